//! `--dtype f32|bf16`: the dtype a model's weights are held and computed in.

use clap::ValueEnum;
use headroom_tensor::DType;

/// What a model runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DtypeArg {
    /// f32 weights and compute (the golden reference).
    F32,
    /// bf16 weights and GEMM inputs, f32 accumulation, f32 norms, softmax and RoPE.
    Bf16,
}

impl DtypeArg {
    /// The weight dtype.
    pub fn dtype(self) -> DType {
        match self {
            DtypeArg::F32 => DType::F32,
            DtypeArg::Bf16 => DType::BF16,
        }
    }
}
