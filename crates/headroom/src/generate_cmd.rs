//! `headroom generate`: one streaming session end to end on a built-in model, written
//! as Y4M or PNG frames, with its memory story.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::outputs::{commit_all, Output};
use crate::ranks::RankArgs;
use crate::session_args::SessionShape;
use headroom_engine::replicated::{self, LeadSession, RankMemory};
use headroom_engine::{
    Chunk, Engine, EngineConfig, LatentRecorder, NoiseSource, RankGroups, Session, SessionRequest,
};
use headroom_media::{write_png, Mp4Writer, Y4mWriter};
use headroom_mem::{format_bytes, parse_size, AllocatorConfig, AllocatorPolicy, ReclaimPolicy};
use headroom_model::camera::{Keys, Trajectory};
use headroom_model::import::lingbot::trajectory_from_dir;
use headroom_tensor::io::npy::{read_npy, write_npy};
use headroom_tensor::io::safetensors::SafetensorsFile;
use headroom_tensor::{DType, Device, Tensor};
use headroom_text::TextEncoderMode;
use indicatif::{ProgressBar, ProgressStyle};

/// Arguments of `headroom generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    shape: SessionShape,
    #[command(flatten)]
    decoders: crate::session_args::DecoderArgs,
    /// A transformer checkpoint over --model's VAE and text encoder (any layout: a
    /// Self-Forcing .pt, a LingBot-World or original Wan folder, a ComfyUI file).
    #[arg(long)]
    transformer: Option<String>,
    /// The --transformer checkpoint's config.json (diffusers or original keys), for a
    /// checkpoint that carries none and whose shapes do not settle it.
    #[arg(long, requires = "transformer")]
    config: Option<PathBuf>,
    /// DMD steps per block.
    #[arg(long, default_value_t = 4)]
    steps: usize,
    /// Timestep shift.
    #[arg(long, default_value_t = 5.0)]
    flow_shift: f64,
    /// Text embeddings [L, text_dim]: .npy, or .safetensors holding one tensor.
    #[arg(long, conflicts_with = "prompt")]
    text_embeds: Option<PathBuf>,
    /// A prompt, encoded by the model folder's text_encoder/ + tokenizer/ (the tiny and
    /// small built-in models have a seeded one).
    #[arg(long)]
    prompt: Option<String>,
    /// Text encoder weights: resident (kept) or on-demand (loaded for the prompt and
    /// released before the video starts).
    #[arg(long, default_value = "resident")]
    text_encoder: String,
    /// Byte budget of the prompt-embedding cache (B, KiB, MiB, GiB).
    #[arg(long, default_value = "64MiB")]
    text_cache: String,
    /// A folder that keeps the planned allocator's plans across runs (a corrupt or
    /// stale file is rebuilt): the next run with the same shapes replays its first
    /// session without planning it.
    #[arg(long)]
    plan_cache: Option<PathBuf>,
    /// Camera keys, one character per latent frame: w/a/s/d move, i/k pitch, j/l yaw,
    /// `-` none (e.g. `wwwwwwddd`); or a JSON pose file `{"poses": [[4x4]…],
    /// "intrinsics": [[fx, fy, cx, cy]…]}` (one pose per pixel frame, 832×480 units); or a
    /// LingBot-World folder with poses.npy [F, 4, 4] and intrinsics.npy [F, 4].
    #[arg(long, default_value = "")]
    actions: String,
    /// Decode each chunk on a second thread while the next one denoises (same output).
    #[arg(long)]
    overlap: bool,
    /// Commit the last DMD step's keys/values instead of running the commit forward.
    #[arg(long)]
    reuse_last_step_kv: bool,
    /// Camera guidance: each step's velocity pushed away from a still camera's by this
    /// scale (two forwards a step; default: the model's `camera_guidance`, 1 = off).
    #[arg(long)]
    camera_guidance: Option<f64>,
    /// Noise to use instead of the seeded generator: an f32 .npy `[blocks, steps, C, 3,
    /// h, w]` holding every tensor the loop draws, in draw order (per block: the initial
    /// noise, then each re-noise), e.g. from `tools/reference_rollout.py`.
    #[arg(long)]
    noise: Option<PathBuf>,
    /// Write each block's clean latents, f32 `[blocks, C, 3, h, w]`, as they go to the
    /// decoder, to this .npy file.
    #[arg(long)]
    dump_latents: Option<PathBuf>,
    /// Reclaim policy: never, before-decode, bounded[:…], fit[:slack=F], always.
    #[arg(long, default_value = "before-decode")]
    policy: String,
    /// Allocator: planned (default: sessions replay a plan at the live peak), pytorch or
    /// expandable.
    #[arg(long, default_value = "planned")]
    allocator: String,
    /// KV page budget (B, KiB, MiB, GiB), a fraction of the device capacity (e.g. 0.05),
    /// or `auto` (sized for this one session).
    #[arg(long, default_value = "auto")]
    kv_budget: String,
    /// First frame for image-conditioned models: PNG or JPEG, resized to the video size
    /// (default: the model folder's own first_frame.png, if it has one).
    #[arg(long)]
    image: Option<PathBuf>,
    /// Write the allocator's snapshot with its event trace as a PyTorch memory pickle
    /// (pytorch.org/memory_viz).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Output: an .mp4 (H.264) or .y4m file, or a directory for PNG frames.
    #[arg(long, default_value = "out.mp4")]
    out: PathBuf,
    /// Print the report as JSON on stdout (progress goes to stderr).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    ranks: RankArgs,
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
    Mp4(Box<Mp4Writer>),
    Y4m(Y4mWriter),
    Png(PathBuf, usize),
}

/// The kind of video `--out` names, from its extension.
#[derive(Debug, Clone, Copy, PartialEq)]
enum VideoKind {
    Mp4,
    Y4m,
    PngFrames,
}

impl VideoKind {
    fn of(out: &Path) -> Result<Self> {
        match out.extension().and_then(|e| e.to_str()) {
            Some("mp4") => Ok(VideoKind::Mp4),
            Some("y4m") => Ok(VideoKind::Y4m),
            None => Ok(VideoKind::PngFrames),
            Some(_) => bail!(
                "--out {}: use a .mp4 or .y4m file, or a folder (no extension) for PNG frames",
                out.display()
            ),
        }
    }
}

impl Sink {
    /// A writer of `kind` at `path` (the output's partial name).
    fn create(kind: VideoKind, path: &Path, width: usize, height: usize) -> Result<Self> {
        Ok(match kind {
            VideoKind::Mp4 => Sink::Mp4(Box::new(Mp4Writer::create(path, width, height, FPS)?)),
            VideoKind::Y4m => Sink::Y4m(Y4mWriter::create(path, width, height, FPS)?),
            VideoKind::PngFrames => {
                std::fs::create_dir_all(path).with_context(|| {
                    format!("--out {}: cannot create the folder", path.display())
                })?;
                Sink::Png(path.to_path_buf(), 0)
            }
        })
    }

    fn write(&mut self, frame: &[u8], width: usize, height: usize) -> Result<()> {
        match self {
            Sink::Mp4(writer) => writer.write_frame(frame)?,
            Sink::Y4m(writer) => writer.write_frame(frame)?,
            Sink::Png(dir, index) => {
                write_png(dir, *index, width, height, frame)?;
                *index += 1;
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<()> {
        match self {
            Sink::Mp4(writer) => {
                writer.finish()?;
            }
            Sink::Y4m(writer) => {
                writer.finish()?;
            }
            Sink::Png(..) => {}
        }
        Ok(())
    }
}

/// Every file the run writes, checked before any weights load.
struct Outputs {
    kind: VideoKind,
    video: Output,
    latents: Option<Output>,
    trace: Option<Output>,
}

impl Outputs {
    fn check(args: &GenerateArgs, width: usize, height: usize) -> Result<Self> {
        let kind = VideoKind::of(&args.out)?;
        let video = match kind {
            VideoKind::Mp4 => {
                headroom_media::check_h264_size(width, height, FPS)
                    .with_context(|| format!("--out {}", args.out.display()))?;
                Output::file("--out", &args.out)?
            }
            VideoKind::Y4m => Output::file("--out", &args.out)?,
            VideoKind::PngFrames => Output::dir("--out", &args.out)?,
        };
        let file = |field, path: &Option<PathBuf>| {
            path.as_deref().map(|p| Output::file(field, p)).transpose()
        };
        Ok(Self {
            kind,
            video,
            latents: file("--dump-latents", &args.dump_latents)?,
            trace: file("--trace", &args.trace)?,
        })
    }
}

/// Loads a PNG or JPEG first frame, resized (bicubic) to `width × height`, as
/// `[3, H, W]` in [−1, 1].
fn load_image(path: &Path, width: usize, height: usize, device: &Device) -> Result<Tensor> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("--image {}: cannot read it", path.display()))?;
    let image =
        headroom_engine::first_frame::decode_image(&bytes, headroom_engine::first_frame::MAX_SIDE)
            .map_err(|e| anyhow::anyhow!("--image {}: {e}", path.display()))?;
    Ok(headroom_engine::first_frame::to_tensor(
        &image, width, height, device,
    )?)
}

/// Frames per second of the written video.
const FPS: u32 = 16;

/// A session as the chunk loop drives it: alone, or led on every rank of a mesh.
trait ChunkSource {
    /// Chunks the session will produce.
    fn chunks_total(&self) -> usize;
    /// The next chunk.
    fn next_chunk(&mut self) -> headroom_engine::Result<Chunk>;
    /// Ends the session: every rank's memory, when it ran on a mesh.
    fn finish(self: Box<Self>, engine: &Engine) -> Result<Option<Vec<RankMemory>>>;
}

impl ChunkSource for Session {
    fn chunks_total(&self) -> usize {
        Session::chunks_total(self).unwrap_or(0)
    }
    fn next_chunk(&mut self) -> headroom_engine::Result<Chunk> {
        Session::next_chunk(self)
    }
    fn finish(self: Box<Self>, _: &Engine) -> Result<Option<Vec<RankMemory>>> {
        Ok(None)
    }
}

impl ChunkSource for LeadSession {
    fn chunks_total(&self) -> usize {
        self.session().and_then(Session::chunks_total).unwrap_or(0)
    }
    fn next_chunk(&mut self) -> headroom_engine::Result<Chunk> {
        LeadSession::next_chunk(self)
    }
    fn finish(self: Box<Self>, engine: &Engine) -> Result<Option<Vec<RankMemory>>> {
        Ok(Some(self.close(engine)?))
    }
}

/// What the command line says, checked before any weights load.
struct Prepared {
    config: EngineConfig,
    reclaim: ReclaimPolicy,
    width: usize,
    height: usize,
    actions: Vec<Keys>,
    trajectory: Option<Trajectory>,
    /// The files the run writes (rank 0 writes them).
    outputs: Mutex<Outputs>,
}

fn prepare(args: &GenerateArgs) -> Result<Prepared> {
    let reclaim: ReclaimPolicy = args.policy.parse()?;
    let policy: AllocatorPolicy = args.allocator.parse()?;
    let kv_budget_bytes =
        crate::session_args::kv_budget(&args.kv_budget, args.shape.capacity_bytes()?)?;
    let (actions, trajectory) = if Path::new(&args.actions).is_dir() {
        // LingBot-World's camera input: poses.npy + intrinsics.npy.
        let device = Device::cpu()?;
        let dir = Path::new(&args.actions);
        (Vec::new(), Some(trajectory_from_dir(dir, &device)?))
    } else if args.actions.ends_with(".json") {
        let text = std::fs::read_to_string(&args.actions)
            .with_context(|| format!("--actions {}: cannot read it", args.actions))?;
        (Vec::new(), Some(Trajectory::from_json(&text)?))
    } else {
        (Keys::script(&args.actions)?, None)
    };
    let text_encoder: TextEncoderMode = args.text_encoder.parse().context("--text-encoder")?;
    let text_cache_bytes = parse_size(&args.text_cache).context("--text-cache")?;
    let model = args.shape.resolved_model(crate::builtin_world::WORLD)?;
    let (width, height) = args.shape.size(&model);
    let config = args.decoders.apply(EngineConfig {
        model,
        transformer: args.transformer.clone(),
        transformer_config: args.config.clone(),
        allocator: AllocatorConfig::with_policy(policy),
        reclaim,
        kv_budget_bytes,
        capacity: args.shape.capacity_bytes()?,
        text_encoder,
        text_cache_bytes,
        weight_dtype: args.shape.dtype.dtype(),
        plan_cache: args.plan_cache.clone(),
        ..EngineConfig::default()
    });
    crate::session_args::require_end("generate writes a file, which", args.shape.frames)?;
    headroom_engine::validate::check_request(
        &config,
        args.ranks.mesh()?,
        width,
        height,
        args.shape.frames,
    )?;
    let frames = args.shape.frames;
    headroom_engine::model_source::check_camera(
        frames,
        actions.len(),
        trajectory.as_ref().map(|t| t.poses.len()),
    )?;
    let latent = headroom_engine::model_source::latent_frames(frames);
    if !actions.is_empty() && actions.len() < latent {
        eprintln!(
            "--actions: {} key sets for {latent} latent frames; latent frames {}–{latent} have no keys",
            actions.len(),
            actions.len() + 1
        );
    }
    let outputs = Mutex::new(Outputs::check(args, width, height)?);
    Ok(Prepared {
        config,
        reclaim,
        width,
        height,
        actions,
        trajectory,
        outputs,
    })
}

/// Runs `headroom generate`.
pub fn run(args: GenerateArgs) -> Result<()> {
    crate::outputs::stop_on_signals("generate")?;
    let prepared = prepare(&args)?;
    let on_gpu = args.shape.device != crate::device_arg::DeviceArg::Cpu;
    if args.ranks.is_single()? {
        let engine = match args.shape.device.engine_device(
            &prepared.config.allocator,
            prepared.reclaim,
            prepared.config.capacity,
        )? {
            Some(device) => Engine::on_device(prepared.config.clone(), device)?,
            None => Engine::new(prepared.config.clone())?,
        };
        let report = stream(&args, &prepared, &engine, |request| {
            Ok(Box::new(engine.open_session(request)?) as Box<dyn ChunkSource>)
        })?;
        return print_report(&args, &report);
    }
    let gpu = |local: usize| args.shape.device.rank_gpu(local, &prepared.config);
    let gpu: crate::ranks::GpuFor<'_> = &gpu;
    let report = args.ranks.launch(on_gpu.then_some(gpu), |groups, device| {
        rank_main(&args, &prepared, groups, device)
    })?;
    match report {
        Some(report) => print_report(&args, &report),
        None => Ok(()),
    }
}

/// One rank of a sharded `generate`: rank 0 streams the session and writes the video,
/// every other rank follows its commands.
fn rank_main(
    args: &GenerateArgs,
    prepared: &Prepared,
    groups: RankGroups,
    device: Option<Device>,
) -> Result<Report> {
    let config = &prepared.config;
    let engine = match device {
        Some(device) => Engine::on_mesh_device(config.clone(), device, &groups)?,
        None => Engine::on_mesh(config.clone(), config.cpu_platform()?, &groups)?,
    };
    if groups.rank() != 0 {
        replicated::follow(&engine, &groups.world)?;
        return Ok(Report::default());
    }
    let world = Arc::clone(&groups.world);
    let out = stream(args, prepared, &engine, |request| {
        Ok(Box::new(replicated::lead_open(&engine, &world, request)?) as Box<dyn ChunkSource>)
    });
    // However rank 0 ended, the followers leave their loops (after an abort this fails
    // at once, and the job is ending anyway).
    let shutdown = replicated::lead_shutdown(&world);
    let mut report = out?;
    shutdown?;
    report.backend = groups.backend();
    Ok(report)
}

/// What a finished run reports.
#[derive(Debug, Default)]
struct Report {
    json: serde_json::Value,
    lines: Vec<String>,
    ranks: Option<Vec<RankMemory>>,
    backend: &'static str,
}

fn print_report(args: &GenerateArgs, report: &Report) -> Result<()> {
    let mut json = report.json.clone();
    if let (Some(ranks), Some(obj)) = (&report.ranks, json.as_object_mut()) {
        obj.insert("comm".into(), serde_json::json!(report.backend));
        obj.insert("ranks".into(), serde_json::to_value(ranks)?);
    }
    if args.json {
        println!("{json}");
        return Ok(());
    }
    for line in &report.lines {
        println!("{line}");
    }
    if let Some(ranks) = &report.ranks {
        println!(
            "per rank ({} × tp {} × sp {} on {}):",
            ranks.len(),
            args.ranks.tp,
            args.ranks.sp,
            report.backend
        );
        println!(
            "{:>5} {:>8} {:>8} {:>18} {:>18} {:>18} {:>22}",
            "rank",
            "tp_rank",
            "sp_rank",
            "allocated peak",
            "reserved peak",
            "after session",
            "collectives per chunk"
        );
        let chunks = report.json["chunks"].as_array().map_or(1, Vec::len).max(1) as f64;
        for r in ranks {
            let (bytes, secs) = r
                .collectives
                .values()
                .fold((0u64, 0f64), |(b, s), t| (b + t.bytes, s + t.seconds));
            println!(
                "{:>5} {:>8} {:>8} {:>18} {:>18} {:>18} {:>22}",
                r.rank,
                r.tp_rank,
                r.sp_rank,
                r.allocated_peak_bytes,
                r.reserved_peak_bytes,
                r.post_session_reserved_bytes,
                format!(
                    "{} in {:.3} s",
                    format_bytes((bytes as f64 / chunks) as u64),
                    secs / chunks
                )
            );
        }
    }
    Ok(())
}

/// Streams one session on `engine` (opened by `open`) into the output, and reports.
fn stream<O>(args: &GenerateArgs, prepared: &Prepared, engine: &Engine, open: O) -> Result<Report>
where
    O: FnOnce(SessionRequest) -> Result<Box<dyn ChunkSource>>,
{
    let (width, height) = (prepared.width, prepared.height);
    let reclaim = prepared.reclaim;
    let platform = engine.platform().clone();
    if args.trace.is_some() {
        platform.allocator().set_history(1 << 20);
    }
    let device = engine.device().clone();
    let text = args
        .text_embeds
        .as_ref()
        .map(|p| load_text(p, &device))
        .transpose()?;
    let image = args
        .image
        .as_ref()
        .map(|p| load_image(p, width, height, &device))
        .transpose()?;
    let noise = match &args.noise {
        Some(path) => NoiseSource::Supplied(
            read_npy(path, &device)
                .with_context(|| format!("--noise {}: cannot read it as .npy", path.display()))?,
        ),
        None => NoiseSource::Generator,
    };
    let recorder = args
        .dump_latents
        .as_ref()
        .map(|_| std::sync::Arc::new(LatentRecorder::default()));
    let request = SessionRequest {
        seed: args.shape.seed,
        steps: args.steps,
        flow_shift: args.flow_shift,
        text_embeds: text,
        prompt: args.prompt.clone(),
        image,
        actions: prepared.actions.clone(),
        trajectory: prepared.trajectory.clone(),
        overlap: args.overlap,
        reuse_last_step_kv: args.reuse_last_step_kv,
        camera_guidance: args.camera_guidance,
        noise,
        latent_sink: recorder.clone().map(|r| r as _),
        ..SessionRequest::new(width, height, args.shape.frames)
    };
    platform.reset_peak_stats();
    let start = Instant::now();
    // The request is validated (and admitted) before any output exists.
    let mut session = open(request)?;
    let mut outputs = prepared
        .outputs
        .lock()
        .map_err(|_| anyhow::anyhow!("the outputs' lock was poisoned"))?;
    let mut sink = Sink::create(outputs.kind, outputs.video.open(), width, height)?;
    let total = session.chunks_total();
    crate::outputs::set_progress(0, total);
    let progress = ProgressBar::new(total as u64);
    progress.set_style(
        ProgressStyle::with_template("{spinner} chunk {pos}/{len} [{bar:30}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut chunk_times = Vec::new();
    let mut chunk_reports = Vec::new();
    let mut ttfc = 0.0;
    let mut frames = 0;
    let outcome: Result<()> = (|| {
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
                sink.write(f, w, h)?;
            }
            frames += n;
            crate::outputs::set_progress(i + 1, total);
            chunk_reports.push(serde_json::json!({
                "frames": n,
                "total_s": secs,
                "denoise_s": chunk.timings.denoise.as_secs_f64(),
                "commit_s": chunk.timings.commit.as_secs_f64(),
                "decode_s": chunk.timings.decode.as_secs_f64(),
                "allocated_bytes": chunk.stats_decoded.allocated_bytes.all().current,
                "reserved_bytes": chunk.stats_decoded.reserved_bytes.all().current,
            }));
            let line = format!(
                "{n} frames in {secs:.2} s (denoise {:.2} s, commit {:.2} s, decode {:.2} s), reserved {}",
                chunk.timings.denoise.as_secs_f64(),
                chunk.timings.commit.as_secs_f64(),
                chunk.timings.decode.as_secs_f64(),
                format_bytes(chunk.stats_decoded.reserved_bytes.all().current as u64)
            );
            if progress.is_hidden() {
                // Not a terminal (logs, CI): one line per chunk instead of a bar.
                eprintln!("chunk {}/{total}: {line}", i + 1);
            }
            progress.set_message(line);
            progress.inc(1);
        }
        Ok(())
    })();
    progress.finish();
    let ranks = match outcome {
        Ok(()) => session.finish(engine),
        Err(e) => {
            drop(session);
            Err(e)
        }
    };
    // On any failure the outputs' partial files go with them (Output's drop).
    let ranks = ranks?;
    sink.finish()?;
    let Outputs {
        video,
        latents,
        trace,
        ..
    } = &mut *outputs;
    if let (Some(out), Some(recorder)) = (latents.as_mut(), &recorder) {
        write_npy(out.open(), &recorder.stacked(&device)?).with_context(|| {
            format!("--dump-latents {}: cannot write it", out.target().display())
        })?;
    }
    if let Some(out) = trace.as_mut() {
        std::fs::write(out.open(), platform.allocator().snapshot().to_pickle())
            .with_context(|| format!("--trace {}: cannot write it", out.target().display()))?;
    }
    let mut all: Vec<&mut Output> = vec![video];
    all.extend(latents.as_mut());
    all.extend(trace.as_mut());
    commit_all(&mut all)?;
    let stats = platform.memory_stats();
    let mean = chunk_times.iter().sum::<f64>() / chunk_times.len().max(1) as f64;
    let text_report = engine.text_report();
    let launcher = device.launcher();
    let gpu = launcher.map(|l| l.describe());
    let checked = launcher.and_then(|l| l.check_report());
    let report = serde_json::json!({
        "device": gpu.clone().unwrap_or_else(|| "cpu".into()),
        "checked_launches": checked,
        "text_encoder": text_report,
        "plan_cache": engine.plan_cache_counts(),
        "frames": frames,
        "width": width,
        "height": height,
        "decoder": args.decoders.decoder.as_str(),
        "weights_bytes": engine.resident().weights_bytes,
        "ttfc_s": ttfc,
        "chunk_mean_s": mean,
        "chunks": chunk_reports,
        "allocated_peak_bytes": stats.allocated_bytes.all().peak,
        "reserved_peak_bytes": stats.reserved_bytes.all().peak,
        "post_session_reserved_bytes": stats.reserved_bytes.all().current,
        "reclaims": stats.num_reclaims,
        "reclaim_s": stats.reclaim_ns as f64 / 1e9,
        "output": args.out.display().to_string(),
    });
    let mut lines = Vec::new();
    {
        lines.push(format!(
            "{frames} frames {width}x{height} → {}",
            args.out.display()
        ));
        if let Some(gpu) = &gpu {
            lines.push(format!("device: {gpu}"));
        }
        if let Some(c) = &checked {
            lines.push(format!(
                "checked: {} launches of {} kernels and {} GEMMs ({:.2} GFLOP), {} uploaded, {} downloaded; no values computed (frames are black)",
                c.launches.values().sum::<u64>(),
                c.launches.len(),
                c.gemms,
                c.gemm_flops / 1e9,
                format_bytes(c.uploaded_bytes),
                format_bytes(c.downloaded_bytes)
            ));
        }
        lines.push(format!(
            "time to first chunk {ttfc:.2} s, mean chunk {mean:.2} s"
        ));
        lines.push(format!(
            "allocator peak: {} allocated, {} reserved; after the session: {} reserved",
            format_bytes(stats.allocated_bytes.all().peak as u64),
            format_bytes(stats.reserved_bytes.all().peak as u64),
            format_bytes(stats.reserved_bytes.all().current as u64)
        ));
        lines.push(format!(
            "reclaims: {} in {:.3} s (policy {reclaim})",
            stats.num_reclaims,
            stats.reclaim_ns as f64 / 1e9
        ));
        if let Some(t) = text_report {
            lines.push(format!(
                "text encoder ({}): {} weights resident ({} while loaded, {} loads); cache {} of {}, {} hits / {} misses",
                t.mode,
                format_bytes(t.resident_weight_bytes),
                format_bytes(t.weight_bytes),
                t.loads,
                format_bytes(t.cache_bytes),
                format_bytes(t.cache_budget_bytes),
                t.cache_hits,
                t.cache_misses
            ));
        }
    }
    Ok(Report {
        json: report,
        lines,
        ranks,
        backend: "",
    })
}
