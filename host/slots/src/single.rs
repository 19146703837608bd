//! A single-policy slot: the admission and safety-filter slots, each holding at most one
//! policy version, its earlier versions for rollback, and its fault streak.
//!
//! Like the router slot, a slot publishes one immutable [`Installed`] through `ArcSwap`, so a
//! request finishes on the version it began with and a swap never blocks a request. Loading
//! (compile → pre-instantiate → probe) happens in the policy engine before anything is
//! published; on failure the old version stays and the caller gets the reason. An unchanged
//! content hash is a no-op. After [`DEFAULT_ROLLBACK_AFTER_FAULTS`] faults in a row the slot
//! rolls back to its previous version. This module knows nothing of what the policy decides:
//! the gateway's admission and safety gates carry the decisions out.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwapOption;
use ringmaster_policy_engine::{
    AdmissionPolicy, FaultCounts, PolicyEngine, PolicyError, PolicyFault, PolicyInfo, SafetyPolicy,
};
use tracing::{info, warn};

use crate::router::{DEFAULT_ROLLBACK_AFTER_FAULTS, MAX_HISTORY_VERSIONS, SlotError};

/// A policy kind a single slot can hold.
pub trait SlotPolicy: Clone + Send + Sync + 'static {
    /// The slot's name in the admin API, metrics and logs.
    const SLOT: &'static str;
    /// Loads and probes a version.
    fn load(
        engine: &PolicyEngine,
        name: &str,
        bytes: &[u8],
        config: BTreeMap<String, String>,
    ) -> Result<Self, PolicyError>;
    /// What was loaded.
    fn info(&self) -> &PolicyInfo;
    /// Its faults so far.
    fn faults(&self) -> FaultCounts;
}

impl SlotPolicy for AdmissionPolicy {
    const SLOT: &'static str = "admission";
    fn load(
        engine: &PolicyEngine,
        name: &str,
        bytes: &[u8],
        config: BTreeMap<String, String>,
    ) -> Result<Self, PolicyError> {
        engine.load_admission(name, bytes, config)
    }
    fn info(&self) -> &PolicyInfo {
        AdmissionPolicy::info(self)
    }
    fn faults(&self) -> FaultCounts {
        AdmissionPolicy::faults(self)
    }
}

impl SlotPolicy for SafetyPolicy {
    const SLOT: &'static str = "safety-filter";
    fn load(
        engine: &PolicyEngine,
        name: &str,
        bytes: &[u8],
        config: BTreeMap<String, String>,
    ) -> Result<Self, PolicyError> {
        engine.load_safety(name, bytes, config)
    }
    fn info(&self) -> &PolicyInfo {
        SafetyPolicy::info(self)
    }
    fn faults(&self) -> FaultCounts {
        SafetyPolicy::faults(self)
    }
}

/// The version a slot holds now, with what it needs to roll back.
#[derive(Debug)]
pub struct Installed<P> {
    /// The name it was loaded under (its metric label and log tag).
    pub name: Arc<str>,
    /// The live version.
    pub policy: P,
    /// Its configuration.
    pub config: BTreeMap<String, String>,
    /// Earlier versions, newest last.
    pub history: Vec<P>,
    consecutive_faults: AtomicU32,
}

/// One single-policy slot.
#[derive(Debug)]
pub struct PolicySlot<P> {
    engine: PolicyEngine,
    current: ArcSwapOption<Installed<P>>,
    /// Serialises changes (never held by a request).
    write: Mutex<()>,
    rollback_after_faults: u32,
    /// Faults of every version, for the metrics.
    pub faults_total: AtomicU64,
}

impl<P: SlotPolicy> PolicySlot<P> {
    /// An empty slot.
    pub fn new(engine: PolicyEngine) -> Self {
        Self {
            engine,
            current: ArcSwapOption::empty(),
            write: Mutex::new(()),
            rollback_after_faults: DEFAULT_ROLLBACK_AFTER_FAULTS,
            faults_total: AtomicU64::new(0),
        }
    }

    /// The installed version, if any.
    pub fn current(&self) -> Option<Arc<Installed<P>>> {
        self.current.load_full()
    }

    /// Loads `bytes` under `name` and publishes it. `config` of `None` keeps the installed
    /// version's configuration. Returns whether anything changed (an identical component with
    /// the same name and configuration is a no-op).
    pub fn install(
        &self,
        name: &str,
        bytes: &[u8],
        config: Option<BTreeMap<String, String>>,
    ) -> Result<bool, SlotError> {
        if name.is_empty() || name.len() > 64 {
            return Err(SlotError::Invalid(
                "a policy name must be 1 to 64 characters".into(),
            ));
        }
        let _write = self.write.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.current.load_full();
        let config = config
            .or_else(|| current.as_ref().map(|c| c.config.clone()))
            .unwrap_or_default();
        let hash = ringmaster_policy_engine::content_hash(bytes);
        if let Some(current) = &current
            && current.policy.info().hash == hash
            && &*current.name == name
            && current.config == config
        {
            return Ok(false);
        }
        let policy = P::load(&self.engine, name, bytes, config.clone())?;
        let mut history = current
            .as_ref()
            .map(|c| {
                let mut h = c.history.clone();
                h.push(c.policy.clone());
                h
            })
            .unwrap_or_default();
        if history.len() > MAX_HISTORY_VERSIONS {
            history.drain(..history.len() - MAX_HISTORY_VERSIONS);
        }
        info!(
            slot = P::SLOT,
            policy = name,
            hash = %policy.info().hash,
            "policy.installed"
        );
        self.current.store(Some(Arc::new(Installed {
            name: name.into(),
            policy,
            config,
            history,
            consecutive_faults: AtomicU32::new(0),
        })));
        Ok(true)
    }

    /// Empties the slot (the gateway then behaves as if none were configured).
    pub fn remove(&self) -> Result<(), SlotError> {
        let _write = self.write.lock().unwrap_or_else(|e| e.into_inner());
        if self.current.swap(None).is_none() {
            return Err(SlotError::Invalid(format!(
                "the {} slot is already empty",
                P::SLOT
            )));
        }
        info!(slot = P::SLOT, "policy.removed");
        Ok(())
    }

    /// Goes back to the previous version.
    pub fn rollback(&self) -> Result<(), SlotError> {
        self.rollback_if(None)
    }

    fn rollback_if(&self, expected_hash: Option<&str>) -> Result<(), SlotError> {
        let _write = self.write.lock().unwrap_or_else(|e| e.into_inner());
        let Some(current) = self.current.load_full() else {
            return Err(SlotError::Invalid(format!("the {} slot is empty", P::SLOT)));
        };
        if expected_hash.is_some_and(|h| h != current.policy.info().hash) {
            // Someone swapped it meanwhile: the faulty version is already gone.
            return Ok(());
        }
        let mut history = current.history.clone();
        let Some(previous) = history.pop() else {
            return Err(SlotError::NoPreviousVersion(P::SLOT.to_owned()));
        };
        warn!(
            slot = P::SLOT,
            from = %current.policy.info().hash,
            to = %previous.info().hash,
            "policy.rolled_back"
        );
        self.current.store(Some(Arc::new(Installed {
            name: current.name.clone(),
            policy: previous,
            config: current.config.clone(),
            history,
            consecutive_faults: AtomicU32::new(0),
        })));
        Ok(())
    }

    /// Records an answer that was not a fault (ends a fault streak).
    pub fn succeeded(&self, installed: &Installed<P>) {
        installed.consecutive_faults.store(0, Ordering::Relaxed);
    }

    /// Records a fault; rolls back after too many in a row.
    pub fn faulted(&self, installed: &Installed<P>, fault: &PolicyFault) {
        self.faults_total.fetch_add(1, Ordering::Relaxed);
        let in_a_row = installed.consecutive_faults.fetch_add(1, Ordering::Relaxed) + 1;
        warn!(
            slot = P::SLOT,
            policy = %installed.name,
            kind = fault.kind(),
            in_a_row,
            "policy.fault"
        );
        if in_a_row >= self.rollback_after_faults && !installed.history.is_empty() {
            let hash = installed.policy.info().hash.clone();
            let _ = self.rollback_if(Some(&hash));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_policy_engine::builtin::builtin;
    use ringmaster_policy_engine::{AdmissionPolicy, EngineConfig, SafetyPolicy};

    fn engine() -> PolicyEngine {
        PolicyEngine::new(EngineConfig {
            cache_dir: None,
            ..EngineConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn an_admission_slot_swaps_keeps_its_history_and_rolls_back_after_faults() {
        let slot: PolicySlot<AdmissionPolicy> = PolicySlot::new(engine());
        assert!(slot.current().is_none());
        let tiered = builtin("tiered").unwrap();
        assert!(slot.install("tiers", tiered, None).unwrap());
        // The same component, name and configuration again: nothing to do.
        assert!(!slot.install("tiers", tiered, None).unwrap());
        let first = slot.current().unwrap();
        let config = BTreeMap::from([("premium".to_owned(), "gold".to_owned())]);
        assert!(slot.install("tiers", tiered, Some(config.clone())).unwrap());
        let second = slot.current().unwrap();
        assert_eq!(second.config, config);
        assert_eq!(second.history.len(), 1);
        // A request that began on the first version still holds it.
        assert!(first.history.is_empty());
        for _ in 1..DEFAULT_ROLLBACK_AFTER_FAULTS {
            slot.faulted(&second, &PolicyFault::Deadline);
        }
        slot.succeeded(&second);
        for _ in 1..DEFAULT_ROLLBACK_AFTER_FAULTS {
            slot.faulted(&second, &PolicyFault::Deadline);
        }
        assert!(
            Arc::ptr_eq(&slot.current().unwrap(), &second),
            "an answer between the faults ended the streak"
        );
        slot.faulted(&second, &PolicyFault::Deadline);
        let now = slot.current().unwrap();
        assert!(now.history.is_empty(), "rolled back to the first version");
        assert_eq!(
            slot.faults_total.load(Ordering::Relaxed),
            u64::from(2 * DEFAULT_ROLLBACK_AFTER_FAULTS - 1)
        );
        assert!(matches!(
            slot.rollback(),
            Err(SlotError::NoPreviousVersion(_))
        ));
        slot.remove().unwrap();
        assert!(slot.current().is_none());
        assert!(slot.remove().is_err());
    }

    #[test]
    fn a_slot_refuses_a_component_of_another_world_and_keeps_what_it_had() {
        let slot: PolicySlot<SafetyPolicy> = PolicySlot::new(engine());
        slot.install("block", builtin("blocklist").unwrap(), None)
            .unwrap();
        let error = slot
            .install("router", builtin("consistent-hash").unwrap(), None)
            .unwrap_err();
        assert!(matches!(error, SlotError::Policy(_)), "{error}");
        assert_eq!(&*slot.current().unwrap().name, "block");
        assert!(
            slot.install("", builtin("blocklist").unwrap(), None)
                .is_err()
        );
    }
}
