//! `headroom snapshot inspect`: what a session snapshot holds (its parts and their
//! bytes, where the session stands) and what it can resume on.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use headroom_engine::SessionSnapshot;
use headroom_mem::format_bytes;

/// Arguments of `headroom snapshot`.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    command: SnapshotCommand,
}

#[derive(Debug, Subcommand)]
enum SnapshotCommand {
    /// Print what a snapshot holds, its bytes per part, and what it can resume on.
    Inspect(InspectArgs),
}

#[derive(Debug, Args)]
struct InspectArgs {
    /// A `.hrsnap` file (`generate --snapshot-every`, a server's store).
    file: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `headroom snapshot`.
pub fn run(args: SnapshotArgs) -> Result<()> {
    match args.command {
        SnapshotCommand::Inspect(a) => inspect(a),
    }
}

/// The flags an engine needs to resume `snap` (what its identity compares).
fn resume_flags(snap: &SessionSnapshot) -> String {
    let id = &snap.identity;
    let mut flags = format!(
        "--model {} --dtype {} --weights {}",
        id.model, id.dtype, id.weight_format
    );
    if id.decoder != "full" {
        flags.push_str(&format!(" --decoder {}", id.decoder));
    }
    if id.mesh.tp * id.mesh.sp > 1 {
        flags.push_str(&format!(" --tp {} --sp {}", id.mesh.tp, id.mesh.sp));
    }
    flags
}

fn inspect(args: InspectArgs) -> Result<()> {
    let file_bytes = std::fs::metadata(&args.file)
        .with_context(|| format!("{}: cannot read it", args.file.display()))?
        .len();
    let snap =
        SessionSnapshot::read(&args.file).with_context(|| format!("{}", args.file.display()))?;
    let id = &snap.identity;
    let p = &snap.progress;
    let parts = snap.parts();
    let (tensors, fields) = snap.contents();
    if args.json {
        let report = serde_json::json!({
            "file": args.file.display().to_string(),
            "file_bytes": file_bytes,
            "state_bytes": snap.state_bytes(),
            "progress": p,
            "identity": id,
            "parts": parts.iter().map(|(name, what, bytes)| serde_json::json!({
                "name": name, "what": what, "bytes": bytes,
            })).collect::<Vec<_>>(),
            "tensors": tensors.len(),
            "fields": fields,
            "resume_flags": resume_flags(&snap),
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "{}: {} (format version {})",
        args.file.display(),
        format_bytes(file_bytes),
        id.format_version
    );
    println!(
        "session {}: {} chunks made ({} frames), next chunk {}, {}",
        p.session_id,
        p.chunks_done,
        p.frames_done,
        p.chunks_done,
        match p.horizon {
            Some(h) => format!("{h} chunks in all"),
            None => "no end".to_string(),
        }
    );
    println!(
        "holds {} in {} tensors and {fields} fields:",
        format_bytes(snap.state_bytes()),
        tensors.len()
    );
    for (name, what, bytes) in &parts {
        println!("  {name:<13} {:>11}  {what}", format_bytes(*bytes));
    }
    println!("resumes on an engine with:");
    println!(
        "  model         {} (architecture {})",
        id.model, id.architecture
    );
    println!(
        "  weights       {} ({}, {})",
        id.weights, id.dtype, id.weight_format
    );
    println!("  decoder       {}", id.decoder);
    println!("  size          {}x{}", id.width, id.height);
    println!(
        "  kv window     sink {} frames, window {} frames",
        id.sink_frames, id.window_frames
    );
    println!(
        "  mesh          tp {} sp {}, this shard is rank {}",
        id.mesh.tp, id.mesh.sp, id.mesh.rank
    );
    println!(
        "  made with     {} threads, CPU path {} (bytes match on the same)",
        id.threads, id.cpu_path
    );
    println!(
        "resume: headroom generate {} --resume {} --out OUT",
        resume_flags(&snap),
        args.file.display()
    );
    Ok(())
}
