//! Picking the next token from logits without sorting the vocabulary: greedy at temperature 0,
//! else temperature, top-k and top-p over a softmax, with a uniform draw that depends only on
//! the request's seed and the token's position, so a sequence preempted and recomputed draws
//! the same tokens again.
//!
//! This is also the reference for the CUDA sampling kernel (`sample_rows` in
//! `ringmaster_cuda`'s kernels): both follow the same definitions, so the CPU and GPU engines
//! draw the same token from the same logits and draw, except where float sums in another order
//! put the draw on the other side of a boundary. The definitions:
//!
//! - the **top-k floor** is the k-th largest logit (every logit equal to it stays in);
//! - the **top-p floor** is the largest logit `v` among those left such that the softmax mass
//!   of the logits `≥ v` reaches `p` of theirs (again every tie stays in);
//! - the token is found by **inverse CDF in vocabulary order** over the logits at or above the
//!   floor: the first id whose running weight `exp((l − max) / T)` exceeds `u ×` the total.
//!
//! No step sorts the vocabulary: a floor is found by selection (`select_nth_unstable`) over the
//! candidates, and with neither cut-off the draw is one pass for the maximum, one for the
//! weights and a partial walk.

use std::cell::RefCell;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::request::SamplingParams;

/// The temperature when a request gives none (the Messages API's default).
pub const DEFAULT_TEMPERATURE: f32 = 1.0;

/// Candidates the top-p search sorts first; it widens eightfold while their mass falls short.
const NUCLEUS_FIRST_CANDIDATES: usize = 64;

/// Everything one row's draw needs: the kernel's per-row parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Draw {
    /// Softmax temperature; 0 or less is greedy.
    pub temperature: f32,
    /// Keep the `top_k` largest logits (0: no cut).
    pub top_k: u32,
    /// Keep the smallest set of largest logits holding this mass (1 or more: no cut).
    pub top_p: f32,
    /// The uniform draw in [0, 1).
    pub uniform: f32,
}

impl Draw {
    /// The draw for a request's `params` at output `position` under `seed`.
    pub fn new(params: &SamplingParams, seed: u64, position: u32) -> Self {
        Self {
            temperature: params.temperature.unwrap_or(DEFAULT_TEMPERATURE),
            top_k: params.top_k.unwrap_or(0),
            top_p: params.top_p.filter(|p| *p > 0.0).unwrap_or(1.0),
            uniform: uniform(seed, position),
        }
    }

    /// Whether this draw is the argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature <= 0.0 || self.top_k == 1
    }

    /// The token this draw picks from `logits`.
    pub fn pick(&self, logits: &[f32]) -> u32 {
        if self.is_greedy() || logits.len() < 2 {
            return argmax(logits);
        }
        let max = logits.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
        if !max.is_finite() {
            return argmax(logits);
        }
        let inv_t = 1.0 / self.temperature;
        let weight = |l: f32| ((l - max) * inv_t).exp();
        SCRATCH.with(|scratch| {
            let Scratch {
                weights,
                candidates,
                keys,
                kept,
            } = &mut *scratch.borrow_mut();
            let top_k = (self.top_k > 0 && (self.top_k as usize) < logits.len())
                .then(|| kth_largest(keys, logits, self.top_k as usize));
            let nucleus = self.top_p < 1.0;
            let Some(floor) = top_k.or_else(|| {
                nucleus.then(|| {
                    let total: f32 = logits.iter().map(|l| weight(*l)).sum();
                    let values = logits.iter().copied();
                    nucleus_floor(candidates, values, self.top_p * total, &weight)
                })
            }) else {
                // No cut-off: one pass of weights, then the walk.
                weights.clear();
                let mut total = 0.0f32;
                weights.extend(logits.iter().map(|l| {
                    let w = weight(*l);
                    total += w;
                    w
                }));
                return walk(
                    weights.iter().enumerate().map(|(i, w)| (i as u32, *w)),
                    self.uniform * total,
                );
            };
            // A cut-off keeps few ids: gather them in vocabulary order once, and do the rest
            // (top-p after top-k, the walk) on those.
            kept.clear();
            let mut total = 0.0f32;
            for (i, l) in logits.iter().enumerate() {
                if *l >= floor {
                    let w = weight(*l);
                    total += w;
                    kept.push((i as u32, *l, w));
                }
            }
            if nucleus && top_k.is_some() {
                let values = kept.iter().map(|k| k.1);
                let nucleus = nucleus_floor(candidates, values, self.top_p * total, &weight);
                if nucleus > floor {
                    kept.retain(|k| k.1 >= nucleus);
                    total = kept.iter().map(|k| k.2).sum();
                }
            }
            walk(kept.iter().map(|k| (k.0, k.2)), self.uniform * total)
        })
    }
}

/// Per-thread buffers, so a draw allocates nothing after a thread's first.
#[derive(Default)]
struct Scratch {
    weights: Vec<f32>,
    candidates: Vec<f32>,
    /// Order keys of the logits (the top-k selection).
    keys: Vec<u32>,
    /// (id, logit, weight) of the ids a cut-off keeps, in vocabulary order.
    kept: Vec<(u32, f32, f32)>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// The next token for `logits` at output `position`; `seed` is the request's (or one the
/// executor chose for it).
pub fn sample(logits: &[f32], params: &SamplingParams, seed: u64, position: u32) -> u32 {
    Draw::new(params, seed, position).pick(logits)
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

/// A uniform draw in [0, 1) from `seed` and `position`, with the 24 bits an f32 holds.
pub fn uniform(seed: u64, position: u32) -> f32 {
    let bits = xxh3_64_with_seed(&position.to_le_bytes(), seed);
    (bits >> 40) as f32 / (1u32 << 24) as f32
}

/// The first id whose running weight exceeds `target` over (id, weight) in vocabulary order;
/// the last weighted one if rounding leaves the target past the sum.
fn walk(weighted: impl Iterator<Item = (u32, f32)>, target: f32) -> u32 {
    let mut acc = 0.0f32;
    let mut last = 0;
    for (id, w) in weighted {
        if w > 0.0 {
            acc += w;
            last = id;
            if acc > target {
                return id;
            }
        }
    }
    last
}

/// Floats as unsigned keys in the same order (the device kernel's `order_key`): selection on
/// integers compares faster than on floats.
fn order_key(f: f32) -> u32 {
    let u = f.to_bits();
    if u & 0x8000_0000 != 0 {
        !u
    } else {
        u | 0x8000_0000
    }
}

fn key_value(k: u32) -> f32 {
    f32::from_bits(if k & 0x8000_0000 != 0 {
        k & 0x7fff_ffff
    } else {
        !k
    })
}

/// The `k`-th largest value of `logits` (1 ≤ k < len), by selection.
fn kth_largest(keys: &mut Vec<u32>, logits: &[f32], k: usize) -> f32 {
    keys.clear();
    keys.extend(logits.iter().map(|l| order_key(*l)));
    let at = keys.len() - k;
    key_value(*keys.select_nth_unstable(at).1)
}

/// The largest of `values` such that the weights of the values at or above it sum to `need`
/// or more: the largest candidates are sorted and summed, more of them each round while the
/// sum falls short (a peaked distribution needs one round of 64).
fn nucleus_floor(
    candidates: &mut Vec<f32>,
    values: impl Iterator<Item = f32>,
    need: f32,
    weight: &impl Fn(f32) -> f32,
) -> f32 {
    candidates.clear();
    candidates.extend(values);
    let by_value_down = |a: &f32, b: &f32| b.total_cmp(a);
    let mut take = NUCLEUS_FIRST_CANDIDATES;
    loop {
        let all = take >= candidates.len();
        let top = if all {
            candidates.sort_unstable_by(by_value_down);
            &candidates[..]
        } else {
            candidates.select_nth_unstable_by(take - 1, by_value_down);
            let top = &mut candidates[..take];
            top.sort_unstable_by(by_value_down);
            &*top
        };
        let mut mass = 0.0f32;
        for v in top {
            mass += weight(*v);
            if mass >= need {
                return *v;
            }
        }
        if all {
            // Rounding left the sum short of `p` of itself: keep everything.
            return top.last().copied().unwrap_or(f32::NEG_INFINITY);
        }
        take = take.saturating_mul(8);
    }
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

    /// The old sampler's definition, by sorting the whole vocabulary: the reference the
    /// selection-based one must agree with on the kept set.
    fn kept_by_sorting(logits: &[f32], top_k: u32, top_p: f32, t: f32) -> Vec<u32> {
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        order.sort_by(|a, b| logits[*b as usize].total_cmp(&logits[*a as usize]));
        let mut floor = f32::NEG_INFINITY;
        if top_k > 0 && (top_k as usize) < logits.len() {
            floor = logits[order[top_k as usize - 1] as usize];
        }
        let max = logits[order[0] as usize];
        let w = |l: f32| f64::from((l - max) / t).exp();
        let total: f64 = logits.iter().filter(|l| **l >= floor).map(|l| w(*l)).sum();
        if top_p < 1.0 {
            let mut mass = 0.0;
            for i in &order {
                let l = logits[*i as usize];
                mass += w(l);
                if mass >= f64::from(top_p) * total {
                    floor = floor.max(l);
                    break;
                }
            }
        }
        (0..logits.len() as u32)
            .filter(|i| logits[*i as usize] >= floor)
            .collect()
    }

    fn noisy_logits(seed: u64, n: usize) -> Vec<f32> {
        let mut state = seed | 1;
        (0..n)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let v = (state % 10_000) as f32 / 1_000.0 - 5.0;
                if i % 997 == 0 { v + 12.0 } else { v }
            })
            .collect()
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
    fn top_k_zero_means_no_cut() {
        let logits = [0.0f32, 0.0];
        let p = params(Some(1.0), Some(0), None);
        let ones = (0..400u64)
            .filter(|s| sample(&logits, &p, *s, 0) == 1)
            .count();
        assert!((120..280).contains(&ones), "{ones}");
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
    fn a_draw_never_leaves_the_kept_set() {
        for (k, p) in [(0, 0.3f32), (5, 1.0), (50, 0.9), (3, 0.5), (0, 0.999)] {
            let logits = noisy_logits(k as u64 + 11, 4096);
            let kept = kept_by_sorting(&logits, k, p, 0.8);
            let draw_params = params(Some(0.8), Some(k), Some(p));
            for seed in 0..200 {
                let token = sample(&logits, &draw_params, seed, 9);
                assert!(kept.binary_search(&token).is_ok(), "k {k} p {p}: {token}");
            }
        }
    }

    #[test]
    fn ties_at_the_floor_all_stay_in() {
        // Top-2 of [3, 5, 5, 5]: the floor is 5 and all three fives can be drawn.
        let logits = [3.0f32, 5.0, 5.0, 5.0];
        let p = params(Some(1.0), Some(2), None);
        let mut seen = [0; 4];
        for seed in 0..600 {
            seen[sample(&logits, &p, seed, 0) as usize] += 1;
        }
        assert_eq!(seen[0], 0);
        assert!(seen[1..].iter().all(|n| *n > 120), "{seen:?}");
    }

    /// Chi-square over a four-token distribution with each cut-off: the draws follow the
    /// softmax of the kept logits, renormalised.
    #[test]
    fn sampling_follows_the_distribution() {
        let logits = [0.0f32, 3f32.ln(), 2f32.ln(), -1.0];
        let cases: [(u32, f32, [f64; 4]); 3] = [
            (0, 1.0, [1.0, 3.0, 2.0, (-1f64).exp()]),
            (2, 1.0, [0.0, 3.0, 2.0, 0.0]),
            // Mass of {3}: 3 / 6.37 < 0.6; of {3, 2}: 5 / 6.37 ≥ 0.6.
            (0, 0.6, [0.0, 3.0, 2.0, 0.0]),
        ];
        for (k, p, weights) in cases {
            let total: f64 = weights.iter().sum();
            let draws = 20_000;
            let mut counts = [0f64; 4];
            let draw_params = params(Some(1.0), Some(k), Some(p));
            for seed in 0..draws {
                counts[sample(&logits, &draw_params, seed, 3) as usize] += 1.0;
            }
            let mut chi2 = 0.0;
            for (c, w) in counts.iter().zip(weights) {
                let expected = w / total * draws as f64;
                if expected == 0.0 {
                    assert_eq!(*c, 0.0, "k {k} p {p}: {counts:?}");
                } else {
                    chi2 += (c - expected).powi(2) / expected;
                }
            }
            // Three degrees of freedom at most: 16.3 is the 0.999 quantile.
            assert!(chi2 < 16.3, "k {k} p {p}: chi² {chi2:.1}, {counts:?}");
        }
    }

    #[test]
    fn temperature_sharpens_and_flattens() {
        let logits = [0.0f32, 1.0];
        let share = |t: f32| {
            let p = params(Some(t), None, None);
            (0..4000u64)
                .filter(|s| sample(&logits, &p, *s, 0) == 1)
                .count() as f64
                / 4000.0
        };
        // softmax([0, 1] / T)[1]: 0.982 at T = 0.25, 0.731 at 1, 0.562 at 4.
        assert!((share(0.25) - 0.982).abs() < 0.02);
        assert!((share(1.0) - 0.731).abs() < 0.03);
        assert!((share(4.0) - 0.562).abs() < 0.03);
    }

    #[test]
    fn infinite_and_degenerate_logits_do_not_panic() {
        let p = params(Some(1.0), Some(3), Some(0.9));
        assert_eq!(sample(&[f32::NEG_INFINITY; 4], &p, 1, 0), 0);
        assert_eq!(
            sample(&[f32::NEG_INFINITY, 2.0, f32::NEG_INFINITY], &p, 1, 0),
            1
        );
        assert_eq!(sample(&[1.0], &p, 1, 0), 0);
        assert_eq!(sample(&[], &p, 1, 0), 0);
        let mut big = vec![f32::NEG_INFINITY; 1000];
        big[700] = 0.0;
        assert_eq!(sample(&big, &params(Some(1.0), None, None), 5, 0), 700);
    }

    #[test]
    fn the_nucleus_search_widens_past_its_first_candidates() {
        // Flat logits: the nucleus of 0.9 is ~90 % of 10,000 ids, far past the first 64.
        let logits: Vec<f32> = (0..10_000).map(|i| (i % 7) as f32 * 1e-3).collect();
        let kept = kept_by_sorting(&logits, 0, 0.9, 1.0);
        assert!(kept.len() > 5_000);
        let p = params(Some(1.0), None, Some(0.9));
        for seed in 0..100 {
            let token = sample(&logits, &p, seed, 0);
            assert!(kept.binary_search(&token).is_ok());
        }
    }
}
