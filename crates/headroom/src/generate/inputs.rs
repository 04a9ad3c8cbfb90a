//! What `generate`'s flags name, read and checked before any weights load: the engine
//! configuration, the camera, the request's size and frames, the output files; and the
//! loaders of the tensors a request carries (text embeddings, first frame).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use headroom_engine::{EngineConfig, SessionSnapshot};
use headroom_mem::parse_size;
use headroom_model::camera::{Keys, Trajectory};
use headroom_model::import::lingbot::trajectory_from_dir;
use headroom_tensor::io::npy::read_npy;
use headroom_tensor::io::safetensors::SafetensorsFile;
use headroom_tensor::{DType, Device, Tensor};
use headroom_text::TextEncoderMode;

use super::args::GenerateArgs;
use super::video::Outputs;

/// What the command line says, checked before any weights load.
pub struct Prepared {
    /// The engine to load.
    pub config: EngineConfig,
    /// Video width.
    pub width: usize,
    /// Video height.
    pub height: usize,
    /// Camera keys, one set per latent frame.
    pub actions: Vec<Keys>,
    /// Camera poses, one per frame, instead of keys.
    pub trajectory: Option<Trajectory>,
    /// The files the run writes (rank 0 writes them).
    pub outputs: Mutex<Outputs>,
}

/// Reads and checks `args`: every refusal a user can act on happens here.
pub fn prepare(args: &GenerateArgs) -> Result<Prepared> {
    let (actions, trajectory) = camera(&args.actions)?;
    let text_encoder: TextEncoderMode = args.text_encoder.parse().context("--text-encoder")?;
    let text_cache_bytes = parse_size(&args.text_cache).context("--text-cache")?;
    let config = EngineConfig {
        text_encoder,
        text_cache_bytes,
        ..args.engine.config(crate::builtin_world::WORLD)?
    };
    let resume = args
        .resume
        .as_deref()
        .map(SessionSnapshot::read)
        .transpose()
        .with_context(|| {
            format!(
                "--resume {}",
                args.resume.as_deref().unwrap_or(Path::new("")).display()
            )
        })?;
    let (width, height) = match &resume {
        Some(snap) => (snap.identity.width, snap.identity.height),
        None => args.shape.size(&config.model),
    };
    if let Some(snap) = &resume {
        if snap.progress.horizon.is_none() {
            bail!(
                "--resume: the snapshot's session has no end (it streamed under `headroom serve`); resume it there, with its resume token"
            );
        }
        let outputs = Mutex::new(Outputs::check(args, width, height)?);
        return Ok(Prepared {
            config,
            width,
            height,
            actions: Vec::new(),
            trajectory: None,
            outputs,
        });
    }
    crate::session_args::require_end("generate writes a file, which", args.shape.frames)?;
    headroom_engine::validate::check_request(
        &config,
        args.ranks.mesh()?,
        width,
        height,
        args.shape.frames,
    )?;
    let frames = args.shape.frames;
    headroom_engine::model_source::check_camera(
        frames,
        actions.len(),
        trajectory.as_ref().map(|t| t.poses.len()),
    )?;
    let latent = headroom_engine::model_source::latent_frames(frames);
    if !actions.is_empty() && actions.len() < latent {
        eprintln!(
            "--actions: {} key sets for {latent} latent frames; latent frames {}–{latent} have no keys",
            actions.len(),
            actions.len() + 1
        );
    }
    let outputs = Mutex::new(Outputs::check(args, width, height)?);
    Ok(Prepared {
        config,
        width,
        height,
        actions,
        trajectory,
        outputs,
    })
}

/// `--actions`: a LingBot-World folder (poses.npy + intrinsics.npy), a JSON pose file,
/// or a key script.
fn camera(actions: &str) -> Result<(Vec<Keys>, Option<Trajectory>)> {
    Ok(if Path::new(actions).is_dir() {
        // LingBot-World's camera input: poses.npy + intrinsics.npy.
        let device = Device::cpu()?;
        let dir = Path::new(actions);
        (Vec::new(), Some(trajectory_from_dir(dir, &device)?))
    } else if actions.ends_with(".json") {
        let text = std::fs::read_to_string(actions)
            .with_context(|| format!("--actions {actions}: cannot read it"))?;
        (Vec::new(), Some(Trajectory::from_json(&text)?))
    } else {
        (Keys::script(actions)?, None)
    })
}

/// Loads `--text-embeds`: a `.npy`, or a `.safetensors` holding one `[L, text_dim]`
/// tensor.
pub fn load_text(path: &PathBuf, device: &Device) -> Result<Tensor> {
    if crate::outputs::has_extension(path, "safetensors") {
        let file = SafetensorsFile::open(path)?;
        let names = file.names()?;
        let [name] = names.as_slice() else {
            bail!(
                "{} holds {} tensors; expected exactly one [L, text_dim]",
                path.display(),
                names.len()
            );
        };
        Ok(file.load(name, device, Some(DType::F32))?)
    } else {
        Ok(read_npy(path, device)?)
    }
}

/// Loads a PNG or JPEG first frame, resized (bicubic) to `width × height`, as
/// `[3, H, W]` in [−1, 1].
pub fn load_image(path: &Path, width: usize, height: usize, device: &Device) -> Result<Tensor> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("--image {}: cannot read it", path.display()))?;
    let image = headroom_media::decode_image(&bytes, headroom_engine::first_frame::MAX_SIDE)
        .map_err(|e| anyhow::anyhow!("--image {}: {e}", path.display()))?;
    Ok(headroom_engine::first_frame::to_tensor(
        &image, width, height, device,
    )?)
}
