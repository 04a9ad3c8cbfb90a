//! The door: one layer in front of the routes that decides who may come in, before any
//! route runs or allocates.
//!
//! - **Keys.** With API keys set (`serve --api-key`, `HEADROOM_API_KEY`), every route but
//!   `/`, `/health` and `/ready` needs `Authorization: Bearer KEY`, compared in constant
//!   time; a browser, which cannot set headers on a WebSocket, offers the key as the
//!   subprotocol `headroom.bearer.KEY` beside `headroom` (a header, so the key stays out
//!   of URLs and access logs). A refusal is HTTP 401.
//! - **Origins.** A WebSocket upgrade whose `Origin` is neither the server's own (its
//!   `Host`) nor an allowed one (`--allowed-origin`, `*` for any) is refused with 403.
//!   A client without an `Origin` header is not a browser and is not refused for it.
//! - **Sockets.** At most `--max-connections` WebSockets are open at once. When a new
//!   one finds them all taken, the one that has waited longest for its `session.start`
//!   is closed to make room; when none waits, the new one is closed at once. Both close
//!   with code 1013 (try again later) and a reason.
//!
//! Every refusal is counted in `/metrics` by reason, never with the key.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tokio::sync::Notify;

use crate::error::{Result, ServerError};
use crate::state::AppState;

/// The WebSocket subprotocol the viewer asks for (and the server selects).
pub const SUBPROTOCOL: &str = "headroom";

/// The prefix of the subprotocol that carries a key: `headroom.bearer.KEY`.
pub const KEY_SUBPROTOCOL_PREFIX: &str = "headroom.bearer.";

/// The WebSocket close code of a socket refused or closed for room (RFC 6455: try again
/// later).
pub const CLOSE_TRY_AGAIN_LATER: u16 = 1013;

/// Routes open to anyone: the viewer page (static, no data), liveness and readiness.
const OPEN_ROUTES: [&str; 3] = ["/", "/health", "/ready"];

/// Why the door turned a request away (the `reason` label of
/// `headroom_door_refusals_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoorRefusal {
    /// No key, or not a key of this server.
    Key,
    /// A WebSocket upgrade from an origin that is not allowed.
    Origin,
    /// A socket past `--max-connections` with none waiting for its start.
    Connections,
    /// A socket that waited for its `session.start` closed to make room for a new one.
    IdleEvicted,
}

impl DoorRefusal {
    /// Every refusal, in the order of their counters.
    pub const ALL: [DoorRefusal; 4] = [
        DoorRefusal::Key,
        DoorRefusal::Origin,
        DoorRefusal::Connections,
        DoorRefusal::IdleEvicted,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            DoorRefusal::Key => "key",
            DoorRefusal::Origin => "origin",
            DoorRefusal::Connections => "connections",
            DoorRefusal::IdleEvicted => "idle_evicted",
        }
    }

    /// Index into the counters.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Who the door lets in: the keys, the allowed origins and the socket cap.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DoorConfig {
    /// API keys, any of which opens the door (empty: no key needed, as before keys).
    pub api_keys: Vec<String>,
    /// Origins allowed to open WebSockets besides the server's own (`*`: any).
    pub allowed_origins: Vec<String>,
    /// WebSockets open at once, at most (`None`: four times the sessions and the queue).
    pub max_connections: Option<usize>,
}

impl DoorConfig {
    /// Checks the keys: each one non-empty and made of HTTP token characters, so it can
    /// travel as a subprotocol; the error names the field and the rule.
    pub fn validate(&self) -> Result<()> {
        for key in &self.api_keys {
            if key.is_empty() || !key.bytes().all(is_token_byte) {
                return Err(ServerError::request(
                    "api_key",
                    "must be non-empty and made of letters, digits and !#$%&'*+-.^_`|~ (it travels as an HTTP token)",
                ));
            }
        }
        if self.max_connections == Some(0) {
            return Err(ServerError::request(
                "max_connections",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// The socket cap for a server of `max_sessions` slots and a queue of `max_queue`.
    pub fn connection_cap(&self, max_sessions: usize, max_queue: usize) -> usize {
        self.max_connections
            .unwrap_or_else(|| 4 * (max_sessions + max_queue).max(1))
    }
}

/// An HTTP token character (RFC 9110 `tchar`).
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Whether `given` equals one of `keys`, in time that depends on the lengths only: every
/// key is compared whole, whatever byte differs first.
fn matches_a_key(given: &[u8], keys: &[String]) -> bool {
    let mut found = 0u8;
    for key in keys {
        let key = key.as_bytes();
        let mut diff = u8::from(key.len() != given.len());
        for (i, &k) in key.iter().enumerate() {
            diff |= k ^ given.get(i).copied().unwrap_or(0);
        }
        found |= u8::from(diff == 0);
    }
    found == 1
}

/// The key a request offers: `Authorization: Bearer KEY`, else a `headroom.bearer.KEY`
/// subprotocol.
fn offered_key(headers: &HeaderMap) -> Option<&[u8]> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    if let Some(token) = bearer {
        return Some(token.as_bytes());
    }
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| p.trim().strip_prefix(KEY_SUBPROTOCOL_PREFIX))
        .map(str::as_bytes)
}

/// Whether a WebSocket upgrade from `origin` may open here: no `Origin` (not a
/// browser), the server's own (`host`), or an allowed one.
fn origin_allowed(origin: Option<&str>, host: Option<&str>, allowed: &[String]) -> bool {
    let Some(origin) = origin else {
        return true;
    };
    if allowed
        .iter()
        .any(|a| a == "*" || a.eq_ignore_ascii_case(origin))
    {
        return true;
    }
    let authority = origin
        .split_once("://")
        .map_or(origin, |(_, rest)| rest)
        .trim_end_matches('/');
    host.is_some_and(|h| h.eq_ignore_ascii_case(authority))
}

/// The door as a middleware: refuses a request without a key (401) or an upgrade from
/// a foreign origin (403) before its route runs.
pub async fn guard(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let door = &state.config.door;
    let path = request.uri().path();
    let headers = request.headers();
    if !door.api_keys.is_empty() && !OPEN_ROUTES.contains(&path) {
        let ok = offered_key(headers).is_some_and(|k| matches_a_key(k, &door.api_keys));
        if !ok {
            state.metrics.door_refused(DoorRefusal::Key);
            let body = Json(serde_json::json!({
                "error": "unauthorized",
                "message": "this server needs an API key: send Authorization: Bearer KEY (a browser's WebSocket offers the subprotocol headroom.bearer.KEY)",
            }));
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                body,
            )
                .into_response();
        }
    }
    if headers.contains_key(header::UPGRADE) {
        let text = |name| {
            headers
                .get(name)
                .and_then(|v: &header::HeaderValue| v.to_str().ok())
        };
        if !origin_allowed(
            text(header::ORIGIN),
            text(header::HOST),
            &door.allowed_origins,
        ) {
            state.metrics.door_refused(DoorRefusal::Origin);
            let body = Json(serde_json::json!({
                "error": "forbidden_origin",
                "message": "WebSockets from this origin are not allowed: the server takes its own origin and those given with --allowed-origin",
            }));
            return (StatusCode::FORBIDDEN, body).into_response();
        }
    }
    next.run(request).await
}

/// The open WebSockets, and which of them still wait for their `session.start`.
#[derive(Debug)]
pub struct Sockets {
    cap: usize,
    inner: Mutex<Registry>,
}

#[derive(Debug, Default)]
struct Registry {
    next_id: u64,
    /// Sockets counted against the cap.
    open: usize,
    /// Sockets waiting for their start, oldest first, with what wakes them to leave.
    waiting: BTreeMap<u64, Arc<Eviction>>,
}

/// What a waiting socket hears when it must leave to make room.
#[derive(Debug, Default)]
struct Eviction {
    notify: Notify,
    /// Set once the socket no longer counts against the cap.
    out: AtomicBool,
}

impl Sockets {
    /// Room for `cap` sockets.
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            inner: Mutex::new(Registry::default()),
        }
    }

    /// The cap.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Sockets counted against the cap now.
    pub fn open(&self) -> usize {
        self.lock().open
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets a new socket in, waiting for its start: when the cap is reached the socket
    /// that has waited longest is told to leave (it no longer counts); `None` when every
    /// socket is past its start.
    pub fn enter(self: &Arc<Self>) -> Option<SocketPass> {
        let mut r = self.lock();
        if r.open >= self.cap {
            let (_, oldest) = r.waiting.pop_first()?;
            oldest.out.store(true, Ordering::Relaxed);
            oldest.notify.notify_one();
            r.open -= 1;
        }
        r.open += 1;
        r.next_id += 1;
        let id = r.next_id;
        let eviction = Arc::new(Eviction::default());
        r.waiting.insert(id, Arc::clone(&eviction));
        Some(SocketPass {
            id,
            sockets: Arc::clone(self),
            eviction,
        })
    }
}

/// A socket's place under the cap; dropping it gives the place back.
#[derive(Debug)]
pub struct SocketPass {
    id: u64,
    sockets: Arc<Sockets>,
    eviction: Arc<Eviction>,
}

impl SocketPass {
    /// The socket sent its start: it is no longer one to close for room.
    pub fn started(&self) {
        self.sockets.lock().waiting.remove(&self.id);
    }

    /// Resolves when the socket must leave to make room for a newer one.
    pub async fn evicted(&self) {
        self.eviction.notify.notified().await;
    }
}

impl Drop for SocketPass {
    fn drop(&mut self) {
        let mut r = self.sockets.lock();
        r.waiting.remove(&self.id);
        if !self.eviction.out.load(Ordering::Relaxed) {
            r.open -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(k: &[&str]) -> Vec<String> {
        k.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_key_matches_only_itself_whole() {
        let ks = keys(&["alpha-1", "beta_2"]);
        assert!(matches_a_key(b"alpha-1", &ks));
        assert!(matches_a_key(b"beta_2", &ks));
        assert!(!matches_a_key(b"alpha-", &ks));
        assert!(!matches_a_key(b"alpha-12", &ks));
        assert!(!matches_a_key(b"", &ks));
        assert!(!matches_a_key(b"alpha-1", &[]));
    }

    #[test]
    fn the_key_comes_from_the_bearer_header_or_the_subprotocol() {
        let mut h = HeaderMap::new();
        assert_eq!(offered_key(&h), None);
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            "headroom, headroom.bearer.k1".parse().unwrap(),
        );
        assert_eq!(offered_key(&h), Some(&b"k1"[..]));
        h.insert(header::AUTHORIZATION, "Bearer k2".parse().unwrap());
        assert_eq!(offered_key(&h), Some(&b"k2"[..]));
        h.insert(header::AUTHORIZATION, "Basic k2".parse().unwrap());
        assert_eq!(offered_key(&h), Some(&b"k1"[..]));
    }

    #[test]
    fn origins_are_the_servers_own_or_allowed() {
        let none: Vec<String> = Vec::new();
        let host = Some("127.0.0.1:8000");
        assert!(origin_allowed(None, host, &none));
        assert!(origin_allowed(Some("http://127.0.0.1:8000"), host, &none));
        assert!(!origin_allowed(Some("http://evil.example"), host, &none));
        assert!(!origin_allowed(Some("null"), host, &none));
        let allowed = keys(&["https://app.example"]);
        assert!(origin_allowed(Some("https://app.example"), host, &allowed));
        assert!(!origin_allowed(Some("http://app.example"), host, &allowed));
        assert!(origin_allowed(
            Some("http://evil.example"),
            host,
            &keys(&["*"])
        ));
    }

    #[test]
    fn keys_must_be_http_tokens() {
        let ok = DoorConfig {
            api_keys: keys(&["sk-abc.DEF_123~"]),
            ..DoorConfig::default()
        };
        assert!(ok.validate().is_ok());
        for bad in ["", "has space", "a/b", "x=y", "ünï"] {
            let err = DoorConfig {
                api_keys: keys(&[bad]),
                ..DoorConfig::default()
            }
            .validate()
            .unwrap_err();
            assert!(err.to_string().contains("api_key"), "{err}");
        }
    }

    #[test]
    fn a_full_house_closes_its_longest_waiting_socket_or_refuses() {
        let sockets = Arc::new(Sockets::new(2));
        let a = sockets.enter().unwrap();
        let b = sockets.enter().unwrap();
        b.started();
        // Full: `a` waits longest and makes room.
        let c = sockets.enter().unwrap();
        assert!(a.eviction.out.load(Ordering::Relaxed));
        assert_eq!(sockets.open(), 2);
        drop(a);
        assert_eq!(sockets.open(), 2);
        c.started();
        // Full, and nobody waits: refused.
        assert!(sockets.enter().is_none());
        drop(b);
        assert_eq!(sockets.open(), 1);
        let d = sockets.enter().unwrap();
        assert_eq!(sockets.open(), 2);
        drop((c, d));
        assert_eq!(sockets.open(), 0);
    }
}
