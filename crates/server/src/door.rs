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
//! - **Sockets** ([`crate::sockets`]). At most `--max-connections` WebSockets are open
//!   at once. When a new one finds them all taken, the one that has waited longest for
//!   its `session.start` is closed to make room; when none waits, the new one is closed
//!   at once. Both close with code 1013 (try again later) and a reason.
//!
//! Every refusal is counted in `/metrics` by reason, never with the key.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

pub use crate::config::DoorConfig;
pub use crate::refusal::DoorRefusal;
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
pub fn offered_key(headers: &HeaderMap) -> Option<&[u8]> {
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
}
