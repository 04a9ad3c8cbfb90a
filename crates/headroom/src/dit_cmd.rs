//! `headroom dit forward`: one full-sequence transformer forward, the reference-check
//! entry point.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use headroom_model::import::{load_transformer, ImportOptions};
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
}

/// Runs `headroom dit`.
pub fn run(args: DitArgs) -> Result<()> {
    let device = Device::cpu()?;
    match args.command {
        DitCommand::Forward(a) => forward(a, &device),
    }
}

fn forward(args: ForwardArgs, device: &Device) -> Result<()> {
    let options = ImportOptions {
        config: args.config.clone(),
        base: None,
    };
    let model = load_transformer(&args.model, &options, device, DType::F32, None)
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
