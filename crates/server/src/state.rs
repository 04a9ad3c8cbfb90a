//! The state every route and socket shares: the engine, admission, counters, the
//! shutdown signal and the open-socket count.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use headroom_engine::{Engine, StepQueue};
use headroom_tensor::comm::Communicator;
use tokio::sync::watch;

use crate::admission::Admission;
use crate::config::ServerConfig;
use crate::metrics::{Metrics, QueueGauges};

/// State shared by every route and socket.
#[derive(Debug)]
pub struct AppState {
    /// The engine sessions run on.
    pub engine: Arc<Engine>,
    /// The mesh's world group when this engine is rank 0 of a TP × SP mesh: every
    /// session is led on every rank (`headroom_engine::replicated`).
    pub world: Option<Arc<dyn Communicator>>,
    /// The server's setup.
    pub config: ServerConfig,
    /// The fewest KV pages a session reserves (the engine's window at one page a frame;
    /// a session reserves its own size's pages).
    pub pages_per_session: usize,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Session slots and the queue in front of them.
    pub admission: Arc<Admission>,
    /// Where concurrent sessions step together (batched steps on, no mesh).
    pub steps: Option<Arc<StepQueue>>,
    pub(crate) shutdown_tx: watch::Sender<bool>,
    /// Turns `true` when a drain begins (SIGTERM, `POST /drain`).
    pub(crate) drain_tx: watch::Sender<bool>,
    pub(crate) sockets: watch::Sender<usize>,
    pub(crate) request_ids: AtomicU64,
    /// The open WebSockets under `--max-connections` ([`crate::sockets::Sockets`]).
    pub(crate) room: Arc<crate::sockets::Sockets>,
    /// Sessions streaming now, from their admission until their end is sent.
    pub(crate) streaming: watch::Sender<usize>,
    /// Resume tokens and parked sessions.
    pub resume: Arc<crate::resume::ResumeBook>,
}

/// Counts one streaming session until it drops.
#[derive(Debug)]
pub(crate) struct Streaming(watch::Sender<usize>);

impl Drop for Streaming {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

/// Decrements the open-socket count when a socket task ends.
#[derive(Debug)]
pub struct SocketGuard {
    sockets: watch::Sender<usize>,
    metrics: Arc<Metrics>,
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        self.metrics
            .connections_open
            .fetch_sub(1, Ordering::Relaxed);
        self.sockets.send_modify(|n| *n -= 1);
    }
}

impl AppState {
    /// Counts a socket task until the guard drops.
    pub fn socket_guard(&self) -> SocketGuard {
        self.metrics
            .connections_open
            .fetch_add(1, Ordering::Relaxed);
        self.metrics
            .connections_total
            .fetch_add(1, Ordering::Relaxed);
        self.sockets.send_modify(|n| *n += 1);
        SocketGuard {
            sockets: self.sockets.clone(),
            metrics: Arc::clone(&self.metrics),
        }
    }

    /// A receiver that turns `true` when the server begins shutting down.
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown_tx.subscribe()
    }

    /// Whether shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown_tx.borrow()
    }

    /// Whether a drain has begun: no new session is taken.
    pub fn is_draining(&self) -> bool {
        *self.drain_tx.borrow()
    }

    /// Begins a drain (once; later calls do nothing): `/ready` turns 503, new sessions
    /// and queued clients are refused, running sessions go on. Returns whether this call
    /// began it.
    pub fn drain(&self) -> bool {
        let began = !self.drain_tx.send_replace(true);
        if began {
            tracing::info!("draining: no new sessions; running ones finish");
        }
        began
    }

    /// A receiver that turns `true` when a drain begins.
    pub fn drain_signal(&self) -> watch::Receiver<bool> {
        self.drain_tx.subscribe()
    }

    /// Counts a session as streaming until the guard drops.
    pub(crate) fn streaming(&self) -> Streaming {
        self.streaming.send_modify(|n| *n += 1);
        Streaming(self.streaming.clone())
    }

    /// Resolves once no session streams (its end sent), none holds a slot and no client
    /// waits.
    pub async fn idle(&self) {
        let mut changes = self.admission.changes();
        let mut streams = self.streaming.subscribe();
        loop {
            if *streams.borrow_and_update() == 0
                && self.admission.open() == 0
                && self.admission.waiting() == 0
            {
                return;
            }
            tokio::select! {
                r = changes.changed() => if r.is_err() { return },
                r = streams.changed() => if r.is_err() { return },
            }
        }
    }

    /// A request id in vLLM-Omni's style: `video_stream-` and 32 hex digits, unique in
    /// this process and unlikely to repeat across restarts.
    pub fn new_request_id(&self) -> String {
        use std::hash::{BuildHasher, Hasher};
        let n = self.request_ids.fetch_add(1, Ordering::Relaxed);
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(n);
        format!("video_stream-{:016x}{:016x}", h.finish(), n)
    }

    /// `Ok` while a new client would start a session at once, else the reason: shutting
    /// down, draining, every slot held, too few free KV pages, or clients already
    /// waiting. With `ready_when_queueing`, a client that would queue counts as served:
    /// then only a full queue (or, with no queue, no room) is not ready.
    pub fn readiness(&self) -> std::result::Result<(), String> {
        self.readiness_for(self.config.ready_when_queueing)
    }

    /// [`AppState::readiness`] with `queueing` in place of `ready_when_queueing`
    /// (`GET /ready?queueing=1` asks for it: a balancer's fallback when no replica is
    /// ready).
    pub fn readiness_for(&self, queueing: bool) -> std::result::Result<(), String> {
        if self.is_shutting_down() {
            return Err("the server is shutting down".to_string());
        }
        if self.is_draining() {
            return Err("the server is draining: no new sessions".to_string());
        }
        let max = self.admission.max_queue();
        if max == 0 || !queueing {
            let waiting = self.admission.waiting();
            if waiting > 0 {
                return Err(format!(
                    "{waiting} clients wait in the admission queue; a new one would queue"
                ));
            }
            return self.admission.room();
        }
        let waiting = self.admission.waiting();
        if waiting >= max {
            return Err(format!(
                "the admission queue is full: {waiting} of {max} clients wait (--max-queue)"
            ));
        }
        Ok(())
    }

    /// The queue's figures now.
    pub fn queue_gauges(&self) -> QueueGauges {
        QueueGauges {
            waiting: self.admission.waiting(),
            max: self.admission.max_queue(),
            slots_free: self
                .config
                .max_sessions
                .saturating_sub(self.admission.open()),
            planned_bytes_free: self.engine.planned_bytes_free(),
            draining: self.is_draining(),
        }
    }
}
