//! A session that can park (`crates/server/src/resume.rs`), on its socket: claiming a
//! resume token, putting a claimed session back when it cannot start after all, a
//! paused socket waiting for `session.resume`, and a hang-up that parks instead of
//! cancelling.

use std::sync::Arc;

use axum::extract::ws::Message;
use serde_json::Value;

use super::Connection;
use crate::error::ServerError;
use crate::protocol::ClientMessage;
use crate::resume::ParkReason;
use crate::wire;
use crate::worker::{ParkRequest, WorkerHandle};

/// The client of `worker` is gone: a session that can park (`parkable`: it has a
/// token, is open and not ending) parks at its next chunk boundary for its resume
/// window; any other is cancelled.
pub(super) fn hang_up(worker: &WorkerHandle, park: Option<&ParkRequest>, parkable: bool) {
    match park {
        Some(p) if parkable => p.ask(ParkReason::HangUp),
        _ => worker.cancel.cancel(),
    }
}

impl Connection {
    /// Claims the session of `token` for this client; `None` when refused (the client
    /// has been told, with `resume_refused`).
    pub(super) async fn claim(&mut self, token: &str) -> Option<crate::resume::Claimed> {
        let state = Arc::clone(&self.state);
        let claimed = if state.world.is_some() {
            Err(ServerError::ResumeRefused(
                "a sharded server resumes sessions from their shard files (generate --resume), not from tokens".into(),
            ))
        } else {
            state.resume.claim(token, self.key.as_deref()).await
        };
        match claimed {
            Ok(c) => {
                self.resume_token = Some(token.to_string());
                Some(c)
            }
            Err(e) => {
                self.send_error(&e, None).await;
                None
            }
        }
    }

    /// A claimed session that will not run after all goes back to the book under its
    /// token (for its resume window), and the client hears `error`.
    pub(super) async fn put_back(
        &mut self,
        start: &serde_json::Map<String, Value>,
        resume: Option<Arc<headroom_engine::SessionSnapshot>>,
        error: ServerError,
    ) {
        self.put_back_quietly(start, resume);
        self.send_error(&error, None).await;
    }

    /// [`Self::put_back`] without a message.
    pub(super) fn put_back_quietly(
        &mut self,
        start: &serde_json::Map<String, Value>,
        resume: Option<Arc<headroom_engine::SessionSnapshot>>,
    ) {
        if let (Some(snapshot), Some(token)) = (resume, self.resume_token.take()) {
            let book = &self.state.resume;
            book.running(&token, self.key.clone(), start.clone());
            let id = crate::resume::digest(token.as_bytes());
            let _ = book.park(&id, snapshot, crate::resume::ParkReason::HangUp);
        }
    }

    /// A paused session's socket: waits for `session.resume` (then claims the session
    /// again), answering pings; `session.stop` or a hang-up ends the wait (a hang-up
    /// leaves the session parked for its resume window, a stop forgets it). A drain
    /// moves the session to the store (`session.moved`, close 1001) when the server has
    /// one; a drain without a store, or a shutdown, ends the wait with its error.
    pub(super) async fn await_resume(
        &mut self,
        token: &str,
        request_id: &str,
    ) -> Option<crate::resume::Claimed> {
        let id = crate::resume::digest(token.as_bytes());
        let state = Arc::clone(&self.state);
        let mut drain = state.drain_signal();
        let mut shutdown = state.shutdown_signal();
        loop {
            if state.is_draining() || state.is_shutting_down() {
                let moved = state
                    .is_draining()
                    .then(|| state.resume.move_to_store(&id))
                    .flatten();
                self.close_with = (super::CLOSE_GOING_AWAY, "the server is draining");
                match moved {
                    Some(next) => {
                        self.send_json(&wire::session_moved(request_id, token, next))
                            .await;
                    }
                    None if state.is_shutting_down() => {
                        self.send_error(&ServerError::ShuttingDown, None).await;
                    }
                    None => self.send_error(&ServerError::Draining, None).await,
                }
                return None;
            }
            let message = tokio::select! {
                m = self.socket.recv() => m,
                _ = drain.changed() => continue,
                _ = shutdown.changed() => continue,
            };
            let text = match message {
                Some(Ok(Message::Text(text))) => text,
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => {
                    self.open = false;
                    state.resume.hung_up(&id);
                    return None;
                }
            };
            match ClientMessage::parse(text.as_str()) {
                Ok(ClientMessage::Resume) => return self.claim(token).await,
                Ok(ClientMessage::Ping) => {
                    self.send_json(&wire::pong()).await;
                }
                Ok(ClientMessage::Stop) => {
                    state.resume.forget(&id);
                    self.send_json(&wire::session_done(request_id, 0, true))
                        .await;
                    return None;
                }
                Ok(_) => {
                    let e = ServerError::InvalidState(
                        "the session is paused: send session.resume (or session.stop)".into(),
                    );
                    self.send_error(&e, None).await;
                }
                Err(e) => self.send_error(&e, None).await,
            }
        }
    }
}
