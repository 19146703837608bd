//! A progressive rollout's state in the router slot: which variant ramps in, against which
//! control, at which step since when, and how it ended. The slot changes it only when told
//! (start, advance, stop, each a revision of the configuration log in a cluster, so every
//! replica holds the same state); deciding when to advance or stop is the admin crate's
//! judge, which reads this state and never writes it except through those calls.

use ringmaster_config::rollout::RolloutPlan;
use serde::Serialize;

/// Weights during a rollout are in hundredths of a percent, so that a 1 % step is exact.
pub(crate) const WEIGHT_SCALE: u32 = 100;

/// Where a rollout is.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RolloutPhase {
    /// Ramping: the judge advances it while the guardrails hold.
    Running,
    /// The last step was reached: the candidate is the slot's only variant.
    Promoted {
        /// When (Unix milliseconds).
        at_ms: u64,
    },
    /// A guardrail tripped or an operator stopped it: the candidate's weight is 0 and the
    /// others' weights are back to what they were before.
    Stopped {
        /// When (Unix milliseconds).
        at_ms: u64,
        /// Why, in words.
        reason: String,
    },
}

/// One rollout of one router variant.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rollout {
    /// The candidate variant.
    pub variant: String,
    /// The candidate's content hash.
    pub hash: String,
    /// The plan.
    pub plan: RolloutPlan,
    /// The variant the guardrails compare the candidate with.
    pub control: String,
    /// The other live variants' weights when the rollout started (restored when it stops).
    pub others: Vec<(String, u32)>,
    /// The current step (an index into the plan's steps).
    pub index: usize,
    /// When the current step began (Unix milliseconds, as the log recorded it).
    pub step_started_ms: u64,
    /// The candidate's requests (the fleet's) when the current step began.
    pub requests_at_step: u64,
    /// Where it is.
    pub phase: RolloutPhase,
}

impl Rollout {
    /// The candidate's percent of traffic now.
    pub fn percent(&self) -> u8 {
        match self.phase {
            RolloutPhase::Running => self.plan.steps[self.index],
            RolloutPhase::Promoted { .. } => 100,
            RolloutPhase::Stopped { .. } => 0,
        }
    }

    /// When the current step may end at the earliest (Unix milliseconds), while running.
    pub fn next_step_at_ms(&self) -> Option<u64> {
        (self.phase == RolloutPhase::Running)
            .then(|| self.step_started_ms.saturating_add(self.plan.step_ms))
    }

    /// Every live variant's weight at `percent` for the candidate: the candidate gets
    /// `percent` of the traffic, the others share the rest in their starting proportions.
    pub(crate) fn weights_at(&self, percent: u8) -> Vec<(String, u32)> {
        let candidate = u32::from(percent) * WEIGHT_SCALE;
        let rest = 100 * WEIGHT_SCALE - candidate;
        let total: u64 = self.others.iter().map(|(_, w)| u64::from(*w)).sum();
        let mut weights: Vec<(String, u32)> = self
            .others
            .iter()
            .map(|(name, w)| {
                let share = (u64::from(*w) * u64::from(rest))
                    .checked_div(total)
                    .unwrap_or(0);
                (name.clone(), share as u32)
            })
            .collect();
        weights.push((self.variant.clone(), candidate));
        weights
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rollout(others: Vec<(String, u32)>) -> Rollout {
        Rollout {
            variant: "next".into(),
            hash: "h".into(),
            plan: RolloutPlan::new(&[1, 5, 25, 100], std::time::Duration::from_secs(60), None)
                .unwrap(),
            control: "control".into(),
            others,
            index: 0,
            step_started_ms: 1_000,
            requests_at_step: 0,
            phase: RolloutPhase::Running,
        }
    }

    #[test]
    fn the_candidate_takes_its_percent_and_the_others_share_the_rest_as_they_did() {
        let r = rollout(vec![("control".into(), 100), ("other".into(), 300)]);
        assert_eq!(
            r.weights_at(1),
            [
                ("control".to_owned(), 2475),
                ("other".to_owned(), 7425),
                ("next".to_owned(), 100)
            ]
        );
        assert_eq!(r.weights_at(100)[2], ("next".to_owned(), 10_000));
        assert_eq!(r.next_step_at_ms(), Some(61_000));
        assert_eq!(r.percent(), 1);
    }
}
