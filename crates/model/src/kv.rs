//! The paged self-attention KV cache (STEPWISE.md B5).
//!
//! A page holds the keys and values of a fixed number of tokens (`PageLayout::tokens`,
//! 16 by default, as vLLM's blocks) for every layer, so one pool serves sessions of any
//! resolution: a latent frame of T tokens takes ⌈T / tokens⌉ pages, the last one
//! partly filled. Pages come from a [`KvPool`] sized once from a memory budget: every
//! page is allocated up front from the device's allocator, so a session that is admitted
//! can never run out mid-stream, and a session that cannot get its pages is refused
//! before it starts. A [`SessionKv`] keeps a sink of the first frames for the whole
//! session plus a rolling window; when a new block would exceed the window it evicts the
//! oldest non-sink block and reuses its pages.

use std::sync::{Arc, Mutex};

use headroom_tensor::{DType, Device, Tensor};

use crate::dit::KeyValues;
use crate::error::{ModelError, Result};
use crate::state::{StateReader, StateWriter};

/// Shape of one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageLayout {
    /// Transformer layers.
    pub layers: usize,
    /// Tokens per page.
    pub tokens: usize,
    /// Attention heads.
    pub heads: usize,
    /// Dimension per head.
    pub head_dim: usize,
    /// Storage dtype.
    pub dtype: DType,
}

impl PageLayout {
    /// Bytes of one page (K and V of every layer).
    pub fn bytes(&self) -> u64 {
        (2 * self.layers * self.tokens * self.heads * self.head_dim * self.dtype.size()) as u64
    }

    /// Pages one latent frame of `frame_tokens` tokens takes.
    pub fn pages_per_frame(&self, frame_tokens: usize) -> usize {
        frame_tokens.div_ceil(self.tokens.max(1))
    }

    /// Pages a session of `frame_tokens` tokens per latent frame holds: a window of
    /// `window_frames` frames.
    pub fn session_pages(&self, frame_tokens: usize, window_frames: usize) -> usize {
        window_frames * self.pages_per_frame(frame_tokens)
    }
}

/// One page: `tokens` tokens' keys and values, per layer.
#[derive(Debug)]
pub struct Page {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
}

/// A fixed set of pages taken from the allocator once.
#[derive(Debug)]
pub struct KvPool {
    layout: PageLayout,
    free: Mutex<Vec<Page>>,
    total: usize,
}

impl KvPool {
    /// A pool of as many pages as `budget_bytes` holds (at least `min_pages`, or an error
    /// saying what does not fit).
    pub fn with_budget(
        layout: PageLayout,
        budget_bytes: u64,
        min_pages: usize,
        device: &Device,
    ) -> Result<Arc<Self>> {
        if layout.tokens == 0 {
            return Err(ModelError::input("kv page tokens", "must be at least 1"));
        }
        let pages = usize::try_from(budget_bytes / layout.bytes().max(1)).unwrap_or(usize::MAX);
        if pages < min_pages {
            return Err(ModelError::input(
                "kv pool",
                format!(
                    "a budget of {budget_bytes} B holds {pages} pages of {} B; at least {min_pages} are needed",
                    layout.bytes()
                ),
            ));
        }
        let shape = [1, layout.tokens, layout.heads, layout.head_dim];
        let mut free = Vec::with_capacity(pages);
        for _ in 0..pages {
            let make = || -> Result<Vec<Tensor>> {
                (0..layout.layers)
                    .map(|_| Ok(Tensor::zeros(&shape, layout.dtype, device)?))
                    .collect()
            };
            free.push(Page {
                k: make()?,
                v: make()?,
            });
        }
        Ok(Arc::new(Self {
            layout,
            free: Mutex::new(free),
            total: pages,
        }))
    }

    /// Page shape.
    pub fn layout(&self) -> PageLayout {
        self.layout
    }

    /// Pages in the pool.
    pub fn total_pages(&self) -> usize {
        self.total
    }

    /// Bytes the pool's pages hold.
    pub fn bytes(&self) -> u64 {
        self.total as u64 * self.layout.bytes()
    }

    /// Pages not held by any session.
    pub fn free_pages(&self) -> usize {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Takes `n` pages, or refuses (leaving the pool unchanged) when fewer are free.
    pub fn acquire(&self, n: usize) -> Result<Vec<Page>> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.len() < n {
            return Err(ModelError::input(
                "kv pool",
                format!("{n} pages needed, {} of {} free", free.len(), self.total),
            ));
        }
        let at = free.len() - n;
        Ok(free.split_off(at))
    }

    /// Returns pages to the pool.
    pub fn release(&self, pages: Vec<Page>) {
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(pages);
    }
}

/// One session's cache: pages reserved at admission, a sink and a rolling window.
#[derive(Debug)]
pub struct SessionKv {
    pool: Arc<KvPool>,
    /// Tokens of one latent frame.
    frame_tokens: usize,
    /// Pages not yet holding a frame.
    spare: Vec<Page>,
    /// (absolute frame, its pages), in frame order.
    frames: Vec<(usize, Vec<Page>)>,
    sink_frames: usize,
    window_frames: usize,
    block_frames: usize,
}

impl SessionKv {
    /// Reserves the pages a session of `frame_tokens` tokens per latent frame needs:
    /// `window_frames` frames (the visible history plus the current block), with
    /// `sink_frames` of them kept forever.
    pub fn new(
        pool: &Arc<KvPool>,
        frame_tokens: usize,
        sink_frames: usize,
        window_frames: usize,
        block_frames: usize,
    ) -> Result<Self> {
        if block_frames == 0
            || window_frames < sink_frames + block_frames
            || !(window_frames - sink_frames).is_multiple_of(block_frames)
        {
            return Err(ModelError::input(
                "kv window",
                format!(
                    "window {window_frames} must hold the sink {sink_frames} plus whole blocks of {block_frames} frames"
                ),
            ));
        }
        if frame_tokens == 0 {
            return Err(ModelError::input("kv frame tokens", "must be at least 1"));
        }
        let spare = pool.acquire(pool.layout.session_pages(frame_tokens, window_frames))?;
        Ok(Self {
            pool: Arc::clone(pool),
            frame_tokens,
            spare,
            frames: Vec::new(),
            sink_frames,
            window_frames,
            block_frames,
        })
    }

    /// Absolute frames whose keys a new block will see (before it is committed).
    pub fn history(&self) -> Vec<usize> {
        self.frames.iter().map(|(f, _)| *f).collect()
    }

    /// Tokens page `i` of a frame holds (the last page of a frame may be partly filled).
    fn rows(&self, i: usize) -> usize {
        let per = self.pool.layout.tokens;
        per.min(self.frame_tokens - i * per)
    }

    /// Keys and values of the history, per layer, `[1, frames·tokens, H, D]` in f32.
    pub fn gather(&self) -> Result<Option<Vec<KeyValues>>> {
        if self.frames.is_empty() {
            return Ok(None);
        }
        (0..self.pool.layout.layers)
            .map(|l| {
                Ok(KeyValues {
                    k: self.layer_history(|p| &p.k[l])?.to_dtype(DType::F32)?,
                    v: self.layer_history(|p| &p.v[l])?.to_dtype(DType::F32)?,
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// One side of one layer (`side` picks it from a page) over the whole history, as
    /// one `[1, frames·tokens, H, D]` tensor in the pages' dtype: the rows each page
    /// holds, frame after frame.
    fn layer_history(&self, side: impl Fn(&Page) -> &Tensor) -> Result<Tensor> {
        let per = self.pool.layout.tokens;
        let mut parts = Vec::new();
        for (_, pages) in &self.frames {
            for (i, p) in pages.iter().enumerate() {
                let rows = self.rows(i);
                let t = side(p);
                parts.push(if rows == per {
                    t.clone()
                } else {
                    t.narrow(1, 0, rows)?
                });
            }
        }
        Ok(Tensor::cat(&parts.iter().collect::<Vec<_>>(), 1)?)
    }

    /// Stores a block's keys/values (`own[layer]`, `[1, block·tokens, H, D]`) for frames
    /// `first_frame..`, evicting the oldest non-sink block first when the window is full.
    pub fn commit(&mut self, first_frame: usize, own: &[KeyValues]) -> Result<()> {
        let tokens = self.frame_tokens;
        if let Some(&(last, _)) = self.frames.last() {
            if first_frame != last + 1 {
                return Err(ModelError::input(
                    "kv commit",
                    format!("block at frame {first_frame} does not follow frame {last}"),
                ));
            }
        }
        // The history may hold window − block frames so the next block fits beside it.
        while self.frames.len() + 2 * self.block_frames > self.window_frames {
            let evict_at = self.sink_frames.min(self.frames.len());
            for _ in 0..self.block_frames.min(self.frames.len() - evict_at) {
                let (_, pages) = self.frames.remove(evict_at);
                self.spare.extend(pages);
            }
        }
        for j in 0..self.block_frames {
            self.fill_frame(first_frame + j, own, j * tokens)?;
        }
        Ok(())
    }

    /// Takes a spare frame's pages, fills them with the rows of `src[layer]` from token
    /// `from` on, and appends them as absolute frame `frame`.
    fn fill_frame(&mut self, frame: usize, src: &[KeyValues], from: usize) -> Result<()> {
        let per = self.pool.layout.tokens;
        let per_frame = self.pool.layout.pages_per_frame(self.frame_tokens);
        if self.spare.len() < per_frame {
            return Err(ModelError::input(
                "kv commit",
                "no spare page (internal accounting error)",
            ));
        }
        let at = self.spare.len() - per_frame;
        let mut pages = self.spare.split_off(at);
        for (i, page) in pages.iter_mut().enumerate() {
            let rows = self.rows(i);
            let start = from + i * per;
            for (l, kv) in src.iter().enumerate() {
                // A partly filled page keeps stale rows after `rows`: never read.
                page.k[l].assign_leading(1, &kv.k.narrow(1, start, rows)?)?;
                page.v[l].assign_leading(1, &kv.v.narrow(1, start, rows)?)?;
            }
        }
        self.frames.push((frame, pages));
        Ok(())
    }

    /// Saves the committed history: the absolute frames held (sink and window) and, per
    /// layer, the keys and values of all of them as one `[1, frames·tokens, H, D]`
    /// tensor in the pages' dtype (one transfer per layer and side, not one per page).
    pub fn save(&self, w: &mut StateWriter<'_>) -> Result<()> {
        w.field("frames", &self.history())?;
        w.field("frame_tokens", &self.frame_tokens)?;
        w.field("sink_frames", &self.sink_frames)?;
        w.field("window_frames", &self.window_frames)?;
        w.field("block_frames", &self.block_frames)?;
        if self.frames.is_empty() {
            return Ok(());
        }
        for l in 0..self.pool.layout.layers {
            // One side at a time: the staging is one layer's keys (or values).
            w.tensor(&format!("k.{l}"), &self.layer_history(|p| &p.k[l])?)?;
            w.tensor(&format!("v.{l}"), &self.layer_history(|p| &p.v[l])?)?;
        }
        Ok(())
    }

    /// Fills this fresh cache (its pages reserved, no frame committed) with a saved
    /// history ([`SessionKv::save`]), refusing one of another shape by name.
    pub fn restore(&mut self, r: &StateReader<'_>) -> Result<()> {
        if !self.frames.is_empty() {
            return Err(ModelError::input(
                "kv restore",
                "the cache already holds frames",
            ));
        }
        let saved = [
            (
                "frame_tokens",
                r.field::<usize>("frame_tokens")?,
                self.frame_tokens,
            ),
            (
                "sink_frames",
                r.field::<usize>("sink_frames")?,
                self.sink_frames,
            ),
            (
                "window_frames",
                r.field::<usize>("window_frames")?,
                self.window_frames,
            ),
            (
                "block_frames",
                r.field::<usize>("block_frames")?,
                self.block_frames,
            ),
        ];
        for (name, was, is) in saved {
            if was != is {
                return Err(ModelError::input(
                    "snapshot",
                    format!("kv {name} was {was}, this engine has {is}"),
                ));
            }
        }
        let frames: Vec<usize> = r.field("frames")?;
        if frames.len() + self.block_frames > self.window_frames
            || frames.windows(2).any(|p| p[1] <= p[0])
        {
            return Err(ModelError::input(
                "snapshot",
                format!(
                    "kv frames {frames:?} are not an increasing history that leaves a block of room in a window of {}",
                    self.window_frames
                ),
            ));
        }
        if frames.is_empty() {
            return Ok(());
        }
        let layout = self.pool.layout;
        let want = [
            1,
            frames.len() * self.frame_tokens,
            layout.heads,
            layout.head_dim,
        ];
        let src = (0..layout.layers)
            .map(|l| {
                let load = |side: &str| -> Result<Tensor> {
                    let name = format!("{side}.{l}");
                    let saved = r.saved(&name)?;
                    if saved.shape != want || saved.dtype != layout.dtype {
                        return Err(ModelError::input(
                            "snapshot",
                            format!(
                                "kv {name} is {} {:?}, the pages hold {} {want:?}",
                                saved.dtype, saved.shape, layout.dtype
                            ),
                        ));
                    }
                    r.tensor(&name)
                };
                Ok(KeyValues {
                    k: load("k")?,
                    v: load("v")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        for (j, &frame) in frames.iter().enumerate() {
            self.fill_frame(frame, &src, j * self.frame_tokens)?;
        }
        Ok(())
    }
}

impl Drop for SessionKv {
    fn drop(&mut self) {
        let mut pages: Vec<Page> = std::mem::take(&mut self.spare);
        for (_, frame) in self.frames.drain(..) {
            pages.extend(frame);
        }
        self.pool.release(pages);
    }
}
