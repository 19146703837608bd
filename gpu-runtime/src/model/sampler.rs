//! Picking the next token from logits: greedy at temperature 0, else temperature, top-k and
//! top-p over a softmax, with a random draw that depends only on the request's seed and the
//! token's position, so a sequence preempted and recomputed draws the same tokens again.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::request::SamplingParams;

/// The temperature when a request gives none (the Messages API's default).
pub const DEFAULT_TEMPERATURE: f32 = 1.0;

/// The next token for `logits` at output `position`; `seed` is the request's (or one the
/// executor chose for it).
pub fn sample(logits: &[f32], params: &SamplingParams, seed: u64, position: u32) -> u32 {
    let temperature = params.temperature.unwrap_or(DEFAULT_TEMPERATURE);
    if temperature <= 0.0 || logits.len() < 2 {
        return argmax(logits);
    }
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let k = params
        .top_k
        .map_or(logits.len(), |k| (k as usize).clamp(1, logits.len()));
    let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]);
    if k < order.len() {
        order.select_nth_unstable_by(k - 1, by_logit);
        order.truncate(k);
    }
    order.sort_unstable_by(by_logit);
    let max = logits[order[0] as usize];
    let mut weights: Vec<f64> = order
        .iter()
        .map(|&i| (f64::from(logits[i as usize] - max) / f64::from(temperature)).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    if let Some(p) = params.top_p.filter(|p| *p > 0.0 && *p < 1.0) {
        let mut mass = 0.0;
        let mut keep = weights.len();
        for (i, w) in weights.iter().enumerate() {
            mass += w / total;
            if mass >= f64::from(p) {
                keep = i + 1;
                break;
            }
        }
        weights.truncate(keep);
        order.truncate(keep);
    }
    let total: f64 = weights.iter().sum();
    let draw = uniform(seed, position) * total;
    let mut acc = 0.0;
    for (i, w) in weights.iter().enumerate() {
        acc += w;
        if draw < acc {
            return order[i];
        }
    }
    order[order.len() - 1]
}

/// The index of the largest logit (the first on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// A uniform draw in [0, 1) from `seed` and `position`.
fn uniform(seed: u64, position: u32) -> f64 {
    let bits = xxh3_64_with_seed(&position.to_le_bytes(), seed);
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: Option<f32>, top_k: Option<u32>, top_p: Option<f32>) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p,
            top_k,
            seed: None,
            ignore_eos: false,
        }
    }

    #[test]
    fn temperature_zero_is_greedy() {
        let logits = [0.1, 3.0, 2.9, -1.0];
        for seed in 0..20 {
            assert_eq!(sample(&logits, &params(Some(0.0), None, None), seed, 0), 1);
        }
    }

    #[test]
    fn top_k_one_is_greedy_and_draws_are_reproducible() {
        let logits = [0.1, 3.0, 2.9, -1.0];
        assert_eq!(sample(&logits, &params(Some(1.0), Some(1), None), 7, 3), 1);
        let p = params(Some(1.0), None, None);
        assert_eq!(sample(&logits, &p, 42, 5), sample(&logits, &p, 42, 5));
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // Token 0 holds almost all the mass: a nucleus of 0.5 is token 0 alone.
        let logits = [10.0, 0.0, 0.0, 0.0];
        for seed in 0..50 {
            assert_eq!(
                sample(&logits, &params(Some(1.0), None, Some(0.5)), seed, 0),
                0
            );
        }
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let logits = [0.0f32, (3.0f32).ln()];
        let p = params(Some(1.0), None, None);
        let ones = (0..4000u64)
            .filter(|s| sample(&logits, &p, *s, 0) == 1)
            .count();
        let share = ones as f64 / 4000.0;
        assert!((share - 0.75).abs() < 0.03, "{share}");
    }
}
