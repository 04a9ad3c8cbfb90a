//! `headroom bench kernels`: GFLOP/s of headroom's tensor ops at Wan shapes on every CPU
//! path this machine runs (AMX, AVX-512) and in each compute (f32, near-f32 on AMX, bf16,
//! and int8 W8A8 linears where the CPU has VNNI), each beside the path's bare arithmetic
//! peak measured in the same run, and the scratch memory each op took from the allocator.
//! On a GPU device: the same kernels in f32 and bf16 and the fp8 and int8 linears, each
//! against a bf16 cuBLASLt GEMM of its FLOP-equivalent shape.

use std::time::Instant;

use headroom_model::WeightFormat;
use headroom_tensor::kernels::gemm::{sgemm, MatRef, Threads};
use headroom_tensor::ops::attention::Mask;
use headroom_tensor::ops::conv::Conv3dOptions;
use headroom_tensor::{parallel, DType, Device, Tensor};
use serde::Serialize;

use crate::Result;

/// One kernel's measurement.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelRow {
    /// `matmul MxKxN`, `attention …` or `conv3d …`.
    pub name: String,
    /// The CPU path (`amx`, `avx512`, …).
    pub path: String,
    /// `f32`, `near-f32` or `bf16`.
    pub compute: String,
    /// The path's bare peak for this compute (GFLOP/s over the pool), when it has one.
    pub peak_gflops: Option<f64>,
    /// `gflops / peak_gflops`.
    pub fraction_of_peak: Option<f64>,
    /// GFLOP/s of headroom's op (best of the repetitions).
    pub gflops: f64,
    /// GFLOP/s of the bare GEMM of the FLOP-equivalent shape (best of the repetitions).
    pub reference_gflops: f64,
    /// `gflops / reference_gflops`.
    pub ratio: f64,
    /// Peak bytes the op held from the allocator beyond its inputs and output.
    pub scratch_peak_bytes: u64,
}

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelBenchConfig {
    /// Timed repetitions of each side (best counts).
    pub reps: usize,
    /// Divide the long axes by this (1 = the real Wan shapes; tests use more).
    pub shrink: usize,
}

impl Default for KernelBenchConfig {
    fn default() -> Self {
        Self { reps: 3, shrink: 1 }
    }
}

/// Plain buffers for one bare `gemm` call `[m×k]·[k×n]`: the reference side.
struct BareGemm {
    m: usize,
    k: usize,
    n: usize,
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
}

impl BareGemm {
    fn new(m: usize, k: usize, n: usize) -> Self {
        Self {
            m,
            k,
            n,
            a: (0..m * k).map(|i| (i % 17) as f32 * 0.01).collect(),
            b: (0..k * n).map(|i| (i % 13) as f32 * 0.01).collect(),
            c: vec![0f32; m * n],
        }
    }

    fn flops(&self) -> f64 {
        2.0 * (self.m * self.n * self.k) as f64
    }

    fn run_host(&mut self) {
        let Self { m, k, n, a, b, c } = self;
        let (m, k, n) = (*m, *k, *n);
        parallel::run(|| {
            sgemm(
                m,
                n,
                k,
                MatRef::row_major(a, 0, k),
                MatRef::row_major(b, 0, n),
                c,
                0,
                n,
                false,
                1.0,
                Threads::Pool,
            )
        });
    }
}

/// The reference side of a row: on the host one bare `gemm` call, on a GPU device one
/// bf16 cuBLASLt GEMM (`linear`) of the FLOP-equivalent shape, the device's dense-math
/// ceiling in practice.
enum Reference {
    Host(BareGemm),
    Gpu { x: Tensor, w: Tensor, flops: f64 },
}

impl Reference {
    fn new(device: &Device, m: usize, k: usize, n: usize) -> Result<Self> {
        if device.launcher().is_none() {
            return Ok(Reference::Host(BareGemm::new(m, k, n)));
        }
        let make = |shape: &[usize], seed| -> Result<Tensor> {
            Ok(Tensor::randn(shape, seed, 0, DType::BF16, device)?)
        };
        Ok(Reference::Gpu {
            x: make(&[m, k], 11)?,
            w: make(&[n, k], 12)?,
            flops: 2.0 * (m * n * k) as f64,
        })
    }

    fn flops(&self) -> f64 {
        match self {
            Reference::Host(g) => g.flops(),
            Reference::Gpu { flops, .. } => *flops,
        }
    }

    fn run(&mut self) -> Result<()> {
        match self {
            Reference::Host(g) => g.run_host(),
            Reference::Gpu { x, w, .. } => {
                let y = x.linear(w, None)?;
                y.device().synchronize()?;
            }
        }
        Ok(())
    }
}

/// Times `op` and the bare reference alternately (so drift hits both alike), `reps`
/// times each after a warm-up. Returns (best op seconds, best reference seconds, scratch
/// peak), the scratch being the op's peak requested bytes beyond its inputs and output.
fn compare(
    device: &Device,
    reps: usize,
    output_bytes: u64,
    reference: &mut Reference,
    mut op: impl FnMut() -> Result<Tensor>,
) -> Result<(f64, f64, u64)> {
    // GPU work is asynchronous: a timing ends when the device has finished.
    let mut timed = || -> Result<()> {
        let out = op()?;
        out.device().synchronize()?;
        Ok(())
    };
    timed()?;
    reference.run()?;
    let platform = device.platform();
    let base = platform.memory_stats().requested_bytes.all().current;
    platform.reset_peak_stats();
    let (mut best_op, mut best_ref) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        timed()?;
        best_op = best_op.min(start.elapsed().as_secs_f64());
        let start = Instant::now();
        reference.run()?;
        best_ref = best_ref.min(start.elapsed().as_secs_f64());
    }
    let peak = platform.memory_stats().requested_bytes.all().peak;
    let scratch = ((peak - base).max(0) as u64).saturating_sub(output_bytes);
    Ok((best_op, best_ref, scratch))
}

fn row(
    name: String,
    flops: f64,
    secs: f64,
    reference: &Reference,
    reference_secs: f64,
    scratch_peak_bytes: u64,
) -> KernelRow {
    let gflops = flops / secs / 1e9;
    let reference_gflops = reference.flops() / reference_secs / 1e9;
    KernelRow {
        name,
        path: String::new(),
        compute: String::new(),
        peak_gflops: None,
        fraction_of_peak: None,
        gflops,
        reference_gflops,
        ratio: gflops / reference_gflops,
        scratch_peak_bytes,
    }
}

thread_local! {
    /// The dtype the current rows' operands are made in.
    static OPERAND_DTYPE: std::cell::Cell<DType> = const { std::cell::Cell::new(DType::F32) };
}

fn random(shape: &[usize], seed: u64, device: &Device) -> Result<Tensor> {
    let dtype = OPERAND_DTYPE.with(|d| d.get());
    Ok(Tensor::randn(shape, seed, 0, DType::F32, device)?
        .mul_scalar(0.1)?
        .to_dtype(dtype)?)
}

fn matmul_row(device: &Device, m: usize, k: usize, n: usize, reps: usize) -> Result<KernelRow> {
    // Activations f32, the weight-like operand in the row's dtype (as the models run).
    let a = random(&[m, k], 1, device)?.to_dtype(DType::F32)?;
    let b = random(&[k, n], 2, device)?;
    let mut reference = Reference::new(device, m, k, n)?;
    let (secs, ref_secs, scratch) =
        compare(device, reps, (m * n * 4) as u64, &mut reference, || {
            Ok(a.matmul(&b)?)
        })?;
    Ok(row(
        format!("matmul {m}x{k}x{n}"),
        2.0 * (m * n * k) as f64,
        secs,
        &reference,
        ref_secs,
        scratch,
    ))
}

/// `x · Wᵀ` with `W` packed once as a model holds it ([`Tensor::pack_linear`]); none
/// where the path and dtype do not pack weights (only bf16 on AMX does).
fn linear_row(
    device: &Device,
    m: usize,
    k: usize,
    n: usize,
    reps: usize,
) -> Result<Option<KernelRow>> {
    let x = random(&[m, k], 1, device)?.to_dtype(DType::F32)?;
    let w = random(&[n, k], 2, device)?;
    let Some(packed) = w.pack_linear()? else {
        return Ok(None);
    };
    let mut reference = Reference::new(device, m, k, n)?;
    let (secs, ref_secs, scratch) =
        compare(device, reps, (m * n * 4) as u64, &mut reference, || {
            Ok(x.linear_packed(&packed, None)?)
        })?;
    Ok(Some(row(
        format!("linear {m}x{k}x{n} (packed weight)"),
        2.0 * (m * n * k) as f64,
        secs,
        &reference,
        ref_secs,
        scratch,
    )))
}

fn attention_row(
    device: &Device,
    q_len: usize,
    kv_len: usize,
    heads: usize,
    head_dim: usize,
    reps: usize,
) -> Result<KernelRow> {
    // f32 activations with the compute named explicitly, as the models call it.
    let compute = if OPERAND_DTYPE.with(|d| d.get()) == DType::BF16 {
        headroom_tensor::kernels::gemm::Compute::Bf16
    } else {
        headroom_tensor::kernels::gemm::f32_compute()
    };
    let q = random(&[1, q_len, heads, head_dim], 3, device)?.to_dtype(DType::F32)?;
    let k = random(&[1, kv_len, heads, head_dim], 4, device)?.to_dtype(DType::F32)?;
    let v = random(&[1, kv_len, heads, head_dim], 5, device)?.to_dtype(DType::F32)?;
    let mut reference = Reference::new(device, q_len, head_dim, kv_len)?;
    let out_bytes = (q_len * heads * head_dim * 4) as u64;
    let (secs, ref_secs, scratch) = compare(device, reps, out_bytes, &mut reference, || {
        Ok(Tensor::scaled_dot_product_attention_in(
            &q,
            &k,
            &v,
            Mask::None,
            None,
            compute,
        )?)
    })?;
    let flops = 4.0 * (heads * q_len * kv_len * head_dim) as f64;
    let name = format!("attention {q_len}q x {kv_len}k x {heads}h x {head_dim}d");
    Ok(row(name, flops, secs, &reference, ref_secs, scratch))
}

fn conv3d_row(
    device: &Device,
    channels: usize,
    frames: usize,
    h: usize,
    w: usize,
    reps: usize,
) -> Result<KernelRow> {
    let x = random(&[1, channels, frames, h, w], 6, device)?.to_dtype(DType::F32)?;
    let weight = random(&[channels, channels, 3, 3, 3], 7, device)?;
    let bias = random(&[channels], 8, device)?.to_dtype(DType::F32)?;
    let pixels = frames * h * w;
    let mut reference = Reference::new(device, channels, channels * 27, pixels)?;
    let out_bytes = (channels * pixels * 4) as u64;
    let (secs, ref_secs, scratch) = compare(device, reps, out_bytes, &mut reference, || {
        Ok(x.conv3d(&weight, Some(&bias), Conv3dOptions::causal([1, 1, 1]))?)
    })?;
    // The work a causal conv must do: frame t's taps on the two zero frames in front
    // (t < 2) multiply zeros, and the kernel skips them.
    let taps: usize = (0..frames).map(|t| 9 * (t + 1).min(3)).sum();
    let flops = 2.0 * (channels * channels * taps * h * w) as f64;
    let name = format!("conv3d {channels}->{channels} 3x3x3 {frames}x{h}x{w}");
    Ok(row(name, flops, secs, &reference, ref_secs, scratch))
}

/// A 3×3 conv2d with padding 1 over `frames` images: TAEHV's memory-block conv
/// (`cat[x, past]`, 2n → n channels).
fn conv2d_row(
    device: &Device,
    (cin, cout): (usize, usize),
    frames: usize,
    h: usize,
    w: usize,
    reps: usize,
) -> Result<KernelRow> {
    let x = random(&[frames, cin, h, w], 9, device)?.to_dtype(DType::F32)?;
    let weight = random(&[cout, cin, 3, 3], 10, device)?;
    let bias = random(&[cout], 11, device)?.to_dtype(DType::F32)?;
    let pixels = frames * h * w;
    let mut reference = Reference::new(device, cout, cin * 9, pixels)?;
    let out_bytes = (cout * pixels * 4) as u64;
    let (secs, ref_secs, scratch) = compare(device, reps, out_bytes, &mut reference, || {
        Ok(x.conv2d(&weight, Some(&bias), [1, 1], [1, 1])?)
    })?;
    let flops = 2.0 * (cout * cin * 9 * pixels) as f64;
    let name = format!("conv2d {cin}->{cout} 3x3 {frames}x{h}x{w}");
    Ok(row(name, flops, secs, &reference, ref_secs, scratch))
}

/// `x · Wᵀ` with `W` quantized once as a model holds it (`--weights int8|fp8`): int8
/// W8A8 (the input quantized per row in each call), or fp8 (e4m3 per output channel:
/// widened to bf16 on the CPU, W8A8 on a GPU's fp8 GEMM), in GOP/s.
fn eight_bit_linear_row(
    device: &Device,
    [m, k, n]: [usize; 3],
    format: WeightFormat,
    reps: usize,
) -> Result<KernelRow> {
    let x = random(&[m, k], 1, device)?.to_dtype(DType::F32)?;
    let w = random(&[n, k], 2, device)?;
    let mut reference = Reference::new(device, m, k, n)?;
    let (what, mut op): (&str, Box<dyn FnMut() -> Result<Tensor>>) = match format {
        WeightFormat::Fp8 => {
            let (codes, scale) = w.quantize_fp8()?;
            let x = &x;
            let op = move || Ok(x.linear_fp8(&codes, &scale, None)?);
            ("fp8 weight", Box::new(op))
        }
        _ => {
            let q = w.quantize_linear_int8()?;
            let x = &x;
            ("int8 W8A8", Box::new(move || Ok(x.linear_int8(&q, None)?)))
        }
    };
    let (secs, ref_secs, scratch) =
        compare(device, reps, (m * n * 4) as u64, &mut reference, &mut op)?;
    Ok(row(
        format!("linear {m}x{k}x{n} ({what})"),
        2.0 * (m * n * k) as f64,
        secs,
        &reference,
        ref_secs,
        scratch,
    ))
}

/// The 8-bit linears at the Wan 1.3B's shapes (attention and both FFN products).
fn eight_bit_rows(
    device: &Device,
    config: &KernelBenchConfig,
    format: WeightFormat,
) -> Result<Vec<KernelRow>> {
    let s = config.shrink.max(1);
    let tokens = 4680 / s;
    [(1536, 1536 / s), (1536, 8960 / s), (8960 / s, 1536)]
        .into_iter()
        .map(|(k, n)| eight_bit_linear_row(device, [tokens, k, n], format, config.reps))
        .collect()
}

/// The kernels at Wan shapes in the current path and compute.
fn kernel_rows(device: &Device, config: &KernelBenchConfig) -> Result<Vec<KernelRow>> {
    let s = config.shrink.max(1);
    let tokens = 4680 / s;
    let mut rows = vec![
        matmul_row(device, tokens, 1536, 1536 / s, config.reps)?,
        matmul_row(device, tokens, 1536, 8960 / s, config.reps)?,
    ];
    for n in [1536 / s, 8960 / s] {
        rows.extend(linear_row(device, tokens, 1536, n, config.reps)?);
    }
    rows.extend([
        attention_row(device, tokens, 2 * tokens, 12, 128, config.reps)?,
        conv3d_row(
            device,
            96,
            4,
            (60 / s).max(3),
            (104 / s).max(3),
            config.reps,
        )?,
        // The tiny decoder's second-stage memory block at 240×416 video (one latent
        // frame: one 60×104 image).
        conv2d_row(
            device,
            (256, 128),
            1,
            (60 / s).max(3),
            (104 / s).max(3),
            config.reps,
        )?,
    ]);
    Ok(rows)
}

/// Runs every kernel benchmark on a GPU device in f32 and bf16 operands, and the 8-bit
/// linears (fp8 and int8 weights), each against a bf16 cuBLASLt GEMM of the
/// FLOP-equivalent shape (no bare peak loop on the GPU): an 8-bit row's ratio is its
/// speed over bf16's.
pub fn run_kernel_bench_on(device: &Device, config: &KernelBenchConfig) -> Result<Vec<KernelRow>> {
    let mut rows = Vec::new();
    for (compute, dtype) in [("f32", DType::F32), ("bf16", DType::BF16)] {
        OPERAND_DTYPE.with(|d| d.set(dtype));
        for mut row in kernel_rows(device, config)? {
            row.path = "cuda".into();
            row.compute = compute.into();
            rows.push(row);
        }
    }
    OPERAND_DTYPE.with(|d| d.set(DType::F32));
    for format in [WeightFormat::Fp8, WeightFormat::Int8] {
        for mut row in eight_bit_rows(device, config, format)? {
            row.path = "cuda".into();
            row.compute = format.name().into();
            rows.push(row);
        }
    }
    Ok(rows)
}

/// Runs every kernel benchmark on every path this CPU runs (AMX, AVX512-BF16, AVX-512,
/// else the best one), in f32, near-f32 (packed bf16 paths only) and bf16.
pub fn run_kernel_bench(config: &KernelBenchConfig) -> Result<Vec<KernelRow>> {
    use headroom_tensor::kernels::cpu::{self, peak::peak_gflops, CpuPath};
    use headroom_tensor::kernels::gemm::set_near_f32;
    let device = Device::cpu()?;
    let mut paths: Vec<CpuPath> = [CpuPath::Amx, CpuPath::Avx512Bf16, CpuPath::Avx512]
        .into_iter()
        .filter(|p| p.supported())
        .collect();
    if paths.is_empty() {
        paths.push(cpu::best());
    }
    let iterations = (2_000_000 / config.shrink.max(1)).max(1000);
    let mut rows = Vec::new();
    for path in paths {
        cpu::set_path(Some(path)).map_err(|rule| crate::BenchError::InvalidConfig {
            field: "path",
            rule,
        })?;
        let f32_peak = peak_gflops(CpuPath::Avx512, iterations).filter(|_| path >= CpuPath::Avx512);
        // bf16 products run at the path's own bf16 peak (tiles or `vdpbf16ps`); the
        // AVX-512 path rounds operands and multiplies in f32.
        let bf16_peak = match path {
            CpuPath::Amx => peak_gflops(CpuPath::Amx, iterations / 8),
            CpuPath::Avx512Bf16 => peak_gflops(CpuPath::Avx512Bf16, iterations),
            _ => f32_peak,
        };
        let mut modes = vec![
            ("f32", DType::F32, false, f32_peak),
            ("bf16", DType::BF16, false, bf16_peak),
        ];
        if path.packs_bf16() {
            modes.insert(
                1,
                ("near-f32", DType::F32, true, bf16_peak.map(|p| p / 3.0)),
            );
        }
        for (compute, dtype, near, peak) in modes {
            set_near_f32(near);
            OPERAND_DTYPE.with(|d| d.set(dtype));
            for mut row in kernel_rows(&device, config)? {
                row.path = path.name().to_string();
                row.compute = compute.to_string();
                row.peak_gflops = peak;
                row.fraction_of_peak = peak.map(|p| row.gflops / p);
                rows.push(row);
            }
        }
        // int8 products run where the path has AVX-512 and the CPU VNNI.
        let int8_peak = cpu::peak::peak_int8_gops(iterations);
        if path >= CpuPath::Avx512 && int8_peak.is_some() {
            set_near_f32(false);
            for mut row in eight_bit_rows(&device, config, WeightFormat::Int8)? {
                row.path = path.name().to_string();
                row.compute = "int8".to_string();
                row.peak_gflops = int8_peak;
                row.fraction_of_peak = int8_peak.map(|p| row.gflops / p);
                rows.push(row);
            }
        }
    }
    set_near_f32(false);
    OPERAND_DTYPE.with(|d| d.set(DType::F32));
    cpu::set_path(None).map_err(|rule| crate::BenchError::InvalidConfig {
        field: "path",
        rule,
    })?;
    Ok(rows)
}

/// The report `bench kernels --json` prints: the CPU, the kernel threads and the rows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelBenchReport {
    /// CPU model name.
    pub cpu: String,
    /// Kernel threads.
    pub threads: usize,
    /// One row per kernel, path and compute.
    pub kernels: Vec<KernelRow>,
}

impl KernelBenchReport {
    /// `rows` measured on this machine's CPU and kernel threads.
    pub fn new(rows: Vec<KernelRow>) -> Self {
        Self {
            cpu: headroom_tensor::kernels::cpu::model_name(),
            threads: parallel::num_threads(),
            kernels: rows,
        }
    }
}

/// The rows of a run of `config` as a text table, headed by how to read it; `gpu` names
/// the GPU the ops ran on, if they did.
pub fn table(config: &KernelBenchConfig, rows: &[KernelRow], gpu: Option<&str>) -> String {
    let mut out = format!(
        "{}: best of {} runs each, {} kernel threads; peak = the path's bare arithmetic loop on every thread (bf16: the tiles' or vdpbf16ps' own; near-f32: a third of it; int8: vpdpbusd's, in GOP/s); gemm crate = one bare f32 gemm call of the FLOP-equivalent shape\n",
        headroom_tensor::kernels::cpu::model_name(),
        config.reps,
        parallel::num_threads()
    );
    if let Some(name) = gpu {
        out.push_str(&format!("on {name}: the reference column is one bf16 cuBLASLt GEMM of the FLOP-equivalent shape\n"));
    }
    out.push_str(&format!(
        "{:<40}{:>8}{:>10}{:>10}{:>10}{:>8}{:>11}{:>14}\n",
        "kernel", "path", "compute", "GFLOP/s", "peak", "% peak", "gemm crate", "scratch peak"
    ));
    for row in rows {
        let peak = row
            .peak_gflops
            .map_or("—".to_string(), |p| format!("{p:.0}"));
        let frac = row
            .fraction_of_peak
            .map_or("—".to_string(), |f| format!("{:.0}%", 100.0 * f));
        out.push_str(&format!(
            "{:<40}{:>8}{:>10}{:>10.1}{:>10}{:>8}{:>11.1}{:>14}\n",
            row.name,
            row.path,
            row.compute,
            row.gflops,
            peak,
            frac,
            row.reference_gflops,
            headroom_mem::format_bytes(row.scratch_peak_bytes)
        ));
    }
    out
}
