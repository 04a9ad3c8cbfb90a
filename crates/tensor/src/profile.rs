//! Time and bytes per op kind, for `headroom bench models --profile`: where a forward's
//! wall time goes, op by op, and how many bytes each kind reads and writes.
//!
//! Off by default; when off an op pays one relaxed atomic load. When on, every tensor op
//! called from outside another op (the model's own calls) adds its wall time, its call and
//! the bytes of its operands and result to its kind's row. Ops that an op calls inside
//! itself (a norm's dtype conversion, a conv's GEMM) count as their caller's time, so the
//! rows partition the time spent in ops and add up to at most the forward's wall time.
//! Recording changes no result.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::error::Result;
use crate::tensor::Tensor;

static ENABLED: AtomicBool = AtomicBool::new(false);
static TABLE: Mutex<BTreeMap<&'static str, OpStats>> = Mutex::new(BTreeMap::new());

thread_local! {
    /// Ops this thread is inside: only the outermost one records.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// What the ops of one kind took while recording was on.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpStats {
    /// Calls from outside another op.
    pub calls: u64,
    /// Wall seconds inside them.
    pub seconds: f64,
    /// Bytes of their operands and results (each tensor's elements × element size).
    pub bytes: u64,
}

/// Turns recording on or off for the whole process.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// The rows recorded since the last call (kind, stats), by kind name; clears them.
pub fn take() -> Vec<(&'static str, OpStats)> {
    let mut table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    std::mem::take(&mut *table).into_iter().collect()
}

/// Leaves one level of op nesting when dropped (also on unwinding).
struct Depth;

impl Drop for Depth {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

fn nbytes(t: &Tensor) -> u64 {
    (t.numel() * t.dtype().size()) as u64
}

/// Runs the op `f` of kind `kind` on `inputs`, recording it when recording is on and no
/// other op is running on this thread.
pub(crate) fn op(
    kind: &'static str,
    inputs: &[&Tensor],
    f: impl FnOnce() -> Result<Tensor>,
) -> Result<Tensor> {
    if !ENABLED.load(Ordering::Relaxed) {
        return f();
    }
    let outer = DEPTH.with(|d| {
        d.set(d.get() + 1);
        d.get() == 1
    });
    let _depth = Depth;
    if !outer {
        return f();
    }
    let start = Instant::now();
    let out = f();
    let seconds = start.elapsed().as_secs_f64();
    let mut bytes: u64 = inputs.iter().map(|t| nbytes(t)).sum();
    if let Ok(t) = &out {
        bytes += nbytes(t);
    }
    let mut table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let row = table.entry(kind).or_default();
    row.calls += 1;
    row.seconds += seconds;
    row.bytes += bytes;
    out
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, Tensor};

    #[test]
    fn outer_ops_record_and_inner_ones_do_not() {
        let device = Device::cpu().unwrap();
        let x = Tensor::from_f32(&[1.0; 64], &[4, 16], DType::F32, &device).unwrap();
        super::set_enabled(true);
        let y = x.layer_norm(None, None, 1e-6).unwrap().add(&x).unwrap();
        super::set_enabled(false);
        let _ = y.add(&x).unwrap();
        let rows = super::take();
        // Other tests may record in the same process while it was on: look for ours.
        let norm = rows
            .iter()
            .find(|(k, _)| *k == "layer_norm")
            .expect("a norm row");
        assert!(norm.1.calls >= 1 && norm.1.bytes >= 2 * 64 * 4);
        let add = rows.iter().find(|(k, _)| *k == "add").expect("an add row");
        assert!(add.1.calls >= 1 && add.1.bytes >= 3 * 64 * 4);
        assert!(rows.iter().all(|(_, s)| s.seconds >= 0.0));
    }
}
