//! The server: shared state, the routes, readiness, and serving until shutdown.
//!
//! Routes: `GET /` (the web viewer), `GET /health`, `GET /ready`, `GET /metrics`
//! (Prometheus text), `GET /stats` (the same figures as JSON, for the viewer),
//! `POST /drain` and `GET /v1/realtime/video` (the WebSocket API), all behind
//! [`crate::door`] (keys, origins, the socket cap).
//!
//! Drain: when the shutdown future resolves (SIGTERM) or `POST /drain` arrives, `/ready`
//! turns 503, a new `session.start` and every queued client are refused (`error` code
//! `draining`, close code 1001), and running sessions go on for up to `drain_timeout`.
//! Shutdown follows: the listener stops accepting, every open
//! socket is told (its session ends at the next chunk boundary with
//! `session.done {stopped: true}`), and [`Server::serve`] returns once every socket task
//! has finished — after every worker has released its session.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use headroom_engine::{Engine, EngineConfig, StepQueue};
use headroom_tensor::comm::Communicator;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::admission::Admission;
use crate::config::{Scheduler, ServerConfig};
use crate::error::{Result, ServerError};
use crate::metrics::Metrics;
use crate::realtime::handle_socket;
use crate::state::AppState;

/// Bytes a WebSocket reads at a time (tungstenite's default, 128 KiB, would be held by
/// every socket, idle ones included).
const READ_CHUNK: usize = 16 << 10;

/// The web viewer page.
const VIEWER_HTML: &str = include_str!("../static/viewer.html");

/// The realtime server: an engine plus its routes.
#[derive(Debug, Clone)]
pub struct Server {
    state: Arc<AppState>,
}

impl Server {
    /// Loads the engine (`engine_config`) and sets the server up; the engine's automatic
    /// KV budget is sized for `config.max_sessions` sessions.
    pub fn new(mut engine_config: EngineConfig, config: ServerConfig) -> Result<Self> {
        if config.max_sessions == 0 {
            return Err(ServerError::request("max_sessions", "must be at least 1"));
        }
        engine_config.max_sessions = config.max_sessions;
        let engine = Engine::new(engine_config)
            .map_err(|e| ServerError::Setup(format!("cannot load the engine: {e}")))?;
        Self::with_engine(engine, None, config)
    }

    /// Sets the server up over a loaded `engine` (built with `max_sessions` =
    /// `config.max_sessions`). With `world`, the engine is rank 0 of a mesh whose other
    /// ranks follow (`headroom_engine::replicated::follow`): sessions run one at a time,
    /// each led on every rank.
    pub fn with_engine(
        engine: Engine,
        world: Option<Arc<dyn Communicator>>,
        config: ServerConfig,
    ) -> Result<Self> {
        if config.max_sessions == 0 {
            return Err(ServerError::request("max_sessions", "must be at least 1"));
        }
        config.door.validate()?;
        if world.is_some() && config.max_sessions != 1 {
            return Err(ServerError::request(
                "max_sessions",
                "a sharded server runs one session at a time (every rank follows one schedule)",
            ));
        }
        // The fewest pages a session takes: one a frame (a frame of one page's tokens).
        let pages_per_session = engine.config().window_frames;
        let (shutdown_tx, _) = watch::channel(false);
        let (drain_tx, _) = watch::channel(false);
        let (sockets, _) = watch::channel(0);
        let engine = Arc::new(engine);
        let metrics = Arc::new(Metrics::default());
        engine.set_batched_steps(config.batch_steps && world.is_none() && config.max_sessions > 1);
        let steps = (config.batch_steps && world.is_none()).then(|| {
            Arc::new(match config.max_batch {
                Some(max) => StepQueue::with_max_batch(max),
                None => StepQueue::new(),
            })
        });
        // A real-time server (sessions paced by default, `serve --pace`) under the
        // deadline scheduler admits a new session only while the rounds stay on time:
        // a chunk (12 frames) plays for 12 / fps seconds at the default fps.
        let realtime = match (&steps, config.scheduler) {
            (Some(q), Scheduler::Deadline) if config.defaults.pacing.enabled => Some((
                Arc::clone(q),
                Duration::from_secs_f64(12.0 / f64::from(config.defaults.fps.max(1))),
            )),
            _ => None,
        };
        let admission = Admission::new(
            Arc::clone(&engine),
            Arc::clone(&metrics),
            config.max_sessions,
            config.max_queue,
            pages_per_session,
            realtime,
        );
        if config.snapshot_every.is_some() && config.session_store.is_none() {
            return Err(ServerError::request(
                "snapshot_every",
                "writes to the session store: give --session-store DIR too",
            ));
        }
        if let Some(store) = &config.session_store {
            std::fs::create_dir_all(store).map_err(|e| {
                ServerError::Setup(format!("--session-store {}: {e}", store.display()))
            })?;
        }
        let resume = Arc::new(crate::resume::ResumeBook::bounded(
            config.session_store.clone(),
            config.resume_window,
            config
                .max_parked_bytes
                .unwrap_or_else(|| headroom_mem::HostMemory::physical_memory() / 4),
        ));
        let room = Arc::new(crate::sockets::Sockets::new(
            config
                .door
                .connection_cap(config.max_sessions, config.max_queue),
        ));
        Ok(Self {
            state: Arc::new(AppState {
                room,
                engine,
                steps,
                world,
                config,
                pages_per_session,
                metrics,
                admission,
                shutdown_tx,
                drain_tx,
                sockets,
                request_ids: AtomicU64::new(1),
                streaming: watch::channel(0).0,
                resume,
            }),
        })
    }

    /// The engine (tests read its allocator and KV pool).
    pub fn engine(&self) -> &Arc<Engine> {
        &self.state.engine
    }

    /// The server's counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.state.metrics
    }

    /// `Ok` while a new session could be admitted now, else the reason.
    pub fn readiness(&self) -> std::result::Result<(), String> {
        self.state.readiness()
    }

    /// Sessions holding a slot now.
    pub fn open_sessions(&self) -> u64 {
        self.state.admission.open() as u64
    }

    /// Clients waiting in the admission queue now.
    pub fn queued(&self) -> usize {
        self.state.admission.waiting()
    }

    /// The routes.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/", get(viewer))
            .route("/health", get(health))
            .route("/ready", get(ready))
            .route("/metrics", get(metrics))
            .route("/stats", get(stats))
            .route("/drain", axum::routing::post(drain))
            .route("/v1/realtime/video", get(realtime))
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(&self.state),
                crate::door::guard,
            ))
            .with_state(Arc::clone(&self.state))
    }

    /// Begins a drain, as `POST /drain` does (see [`Server::serve`]).
    pub fn drain(&self) -> bool {
        self.state.drain()
    }

    /// Serves on `listener` until `shutdown` resolves or a drain begins (`POST /drain`):
    /// then drains — `/ready` turns 503, new sessions and queued clients are refused
    /// (close code 1001), running sessions go on for up to `drain_timeout` — and then
    /// stops accepting, ends what still runs with `session.done {stopped: true}` and
    /// returns once every socket closed.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        // Parked sessions past their window go, once a second, until the server stops.
        let sweeper = {
            let state = Arc::clone(&self.state);
            let mut stop = state.shutdown_signal();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
                loop {
                    tokio::select! {
                        _ = tick.tick() => {
                            let book = Arc::clone(&state.resume);
                            let _ = tokio::task::spawn_blocking(move || book.sweep()).await;
                        }
                        changed = stop.changed() => {
                            if changed.is_err() || *stop.borrow() {
                                return;
                            }
                        }
                    }
                }
            })
        };
        let state = Arc::clone(&self.state);
        let signal = async move {
            let mut drain = state.drain_signal();
            tokio::select! {
                () = shutdown => {}
                _ = drain.wait_for(|d| *d) => {}
            }
            state.drain();
            let timeout = state.config.drain_timeout;
            if !timeout.is_zero() && tokio::time::timeout(timeout, state.idle()).await.is_err() {
                tracing::warn!(
                    "drain: sessions still ran after {:.0} s (--drain-timeout); stopping them",
                    timeout.as_secs_f64()
                );
            }
            state.shutdown_tx.send_replace(true);
        };
        axum::serve(listener, self.router())
            .with_graceful_shutdown(signal)
            .await
            .map_err(|e| ServerError::Setup(format!("serving failed: {e}")))?;
        // Upgraded sockets outlive their HTTP connection: wait for them here.
        let mut sockets = self.state.sockets.subscribe();
        let _ = sockets.wait_for(|n| *n == 0).await;
        sweeper.abort();
        Ok(())
    }
}

/// `POST /drain` (behind the key): begins a drain; 202 with whether this call began it.
async fn drain(State(state): State<Arc<AppState>>) -> Response {
    let began = state.drain();
    (
        StatusCode::ACCEPTED,
        Json(serde_json::json!({ "draining": true, "began": began })),
    )
        .into_response()
}

async fn viewer() -> Html<&'static str> {
    Html(VIEWER_HTML)
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    if state
        .metrics
        .mesh_failed
        .load(std::sync::atomic::Ordering::Relaxed)
    {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({
                "status": "failed",
                "reason": "a rank of the mesh failed; the job must be restarted",
            })),
        )
            .into_response();
    }
    Json(serde_json::json!({ "status": "ok" })).into_response()
}

/// `GET /ready[?queueing=1]`: with `queueing=1` a client that would wait in the queue
/// counts as served, whatever `--ready-when-queueing` says.
async fn ready(
    State(state): State<Arc<AppState>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    let queueing = query.is_some_and(|q| q.split('&').any(|p| p == "queueing=1"))
        || state.config.ready_when_queueing;
    match state.readiness_for(queueing) {
        Ok(()) => Json(serde_json::json!({ "ready": true })).into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "ready": false, "reason": reason })),
        )
            .into_response(),
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let ready = state.readiness().is_ok();
    let mut body = state.metrics.render(
        &state.engine,
        state.config.max_sessions,
        ready,
        state.queue_gauges(),
    );
    let (parked, parked_bytes) = state.resume.parked();
    crate::metrics::gauge(
        &mut body,
        "headroom_sessions_parked",
        "Sessions parked in host memory (paused, or hung up inside --resume-window); their device bytes are 0.",
        parked,
    );
    crate::metrics::gauge(
        &mut body,
        "headroom_parked_bytes",
        "Bytes of parked sessions' state, in host memory (none on the device).",
        parked_bytes,
    );
    if let Some(c) = state.engine.plan_cache_counts() {
        for (name, help, value) in [
            ("hits", "Plans read from the plan cache.", c.hits),
            ("written", "Plans written to the plan cache.", c.written),
            (
                "corrupt",
                "Plan files deleted as corrupt and rebuilt.",
                c.corrupt,
            ),
            ("stale", "Plan files deleted as stale and rebuilt.", c.stale),
        ] {
            crate::metrics::counter(
                &mut body,
                &format!("headroom_plan_cache_{name}_total"),
                help,
                value,
            );
        }
    }
    if let Some(steps) = &state.steps {
        let (batches, stepped) = steps.counts();
        crate::metrics::counter(
            &mut body,
            "headroom_step_batches_total",
            "Chunk steps run (each one batch of every session ready at once).",
            batches,
        );
        crate::metrics::counter(
            &mut body,
            "headroom_stepped_session_chunks_total",
            "Session chunks run in those steps (over batches: sessions per step).",
            stepped,
        );
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn stats(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let s = state.engine.platform().memory_stats();
    let m = &state.metrics;
    let (pages_total, pages_free) = state
        .engine
        .kv_pool()
        .map_or((0, 0), |p| (p.total_pages(), p.free_pages()));
    let readiness = state.readiness();
    Json(serde_json::json!({
        "allocated_bytes": s.allocated_bytes.all().current,
        "allocated_peak_bytes": s.allocated_bytes.all().peak,
        "reserved_bytes": s.reserved_bytes.all().current,
        "reserved_peak_bytes": s.reserved_bytes.all().peak,
        "reclaims": s.num_reclaims,
        "kv_pages_total": pages_total,
        "kv_pages_free": pages_free,
        "sessions_open": m.sessions_open.load(Ordering::Relaxed),
        "max_sessions": state.config.max_sessions,
        "queue_waiting": state.admission.waiting(),
        "max_queue": state.config.max_queue,
        "ready": readiness.is_ok(),
        "not_ready_reason": readiness.err(),
        "chunks_sent": m.chunks_sent.load(Ordering::Relaxed),
        "chunk_latency_mean_s": m.chunk_latency.mean_secs(),
        "time_to_first_chunk_mean_s": m.time_to_first_chunk.mean_secs(),
        "model": state.config.model_name,
        "takes_prompt": state.engine.has_text_encoder(),
        "defaults": {
            "width": state.config.defaults.width,
            "height": state.config.defaults.height,
            "num_frames": state.config.defaults.num_frames,
            "fps": state.config.defaults.fps,
        },
    }))
}

async fn realtime(
    ws: WebSocketUpgrade,
    headers: axum::http::HeaderMap,
    State(state): State<Arc<AppState>>,
) -> Response {
    // Resume tokens are bound to the key the session was opened with (its digest).
    let key = crate::door::offered_key(&headers)
        .filter(|_| !state.config.door.api_keys.is_empty())
        .map(crate::resume::digest);
    // The WebSocket layer's own ceiling is above the protocol limits, so a message over a
    // limit is answered with `message_too_large` instead of a dropped connection; only
    // messages over twice the start limit are cut by the WebSocket layer itself.
    let ceiling = state
        .config
        .limits
        .start_message_bytes
        .max(state.config.limits.control_message_bytes)
        .saturating_mul(2);
    // A small read chunk: a socket that waits for its start holds little (a message
    // longer than the chunk is read in several).
    ws.read_buffer_size(READ_CHUNK)
        .max_message_size(ceiling)
        .max_frame_size(ceiling)
        .protocols([crate::door::SUBPROTOCOL])
        .on_upgrade(move |socket| handle_socket(socket, state, key))
}
