//! `headroom generate`: one streaming session end to end on a built-in model, written
//! as MP4, Y4M or PNG frames, with its memory story.
//!
//! One job per file: [`args`] the flags, [`inputs`] what they name (checked before any
//! weights load), [`video`] the writer and the output files, [`stream`](mod@stream) the chunk loop
//! (over the engine's [`headroom_engine::SessionDriver`]), [`report`] the report and how
//! it prints. This file loads the engine, alone or on every rank of a mesh.

mod args;
mod inputs;
mod report;
mod stream;
mod video;

use std::sync::Arc;

use anyhow::Result;
use headroom_engine::replicated;
use headroom_engine::{Drive, Engine, Placement, RankGroups};
use headroom_tensor::Device;

pub use args::GenerateArgs;
use inputs::{prepare, Prepared};
use report::Run;
use stream::stream;

/// Runs `headroom generate`.
pub fn run(args: GenerateArgs) -> Result<()> {
    crate::outputs::stop_on_signals("generate")?;
    let prepared = prepare(&args)?;
    let device_arg = args.engine.model.device;
    let on_gpu = device_arg != crate::device_arg::DeviceArg::Cpu;
    let run = if args.ranks.is_single()? {
        let config = &prepared.config;
        let engine =
            match device_arg.engine_device(&config.allocator, config.reclaim, config.capacity)? {
                Some(device) => Engine::load(config.clone(), Placement::device(device))?,
                None => Engine::new(config.clone())?,
            };
        Some(stream(&args, &prepared, &engine, Drive::Alone)?)
    } else {
        let gpu = |local: usize| device_arg.rank_gpu(local, &prepared.config);
        let gpu: crate::ranks::GpuFor<'_> = &gpu;
        args.ranks
            .launch(on_gpu.then_some(gpu), |groups, device| {
                rank_main(&args, &prepared, groups, device)
            })?
            .flatten()
    };
    match run {
        Some(run) => run.print(args.json, args.ranks.tp, args.ranks.sp),
        None => Ok(()),
    }
}

/// One rank of a sharded `generate`: rank 0 streams the session and writes the video
/// (its run is the value), every other rank follows its commands.
fn rank_main(
    args: &GenerateArgs,
    prepared: &Prepared,
    groups: RankGroups,
    device: Option<Device>,
) -> Result<Option<Run>> {
    let config = &prepared.config;
    let device = match device {
        Some(device) => device,
        None => Device::new(config.cpu_platform()?),
    };
    let engine = Engine::load(config.clone(), Placement::rank(device, &groups))?;
    if groups.rank() != 0 {
        replicated::follow(&engine, &groups.world)?;
        return Ok(None);
    }
    let world = Arc::clone(&groups.world);
    let out = stream(args, prepared, &engine, Drive::Led(&world));
    // However rank 0 ended, the followers leave their loops (after an abort this fails
    // at once, and the job is ending anyway).
    let shutdown = replicated::lead_shutdown(&world);
    let mut run = out?;
    shutdown?;
    if run.report.ranks.is_some() {
        run.report.comm = Some(groups.backend());
    }
    Ok(Some(run))
}
