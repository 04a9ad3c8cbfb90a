//! Admission: session slots and the first-come-first-served queue in front of them.
//!
//! A `session.start` that finds a slot free, the KV pool with room for one more session
//! and nobody waiting is admitted at once; otherwise it takes a [`Ticket`] at the back of
//! the queue (at most `max_queue` wait) and is admitted when its ticket reaches the head
//! and those conditions hold. One session opens at a time: the head waits while an
//! admitted session is still reserving its KV pages and state, so two starts never race
//! for the same pages. Every change that can let the head in (a slot or ticket given
//! back, an open finished) bumps a generation counter that waiters watch, so waiting
//! costs nothing between changes. Tickets and slots give themselves back on drop: a
//! client that hangs up while queued leaves the queue with its socket task. When the
//! last slot is given back with nobody waiting, the engine crosses its `sleep` boundary
//! and the allocator's cache goes back: what stays is the weights and the KV pool.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use std::time::Duration;

use headroom_engine::{Engine, StepQueue};
use tokio::sync::watch;

use crate::metrics::Metrics;

pub use crate::refusal::Refusal;

#[derive(Debug, Default)]
struct Inner {
    /// Tickets waiting, head first.
    waiting: VecDeque<u64>,
    next_ticket: u64,
    /// Slots held (sessions admitted and not yet released).
    open: usize,
    /// Admitted sessions still reserving their pages and state.
    opening: usize,
}

/// The slots and the queue of one server.
#[derive(Debug)]
pub struct Admission {
    engine: Arc<Engine>,
    metrics: Arc<Metrics>,
    max_sessions: usize,
    max_queue: usize,
    pages_per_session: usize,
    /// The step queue whose rounds must stay on time, and a chunk's playing time.
    realtime: Option<(Arc<StepQueue>, Duration)>,
    inner: Mutex<Inner>,
    generation: watch::Sender<u64>,
}

/// A place in the queue; dropping it leaves the queue.
#[derive(Debug)]
pub struct Ticket {
    admission: Arc<Admission>,
    id: u64,
    /// False once admitted (the ticket left the queue then).
    queued: bool,
}

/// A held session slot; dropping it frees the slot.
#[derive(Debug)]
pub struct Slot {
    admission: Arc<Admission>,
    opening: bool,
}

impl Admission {
    /// Slots for `max_sessions` sessions and a queue of at most `max_queue` waiting
    /// clients; `pages_per_session` is the fewest pages a session reserves (what
    /// [`Admission::room`] asks for). Each client's own need is given where it enters.
    pub fn new(
        engine: Arc<Engine>,
        metrics: Arc<Metrics>,
        max_sessions: usize,
        max_queue: usize,
        pages_per_session: usize,
        realtime: Option<(Arc<StepQueue>, Duration)>,
    ) -> Arc<Self> {
        Arc::new(Self {
            engine,
            metrics,
            max_sessions,
            max_queue,
            pages_per_session,
            realtime,
            inner: Mutex::new(Inner::default()),
            generation: watch::channel(0).0,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.generation.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// A receiver that changes whenever the head might now be admitted.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Session slots held now.
    pub fn open(&self) -> usize {
        self.lock().open
    }

    /// Clients waiting now.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    /// The most clients that may wait.
    pub fn max_queue(&self) -> usize {
        self.max_queue
    }

    /// `Ok` while a slot is free and the KV pool (once sized) has the pages of the
    /// smallest session free, else the reason.
    pub fn room(&self) -> std::result::Result<(), String> {
        self.room_for(self.pages_per_session)
    }

    /// `Ok` while a slot is free and the KV pool (once sized) has `pages` free, else the
    /// reason.
    pub fn room_for(&self, pages: usize) -> std::result::Result<(), String> {
        let open = self.lock().open;
        self.room_with(open, pages)
    }

    fn room_with(&self, open: usize, pages: usize) -> std::result::Result<(), String> {
        if open >= self.max_sessions {
            return Err(format!(
                "all {} session slots are in use (--max-sessions)",
                self.max_sessions
            ));
        }
        if let Some(pool) = self.engine.kv_pool() {
            let free = pool.free_pages();
            if free < pages {
                return Err(format!(
                    "the KV pool has {free} of {} pages free; this session needs {pages}",
                    pool.total_pages(),
                ));
            }
        }
        if let Some((steps, period)) = &self.realtime {
            if !steps.admits_another(*period) {
                let needed = steps.time_with_another().unwrap_or_default();
                return Err(format!(
                    "one more session would make the others late: a chunk of {} sessions takes {:.0} ms of device time, and a chunk plays for {:.0} ms (real-time capacity, --scheduler deadline)",
                    steps.live() + 1,
                    needed.as_secs_f64() * 1e3,
                    period.as_secs_f64() * 1e3,
                ));
            }
        }
        Ok(())
    }

    /// A slot now for a session of `pages` KV pages when nobody waits and there is room;
    /// else `Err(None)` to queue, or `Err(Some(reason))` when the queue is full.
    pub fn try_enter(self: &Arc<Self>, pages: usize) -> std::result::Result<Slot, Option<String>> {
        let mut inner = self.lock();
        if inner.waiting.is_empty() && inner.opening == 0 {
            if let Ok(()) = self.room_with(inner.open, pages) {
                return Ok(self.take(&mut inner));
            }
        }
        if inner.waiting.len() >= self.max_queue {
            let why = self
                .room_with(inner.open, pages)
                .err()
                .unwrap_or_else(|| "another session is being admitted before you".to_string());
            return Err(Some(format!(
                "{why}, and the admission queue is full: {} of {} clients wait (--max-queue)",
                inner.waiting.len(),
                self.max_queue
            )));
        }
        Err(None)
    }

    /// Joins the back of the queue (the front when `front`: a client whose admission
    /// failed for memory goes back to where it was). The caller checked the length.
    pub fn join(self: &Arc<Self>, front: bool) -> Ticket {
        let mut inner = self.lock();
        inner.next_ticket += 1;
        let id = inner.next_ticket;
        if front {
            inner.waiting.push_front(id);
        } else {
            inner.waiting.push_back(id);
        }
        drop(inner);
        self.bump();
        Ticket {
            admission: Arc::clone(self),
            id,
            queued: true,
        }
    }

    fn take(self: &Arc<Self>, inner: &mut Inner) -> Slot {
        inner.open += 1;
        inner.opening += 1;
        self.metrics
            .sessions_open
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Slot {
            admission: Arc::clone(self),
            opening: true,
        }
    }
}

impl Ticket {
    /// Clients ahead of this one.
    pub fn ahead(&self) -> usize {
        let inner = self.admission.lock();
        inner
            .waiting
            .iter()
            .position(|&t| t == self.id)
            .unwrap_or(0)
    }

    /// A slot when this ticket is at the head and there is room for a session of `pages`
    /// KV pages (the ticket is used up), else the ticket back.
    pub fn try_admit(mut self, pages: usize) -> std::result::Result<Slot, Ticket> {
        let admission = Arc::clone(&self.admission);
        let mut inner = admission.lock();
        let at_head = inner.waiting.front() == Some(&self.id);
        if !at_head || inner.opening > 0 || admission.room_with(inner.open, pages).is_err() {
            drop(inner);
            return Err(self);
        }
        inner.waiting.pop_front();
        let slot = admission.take(&mut inner);
        drop(inner);
        self.queued = false;
        admission.bump();
        Ok(slot)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.queued {
            return;
        }
        let mut inner = self.admission.lock();
        inner.waiting.retain(|&t| t != self.id);
        drop(inner);
        self.admission.bump();
    }
}

impl Slot {
    /// The session has reserved its pages and state (or failed to): the next in line may
    /// be admitted.
    pub fn opened(&mut self) {
        if std::mem::take(&mut self.opening) {
            self.admission.lock().opening -= 1;
            self.admission.bump();
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut inner = self.admission.lock();
        inner.open -= 1;
        if self.opening {
            inner.opening -= 1;
        }
        let idle = inner.open == 0 && inner.waiting.is_empty();
        drop(inner);
        if idle {
            // The last session is gone and nobody waits: the cache goes back.
            self.admission.engine.sleep();
        }
        self.admission
            .metrics
            .sessions_open
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.admission.bump();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_engine::EngineConfig;

    fn admission(max_sessions: usize, max_queue: usize) -> Arc<Admission> {
        let engine = Engine::new(EngineConfig {
            model: "tiny".to_string(),
            ..EngineConfig::default()
        })
        .unwrap();
        Admission::new(
            Arc::new(engine),
            Arc::new(Metrics::default()),
            max_sessions,
            max_queue,
            18,
            None,
        )
    }

    #[test]
    fn only_the_head_is_admitted_and_not_while_another_session_is_opening() {
        let a = admission(2, 4);
        let mut first = a.try_enter(18).unwrap();
        // The first is still opening: a newcomer queues even with a slot free.
        assert!(matches!(a.try_enter(18), Err(None)));
        let one = a.join(false);
        let two = a.join(false);
        assert_eq!((one.ahead(), two.ahead()), (0, 1));
        let two = two.try_admit(18).unwrap_err();
        let one = one.try_admit(18).unwrap_err();
        first.opened();
        let _two = two.try_admit(18).unwrap_err();
        let mut second = one.try_admit(18).unwrap();
        assert_eq!((a.open(), a.waiting()), (2, 1));
        second.opened();
        drop(first);
        assert_eq!(a.open(), 1);
    }

    #[test]
    fn a_dropped_ticket_leaves_the_queue_and_a_full_queue_names_max_queue() {
        let a = admission(1, 1);
        let _slot = a.try_enter(18).unwrap();
        let waiting = a.join(false);
        let full = a.try_enter(18).unwrap_err().unwrap();
        assert!(
            full.contains("--max-queue") && full.contains("--max-sessions"),
            "{full}"
        );
        drop(waiting);
        assert_eq!(a.waiting(), 0);
        assert!(matches!(a.try_enter(18), Err(None)));
    }

    #[test]
    fn a_client_sent_back_to_the_front_is_next_in_line() {
        let a = admission(1, 4);
        let _slot = a.try_enter(18).unwrap();
        let later = a.join(false);
        let back = a.join(true);
        assert_eq!((back.ahead(), later.ahead()), (0, 1));
    }
}
