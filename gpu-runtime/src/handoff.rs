//! A prompt's KV cache handed from a prefill engine to a decode engine ([`KvHandoff`]): the
//! prompt's full blocks, each by its chained hash and tokens, and their contents as the
//! prefill engine's executor holds them. The decode engine registers the blocks in its prefix
//! cache before it admits the request, so the request finds them there and computes only the
//! prompt's last tokens; the blocks stay cached for the requests after it.
//!
//! Both engines must run the same model: a block's hash names its tokens, and its contents
//! are only meaningful to an executor of the same shape.
//!
//! A handoff comes from another process, so the decode engine believes nothing in it it can
//! check ([`KvHandoff::verify`]): every block must hold the request's own prompt tokens at its
//! place, chain to the block before it, and carry the hash those give; the contents must be
//! one block's bytes per block. One block that fails refuses the whole handoff
//! ([`ImportRefusal`], counted in the engine's load report) and the prompt is computed
//! locally: a block registered under a hash is served to every later request whose prompt has
//! that prefix, whoever sent it, so a wrong one would poison other tenants' replies.

use crate::block::{BLOCK_SIZE, BlockHash, StoredBlock, chain_hash};
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

/// Why a handoff's blocks were not imported (the prompt is computed locally instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ImportRefusal {
    /// A block's hash is not the chained hash of its tokens and its parent, or its parent is
    /// not the block before it.
    Hash,
    /// A block's tokens are not the request's prompt at its place, or the blocks cover more
    /// than the prompt's full blocks.
    Tokens,
    /// The contents are not one block's bytes per block, or not of this executor's shape.
    Shape,
}

impl ImportRefusal {
    /// Every reason, in the order the checks run.
    pub const ALL: [ImportRefusal; 3] = [Self::Shape, Self::Tokens, Self::Hash];

    /// Its name in metrics (`ringmaster_kv_import_refused_total{reason}`) and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hash => "hash",
            Self::Tokens => "tokens",
            Self::Shape => "shape",
        }
    }
}

impl KvHandoff {
    /// Checks the handoff against the `prompt` of the request it came with (see the module's
    /// documentation): `Ok` when every block is that prompt's own and the contents are whole.
    pub fn verify(&self, prompt: &[u32]) -> Result<(), ImportRefusal> {
        if let KvContents::Bytes { block_bytes, data } = &self.contents
            && (*block_bytes == 0
                || self.blocks.len().checked_mul(*block_bytes) != Some(data.len()))
        {
            return Err(ImportRefusal::Shape);
        }
        if self.blocks.len() > prompt.len() / BLOCK_SIZE {
            return Err(ImportRefusal::Tokens);
        }
        let mut parent: Option<BlockHash> = None;
        for (block, expected) in self.blocks.iter().zip(prompt.chunks_exact(BLOCK_SIZE)) {
            if block.tokens[..] != *expected {
                return Err(ImportRefusal::Tokens);
            }
            if block.parent != parent || block.hash != chain_hash(parent, &block.tokens) {
                return Err(ImportRefusal::Hash);
            }
            parent = Some(block.hash);
        }
        Ok(())
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn handoff_of(prompt: &[u32], contents: KvContents) -> KvHandoff {
        let mut blocks: Vec<StoredBlock> = Vec::new();
        for chunk in prompt.chunks_exact(BLOCK_SIZE) {
            let parent = blocks.last().map(|b| b.hash);
            blocks.push(StoredBlock {
                hash: chain_hash(parent, chunk),
                parent,
                tokens: chunk.try_into().unwrap(),
            });
        }
        KvHandoff { blocks, contents }
    }

    #[test]
    fn a_handoff_of_the_prompts_own_blocks_passes() {
        let prompt: Vec<u32> = (0..3 * BLOCK_SIZE as u32 + 5).collect();
        let handoff = handoff_of(&prompt, KvContents::Modelled);
        assert_eq!(handoff.blocks.len(), 3);
        assert_eq!(handoff.verify(&prompt), Ok(()));
        // A prefix of the blocks is the prompt's too.
        let head = KvHandoff {
            blocks: handoff.blocks[..1].to_vec(),
            ..handoff.clone()
        };
        assert_eq!(head.verify(&prompt), Ok(()));
        let bytes = KvContents::Bytes {
            block_bytes: 4,
            data: vec![0; 12],
        };
        assert_eq!(handoff_of(&prompt, bytes).verify(&prompt), Ok(()));
    }

    #[test]
    fn planted_blocks_are_refused_by_reason() {
        let prompt: Vec<u32> = (0..2 * BLOCK_SIZE as u32).collect();
        let other: Vec<u32> = (100..100 + 2 * BLOCK_SIZE as u32).collect();
        // Another prompt's blocks, consistent in themselves: not this request's tokens.
        assert_eq!(
            handoff_of(&other, KvContents::Modelled).verify(&prompt),
            Err(ImportRefusal::Tokens)
        );
        // The right tokens under a hash that is not theirs (a popular prefix's, say).
        let mut forged = handoff_of(&prompt, KvContents::Modelled);
        forged.blocks[1].hash = BlockHash(42);
        assert_eq!(forged.verify(&prompt), Err(ImportRefusal::Hash));
        // A block that does not chain to the one before it.
        let mut unchained = handoff_of(&prompt, KvContents::Modelled);
        unchained.blocks[1].parent = None;
        unchained.blocks[1].hash = chain_hash(None, &unchained.blocks[1].tokens);
        assert_eq!(unchained.verify(&prompt), Err(ImportRefusal::Hash));
        // More blocks than the prompt has.
        let short = &prompt[..BLOCK_SIZE + 3];
        assert_eq!(
            handoff_of(&prompt, KvContents::Modelled).verify(short),
            Err(ImportRefusal::Tokens)
        );
        // Contents that are not one block's bytes per block.
        for (block_bytes, len) in [(4, 7), (0, 0), (usize::MAX, 0)] {
            let contents = KvContents::Bytes {
                block_bytes,
                data: vec![0; len],
            };
            assert_eq!(
                handoff_of(&prompt, contents).verify(&prompt),
                Err(ImportRefusal::Shape),
                "{block_bytes} x 2 != {len}"
            );
        }
    }
}
