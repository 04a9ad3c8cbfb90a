//! Allocator statistics under PyTorch's names (`torch.cuda.memory_stats()`), so that
//! `allocated_bytes.all.peak` means here what it means there.

use std::collections::BTreeMap;

use serde::{Serialize, Serializer};

/// One counter: its current value, its peak since the last reset, and the running totals
/// of increases and decreases.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    /// Current value.
    pub current: i64,
    /// Highest `current` since creation or the last peak reset.
    pub peak: i64,
    /// Sum of all increases.
    pub allocated: i64,
    /// Sum of all decreases.
    pub freed: i64,
}

impl Stat {
    /// Adds `amount`, raising the peak if needed.
    pub fn increase(&mut self, amount: u64) {
        let amount = amount as i64;
        self.current += amount;
        self.allocated += amount;
        self.peak = self.peak.max(self.current);
    }

    /// Subtracts `amount`.
    pub fn decrease(&mut self, amount: u64) {
        let amount = amount as i64;
        self.current -= amount;
        self.freed += amount;
    }

    /// Sets the peak to the current value, as `reset_peak_memory_stats` does.
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// Which of PyTorch's stat types a counter belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatType {
    /// Both pools together (`all`).
    All,
    /// The small pool (requests of at most 1 MiB, `small_pool`).
    SmallPool,
    /// The large pool (`large_pool`).
    LargePool,
}

impl StatType {
    const ALL: [StatType; 3] = [StatType::All, StatType::SmallPool, StatType::LargePool];

    /// PyTorch's key fragment for this type.
    pub fn key(self) -> &'static str {
        match self {
            StatType::All => "all",
            StatType::SmallPool => "small_pool",
            StatType::LargePool => "large_pool",
        }
    }
}

/// A counter kept for the aggregate and for each pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatArray(pub [Stat; 3]);

impl StatArray {
    /// The counter of one stat type.
    pub fn get(&self, kind: StatType) -> &Stat {
        &self.0[kind as usize]
    }

    /// The aggregate counter (`all`).
    pub fn all(&self) -> &Stat {
        &self.0[0]
    }

    /// Increases the aggregate and the given pool's counter.
    pub fn increase(&mut self, small: bool, amount: u64) {
        self.0[0].increase(amount);
        self.0[pool_index(small)].increase(amount);
    }

    /// Decreases the aggregate and the given pool's counter.
    pub fn decrease(&mut self, small: bool, amount: u64) {
        self.0[0].decrease(amount);
        self.0[pool_index(small)].decrease(amount);
    }

    fn reset_peak(&mut self) {
        self.0.iter_mut().for_each(Stat::reset_peak);
    }
}

fn pool_index(small: bool) -> usize {
    if small {
        StatType::SmallPool as usize
    } else {
        StatType::LargePool as usize
    }
}

/// Everything the allocator counts, readable as PyTorch's flat key/value map.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemoryStats {
    /// Number of live allocations (`allocation`).
    pub allocation: StatArray,
    /// Number of device segments (`segment`).
    pub segment: StatArray,
    /// Number of active blocks (`active`).
    pub active: StatArray,
    /// Number of free blocks inside split segments (`inactive_split`).
    pub inactive_split: StatArray,
    /// Bytes in live allocations, rounded sizes (`allocated_bytes`).
    pub allocated_bytes: StatArray,
    /// Bytes held from the device (`reserved_bytes`).
    pub reserved_bytes: StatArray,
    /// Bytes in active blocks (`active_bytes`).
    pub active_bytes: StatArray,
    /// Bytes in free blocks inside split segments (`inactive_split_bytes`).
    pub inactive_split_bytes: StatArray,
    /// Bytes callers asked for, before rounding (`requested_bytes`).
    pub requested_bytes: StatArray,
    /// Allocations of at least `max_split_size` (`oversize_allocations`).
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size` (`oversize_segments`).
    pub oversize_segments: Stat,
    /// Times the slow path freed every cached block and retried (`num_alloc_retries`).
    pub num_alloc_retries: u64,
    /// Requests that failed with out of memory (`num_ooms`).
    pub num_ooms: u64,
    /// Times every stream was synchronised (`num_sync_all_streams`).
    pub num_sync_all_streams: u64,
    /// Device allocations: segments and mapped ranges (`num_device_alloc`).
    pub num_device_alloc: u64,
    /// Device frees: segments and unmapped ranges (`num_device_free`).
    pub num_device_free: u64,
    /// `max_split_size` in bytes, −1 when unlimited (`max_split_size`).
    pub max_split_size: i64,
    /// Reclaims performed by the reclaim policy at phase boundaries.
    pub num_reclaims: u64,
    /// Total wall time spent in those reclaims, in nanoseconds.
    pub reclaim_ns: u64,
    /// Total reserved bytes those reclaims gave back.
    pub reclaimed_bytes: u64,
    /// Requests the planned policy served as its plan says.
    pub planned_hits: u64,
    /// Requests of a replayed plan that did not match it (served by the caching path).
    pub planned_misses: u64,
    /// Bytes the caching path served while a plan was replayed (misses and the tensors
    /// the plan leaves there because they outlive its span).
    pub fallback_bytes: u64,
    /// Requests made while spans were live by a thread in none of them (it entered no
    /// span while several were live, or entered one that ended, or entered `None`):
    /// served by the caching path.
    pub planned_unattributed: u64,
}

impl MemoryStats {
    /// Bytes in live allocations now (`allocated_bytes.all.current`).
    pub fn allocated_now(&self) -> u64 {
        self.allocated_bytes.all().current.max(0) as u64
    }

    /// Bytes reserved but not allocated now: what the cache holds.
    pub fn cached_now(&self) -> u64 {
        (self.reserved_bytes.all().current - self.allocated_bytes.all().current).max(0) as u64
    }

    /// Sets every peak to its current value (`reset_peak_memory_stats`).
    pub fn reset_peaks(&mut self) {
        for array in [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ] {
            array.reset_peak();
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// The flat map of `torch.cuda.memory_stats()`: `allocated_bytes.all.peak` and so on,
    /// plus headroom's reclaim counters.
    pub fn to_map(&self) -> BTreeMap<String, i64> {
        let mut map = BTreeMap::new();
        let arrays: [(&str, &StatArray); 9] = [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ];
        for (name, array) in arrays {
            for kind in StatType::ALL {
                insert_stat(&mut map, &format!("{name}.{}", kind.key()), array.get(kind));
            }
        }
        insert_stat(&mut map, "oversize_allocations", &self.oversize_allocations);
        insert_stat(&mut map, "oversize_segments", &self.oversize_segments);
        let counters = [
            ("num_alloc_retries", self.num_alloc_retries),
            ("num_ooms", self.num_ooms),
            ("num_sync_all_streams", self.num_sync_all_streams),
            ("num_device_alloc", self.num_device_alloc),
            ("num_device_free", self.num_device_free),
            ("num_reclaims", self.num_reclaims),
            ("reclaim_ns", self.reclaim_ns),
            ("reclaimed_bytes", self.reclaimed_bytes),
            ("planned_hits", self.planned_hits),
            ("planned_misses", self.planned_misses),
            ("fallback_bytes", self.fallback_bytes),
            ("planned_unattributed", self.planned_unattributed),
        ];
        for (name, value) in counters {
            map.insert(name.to_string(), value as i64);
        }
        map.insert("max_split_size".to_string(), self.max_split_size);
        map
    }

    /// One value of [`MemoryStats::to_map`] by its PyTorch key.
    pub fn get(&self, key: &str) -> Option<i64> {
        self.to_map().get(key).copied()
    }
}

fn insert_stat(map: &mut BTreeMap<String, i64>, prefix: &str, stat: &Stat) {
    map.insert(format!("{prefix}.current"), stat.current);
    map.insert(format!("{prefix}.peak"), stat.peak);
    map.insert(format!("{prefix}.allocated"), stat.allocated);
    map.insert(format!("{prefix}.freed"), stat.freed);
}

impl Serialize for MemoryStats {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        self.to_map().serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_use_pytorch_key_names() {
        let mut stats = MemoryStats::default();
        stats.allocated_bytes.increase(true, 512);
        stats.allocated_bytes.decrease(true, 512);
        let map = stats.to_map();
        assert_eq!(map["allocated_bytes.all.peak"], 512);
        assert_eq!(map["allocated_bytes.all.current"], 0);
        assert_eq!(map["allocated_bytes.small_pool.allocated"], 512);
        assert_eq!(map["allocated_bytes.large_pool.peak"], 0);
        for key in [
            "reserved_bytes.all.current",
            "active_bytes.all.peak",
            "inactive_split_bytes.all.current",
            "requested_bytes.all.peak",
            "segment.all.current",
            "num_alloc_retries",
            "num_ooms",
            "num_sync_all_streams",
            "num_device_alloc",
            "num_device_free",
        ] {
            assert!(map.contains_key(key), "{key}");
        }
    }

    #[test]
    fn reset_peak_sets_every_peak_to_current() {
        let mut stats = MemoryStats::default();
        stats.reserved_bytes.increase(false, 1 << 20);
        stats.reserved_bytes.decrease(false, 1 << 19);
        stats.reset_peaks();
        assert_eq!(stats.reserved_bytes.all().peak, 1 << 19);
        assert_eq!(stats.reserved_bytes.get(StatType::LargePool).peak, 1 << 19);
    }
}
