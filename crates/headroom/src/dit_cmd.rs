//! `headroom dit forward`: one full-sequence transformer forward, the reference-check
//! entry point.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use headroom_model::WanTransformer;
use headroom_tensor::io::npy::{read_npy, write_npy};
use headroom_tensor::{Device, Tensor};

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
    /// A diffusers WanTransformer3DModel folder.
    #[arg(long)]
    model: PathBuf,
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
}

/// Runs `headroom dit`.
pub fn run(args: DitArgs) -> Result<()> {
    let device = Device::cpu()?;
    match args.command {
        DitCommand::Forward(a) => forward(a, &device),
    }
}

fn forward(args: ForwardArgs, device: &Device) -> Result<()> {
    let model = WanTransformer::load(&args.model, device, args.dtype.dtype())
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
