//! Reading and writing tensors: safetensors and PyTorch `.pth` checkpoints (memory-mapped,
//! copied into allocator blocks once, dtype converted on load, mapped pages dropped as
//! each tensor is done) and NumPy `.npy` files (for reference checks and tools).

pub mod npy;
pub mod pth;
pub mod safetensors;

use memmap2::Mmap;

/// Drops the mapped pages of `range` from this process's resident set once a tensor has
/// been copied out of them, so a load never holds the file and its copy at once. The
/// map is read-only and file-backed: a later read of the range faults the same bytes
/// back in from the page cache or the file, so nothing observable changes.
pub(crate) fn release_mapped(mmap: &Mmap, range: std::ops::Range<usize>) {
    #[cfg(unix)]
    {
        if range.is_empty() || range.end > mmap.len() {
            return;
        }
        // SAFETY: MADV_DONTNEED on a private read-only file mapping only discards
        // clean pages; no Rust reference sees different bytes afterwards, because any
        // later access re-reads the unchanged file. Failure only leaves pages resident.
        let _ = unsafe {
            mmap.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                range.start,
                range.len(),
            )
        };
    }
    #[cfg(not(unix))]
    let _ = (mmap, range);
}
