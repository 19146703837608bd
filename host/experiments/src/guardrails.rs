//! Guardrails: whether a live candidate is worse than the control beyond doubt, on its error
//! rate, its mean TTFT, or its TTFT tail, each by an always-valid interval
//! ([`crate::stats`]), so a guardrail may look as often as it likes. A breach is a reason in
//! words; what to do about it (the gateway sets the candidate's weight to 0) is the caller's.

use crate::stats::{
    MIN_SAMPLES, Summary, Verdict, always_valid_with, proportion, summarize, verdict,
};
use crate::{VariantFigures, VariantStats};

/// The mixing prior's scale for error rates: tuned to differences of five percentage points
/// (a guardrail is for a candidate that breaks things; a scale much smaller than the
/// difference's standard error makes the interval very wide at small samples).
pub const ERROR_RATE_TAU: f64 = 0.05;

/// Why a candidate should stop, if it is worse than the control beyond doubt (both always-
/// valid, so a guardrail may check as often as it likes): its error rate is higher, or its
/// mean TTFT is. `None` while it is not, or before [`MIN_SAMPLES`] in each arm.
pub fn guardrail_breach(
    control_ttft: Option<&Summary>,
    candidate_ttft: Option<&Summary>,
    control_errors: &Summary,
    candidate_errors: &Summary,
) -> Option<String> {
    if control_errors.n >= MIN_SAMPLES
        && candidate_errors.n >= MIN_SAMPLES
        && let Some([lo, _]) = always_valid_with(control_errors, candidate_errors, ERROR_RATE_TAU)
        && lo > 0.0
    {
        return Some(format!(
            "error rate {:.1} % against the control's {:.1} % (always-valid 95 % interval of \
             the difference starts at +{:.1} points)",
            candidate_errors.mean * 100.0,
            control_errors.mean * 100.0,
            lo * 100.0
        ));
    }
    if let (Some(a), Some(b)) = (control_ttft, candidate_ttft)
        && verdict(a, b) == Verdict::CandidateSlower
    {
        return Some(format!(
            "mean TTFT {:.3} s against the control's {:.3} s, slower beyond doubt",
            b.mean, a.mean
        ));
    }
    None
}

/// Samples per arm before the tail guardrail looks: with fewer, a 99th percentile is a
/// handful of requests.
pub const MIN_TAIL_SAMPLES: usize = 200;

/// Why a candidate should stop for its TTFT tail, if that is heavier than the control's
/// beyond doubt: more of its requests are slower than the control's p99 than the control's
/// own 1 %. The two exceedance rates are compared like error rates, with the same
/// always-valid interval (so it may be checked as often as the others); the threshold is the
/// control's current p99. `None` while it is not heavier, or before [`MIN_TAIL_SAMPLES`] in
/// each arm.
pub fn tail_breach(control: &[f64], candidate: &[f64]) -> Option<String> {
    if control.len() < MIN_TAIL_SAMPLES || candidate.len() < MIN_TAIL_SAMPLES {
        return None;
    }
    let threshold = summarize(control)?.p99;
    let over = |xs: &[f64]| xs.iter().filter(|&&x| x > threshold).count() as u64;
    let (control_over, candidate_over) = (over(control), over(candidate));
    let control_rate = proportion(control_over, control.len() as u64);
    let candidate_rate = proportion(candidate_over, candidate.len() as u64);
    let [lo, _] = always_valid_with(&control_rate, &candidate_rate, ERROR_RATE_TAU)?;
    (lo > 0.0).then(|| {
        format!(
            "TTFT tail: {:.1} % of its requests slower than the control's p99 of {:.3} s, \
             against the control's {:.1} % (always-valid 95 % interval of the difference starts \
             at +{:.1} points)",
            candidate_rate.mean * 100.0,
            threshold,
            control_rate.mean * 100.0,
            lo * 100.0
        )
    })
}

/// Why the candidate whose statistics are `candidate` should stop, against the control's, if
/// it is worse beyond doubt by any guardrail: its error rate, its mean TTFT, its TTFT tail.
pub fn check(control: &VariantStats, candidate: &VariantStats) -> Option<String> {
    check_figures(&control.figures(usize::MAX), &candidate.figures(usize::MAX))
}

/// [`check`] on figures as numbers: one replica's, or the fleet's summed over replicas.
pub fn check_figures(control: &VariantFigures, candidate: &VariantFigures) -> Option<String> {
    let control_errors = proportion(control.errors, control.requests);
    let errors = proportion(candidate.errors, candidate.requests);
    guardrail_breach(
        summarize(&control.ttft).as_ref(),
        summarize(&candidate.ttft).as_ref(),
        &control_errors,
        &errors,
    )
    .or_else(|| tail_breach(&control.ttft, &candidate.ttft))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(requests: u64, errors: u64) -> VariantFigures {
        VariantFigures {
            requests,
            errors,
            ttft: (0..requests).map(|i| 0.1 + (i % 5) as f64 * 0.01).collect(),
            ..VariantFigures::default()
        }
    }

    #[test]
    fn the_fleet_sees_a_breach_no_replica_sees_alone() {
        // Each of three replicas holds too few of the candidate's requests to judge (fewer
        // than the samples a verdict needs); summed, the fleet's figures are beyond doubt.
        let control_one = figures(20, 0);
        let candidate_one = figures(12, 5);
        assert_eq!(check_figures(&control_one, &candidate_one), None);
        let (mut control, mut candidate) = (VariantFigures::default(), VariantFigures::default());
        for _ in 0..3 {
            control.add(&control_one);
            candidate.add(&candidate_one);
        }
        let why = check_figures(&control, &candidate).expect("a breach over the fleet");
        assert!(why.starts_with("error rate"), "{why}");
    }
}
