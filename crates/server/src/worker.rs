//! A session's worker: one dedicated OS thread that opens the engine session, applies
//! interactions at chunk boundaries, generates and encodes every chunk, and hands the
//! fragments to the socket task through a bounded channel.
//!
//! The channel holds at most `chunks_ahead` chunks, so a slow client slows its own
//! generation instead of growing a buffer (back-pressure). Generation never runs on the
//! async runtime. Whatever way the session ends — last chunk, stop, a closed socket, an
//! error — the worker drops the engine session (its KV pages, decoder state and
//! conditioning) and then its session slot *before* it reports the end, so a client that
//! reads `session.done` finds the memory already given back.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use headroom_engine::{
    CancelToken, Chunk, Drive, Engine, EngineError, Pace, SessionDriver, SessionRequest,
    SessionSnapshot, StepQueue, ROUND_MARGIN,
};
use headroom_media::FragmentedMp4;
use headroom_tensor::comm::Communicator;
use headroom_tensor::Device;
use tokio::sync::mpsc;

use crate::admission::Slot;
use crate::config::Scheduler;
use crate::error::{Result, ServerError};
use crate::events::EventTracker;
use crate::image_ref::decode_image_url;
use crate::metrics::Metrics;
use crate::pacer::MediaTimePacer;
use crate::prompt::prompt_of;
use crate::protocol::{Interaction, StartRequest};
use crate::resume::{ParkReason, ResumeBook};

/// One encoded chunk on its way to the socket.
#[derive(Debug)]
pub struct EncodedChunk {
    /// Generation chunk index from 0.
    pub index: usize,
    /// Frames in the chunk.
    pub num_frames: usize,
    /// Fragmented MP4: init segment + first fragment for chunk 0, one `moof`+`mdat` after.
    pub bytes: Vec<u8>,
    /// Interactions applied at this chunk's start, each with the video frame of this
    /// chunk it begins at (its arrival since the previous chunk began, at the session's
    /// fps, clamped to the chunk).
    pub started_frames: Vec<(String, usize)>,
    /// Interactions still moving the camera after this chunk.
    pub active: Vec<String>,
    /// Interactions finished or replaced during this chunk.
    pub completed: Vec<String>,
    /// Generate + encode time.
    pub latency: Duration,
    /// How long after its playback deadline the chunk was ready (zero when on time):
    /// playback starts when the first chunk is ready and runs at the session's fps.
    pub behind_playback: Duration,
    /// The engine's phase timings (denoise, commit, decode) in seconds.
    pub phases: [f64; 3],
    /// Allocator `allocated_bytes.all.current` after the decode.
    pub allocated_bytes: i64,
    /// Allocator `reserved_bytes.all.current` after the decode.
    pub reserved_bytes: i64,
    /// Allocator `allocated_bytes` and `reserved_bytes` (`.all.current`) at the end of
    /// the denoise phase.
    pub denoise_end_bytes: [i64; 2],
    /// How long the chunk waited, ready, for its media time (zero when unpaced or late):
    /// the socket task holds it until `release_at` and sets this when it sends it.
    pub paced_wait: Duration,
    /// When the chunk was ready.
    pub ready_at: Instant,
    /// When it may leave (its play time less the lead; `ready_at` when unpaced).
    pub release_at: Instant,
}

/// How a worker ended.
#[derive(Debug)]
pub enum Ending {
    /// Every chunk was produced.
    Completed,
    /// Parked at a chunk boundary: the session's state left the device for the resume
    /// book (host memory, or the store on a drain).
    Parked {
        /// Why.
        reason: ParkReason,
        /// The chunk a resumed stream starts at.
        next_chunk: usize,
        /// Bytes of state parked.
        bytes: u64,
    },
    /// Cancelled (stop, shutdown, stall) or the socket went away.
    Cancelled,
    /// The session could not be opened (nothing was streamed).
    Refused(ServerError),
    /// Generation failed mid-session.
    Failed(ServerError),
}

/// What a worker tells its socket task.
#[derive(Debug)]
pub enum WorkerEvent {
    /// The session was admitted and will produce `chunks` chunks.
    Opened {
        /// Chunks to come; `None` until the client stops.
        chunks: Option<usize>,
    },
    /// A chunk is ready.
    Chunk(Box<EncodedChunk>),
    /// A queued interaction could not be applied at the chunk boundary.
    InteractionFailed {
        /// The interaction's id.
        event_id: String,
        /// Why.
        error: ServerError,
    },
    /// The session ended and released everything; the last event.
    Ended(Ending),
}

/// What a session asks its worker to do at the next chunk boundary (beside going on).
#[derive(Debug, Default)]
pub struct ParkRequest(AtomicU8);

impl ParkRequest {
    /// Asks the worker to park at its next boundary for `reason`.
    pub fn ask(&self, reason: ParkReason) {
        let code = match reason {
            ParkReason::Pause => 1,
            ParkReason::HangUp => 2,
            ParkReason::Drain => 3,
        };
        self.0.store(code, Ordering::SeqCst);
    }

    /// What was asked, if anything.
    pub fn asked(&self) -> Option<ParkReason> {
        match self.0.load(Ordering::SeqCst) {
            1 => Some(ParkReason::Pause),
            2 => Some(ParkReason::HangUp),
            3 => Some(ParkReason::Drain),
            _ => None,
        }
    }
}

/// A session that can be parked and resumed: where it parks and how it is known there.
#[derive(Debug, Clone)]
pub struct Parking {
    /// The book it parks in.
    pub book: Arc<ResumeBook>,
    /// Its token's digest (the book's key).
    pub id: String,
    /// Write a snapshot to the store every this many chunks (`serve --snapshot-every`).
    pub every: Option<usize>,
    /// The socket's requests.
    pub request: Arc<ParkRequest>,
}

/// The socket task's side of a worker.
#[derive(Debug)]
pub struct WorkerHandle {
    /// Events from the worker (bounded).
    pub events: mpsc::Receiver<WorkerEvent>,
    /// Interactions for the next chunk boundary (bounded).
    pub control: SyncSender<Interaction>,
    /// Ends the session at its next safe point (within one DMD step or decoded frame);
    /// dropping the handle cancels too, unless the session was asked to park.
    pub cancel: CancelToken,
    /// Parking requests, for a session that can park.
    pub park: Option<Arc<ParkRequest>>,
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        // Nobody reads this worker's events any more: stop it now rather than at its
        // next send, unless it is to park at its next boundary (a hang-up).
        if self.park.as_ref().is_none_or(|p| p.asked().is_none()) {
            self.cancel.cancel();
        }
    }
}

/// What a worker needs.
#[derive(Debug)]
pub struct Job {
    /// The engine.
    pub engine: Arc<Engine>,
    /// The mesh's world group when the engine is rank 0 of a mesh.
    pub world: Option<Arc<dyn Communicator>>,
    /// Where the session steps together with the others (batched steps).
    pub steps: Option<Arc<StepQueue>>,
    /// How the step queue times a paced session's chunks.
    pub scheduler: Scheduler,
    /// The checked request.
    pub request: StartRequest,
    /// When `session.start` arrived (time to first chunk counts from here).
    pub started_at: Instant,
    /// The held session slot.
    pub slot: Slot,
    /// The session's `request_id` (for logs).
    pub request_id: String,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Interactions acknowledged while the client waited: they apply from the first chunk.
    pub held: Vec<Interaction>,
    /// Most frames the session may stream (`--max-session-frames`).
    pub max_frames: Option<usize>,
    /// The snapshot the session resumes from (a claimed resume token).
    pub resume: Option<Arc<SessionSnapshot>>,
    /// Where the session parks, when it can.
    pub parking: Option<Parking>,
}

/// Spawns the worker thread of `job`.
pub fn spawn(
    mut job: Job,
    chunks_ahead: usize,
    pending_interactions: usize,
) -> Result<WorkerHandle> {
    let (event_tx, events) = mpsc::channel(chunks_ahead.max(1) + 2);
    let (control, control_rx) = std::sync::mpsc::sync_channel(pending_interactions.max(1));
    for interaction in std::mem::take(&mut job.held) {
        // The socket task held at most `pending_interactions`: they all fit.
        let _ = control.try_send(interaction);
    }
    let cancel = CancelToken::new();
    let flag = cancel.clone();
    let park = job.parking.as_ref().map(|p| Arc::clone(&p.request));
    std::thread::Builder::new()
        .name("headroom-session".to_string())
        .spawn(move || run(job, &event_tx, &control_rx, &flag))
        .map_err(|e| ServerError::Setup(format!("cannot start a session thread: {e}")))?;
    Ok(WorkerHandle {
        events,
        control,
        cancel,
        park,
    })
}

fn run(
    job: Job,
    events: &mpsc::Sender<WorkerEvent>,
    control: &Receiver<Interaction>,
    cancel: &CancelToken,
) {
    let Job {
        engine,
        world,
        steps,
        scheduler,
        request,
        started_at,
        mut slot,
        request_id,
        metrics,
        held: _,
        max_frames,
        resume,
        parking,
    } = job;
    let _span = tracing::info_span!("session", request_id = %request_id).entered();
    let opened = match resume {
        Some(snapshot) => resume_session(&engine, world.as_ref(), steps.as_ref(), snapshot),
        None => open(&engine, world.as_ref(), steps.as_ref(), &request),
    };
    // Pages and state are reserved (or not): the next client in line may be admitted.
    slot.opened();
    let ending = match opened {
        Err(error) => Ending::Refused(error),
        Ok(mut session) => {
            session.set_cancel(cancel.clone());
            let mesh = world.is_some();
            metrics.sessions_admitted.fetch_add(1, Ordering::Relaxed);
            let mut stream = Stream {
                session,
                tracker: EventTracker::default(),
                events,
                control,
                cancel,
                metrics: &metrics,
                started_at,
                max_frames,
                parking: parking.as_ref(),
                deadline: scheduler == Scheduler::Deadline,
            };
            let ending = stream.run(&request);
            // Release the session (KV pages, decoder state, conditioning) before the
            // socket hears about the end; on a mesh every rank releases and reports.
            let Stream { session, .. } = stream;
            match session.finish(&engine) {
                Ok(Some(ranks)) => {
                    *metrics
                        .rank_memory
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()) = ranks;
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "the mesh did not report its memory"),
            }
            if mesh && matches!(ending, Ending::Failed(_)) {
                // A chunk that failed on a mesh aborted it: nothing more can run.
                metrics.mesh_failed.store(true, Ordering::Relaxed);
            }
            ending
        }
    };
    drop(slot);
    if let (Some(p), false) = (&parking, matches!(ending, Ending::Parked { .. })) {
        // Ended for good: nothing to resume.
        p.book.forget(&p.id);
    }
    let counter = match &ending {
        Ending::Completed => Some(&metrics.sessions_completed),
        Ending::Parked { .. } => Some(&metrics.sessions_parked_total),
        Ending::Cancelled => Some(&metrics.sessions_stopped),
        // The socket task counts capacity refusals (it may queue the client again).
        Ending::Refused(_) => None,
        Ending::Failed(_) => Some(&metrics.sessions_failed),
    };
    if let Some(counter) = counter {
        counter.fetch_add(1, Ordering::Relaxed);
    }
    match &ending {
        Ending::Completed | Ending::Cancelled | Ending::Parked { .. } => {
            tracing::info!(?ending, "session released")
        }
        Ending::Refused(e) => tracing::info!(code = e.code(), error = %e, "session refused"),
        Ending::Failed(e) => tracing::warn!(error = %e, "session failed and was released"),
    }
    // The socket may be gone; then nobody needs to hear it.
    let _ = events.blocking_send(WorkerEvent::Ended(ending));
}

/// Builds the engine request (prompt, first frame, actions) and opens the session (on
/// every rank of the mesh, with `world`; stepped through `steps` when given).
fn open(
    engine: &Engine,
    world: Option<&Arc<dyn Communicator>>,
    steps: Option<&Arc<StepQueue>>,
    r: &StartRequest,
) -> Result<SessionDriver> {
    let device = Device::new(Arc::clone(engine.platform()));
    let image = r
        .image_url
        .as_deref()
        .map(|url| decode_image_url(url, r.width, r.height, &device))
        .transpose()?;
    let request = SessionRequest {
        seed: r.seed,
        steps: r.num_inference_steps,
        flow_shift: r.flow_shift,
        prompt: prompt_of(r.prompt.as_deref()),
        image,
        actions: r.actions.clone(),
        overlap: r.overlap,
        camera_guidance: r.camera_guidance,
        decoder: r.decoder,
        ..SessionRequest::new(r.width, r.height, r.num_frames)
    };
    let how = match (world, steps) {
        (Some(world), _) => Drive::Led(world),
        (None, Some(queue)) => Drive::Stepped(queue),
        (None, None) => Drive::Alone,
    };
    SessionDriver::open(engine, request, how).map_err(ServerError::from_open)
}

/// Resumes a claimed snapshot (on this engine, alone or stepped).
fn resume_session(
    engine: &Engine,
    world: Option<&Arc<dyn Communicator>>,
    steps: Option<&Arc<StepQueue>>,
    snapshot: Arc<SessionSnapshot>,
) -> Result<SessionDriver> {
    let how = match (world, steps) {
        (Some(world), _) => Drive::Led(world),
        (None, Some(queue)) => Drive::Stepped(queue),
        (None, None) => Drive::Alone,
    };
    SessionDriver::resume_snapshot(engine, snapshot, how).map_err(|e| match e.snapshot_fault() {
        Some(_) => ServerError::ResumeRefused(e.to_string()),
        None => ServerError::from_open(e),
    })
}

/// A running session and its plumbing.
struct Stream<'a> {
    session: SessionDriver,
    tracker: EventTracker,
    events: &'a mpsc::Sender<WorkerEvent>,
    control: &'a Receiver<Interaction>,
    cancel: &'a CancelToken,
    metrics: &'a Metrics,
    started_at: Instant,
    max_frames: Option<usize>,
    parking: Option<&'a Parking>,
    /// Whether a stepped session's paced chunks are timed by the queue's rounds.
    deadline: bool,
}

impl Stream<'_> {
    /// Parks the session at this boundary if it was asked to; `None` when not asked.
    fn park_if_asked(&mut self) -> Option<Ending> {
        let parking = self.parking?;
        let reason = parking.request.asked()?;
        Some(self.park(parking, reason))
    }

    /// Snapshots the session into the book for `reason` (its device state is released
    /// when the worker drops it right after).
    fn park(&mut self, parking: &Parking, reason: ParkReason) -> Ending {
        self.session.give_up_turn();
        let parked = self
            .session
            .snapshot()
            .map_err(|e| ServerError::Generation(format!("parking: {e}")))
            .and_then(|snap| {
                let next_chunk = snap.progress.chunks_done;
                let bytes = parking.book.park(&parking.id, Arc::new(snap), reason)?;
                Ok(Ending::Parked {
                    reason,
                    next_chunk,
                    bytes,
                })
            });
        parked.unwrap_or_else(Ending::Failed)
    }

    /// Waits, off the device, until `at` (when a paced chunk on its own clock should
    /// start); `false` when the session was stopped meanwhile. A request to park ends
    /// the wait early: the session parks at this boundary.
    fn wait_until(&self, at: Instant) -> bool {
        loop {
            if self.cancel.is_cancelled() {
                return false;
            }
            let now = Instant::now();
            if now >= at || self.parking.is_some_and(|p| p.request.asked().is_some()) {
                return true;
            }
            std::thread::sleep((at - now).min(Duration::from_millis(10)));
        }
    }

    /// Writes the periodic snapshot after chunk `index` when one is due.
    fn checkpoint(&self, index: usize) {
        let Some(p) = self.parking else { return };
        let Some(every) = p.every else { return };
        if !(index + 1).is_multiple_of(every) {
            return;
        }
        let written = self
            .session
            .snapshot()
            .map_err(|e| ServerError::Generation(e.to_string()))
            .and_then(|snap| p.book.checkpoint(&p.id, &snap));
        if let Err(e) = written {
            tracing::warn!(error = %e, chunk = index, "the periodic snapshot failed; the session goes on");
        }
    }
    fn run(&mut self, request: &StartRequest) -> Ending {
        let total = self.session.chunks_total();
        if self
            .events
            .blocking_send(WorkerEvent::Opened { chunks: total })
            .is_err()
        {
            return Ending::Cancelled;
        }
        let _realtime = request
            .pacing
            .enabled
            .then(|| Gauge::up(&self.metrics.realtime_sessions));
        let mut mp4 = match FragmentedMp4::new(request.width, request.height, request.fps) {
            Ok(m) => m,
            Err(e) => return Ending::Failed(ServerError::Generation(format!("encoder: {e}"))),
        };
        // The playback clock: when the first chunk was ready, and the frames before
        // the coming chunk.
        let mut pacer = MediaTimePacer::new(request.pacing, request.fps);
        let mut playback: Option<Instant> = None;
        let mut played_frames = 0usize;
        let playing_at = |start: Instant, frames: usize| {
            start + Duration::from_secs_f64(frames as f64 / f64::from(request.fps))
        };
        let first = self
            .session
            .session()
            .map_or(0, headroom_engine::Session::chunks_done);
        // The previous chunk boundary: when the last chunk began (the session's start
        // before the first). An interaction starts at the frame of the coming chunk its
        // arrival since then gives.
        let mut boundary = Instant::now();
        // How long chunks take to make (a moving average): a paced session on its own
        // clock starts a chunk that long (and the step queue's margin) before it is due.
        let mut making: Option<f64> = None;
        // Frames a resumed session made before this stream (for --max-session-frames).
        let before = if first > 0 {
            headroom_engine::blocks::frames_for_blocks(first)
        } else {
            0
        };
        for index in first.. {
            if let Some(parked) = self.park_if_asked() {
                return parked;
            }
            if total.is_some_and(|t| index >= t) {
                break;
            }
            // The first chunk has 9 frames, every later one 12.
            let next = if index == 0 { 9 } else { 12 };
            if self
                .max_frames
                .is_some_and(|m| before + played_frames + next > m)
            {
                break;
            }
            if self.cancel.is_cancelled() {
                return Ending::Cancelled;
            }
            // Due when its first frame should play; the first chunk is due at once.
            let due = playback.map_or(self.started_at, |start| playing_at(start, played_frames));
            // When it should leave: a paced chunk at its play time less the lead.
            let release = pacer.next_due();
            let (cancel, parking) = (self.cancel, self.parking);
            let give_up =
                || cancel.is_cancelled() || parking.is_some_and(|p| p.request.asked().is_some());
            let turned = match release {
                // The step queue calls the session up when its round should start.
                Some(at) if self.deadline && self.session.stepped() => {
                    self.session.await_turn(at, Pace::Deadline, &give_up)
                }
                // On its own clock: start the chunk its making time before it is due.
                Some(at) => {
                    let make = Duration::from_secs_f64(making.unwrap_or(0.0)) + ROUND_MARGIN;
                    if !self.wait_until(at.checked_sub(make).unwrap_or(at)) {
                        return Ending::Cancelled;
                    }
                    self.session.await_turn(due, Pace::Asap, &give_up)
                }
                None => self.session.await_turn(due, Pace::Asap, &give_up),
            };
            if let Some(parked) = self.park_if_asked() {
                return parked;
            }
            if !turned {
                return Ending::Cancelled;
            }
            let started_frames = match self.apply_interactions(boundary, request.fps, next) {
                Ok(started) => started,
                Err(ending) => return ending,
            };
            boundary = Instant::now();
            let t = Instant::now();
            let chunk = match self.session.next_chunk_due(due) {
                Ok(chunk) => chunk,
                // Stopped inside the chunk: the session has already let go of its pages.
                Err(EngineError::Cancelled { .. }) => return Ending::Cancelled,
                Err(e) => return Ending::Failed(ServerError::Generation(e.to_string())),
            };
            let encoded = match encode(&mut mp4, &chunk) {
                Ok(bytes) => bytes,
                Err(e) => return Ending::Failed(e),
            };
            let latency = t.elapsed();
            tracing::debug!(
                chunk = chunk.index,
                latency_ms = latency.as_secs_f64() * 1e3,
                bytes = encoded.len(),
                "chunk ready"
            );
            self.metrics.chunk_latency.observe(latency);
            if chunk.index == 0 {
                self.metrics
                    .time_to_first_chunk
                    .observe(self.started_at.elapsed());
            }
            let ready = Instant::now();
            let start = *playback.get_or_insert(ready);
            let deadline = playing_at(start, played_frames);
            let behind_playback = ready.saturating_duration_since(deadline);
            if !behind_playback.is_zero() {
                self.metrics
                    .chunks_behind_playback
                    .fetch_add(1, Ordering::Relaxed);
            }
            if ready > release.unwrap_or(deadline) {
                self.metrics.deadline_misses.fetch_add(1, Ordering::Relaxed);
            }
            played_frames += chunk.frames.shape().first().copied().unwrap_or(0);
            let (active, completed) = self.tracker.after_chunk();
            let mut out = EncodedChunk {
                index: chunk.index,
                num_frames: chunk.frames.shape().first().copied().unwrap_or(0),
                bytes: encoded,
                started_frames,
                active,
                completed,
                latency,
                behind_playback,
                phases: [
                    chunk.timings.denoise.as_secs_f64(),
                    chunk.timings.commit.as_secs_f64(),
                    chunk.timings.decode.as_secs_f64(),
                ],
                allocated_bytes: chunk.stats_decoded.allocated_bytes.all().current,
                reserved_bytes: chunk.stats_decoded.reserved_bytes.all().current,
                denoise_end_bytes: [
                    chunk.stats_denoise_end.allocated_bytes.all().current,
                    chunk.stats_denoise_end.reserved_bytes.all().current,
                ],
                paced_wait: Duration::ZERO,
                ready_at: ready,
                release_at: ready,
            };
            drop(chunk);
            // A stop that came in during the chunk: the chunk is not sent.
            if self.cancel.is_cancelled() {
                return Ending::Cancelled;
            }
            // A moving average: one slow chunk does not move the next start much.
            let took = boundary.elapsed().as_secs_f64();
            making = Some(making.map_or(took, |m| 0.7 * m + 0.3 * took));
            // The socket task holds a paced chunk until its release: the worker is free
            // to ask for its next turn meanwhile, so that sessions whose deadlines are
            // near can share a round.
            out.release_at = pacer.schedule(ready, out.num_frames);
            self.checkpoint(out.index);
            if self
                .events
                .blocking_send(WorkerEvent::Chunk(Box::new(out)))
                .is_err()
            {
                // The socket is gone: park if it asked (a hang-up), else end.
                return self.park_if_asked().unwrap_or(Ending::Cancelled);
            }
        }
        Ending::Completed
    }

    /// Applies every interaction queued since the last boundary; returns the ids that
    /// start with the coming chunk and the frame each starts at. Camera updates apply
    /// in arrival order; of the prompt updates only the last applies (it is encoded
    /// here and blends over its transition), and the ones it replaced complete at this
    /// boundary. A failure is reported for that event only.
    fn apply_interactions(
        &mut self,
        boundary: Instant,
        fps: u32,
        chunk_frames: usize,
    ) -> std::result::Result<Vec<(String, usize)>, Ending> {
        // Empty or disconnected: nothing more is queued for this boundary.
        let queued: Vec<Interaction> =
            std::iter::from_fn(|| self.control.try_recv().ok()).collect();
        let last_prompt = queued.iter().rposition(|i| i.prompt.is_some());
        let mut started = Vec::new();
        for (k, interaction) in queued.into_iter().enumerate() {
            // floor((received − previous boundary) · fps), clamped to the chunk.
            let since = interaction.received_at.saturating_duration_since(boundary);
            let frame = ((since.as_secs_f64() * f64::from(fps)).floor() as usize)
                .min(chunk_frames.saturating_sub(1));
            let prompt = match prompt_of(interaction.prompt.as_deref()) {
                Some(_) if Some(k) != last_prompt => {
                    // Replaced before its boundary by a later prompt update.
                    if interaction.camera.is_none() {
                        self.tracker.replaced(&interaction.event_id);
                        continue;
                    }
                    None
                }
                prompt => prompt,
            };
            // The prompt first: its encoding is what can fail.
            let applied = match &prompt {
                Some(prompt) => self
                    .session
                    .set_prompt_over(prompt, interaction.prompt_transition)
                    .map_err(|e| ServerError::request("interaction.event.prompt", e.to_string())),
                None => Ok(()),
            }
            .and_then(|()| match interaction.camera {
                Some(update) => self
                    .session
                    .interact_at(update, frame)
                    .map_err(|e| ServerError::request("interaction", e.to_string())),
                None => Ok(()),
            });
            match applied {
                Ok(()) => {
                    if let Some(update) = interaction.camera {
                        self.tracker.camera(
                            &interaction.event_id,
                            update.mode,
                            update.transition_chunks,
                            frame,
                            chunk_frames,
                        );
                    }
                    if prompt.is_some() {
                        self.tracker
                            .prompt(&interaction.event_id, interaction.prompt_transition);
                    }
                    started.push((interaction.event_id, frame));
                }
                Err(error) => {
                    let failed = WorkerEvent::InteractionFailed {
                        event_id: interaction.event_id,
                        error,
                    };
                    if self.events.blocking_send(failed).is_err() {
                        return Err(Ending::Cancelled);
                    }
                }
            }
        }
        Ok(started)
    }
}

/// Encodes a chunk's `[T, H, W, 3]` frames into one fragment.
fn encode(mp4: &mut FragmentedMp4, chunk: &Chunk) -> Result<Vec<u8>> {
    let fail = |e: String| ServerError::Generation(format!("encoding chunk {}: {e}", chunk.index));
    let [_, h, w, 3] = *chunk.frames.shape() else {
        return Err(fail(format!(
            "frames must be [T, H, W, 3], got {:?}",
            chunk.frames.shape()
        )));
    };
    let pixels = chunk
        .frames
        .to_vec::<u8>()
        .map_err(|e| fail(e.to_string()))?;
    let frames: Vec<&[u8]> = pixels.chunks_exact(h * w * 3).collect();
    mp4.fragment(&frames).map_err(|e| fail(e.to_string()))
}

/// One count on a gauge, taken back on drop.
struct Gauge<'a>(&'a AtomicU64);

impl<'a> Gauge<'a> {
    fn up(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Self(gauge)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
