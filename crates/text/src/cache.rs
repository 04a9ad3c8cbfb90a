//! An LRU cache of prompt embeddings with a byte budget.
//!
//! Entries live in a map from prompt to (embedding, last-use tick) plus an ordered index
//! from tick to prompt, so a hit, an insert and an eviction of the least recently used
//! entry are each O(log n). The budget counts the storage bytes of the cached tensors
//! (the allocator's bytes, not the map's): an embedding larger than the whole budget is
//! not cached at all, and a budget of 0 turns the cache off. Handles are shared, so a
//! cached embedding handed out costs no copy and no extra bytes.

use std::collections::{BTreeMap, HashMap};

use headroom_tensor::Tensor;

/// Hit/miss counters and the bytes held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups that found the prompt.
    pub hits: u64,
    /// Lookups that did not.
    pub misses: u64,
    /// Entries dropped to stay within the budget.
    pub evictions: u64,
    /// Cached prompts.
    pub entries: usize,
    /// Storage bytes of the cached embeddings.
    pub bytes: u64,
    /// The byte budget.
    pub budget_bytes: u64,
}

/// Prompt embeddings by prompt, least recently used evicted first.
#[derive(Debug)]
pub struct EmbeddingCache {
    entries: HashMap<String, (Tensor, u64)>,
    order: BTreeMap<u64, String>,
    tick: u64,
    stats: CacheStats,
}

impl EmbeddingCache {
    /// An empty cache holding at most `budget_bytes` of embeddings.
    pub fn new(budget_bytes: u64) -> Self {
        Self {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            stats: CacheStats {
                budget_bytes,
                ..CacheStats::default()
            },
        }
    }

    /// The embedding of `prompt`, marking it most recently used; counts a hit or a miss.
    pub fn get(&mut self, prompt: &str) -> Option<Tensor> {
        self.tick += 1;
        let tick = self.tick;
        match self.entries.get_mut(prompt) {
            Some((tensor, last)) => {
                self.order.remove(last);
                *last = tick;
                self.order.insert(tick, prompt.to_string());
                self.stats.hits += 1;
                Some(tensor.clone())
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// Caches `embedding` for `prompt`, evicting least recently used entries until it
    /// fits; an embedding larger than the budget is not cached.
    pub fn insert(&mut self, prompt: &str, embedding: &Tensor) {
        let bytes = embedding.storage_bytes() as u64;
        if bytes > self.stats.budget_bytes {
            return;
        }
        self.remove(prompt);
        while self.stats.bytes + bytes > self.stats.budget_bytes {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some((t, _)) = self.entries.remove(&oldest) {
                self.stats.bytes -= t.storage_bytes() as u64;
                self.stats.evictions += 1;
            }
        }
        self.tick += 1;
        self.order.insert(self.tick, prompt.to_string());
        self.entries
            .insert(prompt.to_string(), (embedding.clone(), self.tick));
        self.stats.bytes += bytes;
    }

    fn remove(&mut self, prompt: &str) {
        if let Some((t, last)) = self.entries.remove(prompt) {
            self.order.remove(&last);
            self.stats.bytes -= t.storage_bytes() as u64;
        }
    }

    /// Drops every entry (the counters stay).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.order.clear();
        self.stats.bytes = 0;
    }

    /// Whether `prompt` is cached (does not count as a lookup).
    pub fn contains(&self, prompt: &str) -> bool {
        self.entries.contains_key(prompt)
    }

    /// Counters and bytes.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            entries: self.entries.len(),
            ..self.stats
        }
    }
}
