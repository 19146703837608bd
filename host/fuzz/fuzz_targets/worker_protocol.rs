//! Fuzzes both ends of the worker protocol: a worker's reading of a request body (chat and
//! completions), and a gateway's reading of a worker's load report, tokenizer description and
//! `/kv/events` messages. Any bytes give a value or a typed refusal, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringmaster_gpu_runtime::block::BlockHash;
use ringmaster_pool::kv_view::ReportedCache;
use ringmaster_wire::worker::Load;
use ringmaster_worker::openai::{Endpoint, Request};

fuzz_target!(|bytes: &[u8]| {
    for endpoint in [Endpoint::Chat, Endpoint::Completions] {
        if let Ok(request) = Request::parse(bytes, endpoint, "m", "req_fuzz") {
            let _ = format!("{request:?}");
        }
    }
    let _ = serde_json::from_slice::<Load>(bytes);
    if let Ok(text) = std::str::from_utf8(bytes) {
        let view = ReportedCache::default();
        for line in text.lines() {
            let _ = view.apply(line);
        }
        let _ = view.held_blocks(&[BlockHash(1), BlockHash(2), BlockHash(3)]);
    }
});
