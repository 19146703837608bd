//! Fuzzes the configuration parser and validator: any text gives a config or a named error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringmaster_config::RawConfig;

fuzz_target!(|text: &str| {
    if let Ok(raw) = RawConfig::from_toml(text) {
        // Validation must not start anything or panic; the environment is empty.
        let _ = raw.validate_with_env(|_| None);
    }
});
