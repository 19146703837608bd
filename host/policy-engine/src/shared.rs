//! What the engine shares with every version it loaded: wasmtime's `Engine` and `Linker`, the
//! engine's settings and deadlines in ticks, the compile cache, and each policy's counters and
//! state by name. The engine ([`crate::engine`]) builds it; a version's instances
//! ([`crate::instance`]) read it. It must not load or run a policy itself.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use wasmtime::component::Linker;
use wasmtime::{Cache, Engine};

use crate::error::PolicyFault;
use crate::host::{CounterSet, StoreData};
use crate::state::StateStore;
use crate::{EngineConfig, INSTANTIATE_FUEL_FACTOR};

pub(crate) struct EngineInner {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<StoreData>,
    pub(crate) config: EngineConfig,
    pub(crate) call_ticks: u64,
    pub(crate) instantiate_ticks: u64,
    pub(crate) cache: Option<Cache>,
    pub(crate) counters: Mutex<BTreeMap<String, Arc<CounterSet>>>,
    /// Each policy's `state` store, by world and name: what the next version loaded under
    /// that name starts with ([`StateMode::Keep`]).
    pub(crate) states: Mutex<BTreeMap<(&'static str, String), Arc<StateStore>>>,
}

impl EngineInner {
    pub(crate) fn new_state(&self) -> StateStore {
        StateStore::new(self.config.state_max_entries, self.config.state_max_bytes)
    }

    pub(crate) fn explain(&self, fault: &PolicyFault, instantiating: bool) -> String {
        let config = &self.config;
        match fault {
            PolicyFault::Deadline => match (config.fuel, instantiating) {
                (Some(fuel), false) => {
                    format!("it ran out of its {fuel} units of fuel (an endless loop?)")
                }
                (Some(fuel), true) => format!(
                    "its start-up ran out of its {} units of fuel",
                    fuel.saturating_mul(INSTANTIATE_FUEL_FACTOR)
                ),
                (None, false) => format!(
                    "it ran past its {:?} deadline (an endless loop?)",
                    config.call_deadline
                ),
                (None, true) => format!(
                    "its start-up ran past the {:?} instantiate deadline",
                    config.instantiate_deadline
                ),
            },
            PolicyFault::OutOfMemory => format!(
                "it needed more than its memory cap of {} bytes",
                config.memory_limit_bytes
            ),
            PolicyFault::Trap(trap) => {
                format!("it trapped ({trap}; a panic or an uncaught exception?)")
            }
            PolicyFault::InvalidAnswer(answer) => answer.clone(),
            PolicyFault::Instantiate(why) => why.clone(),
        }
    }
}
