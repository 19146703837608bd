//! Fuzzes the Responses door's parser and the relay of a body to a server of its own API: any
//! bytes give a validated request or a client error, and a body the door took is relayed as a
//! JSON object.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringmaster_api::relay::{RelayEdits, relay_body};
use ringmaster_api::{Door, Limits, VolatileLines};

fuzz_target!(|body: &[u8]| {
    let models = ["sim-llama-3-8b".to_owned()];
    let volatile = VolatileLines::new([ringmaster_api::volatile::CLAUDE_CODE_BILLING_LINE])
        .unwrap_or_default();
    let limits = Limits {
        volatile: &volatile,
        ..Limits::new(&models, 8192)
    };
    let prior = ringmaster_api::responses::Prior {
        id: "resp_1",
        items: r#"[{"type":"message","role":"user","content":"earlier"}]"#,
    };
    for door in [Door::Responses, Door::Messages, Door::Chat] {
        let parsed = door.parse_continuing(body, limits, Some(prior));
        match parsed {
            Ok(request) => {
                assert!(!request.messages.is_empty());
                assert!((1..=8192).contains(&request.max_tokens));
                let edits = RelayEdits {
                    model: "served",
                    volatile: Some(&volatile),
                    drop: &request.fields.unknown,
                    stream_usage: true,
                    usage_stats: true,
                    prior_items: Some(prior.items),
                    clamped: request.clamped,
                };
                let relayed = relay_body(door, body, &edits).expect("a body the door took relays");
                let value: serde_json::Value =
                    serde_json::from_slice(&relayed).expect("a relayed body is JSON");
                assert!(value.is_object());
                assert_eq!(value["model"], "served");
            }
            Err(error) => assert!(error.kind().status().is_client_error()),
        }
    }
});
