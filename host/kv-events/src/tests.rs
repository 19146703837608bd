use rmpv::Value;

use super::*;

fn encode(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, value).unwrap();
    out
}

fn s(text: &str) -> Value {
    Value::from(text)
}

fn ints(values: &[i64]) -> Value {
    Value::Array(values.iter().map(|&v| Value::from(v)).collect())
}

fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(pairs.into_iter().map(|(k, v)| (s(k), v)).collect())
}

/// vLLM's positional encoding (msgspec `array_like`): a stored event with every field up to
/// the group index, a removal, a clear; the batch with its data-parallel rank.
fn positional_batch() -> Value {
    Value::Array(vec![
        Value::F64(1_700_000_000.5),
        Value::Array(vec![
            Value::Array(vec![
                s("BlockStored"),
                ints(&[11, 12]),
                Value::Nil,
                ints(&[1, 2, 3, 4]),
                Value::from(2),
                Value::Nil,
                s("GPU"),
                s("my-adapter"),
                Value::Array(vec![Value::Nil, Value::Nil]),
                Value::from(0),
            ]),
            Value::Array(vec![s("BlockRemoved"), ints(&[11]), s("GPU")]),
            Value::Array(vec![s("AllBlocksCleared")]),
        ]),
        Value::from(1),
    ])
}

#[test]
fn the_positional_encoding_reads_every_field() {
    let batch = decode_batch(&encode(&positional_batch())).unwrap();
    assert_eq!(batch.data_parallel_rank, Some(1));
    assert_eq!(batch.events.len(), 3);
    let Event::Stored(stored) = &batch.events[0] else {
        panic!("stored first");
    };
    assert_eq!(
        stored.block_hashes,
        [EngineHash::Int(11), EngineHash::Int(12)]
    );
    assert_eq!(stored.parent_block_hash, None);
    assert_eq!(stored.token_ids, [1, 2, 3, 4]);
    assert_eq!(stored.block_size, 2);
    assert_eq!(stored.medium.as_deref(), Some("GPU"));
    assert_eq!(stored.lora_name.as_deref(), Some("my-adapter"));
    assert_eq!(stored.group_idx, Some(0));
    assert_eq!(
        batch.events[1],
        Event::Removed(BlockRemoved {
            block_hashes: vec![EngineHash::Int(11)],
            medium: Some("GPU".into()),
            group_idx: None,
        })
    );
    assert_eq!(batch.events[2], Event::AllCleared);
}

#[test]
fn the_map_encoding_reads_the_same_and_ignores_fields_it_does_not_know() {
    let batch = map(vec![
        ("ts", Value::F64(1.0)),
        (
            "events",
            Value::Array(vec![
                map(vec![
                    ("type", s("BlockStored")),
                    (
                        "block_hashes",
                        Value::Array(vec![Value::Binary(vec![0xab; 32])]),
                    ),
                    ("parent_block_hash", Value::Binary(vec![0xcd; 32])),
                    ("token_ids", ints(&[5, 6])),
                    ("block_size", Value::from(2)),
                    ("lora_id", Value::Nil),
                    ("medium", s("GPU")),
                    ("lora_name", Value::Nil),
                    ("kv_cache_spec_kind", s("full_attention")),
                    ("a_field_from_the_future", Value::from(7)),
                ]),
                map(vec![
                    ("type", s("BlockRemoved")),
                    (
                        "block_hashes",
                        Value::Array(vec![Value::Binary(vec![0xab; 32])]),
                    ),
                    ("medium", Value::Nil),
                    ("group_idx", Value::from(3)),
                ]),
                map(vec![("type", s("SomethingNew"))]),
            ]),
        ),
    ]);
    let batch = decode_batch(&encode(&batch)).unwrap();
    assert_eq!(batch.data_parallel_rank, None);
    let Event::Stored(stored) = &batch.events[0] else {
        panic!("stored first");
    };
    assert_eq!(stored.block_hashes, [EngineHash::Bytes(vec![0xab; 32])]);
    assert_eq!(
        stored.parent_block_hash,
        Some(EngineHash::Bytes(vec![0xcd; 32]))
    );
    assert_eq!(
        (stored.token_ids.as_slice(), stored.block_size),
        (&[5, 6][..], 2)
    );
    let Event::Removed(removed) = &batch.events[1] else {
        panic!("removed second");
    };
    assert_eq!(removed.group_idx, Some(3));
    assert_eq!(batch.events[2], Event::Unknown("SomethingNew".into()));
}

#[test]
fn older_events_without_trailing_fields_take_their_defaults() {
    // vLLM before lora_name and group_idx: six fields after the tag.
    let batch = Value::Array(vec![
        Value::F64(0.0),
        Value::Array(vec![Value::Array(vec![
            s("BlockStored"),
            ints(&[-5]),
            Value::from(4),
            ints(&[9]),
            Value::from(1),
            Value::from(3),
        ])]),
    ]);
    let batch = decode_batch(&encode(&batch)).unwrap();
    let Event::Stored(stored) = &batch.events[0] else {
        panic!("stored");
    };
    assert_eq!(stored.block_hashes, [EngineHash::Int(-5)]);
    assert_eq!(stored.parent_block_hash, Some(EngineHash::Int(4)));
    assert_eq!(stored.lora_id, Some(3));
    assert_eq!((stored.medium.clone(), stored.group_idx), (None, None));
}

#[test]
fn a_frame_carries_its_big_endian_sequence() {
    let payload = encode(&positional_batch());
    let frame = decode_frame(&[b"kv", &7u64.to_be_bytes(), &payload]).unwrap();
    assert_eq!((frame.topic.as_slice(), frame.sequence), (&b"kv"[..], 7));
    assert_eq!(
        decode_frame(&[b"kv", &payload]),
        Err(DecodeError::Parts { parts: 2 })
    );
    assert_eq!(
        decode_frame(&[b"kv", b"\x01", &payload]),
        Err(DecodeError::Sequence(1))
    );
}

#[test]
fn garbage_and_oversized_batches_are_refused_with_a_reason() {
    for garbage in [&b"\xc1"[..], b"", b"\x92", b"\xdd\xff\xff\xff\xff"] {
        let error = decode_batch(garbage).unwrap_err();
        assert!(
            matches!(error, DecodeError::Msgpack(_) | DecodeError::Malformed(_)),
            "{error}"
        );
    }
    assert!(matches!(
        decode_batch(&encode(&s("not a batch"))),
        Err(DecodeError::Malformed(_))
    ));
    assert!(matches!(
        decode_batch(&encode(&Value::Array(vec![
            Value::F64(0.0),
            Value::Array(vec![Value::Array(vec![s("BlockStored"), s("no list")])]),
        ]))),
        Err(DecodeError::Malformed(_))
    ));
    let many = Value::Array(vec![
        Value::F64(0.0),
        Value::Array(vec![
            Value::Array(vec![s("AllBlocksCleared")]);
            MAX_EVENTS_PER_BATCH + 1
        ]),
    ]);
    assert!(matches!(
        decode_batch(&encode(&many)),
        Err(DecodeError::Oversized(_))
    ));
}

proptest::proptest! {
    /// Whatever arrives, the decoder answers with a batch or a reason, never a panic.
    #[test]
    fn any_bytes_decode_or_are_refused(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
        let _ = decode_batch(&bytes);
    }

    /// A valid batch cut anywhere is refused, not misread as a shorter one.
    #[test]
    fn a_truncated_batch_is_refused(cut in 0usize..200) {
        let payload = encode(&positional_batch());
        let cut = cut.min(payload.len() - 1);
        proptest::prop_assert!(decode_batch(&payload[..cut]).is_err());
    }
}

#[test]
fn what_the_encoder_writes_decodes_to_the_same_batch_in_both_encodings() {
    let batch = Batch {
        ts: 12.5,
        events: vec![
            Event::Stored(BlockStored {
                block_hashes: vec![EngineHash::Int(-3), EngineHash::Bytes(vec![1, 2, 3])],
                parent_block_hash: Some(EngineHash::Int(u64::MAX as i128)),
                token_ids: (0..32).collect(),
                block_size: 16,
                lora_id: Some(4),
                medium: Some("GPU".into()),
                lora_name: Some("sql".into()),
                extra_keys: Some(vec![Value::Nil, s("salt")]),
                group_idx: Some(1),
            }),
            Event::Removed(BlockRemoved {
                block_hashes: vec![EngineHash::Int(9)],
                medium: None,
                group_idx: None,
            }),
            Event::AllCleared,
        ],
        data_parallel_rank: Some(2),
    };
    for encoding in [Encoding::Positional, Encoding::Tagged] {
        let [topic, sequence, payload] = encode_frame(b"kv", 7, &batch, encoding);
        let frame = decode_frame(&[&topic, &sequence, &payload]).unwrap();
        assert_eq!((frame.sequence, &frame.topic[..]), (7, &b"kv"[..]));
        assert_eq!(frame.batch, batch, "{encoding:?}");
    }
    // The positional form is msgspec's array_like struct: exactly this msgpack.
    let stored_only = Batch {
        ts: 0.0,
        events: vec![Event::Stored(BlockStored {
            block_hashes: vec![EngineHash::Int(1)],
            token_ids: vec![5],
            block_size: 1,
            ..BlockStored::default()
        })],
        data_parallel_rank: None,
    };
    let by_hand = encode(&Value::Array(vec![
        Value::F64(0.0),
        Value::Array(vec![Value::Array(vec![
            s("BlockStored"),
            ints(&[1]),
            Value::Nil,
            ints(&[5]),
            Value::from(1),
            Value::Nil,
            Value::Nil,
            Value::Nil,
            Value::Nil,
            Value::Nil,
        ])]),
        Value::Nil,
    ]));
    assert_eq!(encode_batch(&stored_only, Encoding::Positional), by_hand);
}
