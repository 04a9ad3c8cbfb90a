//! Server counters and the Prometheus text exposition of `GET /metrics`.
//!
//! Counters are atomics bumped by socket tasks and workers; histograms keep cumulative
//! bucket counts in fixed buckets (seconds), so recording never allocates or locks. The
//! allocator and KV-pool figures are read fresh from the engine at scrape time. Every
//! name starts with `headroom_`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use headroom_engine::Engine;

use crate::refusal::{DoorRefusal, Refusal};

/// Upper bounds (seconds) of the latency histogram buckets; `+Inf` is implied.
pub const BUCKETS: [f64; 14] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// A latency histogram with fixed buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, value: Duration) {
        let secs = value.as_secs_f64();
        for (bound, bucket) in BUCKETS.iter().zip(&self.buckets) {
            if secs <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(value.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Mean of the observations in seconds (0 when there are none).
    pub fn mean_secs(&self) -> f64 {
        let n = self.count();
        if n == 0 {
            return 0.0;
        }
        self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9 / n as f64
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (bound, bucket) in BUCKETS.iter().zip(&self.buckets) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed)
            );
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {count}");
    }
}

/// The admission queue's figures at scrape time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueGauges {
    /// Clients waiting.
    pub waiting: usize,
    /// Clients that may wait at once.
    pub max: usize,
    /// Session slots free now (`--max-sessions` less the sessions holding one).
    pub slots_free: usize,
    /// Bytes of the device's capacity not committed to the weights, the KV pool and the
    /// live sessions' planned peaks: what the next session's planned peak must fit in.
    pub planned_bytes_free: u64,
    /// Whether the server is draining (no new sessions).
    pub draining: bool,
}

/// Everything the server counts.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Each rank's memory over the last session, when the engine is rank 0 of a mesh.
    pub rank_memory: std::sync::Mutex<Vec<headroom_engine::replicated::RankMemory>>,
    /// A rank of the mesh failed: the server can no longer generate (`/health` says so).
    pub mesh_failed: std::sync::atomic::AtomicBool,
    /// Sessions holding a worker (admitted and not yet released).
    pub sessions_open: AtomicU64,
    /// Sessions admitted since start.
    pub sessions_admitted: AtomicU64,
    /// Sessions refused for capacity (queue full or timed out, KV pages, memory).
    pub sessions_rejected: AtomicU64,
    /// Sessions refused, by [`Refusal`] (indexed by [`Refusal::index`]).
    pub sessions_refused: [AtomicU64; Refusal::ALL.len()],
    /// Sessions admitted after waiting in the queue.
    pub queue_admitted: AtomicU64,
    /// Time from `session.start` to admission, for every admitted session (0 when a
    /// slot was free).
    pub queue_wait: Histogram,
    /// Sessions that ended with a generation error.
    pub sessions_failed: AtomicU64,
    /// Sessions that produced every chunk.
    pub sessions_completed: AtomicU64,
    /// Sessions parked (`session.pause`, a hang-up, a drain into the store).
    pub sessions_parked_total: AtomicU64,
    /// Sessions resumed from a resume token.
    pub sessions_resumed: AtomicU64,
    /// Chunks that were ready after their playback deadline (the session fell behind
    /// its client's clock at `fps`, playback starting with the first chunk).
    pub chunks_behind_playback: AtomicU64,
    /// Chunks ready after they were due to leave: a paced chunk after its play time
    /// less the lead, an unpaced one after its play time.
    pub deadline_misses: AtomicU64,
    /// Paced sessions streaming now (held to their viewers' clocks).
    pub realtime_sessions: AtomicU64,
    /// Sessions ended early by `session.stop`, disconnect, stall or shutdown.
    pub sessions_stopped: AtomicU64,
    /// Chunks sent to clients.
    pub chunks_sent: AtomicU64,
    /// Bytes of fragmented MP4 sent to clients.
    pub media_bytes_sent: AtomicU64,
    /// `error` messages sent.
    pub errors_sent: AtomicU64,
    /// WebSocket connections open.
    pub connections_open: AtomicU64,
    /// WebSocket connections served since start (counted when their task starts).
    pub connections_total: AtomicU64,
    /// Requests and sockets the door turned away, by [`DoorRefusal`] (indexed by
    /// [`DoorRefusal::index`]).
    pub door_refusals: [AtomicU64; DoorRefusal::ALL.len()],
    /// Time to generate and encode one chunk.
    pub chunk_latency: Histogram,
    /// Key to display: from an interaction's arrival to the sending of the chunk that
    /// holds its first frame, plus that frame's offset in the chunk's media time.
    pub action_latency: Histogram,
    /// Time from `session.start` to the first chunk being ready.
    pub time_to_first_chunk: Histogram,
}

/// Writes one Prometheus gauge with its help line.
pub fn gauge(out: &mut String, name: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} gauge");
    let _ = writeln!(out, "{name} {value}");
}

pub(crate) fn counter(out: &mut String, name: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} counter");
    let _ = writeln!(out, "{name} {value}");
}

impl Metrics {
    /// Counts a request or socket the door turned away.
    pub fn door_refused(&self, reason: DoorRefusal) {
        self.door_refusals[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Records one refusal for `reason` (also counted in `sessions_rejected`).
    pub fn refused(&self, reason: Refusal) {
        self.sessions_refused[reason.index()].fetch_add(1, Ordering::Relaxed);
        self.sessions_rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition: these counters plus the engine's allocator and
    /// KV-pool figures read now.
    pub fn render(
        &self,
        engine: &Engine,
        max_sessions: usize,
        ready: bool,
        queue: QueueGauges,
    ) -> String {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let stats = engine.platform().memory_stats();
        let mut out = String::with_capacity(8 << 10);
        let o = &mut out;
        self.render_ranks(o);
        gauge(
            o,
            "headroom_allocated_bytes",
            "Bytes in live allocations (allocated_bytes.all.current).",
            stats.allocated_bytes.all().current,
        );
        gauge(
            o,
            "headroom_allocated_peak_bytes",
            "Peak of allocated_bytes.all since start or the last peak reset.",
            stats.allocated_bytes.all().peak,
        );
        gauge(
            o,
            "headroom_reserved_bytes",
            "Bytes the allocator holds from the device (reserved_bytes.all.current).",
            stats.reserved_bytes.all().current,
        );
        gauge(
            o,
            "headroom_reserved_peak_bytes",
            "Peak of reserved_bytes.all since start or the last peak reset.",
            stats.reserved_bytes.all().peak,
        );
        gauge(
            o,
            "headroom_active_bytes",
            "Bytes in active blocks (active_bytes.all.current).",
            stats.active_bytes.all().current,
        );
        let spans = engine.platform().allocator().span_commitments();
        gauge(
            o,
            "headroom_planned_spans",
            "Planned spans live now (one per admitted session under the planned allocator).",
            spans.live_spans,
        );
        gauge(
            o,
            "headroom_committed_bytes",
            "Bytes admission counts as taken: live outside the arenas, retiring arenas and every live session's planned peak.",
            engine.committed_bytes(),
        );
        counter(
            o,
            "headroom_planned_hits_total",
            "Requests the planned allocator served as a plan says.",
            stats.planned_hits,
        );
        counter(
            o,
            "headroom_planned_misses_total",
            "Requests of a replayed plan that did not match it (served by the cache).",
            stats.planned_misses,
        );
        counter(
            o,
            "headroom_planned_unattributed_total",
            "Requests made while spans were live outside all of them (batched work, detached sessions): served by the cache.",
            stats.planned_unattributed,
        );
        counter(
            o,
            "headroom_reclaims_total",
            "Allocator cache reclaims done at phase boundaries.",
            stats.num_reclaims,
        );
        counter(
            o,
            "headroom_reclaimed_bytes_total",
            "Reserved bytes given back by those reclaims.",
            stats.reclaimed_bytes,
        );
        counter(
            o,
            "headroom_reclaim_seconds_total",
            "Wall time spent in those reclaims.",
            stats.reclaim_ns as f64 / 1e9,
        );
        counter(
            o,
            "headroom_alloc_retries_total",
            "Allocations that freed the cache and retried (num_alloc_retries).",
            stats.num_alloc_retries,
        );
        counter(
            o,
            "headroom_ooms_total",
            "Allocations that failed with out of memory (num_ooms).",
            stats.num_ooms,
        );
        counter(
            o,
            "headroom_device_allocs_total",
            "Device allocations (num_device_alloc).",
            stats.num_device_alloc,
        );
        counter(
            o,
            "headroom_device_frees_total",
            "Device frees (num_device_free).",
            stats.num_device_free,
        );
        let (free, total) = engine.platform().mem_info();
        gauge(
            o,
            "headroom_device_free_bytes",
            "Free bytes of the device (mem_info).",
            free,
        );
        gauge(
            o,
            "headroom_device_total_bytes",
            "Capacity of the device (mem_info).",
            total,
        );
        let resident = engine.resident();
        gauge(
            o,
            "headroom_weights_bytes",
            "Bytes the model's weights hold (allocated once it was loaded).",
            resident.weights_bytes,
        );
        gauge(
            o,
            "headroom_kv_pool_bytes",
            "Bytes the KV page pool holds (0 until the first session sizes it).",
            resident.kv_pool_bytes,
        );
        gauge(
            o,
            "headroom_prompt_cache_bytes",
            "Bytes of cached prompt embeddings.",
            resident.prompt_cache_bytes,
        );
        let (pages_total, pages_free) = engine
            .kv_pool()
            .map_or((0, 0), |p| (p.total_pages(), p.free_pages()));
        gauge(
            o,
            "headroom_kv_pages_total",
            "Pages in the KV pool (0 until the first session sizes it).",
            pages_total,
        );
        gauge(
            o,
            "headroom_kv_pages_free",
            "KV pages no session holds.",
            pages_free,
        );
        gauge(
            o,
            "headroom_sessions_open",
            "Sessions admitted and not yet released.",
            load(&self.sessions_open),
        );
        gauge(
            o,
            "headroom_sessions_max",
            "Session slots (--max-sessions).",
            max_sessions,
        );
        gauge(
            o,
            "headroom_ready",
            "1 while a new session could be admitted now, else 0.",
            u8::from(ready),
        );
        gauge(
            o,
            "headroom_queue_waiting",
            "Clients waiting in the admission queue.",
            queue.waiting,
        );
        gauge(
            o,
            "headroom_session_slots_free",
            "Session slots free now (--max-sessions less the sessions holding one).",
            queue.slots_free,
        );
        gauge(
            o,
            "headroom_planned_bytes_free",
            "Capacity not committed to the weights, the KV pool and the live sessions' planned peaks.",
            queue.planned_bytes_free,
        );
        gauge(
            o,
            "headroom_draining",
            "1 while the server drains (no new sessions; SIGTERM or POST /drain), else 0.",
            u8::from(queue.draining),
        );
        gauge(
            o,
            "headroom_queue_max",
            "Clients that may wait at once (--max-queue).",
            queue.max,
        );
        counter(
            o,
            "headroom_queue_admitted_total",
            "Sessions admitted after waiting in the queue.",
            load(&self.queue_admitted),
        );
        let _ = writeln!(
            o,
            "# HELP headroom_sessions_refused_total Sessions refused, by reason."
        );
        let _ = writeln!(o, "# TYPE headroom_sessions_refused_total counter");
        for reason in Refusal::ALL {
            let _ = writeln!(
                o,
                "headroom_sessions_refused_total{{reason=\"{}\"}} {}",
                reason.label(),
                load(&self.sessions_refused[reason.index()])
            );
        }
        gauge(
            o,
            "headroom_connections_open",
            "WebSocket connections open.",
            load(&self.connections_open),
        );
        counter(
            o,
            "headroom_connections_total",
            "WebSocket connections served.",
            load(&self.connections_total),
        );
        let _ = writeln!(
            o,
            "# HELP headroom_door_refusals_total Requests and sockets turned away at the door, by reason."
        );
        let _ = writeln!(o, "# TYPE headroom_door_refusals_total counter");
        for reason in DoorRefusal::ALL {
            let _ = writeln!(
                o,
                "headroom_door_refusals_total{{reason=\"{}\"}} {}",
                reason.label(),
                load(&self.door_refusals[reason.index()])
            );
        }
        counter(
            o,
            "headroom_sessions_admitted_total",
            "Sessions admitted.",
            load(&self.sessions_admitted),
        );
        counter(
            o,
            "headroom_sessions_rejected_total",
            "Sessions refused for capacity.",
            load(&self.sessions_rejected),
        );
        counter(
            o,
            "headroom_sessions_failed_total",
            "Sessions ended by a generation error.",
            load(&self.sessions_failed),
        );
        counter(
            o,
            "headroom_sessions_completed_total",
            "Sessions that produced every chunk.",
            load(&self.sessions_completed),
        );
        counter(
            o,
            "headroom_sessions_parked_total",
            "Sessions parked at a chunk boundary (pause, hang-up, drain into the store).",
            load(&self.sessions_parked_total),
        );
        counter(
            o,
            "headroom_sessions_resumed_total",
            "Sessions resumed from a resume token.",
            load(&self.sessions_resumed),
        );
        counter(
            o,
            "headroom_chunks_behind_playback_total",
            "Chunks ready after their playback deadline (playback from the first chunk at the session's fps).",
            load(&self.chunks_behind_playback),
        );
        counter(
            o,
            "headroom_deadline_misses_total",
            "Chunks ready after they were due to leave (a paced chunk: its play time less the lead; an unpaced one: its play time).",
            load(&self.deadline_misses),
        );
        gauge(
            o,
            "headroom_realtime_sessions",
            "Paced sessions streaming now, held to their viewers' clocks.",
            load(&self.realtime_sessions),
        );
        counter(
            o,
            "headroom_sessions_stopped_total",
            "Sessions ended early (stop, disconnect, stall, shutdown).",
            load(&self.sessions_stopped),
        );
        counter(
            o,
            "headroom_chunks_sent_total",
            "Chunks sent to clients.",
            load(&self.chunks_sent),
        );
        counter(
            o,
            "headroom_media_bytes_sent_total",
            "Bytes of fragmented MP4 sent.",
            load(&self.media_bytes_sent),
        );
        counter(
            o,
            "headroom_errors_sent_total",
            "error messages sent to clients.",
            load(&self.errors_sent),
        );
        self.chunk_latency.render(
            o,
            "headroom_chunk_latency_seconds",
            "Time to generate and encode one chunk.",
        );
        self.action_latency.render(
            o,
            "headroom_action_latency_seconds",
            "From an interaction's arrival to the sending of the chunk holding its first frame, plus that frame's offset in the chunk.",
        );
        self.time_to_first_chunk.render(
            o,
            "headroom_time_to_first_chunk_seconds",
            "Time from session.start to the first chunk being ready.",
        );
        self.queue_wait.render(
            o,
            "headroom_queue_wait_seconds",
            "Time from session.start to admission (0 when a slot was free).",
        );
        out
    }
}

impl Metrics {
    /// Per-rank memory of the last session on a mesh, labelled by rank.
    fn render_ranks(&self, o: &mut String) {
        use std::fmt::Write as _;
        let ranks = self
            .rank_memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if ranks.is_empty() {
            return;
        }
        type Field = fn(&headroom_engine::replicated::RankMemory) -> u64;
        let series: [(&str, &str, Field); 3] = [
            (
                "headroom_rank_allocated_peak_bytes",
                "Each rank's allocated peak over the last session.",
                |r| r.allocated_peak_bytes,
            ),
            (
                "headroom_rank_reserved_peak_bytes",
                "Each rank's reserved peak over the last session.",
                |r| r.reserved_peak_bytes,
            ),
            (
                "headroom_rank_post_session_reserved_bytes",
                "Each rank's reserved bytes after the last session.",
                |r| r.post_session_reserved_bytes,
            ),
        ];
        for (name, help, field) in series {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge");
            for r in &ranks {
                let _ = writeln!(
                    o,
                    "{name}{{rank=\"{}\",tp_rank=\"{}\",sp_rank=\"{}\"}} {}",
                    r.rank,
                    r.tp_rank,
                    r.sp_rank,
                    field(r)
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_counts_each_observation_in_every_bucket_at_or_above_it() {
        let h = Histogram::default();
        h.observe(Duration::from_millis(30));
        h.observe(Duration::from_secs(2));
        let mut out = String::new();
        h.render(&mut out, "headroom_x_seconds", "x");
        assert!(out.contains("headroom_x_seconds_bucket{le=\"0.025\"} 0"));
        assert!(out.contains("headroom_x_seconds_bucket{le=\"0.05\"} 1"));
        assert!(out.contains("headroom_x_seconds_bucket{le=\"2.5\"} 2"));
        assert!(out.contains("headroom_x_seconds_bucket{le=\"+Inf\"} 2"));
        assert!(out.contains("headroom_x_seconds_count 2"));
        assert!((h.mean_secs() - 1.015).abs() < 1e-9);
    }
}
