//! A [`Launcher`] for machines without a GPU: it computes nothing, and checks everything
//! about each launch that can be checked without running it.
//!
//! - The kernel is in the catalog, and its arguments have the sizes of the compiled
//!   kernel's parameters (read from the sm_90 cubins, when NVRTC is there).
//! - The launch shape is legal (threads per block ≤ 1024, grid y and z ≤ 65 535).
//! - Every pointer lies inside one live tensor block, with all the bytes the kernel may
//!   touch from it; every buffer a launch, GEMM or download reads was written before (by
//!   a launch, an upload or a zero fill) since its block was handed out. An op that
//!   skipped its GPU path, or a wrong address or size, fails here.
//!
//! Downloads give zeros: on such a device values are not computed, as on a meta device.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::cache::DiskCache;
use super::compile::compile_all;
use super::cubin::kernel_params;
use super::error::{CudaError, Result};
pub use super::launch::CheckReport;
use super::launch::{Access, Arg, GemmOperands, GemmShape, Launch, Launcher};
use super::modules::MODULES;

/// The arch whose cubins give the parameter tables.
pub const CHECK_ARCH: &str = "sm_90";

/// Where the parameter tables came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamSource {
    /// Compiled cubins of [`CHECK_ARCH`]: argument sizes are checked.
    Cubins,
    /// NVRTC could not be loaded (the reason): only kernel names are checked.
    NamesOnly(String),
}

#[derive(Debug)]
struct Block {
    bytes: u64,
    written: bool,
}

#[derive(Debug, Default)]
struct State {
    blocks: BTreeMap<u64, Block>,
    report: CheckReport,
}

impl State {
    /// The block holding `[addr, addr + bytes)`, or why there is none.
    fn block(&mut self, addr: u64, bytes: u64) -> std::result::Result<&mut Block, String> {
        let (&start, block) = self
            .blocks
            .range_mut(..=addr)
            .next_back()
            .ok_or_else(|| format!("address {addr:#x} is in no live tensor block"))?;
        if addr + bytes > start + block.bytes.max(1) {
            return Err(format!(
                "{bytes} bytes at {addr:#x} run past the block of {} bytes at {start:#x}",
                block.bytes
            ));
        }
        Ok(block)
    }

    /// Checks a read of `bytes` at `addr` (nothing to check for zero bytes).
    fn read(&mut self, addr: u64, bytes: u64) -> std::result::Result<(), String> {
        if bytes == 0 {
            return Ok(());
        }
        let block = self.block(addr, bytes)?;
        if block.written {
            Ok(())
        } else {
            Err(format!(
                "reads {bytes} bytes at {addr:#x} that nothing wrote (an op that did not run on the GPU?)"
            ))
        }
    }

    /// Checks a write of `bytes` at `addr`, then marks its block written.
    fn write(&mut self, addr: u64, bytes: u64) -> std::result::Result<(), String> {
        if bytes == 0 {
            return Ok(());
        }
        self.block(addr, bytes)?.written = true;
        Ok(())
    }
}

/// The parameter tables of the catalog's kernels, compiled once per process.
fn tables() -> &'static std::result::Result<HashMap<String, Vec<usize>>, String> {
    static TABLES: OnceLock<std::result::Result<HashMap<String, Vec<usize>>, String>> =
        OnceLock::new();
    TABLES.get_or_init(|| {
        let compiled = compile_all(CHECK_ARCH, DiskCache::default_location().as_ref())
            .map_err(|e| e.to_string())?;
        let mut all = HashMap::new();
        for m in compiled {
            all.extend(kernel_params(&m.cubin).map_err(|e| e.to_string())?);
        }
        Ok(all)
    })
}

/// Validates launches instead of running them (see the module docs).
#[derive(Debug)]
pub struct CheckedLauncher {
    params: Option<&'static HashMap<String, Vec<usize>>>,
    source: ParamSource,
    state: Mutex<State>,
}

impl CheckedLauncher {
    /// A checker with the sm_90 parameter tables; names only when NVRTC cannot be loaded,
    /// unless NVRTC is required here ([`headroom_mem::required`]: then that is an error).
    pub fn new() -> Result<Self> {
        let (params, source) = match tables() {
            Ok(t) => (Some(t), ParamSource::Cubins),
            Err(reason) => {
                if headroom_mem::required::is_required("nvrtc") {
                    return Err(CudaError::Launch {
                        kernel: "parameter tables".into(),
                        reason: reason.clone(),
                    });
                }
                (None, ParamSource::NamesOnly(reason.clone()))
            }
        };
        Ok(Self {
            params,
            source,
            state: Mutex::new(State::default()),
        })
    }

    /// Where the parameter tables came from.
    pub fn source(&self) -> &ParamSource {
        &self.source
    }

    /// What was launched so far.
    pub fn report(&self) -> CheckReport {
        self.state().report.clone()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check_launch(&self, l: &Launch) -> std::result::Result<(), String> {
        if !MODULES
            .iter()
            .any(|m| m.kernels.iter().any(|(k, _)| *k == l.kernel))
        {
            return Err("no such kernel in the catalog".into());
        }
        if let Some(params) = self.params {
            let want = params
                .get(l.kernel)
                .ok_or("the cubin has no parameter table for it")?;
            let got: Vec<usize> = l.args.iter().map(Arg::size).collect();
            if &got != want {
                return Err(format!(
                    "argument sizes {got:?} do not match the kernel's parameters {want:?}"
                ));
            }
        }
        let threads: u32 = l.block.iter().product();
        if threads == 0 || threads > 1024 || l.grid.contains(&0) {
            return Err(format!(
                "launch shape grid {:?} block {:?}",
                l.grid, l.block
            ));
        }
        if l.grid[1] > 65_535 || l.grid[2] > 65_535 {
            return Err(format!("grid {:?}: y and z are at most 65 535", l.grid));
        }
        let mut state = self.state();
        // Every read is checked before any write of the launch marks a block written.
        for pass in [Access::Read, Access::Write] {
            for a in &l.args {
                match *a {
                    Arg::Ptr {
                        addr,
                        bytes,
                        access,
                    } if access == pass => match access {
                        Access::Read => state.read(addr, bytes)?,
                        Access::Write => state.write(addr, bytes)?,
                    },
                    _ => {}
                }
            }
        }
        *state
            .report
            .launches
            .entry(l.kernel.to_string())
            .or_default() += 1;
        Ok(())
    }
}

fn failed(kernel: impl Into<String>) -> impl FnOnce(String) -> CudaError {
    move |reason| CudaError::Launch {
        kernel: kernel.into(),
        reason,
    }
}

impl Launcher for CheckedLauncher {
    fn describe(&self) -> String {
        match &self.source {
            ParamSource::Cubins => {
                format!("checked launches (no GPU; {CHECK_ARCH} parameter tables)")
            }
            ParamSource::NamesOnly(_) => "checked launches (no GPU; kernel names only)".into(),
        }
    }

    fn launch(&self, launch: &Launch) -> Result<()> {
        self.check_launch(launch).map_err(failed(launch.kernel))
    }

    fn gemm(&self, shape: &GemmShape, ops: &GemmOperands) -> Result<()> {
        let (m, n, k) = (shape.m, shape.n, shape.k);
        let size = shape.input_size();
        let mut state = self.state();
        let run = |state: &mut State| -> std::result::Result<(), String> {
            state.read(ops.x, m * k * size)?;
            state.read(ops.w, n * k * size)?;
            if shape.epilogue != super::launch::Epilogue::None {
                let bias = ops
                    .bias
                    .ok_or("the epilogue adds a bias but none was given")?;
                state.read(bias, n * 4)?;
            }
            state.write(ops.y, m * n * 4)
        };
        run(&mut state).map_err(failed(format!("gemm {m}x{n}x{k}")))?;
        state.report.gemms += 1;
        state.report.gemm_flops += 2.0 * (m * n * k) as f64;
        Ok(())
    }

    /// True: the checks follow sm_90's cubins, and sm_90 has fp8 GEMMs.
    fn fp8_gemm(&self) -> bool {
        true
    }

    fn upload(&self, dst: u64, src: &[u8]) -> Result<()> {
        let mut state = self.state();
        state
            .write(dst, src.len() as u64)
            .map_err(failed("upload"))?;
        state.report.uploaded_bytes += src.len() as u64;
        Ok(())
    }

    fn download(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        let mut state = self.state();
        state
            .read(src, dst.len() as u64)
            .map_err(failed("download"))?;
        dst.fill(0);
        state.report.downloaded_bytes += dst.len() as u64;
        Ok(())
    }

    fn zero(&self, dst: u64, bytes: u64) -> Result<()> {
        self.state().write(dst, bytes).map_err(failed("zero"))
    }

    fn allocated(&self, addr: u64, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let mut state = self.state();
        // Blocks never overlap: only the one starting below `addr` and those starting
        // inside the new block can reach into it.
        let below = state
            .blocks
            .range(..addr)
            .next_back()
            .filter(|(&s, b)| s + b.bytes > addr)
            .map(|(&s, _)| s);
        let inside = state.blocks.range(addr..addr + bytes).map(|(&s, _)| s);
        let stale: Vec<u64> = below.into_iter().chain(inside).collect();
        for s in stale {
            state.blocks.remove(&s);
        }
        state.blocks.insert(
            addr,
            Block {
                bytes,
                written: false,
            },
        );
    }

    fn released(&self, addr: u64) {
        self.state().blocks.remove(&addr);
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn check_report(&self) -> Option<CheckReport> {
        Some(self.report())
    }
}
