//! One driver for a session however it runs: alone on this engine, stepped together
//! with other sessions through a [`StepQueue`] (their forwards batched), or led on every
//! rank of a mesh ([`crate::replicated`]). `headroom generate` and the server drive
//! their sessions through it, so the chunk loop is written once.

use std::sync::Arc;
use std::time::Instant;

use headroom_model::camera::CameraUpdate;
use headroom_tensor::comm::Communicator;

use crate::cancel::CancelToken;
use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::replicated::{lead_open, LeadSession, RankMemory};
use crate::request::SessionRequest;
use crate::session::{Chunk, Session};
use crate::step_queue::{Member, Pace, StepQueue, Turn};

/// How a session is driven.
#[derive(Clone, Copy)]
pub enum Drive<'a> {
    /// Alone on this engine: each chunk runs when asked for.
    Alone,
    /// Stepped with the other sessions of `queue`, whose forwards run batched.
    Stepped(&'a Arc<StepQueue>),
    /// On every rank of the mesh of `world` (this is rank 0; the others follow).
    Led(&'a Arc<dyn Communicator>),
}

impl std::fmt::Debug for Drive<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Drive::Alone => "Alone",
            Drive::Stepped(_) => "Stepped",
            Drive::Led(_) => "Led",
        })
    }
}

/// A session as its caller drives it, whichever [`Drive`] it was opened with.
#[derive(Debug)]
pub struct SessionDriver {
    how: Driven,
}

/// The session behind a [`SessionDriver`].
#[derive(Debug)]
enum Driven {
    /// This engine's own session.
    Alone(Session),
    /// This engine's session, its chunks run through the step queue (it is `None` only
    /// while the queue holds it).
    Stepped {
        session: Option<Session>,
        queue: Arc<StepQueue>,
        /// The turn the queue called up, until the chunk runs in it.
        turn: Option<Turn>,
        _member: Member,
    },
    /// Rank 0's side of a session every rank runs.
    Led(LeadSession),
}

impl SessionDriver {
    /// Admits and opens `request` on `engine`, driven as `how` says: a refused or
    /// failed open leaves the engine (and every rank) as it was.
    pub fn open(engine: &Engine, request: SessionRequest, how: Drive<'_>) -> Result<Self> {
        Self::drive(
            how,
            request,
            |request| engine.open_session(request),
            |world, request| lead_open(engine, world, request),
        )
    }

    /// Resumes `snapshot` on `engine` ([`Engine::resume`]), driven as `how` says. A
    /// session led over a mesh resumes on every rank, each from its own shard: rank
    /// `r` > 0 reads `snapshot`'s path with `.rank-r` before its extension.
    pub fn resume(engine: &Engine, snapshot: &std::path::Path, how: Drive<'_>) -> Result<Self> {
        Self::drive(
            how,
            snapshot,
            |snapshot| engine.resume(snapshot),
            |world, snapshot| crate::replicated::lead_resume(engine, world, snapshot),
        )
    }

    /// Resumes a snapshot held in memory (a parked session) on `engine`, alone or
    /// stepped; a led session resumes from its shards' files ([`SessionDriver::resume`]).
    pub fn resume_snapshot(
        engine: &Engine,
        snapshot: Arc<crate::SessionSnapshot>,
        how: Drive<'_>,
    ) -> Result<Self> {
        let led = |_: &Arc<dyn Communicator>, _| {
            Err(EngineError::snapshot(
                crate::SnapshotFault::Unsupported,
                "a session led over a mesh resumes from its ranks' shard files, not from memory",
            ))
        };
        Self::drive(how, snapshot, |snapshot| engine.resume(snapshot), led)
    }

    /// A session this engine opens from `what` with `open` (alone, or joining the step
    /// queue), or one `led` opens from it on every rank.
    fn drive<T>(
        how: Drive<'_>,
        what: T,
        open: impl FnOnce(T) -> Result<Session>,
        led: impl FnOnce(&Arc<dyn Communicator>, T) -> Result<LeadSession>,
    ) -> Result<Self> {
        let how = match how {
            Drive::Alone => Driven::Alone(open(what)?),
            Drive::Stepped(queue) => Driven::Stepped {
                session: Some(open(what)?),
                turn: None,
                _member: queue.join(),
                queue: Arc::clone(queue),
            },
            Drive::Led(world) => Driven::Led(led(world, what)?),
        };
        Ok(Self { how })
    }

    /// The session's snapshot at this chunk boundary, in memory (a led session's is
    /// refused: its ranks' shards are files, [`SessionDriver::snapshot_to`]).
    pub fn snapshot(&self) -> Result<crate::SessionSnapshot> {
        match &self.how {
            Driven::Led(_) => Err(EngineError::snapshot(
                crate::SnapshotFault::Unsupported,
                "a session led over a mesh is snapshotted to its ranks' shard files",
            )),
            _ => self.session().ok_or_else(released)?.snapshot(),
        }
    }

    /// Snapshots the session at this chunk boundary to `path` (a led session: every
    /// rank its own shard, rank `r` > 0 beside `path` with `.rank-r` before the
    /// extension); returns rank 0's snapshot as written.
    pub fn snapshot_to(&mut self, path: &std::path::Path) -> Result<crate::SessionSnapshot> {
        match &mut self.how {
            Driven::Led(s) => s.snapshot_to(path),
            _ => {
                let snap = self.session().ok_or_else(released)?.snapshot()?;
                snap.write(path)?;
                Ok(snap)
            }
        }
    }

    /// The session (`None` for a led session after it ended).
    pub fn session(&self) -> Option<&Session> {
        match &self.how {
            Driven::Alone(s) => Some(s),
            Driven::Stepped { session, .. } => session.as_ref(),
            Driven::Led(s) => s.session(),
        }
    }

    /// Chunks the session will produce; `None` for one that streams until stopped.
    pub fn chunks_total(&self) -> Option<usize> {
        self.session().and_then(Session::chunks_total)
    }

    /// The next chunk; [`EngineError::Finished`] after the last.
    pub fn next_chunk(&mut self) -> Result<Chunk> {
        self.next_chunk_due(Instant::now())
    }

    /// The next chunk, due at `due` on the session's playback clock: a step queue with
    /// a capped batch runs the chunks due soonest first.
    pub fn next_chunk_due(&mut self, due: Instant) -> Result<Chunk> {
        match &mut self.how {
            Driven::Alone(s) => s.next_chunk(),
            Driven::Stepped {
                session,
                queue,
                turn,
                ..
            } => {
                let Some(s) = session.take() else {
                    return Err(released());
                };
                let (back, chunk) = match turn.take() {
                    Some(turn) => turn.run(s),
                    None => queue.next_chunk_due(s, due),
                };
                *session = Some(back);
                chunk
            }
            Driven::Led(s) => s.next_chunk(),
        }
    }

    /// Whether the session's chunks are timed by a step queue ([`SessionDriver::await_turn`]
    /// waits for its round); otherwise a paced caller waits itself.
    pub fn stepped(&self) -> bool {
        matches!(self.how, Driven::Stepped { .. })
    }

    /// Waits, off the device, for the turn of the chunk due at `due`, timed by `pace`:
    /// a stepped session until its step queue calls it up (the next
    /// [`SessionDriver::next_chunk_due`] runs in that round); any other at once. `false`
    /// when `give_up` said so first (a stop, a request to park).
    pub fn await_turn(&mut self, due: Instant, pace: Pace, give_up: &dyn Fn() -> bool) -> bool {
        match &mut self.how {
            Driven::Stepped { queue, turn, .. } => match queue.turn(due, pace, give_up) {
                Some(t) => {
                    *turn = Some(t);
                    true
                }
                None => false,
            },
            _ => !give_up(),
        }
    }

    /// Gives up a turn called up and not run (the session parks or ends at this
    /// boundary instead): its round goes without it.
    pub fn give_up_turn(&mut self) {
        if let Driven::Stepped { turn, .. } = &mut self.how {
            *turn = None;
        }
    }

    /// Changes the prompt from the next chunk on (see [`Session::set_prompt`]).
    pub fn set_prompt(&mut self, prompt: &str) -> Result<()> {
        self.set_prompt_over(prompt, 0.0)
    }

    /// Changes the prompt over `transition_chunks` chunks (see
    /// [`Session::set_prompt_over`]).
    pub fn set_prompt_over(&mut self, prompt: &str, transition_chunks: f64) -> Result<()> {
        match &mut self.how {
            Driven::Alone(s) => s.set_prompt_over(prompt, transition_chunks),
            Driven::Stepped { session, .. } => session
                .as_mut()
                .ok_or_else(released)?
                .set_prompt_over(prompt, transition_chunks),
            Driven::Led(s) => s.set_prompt_over(prompt, transition_chunks),
        }
    }

    /// Queues a camera update for the next chunk (see [`Session::interact`]).
    pub fn interact(&mut self, update: CameraUpdate) -> Result<()> {
        self.interact_at(update, 0)
    }

    /// Queues a camera update starting at video frame `frame` of the next chunk (see
    /// [`Session::interact_at`]).
    pub fn interact_at(&mut self, update: CameraUpdate, frame: usize) -> Result<()> {
        match &mut self.how {
            Driven::Alone(s) => s.interact_at(update, frame),
            Driven::Stepped { session, .. } => session
                .as_mut()
                .ok_or_else(released)?
                .interact_at(update, frame),
            Driven::Led(s) => s.interact_at(update, frame),
        }
    }

    /// Stops the session at its next safe point when `token` fires. A led session is
    /// stopped at chunk boundaries only (its ranks meet inside every forward), so the
    /// token is not handed to it.
    pub fn set_cancel(&mut self, token: CancelToken) {
        match &mut self.how {
            Driven::Alone(s)
            | Driven::Stepped {
                session: Some(s), ..
            } => s.set_cancel(token),
            _ => {}
        }
    }

    /// Ends the session, releasing what it holds; for a led session, every rank's
    /// memory over it.
    pub fn finish(self, engine: &Engine) -> Result<Option<Vec<RankMemory>>> {
        match self.how {
            Driven::Alone(_) | Driven::Stepped { .. } => Ok(None),
            Driven::Led(s) => s.close(engine).map(Some),
        }
    }
}

/// The error of a stepped session asked for while the queue holds it.
fn released() -> EngineError {
    EngineError::request("session", "already released")
}
