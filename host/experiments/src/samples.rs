//! [`VariantStats`]: one router variant's running totals and sliding windows of samples (TTFT,
//! and each request's cached and prompt tokens), kept across its versions, read by the
//! experiment's statistics and guardrails. Counters are atomics; the windows are short locks.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

/// TTFT samples kept per variant for `/admin/experiments` (the most recent ones).
pub const TTFT_SAMPLES_PER_VARIANT: usize = 10_000;
/// Running totals of one variant, kept across its versions.
#[derive(Debug, Default)]
pub struct VariantStats {
    /// Requests routed through the variant.
    pub requests: AtomicU64,
    /// Requests that ended in an error after routing.
    pub errors: AtomicU64,
    /// Policy faults (each fell back to the native ring).
    pub faults: AtomicU64,
    /// Prompt tokens of finished requests.
    pub prompt_tokens: AtomicU64,
    /// Of which served from the prefix cache.
    pub cached_tokens: AtomicU64,
    ttft: Mutex<VecDeque<f64>>,
    /// Each finished request's (cached, prompt) tokens, the same window as `ttft`: the
    /// samples behind the hit ratio's interval.
    cache: Mutex<VecDeque<(u32, u32)>>,
    /// Shadow only: decisions compared with the live one.
    pub shadow_decisions: AtomicU64,
    /// Shadow only: decisions equal to the live one.
    pub shadow_agreements: AtomicU64,
    shadow_load: Mutex<HashMap<String, u64>>,
}

impl VariantStats {
    /// Records a time to first token, in seconds.
    pub fn record_ttft(&self, seconds: f64) {
        push_to_window(&self.ttft, seconds);
    }

    /// Records a finished request's prompt tokens and how many of them were cached: adds them
    /// to the totals and keeps the pair for the hit ratio's interval.
    pub fn record_cache(&self, cached_tokens: u32, prompt_tokens: u32) {
        self.prompt_tokens.fetch_add(
            u64::from(prompt_tokens),
            std::sync::atomic::Ordering::Relaxed,
        );
        self.cached_tokens.fetch_add(
            u64::from(cached_tokens),
            std::sync::atomic::Ordering::Relaxed,
        );
        push_to_window(&self.cache, (cached_tokens, prompt_tokens));
    }

    /// A copy of the (cached, prompt) token samples.
    pub fn cache_samples(&self) -> Vec<(u32, u32)> {
        copy_of_window(&self.cache)
    }

    /// A copy of the TTFT samples.
    pub fn ttft_samples(&self) -> Vec<f64> {
        copy_of_window(&self.ttft)
    }

    /// Shadow only: counts one decision for `server`.
    pub fn record_shadow_choice(&self, server: String) {
        *self
            .shadow_load
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(server)
            .or_default() += 1;
    }

    /// Shadow only: decisions per server it would have made.
    pub fn shadow_load(&self) -> HashMap<String, u64> {
        self.shadow_load
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Appends to a variant's sliding window of the last [`TTFT_SAMPLES_PER_VARIANT`] samples.
fn push_to_window<T>(window: &Mutex<VecDeque<T>>, sample: T) {
    let mut samples = window.lock().unwrap_or_else(|e| e.into_inner());
    if samples.len() == TTFT_SAMPLES_PER_VARIANT {
        samples.pop_front();
    }
    samples.push_back(sample);
}

/// A copy of a sliding window's samples, oldest first.
fn copy_of_window<T: Copy>(window: &Mutex<VecDeque<T>>) -> Vec<T> {
    window
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .copied()
        .collect()
}
