//! `headroom text encode`: a prompt to the Wan pipelines' text embeddings, the
//! reference-check entry point of the text encoder.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use headroom_tensor::io::npy::write_npy;
use headroom_tensor::{DType, Device};
use headroom_text::{TextEncoder, TextEncoderMode, MAX_LENGTH};

/// Arguments of `headroom text`.
#[derive(Debug, Args)]
pub struct TextArgs {
    #[command(subcommand)]
    command: TextCommand,
}

#[derive(Debug, Subcommand)]
enum TextCommand {
    /// Encode a prompt: cleaned, tokenised, UMT5-encoded, padded rows zeroed.
    Encode(EncodeArgs),
}

#[derive(Debug, Args)]
struct EncodeArgs {
    /// A folder holding text_encoder/ (transformers UMT5EncoderModel) and tokenizer/
    /// (a diffusers Wan pipeline folder works), or a Wan repo folder with
    /// models_t5_umt5-xxl-enc-bf16.pth and google/umt5-xxl/.
    #[arg(long)]
    model: PathBuf,
    /// The prompt.
    #[arg(long)]
    prompt: String,
    /// Tokens per embedding: the prompt is truncated to it and padded up to it.
    #[arg(long, default_value_t = MAX_LENGTH)]
    max_length: usize,
    /// Storage dtype of the weights (compute is f32): f32 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Output embeddings .npy [max_length, d_model] f32.
    #[arg(long)]
    out: PathBuf,
}

/// Runs `headroom text`.
pub fn run(args: TextArgs) -> Result<()> {
    match args.command {
        TextCommand::Encode(a) => encode(a),
    }
}

fn encode(args: EncodeArgs) -> Result<()> {
    let dtype: DType = args
        .dtype
        .parse()
        .map_err(|e: String| anyhow::anyhow!("--dtype: {e}"))?;
    if !dtype.is_float() {
        anyhow::bail!("--dtype must be f32 or bf16, got {dtype}");
    }
    let device = Device::cpu()?;
    let encoder = TextEncoder::load(&args.model, &device, dtype, TextEncoderMode::Resident, 0)
        .with_context(|| format!("loading the text encoder from {}", args.model.display()))?
        .with_max_length(args.max_length)
        .context("--max-length")?;
    let tokens = encoder.tokenize(&args.prompt)?;
    let embeds = encoder.encode(&args.prompt)?;
    write_npy(&args.out, &embeds)
        .with_context(|| format!("--out {}: cannot write it", args.out.display()))?;
    eprintln!(
        "{} tokens (of {}), embeddings {:?} → {}",
        tokens.n,
        args.max_length,
        embeds.shape(),
        args.out.display()
    );
    Ok(())
}
