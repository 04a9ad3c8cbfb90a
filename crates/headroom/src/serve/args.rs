//! The flags of `headroom serve`: the shared engine flags (worded for a server where it
//! differs) and the server's own: address, slots, queue, limits, session defaults.

use clap::{Arg, Args};

use crate::engine_args::EngineArgs;
use crate::ranks::RankArgs;

/// Arguments of `headroom serve`.
#[derive(Debug, Args)]
#[command(mut_args(reword))]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The engine: model, device, dtype, decoders, allocator, reclaim policy, KV pages.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Sessions generating at once, at most.
    #[arg(long, default_value_t = 1)]
    pub max_sessions: usize,
    /// Step the sessions generating at once together (one batched forward per DMD step,
    /// batched VAE work; every stream the same bytes): true or false.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub batch_steps: bool,
    /// Most sessions in one batched step (default: every session ready); beyond it the
    /// chunks due soonest on their playback clocks go first.
    #[arg(long)]
    pub max_batch: Option<usize>,
    /// How stepped sessions are scheduled: `deadline` calls each paced chunk's round up
    /// to be ready when due, batches the sessions whose deadlines are near and admits a
    /// new session only while a round of all fits in a chunk's playing time; `arrival`
    /// lets each paced session wait on its own clock (admission by slots and memory).
    #[arg(long, value_enum, default_value_t = SchedulerArg::Deadline)]
    pub scheduler: SchedulerArg,
    /// Clients that may wait for a slot at once, first come first served (0: refuse at
    /// once when full).
    #[arg(long, default_value_t = 16)]
    pub max_queue: usize,
    /// Seconds a client may wait in the queue before it is refused with `capacity`.
    #[arg(long, default_value_t = 120.0)]
    pub queue_timeout: f64,
    /// Count a server that would queue a new client as ready on /ready (default: 503 as
    /// soon as a new session could not start at once, what a load balancer needs).
    #[arg(long)]
    pub ready_when_queueing: bool,
    /// Seconds a drain (SIGTERM, POST /drain) lets running sessions finish before it
    /// stops them at their next chunk boundary and exits (0: stop them at once).
    #[arg(long, default_value_t = 300.0)]
    pub drain_timeout: f64,
    /// Pace sessions to media time unless their session.start says otherwise
    /// (extra_params.pace_to_media_time): each chunk leaves when its first frame is due
    /// to play, minus the lead. The viewer's sessions are always paced.
    #[arg(long)]
    pub pace: bool,
    /// Seconds ahead of its play time a paced chunk leaves (default half a 12-frame
    /// chunk at 16 fps).
    #[arg(long, default_value_t = 0.375)]
    pub pacing_lead: f64,
    /// Seconds a paced session may fall behind before its schedule re-bases.
    #[arg(long, default_value_t = 2.0)]
    pub pacing_max_lag: f64,
    /// Seconds a session whose client hung up stays parked (in host memory) for its
    /// resume token.
    #[arg(long, default_value_t = 60.0)]
    pub resume_window: f64,
    /// A folder the replicas share for parked sessions: a drain parks every running
    /// session there (session.moved) and ends within about one chunk time.
    #[arg(long)]
    pub session_store: Option<std::path::PathBuf>,
    /// Most host memory parked sessions hold (B, KiB, MiB, GiB; default a quarter of
    /// the machine's): past it a session parks in --session-store, or is not parked.
    #[arg(long)]
    pub max_parked_bytes: Option<String>,
    /// Write each running session's snapshot to --session-store every N chunks, so the
    /// sessions of a replica that dies resume elsewhere, losing at most N chunks.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), requires = "session_store")]
    pub snapshot_every: Option<u64>,
    /// Largest session.start message (it may carry a data: image).
    #[arg(long, default_value = "4MiB")]
    pub max_start_message: String,
    /// Largest message after session.start.
    #[arg(long, default_value = "128KiB")]
    pub max_control_message: String,
    /// Seconds a new socket may take to send session.start.
    #[arg(long, default_value_t = 10.0)]
    pub start_timeout: f64,
    /// Seconds a session may go without progress (a chunk or a ping) before it ends.
    #[arg(long, default_value_t = 60.0)]
    pub stall_timeout: f64,
    /// Default width of a session.start that gives none (multiple of 16); default: the
    /// model's own size (its first_frame.png), else 416.
    #[arg(long)]
    pub width: Option<usize>,
    /// Default height of a session.start that gives none (multiple of 16); default: the
    /// model's own size, else 240.
    #[arg(long)]
    pub height: Option<usize>,
    /// Default frames of a session.start that gives none (12·K − 3), or 0: such a
    /// session streams until the client stops it.
    #[arg(long, default_value_t = 0)]
    pub frames: usize,
    /// Most frames one session may stream (default: unlimited): a session streamed
    /// until stopped ends after the last chunk within it, a longer num_frames is refused.
    #[arg(long)]
    pub max_session_frames: Option<usize>,
    /// An API key clients must send as `Authorization: Bearer KEY` (a browser: the
    /// WebSocket subprotocol `headroom.bearer.KEY`) on every route but /, /health and
    /// /ready; repeat for several keys. Also read from HEADROOM_API_KEY
    /// (comma-separated). Without one, no key is asked for.
    #[arg(long = "api-key", value_name = "KEY")]
    pub api_keys: Vec<String>,
    /// An origin whose pages may open WebSockets here besides the server's own (for
    /// example `https://app.example`); repeatable; `*` allows any.
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,
    /// WebSockets open at once, at most (default: 4 × (max-sessions + max-queue)); past
    /// it the socket waiting longest for its session.start is closed first, else the new
    /// one is (close code 1013).
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// The TP × SP mesh and its collective backend.
    #[command(flatten)]
    pub ranks: RankArgs,
}

/// `serve --help`'s flags in order, the engine's among the server's own.
pub const HELP_ORDER: [&str; 44] = [
    "host",
    "port",
    "model",
    "decoder",
    "tiny_decoder",
    "dtype",
    "weights",
    "transformer",
    "config",
    "policy",
    "allocator",
    "max_sessions",
    "batch_steps",
    "max_batch",
    "scheduler",
    "max_queue",
    "queue_timeout",
    "ready_when_queueing",
    "drain_timeout",
    "pace",
    "pacing_lead",
    "pacing_max_lag",
    "resume_window",
    "session_store",
    "max_parked_bytes",
    "snapshot_every",
    "kv_budget",
    "capacity",
    "max_start_message",
    "max_control_message",
    "start_timeout",
    "stall_timeout",
    "width",
    "height",
    "frames",
    "max_session_frames",
    "api_keys",
    "allowed_origins",
    "max_connections",
    "device",
    "plan_cache",
    "tp",
    "sp",
    "comm",
];

/// `serve --scheduler`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SchedulerArg {
    /// Rounds by playback deadline, admission by real-time capacity.
    Deadline,
    /// Each paced session on its own clock.
    Arrival,
}

/// A shared engine flag as `serve` says it (a server loads `world` unless told, and its
/// sessions share the KV budget), placed in [`HELP_ORDER`].
fn reword(arg: Arg) -> Arg {
    let arg = crate::help_order::place(arg, &HELP_ORDER);
    match arg.get_id().as_str() {
        "model" => arg
            .help("Built-in model (world, tiny, small, …), a diffusers pipeline folder with transformer/ and vae/, or an original Wan repo folder")
            .default_value(crate::builtin_world::WORLD),
        "transformer" => arg.help(
            "A transformer checkpoint over --model (Self-Forcing .pt, LingBot-World folder, …)",
        ),
        "kv_budget" => arg.help("KV page budget, taken at the first open: bytes (B, KiB, MiB, GiB), a fraction of the device capacity (--capacity, else physical memory; e.g. 0.05), or `auto` (exactly --max-sessions sessions of the first session's size, rebuilt while idle for a larger one). Pages hold 16 tokens, so every size shares them"),
        "capacity" => arg.help(
            "Device capacity (B, KiB, MiB, GiB) to emulate a memory-tight device; physical memory by default",
        ),
        "device" => arg.help("Where the engine runs: cpu, cuda[:N] (on a mesh, rank r of a node takes cuda:N+r and the collectives run on NCCL) or cuda-check (the GPU path without a GPU: launches checked, frames black)"),
        "plan_cache" => arg.help(
            "A folder that keeps the planned allocator's plans across restarts (a corrupt or stale file is rebuilt)",
        ),
        _ => arg,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn help_lists_every_flag_in_its_order() {
        assert_eq!(crate::help_order::listed(&["serve"]), super::HELP_ORDER);
    }
}
