//! The one error type of `mem`: every variant carries what a person needs to act.

use crate::size::format_bytes;

/// Errors of the memory core.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// The device could not provide a new segment even after every cached block was
    /// released. The caller cannot retry as is: it must free memory, lower the
    /// workload, or choose a policy that fragments less.
    #[error(
        "out of memory on the {platform} platform: tried to allocate {} ({requested} B); \
         capacity {}, of which {} is free; headroom holds {} allocated and {} reserved \
         ({} reserved but unallocated). {}",
        format_bytes(*requested), format_bytes(*capacity), format_bytes(*free),
        format_bytes(*allocated), format_bytes(*reserved),
        format_bytes(reserved.saturating_sub(*allocated)), oom_hint(*reserved, *allocated, *capacity)
    )]
    OutOfMemory {
        /// Bytes the caller asked for.
        requested: u64,
        /// Bytes the device still had free when the request failed.
        free: u64,
        /// Bytes the allocator held from the device (reserved).
        reserved: u64,
        /// Bytes handed out to live allocations.
        allocated: u64,
        /// The device's capacity.
        capacity: u64,
        /// Name of the platform, for the message.
        platform: &'static str,
    },
    /// A configuration value breaks a rule; the message names the field and the rule.
    #[error("invalid {field}: {rule}")]
    InvalidConfig {
        /// The field or option that is wrong.
        field: &'static str,
        /// The rule it breaks, with the value given.
        rule: String,
    },
    /// A size string could not be parsed.
    #[error(transparent)]
    InvalidSize(#[from] crate::size::SizeError),
    /// A line of a JSON-lines trace is malformed.
    #[error("trace line {line}: {reason}")]
    TraceLine {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A PyTorch snapshot could not be read.
    #[error("PyTorch snapshot: {0}")]
    Snapshot(String),
    /// The platform's device cannot be used: no driver library, no device, or not the
    /// device asked for. The reason is the driver loader's or the driver's own.
    #[error("no {} device: {reason}", platform.to_uppercase())]
    NoDevice {
        /// The platform (`cuda`, `nvml`).
        platform: &'static str,
        /// Why, in the driver's words where it gave any.
        reason: String,
    },
    /// A driver call failed on a device that was found.
    #[error("{platform} driver call {call} failed: {reason}")]
    Driver {
        /// The platform (`cuda`, `nvml`).
        platform: &'static str,
        /// The driver entry point.
        call: &'static str,
        /// The driver's error.
        reason: String,
    },
    /// A pickle could not be decoded.
    #[error("pickle: {0}")]
    Pickle(#[from] crate::pickle::PickleError),
}

impl MemError {
    /// Whether the device ran out of memory (not a setting or a file).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, MemError::OutOfMemory { .. })
    }
}

/// What to change after an out-of-memory error, from the allocator's state at the time.
fn oom_hint(reserved: u64, allocated: u64, capacity: u64) -> &'static str {
    let cached = reserved.saturating_sub(allocated);
    if capacity > 0 && cached.saturating_mul(10) >= capacity {
        "Reserved but unallocated memory is large: reclaim it at phase boundaries \
         (--policy before-decode, bounded or fit) or use --allocator planned (or expandable) to avoid fragmentation."
    } else {
        "Live allocations fill the device: lower the resolution, frames or batch, \
         or run on a device with more memory."
    }
}

/// Result alias of the memory core.
pub type Result<T> = std::result::Result<T, MemError>;
