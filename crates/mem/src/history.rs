//! The allocator's event history: an opt-in, bounded ring buffer of what happened, in
//! order, for snapshots, memory_viz and tests that must prove an order of events.

use std::collections::VecDeque;

use serde::Serialize;

/// What an event records; names follow PyTorch's trace actions where one exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceAction {
    /// A block was handed to a caller.
    Alloc,
    /// A caller returned a block.
    Free,
    /// A segment was obtained from the device.
    SegmentAlloc,
    /// A segment was returned to the device.
    SegmentFree,
    /// Pages of an expandable segment were mapped.
    SegmentMap,
    /// Pages of an expandable segment were unmapped.
    SegmentUnmap,
    /// `empty_cache` ran (explicitly or by a reclaim policy).
    EmptyCache,
    /// A request failed with out of memory.
    Oom,
    /// A named phase boundary was crossed.
    Phase,
}

impl TraceAction {
    /// The snake_case name used in JSON and traces.
    pub fn name(self) -> &'static str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::Free => "free",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::EmptyCache => "empty_cache",
            TraceAction::Oom => "oom",
            TraceAction::Phase => "phase",
        }
    }
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TraceEvent {
    /// Position in the allocator's whole history (survives ring-buffer eviction).
    pub seq: u64,
    /// What happened.
    pub action: TraceAction,
    /// Address of the block, segment or range (0 for phases and `empty_cache`).
    pub addr: u64,
    /// Bytes involved (the request for `oom`).
    pub size: u64,
    /// Stream of the request.
    pub stream: u32,
    /// Phase name, for `phase` events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Free device bytes, for `oom` events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_free: Option<u64>,
}

/// A bounded ring buffer of events; capacity 0 records nothing.
#[derive(Debug, Clone, Default)]
pub struct History {
    capacity: usize,
    events: VecDeque<TraceEvent>,
    next_seq: u64,
}

impl History {
    /// A history keeping the last `capacity` events (0 = off).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            events: VecDeque::new(),
            next_seq: 0,
        }
    }

    /// Whether events are being recorded.
    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Changes the capacity, dropping the oldest events if it shrinks.
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity;
        while self.events.len() > capacity {
            self.events.pop_front();
        }
    }

    /// Records an event if recording is on.
    pub fn record(&mut self, action: TraceAction, addr: u64, size: u64, stream: u32) {
        self.push(action, addr, size, stream, None, None);
    }

    /// Records an event with its optional phase name and free-bytes fields.
    pub fn push(
        &mut self,
        action: TraceAction,
        addr: u64,
        size: u64,
        stream: u32,
        name: Option<String>,
        device_free: Option<u64>,
    ) {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.capacity == 0 {
            return;
        }
        if self.events.len() == self.capacity {
            self.events.pop_front();
        }
        self.events.push_back(TraceEvent {
            seq,
            action,
            addr,
            size,
            stream,
            name,
            device_free,
        });
    }

    /// The recorded events, oldest first.
    pub fn events(&self) -> Vec<TraceEvent> {
        self.events.iter().cloned().collect()
    }

    /// Drops every recorded event.
    pub fn clear(&mut self) {
        self.events.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_keeps_only_the_last_events() {
        let mut history = History::new(2);
        for i in 0..5 {
            history.record(TraceAction::Alloc, i, 512, 0);
        }
        let events = history.events();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].seq, 3);
        assert_eq!(events[1].addr, 4);
    }

    #[test]
    fn disabled_history_records_nothing() {
        let mut history = History::new(0);
        history.record(TraceAction::Alloc, 1, 512, 0);
        assert!(history.events().is_empty());
        assert!(!history.enabled());
    }
}
