//! Helpers shared by the WebSocket tests: a server on the `tiny` model in-process, a
//! client that reads the protocol's messages, and a small deterministic generator.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use headroom_engine::EngineConfig;
use headroom_mem::ReclaimPolicy;
use headroom_server::{Server, ServerConfig};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Guard against a hang; never an assertion about speed.
pub const GUARD: Duration = Duration::from_secs(120);
pub const W: usize = 48;
pub const H: usize = 32;

/// A server on the `tiny` model listening on a free port.
pub struct TestServer {
    pub addr: SocketAddr,
    /// WebSocket connections this test opened.
    connections: AtomicU64,
    pub server: Server,
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<headroom_server::Result<()>>,
}

impl TestServer {
    pub async fn start(config: ServerConfig, kv_budget_bytes: Option<u64>) -> Self {
        let engine = EngineConfig {
            model: "tiny".to_string(),
            reclaim: ReclaimPolicy::BeforeDecode,
            kv_budget_bytes,
            ..EngineConfig::default()
        };
        Self::start_with(engine, config).await
    }

    /// A server on `engine` (its model set to `tiny`).
    pub async fn start_with(engine: EngineConfig, config: ServerConfig) -> Self {
        Self::start_model("tiny", "tiny", engine, config).await
    }

    /// A server of model `model` (a built-in name or a folder) served as `name`.
    pub async fn start_model(
        model: &str,
        name: &str,
        engine: EngineConfig,
        config: ServerConfig,
    ) -> Self {
        let engine = EngineConfig {
            model: model.to_string(),
            ..engine
        };
        let config = ServerConfig {
            model_name: name.to_string(),
            ..config
        };
        let server = Server::new(engine, config).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(server.clone().serve(listener, async {
            let _ = rx.await;
        }));
        Self {
            addr,
            connections: AtomicU64::new(0),
            server,
            shutdown: Some(tx),
            task,
        }
    }

    pub async fn default() -> Self {
        Self::start(ServerConfig::default(), None).await
    }

    pub async fn connect(&self) -> Ws {
        self.connections.fetch_add(1, Ordering::Relaxed);
        let url = format!("ws://{}/v1/realtime/video", self.addr);
        tokio_tungstenite::connect_async(url).await.unwrap().0
    }

    /// A WebSocket upgrade with extra `headers`: the socket, or the HTTP status of the
    /// refusal.
    pub async fn connect_with(&self, headers: &[(&str, &str)]) -> Result<Ws, u16> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        use tokio_tungstenite::tungstenite::Error;
        let url = format!("ws://{}/v1/realtime/video", self.addr);
        let mut request = url.into_client_request().unwrap();
        for (name, value) in headers {
            request.headers_mut().insert(
                tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(name.as_bytes())
                    .unwrap(),
                value.parse().unwrap(),
            );
        }
        match tokio_tungstenite::connect_async(request).await {
            Ok((ws, _)) => {
                self.connections.fetch_add(1, Ordering::Relaxed);
                Ok(ws)
            }
            Err(Error::Http(response)) => Err(response.status().as_u16()),
            Err(e) => panic!("the upgrade failed otherwise: {e}"),
        }
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        self.get_with(path, &[]).await
    }

    /// A GET with extra `headers` (`Name: value` lines).
    pub async fn get_with(&self, path: &str, headers: &[&str]) -> (u16, String) {
        self.request("GET", path, headers).await
    }

    /// A POST with an empty body: (status, body).
    pub async fn post(&self, path: &str) -> (u16, String) {
        self.request("POST", path, &["Content-Length: 0"]).await
    }

    /// One HTTP/1.1 request with extra `headers`: (status, body).
    async fn request(&self, method: &str, path: &str, headers: &[&str]) -> (u16, String) {
        let mut stream = TcpStream::connect(self.addr).await.unwrap();
        let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
        let request =
            format!("{method} {path} HTTP/1.1\r\nHost: test\r\n{extra}Connection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        tokio::time::timeout(GUARD, stream.read_to_end(&mut raw))
            .await
            .unwrap()
            .unwrap();
        let text = String::from_utf8_lossy(&raw).to_string();
        let status = text[9..12].parse().unwrap();
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        (status, body)
    }

    /// The value of the metric line starting with `name ` in `/metrics`.
    pub async fn metric(&self, name: &str) -> f64 {
        let (_, metrics) = self.get("/metrics").await;
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{name} missing from {metrics}"))
            .parse()
            .unwrap()
    }

    pub fn allocated_bytes(&self) -> i64 {
        self.server
            .engine()
            .platform()
            .memory_stats()
            .allocated_bytes
            .all()
            .current
    }

    /// Waits for `serve` to return on its own (after a drain), without asking it to stop.
    pub async fn served(mut self) {
        self.shutdown.take();
        tokio::time::timeout(GUARD, &mut self.task)
            .await
            .expect("serve never returned")
            .unwrap()
            .unwrap();
    }

    /// Waits until every socket this test opened has been served to its end and no
    /// session holds a slot (workers release before they report).
    pub async fn idle(&self) {
        let metrics = self.server.metrics();
        let busy = || {
            metrics.connections_total.load(Ordering::Relaxed)
                < self.connections.load(Ordering::Relaxed)
                || metrics.connections_open.load(Ordering::Relaxed) > 0
                || self.server.open_sessions() > 0
        };
        tokio::time::timeout(GUARD, async {
            while busy() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("sessions never ended");
    }

    pub fn assert_pool_free(&self) {
        let pool = self
            .server
            .engine()
            .kv_pool()
            .expect("a session sized the pool");
        assert_eq!(pool.free_pages(), pool.total_pages(), "KV pages leaked");
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(GUARD, self.task)
            .await
            .expect("serve never returned")
            .unwrap()
            .unwrap();
    }
}

#[derive(Debug)]
pub enum In {
    Json(Value),
    Bin(Vec<u8>),
    Closed,
}

pub async fn recv(ws: &mut Ws) -> In {
    loop {
        return match recv_raw(ws).await {
            Some(Ok(Message::Text(t))) => In::Json(serde_json::from_str(t.as_str()).unwrap()),
            Some(Ok(Message::Binary(b))) => In::Bin(b.to_vec()),
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => continue,
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => In::Closed,
        };
    }
}

/// The next frame as the client library reads it (close frames and errors included).
pub async fn recv_raw(
    ws: &mut Ws,
) -> Option<Result<Message, tokio_tungstenite::tungstenite::Error>> {
    tokio::time::timeout(GUARD, ws.next())
        .await
        .expect("no message from the server")
}

pub async fn recv_json(ws: &mut Ws) -> Value {
    match recv(ws).await {
        In::Json(v) => v,
        other => panic!("expected a JSON message, got {other:?}"),
    }
}

pub async fn send(ws: &mut Ws, value: Value) {
    ws.send(Message::text(value.to_string())).await.unwrap();
}

pub fn start_msg(frames: usize, seed: u64) -> Value {
    json!({"type": "session.start", "model": "tiny", "format": "m4s",
           "width": W, "height": H, "num_frames": frames, "seed": seed, "fps": 16})
}

pub fn velocity(event_id: &str) -> Value {
    json!({"type": "session.interaction", "interaction": {"event_id": event_id,
        "event": {"multi_modal_data": {"camera": {"mode": "velocity",
            "data": {"translation": [0.0, 0.0, 0.05], "rotation": [0.0, 0.0, 0.0, 1.0]}}}}}})
}

/// A session's messages after `video.start`, until `session.done` or an error.
#[derive(Debug, Default)]
pub struct Streamed {
    pub metadata: Vec<Value>,
    pub binaries: Vec<Vec<u8>>,
    pub others: Vec<Value>,
    pub end: Option<Value>,
}

/// Reads until `session.done` (the end) or the server closes the socket (the end is then
/// the last `error`).
pub async fn stream_to_end(ws: &mut Ws) -> Streamed {
    stream_to_end_pinging(ws, None).await
}

/// [`stream_to_end`], sending `session.ping` every `every` while it waits, so that how
/// long a chunk takes on this machine never counts as a stall.
pub async fn stream_to_end_pinging(ws: &mut Ws, every: Option<std::time::Duration>) -> Streamed {
    let mut out = Streamed::default();
    loop {
        let message = match every {
            None => recv(ws).await,
            Some(every) => {
                tokio::select! {
                    m = recv(ws) => m,
                    _ = tokio::time::sleep(every) => {
                        send(ws, serde_json::json!({"type": "session.ping"})).await;
                        continue;
                    }
                }
            }
        };
        match message {
            In::Json(v) => match v["type"].as_str() {
                Some("video.chunk_metadata") => {
                    out.metadata.push(v);
                    match recv(ws).await {
                        In::Bin(b) => out.binaries.push(b),
                        other => panic!("metadata must be followed by binary, got {other:?}"),
                    }
                }
                Some("session.done") => {
                    out.end = Some(v);
                    return out;
                }
                _ => out.others.push(v),
            },
            In::Bin(_) => panic!("binary without metadata"),
            In::Closed => {
                out.end = out
                    .others
                    .iter()
                    .rev()
                    .find(|v| v["type"] == "error")
                    .cloned();
                return out;
            }
        }
    }
}

/// Opens a session and returns its `video.start`.
pub async fn open(ts: &TestServer, frames: usize, seed: u64) -> (Ws, Value) {
    let mut ws = ts.connect().await;
    send(&mut ws, start_msg(frames, seed)).await;
    let start = recv_json(&mut ws).await;
    assert_eq!(start["type"], "video.start", "{start}");
    (ws, start)
}

pub async fn run_session(ts: &TestServer, frames: usize, seed: u64) -> Streamed {
    let (mut ws, _) = open(ts, frames, seed).await;
    let out = stream_to_end(&mut ws).await;
    assert_eq!(out.end.as_ref().unwrap()["type"], "session.done");
    out
}

/// Top-level MP4 box types of `bytes`.
pub fn boxes(bytes: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 8 <= bytes.len() {
        let size = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        out.push(String::from_utf8_lossy(&bytes[at + 4..at + 8]).to_string());
        assert!(size >= 8, "box size {size}");
        at += size;
    }
    assert_eq!(at, bytes.len(), "boxes end exactly at the message end");
    out
}

/// An error message with `code`, as the next message.
pub async fn expect_error(ws: &mut Ws, code: &str) -> Value {
    let v = recv_json(ws).await;
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["code"], code, "{v}");
    assert!(!v["message"].as_str().unwrap().is_empty());
    v
}

/// `headroom_reserved_bytes` read from `/metrics`, as an operator would.
pub async fn reserved_from_metrics(ts: &TestServer) -> i64 {
    let (_, metrics) = ts.get("/metrics").await;
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("headroom_reserved_bytes "))
        .expect("headroom_reserved_bytes is exported")
        .parse()
        .unwrap()
}

/// A small deterministic generator for the fuzz test.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The `headroom_door_refusals_total` counter of `reason` in a `/metrics` body.
pub fn refusals(metrics: &str, reason: &str) -> u64 {
    let prefix = format!("headroom_door_refusals_total{{reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in /metrics"))
}
