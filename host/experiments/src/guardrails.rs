//! Guardrails: whether a live candidate is worse than the control beyond doubt, on its error
//! rate, its mean TTFT, or its TTFT tail, each by an always-valid interval
//! ([`crate::stats`]), so a guardrail may look as often as it likes. A breach is a reason in
//! words; what to do about it (the gateway sets the candidate's weight to 0) is the caller's.

use serde::Serialize;

use crate::stats::{
    MIN_SAMPLES, Summary, Verdict, always_valid, always_valid_with, proportion, summarize, verdict,
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
    error_breach(control_errors, candidate_errors)
        .or_else(|| mean_breach(control_ttft?, candidate_ttft?))
}

/// The error-rate half of [`guardrail_breach`].
fn error_breach(control: &Summary, candidate: &Summary) -> Option<String> {
    if control.n < MIN_SAMPLES || candidate.n < MIN_SAMPLES {
        return None;
    }
    let [lo, _] = always_valid_with(control, candidate, ERROR_RATE_TAU)?;
    (lo > 0.0).then(|| {
        format!(
            "error rate {:.1} % against the control's {:.1} % (always-valid 95 % interval of \
             the difference starts at +{:.1} points)",
            candidate.mean * 100.0,
            control.mean * 100.0,
            lo * 100.0
        )
    })
}

/// The mean-TTFT half of [`guardrail_breach`].
fn mean_breach(control: &Summary, candidate: &Summary) -> Option<String> {
    (verdict(control, candidate) == Verdict::CandidateSlower).then(|| {
        format!(
            "mean TTFT {:.3} s against the control's {:.3} s, slower beyond doubt",
            candidate.mean, control.mean
        )
    })
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
    tail_reading(control, candidate).breach
}

/// Why the candidate whose statistics are `candidate` should stop, against the control's, if
/// it is worse beyond doubt by any guardrail: its error rate, its mean TTFT, its TTFT tail.
pub fn check(control: &VariantStats, candidate: &VariantStats) -> Option<String> {
    check_figures(&control.figures(usize::MAX), &candidate.figures(usize::MAX))
}

/// [`check`] on figures as numbers: one replica's, or the fleet's summed over replicas.
pub fn check_figures(control: &VariantFigures, candidate: &VariantFigures) -> Option<String> {
    readings(control, candidate)
        .into_iter()
        .find_map(|reading| reading.breach)
}

/// One guardrail's reading now, for an operator watching a rollout or an experiment.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Reading {
    /// `error_rate`, `mean_ttft_seconds` or `ttft_tail` (the share of requests slower than
    /// the control's p99).
    pub guardrail: &'static str,
    /// The control's figure.
    pub control: Option<f64>,
    /// The candidate's figure.
    pub candidate: Option<f64>,
    /// Samples in each arm, control first.
    pub samples: [u64; 2],
    /// The always-valid 95 % interval of candidate minus control, once it may be read.
    pub always_valid_ci95: Option<[f64; 2]>,
    /// Why the candidate should stop by this guardrail, if it should.
    pub breach: Option<String>,
}

/// Every guardrail's reading of `candidate` against `control`, in the order they are
/// checked (error rate, mean TTFT, the TTFT tail).
pub fn readings(control: &VariantFigures, candidate: &VariantFigures) -> Vec<Reading> {
    let control_errors = proportion(control.errors, control.requests);
    let errors = proportion(candidate.errors, candidate.requests);
    let (a, b) = (summarize(&control.ttft), summarize(&candidate.ttft));
    let mut mean = Reading {
        guardrail: "mean_ttft_seconds",
        control: a.as_ref().map(|s| s.mean),
        candidate: b.as_ref().map(|s| s.mean),
        samples: [control.ttft.len() as u64, candidate.ttft.len() as u64],
        always_valid_ci95: None,
        breach: None,
    };
    if let (Some(a), Some(b)) = (&a, &b) {
        mean.always_valid_ci95 = always_valid(a, b);
        mean.breach = mean_breach(a, b);
    }
    let mut error_rate = Reading {
        guardrail: "error_rate",
        control: Some(control_errors.mean),
        candidate: Some(errors.mean),
        samples: [control.requests, candidate.requests],
        always_valid_ci95: None,
        breach: error_breach(&control_errors, &errors),
    };
    if control_errors.n >= MIN_SAMPLES && errors.n >= MIN_SAMPLES {
        error_rate.always_valid_ci95 = always_valid_with(&control_errors, &errors, ERROR_RATE_TAU);
    }
    let tail = tail_reading(&control.ttft, &candidate.ttft);
    vec![error_rate, mean, tail]
}

/// The tail guardrail's reading ([`tail_breach`]'s numbers).
fn tail_reading(control: &[f64], candidate: &[f64]) -> Reading {
    let mut reading = Reading {
        guardrail: "ttft_tail",
        control: None,
        candidate: None,
        samples: [control.len() as u64, candidate.len() as u64],
        always_valid_ci95: None,
        breach: None,
    };
    if control.len() < MIN_TAIL_SAMPLES || candidate.len() < MIN_TAIL_SAMPLES {
        return reading;
    }
    let Some(threshold) = summarize(control).map(|s| s.p99) else {
        return reading;
    };
    let over = |xs: &[f64]| xs.iter().filter(|&&x| x > threshold).count() as u64;
    let control_rate = proportion(over(control), control.len() as u64);
    let candidate_rate = proportion(over(candidate), candidate.len() as u64);
    reading.control = Some(control_rate.mean);
    reading.candidate = Some(candidate_rate.mean);
    reading.always_valid_ci95 = always_valid_with(&control_rate, &candidate_rate, ERROR_RATE_TAU);
    if let Some([lo, _]) = reading.always_valid_ci95
        && lo > 0.0
    {
        reading.breach = Some(format!(
            "TTFT tail: {:.1} % of its requests slower than the control's p99 of {:.3} s, \
             against the control's {:.1} % (always-valid 95 % interval of the difference starts \
             at +{:.1} points)",
            candidate_rate.mean * 100.0,
            threshold,
            control_rate.mean * 100.0,
            lo * 100.0
        ));
    }
    reading
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
