//! The files a run writes (video, latents, trace): each is checked writable before any
//! work, written under a temporary name beside its target and renamed into place only
//! when the whole run succeeded. A failed run, or one stopped by SIGINT or SIGTERM,
//! removes what it wrote, so nothing half-written is ever left behind.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use anyhow::{bail, Context, Result};

/// The partial outputs alive in this process: what a signal removes.
static PARTIALS: Mutex<Vec<(PathBuf, bool)>> = Mutex::new(Vec::new());
/// Chunks finished so far and in all, for the message a signal prints.
static CHUNKS_DONE: AtomicUsize = AtomicUsize::new(0);
static CHUNKS_TOTAL: AtomicUsize = AtomicUsize::new(0);

fn partials() -> MutexGuard<'static, Vec<(PathBuf, bool)>> {
    // A panic elsewhere while holding the lock leaves the list itself intact.
    PARTIALS.lock().unwrap_or_else(|p| p.into_inner())
}

fn remove(path: &Path, dir: bool) {
    let _ = if dir {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
}

/// One output of a run: its target and the partial name it is written under.
#[derive(Debug)]
pub struct Output {
    field: &'static str,
    target: PathBuf,
    partial: PathBuf,
    dir: bool,
    committed: bool,
}

impl Output {
    /// A file output for the flag `field` (e.g. `--out`): refused unless its folder
    /// exists and a file can be created in it, and unless the target is not a folder.
    pub fn file(field: &'static str, target: &Path) -> Result<Self> {
        Self::checked(field, target, false)
    }

    /// A folder output (PNG frames): refused when the target is a file or its parent
    /// cannot take a new folder.
    pub fn dir(field: &'static str, target: &Path) -> Result<Self> {
        Self::checked(field, target, true)
    }

    fn checked(field: &'static str, target: &Path, dir: bool) -> Result<Self> {
        if !dir && target.is_dir() {
            bail!(
                "{field} {}: is a folder; give a file name",
                target.display()
            );
        }
        if dir && target.exists() && !target.is_dir() {
            bail!("{field} {}: exists and is not a folder", target.display());
        }
        let Some(name) = target.file_name().and_then(|n| n.to_str()) else {
            bail!(
                "{field} {}: must end in a file or folder name",
                target.display()
            );
        };
        let folder = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        if !folder.is_dir() {
            bail!(
                "{field} {}: the folder {} does not exist",
                target.display(),
                folder.display()
            );
        }
        let partial = folder.join(format!(".{name}.partial-{}", std::process::id()));
        // Probe the folder with the partial name itself, then leave nothing there until
        // the run writes (nothing exists while the weights load).
        let probe = if dir {
            std::fs::create_dir(&partial)
        } else {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&partial)
                .map(drop)
        };
        probe.with_context(|| {
            format!(
                "{field} {}: cannot create a {} in {}",
                target.display(),
                if dir { "folder" } else { "file" },
                folder.display()
            )
        })?;
        remove(&partial, dir);
        Ok(Self {
            field,
            target: target.to_path_buf(),
            partial,
            dir,
            committed: false,
        })
    }

    /// The path the run writes to until the output is committed; from now on a failure
    /// or a signal removes it.
    pub fn open(&self) -> &Path {
        let mut list = partials();
        if !list.iter().any(|(p, _)| p == &self.partial) {
            list.push((self.partial.clone(), self.dir));
        }
        &self.partial
    }

    /// The path the output ends at.
    pub fn target(&self) -> &Path {
        &self.target
    }

    fn commit_locked(&mut self, list: &mut Vec<(PathBuf, bool)>) -> Result<()> {
        if !self.partial.exists() {
            // Never opened (e.g. no --trace): nothing to move.
            self.committed = true;
            return Ok(());
        }
        if self.dir && self.target.is_dir() {
            // Frames into an existing folder: each file moves in, replacing its namesake.
            for entry in std::fs::read_dir(&self.partial)? {
                let entry = entry?;
                std::fs::rename(entry.path(), self.target.join(entry.file_name()))?;
            }
            std::fs::remove_dir(&self.partial)?;
        } else {
            std::fs::rename(&self.partial, &self.target).with_context(|| {
                format!(
                    "{} {}: cannot move it into place",
                    self.field,
                    self.target.display()
                )
            })?;
        }
        list.retain(|(p, _)| p != &self.partial);
        self.committed = true;
        Ok(())
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if !self.committed {
            partials().retain(|(p, _)| p != &self.partial);
            remove(&self.partial, self.dir);
        }
    }
}

/// Whether `path`'s extension is `ext`, in any case (`UP.MP4` is an MP4, as every
/// player reads it).
pub fn has_extension(path: &Path, ext: &str) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case(ext))
}

/// Moves every output into place at once: a signal sees either all of them partial (and
/// removes them) or all of them done.
pub fn commit_all(outputs: &mut [&mut Output]) -> Result<()> {
    let mut list = partials();
    for out in outputs.iter_mut() {
        out.commit_locked(&mut list)?;
    }
    Ok(())
}

/// Records the chunk progress a signal's message reports.
pub fn set_progress(done: usize, total: usize) {
    CHUNKS_DONE.store(done, Ordering::Relaxed);
    CHUNKS_TOTAL.store(total, Ordering::Relaxed);
}

/// Ends the process cleanly on SIGINT (exit 130) or SIGTERM (exit 143): the partial
/// outputs are removed and what was done is printed. Call once, before any work.
pub fn stop_on_signals(command: &'static str) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .context("cannot start the signal watcher")?;
    // The streams are registered here, so the handlers are in place when this returns.
    let (mut int, mut term) = runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        Ok::<_, std::io::Error>((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        ))
    })?;
    std::thread::Builder::new()
        .name("headroom-signals".into())
        .spawn(move || {
            let (name, code) = runtime.block_on(async {
                tokio::select! {
                    _ = int.recv() => ("SIGINT", 130),
                    _ = term.recv() => ("SIGTERM", 143),
                }
            });
            // Holding the list keeps a commit from running halfway beside the removal.
            let list = partials();
            for (path, dir) in list.iter() {
                remove(path, *dir);
            }
            let total = CHUNKS_TOTAL.load(Ordering::Relaxed);
            let done = CHUNKS_DONE.load(Ordering::Relaxed);
            let progress = if total > 0 {
                format!("after {done} of {total} chunks")
            } else {
                "before the first chunk".to_string()
            };
            let removed = if list.is_empty() {
                "nothing had been written".to_string()
            } else {
                format!("removed {} partial output(s)", list.len())
            };
            eprintln!("\nheadroom {command}: stopped by {name} {progress}; {removed}");
            std::process::exit(code);
        })
        .context("cannot start the signal watcher")?;
    Ok(())
}
