//! Sessions replicated across the ranks of a mesh: rank 0 leads, the others follow.
//!
//! Every rank holds its own engine (its share of the transformer and of the KV cache,
//! a whole VAE) and runs the same session schedule, so every rank's allocator sees the
//! same phases and the per-rank plan stays a measurement. Rank 0 owns all I/O (the
//! request, its files, the video, HTTP/WS) and broadcasts each session command over the
//! world group *before* the work it starts: open (with the request's tensors: text
//! embeddings, image, noise), chunk, camera interaction, prompt change, close. A
//! cancellation or hang-up is seen by rank 0 and becomes a close at the next chunk
//! boundary, so it reaches every rank within a chunk step; a chunk is never cut short
//! on one rank alone, since the ranks meet at collectives inside every layer.
//!
//! Failures never leave a rank waiting: an admission that fails anywhere (a request
//! rule, the KV pages, free memory, the prompt) is agreed on by every rank before any
//! collective runs and returned by rank 0, and the server keeps serving; any later
//! failure (inside the open's or a chunk's forwards) aborts the world (`MPI_Abort` ends the job, the
//! in-process group fails every pending collective), naming the rank that failed.

use std::sync::Arc;

use headroom_model::camera::{CameraUpdate, Keys, Trajectory};
use headroom_model::dit::Sharding;
use headroom_model::DecoderKind;
use headroom_tensor::comm::Communicator;
use headroom_tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::loop_io::NoiseSource;
use crate::session::{Chunk, Session, SessionRequest};

/// A tensor of an open command: its shape and the index of its values among the
/// message's f32 blobs.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct WireTensor {
    shape: Vec<usize>,
    blob: usize,
}

/// Everything of a [`SessionRequest`] that crosses to the other ranks (a latent sink
/// stays with rank 0, which writes the file).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OpenSpec {
    width: usize,
    height: usize,
    num_frames: usize,
    seed: u64,
    steps: usize,
    flow_shift: Option<f64>,
    prompt: Option<String>,
    actions: Vec<Keys>,
    trajectory: Option<Trajectory>,
    overlap: bool,
    reuse_last_step_kv: bool,
    camera_guidance: Option<f64>,
    decoder: Option<DecoderKind>,
    text_embeds: Option<WireTensor>,
    image: Option<WireTensor>,
    noise: Option<WireTensor>,
}

/// A session command, broadcast by rank 0 before the work it starts.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Command {
    /// Open the session (peak statistics restart here on every rank).
    Open(Box<OpenSpec>),
    /// Produce the next chunk.
    Chunk,
    /// Queue a camera update starting at a video frame of the next chunk.
    Interact(CameraUpdate, usize),
    /// Change the prompt over a transition of this many chunks (0: at once).
    Prompt(String, f64),
    /// Change the text embeddings (blob 0).
    TextEmbeds(WireTensor),
    /// Snapshot the session: each rank writes its shard of the path given.
    Snapshot(std::path::PathBuf),
    /// Resume a session: each rank reads its shard of the path given.
    Resume(std::path::PathBuf),
    /// Drop the session and report memory.
    Close,
    /// Leave the follow loop.
    Shutdown,
}

/// One rank's memory over a session, gathered to rank 0 at its close.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankMemory {
    /// World rank.
    pub rank: usize,
    /// Rank in its TP group.
    pub tp_rank: usize,
    /// Rank in its SP group.
    pub sp_rank: usize,
    /// The allocator's allocated peak from the open on.
    pub allocated_peak_bytes: u64,
    /// The allocator's reserved peak from the open on.
    pub reserved_peak_bytes: u64,
    /// Reserved bytes once the session was dropped.
    pub post_session_reserved_bytes: u64,
    /// What this rank's TP and SP collectives moved over the session, by kind.
    #[serde(default)]
    pub collectives: std::collections::BTreeMap<String, headroom_tensor::comm::OpTotals>,
}

impl RankMemory {
    fn of(engine: &Engine) -> Self {
        let stats = engine.platform().memory_stats();
        let shard = engine.transformer().sharding();
        Self {
            rank: shard.map_or(0, Sharding::world_rank),
            tp_rank: shard.map_or(0, |s| s.tp.rank()),
            sp_rank: shard.map_or(0, |s| s.sp.rank()),
            allocated_peak_bytes: stats.allocated_bytes.all().peak.max(0) as u64,
            reserved_peak_bytes: stats.reserved_bytes.all().peak.max(0) as u64,
            post_session_reserved_bytes: stats.reserved_bytes.all().current.max(0) as u64,
            collectives: shard.map(|s| s.meter.totals()).unwrap_or_default(),
        }
    }
}

fn wire_err(reason: impl std::fmt::Display) -> EngineError {
    EngineError::Internal(format!("a session command did not decode: {reason}"))
}

/// `[u64 header length][JSON header][per blob: u64 length, f32 little-endian values]`.
fn encode(command: &Command, blobs: &[Vec<f32>]) -> Result<Vec<u8>> {
    let header = serde_json::to_vec(command).map_err(wire_err)?;
    let mut out = Vec::with_capacity(
        16 + header.len() + blobs.iter().map(|b| 8 + 4 * b.len()).sum::<usize>(),
    );
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(&header);
    for blob in blobs {
        out.extend_from_slice(&(blob.len() as u64).to_le_bytes());
        for v in blob {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    Ok(out)
}

/// Reads a message front to back.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| wire_err("truncated message"))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn len(&mut self) -> Result<usize> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        usize::try_from(u64::from_le_bytes(b)).map_err(|_| wire_err("length past usize"))
    }

    fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }
}

fn decode(bytes: &[u8]) -> Result<(Command, Vec<Vec<f32>>)> {
    let mut r = Reader { bytes, at: 0 };
    let header_len = r.len()?;
    let command: Command = serde_json::from_slice(r.take(header_len)?).map_err(wire_err)?;
    let mut blobs = Vec::new();
    while !r.done() {
        let n = r.len()?;
        let raw = r.take(n.checked_mul(4).ok_or_else(|| wire_err("blob length"))?)?;
        blobs.push(
            raw.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        );
    }
    Ok((command, blobs))
}

fn wire_tensor(t: &Tensor, blobs: &mut Vec<Vec<f32>>) -> Result<WireTensor> {
    blobs.push(t.to_f32_vec()?);
    Ok(WireTensor {
        shape: t.shape().to_vec(),
        blob: blobs.len() - 1,
    })
}

fn from_wire(w: &WireTensor, blobs: &[Vec<f32>], device: &Device) -> Result<Tensor> {
    let values = blobs
        .get(w.blob)
        .ok_or_else(|| wire_err("a tensor's blob is missing"))?;
    Ok(Tensor::from_slice(values, &w.shape, device)?)
}

impl OpenSpec {
    fn of(r: &SessionRequest, blobs: &mut Vec<Vec<f32>>) -> Result<Self> {
        let noise = match &r.noise {
            NoiseSource::Generator => None,
            NoiseSource::Supplied(t) => Some(wire_tensor(t, blobs)?),
        };
        Ok(Self {
            width: r.width,
            height: r.height,
            num_frames: r.num_frames,
            seed: r.seed,
            steps: r.steps,
            flow_shift: r.flow_shift,
            prompt: r.prompt.clone(),
            actions: r.actions.clone(),
            trajectory: r.trajectory.clone(),
            overlap: r.overlap,
            reuse_last_step_kv: r.reuse_last_step_kv,
            camera_guidance: r.camera_guidance,
            decoder: r.decoder,
            text_embeds: r
                .text_embeds
                .as_ref()
                .map(|t| wire_tensor(t, blobs))
                .transpose()?,
            image: r
                .image
                .as_ref()
                .map(|t| wire_tensor(t, blobs))
                .transpose()?,
            noise,
        })
    }

    fn request(&self, blobs: &[Vec<f32>], device: &Device) -> Result<SessionRequest> {
        let tensor =
            |w: &Option<WireTensor>| w.as_ref().map(|w| from_wire(w, blobs, device)).transpose();
        Ok(SessionRequest {
            seed: self.seed,
            steps: self.steps,
            flow_shift: self.flow_shift,
            text_embeds: tensor(&self.text_embeds)?,
            prompt: self.prompt.clone(),
            image: tensor(&self.image)?,
            actions: self.actions.clone(),
            trajectory: self.trajectory.clone(),
            overlap: self.overlap,
            reuse_last_step_kv: self.reuse_last_step_kv,
            camera_guidance: self.camera_guidance,
            decoder: self.decoder,
            noise: match tensor(&self.noise)? {
                Some(t) => NoiseSource::Supplied(t),
                None => NoiseSource::Generator,
            },
            ..SessionRequest::new(self.width, self.height, self.num_frames)
        })
    }
}

/// The outcome of a step every rank agrees on: `None` if it went well everywhere, else
/// the first failing rank and its error.
fn agree(
    world: &dyn Communicator,
    outcome: &std::result::Result<(), String>,
) -> Result<Option<(usize, String)>> {
    // An empty message means success, so a failure always says something.
    let mine = match outcome {
        Ok(()) => Vec::new(),
        Err(text) if text.is_empty() => b"error".to_vec(),
        Err(text) => text.as_bytes().to_vec(),
    };
    let all = world.all_gather_bytes(&mine)?;
    Ok(all
        .into_iter()
        .enumerate()
        .find(|(_, m)| !m.is_empty())
        .map(|(rank, m)| (rank, String::from_utf8_lossy(&m).into_owned())))
}

fn broadcast(world: &dyn Communicator, command: &Command, blobs: &[Vec<f32>]) -> Result<()> {
    world.broadcast_bytes(0, encode(command, blobs)?)?;
    Ok(())
}

/// Rank 0's handle on a session open on every rank of the mesh.
#[derive(Debug)]
pub struct LeadSession {
    session: Option<Session>,
    world: Arc<dyn Communicator>,
}

/// Opens `request` on every rank (rank 0 only; the others are in [`follow`]): the
/// request and its tensors are broadcast, every rank opens, and all agree on the
/// outcome, so a refused open leaves every rank as it was.
pub fn lead_open(
    engine: &Engine,
    world: &Arc<dyn Communicator>,
    request: SessionRequest,
) -> Result<LeadSession> {
    let mut blobs = Vec::new();
    let spec = OpenSpec::of(&request, &mut blobs)?;
    broadcast(world.as_ref(), &Command::Open(Box::new(spec)), &blobs)?;
    reset_stats(engine);
    open_agreed(world, engine.admit_session(request))
}

/// Rank 0's side of an open every rank takes part in, after the command went out: all
/// agree on the admissions (a refusal anywhere leaves every rank as it was), then open
/// (a failure there aborts the mesh: the others may wait at a collective of the open).
fn open_agreed(
    world: &Arc<dyn Communicator>,
    admitted: Result<crate::Admitted<'_>>,
) -> Result<LeadSession> {
    let status = admitted.as_ref().map(|_| ()).map_err(|e| e.to_string());
    match agree(world.as_ref(), &status)? {
        None => {}
        Some((0, _)) => return Err(admitted.err().unwrap_or_else(|| wire_err("open failed"))),
        Some((rank, reason)) => {
            return Err(EngineError::Rank {
                rank,
                reason,
                cause: None,
            })
        }
    }
    match admitted.and_then(|a| a.open()) {
        Ok(session) => Ok(LeadSession {
            session: Some(session),
            world: Arc::clone(world),
        }),
        Err(e) => {
            world.abort();
            Err(e)
        }
    }
}

/// Resumes on every rank the session snapshotted to `path` (rank 0 only; the others
/// are in [`follow`]), each rank from its own shard ([`shard_path`]); all agree on the
/// outcome, so a refused resume leaves every rank as it was.
pub fn lead_resume(
    engine: &Engine,
    world: &Arc<dyn Communicator>,
    path: &std::path::Path,
) -> Result<LeadSession> {
    broadcast(world.as_ref(), &Command::Resume(path.to_path_buf()), &[])?;
    reset_stats(engine);
    open_agreed(world, engine.admit_resume(path))
}

/// Rank `rank`'s shard of the snapshot at `path`: `path` itself for rank 0, else
/// `.rank-R` before its extension (`chunk-3.hrsnap` → `chunk-3.rank-2.hrsnap`).
pub fn shard_path(path: &std::path::Path, rank: usize) -> std::path::PathBuf {
    if rank == 0 {
        return path.to_path_buf();
    }
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.rank-{rank}.{}", ext.to_string_lossy()),
        None => format!("{stem}.rank-{rank}"),
    };
    path.with_file_name(name)
}

/// Writes this rank's shard of a snapshot of `session` at `path`, and agrees with the
/// others on the outcome (a failed write ends no session).
fn snapshot_shard(
    world: &dyn Communicator,
    session: &Session,
    path: &std::path::Path,
) -> Result<Option<crate::SessionSnapshot>> {
    let mine = session
        .snapshot()
        .and_then(|s| s.write(&shard_path(path, world.rank())).map(|_| s));
    let status = mine.as_ref().map(|_| ()).map_err(|e| e.to_string());
    match agree(world, &status)? {
        None => Ok(mine.ok()),
        Some((rank, _)) if rank == world.rank() => mine.map(Some),
        Some((rank, reason)) => Err(EngineError::Rank {
            rank,
            reason,
            cause: None,
        }),
    }
}

/// Ends the followers' loops (rank 0, when it will open no more sessions).
pub fn lead_shutdown(world: &Arc<dyn Communicator>) -> Result<()> {
    broadcast(world.as_ref(), &Command::Shutdown, &[])
}

impl LeadSession {
    fn live(&mut self) -> Result<&mut Session> {
        self.session
            .as_mut()
            .ok_or_else(|| EngineError::Finished("closed".to_string()))
    }

    /// The session on rank 0.
    pub fn session(&self) -> Option<&Session> {
        self.session.as_ref()
    }

    /// The next chunk, produced by every rank; a failure aborts the world.
    pub fn next_chunk(&mut self) -> Result<Chunk> {
        let world = Arc::clone(&self.world);
        let out = (|| {
            broadcast(world.as_ref(), &Command::Chunk, &[])?;
            self.live()?.next_chunk()
        })();
        if out.is_err() {
            world.abort();
        }
        out
    }

    /// Queues a camera update on every rank (refused on rank 0 first, sent nowhere).
    pub fn interact(&mut self, update: CameraUpdate) -> Result<()> {
        self.interact_at(update, 0)
    }

    /// Queues a camera update starting at video frame `frame` of the next chunk on
    /// every rank.
    pub fn interact_at(&mut self, update: CameraUpdate, frame: usize) -> Result<()> {
        self.live()?.interact_at(update, frame)?;
        broadcast(self.world.as_ref(), &Command::Interact(update, frame), &[])
    }

    /// Changes the prompt on every rank over `transition_chunks` (encoded on rank 0
    /// first: an error there sends nothing).
    pub fn set_prompt_over(&mut self, prompt: &str, transition_chunks: f64) -> Result<()> {
        self.live()?.set_prompt_over(prompt, transition_chunks)?;
        broadcast(
            self.world.as_ref(),
            &Command::Prompt(prompt.to_string(), transition_chunks),
            &[],
        )
    }

    /// Changes the text embeddings on every rank.
    pub fn set_text_embeds(&mut self, embeds: &Tensor) -> Result<()> {
        self.live()?.set_text_embeds(embeds)?;
        let mut blobs = Vec::new();
        let w = wire_tensor(embeds, &mut blobs)?;
        broadcast(self.world.as_ref(), &Command::TextEmbeds(w), &blobs)
    }

    /// Snapshots the session on every rank at this chunk boundary: rank 0 to `path`,
    /// rank `r` to [`shard_path`]`(path, r)`; returns rank 0's snapshot.
    pub fn snapshot_to(&mut self, path: &std::path::Path) -> Result<crate::SessionSnapshot> {
        broadcast(
            self.world.as_ref(),
            &Command::Snapshot(path.to_path_buf()),
            &[],
        )?;
        let world = Arc::clone(&self.world);
        snapshot_shard(world.as_ref(), self.live()?, path)?
            .ok_or_else(|| EngineError::Internal("rank 0 wrote no snapshot".into()))
    }

    /// Closes the session on every rank and returns each rank's memory, in rank order.
    pub fn close(mut self, engine: &Engine) -> Result<Vec<RankMemory>> {
        broadcast(self.world.as_ref(), &Command::Close, &[])?;
        drop(self.session.take());
        gather_memory(engine, self.world.as_ref())
    }
}

impl Drop for LeadSession {
    fn drop(&mut self) {
        // Closed without `close` (an error path): the followers drop theirs too. Their
        // memory reports are gathered and dropped, so every rank leaves the close.
        if self.session.take().is_some() {
            let _ = broadcast(self.world.as_ref(), &Command::Close, &[])
                .and_then(|()| Ok(self.world.all_gather_bytes(&[])?));
        }
    }
}

/// Peaks and collective totals restart with each session.
fn reset_stats(engine: &Engine) {
    engine.platform().reset_peak_stats();
    if let Some(s) = engine.transformer().sharding() {
        s.meter.reset();
    }
}

fn gather_memory(engine: &Engine, world: &dyn Communicator) -> Result<Vec<RankMemory>> {
    let mine = serde_json::to_vec(&RankMemory::of(engine)).map_err(wire_err)?;
    world
        .all_gather_bytes(&mine)?
        .iter()
        .map(|b| serde_json::from_slice(b).map_err(wire_err))
        .collect()
}

/// A follower's loop (every rank but 0): runs each command rank 0 broadcasts until it
/// says shut down. A failure aborts the world after naming this rank on stderr.
pub fn follow(engine: &Engine, world: &Arc<dyn Communicator>) -> Result<()> {
    let out = follow_inner(engine, world.as_ref());
    if let Err(e) = &out {
        if !e.is_aborted() {
            eprintln!("headroom: rank {} failed: {e}", world.rank());
        }
        world.abort();
    }
    out
}

fn follow_inner(engine: &Engine, world: &dyn Communicator) -> Result<()> {
    let device = engine.device().clone();
    let mut session: Option<Session> = None;
    loop {
        let (command, blobs) = decode(&world.broadcast_bytes(0, Vec::new())?)?;
        match command {
            Command::Open(spec) => {
                reset_stats(engine);
                let admitted = spec
                    .request(&blobs, &device)
                    .and_then(|r| engine.admit_session(r));
                let status = admitted.as_ref().map(|_| ()).map_err(|e| e.to_string());
                if agree(world, &status)?.is_none() {
                    session = Some(admitted?.open()?);
                }
            }
            Command::Chunk => {
                live(&mut session)?.next_chunk()?;
            }
            Command::Interact(update, frame) => live(&mut session)?.interact_at(update, frame)?,
            Command::Prompt(prompt, chunks) => {
                live(&mut session)?.set_prompt_over(&prompt, chunks)?
            }
            Command::TextEmbeds(w) => {
                let t = from_wire(&w, &blobs, &device)?;
                live(&mut session)?.set_text_embeds(&t)?;
            }
            Command::Resume(path) => {
                reset_stats(engine);
                let admitted = engine.admit_resume(shard_path(&path, world.rank()).as_path());
                let status = admitted.as_ref().map(|_| ()).map_err(|e| e.to_string());
                if agree(world, &status)?.is_none() {
                    session = Some(admitted?.open()?);
                }
            }
            Command::Snapshot(path) => {
                // A failed write is reported by the agreement; the session goes on.
                let _ = snapshot_shard(world, live(&mut session)?, &path);
            }
            Command::Close => {
                drop(session.take());
                gather_memory(engine, world)?;
            }
            Command::Shutdown => return Ok(()),
        }
    }
}

fn live(session: &mut Option<Session>) -> Result<&mut Session> {
    session
        .as_mut()
        .ok_or_else(|| EngineError::Finished("no session is open on this rank".to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_survive_the_wire_with_their_tensors() {
        let device = Device::cpu().unwrap();
        let image = Tensor::from_slice(&[0.5f32, -1.0, 0.25, 1.0], &[1, 2, 2], &device).unwrap();
        let request = SessionRequest {
            image: Some(image),
            actions: vec![Keys {
                w: true,
                ..Keys::default()
            }],
            prompt: Some("a box".to_string()),
            ..SessionRequest::new(64, 32, 21)
        };
        let mut blobs = Vec::new();
        let spec = OpenSpec::of(&request, &mut blobs).unwrap();
        let bytes = encode(&Command::Open(Box::new(spec)), &blobs).unwrap();
        let (command, blobs) = decode(&bytes).unwrap();
        let Command::Open(spec) = command else {
            panic!("not an open")
        };
        let back = spec.request(&blobs, &device).unwrap();
        assert_eq!((back.width, back.height, back.num_frames), (64, 32, 21));
        assert_eq!(back.actions, request.actions);
        assert_eq!(back.prompt.as_deref(), Some("a box"));
        assert_eq!(
            back.image.unwrap().to_f32_vec().unwrap(),
            vec![0.5, -1.0, 0.25, 1.0]
        );
        assert!(decode(&bytes[..bytes.len() - 2]).is_err());
    }
}
