//! Fuzzes the reading of a server's reply: any bytes, split anywhere, give engine events that
//! end exactly once (a finish or a failure), and the buffers stay within the event limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringmaster_gateway::remote::{ReplyDecoder, SseDecoder};
use ringmaster_gpu_runtime::GenerateEvent;

const LIMIT: usize = 4096;

fuzz_target!(|input: (u8, &[u8])| {
    let (split, bytes) = input;
    let split = usize::from(split).max(1);
    let mut sse = SseDecoder::new(LIMIT);
    let mut reply = ReplyDecoder::default();
    let mut events = Vec::new();
    for piece in bytes.chunks(split) {
        sse.push(piece);
        while let Some(event) = sse.next_event() {
            match event {
                Ok(data) => {
                    assert!(data.len() <= LIMIT);
                    reply.data(data, &mut events);
                }
                Err(e) => reply.fail(e.to_string(), &mut events),
            }
            if reply.is_done() {
                break;
            }
        }
        if reply.is_done() {
            break;
        }
    }
    if let Some(Ok(data)) = sse.finish() {
        reply.data(data, &mut events);
    }
    reply.end_of_body(&mut events);
    let ends = events
        .iter()
        .filter(|e| matches!(e, GenerateEvent::Finished { .. } | GenerateEvent::Failed { .. }))
        .count();
    assert_eq!(ends, 1, "{events:?}");
    assert!(matches!(
        events.last(),
        Some(GenerateEvent::Finished { .. } | GenerateEvent::Failed { .. })
    ));
});
