//! The worker protocol: what `ringmaster worker` serves besides OpenAI's chat endpoints, and
//! what a gateway's pool reads from it: the load report (`GET /load`), the prefix cache's
//! events (`GET /kv/events`), the tokenizer (`GET /tokenizer`), and a prefill's KV blocks for
//! the decode worker of a split request (`GET /kv/transfer/{id}`, [`KvTransfer`]).
//!
//! These shapes are the protocol, apart from the engine's own structs: the engine may change
//! its internals, and the worker and the pool each convert at their edge.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `GET /load`: an engine's load and cumulative counters (the engine publishes this very
/// struct after every step). A missing field reads as 0, so a
/// newer worker's report reads in an older gateway and the reverse.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Load {
    /// Sequences running (holding KV blocks).
    pub running: u32,
    /// Requests waiting for admission, including those submitted but not yet taken in.
    pub waiting: u32,
    /// Blocks in the KV pool.
    pub kv_blocks_total: u32,
    /// Blocks referenced by live sequences.
    pub kv_blocks_used: u32,
    /// Blocks unreferenced but still hittable in the prefix cache.
    pub kv_blocks_cached: u32,
    /// Prompt tokens of every admitted request (cumulative).
    pub prompt_tokens_total: u64,
    /// Of those, tokens reused from the prefix cache (cumulative); divide by
    /// `prompt_tokens_total` for the hit ratio.
    pub cached_prompt_tokens_total: u64,
    /// Tokens generated (cumulative).
    pub generated_tokens_total: u64,
    /// Requests that reached their end (cumulative).
    pub requests_finished: u64,
    /// Requests whose stream was dropped before their end (cumulative).
    pub requests_cancelled: u64,
    /// Sequences preempted for lack of KV blocks (cumulative).
    pub preemptions: u64,
    /// Steps run (cumulative).
    pub steps: u64,
    /// Sequences in the last step (its batch size).
    pub last_batch_size: u32,
    /// Sequences scheduled, summed over steps (cumulative; over `steps`, the mean batch).
    pub step_sequences_total: u64,
    /// Tokens computed, summed over steps (cumulative).
    pub step_tokens_total: u64,
    /// The step token budget, summed over steps (cumulative; `step_tokens_total` over this is
    /// the batch utilisation).
    pub step_budget_tokens_total: u64,
    /// Prompt tokens computed (prefill, including recompute after preemption; cumulative).
    pub prefill_tokens_total: u64,
    /// Decode tokens computed (cumulative).
    pub decode_tokens_total: u64,
    /// Time the executor spent computing steps (cumulative); tokens over it are tokens/s.
    pub busy_seconds_total: f64,
    /// Steps that left requests waiting for admission (cumulative): the steps that ran
    /// under load, where every token of room should have been used.
    pub loaded_steps: u64,
    /// Tokens computed in those steps (cumulative).
    pub loaded_step_tokens_total: u64,
    /// Tokens those steps could have held (cumulative): the budget, or with decodes in the
    /// step the decodes plus the prefill allowed beside them. The fill under load is
    /// `loaded_step_tokens_total` over this.
    pub loaded_step_capacity_tokens_total: u64,
    /// Sequences ready to decode when each step was scheduled, summed over steps
    /// (cumulative); `decode_tokens_total` over this is the decode occupancy.
    pub decode_ready_total: u64,
    /// Prefills' KV handoffs refused because a block's hash is not that of its tokens and
    /// parent (cumulative): the prompt was computed here instead.
    pub kv_import_refused_hash: u64,
    /// Handoffs refused because their blocks are not the request's prompt (cumulative).
    pub kv_import_refused_tokens: u64,
    /// Handoffs refused because their contents are not of this engine's shape (cumulative).
    pub kv_import_refused_shape: u64,
}

/// A block's chained hash: 16 lower-case hex digits on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HexHash(pub u64);

impl Serialize for HexHash {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut digits = [0u8; 16];
        for (i, digit) in digits.iter_mut().enumerate() {
            let nibble = (self.0 >> (60 - 4 * i)) & 0xf;
            *digit = b"0123456789abcdef"[nibble as usize];
        }
        serializer.serialize_str(std::str::from_utf8(&digits).unwrap_or_default())
    }
}

impl<'de> Deserialize<'de> for HexHash {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = crate::Str::deserialize(deserializer)?;
        u64::from_str_radix(&text, 16)
            .map(HexHash)
            .map_err(|_| serde::de::Error::custom(format!("bad block hash {text:?}")))
    }
}

/// One event of `GET /kv/events`, the `data` of its SSE frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum KvEvent {
    /// The first event: every block the prefix cache holds.
    Snapshot {
        /// Their hashes.
        hashes: Vec<HexHash>,
    },
    /// A block entered the cache.
    Stored {
        /// Its hash.
        hash: HexHash,
    },
    /// A block left the cache.
    Evicted {
        /// Its hash.
        hash: HexHash,
    },
    /// Blocks that entered the cache one after another (a worker sends the events it has
    /// ready as one batch: one prefill stores hundreds of blocks at once).
    #[serde(rename = "stored_many")]
    StoredMany {
        /// Their hashes, in order.
        hashes: Vec<HexHash>,
    },
    /// Blocks that left the cache one after another.
    #[serde(rename = "evicted_many")]
    EvictedMany {
        /// Their hashes, in order.
        hashes: Vec<HexHash>,
    },
    /// The subscriber fell behind and missed this many events: its view is stale, and it
    /// should reconnect for a new snapshot.
    Lagged {
        /// Events missed.
        missed: u64,
    },
}

/// `GET /tokenizer`: how the worker tokenizes, so a gateway hashes a prompt's blocks exactly
/// as the worker's engine does. `T` is the engine's own description of its tokenizer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizerDescription<T> {
    /// Tokens per KV block.
    pub block_size: usize,
    /// The tokenizer's fingerprint (16 hex digits); equal fingerprints tokenize alike.
    pub fingerprint: String,
    /// The tokenizer itself.
    pub tokenizer: T,
}

/// `GET /health`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health<'a> {
    /// `ok`.
    pub status: &'a str,
    /// The model served.
    pub model: &'a str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_events_read_back_as_written() {
        for event in [
            KvEvent::Snapshot {
                hashes: vec![HexHash(1), HexHash(u64::MAX)],
            },
            KvEvent::Stored {
                hash: HexHash(0xabc),
            },
            KvEvent::Evicted { hash: HexHash(7) },
            KvEvent::StoredMany {
                hashes: vec![HexHash(1), HexHash(2)],
            },
            KvEvent::EvictedMany {
                hashes: vec![HexHash(3)],
            },
            KvEvent::Lagged { missed: 3 },
        ] {
            let text = serde_json::to_string(&event).unwrap();
            assert_eq!(serde_json::from_str::<KvEvent>(&text).unwrap(), event);
        }
        assert_eq!(
            serde_json::to_string(&KvEvent::Stored {
                hash: HexHash(0xabc)
            })
            .unwrap(),
            r#"{"type":"stored","hash":"0000000000000abc"}"#
        );
        assert_eq!(
            serde_json::to_string(&KvEvent::StoredMany {
                hashes: vec![HexHash(1)]
            })
            .unwrap(),
            r#"{"type":"stored_many","hashes":["0000000000000001"]}"#
        );
        assert!(serde_json::from_str::<KvEvent>(r#"{"type":"stored","hash":"xyz"}"#).is_err());
    }

    #[test]
    fn a_load_report_reads_back_and_missing_fields_read_as_zero() {
        let report = Load {
            running: 3,
            busy_seconds_total: 1.5,
            ..Load::default()
        };
        let text = serde_json::to_string(&report).unwrap();
        assert_eq!(serde_json::from_str::<Load>(&text).unwrap(), report);
        let partial: Load = serde_json::from_str(r#"{"waiting":2}"#).unwrap();
        assert_eq!((partial.waiting, partial.running), (2, 0));
    }
}

/// `GET /kv/transfer/{id}`: the first line of a prefill's handoff, a JSON object ending in
/// `\n`; the blocks' contents follow it, raw (`block_bytes` each, in block order), when
/// `contents` is `bytes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvTransfer {
    /// The prompt's computed full blocks, in order.
    pub blocks: Vec<TransferBlock>,
    /// `bytes` (the raw contents follow), `modelled` (a simulated engine: nothing follows) or
    /// `unavailable` (the decode worker computes the prompt).
    pub contents: String,
    /// Bytes per block of the contents (0 when none follow).
    pub block_bytes: usize,
}

/// One block of a [`KvTransfer`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferBlock {
    /// Its chained hash.
    pub hash: HexHash,
    /// The block before it (`null` for the first).
    pub parent: Option<HexHash>,
    /// Its token ids.
    pub tokens: Vec<u32>,
}
