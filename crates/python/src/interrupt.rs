//! Engine work run from Python: on a worker thread, with the GIL released, while the
//! calling thread watches Python's signal handlers. On Ctrl-C the chunk's
//! [`CancelToken`] is cancelled, the work stops at its next safe point (between DMD
//! steps, before the commit, between decoded latent frames) and `KeyboardInterrupt` is
//! raised once it has: the session is over, as a signal ends it under the CLI.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use headroom_engine::CancelToken;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// How often the waiting thread looks for a signal.
const SIGNAL_POLL: Duration = Duration::from_millis(20);

/// Runs `work` on a worker thread with the GIL released, checking Python's signal
/// handlers meanwhile: on Ctrl-C, `cancel` (if any) is cancelled, the work is awaited
/// (it stops at its next safe point) and the signal's exception is returned.
pub fn run_interruptible<T: Send>(
    py: Python<'_>,
    cancel: Option<&CancelToken>,
    work: impl FnOnce() -> T + Send,
) -> PyResult<T> {
    let finished = AtomicBool::new(false);
    let waiter = std::thread::current();
    std::thread::scope(|scope| {
        let worker = scope.spawn(|| {
            let out = work();
            finished.store(true, Ordering::Release);
            waiter.unpark();
            out
        });
        let mut interrupted = None;
        loop {
            let done = py.detach(|| {
                if !finished.load(Ordering::Acquire) {
                    std::thread::park_timeout(SIGNAL_POLL);
                }
                finished.load(Ordering::Acquire)
            });
            if done {
                break;
            }
            if interrupted.is_none() {
                if let Err(e) = py.check_signals() {
                    if let Some(token) = cancel {
                        token.cancel();
                    }
                    interrupted = Some(e);
                }
            }
        }
        let out = worker
            .join()
            .map_err(|_| PyRuntimeError::new_err("the engine's worker thread panicked"))?;
        match interrupted {
            Some(e) => Err(e),
            None => Ok(out),
        }
    })
}
