//! `headroom vae …`: decode and encode with a Wan VAE (any layout) or decode with a TAEHV
//! tiny decoder file, .npy in and out.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use headroom_engine::phases::DecodeStart;
use headroom_model::import::{load_vae, ImportOptions};
use headroom_model::taehv::is_taehv_file;
use headroom_model::{OutputFormat, StreamingDecodeState, StreamingDecoder, TinyDecoder, WanVae};
use headroom_tensor::io::npy::{read_npy, write_npy};
use headroom_tensor::{DType, Device, Tensor};

use crate::dtype_arg::DtypeArg;

/// Arguments of `headroom vae`.
#[derive(Debug, Args)]
pub struct VaeArgs {
    #[command(subcommand)]
    command: VaeCommand,
}

#[derive(Debug, Subcommand)]
enum VaeCommand {
    /// Decode latents [1, C, T, H, W] to video: denormalised for a Wan VAE, in the DiT's
    /// space for a TAEHV tiny decoder file.
    Decode(DecodeArgs),
    /// Encode video [1, 3, T, H, W] in [-1, 1] to the latent mean.
    Encode(EncodeArgs),
}

#[derive(Debug, Args)]
struct DecodeArgs {
    /// The VAE in any layout: a diffusers pipeline or vae folder, an original Wan folder
    /// (its Wan2.1_VAE.pth), a checkpoint file in original names (.pth, .safetensors), or
    /// a TAEHV tiny decoder file (taew2_1, taew2_2: .pth or .safetensors).
    #[arg(long)]
    model: PathBuf,
    /// A diffusers vae config.json overriding the folder's or the one inferred from shapes.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Latents .npy, f32 [1, C, T, H, W]: denormalised as diffusers' vae.decode takes them,
    /// or, for a TAEHV file, as the DiT makes them.
    #[arg(long)]
    latents: PathBuf,
    /// Split T into streaming chunks, e.g. 3,3,3 (must sum to T); one chunk by default.
    #[arg(long, value_delimiter = ',')]
    chunks: Option<Vec<usize>>,
    /// video (f32 [1, 3, T', H, W]) or planar_uint8 (u8 [3, T', H, W]).
    #[arg(long, default_value = "video")]
    format: String,
    /// Output .npy.
    #[arg(long)]
    out: PathBuf,
    /// What the VAE's weights are held and computed in.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: DtypeArg,
    /// A reference decode .npy of the same shape: print the max abs difference.
    #[arg(long)]
    compare: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct EncodeArgs {
    /// The VAE in any layout (as for `vae decode`).
    #[arg(long)]
    model: PathBuf,
    /// A diffusers vae config.json overriding the folder's or the one inferred from shapes.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Video .npy, f32 [1, 3, T, H, W] in [-1, 1].
    #[arg(long)]
    video: PathBuf,
    /// Output .npy: the latent mean [1, C, T', H', W'].
    #[arg(long)]
    out: PathBuf,
}

/// Runs `headroom vae`.
pub fn run(args: VaeArgs) -> Result<()> {
    let device = Device::cpu()?;
    match args.command {
        VaeCommand::Decode(a) => decode(a, &device),
        VaeCommand::Encode(a) => encode(a, &device),
    }
}

fn load(
    model: &std::path::Path,
    config: Option<&PathBuf>,
    device: &Device,
    dtype: DType,
) -> Result<WanVae> {
    let options = ImportOptions {
        config: config.cloned(),
        ..ImportOptions::default()
    };
    load_vae(model, &options, device, dtype)
        .with_context(|| format!("loading the VAE from {}", model.display()))
}

/// The decoder `vae decode` was given.
enum Loaded {
    Full(Box<WanVae>),
    Tiny(Box<TinyDecoder>),
}

fn decode(args: DecodeArgs, device: &Device) -> Result<()> {
    let format: OutputFormat = args.format.parse()?;
    let latents = read_npy(&args.latents, device)?;
    let t = latents.shape().get(2).copied().unwrap_or(0);
    let chunks = args.chunks.clone().unwrap_or_else(|| vec![t]);
    if chunks.iter().sum::<usize>() != t || chunks.contains(&0) {
        bail!("--chunks {chunks:?} must be positive and sum to the latent frames T = {t}");
    }
    let mut state = StreamingDecodeState::new("cli")?;
    let mut outs = Vec::new();
    let mut at = 0;
    let dtype = args.dtype.dtype();
    let loaded = if is_taehv_file(&args.model) {
        Loaded::Tiny(Box::new(
            TinyDecoder::load(&args.model, device, dtype)
                .with_context(|| format!("loading the tiny decoder {}", args.model.display()))?,
        ))
    } else {
        Loaded::Full(Box::new(load(
            &args.model,
            args.config.as_ref(),
            device,
            dtype,
        )?))
    };
    let start = std::time::Instant::now();
    // Each chunk crosses `decode_start` as a session's decode does.
    let control = DecodeStart::on(device.platform().as_ref());
    for n in chunks {
        let chunk = latents.narrow(2, at, n)?.contiguous()?;
        let out = match &loaded {
            // The Wan VAE here takes denormalised latents, as diffusers' vae.decode does.
            Loaded::Full(vae) => StreamingDecoder::new(vae, None)
                .decode_chunk_with(&chunk, &mut state, format, true, &control)?,
            Loaded::Tiny(tiny) => tiny
                .decode_streams(&[&chunk], &mut [&mut state], format, &control)?
                .and_then(|mut v| v.pop()),
        };
        outs.push(out.context("the decode produced no frames")?);
        at += n;
    }
    let elapsed = start.elapsed();
    let axis = match format {
        OutputFormat::Video => 2,
        OutputFormat::PlanarUint8 => 1,
    };
    let video = Tensor::cat(&outs.iter().collect::<Vec<_>>(), axis)?;
    write_npy(&args.out, &video)?;
    eprintln!(
        "{} decoder: {} latent frames in {} chunks → {} frames {:?} in {:.1} ms → {}",
        match loaded {
            Loaded::Full(_) => "full",
            Loaded::Tiny(_) => "tiny",
        },
        t,
        state.chunks_decoded,
        state.frames_decoded,
        video.shape(),
        elapsed.as_secs_f64() * 1e3,
        args.out.display()
    );
    if let Some(path) = &args.compare {
        let reference = read_npy(path, device)?;
        if reference.shape() != video.shape() {
            bail!(
                "--compare {}: shape {:?}, the decode's is {:?}",
                path.display(),
                reference.shape(),
                video.shape()
            );
        }
        let err = headroom_tensor::compare::max_abs_error(&video, &reference)?;
        println!("max abs difference from {}: {err:e}", path.display());
    }
    Ok(())
}

fn encode(args: EncodeArgs, device: &Device) -> Result<()> {
    let vae = load(&args.model, args.config.as_ref(), device, DType::F32)?;
    let video = read_npy(&args.video, device)?;
    let mean = vae.encode(&video)?;
    write_npy(&args.out, &mean)?;
    eprintln!(
        "encoded {:?} → latent mean {:?} → {}",
        video.shape(),
        mean.shape(),
        args.out.display()
    );
    Ok(())
}
