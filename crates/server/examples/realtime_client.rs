//! A scripted `WS /v1/realtime/video` client: one session, a camera interaction after the
//! first chunk, every message printed with its arrival time, the stream written to a file.
//!
//! `cargo run -p headroom-server --example realtime_client -- ws://127.0.0.1:8000/v1/realtime/video 33 416 240 out.mp4`

use std::time::Instant;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let url = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "ws://127.0.0.1:8000/v1/realtime/video".to_string());
    let frames: usize = args.get(2).map_or(Ok(33), |a| a.parse())?;
    let width: usize = args.get(3).map_or(Ok(416), |a| a.parse())?;
    let height: usize = args.get(4).map_or(Ok(240), |a| a.parse())?;
    let out = args
        .get(5)
        .cloned()
        .unwrap_or_else(|| "stream.mp4".to_string());

    let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str()).await?;
    let t0 = Instant::now();
    let start = json!({"type": "session.start", "format": "m4s", "num_frames": frames,
                       "width": width, "height": height, "seed": 7, "fps": 16});
    ws.send(Message::text(start.to_string())).await?;
    let mut stream = Vec::new();
    let mut steered = false;
    while let Some(message) = ws.next().await {
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        match message? {
            Message::Binary(bytes) => {
                println!("{ms:9.1} ms  binary {} B", bytes.len());
                stream.extend_from_slice(&bytes);
                if !steered {
                    steered = true;
                    let turn = json!({"type": "session.interaction", "interaction": {
                        "event_id": "turn-right", "event": {"multi_modal_data": {"camera": {
                            "mode": "velocity",
                            "data": {"translation": [0.0, 0.0, 0.05],
                                     "rotation": [0.0, 0.0523, 0.0, 0.9986]}}}}}});
                    ws.send(Message::text(turn.to_string())).await?;
                    ws.send(Message::text(json!({"type": "session.ping"}).to_string()))
                        .await?;
                }
            }
            Message::Text(text) => {
                let mut v: Value = serde_json::from_str(text.as_str())?;
                if let Some(config) = v.get_mut("config") {
                    // Keep the printed line short.
                    *config = json!(format!("{config}"));
                }
                println!("{ms:9.1} ms  {v}");
                let kind = v["type"].as_str().unwrap_or_default().to_string();
                if kind == "session.done" || (kind == "error" && v["event_id"].is_null()) {
                    break;
                }
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    std::fs::write(&out, &stream)?;
    println!("wrote {} B of fragmented MP4 to {out}", stream.len());
    Ok(())
}
