//! Reclaim policies: when to give cached device memory back, decided at named phase
//! boundaries instead of scattered `empty_cache` calls.
//!
//! | policy          | reclaims at                                                        |
//! |-----------------|--------------------------------------------------------------------|
//! | `never`         | no boundary                                                        |
//! | `before-decode` | `decode_start` (the fix of vLLM-Omni PR #9313), `text_end`, `sleep`, `model_swap` |
//! | `bounded`       | any boundary where cached-but-unused bytes exceed a fraction of the capacity or free bytes fall under a floor; always at `text_end`, `sleep` and `model_swap` |
//! | `fit`           | `session_end` and `error` (a closed session's cache goes back whole), `text_end`, `sleep`, `model_swap`; within a session only while allocating: before the reserved bytes would grow past `1 + slack` times the allocated peak, just enough cached memory is given back (largest free segments first) |
//! | `always`        | every boundary                                                     |
//!
//! `text_end` (an on-demand text encoder has just released its weights), `sleep` and
//! `model_swap` exist to hand memory back, so every policy but `never` acts there. A
//! platform that does not cache device memory is never asked to reclaim.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

use crate::error::{MemError, Result};

/// A named point in a session where memory may be reclaimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// An on-demand text encoder has encoded a prompt and released its weights.
    TextEnd,
    /// The denoise loop of a chunk has finished.
    DenoiseEnd,
    /// The VAE decode of a chunk is about to allocate.
    DecodeStart,
    /// A session has closed and released what it held.
    SessionEnd,
    /// A session failed and released what it held.
    Error,
    /// The engine goes idle and should hold as little as possible.
    Sleep,
    /// One model's weights are being replaced by another's.
    ModelSwap,
}

impl Phase {
    /// Every phase, in pipeline order.
    pub const ALL: [Phase; 7] = [
        Phase::TextEnd,
        Phase::DenoiseEnd,
        Phase::DecodeStart,
        Phase::SessionEnd,
        Phase::Error,
        Phase::Sleep,
        Phase::ModelSwap,
    ];

    /// The snake_case name used in traces and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Phase::TextEnd => "text_end",
            Phase::DenoiseEnd => "denoise_end",
            Phase::DecodeStart => "decode_start",
            Phase::SessionEnd => "session_end",
            Phase::Error => "error",
            Phase::Sleep => "sleep",
            Phase::ModelSwap => "model_swap",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Phase {
    type Err = MemError;
    fn from_str(s: &str) -> Result<Self> {
        Phase::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| MemError::InvalidConfig {
                field: "phase",
                rule: format!(
                    "must be one of text_end, denoise_end, decode_start, session_end, error, sleep, model_swap; got {s:?}"
                ),
            })
    }
}

/// The memory picture a policy decides on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pressure {
    /// Device capacity.
    pub capacity: u64,
    /// Bytes the allocator holds from the device.
    pub reserved: u64,
    /// Bytes in live allocations.
    pub allocated: u64,
    /// Bytes the device still has free.
    pub free: u64,
}

impl Pressure {
    /// Bytes held in the cache but not used by any allocation.
    pub fn cached(&self) -> u64 {
        self.reserved.saturating_sub(self.allocated)
    }
}

/// When to reclaim cached device memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum ReclaimPolicy {
    /// Never reclaim: what PyTorch does unless told otherwise.
    #[default]
    Never,
    /// Reclaim at `decode_start` (and `text_end`, `sleep`, `model_swap`).
    BeforeDecode,
    /// Reclaim when the cache grows past a bound or free memory runs low.
    Bounded {
        /// Reclaim when cached-but-unused bytes exceed this fraction of the capacity.
        max_cached_fraction: f64,
        /// Reclaim when free bytes fall under this fraction of the capacity.
        min_free_fraction: f64,
    },
    /// Reclaim while allocating, only what keeps reserved bytes within `1 + slack` of
    /// the allocated peak (see the allocator's `set_fit_slack`).
    Fit {
        /// Allowed excess of reserved over allocated peak bytes, as a fraction.
        slack: f64,
    },
    /// Reclaim at every boundary: the upper bound on reclaim cost.
    Always,
}

/// Default bound on cached-but-unused memory for `bounded`.
pub const DEFAULT_MAX_CACHED_FRACTION: f64 = 0.25;
/// Default floor on free memory for `bounded`.
pub const DEFAULT_MIN_FREE_FRACTION: f64 = 0.10;
/// Default slack of `fit`: reserved within 4 % of the allocated peak (the goal is 5 %).
pub const DEFAULT_FIT_SLACK: f64 = 0.04;

impl ReclaimPolicy {
    /// `bounded` with the default fractions.
    pub fn bounded() -> Self {
        ReclaimPolicy::Bounded {
            max_cached_fraction: DEFAULT_MAX_CACHED_FRACTION,
            min_free_fraction: DEFAULT_MIN_FREE_FRACTION,
        }
    }

    /// `fit` with the default slack.
    pub fn fit() -> Self {
        ReclaimPolicy::Fit {
            slack: DEFAULT_FIT_SLACK,
        }
    }

    /// The slack the allocator enforces while allocating (`fit` only).
    pub fn fit_slack(&self) -> Option<f64> {
        match *self {
            ReclaimPolicy::Fit { slack } => Some(slack),
            _ => None,
        }
    }

    /// Whether to reclaim at `phase` given the memory picture.
    pub fn should_reclaim(&self, phase: Phase, pressure: &Pressure) -> bool {
        let explicit = matches!(phase, Phase::TextEnd | Phase::Sleep | Phase::ModelSwap);
        match *self {
            ReclaimPolicy::Never => false,
            ReclaimPolicy::Always => true,
            ReclaimPolicy::BeforeDecode => explicit || phase == Phase::DecodeStart,
            ReclaimPolicy::Fit { .. } => {
                explicit || matches!(phase, Phase::SessionEnd | Phase::Error)
            }
            ReclaimPolicy::Bounded {
                max_cached_fraction,
                min_free_fraction,
            } => {
                if explicit {
                    return true;
                }
                let capacity = pressure.capacity as f64;
                let cached = pressure.cached();
                cached > 0
                    && (cached as f64 > max_cached_fraction * capacity
                        || (pressure.free as f64) < min_free_fraction * capacity)
            }
        }
    }
}

impl fmt::Display for ReclaimPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReclaimPolicy::Never => f.write_str("never"),
            ReclaimPolicy::BeforeDecode => f.write_str("before-decode"),
            ReclaimPolicy::Always => f.write_str("always"),
            ReclaimPolicy::Fit { slack } => write!(f, "fit:slack={slack}"),
            ReclaimPolicy::Bounded {
                max_cached_fraction,
                min_free_fraction,
            } => write!(
                f,
                "bounded:max_cached={max_cached_fraction},min_free={min_free_fraction}"
            ),
        }
    }
}

impl FromStr for ReclaimPolicy {
    type Err = MemError;
    /// Parses `never`, `before-decode`, `always`, `bounded` or
    /// `bounded:max_cached=0.25,min_free=0.1`, `fit` or `fit:slack=0.04`.
    fn from_str(s: &str) -> Result<Self> {
        let invalid = |rule: String| MemError::InvalidConfig {
            field: "reclaim policy",
            rule,
        };
        let (name, params) = s.split_once(':').unwrap_or((s, ""));
        match name {
            "never" | "before-decode" | "always" if !params.is_empty() => {
                Err(invalid(format!("{name} takes no parameters, got {params:?}")))
            }
            "never" => Ok(ReclaimPolicy::Never),
            "before-decode" => Ok(ReclaimPolicy::BeforeDecode),
            "always" => Ok(ReclaimPolicy::Always),
            "bounded" => {
                let mut max_cached_fraction = DEFAULT_MAX_CACHED_FRACTION;
                let mut min_free_fraction = DEFAULT_MIN_FREE_FRACTION;
                for item in params.split(',').filter(|p| !p.is_empty()) {
                    let (key, value) = item
                        .split_once('=')
                        .ok_or_else(|| invalid(format!("parameter {item:?} is not key=value")))?;
                    let value: f64 = value.parse().map_err(|_| {
                        invalid(format!("{key} must be a number in [0, 1], got {value:?}"))
                    })?;
                    if !(0.0..=1.0).contains(&value) {
                        return Err(invalid(format!("{key} must be in [0, 1], got {value}")));
                    }
                    match key {
                        "max_cached" => max_cached_fraction = value,
                        "min_free" => min_free_fraction = value,
                        other => {
                            return Err(invalid(format!(
                                "unknown parameter {other:?}; bounded takes max_cached and min_free"
                            )))
                        }
                    }
                }
                Ok(ReclaimPolicy::Bounded {
                    max_cached_fraction,
                    min_free_fraction,
                })
            }
            "fit" => {
                let mut slack = DEFAULT_FIT_SLACK;
                for item in params.split(',').filter(|p| !p.is_empty()) {
                    match item.split_once('=') {
                        Some(("slack", value)) => {
                            slack = value
                                .parse::<f64>()
                                .ok()
                                .filter(|v| (0.0..=1.0).contains(v))
                                .ok_or_else(|| {
                                    invalid(format!("slack must be a number in [0, 1], got {value:?}"))
                                })?;
                        }
                        _ => {
                            return Err(invalid(format!(
                                "unknown parameter {item:?}; fit takes slack=F"
                            )))
                        }
                    }
                }
                Ok(ReclaimPolicy::Fit { slack })
            }
            other => Err(invalid(format!(
                "must be never, before-decode, bounded[:max_cached=F,min_free=F], fit[:slack=F] or always; got {other:?}"
            ))),
        }
    }
}

/// One reclaim that ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Reclaim {
    /// The boundary it ran at.
    pub phase: Phase,
    /// Wall time of the `empty_cache` call.
    pub duration: Duration,
    /// Reserved bytes it gave back.
    pub released_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn pressure(reserved: u64, allocated: u64) -> Pressure {
        Pressure {
            capacity: 64 * GIB,
            reserved,
            allocated,
            free: 64 * GIB - reserved,
        }
    }

    #[test]
    fn never_never_reclaims() {
        for phase in Phase::ALL {
            assert!(!ReclaimPolicy::Never.should_reclaim(phase, &pressure(60 * GIB, 0)));
        }
    }

    #[test]
    fn before_decode_reclaims_at_decode_start_only_among_session_phases() {
        let p = pressure(GIB, 0);
        let policy = ReclaimPolicy::BeforeDecode;
        assert!(policy.should_reclaim(Phase::DecodeStart, &p));
        assert!(!policy.should_reclaim(Phase::DenoiseEnd, &p));
        assert!(!policy.should_reclaim(Phase::SessionEnd, &p));
        assert!(policy.should_reclaim(Phase::Sleep, &p));
        assert!(policy.should_reclaim(Phase::ModelSwap, &p));
        assert!(policy.should_reclaim(Phase::TextEnd, &p));
    }

    #[test]
    fn phases_parse_from_their_names() {
        for phase in Phase::ALL {
            assert_eq!(phase.name().parse::<Phase>().unwrap(), phase);
        }
        assert_eq!("text_end".parse::<Phase>().unwrap(), Phase::TextEnd);
        let err = "text_start".parse::<Phase>().unwrap_err().to_string();
        assert!(err.contains("text_end"), "{err}");
    }

    #[test]
    fn bounded_reclaims_when_the_cache_exceeds_its_fraction() {
        let policy = ReclaimPolicy::bounded();
        // 10 GiB cached of 64 GiB (15.6 %) is under the 25 % bound, free is plenty.
        assert!(!policy.should_reclaim(Phase::SessionEnd, &pressure(20 * GIB, 10 * GIB)));
        // 20 GiB cached (31 %) exceeds it.
        assert!(policy.should_reclaim(Phase::SessionEnd, &pressure(30 * GIB, 10 * GIB)));
    }

    #[test]
    fn bounded_reclaims_when_free_memory_falls_under_its_floor() {
        let policy = ReclaimPolicy::bounded();
        // 1 GiB cached but only 4 GiB free (6 % < 10 %).
        assert!(policy.should_reclaim(Phase::DenoiseEnd, &pressure(60 * GIB, 59 * GIB)));
        // Nothing cached: nothing to give back even when free is low.
        assert!(!policy.should_reclaim(Phase::DenoiseEnd, &pressure(60 * GIB, 60 * GIB)));
    }

    #[test]
    fn policies_parse_from_their_names() {
        assert_eq!(
            "never".parse::<ReclaimPolicy>().unwrap(),
            ReclaimPolicy::Never
        );
        assert_eq!(
            "before-decode".parse::<ReclaimPolicy>().unwrap(),
            ReclaimPolicy::BeforeDecode
        );
        assert_eq!(
            "bounded:max_cached=0.5,min_free=0.05"
                .parse::<ReclaimPolicy>()
                .unwrap(),
            ReclaimPolicy::Bounded {
                max_cached_fraction: 0.5,
                min_free_fraction: 0.05
            }
        );
        let err = "bounded:max_cached=2"
            .parse::<ReclaimPolicy>()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("max_cached") && err.contains("[0, 1]"),
            "{err}"
        );
        let err = "sometimes"
            .parse::<ReclaimPolicy>()
            .unwrap_err()
            .to_string();
        assert!(err.contains("reclaim policy"), "{err}");
        assert_eq!(
            "fit:slack=0.1".parse::<ReclaimPolicy>().unwrap(),
            ReclaimPolicy::Fit { slack: 0.1 }
        );
        let err = "fit:slack=-1"
            .parse::<ReclaimPolicy>()
            .unwrap_err()
            .to_string();
        assert!(err.contains("slack") && err.contains("[0, 1]"), "{err}");
        for policy in [
            ReclaimPolicy::Never,
            ReclaimPolicy::bounded(),
            ReclaimPolicy::fit(),
            ReclaimPolicy::Always,
        ] {
            assert_eq!(policy.to_string().parse::<ReclaimPolicy>().unwrap(), policy);
        }
    }
}
