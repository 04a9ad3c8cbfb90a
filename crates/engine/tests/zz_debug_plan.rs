use std::sync::Arc;
use headroom_engine::{Engine, EngineConfig, SessionRequest};
use headroom_mem::{AllocatorConfig, AllocatorPolicy, CachingPlatform, ReclaimPolicy, Platform};
#[test]
fn debug_plan() {
    let (model, w, h, f) = (std::env::var("M").unwrap_or("small".into()), 416, 240, 21);
    let p = CachingPlatform::sim(1 << 40, AllocatorConfig::with_policy(AllocatorPolicy::Planned), ReclaimPolicy::Never).unwrap();
    let e = Engine::on(EngineConfig { model: model.clone(), ..EngineConfig::default() }, Arc::new(p)).unwrap();
    let st = e.platform().memory_stats();
    eprintln!("after load: alloc {} res {}", st.allocated_bytes.all().current, st.reserved_bytes.all().current);
    for s in 0..2 {
        e.platform().reset_peak_stats();
        let mut sess = e.open_session(SessionRequest::new(w, h, f)).unwrap();
        for _ in 0..sess.chunks_total() { sess.next_chunk().unwrap(); }
        drop(sess);
        let st = e.platform().memory_stats();
        eprintln!("session {s}: alloc peak {} res peak {} ratio {:.4} after alloc {} res {} hits {} misses {} fb {}", st.allocated_bytes.all().peak, st.reserved_bytes.all().peak, st.reserved_bytes.all().peak as f64 / st.allocated_bytes.all().peak as f64, st.allocated_bytes.all().current, st.reserved_bytes.all().current, st.planned_hits, st.planned_misses, st.fallback_bytes);
    }
    let book = e.platform().allocator().plans();
    for k in book.keys() { let pl = book.get(k).unwrap(); eprintln!("plan {k}: n {} arena {} live {} ratio {:.4} fb {} order {}", pl.entries.len(), pl.arena_bytes(), pl.live_peak_bytes, pl.arena_bytes() as f64 / pl.live_peak_bytes as f64, pl.fallback_bytes, pl.order); }
}
#[test]
fn dump() {
    let p = CachingPlatform::sim(1 << 40, AllocatorConfig::with_policy(AllocatorPolicy::Planned), ReclaimPolicy::Never).unwrap();
    let e = Engine::on(EngineConfig { model: std::env::var("M").unwrap_or("small".into()), ..EngineConfig::default() }, Arc::new(p)).unwrap();
    let mut sess = e.open_session(SessionRequest::new(416, 240, 21)).unwrap();
    for _ in 0..sess.chunks_total() { sess.next_chunk().unwrap(); }
    drop(sess);
    let book = e.platform().allocator().plans();
    for k in book.keys() { let pl = book.get(k).unwrap();
      let mut out = String::new();
      for r in &pl.requests { out += &format!("{} {} {} {}\n", r.size, r.stream, r.start, r.end.map_or(-1i64, |e| e as i64)); }
      std::fs::write("/tmp/dbg/reqs.txt", out).unwrap();
    }
}
