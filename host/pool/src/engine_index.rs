//! One engine's KV-cache events (vLLM's or SGLang's, decoded by `ringmaster-kv-events`) turned
//! into the blocks a [`ReportedCache`] holds: keyed by this gateway's own chained hash of each
//! block's token ids, never by the engine's hash.
//!
//! Why our own hash: the engine's hash depends on its algorithm, its seed (`PYTHONHASHSEED`,
//! `--prefix-caching-hash-algo`) and its block size; ours is what the gateway computes for a
//! request's prompt (`block::chain_hash` over [`BLOCK_SIZE`]-token blocks), so a stored block
//! and a prompt meet whatever the engine chose. The engine's hash is kept only to find what a
//! removal removes and to chain a stored block to its parent. An engine block of any size maps
//! onto ours: each engine block remembers where our chain stands after it (the last full block
//! of ours, and the tokens since), so 16-token, 32-token and 1-token (SGLang's default page)
//! engine blocks all index alike.
//!
//! A block's key also holds its LoRA adapter, its KV-cache group and any extra keys the engine
//! hashed with it (multimodal ids, cache salt) as a salt on the chain: a base-model prompt never
//! matches an adapter's blocks. A stored block whose parent was never seen (stored before the
//! gateway joined the stream, or lost in an unrepaired gap) is an orphan: its tokens cannot be
//! placed in a chain, so it is counted and passed over, as are its children.
//!
//! Pure state, no I/O, no locks of its own: the follower task owns one per server and hands
//! each batch's changes to the shared [`ReportedCache`] under one lock.

use std::collections::HashMap;

pub use ringmaster_gpu_runtime::BLOCK_SIZE;
use ringmaster_gpu_runtime::block::{BlockHash, chain_hash};
use ringmaster_kv_events::{Batch, BlockRemoved, BlockStored, EngineHash, Event};
use xxhash_rust::xxh3::{xxh3_64_with_seed, xxh3_128};

use crate::kv_view::ReportedCache;

/// Engine blocks one server's index may hold before it is cleared as runaway (an H200 running
/// a small model holds about a million 16-token blocks; an engine that never removes anything
/// or a hostile publisher must not grow the gateway without bound).
pub const MAX_INDEXED_BLOCKS: usize = 1 << 22;

/// The salt of a chain: 0 for the base model's first KV group with no extra keys, so that a
/// plain prompt's hashes are exactly `block::block_hashes`'.
pub fn chain_salt(lora_name: Option<&str>, group_idx: Option<i64>) -> u64 {
    let group = group_idx.unwrap_or(0);
    match (lora_name, group) {
        (None, 0) => 0,
        (lora, group) => {
            let mut key = Vec::with_capacity(16 + lora.map_or(0, str::len));
            key.extend_from_slice(&group.to_le_bytes());
            if let Some(lora) = lora {
                key.extend_from_slice(b"lora:");
                key.extend_from_slice(lora.as_bytes());
            }
            // Never 0, which means "no salt".
            xxh3_64_with_seed(&key, 0x5a17).max(1)
        }
    }
}

/// The parent a block chains from under `salt`.
fn salted(tip: Option<BlockHash>, salt: u64) -> Option<BlockHash> {
    if salt == 0 {
        return tip;
    }
    let tip = tip.map_or(0, |h| h.0);
    Some(BlockHash(xxh3_64_with_seed(&tip.to_le_bytes(), salt)))
}

/// A prompt's full-block hashes under `salt` (what [`chain_salt`] gives for the request's
/// adapter): with salt 0, `block::block_hashes(tokens)`.
pub fn salted_block_hashes(tokens: &[u32], salt: u64) -> Vec<BlockHash> {
    let mut hashes: Vec<BlockHash> = Vec::with_capacity(tokens.len() / BLOCK_SIZE);
    for chunk in tokens.chunks_exact(BLOCK_SIZE) {
        hashes.push(chain_hash(salted(hashes.last().copied(), salt), chunk));
    }
    hashes
}

/// Where our chain stands after an engine block.
#[derive(Clone, Debug, Default)]
struct ChainState {
    /// Our last full block.
    tip: Option<BlockHash>,
    /// Tokens after it (fewer than [`BLOCK_SIZE`]).
    tail: Vec<u32>,
    salt: u64,
}

/// What one engine block added to our index.
#[derive(Debug)]
struct Indexed {
    after: ChainState,
    /// Our blocks this engine block completed (usually one; none for a small engine block
    /// that did not fill one; several for a large one).
    completed: Vec<u64>,
}

/// The engine's block key: its medium (GPU, CPU, …) and its hash.
type EngineKey = (u8, u128);

/// How one batch changed the index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Engine blocks stored.
    pub stored: u64,
    /// Engine blocks removed.
    pub removed: u64,
    /// Stored blocks passed over: parent unknown, or tokens that do not fit the hashes.
    pub orphans: u64,
    /// Whether the engine cleared its cache (or the index outgrew [`MAX_INDEXED_BLOCKS`]).
    pub cleared: bool,
    /// Whether the index outgrew [`MAX_INDEXED_BLOCKS`] and was cleared (a reset of the view,
    /// not the engine's own clear).
    pub overflowed: bool,
}

/// One engine's blocks, keyed for routing.
#[derive(Debug, Default)]
pub struct EngineIndex {
    blocks: HashMap<EngineKey, Indexed>,
    /// Our block → how many engine blocks (across media) completed it.
    ours: HashMap<u64, u32>,
    media: Vec<String>,
}

impl EngineIndex {
    /// Engine blocks indexed.
    pub fn engine_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Our blocks held.
    pub fn blocks(&self) -> usize {
        self.ours.len()
    }

    /// Forgets everything (and empties `cache`).
    pub fn clear(&mut self, cache: &ReportedCache) {
        self.blocks.clear();
        self.ours.clear();
        cache.replace_all(std::iter::empty());
    }

    /// Applies one batch, in order, and hands its net changes to `cache`.
    pub fn apply(&mut self, batch: &Batch, cache: &ReportedCache) -> Applied {
        let mut applied = Applied::default();
        // Our blocks gained (true) and lost (false), in order.
        let mut changes = Vec::new();
        for event in &batch.events {
            match event {
                Event::Stored(stored) => self.store(stored, &mut applied, &mut changes),
                Event::Removed(removed) => self.remove(removed, &mut applied, &mut changes),
                Event::AllCleared => {
                    self.blocks.clear();
                    self.ours.clear();
                    changes.clear();
                    applied.cleared = true;
                }
                Event::Unknown(_) => {}
            }
            if self.blocks.len() > MAX_INDEXED_BLOCKS {
                self.blocks.clear();
                self.ours.clear();
                changes.clear();
                applied.cleared = true;
                applied.overflowed = true;
            }
        }
        if applied.cleared {
            // Rebuild from what is held now (the batch's stores after the clear included).
            cache.replace_all(self.ours.keys().copied());
        } else {
            cache.change(&changes);
        }
        applied
    }

    fn medium(&mut self, medium: Option<&str>) -> u8 {
        let medium = medium.unwrap_or("GPU");
        if let Some(i) = self.media.iter().position(|m| m == medium) {
            return i as u8;
        }
        if self.media.len() < usize::from(u8::MAX) {
            self.media.push(medium.to_owned());
            return (self.media.len() - 1) as u8;
        }
        // A publisher inventing media without end: fold the rest into one.
        u8::MAX
    }

    fn store(
        &mut self,
        stored: &BlockStored,
        applied: &mut Applied,
        changes: &mut Vec<(u64, bool)>,
    ) {
        let n = stored.block_hashes.len();
        if n == 0 {
            return;
        }
        let size = stored.block_size as usize;
        let fits = size > 0 && stored.token_ids.len() == n * size;
        // One hash for a short last page (SGLang sends a partial page with its own length).
        let single = n == 1 && !stored.token_ids.is_empty();
        if !fits && !single {
            applied.orphans += n as u64;
            return;
        }
        let medium = self.medium(stored.medium.as_deref());
        let root_salt = chain_salt(stored.lora_name.as_deref(), stored.group_idx);
        let mut state = match &stored.parent_block_hash {
            None => ChainState {
                salt: root_salt,
                ..ChainState::default()
            },
            Some(parent) => match self.blocks.get(&(medium, engine_key(parent))) {
                Some(parent) => parent.after.clone(),
                None => {
                    applied.orphans += n as u64;
                    return;
                }
            },
        };
        let chunks: Vec<&[u32]> = if fits {
            stored.token_ids.chunks_exact(size).collect()
        } else {
            vec![&stored.token_ids[..]]
        };
        for (i, (hash, tokens)) in stored.block_hashes.iter().zip(chunks).enumerate() {
            if let Some(extra) = stored.extra_keys.as_ref().and_then(|keys| keys.get(i))
                && !extra.is_nil()
            {
                let mut bytes = Vec::new();
                // Writing a decoded value back to a Vec does not fail.
                let _ = rmpv::encode::write_value(&mut bytes, extra);
                state.salt = xxh3_64_with_seed(&bytes, state.salt).max(1);
            }
            let mut completed = Vec::new();
            for &token in tokens {
                state.tail.push(token);
                if state.tail.len() == BLOCK_SIZE {
                    let ours = chain_hash(salted(state.tip, state.salt), &state.tail);
                    state.tail.clear();
                    state.tip = Some(ours);
                    completed.push(ours.0);
                }
            }
            let key = (medium, engine_key(hash));
            if let Some(old) = self.blocks.remove(&key) {
                // Stored again without a removal between: the new one replaces it.
                self.release(&old.completed, changes);
            }
            for ours in &completed {
                let count = self.ours.entry(*ours).or_insert(0);
                *count += 1;
                if *count == 1 {
                    changes.push((*ours, true));
                }
            }
            self.blocks.insert(
                key,
                Indexed {
                    after: state.clone(),
                    completed,
                },
            );
            applied.stored += 1;
        }
    }

    fn remove(
        &mut self,
        removed: &BlockRemoved,
        applied: &mut Applied,
        changes: &mut Vec<(u64, bool)>,
    ) {
        let medium = self.medium(removed.medium.as_deref());
        for hash in &removed.block_hashes {
            if let Some(old) = self.blocks.remove(&(medium, engine_key(hash))) {
                self.release(&old.completed, changes);
                applied.removed += 1;
            }
        }
    }

    fn release(&mut self, completed: &[u64], changes: &mut Vec<(u64, bool)>) {
        for ours in completed {
            if let Some(count) = self.ours.get_mut(ours) {
                *count -= 1;
                if *count == 0 {
                    self.ours.remove(ours);
                    changes.push((*ours, false));
                }
            }
        }
    }
}

fn engine_key(hash: &EngineHash) -> u128 {
    match hash {
        EngineHash::Int(i) => *i as u128,
        // Bytes hashes (vLLM's 32-byte digests) fold to 128 bits; a different tag bit keeps
        // them apart from integers.
        EngineHash::Bytes(bytes) => xxh3_128(bytes) | (1 << 127),
    }
}

#[cfg(test)]
mod tests;
