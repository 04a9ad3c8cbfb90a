//! `headroom bench serve`: a realtime-video client against a running `headroom serve`,
//! at one concurrency or several compared.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use headroom_bench::serve::{
    by_concurrency, markdown, run_serve_bench, ServeBenchConfig, ServeBenchSummary,
};

use crate::session_args::{DEFAULT_FRAMES, DEFAULT_SIZE};

/// Arguments of `headroom bench serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The server's realtime endpoint.
    #[arg(long, default_value = "ws://127.0.0.1:8000/v1/realtime/video")]
    url: String,
    /// Sessions in all.
    #[arg(long, default_value_t = 4)]
    sessions: usize,
    /// Clients at a time (more than the server's slots: the rest wait in its queue);
    /// several, comma-separated, run one after another and are compared.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    concurrency: Vec<usize>,
    /// Frames per session: 12·K − 3.
    #[arg(long, default_value_t = DEFAULT_FRAMES)]
    frames: usize,
    /// Width in pixels.
    #[arg(long, default_value_t = DEFAULT_SIZE.0)]
    width: usize,
    /// Height in pixels.
    #[arg(long, default_value_t = DEFAULT_SIZE.1)]
    height: usize,
    /// Playback rate the deadlines assume.
    #[arg(long, default_value_t = 16.0)]
    fps: f64,
    /// Output folder (summary.json).
    #[arg(long, default_value = "bench-serve")]
    out: PathBuf,
    /// First, one client starts a session and hangs up this many seconds after its
    /// video.start (mid-chunk); the measured clients start right after.
    #[arg(long)]
    hang_up_after: Option<f64>,
    /// Sizes the sessions draw from, comma-separated WxH (a fixed draw per session);
    /// default: every session at --width × --height.
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<String>,
    /// Share of sessions whose client hangs up before its first chunk or after one of
    /// them (drawn per session; a soak: they are counted, not timed).
    #[arg(long, default_value_t = 0.0)]
    hang_up_share: f64,
    /// The server's API key (`serve --api-key`), sent as `Authorization: Bearer`; also
    /// read from HEADROOM_API_KEY.
    #[arg(long)]
    api_key: Option<String>,
    /// Measure key-to-display instead: one paced open-ended session per `--leads`
    /// value, a key change every `--every` chunks, until this many changes were seen.
    #[arg(long)]
    actions: Option<usize>,
    /// Pacing leads (seconds) `--actions` measures, comma-separated: 0, half a chunk
    /// and a chunk at 16 fps by default.
    #[arg(long, value_delimiter = ',', default_value = "0,0.375,0.75")]
    leads: Vec<f64>,
    /// Chunks between `--actions`' key changes.
    #[arg(long, default_value_t = 1)]
    every: usize,
    /// Measure real-time capacity instead: for each count, that many paced open-ended
    /// sessions (staggered over a chunk), each measured for `--seconds`; reports the
    /// share of chunks that arrive by the time they play, and the allocator's peaks.
    #[arg(long, value_delimiter = ',')]
    realtime: Vec<usize>,
    /// Seconds `--realtime` measures each session for.
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// The pacing lead `--realtime`'s sessions ask for, seconds.
    #[arg(long, default_value_t = 0.375)]
    lead: f64,
    /// With `--realtime`: sessions arrive and leave at random (3–15 s each, 0–2 s apart,
    /// for `--seconds` in all), so round compositions keep changing.
    #[arg(long)]
    churn: bool,
}

impl ServeArgs {
    /// `--api-key`, else `HEADROOM_API_KEY`.
    fn api_key(&self) -> Option<String> {
        self.api_key
            .clone()
            .or_else(|| std::env::var("HEADROOM_API_KEY").ok())
    }
}

/// The server and video of `--actions` and `--realtime`'s paced sessions.
fn paced_target(args: &ServeArgs) -> headroom_bench::actions::PacedTarget {
    headroom_bench::actions::PacedTarget {
        url: args.url.clone(),
        api_key: args.api_key(),
        width: args.width,
        height: args.height,
        fps: args.fps.round().max(1.0) as u32,
    }
}

/// Runs `headroom bench serve`: each concurrency in turn, then their comparison.
pub fn run(args: ServeArgs) -> Result<()> {
    if let Some(changes) = args.actions {
        let config = headroom_bench::actions::ActionsBenchConfig {
            target: paced_target(&args),
            changes,
            every: args.every,
            leads: args.leads.clone(),
        };
        let rows = headroom_bench::actions::run_actions_bench(&config)?;
        println!(
            "# bench serve --actions: {changes} key changes per lead, every {} chunks, {}x{} at {} fps\n",
            args.every, args.width, args.height, config.target.fps
        );
        print!("{}", headroom_bench::actions::markdown(&rows));
        return Ok(());
    }
    if !args.realtime.is_empty() {
        let config = headroom_bench::realtime::RealtimeBenchConfig {
            target: paced_target(&args),
            counts: args.realtime.clone(),
            seconds: args.seconds,
            lead: args.lead,
            churn: args.churn,
        };
        let rows = headroom_bench::realtime::run_realtime_bench(&config)?;
        println!(
            "# bench serve --realtime: paced open-ended sessions, {} s {}, lead {} s, {}x{} at {} fps\n",
            args.seconds,
            if args.churn { "of churn (3-15 s sessions)" } else { "each" },
            args.lead,
            args.width,
            args.height,
            config.target.fps
        );
        print!("{}", headroom_bench::realtime::markdown(&rows));
        return Ok(());
    }
    if let [one] = args.concurrency[..] {
        serve_one(&args, one, args.out.clone())?;
        return Ok(());
    }
    let mut rows = Vec::new();
    for &c in &args.concurrency {
        rows.push(serve_one(&args, c, args.out.join(format!("c{c}")))?);
        println!();
    }
    print!("{}", by_concurrency(&rows));
    Ok(())
}

/// One `bench serve` run at `concurrency` clients, printed; its summary.
fn serve_one(args: &ServeArgs, concurrency: usize, out: PathBuf) -> Result<ServeBenchSummary> {
    let config = ServeBenchConfig {
        url: args.url.clone(),
        sessions: args.sessions,
        concurrency,
        frames: args.frames,
        width: args.width,
        height: args.height,
        fps: args.fps,
        out,
        hang_up_after_s: args.hang_up_after,
        sizes: args
            .sizes
            .iter()
            .map(|s| parse_wxh(s))
            .collect::<Result<Vec<_>>>()?,
        hang_up_share: args.hang_up_share,
        api_key: args
            .api_key
            .clone()
            .or_else(|| crate::serve::env_api_keys().into_iter().next()),
    };
    let s = run_serve_bench(&config)?;
    print!("{}", markdown(&s, &config));
    if !s.all_served {
        anyhow::bail!(
            "{} of {} clients were not served",
            s.unserved.len(),
            s.clients
        );
    }
    Ok(s)
}

/// `WxH` as `(width, height)`.
fn parse_wxh(s: &str) -> Result<(usize, usize)> {
    let parsed = s
        .split_once(['x', 'X'])
        .and_then(|(w, h)| Some((w.trim().parse().ok()?, h.trim().parse().ok()?)));
    parsed.ok_or_else(|| anyhow::anyhow!("--sizes: {s:?} is not WxH (e.g. 128x96)"))
}
