//! Fuzzes the reading of a server's reply, in each API's events (OpenAI chat chunks,
//! Anthropic's Messages events, OpenAI's Responses events): any bytes, split anywhere, give
//! engine events that end exactly once (a finish or a failure), last.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringmaster_gpu_runtime::GenerateEvent;
use ringmaster_pool::remote::ReplyReader;

fuzz_target!(|input: (u8, u8, &[u8])| {
    let (api, split, bytes) = input;
    let api = ringmaster_wire::Api::ALL[usize::from(api) % ringmaster_wire::Api::ALL.len()];
    let mut reader = ReplyReader::of(api, 4096);
    let mut events = Vec::new();
    for piece in bytes.chunks(usize::from(split).max(1)) {
        reader.feed(piece, &mut events);
    }
    reader.end(&mut events);
    let ends = events
        .iter()
        .filter(|e| {
            matches!(
                e,
                GenerateEvent::Finished { .. } | GenerateEvent::Failed { .. }
            )
        })
        .count();
    assert_eq!(ends, 1, "{events:?}");
    assert!(matches!(
        events.last(),
        Some(GenerateEvent::Finished { .. } | GenerateEvent::Failed { .. })
    ));
});
