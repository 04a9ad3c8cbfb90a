//! NVRTC, CUDA's run-time compiler, loaded by absolute path with `libloading`: CUDA C in,
//! a cubin for one arch out, plus the compile log (with `-Xptxas=-v`: registers, spills
//! and shared memory per kernel). It needs no GPU, no driver and no toolkit, only
//! `libnvrtc.so.13` and its builtins library, which the PyPI wheel
//! `nvidia-cuda-nvrtc==13.0.88` ships.
//!
//! Lookup order: `HEADROOM_CUDA_LIB_DIR`, `$CUDA_HOME/lib64`, `/usr/local/cuda/lib64`,
//! then Python site-packages (`nvidia/cu13/lib`, `nvidia/cuda_nvrtc/lib`) of the active
//! virtual environment, conda, the user's and the system's Python. The builtins library
//! is opened first by absolute path so that NVRTC's own `dlopen` of it by name finds the
//! already loaded copy instead of searching `LD_LIBRARY_PATH`.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::error::{CudaError, Result};

/// The NVRTC library's file name (CUDA 13).
pub const NVRTC_LIB: &str = "libnvrtc.so.13";

type Program = *mut c_void;
type NvrtcResult = c_int;

/// The NVRTC entry points this module calls, resolved once.
struct Api {
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult,
    error_string: unsafe extern "C" fn(NvrtcResult) -> *const c_char,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcResult,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult,
    destroy: unsafe extern "C" fn(*mut Program) -> NvrtcResult,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    log: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
}

/// A loaded NVRTC: the library handles (kept open for the process) and its version.
pub struct Nvrtc {
    api: Api,
    dir: PathBuf,
    version: (i32, i32),
    _builtins: Option<libloading::Library>,
    _lib: libloading::Library,
}

impl std::fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvrtc")
            .field("dir", &self.dir)
            .field("version", &self.version)
            .finish()
    }
}

/// One header handed to NVRTC by name (`#include "name"` finds it without a file).
#[derive(Debug, Clone, Copy)]
pub struct Header {
    /// The include name.
    pub name: &'static str,
    /// Its text.
    pub source: &'static str,
}

/// The result of a successful compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiled {
    /// The cubin (ELF for the requested `sm_*` arch).
    pub cubin: Vec<u8>,
    /// NVRTC's log (ptxas's `-v` report when asked).
    pub log: String,
}

/// The folders searched for NVRTC, in order (existing or not).
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = std::env::var_os("HEADROOM_CUDA_LIB_DIR").filter(|d| !d.is_empty()) {
        dirs.push(PathBuf::from(dir));
    }
    if let Some(home) = std::env::var_os("CUDA_HOME").filter(|d| !d.is_empty()) {
        let home = PathBuf::from(home);
        dirs.push(home.join("lib64"));
        dirs.push(home.join("lib"));
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    for site in site_packages() {
        dirs.push(site.join("nvidia/cu13/lib"));
        dirs.push(site.join("nvidia/cuda_nvrtc/lib"));
    }
    dirs
}

/// Python site-packages folders that may hold NVIDIA wheels: the active virtual
/// environment, conda, the user's and the system's, each `lib/python3.*/{site,dist}-packages`.
pub(crate) fn site_packages() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(p) = std::env::var_os(var).filter(|d| !d.is_empty()) {
            roots.push(PathBuf::from(p));
        }
    }
    if let Some(home) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        roots.push(PathBuf::from(home).join(".local"));
    }
    roots.push(PathBuf::from("/usr/local"));
    roots.push(PathBuf::from("/usr"));
    let mut out = Vec::new();
    for root in roots {
        let lib = root.join("lib");
        let Ok(entries) = std::fs::read_dir(&lib) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .collect();
        pythons.sort();
        for py in pythons {
            for sub in ["site-packages", "dist-packages"] {
                let site = py.join(sub);
                if site.is_dir() {
                    out.push(site);
                }
            }
        }
    }
    out
}

/// The builtins library beside `lib` (`libnvrtc-builtins.so.13.*`), if any.
fn builtins_in(dir: &Path) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc-builtins.so.13"))
        })
        .collect();
    found.sort();
    found.into_iter().next()
}

impl Nvrtc {
    /// The process-wide NVRTC, loaded on first use; the error says where it looked.
    pub fn get() -> Result<&'static Nvrtc> {
        static NVRTC: OnceLock<Result<Nvrtc>> = OnceLock::new();
        NVRTC
            .get_or_init(Nvrtc::find)
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Searches [`search_dirs`] and loads the first folder holding [`NVRTC_LIB`].
    pub fn find() -> Result<Nvrtc> {
        let looked = search_dirs();
        for dir in &looked {
            if dir.join(NVRTC_LIB).is_file() {
                return Nvrtc::load(dir);
            }
        }
        Err(CudaError::NvrtcNotFound { looked })
    }

    /// Loads NVRTC from `dir` (builtins first, then `libnvrtc.so.13`).
    pub fn load(dir: &Path) -> Result<Nvrtc> {
        let path = dir.join(NVRTC_LIB);
        let load_error = |path: &Path, e: libloading::Error| CudaError::NvrtcLoad {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        let builtins = match builtins_in(dir) {
            // SAFETY: loading NVIDIA's builtins library runs only its initialisers,
            // which have no preconditions.
            Some(b) => {
                Some(unsafe { libloading::Library::new(&b) }.map_err(|e| load_error(&b, e))?)
            }
            None => None,
        };
        // SAFETY: as above, for libnvrtc itself.
        let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| load_error(&path, e))?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is an NVRTC C entry point whose signature is the
                // one of the field it is stored in (nvrtc.h of CUDA 13.0); the library
                // stays loaded as long as `Nvrtc`, which owns it.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| load_error(&path, e))?
            };
        }
        let api = Api {
            version: sym!("nvrtcVersion"),
            error_string: sym!("nvrtcGetErrorString"),
            create: sym!("nvrtcCreateProgram"),
            compile: sym!("nvrtcCompileProgram"),
            destroy: sym!("nvrtcDestroyProgram"),
            log_size: sym!("nvrtcGetProgramLogSize"),
            log: sym!("nvrtcGetProgramLog"),
            cubin_size: sym!("nvrtcGetCUBINSize"),
            cubin: sym!("nvrtcGetCUBIN"),
        };
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out pointers.
        let rc = unsafe { (api.version)(&mut major, &mut minor) };
        let mut nvrtc = Nvrtc {
            api,
            dir: dir.to_path_buf(),
            version: (0, 0),
            _builtins: builtins,
            _lib: lib,
        };
        nvrtc.check(rc, "nvrtcVersion")?;
        nvrtc.version = (major, minor);
        Ok(nvrtc)
    }

    /// The folder NVRTC was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// NVRTC's version as `major.minor` (`13.0`).
    pub fn version(&self) -> String {
        format!("{}.{}", self.version.0, self.version.1)
    }

    fn check(&self, rc: NvrtcResult, call: &'static str) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: nvrtcGetErrorString returns a static string for any code.
        let text = unsafe { (self.api.error_string)(rc) };
        let reason = if text.is_null() {
            format!("error {rc}")
        } else {
            // SAFETY: non-null, NUL-terminated and static (nvrtc.h).
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        };
        Err(CudaError::Nvrtc { call, reason })
    }

    /// Compiles `source` (named `module` in messages) with `options` and `headers`; a
    /// failed compile is [`CudaError::Compile`] with NVRTC's log.
    pub fn compile(
        &self,
        module: &str,
        arch: &str,
        source: &str,
        headers: &[Header],
        options: &[String],
    ) -> Result<Compiled> {
        let cstr = |s: &str, what: &'static str| {
            CString::new(s).map_err(|_| CudaError::Nvrtc {
                call: what,
                reason: "text holds a NUL byte".into(),
            })
        };
        let src = cstr(source, "nvrtcCreateProgram")?;
        let name = cstr(&format!("{module}.cu"), "nvrtcCreateProgram")?;
        let header_src: Vec<CString> = headers
            .iter()
            .map(|h| cstr(h.source, "nvrtcCreateProgram"))
            .collect::<Result<_>>()?;
        let header_names: Vec<CString> = headers
            .iter()
            .map(|h| cstr(h.name, "nvrtcCreateProgram"))
            .collect::<Result<_>>()?;
        let header_src_ptrs: Vec<*const c_char> = header_src.iter().map(|s| s.as_ptr()).collect();
        let header_name_ptrs: Vec<*const c_char> =
            header_names.iter().map(|s| s.as_ptr()).collect();
        let opts: Vec<CString> = options
            .iter()
            .map(|o| cstr(o, "nvrtcCompileProgram"))
            .collect::<Result<_>>()?;
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|s| s.as_ptr()).collect();

        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: every pointer is a live NUL-terminated string (or an array of them of
        // the given length) that outlives the call; `prog` is a valid out pointer.
        let rc = unsafe {
            (self.api.create)(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                headers.len() as c_int,
                header_src_ptrs.as_ptr(),
                header_name_ptrs.as_ptr(),
            )
        };
        self.check(rc, "nvrtcCreateProgram")?;
        let guard = ProgramGuard {
            api: &self.api,
            prog,
        };
        // SAFETY: `prog` was created above; the options array has `opts.len()` live strings.
        let compile_rc =
            unsafe { (self.api.compile)(guard.prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
        let log = self.read_log(guard.prog)?;
        if compile_rc != 0 {
            return Err(CudaError::Compile {
                module: module.to_string(),
                arch: arch.to_string(),
                log,
            });
        }
        let mut size = 0usize;
        // SAFETY: valid program and out pointer.
        self.check(
            unsafe { (self.api.cubin_size)(guard.prog, &mut size) },
            "nvrtcGetCUBINSize",
        )?;
        let mut cubin = vec![0u8; size];
        // SAFETY: the buffer has the size NVRTC just reported.
        self.check(
            unsafe { (self.api.cubin)(guard.prog, cubin.as_mut_ptr().cast()) },
            "nvrtcGetCUBIN",
        )?;
        Ok(Compiled { cubin, log })
    }

    fn read_log(&self, prog: Program) -> Result<String> {
        let mut size = 0usize;
        // SAFETY: valid program and out pointer.
        self.check(
            unsafe { (self.api.log_size)(prog, &mut size) },
            "nvrtcGetProgramLogSize",
        )?;
        let mut buf = vec![0u8; size.max(1)];
        // SAFETY: the buffer has the size NVRTC just reported (at least 1 byte for NUL).
        self.check(
            unsafe { (self.api.log)(prog, buf.as_mut_ptr().cast()) },
            "nvrtcGetProgramLog",
        )?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }
}

/// Destroys an NVRTC program on every path out of [`Nvrtc::compile`].
struct ProgramGuard<'a> {
    api: &'a Api,
    prog: Program,
}

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: `prog` came from nvrtcCreateProgram and is destroyed exactly once.
        unsafe { (self.api.destroy)(&mut self.prog) };
    }
}

// SAFETY: NVRTC's API is thread-safe for distinct programs (nvrtc.h: "all NVRTC API
// functions are thread safe"); the struct holds only function pointers and handles.
unsafe impl Send for Nvrtc {}
// SAFETY: as above; no method mutates shared state.
unsafe impl Sync for Nvrtc {}
