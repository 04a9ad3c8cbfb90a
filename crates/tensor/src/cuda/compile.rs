//! Compiling the kernel modules for one arch: the common NVRTC options, the cache lookup,
//! and the per-kernel resource report joined with the catalog.

use super::cache::{cache_key, DiskCache};
use super::error::{CudaError, Result};
use super::modules::{KernelModule, Op, MODULES, PRELUDE};
use super::nvrtc::{Compiled, Nvrtc};
use super::ptxas::parse_log;

/// Archs the kernels are written for (`mma.sync` bf16 needs sm_80 or newer).
pub const ARCHS: &[&str] = &["sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"];

/// Static shared memory one block may declare (ptxas rejects more).
pub const STATIC_SHARED_LIMIT_BYTES: u64 = 48 * 1024;

/// One kernel's resource use on one arch.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KernelStats {
    /// The module (`.cu` file stem).
    pub module: &'static str,
    /// The kernel's name.
    pub name: &'static str,
    /// The op it serves.
    pub op: &'static str,
    /// Registers per thread.
    pub registers: u32,
    /// Spill stores + loads, bytes.
    pub spill_bytes: u64,
    /// Static shared memory, bytes.
    pub shared_bytes: u64,
    /// Local-memory stack frame, bytes.
    #[serde(skip)]
    pub stack_bytes: u64,
}

/// A compiled module: the cubin, NVRTC's log and the per-kernel report.
#[derive(Debug, Clone)]
pub struct CompiledModule {
    /// The catalog entry.
    pub module: &'static KernelModule,
    /// The arch it was compiled for.
    pub arch: String,
    /// The cubin.
    pub cubin: Vec<u8>,
    /// NVRTC's log.
    pub log: String,
    /// One entry per catalog kernel, in catalog order.
    pub kernels: Vec<KernelStats>,
    /// Whether the cubin came from the disk cache.
    pub cached: bool,
    /// Why the result could not be stored in the cache, if it could not.
    pub cache_error: Option<String>,
}

/// Checks `arch` is one of [`ARCHS`].
pub fn check_arch(arch: &str) -> Result<()> {
    if ARCHS.contains(&arch) {
        Ok(())
    } else {
        Err(CudaError::Arch(arch.to_string()))
    }
}

/// The NVRTC options for `module` on `arch`.
pub fn options(module: &KernelModule, arch: &str) -> Vec<String> {
    let mut opts = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "-Xptxas=-v".to_string(),
    ];
    opts.extend(module.extra_options.iter().map(|s| s.to_string()));
    opts
}

/// Compiles `module` for `arch`, through `cache` when given.
pub fn compile_module(
    nvrtc: &Nvrtc,
    module: &'static KernelModule,
    arch: &str,
    cache: Option<&DiskCache>,
) -> Result<CompiledModule> {
    check_arch(arch)?;
    let opts = options(module, arch);
    let version = nvrtc.version();
    let joined = opts.join("\u{1f}");
    let key = cache_key(&[module.source, PRELUDE.source, &joined, &version, arch]);
    let (compiled, cached, cache_error) = match cache.and_then(|c| c.get(&key)) {
        Some(hit) => (hit, true, None),
        None => {
            let fresh: Compiled =
                nvrtc.compile(module.name, arch, module.source, &[PRELUDE], &opts)?;
            let err = cache.and_then(|c| c.put(&key, &fresh).err().map(|e| e.to_string()));
            (fresh, false, err)
        }
    };
    let entries = parse_log(&compiled.log);
    let kernels = module
        .kernels
        .iter()
        .map(|&(name, op)| {
            let e = entries
                .iter()
                .find(|e| e.name == name)
                .ok_or_else(|| CudaError::Compile {
                    module: module.name.to_string(),
                    arch: arch.to_string(),
                    log: format!(
                        "kernel {name} is in the catalog but not in ptxas's report:\n{}",
                        compiled.log
                    ),
                })?;
            Ok(KernelStats {
                module: module.name,
                name,
                op: op_name(op),
                registers: e.registers,
                spill_bytes: e.spill_bytes,
                shared_bytes: e.shared_bytes,
                stack_bytes: e.stack_bytes,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(CompiledModule {
        module,
        arch: arch.to_string(),
        cubin: compiled.cubin,
        log: compiled.log,
        kernels,
        cached,
        cache_error,
    })
}

fn op_name(op: Op) -> &'static str {
    op.name()
}

/// Compiles every module of [`MODULES`] for `arch` with the process's NVRTC.
pub fn compile_all(arch: &str, cache: Option<&DiskCache>) -> Result<Vec<CompiledModule>> {
    check_arch(arch)?;
    let nvrtc = Nvrtc::get()?;
    MODULES
        .iter()
        .map(|m| compile_module(nvrtc, m, arch, cache))
        .collect()
}
