//! Replicas of `headroom serve` behind HAProxy (`deploy/haproxy.cfg`), for the tests
//! that run several servers behind one address.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free loopback port (bound, then released for the child to take).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One `headroom serve` replica, killed when dropped.
pub struct Replica {
    pub child: Child,
    pub addr: String,
    /// The key its requests carry, if it has one.
    key: Option<String>,
}

impl Replica {
    /// `headroom serve ARGS --port P` (with `--api-key KEY` when given), once it listens.
    pub fn start(args: &[&str], key: Option<&str>) -> Self {
        let port = free_port().to_string();
        let mut command = Command::new(env!("CARGO_BIN_EXE_headroom"));
        command.arg("serve").args(args).args(["--port", &port]);
        if let Some(k) = key {
            command.args(["--api-key", k]);
        }
        let mut child = command
            .stderr(Stdio::piped())
            .spawn()
            .expect("the headroom binary runs");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while stderr.read_line(&mut line).unwrap() > 0 {
            if line.contains("listening on http://") {
                break;
            }
            line.clear();
        }
        // Keep reading its log so the pipe never fills.
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = stderr.read_to_string(&mut rest);
        });
        Self {
            child,
            addr: format!("127.0.0.1:{port}"),
            key: key.map(str::to_string),
        }
    }

    /// `(status, body)` of a request to this replica (status 0: it did not answer).
    pub fn request(&self, method: &str, path: &str) -> (u16, String) {
        let Ok(mut stream) = TcpStream::connect(&self.addr) else {
            return (0, String::new());
        };
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let auth = self
            .key
            .as_deref()
            .map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
        let addr = &self.addr;
        let _ = write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let mut raw = String::new();
        let _ = stream.read_to_string(&mut raw);
        let status = raw.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        let body = raw
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        (status, body)
    }

    /// The value of the metric line starting with `name ` in `/metrics` (0 if absent).
    pub fn metric(&self, name: &str) -> f64 {
        let (_, m) = self.request("GET", "/metrics");
        m.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// HAProxy on deploy/haproxy.cfg in front of `replicas`, at the address returned;
/// `None` (the reason printed, or a failure where HAProxy is required) without it.
pub fn haproxy(replicas: &[Replica]) -> Option<(Child, String)> {
    let bind = format!("127.0.0.1:{}", free_port());
    let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/haproxy.cfg");
    let mut command = Command::new("haproxy");
    command
        .args(["-db", "-f"])
        .arg(&config)
        .env("HEADROOM_LB_BIND", &bind)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (i, r) in replicas.iter().enumerate() {
        command.env(format!("HEADROOM_R{}", i + 1), &r.addr);
    }
    let child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            headroom_mem::required::missing(
                "haproxy",
                &format!("cannot run haproxy: {e}"),
                "apt-get install haproxy",
            );
            return None;
        }
    };
    // Up once its frontend answers.
    let start = Instant::now();
    while TcpStream::connect(&bind).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "haproxy never listened"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Some((child, bind))
}
