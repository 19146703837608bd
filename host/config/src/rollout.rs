//! A progressive rollout's plan: the candidate's share of traffic at each step (percent,
//! rising, the last 100 — the promotion), how long a step lasts at least, and how many of
//! the candidate's requests a step must see before it may advance. Parsed from the admin
//! API's query (`rollout=1,5,25,50,100&step=10m`) and from `[[policies.router]] rollout`,
//! validated once here. What runs the plan (the router slot, the judge) lives elsewhere.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Candidate requests a step sees before it may advance, unless configured: as many as a
/// guardrail needs before it may look ([`ringmaster_experiments`]'s `MIN_SAMPLES`).
pub const DEFAULT_ROLLOUT_MIN_SAMPLES: u64 = 30;
/// Most steps in a plan.
pub const MAX_ROLLOUT_STEPS: usize = 20;
/// Shortest step: anything shorter cannot be judged on the fleet's figures, which replicas
/// publish about once a second.
pub const MIN_ROLLOUT_STEP: Duration = Duration::from_millis(100);
/// Longest step.
pub const MAX_ROLLOUT_STEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// A validated plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutPlan {
    /// The candidate's percent of traffic at each step, rising; the last is 100.
    pub steps: Vec<u8>,
    /// Each step's least duration, in milliseconds.
    pub step_ms: u64,
    /// The candidate's requests each step must see before it may advance.
    pub min_samples: u64,
}

impl RolloutPlan {
    /// A plan from its parts, or why it is not one.
    pub fn new(steps: &[u32], step: Duration, min_samples: Option<u64>) -> Result<Self, String> {
        if steps.is_empty() || steps.len() > MAX_ROLLOUT_STEPS {
            return Err(format!(
                "rollout: give 1 to {MAX_ROLLOUT_STEPS} steps, percents of traffic, e.g. 1,5,25,50,100"
            ));
        }
        if let Some(bad) = steps.iter().find(|p| !(1..=100).contains(*p)) {
            return Err(format!(
                "rollout: step {bad} is not a percent from 1 to 100"
            ));
        }
        if steps.windows(2).any(|w| w[0] >= w[1]) {
            return Err("rollout: the steps must rise, each above the one before".to_owned());
        }
        if steps.last() != Some(&100) {
            return Err(
                "rollout: the last step must be 100 (it promotes the candidate to the slot's only variant)"
                    .to_owned(),
            );
        }
        if !(MIN_ROLLOUT_STEP..=MAX_ROLLOUT_STEP).contains(&step) {
            return Err(format!(
                "step: {} is outside {} to {}",
                humantime::format_duration(step),
                humantime::format_duration(MIN_ROLLOUT_STEP),
                humantime::format_duration(MAX_ROLLOUT_STEP)
            ));
        }
        let min_samples = min_samples.unwrap_or(DEFAULT_ROLLOUT_MIN_SAMPLES);
        if min_samples > 1_000_000 {
            return Err("min_samples: at most 1000000".to_owned());
        }
        Ok(Self {
            steps: steps.iter().map(|&p| p as u8).collect(),
            step_ms: step.as_millis() as u64,
            min_samples,
        })
    }

    /// From the admin API's text: `steps` as `1,5,25,50,100`, `step` as `10m` or `1s`
    /// (default 10 minutes), `min_samples` as a whole number.
    pub fn parse(
        steps: &str,
        step: Option<&str>,
        min_samples: Option<&str>,
    ) -> Result<Self, String> {
        let steps = steps
            .split(',')
            .map(|p| {
                p.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("rollout: {p:?} is not a whole percent"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let step = match step {
            None => DEFAULT_ROLLOUT_STEP,
            Some(text) => humantime::parse_duration(text)
                .map_err(|e| format!("step: {text:?} is not a duration like 10m or 30s: {e}"))?,
        };
        let min_samples = min_samples
            .map(|text| {
                text.parse::<u64>()
                    .map_err(|_| format!("min_samples: {text:?} is not a whole number"))
            })
            .transpose()?;
        Self::new(&steps, step, min_samples)
    }

    /// Each step's least duration.
    pub fn step(&self) -> Duration {
        Duration::from_millis(self.step_ms)
    }
}

/// A step's duration when none is given.
pub const DEFAULT_ROLLOUT_STEP: Duration = Duration::from_secs(600);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_parses_and_bad_ones_say_why() {
        let plan = RolloutPlan::parse("1,5,25,50,100", Some("10m"), None).unwrap();
        assert_eq!(plan.steps, [1, 5, 25, 50, 100]);
        assert_eq!(plan.step(), Duration::from_secs(600));
        assert_eq!(plan.min_samples, DEFAULT_ROLLOUT_MIN_SAMPLES);
        assert_eq!(
            RolloutPlan::parse("100", Some("1s"), Some("5"))
                .unwrap()
                .steps,
            [100]
        );
        for (steps, step, why) in [
            ("", None, "whole percent"),
            ("1,5,50", None, "last step must be 100"),
            ("5,5,100", None, "must rise"),
            ("0,100", None, "not a percent"),
            ("50,101", None, "not a percent"),
            ("1,100", Some("soon"), "not a duration"),
            ("1,100", Some("10ms"), "outside"),
        ] {
            let error = RolloutPlan::parse(steps, step, None).unwrap_err();
            assert!(error.contains(why), "{steps:?} {step:?}: {error}");
        }
        assert!(
            RolloutPlan::parse("1,100", None, Some("many"))
                .unwrap_err()
                .contains("min_samples")
        );
    }
}
