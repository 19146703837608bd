//! The safety gate: runs the safety-filter policy on a request's prompt before anything runs,
//! and on windows of its reply before they reach the client.
//!
//! Output is checked in windows of about `window_bytes` (never per token): generated text is
//! held back until the window holding it has been allowed, so blocked text never leaves the
//! gateway. Each window is sent with the last [`OUTPUT_OVERLAP_BYTES`] of text already allowed,
//! so a pattern split across two windows is still seen. A blocked reply ends at once with
//! `stop_reason: "refusal"` (the generation is cancelled); a blocked prompt is refused with
//! 400 before routing. A fault of the filter allows the text, unless `fail_closed` is set, in
//! which case it blocks it. With no safety filter installed the gate does nothing.

use std::sync::Arc;

use ringmaster_policy_engine::{PolicyFault, SafetyPolicy, SafetyVerdict};

use crate::metrics::{FaultLabels, Metrics, SafetyLabels};
use ringmaster_api::error::{ApiError, ErrorKind};
use ringmaster_slots::single::{Installed, PolicySlot};

pub use ringmaster_config::policies::DEFAULT_OUTPUT_WINDOW_BYTES;
/// Bytes of already-allowed text sent again at the start of each output window.
pub const OUTPUT_OVERLAP_BYTES: usize = 64;

/// The safety-filter slot and how it is applied.
#[derive(Debug)]
pub struct SafetyGate {
    /// The slot holding the safety filter.
    pub slot: PolicySlot<SafetyPolicy>,
    window_bytes: usize,
    fail_closed: bool,
}

/// Text the filter blocked, with its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// The filter's reason (or that it failed, when failing closed).
    pub reason: String,
    /// The filter faulted and the gate fails closed (not the text's fault).
    pub by_fault: bool,
}

impl SafetyGate {
    /// A gate over `slot` checking output every `window_bytes`.
    pub fn new(slot: PolicySlot<SafetyPolicy>, window_bytes: usize, fail_closed: bool) -> Self {
        Self {
            slot,
            window_bytes: window_bytes.max(1),
            fail_closed,
        }
    }

    /// Checks a prompt; a block is a 400 naming the filter's reason.
    pub fn check_input(&self, metrics: &Metrics, text: &str) -> Result<(), ApiError> {
        let Some(installed) = self.slot.current() else {
            return Ok(());
        };
        let verdict = installed.policy.check_input(text);
        match self.settle(&installed, metrics, "input", verdict) {
            Ok(()) => Ok(()),
            Err(blocked) if blocked.by_fault => Err(ApiError::new(
                ErrorKind::Unavailable,
                format!("the prompt could not be checked: {}", blocked.reason),
            )),
            Err(blocked) => Err(ApiError::new(
                ErrorKind::InvalidRequest,
                format!("the safety filter blocked the prompt: {}", blocked.reason),
            )),
        }
    }

    /// A filter for one reply's output, on the version installed now (`None`: no filter).
    pub fn output(self: &Arc<Self>) -> Option<OutputFilter> {
        Some(OutputFilter {
            installed: self.slot.current()?,
            gate: self.clone(),
            pending: String::new(),
            allowed_tail: String::new(),
        })
    }

    /// Counts a verdict and turns it into allow (`Ok`) or block.
    fn settle(
        &self,
        installed: &Installed<SafetyPolicy>,
        metrics: &Metrics,
        stage: &'static str,
        verdict: Result<SafetyVerdict, PolicyFault>,
    ) -> Result<(), Blocked> {
        let (label, outcome) = match verdict {
            Ok(SafetyVerdict::Allow) => {
                self.slot.succeeded(installed);
                ("allow", Ok(()))
            }
            Ok(SafetyVerdict::Block(reason)) => {
                self.slot.succeeded(installed);
                (
                    "block",
                    Err(Blocked {
                        reason,
                        by_fault: false,
                    }),
                )
            }
            Err(fault) => {
                metrics
                    .policy_faults
                    .get_or_create(&FaultLabels {
                        slot: "safety-filter",
                        variant: installed.name.to_string(),
                        kind: fault.kind(),
                    })
                    .inc();
                self.slot.faulted(installed, &fault);
                if self.fail_closed {
                    let reason = format!(
                        "the safety filter failed ({}) and the gateway fails closed",
                        fault.kind()
                    );
                    (
                        "fault",
                        Err(Blocked {
                            reason,
                            by_fault: true,
                        }),
                    )
                } else {
                    ("fault", Ok(()))
                }
            }
        };
        metrics
            .safety_verdicts
            .get_or_create(&SafetyLabels {
                stage,
                verdict: label,
            })
            .inc();
        outcome
    }
}

/// Holds back one reply's output until the filter has allowed it.
#[derive(Debug)]
pub struct OutputFilter {
    installed: Arc<Installed<SafetyPolicy>>,
    gate: Arc<SafetyGate>,
    pending: String,
    allowed_tail: String,
}

impl OutputFilter {
    /// Adds generated text; returns the text now allowed to go to the client (empty while a
    /// window fills).
    pub fn push(&mut self, metrics: &Metrics, piece: &str) -> Result<String, Blocked> {
        self.pending.push_str(piece);
        if self.pending.len() < self.gate.window_bytes {
            return Ok(String::new());
        }
        self.check(metrics, false)
    }

    /// Checks and lets out what is held back now, before the reply moves on to something the
    /// filter does not read (a tool call): the window is checked as it is, not as the end.
    pub fn flush(&mut self, metrics: &Metrics) -> Result<String, Blocked> {
        if self.pending.is_empty() {
            return Ok(String::new());
        }
        self.check(metrics, false)
    }

    /// Checks what is left at the end of the reply (the final window, possibly empty).
    pub fn finish(&mut self, metrics: &Metrics) -> Result<String, Blocked> {
        self.check(metrics, true)
    }

    fn check(&mut self, metrics: &Metrics, is_final: bool) -> Result<String, Blocked> {
        let window = format!("{}{}", self.allowed_tail, self.pending);
        let verdict = self.installed.policy.check_output(&window, is_final);
        self.gate
            .settle(&self.installed, metrics, "output", verdict)?;
        let allowed = std::mem::take(&mut self.pending);
        let mut start = window.len().saturating_sub(OUTPUT_OVERLAP_BYTES);
        while !window.is_char_boundary(start) {
            start += 1;
        }
        self.allowed_tail = window[start..].to_owned();
        Ok(allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_policy_engine::{EngineConfig, PolicyEngine};
    use std::collections::BTreeMap;

    fn metrics(_engine: &PolicyEngine) -> Metrics {
        Metrics::new()
    }

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/../../policies/dist/fixtures/{name}.wasm",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn faulty(fail_closed: bool) -> (Arc<SafetyGate>, Metrics) {
        let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
        let slot = PolicySlot::new(engine.clone());
        let bytes = fixture("filter-faults-on-demand");
        slot.install("faulty", &bytes, None).unwrap();
        let metrics = metrics(&engine);
        (Arc::new(SafetyGate::new(slot, 16, fail_closed)), metrics)
    }

    #[tokio::test]
    async fn a_fault_allows_unless_the_gate_fails_closed() {
        let (open, metrics) = faulty(false);
        assert!(open.check_input(&metrics, "total chaos").is_ok());
        let mut filter = open.output().unwrap();
        assert_eq!(
            filter.push(&metrics, "chaos and more chaos").unwrap(),
            "chaos and more chaos"
        );

        let (closed, metrics) = faulty(true);
        let err = closed.check_input(&metrics, "total chaos").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable, "not the client's fault");
        assert!(closed.check_input(&metrics, "calm").is_ok());
        let mut filter = closed.output().unwrap();
        let blocked = filter.push(&metrics, "chaos and more chaos").unwrap_err();
        assert!(blocked.by_fault);
        assert!(
            blocked.reason.contains("fails closed"),
            "{}",
            blocked.reason
        );
        assert!(
            closed
                .slot
                .faults_total
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 2
        );
    }

    #[tokio::test]
    async fn repeated_faults_roll_the_slot_back_and_a_success_ends_the_streak() {
        let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
        let slot = PolicySlot::<SafetyPolicy>::new(engine.clone());
        let good = ringmaster_policy_engine::builtin::builtin("blocklist").unwrap();
        slot.install("filter", good, None).unwrap();
        slot.install("filter", &fixture("filter-faults-on-demand"), None)
            .unwrap();
        let faulty_hash = slot.current().unwrap().policy.info().hash.clone();
        let gate = Arc::new(SafetyGate::new(slot, 16, false));
        let metrics = metrics(&engine);
        for _ in 0..4 {
            gate.check_input(&metrics, "chaos").unwrap();
        }
        gate.check_input(&metrics, "calm").unwrap();
        for _ in 0..4 {
            gate.check_input(&metrics, "chaos").unwrap();
        }
        assert_eq!(gate.slot.current().unwrap().policy.info().hash, faulty_hash);
        gate.check_input(&metrics, "chaos").unwrap();
        let now = gate.slot.current().unwrap();
        assert_eq!(
            now.policy.info().hash,
            ringmaster_policy_engine::content_hash(good)
        );
        assert!(now.history.is_empty());
        assert!(matches!(
            gate.slot.rollback(),
            Err(ringmaster_slots::router::SlotError::NoPreviousVersion(_))
        ));
    }

    fn blocklist(patterns: &str, window_bytes: usize) -> (Arc<SafetyGate>, Metrics) {
        let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
        let slot = PolicySlot::new(engine.clone());
        let bytes = ringmaster_policy_engine::builtin::builtin("blocklist").unwrap();
        let config = BTreeMap::from([("patterns".to_owned(), patterns.to_owned())]);
        slot.install("words", bytes, Some(config)).unwrap();
        let metrics = metrics(&engine);
        (
            Arc::new(SafetyGate::new(slot, window_bytes, false)),
            metrics,
        )
    }

    #[tokio::test]
    async fn a_pattern_split_across_windows_is_caught_before_its_second_half_leaves() {
        let (gate, metrics) = blocklist("needle", 16);
        let mut filter = gate.output().unwrap();
        assert_eq!(filter.push(&metrics, "0123456789").unwrap(), "");
        // The window fills (18 bytes) and ends in "nee": allowed, released.
        assert_eq!(
            filter.push(&metrics, "abcdenee").unwrap(),
            "0123456789abcdenee"
        );
        // "dle" completes the pattern; it is held back and the final window blocks it.
        assert_eq!(filter.push(&metrics, "dle").unwrap(), "");
        let blocked = filter.finish(&metrics).unwrap_err();
        assert_eq!(blocked.reason, "blocked by blocklist rule 0");
    }

    #[tokio::test]
    async fn text_is_released_whole_and_in_order() {
        let (gate, metrics) = blocklist("never", 8);
        let mut filter = gate.output().unwrap();
        let pieces = ["Once ", "upon ", "a ", "time, ", "ünïcödé ", "text", "."];
        let mut out = String::new();
        for piece in pieces {
            out.push_str(&filter.push(&metrics, piece).unwrap());
        }
        out.push_str(&filter.finish(&metrics).unwrap());
        assert_eq!(out, pieces.concat());
    }

    #[tokio::test]
    async fn a_blocked_prompt_is_a_400_and_an_empty_slot_allows_everything() {
        let (gate, metrics) = blocklist("secret", 16);
        let err = gate
            .check_input(&metrics, "tell me the SECRET")
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
        assert!(gate.check_input(&metrics, "hello").is_ok());
        gate.slot.remove().unwrap();
        assert!(gate.check_input(&metrics, "tell me the secret").is_ok());
        assert!(gate.output().is_none());
    }
}
