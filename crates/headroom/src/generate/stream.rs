//! The chunk loop: one session pulled chunk by chunk into the video writer, with a
//! progress bar, then the outputs committed and the run's report built.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use headroom_engine::{Drive, Engine, LatentRecorder, NoiseSource, SessionDriver, SessionRequest};
use headroom_mem::format_bytes;
use headroom_tensor::io::npy::{read_npy, write_npy};
use indicatif::{ProgressBar, ProgressStyle};

use super::args::GenerateArgs;
use super::inputs::{load_image, load_text, Prepared};
use super::report::{ChunkReport, GenerateReport, Run};
use super::video::{Outputs, Sink};
use crate::outputs::{commit_all, Output};

/// Streams one session on `engine` (driven as `how` says: alone, or led on every rank of
/// a mesh) into the output, and reports.
pub fn stream(
    args: &GenerateArgs,
    prepared: &Prepared,
    engine: &Engine,
    how: Drive<'_>,
) -> Result<Run> {
    let (width, height) = (prepared.width, prepared.height);
    let reclaim = prepared.config.reclaim;
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
    let mut session = match &args.resume {
        Some(path) => SessionDriver::resume(engine, path, how)
            .with_context(|| format!("--resume {}", path.display()))?,
        None => SessionDriver::open(engine, request, how)?,
    };
    if let Some(every) = args.snapshot_every {
        std::fs::create_dir_all(&args.snapshot_dir).with_context(|| {
            format!(
                "--snapshot-dir {}: cannot make it",
                args.snapshot_dir.display()
            )
        })?;
        eprintln!(
            "snapshots every {every} chunks to {}",
            args.snapshot_dir.display()
        );
    }
    let first = session
        .session()
        .map_or(0, headroom_engine::Session::chunks_done);
    let mut outputs = prepared
        .outputs
        .lock()
        .map_err(|_| anyhow::anyhow!("the outputs' lock was poisoned"))?;
    let mut sink = Sink::create(outputs.kind, outputs.video.open(), width, height)?;
    let total = session.chunks_total().unwrap_or(0);
    crate::outputs::set_progress(0, total);
    let progress = ProgressBar::new(total as u64);
    progress.set_style(
        ProgressStyle::with_template("{spinner} chunk {pos}/{len} [{bar:30}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    progress.set_position(first as u64);
    let mut chunk_times = Vec::new();
    let mut chunk_reports = Vec::new();
    let mut ttfc = 0.0;
    let mut frames = 0;
    let outcome: Result<()> = (|| {
        for i in first..total {
            let t = Instant::now();
            let chunk = session.next_chunk()?;
            let secs = t.elapsed().as_secs_f64();
            if i == first {
                ttfc = start.elapsed().as_secs_f64();
            }
            if let Some(every) = args.snapshot_every {
                if (i as u64 + 1).is_multiple_of(every) && i + 1 < total {
                    let path = args.snapshot_dir.join(format!(
                        "chunk-{i}.{}",
                        headroom_engine::snapshot::EXTENSION
                    ));
                    let snap = session
                        .snapshot_to(&path)
                        .with_context(|| format!("snapshot after chunk {i}"))?;
                    eprintln!(
                        "snapshot after chunk {i}: {} ({} of state)",
                        path.display(),
                        format_bytes(snap.state_bytes())
                    );
                }
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
            chunk_reports.push(ChunkReport {
                frames: n,
                total_s: secs,
                denoise_s: chunk.timings.denoise.as_secs_f64(),
                commit_s: chunk.timings.commit.as_secs_f64(),
                decode_s: chunk.timings.decode.as_secs_f64(),
                allocated_bytes: chunk.stats_decoded.allocated_bytes.all().current,
                reserved_bytes: chunk.stats_decoded.reserved_bytes.all().current,
            });
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
        Ok(()) => session.finish(engine).map_err(anyhow::Error::from),
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
    let launcher = device.launcher();
    let gpu = launcher.map(|l| l.describe());
    let on_gpu = gpu.is_some();
    let report = GenerateReport {
        device: gpu.unwrap_or_else(|| "cpu".into()),
        checked_launches: launcher.and_then(|l| l.check_report()),
        text_encoder: engine.text_report(),
        plan_cache: engine.plan_cache_counts(),
        frames,
        width,
        height,
        decoder: args.engine.decoders.decoder.as_str(),
        weights_bytes: engine.resident().weights_bytes,
        ttfc_s: ttfc,
        chunk_mean_s: mean,
        chunks: chunk_reports,
        allocated_peak_bytes: stats.allocated_bytes.all().peak,
        reserved_peak_bytes: stats.reserved_bytes.all().peak,
        post_session_reserved_bytes: stats.reserved_bytes.all().current,
        reclaims: stats.num_reclaims,
        reclaim_s: stats.reclaim_ns as f64 / 1e9,
        output: args.out.display().to_string(),
        comm: None,
        ranks,
    };
    Ok(Run {
        report,
        on_gpu,
        policy: reclaim,
    })
}
