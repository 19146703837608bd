//! The gateway's estimate of which prefix hashes each GPU server holds in its KV cache.
//!
//! Every routed request records its prefix hashes against the server that took it. For a new
//! request, [`PrefixIndex::matches`] answers, per server, how many of its *leading* hashes that
//! server was sent before: a lower bound on its cached prefix while the server has not evicted
//! it, and a guess after. Cache-aware policies read it through `cluster.prefix-matches`.
//!
//! Memory is bounded: entries live in two generations; when the current one reaches
//! `capacity / 2` entries the older generation is dropped, so the index keeps roughly the most
//! recently used `capacity / 2 ..= capacity` hashes (an LRU approximation without per-entry
//! bookkeeping). Servers are tracked by slot numbers 0..64 (a bitmask per hash); the pool gives
//! each server a slot for as long as it lives, and a pool with more than 64 servers simply gets
//! no estimate for the rest. Servers that report their own cache (see [`crate::kv_view`]) are
//! matched by that report instead; this estimate answers for the others. This module does no
//! I/O.

use std::collections::HashMap;
use std::sync::Mutex;

/// Default number of prefix hashes remembered (about 40 bytes each: ~40 MiB at most).
pub const DEFAULT_PREFIX_INDEX_CAPACITY: usize = 1 << 20;
/// Servers that can be tracked (bits in a mask).
pub const MAX_TRACKED_SERVERS: usize = 64;

#[derive(Debug, Default)]
struct Generations {
    current: HashMap<u64, u64>,
    previous: HashMap<u64, u64>,
}

impl Generations {
    fn get(&self, hash: u64) -> u64 {
        self.current.get(&hash).copied().unwrap_or(0)
            | self.previous.get(&hash).copied().unwrap_or(0)
    }
}

/// Prefix hash → servers that were sent it.
#[derive(Debug)]
pub struct PrefixIndex {
    generations: Mutex<Generations>,
    generation_capacity: usize,
}

impl PrefixIndex {
    /// An index remembering about `capacity` hashes.
    pub fn new(capacity: usize) -> Self {
        Self {
            generations: Mutex::new(Generations::default()),
            generation_capacity: (capacity / 2).max(1),
        }
    }

    /// Records that the server in `slot` was sent a prompt with these prefix hashes.
    pub fn record(&self, slot: usize, hashes: &[u64]) {
        if slot >= MAX_TRACKED_SERVERS || hashes.is_empty() {
            return;
        }
        let bit = 1u64 << slot;
        let mut g = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        for &hash in hashes {
            let carried = g.previous.get(&hash).copied().unwrap_or(0);
            *g.current.entry(hash).or_insert(carried) |= bit;
        }
        if g.current.len() >= self.generation_capacity {
            g.previous = std::mem::take(&mut g.current);
        }
    }

    /// Forgets a server slot everywhere (it left the pool; its slot may be reused).
    pub fn forget(&self, slot: usize) {
        if slot >= MAX_TRACKED_SERVERS {
            return;
        }
        let mask = !(1u64 << slot);
        let mut g = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        let Generations { current, previous } = &mut *g;
        for map in [current, previous] {
            map.retain(|_, bits| {
                *bits &= mask;
                *bits != 0
            });
        }
    }

    /// For each server slot, how many leading `hashes` it was sent: `(slot, count)`, count > 0.
    pub fn matches(&self, hashes: &[u64]) -> Vec<(usize, u32)> {
        let mut counts = [0u32; MAX_TRACKED_SERVERS];
        let mut alive = u64::MAX;
        {
            let g = self.generations.lock().unwrap_or_else(|e| e.into_inner());
            for (i, &hash) in hashes.iter().enumerate() {
                alive &= g.get(hash);
                if alive == 0 {
                    break;
                }
                let mut bits = alive;
                while bits != 0 {
                    let slot = bits.trailing_zeros() as usize;
                    counts[slot] = i as u32 + 1;
                    bits &= bits - 1;
                }
            }
        }
        counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(slot, c)| (slot, *c))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_leading_hashes_per_server() {
        let index = PrefixIndex::new(1000);
        index.record(0, &[1, 2, 3, 4]);
        index.record(2, &[1, 2, 9]);
        assert_eq!(index.matches(&[1, 2, 3, 4, 5]), vec![(0, 4), (2, 2)]);
        assert_eq!(index.matches(&[1, 2, 9]), vec![(0, 2), (2, 3)]);
        // Only leading runs count: a hash in the middle alone is no match.
        assert_eq!(index.matches(&[7, 2, 3]), vec![]);
    }

    #[test]
    fn forgetting_a_server_clears_its_bits() {
        let index = PrefixIndex::new(1000);
        index.record(1, &[5, 6]);
        index.record(3, &[5]);
        index.forget(1);
        assert_eq!(index.matches(&[5, 6]), vec![(3, 1)]);
    }

    #[test]
    fn memory_is_bounded_and_recent_hashes_survive() {
        let index = PrefixIndex::new(100);
        for h in 0..1000u64 {
            index.record(0, &[h]);
        }
        let g = index.generations.lock().unwrap();
        assert!(g.current.len() + g.previous.len() <= 100);
        drop(g);
        assert_eq!(index.matches(&[999]), vec![(0, 1)]);
        assert_eq!(index.matches(&[0]), vec![]);
    }

    #[test]
    fn out_of_range_slots_are_ignored() {
        let index = PrefixIndex::new(10);
        index.record(64, &[1]);
        assert!(index.matches(&[1]).is_empty());
    }
}
