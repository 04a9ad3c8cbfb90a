//! `headroom bench models`: the whole networks at one AR block's shapes — the DiT forward
//! over 3 latent frames with 512 text tokens and the VAE decode of that block — in f32,
//! near-f32 (AMX), bf16 and int8 (bf16 with the DiT blocks' linears W8A8), load
//! excluded, with the allocator's peak beside each; and, with `reference`, diffusers on
//! the same weights and inputs timed in the same run (int8 against diffusers' bf16).
//! Where f32 runs first, each later mode's DiT output is compared with f32's (relative
//! L2), and where bf16 runs, each other mode's time is given against it.

use std::path::{Path, PathBuf};
use std::time::Instant;

use headroom_engine::ModelPreset;
use headroom_model::{WanTransformer, WanVae, WeightFormat, WeightStore};
use headroom_tensor::kernels::gemm::set_near_f32;
use headroom_tensor::{DType, Device, Tensor};
use serde::Serialize;

use crate::{BenchError, Result};

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelBenchConfig {
    /// A diffusers pipeline folder (`transformer/`, `vae/`); `None`: the seeded
    /// `wan2.1-t2v-1.3b` preset.
    pub model: Option<PathBuf>,
    /// A transformer checkpoint in any layout timed in place of the folder's (8-bit
    /// files stay 8-bit under `native` modes), the folder's or the preset's config its
    /// base.
    pub transformer: Option<PathBuf>,
    /// Modes to run: `f32`, `near-f32`, `bf16`, `int8`.
    pub modes: Vec<String>,
    /// Timed repetitions (best counts) after one warm-up.
    pub reps: usize,
    /// Video size in pixels (multiples of 16).
    pub width: usize,
    /// Video size in pixels (multiples of 16).
    pub height: usize,
    /// A command that times diffusers on the same folder: run as
    /// `CMD --model DIR --dtype f32|bf16 --reps N --width W --height H`, it prints one JSON
    /// object `{"dit_forward_s", "vae_decode_s"}`.
    pub reference: Option<String>,
    /// Works to run: `dit`, `vae` (both when empty).
    pub works: Vec<String>,
    /// After the timed runs, one more run of each work with the ops recorded
    /// ([`headroom_tensor::profile`]): time, calls and bytes per op kind.
    pub profile: bool,
}

/// One work item in one mode.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelRow {
    /// `dit forward` or `vae decode`.
    pub work: String,
    /// `f32`, `near-f32` or `bf16`.
    pub mode: String,
    /// Best seconds of headroom's run.
    pub seconds: f64,
    /// The allocator's allocated peak during the run (weights included).
    pub allocated_peak_bytes: u64,
    /// diffusers' best seconds on the same inputs, when a reference ran.
    pub reference_seconds: Option<f64>,
    /// `reference_seconds / seconds`: how many times faster headroom is.
    pub speedup: Option<f64>,
    /// Our bf16 row's seconds over this one's (same work, same run), for other modes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vs_bf16: Option<f64>,
    /// The DiT output's relative L2 distance from the f32 mode's (same run), for later
    /// modes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_vs_f32: Option<f64>,
    /// Per op kind, from one extra recorded run (with `profile`), most time first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub profile: Vec<OpRow>,
    /// Wall seconds of the recorded run (0 without `profile`).
    #[serde(skip_serializing_if = "is_zero")]
    pub profile_seconds: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// One op kind of a recorded run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpRow {
    /// The op kind (`conv3d`, `linear`, `attention`, `add`, …; `outside ops` for the
    /// run's time in none of them).
    pub op: String,
    /// Calls from the model (ops inside ops count as their caller).
    pub calls: u64,
    /// Wall seconds in them.
    pub seconds: f64,
    /// Bytes of their operands and results.
    pub bytes: u64,
}

/// `f` once with the ops recorded: (the rows, most time first, and the run's seconds).
fn recorded(f: &mut dyn FnMut() -> Result<()>) -> Result<(Vec<OpRow>, f64)> {
    headroom_tensor::profile::take();
    headroom_tensor::profile::set_enabled(true);
    let start = Instant::now();
    let done = f();
    let wall = start.elapsed().as_secs_f64();
    headroom_tensor::profile::set_enabled(false);
    done?;
    let mut rows: Vec<OpRow> = headroom_tensor::profile::take()
        .into_iter()
        .map(|(op, s)| OpRow {
            op: op.to_string(),
            calls: s.calls,
            seconds: s.seconds,
            bytes: s.bytes,
        })
        .collect();
    let in_ops: f64 = rows.iter().map(|r| r.seconds).sum();
    rows.push(OpRow {
        op: "outside ops".to_string(),
        calls: 0,
        seconds: (wall - in_ops).max(0.0),
        bytes: 0,
    });
    rows.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    Ok((rows, wall))
}

fn invalid(field: &'static str, rule: impl std::fmt::Display) -> BenchError {
    BenchError::InvalidConfig {
        field,
        rule: rule.to_string(),
    }
}

fn best(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        f()?;
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// Times diffusers through the reference command: (DiT forward, VAE decode) seconds,
/// each `None` when that network was not asked for.
fn reference(config: &ModelBenchConfig, dtype: &str) -> Result<Option<(Option<f64>, Option<f64>)>> {
    let (Some(cmd), Some(model)) = (&config.reference, &config.model) else {
        return Ok(None);
    };
    let mut args: Vec<String> = vec!["--model".into(), model.display().to_string()];
    for (flag, value) in [
        ("--dtype", dtype.to_string()),
        ("--reps", config.reps.to_string()),
        ("--width", config.width.to_string()),
        ("--height", config.height.to_string()),
    ] {
        args.extend([flag.to_string(), value]);
    }
    if !config.works.is_empty() {
        args.extend(["--works".to_string(), config.works.join(",")]);
    }
    let v = crate::reference_json(cmd, &args)?;
    let runs = |w: &str| config.works.is_empty() || config.works.iter().any(|x| x == w);
    let get = |work: &str, k: &str| {
        if !runs(work) {
            return Ok(None);
        }
        v[k].as_f64()
            .map(Some)
            .ok_or_else(|| invalid("reference", format!("its JSON has no number {k:?}")))
    };
    Ok(Some((
        get("dit", "dit_forward_s")?,
        get("vae", "vae_decode_s")?,
    )))
}

/// Runs the model benchmark.
pub fn run_model_bench(config: &ModelBenchConfig) -> Result<Vec<ModelRow>> {
    let ok = |v: usize| v > 0 && v.is_multiple_of(16);
    if !ok(config.width) || !ok(config.height) {
        return Err(invalid("width / height", "positive multiples of 16"));
    }
    for w in &config.works {
        if w != "dit" && w != "vae" {
            return Err(invalid("works", format!("{w:?} is not dit or vae")));
        }
    }
    let runs = |w: &str| config.works.is_empty() || config.works.iter().any(|x| x == w);
    let device = Device::cpu()?;
    let platform = device.platform().clone();
    let mut rows = Vec::new();
    let mut f32_out: Option<Tensor> = None;
    for mode in &config.modes {
        let (dtype, format) = match mode.as_str() {
            "f32" | "near-f32" => (DType::F32, WeightFormat::Native),
            "bf16" => (DType::BF16, WeightFormat::Native),
            "int8" => (DType::BF16, WeightFormat::Int8),
            other => {
                return Err(invalid(
                    "modes",
                    format!("{other:?} is not f32, near-f32, bf16 or int8"),
                ))
            }
        };
        set_near_f32(mode == "near-f32");
        // A network the run leaves out is not loaded (the seeded DiT takes most of a
        // minute to initialise).
        let preset = ModelPreset::named("wan2.1-t2v-1.3b").map_err(|e| invalid("model", e))?;
        let folder_config = |dir: &Path| {
            headroom_model::weights::read_config(&dir.join("transformer"))
                .and_then(|c| headroom_model::DitConfig::from_json(&c))
        };
        let dit = match (&config.model, &config.transformer, runs("dit")) {
            (_, _, false) => None,
            (folder, Some(path), true) => {
                let base = folder
                    .as_deref()
                    .map_or_else(|| Ok(preset.dit.clone()), folder_config);
                Some(base.and_then(|base| {
                    let options = headroom_model::import::ImportOptions {
                        base: Some(base),
                        weights: format,
                        ..Default::default()
                    };
                    headroom_model::import::load_transformer(path, &options, &device, dtype, None)
                }))
            }
            (Some(dir), None, true) => Some(folder_config(dir).and_then(|c| {
                let store = WeightStore::from_dir(&dir.join("transformer"), &device, dtype)?;
                WanTransformer::from_store(c, &store.with_format(format))
            })),
            (None, None, true) => Some(WanTransformer::from_store(
                preset.dit.clone(),
                &WeightStore::seeded(0, &device, dtype).with_format(format),
            )),
        };
        let vae = match (&config.model, runs("vae")) {
            (_, false) => None,
            (Some(dir), true) => Some(WanVae::load(&dir.join("vae"), &device, dtype)),
            (None, true) => Some(WanVae::seeded(preset.vae.clone(), 1, &device, dtype)),
        };
        let dit = dit.transpose().map_err(|e| invalid("model", e))?;
        let vae = vae.transpose().map_err(|e| invalid("model", e))?;
        let (h, w) = (config.height / 8, config.width / 8);
        let mut dit_error = None;
        let reference = reference(config, if dtype == DType::BF16 { "bf16" } else { "f32" })?;
        let mut measure =
            |work: &str, f: &mut dyn FnMut() -> Result<()>, reference: Option<f64>| {
                platform.reset_peak_stats();
                let seconds = best(config.reps, &mut *f)?;
                let allocated_peak_bytes =
                    platform.memory_stats().allocated_bytes.all().peak.max(0) as u64;
                let (profile, profile_seconds) = if config.profile {
                    recorded(f)?
                } else {
                    (Vec::new(), 0.0)
                };
                rows.push(ModelRow {
                    work: work.to_string(),
                    mode: mode.clone(),
                    seconds,
                    allocated_peak_bytes,
                    reference_seconds: reference,
                    speedup: reference.map(|r| r / seconds),
                    vs_bf16: None,
                    error_vs_f32: None,
                    profile,
                    profile_seconds,
                });
                Ok::<_, BenchError>(())
            };
        if let Some(dit) = &dit {
            let c = dit.config().clone();
            let latents = Tensor::randn(&[1, c.in_channels, 3, h, w], 1, 0, DType::F32, &device)?;
            let text =
                Tensor::randn(&[512, c.text_dim], 2, 0, DType::F32, &device)?.mul_scalar(0.1)?;
            measure(
                "dit forward",
                &mut || {
                    drop(
                        dit.forward(&latents, 999.0, Some(&text), None)
                            .map_err(|e| invalid("dit", e))?,
                    );
                    Ok(())
                },
                reference.and_then(|r| r.0),
            )?;
            // One more forward for the output, held for (or against) the f32 one.
            if config.modes.len() > 1 && config.modes.iter().any(|m| m == "f32") {
                let out = dit
                    .forward(&latents, 999.0, Some(&text), None)
                    .map_err(|e| invalid("dit", e))?;
                match &f32_out {
                    None if mode == "f32" => f32_out = Some(out),
                    Some(reference) => {
                        dit_error = Some(headroom_tensor::compare::relative_l2(&out, reference)?);
                    }
                    None => {}
                }
            }
        }
        if let Some(vae) = &vae {
            let z = Tensor::randn(&[1, vae.config().z_dim, 3, h, w], 3, 0, DType::F32, &device)?;
            measure(
                "vae decode",
                &mut || {
                    drop(vae.decode(&z).map_err(|e| invalid("vae", e))?);
                    Ok(())
                },
                reference.and_then(|r| r.1),
            )?;
        }
        if let Some(row) = rows
            .iter_mut()
            .find(|r| r.work == "dit forward" && &r.mode == mode)
        {
            row.error_vs_f32 = dit_error;
        }
    }
    set_near_f32(false);
    for i in 0..rows.len() {
        let bf16 = rows
            .iter()
            .find(|r| r.mode == "bf16" && r.work == rows[i].work)
            .map(|r| r.seconds);
        if rows[i].mode != "bf16" {
            rows[i].vs_bf16 = bf16.map(|b| b / rows[i].seconds);
        }
    }
    Ok(rows)
}

/// The report `bench models --json` prints: the CPU, its threads and path, the rows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelBenchReport {
    /// CPU model name.
    pub cpu: String,
    /// Kernel threads.
    pub threads: usize,
    /// The CPU path the kernels took.
    pub path: &'static str,
    /// One row per work and mode.
    pub rows: Vec<ModelRow>,
}

impl ModelBenchReport {
    /// `rows` measured on this machine's CPU, threads and path.
    pub fn new(rows: Vec<ModelRow>) -> Self {
        Self {
            cpu: headroom_tensor::kernels::cpu::model_name(),
            threads: headroom_tensor::parallel::num_threads(),
            path: headroom_tensor::kernels::cpu::selected().name(),
            rows,
        }
    }
}

/// The line that heads a run of `config`'s table: CPU, shapes, repetitions, threads, path.
pub fn heading(config: &ModelBenchConfig) -> String {
    format!(
        "{}: one AR block: 3 latent frames at {}x{}, 512 text tokens; best of {} after a warm-up; {} kernel threads, path {}\n",
        headroom_tensor::kernels::cpu::model_name(),
        config.width,
        config.height,
        config.reps,
        headroom_tensor::parallel::num_threads(),
        headroom_tensor::kernels::cpu::selected()
    )
}

/// The rows as a Markdown table (with `× our bf16` and `rel. L2 vs f32` columns where
/// some row has them).
pub fn markdown(rows: &[ModelRow]) -> String {
    let extra = rows
        .iter()
        .any(|r| r.vs_bf16.is_some() || r.error_vs_f32.is_some());
    let mut s = String::from(if extra {
        "| work | mode | headroom s | diffusers s | speedup | × our bf16 | rel. L2 vs f32 | allocated peak |\n|---|---|---|---|---|---|---|---|\n"
    } else {
        "| work | mode | headroom s | diffusers s | speedup | allocated peak |\n|---|---|---|---|---|---|\n"
    });
    for r in rows {
        let opt = |v: Option<f64>, suffix: &str| {
            v.map_or("—".to_string(), |v| format!("{v:.2}{suffix}"))
        };
        let more = if extra {
            let error = r
                .error_vs_f32
                .map_or("—".to_string(), |e| format!("{:.2} %", e * 100.0));
            format!(" {} | {error} |", opt(r.vs_bf16, "×"))
        } else {
            String::new()
        };
        s.push_str(&format!(
            "| {} | {} | {:.2} | {} | {} |{more} {} |\n",
            r.work,
            r.mode,
            r.seconds,
            opt(r.reference_seconds, ""),
            opt(r.speedup, "×"),
            headroom_mem::format_bytes(r.allocated_peak_bytes),
        ));
    }
    for r in rows.iter().filter(|r| !r.profile.is_empty()) {
        s.push_str(&format!(
            "\n{} {}, per op kind (one more run, {:.2} s, recorded):\n\n| op | calls | s | share | GB moved | GB/s |\n|---|---|---|---|---|---|\n",
            r.work, r.mode, r.profile_seconds
        ));
        for op in &r.profile {
            let gb = op.bytes as f64 / 1e9;
            let rate = if op.seconds > 0.0 && op.bytes > 0 {
                format!("{:.1}", gb / op.seconds)
            } else {
                "—".to_string()
            };
            s.push_str(&format!(
                "| {} | {} | {:.3} | {:.1} % | {:.2} | {} |\n",
                op.op,
                op.calls,
                op.seconds,
                100.0 * op.seconds / r.profile_seconds.max(f64::MIN_POSITIVE),
                gb,
                rate
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_run_gives_rows_per_op_and_a_table() {
        let device = Device::cpu().unwrap();
        let x = Tensor::randn(&[64, 96], 1, 0, DType::F32, &device).unwrap();
        let w = Tensor::randn(&[32, 96], 2, 0, DType::F32, &device).unwrap();
        let (rows, wall) = recorded(&mut || {
            let y = x.linear(&w, None)?.silu()?;
            drop(y.add(&y)?);
            Ok(())
        })
        .unwrap();
        let find = |op: &str| rows.iter().find(|r| r.op == op);
        let linear = find("linear").expect("a linear row");
        assert!(linear.calls >= 1 && linear.bytes >= ((64 + 32) * 96 + 64 * 32) * 4);
        assert!(find("silu").is_some() && find("add").is_some());
        assert!(find("outside ops").is_some());
        let in_rows: f64 = rows.iter().map(|r| r.seconds).sum();
        // The rows partition the run: the ops' own time plus the time outside them.
        assert!(in_rows >= wall * 0.999, "{in_rows} of {wall}");
        assert!(rows.windows(2).all(|p| p[0].seconds >= p[1].seconds));
        let table = markdown(&[ModelRow {
            work: "dit forward".into(),
            mode: "f32".into(),
            seconds: wall,
            allocated_peak_bytes: 0,
            reference_seconds: None,
            speedup: None,
            vs_bf16: None,
            error_vs_f32: None,
            profile: rows,
            profile_seconds: wall,
        }]);
        assert!(
            table.contains("per op kind") && table.contains("| linear |"),
            "{table}"
        );
        assert!(!table.contains("× our bf16"), "{table}");
    }

    #[test]
    fn the_table_gives_each_mode_against_our_bf16_and_its_error_against_f32() {
        let row = |mode: &str, seconds: f64, vs_bf16, error_vs_f32| ModelRow {
            work: "dit forward".into(),
            mode: mode.into(),
            seconds,
            allocated_peak_bytes: 1 << 30,
            reference_seconds: Some(10.0),
            speedup: Some(10.0 / seconds),
            vs_bf16,
            error_vs_f32,
            profile: Vec::new(),
            profile_seconds: 0.0,
        };
        let table = markdown(&[
            row("bf16", 8.0, None, Some(0.005)),
            row("int8", 5.0, Some(1.6), Some(0.02)),
        ]);
        assert!(table.contains("| × our bf16 | rel. L2 vs f32 |"), "{table}");
        assert!(
            table.contains(
                "| dit forward | int8 | 5.00 | 10.00 | 2.00× | 1.60× | 2.00 % | 1.0 GiB |"
            ),
            "{table}"
        );
        assert!(
            table.contains("| bf16 | 8.00 | 10.00 | 1.25× | — | 0.50 % |"),
            "{table}"
        );
    }
}
