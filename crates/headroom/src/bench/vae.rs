//! `headroom bench vae`: the streaming VAE decode per latent frame, or (`--decoder both`)
//! the model's full VAE against a TAEHV tiny decoder a block at a time.

use anyhow::Result;
use clap::Args;
use headroom_bench::{run_decoder_bench, run_vae_bench, DecoderBenchConfig, VaeBenchConfig};

/// Arguments of `headroom bench vae`.
#[derive(Debug, Args)]
pub struct VaeArgs {
    /// VAE config: wan2.1 (the real one, seeded weights) or tiny.
    #[arg(long, default_value = "wan2.1")]
    config: String,
    /// Video height in pixels.
    #[arg(long, default_value_t = 128)]
    height: usize,
    /// Video width in pixels.
    #[arg(long, default_value_t = 128)]
    width: usize,
    /// Latent frames to decode, one chunk each.
    #[arg(long, default_value_t = 4)]
    frames: usize,
    /// full (the streaming decode of --config, per latent frame) or both: the model's
    /// full VAE against a TAEHV tiny decoder, a block (3 latent frames) at a time, with
    /// --model, --tiny-decoder, --dtype, --reps and --reference.
    #[arg(long, default_value = "full")]
    decoder: String,
    /// With --decoder both: wan2.1 (the real VAE config, seeded), world, or a model
    /// folder (its vae/ and tiny_decoder.safetensors).
    #[arg(long, default_value = "wan2.1")]
    model: String,
    /// With --decoder both: a TAEHV file (default: the model folder's, else seeded
    /// weights of taew2_1's or taew2_2's shapes).
    #[arg(long)]
    tiny_decoder: Option<std::path::PathBuf>,
    /// With --decoder both: weights and compute dtype of both decoders.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: crate::dtype_arg::DtypeArg,
    /// With --decoder both: timed fresh streams per decoder; the best counts.
    #[arg(long, default_value_t = 2)]
    reps: usize,
    /// With --decoder both: taehv.py timed on the same shapes in the same run, e.g.
    /// "python tools/bench_taehv.py --taehv /path/to/taehv.py".
    #[arg(long)]
    reference: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `headroom bench vae`.
pub fn run(args: VaeArgs) -> Result<()> {
    match args.decoder.as_str() {
        "full" => {}
        "both" => return decoders(args),
        other => anyhow::bail!("--decoder {other:?}: use full or both"),
    }
    let report = run_vae_bench(&VaeBenchConfig {
        config: args.config,
        height: args.height,
        width: args.width,
        latent_frames: args.frames,
    })?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    print!("{}", headroom_bench::vae::summary(&report));
    Ok(())
}

/// `bench vae --decoder both`: full against tiny on one block.
fn decoders(args: VaeArgs) -> Result<()> {
    let report = run_decoder_bench(&DecoderBenchConfig {
        model: if args.model == "wan2.1" {
            args.model.clone()
        } else {
            crate::builtin_world::resolve(&args.model)?
        },
        tiny_decoder: args.tiny_decoder.clone(),
        height: args.height,
        width: args.width,
        dtype: args.dtype.dtype(),
        reps: args.reps,
        reference: args.reference.clone(),
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    print!(
        "{}",
        headroom_bench::decoders::markdown(&report, &args.model, args.reps)
    );
    Ok(())
}
