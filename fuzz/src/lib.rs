//! What every fuzz target shares: a global allocator that enforces the memory bound a
//! parser of a small untrusted input must keep, and the CPU device the tensor parsers
//! load onto.
//!
//! The bound: no single allocation, and no total of live heap bytes, past
//! [`MAX_HEAP`] (256 MiB). libFuzzer's own `-malloc_limit_mb` needs a sanitizer's
//! malloc hooks, which this sanitizer-free build has not, so the allocator checks it
//! itself and aborts (libFuzzer records the input as a crash) with a message naming
//! the request. `-rss_limit_mb` stays as a backstop for memory outside Rust's heap.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use headroom_tensor::Device;

/// The most heap a parser may hold for one fuzz input.
pub const MAX_HEAP: usize = 256 << 20;

/// [`System`], aborting when an allocation would take the live heap past [`MAX_HEAP`].
pub struct BoundedAlloc;

static LIVE: AtomicUsize = AtomicUsize::new(0);

fn over_bound(size: usize) -> ! {
    // No allocation here: format the size by hand into a stack buffer.
    let mut buf = [0u8; 128];
    let head = b"headroom-fuzz: allocation of ";
    let tail = b" bytes takes the live heap past the 256 MiB bound\n";
    let mut n = 0;
    buf[..head.len()].copy_from_slice(head);
    n += head.len();
    let mut digits = [0u8; 20];
    let (mut v, mut d) = (size, 0);
    loop {
        digits[d] = b'0' + (v % 10) as u8;
        d += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for i in (0..d).rev() {
        buf[n] = digits[i];
        n += 1;
    }
    buf[n..n + tail.len()].copy_from_slice(tail);
    n += tail.len();
    // SAFETY: writing a stack buffer to stderr.
    unsafe {
        libc::write(2, buf.as_ptr().cast(), n);
    }
    std::process::abort()
}

// SAFETY: every call forwards to `System` with the same layout; the counter only
// observes sizes.
unsafe impl GlobalAlloc for BoundedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        if live > MAX_HEAP {
            over_bound(layout.size());
        }
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        if live > MAX_HEAP {
            over_bound(layout.size());
        }
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            let grow = new_size - layout.size();
            let live = LIVE.fetch_add(grow, Ordering::Relaxed) + grow;
            if live > MAX_HEAP {
                over_bound(new_size);
            }
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOC: BoundedAlloc = BoundedAlloc;

/// The host device the tensor parsers load onto, made once per process.
pub fn cpu() -> &'static Device {
    static CPU: OnceLock<Device> = OnceLock::new();
    CPU.get_or_init(|| Device::cpu().expect("a CPU device"))
}
