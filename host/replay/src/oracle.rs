//! The two oracles a router is measured against, computed from the trace alone: one cache
//! that never forgets, and one LRU cache holding the whole fleet's memory as if it were one
//! server. Both count hits in whole trace blocks from the start of a prompt (a prefix cache
//! can only reuse a prefix), as the servers do in their own blocks.
//!
//! This module owns these two computations only; it must not run anything.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::trace::TraceRequest;

/// Prompt tokens and the tokens of them a cache already held, summed over a trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Hits {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Of those, tokens found in the cache.
    pub cached_tokens: u64,
}

impl Hits {
    /// `cached / prompt`, 0 for an empty trace.
    pub fn ratio(&self) -> f64 {
        if self.prompt_tokens == 0 {
            0.0
        } else {
            self.cached_tokens as f64 / self.prompt_tokens as f64
        }
    }
}

/// Hits of one cache that keeps every block it ever saw.
pub fn unbounded(requests: &[TraceRequest]) -> Hits {
    let mut seen: HashSet<u64> = HashSet::new();
    let mut hits = Hits::default();
    for request in requests {
        hits.prompt_tokens += u64::from(request.input_tokens);
        let leading = request
            .blocks
            .iter()
            .take_while(|id| seen.contains(id))
            .count();
        hits.cached_tokens += cached_tokens(request, leading);
        seen.extend(request.blocks.iter().copied());
    }
    hits
}

/// Hits of one LRU cache of `capacity_blocks` trace blocks: every request's blocks are
/// touched (inserted or refreshed) after it is looked up, the least recently used go first.
pub fn shared_lru(requests: &[TraceRequest], capacity_blocks: usize) -> Hits {
    let mut lru = Lru::new(capacity_blocks);
    let mut hits = Hits::default();
    for request in requests {
        hits.prompt_tokens += u64::from(request.input_tokens);
        let leading = request
            .blocks
            .iter()
            .take_while(|id| lru.contains(**id))
            .count();
        hits.cached_tokens += cached_tokens(request, leading);
        for &id in &request.blocks {
            lru.touch(id);
        }
    }
    hits
}

/// Tokens in the first `leading` blocks of `request`, except that a prompt is never entirely
/// cached: its last token is always computed (as on the servers).
fn cached_tokens(request: &TraceRequest, leading: usize) -> u64 {
    let tokens: u64 = (0..leading)
        .map(|i| u64::from(request.block_tokens(i)))
        .sum();
    tokens.min(u64::from(request.input_tokens.saturating_sub(1)))
}

/// An LRU set of block ids: a map from id to its last use, and the uses in order.
struct Lru {
    capacity: usize,
    last_use: HashMap<u64, u64>,
    by_use: BTreeMap<u64, u64>,
    clock: u64,
}

impl Lru {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            last_use: HashMap::new(),
            by_use: BTreeMap::new(),
            clock: 0,
        }
    }

    fn contains(&self, id: u64) -> bool {
        self.last_use.contains_key(&id)
    }

    fn touch(&mut self, id: u64) {
        if self.capacity == 0 {
            return;
        }
        self.clock += 1;
        if let Some(old) = self.last_use.insert(id, self.clock) {
            self.by_use.remove(&old);
        } else if self.last_use.len() > self.capacity
            && let Some((_, evicted)) = self.by_use.pop_first()
        {
            self.last_use.remove(&evicted);
        }
        self.by_use.insert(self.clock, id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn request(input: u32, blocks: &[u64]) -> TraceRequest {
        TraceRequest {
            arrival: Duration::ZERO,
            input_tokens: input,
            output_tokens: 1,
            blocks: blocks.to_vec(),
            session: None,
        }
    }

    #[test]
    fn unbounded_counts_leading_blocks_seen_before() {
        let trace = [
            request(1024, &[0, 1]),
            request(1536, &[0, 1, 2]),
            request(1024, &[0, 9]),
            // Seen blocks after a miss do not count: a prefix cache stops at the first miss.
            request(1536, &[5, 1, 2]),
        ];
        let hits = unbounded(&trace);
        assert_eq!(hits.prompt_tokens, 1024 + 1536 + 1024 + 1536);
        assert_eq!(hits.cached_tokens, 1024 + 512);
    }

    #[test]
    fn a_small_lru_forgets_and_an_ample_one_matches_unbounded() {
        let trace = [
            request(1024, &[0, 1]),
            request(1024, &[2, 3]),
            request(1024, &[0, 1]),
        ];
        assert_eq!(shared_lru(&trace, 2).cached_tokens, 0);
        assert_eq!(shared_lru(&trace, 4), unbounded(&trace));
        // A prompt is never all cached: its last token is computed.
        assert_eq!(unbounded(&trace).cached_tokens, 1023);
    }
}
