//! The paged self-attention KV cache (STEPWISE.md B5).
//!
//! A page holds one latent frame's keys and values for every layer. Pages come from a
//! [`KvPool`] sized once from a memory budget: every page is allocated up front from the
//! device's allocator, so a session that is admitted can never run out mid-stream, and a
//! session that cannot get its pages is refused before it starts. A [`SessionKv`] keeps
//! a sink of the first frames for the whole session plus a rolling window; when a new
//! block would exceed the window it evicts the oldest non-sink block and reuses its pages.

use std::sync::{Arc, Mutex};

use headroom_tensor::{DType, Device, Tensor};

use crate::dit::KeyValues;
use crate::error::{ModelError, Result};

/// Shape of one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageLayout {
    /// Transformer layers.
    pub layers: usize,
    /// Tokens per latent frame.
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
}

/// One frame's keys and values, per layer.
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
    /// Pages not yet holding a frame.
    spare: Vec<Page>,
    /// (absolute frame, page), in frame order.
    frames: Vec<(usize, Page)>,
    sink_frames: usize,
    window_frames: usize,
    block_frames: usize,
}

impl SessionKv {
    /// Reserves the pages a session needs: `window_frames` (the visible history plus the
    /// current block), with `sink_frames` of them kept forever.
    pub fn new(
        pool: &Arc<KvPool>,
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
        let spare = pool.acquire(window_frames)?;
        Ok(Self {
            pool: Arc::clone(pool),
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

    /// Keys and values of the history, per layer, `[1, frames·tokens, H, D]` in f32.
    pub fn gather(&self) -> Result<Option<Vec<KeyValues>>> {
        if self.frames.is_empty() {
            return Ok(None);
        }
        let layers = self.pool.layout.layers;
        (0..layers)
            .map(|l| {
                let ks: Vec<&Tensor> = self.frames.iter().map(|(_, p)| &p.k[l]).collect();
                let vs: Vec<&Tensor> = self.frames.iter().map(|(_, p)| &p.v[l]).collect();
                Ok(KeyValues {
                    k: Tensor::cat(&ks, 1)?.to_dtype(DType::F32)?,
                    v: Tensor::cat(&vs, 1)?.to_dtype(DType::F32)?,
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// Stores a block's keys/values (`own[layer]`, `[1, block·tokens, H, D]`) for frames
    /// `first_frame..`, evicting the oldest non-sink block first when the window is full.
    pub fn commit(&mut self, first_frame: usize, own: &[KeyValues]) -> Result<()> {
        let tokens = self.pool.layout.tokens;
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
                let (_, page) = self.frames.remove(evict_at);
                self.spare.push(page);
            }
        }
        for j in 0..self.block_frames {
            let mut page = self.spare.pop().ok_or_else(|| {
                ModelError::input("kv commit", "no spare page (internal accounting error)")
            })?;
            for (l, kv) in own.iter().enumerate() {
                page.k[l].assign(&kv.k.narrow(1, j * tokens, tokens)?)?;
                page.v[l].assign(&kv.v.narrow(1, j * tokens, tokens)?)?;
            }
            self.frames.push((first_frame + j, page));
        }
        Ok(())
    }
}

impl Drop for SessionKv {
    fn drop(&mut self) {
        let mut pages: Vec<Page> = std::mem::take(&mut self.spare);
        pages.extend(self.frames.drain(..).map(|(_, p)| p));
        self.pool.release(pages);
    }
}
