//! The KV-cache event streams of vLLM and SGLang, decoded: what an engine's ZeroMQ publisher
//! sends (`[topic, 8-byte big-endian sequence, msgpack batch]`) as plain Rust values. Both
//! encodings the engines have used are read, at both levels: a batch as a positional array
//! `[ts, events, data_parallel_rank]` or a map `{ts, events, data_parallel_rank}`; an event as
//! a positional array led by its tag (`["BlockStored", block_hashes, parent_block_hash,
//! token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx, …]`) or a map
//! tagged by `type`. Fields the engines add later are ignored; trailing fields they omit take
//! their defaults. A block hash is whatever the engine sent (an integer or bytes) and is kept
//! only to apply removals: routing keys blocks by its own chained hash of their token ids.
//!
//! Written from vLLM's `vllm/distributed/kv_events.py` (the msgspec structs `EventBatch`,
//! `BlockStored`, `BlockRemoved`, `AllBlocksCleared`; SGLang's publisher mirrors them). This
//! crate decodes and bounds, and writes the same wire for simulators and tests ([`encode`]);
//! it opens no socket and keeps no index (the pool does both).

#![deny(missing_docs)]

use rmpv::Value;

pub mod encode;
pub use encode::{Encoding, encode_batch, encode_frame};

/// Events one batch may hold before it is refused as oversized (an engine step stores a few
/// thousand blocks at most; a batch far past that is garbage or hostile).
pub const MAX_EVENTS_PER_BATCH: usize = 65_536;
/// Bytes one batch may take before it is refused unread.
pub const MAX_BATCH_BYTES: usize = 64 * 1024 * 1024;

/// A block hash as the engine sent it: kept to match a later removal with its store.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EngineHash {
    /// An integer hash (older vLLM, SGLang).
    Int(i128),
    /// A byte-string hash (vLLM's `ExternalBlockHash` as bytes).
    Bytes(Vec<u8>),
}

/// Blocks the engine stored.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockStored {
    /// The blocks' hashes, in order.
    pub block_hashes: Vec<EngineHash>,
    /// The hash of the block before the first, if any.
    pub parent_block_hash: Option<EngineHash>,
    /// The blocks' token ids, `block_size` per block.
    pub token_ids: Vec<u32>,
    /// Tokens per block.
    pub block_size: u32,
    /// The LoRA adapter's id (deprecated by vLLM in favour of its name).
    pub lora_id: Option<i64>,
    /// Where the blocks live (`GPU`, `CPU`, …).
    pub medium: Option<String>,
    /// The LoRA adapter's name.
    pub lora_name: Option<String>,
    /// Per block, the extra keys the engine hashed with it (multimodal ids, cache salt…),
    /// as the engine's own values.
    pub extra_keys: Option<Vec<Value>>,
    /// The KV-cache group (hybrid models).
    pub group_idx: Option<i64>,
}

/// Blocks the engine removed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockRemoved {
    /// Their hashes.
    pub block_hashes: Vec<EngineHash>,
    /// Where they lived.
    pub medium: Option<String>,
    /// The KV-cache group.
    pub group_idx: Option<i64>,
}

/// One event.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Blocks stored.
    Stored(BlockStored),
    /// Blocks removed.
    Removed(BlockRemoved),
    /// The whole cache was cleared.
    AllCleared,
    /// An event of a kind this version does not know (kept by name, ignored by the index).
    Unknown(String),
}

/// One batch: what one publish carries.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// The engine's timestamp (seconds).
    pub ts: f64,
    /// The events, in order.
    pub events: Vec<Event>,
    /// The data-parallel rank that published it.
    pub data_parallel_rank: Option<i64>,
}

/// One ZeroMQ message of the stream.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    /// The topic.
    pub topic: Vec<u8>,
    /// The batch's sequence number (per publisher, from 0).
    pub sequence: u64,
    /// The batch.
    pub batch: Batch,
}

/// Why a frame or batch was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DecodeError {
    /// Not three parts, or a sequence that is not 8 bytes.
    #[error("a KV event message has {parts} parts (topic, 8-byte sequence, payload expected)")]
    Parts {
        /// How many it had.
        parts: usize,
    },
    /// The sequence part is not 8 bytes.
    #[error("a KV event sequence is {0} bytes, not 8")]
    Sequence(usize),
    /// The payload is not msgpack.
    #[error("a KV event batch is not msgpack: {0}")]
    Msgpack(String),
    /// Too large to read.
    #[error("a KV event batch is oversized: {0}")]
    Oversized(String),
    /// Msgpack, but not a batch.
    #[error("a KV event batch is malformed: {0}")]
    Malformed(String),
}

/// Decodes one multipart message `[topic, sequence, payload]`.
pub fn decode_frame(parts: &[&[u8]]) -> Result<Frame, DecodeError> {
    let [topic, sequence, payload] = parts else {
        return Err(DecodeError::Parts { parts: parts.len() });
    };
    let sequence: [u8; 8] = (*sequence)
        .try_into()
        .map_err(|_| DecodeError::Sequence(sequence.len()))?;
    Ok(Frame {
        topic: topic.to_vec(),
        sequence: u64::from_be_bytes(sequence),
        batch: decode_batch(payload)?,
    })
}

/// Decodes one msgpack batch, in either encoding.
pub fn decode_batch(payload: &[u8]) -> Result<Batch, DecodeError> {
    if payload.len() > MAX_BATCH_BYTES {
        return Err(DecodeError::Oversized(format!(
            "{} bytes (at most {MAX_BATCH_BYTES})",
            payload.len()
        )));
    }
    let value = rmpv::decode::read_value(&mut &payload[..])
        .map_err(|e| DecodeError::Msgpack(e.to_string()))?;
    let (ts, events, rank) = match &value {
        Value::Array(items) => (items.first(), items.get(1), items.get(2)),
        Value::Map(_) => (
            field(&value, "ts"),
            field(&value, "events"),
            field(&value, "data_parallel_rank"),
        ),
        other => return Err(malformed(format!("a batch is a {}", kind(other)))),
    };
    let ts = ts.and_then(Value::as_f64).unwrap_or(0.0);
    let Some(Value::Array(events)) = events else {
        return Err(malformed("a batch without an events list".into()));
    };
    if events.len() > MAX_EVENTS_PER_BATCH {
        return Err(DecodeError::Oversized(format!(
            "{} events (at most {MAX_EVENTS_PER_BATCH})",
            events.len()
        )));
    }
    Ok(Batch {
        ts,
        events: events.iter().map(decode_event).collect::<Result<_, _>>()?,
        data_parallel_rank: rank.and_then(Value::as_i64),
    })
}

/// One event, positional or a map tagged by `type`.
fn decode_event(value: &Value) -> Result<Event, DecodeError> {
    let (tag, fields) = match value {
        Value::Array(items) => {
            let tag = items.first().and_then(Value::as_str).ok_or_else(|| {
                malformed("a positional event does not start with its type".into())
            })?;
            (tag, Fields::Positional(items))
        }
        Value::Map(_) => {
            let tag = field(value, "type")
                .and_then(Value::as_str)
                .ok_or_else(|| malformed("an event map without a type".into()))?;
            (tag, Fields::Named(value))
        }
        other => return Err(malformed(format!("an event is a {}", kind(other)))),
    };
    let at = |i, name| fields.get(i, name);
    let present = |i, name| at(i, name).filter(|v| !v.is_nil());
    match tag {
        "BlockStored" => Ok(Event::Stored(BlockStored {
            block_hashes: hashes(at(1, "block_hashes"))?,
            parent_block_hash: present(2, "parent_block_hash").map(hash).transpose()?,
            token_ids: tokens(at(3, "token_ids"))?,
            block_size: present(4, "block_size")
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0),
            lora_id: present(5, "lora_id").and_then(Value::as_i64),
            medium: present(6, "medium")
                .and_then(Value::as_str)
                .map(str::to_owned),
            lora_name: present(7, "lora_name")
                .and_then(Value::as_str)
                .map(str::to_owned),
            extra_keys: present(8, "extra_keys")
                .and_then(Value::as_array)
                .map(|keys| keys.to_vec()),
            group_idx: present(9, "group_idx").and_then(Value::as_i64),
        })),
        "BlockRemoved" => Ok(Event::Removed(BlockRemoved {
            block_hashes: hashes(at(1, "block_hashes"))?,
            medium: present(2, "medium")
                .and_then(Value::as_str)
                .map(str::to_owned),
            group_idx: present(3, "group_idx").and_then(Value::as_i64),
        })),
        "AllBlocksCleared" => Ok(Event::AllCleared),
        other => Ok(Event::Unknown(other.chars().take(64).collect())),
    }
}

/// An event's fields, by position (after the tag) or by name.
enum Fields<'a> {
    Positional(&'a [Value]),
    Named(&'a Value),
}

impl<'a> Fields<'a> {
    fn get(&self, index: usize, name: &str) -> Option<&'a Value> {
        match self {
            Self::Positional(items) => items.get(index),
            Self::Named(map) => field(map, name),
        }
    }
}

/// A map's field by name.
fn field<'a>(map: &'a Value, name: &str) -> Option<&'a Value> {
    map.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(name))
        .map(|(_, v)| v)
}

fn hash(value: &Value) -> Result<EngineHash, DecodeError> {
    match value {
        Value::Integer(n) => n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from))
            .map(EngineHash::Int)
            .ok_or_else(|| malformed("a block hash out of range".into())),
        Value::Binary(bytes) => Ok(EngineHash::Bytes(bytes.clone())),
        Value::String(text) => Ok(EngineHash::Bytes(text.as_bytes().to_vec())),
        other => Err(malformed(format!("a block hash is a {}", kind(other)))),
    }
}

fn hashes(value: Option<&Value>) -> Result<Vec<EngineHash>, DecodeError> {
    match value {
        Some(Value::Array(items)) => items.iter().map(hash).collect(),
        Some(other) => Err(malformed(format!("block_hashes is a {}", kind(other)))),
        None => Err(malformed("an event without block_hashes".into())),
    }
}

fn tokens(value: Option<&Value>) -> Result<Vec<u32>, DecodeError> {
    match value {
        Some(Value::Array(items)) => items
            .iter()
            .map(|t| {
                t.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| malformed("a token id is not a 32-bit whole number".into()))
            })
            .collect(),
        None | Some(Value::Nil) => Ok(Vec::new()),
        Some(other) => Err(malformed(format!("token_ids is a {}", kind(other)))),
    }
}

fn malformed(why: String) -> DecodeError {
    DecodeError::Malformed(why)
}

/// A value's kind, for messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Nil => "nil",
        Value::Boolean(_) => "boolean",
        Value::Integer(_) => "integer",
        Value::F32(_) | Value::F64(_) => "float",
        Value::String(_) => "string",
        Value::Binary(_) => "binary string",
        Value::Array(_) => "list",
        Value::Map(_) => "map",
        Value::Ext(..) => "msgpack extension",
    }
}

#[cfg(test)]
mod tests;
