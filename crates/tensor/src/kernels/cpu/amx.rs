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
//! better ([`split_columns`]), and every element sums its products in one fixed order (K
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

use std::sync::OnceLock;

use super::pack::{pack_a, pack_b, packed_len, Operand, Part, KSTEP_LEN, PANEL};

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

/// Asks the kernel for AMX tile state once; true when it granted it.
pub fn enable() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            if !super::features().amx_bf16 {
                return false;
            }
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM only changes this process's
            // permission to use the tile data state; it reads and writes no memory of ours.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                )
            };
            rc == 0
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        {
            false
        }
    })
}

/// `u16` values of one thread's packed A block for this K and A part count.
fn a_block_len(k: usize, parts: usize) -> usize {
    packed_len(MC, kb_for(k, parts), parts)
}

/// `u16` scratch [`gemm`] needs: packed B, then one packed A block per thread.
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

struct SendPtr(*mut f32);
// SAFETY: threads write disjoint row ranges of the output (see `gemm`).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

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

/// [`gemm`] with B packed beforehand: `b_packed` holds every panel of B ([`pack_b`] of
/// panels `0..`, [`packed_b_len`] values), so a weight is packed once, not per call. The
/// same loops as [`gemm`], so the same bits; the scratch is
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

/// Where [`gemm_from`] puts C.
enum Out<'a, 'e> {
    /// Stored in a matrix, each finished block then passed to the epilogue there.
    Dst(Dst<'a>, Option<&'e Epilogue<'e>>),
    /// Summed in a per-thread panel buffer and passed to the sink; never stored.
    Blocks(&'e Epilogue<'e>),
}

/// Where [`gemm_from`] finds B.
enum BSource<'a> {
    /// An operand packed here, in column blocks of at most [`B_BLOCK_BYTES`].
    Pack(&'a Operand<'a>),
    /// Every panel packed beforehand.
    Packed(&'a [u16]),
}

#[allow(clippy::too_many_arguments)]
fn gemm_from(
    kernel: Kernel,
    m: usize,
    n: usize,
    k: usize,
    a: &Operand<'_>,
    b: BSource<'_>,
    out: Out<'_, '_>,
    accumulate: bool,
    alpha: f32,
    precision: Precision,
    threads: usize,
    scratch: &mut [u16],
) {
    let (mut dst, epilogue, sink) = match out {
        Out::Dst(dst, epilogue) => (Some(dst), epilogue, None),
        Out::Blocks(sink) => (None, None, Some(sink)),
    };
    if entry_is_trivial(kernel, m, n, k, dst.as_mut(), accumulate, alpha) {
        return;
    }
    let threads = threads.max(1);
    let (pa, pb) = precision.parts();
    let panel_len = packed_len(PANEL, k, pb.len());
    let nb = n.div_ceil(PANEL);
    // Panels packed at once and the scratch they take (none when B comes packed).
    let (per_block, b_len) = match b {
        BSource::Pack(_) => {
            let per_block = panels_per_block(n, k, pb.len());
            (per_block, per_block * panel_len)
        }
        BSource::Packed(_) => (nb, 0),
    };
    let kb = kb_for(k, pa.len());
    let a_len = a_block_len(k, pa.len());
    assert!(
        scratch.len() >= b_len + threads * a_len,
        "gemm scratch too short"
    );
    let (b_buf, rest) = scratch.split_at_mut(b_len);
    let m_panels = m.div_ceil(PANEL);
    let (out, out_len, ldc) = match dst {
        Some(d) => (
            SendPtr(d.data[d.offset..].as_mut_ptr()),
            d.data.len() - d.offset,
            d.ldc,
        ),
        None => (SendPtr(std::ptr::null_mut()), 0, 0),
    };
    let out = &out;
    let shape = Shape {
        kernel,
        m,
        n,
        panel_len,
        ldc,
        alpha,
        epilogue,
        sink,
    };
    let by_columns = split_columns(m_panels, nb, threads);
    // Thread `t`'s share of the work against the packed B panels `panels`: its rows
    // against all of them, or all rows against its share of them (`by_columns`).
    let job = |t: usize, a_buf: &mut [u16], packed_b: &[u16], panels: std::ops::Range<usize>| {
        let share = |n: usize| t * n / threads..(t + 1) * n / threads;
        let (rows, panels, packed_b) = if by_columns {
            let mine = share(panels.len());
            let packed_b = &packed_b[mine.start * panel_len..];
            (
                0..m,
                panels.start + mine.start..panels.start + mine.end,
                packed_b,
            )
        } else {
            let p = share(m_panels);
            (
                (p.start * PANEL).min(m)..(p.end * PANEL).min(m),
                panels,
                packed_b,
            )
        };
        if rows.is_empty() || panels.is_empty() {
            return;
        }
        // Blocks of equal size (whole panels, at most MC rows): 585 rows become three of
        // 224, 224 and 137 rather than 256, 256 and 73, so no block meets B for a few rows.
        let panels_here = rows.len().div_ceil(PANEL);
        let blocks = panels_here.div_ceil(MC / PANEL);
        let block_rows = panels_here.div_ceil(blocks) * PANEL;
        // SAFETY: the kernel's instructions were checked above; a tile configuration
        // is this thread's own.
        let _tiles = unsafe { kernel.configure() };
        // C of one B panel against the thread's A block when the blocks go to a sink.
        let mut panel = sink.map(|_| Box::new(CPanel([0.0; MC * PANEL])));
        for r0 in rows.clone().step_by(block_rows) {
            let mc = block_rows.min(rows.end - r0);
            for k0 in (0..k).step_by(kb) {
                let kn = kb.min(k - k0);
                pack_a(&a.cols_from(k0), r0, mc, kn, pa, a_buf);
                let span = Span {
                    b_step0: k0 / super::pack::TILE_K * pa.len(),
                    steps: kn.div_ceil(super::pack::TILE_K) * pa.len(),
                    load: accumulate || k0 > 0,
                    last: k0 + kn == k,
                };
                // SAFETY: tiles configured (for the tile kernel); `a_buf` holds rows r0.. over K values
                // k0..k0 + kn packed, `packed_b` the panels; this thread alone writes
                // the blocks of rows `rows` × panels `panels` of the output (bounds
                // asserted at entry).
                unsafe {
                    multiply(
                        &shape,
                        &span,
                        a_buf,
                        r0,
                        mc,
                        packed_b,
                        panels.clone(),
                        out.0,
                        out_len,
                        panel.as_mut().map(|p| &mut p.0[..]),
                    )
                };
            }
        }
    };
    let run = |a_bufs: &mut [u16], used: &[u16], panels: std::ops::Range<usize>| {
        if threads == 1 {
            job(0, &mut a_bufs[..a_len], used, panels);
        } else {
            use rayon::prelude::*;
            a_bufs[..threads * a_len]
                .par_chunks_mut(a_len)
                .enumerate()
                .for_each(|(t, a_buf)| job(t, a_buf, used, panels.clone()));
        }
    };
    match b {
        BSource::Packed(all) => run(rest, all, 0..nb),
        BSource::Pack(b) => {
            for j0 in (0..nb).step_by(per_block) {
                let panels = j0..(j0 + per_block).min(nb);
                let used = &mut b_buf[..panels.len() * panel_len];
                pack_b_panels(b, k, n, panels.clone(), pb, used, threads);
                run(rest, used, panels);
            }
        }
    }
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

/// What [`multiply`] needs to know of the whole GEMM.
struct Shape<'e> {
    kernel: Kernel,
    m: usize,
    n: usize,
    /// `u16` values of one packed B panel.
    panel_len: usize,
    ldc: usize,
    alpha: f32,
    /// Runs on every finished block.
    epilogue: Option<&'e Epilogue<'e>>,
    /// Takes every finished block instead of the output (see [`Out::Blocks`]).
    sink: Option<&'e Epilogue<'e>>,
}

/// A thread's C for one B panel against its A block ([`MC`] × 32 f32), tile-aligned.
#[repr(C, align(64))]
struct CPanel([f32; MC * PANEL]);

/// The K range one [`multiply`] call sums, in packed k-steps (k-steps × parts).
struct Span {
    /// The range's first packed k-step within a B panel.
    b_step0: usize,
    /// Packed k-steps in the range (all of them in the A block).
    steps: usize,
    /// C starts from the output (accumulating, or a later K range) rather than zeros.
    load: bool,
    /// The range ends K (the scale applies after it).
    last: bool,
}

/// C rows `r0..r0 + mc` × B panels `panels` from `a_packed` (rows `r0..` packed, panel
/// by panel) and `packed_b` (panel `panels.start` first). C stays in L1/L2 across the K
/// blocks; the B sub-panel of a K block ([`KC`] k-steps) is reused by every A panel.
///
/// # Safety
/// Tiles configured on this thread; the buffers hold those packed rows and panels; the
/// rows `r0..r0 + mc` of the `ldc`-strided output at `out` (`out_len` elements) lie
/// inside it and no other thread accesses them.
#[allow(clippy::too_many_arguments)]
unsafe fn multiply(
    g: &Shape<'_>,
    span: &Span,
    a_packed: &[u16],
    r0: usize,
    mc: usize,
    packed_b: &[u16],
    panels: std::ops::Range<usize>,
    out: *mut f32,
    out_len: usize,
    mut c_panel: Option<&mut [f32]>,
) {
    let count = panels.len();
    let kc = g.kernel.kc();
    debug_assert!(c_panel.as_ref().is_none_or(|p| p.len() >= mc * PANEL));
    for (i, jb) in panels.enumerate() {
        for s0 in (0..span.steps).step_by(kc) {
            let steps = kc.min(span.steps - s0);
            let load = span.load || s0 > 0;
            let last = span.last && s0 + steps == span.steps;
            let bp = &packed_b[i * g.panel_len + (span.b_step0 + s0) * KSTEP_LEN..];
            // The same k-steps of the next panel, pulled towards L1 a slice per A panel
            // while this one computes: the first A panel to meet a panel otherwise waits
            // on it from L3 (measured ~7 % of the kernel's time at 1.3B shapes).
            let next = (i + 1 < count)
                .then(|| &packed_b[(i + 1) * g.panel_len + (span.b_step0 + s0) * KSTEP_LEN..]);
            for ib in 0..mc.div_ceil(PANEL) {
                let slice = ib * steps * PREFETCH_PER_STEP;
                let pf = match next {
                    // Eight A panels cover the panel; any more prefetch their own.
                    Some(nb) if (ib + 1) * PREFETCH_PER_STEP <= KSTEP_LEN => nb[slice..].as_ptr(),
                    _ => bp.as_ptr(),
                };
                let ap = &a_packed[(ib * span.steps + s0) * KSTEP_LEN..];
                let (row, col) = (r0 + ib * PANEL, jb * PANEL);
                let (h, w) = (PANEL.min(g.m - row), PANEL.min(g.n - col));
                let scale = (last && g.alpha != 1.0).then_some(g.alpha);
                if let (Some(c_panel), Some(sink)) = (c_panel.as_deref_mut(), g.sink) {
                    // The whole 32 × 32 block in the panel buffer (A and B are zero past
                    // the matrix), handed to the sink once K is done.
                    let c = &mut c_panel[ib * PANEL * PANEL..(ib + 1) * PANEL * PANEL];
                    // SAFETY: `ap`/`bp` hold `steps` packed k-steps; `c` is 32 rows of
                    // 32 f32, 64-byte aligned (the buffer is, and blocks are 4 KiB).
                    unsafe {
                        run_kernel(
                            g.kernel,
                            ap.as_ptr(),
                            bp.as_ptr(),
                            pf,
                            c.as_mut_ptr(),
                            PANEL * 4,
                            steps,
                            load,
                        )
                    };
                    if last {
                        finish(c, PANEL, row, col, h, w, scale, Some(sink));
                    }
                    continue;
                }
                let epilogue = if last { g.epilogue } else { None };
                // SAFETY: `ap`/`bp` hold `steps` packed k-steps; the h × w block at
                // (row, col) is inside the output and this thread's (caller).
                unsafe {
                    block(
                        g.kernel, ap, bp, pf, out, out_len, g.ldc, row, col, h, w, steps, load,
                        scale, epilogue,
                    )
                };
            }
        }
    }
}

/// `u16` length of A's rows packed whole for [`gemm_packed`].
pub fn packed_a_len(m: usize, k: usize, precision: Precision) -> usize {
    packed_len(m, k, precision.parts().0.len())
}

/// `u16` length of B's columns packed whole for [`gemm_packed`].
pub fn packed_b_len(n: usize, k: usize, precision: Precision) -> usize {
    packed_len(n, k, precision.parts().1.len())
}

/// [`gemm`] on the calling thread from operands packed beforehand: `a_packed` is every
/// row of A ([`pack_a`] from row 0 with `precision`'s A parts), `b_packed` every panel
/// of B ([`pack_b`] of panels `0..`, or [`super::pack::pack_b_kstep`] step by step).
/// The same loops as [`gemm`], so the same bits.
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

/// Whether threads split the B panels (each thread all rows) rather than the row panels
/// (each thread all B panels): whichever gives the busiest thread fewer 32 × 32 blocks,
/// counting a row panel a thread packs as half a block (measured: packing a 32-row panel
/// of A costs 0.4 of a block's product on Zen 4). 1,170 rows (37 panels) on 2 threads:
/// 19 × N panels for one thread when split by rows, 37 × N/2 + 18.5 / 2 by columns.
fn split_columns(m_panels: usize, n_panels: usize, threads: usize) -> bool {
    if threads < 2 {
        return false;
    }
    // Twice the cost, in blocks, so the half-block packing stays an integer.
    let by_rows = m_panels.div_ceil(threads) * (2 * n_panels + 1);
    let by_columns = m_panels * (2 * n_panels.div_ceil(threads) + 1);
    by_columns < by_rows
}

/// One 32 × 32 block of C (`h × w` of it inside the matrix) over `steps` packed k-steps.
///
/// # Safety
/// Tiles configured on this thread; `a`, `b` hold `steps` k-steps; rows `row..row + h`,
/// columns `col..col + w` of the `ldc`-strided output at `out` (`out_len` elements) are
/// in bounds and not accessed by another thread.
#[allow(clippy::too_many_arguments)]
unsafe fn block(
    kernel: Kernel,
    a: &[u16],
    b: &[u16],
    pf: *const u16,
    out: *mut f32,
    out_len: usize,
    ldc: usize,
    row: usize,
    col: usize,
    h: usize,
    w: usize,
    steps: usize,
    load: bool,
    scale: Option<f32>,
    epilogue: Option<&Epilogue<'_>>,
) {
    debug_assert!(a.len() >= steps * KSTEP_LEN && b.len() >= steps * KSTEP_LEN);
    debug_assert!((row + h - 1) * ldc + col + w <= out_len);
    if h == PANEL && w == PANEL {
        // SAFETY: the full 32 × 32 block is in bounds (caller), rows `ldc` apart.
        unsafe {
            let c = out.add(row * ldc + col);
            if !load {
                // The block's 64 output lines, asked for with write intent now: they come
                // from far away (the output is written once) and the tile stores at the
                // end of the K loop otherwise wait on them.
                for r in 0..PANEL {
                    let line = c.add(r * ldc);
                    std::arch::asm!(
                        "prefetchw [{0}]",
                        "prefetchw [{0} + 64]",
                        in(reg) line,
                        options(nostack, readonly, preserves_flags)
                    );
                }
            }
            run_kernel(kernel, a.as_ptr(), b.as_ptr(), pf, c, ldc * 4, steps, load);
            if scale.is_some() || epilogue.is_some() {
                let data = std::slice::from_raw_parts_mut(c, (PANEL - 1) * ldc + PANEL);
                finish(data, ldc, row, col, PANEL, PANEL, scale, epilogue);
            }
        }
        return;
    }
    // An edge block goes through a local 32 × 32 buffer.
    let mut tmp = [0.0f32; PANEL * PANEL];
    // SAFETY: only rows < h and columns < w of the block are read or written (in
    // bounds by the caller's contract).
    unsafe {
        if load {
            for r in 0..h {
                let src = std::slice::from_raw_parts(out.add((row + r) * ldc + col), w);
                tmp[r * PANEL..r * PANEL + w].copy_from_slice(src);
            }
        }
        run_kernel(
            kernel,
            a.as_ptr(),
            b.as_ptr(),
            pf,
            tmp.as_mut_ptr(),
            PANEL * 4,
            steps,
            load,
        );
        for r in 0..h {
            let d = std::slice::from_raw_parts_mut(out.add((row + r) * ldc + col), w);
            d.copy_from_slice(&tmp[r * PANEL..r * PANEL + w]);
        }
        let data = std::slice::from_raw_parts_mut(out.add(row * ldc + col), (h - 1) * ldc + w);
        finish(data, ldc, row, col, h, w, scale, epilogue);
    }
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

/// A finished block: each row scaled, then the epilogue.
#[allow(clippy::too_many_arguments)]
#[inline]
fn finish(
    data: &mut [f32],
    ldc: usize,
    row: usize,
    col: usize,
    h: usize,
    w: usize,
    scale: Option<f32>,
    epilogue: Option<&Epilogue<'_>>,
) {
    if let Some(s) = scale {
        for r in 0..h {
            data[r * ldc..r * ldc + w].iter_mut().for_each(|x| *x *= s);
        }
    }
    if let Some(e) = epilogue {
        e(Block {
            data,
            ldc,
            row,
            col,
            h,
            w,
        });
    }
}

/// The tile registers configured as eight 16 × 64-byte tiles, released on drop.
#[derive(Debug)]
pub(crate) struct Tiles;

#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl Tiles {
    /// # Safety
    /// AMX must be enabled for the process ([`enable`]).
    pub(crate) unsafe fn configure() -> Tiles {
        let mut cfg = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for t in 0..8 {
            cfg.colsb[t] = 64;
            cfg.rows[t] = 16;
        }
        // SAFETY: `cfg` is a valid 64-byte palette-1 configuration; the caller has the
        // tile permission.
        unsafe {
            std::arch::asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
        }
        Tiles
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: releasing the tile state this thread configured; touches no memory.
        unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// [`tile_kernel`] or [`super::vdp::kernel`], by `kernel`.
///
/// # Safety
/// As for the kernel run (its instructions available, tiles configured for the tiles).
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn run_kernel(
    kernel: Kernel,
    a: *const u16,
    b: *const u16,
    pf: *const u16,
    c: *mut f32,
    ldc_bytes: usize,
    steps: usize,
    load: bool,
) {
    // SAFETY: the caller's contract, which is each kernel's.
    unsafe {
        match kernel {
            Kernel::Tiles => tile_kernel(a, b, pf, c, ldc_bytes, steps, load),
            Kernel::Vdp => super::vdp::kernel(a, b, pf, c, ldc_bytes, steps, load),
        }
    }
}

/// `u16` values of the next B panel [`tile_kernel`] prefetches per k-step: four cache
/// lines, so the A panels of a block (eight at [`MC`] rows) fetch one whole panel.
const PREFETCH_PER_STEP: usize = 128;

/// C (32 × 32 f32 at `c`, rows `ldc_bytes` apart) `(load ? C : 0) +=` A panel · B panel
/// over `steps` packed k-steps, prefetching `steps` × [`PREFETCH_PER_STEP`] values at
/// `pf` on the way.
///
/// # Safety
/// Tiles configured (8 × 16 rows × 64 bytes); `a` and `b` point at `steps` packed
/// k-steps (2,048 bytes each); the 32 rows of 128 bytes at `c` are writable; `steps ≥ 1`.
/// `pf` may point anywhere (a prefetch never faults), but should be in some buffer.
#[inline]
unsafe fn tile_kernel(
    a: *const u16,
    b: *const u16,
    pf: *const u16,
    c: *mut f32,
    ldc_bytes: usize,
    steps: usize,
    load: bool,
) {
    debug_assert!(steps >= 1);
    // SAFETY: the caller's contract; the four C tiles are at c, c + 64 B, c + 16 rows and
    // c + 16 rows + 64 B; A and B tiles at +0 and +1024 B of each 2,048-byte k-step.
    unsafe {
        let c1 = c.add(16);
        let c2 = c.cast::<u8>().add(16 * ldc_bytes).cast::<f32>();
        let c3 = c2.add(16);
        std::arch::asm!(
            "test {load}, {load}",
            "jz 2f",
            "tileloadd tmm0, [{c0} + {ldc}*1]",
            "tileloadd tmm1, [{c1} + {ldc}*1]",
            "tileloadd tmm2, [{c2} + {ldc}*1]",
            "tileloadd tmm3, [{c3} + {ldc}*1]",
            "jmp 3f",
            "2:",
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "3:",
            "tileloadd tmm4, [{a} + {s64}*1]",
            "tileloadd tmm6, [{b} + {s64}*1]",
            "tileloadd tmm5, [{a} + {s64}*1 + 1024]",
            "tileloadd tmm7, [{b} + {s64}*1 + 1024]",
            "prefetcht0 [{pf}]",
            "prefetcht0 [{pf} + 64]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "prefetcht0 [{pf} + 128]",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "prefetcht0 [{pf} + 192]",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "add {a}, 2048",
            "add {b}, 2048",
            "add {pf}, 256",
            "dec {k}",
            "jnz 3b",
            "tilestored [{c0} + {ldc}*1], tmm0",
            "tilestored [{c1} + {ldc}*1], tmm1",
            "tilestored [{c2} + {ldc}*1], tmm2",
            "tilestored [{c3} + {ldc}*1], tmm3",
            load = in(reg) u64::from(load),
            a = inout(reg) a => _,
            b = inout(reg) b => _,
            pf = inout(reg) pf => _,
            k = inout(reg) steps => _,
            c0 = in(reg) c,
            c1 = in(reg) c1,
            c2 = in(reg) c2,
            c3 = in(reg) c3,
            ldc = in(reg) ldc_bytes,
            s64 = in(reg) 64usize,
            options(nostack),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::split_columns;

    #[test]
    fn threads_split_columns_where_row_panels_do_not_divide_evenly() {
        // The DiT's 1,170 rows (37 panels) against 1,536 or 8,960 columns on 2 threads.
        assert!(split_columns(37, 48, 2));
        assert!(split_columns(37, 280, 2));
        // Even row panels, or too few columns to share: rows.
        assert!(!split_columns(36, 48, 2));
        assert!(!split_columns(7, 3, 2));
        assert!(!split_columns(37, 48, 1));
    }
}
