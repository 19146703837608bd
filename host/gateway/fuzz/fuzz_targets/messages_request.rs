//! Fuzzes the Messages request parser: any bytes give a validated request or a client error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringmaster_gateway::api::{Limits, parse_messages_request};

fuzz_target!(|body: &[u8]| {
    let models = ["sim-llama-3-8b".to_owned()];
    let limits = Limits {
        models: &models,
        max_output_tokens: 8192,
    };
    match parse_messages_request(body, limits) {
        Ok(request) => {
            assert!(!request.messages.is_empty());
            assert!((1..=8192).contains(&request.max_tokens));
        }
        Err(error) => assert!(error.kind().status().is_client_error()),
    }
});
