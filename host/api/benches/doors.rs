//! The doors' share of a request's CPU: parsing a body into the one request, and writing a
//! reply's events as each door's stream and whole body (the benchmark's eight-token reply).
//!
//!   cargo bench -p ringmaster-api --bench doors

use criterion::{Criterion, criterion_group, criterion_main};
use ringmaster_api::reply::{ReplyEvent, StopReason, StreamWriter, Usage, WholeReply};
use ringmaster_api::{Door, Limits};
use std::hint::black_box;

const MESSAGES: &[u8] = br#"{"model":"fake","max_tokens":8,"messages":[{"role":"user","content":"Hello there, how are you today?"}]}"#;
const RESPONSES: &[u8] = br#"{"model":"fake","max_output_tokens":8,"stream":true,"instructions":"Be brief.","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"Hello there, how are you today?"}]}]}"#;
const CHAT: &[u8] = br#"{"model":"fake","max_tokens":8,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello there, how are you today?"}]}"#;

fn events() -> Vec<ReplyEvent<'static>> {
    let usage = Usage {
        prompt_tokens: 12,
        cached_tokens: 4,
        output_tokens: 8,
    };
    let mut events = vec![ReplyEvent::Start { usage }];
    events.extend(std::iter::repeat_n(ReplyEvent::Text("tok "), 8));
    events.push(ReplyEvent::Stop {
        reason: StopReason::MaxTokens,
        stop_sequence: None,
        usage,
    });
    events
}

fn doors(c: &mut Criterion) {
    let models = ["fake".to_owned()];
    let limits = Limits::new(&models, 4096);
    c.bench_function("parse/messages", |b| {
        b.iter(|| Door::Messages.parse(black_box(MESSAGES), limits).unwrap())
    });
    c.bench_function("parse/chat", |b| {
        b.iter(|| Door::Chat.parse(black_box(CHAT), limits).unwrap())
    });
    c.bench_function("parse/responses", |b| {
        b.iter(|| Door::Responses.parse(black_box(RESPONSES), limits).unwrap())
    });
    let edits = ringmaster_api::relay::RelayEdits {
        model: "served",
        volatile: None,
        drop: &[],
        stream_usage: true,
        usage_stats: true,
        prior_items: None,
        clamped: None,
    };
    c.bench_function("relay/messages", |b| {
        b.iter(|| {
            ringmaster_api::relay::relay_body(Door::Messages, black_box(MESSAGES), &edits).unwrap()
        })
    });
    let events = events();
    for door in [Door::Messages, Door::Chat, Door::Responses] {
        let request = ringmaster_api::Request::new(door, "fake".into());
        c.bench_function(&format!("stream/{}", door.label()), |b| {
            b.iter(|| {
                let mut writer = StreamWriter::new(door, "id-1".into(), "fake".into(), true);
                let mut out = Vec::with_capacity(2048);
                for event in &events {
                    writer.write(event, &mut out);
                }
                out
            })
        });
        c.bench_function(&format!("whole/{}", door.label()), |b| {
            b.iter(|| {
                let mut whole = WholeReply::default();
                for event in &events {
                    whole.push(event);
                }
                door.whole_body(&whole, "id-1", &request).unwrap()
            })
        });
    }
}

criterion_group!(benches, doors);
criterion_main!(benches);
