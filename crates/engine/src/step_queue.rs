//! Sessions on threads of their own, stepped together in rounds ordered by their
//! playback deadlines: the queue a server's session workers hand their sessions to for
//! each chunk, so that the sessions of one round run in one
//! [`crate::scheduler::next_chunks`] call (one batched forward per DMD step, batched VAE
//! work). A session's bytes are those it streams alone, whatever round it lands in.
//!
//! A worker first asks for its turn ([`StepQueue::turn`]) with the time its chunk is
//! due on its playback clock, then, called up, applies what happened since its last
//! boundary (interactions) and hands its session in ([`Turn::run`]).
//! - **Unpaced** turns are ready at once. **Paced** turns (the chunk should be made
//!   just in time, [`Pace::Deadline`]) are ready at `due − round time − margin`, the
//!   round time measured for rounds of that size.
//! - **Earliest deadline first:** when the first turn is ready, the round takes every
//!   turn that is ready, then, in deadline order, each turn that would be late if it
//!   waited for this round to end (its ready time falls before the round, with it,
//!   would end). Under light load a session runs alone at its own time (the least
//!   latency); as load grows, rounds fill, which is what a batched forward is cheap for.
//! - A capped round ([`StepQueue::with_max_batch`]) takes the turns due soonest.
//! - There is no scheduler thread: whichever waiting worker finds a round due calls
//!   it up, and the first called-up worker whose round has gathered leads it.
//!
//! The queue measures each round's time by its size and answers whether one more
//! session keeps every round on time ([`StepQueue::admits_another`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::scheduler;
use crate::session::{Chunk, Session};

/// How long a round that is due waits for live sessions that have not asked for their
/// turn yet (still sending their last chunk): sessions ready together batch together.
const GATHER: Duration = Duration::from_millis(20);

/// How long a called-up round waits for its sessions to be handed in (they apply their
/// interactions first: a prompt is encoded then); the late ones go to the next round.
const HAND_IN: Duration = Duration::from_millis(250);

/// What a paced turn adds to the round's measured time when it decides when to start:
/// room for the run-to-run spread of a round, little enough that an interaction waits
/// hardly more than a round.
pub const ROUND_MARGIN: Duration = Duration::from_millis(30);

/// How a session's chunk is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// Made as soon as possible (ordered by its due time when rounds are capped).
    Asap,
    /// Made just in time to be ready at its due time.
    Deadline,
}

/// The shared queue (one per engine).
#[derive(Debug, Default)]
pub struct StepQueue {
    state: Mutex<State>,
    changed: Condvar,
    /// Most sessions in one round (`None`: no cap).
    max_batch: Option<usize>,
}

/// A session's turn, from asking until its chunk is back.
#[derive(Debug)]
struct Entry {
    ticket: u64,
    /// When its chunk is due on its playback clock.
    due: Instant,
    pace: Pace,
    /// Called up for the round forming.
    called: bool,
    /// Handed in for the round.
    session: Option<Session>,
}

#[derive(Debug, Default)]
struct State {
    /// Sessions that step through this queue and are not finished.
    live: usize,
    /// Turns asked for and not yet run.
    entries: Vec<Entry>,
    /// Whether a round is running.
    running: bool,
    /// When the round being called up started calling (for [`HAND_IN`]).
    called_at: Option<Instant>,
    /// Until when a due round waits for live sessions to ask (for [`GATHER`]).
    gather_until: Option<Instant>,
    /// Sessions handed back with their chunks, by ticket.
    done: HashMap<u64, (Session, Result<Chunk>)>,
    next_ticket: u64,
    /// Seconds a round of n sessions takes (a moving average), by n.
    round_secs: BTreeMap<usize, f64>,
    /// Rounds run and sessions stepped in them (for reports).
    batches: u64,
    stepped: u64,
}

impl State {
    /// The measured (or, from the nearest measured size, scaled) time of a round of
    /// `n`; zero before any round ran.
    fn round_time(&self, n: usize) -> Duration {
        let n = n.max(1);
        let secs = match self.round_secs.get(&n) {
            Some(&t) => t,
            None => {
                let near = self
                    .round_secs
                    .iter()
                    .min_by_key(|(&m, _)| m.abs_diff(n))
                    .map(|(&m, &t)| t * n as f64 / m as f64);
                near.unwrap_or(0.0)
            }
        };
        Duration::from_secs_f64(secs.max(0.0))
    }

    /// When turn `e` should start to be ready by its due time in a round of its own (a
    /// paced turn before any round was measured: at once, ahead rather than late).
    fn ready_at(&self, e: &Entry, now: Instant) -> Instant {
        match e.pace {
            Pace::Asap => now,
            Pace::Deadline if self.round_secs.is_empty() => now,
            Pace::Deadline => e
                .due
                .checked_sub(self.round_time(1) + ROUND_MARGIN)
                .unwrap_or(now),
        }
    }
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

/// A called-up turn: the session's place in the round forming. Dropped without
/// [`Turn::run`], the place is given up.
#[derive(Debug)]
pub struct Turn {
    queue: Arc<StepQueue>,
    ticket: u64,
    ran: bool,
}

impl Drop for Turn {
    fn drop(&mut self) {
        if !self.ran {
            self.queue.forget(self.ticket);
        }
    }
}

impl Turn {
    /// Runs the session's chunk in its round and hands the session back with its
    /// chunk (or error, after which the session has released what it held, as
    /// [`Session::next_chunk`] does).
    pub fn run(mut self, session: Session) -> (Session, Result<Chunk>) {
        self.ran = true;
        let queue = Arc::clone(&self.queue);
        queue.run(self.ticket, session)
    }
}

impl StepQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty queue whose rounds hold at most `max` sessions (at least 1), the ones
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

    fn wait_for<'a>(&self, s: MutexGuard<'a, State>, d: Duration) -> MutexGuard<'a, State> {
        self.changed
            .wait_timeout(s, d)
            .unwrap_or_else(|p| p.into_inner())
            .0
    }

    /// Counts a session as live until the returned membership is dropped: a due round
    /// waits (briefly) for every live session to ask for its turn.
    pub fn join(self: &Arc<Self>) -> Member {
        self.lock().live += 1;
        Member {
            queue: Arc::clone(self),
        }
    }

    /// (rounds run, sessions stepped in them) so far.
    pub fn counts(&self) -> (u64, u64) {
        let s = self.lock();
        (s.batches, s.stepped)
    }

    /// Sessions stepping through the queue now.
    pub fn live(&self) -> usize {
        self.lock().live
    }

    /// The measured time of a round of `n` sessions (scaled from the nearest measured
    /// size; `None` before any round ran).
    pub fn round_time(&self, n: usize) -> Option<Duration> {
        let s = self.lock();
        (!s.round_secs.is_empty()).then(|| s.round_time(n))
    }

    /// The device time a chunk of every live session and one more takes: a measured
    /// round of them all (in rounds of at most the cap) where one was measured, else
    /// every session's chunk in a round of its own (sessions paced apart need not meet
    /// in a round), so never optimistic. `None` before any round was measured or with
    /// no session live (there is no other to make late).
    pub fn time_with_another(&self) -> Option<Duration> {
        let s = self.lock();
        if s.live == 0 || s.round_secs.is_empty() {
            return None;
        }
        let all = s.live + 1;
        let n = self.max_batch.map_or(all, |m| m.min(all));
        let rounds = all.div_ceil(n) as u32;
        let alone = s.round_time(1) * all as u32;
        let together = s.round_secs.get(&n).map(|_| s.round_time(n) * rounds);
        Some(together.map_or(alone, |t| t.min(alone)))
    }

    /// Whether one more session, needing a chunk every `period`, keeps every round on
    /// time: [`StepQueue::time_with_another`] with [`ROUND_MARGIN`] fits in the period.
    pub fn admits_another(&self, period: Duration) -> bool {
        self.time_with_another()
            .is_none_or(|t| t + ROUND_MARGIN <= period)
    }

    /// Runs `session`'s next chunk together with the other sessions of its round, at
    /// once (see [`StepQueue::turn`] and [`Turn::run`]).
    pub fn next_chunk(self: &Arc<Self>, session: Session) -> (Session, Result<Chunk>) {
        self.next_chunk_due(session, Instant::now())
    }

    /// [`StepQueue::next_chunk`] for a chunk due at `due` on the session's playback
    /// clock: in a capped round, the chunks due soonest run first.
    pub fn next_chunk_due(
        self: &Arc<Self>,
        session: Session,
        due: Instant,
    ) -> (Session, Result<Chunk>) {
        match self.turn(due, Pace::Asap, &|| false) {
            Some(turn) => turn.run(session),
            None => unreachable!("a turn that never gives up is always called up"),
        }
    }

    /// Asks for a turn for a chunk due at `due`, timed by `pace`, and waits, off the
    /// device, until the queue calls it up; `None` when `give_up` says so first (it is
    /// asked every few milliseconds: a stop, a request to park).
    pub fn turn(
        self: &Arc<Self>,
        due: Instant,
        pace: Pace,
        give_up: &dyn Fn() -> bool,
    ) -> Option<Turn> {
        let mut s = self.lock();
        let ticket = s.next_ticket;
        s.next_ticket += 1;
        s.entries.push(Entry {
            ticket,
            due,
            pace,
            called: false,
            session: None,
        });
        self.changed.notify_all();
        loop {
            if s.entries.iter().any(|e| e.ticket == ticket && e.called) {
                return Some(Turn {
                    queue: Arc::clone(self),
                    ticket,
                    ran: false,
                });
            }
            if give_up() {
                drop(s);
                self.forget(ticket);
                return None;
            }
            let wake = self.call_up(&mut s);
            if s.entries.iter().any(|e| e.ticket == ticket && e.called) {
                continue;
            }
            // Wake for a change, the next ready time, or to ask `give_up` again.
            let nap = wake
                .map_or(Duration::from_millis(10), |at| {
                    at.saturating_duration_since(Instant::now())
                })
                .clamp(Duration::from_micros(200), Duration::from_millis(10));
            s = self.wait_for(s, nap);
        }
    }

    /// Calls up the next round if one is due; otherwise when to look again.
    fn call_up(&self, s: &mut State) -> Option<Instant> {
        if s.running || s.entries.iter().any(|e| e.called) {
            return None;
        }
        let now = Instant::now();
        let first = s.entries.iter().map(|e| s.ready_at(e, now)).min()?;
        if first > now {
            s.gather_until = None;
            return Some(first);
        }
        // Due at once: wait a little for live sessions that have not asked yet (a
        // paced round is timed, and does not wait).
        let asap = s.entries.iter().any(|e| e.pace == Pace::Asap);
        let gather = *s.gather_until.get_or_insert(now + GATHER);
        if asap && s.entries.len() < s.live && now < gather {
            return Some(gather);
        }
        s.gather_until = None;
        // In deadline order: the ready ones, then each that would be late after this
        // round ends.
        let mut order: Vec<usize> = (0..s.entries.len()).collect();
        order.sort_by_key(|&i| (s.entries[i].due, s.entries[i].ticket));
        let cap = self.max_batch.unwrap_or(usize::MAX);
        let mut round: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&i| s.ready_at(&s.entries[i], now) <= now)
            .take(cap)
            .collect();
        for &i in &order {
            if round.len() >= cap {
                break;
            }
            if round.contains(&i) {
                continue;
            }
            // This round without it ends then; ready before, it would start late.
            let ends = now + s.round_time(round.len());
            if s.ready_at(&s.entries[i], now) < ends {
                round.push(i);
            } else {
                break;
            }
        }
        for i in round {
            s.entries[i].called = true;
        }
        s.called_at = Some(now);
        self.changed.notify_all();
        None
    }

    /// Gives up turn `ticket` (cancelled, or dropped unrun).
    fn forget(&self, ticket: u64) {
        let mut s = self.lock();
        s.entries.retain(|e| e.ticket != ticket);
        drop(s);
        self.changed.notify_all();
    }

    /// Hands `session` in for turn `ticket` and leads or waits for its round.
    fn run(&self, ticket: u64, session: Session) -> (Session, Result<Chunk>) {
        let mut s = self.lock();
        if let Some(e) = s.entries.iter_mut().find(|e| e.ticket == ticket) {
            e.session = Some(session);
        }
        self.changed.notify_all();
        loop {
            if let Some(out) = s.done.remove(&ticket) {
                return out;
            }
            let mut nap = Duration::from_millis(5);
            if !s.running {
                if s.entries.iter().any(|e| e.called) {
                    let missing = s.entries.iter().any(|e| e.called && e.session.is_none());
                    let late = s.called_at.is_none_or(|at| at.elapsed() >= HAND_IN);
                    if !missing || late {
                        s = self.lead(s);
                        continue;
                    }
                } else {
                    // Handed in after its round left without it: called up again.
                    if let Some(at) = self.call_up(&mut s) {
                        nap = at.saturating_duration_since(Instant::now()).min(nap);
                    }
                    if s.entries.iter().any(|e| e.called) {
                        continue;
                    }
                }
            }
            s = self.wait_for(s, nap.max(Duration::from_micros(200)));
        }
    }

    /// Leads one round: every called-up turn handed in (the others go back to
    /// waiting), run together; the sessions go back with their chunks.
    fn lead<'a>(&'a self, mut s: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        let (mut round, rest): (Vec<Entry>, Vec<Entry>) = std::mem::take(&mut s.entries)
            .into_iter()
            .partition(|e| e.called && e.session.is_some());
        s.entries = rest;
        for e in &mut s.entries {
            e.called = false;
        }
        s.called_at = None;
        if round.is_empty() {
            return s;
        }
        s.running = true;
        s.batches += 1;
        s.stepped += round.len() as u64;
        drop(s);
        let started = Instant::now();
        let mut sessions: Vec<Session> =
            round.iter_mut().filter_map(|e| e.session.take()).collect();
        let results = {
            let mut refs: Vec<&mut Session> = sessions.iter_mut().collect();
            scheduler::next_chunks(&mut refs)
        };
        let took = started.elapsed().as_secs_f64();
        let mut s = self.lock();
        let n = round.len();
        let t = s.round_secs.entry(n).or_insert(took);
        *t = 0.7 * *t + 0.3 * took;
        for ((e, session), result) in round.into_iter().zip(sessions).zip(results) {
            s.done.insert(e.ticket, (session, result));
        }
        s.running = false;
        self.changed.notify_all();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Engine, EngineConfig};
    use crate::session::SessionRequest;

    fn entry(ticket: u64, due: Instant, pace: Pace) -> Entry {
        Entry {
            ticket,
            due,
            pace,
            called: false,
            session: None,
        }
    }

    fn called(s: &State) -> Vec<u64> {
        let mut c: Vec<u64> = s
            .entries
            .iter()
            .filter(|e| e.called)
            .map(|e| e.ticket)
            .collect();
        c.sort_unstable();
        c
    }

    #[test]
    fn a_round_takes_the_ready_turns_and_those_that_would_be_late_after_it() {
        let queue = StepQueue::new();
        let now = Instant::now();
        let ms = |m: u64| now + Duration::from_millis(m);
        // Rounds of 1 take 100 ms, of 2 140 ms, of 3 170 ms.
        let mut s = State {
            live: 4,
            round_secs: [(1, 0.1), (2, 0.14), (3, 0.17)].into_iter().collect(),
            ..State::default()
        };
        // Ready at due − 100 ms − margin: ticket 0 is ready now; 1 (due in 200 ms) is
        // ready in 70 ms, before the round of 0 alone would end (100 ms): it joins; 3
        // (due in 300 ms, next in deadline order) would be ready in 170 ms, after the
        // round of two ends (140 ms): it waits, and so does 2 (due in 400 ms) behind it.
        s.entries = vec![
            entry(0, ms(130), Pace::Deadline),
            entry(1, ms(200), Pace::Deadline),
            entry(2, ms(400), Pace::Deadline),
            entry(3, ms(300), Pace::Deadline),
        ];
        assert_eq!(queue.call_up(&mut s), None);
        assert_eq!(called(&s), [0, 1]);
        // Nothing is ready: the next look is at the first ready time.
        let mut s = State {
            round_secs: [(1, 0.1)].into_iter().collect(),
            entries: vec![entry(7, ms(1000), Pace::Deadline)],
            ..State::default()
        };
        let wake = queue.call_up(&mut s).unwrap();
        assert!(wake > ms(800) && wake <= ms(870), "{:?}", wake - now);
        assert!(called(&s).is_empty());
        // An unpaced turn is ready at once.
        s.entries.push(entry(8, ms(5000), Pace::Asap));
        s.live = 2;
        assert_eq!(queue.call_up(&mut s), None);
        assert_eq!(called(&s), [8]);
    }

    #[test]
    fn a_capped_round_takes_the_turns_due_soonest() {
        let queue = StepQueue::with_max_batch(2);
        let now = Instant::now();
        let ms = |m: u64| now + Duration::from_millis(m);
        let mut s = State {
            live: 4,
            ..State::default()
        };
        s.entries = vec![
            entry(0, ms(40), Pace::Asap),
            entry(1, ms(10), Pace::Asap),
            entry(2, ms(40), Pace::Asap),
            entry(3, ms(5), Pace::Asap),
        ];
        assert_eq!(queue.call_up(&mut s), None);
        assert_eq!(called(&s), [1, 3]);
    }

    #[test]
    fn capacity_counts_the_round_of_every_live_session_and_one_more() {
        let queue = Arc::new(StepQueue::new());
        let period = Duration::from_millis(750);
        assert!(queue.admits_another(period), "nothing measured: yes");
        queue.lock().round_secs = [(1, 9.0)].into_iter().collect();
        assert!(
            queue.admits_another(period),
            "nobody else to make late: yes"
        );
        let _a = queue.join();
        let _b = queue.join();
        // Three chunks alone take 3 × 250 ms: with the margin they do not fit.
        queue.lock().round_secs = [(1, 0.25), (2, 0.4)].into_iter().collect();
        assert!(!queue.admits_another(period));
        // A round of all three measured at 600 ms does.
        queue.lock().round_secs.insert(3, 0.6);
        assert!(queue.admits_another(period));
        assert_eq!(queue.round_time(3), Some(Duration::from_secs_f64(0.6)));
        // Alone at 200 ms each, they fit without meeting.
        queue.lock().round_secs = [(1, 0.2)].into_iter().collect();
        assert!(queue.admits_another(period));
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
