//! The catalog of CUDA kernel modules: each `.cu` source embedded in the binary, the extra
//! NVRTC options it needs, and every `extern "C"` kernel it defines with the op it serves.

use super::nvrtc::Header;

/// The op family a kernel implements (the `op` field of `headroom cuda kernels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    /// Binary ops with broadcasting, unary activations, scalar affine, modulation.
    Elementwise,
    /// dtype conversions and pixels.
    Cast,
    /// Softmax over the last axis.
    Softmax,
    /// Layer norm over the last axis.
    LayerNorm,
    /// RMS norm over the last axis (DiT) and over channels (VAE).
    RmsNorm,
    /// Wan's 3-axis rotary embedding.
    Rope,
    /// Flash-style attention with the block-causal mask.
    Attention,
    /// Causal 3-D convolution.
    Conv3d,
    /// Nearest ×2, pixel shuffle / unshuffle, padding.
    Resample,
    /// Sum, mean and max over an axis.
    Reduce,
    /// The counter-based normal generator.
    Noise,
    /// Strided copies (contiguous, cat, views) and fills.
    Copy,
    /// 8-bit linears: activations quantized per row, 8-bit weights widened, the scales'
    /// epilogue.
    Quantize,
}

impl Op {
    /// Every op, in the order of the list.
    pub const ALL: [Op; 13] = [
        Op::Elementwise,
        Op::Cast,
        Op::Softmax,
        Op::LayerNorm,
        Op::RmsNorm,
        Op::Rope,
        Op::Attention,
        Op::Conv3d,
        Op::Resample,
        Op::Reduce,
        Op::Noise,
        Op::Copy,
        Op::Quantize,
    ];

    /// The op's name in reports (`layer_norm`).
    pub fn name(self) -> &'static str {
        match self {
            Op::Elementwise => "elementwise",
            Op::Cast => "cast",
            Op::Softmax => "softmax",
            Op::LayerNorm => "layer_norm",
            Op::RmsNorm => "rms_norm",
            Op::Rope => "rope",
            Op::Attention => "attention",
            Op::Conv3d => "conv3d",
            Op::Resample => "resample",
            Op::Reduce => "reduce",
            Op::Noise => "noise",
            Op::Copy => "copy",
            Op::Quantize => "quantize",
        }
    }
}

/// One `.cu` source: its kernels and the options it needs beyond the common ones.
#[derive(Debug, Clone, Copy)]
pub struct KernelModule {
    /// The module name (the file stem).
    pub name: &'static str,
    /// The CUDA C source.
    pub source: &'static str,
    /// NVRTC options added for this module only.
    pub extra_options: &'static [&'static str],
    /// Every `extern "C" __global__` kernel of the source and its op.
    pub kernels: &'static [(&'static str, Op)],
}

/// The shared prelude every module includes as `"prelude.cuh"`.
pub const PRELUDE: Header = Header {
    name: "prelude.cuh",
    source: include_str!("kernels/prelude.cuh"),
};

use Op::*;

/// Every kernel module of the backend.
pub const MODULES: &[KernelModule] = &[
    KernelModule {
        name: "elementwise",
        source: include_str!("kernels/elementwise.cu"),
        extra_options: &[],
        kernels: &[
            ("add_f32", Elementwise),
            ("add_contig_f32", Elementwise),
            ("sub_f32", Elementwise),
            ("sub_contig_f32", Elementwise),
            ("mul_f32", Elementwise),
            ("mul_contig_f32", Elementwise),
            ("div_f32", Elementwise),
            ("div_contig_f32", Elementwise),
            ("exp_f32", Elementwise),
            ("sin_f32", Elementwise),
            ("cos_f32", Elementwise),
            ("sqrt_f32", Elementwise),
            ("rsqrt_f32", Elementwise),
            ("silu_f32", Elementwise),
            ("tanh_f32", Elementwise),
            ("gelu_tanh_f32", Elementwise),
            ("gelu_erf_f32", Elementwise),
            ("affine_f32", Elementwise),
            ("clamp_f32", Elementwise),
            ("modulate_f32", Elementwise),
        ],
    },
    KernelModule {
        name: "cast",
        source: include_str!("kernels/cast.cu"),
        extra_options: &[],
        kernels: &[
            ("f32_to_bf16", Cast),
            ("bf16_to_f32", Cast),
            ("f32_to_f16", Cast),
            ("f16_to_f32", Cast),
            ("u8_to_f32", Cast),
            ("i64_to_f32", Cast),
            ("f32_to_pixels", Cast),
        ],
    },
    KernelModule {
        name: "softmax",
        source: include_str!("kernels/softmax.cu"),
        extra_options: &[],
        kernels: &[("softmax_f32", Softmax)],
    },
    KernelModule {
        name: "norm",
        source: include_str!("kernels/norm.cu"),
        extra_options: &[],
        kernels: &[
            ("layer_norm_f32", LayerNorm),
            ("rms_norm_f32", RmsNorm),
            ("rms_norm_channels_f32", RmsNorm),
        ],
    },
    KernelModule {
        name: "rope",
        source: include_str!("kernels/rope.cu"),
        extra_options: &[],
        kernels: &[("rope_f32", Rope)],
    },
    KernelModule {
        name: "attention",
        source: include_str!("kernels/attention.cu"),
        extra_options: &[],
        kernels: &[
            ("attention_bf16_d64", Attention),
            ("attention_bf16_d128", Attention),
            ("attention_f32", Attention),
        ],
    },
    KernelModule {
        name: "conv3d",
        source: include_str!("kernels/conv3d.cu"),
        extra_options: &[],
        kernels: &[("conv3d_f32", Conv3d)],
    },
    KernelModule {
        name: "resample",
        source: include_str!("kernels/resample.cu"),
        extra_options: &[],
        kernels: &[
            ("upsample_nearest2x_f32", Resample),
            ("pixel_shuffle_f32", Resample),
            ("pixel_unshuffle_f32", Resample),
            ("pad_f32", Resample),
        ],
    },
    KernelModule {
        name: "copy",
        source: include_str!("kernels/copy.cu"),
        extra_options: &[],
        kernels: &[
            ("copy_strided_b8", Copy),
            ("copy_strided_b4", Copy),
            ("copy_strided_b2", Copy),
            ("copy_strided_b1", Copy),
            ("fill_b4", Copy),
        ],
    },
    KernelModule {
        name: "reduce",
        source: include_str!("kernels/reduce.cu"),
        extra_options: &[],
        kernels: &[
            ("sum_rows_f32", Reduce),
            ("max_rows_f32", Reduce),
            ("sum_axis_f32", Reduce),
            ("max_axis_f32", Reduce),
        ],
    },
    KernelModule {
        name: "noise",
        source: include_str!("kernels/noise.cu"),
        // Bit-exact with the CPU generator: no multiply-add contraction.
        extra_options: &["--fmad=false"],
        kernels: &[("randn_f32", Noise)],
    },
    KernelModule {
        name: "quant",
        source: include_str!("kernels/quant.cu"),
        extra_options: &[],
        kernels: &[
            ("quantize_rows_e4m3_f32", Quantize),
            ("quantize_rows_e4m3_bf16", Quantize),
            ("quantize_rows_i8_f32", Quantize),
            ("quantize_rows_i8_bf16", Quantize),
            ("e4m3_to_bf16", Quantize),
            ("i8_to_bf16", Quantize),
            ("e4m3_to_f32", Cast),
            ("e5m2_to_f32", Cast),
            ("i8_to_f32", Cast),
            ("e5m2_to_bf16", Quantize),
            ("scale_bias_act_f32", Quantize),
        ],
    },
];

/// The module named `name`.
pub fn module(name: &str) -> Option<&'static KernelModule> {
    MODULES.iter().find(|m| m.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `extern "C" __global__` names defined in a source (after macro expansion for
    /// the `BINARY`/`UNARY`/`COPY` helpers of the elementwise and copy modules).
    fn defined(source: &str) -> Vec<String> {
        let mut names = Vec::new();
        for line in source.lines() {
            let line = line.trim();
            if let Some(rest) = line.split("__global__ void ").nth(1) {
                let rest = rest.trim_start_matches("__launch_bounds__(256) ");
                let rest = rest.trim_start_matches("__launch_bounds__(128) ");
                if let Some(name) = rest.split('(').next() {
                    // Macro definitions name their parameter (`NAME`, `NAME##_f32`).
                    let is_macro =
                        name.contains("##") || name.chars().all(|c| c.is_ascii_uppercase());
                    if !is_macro && !name.is_empty() && !name.contains(' ') {
                        names.push(name.to_string());
                    }
                }
            }
            for (mac, suffixes) in [
                ("BINARY(", &["_f32", "_contig_f32"][..]),
                ("UNARY(", &["_f32"][..]),
            ] {
                if let Some(rest) = line.strip_prefix(mac) {
                    let stem = rest.split(',').next().unwrap_or_default();
                    names.extend(suffixes.iter().map(|s| format!("{stem}{s}")));
                }
            }
            if let Some(rest) = line.strip_prefix("COPY(") {
                names.push(rest.split(',').next().unwrap_or_default().to_string());
            }
        }
        names.sort();
        names
    }

    #[test]
    fn every_kernel_of_every_source_is_in_the_catalog() {
        for m in MODULES {
            let mut listed: Vec<String> = m.kernels.iter().map(|(n, _)| n.to_string()).collect();
            listed.sort();
            assert_eq!(defined(m.source), listed, "module {}", m.name);
        }
    }

    /// The float literals of `text` outside `//` comments (a number with a `.`), parsed,
    /// sorted.
    fn float_literals(text: &str) -> Vec<f64> {
        let code: String = text
            .lines()
            .map(|l| l.split("//").next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        let text = code.as_str();
        let mut out = Vec::new();
        let bytes = text.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let starts = bytes[i].is_ascii_digit()
                && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'));
            if !starts {
                i += 1;
                continue;
            }
            let mut j = i;
            while j < bytes.len()
                && (bytes[j].is_ascii_alphanumeric()
                    || bytes[j] == b'.'
                    || bytes[j] == b'_'
                    || ((bytes[j] == b'-' || bytes[j] == b'+')
                        && matches!(bytes[j - 1], b'e' | b'E')))
            {
                j += 1;
            }
            let lit = text[i..j].replace('_', "");
            if lit.contains('.') {
                if let Ok(v) = lit.parse::<f64>() {
                    out.push(v);
                }
            }
            i = j;
        }
        out.sort_by(f64::total_cmp);
        out
    }

    #[test]
    fn the_cuda_noise_uses_the_cpu_generators_constants() {
        let rust = include_str!("../ops/random.rs");
        let rust = &rust
            [rust.find("const LN2_HI").expect("LN2_HI")..rust.find("impl Tensor {").expect("impl")];
        let rust = rust
            .replace("std::f64::consts::TAU", "6.283185307179586")
            .replace("std::f64::consts::SQRT_2", "1.4142135623730951");
        let cuda = module("noise").expect("noise").source;
        let cuda = &cuda[cuda.find("__device__ double portable_ln").expect("ln")
            ..cuda.find("// out[i]").expect("kernel")];
        let (r, c) = (float_literals(&rust), float_literals(cuda));
        assert!(r.len() > 30, "{r:?}");
        assert_eq!(r, c);
    }

    #[test]
    fn every_op_has_a_kernel() {
        for op in Op::ALL {
            assert!(
                MODULES
                    .iter()
                    .any(|m| m.kernels.iter().any(|&(_, o)| o == op)),
                "no kernel for {}",
                op.name()
            );
        }
    }
}
