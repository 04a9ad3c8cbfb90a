//! The web viewer in a real browser: headless Chromium (Debian's `chromium`) opens
//! `GET /`, the page starts a session on the `tiny` model, plays it through MediaSource,
//! and a held key steers it; with the only slot taken, the page shows that it waits for a
//! free slot and then streams, drawing the memory chart with phase marks. The tests read
//! the page over the DevTools protocol and save screenshots to `$CARGO_TARGET_TMPDIR`.
//!
//! Skipped (with a note) where no `chromium` binary is installed, and failed instead
//! where Chromium is required (`CI=true`, `HEADROOM_REQUIRE_CHROMIUM=1`).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use futures_util::{SinkExt, StreamExt};
use headroom_engine::EngineConfig;
use headroom_server::{Server, ServerConfig};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

/// Guard against a hang; never an assertion about speed.
const GUARD: Duration = Duration::from_secs(180);

/// The Chromium binary, or `None` after saying it is missing (a failure where Chromium
/// is required).
fn chromium() -> Option<&'static str> {
    let found = ["chromium", "chromium-browser"].into_iter().find(|b| {
        Command::new(b)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if found.is_none() {
        headroom_mem::required::missing(
            "chromium",
            "no chromium binary on PATH",
            "Debian: apt-get install chromium",
        );
    }
    found
}

/// A GET that reads exactly the body its `Content-Length` announces (Chromium's DevTools
/// server keeps the connection open).
async fn http_get(addr: &str, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "connection closed before the body");
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .expect("a Content-Length header");
            if body.len() >= length {
                return body[..length].to_string();
            }
        }
    }
}

/// A DevTools-protocol connection to one page.
struct Page {
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    next_id: u64,
}

impl Page {
    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let msg = json!({"id": id, "method": method, "params": params});
        self.ws.send(Message::text(msg.to_string())).await.unwrap();
        loop {
            let Some(Ok(Message::Text(text))) = self.ws.next().await else {
                panic!("DevTools connection closed during {method}");
            };
            let v: Value = serde_json::from_str(text.as_str()).unwrap();
            if v["id"] == id {
                return v["result"].clone();
            }
        }
    }

    async fn eval(&mut self, expression: &str) -> Value {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true}),
            )
            .await;
        r["result"]["value"].clone()
    }

    async fn key(&mut self, kind: &str, key: &str) {
        let code = format!("Key{}", key.to_ascii_uppercase());
        self.call(
            "Input.dispatchKeyEvent",
            json!({"type": kind, "key": key, "text": key, "code": code}),
        )
        .await;
    }
}

/// A server on the `tiny` model, serving on a free port until `stop` fires.
struct Serving {
    addr: String,
    server: Server,
    stop: tokio::sync::oneshot::Sender<()>,
    serving: tokio::task::JoinHandle<headroom_server::Result<()>>,
}

async fn serve(config: ServerConfig) -> Serving {
    let engine = EngineConfig {
        model: "tiny".to_string(),
        ..EngineConfig::default()
    };
    let config = ServerConfig {
        model_name: "tiny".to_string(),
        ..config
    };
    let server = Server::new(engine, config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.clone().serve(listener, async {
        let _ = stopped.await;
    }));
    Serving {
        addr,
        server,
        stop,
        serving,
    }
}

/// Starts headless `browser` on `url`; returns the process, its DevTools address and the
/// profile folder (removed on drop).
async fn launch(browser: &str, url: &str) -> (std::process::Child, String, tempfile::TempDir) {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(browser)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--autoplay-policy=no-user-gesture-required",
            "--window-size=1280,800",
            "--remote-debugging-port=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(url)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Chromium prints "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/…".
    let stderr = child.stderr.take().unwrap();
    let devtools = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stderr).lines();
        let port = lines.by_ref().find_map(|line| {
            let line = line.ok()?;
            let rest = line.split("DevTools listening on ws://").nth(1)?;
            Some(rest.split('/').next()?.to_string())
        });
        // Keep draining so Chromium never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        port
    })
    .await
    .unwrap()
    .expect("chromium announces its DevTools port");

    (child, devtools, profile)
}

/// The page target's DevTools connection.
async fn page(devtools: &str) -> Page {
    let pages: Value = serde_json::from_str(&http_get(devtools, "/json/list").await).unwrap();
    let page_ws = pages
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "page")
        .and_then(|p| p["webSocketDebuggerUrl"].as_str())
        .expect("a page target")
        .to_string();
    let (ws, _) = tokio_tungstenite::connect_async(page_ws).await.unwrap();
    Page { ws, next_id: 0 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_viewer_plays_a_tiny_session_until_stopped_in_headless_chromium_and_steers_it() {
    let Some(browser) = chromium() else {
        return;
    };
    let Serving {
        addr,
        stop,
        serving,
        ..
    } = serve(ServerConfig::default()).await;

    // No frames: the viewer's default, a session played until Stop is pressed.
    let url = format!("http://{addr}/?autostart=1&seed=3&width=96&height=64");
    let (mut child, devtools, _profile) = launch(browser, &url).await;
    let result = tokio::time::timeout(GUARD, async {
        let mut page = page(&devtools).await;
        let probe = "JSON.stringify({state: document.getElementById('state')?.textContent ?? '', \
                     chunks: parseInt(document.getElementById('chunks')?.textContent ?? '0'), \
                     played: document.getElementById('video')?.currentTime ?? 0, \
                     log: document.getElementById('log')?.innerText ?? ''})";
        let (mut pressed, mut released, mut stopped) = (false, false, false);
        let mut seen = Value::Null;
        let last = loop {
            let v: Value = match page.eval(probe).await.as_str() {
                Some(s) => serde_json::from_str(s).unwrap(),
                None => Value::Null,
            };
            if v["state"] != seen {
                eprintln!(
                    "page: {} (chunk {}, played {} s)",
                    v["state"], v["chunks"], v["played"]
                );
                seen = v["state"].clone();
            }
            let chunks = v["chunks"].as_u64().unwrap_or(0);
            let state = v["state"].as_str().unwrap_or_default();
            // Hold W as soon as the session started: it applies at a later chunk boundary.
            if !pressed && state.starts_with("playing until stopped") {
                pressed = true;
                page.key("keyDown", "w").await;
            }
            if pressed && !released && chunks >= 4 {
                released = true;
                page.key("keyUp", "w").await;
            }
            if released && !stopped && chunks >= 8 {
                stopped = true;
                page.eval("document.getElementById('stop').click()").await;
            }
            assert!(!state.starts_with("error"), "{v}");
            assert!(
                state != "done",
                "a session played until stopped ended by itself: {v}"
            );
            if state == "stopped" && v["played"].as_f64().unwrap_or(0.0) > 0.0 {
                break v;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let shot = page
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap();
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("viewer.png");
        std::fs::write(&path, png).unwrap();
        eprintln!("screenshot: {}", path.display());
        last
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    let last = result.expect("the page never reported a finished, played session");
    let log = last["log"].as_str().unwrap();
    assert!(log.contains("chunks (stopped)"), "{log}");
    assert!(
        log.contains("applies key-1"),
        "the held key steered a chunk: {log}"
    );
    assert!(
        last["played"].as_f64().unwrap() > 0.0,
        "frames played: {last}"
    );
    let _ = stop.send(());
    serving.await.unwrap().unwrap();
}

/// Reads a WebSocket until `session.done` (or the end of the stream).
async fn read_to_done(
    ws: &mut tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
) -> Option<Value> {
    while let Some(Ok(message)) = ws.next().await {
        if let Message::Text(text) = message {
            let v: Value = serde_json::from_str(text.as_str()).unwrap();
            if v["type"] == "session.done" {
                return Some(v);
            }
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_viewer_shows_it_waits_for_a_free_slot_then_charts_memory_with_phase_marks() {
    let Some(browser) = chromium() else {
        return;
    };
    let Serving {
        addr,
        stop,
        serving,
        ..
    } = serve(ServerConfig::default()).await;
    // A client of the test's own holds the only slot with a long, large session.
    let (mut holder, _) =
        tokio_tungstenite::connect_async(format!("ws://{addr}/v1/realtime/video"))
            .await
            .unwrap();
    let start = json!({"type": "session.start", "width": 256, "height": 160, "num_frames": 117});
    holder.send(Message::text(start.to_string())).await.unwrap();
    loop {
        let Some(Ok(Message::Text(text))) = holder.next().await else {
            panic!("the holder's session never started");
        };
        if text.as_str().contains("video.start") {
            break;
        }
    }

    let url = format!("http://{addr}/?autostart=1&frames=21&seed=2&width=96&height=64");
    let (mut child, devtools, _profile) = launch(browser, &url).await;
    let probe = "JSON.stringify({state: document.getElementById('state')?.textContent ?? '', \
                 samples: window.chart ? chart.samples.length : 0, \
                 denoise: window.chart ? chart.marks.filter(m => m.kind === 'denoise_end').length : 0, \
                 decode: window.chart ? chart.marks.filter(m => m.kind === 'decode_end').length : 0, \
                 painted: (() => { const c = document.getElementById('chart'); if (!c) return 0; \
                   const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0; \
                   for (let i = 0; i < d.length; i += 4) if (d[i] > 40 || d[i + 1] > 40 || d[i + 2] > 40) n++; \
                   return n; })()})";
    let result = tokio::time::timeout(GUARD, async {
        let mut page = page(&devtools).await;
        let read = |v: Value| -> Value {
            v.as_str()
                .map(|s| serde_json::from_str(s).unwrap())
                .unwrap_or(Value::Null)
        };
        let queued = loop {
            let v = read(page.eval(probe).await);
            let state = v["state"].as_str().unwrap_or_default().to_string();
            assert!(!state.starts_with("error"), "{v}");
            if state.starts_with("waiting") {
                break state;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let shot = page
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap();
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("viewer-queued.png");
        std::fs::write(&path, png).unwrap();
        // The holder stops: its chunk ends within a step and the page is admitted.
        holder
            .send(Message::text(json!({"type": "session.stop"}).to_string()))
            .await
            .unwrap();
        let held = read_to_done(&mut holder).await.expect("the holder's done");
        assert_eq!(held["stopped"], true, "{held}");
        let last = loop {
            let v = read(page.eval(probe).await);
            let state = v["state"].as_str().unwrap_or_default();
            assert!(!state.starts_with("error"), "{v}");
            if state == "done" && v["decode"].as_u64() == Some(2) {
                break v;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let shot = page
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap();
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("viewer-chart.png");
        std::fs::write(&path, png).unwrap();
        eprintln!("screenshots: {}", path.display());
        (queued, last)
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    let (queued, last) =
        result.expect("the page never showed the queue and then a finished session");
    assert_eq!(queued, "waiting for a free slot, 0 ahead");
    assert!(last["samples"].as_u64().unwrap() > 0, "{last}");
    assert_eq!(last["denoise"], 2, "a denoise-end mark per chunk: {last}");
    assert!(
        last["painted"].as_u64().unwrap() > 500,
        "the chart is drawn: {last}"
    );
    let _ = stop.send(());
    serving.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_viewer_plays_with_an_api_key_typed_into_it() {
    let Some(browser) = chromium() else {
        return;
    };
    let Serving {
        addr,
        stop,
        serving,
        server,
    } = serve(ServerConfig {
        door: headroom_server::DoorConfig {
            api_keys: vec!["viewer-key_1".to_string()],
            ..headroom_server::DoorConfig::default()
        },
        ..ServerConfig::default()
    })
    .await;
    let url = format!("http://{addr}/?frames=21&seed=4&width=96&height=64");
    let (mut child, devtools, _profile) = launch(browser, &url).await;
    let probe = "JSON.stringify({state: document.getElementById('state')?.textContent ?? '', \
                 ready: document.getElementById('ready')?.textContent ?? '', \
                 asks: (document.getElementById('keyrow')?.style.display ?? 'none') !== 'none', \
                 played: document.getElementById('video')?.currentTime ?? 0})";
    let result = tokio::time::timeout(GUARD, async {
        let mut page = page(&devtools).await;
        let read = |v: Value| -> Value {
            v.as_str()
                .map(|s| serde_json::from_str(s).unwrap())
                .unwrap_or(Value::Null)
        };
        // The page finds /stats closed and asks for the key.
        loop {
            let v = read(page.eval(probe).await);
            if v["asks"] == true {
                assert_eq!(v["ready"], "this server needs an API key", "{v}");
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        page.eval(
            "document.getElementById('key').value = 'viewer-key_1'; \
             document.getElementById('start').click()",
        )
        .await;
        loop {
            let v = read(page.eval(probe).await);
            let state = v["state"].as_str().unwrap_or_default();
            assert!(!state.starts_with("error"), "{v}");
            // While its session runs the one slot is taken (not ready); once it is
            // done the page's next look at /stats says ready again.
            let ready = v["ready"].as_str().unwrap_or_default().starts_with("ready");
            if state == "done" && v["played"].as_f64().unwrap_or(0.0) > 0.0 && ready {
                break v;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    let last = result.expect("the page never played a session with its key");
    assert!(
        last["ready"].as_str().unwrap().starts_with("ready"),
        "{last}"
    );
    // The key went as a header and a subprotocol only: no refusal was counted after it.
    let metrics = server.metrics();
    assert_eq!(
        metrics
            .sessions_completed
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    let _ = stop.send(());
    serving.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_viewer_plays_at_the_live_edge_and_shows_key_to_display() {
    let Some(browser) = chromium() else {
        return;
    };
    let Serving {
        addr,
        stop,
        serving,
        ..
    } = serve(ServerConfig::default()).await;
    // Open-ended and paced (the viewer's sessions are): chunks leave their lead
    // (0.375 s) before they play, 12 frames (0.75 s) each.
    let url = format!("http://{addr}/?autostart=1&seed=4&width=96&height=64&fps=16");
    let (mut child, devtools, _profile) = launch(browser, &url).await;
    let probe = "JSON.stringify({state: document.getElementById('state')?.textContent ?? '', \
                 chunks: parseInt(document.getElementById('chunks')?.textContent ?? '0'), \
                 duration: String(window.live ? live.duration : ''), \
                 delays: window.live ? live.delays : [], \
                 k2d: window.live ? live.keyToDisplay : [], \
                 seeks: window.live ? live.seeks : -1, \
                 shown: document.getElementById('k2d')?.textContent ?? ''})";
    let result = tokio::time::timeout(GUARD, async {
        let mut page = page(&devtools).await;
        let (mut pressed, mut released) = (false, false);
        loop {
            let v: Value = page
                .eval(probe)
                .await
                .as_str()
                .map(|s| serde_json::from_str(s).unwrap())
                .unwrap_or(Value::Null);
            let state = v["state"].as_str().unwrap_or_default();
            assert!(!state.starts_with("error"), "{v}");
            let chunks = v["chunks"].as_u64().unwrap_or(0);
            if !pressed && chunks >= 3 {
                pressed = true;
                page.key("keyDown", "d").await;
            }
            if pressed && !released && chunks >= 5 {
                released = true;
                page.key("keyUp", "d").await;
            }
            let keys = v["k2d"].as_array().map_or(0, Vec::len);
            if released && chunks >= 12 && keys >= 2 {
                page.eval("document.getElementById('stop').click()").await;
                break v;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    let v = result.expect("the page never played 12 chunks with two keys shown");
    assert_eq!(v["duration"], "Infinity", "live mode: no duration");
    // Behind the newest appended frame, once playing: at most the lead and the chunk
    // that just arrived (the page corrects anything past a second more).
    let delays: Vec<f64> = v["delays"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    let steady = &delays[delays.len() / 3..];
    let mut sorted = steady.to_vec();
    sorted.sort_by(f64::total_cmp);
    let pick = |p: f64| sorted[((sorted.len() - 1) as f64 * p).round() as usize];
    eprintln!(
        "behind the live edge: p50 {:.3} s, p95 {:.3} s, max {:.3} s over {} samples; key to display {:?}",
        pick(0.5),
        pick(0.95),
        pick(1.0),
        sorted.len(),
        v["k2d"]
    );
    assert!(!sorted.is_empty(), "{v}");
    assert!(pick(1.0) <= 0.375 + 0.75 + 1.0, "{sorted:?}");
    assert!(
        pick(0.5) >= 0.375 - 0.1,
        "the page keeps the lead: {sorted:?}"
    );
    assert_eq!(v["seeks"], 0, "a paced stream never falls a second behind");
    let k2d: Vec<f64> = v["k2d"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    assert!(k2d.iter().all(|&s| s > 0.0), "{k2d:?}");
    assert!(v["shown"].as_str().unwrap().contains(" s (key-"), "{v}");
    let _ = stop.send(());
    serving.await.unwrap().unwrap();
}
