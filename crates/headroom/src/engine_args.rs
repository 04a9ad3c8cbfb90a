//! The engine a command loads, as flags: one set of structs flattened into every command
//! that loads one, and one function, [`EngineArgs::config`], that turns them into the
//! [`EngineConfig`]. `generate` and `serve` flatten [`EngineArgs`]; `bench session`, which
//! compares allocators and policies instead of choosing one, flattens [`ModelArgs`] and
//! [`DecoderArgs`]; `plan` and `bench batch` flatten [`DecoderArgs`].
//!
//! The help texts are `generate`'s; a command that says a flag differently (`serve`: a
//! server's `--kv-budget` is shared by its sessions) replaces the text where it flattens
//! the struct, so every command keeps the help it has always had.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use headroom_engine::EngineConfig;
use headroom_mem::{
    format_bytes, parse_size, AllocatorConfig, AllocatorPolicy, HostMemory, ReclaimPolicy,
};
use headroom_model::WeightFormat;

use crate::device_arg::DeviceArg;
use crate::dtype_arg::DtypeArg;

/// Which model, on which device, in which dtype, with how much memory.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// Built-in model (world, tiny, small, wan2.1-t2v-1.3b, lingbot-world-v2-14b), a
    /// diffusers pipeline folder with transformer/ and vae/, or an original Wan repo
    /// folder (config.json, DiT safetensors, Wan2.1_VAE.pth, T5 .pth + google/umt5-xxl/).
    /// Default: world for generate, small for bench.
    #[arg(long)]
    pub model: Option<String>,
    /// Device capacity (B, KiB, MiB, GiB) to emulate a memory-tight device; physical
    /// memory by default. `bounded` reclaim fractions refer to it.
    #[arg(long)]
    pub capacity: Option<String>,
    /// Device: cpu, cuda or cuda:N (a build with --features cuda), or cuda-check (the
    /// GPU path's launches checked on the host, nothing computed).
    #[arg(long, default_value = "cpu")]
    pub device: DeviceArg,
    /// What the model's weights are held and computed in.
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: DtypeArg,
    /// How the DiT blocks' linear weights are held: native (as loaded; 8-bit files stay
    /// 8-bit), fp8 (e4m3 per output channel: widened to bf16 in the CPU's products, W8A8
    /// on cuBLASLt's fp8 GEMM on sm_89+ GPUs) or int8 (per output channel, W8A8 on the
    /// CPU, `vpdpbusd` where the CPU has it).
    #[arg(long, default_value = "native")]
    pub weights: WeightFormat,
}

impl ModelArgs {
    /// `--model` as given, `default` when absent.
    pub fn name<'a>(&'a self, default: &'a str) -> &'a str {
        self.model.as_deref().unwrap_or(default)
    }

    /// The model the engine loads (`world` resolved to its folder), `default` when
    /// `--model` is absent.
    pub fn resolved_model(&self, default: &str) -> Result<String> {
        crate::builtin_world::resolve(self.name(default))
    }

    /// `--capacity` in bytes, if given.
    pub fn capacity_bytes(&self) -> Result<Option<u64>> {
        self.capacity
            .as_deref()
            .map(parse_size)
            .transpose()
            .context("--capacity")
    }
}

/// Which decoder sessions decode with: `--decoder` and `--tiny-decoder`.
#[derive(Debug, Clone, Args)]
pub struct DecoderArgs {
    /// full (the model's own VAE) or tiny (a TAEHV tiny decoder: `--tiny-decoder`, else
    /// the model folder's tiny_decoder.safetensors, else for a built-in model seeded
    /// weights of taew2_1's or taew2_2's shapes).
    #[arg(long, default_value = "full")]
    pub decoder: headroom_model::DecoderKind,
    /// A TAEHV tiny decoder file (taew2_1 / taew2_2, .pth or .safetensors), loaded beside
    /// the model so sessions may choose it.
    #[arg(long)]
    pub tiny_decoder: Option<PathBuf>,
}

impl DecoderArgs {
    /// `config` with these choices.
    pub fn apply(&self, config: EngineConfig) -> EngineConfig {
        EngineConfig {
            decoder: self.decoder,
            tiny_decoder: self.tiny_decoder.clone(),
            ..config
        }
    }
}

/// The engine: its model and decoders, its allocator and reclaim policy, its KV pages.
#[derive(Debug, Args)]
pub struct EngineArgs {
    /// The model, its device, dtype and capacity.
    #[command(flatten)]
    pub model: ModelArgs,
    /// The decoders sessions may use.
    #[command(flatten)]
    pub decoders: DecoderArgs,
    /// A transformer checkpoint over --model's VAE and text encoder (any layout: a
    /// Self-Forcing .pt, a LingBot-World or original Wan folder, a ComfyUI file).
    #[arg(long)]
    pub transformer: Option<String>,
    /// The --transformer checkpoint's config.json (diffusers or original keys), for a
    /// checkpoint that carries none and whose shapes do not settle it.
    #[arg(long, requires = "transformer")]
    pub config: Option<PathBuf>,
    /// A folder that keeps the planned allocator's plans across runs (a corrupt or
    /// stale file is rebuilt): the next run with the same shapes replays its first
    /// session without planning it.
    #[arg(long)]
    pub plan_cache: Option<PathBuf>,
    /// Reclaim policy: never, before-decode, bounded[:…], fit[:slack=F], always.
    #[arg(long, default_value = "before-decode")]
    pub policy: String,
    /// Allocator: planned (default: sessions replay a plan at the live peak), pytorch or
    /// expandable.
    #[arg(long, default_value = "planned")]
    pub allocator: String,
    /// KV page budget (B, KiB, MiB, GiB), a fraction of the device capacity (e.g. 0.05),
    /// or `auto` (sized for this one session).
    #[arg(long, default_value = "auto")]
    pub kv_budget: String,
}

impl EngineArgs {
    /// The engine these flags describe, with `default_model` when `--model` is absent.
    /// Everything a user can get wrong is checked here, before any weights load.
    pub fn config(&self, default_model: &str) -> Result<EngineConfig> {
        let reclaim: ReclaimPolicy = self.policy.parse()?;
        let policy: AllocatorPolicy = self.allocator.parse()?;
        let capacity = self.model.capacity_bytes()?;
        let kv_budget_bytes = kv_budget(&self.kv_budget, capacity)?;
        let model = self.model.resolved_model(default_model)?;
        Ok(self.decoders.apply(EngineConfig {
            model,
            transformer: self.transformer.clone(),
            transformer_config: self.config.clone(),
            allocator: AllocatorConfig::with_policy(policy),
            reclaim,
            kv_budget_bytes,
            capacity,
            weight_dtype: self.model.dtype.dtype(),
            weights: self.model.weights,
            plan_cache: self.plan_cache.clone(),
            ..EngineConfig::default()
        }))
    }
}

/// `--kv-budget`: `auto` (`None`), a size, or a fraction in (0, 1] of the device
/// capacity (`capacity`, else physical memory). A fraction is said on stderr with the
/// bytes it came to, since on a host it is a share of the whole machine.
pub fn kv_budget(value: &str, capacity: Option<u64>) -> Result<Option<u64>> {
    if value == "auto" {
        return Ok(None);
    }
    if value.contains('.') {
        if let Ok(fraction) = value.parse::<f64>() {
            if !(fraction > 0.0 && fraction <= 1.0) {
                anyhow::bail!("--kv-budget {value}: a fraction must be in (0, 1]");
            }
            let (total, of) = match capacity {
                Some(c) => (c, "--capacity"),
                None => (HostMemory::physical_memory(), "physical memory"),
            };
            let bytes = (total as f64 * fraction) as u64;
            eprintln!(
                "--kv-budget {value}: {} of KV pages ({value} of {} {of})",
                format_bytes(bytes),
                format_bytes(total)
            );
            return Ok(Some(bytes));
        }
    }
    let bytes = parse_size(value).context("--kv-budget")?;
    if bytes == 0 {
        anyhow::bail!("--kv-budget {value}: must be at least one page (e.g. 64MiB), or auto");
    }
    Ok(Some(bytes))
}
