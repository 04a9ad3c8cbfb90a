//! GEMM through cuBLASLt (feature `cuda`): `Y[m, n] = X[m, k] · Wᵀ (+ bias) (→ GELU)` with
//! row-major operands, bf16 inputs with f32 compute and f32 output, f32 throughout with
//! `CUBLAS_COMPUTE_32F` (no TF32, so the f32 path rounds like the CPU's f32 GEMM), or
//! 8-bit codes summed with unit scales, the caller scaling the sums after: float
//! (`float8_e4m3fn` X, e4m3 or e5m2 W, sm_89+) into f32, or int8 into exact i32.
//!
//! Row-major `Y = X·Wᵀ` is column-major `Yᵀ = W·Xᵀ`: cuBLASLt's A is W (`k × n`,
//! transposed), B is X (`k × m`), D is Y (`n × m`), so the bias epilogue adds one value per
//! output feature. The descriptors, layouts and the heuristic's algorithm are built once
//! per [`GemmShape`] and cached. The workspace is a device block the caller allocates
//! from headroom's `CachingAllocator` on the `cuda` platform and hands in.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::CudaStream;

use super::error::{CudaError, Result};

pub use super::launch::{Epilogue, Fp8Format, GemmInput, GemmShape, NO_ALGORITHM};

/// A device block for cuBLASLt's scratch (from the `CachingAllocator`).
#[derive(Debug, Clone, Copy)]
pub struct Workspace {
    /// Device address.
    pub ptr: u64,
    /// Size in bytes.
    pub bytes: usize,
}

pub use super::launch::GemmOperands;

/// The cached descriptors of one shape.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each handle was created once by `Plan::new` and is destroyed once here.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.d);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

fn blas(call: &'static str) -> impl Fn(lt::CublasError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        reason: format!("{e:?}"),
    }
}

/// A shape's plan, or the reason cuBLASLt has none (remembered, so the heuristic is not
/// asked again for a shape it refused).
type Cached = std::result::Result<Plan, String>;

/// cuBLASLt with a per-shape plan cache.
pub struct CublasLt {
    handle: sys::cublasLtHandle_t,
    plans: Mutex<HashMap<(GemmShape, usize), Cached>>,
}

impl std::fmt::Debug for CublasLt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plans = self.cached_plans();
        f.debug_struct("CublasLt").field("plans", &plans).finish()
    }
}

// SAFETY: the handle is used under the plan mutex or by one thread at a time per call;
// cuBLASLt handles may be shared across threads (cuBLASLt docs: thread safe).
unsafe impl Send for CublasLt {}
// SAFETY: as above.
unsafe impl Sync for CublasLt {}

impl CublasLt {
    /// Loads cuBLASLt (`libcublasLt.so.13`) and creates a handle; [`CudaError::NoDevice`]
    /// when the library is not there.
    pub fn new() -> Result<Self> {
        // SAFETY: only tries to open the library; cudarc would panic on first use otherwise.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::NoDevice(
                "cuBLASLt (libcublasLt.so.13) could not be loaded; add the folder of \
                 nvidia-cublas's lib to LD_LIBRARY_PATH"
                    .into(),
            ));
        }
        let handle = lt::create_handle().map_err(blas("cublasLtCreate"))?;
        Ok(Self {
            handle,
            plans: Mutex::new(HashMap::new()),
        })
    }

    /// Number of cached plans (one per shape and workspace size).
    pub fn cached_plans(&self) -> usize {
        self.plans
            .lock()
            .map(|p| p.values().filter(|c| c.is_ok()).count())
            .unwrap_or(0)
    }

    fn plan(&self, shape: &GemmShape, workspace: usize) -> Result<Plan> {
        use sys::cublasComputeType_t as C;
        use sys::cudaDataType as T;
        let fp8 = |f| match f {
            Fp8Format::E4M3 => T::CUDA_R_8F_E4M3,
            Fp8Format::E5M2 => T::CUDA_R_8F_E5M2,
        };
        let eight_bit = matches!(shape.input, GemmInput::Fp8(_) | GemmInput::I8);
        // cuBLASLt's 8-bit GEMMs take only A transposed ("TN"); their scales stay at 1 and
        // the bias and GELU run in the caller's scale epilogue.
        if eight_bit && (!shape.weight_transposed || shape.epilogue != Epilogue::None) {
            return Err(CudaError::Unsupported {
                op: "gemm",
                reason: "an 8-bit GEMM takes an [n, k] weight and no epilogue".into(),
            });
        }
        // (W's type, X's type, compute, scale and D's type): cuBLASLt's A, B, …
        let (w_type, x_type, compute, out_type) = match shape.input {
            GemmInput::Bf16 => (
                T::CUDA_R_16BF,
                T::CUDA_R_16BF,
                C::CUBLAS_COMPUTE_32F,
                T::CUDA_R_32F,
            ),
            GemmInput::F32 => (
                T::CUDA_R_32F,
                T::CUDA_R_32F,
                C::CUBLAS_COMPUTE_32F,
                T::CUDA_R_32F,
            ),
            GemmInput::Fp8(w) => (
                fp8(w),
                T::CUDA_R_8F_E4M3,
                C::CUBLAS_COMPUTE_32F,
                T::CUDA_R_32F,
            ),
            GemmInput::I8 => (
                T::CUDA_R_8I,
                T::CUDA_R_8I,
                C::CUBLAS_COMPUTE_32I,
                T::CUDA_R_32I,
            ),
        };
        let f32t = sys::cudaDataType::CUDA_R_32F;
        let desc =
            lt::create_matmul_desc(compute, out_type).map_err(blas("cublasLtMatmulDescCreate"))?;
        let set_desc = |attr, value: *const c_void, size: usize| {
            // SAFETY: `value` points to `size` bytes of the attribute's documented type.
            unsafe { lt::set_matmul_desc_attribute(desc, attr, value, size) }
                .map_err(blas("cublasLtMatmulDescSetAttribute"))
        };
        // cublasOperation_t as i32: 1 = CUBLAS_OP_T, 0 = CUBLAS_OP_N.
        let op_a: i32 = i32::from(shape.weight_transposed);
        set_desc(
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            (&op_a as *const i32).cast(),
            std::mem::size_of::<i32>(),
        )?;
        let epilogue = match shape.epilogue {
            Epilogue::None => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
            Epilogue::Bias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            Epilogue::BiasGelu => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
        };
        set_desc(
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
            (&epilogue as *const sys::cublasLtEpilogue_t).cast(),
            std::mem::size_of::<sys::cublasLtEpilogue_t>(),
        )?;
        if shape.epilogue != Epilogue::None {
            set_desc(
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                (&f32t as *const sys::cudaDataType).cast(),
                std::mem::size_of::<sys::cudaDataType>(),
            )?;
        }
        let (m, n, k) = (shape.m, shape.n, shape.k);
        let layout = |t, rows: u64, cols: u64, ld: u64| {
            lt::create_matrix_layout(t, rows, cols, ld as i64)
                .map_err(blas("cublasLtMatrixLayoutCreate"))
        };
        let a = if shape.weight_transposed {
            layout(w_type, k, n, k)?
        } else {
            layout(w_type, n, k, n)?
        };
        let b = layout(x_type, k, m, k)?;
        let d = layout(out_type, n, m, n)?;
        let pref = lt::create_matmul_pref().map_err(blas("cublasLtMatmulPreferenceCreate"))?;
        let ws = workspace as u64;
        // SAFETY: the attribute is a u64 byte count.
        let set = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        // SAFETY: every handle was just created for this shape.
        let heuristic = set.and_then(|()| unsafe {
            lt::get_matmul_algo_heuristic(self.handle, desc, a, b, d, d, pref)
        });
        // SAFETY: created above, destroyed once.
        unsafe {
            let _ = lt::destroy_matmul_pref(pref);
        }
        let plan = Plan {
            desc,
            a,
            b,
            d,
            algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
        };
        let heuristic = heuristic.map_err(blas(NO_ALGORITHM))?;
        Ok(Plan {
            algo: heuristic.algo,
            ..plan
        })
    }

    /// `y = x · wᵀ (+ bias) (→ GELU)` on `stream`; `ops` are device addresses of buffers
    /// of the sizes `shape` implies (`bias` of `n` f32 when the epilogue has one).
    ///
    /// # Safety
    /// The pointers must be valid device memory of the right sizes for the duration of
    /// the stream's work, and must not be freed before that work completes.
    pub unsafe fn matmul(
        &self,
        stream: &CudaStream,
        shape: &GemmShape,
        ops: GemmOperands,
        workspace: Workspace,
    ) -> Result<()> {
        let GemmOperands { x, w, bias, y } = ops;
        let mut plans = self.plans.lock().map_err(|_| CudaError::Driver {
            call: "cublasLtMatmul",
            reason: "plan cache poisoned".into(),
        })?;
        let key = (*shape, workspace.bytes);
        let cached = match plans.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(v) => match self.plan(shape, workspace.bytes) {
                Ok(plan) => v.insert(Ok(plan)),
                Err(CudaError::Driver { call, reason }) if call == NO_ALGORITHM => {
                    v.insert(Err(reason))
                }
                Err(e) => return Err(e),
            },
        };
        let plan = match cached {
            Ok(plan) => plan,
            Err(reason) => {
                return Err(CudaError::Driver {
                    call: NO_ALGORITHM,
                    reason: reason.clone(),
                })
            }
        };
        if let Some(bias) = bias {
            let ptr = bias as *const c_void;
            // SAFETY: the attribute is a device pointer; the descriptor is this plan's.
            unsafe {
                lt::set_matmul_desc_attribute(
                    plan.desc,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    (&ptr as *const *const c_void).cast(),
                    std::mem::size_of::<*const c_void>(),
                )
            }
            .map_err(blas("cublasLtMatmulDescSetAttribute"))?;
        }
        // The scale type is the compute's: i32 for the int8 GEMM, f32 otherwise.
        // (Their bits as u32: one aligned 4-byte value either way.)
        let (alpha, beta): (u32, u32) = if shape.input == GemmInput::I8 {
            (1, 0)
        } else {
            (1f32.to_bits(), 0f32.to_bits())
        };
        // SAFETY: the caller guarantees the buffers; descriptors and algo are this plan's;
        // the stream handle is live for the call.
        unsafe {
            lt::matmul(
                self.handle,
                plan.desc,
                (&alpha as *const u32).cast(),
                (&beta as *const u32).cast(),
                w as *const c_void,
                plan.a,
                x as *const c_void,
                plan.b,
                y as *const c_void,
                plan.d,
                y as *mut c_void,
                plan.d,
                &plan.algo,
                workspace.ptr as *mut c_void,
                workspace.bytes,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(blas("cublasLtMatmul"))
    }
}

impl Drop for CublasLt {
    fn drop(&mut self) {
        if let Ok(mut plans) = self.plans.lock() {
            plans.clear();
        }
        // SAFETY: created in `new`, destroyed once, after every plan.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}
