//! Snapshots of the allocator (segments, blocks, trace) and their export as JSON or as a
//! pickle in PyTorch's `torch.cuda.memory._snapshot()` layout, which
//! pytorch.org/memory_viz opens.

use serde::Serialize;

use crate::history::{TraceAction, TraceEvent};
use crate::pickle::{to_pickle, PickleValue};
use crate::policy::AllocatorPolicy;
use crate::stats::MemoryStats;

/// State of a block in a snapshot (PyTorch's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Handed out to a caller.
    ActiveAllocated,
    /// Cached, free.
    Inactive,
}

impl BlockState {
    /// PyTorch's string for the state.
    pub fn name(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::Inactive => "inactive",
        }
    }
}

/// One block of a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockSnapshot {
    /// Start address.
    pub address: u64,
    /// Bytes of the block.
    pub size: u64,
    /// Bytes the caller asked for (0 when free).
    pub requested_size: u64,
    /// Allocated or cached.
    pub state: BlockState,
}

/// One segment (for expandable segments: one contiguous mapped run).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SegmentSnapshot {
    /// Start address.
    pub address: u64,
    /// Bytes of the segment.
    pub total_size: u64,
    /// Stream of the segment.
    pub stream: u32,
    /// `small` or `large` pool.
    pub segment_type: &'static str,
    /// Bytes in allocated blocks.
    pub allocated_size: u64,
    /// Bytes in active blocks.
    pub active_size: u64,
    /// Bytes requested by callers of the allocated blocks.
    pub requested_size: u64,
    /// Whether it belongs to an expandable segment.
    pub is_expandable: bool,
    /// Blocks in address order.
    pub blocks: Vec<BlockSnapshot>,
}

/// The allocator at one moment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Snapshot {
    /// Device name (`cpu`, `sim`).
    pub device: String,
    /// Device capacity in bytes.
    pub capacity: u64,
    /// Allocator policy.
    pub policy: AllocatorPolicy,
    /// Segments in address order.
    pub segments: Vec<SegmentSnapshot>,
    /// Recorded events, oldest first (empty when history is off).
    pub trace: Vec<TraceEvent>,
    /// Statistics at the time of the snapshot.
    pub stats: MemoryStats,
}

impl Snapshot {
    /// Bytes of all segments in the snapshot.
    pub fn reserved_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.total_size).sum()
    }

    /// Pretty JSON of the whole snapshot.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The snapshot as PyTorch lays it out: `{segments, device_traces, allocator_settings}`.
    pub fn to_pytorch_value(&self) -> PickleValue {
        let segments = self
            .segments
            .iter()
            .map(|s| {
                let blocks = s
                    .blocks
                    .iter()
                    .map(|b| {
                        PickleValue::dict([
                            ("address", PickleValue::from(b.address)),
                            ("size", b.size.into()),
                            ("requested_size", b.requested_size.into()),
                            ("state", b.state.name().into()),
                            ("frames", PickleValue::List(Vec::new())),
                        ])
                    })
                    .collect::<Vec<_>>();
                PickleValue::dict([
                    ("device", PickleValue::Int(0)),
                    ("address", s.address.into()),
                    ("total_size", s.total_size.into()),
                    ("allocated_size", s.allocated_size.into()),
                    ("active_size", s.active_size.into()),
                    ("requested_size", s.requested_size.into()),
                    ("stream", u64::from(s.stream).into()),
                    ("segment_type", s.segment_type.into()),
                    (
                        "segment_pool_id",
                        PickleValue::Tuple(vec![0i64.into(), 0i64.into()]),
                    ),
                    ("is_expandable", s.is_expandable.into()),
                    ("frames", PickleValue::List(Vec::new())),
                    ("blocks", PickleValue::List(blocks)),
                ])
            })
            .collect::<Vec<_>>();
        let mut trace = Vec::with_capacity(self.trace.len());
        for event in &self.trace {
            let entry = |action: &str| {
                let mut items = vec![
                    ("action", PickleValue::from(action)),
                    ("addr", event.addr.into()),
                    ("size", event.size.into()),
                    ("stream", u64::from(event.stream).into()),
                    ("time_us", event.seq.into()),
                    ("frames", PickleValue::List(Vec::new())),
                ];
                if let Some(free) = event.device_free {
                    items.push(("device_free", free.into()));
                }
                if let Some(name) = &event.name {
                    items.push(("name", name.as_str().into()));
                }
                PickleValue::dict(items)
            };
            match event.action {
                // PyTorch records a free as requested, then completed once no stream uses
                // the block; ours complete at once.
                TraceAction::Free => {
                    trace.push(entry("free_requested"));
                    trace.push(entry("free_completed"));
                }
                // Phases and explicit empty_cache calls have no PyTorch action; memory_viz
                // lists unknown actions without drawing them.
                TraceAction::Phase | TraceAction::EmptyCache => trace.push(entry("user_defined")),
                other => trace.push(entry(other.name())),
            }
        }
        let settings = PickleValue::dict([
            (
                "max_split_size",
                PickleValue::Int(self.stats.max_split_size),
            ),
            (
                "expandable_segments",
                (self.policy == AllocatorPolicy::Expandable).into(),
            ),
            ("garbage_collection_threshold", PickleValue::Float(0.0)),
            ("PYTORCH_CUDA_ALLOC_CONF", "".into()),
        ]);
        PickleValue::dict([
            ("segments", PickleValue::List(segments)),
            (
                "device_traces",
                PickleValue::List(vec![PickleValue::List(trace)]),
            ),
            ("allocator_settings", settings),
        ])
    }

    /// The snapshot as a PyTorch snapshot pickle (protocol 2), for memory_viz.
    pub fn to_pickle(&self) -> Vec<u8> {
        to_pickle(&self.to_pytorch_value())
    }
}
