//! The built-in policies (`builtin:NAME` in a config), embedded in the binary so
//! `ringmaster serve` needs no policy files and a plain `cargo build` needs no Wasm toolchain.
//!
//! The bytes are the committed components in `policies/dist/`, built from `policies/*` by
//! `cargo xtask policies`; `cargo xtask policies --check` (run by `tests/run`) proves that
//! rebuilding the sources reproduces them byte for byte.

/// `(name, component bytes)` of every built-in policy.
pub const BUILTIN_POLICIES: &[(&str, &[u8])] = &[
    (
        "consistent-hash",
        include_bytes!("../../../policies/dist/consistent-hash.wasm"),
    ),
    (
        "cache-aware",
        include_bytes!("../../../policies/dist/cache-aware.wasm"),
    ),
    (
        "prefix-affinity",
        include_bytes!("../../../policies/dist/prefix-affinity.wasm"),
    ),
    (
        "kv-cost",
        include_bytes!("../../../policies/dist/kv-cost.wasm"),
    ),
    (
        "weighted-scorers",
        include_bytes!("../../../policies/dist/weighted-scorers.wasm"),
    ),
    (
        "prefix-cache",
        include_bytes!("../../../policies/dist/prefix-cache.wasm"),
    ),
    (
        "least-loaded",
        include_bytes!("../../../policies/dist/least-loaded.wasm"),
    ),
    (
        "round-robin",
        include_bytes!("../../../policies/dist/round-robin.wasm"),
    ),
    (
        "pair-prefix",
        include_bytes!("../../../policies/dist/pair-prefix.wasm"),
    ),
    (
        "pair-llm-d",
        include_bytes!("../../../policies/dist/pair-llm-d.wasm"),
    ),
    (
        "pair-dynamo",
        include_bytes!("../../../policies/dist/pair-dynamo.wasm"),
    ),
    (
        "pair-split",
        include_bytes!("../../../policies/dist/pair-split.wasm"),
    ),
    (
        "learned-ttft",
        include_bytes!("../../../policies/dist/learned-ttft.wasm"),
    ),
    (
        "tiered",
        include_bytes!("../../../policies/dist/tiered.wasm"),
    ),
    (
        "blocklist",
        include_bytes!("../../../policies/dist/blocklist.wasm"),
    ),
];

/// The built-in policy called `name`.
pub fn builtin(name: &str) -> Option<&'static [u8]> {
    BUILTIN_POLICIES
        .iter()
        .find(|(builtin, _)| *builtin == name)
        .map(|(_, bytes)| *bytes)
}

/// The names of the built-in policies, for error messages.
pub fn builtin_names() -> String {
    BUILTIN_POLICIES
        .iter()
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The built-in policy whose bytes have content hash `hash` ([`crate::content_hash`]), so
/// that a listing can name a loaded version's source rather than its hash alone.
pub fn builtin_by_hash(hash: &str) -> Option<&'static str> {
    static HASHES: std::sync::OnceLock<Vec<(String, &'static str)>> = std::sync::OnceLock::new();
    HASHES
        .get_or_init(|| {
            BUILTIN_POLICIES
                .iter()
                .map(|(name, bytes)| (crate::content_hash(bytes), *name))
                .collect()
        })
        .iter()
        .find(|(h, _)| h == hash)
        .map(|(_, name)| *name)
}
