//! Host memory from the operating system: segments are anonymous `mmap`s, so giving one
//! back (`munmap`) really lowers the process's resident set; expandable segments reserve
//! address space with `PROT_NONE` and commit or return pages with `mprotect` / `madvise`.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::Mutex;

use super::{AddressSpace, Budget, DeviceMemory};

/// Host memory obtained with `mmap`, limited to a capacity. The allocator sees device
/// addresses numbered like the modelled device's; each range maps to its mapping here.
#[derive(Debug)]
pub struct HostMemory {
    budget: Budget,
    addresses: AddressSpace,
    /// Device base address → (host address, bytes) of every live range.
    ranges: Mutex<BTreeMap<u64, (u64, u64)>>,
}

impl HostMemory {
    /// Host memory limited to `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        Self {
            budget: Budget::new(capacity),
            addresses: AddressSpace::new(),
            ranges: Mutex::new(BTreeMap::new()),
        }
    }

    fn ranges(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, (u64, u64)>> {
        self.ranges.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a new host mapping and returns its device address.
    fn register(&self, host: u64, size: u64) -> u64 {
        let addr = self.addresses.next_range(size);
        self.ranges().insert(addr, (host, size));
        addr
    }

    /// Forgets the range at device address `addr`, returning its host address.
    fn unregister(&self, addr: u64) -> Option<u64> {
        self.ranges().remove(&addr).map(|(host, _)| host)
    }

    /// The host address of device address `addr`.
    fn translate(&self, addr: u64) -> Option<u64> {
        let ranges = self.ranges();
        let (&base, &(host, size)) = ranges.range(..=addr).next_back()?;
        (addr < base + size).then_some(host + (addr - base))
    }

    /// The machine's physical memory in bytes, the default capacity of the `cpu` platform.
    pub fn physical_memory() -> u64 {
        // SAFETY: sysconf only reads system configuration.
        let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
        // SAFETY: as above.
        let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if pages <= 0 || page_size <= 0 {
            return 0;
        }
        pages as u64 * page_size as u64
    }
}

/// Huge-page size of x86-64 and aarch64 Linux: ranges this large and larger are mapped
/// at a multiple of it and marked for transparent huge pages.
const HUGE_PAGE: u64 = 2 << 20;

/// Whether segments ask for transparent huge pages (`HEADROOM_HUGE_PAGES=0` turns it
/// off, to measure what it saves).
fn huge_pages() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("HEADROOM_HUGE_PAGES").map_or(true, |v| v != "0"))
}

/// Maps `size` bytes of fresh anonymous memory with the given protection. A range of a
/// huge page or more starts on a huge-page boundary and is marked `MADV_HUGEPAGE`: the
/// first touch of a fresh arena then takes one fault per 2 MiB instead of one per 4 KiB
/// (a session's ~400 MB arena: ~200 faults instead of ~100,000), and GEMM panels that
/// stream through it miss the TLB less.
fn mmap_anonymous(size: u64, protection: libc::c_int) -> Option<u64> {
    let huge = huge_pages() && size >= HUGE_PAGE;
    let slack = if huge { HUGE_PAGE } else { 0 };
    let len = usize::try_from(size.checked_add(slack)?).ok()?;
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches
    // no existing memory; failure is reported as MAP_FAILED and handled.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            protection,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return None;
    }
    let start = ptr as u64;
    if !huge {
        return Some(start);
    }
    // Trim the mapping to `size` bytes from the first huge-page boundary in it.
    // `munmap` of the range later rounds its length up to a whole page, so the tail
    // trimmed now starts there.
    let aligned = start.next_multiple_of(HUGE_PAGE);
    let head = aligned - start;
    let end = (aligned + size).next_multiple_of(page_size());
    if head > 0 {
        munmap(start, head);
    }
    if start + len as u64 > end {
        munmap(end, start + len as u64 - end);
    }
    // SAFETY: the range is the mapping just made; the advice changes how the kernel
    // backs its pages, never their contents (a kernel without THP ignores it).
    unsafe {
        libc::madvise(
            aligned as *mut libc::c_void,
            size as usize,
            libc::MADV_HUGEPAGE,
        );
    }
    Some(aligned)
}

/// The kernel's page size (4 KiB where it cannot be read).
fn page_size() -> u64 {
    // SAFETY: sysconf only reads system configuration.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// Unmaps a range this module mapped.
fn munmap(addr: u64, size: u64) {
    // SAFETY: the allocator only passes ranges it obtained from `mmap_anonymous` and no
    // longer hands out, and `mmap_anonymous` only trims slack no range includes; no live
    // block points into them.
    let rc = unsafe { libc::munmap(addr as *mut libc::c_void, size as usize) };
    debug_assert_eq!(rc, 0, "munmap of an allocator range failed");
}

impl DeviceMemory for HostMemory {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn capacity(&self) -> u64 {
        self.budget.capacity()
    }
    fn used(&self) -> u64 {
        self.budget.used()
    }
    fn holds_bytes(&self) -> bool {
        true
    }
    fn alloc_segment(&self, size: u64) -> Option<u64> {
        if !self.budget.take(size) {
            return None;
        }
        match mmap_anonymous(size, libc::PROT_READ | libc::PROT_WRITE) {
            Some(host) => Some(self.register(host, size)),
            None => {
                self.budget.give(size);
                None
            }
        }
    }
    fn free_segment(&self, addr: u64, size: u64) {
        if let Some(host) = self.unregister(addr) {
            munmap(host, size);
        }
        self.budget.give(size);
    }
    fn reserve(&self, size: u64) -> Option<u64> {
        mmap_anonymous(size, libc::PROT_NONE).map(|host| self.register(host, size))
    }
    fn release_reservation(&self, addr: u64, size: u64) {
        if let Some(host) = self.unregister(addr) {
            munmap(host, size);
        }
    }
    fn host_ptr(&self, addr: u64) -> Option<NonNull<u8>> {
        NonNull::new(self.translate(addr)? as *mut u8)
    }
    fn map(&self, addr: u64, size: u64) -> bool {
        let Some(addr) = self.translate(addr) else {
            return false;
        };
        if !self.budget.take(size) {
            return false;
        }
        // SAFETY: the range lies inside a reservation made by `reserve` and is not mapped
        // yet; making it accessible touches no live data.
        let rc = unsafe {
            libc::mprotect(
                addr as *mut libc::c_void,
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        if rc != 0 {
            self.budget.give(size);
        }
        rc == 0
    }
    fn unmap(&self, addr: u64, size: u64) {
        let Some(addr) = self.translate(addr) else {
            return;
        };
        // SAFETY: the range lies inside a reservation and holds no live block; dropping its
        // pages (MADV_DONTNEED) returns them to the OS and the next touch sees zeros.
        unsafe {
            libc::madvise(
                addr as *mut libc::c_void,
                size as usize,
                libc::MADV_DONTNEED,
            );
            libc::mprotect(addr as *mut libc::c_void, size as usize, libc::PROT_NONE);
        }
        self.budget.give(size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_segments_start_on_a_huge_page_and_hold_every_byte() {
        let memory = HostMemory::new(64 << 20);
        for size in [HUGE_PAGE, (3 << 20) + 512, 4096, 512] {
            let addr = memory.alloc_segment(size).expect("segment");
            let ptr = memory.host_ptr(addr).expect("host pointer").as_ptr();
            if size >= HUGE_PAGE {
                assert_eq!(ptr as u64 % HUGE_PAGE, 0, "{size} B not huge-page aligned");
            }
            // SAFETY: the segment is `size` bytes, mapped readable and writable, and
            // nothing else uses it.
            unsafe {
                std::ptr::write_bytes(ptr, 0xA5, size as usize);
                assert_eq!(*ptr.add(size as usize - 1), 0xA5);
            }
            memory.free_segment(addr, size);
        }
        assert_eq!(memory.used(), 0);
    }
}
