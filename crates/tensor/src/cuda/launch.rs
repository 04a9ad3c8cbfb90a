//! What the tensor runtime asks of a GPU, as plain data: kernel launches with their
//! arguments in the kernels' C layout, cuBLASLt GEMMs and host↔device copies, all by
//! device address. A [`Launcher`] carries them out: the CUDA runtime on a GPU (feature
//! `cuda`), or the [`super::check::CheckedLauncher`] that validates every launch against
//! the compiled kernels' parameter tables on a machine without one.

use std::fmt;

use super::error::Result;

/// Rank limit of a [`DeviceView`] (`HR_MAX_RANK` of `prelude.cuh`).
pub const MAX_RANK: usize = 6;

/// Threads per block of the element-wise (grid-stride) kernels.
pub const BLOCK: u32 = 256;

/// How a kernel uses a buffer argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read only: the bytes must have been written before.
    Read,
    /// Written (and possibly read back by the same launch).
    Write,
}

/// One kernel argument.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    /// A device pointer with the bytes the kernel may touch from it.
    Ptr {
        /// Device address.
        addr: u64,
        /// Bytes the kernel may read or write from `addr`.
        bytes: u64,
        /// Read or write.
        access: Access,
    },
    /// A value passed by value: its bytes in the C layout of the parameter.
    Value(Vec<u8>),
}

impl Arg {
    /// An `i64` by value.
    pub fn i64(v: i64) -> Self {
        Arg::Value(v.to_le_bytes().to_vec())
    }
    /// A `u64` by value.
    pub fn u64(v: u64) -> Self {
        Arg::Value(v.to_le_bytes().to_vec())
    }
    /// An `i32` by value.
    pub fn i32(v: i32) -> Self {
        Arg::Value(v.to_le_bytes().to_vec())
    }
    /// A `float` by value.
    pub fn f32(v: f32) -> Self {
        Arg::Value(v.to_le_bytes().to_vec())
    }
    /// A `double` by value.
    pub fn f64(v: f64) -> Self {
        Arg::Value(v.to_le_bytes().to_vec())
    }
    /// The argument's size in the kernel's parameter buffer.
    pub fn size(&self) -> usize {
        match self {
            Arg::Ptr { .. } => 8,
            Arg::Value(b) => b.len(),
        }
    }
}

/// Builds a struct argument field by field with C's layout rules (each field aligned to
/// its size, the whole padded to its largest field), padding bytes zero.
#[derive(Debug, Default, Clone)]
pub struct CStruct {
    bytes: Vec<u8>,
    align: usize,
}

impl CStruct {
    /// An empty struct.
    pub fn new() -> Self {
        Self::default()
    }

    fn field(mut self, value: &[u8]) -> Self {
        let align = value.len();
        self.bytes
            .resize(self.bytes.len().next_multiple_of(align), 0);
        self.bytes.extend_from_slice(value);
        self.align = self.align.max(align);
        self
    }

    /// Appends an `i64`.
    pub fn i64(self, v: i64) -> Self {
        self.field(&v.to_le_bytes())
    }
    /// Appends an `i32`.
    pub fn i32(self, v: i32) -> Self {
        self.field(&v.to_le_bytes())
    }
    /// Appends a `float`.
    pub fn f32(self, v: f32) -> Self {
        self.field(&v.to_le_bytes())
    }

    /// The finished argument.
    pub fn build(mut self) -> Arg {
        let align = self.align.max(1);
        self.bytes
            .resize(self.bytes.len().next_multiple_of(align), 0);
        Arg::Value(self.bytes)
    }
}

/// A strided view for the kernels (`View` of `prelude.cuh`): shape and element strides.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceView {
    /// Number of axes used (≤ [`MAX_RANK`]).
    pub rank: usize,
    /// Extent per axis.
    pub shape: [i64; MAX_RANK],
    /// Element stride per axis.
    pub stride: [i64; MAX_RANK],
}

impl DeviceView {
    /// A view of `shape` with element `strides`; `None` above [`MAX_RANK`] axes or when
    /// the lengths differ.
    pub fn new(shape: &[usize], strides: &[usize]) -> Option<Self> {
        if shape.len() > MAX_RANK || strides.len() != shape.len() {
            return None;
        }
        let mut v = DeviceView {
            rank: shape.len(),
            ..Default::default()
        };
        for (i, (&s, &t)) in shape.iter().zip(strides).enumerate() {
            v.shape[i] = s as i64;
            v.stride[i] = t as i64;
        }
        Some(v)
    }

    /// The argument (`View` by value).
    pub fn arg(&self) -> Arg {
        let mut s = CStruct::new().i32(self.rank as i32);
        for &d in &self.shape {
            s = s.i64(d);
        }
        for &d in &self.stride {
            s = s.i64(d);
        }
        s.build()
    }
}

/// One kernel launch.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// The kernel's name in the catalog.
    pub kernel: &'static str,
    /// Blocks per axis.
    pub grid: [u32; 3],
    /// Threads per block per axis.
    pub block: [u32; 3],
    /// Dynamic shared memory, bytes.
    pub shared: u32,
    /// The arguments in parameter order.
    pub args: Vec<Arg>,
}

impl Launch {
    /// A grid-stride launch of [`BLOCK`] threads per block over `n` elements.
    pub fn elements(kernel: &'static str, n: usize, args: Vec<Arg>) -> Self {
        let blocks = n.div_ceil(BLOCK as usize).clamp(1, 1 << 20) as u32;
        Self {
            kernel,
            grid: [blocks, 1, 1],
            block: [BLOCK, 1, 1],
            shared: 0,
            args,
        }
    }

    /// One block of [`BLOCK`] threads per row (rows beyond 2²⁰ loop in the kernel).
    pub fn rows(kernel: &'static str, rows: usize, args: Vec<Arg>) -> Self {
        Self {
            kernel,
            grid: [rows.clamp(1, 1 << 20) as u32, 1, 1],
            block: [BLOCK, 1, 1],
            shared: 0,
            args,
        }
    }
}

/// The call named by the error of a GEMM cuBLASLt has no algorithm for
/// (`CudaError::Driver { call: NO_ALGORITHM, .. }`).
pub const NO_ALGORITHM: &str = "cublasLtMatmulAlgoGetHeuristic";

/// Input dtype of a GEMM (the output is f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemmInput {
    /// bf16 X and W, f32 accumulation.
    Bf16,
    /// f32 X and W, f32 accumulation (`CUBLAS_COMPUTE_32F`).
    F32,
    /// `float8_e4m3fn` X and an 8-bit float W of the given format, f32 accumulation of
    /// the codes themselves (no scales: the caller's epilogue applies them), on GPUs with
    /// fp8 tensor cores (sm_89+, [`Launcher::fp8_gemm`]). The weight must be `[n, k]`.
    Fp8(Fp8Format),
    /// int8 X and W, exact i32 sums (`CUBLAS_COMPUTE_32I`) written as i32 into Y's f32
    /// slots for the caller's epilogue to scale. The weight must be `[n, k]`.
    I8,
}

/// The format of an 8-bit float GEMM operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Format {
    /// `float8_e4m3fn` (`CUDA_R_8F_E4M3`).
    E4M3,
    /// `float8_e5m2` (`CUDA_R_8F_E5M2`).
    E5M2,
}

/// What is fused after the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Epilogue {
    /// `Y = X·Wᵀ`.
    None,
    /// `Y = X·Wᵀ + bias` (f32 bias of `n`).
    Bias,
    /// `Y = gelu_tanh(X·Wᵀ + bias)`.
    BiasGelu,
}

/// One GEMM's shape: the cache key of its plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemmShape {
    /// Rows of X and Y.
    pub m: u64,
    /// Output features: rows of W, columns of Y.
    pub n: u64,
    /// Inner dim: columns of X and W.
    pub k: u64,
    /// Input dtype.
    pub input: GemmInput,
    /// Fused epilogue.
    pub epilogue: Epilogue,
    /// W is `[n, k]` (a linear layer's weight) when true, `[k, n]` when false.
    pub weight_transposed: bool,
}

impl GemmShape {
    /// Bytes of one input element.
    pub fn input_size(&self) -> u64 {
        match self.input {
            GemmInput::Bf16 => 2,
            GemmInput::F32 => 4,
            GemmInput::Fp8(_) | GemmInput::I8 => 1,
        }
    }
}

/// Device addresses of one GEMM's operands (all dense row-major).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmOperands {
    /// X, `[m, k]` of the shape's input dtype.
    pub x: u64,
    /// W, `[n, k]` (or `[k, n]`) of the shape's input dtype.
    pub w: u64,
    /// f32 bias of `n`, for the epilogues that add one.
    pub bias: Option<u64>,
    /// Y, `[m, n]` f32.
    pub y: u64,
}

/// Carries out launches, GEMMs and copies on one device, in submission order.
pub trait Launcher: Send + Sync + fmt::Debug {
    /// What this launcher is (`cuda:0 (NVIDIA H200)`, `checked (no GPU)`).
    fn describe(&self) -> String;
    /// Submits one kernel launch.
    fn launch(&self, launch: &Launch) -> Result<()>;
    /// Submits `y = x · wᵀ (+ bias) (→ GELU)`.
    fn gemm(&self, shape: &GemmShape, operands: &GemmOperands) -> Result<()>;
    /// Whether [`GemmInput::Fp8`] GEMMs run here (fp8 tensor cores: sm_89 and later).
    fn fp8_gemm(&self) -> bool {
        false
    }
    /// Copies host bytes to `dst` (the copy is complete when this returns).
    fn upload(&self, dst: u64, src: &[u8]) -> Result<()>;
    /// Copies device bytes at `src` into `dst`, after all work submitted so far.
    fn download(&self, src: u64, dst: &mut [u8]) -> Result<()>;
    /// Sets `bytes` bytes at `dst` to zero.
    fn zero(&self, dst: u64, bytes: u64) -> Result<()>;
    /// A block of `bytes` at `addr` was handed to a tensor (its contents are undefined).
    fn allocated(&self, _addr: u64, _bytes: u64) {}
    /// The tensor storage at `addr` was dropped.
    fn released(&self, _addr: u64) {}
    /// Waits for every submitted piece of work.
    fn synchronize(&self) -> Result<()>;
    /// The raw `CUstream` this launcher enqueues on, where it has one (collectives on
    /// NCCL are ordered on it).
    fn cuda_stream(&self) -> Option<u64> {
        None
    }
    /// What a checking launcher saw (`None` for one that runs the work).
    fn check_report(&self) -> Option<CheckReport> {
        None
    }
}

/// What a checked launcher saw (see [`super::check::CheckedLauncher`]).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct CheckReport {
    /// Launches per kernel.
    pub launches: std::collections::BTreeMap<String, u64>,
    /// cuBLASLt GEMMs.
    pub gemms: u64,
    /// Floating-point operations of those GEMMs (2·m·n·k each).
    pub gemm_flops: f64,
    /// Bytes uploaded.
    pub uploaded_bytes: u64,
    /// Bytes downloaded.
    pub downloaded_bytes: u64,
}
