//! Fuzzes the OpenAI doors' parsers (chat and legacy completions) and the count_tokens body:
//! any bytes give a validated request or a client error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringmaster_api::{Door, Limits};

fuzz_target!(|body: &[u8]| {
    let models = ["sim-llama-3-8b".to_owned()];
    let limits = Limits::new(&models, 8192);
    for parsed in [
        Door::Chat.parse(body, limits),
        Door::Completions.parse(body, limits),
        ringmaster_api::messages::parse_count_tokens(body, limits),
    ] {
        match parsed {
            Ok(request) => {
                assert!(!request.messages.is_empty());
                assert!((1..=8192).contains(&request.max_tokens));
                if let Some(t) = request.sampling.temperature {
                    assert!((0.0..=2.0).contains(&t));
                }
            }
            Err(error) => assert!(error.kind().status().is_client_error()),
        }
    }
});
