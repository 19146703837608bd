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
    /// Of finished requests' prompt tokens, those the best-placed candidate held at the
    /// decision (the gateway's cache view): what the variant could have had.
    pub reachable_cached_tokens: AtomicU64,
    /// Of finished requests' prompt tokens, those the chosen server held: what it took.
    pub achieved_cached_tokens: AtomicU64,
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
    /// Records a finished request's reach: of its prompt tokens, the most any candidate held
    /// at the decision, and what the chosen one held (each at most its prompt tokens, so
    /// that the totals stand beside [`Self::prompt_tokens`] in one unit).
    pub fn record_reach(&self, reachable: u64, achieved: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.reachable_cached_tokens.fetch_add(reachable, Relaxed);
        self.achieved_cached_tokens.fetch_add(achieved, Relaxed);
    }

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

/// The last `n` of `all`.
fn last<T>(mut all: Vec<T>, n: usize) -> Vec<T> {
    let skip = all.len().saturating_sub(n);
    all.drain(..skip);
    all
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

/// One variant's figures as numbers, to be summed over replicas: its totals and its most
/// recent samples. What a replica publishes, and what `/admin/experiments` reads.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct VariantFigures {
    /// Requests routed through the variant.
    pub requests: u64,
    /// Requests that ended in an error after routing.
    pub errors: u64,
    /// Policy faults.
    pub faults: u64,
    /// Prompt tokens of finished requests.
    pub prompt_tokens: u64,
    /// Of which cached.
    pub cached_tokens: u64,
    /// Of the prompt tokens, those the best-placed candidate held at each decision, summed.
    #[serde(default)]
    pub reachable_cached_tokens: u64,
    /// Of the prompt tokens, those the chosen server held at each decision, summed.
    #[serde(default)]
    pub achieved_cached_tokens: u64,
    /// Times to first token, seconds, most recent last.
    pub ttft: Vec<f64>,
    /// Each request's (cached, prompt) tokens, most recent last.
    pub cache: Vec<(u32, u32)>,
}

impl VariantStats {
    /// The variant's totals and its last `samples` samples of each window.
    pub fn figures(&self, samples: usize) -> VariantFigures {
        use std::sync::atomic::Ordering::Relaxed;
        VariantFigures {
            requests: self.requests.load(Relaxed),
            errors: self.errors.load(Relaxed),
            faults: self.faults.load(Relaxed),
            prompt_tokens: self.prompt_tokens.load(Relaxed),
            cached_tokens: self.cached_tokens.load(Relaxed),
            reachable_cached_tokens: self.reachable_cached_tokens.load(Relaxed),
            achieved_cached_tokens: self.achieved_cached_tokens.load(Relaxed),
            ttft: last(self.ttft_samples(), samples),
            cache: last(self.cache_samples(), samples),
        }
    }
}

impl VariantFigures {
    /// Adds another replica's figures (totals summed, samples pooled).
    pub fn add(&mut self, other: &Self) {
        self.requests += other.requests;
        self.errors += other.errors;
        self.faults += other.faults;
        self.prompt_tokens += other.prompt_tokens;
        self.cached_tokens += other.cached_tokens;
        self.reachable_cached_tokens += other.reachable_cached_tokens;
        self.achieved_cached_tokens += other.achieved_cached_tokens;
        self.ttft.extend_from_slice(&other.ttft);
        self.cache.extend_from_slice(&other.cache);
    }

    /// Achieved over reachable cached tokens: the share of the cache the variant could have
    /// used that it did (`None` before any was reachable).
    pub fn reach_ratio(&self) -> Option<f64> {
        (self.reachable_cached_tokens > 0)
            .then(|| self.achieved_cached_tokens as f64 / self.reachable_cached_tokens as f64)
    }

    /// Cached over prompt tokens (`None` before any).
    pub fn hit_ratio(&self) -> Option<f64> {
        (self.prompt_tokens > 0).then(|| self.cached_tokens as f64 / self.prompt_tokens as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_keep_the_last_samples_and_add_up() {
        let stats = VariantStats::default();
        for i in 0..10 {
            stats.record_ttft(f64::from(i));
            stats.record_cache(i, 10);
        }
        stats
            .requests
            .store(10, std::sync::atomic::Ordering::Relaxed);
        let mut a = stats.figures(3);
        assert_eq!(a.ttft, vec![7.0, 8.0, 9.0]);
        assert_eq!(a.cache.len(), 3);
        let b = stats.figures(100);
        a.add(&b);
        assert_eq!(a.requests, 20);
        assert_eq!(a.ttft.len(), 13);
        assert_eq!(a.prompt_tokens, 200);
        assert_eq!(a.hit_ratio(), Some(90.0 / 200.0));
    }
}
