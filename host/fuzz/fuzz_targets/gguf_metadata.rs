//! Fuzzes the reading and checking of a GGUF file's header (metadata and tensor directory):
//! any bytes give a checked llama header or a `ModelError`, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringmaster_gpu_runtime::model::gguf::check_header;

fuzz_target!(|bytes: &[u8]| {
    let mut reader = std::io::Cursor::new(bytes);
    if let Ok((_, config)) = check_header(&mut reader, "fuzz.gguf") {
        assert!(config.layers > 0 && config.heads > 0);
    }
});
