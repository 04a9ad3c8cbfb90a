//! `--device cpu|cuda[:N]|cuda-check`, shared by `generate`, `bench session` and `plan`.
//!
//! `cuda` needs a build with `--features cuda` and a GPU the driver can open; both
//! failures are errors (exit code 2) with the reason. `generate` runs the engine on it;
//! `bench session` and `plan --measure` run on the host only, and `plan` reads the card's
//! capacity. `cuda-check` runs `generate` through the GPU path on a machine without one:
//! every op is launched against the checked launcher (argument sizes held to the sm_90
//! cubins, pointers to live blocks, inputs to written bytes) and no values are computed,
//! so the frames are black.

use std::fmt;
use std::str::FromStr;

use anyhow::{bail, Result};
use headroom_engine::EngineConfig;
use headroom_mem::{AllocatorConfig, ReclaimPolicy};
use headroom_tensor::Device;

/// Where a command runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceArg {
    /// The host: real bytes through the `cpu` platform.
    #[default]
    Cpu,
    /// NVIDIA GPU with this CUDA ordinal.
    Cuda(usize),
    /// The GPU path without a GPU: launches checked, nothing computed.
    CudaCheck,
}

impl FromStr for DeviceArg {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(DeviceArg::Cpu),
            "cuda" => Ok(DeviceArg::Cuda(0)),
            "cuda-check" => Ok(DeviceArg::CudaCheck),
            other => match other.strip_prefix("cuda:") {
                Some(n) => n
                    .parse()
                    .map(DeviceArg::Cuda)
                    .map_err(|_| format!("invalid CUDA ordinal {n:?} in {other:?}")),
                None => Err(format!(
                    "must be cpu, cuda, cuda:N or cuda-check, got {other:?}"
                )),
            },
        }
    }
}

impl fmt::Display for DeviceArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceArg::Cpu => f.write_str("cpu"),
            DeviceArg::Cuda(n) => write!(f, "cuda:{n}"),
            DeviceArg::CudaCheck => f.write_str("cuda-check"),
        }
    }
}

impl DeviceArg {
    /// Checks that a host-only command (`bench session`, `plan --measure`) can run here:
    /// `cpu` always; for `cuda` it opens the GPU (so a missing device is reported as such)
    /// and then says which command runs there.
    pub fn require_host(self, command: &str) -> Result<()> {
        match self {
            DeviceArg::Cpu => Ok(()),
            DeviceArg::Cuda(ordinal) => {
                let capacity = cuda_capacity(ordinal)?;
                bail!(
                    "found cuda:{ordinal} ({capacity} B), but `{command}` runs on the host only; \
                     run the engine on the GPU with `headroom generate --device cuda:{ordinal}`"
                )
            }
            DeviceArg::CudaCheck => bail!(
                "`{command}` runs on the host only; `--device cuda-check` is for `headroom generate`"
            ),
        }
    }

    /// The device `generate` runs its engine on: `None` for the host (the engine's own
    /// `cpu` platform), the GPU for `cuda`, the checked launch path for `cuda-check`
    /// (`capacity` bytes, default 80 GiB).
    pub fn engine_device(
        self,
        config: &AllocatorConfig,
        reclaim: ReclaimPolicy,
        capacity: Option<u64>,
    ) -> Result<Option<Device>> {
        match self {
            DeviceArg::Cpu => Ok(None),
            DeviceArg::Cuda(ordinal) => cuda_device(ordinal, config, reclaim).map(Some),
            DeviceArg::CudaCheck => Ok(Some(Device::checked_gpu(
                capacity.unwrap_or(80 << 30),
                config.clone(),
                reclaim,
            )?)),
        }
    }

    /// The GPU of a mesh rank that is `local`-th among its node's processes, with
    /// `config`'s allocator, reclaim policy and capacity: `cuda:N` becomes
    /// `cuda:N+local` (one GPU per rank, counted from N); the host has none.
    pub fn rank_gpu(self, local: usize, config: &EngineConfig) -> Result<Device> {
        let arg = match self {
            DeviceArg::Cuda(first) => DeviceArg::Cuda(first + local),
            other => other,
        };
        match arg.engine_device(&config.allocator, config.reclaim, config.capacity)? {
            Some(device) => Ok(device),
            None => bail!("a GPU rank needs a GPU device, got --device {arg}"),
        }
    }

    /// The capacity the card reports (`cuDeviceTotalMem`) for `cuda`; `None` for `cpu`.
    pub fn card_capacity(self) -> Result<Option<u64>> {
        match self {
            DeviceArg::Cpu => Ok(None),
            DeviceArg::Cuda(ordinal) => cuda_capacity(ordinal).map(Some),
            DeviceArg::CudaCheck => Ok(None),
        }
    }
}

/// Total memory of GPU `ordinal`, from the driver.
#[cfg(feature = "cuda")]
fn cuda_capacity(ordinal: usize) -> Result<u64> {
    use headroom_mem::DeviceMemory;
    let memory = headroom_mem::CudaMemory::new(ordinal)?;
    Ok(memory.capacity())
}

/// GPU `ordinal` with the CUDA runtime on it.
#[cfg(feature = "cuda")]
fn cuda_device(ordinal: usize, config: &AllocatorConfig, reclaim: ReclaimPolicy) -> Result<Device> {
    Ok(Device::cuda(ordinal, config.clone(), reclaim)?)
}

/// Without the feature there is no CUDA code in this binary.
#[cfg(not(feature = "cuda"))]
fn cuda_device(_: usize, _: &AllocatorConfig, _: ReclaimPolicy) -> Result<Device> {
    bail!("this build has no CUDA support (build with --features cuda)")
}

/// Without the feature there is no CUDA code in this binary.
#[cfg(not(feature = "cuda"))]
fn cuda_capacity(_ordinal: usize) -> Result<u64> {
    bail!("this build has no CUDA support (build with --features cuda)")
}

#[cfg(test)]
mod tests {
    use super::DeviceArg;

    #[test]
    fn parses_cpu_cuda_and_ordinals() {
        assert_eq!("cpu".parse(), Ok(DeviceArg::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceArg::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(DeviceArg::Cuda(3)));
        assert!("cuda:x".parse::<DeviceArg>().is_err());
        assert!("gpu".parse::<DeviceArg>().is_err());
        assert_eq!(DeviceArg::Cuda(1).to_string(), "cuda:1");
    }
}
