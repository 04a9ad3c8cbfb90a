//! The blocked loop nest of the packed bf16 GEMM: threads split the rows or the B
//! panels ([`split_columns`]), each packs its A blocks and walks K blocks, B panels and A
//! panels, and each 32 × 32 block of C goes through the tile or VDP micro-kernel, then
//! its scale and epilogue. The entries in the parent module set the loops up.

use super::super::pack::{pack_a, packed_len, KSTEP_LEN, PANEL, TILE_K};
use super::super::vdp;
use super::tiles::{tile_kernel, PREFETCH_PER_STEP};
use super::{
    a_block_len, entry_is_trivial, kb_for, pack_b_panels, panels_per_block, Block, Dst, Epilogue,
    Kernel, Operand, Precision, MC,
};

struct SendPtr(*mut f32);
// SAFETY: threads write disjoint row ranges of the output (see `gemm`).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

/// Where [`gemm_from`] puts C.
pub(super) enum Out<'a, 'e> {
    /// Stored in a matrix, each finished block then passed to the epilogue there.
    Dst(Dst<'a>, Option<&'e Epilogue<'e>>),
    /// Summed in a per-thread panel buffer and passed to the sink; never stored.
    Blocks(&'e Epilogue<'e>),
}

/// Where [`gemm_from`] finds B.
pub(super) enum BSource<'a> {
    /// An operand packed here, in column blocks of at most [`B_BLOCK_BYTES`](super::B_BLOCK_BYTES).
    Pack(&'a Operand<'a>),
    /// Every panel packed beforehand.
    Packed(&'a [u16]),
}

#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_from(
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
                    b_step0: k0 / TILE_K * pa.len(),
                    steps: kn.div_ceil(TILE_K) * pa.len(),
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

/// What [`multiply`] needs to know of the whole GEMM.
pub(super) struct Shape<'e> {
    /// What computes each 32 × 32 block.
    pub(super) kernel: Kernel,
    /// Rows of C.
    pub(super) m: usize,
    /// Columns of C.
    pub(super) n: usize,
    /// `u16` values of one packed B panel.
    pub(super) panel_len: usize,
    /// Elements between rows of the output.
    pub(super) ldc: usize,
    /// Scale of the product, applied once K is done.
    pub(super) alpha: f32,
    /// Runs on every finished block.
    pub(super) epilogue: Option<&'e Epilogue<'e>>,
    /// Takes every finished block instead of the output (see [`Out::Blocks`]).
    pub(super) sink: Option<&'e Epilogue<'e>>,
}

/// A thread's C for one B panel against its A block ([`MC`] × 32 f32), tile-aligned.
#[repr(C, align(64))]
struct CPanel([f32; MC * PANEL]);

/// The K range one [`multiply`] call sums, in packed k-steps (k-steps × parts).
pub(super) struct Span {
    /// The range's first packed k-step within a B panel.
    pub(super) b_step0: usize,
    /// Packed k-steps in the range (all of them in the A block).
    pub(super) steps: usize,
    /// C starts from the output (accumulating, or a later K range) rather than zeros.
    pub(super) load: bool,
    /// The range ends K (the scale applies after it).
    pub(super) last: bool,
}

/// C rows `r0..r0 + mc` × B panels `panels` from `a_packed` (rows `r0..` packed, panel
/// by panel) and `packed_b` (panel `panels.start` first). C stays in L1/L2 across the K
/// blocks; the B sub-panel of a K block ([`KC`](super::KC) k-steps) is reused by every A
/// panel.
///
/// # Safety
/// Tiles configured on this thread; the buffers hold those packed rows and panels; the
/// rows `r0..r0 + mc` of the `ldc`-strided output at `out` (`out_len` elements) lie
/// inside it and no other thread accesses them.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn multiply(
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

/// [`tile_kernel`] or [`vdp::kernel`], by `kernel`.
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
            Kernel::Vdp => vdp::kernel(a, b, pf, c, ldc_bytes, steps, load),
        }
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
