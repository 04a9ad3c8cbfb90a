//! `--device cpu|cuda[:N]`, shared by `generate`, `bench session` and `plan`.
//!
//! `cuda` needs a build with `--features cuda` and a GPU the driver can open; both
//! failures are errors (exit code 2) with the reason. The tensor runtime does not route
//! its ops to the CUDA kernels yet, so commands that run the engine stop with a clear
//! error once the device is found; `plan` only reads the card's capacity.

use std::fmt;
use std::str::FromStr;

use anyhow::{bail, Result};

/// Where a command runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceArg {
    /// The host: real bytes through the `cpu` platform.
    #[default]
    Cpu,
    /// NVIDIA GPU with this CUDA ordinal.
    Cuda(usize),
}

impl FromStr for DeviceArg {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(DeviceArg::Cpu),
            "cuda" => Ok(DeviceArg::Cuda(0)),
            other => match other.strip_prefix("cuda:") {
                Some(n) => n
                    .parse()
                    .map(DeviceArg::Cuda)
                    .map_err(|_| format!("invalid CUDA ordinal {n:?} in {other:?}")),
                None => Err(format!("must be cpu, cuda or cuda:N, got {other:?}")),
            },
        }
    }
}

impl fmt::Display for DeviceArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceArg::Cpu => f.write_str("cpu"),
            DeviceArg::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl DeviceArg {
    /// Checks that the engine can run here: `cpu` always; `cuda` opens the GPU (so a
    /// missing device is reported as such) and then refuses, since the tensor runtime does
    /// not dispatch ops to CUDA yet.
    pub fn require_engine_support(self) -> Result<()> {
        match self {
            DeviceArg::Cpu => Ok(()),
            DeviceArg::Cuda(ordinal) => {
                let capacity = cuda_capacity(ordinal)?;
                bail!(
                    "found cuda:{ordinal} ({} B), but the tensor runtime does not dispatch ops \
                     to CUDA yet (the kernels compile and self-test: `headroom cuda kernels`, \
                     `headroom cuda selftest`); run with --device cpu, or plan with \
                     `headroom plan --device cuda:{ordinal}`",
                    capacity
                )
            }
        }
    }

    /// The capacity the card reports (`cuDeviceTotalMem`) for `cuda`; `None` for `cpu`.
    pub fn card_capacity(self) -> Result<Option<u64>> {
        match self {
            DeviceArg::Cpu => Ok(None),
            DeviceArg::Cuda(ordinal) => cuda_capacity(ordinal).map(Some),
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
