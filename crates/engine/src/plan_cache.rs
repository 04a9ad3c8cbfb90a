//! Plans of the `planned` allocator cached on disk (`--plan-cache DIR`), so a restarted
//! server or a second `generate` replays its first session from a plan instead of
//! meta-executing it again (minutes for a 14B mesh).
//!
//! One file per span key, `DIR/<sha256 of the key>.plan.json`: the format number, the
//! binary's version, the key itself, the SHA-256 of the plan's JSON and the plan. A file
//! is used only when all of them check; a file that does not parse, whose checksum or
//! key does not match (corrupt), or that another format or binary wrote (stale) is
//! deleted, counted and rebuilt. A plan only places bytes: whatever a file holds, the
//! allocator hands out an arena range only while it is free, so a bad plan costs
//! misses, never a byte of the output. A plan that stopped matching while it was
//! replayed (the allocator drops it and records the session again) is replaced on disk
//! by the re-recorded one at the key's next session.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use headroom_mem::Plan;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{EngineError, Result};

/// The file layout's number: a file of another is stale.
const FORMAT: u32 = 1;

/// The binary a plan file must come from (a new build may allocate in another order).
const VERSION: &str = concat!(env!("CARGO_PKG_NAME"), " ", env!("CARGO_PKG_VERSION"));

/// What the cache did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PlanCacheCounts {
    /// Plans read from disk and installed.
    pub hits: u64,
    /// Plans written.
    pub written: u64,
    /// Files deleted as corrupt.
    pub corrupt: u64,
    /// Files deleted as stale (another format or binary, or a plan that stopped
    /// matching its sessions).
    pub stale: u64,
    /// Plans that could not be written (the session went on without).
    pub write_failed: u64,
}

#[derive(Serialize, Deserialize)]
struct File {
    format: u32,
    version: String,
    key: String,
    checksum: String,
    plan: serde_json::Value,
}

/// A folder of plan files.
#[derive(Debug)]
pub struct PlanCache {
    dir: PathBuf,
    counts: Mutex<PlanCacheCounts>,
    /// Key → address of the plan last read or written for it (the allocator's copy is
    /// the same allocation while it keeps it).
    known: Mutex<HashMap<String, usize>>,
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What reading a key's file gave.
#[derive(Debug)]
pub(crate) enum Read {
    /// A plan that checks.
    Plan(Plan),
    /// No file.
    Missing,
    /// A file that was deleted, corrupt or stale.
    Discarded,
}

impl PlanCache {
    /// The cache in `dir` (made if missing; refused when it cannot be).
    pub fn new(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| {
            EngineError::request(
                "plan_cache",
                format!("{} cannot be made a folder: {e}", dir.display()),
            )
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
            counts: Mutex::default(),
            known: Mutex::default(),
        })
    }

    /// What the cache did so far.
    pub fn counts(&self) -> PlanCacheCounts {
        *self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count(&self, f: impl FnOnce(&mut PlanCacheCounts)) {
        f(&mut self.counts.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// The file of `key`.
    pub fn path(&self, key: &str) -> PathBuf {
        self.dir
            .join(format!("{}.plan.json", &sha256_hex(key.as_bytes())[..32]))
    }

    /// Reads `key`'s plan; a corrupt or stale file is deleted and counted.
    pub(crate) fn read(&self, key: &str) -> Read {
        let path = self.path(key);
        let Ok(bytes) = std::fs::read(&path) else {
            return Read::Missing;
        };
        let parsed: Option<File> = serde_json::from_slice(&bytes).ok();
        let verdict = match parsed {
            None => Err(false),
            Some(f) if f.format != FORMAT || f.version != VERSION => Err(true),
            Some(f) => {
                let plan_json = serde_json::to_vec(&f.plan).unwrap_or_default();
                let plan = (f.key == key && f.checksum == sha256_hex(&plan_json))
                    .then(|| serde_json::from_value::<Plan>(f.plan).ok())
                    .flatten();
                plan.ok_or(false)
            }
        };
        match verdict {
            Ok(plan) => {
                self.count(|c| c.hits += 1);
                Read::Plan(plan)
            }
            Err(stale) => {
                let _ = std::fs::remove_file(&path);
                self.count(|c| if stale { c.stale += 1 } else { c.corrupt += 1 });
                Read::Discarded
            }
        }
    }

    /// Writes `key`'s plan (whole or not at all: a temporary file renamed into place).
    pub(crate) fn write(&self, key: &str, plan: &Plan) -> Result<()> {
        let value = serde_json::to_value(plan)
            .map_err(|e| EngineError::request("plan_cache", format!("plan to JSON: {e}")))?;
        let checksum = sha256_hex(&serde_json::to_vec(&value).unwrap_or_default());
        let file = File {
            format: FORMAT,
            version: VERSION.to_string(),
            key: key.to_string(),
            checksum,
            plan: value,
        };
        let path = self.path(key);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let io = |e: std::io::Error| {
            EngineError::request("plan_cache", format!("{}: {e}", path.display()))
        };
        let text = serde_json::to_vec(&file)
            .map_err(|e| EngineError::request("plan_cache", format!("plan file: {e}")))?;
        std::fs::write(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)?;
        self.count(|c| c.written += 1);
        Ok(())
    }

    /// Remembers `plan` as what the file of `key` holds.
    pub(crate) fn remember(&self, key: &str, plan: &Plan) {
        self.known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_string(), plan as *const Plan as usize);
    }

    /// Whether `plan` is what the file of `key` holds (as far as this process knows).
    pub(crate) fn holds(&self, key: &str, plan: &Plan) -> bool {
        self.known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            == Some(&(plan as *const Plan as usize))
    }

    /// Brings the file of `key` in line with the allocator's plan for it: a plan the
    /// file does not hold is written, and when the allocator dropped its plan (it
    /// stopped matching a replayed session) the file is deleted.
    pub(crate) fn sync(&self, key: &str, allocator: &headroom_mem::CachingAllocator) {
        let book = allocator.plans();
        match book.get(key) {
            Some(plan) if !self.holds(key, plan) => match self.write(key, plan) {
                Ok(()) => self.remember(key, plan),
                Err(_) => self.count(|c| c.write_failed += 1),
            },
            Some(_) => {}
            None if !allocator.wants_plan(key) => self.discard(key),
            None => {}
        }
    }

    /// Installs the file's plan of `key` in `allocator` when it has none and the file
    /// checks (else the file is gone and counted).
    pub(crate) fn load_into(&self, key: &str, allocator: &headroom_mem::CachingAllocator) {
        if !allocator.wants_plan(key) {
            return;
        }
        if let Read::Plan(plan) = self.read(key) {
            let mut book = headroom_mem::PlanBook::default();
            book.insert(key, plan);
            allocator.install_plans(&book);
            if let Some(plan) = allocator.plans().get(key) {
                self.remember(key, plan);
            }
        }
    }

    /// Deletes the file of `key` (its plan stopped matching its sessions).
    pub(crate) fn discard(&self, key: &str) {
        self.known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        if std::fs::remove_file(self.path(key)).is_ok() {
            self.count(|c| c.stale += 1);
        }
    }
}
