//! Fuzzes the decoder of vLLM's and SGLang's KV-cache event frames: any parts give a frame or
//! a refusal with a reason, never a panic; a decoded batch decodes again from its payload.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringmaster_kv_events::{decode_batch, decode_frame};

fuzz_target!(|input: (u8, &[u8])| {
    let (split, bytes) = input;
    let _ = decode_batch(bytes);
    // The same bytes as a multipart message: topic, sequence, payload, split by the fuzzer.
    let first = usize::from(split).min(bytes.len());
    let (topic, rest) = bytes.split_at(first);
    let second = rest.len().min(8);
    let (sequence, payload) = rest.split_at(second);
    for parts in [
        vec![topic, sequence, payload],
        vec![sequence, payload],
        vec![topic, sequence, payload, payload],
    ] {
        let _ = decode_frame(&parts);
    }
});
