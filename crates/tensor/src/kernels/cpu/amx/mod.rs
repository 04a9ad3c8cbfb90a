//! GEMM on Intel AMX tiles: `C (+)= A · B` with bf16 products accumulated in f32.
//!
//! Eight tile registers of 16 rows × 64 bytes hold a 32 × 32 block of C (four f32 tiles),
//! two 16 × 32 bf16 tiles of A and two VNNI-paired 32 × 16 tiles of B; one k-step of 32 is
//! four `tdpbf16ps` (16 × 16 × 32 multiply-adds each). Operands are packed by
//! [`super::pack`] (zero-padded, so K, M and N tails need no special case): B once per call
//! in column blocks for all threads, A per thread in blocks of [`MC`] rows × up to 2,048
//! values of K (1 MiB packed). Loops, outside in: a thread's rows in blocks of `MC` → K
//! in A-block ranges → B panels → K in blocks of [`KC`] k-steps → A panels, so a B panel
//! stays in L2 while the A panels pass it and the `MC × 32` block of C being summed stays
//! in L1/L2. C stays in tiles across one K block and in `dst` between blocks. Every
//! packed buffer starts on a 64-byte boundary: an unaligned tile load measured 6× slower.
//! Threads own disjoint row ranges, or disjoint ranges of B panels where that balances
//! better (`split_columns`), and every element sums its products in one fixed order (K
//! ascending, whatever the blocking), so the bytes do not depend on the thread that
//! computes them.
//!
//! The same loops, packing and epilogues run on CPUs without AMX that have AVX512_BF16:
//! [`Kernel::Vdp`] computes each 32 × 32 block with `vdpbf16ps` ([`super::vdp`]) instead
//! of the tiles, with K blocks of [`super::vdp::KC`] k-steps. [`Kernel::current`] picks
//! by the selected CPU path.
//!
//! The tiles need the kernel's permission (`arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`, asked once per process by [`enable`]) and a tile configuration
//! per thread, loaded at the start of each task and released at its end.
//!
//! This module holds the entries, their types and the scratch sizes; `blocked` runs the
//! loop nest above, and `tiles` holds the tile state and the `tdpbf16ps` micro-kernel.

mod blocked;
mod tiles;

pub use tiles::enable;
pub(crate) use tiles::Tiles;

use self::blocked::{gemm_from, multiply, BSource, Out, Shape, Span};
use super::pack::{pack_b, packed_len, Operand, Part, PANEL};

/// Most rows of A packed at once per thread.
pub const MC: usize = 256;
/// Bytes of one thread's packed A block, kept in L2 while every B panel passes it.
const A_BLOCK_BYTES: usize = 1 << 20;

/// Packed k-steps of one A block row range: [`MC`] rows × this many fill
/// [`A_BLOCK_BYTES`] (64 for bf16: K up to 2,048 in one block).
const A_BLOCK_STEPS: usize = A_BLOCK_BYTES / (2 * MC * super::pack::TILE_K);

/// K values packed at once per A block for this K and part count: all of K when it fits
/// [`A_BLOCK_STEPS`], else whole k-steps of it. A large K is cut into such blocks (C
/// carried in the output between them) rather than shrinking the rows per block, so
/// every B panel still meets [`MC`] rows of A while it is in cache.
fn kb_for(k: usize, parts: usize) -> usize {
    let steps = (A_BLOCK_STEPS / parts).max(1);
    k.min(steps * super::pack::TILE_K)
}
/// Packed k-steps per K block (of 32 values each): C stays in tiles over up to 2,048
/// values of K (measured on SPR: 48 k-steps per block ran 1.15–1.2× faster than 8 or 16).
pub const KC: usize = 64;
/// Bytes of packed B held at once: B is packed and consumed in column blocks of at most
/// this size, so the scratch never grows with N (32 MiB holds a 1.3B FFN weight in
/// bf16, so A is packed once per GEMM; 8 MiB repacked A four times, ~7% slower).
pub const B_BLOCK_BYTES: usize = 32 << 20;

/// B panels packed at once for this K and part count.
fn panels_per_block(n: usize, k: usize, parts: usize) -> usize {
    let panel_bytes = 2 * packed_len(PANEL, k, parts);
    (B_BLOCK_BYTES / panel_bytes).clamp(1, n.div_ceil(PANEL).max(1))
}

/// What computes each 32 × 32 block of C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// AMX tiles (`tdpbf16ps`).
    Tiles,
    /// AVX512-BF16 (`vdpbf16ps` on ZMM registers).
    Vdp,
}

impl Kernel {
    /// The kernel of `path`, or `None` where the path has no packed bf16 GEMM.
    pub fn of(path: super::CpuPath) -> Option<Kernel> {
        match path {
            super::CpuPath::Amx => Some(Kernel::Tiles),
            super::CpuPath::Avx512Bf16 => Some(Kernel::Vdp),
            _ => None,
        }
    }

    /// The kernel of the selected path. Panics where it has none (callers check
    /// [`super::CpuPath::packs_bf16`] first: an internal bug, never input).
    pub fn current() -> Kernel {
        let path = super::selected();
        Kernel::of(path).unwrap_or_else(|| panic!("the {path} path has no packed bf16 GEMM"))
    }

    /// Packed k-steps per K block.
    fn kc(self) -> usize {
        match self {
            Kernel::Tiles => KC,
            Kernel::Vdp => super::vdp::KC,
        }
    }

    /// The tile configuration for this thread when the kernel uses tiles.
    ///
    /// # Safety
    /// For [`Kernel::Tiles`], AMX must be enabled for the process ([`enable`]).
    unsafe fn configure(self) -> Option<Tiles> {
        match self {
            // SAFETY: the caller's contract.
            Kernel::Tiles => Some(unsafe { Tiles::configure() }),
            Kernel::Vdp => None,
        }
    }
}

/// How f32 operands become bf16 for the tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// Each operand rounded to bf16 once: one product per k.
    Bf16,
    /// Each f32 operand split into a bf16 high and low part; `hi·hi + hi·lo + lo·hi`
    /// keeps about 16 mantissa bits at three times the work.
    Bf16x3,
}

impl Precision {
    /// The parts A and B are packed with, in matching order.
    pub fn parts(self) -> (&'static [Part], &'static [Part]) {
        match self {
            Precision::Bf16 => (&[Part::Hi], &[Part::Hi]),
            Precision::Bf16x3 => (
                &[Part::Hi, Part::Hi, Part::Lo],
                &[Part::Hi, Part::Lo, Part::Hi],
            ),
        }
    }
}

/// `u16` values of one thread's packed A block for this K and A part count.
fn a_block_len(k: usize, parts: usize) -> usize {
    packed_len(MC, kb_for(k, parts), parts)
}

/// `u16` scratch [`gemm()`] needs: packed B, then one packed A block per thread.
pub fn scratch_len(n: usize, k: usize, precision: Precision, threads: usize) -> usize {
    let pb = precision.parts().1.len();
    panels_per_block(n, k, pb) * packed_len(PANEL, k, pb)
        + prepacked_b_scratch_len(k, precision, threads)
}

/// The output of a GEMM: row-major f32 with `ldc` elements between rows.
#[derive(Debug)]
pub struct Dst<'a> {
    /// The elements.
    pub data: &'a mut [f32],
    /// Index of element (0, 0).
    pub offset: usize,
    /// Elements between rows.
    pub ldc: usize,
}

/// The checks both GEMM entries make, and the cases with nothing to multiply: empty
/// output (nothing to do) or `k = 0` (C becomes 0 unless accumulating). True when done.
fn entry_is_trivial(
    kernel: Kernel,
    m: usize,
    n: usize,
    k: usize,
    dst: Option<&mut Dst<'_>>,
    accumulate: bool,
    alpha: f32,
) -> bool {
    match kernel {
        Kernel::Tiles => assert!(enable(), "AMX tiles are not available"),
        Kernel::Vdp => assert!(
            super::CpuPath::Avx512Bf16.supported(),
            "AVX512_BF16 is not available"
        ),
    }
    assert!(alpha == 1.0 || !accumulate, "alpha needs a fresh output");
    if m == 0 || n == 0 {
        return true;
    }
    let Some(dst) = dst else {
        // Blocks to a sink: no matrix to bound or clear, and K is never 0 there.
        return false;
    };
    assert!(
        dst.offset + (m - 1) * dst.ldc + n <= dst.data.len(),
        "gemm destination out of bounds"
    );
    if k == 0 && !accumulate {
        for r in 0..m {
            let at = dst.offset + r * dst.ldc;
            dst.data[at..at + n].fill(0.0);
        }
    }
    k == 0
}

/// `dst = (accumulate ? dst : 0) + alpha · A[m×k] · B[k×n]` on `kernel` with `threads`
/// threads of the kernel pool (1: the calling thread only).
///
/// `alpha` other than 1 needs `accumulate == false`. Panics when the kernel cannot run
/// here, a matrix does not fit its buffer or the scratch is short (internal bugs, never
/// input).
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    kernel: Kernel,
    m: usize,
    n: usize,
    k: usize,
    a: &Operand<'_>,
    b: &Operand<'_>,
    dst: Dst<'_>,
    accumulate: bool,
    alpha: f32,
    precision: Precision,
    threads: usize,
    scratch: &mut [u16],
) {
    gemm_from(
        kernel,
        m,
        n,
        k,
        a,
        BSource::Pack(b),
        Out::Dst(dst, None),
        accumulate,
        alpha,
        precision,
        threads,
        scratch,
    );
}

/// `u16` scratch [`gemm_prepacked_b`] needs: one packed A block per thread.
pub fn prepacked_b_scratch_len(k: usize, precision: Precision, threads: usize) -> usize {
    threads.max(1) * a_block_len(k, precision.parts().0.len())
}

/// [`gemm()`] with B packed beforehand: `b_packed` holds every panel of B ([`pack_b`] of
/// panels `0..`, [`packed_b_len`] values), so a weight is packed once, not per call. The
/// same loops as [`gemm()`], so the same bits; the scratch is
/// [`prepacked_b_scratch_len`]. `epilogue` runs on every finished block.
#[allow(clippy::too_many_arguments)]
pub fn gemm_prepacked_b(
    m: usize,
    n: usize,
    k: usize,
    a: &Operand<'_>,
    b_packed: &[u16],
    dst: Dst<'_>,
    accumulate: bool,
    alpha: f32,
    precision: Precision,
    threads: usize,
    scratch: &mut [u16],
    epilogue: Option<&Epilogue<'_>>,
) {
    let shape = (m, n, k, accumulate, alpha, precision, threads);
    prepacked(shape, a, b_packed, Out::Dst(dst, epilogue), scratch);
}

/// [`gemm_from`] on the current kernel with every panel of B packed beforehand;
/// `shape` is `(m, n, k, accumulate, alpha, precision, threads)`.
fn prepacked(
    shape: (usize, usize, usize, bool, f32, Precision, usize),
    a: &Operand<'_>,
    b_packed: &[u16],
    out: Out<'_, '_>,
    scratch: &mut [u16],
) {
    let (m, n, k, accumulate, alpha, precision, threads) = shape;
    assert!(
        b_packed.len() >= packed_b_len(n, k, precision),
        "packed B too short"
    );
    gemm_from(
        Kernel::current(),
        m,
        n,
        k,
        a,
        BSource::Packed(b_packed),
        out,
        accumulate,
        alpha,
        precision,
        threads,
        scratch,
    );
}

/// Whether [`gemm_prepacked_blocks`] can take a K of `k`: the whole of it one A block and
/// one K block of the current kernel, so each block of C is finished in one pass.
pub fn blocks_fit(k: usize, precision: Precision) -> bool {
    let pa = precision.parts().0.len();
    k > 0 && kb_for(k, pa) >= k
}

/// [`gemm_prepacked_b`] with no output matrix: every finished block of `A · B` goes to
/// `sink` from a per-thread buffer, which writes it where (and in what type) it wants, so
/// a product that is rounded or reduced afterwards never stores its f32 values. The
/// blocks hold the bits [`gemm_prepacked_b`] would store. K must pass [`blocks_fit`]
/// (panics otherwise: an internal bug, never input).
#[allow(clippy::too_many_arguments)]
pub fn gemm_prepacked_blocks(
    m: usize,
    n: usize,
    k: usize,
    a: &Operand<'_>,
    b_packed: &[u16],
    precision: Precision,
    threads: usize,
    scratch: &mut [u16],
    sink: &Epilogue<'_>,
) {
    assert!(blocks_fit(k, precision), "K of {k} does not fit one block");
    let shape = (m, n, k, false, 1.0, precision, threads);
    prepacked(shape, a, b_packed, Out::Blocks(sink), scratch);
}

/// Packs B panels `panels` into `out` ([`pack_b`]), on `threads` threads of the pool.
pub fn pack_b_panels(
    b: &Operand<'_>,
    k: usize,
    n: usize,
    panels: std::ops::Range<usize>,
    parts: &[Part],
    out: &mut [u16],
    threads: usize,
) {
    if threads <= 1 {
        pack_b(b, k, n, panels, parts, out);
        return;
    }
    use rayon::prelude::*;
    let panel_len = packed_len(PANEL, k, parts.len());
    out[..panels.len() * panel_len]
        .par_chunks_mut(panel_len)
        .enumerate()
        .for_each(|(i, chunk)| {
            let jb = panels.start + i;
            pack_b(b, k, n, jb..jb + 1, parts, chunk);
        });
}

/// `u16` length of A's rows packed whole for [`gemm_packed`].
pub fn packed_a_len(m: usize, k: usize, precision: Precision) -> usize {
    packed_len(m, k, precision.parts().0.len())
}

/// `u16` length of B's columns packed whole for [`gemm_packed`].
pub fn packed_b_len(n: usize, k: usize, precision: Precision) -> usize {
    packed_len(n, k, precision.parts().1.len())
}

/// [`gemm()`] on the calling thread from operands packed beforehand: `a_packed` is every
/// row of A ([`pack_a`](super::pack::pack_a) from row 0 with `precision`'s A parts),
/// `b_packed` every panel of B ([`pack_b`] of panels `0..`, or
/// [`super::pack::pack_b_kstep`] step by step).
/// The same loops as [`gemm()`], so the same bits.
#[allow(clippy::too_many_arguments)]
pub fn gemm_packed(
    m: usize,
    n: usize,
    k: usize,
    a_packed: &[u16],
    b_packed: &[u16],
    mut dst: Dst<'_>,
    accumulate: bool,
    alpha: f32,
    precision: Precision,
) {
    let kernel = Kernel::current();
    if entry_is_trivial(kernel, m, n, k, Some(&mut dst), accumulate, alpha) {
        return;
    }
    assert!(
        a_packed.len() >= packed_a_len(m, k, precision),
        "packed A too short"
    );
    assert!(
        b_packed.len() >= packed_b_len(n, k, precision),
        "packed B too short"
    );
    let (pa, pb) = precision.parts();
    let shape = Shape {
        kernel,
        m,
        n,
        panel_len: packed_len(PANEL, k, pb.len()),
        ldc: dst.ldc,
        alpha,
        epilogue: None,
        sink: None,
    };
    let span = Span {
        b_step0: 0,
        steps: k.div_ceil(super::pack::TILE_K) * pa.len(),
        load: accumulate,
        last: true,
    };
    let out_len = dst.data.len() - dst.offset;
    let out = dst.data[dst.offset..].as_mut_ptr();
    // SAFETY: the kernel's instructions were checked above; a tile configuration is
    // this thread's own.
    let _tiles = unsafe { kernel.configure() };
    // SAFETY: tiles configured (for the tile kernel); the packed buffers hold every row and panel (asserted);
    // the output holds the m × n block (asserted) and is borrowed mutably here.
    unsafe {
        multiply(
            &shape,
            &span,
            a_packed,
            0,
            m,
            b_packed,
            0..n.div_ceil(PANEL),
            out,
            out_len,
            None,
        )
    };
}

/// A finished block of C (at most 32 × 32), still in L1: rows `row..row + h`, columns
/// `col..col + w`, row `r` at `data[r * ldc..r * ldc + w]`.
#[derive(Debug)]
pub struct Block<'a> {
    /// From the block's first element to its last.
    pub data: &'a mut [f32],
    /// Elements between the starts of two rows.
    pub ldc: usize,
    /// First row of C.
    pub row: usize,
    /// First column of C.
    pub col: usize,
    /// Rows.
    pub h: usize,
    /// Columns.
    pub w: usize,
}

/// What runs on each finished block of C right after it is done. Fusing a bias and an
/// activation here saves the passes over the whole output that would apply them
/// afterwards; one call per block (not per row) keeps the call and set-up cost off the
/// values.
pub type Epilogue<'a> = dyn Fn(Block<'_>) + Sync + 'a;
