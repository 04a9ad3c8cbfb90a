//! Times the planner on a plan-cache file's recording (`cargo run --release -p
//! headroom-mem --example plan_time FILE`): the whole span and the periodic plan.

use std::time::Instant;

use headroom_mem::allocator::periodic::periodic;
use headroom_mem::allocator::planner::plan;
use headroom_mem::Plan;

fn main() {
    let path = std::env::args().nth(1).expect("a plan-cache file");
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).expect("readable")).expect("json");
    let p: Plan = serde_json::from_value(file["plan"].clone()).expect("a plan");
    println!("{} requests, {} marks", p.requests.len(), p.marks.len());
    let t = Instant::now();
    let whole = plan(&p.requests, None).expect("whole");
    println!(
        "whole: {:.2} s, arena {} (live {}), order {}",
        t.elapsed().as_secs_f64(),
        whole.arena_bytes(),
        whole.live_peak_bytes,
        whole.order
    );
    let t = Instant::now();
    match periodic(&p.requests, &p.marks, None) {
        Some(per) => println!(
            "periodic: {:.2} s, arena {} (live {}), order {}",
            t.elapsed().as_secs_f64(),
            per.arena_bytes(),
            per.live_peak_bytes,
            per.order
        ),
        None => println!("periodic: none (the recording does not end in repeating chunks)"),
    }
    for order in headroom_mem::PlacementOrder::ALL.into_iter().chain(
        [10, 20, 30, 60, 100, 200, 400, 1000, 3000].map(headroom_mem::PlacementOrder::Tiered),
    ) {
        let t = Instant::now();
        let one = plan(&p.requests, Some(order)).expect("one");
        println!(
            "  {order}: {:.3} s arena {}",
            t.elapsed().as_secs_f64(),
            one.arena_bytes()
        );
    }
}
