//! The cap on open WebSockets (`--max-connections`): each socket holds a pass while it
//! is open. When a new socket finds every place taken, the socket that has waited
//! longest for its `session.start` is told to leave, and the new one takes its place;
//! when every socket is past its start, the new one is turned away.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

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
