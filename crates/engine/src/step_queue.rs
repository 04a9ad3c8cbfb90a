//! Sessions on threads of their own, stepped together: the queue a server's session
//! workers hand their sessions to for each chunk, so that every session ready at the
//! same time runs in one [`crate::scheduler::next_chunks`] call
//! (one batched forward per DMD step, batched VAE work).
//!
//! There is no scheduler thread: the first worker to arrive while no batch runs leads
//! one. It waits a little for the other live sessions to arrive (a session whose client
//! reads slowly is not waited for long), takes every session waiting, runs their chunks
//! together and hands each its session back with its chunk; whoever is waiting then
//! leads the next batch. A session's bytes are those it streams alone, whatever batch it
//! lands in.
//!
//! With a cap on the batch ([`StepQueue::with_max_batch`]), the sessions whose chunks are
//! due soonest (each worker says when its next chunk is due on its playback clock) go
//! first; the others wait for the next batch, so none is starved: a session passed over
//! only becomes more due.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::scheduler;
use crate::session::{Chunk, Session};

/// How long a leader waits for the other live sessions to come for their next chunk.
const GATHER: Duration = Duration::from_millis(20);

/// The shared queue (one per engine).
#[derive(Debug, Default)]
pub struct StepQueue {
    state: Mutex<State>,
    changed: Condvar,
    /// Most sessions in one batch (`None`: every session waiting).
    max_batch: Option<usize>,
}

/// A session handed in for its next chunk.
#[derive(Debug)]
struct Waiting {
    ticket: u64,
    /// When its chunk is due on its playback clock.
    due: Instant,
    session: Session,
}

#[derive(Debug, Default)]
struct State {
    /// Sessions that step through this queue and are not finished.
    live: usize,
    /// Sessions handed in for their next chunk.
    waiting: Vec<Waiting>,
    /// Whether a batch is running.
    running: bool,
    /// Sessions handed back with their chunks, by ticket.
    done: HashMap<u64, (Session, Result<Chunk>)>,
    next_ticket: u64,
    /// Batches run and sessions stepped in them (for reports).
    batches: u64,
    stepped: u64,
}

/// A session's membership of a [`StepQueue`]: counted as live until dropped.
#[derive(Debug)]
pub struct Member {
    queue: Arc<StepQueue>,
}

impl Drop for Member {
    fn drop(&mut self) {
        let mut s = self.queue.lock();
        s.live = s.live.saturating_sub(1);
        drop(s);
        self.queue.changed.notify_all();
    }
}

impl StepQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty queue whose batches hold at most `max` sessions (at least 1), the ones
    /// due soonest.
    pub fn with_max_batch(max: usize) -> Self {
        Self {
            max_batch: Some(max.max(1)),
            ..Self::default()
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a session as live until the returned membership is dropped: a batch's
    /// leader waits (briefly) for every live session before it starts.
    pub fn join(self: &Arc<Self>) -> Member {
        self.lock().live += 1;
        Member {
            queue: Arc::clone(self),
        }
    }

    /// (batches run, sessions stepped in them) so far.
    pub fn counts(&self) -> (u64, u64) {
        let s = self.lock();
        (s.batches, s.stepped)
    }

    /// Runs `session`'s next chunk together with every other session waiting for its
    /// own, and hands the session back with its chunk (or error, after which the session
    /// has released what it held, as [`Session::next_chunk`] does).
    pub fn next_chunk(&self, session: Session) -> (Session, Result<Chunk>) {
        self.next_chunk_due(session, Instant::now())
    }

    /// [`StepQueue::next_chunk`] for a chunk due at `due` on the session's playback
    /// clock: when the batch is capped, the chunks due soonest run first.
    pub fn next_chunk_due(&self, session: Session, due: Instant) -> (Session, Result<Chunk>) {
        let mut s = self.lock();
        let ticket = s.next_ticket;
        s.next_ticket += 1;
        s.waiting.push(Waiting {
            ticket,
            due,
            session,
        });
        self.changed.notify_all();
        loop {
            if let Some(out) = s.done.remove(&ticket) {
                return out;
            }
            if !s.running && !s.waiting.is_empty() {
                s = self.lead(s);
                continue;
            }
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Leads one batch: gathers the live sessions (for at most [`GATHER`]), runs every
    /// waiting one's chunk together and hands the sessions back.
    fn lead<'a>(&'a self, mut s: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        s.running = true;
        let deadline = Instant::now() + GATHER;
        let wanted = self.max_batch.map_or(s.live, |m| m.min(s.live));
        while s.waiting.len() < wanted {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let batch = take_due(&mut s.waiting, self.max_batch, |w| (w.due, w.ticket));
        let (tickets, mut sessions): (Vec<u64>, Vec<Session>) =
            batch.into_iter().map(|w| (w.ticket, w.session)).unzip();
        s.batches += 1;
        s.stepped += sessions.len() as u64;
        drop(s);
        let results = {
            let mut refs: Vec<&mut Session> = sessions.iter_mut().collect();
            scheduler::next_chunks(&mut refs)
        };
        let mut s = self.lock();
        for ((ticket, session), result) in tickets.into_iter().zip(sessions).zip(results) {
            s.done.insert(ticket, (session, result));
        }
        s.running = false;
        self.changed.notify_all();
        s
    }
}

/// Takes the batch out of `waiting`: everything, or the `max` due soonest (the earlier
/// ticket first among equal deadlines).
fn take_due<T>(
    waiting: &mut Vec<T>,
    max: Option<usize>,
    order: impl Fn(&T) -> (Instant, u64),
) -> Vec<T> {
    match max {
        Some(max) if waiting.len() > max => {
            waiting.sort_by_key(order);
            let rest = waiting.split_off(max);
            std::mem::replace(waiting, rest)
        }
        _ => std::mem::take(waiting),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Engine, EngineConfig};
    use crate::session::SessionRequest;

    #[test]
    fn a_capped_batch_takes_the_chunks_due_soonest_and_leaves_the_rest_waiting() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // (due, ticket): ticket 3 arrived last but is due first.
        let mut waiting = vec![(at(40), 0), (at(10), 1), (at(40), 2), (at(5), 3)];
        let batch = take_due(&mut waiting, Some(2), |w| *w);
        assert_eq!(batch, [(at(5), 3), (at(10), 1)]);
        assert_eq!(waiting, [(at(40), 0), (at(40), 2)]);
        // Uncapped, or within the cap: everything, in arrival order.
        assert_eq!(take_due(&mut waiting, Some(2), |w| *w).len(), 2);
        let mut all = vec![(at(9), 0), (at(1), 1)];
        assert_eq!(take_due(&mut all, None, |w| *w), [(at(9), 0), (at(1), 1)]);
    }

    #[test]
    fn sessions_on_threads_stepped_through_the_queue_stream_their_bytes_alone() {
        let engine = Engine::new(EngineConfig {
            model: "tiny".to_string(),
            kv_budget_bytes: Some(64 << 20),
            max_sessions: 3,
            ..EngineConfig::default()
        })
        .unwrap();
        let request = |k: u64| SessionRequest {
            seed: 70 + k,
            ..SessionRequest::new(48, 32, [21, 33, 9][k as usize])
        };
        let alone: Vec<Vec<Vec<u8>>> = (0..3)
            .map(|k| {
                let mut s = engine.open_session(request(k)).unwrap();
                (0..s.chunks_total().unwrap())
                    .map(|_| s.next_chunk().unwrap().frames.to_vec::<u8>().unwrap())
                    .collect()
            })
            .collect();
        for queue in [StepQueue::new(), StepQueue::with_max_batch(2)] {
            let queue = Arc::new(queue);
            let opened = std::sync::Barrier::new(3);
            let streamed: Vec<Vec<Vec<u8>>> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..3)
                    .map(|k| {
                        let (engine, queue, opened) = (&engine, &queue, &opened);
                        scope.spawn(move || {
                            let _member = queue.join();
                            let mut session = engine.open_session(request(k)).unwrap();
                            // Every session open before the first chunk: they step together.
                            opened.wait();
                            let mut out = Vec::new();
                            for _ in 0..session.chunks_total().unwrap() {
                                let (back, chunk) = queue.next_chunk(session);
                                session = back;
                                out.push(chunk.unwrap().frames.to_vec::<u8>().unwrap());
                            }
                            out
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert_eq!(streamed, alone);
            let (batches, stepped) = queue.counts();
            assert_eq!(stepped, 3 + 2 + 1, "every chunk went through the queue");
            assert!(
                batches < stepped,
                "some chunks ran together: {batches} batches"
            );
        }
    }
}
