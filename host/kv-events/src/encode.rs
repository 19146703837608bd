//! Writing batches as the engines write them: what the replay's simulated servers publish and
//! what the tests' publisher sends, in either encoding. The decoder reads back exactly what
//! this writes (a unit test holds both to hand-written msgpack).

use rmpv::Value;

use crate::{Batch, BlockRemoved, BlockStored, EngineHash, Event};

/// The two encodings the engines have used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// msgspec's `array_like=True`: a batch `[ts, events, rank]`, an event `[tag, fields…]`.
    Positional,
    /// Maps: a batch `{ts, events, data_parallel_rank}`, an event `{type, fields…}`.
    Tagged,
}

/// One batch's msgpack payload.
pub fn encode_batch(batch: &Batch, encoding: Encoding) -> Vec<u8> {
    let events = Value::Array(batch.events.iter().map(|e| event(e, encoding)).collect());
    let rank = batch.data_parallel_rank.map_or(Value::Nil, Value::from);
    let value = match encoding {
        Encoding::Positional => Value::Array(vec![Value::F64(batch.ts), events, rank]),
        Encoding::Tagged => Value::Map(vec![
            ("ts".into(), Value::F64(batch.ts)),
            ("events".into(), events),
            ("data_parallel_rank".into(), rank),
        ]),
    };
    let mut out = Vec::new();
    // Writing to a Vec does not fail.
    let _ = rmpv::encode::write_value(&mut out, &value);
    out
}

/// One publish: `[topic, 8-byte big-endian sequence, payload]`.
pub fn encode_frame(
    topic: &[u8],
    sequence: u64,
    batch: &Batch,
    encoding: Encoding,
) -> [Vec<u8>; 3] {
    [
        topic.to_vec(),
        sequence.to_be_bytes().to_vec(),
        encode_batch(batch, encoding),
    ]
}

fn hash(hash: &EngineHash) -> Value {
    match hash {
        EngineHash::Int(n) => i64::try_from(*n)
            .map(Value::from)
            .or_else(|_| u64::try_from(*n).map(Value::from))
            .unwrap_or(Value::Nil),
        EngineHash::Bytes(bytes) => Value::Binary(bytes.clone()),
    }
}

fn opt_str(text: Option<&String>) -> Value {
    text.map_or(Value::Nil, |t| Value::from(t.as_str()))
}

fn event(event: &Event, encoding: Encoding) -> Value {
    let (tag, fields): (&str, Vec<(&str, Value)>) = match event {
        Event::Stored(BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_id,
            medium,
            lora_name,
            extra_keys,
            group_idx,
        }) => (
            "BlockStored",
            vec![
                (
                    "block_hashes",
                    Value::Array(block_hashes.iter().map(hash).collect()),
                ),
                (
                    "parent_block_hash",
                    parent_block_hash.as_ref().map_or(Value::Nil, hash),
                ),
                (
                    "token_ids",
                    Value::Array(token_ids.iter().map(|&t| Value::from(t)).collect()),
                ),
                ("block_size", Value::from(*block_size)),
                ("lora_id", lora_id.map_or(Value::Nil, Value::from)),
                ("medium", opt_str(medium.as_ref())),
                ("lora_name", opt_str(lora_name.as_ref())),
                (
                    "extra_keys",
                    extra_keys.clone().map_or(Value::Nil, Value::Array),
                ),
                ("group_idx", group_idx.map_or(Value::Nil, Value::from)),
            ],
        ),
        Event::Removed(BlockRemoved {
            block_hashes,
            medium,
            group_idx,
        }) => (
            "BlockRemoved",
            vec![
                (
                    "block_hashes",
                    Value::Array(block_hashes.iter().map(hash).collect()),
                ),
                ("medium", opt_str(medium.as_ref())),
                ("group_idx", group_idx.map_or(Value::Nil, Value::from)),
            ],
        ),
        Event::AllCleared => ("AllBlocksCleared", Vec::new()),
        Event::Unknown(tag) => (tag.as_str(), Vec::new()),
    };
    match encoding {
        Encoding::Positional => Value::Array(
            std::iter::once(Value::from(tag))
                .chain(fields.into_iter().map(|(_, v)| v))
                .collect(),
        ),
        Encoding::Tagged => Value::Map(
            std::iter::once(("type".into(), Value::from(tag)))
                .chain(fields.into_iter().map(|(k, v)| (Value::from(k), v)))
                .collect(),
        ),
    }
}
