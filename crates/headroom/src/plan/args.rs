//! The flags of `headroom plan`: the deployment (model, size, mesh, card, allocator,
//! policies) and what to write. The session's frames and size default as `generate`'s
//! do ([`crate::session_args`]), so `plan --model M` plans what `generate --model M` runs.

use std::path::PathBuf;

use clap::Args;

use crate::engine_args::DecoderArgs;
use crate::session_args::{parse_frames, DEFAULT_FRAMES};

/// Options of `headroom plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Built-in model (world, tiny, small, wan2.1-t2v-1.3b, lingbot-world-v2-14b), a
    /// diffusers pipeline folder or an original Wan repo folder (only headers and configs are read).
    #[arg(long, default_value = "lingbot-world-v2-14b")]
    pub model: String,
    /// A transformer checkpoint over --model (Self-Forcing .pt, LingBot-World folder, …).
    #[arg(long)]
    pub transformer: Option<String>,
    /// Video height in pixels; default: the model's own size (its first_frame.png), else
    /// 240.
    #[arg(long)]
    pub height: Option<usize>,
    /// Video width in pixels; default: the model's own size (its first_frame.png), else
    /// 416.
    #[arg(long)]
    pub width: Option<usize>,
    /// Frames of the session: 12·K − 3 for K chunks, or `until-stop`: a session without
    /// an end, planned at its steady state (its KV window full), whose peak every later
    /// chunk repeats.
    #[arg(long, default_value_t = DEFAULT_FRAMES, value_parser = parse_frames)]
    pub frames: usize,
    /// Tensor-parallel degree (heads and FFN split across ranks).
    #[arg(long, default_value_t = 1)]
    pub tp: usize,
    /// Sequence-parallel (Ulysses) degree (tokens split across ranks).
    #[arg(long, default_value_t = 1)]
    pub sp: usize,
    /// Memory of each card (B, KiB, MiB, GiB).
    #[arg(long, default_value = "64GiB")]
    pub capacity: String,
    /// Device whose capacity to plan for: cpu (use --capacity) or `cuda[:N]` (the card's
    /// memory as the driver reports it replaces --capacity; needs --features cuda).
    #[arg(long, default_value = "cpu")]
    pub device: crate::device_arg::DeviceArg,
    /// Allocator: planned (the default of generate, serve and bench session too),
    /// pytorch or expandable.
    #[arg(long, default_value = "planned")]
    pub allocator: String,
    /// Reclaim policies to plan, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "never,before-decode")]
    pub policies: Vec<String>,
    /// KV pool as a fraction of the memory free after the weights (default: exactly one
    /// session's window of pages).
    #[arg(long)]
    pub kv_fraction: Option<f64>,
    /// Chunks to run (default: the whole session).
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Weight dtype: bf16, f32, or auto (what the model runs in: f32 for the tiny and
    /// small built-ins and pipeline folders, as `generate` runs them; bf16 for the real
    /// model shapes, as they are deployed).
    #[arg(long, default_value = "auto")]
    pub dtype: String,
    /// How the DiT blocks' linear weights are held: native (as loaded), fp8 (e4m3 per
    /// output channel) or int8 (per output channel, W8A8 products).
    #[arg(long, default_value = "native")]
    pub weights: headroom_model::WeightFormat,
    /// Run on the host (`cpu`) instead of meta execution: measures what the plan
    /// predicts (small models only).
    #[arg(long)]
    pub measure: bool,
    /// The session's decoder.
    #[command(flatten)]
    pub decoders: DecoderArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write a memory timeline per rank and policy to this PNG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Write a PyTorch snapshot pickle per rank and policy into this folder (memory_viz).
    #[arg(long)]
    pub trace: Option<PathBuf>,
}
