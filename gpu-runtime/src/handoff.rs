//! A prompt's KV cache handed from a prefill engine to a decode engine ([`KvHandoff`]): the
//! prompt's full blocks, each by its chained hash and tokens, and their contents as the
//! prefill engine's executor holds them. The decode engine registers the blocks in its prefix
//! cache before it admits the request, so the request finds them there and computes only the
//! prompt's last tokens; the blocks stay cached for the requests after it.
//!
//! Both engines must run the same model: a block's hash names its tokens, and its contents
//! are only meaningful to an executor of the same shape.

use crate::block::{BLOCK_SIZE, BlockHash, StoredBlock};
use crate::cost::KV_BYTES_PER_TOKEN;

/// A prompt's KV cache as a prefill engine hands it over.
#[derive(Clone, Debug, PartialEq)]
pub struct KvHandoff {
    /// The prompt's computed full blocks, in order.
    pub blocks: Vec<StoredBlock>,
    /// Their contents.
    pub contents: KvContents,
}

/// The contents of a handoff's blocks.
#[derive(Clone, Debug, PartialEq)]
pub enum KvContents {
    /// A simulated engine's: its blocks hold nothing, only what they would cost to move.
    Modelled,
    /// A model's: every block's keys and values, `block_bytes` each, in block order, in the
    /// executor's own layout.
    Bytes {
        /// Bytes per block.
        block_bytes: usize,
        /// The blocks' contents.
        data: Vec<u8>,
    },
    /// The executor cannot read its blocks out (the decode engine computes the prompt).
    Unavailable,
}

impl KvHandoff {
    /// The blocks' chained hashes, in order.
    pub fn hashes(&self) -> Vec<BlockHash> {
        self.blocks.iter().map(|b| b.hash).collect()
    }

    /// Tokens the handed-over blocks cover.
    pub fn tokens(&self) -> usize {
        self.blocks.len() * BLOCK_SIZE
    }

    /// Bytes that moving `blocks` of these blocks takes: the contents' own size for a
    /// model, the simulated model's KV size per token for a simulated engine.
    pub fn transfer_bytes(&self, blocks: usize) -> u64 {
        match &self.contents {
            KvContents::Bytes { block_bytes, .. } => (blocks * block_bytes) as u64,
            KvContents::Modelled => (blocks * BLOCK_SIZE) as u64 * KV_BYTES_PER_TOKEN,
            KvContents::Unavailable => 0,
        }
    }
}
