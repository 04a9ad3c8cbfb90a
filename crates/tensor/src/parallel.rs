//! The thread pool every kernel runs on. Its size comes from `--threads` /
//! `HEADROOM_THREADS` (default: all cores) and is fixed for the process, because results
//! are byte-identical only for the same thread count.

use std::sync::OnceLock;

use rayon::{ThreadPool, ThreadPoolBuilder};

static POOL: OnceLock<ThreadPool> = OnceLock::new();
static REQUESTED: OnceLock<usize> = OnceLock::new();

/// The environment variable that sets the thread count.
pub const THREADS_ENV: &str = "HEADROOM_THREADS";

/// Requests `threads` kernel threads; takes effect only before the first kernel runs.
/// Returns false when the pool already exists with another size.
pub fn set_threads(threads: usize) -> bool {
    let threads = threads.max(1);
    let _ = REQUESTED.set(threads);
    POOL.get()
        .is_none_or(|pool| pool.current_num_threads() == threads)
}

fn configured_threads() -> usize {
    if let Some(&n) = REQUESTED.get() {
        return n;
    }
    std::env::var(THREADS_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The kernel thread pool, built on first use.
pub fn pool() -> &'static ThreadPool {
    POOL.get_or_init(|| {
        let threads = configured_threads();
        ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("headroom-kernel-{i}"))
            .build()
            .unwrap_or_else(|_| {
                // Building a pool only fails when threads cannot be spawned; one thread
                // still computes the same bytes for a thread count of one.
                ThreadPoolBuilder::new()
                    .num_threads(1)
                    .build()
                    .expect("a one-thread pool can always be built")
            })
    })
}

/// Number of kernel threads.
pub fn num_threads() -> usize {
    pool().current_num_threads()
}

/// Runs `f` inside the kernel pool (nested calls stay in it).
pub fn run<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    pool().install(f)
}

/// Index of the current kernel thread (0 outside the pool), for per-thread scratch.
pub fn thread_index() -> usize {
    rayon::current_thread_index().unwrap_or(0)
}
