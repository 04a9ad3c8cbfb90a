//! `headroom generate`: one streaming session end to end on a built-in model, written
//! as Y4M or PNG frames, with its memory story.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use headroom_engine::{Engine, EngineConfig, SessionRequest};
use headroom_media::{write_png, Y4mWriter};
use headroom_mem::{format_bytes, parse_size, AllocatorConfig, AllocatorPolicy, ReclaimPolicy};
use headroom_model::camera::{Keys, Trajectory};
use headroom_tensor::io::npy::read_npy;
use headroom_tensor::io::safetensors::SafetensorsFile;
use headroom_tensor::{DType, Device, Tensor};

/// Arguments of `headroom generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Built-in model: tiny, small (default, seeded weights), …
    #[arg(long, default_value = "small")]
    model: String,
    /// Frames: 12·K − 3 for K chunks.
    #[arg(long, default_value_t = 33)]
    frames: usize,
    /// Width in pixels (multiple of 16).
    #[arg(long, default_value_t = 416)]
    width: usize,
    /// Height in pixels (multiple of 16).
    #[arg(long, default_value_t = 240)]
    height: usize,
    /// Noise seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// DMD steps per block.
    #[arg(long, default_value_t = 4)]
    steps: usize,
    /// Timestep shift.
    #[arg(long, default_value_t = 5.0)]
    flow_shift: f64,
    /// Text embeddings [L, text_dim]: .npy, or .safetensors holding one tensor.
    #[arg(long)]
    text_embeds: Option<PathBuf>,
    /// Camera keys, one character per latent frame: w/a/s/d move, i/k pitch, j/l yaw,
    /// - none (e.g. `wwwwwwddd`); or a JSON pose file `{"poses": [[4x4]…],
    /// "intrinsics": [[fx, fy, cx, cy]…]}` (one pose per pixel frame, 832×480 units).
    #[arg(long, default_value = "")]
    actions: String,
    /// Decode each chunk on a second thread while the next one denoises (same output).
    #[arg(long)]
    overlap: bool,
    /// Commit the last DMD step's keys/values instead of running the commit forward.
    #[arg(long)]
    reuse_last_step_kv: bool,
    /// Reclaim policy: never, before-decode, bounded[:…], always.
    #[arg(long, default_value = "before-decode")]
    policy: String,
    /// Allocator: pytorch or expandable.
    #[arg(long, default_value = "pytorch")]
    allocator: String,
    /// KV page budget (B, KiB, MiB, GiB); `auto` sizes it for this one session.
    #[arg(long, default_value = "auto")]
    kv_budget: String,
    /// Output: a .y4m file or a directory for PNG frames.
    #[arg(long, default_value = "out.y4m")]
    out: PathBuf,
    /// Print the report as JSON on stdout (progress goes to stderr).
    #[arg(long)]
    json: bool,
}

fn load_text(path: &PathBuf, device: &Device) -> Result<Tensor> {
    if path.extension().is_some_and(|e| e == "safetensors") {
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

enum Sink {
    Y4m(Y4mWriter),
    Png(PathBuf, usize),
}

/// Runs `headroom generate`.
pub fn run(args: GenerateArgs) -> Result<()> {
    let reclaim: ReclaimPolicy = args.policy.parse()?;
    let policy: AllocatorPolicy = args.allocator.parse()?;
    let engine = Engine::new(EngineConfig {
        model: args.model.clone(),
        allocator: AllocatorConfig::with_policy(policy),
        reclaim,
        kv_budget_bytes: match args.kv_budget.as_str() {
            "auto" => None,
            size => Some(parse_size(size)?),
        },
        ..EngineConfig::default()
    })?;
    let device = Device::new(engine.platform().clone());
    let text = args
        .text_embeds
        .as_ref()
        .map(|p| load_text(p, &device))
        .transpose()?;
    let request = SessionRequest {
        seed: args.seed,
        steps: args.steps,
        flow_shift: args.flow_shift,
        text_embeds: text,
        actions: if args.actions.ends_with(".json") {
            Vec::new()
        } else {
            Keys::script(&args.actions)?
        },
        trajectory: if args.actions.ends_with(".json") {
            let text = std::fs::read_to_string(&args.actions)
                .with_context(|| format!("reading {}", args.actions))?;
            Some(Trajectory::from_json(&text)?)
        } else {
            None
        },
        overlap: args.overlap,
        reuse_last_step_kv: args.reuse_last_step_kv,
        ..SessionRequest::new(args.width, args.height, args.frames)
    };
    let mut sink = if args.out.extension().is_some_and(|e| e == "y4m") {
        Sink::Y4m(Y4mWriter::create(&args.out, args.width, args.height, 16)?)
    } else if args.out.extension().is_some() {
        bail!(
            "--out {}: use a .y4m file or a directory for PNG frames (MP4 is not built yet)",
            args.out.display()
        );
    } else {
        std::fs::create_dir_all(&args.out)
            .with_context(|| format!("creating {}", args.out.display()))?;
        Sink::Png(args.out.clone(), 0)
    };
    let platform = engine.platform().clone();
    platform.reset_peak_stats();
    let start = Instant::now();
    let mut session = engine.open_session(request)?;
    let total = session.chunks_total();
    let mut chunk_times = Vec::new();
    let mut ttfc = 0.0;
    let mut frames = 0;
    for i in 0..total {
        let t = Instant::now();
        let chunk = session.next_chunk()?;
        let secs = t.elapsed().as_secs_f64();
        if i == 0 {
            ttfc = start.elapsed().as_secs_f64();
        }
        chunk_times.push(secs);
        let [n, h, w, _] = *chunk.frames.shape() else {
            bail!("frames must be [T, H, W, 3]")
        };
        let bytes = chunk.frames.to_vec::<u8>()?;
        for f in bytes.chunks_exact(h * w * 3) {
            match &mut sink {
                Sink::Y4m(writer) => writer.write_frame(f)?,
                Sink::Png(dir, index) => {
                    write_png(dir, *index, w, h, f)?;
                    *index += 1;
                }
            }
        }
        frames += n;
        eprintln!(
            "chunk {}/{total}: {n} frames in {secs:.2} s (denoise {:.2} s, commit {:.2} s, decode {:.2} s), reserved {}",
            i + 1,
            chunk.timings.denoise.as_secs_f64(),
            chunk.timings.commit.as_secs_f64(),
            chunk.timings.decode.as_secs_f64(),
            format_bytes(chunk.stats_decoded.reserved_bytes.all().current as u64)
        );
    }
    drop(session);
    if let Sink::Y4m(writer) = sink {
        writer.finish()?;
    }
    let stats = platform.memory_stats();
    let mean = chunk_times.iter().sum::<f64>() / chunk_times.len().max(1) as f64;
    let report = serde_json::json!({
        "frames": frames,
        "width": args.width,
        "height": args.height,
        "ttfc_s": ttfc,
        "chunk_mean_s": mean,
        "allocated_peak_bytes": stats.allocated_bytes.all().peak,
        "reserved_peak_bytes": stats.reserved_bytes.all().peak,
        "post_session_reserved_bytes": stats.reserved_bytes.all().current,
        "reclaims": stats.num_reclaims,
        "reclaim_s": stats.reclaim_ns as f64 / 1e9,
        "output": args.out.display().to_string(),
    });
    if args.json {
        println!("{report}");
    } else {
        println!(
            "{frames} frames {}x{} → {}",
            args.width,
            args.height,
            args.out.display()
        );
        println!("time to first chunk {ttfc:.2} s, mean chunk {mean:.2} s");
        println!(
            "allocator peak: {} allocated, {} reserved; after the session: {} reserved",
            format_bytes(stats.allocated_bytes.all().peak as u64),
            format_bytes(stats.reserved_bytes.all().peak as u64),
            format_bytes(stats.reserved_bytes.all().current as u64)
        );
        println!(
            "reclaims: {} in {:.3} s (policy {reclaim})",
            stats.num_reclaims,
            stats.reclaim_ns as f64 / 1e9
        );
    }
    Ok(())
}
