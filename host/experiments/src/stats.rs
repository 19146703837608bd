//! The statistics behind `GET /admin/experiments`: whether a candidate router's TTFT differs
//! from the control's, in a form that holds up when operators look at it as often as they
//! like.
//!
//! TTFT is heavy-tailed and dashboards are read while an experiment runs, so:
//! - **No verdict before [`MIN_SAMPLES`]** per arm (`collecting`).
//! - **Welch's interval** for the difference of means, with the Welch–Satterthwaite degrees of
//!   freedom and a Student-t quantile, for a reader who looks once at a fixed sample size.
//! - **An always-valid interval** (the mixture sequential probability ratio test of Johari,
//!   Koomen, Pekelis and Walsh, "Always valid inference", 2017, the method behind
//!   Optimizely's stats engine): with the difference's variance `V` and a normal mixing
//!   prior of scale `τ`, the interval `diff ± sqrt(V (V + τ²) / τ² × (ln((V + τ²) / V) −
//!   2 ln α))` covers the true difference at every sample size at once with probability
//!   1 − α, so peeking does not inflate false positives. The verdict comes from it. `τ` is
//!   [`TAU_FRACTION`] of the control's mean TTFT: the effect size the test is most sensitive
//!   to.
//! - **Bootstrap intervals** (percentile, deterministic resampling) for the difference of
//!   p50 and of p99, where no formula is trustworthy.
//!
//! The guardrails ([`crate::guardrails`]) apply the always-valid interval to error rates, to
//! mean TTFT and to the TTFT tail. The guarantees assume independent samples that
//! accumulate; each variant keeps the last [`crate::TTFT_SAMPLES_PER_VARIANT`], so they hold
//! until that window fills. Nothing here reads the clock: plain numbers in, plain numbers out.

use serde::Serialize;

/// Samples per arm before any verdict.
pub const MIN_SAMPLES: usize = 30;
/// The error rate the intervals are built for (95 % intervals).
pub const ALPHA: f64 = 0.05;
/// The mixing prior's scale, as a fraction of the control's mean TTFT.
pub const TAU_FRACTION: f64 = 0.1;
/// Bootstrap resamples per interval.
pub const BOOTSTRAP_RESAMPLES: usize = 400;
/// Most samples per arm a bootstrap draws from (every `k`-th sample beyond that), so an
/// admin call stays fast.
pub const BOOTSTRAP_MAX_SAMPLES: usize = 2_000;

/// One arm's TTFT samples, summarised.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Samples.
    pub n: usize,
    /// Mean, seconds.
    pub mean: f64,
    /// Sample variance (n − 1 in the denominator).
    pub variance: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// `samples` summarised; `None` when there are none.
pub fn summarize(samples: &[f64]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let mean = sorted.iter().sum::<f64>() / n as f64;
    let variance = if n > 1 {
        sorted.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64
    } else {
        0.0
    };
    Some(Summary {
        n,
        mean,
        variance,
        p50: quantile(&sorted, 0.5),
        p99: quantile(&sorted, 0.99),
    })
}

/// The `q` quantile of sorted values (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let n = sorted.len();
    sorted[((q * n as f64).ceil() as usize).clamp(1, n) - 1]
}

/// Welch's interval for `candidate.mean − control.mean`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Welch {
    /// The difference of means, seconds.
    pub difference: f64,
    /// Its standard error.
    pub standard_error: f64,
    /// Welch–Satterthwaite degrees of freedom.
    pub degrees_of_freedom: f64,
    /// The 95 % interval (valid for one look at a fixed sample size).
    pub ci95: [f64; 2],
}

/// Welch's interval; `None` unless both arms have two samples or more.
pub fn welch(control: &Summary, candidate: &Summary) -> Option<Welch> {
    if control.n < 2 || candidate.n < 2 {
        return None;
    }
    let (va, vb) = (
        control.variance / control.n as f64,
        candidate.variance / candidate.n as f64,
    );
    let v = va + vb;
    let df = if v == 0.0 {
        (control.n + candidate.n - 2) as f64
    } else {
        v * v / (va * va / (control.n - 1) as f64 + vb * vb / (candidate.n - 1) as f64)
    };
    let difference = candidate.mean - control.mean;
    let se = v.sqrt();
    let t = t_quantile_975(df);
    Some(Welch {
        difference,
        standard_error: se,
        degrees_of_freedom: df,
        ci95: [difference - t * se, difference + t * se],
    })
}

/// The 0.975 quantile of Student's t with `df` degrees of freedom: exact for small integer
/// df, else the Cornish–Fisher expansion around the normal quantile (error under 0.1 % from
/// df = 5 up).
pub fn t_quantile_975(df: f64) -> f64 {
    const SMALL: [f64; 4] = [12.706, 4.303, 3.182, 2.776];
    if df < 1.0 {
        return SMALL[0];
    }
    if df < 5.0 {
        return SMALL[(df.floor() as usize - 1).min(3)];
    }
    let z: f64 = 1.959_963_984_540_054;
    let (z3, z5, z7) = (z.powi(3), z.powi(5), z.powi(7));
    z + (z3 + z) / (4.0 * df)
        + (5.0 * z5 + 16.0 * z3 + 3.0 * z) / (96.0 * df * df)
        + (3.0 * z7 + 19.0 * z5 + 17.0 * z3 - 15.0 * z) / (384.0 * df.powi(3))
}

/// The always-valid 95 % interval for `candidate.mean − control.mean` (module docs); `None`
/// unless both arms have two samples or more and some variance.
pub fn always_valid(control: &Summary, candidate: &Summary) -> Option<[f64; 2]> {
    always_valid_with(control, candidate, TAU_FRACTION * control.mean.abs())
}

/// [`always_valid`] with the mixing prior's scale `tau` given.
pub fn always_valid_with(control: &Summary, candidate: &Summary, tau: f64) -> Option<[f64; 2]> {
    if control.n < 2 || candidate.n < 2 {
        return None;
    }
    let v = control.variance / control.n as f64 + candidate.variance / candidate.n as f64;
    let tau2 = tau * tau;
    if v <= 0.0 || tau2 <= 0.0 {
        return None;
    }
    let radius = (v * (v + tau2) / tau2 * (((v + tau2) / v).ln() - 2.0 * ALPHA.ln())).sqrt();
    let difference = candidate.mean - control.mean;
    Some([difference - radius, difference + radius])
}

/// What an experiment says so far about a candidate's TTFT against the control's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Fewer than [`MIN_SAMPLES`] in an arm.
    Collecting,
    /// The always-valid interval holds 0.
    NoDifference,
    /// Faster beyond doubt.
    CandidateFaster,
    /// Slower beyond doubt.
    CandidateSlower,
}

/// The verdict, from the always-valid interval once both arms have [`MIN_SAMPLES`].
pub fn verdict(control: &Summary, candidate: &Summary) -> Verdict {
    if control.n < MIN_SAMPLES || candidate.n < MIN_SAMPLES {
        return Verdict::Collecting;
    }
    match always_valid(control, candidate) {
        Some([_, hi]) if hi < 0.0 => Verdict::CandidateFaster,
        Some([lo, _]) if lo > 0.0 => Verdict::CandidateSlower,
        _ => Verdict::NoDifference,
    }
}

/// The mixing prior's scale for hit-ratio differences: five percentage points, the size of
/// difference a routing change is tried for.
pub const HIT_RATIO_TAU: f64 = 0.05;

/// The always-valid 95 % interval (as for TTFT, module docs) for the difference of the mean
/// per-request hit fraction (`cached / prompt` of each request, requests without a prompt
/// left out), candidate minus control: valid however often it is read. Each request counts
/// once whatever its length, unlike the token-weighted ratio's bootstrap, which is for one
/// look. `None` before [`MIN_SAMPLES`] in each arm or without variance.
pub fn always_valid_hit_fraction(
    control: &[(u32, u32)],
    candidate: &[(u32, u32)],
) -> Option<[f64; 2]> {
    let fractions = |pairs: &[(u32, u32)]| -> Vec<f64> {
        pairs
            .iter()
            .filter(|(_, prompt)| *prompt > 0)
            .map(|&(cached, prompt)| f64::from(cached.min(prompt)) / f64::from(prompt))
            .collect()
    };
    let (a, b) = (
        summarize(&fractions(control))?,
        summarize(&fractions(candidate))?,
    );
    if a.n < MIN_SAMPLES || b.n < MIN_SAMPLES {
        return None;
    }
    always_valid_with(&a, &b, HIT_RATIO_TAU)
}

/// A percentile-bootstrap 95 % interval for `quantile(candidate) − quantile(control)` at
/// `q`, with a fixed seed (the same samples give the same interval); `None` unless both arms
/// have [`MIN_SAMPLES`].
pub fn bootstrap_quantile_difference(
    control: &[f64],
    candidate: &[f64],
    q: f64,
) -> Option<[f64; 2]> {
    if control.len() < MIN_SAMPLES || candidate.len() < MIN_SAMPLES {
        return None;
    }
    let thin = |xs: &[f64]| -> Vec<f64> {
        let step = xs.len().div_ceil(BOOTSTRAP_MAX_SAMPLES);
        xs.iter().step_by(step.max(1)).copied().collect()
    };
    let (a, b) = (thin(control), thin(candidate));
    let mut rng = SplitMix64(0x5eed_ab7e_57ab_1e00);
    let mut scratch_a = vec![0.0; a.len()];
    let mut scratch_b = vec![0.0; b.len()];
    let mut diffs = Vec::with_capacity(BOOTSTRAP_RESAMPLES);
    for _ in 0..BOOTSTRAP_RESAMPLES {
        for (slot, source) in [(&mut scratch_a, &a), (&mut scratch_b, &b)] {
            for x in slot.iter_mut() {
                *x = source[(rng.next() % source.len() as u64) as usize];
            }
            slot.sort_by(f64::total_cmp);
        }
        diffs.push(quantile(&scratch_b, q) - quantile(&scratch_a, q));
    }
    diffs.sort_by(f64::total_cmp);
    Some([quantile(&diffs, 0.025), quantile(&diffs, 0.975)])
}

/// A percentile-bootstrap 95 % interval for the difference of prefix-cache hit ratios,
/// candidate − control, each the token-weighted ratio `Σ cached / Σ prompt` of its requests'
/// `(cached, prompt)` pairs, resampling requests (so a few long prompts weigh as they do in
/// the ratio). Fixed seed; `None` unless both arms have [`MIN_SAMPLES`] requests with prompt
/// tokens.
pub fn bootstrap_hit_ratio_difference(
    control: &[(u32, u32)],
    candidate: &[(u32, u32)],
) -> Option<[f64; 2]> {
    let usable = |xs: &[(u32, u32)]| -> Vec<(u32, u32)> {
        let kept: Vec<_> = xs.iter().copied().filter(|&(_, p)| p > 0).collect();
        let step = kept.len().div_ceil(BOOTSTRAP_MAX_SAMPLES).max(1);
        kept.into_iter().step_by(step).collect()
    };
    let (a, b) = (usable(control), usable(candidate));
    if a.len() < MIN_SAMPLES || b.len() < MIN_SAMPLES {
        return None;
    }
    let mut rng = SplitMix64(0x41_7a71_0c0f_fee5);
    let mut resampled_ratio = |xs: &[(u32, u32)]| {
        let (mut cached, mut prompt) = (0u64, 0u64);
        for _ in 0..xs.len() {
            let (c, p) = xs[(rng.next() % xs.len() as u64) as usize];
            cached += u64::from(c.min(p));
            prompt += u64::from(p);
        }
        cached as f64 / prompt as f64
    };
    let mut diffs: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
        .map(|_| {
            let control_ratio = resampled_ratio(&a);
            resampled_ratio(&b) - control_ratio
        })
        .collect();
    diffs.sort_by(f64::total_cmp);
    Some([quantile(&diffs, 0.025), quantile(&diffs, 0.975)])
}

/// A small deterministic generator for the bootstrap (and the tests).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform in (0, 1).
    #[cfg(test)]
    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
}

/// `errors` of `requests` as a [`Summary`] of 0/1 outcomes (its quantiles are meaningless).
pub fn proportion(errors: u64, requests: u64) -> Summary {
    let n = requests as usize;
    let p = if requests == 0 {
        0.0
    } else {
        errors as f64 / requests as f64
    };
    let variance = if n > 1 {
        p * (1.0 - p) * n as f64 / (n - 1) as f64
    } else {
        0.0
    };
    Summary {
        n,
        mean: p,
        variance,
        p50: 0.0,
        p99: 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guardrails::{guardrail_breach, tail_breach};

    /// Log-normal TTFTs (heavy-tailed, like real ones) with median `median` seconds.
    fn ttfts(rng: &mut SplitMix64, n: usize, median: f64) -> Vec<f64> {
        (0..n)
            .map(|_| {
                // Box–Muller.
                let (u, v) = (rng.uniform(), rng.uniform());
                let z = (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos();
                median * (0.8 * z).exp()
            })
            .collect()
    }

    fn summary_of(xs: &[f64]) -> Summary {
        summarize(xs).unwrap()
    }

    /// Requests with prompts of 100–4,000 tokens, each cached with probability `hit`.
    fn cache_pairs(rng: &mut SplitMix64, n: usize, hit: f64) -> Vec<(u32, u32)> {
        (0..n)
            .map(|_| {
                let prompt = 100 + (rng.next() % 3_901) as u32;
                let cached = if rng.uniform() < hit { prompt } else { 0 };
                (cached, prompt)
            })
            .collect()
    }

    #[test]
    fn the_hit_ratio_interval_finds_a_real_difference_and_no_false_one() {
        let mut rng = SplitMix64(7);
        // A real difference of 0.3 (20 % against 50 % of requests cached, whatever their
        // length, so 0.3 is also the token-weighted difference): every interval excludes 0,
        // and about 95 of 100 hold 0.3.
        let (mut excluded_zero, mut covered) = (0, 0);
        for _ in 0..50 {
            let control = cache_pairs(&mut rng, 400, 0.2);
            let better = cache_pairs(&mut rng, 400, 0.5);
            let [lo, hi] = bootstrap_hit_ratio_difference(&control, &better).unwrap();
            excluded_zero += usize::from(lo > 0.0);
            covered += usize::from(lo <= 0.3 && 0.3 <= hi);
        }
        assert_eq!(excluded_zero, 50);
        assert!(
            covered >= 42,
            "{covered} of 50 intervals held the true difference"
        );
        let control = cache_pairs(&mut rng, 400, 0.2);
        let better = cache_pairs(&mut rng, 400, 0.5);
        // A/A: over 100 pairs of equal arms, the 95 % interval misses 0 about 5 times.
        let misses = (0..100)
            .filter(|_| {
                let a = cache_pairs(&mut rng, 200, 0.3);
                let b = cache_pairs(&mut rng, 200, 0.3);
                let [lo, hi] = bootstrap_hit_ratio_difference(&a, &b).unwrap();
                lo > 0.0 || hi < 0.0
            })
            .count();
        assert!(misses <= 12, "{misses} of 100 A/A intervals excluded 0");
        // Too few requests (or none with a prompt): no interval.
        assert!(bootstrap_hit_ratio_difference(&control[..29], &better).is_none());
        assert!(bootstrap_hit_ratio_difference(&[(0, 0); 100], &better).is_none());
    }

    #[test]
    fn t_quantiles_match_the_tables() {
        for (df, table) in [
            (1.0, 12.706),
            (4.0, 2.776),
            (5.0, 2.571),
            (10.0, 2.228),
            (30.0, 2.042),
            (1e6, 1.960),
        ] {
            let t = t_quantile_975(df);
            assert!(
                (t - table).abs() / table < 0.002,
                "df {df}: {t} against {table}"
            );
        }
    }

    #[test]
    fn welch_uses_satterthwaite_degrees_of_freedom() {
        // Two arms of 8 and 2 samples: few degrees of freedom, so a wide interval, never the
        // ±1.96 SE that called such a difference significant.
        let a = summary_of(&[1.0, 1.1, 0.9, 1.2, 0.8, 1.0, 1.05, 0.95]);
        let b = summary_of(&[1.3, 1.5]);
        let w = welch(&a, &b).unwrap();
        assert!(w.degrees_of_freedom < 2.0, "{w:?}");
        assert!(w.ci95[0] < 0.0, "not significant with 2 samples: {w:?}");
        assert_eq!(verdict(&a, &b), Verdict::Collecting);
    }

    #[test]
    fn an_a_a_test_calls_a_winner_no_more_often_than_its_error_rate_while_peeking() {
        // 400 A/A experiments, each looked at every 50 samples per arm up to 2,000: the share
        // that ever name a winner must stay within the 5 % the interval promises.
        let mut rng = SplitMix64(7);
        let (experiments, peeks, step) = (400, 40, 50);
        let (mut always_valid_wins, mut fixed_n_wins) = (0, 0);
        for _ in 0..experiments {
            let a = ttfts(&mut rng, peeks * step, 0.2);
            let b = ttfts(&mut rng, peeks * step, 0.2);
            let (mut called, mut called_fixed) = (false, false);
            for k in 1..=peeks {
                let (sa, sb) = (summary_of(&a[..k * step]), summary_of(&b[..k * step]));
                called |= verdict(&sa, &sb) != Verdict::NoDifference
                    && verdict(&sa, &sb) != Verdict::Collecting;
                let w = welch(&sa, &sb).unwrap();
                called_fixed |= w.ci95[0] > 0.0 || w.ci95[1] < 0.0;
            }
            always_valid_wins += usize::from(called);
            fixed_n_wins += usize::from(called_fixed);
        }
        let rate = always_valid_wins as f64 / experiments as f64;
        let fixed_rate = fixed_n_wins as f64 / experiments as f64;
        eprintln!(
            "A/A false positives with peeking: always-valid {rate}, fixed-n Welch {fixed_rate}"
        );
        assert!(rate <= ALPHA, "always-valid false positives {rate}");
        // The fixed-sample interval, read at every peek, calls far more false winners.
        assert!(fixed_rate > 2.0 * ALPHA, "peeking at Welch: {fixed_rate}");
    }

    #[test]
    fn guardrails_stop_on_errors_or_slowness_beyond_doubt_only() {
        let mut rng = SplitMix64(3);
        let fast = summary_of(&ttfts(&mut rng, 500, 0.2));
        let same = summary_of(&ttfts(&mut rng, 500, 0.2));
        let slow = summary_of(&ttfts(&mut rng, 500, 0.3));
        let clean = proportion(1, 500);
        assert!(guardrail_breach(Some(&fast), Some(&same), &clean, &proportion(2, 500)).is_none());
        let why = guardrail_breach(Some(&fast), Some(&same), &clean, &proportion(60, 500)).unwrap();
        assert!(why.starts_with("error rate 12.0 %"), "{why}");
        let why = guardrail_breach(Some(&fast), Some(&slow), &clean, &clean).unwrap();
        assert!(why.starts_with("mean TTFT"), "{why}");
        // Too few samples: never.
        assert!(guardrail_breach(None, None, &proportion(0, 10), &proportion(10, 10)).is_none());
    }

    #[test]
    fn the_always_valid_hit_fraction_interval_survives_peeking_and_finds_a_real_gain() {
        let mut rng = SplitMix64(9);
        let control = cache_pairs(&mut rng, 3_000, 0.3);
        let better = cache_pairs(&mut rng, 3_000, 0.45);
        let [lo, hi] = always_valid_hit_fraction(&control, &better).unwrap();
        assert!(lo > 0.0 && lo < 0.15 && 0.15 < hi, "[{lo}, {hi}]");
        assert!(always_valid_hit_fraction(&control[..10], &better[..10]).is_none());
        // A/A, read every 100 requests 30 times: it excludes 0 in at most its 5 %.
        let (experiments, peeks, step) = (200, 30, 100);
        let mut called = 0;
        for _ in 0..experiments {
            let a = cache_pairs(&mut rng, peeks * step, 0.3);
            let b = cache_pairs(&mut rng, peeks * step, 0.3);
            called += usize::from((1..=peeks).any(|k| {
                always_valid_hit_fraction(&a[..k * step], &b[..k * step])
                    .is_some_and(|[lo, hi]| lo > 0.0 || hi < 0.0)
            }));
        }
        let rate = called as f64 / experiments as f64;
        eprintln!("A/A hit-fraction winners with peeking: {rate}");
        assert!(rate <= ALPHA, "A/A winners {rate}");
    }

    #[test]
    fn the_tail_guardrail_stops_a_heavier_tail_and_rarely_an_equal_one() {
        let mut rng = SplitMix64(5);
        let control = ttfts(&mut rng, 2_000, 0.2);
        // The same median, but one request in ten stalls for 3 s: the mean barely moves, the
        // tail does.
        let stalls: Vec<f64> = ttfts(&mut rng, 2_000, 0.2)
            .into_iter()
            .enumerate()
            .map(|(i, x)| if i % 10 == 0 { 3.0 + x } else { x })
            .collect();
        let why = tail_breach(&control, &stalls).unwrap();
        assert!(why.starts_with("TTFT tail: 10."), "{why}");
        assert!(
            tail_breach(&control[..100], &stalls[..100]).is_none(),
            "too few"
        );
        // A/A with peeking every 100 requests: it stops an equal candidate far less often than
        // its 5 % error rate allows.
        let (experiments, peeks, step) = (200, 20, 100);
        let mut stopped = 0;
        for _ in 0..experiments {
            let a = ttfts(&mut rng, peeks * step, 0.2);
            let b = ttfts(&mut rng, peeks * step, 0.2);
            stopped += usize::from(
                (2..=peeks).any(|k| tail_breach(&a[..k * step], &b[..k * step]).is_some()),
            );
        }
        let rate = stopped as f64 / experiments as f64;
        eprintln!("A/A tail-guardrail stops with peeking: {rate}");
        assert!(rate <= ALPHA, "A/A stops {rate}");
    }

    #[test]
    fn a_real_difference_is_found_and_the_quantiles_bracket_it() {
        let mut rng = SplitMix64(11);
        let control = ttfts(&mut rng, 3_000, 0.2);
        let slower = ttfts(&mut rng, 3_000, 0.26);
        let (sa, sb) = (summary_of(&control), summary_of(&slower));
        assert_eq!(verdict(&sa, &sb), Verdict::CandidateSlower);
        assert_eq!(verdict(&sb, &sa), Verdict::CandidateFaster);
        let [lo, hi] = bootstrap_quantile_difference(&control, &slower, 0.5).unwrap();
        assert!(
            lo < 0.06 && 0.06 < hi && lo > 0.0,
            "p50 difference in [{lo}, {hi}]"
        );
        let same = bootstrap_quantile_difference(&control, &control, 0.99).unwrap();
        assert!(same[0] <= 0.0 && 0.0 <= same[1], "{same:?}");
        assert_eq!(
            bootstrap_quantile_difference(&control, &slower, 0.5),
            Some([lo, hi]),
            "deterministic"
        );
    }
}
