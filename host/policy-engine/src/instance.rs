//! [`Core`]: one policy version's state, wrapped by every policy handle: its `InstancePre`, its
//! pool of warm instances, its fault counters. A call ([`Core::call`]) takes a warm instance
//! (or makes one), arms its deadline or fuel, runs the guest with the call's context visible
//! to the imports, and puts the instance back; an instance whose call failed is dropped.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use wasmtime::component::{ComponentExportIndex, InstancePre};
use wasmtime::{Store, Trap, UpdateDeadline};

use crate::INSTANTIATE_FUEL_FACTOR;
use crate::contract::{Version, World};
use crate::error::{FaultCounters, PolicyFault};
use crate::host::{self, CallCx, PolicyShared, StoreData};
use crate::shared::EngineInner;
use crate::types::PolicyInfo;

/// Which limit a store is armed with before guest code runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Budget {
    /// An ordinary call: `call_deadline` or `fuel`.
    Call,
    /// A probe call while loading: `instantiate_deadline`, or an ordinary call's fuel.
    Probe,
    /// Instantiation: `instantiate_deadline`, or `fuel` × the instantiate factor.
    Instantiate,
}

impl Budget {
    fn call(counting: bool) -> Self {
        if counting { Self::Call } else { Self::Probe }
    }
}

/// One warm instance: its store and typed exports.
pub(crate) struct Warm<E> {
    store: Store<StoreData>,
    exports: E,
}

pub(crate) enum InstantiateError {
    /// Instantiation itself failed (as a fault: trap, deadline, memory, or other).
    Failed(PolicyFault),
    /// An export is missing or has the wrong type.
    Exports(wasmtime::Error),
}

/// One loaded policy version: what every handle of it shares.
pub(crate) struct Core<W: World> {
    pub(crate) info: PolicyInfo,
    pub(crate) engine: Arc<EngineInner>,
    pub(crate) shared: Arc<PolicyShared>,
    pub(crate) pre: InstancePre<StoreData>,
    /// The contract it was built against.
    pub(crate) version: Version,
    pub(crate) export_indices: Vec<ComponentExportIndex>,
    /// Which of `W::OPTIONAL_EXPORTS` it has.
    pub(crate) optional: Vec<bool>,
    pub(crate) warm: Mutex<Vec<Warm<W::Exports>>>,
    pub(crate) faults: FaultCounters,
    /// In fuel mode, the fuel the last successful call burned (`u64::MAX`: none yet).
    pub(crate) last_call_fuel: std::sync::atomic::AtomicU64,
}

impl<W: World> Core<W> {
    /// Runs one guest call on a warm instance with `cx` visible to the imports.
    ///
    /// An error from `call` is classified into a fault, counted, and the instance dropped.
    pub(crate) fn call<R>(
        &self,
        cx: CallCx<'_>,
        call: impl FnOnce(&mut Store<StoreData>, W::Exports) -> wasmtime::Result<R>,
    ) -> Result<R, PolicyFault> {
        let mut warm = match self.take() {
            Ok(warm) => warm,
            Err(fault) => return Err(self.fault(fault)),
        };
        // A probe call (not counting) runs while a new version loads, often on a busy
        // gateway, and is each instance's first call: copy-on-write memory is still being
        // paged in. It gets the instantiate deadline so a load under traffic is not refused
        // for a few milliseconds of scheduling; an endless loop is still caught.
        let cx_counting = cx.counting;
        self.arm(&mut warm.store, Budget::call(cx.counting));
        let exports = warm.exports;
        let store = &mut warm.store;
        match host::with_call(cx, || call(store, exports)) {
            Ok(value) => {
                // `get_fuel` only in fuel mode: elsewhere it returns an error, whose creation
                // costs microseconds when backtraces are on (`RUST_BACKTRACE=1`).
                if let Some(budget) = self.engine.config.fuel
                    && cx_counting
                    && let Ok(left) = warm.store.get_fuel()
                {
                    self.last_call_fuel.store(
                        budget.saturating_sub(left),
                        std::sync::atomic::Ordering::Relaxed,
                    );
                }
                self.put(warm);
                Ok(value)
            }
            Err(error) => {
                let fault = classify(&error, warm.store.data());
                tracing::debug!(
                    target: "policy",
                    policy = self.info.name.as_str(),
                    kind = fault.kind(),
                    error = %format!("{error:#}"),
                    "policy.fault_detail"
                );
                drop(warm);
                Err(self.fault(fault))
            }
        }
    }

    /// Counts `fault` and hands it back.
    pub(crate) fn fault(&self, fault: PolicyFault) -> PolicyFault {
        self.faults.count(&fault);
        fault
    }

    fn take(&self) -> Result<Warm<W::Exports>, PolicyFault> {
        let pooled = self
            .warm
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        match pooled {
            Some(warm) => Ok(warm),
            None => self.instantiate().map_err(|e| match e {
                InstantiateError::Failed(fault) => {
                    PolicyFault::Instantiate(self.engine.explain(&fault, true))
                }
                InstantiateError::Exports(e) => PolicyFault::Instantiate(format!("{e:#}")),
            }),
        }
    }

    pub(crate) fn put(&self, warm: Warm<W::Exports>) {
        let mut pool = self.warm.lock().unwrap_or_else(PoisonError::into_inner);
        if pool.len() < self.engine.config.warm_instances.max(1) {
            pool.push(warm);
        }
    }

    fn arm(&self, store: &mut Store<StoreData>, budget: Budget) {
        store.data_mut().limiter.denied = false;
        store.data_mut().prefix_matches_given = false;
        store.data_mut().deadline_extension = None;
        store.data_mut().call_ticks = match (self.engine.config.fuel, budget) {
            (Some(_), _) => None,
            (None, Budget::Call) => Some(self.engine.call_ticks),
            (None, _) => Some(self.engine.instantiate_ticks),
        };
        match self.engine.config.fuel {
            Some(fuel) => {
                // Fuel does not depend on load, so a probe call gets an ordinary call's fuel.
                let fuel = if budget == Budget::Instantiate {
                    fuel.saturating_mul(INSTANTIATE_FUEL_FACTOR)
                } else {
                    fuel
                };
                // Cannot fail: fuel is enabled whenever `config.fuel` is set.
                let _ = store.set_fuel(fuel);
            }
            None => store.set_epoch_deadline(if budget != Budget::Call {
                self.engine.instantiate_ticks
            } else {
                self.engine.call_ticks
            }),
        }
    }

    pub(crate) fn instantiate(&self) -> Result<Warm<W::Exports>, InstantiateError> {
        let engine = &self.engine;
        let mut store = Store::new(
            &engine.engine,
            StoreData::new(self.shared.clone(), engine.config.memory_limit_bytes),
        );
        store.limiter(|data| &mut data.limiter);
        if engine.config.fuel.is_none() {
            // Reaching the deadline interrupts the call, unless host work the deadline must
            // not count (`StoreData::prefix_matches`) granted one extension.
            store.epoch_deadline_callback(|mut cx| match cx.data_mut().deadline_extension.take() {
                Some(ticks) => Ok(UpdateDeadline::Continue(ticks)),
                None => Err(Trap::Interrupt.into()),
            });
        }
        self.arm(&mut store, Budget::Instantiate);
        let cx = CallCx {
            host: None,
            request: None,
            request_id: "",
            counting: true,
        };
        let instance = host::with_call(cx, || self.pre.instantiate(&mut store))
            .map_err(|e| InstantiateError::Failed(classify_instantiate(&e, store.data())))?;
        let exports = W::exports(
            &instance,
            &mut store,
            self.version,
            &self.export_indices,
            &self.optional,
        )
        .map_err(InstantiateError::Exports)?;
        Ok(Warm { store, exports })
    }

    pub(crate) fn faults(&self) -> crate::FaultCounts {
        self.faults.snapshot()
    }

    pub(crate) fn state_usage(&self) -> crate::StateUsage {
        self.shared.state.usage()
    }

    /// In fuel mode, the fuel (about one unit per Wasm instruction) the last successful
    /// ordinary call burned; `None` in epoch mode or before the first call.
    pub(crate) fn last_call_fuel(&self) -> Option<u64> {
        let fuel = self
            .last_call_fuel
            .load(std::sync::atomic::Ordering::Relaxed);
        (fuel != u64::MAX).then_some(fuel)
    }

    /// Instantiates the component afresh, outside the warm pool, and drops the instance: what
    /// a call pays when no warm instance is free (its start-up code included).
    pub(crate) fn time_instantiation(&self) -> Result<std::time::Duration, PolicyFault> {
        let started = std::time::Instant::now();
        let warm = self.instantiate().map_err(|e| match e {
            InstantiateError::Failed(fault) => fault,
            InstantiateError::Exports(e) => PolicyFault::Instantiate(format!("{e:#}")),
        })?;
        let elapsed = started.elapsed();
        drop(warm);
        Ok(elapsed)
    }

    /// Drops every warm instance (tests: force the next call to instantiate).
    #[cfg(test)]
    pub(crate) fn drain(&self) -> usize {
        let mut pool = self.warm.lock().unwrap_or_else(PoisonError::into_inner);
        let n = pool.len();
        pool.clear();
        n
    }
}

impl<W: World> fmt::Debug for Core<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(W::NAME)
            .field("info", &self.info)
            .field("faults", &self.faults.snapshot())
            .finish_non_exhaustive()
    }
}

/// A failed call, as a fault.
fn classify(error: &wasmtime::Error, data: &StoreData) -> PolicyFault {
    match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt | Trap::OutOfFuel) => PolicyFault::Deadline,
        _ if data.limiter.denied => PolicyFault::OutOfMemory,
        Some(trap) => {
            let text = trap.to_string();
            PolicyFault::Trap(text.strip_prefix("wasm trap: ").unwrap_or(&text).to_owned())
        }
        None => PolicyFault::Trap(error.to_string()),
    }
}

/// A failed instantiation, as a fault (a non-trap error keeps its whole chain: it is usually
/// a pooling-allocator limit and the chain says which).
fn classify_instantiate(error: &wasmtime::Error, data: &StoreData) -> PolicyFault {
    match error.downcast_ref::<Trap>() {
        Some(_) => classify(error, data),
        None if data.limiter.denied => PolicyFault::OutOfMemory,
        None => PolicyFault::Instantiate(format!("{error:#}")),
    }
}
