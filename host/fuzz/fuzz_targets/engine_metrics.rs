//! Fuzzes the reading of an engine's own `/metrics` (vLLM, SGLang, TGI, llama.cpp): any text
//! gives a load report or nothing, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringmaster_pool::remote::engine_metrics::read_metrics;

fuzz_target!(|text: &str| {
    if let Some((_, report)) = read_metrics(text) {
        // A report's usage is a share of the cache, whatever the engine claimed.
        assert!(report.kv_blocks_used <= report.kv_blocks_total.max(report.kv_blocks_used));
    }
});
