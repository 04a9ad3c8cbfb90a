//! The allocator policies: how device memory is obtained and returned.

use std::fmt;
use std::str::FromStr;

use crate::error::{MemError, Result};

/// How the allocator obtains and returns device memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AllocatorPolicy {
    /// PyTorch's CUDA caching allocator: one device allocation per segment.
    #[default]
    Pytorch,
    /// PyTorch's expandable segments: one growing segment per (pool, stream).
    Expandable,
    /// Recorded spans replayed at planned offsets in one arena; the rest as `pytorch`.
    Planned,
}

impl AllocatorPolicy {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            AllocatorPolicy::Pytorch => "pytorch",
            AllocatorPolicy::Expandable => "expandable",
            AllocatorPolicy::Planned => "planned",
        }
    }
}

impl fmt::Display for AllocatorPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AllocatorPolicy {
    type Err = MemError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "pytorch" => Ok(AllocatorPolicy::Pytorch),
            "expandable" => Ok(AllocatorPolicy::Expandable),
            "planned" => Ok(AllocatorPolicy::Planned),
            other => Err(MemError::InvalidConfig {
                field: "allocator",
                rule: format!("must be pytorch, expandable or planned, got {other:?}"),
            }),
        }
    }
}
