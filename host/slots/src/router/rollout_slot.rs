//! The router slot's side of a progressive rollout: start (load the candidate, give it the
//! first step's share), advance (the next step's share; the last promotes the candidate to
//! the slot's only variant), stop (the candidate to 0, the others back to their weights).
//! Each is idempotent, so a revision of the configuration log applied twice changes nothing
//! the second time. When to call them is the judge's business (the admin crate).

use std::sync::Arc;

use ringmaster_config::rollout::RolloutPlan;
use ringmaster_policy_engine::StateMode;
use tracing::{info, warn};

use super::rollout::{Rollout, RolloutPhase};
use super::{RouterSet, RouterSlot, SlotError, rolling_out, rollout_running};

/// What a rollout starts from: the candidate's bytes, its plan, and when (as the log says).
#[derive(Debug)]
pub struct RolloutStart<'a> {
    /// The candidate variant's name.
    pub variant: &'a str,
    /// Its component.
    pub bytes: &'a [u8],
    /// The plan.
    pub plan: RolloutPlan,
    /// When it starts (Unix milliseconds).
    pub at_ms: u64,
    /// Whether a new version of an existing variant keeps its state store.
    pub state: StateMode,
}

impl RouterSlot {
    /// The slot's latest rollout, running or ended, if any ever started.
    pub fn rollout(&self) -> Option<Rollout> {
        self.update
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Starts a rollout: loads the candidate (a new variant, or a new version of one) and
    /// gives it the first step's share; every other live variant is the candidates's
    /// comparison, the first of them the control. Returns `false` when this very rollout
    /// (same variant, version and plan) already runs or was promoted.
    pub fn start_rollout(&self, start: RolloutStart<'_>) -> Result<bool, SlotError> {
        let mut state = self.update.lock().unwrap_or_else(|e| e.into_inner());
        let hash = ringmaster_policy_engine::content_hash(start.bytes);
        if let Some(r) = state.as_ref()
            && r.variant == start.variant
            && r.hash == hash
            && r.plan == start.plan
            && !matches!(r.phase, RolloutPhase::Stopped { .. })
        {
            return Ok(false);
        }
        if let Some(r) = rollout_running(&state) {
            return Err(rolling_out(r));
        }
        let others: Vec<(String, u32)> = self
            .current()
            .variants
            .iter()
            .filter(|v| &*v.name != start.variant && v.weight > 0)
            .map(|v| (v.name.to_string(), v.weight))
            .collect();
        let Some((control, _)) = others.first().cloned() else {
            return Err(SlotError::Invalid(
                "a rollout needs another live variant (weight above 0) to compare the \
                 candidate with: load the current router first, then roll the new one out"
                    .to_owned(),
            ));
        };
        self.install_locked(
            start.variant,
            start.bytes,
            Some(0),
            false,
            None,
            start.state,
        )?;
        let rollout = Rollout {
            variant: start.variant.to_owned(),
            hash,
            control,
            others,
            index: 0,
            step_started_ms: start.at_ms,
            requests_at_step: 0,
            phase: RolloutPhase::Running,
            plan: start.plan,
        };
        let first = rollout.plan.steps[0];
        if first == 100 {
            self.promote_locked(&rollout);
        } else {
            self.set_weights_locked(&rollout.weights_at(first));
        }
        info!(variant = start.variant, percent = first, steps = ?rollout.plan.steps, step_ms = rollout.plan.step_ms, control = %rollout.control, "rollout.started");
        *state = Some(rollout);
        if first == 100 {
            promoted(state.as_mut(), start.at_ms);
        }
        Ok(true)
    }

    /// Moves the running rollout of `variant` to step `index`, begun at `at_ms` with the
    /// candidate's fleet requests at `requests`; the last step promotes it. Returns `false`
    /// when it is already there or past it (a revision applied twice), or not running.
    pub fn advance_rollout(
        &self,
        variant: &str,
        index: usize,
        at_ms: u64,
        requests: u64,
    ) -> Result<bool, SlotError> {
        let mut state = self.update.lock().unwrap_or_else(|e| e.into_inner());
        let Some(rollout) = state
            .as_mut()
            .filter(|r| r.phase == RolloutPhase::Running && r.variant == variant)
        else {
            return Ok(false);
        };
        if index <= rollout.index {
            return Ok(false);
        }
        let Some(&percent) = rollout.plan.steps.get(index) else {
            return Err(SlotError::Invalid(format!(
                "rollout of {variant:?} has {} steps, not {}",
                rollout.plan.steps.len(),
                index + 1
            )));
        };
        rollout.index = index;
        rollout.step_started_ms = at_ms;
        rollout.requests_at_step = requests;
        let snapshot = rollout.clone();
        if percent == 100 {
            self.promote_locked(&snapshot);
            promoted(state.as_mut(), at_ms);
        } else {
            self.set_weights_locked(&snapshot.weights_at(percent));
            info!(variant, step = index + 1, percent, "rollout.advanced");
        }
        Ok(true)
    }

    /// Stops the running rollout of `variant`: its weight to 0, the others' back to what
    /// they were. Returns `false` when none is running.
    pub fn stop_rollout(&self, variant: &str, at_ms: u64, reason: &str) -> bool {
        let mut state = self.update.lock().unwrap_or_else(|e| e.into_inner());
        let Some(rollout) = state
            .as_mut()
            .filter(|r| r.phase == RolloutPhase::Running && r.variant == variant)
        else {
            return false;
        };
        let mut weights = rollout.others.clone();
        weights.push((rollout.variant.clone(), 0));
        self.set_weights_locked(&weights);
        warn!(
            variant,
            step = rollout.index + 1,
            percent = rollout.plan.steps[rollout.index],
            reason,
            "rollout.stopped"
        );
        rollout.phase = RolloutPhase::Stopped {
            at_ms,
            reason: reason.to_owned(),
        };
        true
    }

    /// The candidate becomes the slot's only live variant (the shadow stays), with the
    /// update lock held.
    fn promote_locked(&self, rollout: &Rollout) {
        let current = self.set.load_full();
        let Some(candidate) = current.variants.iter().find(|v| *v.name == rollout.variant) else {
            return;
        };
        let promoted = Arc::new(candidate.successor(
            candidate.policy.clone(),
            candidate.history.clone(),
            100,
            candidate.config.clone(),
        ));
        self.set.store(Arc::new(RouterSet {
            variants: vec![promoted],
            shadow: current.shadow.clone(),
        }));
    }
}

/// Marks the rollout promoted.
fn promoted(rollout: Option<&mut Rollout>, at_ms: u64) {
    if let Some(rollout) = rollout {
        info!(variant = %rollout.variant, "rollout.promoted");
        rollout.phase = RolloutPhase::Promoted { at_ms };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_policy_engine::{EngineConfig, PolicyEngine, builtin::builtin};

    fn weights(slot: &RouterSlot) -> Vec<(String, u32)> {
        slot.current()
            .variants
            .iter()
            .map(|v| (v.name.to_string(), v.weight))
            .collect()
    }

    fn slot_with_control() -> RouterSlot {
        let config = EngineConfig {
            cache_dir: None,
            ..EngineConfig::default()
        };
        let slot = RouterSlot::new(PolicyEngine::new(config).unwrap());
        let control = builtin("consistent-hash").unwrap();
        slot.install("control", control, Some(100), false, None)
            .unwrap();
        slot
    }

    fn start<'a>(bytes: &'a [u8], steps: &[u32]) -> RolloutStart<'a> {
        RolloutStart {
            variant: "next",
            bytes,
            plan: RolloutPlan::new(steps, std::time::Duration::from_secs(1), Some(5)).unwrap(),
            at_ms: 1_000,
            state: StateMode::Keep,
        }
    }

    #[test]
    fn a_rollout_ramps_step_by_step_and_promotes_at_the_last() {
        let slot = slot_with_control();
        let next = builtin("round-robin").unwrap();
        assert!(slot.start_rollout(start(next, &[10, 50, 100])).unwrap());
        assert_eq!(
            weights(&slot),
            [("control".to_owned(), 9_000), ("next".to_owned(), 1_000)]
        );
        // The same start again (a revision applied twice) changes nothing.
        assert!(!slot.start_rollout(start(next, &[10, 50, 100])).unwrap());
        // While it runs, the weights and the candidate are the rollout's.
        assert!(slot.set_weight("control", 1).is_err());
        assert!(slot.remove("next").is_err());
        assert!(slot.install("next", next, Some(5), false, None).is_err());
        assert!(slot.advance_rollout("next", 1, 2_000, 40).unwrap());
        assert!(!slot.advance_rollout("next", 1, 2_000, 40).unwrap());
        assert_eq!(
            weights(&slot),
            [("control".to_owned(), 5_000), ("next".to_owned(), 5_000)]
        );
        let rollout = slot.rollout().unwrap();
        assert_eq!((rollout.index, rollout.requests_at_step), (1, 40));
        assert_eq!(rollout.next_step_at_ms(), Some(3_000));
        assert!(slot.advance_rollout("next", 2, 3_000, 80).unwrap());
        assert_eq!(weights(&slot), [("next".to_owned(), 100)]);
        assert_eq!(
            slot.rollout().unwrap().phase,
            RolloutPhase::Promoted { at_ms: 3_000 }
        );
        // Ended: the weights are the operator's again.
        assert!(slot.set_weight("next", 7).unwrap());
    }

    #[test]
    fn a_stopped_rollout_gives_the_others_their_weights_back_and_can_start_again() {
        let slot = slot_with_control();
        let next = builtin("round-robin").unwrap();
        slot.start_rollout(start(next, &[1, 100])).unwrap();
        assert_eq!(
            weights(&slot),
            [("control".to_owned(), 9_900), ("next".to_owned(), 100)]
        );
        assert!(slot.stop_rollout("next", 1_500, "mean TTFT slower"));
        assert!(!slot.stop_rollout("next", 1_600, "again"));
        assert_eq!(
            weights(&slot),
            [("control".to_owned(), 100), ("next".to_owned(), 0)]
        );
        let RolloutPhase::Stopped { reason, .. } = slot.rollout().unwrap().phase else {
            panic!("stopped");
        };
        assert_eq!(reason, "mean TTFT slower");
        // Nothing advances a stopped rollout; a new start begins again at the first step.
        assert!(!slot.advance_rollout("next", 1, 2_000, 0).unwrap());
        assert!(slot.start_rollout(start(next, &[1, 100])).unwrap());
        assert_eq!(slot.rollout().unwrap().phase, RolloutPhase::Running);
    }

    #[test]
    fn a_rollout_needs_a_live_control() {
        let config = EngineConfig {
            cache_dir: None,
            ..EngineConfig::default()
        };
        let slot = RouterSlot::new(PolicyEngine::new(config).unwrap());
        let error = slot
            .start_rollout(start(builtin("round-robin").unwrap(), &[5, 100]))
            .unwrap_err();
        assert!(
            error.to_string().contains("another live variant"),
            "{error}"
        );
    }
}
