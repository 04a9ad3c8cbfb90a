use headroom_mem::{PlanRequest};
use headroom_mem::allocator::planner::place_sorted;
#[test]
fn exp() {
    let text = std::fs::read_to_string("/tmp/dbg/reqs.txt").unwrap();
    let reqs: Vec<PlanRequest> = text.lines().map(|l| { let v: Vec<i64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
        PlanRequest { size: v[0] as u64, stream: v[1] as u32, start: v[2] as u64, end: (v[3] >= 0).then_some(v[3] as u64) } }).collect();
    let items: Vec<usize> = (0..reqs.len()).filter(|&i| reqs[i].end.is_some()).collect();
    let life = |i: usize| reqs[i].end.unwrap() - reqs[i].start;
    let peak = headroom_mem::allocator::planner::plan(&reqs, None).unwrap().live_peak_bytes as f64;
    let mut off = vec![0u64; reqs.len()];
    let mut rng = 0x9E3779B97F4A7C15u64;
    let mut next = || { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; rng };
    // A: noisy keys
    for sigma in [0.1f64, 0.3, 0.6] {
        let mut best = f64::MAX;
        for _ in 0..200 {
            let mut keyed: Vec<(f64, usize)> = items.iter().map(|&i| { let u = (next() % 10_000) as f64 / 10_000.0 - 0.5; ((reqs[i].size as f64 * life(i) as f64).ln() + sigma * u * 2.0, i) }).collect();
            keyed.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap());
            let order: Vec<usize> = keyed.iter().map(|k| k.1).collect();
            let a = place_sorted(&reqs, &order, &mut off) as f64;
            if a < best { best = a; }
        }
        eprintln!("A sigma {sigma}: {:.4}", best / peak);
    }
    // B: hill climbing from size×life with swaps among the first K.
    let mut order = items.clone();
    order.sort_by_key(|&i| (std::cmp::Reverse(reqs[i].size as u128 * life(i) as u128), reqs[i].start));
    let mut best = place_sorted(&reqs, &order, &mut off);
    let t = std::time::Instant::now();
    for k in [64usize, 256, 1024] {
        let mut o = order.clone(); let mut b = best;
        for _ in 0..300 {
            let mut c = o.clone();
            let n = k.min(c.len());
            let (x, y) = ((next() as usize) % n, (next() as usize) % n);
            c.swap(x, y);
            let a = place_sorted(&reqs, &c, &mut off);
            if a <= b { b = a; o = c; }
        }
        eprintln!("B k {k}: {:.4}", b as f64 / peak);
        if b < best { best = b; }
    }
    eprintln!("time {:?}", t.elapsed());
}
