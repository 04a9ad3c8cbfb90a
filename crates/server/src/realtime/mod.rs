//! `WS /v1/realtime/video`: one socket, one session.
//!
//! The socket task is a small state machine on the async runtime; it never generates.
//! It waits for `session.start` (start timeout), checks it, takes a session slot — or
//! waits for one in the admission queue, telling the client `session.queued` with how
//! many are ahead, answering pings, holding interactions, leaving the queue on a hang-up
//! or `session.stop` — and starts the session's worker thread, then serves three
//! sources at once: the worker's
//! events (admission, chunks, the end), the client's messages (interactions, pings, stop)
//! and the clocks (stall timeout, server shutdown). Each chunk goes out as a
//! `video.chunk_metadata` text message immediately followed by its one binary message;
//! only this task writes to the socket, so nothing can come between the two.
//!
//! Ending: `session.stop`, shutdown and the stall timeout cancel the worker's token (its
//! chunk stops at the next DMD step or decoded frame) and keep reading until the worker
//! reports its end (it releases everything first); a closed socket cancels the token too.
//! The stall clock starts at admission: time in the queue never counts against it.

mod parking;
mod queued;

use headroom_model::DecoderKind;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::mpsc::TrySendError;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use serde_json::Value;
use tokio::time::{sleep_until, timeout, timeout_at, Instant as TokioInstant};

use crate::door::{DoorRefusal, CLOSE_TRY_AGAIN_LATER};
use crate::error::ServerError;
use crate::protocol::{ClientMessage, Interaction, StartRequest};
use crate::resume::ParkReason;
use crate::sockets::SocketPass;
use crate::state::AppState;
use crate::wire;
use crate::worker::{self, Ending, Job, WorkerEvent, WorkerHandle};
use parking::hang_up;

/// How long a closing connection waits for the client's close reply.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The close code a draining server ends a refused socket with (RFC 6455 "going away"):
/// the client should connect again, and a load balancer sends it elsewhere.
pub const CLOSE_GOING_AWAY: u16 = 1001;

/// Serves one WebSocket connection to its end.
pub async fn handle_socket(socket: WebSocket, state: Arc<AppState>, key: Option<String>) {
    let _guard = state.socket_guard();
    let pass = state.room.enter();
    let mut conn = Connection {
        socket,
        open: true,
        state,
        request_id: None,
        event_ids: HashSet::new(),
        fresh_ids: 0,
        held: Vec::new(),
        scripted: false,
        close_with: (1000, ""),
        key,
        resume_token: None,
        session_opened: false,
        received: std::collections::HashMap::new(),
        fps: 16,
    };
    match pass {
        None => {
            // Every socket is past its start: this one cannot come in now.
            conn.state.metrics.door_refused(DoorRefusal::Connections);
            conn.close_with = (
                CLOSE_TRY_AGAIN_LATER,
                "the server holds its --max-connections sockets, all in sessions; try again later",
            );
        }
        Some(pass) => {
            if let Some((start, started_at)) = conn.await_start(&pass).await {
                pass.started();
                conn.run_session(start, started_at).await;
            }
        }
    }
    conn.close().await;
}

struct Connection {
    socket: WebSocket,
    /// False once the client closed or a send failed.
    open: bool,
    state: Arc<AppState>,
    request_id: Option<String>,
    /// `event_id`s this session used (kept to detect conflicts).
    event_ids: HashSet<String>,
    /// Ids given to interactions that came without one.
    fresh_ids: u64,
    /// Interactions acknowledged while queued, handed to the worker once it starts.
    held: Vec<Interaction>,
    /// The session follows its `camera_action_script`: camera updates are refused.
    scripted: bool,
    /// The close frame's code and reason.
    close_with: (u16, &'static str),
    /// Digest of the API key the socket offered (sessions' resume tokens are bound to it).
    key: Option<String>,
    /// The token this socket claimed, until its session opens.
    resume_token: Option<String>,
    /// The session of the current run opened (its worker said so).
    session_opened: bool,
    /// When each interaction of the session arrived (for its action latency).
    received: std::collections::HashMap<String, Instant>,
    /// The session's frames per second.
    fps: u32,
}

/// What `video.start` says of a session that can be resumed.
struct Resumable {
    /// Its resume token.
    token: Option<String>,
    /// The chunk a resumed session starts at.
    resumed_from: Option<usize>,
}

/// The refusal of a `kind` message (`session.start` or `control`) over its limit.
fn too_large(text: &str, limits: &crate::Limits, kind: &'static str) -> Option<ServerError> {
    let limit = match kind {
        "session.start" => limits.start_message_bytes,
        _ => limits.control_message_bytes,
    };
    (text.len() > limit).then_some(ServerError::MessageTooLarge {
        kind,
        bytes: text.len(),
        limit,
    })
}

/// How a worker's run ended for the socket task.
enum Outcome {
    /// The client heard the end (done or an error).
    Ended,
    /// The session could not reserve its pages or state while others held theirs:
    /// back to the head of the queue.
    Requeue,
    /// The session parked on `session.pause`; the socket waits for `session.resume`.
    Paused,
}

/// What a message from a queued client asks for.
enum QueuedInput {
    /// Go on waiting.
    Wait,
    /// The client stopped or hung up: leave the queue.
    Leave,
}

/// What the session loop is doing.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Streaming.
    Running,
    /// Cancelled (stop, shutdown, stall); waiting for the worker's end.
    Ending,
}

impl Connection {
    async fn send_json(&mut self, value: &Value) -> bool {
        self.send(Message::Text(value.to_string().into())).await
    }

    /// Sends one message; a client that does not read for a whole stall timeout is
    /// treated as gone.
    async fn send(&mut self, message: Message) -> bool {
        if !self.open {
            return false;
        }
        let limit = self.state.config.limits.stall_timeout;
        match timeout(limit, self.socket.send(message)).await {
            Ok(Ok(())) => true,
            _ => {
                self.open = false;
                false
            }
        }
    }

    async fn send_error(&mut self, error: &ServerError, event_id: Option<&str>) {
        self.state
            .metrics
            .errors_sent
            .fetch_add(1, Ordering::Relaxed);
        let request_id = self.request_id.clone();
        let mut message = wire::error(error, request_id.as_deref(), event_id);
        // A client never sees where the server keeps its model: the folder's path
        // becomes the model's name.
        let folder = &self.state.engine.config().model;
        if let Some(text) = message["message"].as_str() {
            if std::path::Path::new(folder).is_dir() && text.contains(folder.as_str()) {
                let name = format!("<model {}>", self.state.config.model_name);
                message["message"] = Value::String(text.replace(folder.as_str(), &name));
            }
        }
        self.send_json(&message).await;
    }

    /// Ends the connection with the closing handshake (RFC 6455 §7.1): sends a close
    /// frame, then reads (and drops) what the client still sends until its close reply,
    /// its hang-up or [`CLOSE_GRACE`]. Dropping the socket at once would let a message
    /// already on its way (a ping sent as the session ended) reach a closed socket, and the
    /// kernel's reset would discard the last messages before the client read them.
    async fn close(mut self) {
        if !self.open {
            return;
        }
        let (code, reason) = self.close_with;
        let frame = CloseFrame {
            code,
            reason: reason.into(),
        };
        if !self.send(Message::Close(Some(frame))).await || code == CLOSE_TRY_AGAIN_LATER {
            // A socket turned away for room goes at once: it has nothing on its way, and
            // lingering would hold the room it was closed to free.
            return;
        }
        let until = TokioInstant::now() + CLOSE_GRACE;
        while let Ok(Some(Ok(message))) = timeout_at(until, self.socket.recv()).await {
            if let Message::Close(_) = message {
                break;
            }
        }
    }

    /// Reads until a valid `session.start` (answering pings); anything else before it is
    /// an error that ends the connection, as in vLLM-Omni.
    async fn await_start(
        &mut self,
        pass: &SocketPass,
    ) -> Option<(serde_json::Map<String, Value>, Instant)> {
        let limits = self.state.config.limits.clone();
        let deadline = TokioInstant::now() + limits.start_timeout;
        let mut shutdown = self.state.shutdown_signal();
        loop {
            if *shutdown.borrow() {
                self.send_error(&ServerError::ShuttingDown, None).await;
                return None;
            }
            let message = tokio::select! {
                m = self.socket.recv() => m,
                _ = sleep_until(deadline) => {
                    let secs = limits.start_timeout.as_secs_f64();
                    self.send_error(&ServerError::StartTimeout(secs), None).await;
                    return None;
                }
                _ = shutdown.changed() => continue,
                _ = pass.evicted() => {
                    // A newer socket needs the room this one holds without a start.
                    self.state.metrics.door_refused(DoorRefusal::IdleEvicted);
                    self.close_with = (
                        CLOSE_TRY_AGAIN_LATER,
                        "closed to make room: the server holds its --max-connections sockets and this one sent no session.start",
                    );
                    return None;
                }
            };
            let text = match message {
                Some(Ok(Message::Text(text))) => text,
                Some(Ok(Message::Binary(_))) => {
                    let e = ServerError::InvalidJson(
                        "binary messages are not accepted; send session.start as JSON text"
                            .to_string(),
                    );
                    self.send_error(&e, None).await;
                    return None;
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                    self.open = false;
                    return None;
                }
            };
            if let Some(e) = too_large(&text, &limits, "session.start") {
                self.send_error(&e, None).await;
                return None;
            }
            let at = Instant::now();
            match ClientMessage::parse(text.as_str()) {
                Ok(ClientMessage::Start(map)) => return Some((map, at)),
                Ok(ClientMessage::Ping) => {
                    self.send_json(&wire::pong()).await;
                }
                Ok(_) => {
                    let e = ServerError::InvalidState(
                        "the first message must be session.start".to_string(),
                    );
                    self.send_error(&e, None).await;
                    return None;
                }
                Err(e) => {
                    self.send_error(&e, None).await;
                    return None;
                }
            }
        }
    }

    /// Checks the start (claiming the session of its `resume_token`, if it has one),
    /// waits for admission, runs the worker and streams until it ends; a paused session
    /// waits here for `session.resume` and goes round again.
    async fn run_session(&mut self, start: serde_json::Map<String, Value>, started_at: Instant) {
        let state = Arc::clone(&self.state);
        let (start, mut resume) = match crate::protocol::resume_token(&start) {
            Err(e) => return self.send_error(&e, None).await,
            Ok(None) => (start, None),
            Ok(Some(token)) => match self.claim(&token).await {
                Some(claimed) => (claimed.start, Some(claimed.snapshot)),
                None => return,
            },
        };
        let request = match StartRequest::parse(&start, &state.config.defaults) {
            Ok(r) => r,
            Err(e) => return self.put_back(&start, resume, e).await,
        };
        self.scripted = !request.actions.is_empty();
        self.fps = request.fps;
        if let Some(model) = &request.model {
            if *model != state.config.model_name {
                let e = ServerError::request(
                    "model",
                    format!(
                        "this server runs {:?}, not {model:?}",
                        state.config.model_name
                    ),
                );
                return self.put_back(&start, resume, e).await;
            }
        }
        if let Some(max) = state.config.limits.max_session_frames {
            if request.num_frames > max {
                let e = ServerError::request(
                    "num_frames",
                    format!(
                        "at most {max} frames per session on this server (--max-session-frames), got {}",
                        request.num_frames
                    ),
                );
                return self.send_error(&e, None).await;
            }
        }
        if state.is_shutting_down() {
            return self
                .put_back(&start, resume, ServerError::ShuttingDown)
                .await;
        }
        if state.is_draining() {
            self.close_with = (CLOSE_GOING_AWAY, "the server is draining");
            self.put_back_quietly(&start, resume);
            return self.refuse(ServerError::Draining).await;
        }
        let request_id = state.new_request_id();
        self.request_id = Some(request_id.clone());
        if request.decoder == Some(DecoderKind::Tiny) && state.engine.tiny_decoder().is_none() {
            let e = ServerError::request(
                "extra_params.decoder",
                "\"tiny\" needs a tiny decoder, and this server has none loaded (start it with --tiny-decoder FILE or --decoder tiny)",
            );
            return self.send_error(&e, None).await;
        }
        let config = request.config(&state.config.model_name, state.engine.config().decoder);
        let deadline = TokioInstant::from_std(started_at) + state.config.queue_timeout;
        let mut requeued = false;
        let mut waited = std::time::Duration::ZERO;
        let pages = state.engine.kv_pages_for(request.width, request.height);
        loop {
            self.session_opened = false;
            let Some(slot) = self.admit(requeued, deadline, &request_id, pages).await else {
                self.put_back_quietly(&start, resume);
                return;
            };
            if !requeued {
                waited = started_at.elapsed();
                state.metrics.queue_wait.observe(waited);
            }
            // A session that can park gets a resume token (a server alone: a mesh's
            // sessions resume from shard files only).
            let token = match state.world.is_none().then(crate::resume::new_token) {
                Some(Ok(t)) => Some(t),
                Some(Err(e)) => return self.send_error(&e, None).await,
                None => None,
            };
            let parking = token.as_ref().map(|t| {
                state.resume.running(t, self.key.clone(), start.clone());
                worker::Parking {
                    book: Arc::clone(&state.resume),
                    id: crate::resume::digest(t.as_bytes()),
                    every: state.config.snapshot_every,
                    request: Arc::new(worker::ParkRequest::default()),
                }
            });
            let resumed_from = resume.as_ref().map(|s| s.progress.chunks_done);
            let job = Job {
                engine: Arc::clone(&state.engine),
                world: state.world.clone(),
                steps: state.steps.clone(),
                scheduler: state.config.scheduler,
                request: request.clone(),
                started_at,
                slot,
                request_id: request_id.clone(),
                metrics: Arc::clone(&state.metrics),
                held: std::mem::take(&mut self.held),
                max_frames: state.config.limits.max_session_frames,
                resume: resume.clone(),
                parking,
            };
            let limits = &state.config.limits;
            let worker =
                match worker::spawn(job, state.config.chunks_ahead, limits.pending_interactions) {
                    Ok(w) => w,
                    Err(e) => return self.put_back(&start, resume, e).await,
                };
            let wait_ms = waited.as_secs_f64() * 1e3;
            let video_start = Resumable {
                token: token.clone(),
                resumed_from,
            };
            let outcome = self
                .stream(worker, &request_id, config.clone(), wait_ms, &video_start)
                .await;
            if resume.is_some() && !self.session_opened {
                // The resumed session never opened: its state goes back to the book.
                if let Some(t) = &token {
                    state.resume.forget(&crate::resume::digest(t.as_bytes()));
                }
                if !matches!(outcome, Outcome::Requeue) {
                    self.put_back_quietly(&start, resume.take());
                }
            } else if resume.is_some() {
                state
                    .metrics
                    .sessions_resumed
                    .fetch_add(1, Ordering::Relaxed);
                resume = None;
            }
            match outcome {
                Outcome::Ended => return,
                Outcome::Requeue => requeued = true,
                Outcome::Paused => {
                    let Some(token) = token else { return };
                    let Some(claimed) = self.await_resume(&token, &request_id).await else {
                        return;
                    };
                    resume = Some(claimed.snapshot);
                    requeued = false;
                }
            }
        }
    }

    /// Refuses the session with `error`, counting it by its refusal.
    async fn refuse(&mut self, error: ServerError) {
        if let Some(reason) = error.refusal() {
            self.state.metrics.refused(reason);
        }
        self.send_error(&error, None).await;
    }

    fn parse_interaction(
        &mut self,
        map: &serde_json::Map<String, Value>,
        request_id: &str,
    ) -> crate::error::Result<Interaction> {
        let limits = &self.state.config.limits;
        let fresh_ids = &mut self.fresh_ids;
        Interaction::parse(map, limits, || {
            *fresh_ids += 1;
            format!("{request_id}-event-{fresh_ids}")
        })
    }

    /// The session loop: worker events, client messages, stall and shutdown.
    async fn stream(
        &mut self,
        mut worker: WorkerHandle,
        request_id: &str,
        config: Value,
        queue_wait_ms: f64,
        resumable: &Resumable,
    ) -> Outcome {
        let state = Arc::clone(&self.state);
        // A session that can park: a hang-up parks it, `session.pause` too, and a drain
        // into a store.
        let park = worker.park.clone();
        let mut drain = state.drain_signal();
        let mut drain_seen = state.config.session_store.is_none() || park.is_none();
        // Counted until its end is sent: a drain waits for it.
        let _streaming = state.streaming();
        let limits = state.config.limits.clone();
        let mut shutdown = state.shutdown_signal();
        let mut shutdown_seen = false;
        let mut phase = Phase::Running;
        let mut stopped = false;
        let mut opened = false;
        let mut chunks_sent: u64 = 0;
        let mut last_progress = TokioInstant::now();
        let cancel = |worker: &WorkerHandle| worker.cancel.cancel();
        // A shutdown that began before this subscription is not a change: look once.
        if *shutdown.borrow_and_update() {
            shutdown_seen = true;
            stopped = true;
            phase = Phase::Ending;
            cancel(&worker);
        }
        // A paced chunk ready before its release waits here, off the worker.
        let mut held: Option<Box<crate::worker::EncodedChunk>> = None;
        loop {
            let stall_at = last_progress + limits.stall_timeout;
            let release = held
                .as_ref()
                .map_or(stall_at, |c| TokioInstant::from_std(c.release_at));
            tokio::select! {
                _ = sleep_until(release), if held.is_some() => {
                    if let Some(chunk) = held.take() {
                        if phase != Phase::Ending && self.send_chunk(request_id, &mut chunks_sent, chunk).await {
                            last_progress = TokioInstant::now();
                        }
                    }
                }
                changed = shutdown.changed(), if !shutdown_seen => {
                    shutdown_seen = true;
                    if changed.is_ok() && *shutdown.borrow() {
                        stopped = true;
                        phase = Phase::Ending;
                        cancel(&worker);
                        // A session still opening (a large KV pool can take seconds to
                        // fault in) is answered now, not when its open ends: the worker
                        // sees the cancel and releases what it took. On a mesh every
                        // rank must leave the open together, so there it is waited for.
                        if !opened && state.world.is_none() {
                            self.send_json(&wire::session_done(request_id, 0, true)).await;
                            return Outcome::Ended;
                        }
                    }
                }
                event = worker.events.recv(), if held.is_none() => {
                    let Some(event) = event else {
                        let e = ServerError::Generation(
                            "the session's worker thread ended unexpectedly".to_string(),
                        );
                        self.send_error(&e, None).await;
                        return Outcome::Ended;
                    };
                    match event {
                        WorkerEvent::Opened { .. } => {
                            opened = true;
                            self.session_opened = true;
                            self.resume_token = None;
                            last_progress = TokioInstant::now();
                            let start = wire::with_resume(
                                wire::video_start(request_id, config.clone(), queue_wait_ms),
                                resumable.token.as_deref(),
                                resumable.resumed_from,
                            );
                            self.send_json(&start).await;
                            if !drain_seen && *drain.borrow_and_update() {
                                drain_seen = true;
                                if let Some(p) = &park {
                                    p.ask(ParkReason::Drain);
                                }
                            }
                        }
                        WorkerEvent::Chunk(chunk) => {
                            if phase == Phase::Ending {
                                continue;
                            }
                            if chunk.release_at > std::time::Instant::now() {
                                held = Some(chunk);
                                continue;
                            }
                            if self.send_chunk(request_id, &mut chunks_sent, chunk).await {
                                last_progress = TokioInstant::now();
                            }
                        }
                        WorkerEvent::InteractionFailed { event_id, error } => {
                            self.event_ids.remove(&event_id);
                            self.send_error(&error, Some(&event_id)).await;
                        }
                        WorkerEvent::Ended(ending) => {
                            match ending {
                                Ending::Parked { reason, next_chunk, bytes } => {
                                    let token = resumable.token.as_deref().unwrap_or_default();
                                    match reason {
                                        ParkReason::Pause => {
                                            self.send_json(&wire::session_paused(request_id, token, next_chunk, bytes)).await;
                                            return Outcome::Paused;
                                        }
                                        ParkReason::Drain => {
                                            self.send_json(&wire::session_moved(request_id, token, next_chunk)).await;
                                            self.close_with = (CLOSE_GOING_AWAY, "the server is draining; the session moved to the store");
                                        }
                                        ParkReason::HangUp => {}
                                    }
                                }
                                Ending::Completed => {
                                    self.send_json(&wire::session_done(request_id, chunks_sent, stopped)).await;
                                }
                                Ending::Cancelled => {
                                    self.send_json(&wire::session_done(request_id, chunks_sent, true)).await;
                                }
                                Ending::Refused(e @ ServerError::Capacity { .. }) => {
                                    // Others hold pages or memory that end with them: wait
                                    // for them at the head of the queue.
                                    if !opened
                                        && phase == Phase::Running
                                        && state.admission.open() > 0
                                        && !state.is_shutting_down()
                                    {
                                        return Outcome::Requeue;
                                    }
                                    self.refuse(e).await;
                                }
                                Ending::Refused(e) | Ending::Failed(e) => {
                                    self.send_error(&e, None).await;
                                }
                            }
                            return Outcome::Ended;
                        }
                    }
                    if !self.open {
                        // The client is gone: a session that can park parks at its next
                        // boundary; else dropping the handle ends the worker.
                        hang_up(&worker, park.as_deref(), opened && phase == Phase::Running);
                        return Outcome::Ended;
                    }
                }
                changed = drain.changed(), if !drain_seen && opened => {
                    drain_seen = true;
                    if changed.is_ok() && *drain.borrow() && phase == Phase::Running {
                        if let Some(p) = &park {
                            p.ask(ParkReason::Drain);
                        }
                    }
                }
                message = self.socket.recv(), if self.open => {
                    match message {
                        Some(Ok(Message::Text(text))) => {
                            if let Some(e) = too_large(&text, &limits, "control") {
                                self.send_error(&e, None).await;
                                continue;
                            }
                            match ClientMessage::parse(text.as_str()) {
                                Err(e) => self.send_error(&e, None).await,
                                Ok(ClientMessage::Ping) => {
                                    last_progress = TokioInstant::now();
                                    self.send_json(&wire::pong()).await;
                                }
                                Ok(ClientMessage::Stop) => {
                                    stopped = true;
                                    phase = Phase::Ending;
                                    cancel(&worker);
                                }
                                Ok(ClientMessage::Pause) => match &park {
                                    Some(p) if opened && phase == Phase::Running => {
                                        p.ask(ParkReason::Pause);
                                    }
                                    _ => {
                                        let e = ServerError::InvalidState(
                                            "this session cannot pause now (not yet opened, ending, or on a sharded server)".to_string(),
                                        );
                                        self.send_error(&e, None).await;
                                    }
                                },
                                Ok(ClientMessage::Resume) => {
                                    let e = ServerError::InvalidState(
                                        "the session is not paused".to_string(),
                                    );
                                    self.send_error(&e, None).await;
                                }
                                Ok(ClientMessage::Start(_)) => {
                                    let e = ServerError::InvalidState(
                                        "a session is already running on this socket; open a new socket for another".to_string(),
                                    );
                                    self.send_error(&e, None).await;
                                }
                                Ok(ClientMessage::Interaction(map)) => {
                                    let parsed = self.parse_interaction(&map, request_id);
                                    self.queue(&worker, parsed, request_id, phase).await;
                                }
                            }
                        }
                        Some(Ok(Message::Binary(_))) => {
                            let e = ServerError::InvalidJson(
                                "binary messages are not accepted; send JSON text".to_string(),
                            );
                            self.send_error(&e, None).await;
                        }
                        Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                        Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                            self.open = false;
                            hang_up(&worker, park.as_deref(), opened && phase == Phase::Running);
                            return Outcome::Ended;
                        }
                    }
                    if !self.open {
                        hang_up(&worker, park.as_deref(), opened && phase == Phase::Running);
                        return Outcome::Ended;
                    }
                }
                // The clock runs from admission: opening the session is not a stall.
                _ = sleep_until(stall_at), if phase == Phase::Running && opened => {
                    let secs = limits.stall_timeout.as_secs_f64();
                    self.send_error(&ServerError::StallTimeout(secs), None).await;
                    phase = Phase::Ending;
                    cancel(&worker);
                }
            }
        }
    }

    /// Sends a chunk's metadata and fragment (its paced wait: from ready to now);
    /// whether both went out.
    async fn send_chunk(
        &mut self,
        request_id: &str,
        chunks_sent: &mut u64,
        mut chunk: Box<crate::worker::EncodedChunk>,
    ) -> bool {
        chunk.paced_wait = chunk
            .ready_at
            .elapsed()
            .min(chunk.release_at.saturating_duration_since(chunk.ready_at));
        let mut meta = wire::chunk_metadata(request_id, *chunks_sent, &chunk);
        meta["action_latency_ms"] = self.action_latencies(&chunk.started_frames);
        let bytes = chunk.bytes.len() as u64;
        let sent =
            self.send_json(&meta).await && self.send(Message::Binary(chunk.bytes.into())).await;
        if sent {
            *chunks_sent += 1;
            let metrics = &self.state.metrics;
            metrics.chunks_sent.fetch_add(1, Ordering::Relaxed);
            metrics.media_bytes_sent.fetch_add(bytes, Ordering::Relaxed);
        }
        sent
    }

    /// Each started interaction's key-to-display time as its chunk is sent: since it
    /// arrived, plus its first frame's offset in the chunk's media time (recorded in
    /// `headroom_action_latency_seconds` too).
    fn action_latencies(&mut self, started: &[(String, usize)]) -> Value {
        let now = Instant::now();
        let mut out = serde_json::Map::new();
        for (id, frame) in started {
            let Some(at) = self.received.remove(id) else {
                continue;
            };
            let latency = now.saturating_duration_since(at)
                + std::time::Duration::from_secs_f64(*frame as f64 / f64::from(self.fps.max(1)));
            self.state.metrics.action_latency.observe(latency);
            out.insert(id.clone(), Value::from(latency.as_secs_f64() * 1e3));
        }
        Value::Object(out)
    }

    /// Checks an interaction's id against this session's and the phase; the error (if
    /// any) has been sent.
    async fn check_interaction(
        &mut self,
        parsed: crate::error::Result<Interaction>,
        phase: Phase,
    ) -> Option<Interaction> {
        let interaction = match parsed {
            Ok(i) => i,
            Err(e) => {
                self.send_error(&e, None).await;
                return None;
            }
        };
        let id = interaction.event_id.clone();
        let limits = &self.state.config.limits;
        let refusal = if self.event_ids.contains(&id) {
            Some(ServerError::EventIdConflict(id.clone()))
        } else if phase == Phase::Ending {
            Some(ServerError::InvalidState(
                "the session is ending; no more interactions are taken".to_string(),
            ))
        } else if self.scripted && interaction.camera.is_some() {
            Some(ServerError::request(
                "interaction",
                "this session follows its action script (extra_params.camera_action_script); camera updates cannot be mixed with it",
            ))
        } else if interaction
            .prompt
            .as_deref()
            .is_some_and(|p| !p.trim().is_empty())
            && !self.state.engine.has_text_encoder()
        {
            Some(ServerError::request(
                "interaction.event.prompt",
                "this server's model has no text encoder, so it takes no prompt",
            ))
        } else if self.event_ids.len() >= limits.events_per_session {
            Some(ServerError::Busy(format!(
                "a session takes at most {} interactions",
                limits.events_per_session
            )))
        } else {
            None
        };
        if let Some(e) = refusal {
            self.send_error(&e, Some(&id)).await;
            return None;
        }
        Some(interaction)
    }

    /// Checks an interaction and hands it to the worker for the next boundary.
    async fn queue(
        &mut self,
        worker: &WorkerHandle,
        parsed: crate::error::Result<Interaction>,
        request_id: &str,
        phase: Phase,
    ) {
        let Some(interaction) = self.check_interaction(parsed, phase).await else {
            return;
        };
        let id = interaction.event_id.clone();
        let limits = &self.state.config.limits;
        let received_at = interaction.received_at;
        match worker.control.try_send(interaction) {
            Ok(()) => {
                self.event_ids.insert(id.clone());
                self.received.insert(id.clone(), received_at);
                self.send_json(&wire::interaction_queued(request_id, &id))
                    .await;
            }
            Err(TrySendError::Full(_)) => {
                let e = ServerError::Busy(format!(
                    "{} interactions already wait for the next chunk boundary",
                    limits.pending_interactions
                ));
                self.send_error(&e, Some(&id)).await;
            }
            Err(TrySendError::Disconnected(_)) => {
                let e = ServerError::InvalidState("the session has ended".to_string());
                self.send_error(&e, Some(&id)).await;
            }
        }
    }
}
