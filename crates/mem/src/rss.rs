//! The process's resident set size, read from `/proc/self/statm`.

/// Resident bytes of this process, or `None` where `/proc` is unavailable.
pub fn process_rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let resident_pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads system configuration.
    let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    (page_size > 0).then(|| resident_pages * page_size as u64)
}

/// Peak resident bytes of this process so far (`VmHWM` in `/proc/self/status`), or
/// `None` where `/proc` is unavailable.
pub fn process_peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Page faults this process has taken so far that needed no disk read (`ru_minflt` of
/// `getrusage`): each first touch of a fresh anonymous page is one, so an arena mapped
/// anew per session shows up here. `None` where `getrusage` fails.
pub fn process_minor_faults() -> Option<u64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one `rusage` into the pointer it is given, which points
    // at a zeroed value of that type owned by this frame.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: getrusage returned 0, so it filled the value (and it was zeroed before).
    let usage = unsafe { usage.assume_init() };
    u64::try_from(usage.ru_minflt).ok()
}
