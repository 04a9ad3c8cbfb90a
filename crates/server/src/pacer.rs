//! Media-time pacing (the protocol of vLLM-Omni's open PR #6632): a session faster than
//! real time releases each chunk when its first frame is due to play, minus a lead,
//! instead of running ahead of what its viewer watches — so an interaction lands on a
//! chunk the viewer sees soon, and the session does not hold the device for chunks
//! nobody watches yet.
//!
//! The rules: the first chunk is never held (it sets the origin); chunk k is due at
//! `origin + released_media_seconds − lead`, `released_media_seconds` being the media
//! time of the chunks released before it; a chunk that is late is released at once,
//! never delayed further; and a chunk later than `max_lag` re-bases the origin, so the
//! debt is written off instead of being repaid in a burst of chunks.
//!
//! A paced session waits before it makes a chunk, not only after: it starts chunk k at
//! its due time less the time its recent chunks took ([`MediaTimePacer::next_due`]), so
//! an interaction that arrives while the previous chunk plays is in it, and an
//! interaction waits at most one chunk's media time for its boundary, then one chunk's
//! generation. Waiting is on the session's worker thread, off the device: the session
//! holds its state (what a session between chunks holds) and takes no device time.

use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use crate::error::{Result, ServerError};

/// The lead a paced session runs by default: half a chunk of 12 frames at 16 fps.
/// A chunk then arrives while the viewer still has 0.375 s of video in hand, enough to
/// absorb a network hiccup or a late decode without the picture stalling, and an
/// interaction shows that much sooner than with a whole chunk of lead (docs/serve-protocol.md).
pub const DEFAULT_LEAD: Duration = Duration::from_millis(375);
/// How late a paced session may fall before its schedule re-bases.
pub const DEFAULT_MAX_LAG: Duration = Duration::from_secs(2);

/// A session's pacing: `extra_params.pace_to_media_time`, `pacing_lead_seconds` and
/// `pacing_max_lag_seconds`, with the server's defaults (`serve --pace`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pacing {
    /// Whether chunks are paced to media time at all.
    pub enabled: bool,
    /// How far ahead of its play time a chunk is released.
    pub lead: Duration,
    /// How late a chunk may be before the schedule re-bases.
    pub max_lag: Duration,
}

impl Default for Pacing {
    fn default() -> Self {
        Self {
            enabled: false,
            lead: DEFAULT_LEAD,
            max_lag: DEFAULT_MAX_LAG,
        }
    }
}

fn seconds(extra: &Map<String, Value>, key: &str, positive: bool) -> Result<Option<Duration>> {
    let field = format!("extra_params.{key}");
    match extra.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let s = v
                .as_f64()
                .filter(|s| s.is_finite() && *s >= 0.0 && (!positive || *s > 0.0));
            let rule = if positive { "> 0" } else { "≥ 0" };
            let s = s.ok_or_else(|| {
                ServerError::request(
                    &field,
                    format!("must be a number of seconds {rule}, got {v}"),
                )
            })?;
            Ok(Some(Duration::from_secs_f64(s.min(3600.0))))
        }
    }
}

impl Pacing {
    /// The pacing `extra_params` asks for, the server's `default` filling what it
    /// leaves out; a bad value is refused naming its field.
    pub fn parse(extra: &Map<String, Value>, default: Pacing) -> Result<Self> {
        let enabled = match extra.get("pace_to_media_time") {
            None | Some(Value::Null) => default.enabled,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(ServerError::request(
                    "extra_params.pace_to_media_time",
                    format!("must be true or false, got {other}"),
                ))
            }
        };
        Ok(Self {
            enabled,
            lead: seconds(extra, "pacing_lead_seconds", false)?.unwrap_or(default.lead),
            max_lag: seconds(extra, "pacing_max_lag_seconds", true)?.unwrap_or(default.max_lag),
        })
    }
}

/// One session's media clock.
#[derive(Debug)]
pub struct MediaTimePacer {
    pacing: Pacing,
    fps: f64,
    /// When the first chunk was released (moved forward by re-bases).
    origin: Option<Instant>,
    /// Media seconds of the chunks released so far.
    released: f64,
    /// Times the schedule re-based.
    rebases: u64,
}

impl MediaTimePacer {
    /// A clock for a session of `pacing` at `fps` frames per second.
    pub fn new(pacing: Pacing, fps: u32) -> Self {
        Self {
            pacing,
            fps: f64::from(fps.max(1)),
            origin: None,
            released: 0.0,
            rebases: 0,
        }
    }

    /// When a chunk of `frames` frames, ready at `ready`, leaves (`ready` itself when
    /// unpaced, the first, or late), and counts it released.
    pub fn schedule(&mut self, ready: Instant, frames: usize) -> Instant {
        let media = frames as f64 / self.fps;
        let at = match (self.pacing.enabled, self.origin) {
            (false, _) => ready,
            (true, None) => {
                self.origin = Some(ready);
                ready
            }
            (true, Some(origin)) => {
                let due = shifted(origin, self.released - self.pacing.lead.as_secs_f64());
                if ready > due + self.pacing.max_lag {
                    // Too far behind: the viewer's clock starts over from this chunk.
                    self.origin = Some(shifted(
                        ready,
                        self.pacing.lead.as_secs_f64() - self.released,
                    ));
                    self.rebases += 1;
                    ready
                } else {
                    due.max(ready)
                }
            }
        };
        self.released += media;
        at
    }

    /// When the next chunk is due to leave (`None`: unpaced, or the first chunk, which
    /// leaves when ready): a paced session starts making it this long before, by its
    /// recent chunks' times, so that it is ready just in time and an interaction that
    /// came meanwhile is in it.
    pub fn next_due(&self) -> Option<Instant> {
        match (self.pacing.enabled, self.origin) {
            (true, Some(origin)) => Some(shifted(
                origin,
                self.released - self.pacing.lead.as_secs_f64(),
            )),
            _ => None,
        }
    }

    /// Times the schedule re-based since the session began.
    pub fn rebases(&self) -> u64 {
        self.rebases
    }
}

/// `t` moved by `seconds` (either way; an instant before the clock's start stays at `t`).
fn shifted(t: Instant, seconds: f64) -> Instant {
    let d = Duration::from_secs_f64(seconds.abs());
    if seconds >= 0.0 {
        t + d
    } else {
        t.checked_sub(d).unwrap_or(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paced(lead_ms: u64, max_lag_ms: u64) -> MediaTimePacer {
        MediaTimePacer::new(
            Pacing {
                enabled: true,
                lead: Duration::from_millis(lead_ms),
                max_lag: Duration::from_millis(max_lag_ms),
            },
            16,
        )
    }

    fn ms(a: Instant, b: Instant) -> i64 {
        (b.duration_since(a).as_secs_f64() * 1e3).round() as i64
    }

    #[test]
    fn chunks_faster_than_real_time_leave_at_their_play_time_minus_the_lead() {
        let t0 = Instant::now() + Duration::from_secs(100);
        let mut p = paced(375, 2000);
        // Ready every 100 ms; 9 then 12 frames at 16 fps (562.5 ms, 750 ms).
        let first = p.schedule(t0, 9);
        assert_eq!(first, t0, "the first chunk is never held");
        let second = p.schedule(t0 + Duration::from_millis(100), 12);
        assert_eq!(ms(t0, second), 563 - 375);
        let third = p.schedule(t0 + Duration::from_millis(200), 12);
        assert_eq!(ms(t0, third), 563 + 750 - 375);
        // A late chunk (inside max_lag) leaves at once and is not delayed further.
        let late = t0 + Duration::from_millis(3000);
        assert_eq!(p.schedule(late, 12), late);
        assert_eq!(p.rebases(), 0);
    }

    #[test]
    fn a_stall_past_max_lag_rebases_instead_of_bursting() {
        let t0 = Instant::now() + Duration::from_secs(100);
        let mut p = paced(0, 1000);
        p.schedule(t0, 9);
        p.schedule(t0 + Duration::from_millis(10), 12);
        // A 5 s stall: the next chunk, due at 1.31 s, is ready at 6 s.
        let after = t0 + Duration::from_secs(6);
        assert_eq!(p.schedule(after, 12), after);
        assert_eq!(p.rebases(), 1);
        // The chunks ready right after it are spaced by their media time again, not
        // released in a burst to repay the debt.
        let next = p.schedule(after + Duration::from_millis(10), 12);
        assert_eq!(ms(after, next), 750);
        let next = p.schedule(after + Duration::from_millis(20), 12);
        assert_eq!(ms(after, next), 1500);
    }

    #[test]
    fn unpaced_chunks_leave_when_ready() {
        let t0 = Instant::now();
        let mut p = MediaTimePacer::new(Pacing::default(), 16);
        for k in 0..5 {
            let ready = t0 + Duration::from_millis(k * 10);
            assert_eq!(p.schedule(ready, 12), ready);
        }
    }

    #[test]
    fn pacing_fields_are_read_with_defaults_and_refused_by_name() {
        let default = Pacing::default();
        let parse = |v: Value| Pacing::parse(v.as_object().unwrap(), default);
        let p = parse(serde_json::json!({"pace_to_media_time": true, "pacing_lead_seconds": 0}))
            .unwrap();
        assert!(p.enabled && p.lead.is_zero() && p.max_lag == DEFAULT_MAX_LAG);
        assert_eq!(parse(serde_json::json!({})).unwrap(), default);
        for (bad, field) in [
            (
                serde_json::json!({"pace_to_media_time": 1}),
                "pace_to_media_time",
            ),
            (
                serde_json::json!({"pacing_lead_seconds": -1}),
                "pacing_lead_seconds",
            ),
            (
                serde_json::json!({"pacing_max_lag_seconds": 0}),
                "pacing_max_lag_seconds",
            ),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
    }
}
