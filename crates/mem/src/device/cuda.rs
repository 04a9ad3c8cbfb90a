//! NVIDIA GPU memory through the CUDA driver API (feature `cuda`).
//!
//! `libcuda` is loaded at run time (cudarc's dynamic loading), so a build with the
//! feature needs neither the toolkit nor the driver; on a machine without them every
//! constructor returns [`MemError::NoDevice`] with the loader's reason instead of
//! panicking. Segments of the `pytorch` policy are `cuMemAlloc` / `cuMemFree`; the
//! `expandable` policy reserves address space with `cuMemAddressReserve` and backs it
//! page by page with `cuMemCreate` + `cuMemMap` + `cuMemSetAccess`, returning pages
//! with `cuMemUnmap` + `cuMemRelease`, as PyTorch's expandable segments do.
//!
//! Streams and events: a block used on another stream than its own (`record_stream`) is
//! freed behind a `cuEvent` recorded on that stream and reused once the event completes,
//! as PyTorch does; stream 0 is the context's default stream, others are registered
//! with [`CudaMemory::register_stream`]. Returning memory to the driver (`cuMemFree`,
//! unmapping) synchronises first.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_void, CStr};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use cudarc::driver::sys;

use super::DeviceMemory;
use crate::error::{MemError, Result};

/// Every driver entry point this module calls. cudarc resolves symbols lazily and panics
/// on a missing one, so all of them are looked up once before the first call.
const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemGetAllocationGranularity",
    "cuGetErrorName",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
];

/// The allocator's smallest page (2 MiB); the device's granularity must divide it.
const ALLOCATOR_PAGE: u64 = 2 << 20;

/// The platform name in errors.
const PLATFORM: &str = "cuda";

/// A driver result as text: the error's name (`CUDA_ERROR_OUT_OF_MEMORY`).
fn describe(result: sys::CUresult) -> String {
    let mut name = MaybeUninit::<*const std::ffi::c_char>::uninit();
    // SAFETY: cuGetErrorName was found by `load_driver`; on success it stores a pointer
    // to a static NUL-terminated string.
    let rc = unsafe { sys::cuGetErrorName(result, name.as_mut_ptr()) };
    if rc == sys::CUresult::CUDA_SUCCESS {
        // SAFETY: written by the successful call above; the string is static.
        let ptr = unsafe { name.assume_init() };
        if !ptr.is_null() {
            // SAFETY: non-null pointer to a static C string owned by the driver.
            return unsafe { CStr::from_ptr(ptr) }
                .to_string_lossy()
                .into_owned();
        }
    }
    format!("{result:?}")
}

/// `Ok` for `CUDA_SUCCESS`, else the call's name and the driver's error.
fn check(result: sys::CUresult, call: &'static str) -> std::result::Result<(), String> {
    if result == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call}: {}", describe(result)))
    }
}

fn no_device(reason: impl Into<String>) -> MemError {
    MemError::NoDevice {
        platform: PLATFORM,
        reason: reason.into(),
    }
}

fn driver_error(call: &'static str, reason: impl Into<String>) -> MemError {
    MemError::Driver {
        platform: PLATFORM,
        call,
        reason: reason.into(),
    }
}

/// Loads `libcuda`, checks every symbol this module needs and runs `cuInit`, once per
/// process; the error is the reason there is no usable driver.
fn load_driver() -> Result<()> {
    static LOADED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            // SAFETY: only tries to open the library; no symbol is called.
            if !unsafe { sys::is_culib_present() } {
                let names = cudarc::get_lib_name_candidates("cuda");
                let mut shown: Vec<&str> = names
                    .iter()
                    .map(String::as_str)
                    .filter(|n| n.ends_with(".so") && !n.contains("64") || n.ends_with(".so.1"))
                    .collect();
                shown.dedup();
                if shown.is_empty() {
                    shown.extend(names.iter().take(2).map(String::as_str));
                }
                return Err(format!(
                    "the CUDA driver library could not be loaded (tried {} and {} other names); \
                     is the NVIDIA driver installed and on LD_LIBRARY_PATH?",
                    shown.join(", "),
                    names.len().saturating_sub(shown.len())
                ));
            }
            // SAFETY: `is_culib_present` just opened the library, so `culib` finds it
            // and does not panic.
            let lib = unsafe { sys::culib() };
            for name in REQUIRED_SYMBOLS {
                // SAFETY: looks a symbol up without calling it.
                if unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_err() {
                    return Err(format!(
                        "the CUDA driver has no {name}: it is older than CUDA 13.0, \
                         which this build's bindings need"
                    ));
                }
            }
            // SAFETY: cuInit takes flags 0 and may be called more than once.
            check(unsafe { sys::cuInit(0) }, "cuInit")
        })
        .clone()
        .map_err(no_device)
}

/// Number of CUDA devices the driver sees; [`MemError::NoDevice`] when the driver cannot
/// be loaded or initialised.
pub fn cuda_device_count() -> Result<usize> {
    load_driver()?;
    let mut count = 0;
    // SAFETY: the driver is loaded and initialised; `count` is a valid out pointer.
    check(
        unsafe { sys::cuDeviceGetCount(&mut count) },
        "cuDeviceGetCount",
    )
    .map_err(no_device)?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// Device-used bytes of GPU `ordinal` as NVML reports them (all processes, the driver's
/// own reservations included). NVML numbers devices by PCI order, which equals the CUDA
/// ordinal when `CUDA_VISIBLE_DEVICES` is unset and `CUDA_DEVICE_ORDER=PCI_BUS_ID`.
pub fn nvml_used_bytes(ordinal: usize) -> Result<u64> {
    static NVML: OnceLock<std::result::Result<nvml_wrapper::Nvml, String>> = OnceLock::new();
    let nvml = NVML
        .get_or_init(|| nvml_wrapper::Nvml::init().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|reason| MemError::NoDevice {
            platform: "nvml",
            reason: format!("NVML could not be initialised: {reason}"),
        })?;
    let index = u32::try_from(ordinal).map_err(|_| MemError::NoDevice {
        platform: "nvml",
        reason: format!("ordinal {ordinal} is out of range"),
    })?;
    let device = nvml
        .device_by_index(index)
        .map_err(|e| MemError::NoDevice {
            platform: "nvml",
            reason: format!("device {ordinal}: {e}"),
        })?;
    let info = device.memory_info().map_err(|e| MemError::Driver {
        platform: "nvml",
        call: "nvmlDeviceGetMemoryInfo",
        reason: e.to_string(),
    })?;
    Ok(info.used)
}

/// A retained primary context. The handle is an opaque driver pointer.
#[derive(Debug)]
struct Context {
    device: sys::CUdevice,
    raw: sys::CUcontext,
}

// SAFETY: a CUDA context handle may be used from any thread; each thread makes it current
// with `cuCtxSetCurrent` before a call (see `CudaMemory::bind`), and the driver API is
// thread-safe.
unsafe impl Send for Context {}
// SAFETY: as above; the handle itself is never mutated after creation.
unsafe impl Sync for Context {}

/// What the driver handed out and must get back.
#[derive(Debug, Default)]
struct Ledger {
    /// `cuMemAlloc` segments: address → bytes.
    segments: BTreeMap<u64, u64>,
    /// `cuMemAddressReserve` ranges: address → bytes reserved.
    reservations: BTreeMap<u64, u64>,
    /// Mapped pages: address → physical allocation handle (one granule each).
    pages: BTreeMap<u64, sys::CUmemGenericAllocationHandle>,
    /// The last driver failure, for messages.
    last_error: Option<String>,
}

/// Memory of one NVIDIA GPU, obtained from the CUDA driver. Addresses are real device
/// pointers; the process cannot read them, so [`DeviceMemory::holds_bytes`] is false.
#[derive(Debug)]
pub struct CudaMemory {
    ordinal: usize,
    context: Context,
    capacity: u64,
    granularity: u64,
    used: AtomicU64,
    ledger: Mutex<Ledger>,
    /// Stream handles by allocator stream id, for events (0 is the default stream).
    streams: Mutex<HashMap<u32, usize>>,
}

impl CudaMemory {
    /// Makes allocator stream `id` stand for the driver stream `handle` (a `CUstream` of
    /// this device's context), so blocks used on it are freed behind an event on it.
    /// Stream 0 is the context's default stream without registration.
    pub fn register_stream(&self, id: u32, handle: *mut c_void) {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        streams.insert(id, handle as usize);
    }

    /// Opens GPU `ordinal` (retaining its primary context);
    /// [`MemError::NoDevice`] when there is no driver or no such device.
    pub fn new(ordinal: usize) -> Result<Self> {
        let count = cuda_device_count()?;
        if count == 0 {
            return Err(no_device("the driver reports 0 CUDA devices"));
        }
        if ordinal >= count {
            return Err(no_device(format!(
                "device {ordinal} requested, the driver reports {count} (0..{})",
                count - 1
            )));
        }
        let index = i32::try_from(ordinal).map_err(|_| no_device("ordinal out of range"))?;
        let mut device: sys::CUdevice = 0;
        // SAFETY: driver loaded; `index` is below the device count; valid out pointer.
        check(
            unsafe { sys::cuDeviceGet(&mut device, index) },
            "cuDeviceGet",
        )
        .map_err(no_device)?;
        let mut raw: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `device` came from cuDeviceGet; valid out pointer.
        check(
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut raw, device) },
            "cuDevicePrimaryCtxRetain",
        )
        .map_err(no_device)?;
        let context = Context { device, raw };
        // From here on `memory`'s Drop releases the context on every error path.
        let mut memory = Self {
            ordinal,
            context,
            capacity: 0,
            granularity: ALLOCATOR_PAGE,
            used: AtomicU64::new(0),
            ledger: Mutex::new(Ledger::default()),
            streams: Mutex::new(HashMap::new()),
        };
        memory
            .bind()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
        let mut total = 0usize;
        // SAFETY: `device` is valid; valid out pointer.
        check(
            unsafe { sys::cuDeviceTotalMem_v2(&mut total, device) },
            "cuDeviceTotalMem",
        )
        .map_err(|e| driver_error("cuDeviceTotalMem", e))?;
        memory.capacity = total as u64;
        let prop = memory.allocation_prop();
        let mut granularity = 0usize;
        // SAFETY: `prop` describes pinned device memory on this device; valid out pointer.
        check(
            unsafe {
                sys::cuMemGetAllocationGranularity(
                    &mut granularity,
                    &prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                )
            },
            "cuMemGetAllocationGranularity",
        )
        .map_err(|e| driver_error("cuMemGetAllocationGranularity", e))?;
        let granularity = granularity as u64;
        if granularity == 0 || !ALLOCATOR_PAGE.is_multiple_of(granularity) {
            return Err(driver_error(
                "cuMemGetAllocationGranularity",
                format!("granularity {granularity} B does not divide the allocator's 2 MiB page"),
            ));
        }
        memory.granularity = granularity;
        Ok(memory)
    }

    /// The CUDA ordinal of this device.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The physical page size `cuMemCreate` works in.
    pub fn granularity(&self) -> u64 {
        self.granularity
    }

    /// `(free, total)` bytes from `cuMemGetInfo`: the device's view, other processes and
    /// the driver's own memory included.
    pub fn driver_mem_info(&self) -> Result<(u64, u64)> {
        self.bind()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: context current; valid out pointers.
        check(
            unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) },
            "cuMemGetInfo",
        )
        .map_err(|e| driver_error("cuMemGetInfo", e))?;
        Ok((free as u64, total as u64))
    }

    /// The last driver failure seen by an allocation call, if any.
    pub fn last_error(&self) -> Option<String> {
        self.ledger().last_error.clone()
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record_error(&self, error: String) {
        self.ledger().last_error = Some(error);
    }

    /// Makes this device's context current on the calling thread.
    fn bind(&self) -> std::result::Result<(), String> {
        // SAFETY: the context was retained in `new` and is released only in Drop.
        check(
            unsafe { sys::cuCtxSetCurrent(self.context.raw) },
            "cuCtxSetCurrent",
        )
    }

    fn allocation_prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: CUmemAllocationProp is a plain C struct for which all-zero is valid
        // (no handle types, no flags); the fields that matter are set below.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = self.context.device;
        prop
    }

    /// Unmaps and releases the pages at `addrs` (already removed from the ledger).
    fn release_pages(&self, pages: &[(u64, sys::CUmemGenericAllocationHandle)]) {
        for &(addr, handle) in pages {
            // SAFETY: `addr` was mapped by `map` with one granule of `handle`, and no live
            // block lies in it (the allocator only unmaps free pages).
            if let Err(e) = check(
                unsafe { sys::cuMemUnmap(addr, self.granularity as usize) },
                "cuMemUnmap",
            ) {
                self.record_error(e);
            }
            // SAFETY: `handle` came from cuMemCreate and is no longer mapped.
            if let Err(e) = check(unsafe { sys::cuMemRelease(handle) }, "cuMemRelease") {
                self.record_error(e);
            }
        }
    }

    /// Maps one granule at `addr`; the handle on success.
    fn map_page(
        &self,
        addr: u64,
        prop: &sys::CUmemAllocationProp,
    ) -> std::result::Result<sys::CUmemGenericAllocationHandle, String> {
        let size = self.granularity as usize;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` describes pinned memory on this device; `size` is the granularity.
        check(
            unsafe { sys::cuMemCreate(&mut handle, size, prop, 0) },
            "cuMemCreate",
        )?;
        // SAFETY: `addr` lies inside a reservation from `reserve`, is granule-aligned and
        // not mapped yet; `handle` holds exactly `size` bytes.
        if let Err(e) = check(
            unsafe { sys::cuMemMap(addr, size, 0, handle, 0) },
            "cuMemMap",
        ) {
            // SAFETY: `handle` was created above and is not mapped anywhere.
            unsafe { sys::cuMemRelease(handle) };
            return Err(e);
        }
        Ok(handle)
    }
}

impl DeviceMemory for CudaMemory {
    fn name(&self) -> &'static str {
        PLATFORM
    }
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }
    fn holds_bytes(&self) -> bool {
        false
    }
    fn alloc_segment(&self, size: u64) -> Option<u64> {
        let bytes = usize::try_from(size).ok()?;
        if let Err(e) = self.bind() {
            self.record_error(e);
            return None;
        }
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: context current; valid out pointer; failure is reported, not assumed.
        match check(unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) }, "cuMemAlloc") {
            Ok(()) if ptr != 0 => {
                self.ledger().segments.insert(ptr, size);
                self.used.fetch_add(size, Ordering::AcqRel);
                Some(ptr)
            }
            Ok(()) => None,
            Err(e) => {
                self.record_error(e);
                None
            }
        }
    }
    fn free_segment(&self, addr: u64, size: u64) {
        if self.ledger().segments.remove(&addr).is_none() {
            self.record_error(format!("free_segment of unknown address {addr:#x}"));
            return;
        }
        let result = self.bind().and_then(|()| {
            // SAFETY: `addr` came from cuMemAlloc (it was in the ledger) and holds no live
            // block; cuMemFree synchronises with work still using it.
            check(unsafe { sys::cuMemFree_v2(addr) }, "cuMemFree")
        });
        if let Err(e) = result {
            self.record_error(e);
        }
        self.used.fetch_sub(size, Ordering::AcqRel);
    }
    fn reserve(&self, size: u64) -> Option<u64> {
        let span = size.div_ceil(self.granularity).max(1) * self.granularity;
        let bytes = usize::try_from(span).ok()?;
        if let Err(e) = self.bind() {
            self.record_error(e);
            return None;
        }
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: reserves virtual addresses only (alignment 0 = granularity, no fixed
        // address, no flags); valid out pointer.
        match check(
            unsafe { sys::cuMemAddressReserve(&mut ptr, bytes, 0, 0, 0) },
            "cuMemAddressReserve",
        ) {
            Ok(()) => {
                self.ledger().reservations.insert(ptr, span);
                Some(ptr)
            }
            Err(e) => {
                self.record_error(e);
                None
            }
        }
    }
    fn release_reservation(&self, addr: u64, _size: u64) {
        let (span, pages) = {
            let mut ledger = self.ledger();
            let Some(span) = ledger.reservations.remove(&addr) else {
                ledger.last_error = Some(format!("release of unknown reservation {addr:#x}"));
                return;
            };
            // Pages still mapped (the allocator unmaps first; this is a safety net).
            let keys: Vec<u64> = ledger
                .pages
                .range(addr..addr + span)
                .map(|(&a, _)| a)
                .collect();
            let pages: Vec<_> = keys
                .into_iter()
                .filter_map(|a| ledger.pages.remove(&a).map(|h| (a, h)))
                .collect();
            (span, pages)
        };
        if let Err(e) = self.bind() {
            self.record_error(e);
            return;
        }
        if !pages.is_empty() {
            self.synchronize();
            self.release_pages(&pages);
            self.used
                .fetch_sub(pages.len() as u64 * self.granularity, Ordering::AcqRel);
        }
        // SAFETY: `addr`/`span` is exactly a range from cuMemAddressReserve with nothing
        // mapped in it any more.
        if let Err(e) = check(
            unsafe { sys::cuMemAddressFree(addr, span as usize) },
            "cuMemAddressFree",
        ) {
            self.record_error(e);
        }
    }
    fn map(&self, addr: u64, size: u64) -> bool {
        let g = self.granularity;
        if !addr.is_multiple_of(g) || !size.is_multiple_of(g) || size == 0 {
            self.record_error(format!(
                "map of [{addr:#x}, +{size}) is not aligned to the {g} B granularity"
            ));
            return false;
        }
        if self.used().saturating_add(size) > self.capacity {
            return false;
        }
        if let Err(e) = self.bind() {
            self.record_error(e);
            return false;
        }
        let prop = self.allocation_prop();
        let mut mapped = Vec::with_capacity((size / g) as usize);
        let mut failure = None;
        for page in (addr..addr + size).step_by(g as usize) {
            match self.map_page(page, &prop) {
                Ok(handle) => mapped.push((page, handle)),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if failure.is_none() {
            // SAFETY: CUmemAccessDesc is a plain C struct; all fields are set below.
            let mut access: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
            access.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
            access.location.id = self.context.device;
            access.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            // SAFETY: `[addr, addr + size)` is fully mapped by the loop above.
            if let Err(e) = check(
                unsafe { sys::cuMemSetAccess(addr, size as usize, &access, 1) },
                "cuMemSetAccess",
            ) {
                failure = Some(e);
            }
        }
        if let Some(e) = failure {
            self.release_pages(&mapped);
            self.record_error(e);
            return false;
        }
        self.ledger().pages.extend(mapped);
        self.used.fetch_add(size, Ordering::AcqRel);
        true
    }
    fn unmap(&self, addr: u64, size: u64) {
        let pages: Vec<_> = {
            let mut ledger = self.ledger();
            let keys: Vec<u64> = ledger
                .pages
                .range(addr..addr.saturating_add(size))
                .map(|(&a, _)| a)
                .collect();
            keys.into_iter()
                .filter_map(|a| ledger.pages.remove(&a).map(|h| (a, h)))
                .collect()
        };
        if let Err(e) = self.bind() {
            self.record_error(e);
            return;
        }
        // Work queued on the pages may still run: wait for it, as PyTorch does before
        // unmapping expandable segments.
        self.synchronize();
        self.release_pages(&pages);
        self.used
            .fetch_sub(pages.len() as u64 * self.granularity, Ordering::AcqRel);
    }
    fn synchronize(&self) {
        let result = self.bind().and_then(|()| {
            // SAFETY: the context is current on this thread.
            check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
        });
        if let Err(e) = result {
            self.record_error(e);
        }
    }
    fn driver_mem_info(&self) -> Option<(u64, u64)> {
        CudaMemory::driver_mem_info(self).ok()
    }
    fn record_event(&self, stream: u32) -> Option<u64> {
        let handle = if stream == 0 {
            0
        } else {
            let streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
            match streams.get(&stream) {
                Some(&h) => h,
                None => {
                    // A stream we hold no handle for: order by waiting instead.
                    drop(streams);
                    self.synchronize();
                    return None;
                }
            }
        };
        let recorded = self.bind().and_then(|()| {
            let mut event: sys::CUevent = std::ptr::null_mut();
            let flags = sys::CUevent_flags_enum::CU_EVENT_DISABLE_TIMING as u32;
            // SAFETY: the context is current; valid out pointer.
            check(
                unsafe { sys::cuEventCreate(&mut event, flags) },
                "cuEventCreate",
            )?;
            // SAFETY: `event` was just created in this context; `handle` is a stream of
            // this context (registered) or the default stream (null).
            let r = check(
                unsafe { sys::cuEventRecord(event, handle as sys::CUstream) },
                "cuEventRecord",
            );
            if let Err(e) = r {
                // SAFETY: created above, never recorded.
                unsafe { sys::cuEventDestroy_v2(event) };
                return Err(e);
            }
            Ok(event as u64)
        });
        match recorded {
            Ok(event) => Some(event),
            Err(e) => {
                self.record_error(e);
                self.synchronize();
                None
            }
        }
    }
    fn event_done(&self, id: u64) -> bool {
        // SAFETY: `id` is an event from `record_event`, not destroyed yet.
        let result = unsafe { sys::cuEventQuery(id as sys::CUevent) };
        match result {
            sys::CUresult::CUDA_SUCCESS => true,
            sys::CUresult::CUDA_ERROR_NOT_READY => false,
            other => {
                self.record_error(describe(other));
                true
            }
        }
    }
    fn wait_event(&self, id: u64) {
        // SAFETY: as in `event_done`.
        if let Err(e) = check(
            unsafe { sys::cuEventSynchronize(id as sys::CUevent) },
            "cuEventSynchronize",
        ) {
            self.record_error(e);
        }
    }
    fn destroy_event(&self, id: u64) {
        // SAFETY: as in `event_done`; the allocator destroys each event once.
        unsafe { sys::cuEventDestroy_v2(id as sys::CUevent) };
    }
}

impl Drop for CudaMemory {
    fn drop(&mut self) {
        let ledger = std::mem::take(&mut *self.ledger());
        if self.bind().is_ok() {
            self.synchronize();
            let pages: Vec<_> = ledger.pages.into_iter().collect();
            self.release_pages(&pages);
            for (&addr, &span) in &ledger.reservations {
                // SAFETY: a reservation of ours whose pages were all released above.
                unsafe { sys::cuMemAddressFree(addr, span as usize) };
            }
            for &addr in ledger.segments.keys() {
                // SAFETY: a segment of ours; the allocator that could hand it out is gone.
                unsafe { sys::cuMemFree_v2(addr) };
            }
        }
        // SAFETY: balances the retain in `new`; nothing of ours uses the context now.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.context.device) };
    }
}
