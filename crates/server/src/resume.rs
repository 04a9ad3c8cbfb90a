//! Resume tokens and parked sessions: the server's book of sessions that can be picked
//! up again, in host memory and, with `--session-store DIR`, in a folder the replicas
//! share.
//!
//! A session gets a token (128 random bits, hex) in its `video.start`, bound to the API
//! key that opened it (a SHA-256 of the key; no key when the server has none). The book
//! keys entries by the token's SHA-256, so neither the book nor the store's file names
//! give a token away. A session is *parked* when its state leaves the device at a chunk
//! boundary (`session.pause`, a hang-up, a drain): its [`SessionSnapshot`] is held here
//! (or written to the store) with the original `session.start`, and a `session.start`
//! carrying the token claims it. A claim takes the entry away (a token is used once):
//! in memory under the book's lock, in the store by renaming the file to a name only
//! the claimer knows (a rename is atomic, so of two replicas racing one wins).
//! A hung-up session's entry expires after its window, in memory and in the store (the
//! server's sweep); a drained one stays in the store until claimed; a session that ends
//! for good leaves nothing. Files are written without the book's lock held.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use headroom_engine::SessionSnapshot;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::error::{Result, ServerError};

/// How long a claim waits for a running session to park (a client that reconnects
/// while its session finishes the chunk it was making).
const CLAIM_WAIT: Duration = Duration::from_secs(30);

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The SHA-256 of `bytes`, in hex.
pub fn digest(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// A new resume token: 128 random bits as 32 hex digits.
pub fn new_token() -> Result<String> {
    let mut bits = [0u8; 16];
    getrandom::fill(&mut bits)
        .map_err(|e| ServerError::Internal(format!("no random bits for a resume token: {e}")))?;
    Ok(hex(&bits))
}

/// Why a session was parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParkReason {
    /// The client sent `session.pause`.
    Pause,
    /// The client hung up inside a session that can resume.
    HangUp,
    /// The server is draining into its store.
    Drain,
}

/// A session in the book.
#[derive(Debug)]
enum Entry {
    /// Running on this replica (it parks here, or writes its periodic snapshots).
    Running,
    /// Parked in host memory.
    Parked {
        snapshot: Arc<SessionSnapshot>,
        expires: Option<Instant>,
    },
}

#[derive(Debug)]
struct Record {
    /// SHA-256 of the API key that opened the session (`None`: the server has no keys).
    key: Option<String>,
    /// The `session.start` the session was opened with.
    start: Map<String, Value>,
    entry: Entry,
}

/// What a claim gives: the session's snapshot and its original `session.start`.
#[derive(Debug)]
pub struct Claimed {
    /// The state to resume.
    pub snapshot: Arc<SessionSnapshot>,
    /// The `session.start` that opened it.
    pub start: Map<String, Value>,
}

/// The book of resumable sessions.
#[derive(Debug)]
pub struct ResumeBook {
    records: Mutex<HashMap<String, Record>>,
    /// The shared store, if any.
    store: Option<PathBuf>,
    /// How long a hung-up session stays parked in memory.
    window: Duration,
    /// Most bytes parked sessions may hold in host memory.
    max_parked: u64,
}

/// The store file of a session (by its token's digest), and its sidecar.
fn store_paths(store: &Path, id: &str) -> (PathBuf, PathBuf) {
    (
        store.join(format!("{id}.{}", headroom_engine::snapshot::EXTENSION)),
        store.join(format!("{id}.json")),
    )
}

fn refused(reason: impl Into<String>) -> ServerError {
    ServerError::ResumeRefused(reason.into())
}

impl ResumeBook {
    /// A book keeping hung-up sessions for `window`, with the store `store`.
    pub fn new(store: Option<PathBuf>, window: Duration) -> Self {
        Self::bounded(store, window, u64::MAX)
    }

    /// A book whose sessions parked in host memory hold at most `max_parked` bytes: past
    /// it a session parks in the store, or (without one) is not parked.
    pub fn bounded(store: Option<PathBuf>, window: Duration, max_parked: u64) -> Self {
        Self {
            records: Mutex::new(HashMap::new()),
            store,
            window,
            max_parked,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Record>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a running session under `token`, opened by `key` with `start`.
    pub fn running(&self, token: &str, key: Option<String>, start: Map<String, Value>) {
        self.lock().insert(
            digest(token.as_bytes()),
            Record {
                key,
                start,
                entry: Entry::Running,
            },
        );
    }

    /// Parks the session of token digest `id`: in host memory (`reason` says for how
    /// long), or in the store for a drain, a hang-up on a server with a store, or past
    /// the host memory cap. Returns the bytes held.
    pub fn park(
        &self,
        id: &str,
        snapshot: Arc<SessionSnapshot>,
        reason: ParkReason,
    ) -> Result<u64> {
        let bytes = snapshot.state_bytes();
        let (in_memory, owner) = {
            let records = self.lock();
            let Some(record) = records.get(id) else {
                return Err(ServerError::Internal("parking an unknown session".into()));
            };
            (
                parked_in(&records).1,
                (record.key.clone(), record.start.clone()),
            )
        };
        let over = in_memory.saturating_add(bytes) > self.max_parked;
        // A drain, and a hang-up on a server with a store, park in the store: the client
        // may come back through another replica, and the store's rename-claim is the
        // one place a token is used up. So does a session past the host memory cap.
        let to_store = reason == ParkReason::Drain || reason == ParkReason::HangUp || over;
        if let (true, Some(store)) = (to_store, self.store.as_deref()) {
            let expires =
                (reason == ParkReason::HangUp).then(|| unix_now() + self.window.as_secs());
            // Written without the book's lock (a claim meanwhile sees the session still
            // running and waits for it).
            write_store(store, id, &owner, &snapshot, expires)?;
            self.lock().remove(id);
            return Ok(bytes);
        }
        let mut records = self.lock();
        if reason == ParkReason::Drain {
            return Err(ServerError::Internal(
                "a drain parks only into a store".into(),
            ));
        }
        if over {
            records.remove(id);
            return Err(ServerError::capacity(
                crate::refusal::Refusal::Memory,
                format!(
                    "parked sessions hold {in_memory} B of host memory and this one needs {bytes} B more, past --max-parked-bytes {}; give the server a --session-store to park past it",
                    self.max_parked
                ),
            ));
        }
        let Some(record) = records.get_mut(id) else {
            return Err(ServerError::Internal("parking an unknown session".into()));
        };
        record.entry = Entry::Parked {
            snapshot,
            expires: (reason == ParkReason::HangUp).then(|| Instant::now() + self.window),
        };
        Ok(bytes)
    }

    /// Writes the running session `id`'s periodic snapshot to the store (a crash loses
    /// at most the chunks since).
    pub fn checkpoint(&self, id: &str, snapshot: &SessionSnapshot) -> Result<()> {
        let Some(store) = self.store.as_deref() else {
            return Ok(());
        };
        let owner = match self.lock().get(id) {
            Some(record) => (record.key.clone(), record.start.clone()),
            None => return Ok(()),
        };
        // Written without the book's lock: a large snapshot takes a while.
        write_store(store, id, &owner, snapshot, None)
    }

    /// Starts the resume window of a paused session `id` whose client hung up.
    pub fn hung_up(&self, id: &str) {
        if let Some(Record {
            entry: Entry::Parked { expires, .. },
            ..
        }) = self.lock().get_mut(id)
        {
            *expires = Some(Instant::now() + self.window);
        }
    }

    /// Forgets session `id` (it ended for good), its store files too.
    pub fn forget(&self, id: &str) {
        self.lock().remove(id);
        self.remove_stored(id);
    }

    fn remove_stored(&self, id: &str) {
        if let Some(store) = &self.store {
            let (snap, side) = store_paths(store, id);
            let _ = std::fs::remove_file(snap);
            let _ = std::fs::remove_file(side);
        }
    }

    /// Drops parked sessions past their window; returns how many went.
    pub fn expire(&self) -> usize {
        let now = Instant::now();
        let mut records = self.lock();
        let before = records.len();
        records
            .retain(|_, r| !matches!(r.entry, Entry::Parked { expires: Some(t), .. } if t <= now));
        before - records.len()
    }

    /// Drops what is past its window: parked sessions in host memory, and hung-up
    /// sessions in the store (by their record's `expires_unix`).
    pub fn sweep(&self) {
        self.expire();
        let Some(store) = &self.store else { return };
        let Ok(entries) = std::fs::read_dir(store) else {
            return;
        };
        let now = unix_now();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let expired = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .and_then(|v| v["expires_unix"].as_u64())
                .is_some_and(|t| t <= now);
            if expired {
                if let Some(id) = path.file_stem().and_then(|s| s.to_str()) {
                    self.remove_stored(id);
                }
            }
        }
    }

    /// Moves the session parked in host memory under `id` into the store (a draining
    /// server's paused sessions); returns the chunk it resumes at, `None` when there is
    /// no store or no such session.
    pub fn move_to_store(&self, id: &str) -> Option<usize> {
        let store = self.store.as_deref()?;
        // Taken out of reach (running, as claims see it) while it is written without
        // the book's lock; put back parked when the write fails.
        let (owner, parked) = {
            let mut records = self.lock();
            let record = records.get_mut(id)?;
            if !matches!(record.entry, Entry::Parked { .. }) {
                return None;
            }
            let parked = std::mem::replace(&mut record.entry, Entry::Running);
            ((record.key.clone(), record.start.clone()), parked)
        };
        let Entry::Parked { snapshot, .. } = &parked else {
            unreachable!("taken as parked")
        };
        let next = snapshot.progress.chunks_done;
        let written = write_store(store, id, &owner, snapshot, None);
        let mut records = self.lock();
        match written {
            Ok(()) => {
                records.remove(id);
                Some(next)
            }
            Err(e) => {
                tracing::warn!(error = %e, "a paused session could not move to the store");
                if let Some(record) = records.get_mut(id) {
                    record.entry = parked;
                }
                None
            }
        }
    }

    /// Parked sessions in host memory and the bytes they hold (none of it on the device).
    pub fn parked(&self) -> (usize, u64) {
        self.expire();
        parked_in(&self.lock())
    }

    /// Claims the session of `token` for a client offering key digest `key`: from host
    /// memory (waiting for a running one to park, as after a hang-up), else from the
    /// store. Refused, naming why, when the token is unknown or used, or the key is not
    /// the one that opened it.
    pub async fn claim(&self, token: &str, key: Option<&str>) -> Result<Claimed> {
        let id = digest(token.as_bytes());
        let until = Instant::now() + CLAIM_WAIT;
        loop {
            {
                self.expire();
                let mut records = self.lock();
                match records.get(&id) {
                    Some(r) if r.key.as_deref() != key => {
                        return Err(refused(
                            "this resume token belongs to a session opened with another API key",
                        ))
                    }
                    Some(Record {
                        entry: Entry::Parked { .. },
                        ..
                    }) => {
                        let Some(Record {
                            start,
                            entry: Entry::Parked { snapshot, .. },
                            ..
                        }) = records.remove(&id)
                        else {
                            unreachable!("matched as parked")
                        };
                        drop(records);
                        // A periodic snapshot of it in the store is stale now.
                        self.remove_stored(&id);
                        return Ok(Claimed { snapshot, start });
                    }
                    Some(_) if Instant::now() < until => {}
                    Some(_) => return Err(refused("the session is still running")),
                    None => break,
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        match &self.store {
            Some(store) => claim_from_store(store, &id, key),
            None => Err(refused(
                "no session is parked under this resume token (unknown, used, or past its --resume-window)",
            )),
        }
    }
}

/// Seconds since the Unix epoch.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The sidecar beside a stored snapshot: who may claim it, how it was started, and
/// when a hung-up session's window ends (Unix seconds; none for a drain).
fn sidecar((key, start): &Owner, expires: Option<u64>) -> Value {
    serde_json::json!({ "key": key, "start": start, "expires_unix": expires })
}

/// Who may claim a session (its key's digest) and the `session.start` it came with.
type Owner = (Option<String>, Map<String, Value>);

/// Sessions parked in host memory among `records`, and the bytes they hold.
fn parked_in(records: &HashMap<String, Record>) -> (usize, u64) {
    records
        .values()
        .filter_map(|r| match &r.entry {
            Entry::Parked { snapshot, .. } => Some(snapshot.state_bytes()),
            Entry::Running => None,
        })
        .fold((0, 0), |(n, b), x| (n + 1, b + x))
}

fn write_store(
    store: &Path,
    id: &str,
    owner: &Owner,
    snapshot: &SessionSnapshot,
    expires: Option<u64>,
) -> Result<()> {
    let (snap, side) = store_paths(store, id);
    let io = |e: headroom_engine::EngineError| ServerError::Internal(e.to_string());
    // The sidecar first: a snapshot file is never without its owner's key.
    let side_bytes = serde_json::to_vec(&sidecar(owner, expires))
        .map_err(|e| ServerError::Internal(e.to_string()))?;
    headroom_engine::snapshot::format::write_atomic(&side, &side_bytes).map_err(io)?;
    if let Err(e) = snapshot.write(&snap) {
        // No snapshot beside it (a first write failed): the sidecar goes too.
        if !snap.exists() {
            let _ = std::fs::remove_file(&side);
        }
        return Err(io(e));
    }
    Ok(())
}

fn claim_from_store(store: &Path, id: &str, key: Option<&str>) -> Result<Claimed> {
    let (snap, side) = store_paths(store, id);
    let unknown =
        || refused("no session is parked under this resume token (unknown, or already resumed)");
    let side_bytes = std::fs::read(&side).map_err(|_| unknown())?;
    let side_json: Value = serde_json::from_slice(&side_bytes)
        .map_err(|e| refused(format!("the store's record is not JSON: {e}")))?;
    if side_json["expires_unix"]
        .as_u64()
        .is_some_and(|t| t <= unix_now())
    {
        let _ = std::fs::remove_file(&snap);
        let _ = std::fs::remove_file(&side);
        return Err(refused("the session's --resume-window has passed"));
    }
    if side_json["key"].as_str() != key {
        return Err(refused(
            "this resume token belongs to a session opened with another API key",
        ));
    }
    // The rename claims it: of two claimers, one finds the file gone.
    let mine = store.join(format!(
        ".{id}.claimed-{}-{}",
        std::process::id(),
        new_token()?
    ));
    std::fs::rename(&snap, &mine).map_err(|_| unknown())?;
    let _ = std::fs::remove_file(&side);
    let read = SessionSnapshot::read(&mine);
    let _ = std::fs::remove_file(&mine);
    let snapshot = read.map_err(|e| refused(e.to_string()))?;
    let start = side_json["start"]
        .as_object()
        .cloned()
        .ok_or_else(|| refused("the store's record has no session.start"))?;
    Ok(Claimed {
        snapshot: Arc::new(snapshot),
        start,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_128_random_bits() {
        let a = new_token().unwrap();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, new_token().unwrap());
    }

    #[tokio::test]
    async fn an_unknown_token_or_another_key_is_refused() {
        let book = ResumeBook::new(None, Duration::from_secs(60));
        let e = book.claim("00", None).await.unwrap_err();
        assert_eq!(e.code(), "resume_refused");
        book.running("t", Some(digest(b"k1")), Map::new());
        let e = book.claim("t", Some(&digest(b"k2"))).await.unwrap_err();
        assert!(e.to_string().contains("another API key"), "{e}");
    }
}
