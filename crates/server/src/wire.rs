//! Server → client messages of `WS /v1/realtime/video`, spelled as vLLM-Omni spells them.

use serde_json::{json, Value};

use crate::error::ServerError;
use crate::worker::EncodedChunk;

/// `video.start`: the session was admitted; `config` echoes the accepted request.
/// `queue_wait_ms` (headroom's, ignored by vLLM-Omni's clients) is the time from
/// `session.start` to admission: 0 when a slot was free at once.
pub fn video_start(request_id: &str, config: Value, queue_wait_ms: f64) -> Value {
    json!({
        "type": "video.start",
        "request_id": request_id,
        "format": "m4s",
        "config": config,
        "queue_wait_ms": queue_wait_ms,
    })
}

/// What `video.start` says of a session that can be resumed: its token, and the chunk a
/// resumed stream starts at.
pub fn with_resume(mut start: Value, token: Option<&str>, resumed_from: Option<usize>) -> Value {
    if let Some(t) = token {
        start["resume_token"] = json!(t);
    }
    if let Some(k) = resumed_from {
        start["resumed_from_chunk"] = json!(k);
    }
    start
}

/// `session.paused`: the session's state left the device at a chunk boundary;
/// `session.resume` (or a `session.start` with the token) brings it back from
/// `next_chunk`.
pub fn session_paused(request_id: &str, token: &str, next_chunk: usize, bytes: u64) -> Value {
    json!({
        "type": "session.paused",
        "request_id": request_id,
        "resume_token": token,
        "next_chunk": next_chunk,
        "parked_bytes": bytes,
    })
}

/// `session.moved`: a draining server put the session in the shared store; connect
/// again (the balancer picks a replica) with `session.start` and the token.
pub fn session_moved(request_id: &str, token: &str, next_chunk: usize) -> Value {
    json!({
        "type": "session.moved",
        "request_id": request_id,
        "resume_token": token,
        "next_chunk": next_chunk,
    })
}

/// `session.queued`: the session waits for a free slot with `ahead` clients before it;
/// sent on entering the queue and whenever that number changes. (headroom's own message:
/// vLLM-Omni's clients skip types they do not know and just see `video.start` later.)
pub fn session_queued(request_id: &str, ahead: usize, timeout_s: f64) -> Value {
    json!({
        "type": "session.queued",
        "request_id": request_id,
        "ahead": ahead,
        "position": ahead + 1,
        "queue_timeout_s": timeout_s,
    })
}

/// `video.chunk_metadata` describing the binary message that follows it. Beyond
/// vLLM-Omni's fields it carries the chunk's timings and the allocator's figures after
/// its denoise and its decode (clients ignore fields they do not know).
pub fn chunk_metadata(request_id: &str, transport_index: u64, chunk: &EncodedChunk) -> Value {
    json!({
        "type": "video.chunk_metadata",
        "request_id": request_id,
        "kind": "media",
        "transport_chunk_index": transport_index,
        "generation_chunk_index": chunk.index,
        "num_frames": chunk.num_frames,
        "byte_length": chunk.bytes.len(),
        "started_event_ids": chunk
            .started_frames
            .iter()
            .map(|(id, _)| id.as_str())
            .collect::<Vec<_>>(),
        "started_event_frames": chunk
            .started_frames
            .iter()
            .map(|(id, f)| (id.clone(), json!(f)))
            .collect::<serde_json::Map<_, _>>(),
        "active_event_ids": chunk.active,
        "completed_event_ids": chunk.completed,
        "latency_ms": chunk.latency.as_secs_f64() * 1e3,
        "behind_playback_ms": chunk.behind_playback.as_secs_f64() * 1e3,
        "denoise_ms": chunk.phases[0] * 1e3,
        "commit_ms": chunk.phases[1] * 1e3,
        "decode_ms": chunk.phases[2] * 1e3,
        "allocated_bytes": chunk.allocated_bytes,
        "reserved_bytes": chunk.reserved_bytes,
        "denoise_end_allocated_bytes": chunk.denoise_end_bytes[0],
        "denoise_end_reserved_bytes": chunk.denoise_end_bytes[1],
        "paced_wait_ms": chunk.paced_wait.as_secs_f64() * 1e3,
    })
}

/// `session.interaction.queued`: the interaction waits for the next chunk boundary
/// (queue admission, not application: a later `error` with its `event_id` says when it
/// could not be applied).
pub fn interaction_queued(request_id: &str, event_id: &str) -> Value {
    json!({
        "type": "session.interaction.queued",
        "request_id": request_id,
        "event_id": event_id,
    })
}

/// `session.pong`, the answer to `session.ping`.
pub fn pong() -> Value {
    json!({ "type": "session.pong" })
}

/// `session.done`: the session ended after `chunks` chunks; `stopped` when it ended early.
pub fn session_done(request_id: &str, chunks: u64, stopped: bool) -> Value {
    json!({
        "type": "session.done",
        "request_id": request_id,
        "chunks": chunks,
        "stopped": stopped,
    })
}

/// `error {message, code, request_id?, event_id?}`.
pub fn error(error: &ServerError, request_id: Option<&str>, event_id: Option<&str>) -> Value {
    let mut v = json!({
        "type": "error",
        "message": error.to_string(),
        "code": error.code(),
    });
    if let Some(id) = request_id {
        v["request_id"] = json!(id);
    }
    if let Some(id) = event_id {
        v["event_id"] = json!(id);
    }
    v
}
