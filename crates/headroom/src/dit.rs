//! `headroom dit forward`: one full-sequence transformer forward, the reference-check
//! entry point.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use headroom_mem::{format_bytes, process_peak_rss_bytes};
use headroom_model::import::{load_transformer, open_transformer, ImportOptions};
use headroom_model::WanTransformer;
use headroom_tensor::io::npy::{read_npy, write_npy};
use headroom_tensor::{DType, Device, Tensor};

/// Arguments of `headroom dit`.
#[derive(Debug, Args)]
pub struct DitArgs {
    #[command(subcommand)]
    command: DitCommand,
}

#[derive(Debug, Subcommand)]
enum DitCommand {
    /// One full-sequence forward: latents → velocity.
    Forward(ForwardArgs),
    /// Load a transformer checkpoint (any layout) and report its layout, config, weight
    /// bytes and the process's peak resident memory while loading.
    Load(LoadArgs),
}

#[derive(Debug, Args)]
struct LoadArgs {
    /// The transformer in any layout (as for `dit forward`).
    #[arg(long)]
    model: PathBuf,
    /// A config.json overriding the checkpoint's own or the one inferred from shapes.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Storage dtype of the loaded weights: f32 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
}

#[derive(Debug, Args)]
struct ForwardArgs {
    /// The transformer in any layout: a diffusers pipeline or transformer folder, an
    /// original Wan folder, or a checkpoint file (.safetensors, .pt, .pth; Self-Forcing
    /// `generator_ema`, ComfyUI `model.diffusion_model.` wrappers included).
    #[arg(long)]
    model: PathBuf,
    /// A config.json (diffusers or original Wan keys) overriding the checkpoint's own
    /// or the one inferred from its shapes.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Latents .npy [1, C, F, H, W] f32.
    #[arg(long)]
    latents: PathBuf,
    /// Timestep (e.g. 937.5).
    #[arg(long)]
    timestep: f32,
    /// Text embeddings .npy [L, text_dim] f32 (none: a zero context).
    #[arg(long)]
    text_embeds: Option<PathBuf>,
    /// Image-condition latents .npy [1, 20, F, H, W], concatenated after the latents on
    /// the channel axis when the latents have fewer channels than the model takes.
    #[arg(long)]
    image_latents: Option<PathBuf>,
    /// Output velocity .npy [1, out_channels, F, H, W].
    #[arg(long)]
    out: PathBuf,
    /// What the transformer's weights are held and computed in.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: crate::dtype_arg::DtypeArg,
    /// How the blocks' linear weights are held: native or int8 (W8A8 products).
    #[arg(long, default_value = "native")]
    weights: headroom_model::WeightFormat,
}

/// Runs `headroom dit`.
pub fn run(args: DitArgs) -> Result<()> {
    let device = Device::cpu()?;
    match args.command {
        DitCommand::Forward(a) => forward(a, &device),
        DitCommand::Load(a) => load(a, &device),
    }
}

fn load(args: LoadArgs, device: &Device) -> Result<()> {
    let dtype = match args.dtype.as_str() {
        "f32" => DType::F32,
        "bf16" => DType::BF16,
        other => bail!("--dtype must be f32 or bf16, got {other:?}"),
    };
    let options = ImportOptions {
        config: args.config.clone(),
        ..ImportOptions::default()
    };
    let before = process_peak_rss_bytes().unwrap_or(0);
    let start = std::time::Instant::now();
    let (config, store) = open_transformer(&args.model, &options, device, dtype)
        .with_context(|| format!("opening {}", args.model.display()))?;
    let layout = store.layout().to_string();
    let model = WanTransformer::from_store(config, &store)?;
    let secs = start.elapsed().as_secs_f64();
    let weights = device.platform().memory_stats().allocated_now();
    let peak = process_peak_rss_bytes().unwrap_or(0);
    let c = model.config();
    println!(
        "{}: layout {layout}; {} layers, dim {}, {} heads, ffn {}, in {} / out {}",
        args.model.display(),
        c.num_layers,
        c.dim(),
        c.num_attention_heads,
        c.ffn_dim,
        c.in_channels,
        c.out_channels()
    );
    println!(
        "loaded in {secs:.1} s: weights {} ({weights} B); peak resident (VmHWM) {} ({peak} B) = {:.3}× the weights (before loading: {})",
        format_bytes(weights),
        format_bytes(peak),
        peak as f64 / weights.max(1) as f64,
        format_bytes(before)
    );
    Ok(())
}

fn forward(args: ForwardArgs, device: &Device) -> Result<()> {
    let options = ImportOptions {
        config: args.config.clone(),
        base: None,
        weights: args.weights,
    };
    let model = load_transformer(&args.model, &options, device, args.dtype.dtype(), None)
        .with_context(|| format!("loading the transformer from {}", args.model.display()))?;
    let mut x = read_npy(&args.latents, device)?;
    let channels = model.config().in_channels;
    if x.shape().get(1) != Some(&channels) {
        let Some(path) = &args.image_latents else {
            bail!("latents {:?} have not the model's {channels} channels; pass --image-latents to complete them", x.shape());
        };
        let cond = read_npy(path, device)?;
        x = Tensor::cat(&[&x, &cond], 1)
            .with_context(|| format!("concatenating {} after the latents", path.display()))?;
    }
    let text = args
        .text_embeds
        .as_ref()
        .map(|p| read_npy(p, device))
        .transpose()?;
    let v = model.forward(&x, args.timestep, text.as_ref(), None)?;
    write_npy(&args.out, &v)?;
    eprintln!("velocity {:?} → {}", v.shape(), args.out.display());
    Ok(())
}
