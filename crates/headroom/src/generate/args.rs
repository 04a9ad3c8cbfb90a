//! The flags of `headroom generate`: the engine's and the session's shared structs, the
//! request's own flags, and the files it writes.

use std::path::PathBuf;

use clap::Args;

use crate::engine_args::EngineArgs;
use crate::ranks::RankArgs;
use crate::session_args::SessionShape;

/// Arguments of `headroom generate`.
#[derive(Debug, Args)]
#[command(mut_args(|arg| crate::help_order::place(arg, &HELP_ORDER)))]
pub struct GenerateArgs {
    /// The engine: model, device, dtype, decoders, allocator, reclaim policy, KV pages.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Frames, size and seed.
    #[command(flatten)]
    pub shape: SessionShape,
    /// DMD steps per block.
    #[arg(long, default_value_t = 4)]
    pub steps: usize,
    /// Timestep shift of the DMD steps (default: the model's `flow_shift`, 5 unless its
    /// config says otherwise).
    #[arg(long)]
    pub flow_shift: Option<f64>,
    /// Text embeddings [L, text_dim]: .npy, or .safetensors holding one tensor.
    #[arg(long, conflicts_with = "prompt")]
    pub text_embeds: Option<PathBuf>,
    /// A prompt, encoded by the model folder's text_encoder/ + tokenizer/ (the tiny and
    /// small built-in models have a seeded one).
    #[arg(long)]
    pub prompt: Option<String>,
    /// Text encoder weights: resident (kept) or on-demand (loaded for the prompt and
    /// released before the video starts).
    #[arg(long, default_value = "resident")]
    pub text_encoder: String,
    /// Byte budget of the prompt-embedding cache (B, KiB, MiB, GiB).
    #[arg(long, default_value = "64MiB")]
    pub text_cache: String,
    /// Camera keys, one character per latent frame: w/a/s/d move, i/k pitch, j/l yaw,
    /// `-` none (e.g. `wwwwwwddd`); or a JSON pose file `{"poses": [[4x4]…],
    /// "intrinsics": [[fx, fy, cx, cy]…]}` (one pose per pixel frame, 832×480 units); or a
    /// LingBot-World folder with poses.npy [F, 4, 4] and intrinsics.npy [F, 4].
    #[arg(long, default_value = "")]
    pub actions: String,
    /// Decode each chunk on a second thread while the next one denoises (same output).
    #[arg(long)]
    pub overlap: bool,
    /// Commit the last DMD step's keys/values instead of running the commit forward.
    #[arg(long)]
    pub reuse_last_step_kv: bool,
    /// Camera guidance: each step's velocity pushed away from a still camera's by this
    /// scale (two forwards a step; default: the model's `camera_guidance`, 1 = off).
    #[arg(long)]
    pub camera_guidance: Option<f64>,
    /// Noise to use instead of the seeded generator: an f32 .npy `[blocks, steps, C, 3,
    /// h, w]` holding every tensor the loop draws, in draw order (per block: the initial
    /// noise, then each re-noise), e.g. from `tools/reference_rollout.py`.
    #[arg(long)]
    pub noise: Option<PathBuf>,
    /// Write each block's clean latents, f32 `[blocks, C, 3, h, w]`, as they go to the
    /// decoder, to this .npy file.
    #[arg(long)]
    pub dump_latents: Option<PathBuf>,
    /// First frame for image-conditioned models: PNG or JPEG, resized to the video size
    /// (default: the model folder's own first_frame.png, if it has one).
    #[arg(long)]
    pub image: Option<PathBuf>,
    /// Write the allocator's snapshot with its event trace as a PyTorch memory pickle
    /// (pytorch.org/memory_viz).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Snapshot the session every N chunks: after chunk K (from 0) with (K + 1) a
    /// multiple of N, to `--snapshot-dir`/chunk-K.hrsnap (not after the last chunk).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub snapshot_every: Option<u64>,
    /// Folder for `--snapshot-every`'s files (made if missing).
    #[arg(long, default_value = ".", requires = "snapshot_every")]
    pub snapshot_dir: PathBuf,
    /// Continue the session of a snapshot (`chunk-K.hrsnap`): the output holds its
    /// frames from chunk K + 1 on. The engine flags must describe the engine it ran on
    /// (a difference is refused by name); the size, seed, camera and text come from the
    /// snapshot.
    #[arg(long, conflicts_with_all = ["prompt", "text_embeds", "image", "noise", "width", "height"])]
    pub resume: Option<PathBuf>,
    /// Output: an .mp4 (H.264) or .y4m file, or a directory for PNG frames.
    #[arg(long, default_value = "out.mp4")]
    pub out: PathBuf,
    /// Print the report as JSON on stdout (progress goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// The TP × SP mesh and its collective backend.
    #[command(flatten)]
    pub ranks: RankArgs,
}

/// `generate --help`'s flags in order: the shared engine and session flags among the
/// command's own, where they have always been listed.
pub const HELP_ORDER: [&str; 39] = [
    "model",
    "frames",
    "width",
    "height",
    "seed",
    "capacity",
    "device",
    "dtype",
    "weights",
    "decoder",
    "tiny_decoder",
    "transformer",
    "config",
    "steps",
    "flow_shift",
    "text_embeds",
    "prompt",
    "text_encoder",
    "text_cache",
    "plan_cache",
    "actions",
    "overlap",
    "reuse_last_step_kv",
    "camera_guidance",
    "noise",
    "dump_latents",
    "policy",
    "allocator",
    "kv_budget",
    "image",
    "trace",
    "snapshot_every",
    "snapshot_dir",
    "resume",
    "out",
    "json",
    "tp",
    "sp",
    "comm",
];

#[cfg(test)]
mod tests {
    #[test]
    fn help_lists_every_flag_in_its_order() {
        assert_eq!(crate::help_order::listed(&["generate"]), super::HELP_ORDER);
    }
}
