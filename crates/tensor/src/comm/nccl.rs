//! The `nccl` backend: ranks as processes, one per GPU, collectives on NCCL.
//!
//! [`NcclLibrary`] opens `libnccl.so.2` at run time by absolute path, as NVRTC is found
//! (`HEADROOM_NCCL_LIB_DIR`, `HEADROOM_CUDA_LIB_DIR`, `$CUDA_HOME`, the system's library
//! folders, then the `nvidia-nccl-cu13` wheel's `nvidia/nccl/lib` in a Python
//! site-packages), and resolves every symbol the backend calls; it needs no GPU, so the
//! tests check the load on any machine that has the wheel. (cudarc's NCCL module looks
//! the library up by the bare name `libnccl.so`, which neither the wheel nor a driver-only
//! machine has, so the few calls are bound here.)
//!
//! With the `cuda` feature, `NcclComm` is a `Communicator` over one NCCL
//! communicator per group: the unique id is made by the group's rank 0 and broadcast
//! over the group's control communicator (MPI), every exchange is enqueued on the
//! device's own stream (so it is ordered with the kernels around it, as our allocator's
//! stream-ordered frees assume), and `Communicator::abort` is `ncclCommAbort` followed
//! by the control group's abort.

use std::ffi::{c_char, c_int, c_void};
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::error::{Result, TensorError};

/// The library file the backend loads.
pub const NCCL_LIB: &str = "libnccl.so.2";

/// Bytes of an `ncclUniqueId`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUint8`: every exchange moves bytes.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the communicator only
const NCCL_UINT8: c_int = 1;

fn nccl_err(op: &'static str, reason: impl Into<String>) -> TensorError {
    TensorError::Comm {
        backend: "nccl",
        op,
        reason: reason.into(),
    }
}

type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type GetUniqueId = unsafe extern "C" fn(*mut [u8; UNIQUE_ID_BYTES]) -> c_int;
type CommInitRank =
    unsafe extern "C" fn(*mut *mut c_void, c_int, [u8; UNIQUE_ID_BYTES], c_int) -> c_int;
type AllGather = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    *mut c_void,
    *mut c_void,
) -> c_int;
type SendRecv =
    unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, *mut c_void, *mut c_void) -> c_int;
type Group = unsafe extern "C" fn() -> c_int;
type CommOp = unsafe extern "C" fn(*mut c_void) -> c_int;
type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;

/// The NCCL entry points the backend calls, resolved from one loaded library.
#[derive(Debug)]
// Without `cuda` only the load check reads the library; the communicator calls the rest.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub struct NcclLibrary {
    path: PathBuf,
    get_version: GetVersion,
    get_unique_id: GetUniqueId,
    comm_init_rank: CommInitRank,
    all_gather: AllGather,
    send: SendRecv,
    recv: SendRecv,
    group_start: Group,
    group_end: Group,
    comm_abort: CommOp,
    comm_destroy: CommOp,
    error_string: ErrorString,
    _lib: libloading::Library,
}

/// The folders searched for [`NCCL_LIB`], in order (existing or not).
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["HEADROOM_NCCL_LIB_DIR", "HEADROOM_CUDA_LIB_DIR"] {
        if let Some(dir) = std::env::var_os(var).filter(|d| !d.is_empty()) {
            dirs.push(PathBuf::from(dir));
        }
    }
    if let Some(home) = std::env::var_os("CUDA_HOME").filter(|d| !d.is_empty()) {
        dirs.push(PathBuf::from(home).join("lib64"));
    }
    for dir in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/local/cuda/lib64",
        "/usr/lib64",
    ] {
        dirs.push(PathBuf::from(dir));
    }
    for site in crate::cuda::nvrtc::site_packages() {
        dirs.push(site.join("nvidia/nccl/lib"));
    }
    // The wheel beside NVRTC's (e.g. `.venv-nvrtc/…/nvidia/cu13/lib` → `nvidia/nccl/lib`).
    if let Some(dir) = std::env::var_os("HEADROOM_CUDA_LIB_DIR").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        if let Some(nvidia) = dir.parent().and_then(|p| p.parent()) {
            dirs.push(nvidia.join("nccl/lib"));
        }
    }
    dirs
}

impl NcclLibrary {
    /// The process-wide library, loaded on first use; the error says where it looked.
    pub fn get() -> Result<&'static NcclLibrary> {
        static NCCL: OnceLock<std::result::Result<NcclLibrary, String>> = OnceLock::new();
        NCCL.get_or_init(|| Self::find().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| nccl_err("load", e.clone()))
    }

    /// Loads [`NCCL_LIB`] from the first of [`search_dirs`] that holds it.
    pub fn find() -> Result<NcclLibrary> {
        let dirs = search_dirs();
        let path = dirs
            .iter()
            .map(|d| d.join(NCCL_LIB))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                nccl_err(
                    "load",
                    format!(
                        "{NCCL_LIB} not found in {} (pip install nvidia-nccl-cu13, or set HEADROOM_NCCL_LIB_DIR)",
                        dirs.iter()
                            .map(|d| d.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })?;
        Self::open(path)
    }

    /// Loads the library at `path` and resolves every symbol the backend calls (a
    /// missing one is an error naming it).
    pub fn open(path: PathBuf) -> Result<NcclLibrary> {
        // SAFETY: loading NCCL runs its initialisers, which only set up process-local
        // state; the library stays loaded for as long as the returned value lives.
        let lib = unsafe { libloading::Library::new(&path) }
            .map_err(|e| nccl_err("load", format!("{}: {e}", path.display())))?;
        macro_rules! sym {
            ($name:literal, $ty:ty) => {{
                // SAFETY: the symbol is NCCL's C function of this signature (nccl.h);
                // the pointer is only called while `_lib` keeps the library loaded.
                let f: libloading::Symbol<'_, $ty> = unsafe { lib.get($name.as_bytes()) }
                    .map_err(|e| nccl_err("load", format!("{}: {}: {e}", path.display(), $name)))?;
                *f
            }};
        }
        Ok(NcclLibrary {
            get_version: sym!("ncclGetVersion", GetVersion),
            get_unique_id: sym!("ncclGetUniqueId", GetUniqueId),
            comm_init_rank: sym!("ncclCommInitRank", CommInitRank),
            all_gather: sym!("ncclAllGather", AllGather),
            send: sym!("ncclSend", SendRecv),
            recv: sym!("ncclRecv", SendRecv),
            group_start: sym!("ncclGroupStart", Group),
            group_end: sym!("ncclGroupEnd", Group),
            comm_abort: sym!("ncclCommAbort", CommOp),
            comm_destroy: sym!("ncclCommDestroy", CommOp),
            error_string: sym!("ncclGetErrorString", ErrorString),
            path,
            _lib: lib,
        })
    }

    /// Where the library was loaded from.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// NCCL's version as `major·10000 + minor·100 + patch` (needs no GPU).
    pub fn version(&self) -> Result<i32> {
        let mut v: c_int = 0;
        // SAFETY: `ncclGetVersion` writes one int through the pointer it is given.
        let code = unsafe { (self.get_version)(&mut v) };
        self.check("ncclGetVersion", code)?;
        Ok(v)
    }

    fn check(&self, op: &'static str, code: c_int) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: `ncclGetErrorString` returns a static NUL-terminated string.
        let text = unsafe {
            let p = (self.error_string)(code);
            if p.is_null() {
                format!("error {code}")
            } else {
                std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Err(nccl_err(op, text))
    }
}

#[cfg(feature = "cuda")]
pub use comm::NcclComm;

#[cfg(feature = "cuda")]
mod comm {
    use std::ffi::c_void;
    use std::sync::{Arc, Mutex};

    use super::{NcclLibrary, NCCL_UINT8, UNIQUE_ID_BYTES};
    use crate::comm::Communicator;
    use crate::error::Result;
    use crate::{Device, Tensor};

    /// One rank's handle on an NCCL communicator over a GPU device's stream.
    pub struct NcclComm {
        nccl: &'static NcclLibrary,
        comm: Mutex<*mut c_void>,
        stream: *mut c_void,
        control: Arc<dyn Communicator>,
        device: Device,
    }

    // SAFETY: the raw communicator is only used under its mutex, and NCCL allows a
    // communicator to be used from any thread as long as calls do not overlap; the stream
    // handle belongs to the device's launcher, which outlives this value (it holds the
    // device).
    unsafe impl Send for NcclComm {}
    // SAFETY: as for `Send`.
    unsafe impl Sync for NcclComm {}

    impl std::fmt::Debug for NcclComm {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("NcclComm")
                .field("rank", &self.control.rank())
                .field("size", &self.control.size())
                .finish()
        }
    }

    impl NcclComm {
        /// The NCCL communicator of `control`'s group (every rank of it calls this), on
        /// `device`'s stream: rank 0 makes the unique id and broadcasts it over `control`.
        pub fn init(control: Arc<dyn Communicator>, device: &Device) -> Result<Self> {
            let nccl = NcclLibrary::get()?;
            let launcher = device
                .launcher()
                .ok_or_else(|| super::nccl_err("init", "needs a CUDA device"))?;
            let stream = launcher
                .cuda_stream()
                .ok_or_else(|| super::nccl_err("init", "the device has no CUDA stream"))?
                as *mut c_void;
            let mut id = [0u8; UNIQUE_ID_BYTES];
            if control.rank() == 0 {
                // SAFETY: `ncclGetUniqueId` fills the 128-byte id it is given.
                let code = unsafe { (nccl.get_unique_id)(&mut id) };
                nccl.check("ncclGetUniqueId", code)?;
            }
            let shared = control.broadcast_bytes(0, id.to_vec())?;
            if shared.len() != UNIQUE_ID_BYTES {
                return Err(super::nccl_err(
                    "init",
                    "the broadcast unique id is not 128 bytes",
                ));
            }
            id.copy_from_slice(&shared);
            let mut comm: *mut c_void = std::ptr::null_mut();
            // SAFETY: `comm` receives the new communicator; the id is the group's own.
            let code = unsafe {
                (nccl.comm_init_rank)(&mut comm, control.size() as i32, id, control.rank() as i32)
            };
            nccl.check("ncclCommInitRank", code)?;
            Ok(Self {
                nccl,
                comm: Mutex::new(comm),
                stream,
                control,
                device: device.clone(),
            })
        }

        fn comm(&self) -> std::sync::MutexGuard<'_, *mut c_void> {
            self.comm.lock().unwrap_or_else(|p| p.into_inner())
        }
    }

    impl Communicator for NcclComm {
        fn rank(&self) -> usize {
            self.control.rank()
        }

        fn size(&self) -> usize {
            self.control.size()
        }

        fn backend(&self) -> &'static str {
            "nccl"
        }

        fn exchange_all_gather(&self, send: &Tensor, recv: &mut Tensor) -> Result<()> {
            let bytes = send.numel() * send.dtype().size();
            let comm = self.comm();
            // SAFETY: both tensors are live contiguous blocks of this device (their
            // addresses come from its allocator, `recv` holds size × `bytes`); the
            // exchange is enqueued on the device's stream, after the work that wrote
            // `send` and before the work that reads `recv`.
            let code = unsafe {
                (self.nccl.all_gather)(
                    send.device_addr() as *const c_void,
                    recv.device_addr() as *mut c_void,
                    bytes,
                    NCCL_UINT8,
                    *comm,
                    self.stream,
                )
            };
            self.nccl.check("ncclAllGather", code)
        }

        fn exchange_all_to_all(&self, send: &Tensor, recv: &mut Tensor) -> Result<()> {
            let n = self.size();
            let part = send.numel() * send.dtype().size() / n;
            let comm = self.comm();
            // SAFETY: as for the all-gather; part j of each buffer lies within it.
            unsafe {
                self.nccl
                    .check("ncclGroupStart", (self.nccl.group_start)())?;
                for j in 0..n {
                    let offset = (j * part) as u64;
                    self.nccl.check(
                        "ncclSend",
                        (self.nccl.send)(
                            (send.device_addr() + offset) as *mut c_void,
                            part,
                            NCCL_UINT8,
                            j as i32,
                            *comm,
                            self.stream,
                        ),
                    )?;
                    self.nccl.check(
                        "ncclRecv",
                        (self.nccl.recv)(
                            (recv.device_addr() + offset) as *mut c_void,
                            part,
                            NCCL_UINT8,
                            j as i32,
                            *comm,
                            self.stream,
                        ),
                    )?;
                }
                self.nccl.check("ncclGroupEnd", (self.nccl.group_end)())
            }
        }

        fn broadcast_bytes(&self, root: usize, bytes: Vec<u8>) -> Result<Vec<u8>> {
            self.control.broadcast_bytes(root, bytes)
        }

        fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
            self.control.all_gather_bytes(mine)
        }

        fn abort(&self) {
            let comm = self.comm();
            // SAFETY: aborting a live communicator; pending NCCL work on it ends.
            unsafe {
                (self.nccl.comm_abort)(*comm);
            }
            drop(comm);
            self.control.abort();
        }
    }

    impl Drop for NcclComm {
        fn drop(&mut self) {
            let _ = self.device.synchronize();
            let comm = self.comm();
            // SAFETY: the communicator is destroyed once, after the stream's work on it.
            unsafe {
                (self.nccl.comm_destroy)(*comm);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_loads_and_resolves_every_symbol_where_its_library_is_installed() {
        match NcclLibrary::find() {
            Ok(nccl) => {
                let v = nccl.version().unwrap();
                println!("{} NCCL {v}: every symbol resolved", nccl.path().display());
                assert!(v >= 22000, "NCCL {v} is older than 2.20");
            }
            Err(e) => headroom_mem::required::missing(
                "nccl",
                &e.to_string(),
                "pip install nvidia-nccl-cu13==2.30.7, then HEADROOM_CUDA_LIB_DIR",
            ),
        }
    }
}
