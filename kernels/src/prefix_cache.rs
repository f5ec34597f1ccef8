//! Automatic prefix caching: KV of finished sequences kept for reuse by later prompts.
//!
//! In multi-turn rollouts the next prompt of a trajectory extends the previous prompt and
//! completion, and the prompts of one task share a long prefix (system prompt, tools, facts).
//! The [`crate::engine::Engine`] stores the KV of every finished sequence here; a new prompt
//! copies the KV of its longest cached common prefix into its slot and prefills only the rest
//! (the idea of vLLM's automatic prefix caching, at the granularity of whole sequences instead
//! of blocks).
//!
//! Bounded by a token budget with least-recently-used eviction. An entry holds, per layer,
//! `k, v: [kv_heads, len, head_dim]` in the model dtype, i.e.
//! `len · 2 · layers · kv_heads · head_dim · bytes(dtype)` bytes. KV depends on the weights:
//! [`PrefixCache::clear`] it whenever they change.

use serde::{Deserialize, Serialize};
use tch::Tensor;

/// Shorter common prefixes are not reused: copying them saves less than it costs.
pub const MIN_REUSE_TOKENS: usize = 16;

/// The KV of one token sequence.
#[derive(Debug)]
pub struct PrefixEntry {
    /// The tokens whose KV is stored (position `i` holds token `ids[i]`).
    ids: Vec<u32>,
    /// Per layer `[kv_heads, len, head_dim]`, model dtype and device.
    k: Vec<Tensor>,
    /// Per layer `[kv_heads, len, head_dim]`, model dtype and device.
    v: Vec<Tensor>,
    /// Tick of the last insert or hit, for LRU eviction.
    last_used: u64,
}

impl PrefixEntry {
    /// The tokens whose KV is stored.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Per-layer keys, `[kv_heads, len, head_dim]`.
    pub fn k(&self) -> &[Tensor] {
        &self.k
    }

    /// Per-layer values, `[kv_heads, len, head_dim]`.
    pub fn v(&self) -> &[Tensor] {
        &self.v
    }
}

/// Cumulative counters of a [`PrefixCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefixCacheStats {
    /// Lookups that found a reusable prefix.
    pub hits: u64,
    /// Prompt tokens whose KV was reused instead of computed, tokens.
    pub reused_tokens: u64,
    /// Entries dropped to stay within the budget (subsumed entries are not counted).
    pub evictions: u64,
}

/// Finished sequences' KV, at most `budget` tokens in all.
#[derive(Debug)]
pub struct PrefixCache {
    entries: Vec<PrefixEntry>,
    budget: usize,
    /// Sum of the entries' lengths, tokens.
    held: usize,
    tick: u64,
    stats: PrefixCacheStats,
}

impl PrefixCache {
    /// An empty cache holding at most `budget` tokens of KV (0 disables it).
    pub fn new(budget: usize) -> Self {
        Self {
            entries: Vec::new(),
            budget,
            held: 0,
            tick: 0,
            stats: PrefixCacheStats::default(),
        }
    }

    /// The budget, tokens.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Tokens of KV currently held.
    pub fn tokens(&self) -> usize {
        self.held
    }

    /// Number of stored sequences.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Cumulative counters.
    pub fn stats(&self) -> PrefixCacheStats {
        self.stats
    }

    /// How many leading tokens of `prompt` could be reused, without touching the cache; 0 when
    /// no entry shares at least [`MIN_REUSE_TOKENS`] with it.
    pub fn peek(&self, prompt: &[u32]) -> usize {
        self.best(prompt).map_or(0, |(_, n)| n)
    }

    /// The entry sharing the longest prefix with `prompt`, and the reusable length: capped at
    /// `prompt.len() - 1`, because the last prompt token must be computed for its logits.
    /// `None` below [`MIN_REUSE_TOKENS`]. A hit counts in the stats and refreshes the entry.
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<(&PrefixEntry, usize)> {
        let (i, n) = self.best(prompt)?;
        self.tick += 1;
        self.stats.hits += 1;
        self.stats.reused_tokens += n as u64;
        let entry = &mut self.entries[i];
        entry.last_used = self.tick;
        Some((&*entry, n))
    }

    fn best(&self, prompt: &[u32]) -> Option<(usize, usize)> {
        let cap = prompt.len().saturating_sub(1);
        self.entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_prefix(&e.ids, prompt).min(cap)))
            .filter(|&(_, n)| n >= MIN_REUSE_TOKENS)
            // Ties go to the most recently used entry.
            .max_by_key(|&(i, n)| (n, self.entries[i].last_used))
    }

    /// Stores the KV of `ids` (`k, v`: per layer `[kv_heads, ids.len(), head_dim]`, owned — not
    /// views of a buffer that is reused). Entries that are a prefix of `ids` are dropped
    /// (subsumed); if an entry already extends `ids`, it is only refreshed. Least recently used
    /// entries are then evicted until the budget holds. A sequence longer than the whole budget
    /// is not stored.
    pub fn insert(&mut self, ids: Vec<u32>, k: Vec<Tensor>, v: Vec<Tensor>) {
        let len = ids.len();
        if len == 0 || len > self.budget {
            return;
        }
        self.tick += 1;
        if let Some(e) = self.entries.iter_mut().find(|e| e.ids.starts_with(&ids)) {
            e.last_used = self.tick;
            return;
        }
        let mut held = self.held;
        self.entries.retain(|e| {
            let subsumed = ids.starts_with(&e.ids);
            if subsumed {
                held -= e.ids.len();
            }
            !subsumed
        });
        self.held = held;
        while self.held + len > self.budget {
            let Some(lru) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(i, _)| i)
            else {
                break;
            };
            let gone = self.entries.swap_remove(lru);
            self.held -= gone.ids.len();
            self.stats.evictions += 1;
        }
        self.held += len;
        self.entries.push(PrefixEntry {
            ids,
            k,
            v,
            last_used: self.tick,
        });
    }

    /// Drops every entry (e.g. after a weight update, which makes the stored KV stale). The
    /// counters keep counting.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.held = 0;
    }
}

/// Length of the longest common prefix of `a` and `b`.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One layer, one head, head_dim 1: position `i` stores `ids[i]` as its key and value.
    fn kv(ids: &[u32]) -> (Vec<Tensor>, Vec<Tensor>) {
        let vals: Vec<f32> = ids.iter().map(|&t| t as f32).collect();
        let t = Tensor::from_slice(&vals).view([1, ids.len() as i64, 1]);
        (vec![t.copy()], vec![t])
    }

    fn put(cache: &mut PrefixCache, ids: &[u32]) {
        let (k, v) = kv(ids);
        cache.insert(ids.to_vec(), k, v);
    }

    fn seq(range: std::ops::Range<u32>) -> Vec<u32> {
        range.collect()
    }

    #[test]
    fn lookup_finds_the_longest_prefix_and_leaves_one_token() {
        let mut cache = PrefixCache::new(1000);
        put(&mut cache, &seq(0..40));
        let mut other = seq(0..20);
        other.extend(100..130);
        put(&mut cache, &other);

        // Shares 20 with the first entry and 25 with the second.
        let mut prompt = seq(0..20);
        prompt.extend(100..105);
        prompt.extend(500..510);
        let (entry, n) = cache.lookup(&prompt).expect("hit");
        assert_eq!(n, 25);
        assert_eq!(entry.ids(), other.as_slice());
        let k = &entry.k()[0];
        assert_eq!(k.size(), vec![1, 50, 1]);
        assert_eq!(k.double_value(&[0, 24, 0]), 104.0);

        // The whole prompt is cached: the last token is still left to compute.
        assert_eq!(cache.lookup(&seq(0..30)).map(|(_, n)| n), Some(29));
        // Below the minimum: no hit.
        assert!(cache.lookup(&seq(0..MIN_REUSE_TOKENS as u32)).is_none());
        assert_eq!(cache.peek(&seq(0..(MIN_REUSE_TOKENS as u32 + 1))), 16);
        assert_eq!(cache.lookup(&[7; 30]).map(|(_, n)| n), None);
        let s = cache.stats();
        assert_eq!((s.hits, s.reused_tokens, s.evictions), (2, 54, 0));
    }

    #[test]
    fn insert_drops_subsumed_entries_and_evicts_lru() {
        let mut cache = PrefixCache::new(100);
        put(&mut cache, &seq(0..30));
        put(&mut cache, &seq(0..50));
        assert_eq!((cache.len(), cache.tokens()), (1, 50), "0..30 is subsumed");
        put(&mut cache, &seq(0..40));
        assert_eq!((cache.len(), cache.tokens()), (1, 50), "already covered");

        put(&mut cache, &seq(1000..1040));
        assert_eq!((cache.len(), cache.tokens()), (2, 90));
        // Touch the older entry: the other one is now least recently used.
        assert!(cache.lookup(&seq(0..20)).is_some());
        put(&mut cache, &seq(2000..2030));
        assert_eq!(cache.tokens(), 80);
        assert_eq!(cache.stats().evictions, 1);
        assert_eq!(cache.peek(&seq(1000..1040)), 0, "the LRU entry went");
        assert_eq!(cache.peek(&seq(0..50)), 49);

        // Longer than the budget: not stored, nothing evicted.
        put(&mut cache, &seq(5000..5101));
        assert_eq!((cache.len(), cache.tokens()), (2, 80));

        cache.clear();
        assert!(cache.is_empty());
        assert_eq!(cache.tokens(), 0);
        assert_eq!(cache.peek(&seq(0..50)), 0);
    }
}
