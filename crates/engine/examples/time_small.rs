//! Times one session of a built-in model: `cargo run --release -p headroom-engine --example time_small -- small 416 240 33`.

use std::time::Instant;

use headroom_engine::{Engine, EngineConfig, SessionRequest};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = args.get(1).cloned().unwrap_or_else(|| "small".into());
    let num = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let engine = Engine::new(EngineConfig {
        model,
        ..EngineConfig::default()
    })?;
    let start = Instant::now();
    let mut session =
        engine.open_session(SessionRequest::new(num(2, 416), num(3, 240), num(4, 33)))?;
    println!("open: {:.2?}", start.elapsed());
    for _ in 0..session.chunks_total().unwrap() {
        let c = session.next_chunk()?;
        println!("chunk {} {:?}: {:?}", c.index, c.frames.shape(), c.timings);
    }
    println!("total {:.2?}", start.elapsed());
    Ok(())
}
