//! `headroom bench alloc`: nanoseconds per cached allocate + free pair through our
//! allocator against the system allocator, same sizes, interleaved rounds in one run.

use std::alloc::{alloc, dealloc, Layout};
use std::hint::black_box;
use std::time::Instant;

use headroom_mem::{
    AllocatorConfig, AllocatorPolicy, CachingPlatform, Platform, ReclaimPolicy, GIB,
};
use serde::Serialize;

use crate::{BenchError, Result};

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocBenchConfig {
    /// Request sizes in bytes.
    pub sizes: Vec<u64>,
    /// Allocate + free pairs per round and size.
    pub pairs: u64,
    /// Interleaved rounds (ours, system, ours, …); the median round counts.
    pub rounds: usize,
    /// Our allocator's policy.
    pub policy: AllocatorPolicy,
}

impl Default for AllocBenchConfig {
    fn default() -> Self {
        Self {
            sizes: vec![512, 64 << 10, 1 << 20, 16 << 20, 256 << 20],
            pairs: 20_000,
            rounds: 5,
            policy: AllocatorPolicy::Pytorch,
        }
    }
}

/// One size's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AllocBenchRow {
    /// Request size in bytes.
    pub size: u64,
    /// Median nanoseconds per pair through our caching allocator.
    pub headroom_ns: f64,
    /// Median nanoseconds per pair through the system allocator.
    pub system_ns: f64,
    /// `system_ns / headroom_ns`: how many times faster ours is.
    pub speedup: f64,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Runs the benchmark: per size, `rounds` interleaved rounds of `pairs` pairs each.
pub fn run_alloc_bench(config: &AllocBenchConfig) -> Result<Vec<AllocBenchRow>> {
    if config.pairs == 0 || config.rounds == 0 || config.sizes.is_empty() {
        return Err(BenchError::InvalidConfig {
            field: "alloc bench",
            rule: "needs at least one size, one pair and one round".to_string(),
        });
    }
    let platform = CachingPlatform::cpu(
        Some(16 * GIB),
        AllocatorConfig::with_policy(config.policy),
        ReclaimPolicy::Never,
    )?;
    let allocator = platform.allocator();
    let mut rows = Vec::new();
    for &size in &config.sizes {
        let layout =
            Layout::from_size_align(size as usize, 64).map_err(|e| BenchError::InvalidConfig {
                field: "size",
                rule: format!("{size} B is not a valid layout: {e}"),
            })?;
        // Warm the cache: the measured pairs are cached hits.
        drop(allocator.allocate(size, 0)?);
        let mut ours = Vec::new();
        let mut system = Vec::new();
        for _ in 0..config.rounds {
            let start = Instant::now();
            for _ in 0..config.pairs {
                black_box(allocator.allocate(black_box(size), 0)?);
            }
            ours.push(start.elapsed().as_nanos() as f64 / config.pairs as f64);

            let start = Instant::now();
            for _ in 0..config.pairs {
                // SAFETY: the layout has a non-zero size; the pointer is freed with the
                // same layout right away (a null pointer is skipped).
                unsafe {
                    let ptr = black_box(alloc(layout));
                    if !ptr.is_null() {
                        dealloc(ptr, layout);
                    }
                }
            }
            system.push(start.elapsed().as_nanos() as f64 / config.pairs as f64);
        }
        let (headroom_ns, system_ns) = (median(ours), median(system));
        rows.push(AllocBenchRow {
            size,
            headroom_ns,
            system_ns,
            speedup: system_ns / headroom_ns,
        });
    }
    platform.empty_cache();
    Ok(rows)
}

/// The report `bench alloc --json` prints: the policy and its rows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AllocBenchReport {
    /// Our allocator's policy.
    pub policy: &'static str,
    /// One row per size.
    pub rows: Vec<AllocBenchRow>,
}

/// The rows of a run of `config` as a text table, with its heading and how to read it.
pub fn table(config: &AllocBenchConfig, rows: &[AllocBenchRow]) -> String {
    let mut out = format!(
        "cached allocate+free pairs, median of {} interleaved rounds of {} pairs (policy {})\n",
        config.rounds, config.pairs, config.policy
    );
    out.push_str(&format!(
        "{:>10}{:>16}{:>14}{:>10}\n",
        "size", "headroom ns", "system ns", "ratio"
    ));
    for row in rows {
        out.push_str(&format!(
            "{:>10}{:>16.1}{:>14.1}{:>9.1}×\n",
            headroom_mem::format_bytes(row.size),
            row.headroom_ns,
            row.system_ns,
            row.speedup
        ));
    }
    out.push_str("ratio = system ns / headroom ns (higher is better for headroom)\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bench_measures_every_size_on_both_allocators() {
        let config = AllocBenchConfig {
            sizes: vec![512, 3 << 20],
            pairs: 50,
            rounds: 3,
            policy: AllocatorPolicy::Expandable,
        };
        let rows = run_alloc_bench(&config).unwrap();
        assert_eq!(
            rows.iter().map(|r| r.size).collect::<Vec<_>>(),
            [512, 3 << 20]
        );
        for row in rows {
            assert!(row.headroom_ns > 0.0 && row.system_ns > 0.0);
            assert!((row.speedup - row.system_ns / row.headroom_ns).abs() < 1e-9);
        }
    }

    #[test]
    fn the_table_prints_one_aligned_row_per_size_between_its_heading_and_legend() {
        let config = AllocBenchConfig {
            sizes: vec![512],
            pairs: 10,
            rounds: 1,
            policy: AllocatorPolicy::Pytorch,
        };
        let rows = [AllocBenchRow {
            size: 512,
            headroom_ns: 20.0,
            system_ns: 50.0,
            speedup: 2.5,
        }];
        assert_eq!(
            table(&config, &rows),
            "cached allocate+free pairs, median of 1 interleaved rounds of 10 pairs (policy pytorch)\n      size     headroom ns     system ns     ratio\n     512 B            20.0          50.0      2.5×\nratio = system ns / headroom ns (higher is better for headroom)\n"
        );
    }

    #[test]
    fn an_empty_configuration_is_refused() {
        let config = AllocBenchConfig {
            sizes: vec![],
            ..AllocBenchConfig::default()
        };
        assert!(run_alloc_bench(&config).is_err());
    }
}
