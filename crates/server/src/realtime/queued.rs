//! A client waiting for a session slot: admission at once or through the queue, and the
//! messages a queued client may send (pings, interactions held for its session, stop).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::ws::Message;
use tokio::time::{sleep_until, Instant as TokioInstant};

use super::{too_large, Connection, Phase, QueuedInput, CLOSE_GOING_AWAY};
use crate::admission::{Refusal, Slot};
use crate::error::ServerError;
use crate::protocol::ClientMessage;
use crate::wire;

impl Connection {
    /// A session slot: at once when one is free and nobody waits, else after waiting in
    /// the queue (at its head when `front`) until `deadline`, for a session of `pages` KV
    /// pages. `None` when the client was refused, stopped or hung up (it has been told
    /// what it needs to hear).
    pub(super) async fn admit(
        &mut self,
        front: bool,
        deadline: TokioInstant,
        request_id: &str,
        pages: usize,
    ) -> Option<Slot> {
        let state = Arc::clone(&self.state);
        let admission = &state.admission;
        let mut changes = admission.changes();
        let mut ticket = if front {
            admission.join(true)
        } else {
            match admission.try_enter(pages) {
                Ok(slot) => return Some(slot),
                Err(Some(reason)) => {
                    self.refuse(ServerError::capacity(Refusal::QueueFull, reason))
                        .await;
                    return None;
                }
                Err(None) => admission.join(false),
            }
        };
        let mut shutdown = state.shutdown_signal();
        let mut drain = state.drain_signal();
        let timeout_s = state.config.queue_timeout.as_secs_f64();
        let mut told = None;
        loop {
            if state.is_shutting_down() {
                self.refuse(ServerError::ShuttingDown).await;
                return None;
            }
            if state.is_draining() {
                // Queued here, it would never start: go to another replica now.
                self.close_with = (CLOSE_GOING_AWAY, "the server is draining");
                self.refuse(ServerError::Draining).await;
                return None;
            }
            ticket = match ticket.try_admit(pages) {
                Ok(slot) => {
                    state.metrics.queue_admitted.fetch_add(1, Ordering::Relaxed);
                    return Some(slot);
                }
                Err(ticket) => ticket,
            };
            let ahead = ticket.ahead();
            if told != Some(ahead) {
                told = Some(ahead);
                if !self
                    .send_json(&wire::session_queued(request_id, ahead, timeout_s))
                    .await
                {
                    return None;
                }
            }
            tokio::select! {
                _ = changes.changed() => {}
                _ = shutdown.changed() => {}
                _ = drain.changed() => {}
                _ = sleep_until(deadline) => {
                    let why = admission.room_for(pages).err().unwrap_or_else(|| "others were ahead".to_string());
                    let e = ServerError::capacity(Refusal::QueueTimeout, format!(
                        "waited {timeout_s:.1} s in the admission queue without a free slot ({why}); raise --queue-timeout or add capacity"
                    ));
                    self.refuse(e).await;
                    return None;
                }
                message = self.socket.recv() => {
                    if let QueuedInput::Leave = self.while_queued(message, request_id).await {
                        return None;
                    }
                }
            }
        }
    }

    /// Answers one message of a queued client: pings, interactions held for the session,
    /// `session.stop` (answered with `session.done {chunks: 0, stopped: true}`).
    pub(super) async fn while_queued(
        &mut self,
        message: Option<std::result::Result<Message, axum::Error>>,
        request_id: &str,
    ) -> QueuedInput {
        let limits = self.state.config.limits.clone();
        let text = match message {
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(Message::Binary(_))) => {
                let e = ServerError::InvalidJson(
                    "binary messages are not accepted; send JSON text".to_string(),
                );
                self.send_error(&e, None).await;
                return QueuedInput::Wait;
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => return QueuedInput::Wait,
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                self.open = false;
                return QueuedInput::Leave;
            }
        };
        if let Some(e) = too_large(&text, &limits, "control") {
            self.send_error(&e, None).await;
            return QueuedInput::Wait;
        }
        match ClientMessage::parse(text.as_str()) {
            Err(e) => self.send_error(&e, None).await,
            Ok(ClientMessage::Ping) => {
                self.send_json(&wire::pong()).await;
            }
            Ok(ClientMessage::Stop) => {
                self.send_json(&wire::session_done(request_id, 0, true))
                    .await;
                return QueuedInput::Leave;
            }
            Ok(ClientMessage::Start(_)) => {
                let e = ServerError::InvalidState(
                    "a session is already waiting on this socket; open a new socket for another"
                        .to_string(),
                );
                self.send_error(&e, None).await;
            }
            Ok(ClientMessage::Pause | ClientMessage::Resume) => {
                let e = ServerError::InvalidState(
                    "the session is waiting for a slot: it can pause or resume once it runs"
                        .to_string(),
                );
                self.send_error(&e, None).await;
            }
            Ok(ClientMessage::Interaction(map)) => {
                let parsed = self.parse_interaction(&map, request_id);
                let Some(interaction) = self.check_interaction(parsed, Phase::Running).await else {
                    return QueuedInput::Wait;
                };
                if self.held.len() >= limits.pending_interactions {
                    let e = ServerError::Busy(format!(
                        "{} interactions already wait for the session to start",
                        limits.pending_interactions
                    ));
                    self.send_error(&e, Some(&interaction.event_id)).await;
                    return QueuedInput::Wait;
                }
                self.event_ids.insert(interaction.event_id.clone());
                self.received
                    .insert(interaction.event_id.clone(), interaction.received_at);
                self.send_json(&wire::interaction_queued(request_id, &interaction.event_id))
                    .await;
                self.held.push(interaction);
            }
        }
        if self.open {
            QueuedInput::Wait
        } else {
            QueuedInput::Leave
        }
    }
}
