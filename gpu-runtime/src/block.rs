//! The paged KV cache's block manager, with prefix caching.
//!
//! This module owns the bookkeeping of KV-cache blocks: a fixed pool of [`BLOCK_SIZE`]-token
//! blocks, their reference counts, one block table per sequence, and the prefix cache that lets
//! a new sequence reuse blocks another sequence already computed. It knows token ids and block
//! ids only; it must not touch the KV tensors themselves (an executor owns those and addresses
//! them through the block tables), and it makes no scheduling decision (that is
//! [`crate::scheduler`]'s job): it answers "how much of this prompt is cached?", "is there room?"
//! and does what it is told.
//!
//! The layout follows vLLM v1 (see RUNTIME-NOTES.md, "How serving engines lay out the paged
//! cache"):
//!
//! - a block is identified in the prefix cache by a **chained hash**: xxh3 over the parent
//!   block's hash and the block's 16 token ids, so equal hashes mean equal whole prefixes;
//! - only **full** blocks whose KV is **computed** are registered in the cache;
//! - a freed block keeps its hash and stays hittable in an LRU of unreferenced cached blocks
//!   until the pool needs it back; plain free blocks (never hashed) are handed out first, then
//!   the least recently used cached block is evicted;
//! - a prefix match is capped so that at least the prompt's last token is always computed (the
//!   executor needs its logits to sample the first output token).
//!
//! Beyond vLLM, a block being computed right now is **pending**: its would-be hash is known from
//! the token ids, so [`BlockManager::match_prefix`] can tell the scheduler that a prompt's prefix
//! is in flight, and the scheduler can wait for it instead of computing it a second time.
//!
//! Invariant: every block is in exactly one of three states — used (referenced by at least one
//! sequence), cached (unreferenced, registered, in the LRU) or free (unreferenced, no hash) — so
//! `used + cached + free == total` at all times.

use std::collections::{BTreeMap, HashMap};

use xxhash_rust::xxh3::xxh3_64;

/// Tokens per KV-cache block.
///
/// 16 is vLLM's default block size on CUDA and the unit in which DESIGN.md counts the simulated
/// server's cache (~26k blocks of 16); it keeps internal fragmentation to at most 15 tokens per
/// sequence while keeping block tables short.
pub const BLOCK_SIZE: usize = 16;

/// The value hashed in place of a parent hash for a sequence's first block.
///
/// Any fixed value works; it only has to be the same for every sequence. These are the ASCII
/// bytes of "RINGMSTR".
const ROOT_PARENT_HASH: u64 = 0x5249_4E47_4D53_5452;

/// Number of blocks needed to hold `tokens` tokens.
pub fn blocks_for(tokens: usize) -> usize {
    tokens.div_ceil(BLOCK_SIZE)
}

/// One block of the KV pool, by index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

/// The chained hash of a full block: it identifies the block's tokens and every token before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockHash(pub u64);

/// A sequence (one request's prompt plus its generated tokens) as the engine tracks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

impl std::fmt::Display for SeqId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "seq-{}", self.0)
    }
}

/// Hashes one full block given its parent's hash (`None` for a sequence's first block).
///
/// # Panics
///
/// In debug builds, if `tokens` is not exactly [`BLOCK_SIZE`] long.
pub fn chain_hash(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    debug_assert_eq!(tokens.len(), BLOCK_SIZE, "only full blocks are hashed");
    let mut buf = [0u8; 8 + 4 * BLOCK_SIZE];
    buf[..8].copy_from_slice(&parent.map_or(ROOT_PARENT_HASH, |h| h.0).to_le_bytes());
    for (i, t) in tokens.iter().enumerate() {
        buf[8 + 4 * i..12 + 4 * i].copy_from_slice(&t.to_le_bytes());
    }
    BlockHash(xxh3_64(&buf))
}

/// The chained hashes of every full block of `tokens` (a trailing partial block has none).
pub fn block_hashes(tokens: &[u32]) -> Vec<BlockHash> {
    let mut hashes: Vec<BlockHash> = Vec::with_capacity(tokens.len() / BLOCK_SIZE);
    for chunk in tokens.chunks_exact(BLOCK_SIZE) {
        let h = chain_hash(hashes.last().copied(), chunk);
        hashes.push(h);
    }
    hashes
}

/// The answer to "how much of this prompt can be reused?".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Leading blocks whose KV is computed and registered: reusable as they are.
    pub cached_blocks: usize,
    /// The block right after the cached ones is being computed by a running sequence now:
    /// waiting for it saves computing it twice.
    pub blocked_by_pending: bool,
}

impl PrefixMatch {
    /// Tokens covered by the cached blocks.
    pub fn cached_tokens(&self) -> usize {
        self.cached_blocks * BLOCK_SIZE
    }
}

/// Not enough blocks, even after evicting every unreferenced cached block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("KV cache out of blocks: {needed} needed, {available} available")]
pub struct OutOfBlocks {
    /// Blocks the operation needed.
    pub needed: usize,
    /// Blocks that were free or evictable.
    pub available: usize,
}

/// Cumulative prefix-cache counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Blocks looked up at allocation (full prompt blocks within the match cap).
    pub queried_blocks: u64,
    /// Of those, blocks reused from the cache.
    pub hit_blocks: u64,
    /// Cached blocks evicted to make room.
    pub evictions: u64,
}

#[derive(Clone, Debug, Default)]
struct BlockMeta {
    ref_count: u32,
    /// Registered hash: set once the block is full and computed; kept after it is freed.
    hash: Option<BlockHash>,
    /// Would-be hash while a sequence computes this full block.
    pending: Option<BlockHash>,
    /// Position in the LRU while the block is cached and unreferenced.
    lru_tick: Option<u64>,
}

#[derive(Clone, Debug, Default)]
struct SeqBlocks {
    table: Vec<BlockId>,
    /// Chained hashes of the sequence's full blocks known so far.
    hashes: Vec<BlockHash>,
    /// Leading blocks already registered in the prefix cache (or found there).
    registered: usize,
}

/// A change to what the prefix cache holds, by the block's chained hash: what a router outside
/// the engine needs to know which prefixes this server can serve from cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvEvent {
    /// A full, computed block was registered in the prefix cache.
    Stored(StoredBlock),
    /// A cached block was reused for new content; its prefix is gone.
    Evicted(BlockHash),
}

impl KvEvent {
    /// The block's hash.
    pub fn hash(&self) -> BlockHash {
        match self {
            Self::Stored(stored) => stored.hash,
            Self::Evicted(hash) => *hash,
        }
    }
}

/// A block registered in the prefix cache, with what an engine's event stream says of it
/// (vLLM's `BlockStored`): the block before it in its sequence and its tokens, so a router
/// that keys blocks by its own hash of the tokens can place it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StoredBlock {
    /// Its chained hash.
    pub hash: BlockHash,
    /// The hash of the block before it (`None` for a prompt's first block).
    pub parent: Option<BlockHash>,
    /// Its tokens.
    pub tokens: [u32; BLOCK_SIZE],
}

/// The pool of KV blocks, the sequences' block tables and the prefix cache.
#[derive(Debug)]
pub struct BlockManager {
    blocks: Vec<BlockMeta>,
    /// Unreferenced blocks without a hash; used before any cached block is evicted.
    free: Vec<BlockId>,
    /// Unreferenced cached blocks by the tick they were freed at: oldest first.
    lru: BTreeMap<u64, BlockId>,
    next_tick: u64,
    /// Registered blocks (referenced or not) by hash.
    cached: HashMap<BlockHash, BlockId>,
    /// Blocks being computed, by their would-be hash.
    pending: HashMap<BlockHash, BlockId>,
    seqs: HashMap<SeqId, SeqBlocks>,
    used: usize,
    stats: PrefixCacheStats,
    /// Changes to the prefix cache since [`BlockManager::take_events`] last ran.
    events: Vec<KvEvent>,
}

impl BlockManager {
    /// A pool of `num_blocks` free blocks.
    pub fn new(num_blocks: u32) -> Self {
        let n = num_blocks as usize;
        Self {
            blocks: vec![BlockMeta::default(); n],
            // Reversed so that blocks are handed out in ascending order (a stack pops the end).
            free: (0..num_blocks).rev().map(BlockId).collect(),
            lru: BTreeMap::new(),
            next_tick: 0,
            cached: HashMap::new(),
            pending: HashMap::new(),
            seqs: HashMap::new(),
            used: 0,
            stats: PrefixCacheStats::default(),
            events: Vec::new(),
        }
    }

    /// Blocks in the pool.
    pub fn total_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks referenced by at least one sequence.
    pub fn used_blocks(&self) -> usize {
        self.used
    }

    /// Unreferenced blocks that are still hittable in the prefix cache.
    pub fn cached_blocks(&self) -> usize {
        self.lru.len()
    }

    /// Unreferenced blocks without a hash.
    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Blocks an allocation could obtain now: free plus evictable cached blocks.
    pub fn available_blocks(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// Cumulative prefix-cache counters.
    pub fn stats(&self) -> PrefixCacheStats {
        self.stats
    }

    /// The block table of `seq`, if it holds blocks.
    pub fn block_table(&self, seq: SeqId) -> Option<&[BlockId]> {
        self.seqs.get(&seq).map(|s| s.table.as_slice())
    }

    /// Whether the KV of a block with this hash is computed and registered.
    pub fn is_cached(&self, hash: BlockHash) -> bool {
        self.cached.contains_key(&hash)
    }

    /// Whether a block with this hash is being computed now.
    pub fn is_pending(&self, hash: BlockHash) -> bool {
        self.pending.contains_key(&hash)
    }

    /// The longest reusable prefix of a sequence of `num_tokens` tokens whose full blocks hash
    /// to `hashes`.
    ///
    /// The match is capped at `(num_tokens - 1) / BLOCK_SIZE` blocks, so at least the last
    /// token is always computed. The walk stops at the first block that is not cached; if that
    /// block is pending, the result says so.
    pub fn match_prefix(&self, hashes: &[BlockHash], num_tokens: usize) -> PrefixMatch {
        let cap = (num_tokens.saturating_sub(1) / BLOCK_SIZE).min(hashes.len());
        let mut cached_blocks = 0;
        for h in &hashes[..cap] {
            if self.cached.contains_key(h) {
                cached_blocks += 1;
            } else {
                return PrefixMatch {
                    cached_blocks,
                    blocked_by_pending: self.pending.contains_key(h),
                };
            }
        }
        PrefixMatch {
            cached_blocks,
            blocked_by_pending: false,
        }
    }

    /// New blocks a sequence of `num_tokens` tokens needs given `matched`, plus
    /// `headroom_blocks`, and the blocks that would be available for them (free plus evictable,
    /// not counting the matched blocks that sit in the LRU: reusing them takes them out of it).
    fn plan(
        &self,
        hashes: &[BlockHash],
        num_tokens: usize,
        matched: PrefixMatch,
        headroom_blocks: usize,
    ) -> (usize, usize) {
        let needed = blocks_for(num_tokens) - matched.cached_blocks + headroom_blocks;
        let hits_in_lru = hashes[..matched.cached_blocks]
            .iter()
            .filter(|h| {
                self.cached
                    .get(h)
                    .is_some_and(|b| self.blocks[b.0 as usize].ref_count == 0)
            })
            .count();
        (needed, self.available_blocks() - hits_in_lru)
    }

    /// Whether [`allocate`](Self::allocate) with these arguments (and `headroom_blocks` more
    /// blocks to spare) would succeed now.
    pub fn can_allocate(
        &self,
        hashes: &[BlockHash],
        num_tokens: usize,
        matched: PrefixMatch,
        headroom_blocks: usize,
    ) -> bool {
        let (needed, available) = self.plan(hashes, num_tokens, matched, headroom_blocks);
        needed <= available
    }

    /// Gives `seq` a block table for `num_tokens` tokens whose full blocks hash to `hashes`,
    /// reusing the `matched.cached_blocks` leading cached blocks (from
    /// [`match_prefix`](Self::match_prefix), with no change to the manager in between).
    ///
    /// The full blocks after the reused ones become pending under their would-be hash until
    /// [`commit_computed`](Self::commit_computed) registers them. Returns the number of tokens
    /// reused. On error nothing changes.
    ///
    /// # Panics
    ///
    /// If `seq` already holds blocks.
    pub fn allocate(
        &mut self,
        seq: SeqId,
        hashes: &[BlockHash],
        num_tokens: usize,
        matched: PrefixMatch,
    ) -> Result<usize, OutOfBlocks> {
        assert!(
            !self.seqs.contains_key(&seq),
            "{seq} already holds KV blocks"
        );
        let (needed, available) = self.plan(hashes, num_tokens, matched, 0);
        if needed > available {
            return Err(OutOfBlocks { needed, available });
        }
        let cap = num_tokens.saturating_sub(1) / BLOCK_SIZE;
        self.stats.queried_blocks += cap.min(hashes.len()) as u64;
        self.stats.hit_blocks += matched.cached_blocks as u64;

        let mut table = Vec::with_capacity(blocks_for(num_tokens));
        // Reference the hits first, so that allocating the rest cannot evict them.
        for h in &hashes[..matched.cached_blocks] {
            let b = self.cached[h];
            self.acquire(b);
            table.push(b);
        }
        for i in matched.cached_blocks..blocks_for(num_tokens) {
            let b = self
                .take_block()
                .expect("plan() counted enough free and evictable blocks");
            if let Some(&h) = hashes.get(i)
                && !self.pending.contains_key(&h)
                && !self.cached.contains_key(&h)
            {
                self.pending.insert(h, b);
                self.blocks[b.0 as usize].pending = Some(h);
            }
            table.push(b);
        }
        self.seqs.insert(
            seq,
            SeqBlocks {
                table,
                hashes: hashes.to_vec(),
                registered: matched.cached_blocks,
            },
        );
        Ok(matched.cached_tokens())
    }

    /// Grows `seq`'s block table to hold `num_tokens` tokens, evicting cached blocks if no
    /// free block is left. On error nothing changes.
    ///
    /// # Panics
    ///
    /// If `seq` holds no blocks.
    pub fn ensure_capacity(&mut self, seq: SeqId, num_tokens: usize) -> Result<(), OutOfBlocks> {
        let have = self.seqs[&seq].table.len();
        let needed = blocks_for(num_tokens).saturating_sub(have);
        if needed > self.available_blocks() {
            return Err(OutOfBlocks {
                needed,
                available: self.available_blocks(),
            });
        }
        for _ in 0..needed {
            let b = self.take_block().expect("checked available blocks");
            self.seqs
                .get_mut(&seq)
                .expect("checked above")
                .table
                .push(b);
        }
        Ok(())
    }

    /// Records that the first `num_computed` of `tokens` (the sequence's whole token list so
    /// far) have their KV computed, and registers every newly full, computed block in the
    /// prefix cache (turning pending blocks into cached ones).
    ///
    /// If another block with the same hash was registered first, this block stays unhashed
    /// and is reclaimed as a plain free block when the sequence releases it.
    pub fn commit_computed(&mut self, seq: SeqId, tokens: &[u32], num_computed: usize) {
        let Some(s) = self.seqs.get_mut(&seq) else {
            return;
        };
        let full = (num_computed.min(tokens.len()) / BLOCK_SIZE).min(s.table.len());
        while s.registered < full {
            let i = s.registered;
            let hash = match s.hashes.get(i) {
                Some(&h) => h,
                None => {
                    let parent = i.checked_sub(1).map(|p| s.hashes[p]);
                    let h = chain_hash(parent, &tokens[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE]);
                    s.hashes.push(h);
                    h
                }
            };
            let b = s.table[i];
            let meta = &mut self.blocks[b.0 as usize];
            if let Some(p) = meta.pending.take()
                && self.pending.get(&p) == Some(&b)
            {
                self.pending.remove(&p);
            }
            if meta.hash.is_none() && !self.cached.contains_key(&hash) {
                meta.hash = Some(hash);
                self.cached.insert(hash, b);
                let mut block = [0; BLOCK_SIZE];
                block.copy_from_slice(&tokens[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE]);
                self.events.push(KvEvent::Stored(StoredBlock {
                    hash,
                    parent: i.checked_sub(1).map(|p| s.hashes[p]),
                    tokens: block,
                }));
            }
            s.registered += 1;
        }
    }

    /// Releases every block of `seq`. Blocks nobody references any more go to the LRU if they
    /// are registered (newest last, tail blocks of the sequence before its head so that shared
    /// prefixes outlive private suffixes) or to the free list otherwise. A no-op for a
    /// sequence without blocks.
    pub fn free(&mut self, seq: SeqId) {
        let Some(s) = self.seqs.remove(&seq) else {
            return;
        };
        for &b in s.table.iter().rev() {
            let meta = &mut self.blocks[b.0 as usize];
            meta.ref_count -= 1;
            if meta.ref_count > 0 {
                continue;
            }
            self.used -= 1;
            if let Some(p) = meta.pending.take()
                && self.pending.get(&p) == Some(&b)
            {
                self.pending.remove(&p);
            }
            if meta.hash.is_some() {
                let tick = self.next_tick;
                self.next_tick += 1;
                meta.lru_tick = Some(tick);
                self.lru.insert(tick, b);
            } else {
                self.free.push(b);
            }
        }
    }

    /// The registered blocks of `seq` among its first `prompt_blocks` (a prompt's full
    /// blocks), in order, each with its chained hash, its parent's and its tokens (taken from
    /// `tokens`): what a prefill hands a decode engine. Stops at the first block that is not
    /// registered.
    pub fn registered_blocks(
        &self,
        seq: SeqId,
        tokens: &[u32],
        prompt_blocks: usize,
    ) -> Vec<(StoredBlock, BlockId)> {
        let Some(s) = self.seqs.get(&seq) else {
            return Vec::new();
        };
        let n = s.registered.min(prompt_blocks).min(s.hashes.len());
        (0..n)
            .map_while(|i| {
                let chunk = tokens.get(i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE)?;
                let mut block = [0; BLOCK_SIZE];
                block.copy_from_slice(chunk);
                Some((
                    StoredBlock {
                        hash: s.hashes[i],
                        parent: i.checked_sub(1).map(|p| s.hashes[p]),
                        tokens: block,
                    },
                    s.table[i],
                ))
            })
            .collect()
    }

    /// Registers blocks another engine computed (a prefill's, handed over for a decode), in
    /// order: each one not cached here gets a block of its own, unreferenced and cached as
    /// if a finished sequence had left it (the tail before the head in the LRU), published
    /// like a computed block. Stops at the first one there is no room for without evicting
    /// one of these, or whose parent is not cached (the rest are computed again). Returns
    /// the blocks whose contents must be written, each with its index in `blocks`.
    pub fn import(&mut self, blocks: &[StoredBlock]) -> Vec<(usize, BlockId)> {
        let mut written = Vec::new();
        for (i, block) in blocks.iter().enumerate() {
            if self.cached.contains_key(&block.hash) {
                continue;
            }
            if block
                .parent
                .is_some_and(|parent| !self.cached.contains_key(&parent))
            {
                break;
            }
            // Never evict what this import just registered: those are not in the LRU yet.
            let Some(b) = self.take_block() else {
                break;
            };
            let meta = &mut self.blocks[b.0 as usize];
            meta.ref_count = 0;
            meta.hash = Some(block.hash);
            self.used -= 1;
            self.cached.insert(block.hash, b);
            self.events.push(KvEvent::Stored(*block));
            written.push((i, b));
        }
        for &(_, b) in written.iter().rev() {
            let tick = self.next_tick;
            self.next_tick += 1;
            self.blocks[b.0 as usize].lru_tick = Some(tick);
            self.lru.insert(tick, b);
        }
        written
    }

    /// The prefix-cache changes since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }

    /// References `b`, taking it out of the LRU if it was unreferenced.
    fn acquire(&mut self, b: BlockId) {
        let meta = &mut self.blocks[b.0 as usize];
        if meta.ref_count == 0 {
            if let Some(tick) = meta.lru_tick.take() {
                self.lru.remove(&tick);
            }
            self.used += 1;
        }
        meta.ref_count += 1;
    }

    /// A block for new content, referenced once: a plain free block if any, else the least
    /// recently used cached block (whose hash is dropped).
    fn take_block(&mut self) -> Option<BlockId> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.lru.pop_first()?;
                let meta = &mut self.blocks[b.0 as usize];
                meta.lru_tick = None;
                if let Some(h) = meta.hash.take()
                    && self.cached.get(&h) == Some(&b)
                {
                    self.cached.remove(&h);
                    self.events.push(KvEvent::Evicted(h));
                }
                self.stats.evictions += 1;
                b
            }
        };
        let meta = &mut self.blocks[b.0 as usize];
        debug_assert_eq!(meta.ref_count, 0);
        meta.ref_count = 1;
        self.used += 1;
        Some(b)
    }

    /// Checks the manager's internal invariants; for tests.
    #[cfg(test)]
    pub(crate) fn assert_consistent(&self) {
        assert_eq!(
            self.used + self.lru.len() + self.free.len(),
            self.blocks.len(),
            "used + cached + free == total"
        );
        let mut refs = vec![0u32; self.blocks.len()];
        for s in self.seqs.values() {
            for b in &s.table {
                refs[b.0 as usize] += 1;
            }
        }
        for (i, meta) in self.blocks.iter().enumerate() {
            assert_eq!(meta.ref_count, refs[i], "ref count of block {i}");
            assert_eq!(
                meta.lru_tick.is_some(),
                meta.ref_count == 0 && meta.hash.is_some()
            );
        }
        for (h, b) in &self.cached {
            assert_eq!(self.blocks[b.0 as usize].hash, Some(*h));
        }
        for (h, b) in &self.pending {
            assert_eq!(self.blocks[b.0 as usize].pending, Some(*h));
            assert!(self.blocks[b.0 as usize].ref_count > 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn toks(start: u32, n: usize) -> Vec<u32> {
        (start..start + n as u32).collect()
    }

    /// Allocates `tokens` for `seq` with whatever prefix is cached; returns the tokens reused.
    fn alloc(bm: &mut BlockManager, seq: u64, tokens: &[u32]) -> usize {
        let hashes = block_hashes(tokens);
        let m = bm.match_prefix(&hashes, tokens.len());
        bm.allocate(SeqId(seq), &hashes, tokens.len(), m).unwrap()
    }

    #[test]
    fn chained_hashes_depend_on_the_whole_prefix() {
        let a = toks(0, 48);
        let mut b = a.clone();
        b[0] = 999; // differs only in the first block
        let (ha, hb) = (block_hashes(&a), block_hashes(&b));
        assert_eq!(ha.len(), 3);
        assert!(
            ha.iter().zip(&hb).all(|(x, y)| x != y),
            "a changed first block changes every hash"
        );
        assert_eq!(
            block_hashes(&a[..47]).len(),
            2,
            "partial blocks are not hashed"
        );
        assert_eq!(block_hashes(&a), ha, "deterministic");
        assert_eq!(ha[1], chain_hash(Some(ha[0]), &a[16..32]));
    }

    #[test]
    fn ref_counts_follow_sharing() {
        let mut bm = BlockManager::new(10);
        let p = toks(0, 40);
        assert_eq!(alloc(&mut bm, 1, &p), 0);
        bm.commit_computed(SeqId(1), &p, 40);
        // Same prompt again: two full blocks cached, capped below 40 tokens (39 / 16 = 2).
        assert_eq!(alloc(&mut bm, 2, &p), 32);
        assert_eq!(bm.used_blocks(), 4, "2 shared + 1 private each");
        assert_eq!(
            bm.block_table(SeqId(1)).unwrap()[..2],
            bm.block_table(SeqId(2)).unwrap()[..2]
        );
        bm.free(SeqId(1));
        assert_eq!(bm.used_blocks(), 3, "shared blocks survive the first free");
        bm.free(SeqId(2));
        assert_eq!(bm.used_blocks(), 0);
        assert_eq!(bm.cached_blocks(), 2);
        assert_eq!(bm.free_blocks(), 8);
        bm.assert_consistent();
    }

    #[test]
    fn prefix_hits_across_sequences_and_counts_them() {
        let mut bm = BlockManager::new(20);
        let system = toks(1000, 64);
        let mut a = system.clone();
        a.extend(toks(1, 10));
        let mut b = system.clone();
        b.extend(toks(500, 30));
        alloc(&mut bm, 1, &a);
        bm.commit_computed(SeqId(1), &a, a.len());
        assert_eq!(alloc(&mut bm, 2, &b), 64);
        let stats = bm.stats();
        assert_eq!(stats.hit_blocks, 4);
        assert_eq!(
            stats.queried_blocks,
            4 + 5,
            "a: 73 tokens -> 4 queried; b: 94 -> 5"
        );
        bm.assert_consistent();
    }

    #[test]
    fn match_is_capped_so_the_last_token_is_computed() {
        let mut bm = BlockManager::new(10);
        let p = toks(0, 32); // exactly two full blocks
        alloc(&mut bm, 1, &p);
        bm.commit_computed(SeqId(1), &p, 32);
        let m = bm.match_prefix(&block_hashes(&p), 32);
        assert_eq!(m.cached_blocks, 1, "cap = (32 - 1) / 16 = 1");
        assert_eq!(
            bm.match_prefix(&block_hashes(&p[..17]), 17).cached_blocks,
            1
        );
        assert_eq!(
            bm.match_prefix(&block_hashes(&p[..16]), 16).cached_blocks,
            0
        );
        let mut longer = p.clone();
        longer.push(7);
        assert_eq!(bm.match_prefix(&block_hashes(&longer), 33).cached_blocks, 2);
    }

    #[test]
    fn uncomputed_blocks_are_not_hittable() {
        let mut bm = BlockManager::new(10);
        let p = toks(0, 48);
        alloc(&mut bm, 1, &p);
        bm.commit_computed(SeqId(1), &p, 20); // only the first block is done
        let m = bm.match_prefix(&block_hashes(&p), 48);
        assert_eq!(m.cached_blocks, 1);
        assert!(m.blocked_by_pending, "the second block is being computed");
    }

    #[test]
    fn freed_blocks_stay_hittable_until_reallocated() {
        let mut bm = BlockManager::new(4);
        let p = toks(0, 33);
        alloc(&mut bm, 1, &p);
        bm.commit_computed(SeqId(1), &p, 33);
        bm.free(SeqId(1));
        assert_eq!(
            (bm.used_blocks(), bm.cached_blocks(), bm.free_blocks()),
            (0, 2, 2)
        );
        assert_eq!(alloc(&mut bm, 2, &p), 32, "hit after free");
        bm.free(SeqId(2));
        // Fill the pool with unrelated content: the two plain free blocks go first, then the
        // cached ones are evicted.
        let q = toks(5000, 64);
        alloc(&mut bm, 3, &q);
        assert_eq!(bm.cached_blocks(), 0);
        assert_eq!(bm.stats().evictions, 2);
        bm.free(SeqId(3));
        assert_eq!(bm.match_prefix(&block_hashes(&p), 33).cached_blocks, 0);
        bm.assert_consistent();
    }

    #[test]
    fn plain_free_blocks_are_used_before_evicting() {
        let mut bm = BlockManager::new(6);
        let p = toks(0, 32);
        alloc(&mut bm, 1, &p);
        bm.commit_computed(SeqId(1), &p, 32);
        bm.free(SeqId(1));
        alloc(&mut bm, 2, &toks(100, 64)); // 4 blocks: exactly the 4 plain free ones
        assert_eq!(bm.cached_blocks(), 2);
        assert_eq!(bm.stats().evictions, 0);
        assert_eq!(
            bm.match_prefix(&block_hashes(&toks(0, 40)), 40)
                .cached_blocks,
            2
        );
    }

    #[test]
    fn the_cache_reports_blocks_stored_and_evicted_by_hash() {
        let mut bm = BlockManager::new(3);
        let a = toks(0, 17);
        alloc(&mut bm, 1, &a);
        assert!(bm.take_events().is_empty(), "nothing registered yet");
        bm.commit_computed(SeqId(1), &a, 17);
        let stored = block_hashes(&a)[0];
        let mut first = [0; BLOCK_SIZE];
        first.copy_from_slice(&a[..BLOCK_SIZE]);
        assert_eq!(
            bm.take_events(),
            [KvEvent::Stored(StoredBlock {
                hash: stored,
                parent: None,
                tokens: first,
            })]
        );
        assert!(bm.take_events().is_empty(), "taking drains");
        bm.free(SeqId(1));
        // Three new blocks: the two plain free ones, then a's cached block is evicted.
        alloc(&mut bm, 2, &toks(900, 33));
        assert_eq!(bm.take_events(), [KvEvent::Evicted(stored)]);
        bm.assert_consistent();
    }

    #[test]
    fn eviction_takes_the_least_recently_used_first() {
        let mut bm = BlockManager::new(4);
        let (a, b) = (toks(0, 17), toks(100, 17));
        alloc(&mut bm, 1, &a);
        bm.commit_computed(SeqId(1), &a, 17);
        alloc(&mut bm, 2, &b);
        bm.commit_computed(SeqId(2), &b, 17);
        bm.free(SeqId(1)); // a's block freed first: older
        bm.free(SeqId(2));
        // Touch a again: it becomes the most recently used once freed.
        alloc(&mut bm, 3, &a);
        bm.free(SeqId(3));
        // Need 3 new blocks: 2 plain free + 1 eviction, which must be b's.
        alloc(&mut bm, 4, &toks(900, 33));
        assert_eq!(
            bm.match_prefix(&block_hashes(&b), 17).cached_blocks,
            0,
            "b evicted"
        );
        assert_eq!(
            bm.match_prefix(&block_hashes(&a), 17).cached_blocks,
            1,
            "a kept"
        );
        bm.assert_consistent();
    }

    #[test]
    fn a_sequence_tail_is_evicted_before_its_head() {
        let mut bm = BlockManager::new(3);
        let p = toks(0, 48);
        alloc(&mut bm, 1, &p);
        bm.commit_computed(SeqId(1), &p, 48);
        bm.free(SeqId(1));
        alloc(&mut bm, 2, &toks(900, 16)); // evicts one block: the last one
        assert_eq!(bm.match_prefix(&block_hashes(&p), 48).cached_blocks, 2);
    }

    #[test]
    fn pending_blocks_dedup_in_flight_prefixes() {
        let mut bm = BlockManager::new(20);
        let p = toks(0, 70);
        alloc(&mut bm, 1, &p);
        let hashes = block_hashes(&p);
        assert!(
            hashes.iter().all(|h| bm.is_pending(*h)),
            "all 4 full blocks pending"
        );
        let m = bm.match_prefix(&hashes, 70);
        assert_eq!(
            m,
            PrefixMatch {
                cached_blocks: 0,
                blocked_by_pending: true
            }
        );
        bm.commit_computed(SeqId(1), &p, 70);
        assert!(
            hashes
                .iter()
                .all(|h| bm.is_cached(*h) && !bm.is_pending(*h))
        );
        let m = bm.match_prefix(&hashes, 70);
        assert_eq!(
            m,
            PrefixMatch {
                cached_blocks: 4,
                blocked_by_pending: false
            }
        );
        bm.assert_consistent();
    }

    #[test]
    fn freeing_a_computing_sequence_clears_its_pending_blocks() {
        let mut bm = BlockManager::new(20);
        let p = toks(0, 70);
        alloc(&mut bm, 1, &p);
        bm.free(SeqId(1));
        let m = bm.match_prefix(&block_hashes(&p), 70);
        assert_eq!(
            m,
            PrefixMatch {
                cached_blocks: 0,
                blocked_by_pending: false
            }
        );
        assert_eq!(
            bm.free_blocks(),
            20,
            "never-computed blocks return as plain free blocks"
        );
        bm.assert_consistent();
    }

    #[test]
    fn decode_filled_blocks_are_registered() {
        let mut bm = BlockManager::new(10);
        let mut t = toks(0, 10);
        alloc(&mut bm, 1, &t);
        for next in 100..120 {
            t.push(next);
            bm.ensure_capacity(SeqId(1), t.len()).unwrap();
            bm.commit_computed(SeqId(1), &t, t.len() - 1);
        }
        assert_eq!(bm.match_prefix(&block_hashes(&t), t.len()).cached_blocks, 1);
        bm.assert_consistent();
    }

    #[test]
    fn duplicate_computation_keeps_the_first_registration() {
        let mut bm = BlockManager::new(10);
        let p = toks(0, 20);
        let h = block_hashes(&p);
        let m = bm.match_prefix(&h, 20);
        bm.allocate(SeqId(1), &h, 20, m).unwrap();
        bm.allocate(SeqId(2), &h, 20, m).unwrap(); // the scheduler would defer; force it
        bm.commit_computed(SeqId(1), &p, 20);
        bm.commit_computed(SeqId(2), &p, 20);
        bm.free(SeqId(2));
        bm.free(SeqId(1));
        assert_eq!(bm.cached_blocks(), 1);
        assert_eq!(bm.free_blocks(), 9);
        bm.assert_consistent();
    }

    #[test]
    fn imported_blocks_are_cached_unreferenced_and_published() {
        let mut prefill = BlockManager::new(16);
        let tokens = toks(0, 3 * BLOCK_SIZE + 5);
        alloc(&mut prefill, 1, &tokens);
        prefill.commit_computed(SeqId(1), &tokens, tokens.len());
        let handed: Vec<StoredBlock> = prefill
            .registered_blocks(SeqId(1), &tokens, tokens.len() / BLOCK_SIZE)
            .into_iter()
            .map(|(block, _)| block)
            .collect();
        assert_eq!(handed.len(), 3);
        let mut decode = BlockManager::new(16);
        // The first block is there already: only the other two are written.
        let head = &tokens[..BLOCK_SIZE];
        alloc(&mut decode, 7, head);
        decode.commit_computed(SeqId(7), head, BLOCK_SIZE);
        decode.free(SeqId(7));
        decode.take_events();
        let written = decode.import(&handed);
        assert_eq!(written.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(decode.used_blocks(), 0, "unreferenced");
        let events = decode.take_events();
        assert_eq!(events.len(), 2);
        assert!(events.iter().all(|e| matches!(e, KvEvent::Stored(_))));
        let hashes = block_hashes(&tokens);
        assert_eq!(decode.match_prefix(&hashes, tokens.len()).cached_blocks, 3);
        decode.assert_consistent();
        // The tail goes before the head when blocks are needed.
        let mut small = BlockManager::new(3);
        assert_eq!(small.import(&handed).len(), 3);
        alloc(&mut small, 9, &toks(1000, BLOCK_SIZE));
        assert!(small.is_cached(handed[0].hash) && !small.is_cached(handed[2].hash));
        small.assert_consistent();
    }

    #[test]
    fn an_import_stops_where_there_is_no_room_or_no_parent() {
        let mut prefill = BlockManager::new(16);
        let tokens = toks(0, 4 * BLOCK_SIZE);
        alloc(&mut prefill, 1, &tokens);
        prefill.commit_computed(SeqId(1), &tokens, tokens.len());
        let handed: Vec<StoredBlock> = prefill
            .registered_blocks(SeqId(1), &tokens, 4)
            .into_iter()
            .map(|(block, _)| block)
            .collect();
        let mut full = BlockManager::new(2);
        alloc(&mut full, 3, &toks(500, 2 * BLOCK_SIZE));
        assert!(full.import(&handed).is_empty(), "every block is referenced");
        full.assert_consistent();
        let mut orphan = BlockManager::new(8);
        assert!(
            orphan.import(&handed[1..]).is_empty(),
            "its parent is not cached"
        );
        let mut two = BlockManager::new(2);
        assert_eq!(two.import(&handed).len(), 2);
        two.assert_consistent();
    }

    #[test]
    fn out_of_blocks_changes_nothing() {
        let mut bm = BlockManager::new(2);
        let p = toks(0, 40);
        let h = block_hashes(&p);
        let m = bm.match_prefix(&h, 40);
        assert!(!bm.can_allocate(&h, 40, m, 0));
        assert_eq!(
            bm.allocate(SeqId(1), &h, 40, m),
            Err(OutOfBlocks {
                needed: 3,
                available: 2
            })
        );
        assert_eq!(bm.free_blocks(), 2);
        alloc(&mut bm, 2, &toks(0, 20));
        assert!(bm.ensure_capacity(SeqId(2), 33).is_err());
        assert_eq!(bm.block_table(SeqId(2)).unwrap().len(), 2);
        bm.assert_consistent();
    }

    #[derive(Clone, Debug)]
    enum Op {
        Alloc { seq: u64, prefix: u8, len: usize },
        Grow { seq: u64, extra: usize },
        Compute { seq: u64 },
        Free { seq: u64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..8, 0u8..3, 1usize..80).prop_map(|(seq, prefix, len)| Op::Alloc {
                seq,
                prefix,
                len
            }),
            (0u64..8, 1usize..20).prop_map(|(seq, extra)| Op::Grow { seq, extra }),
            (0u64..8).prop_map(|seq| Op::Compute { seq }),
            (0u64..8).prop_map(|seq| Op::Free { seq }),
        ]
    }

    proptest! {
        #[test]
        fn blocks_are_conserved(ops in prop::collection::vec(op(), 1..120)) {
            let mut bm = BlockManager::new(24);
            let mut live: HashMap<u64, Vec<u32>> = HashMap::new();
            for op in ops {
                match op {
                    Op::Alloc { seq, prefix, len } => {
                        if live.contains_key(&seq) { continue; }
                        // Prompts share one of three prefixes so that hits happen.
                        let tokens: Vec<u32> = (0..len as u32)
                            .map(|i| if i < 40 { u32::from(prefix) * 1000 + i } else { seq as u32 * 7919 + i })
                            .collect();
                        let h = block_hashes(&tokens);
                        let m = bm.match_prefix(&h, tokens.len());
                        let fits = bm.can_allocate(&h, tokens.len(), m, 0);
                        let r = bm.allocate(SeqId(seq), &h, tokens.len(), m);
                        prop_assert_eq!(fits, r.is_ok());
                        if r.is_ok() { live.insert(seq, tokens); }
                    }
                    Op::Grow { seq, extra } => {
                        if let Some(t) = live.get_mut(&seq) {
                            let new_len = t.len() + extra;
                            if bm.ensure_capacity(SeqId(seq), new_len).is_ok() {
                                t.extend((0..extra as u32).map(|i| 50_000 + i));
                            }
                        }
                    }
                    Op::Compute { seq } => {
                        if let Some(t) = live.get(&seq) {
                            bm.commit_computed(SeqId(seq), t, t.len());
                        }
                    }
                    Op::Free { seq } => {
                        bm.free(SeqId(seq));
                        live.remove(&seq);
                    }
                }
                prop_assert_eq!(bm.used_blocks() + bm.cached_blocks() + bm.free_blocks(), 24);
                bm.assert_consistent();
            }
            for seq in live.keys() {
                bm.free(SeqId(*seq));
            }
            prop_assert_eq!(bm.used_blocks(), 0);
            bm.assert_consistent();
        }
    }
}
