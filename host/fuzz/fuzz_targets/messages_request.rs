//! Fuzzes the Messages door's parser: any bytes give a validated request or a client error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringmaster_api::{Door, Limits};

fuzz_target!(|body: &[u8]| {
    let models = ["sim-llama-3-8b".to_owned()];
    let limits = Limits::new(&models, 8192);
    match Door::Messages.parse(body, limits) {
        Ok(request) => {
            assert!(!request.messages.is_empty());
            assert!((1..=8192).contains(&request.max_tokens));
        }
        Err(error) => assert!(error.kind().status().is_client_error()),
    }
});
