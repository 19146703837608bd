//! The pool at one instant: the servers, the ring over them and one pool per served model,
//! built together and published as one immutable value, so that no reader sees a ring that
//! disagrees with the server list or a model's pool that disagrees with either.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ringmaster_ring::{Member, Ring, RingConfig, RingError};

use crate::server::Server;

/// The pool at one instant: a ring and the servers its member indices name.
#[derive(Debug)]
pub struct PoolSnapshot {
    /// The ring over `servers` (member `i` is `servers[i]`).
    pub ring: Ring,
    /// Active servers. In a model's pool, those that take whole requests and decode legs
    /// (every server but the prefill servers), the ring's members.
    pub servers: Vec<Arc<Server>>,
    /// In a model's pool, its prefill servers (`role = "prefill"`): off the ring, chosen for
    /// a request's prefill leg only. Empty in the whole pool, whose `servers` list them.
    pub prefill: Vec<Arc<Server>>,
    /// Removed servers still finishing requests.
    pub draining: Vec<Arc<Server>>,
    /// Increases by one with every published change.
    pub version: u64,
    /// One pool per served model: its servers and a ring over them (empty inside those).
    pub models: BTreeMap<String, Arc<PoolSnapshot>>,
    /// Public names and the served names they stand for.
    pub aliases: Arc<BTreeMap<String, String>>,
    /// Every name a request may ask for (names some server takes, and the aliases of those),
    /// sorted.
    pub accepted: Vec<String>,
    /// The LoRA adapters some server lists, each with its base model.
    pub adapters: BTreeMap<String, String>,
    /// The spill-over pools (`[[servers]] pool`): their servers and a ring over them. Their
    /// servers are in no model's pool. Empty inside a model's pool.
    pub spill_pools: BTreeMap<String, Arc<PoolSnapshot>>,
    /// The servers' model sets this was built from (see [`Pool::snapshot`]).
    pub(crate) models_epoch: u64,
}

impl PoolSnapshot {
    /// Finds an active server by id.
    pub fn server(&self, id: &str) -> Option<&Arc<Server>> {
        self.servers.iter().find(|s| s.id == id)
    }

    /// The pool of the model a request names (through an alias, if it is one), with the
    /// served name; `None` for a model nobody serves.
    pub fn model(&self, name: &str) -> Option<(&str, &Arc<PoolSnapshot>)> {
        let served = self.aliases.get(name).map_or(name, String::as_str);
        self.models
            .get_key_value(served)
            .map(|(name, pool)| (name.as_str(), pool))
    }
}

/// Builds the snapshot of `servers`: the full ring and one pool per served model.
pub(crate) fn build_snapshot(
    servers: Vec<Arc<Server>>,
    draining: Vec<Arc<Server>>,
    version: u64,
    ring_config: &RingConfig,
    catalogue: &ModelCatalogue,
) -> Result<PoolSnapshot, RingError> {
    let models_epoch = catalogue.epoch.load(Ordering::Acquire);
    // A spill-over pool's servers take only what spills to it: in no model's pool.
    let (spill_members, own): (Vec<Arc<Server>>, Vec<Arc<Server>>) = servers
        .iter()
        .cloned()
        .partition(|s| s.spill_pool().is_some());
    let mut spill_pools: BTreeMap<String, Vec<Arc<Server>>> = BTreeMap::new();
    for server in spill_members {
        if let Some(pool) = server.spill_pool() {
            spill_pools
                .entry(pool.to_owned())
                .or_default()
                .push(server.clone());
        }
    }
    let spill_pools = spill_pools
        .into_iter()
        .map(|(name, members)| {
            let pool = inner_pool(
                members,
                Vec::new(),
                (version, models_epoch),
                ring_config,
                catalogue,
            )?;
            Ok((name, Arc::new(pool)))
        })
        .collect::<Result<BTreeMap<_, _>, RingError>>()?;
    // An engine in this process with no models of its own serves the defaults, never
    // whatever is asked: a real server added for another model must get that model's
    // requests, not share them with the simulated servers.
    let served: Vec<Option<Vec<String>>> = own
        .iter()
        .map(|s| {
            s.served_models()
                .or_else(|| s.is_local().then(|| catalogue.defaults.clone()))
        })
        .collect();
    let mut adapters: BTreeMap<String, String> = own.iter().flat_map(|s| s.adapters()).collect();
    let mut names: BTreeSet<String> = catalogue.defaults.iter().cloned().collect();
    names.extend(served.iter().flatten().flatten().cloned());
    names.extend(catalogue.aliases.values().cloned());
    let mut models = BTreeMap::new();
    for name in &names {
        let (members, prefill): (Vec<Arc<Server>>, Vec<Arc<Server>>) = own
            .iter()
            .zip(&served)
            .filter(|(_, models)| models.as_ref().is_none_or(|m| m.contains(name)))
            .map(|(s, _)| s.clone())
            .partition(|s| s.role().decodes());
        let pool = inner_pool(
            members,
            prefill,
            (version, models_epoch),
            ring_config,
            catalogue,
        )?;
        models.insert(name.clone(), Arc::new(pool));
    }
    // A name is accepted when a server can take it (it serves the model, or serves whatever
    // it is asked); with no server at all the fleet is down, not the model unserved. A name
    // no server takes (the default model in front of remote servers that list others) is
    // neither listed nor accepted: asking for it is a 404, not a 503 for ever.
    let servable = |name: &str| own.is_empty() || !models[name].servers.is_empty();
    let mut accepted: Vec<String> = names.iter().filter(|n| servable(n)).cloned().collect();
    accepted.extend(
        catalogue
            .aliases
            .iter()
            .filter(|(_, target)| servable(target))
            .map(|(alias, _)| alias.clone()),
    );
    // An adapter the gateway may load is asked for by its name wherever its base is served.
    for (adapter, base) in &catalogue.loadable {
        if models.get(base).is_some_and(|_| servable(base)) {
            accepted.push(adapter.clone());
            adapters.insert(adapter.clone(), base.clone());
        }
    }
    accepted.sort();
    accepted.dedup();
    Ok(PoolSnapshot {
        ring: build_ring(&servers, ring_config)?,
        servers,
        prefill: Vec::new(),
        draining,
        version,
        models,
        aliases: catalogue.aliases.clone(),
        accepted,
        adapters,
        spill_pools,
        models_epoch,
    })
}

/// A pool inside the snapshot (a model's, or a spill-over pool): `members` on a ring of their
/// own, with the prefill servers beside it.
fn inner_pool(
    members: Vec<Arc<Server>>,
    prefill: Vec<Arc<Server>>,
    (version, models_epoch): (u64, u64),
    ring_config: &RingConfig,
    catalogue: &ModelCatalogue,
) -> Result<PoolSnapshot, RingError> {
    Ok(PoolSnapshot {
        ring: build_ring(&members, ring_config)?,
        servers: members,
        prefill,
        draining: Vec::new(),
        version,
        models: BTreeMap::new(),
        aliases: catalogue.aliases.clone(),
        accepted: Vec::new(),
        adapters: BTreeMap::new(),
        spill_pools: BTreeMap::new(),
        models_epoch,
    })
}

/// What the pools per model are built from.
#[derive(Debug, Default)]
pub struct ModelCatalogue {
    /// The names a server of unknown models takes (the config's top-level `models`).
    pub defaults: Vec<String>,
    /// Public names and the served names they stand for.
    pub aliases: Arc<BTreeMap<String, String>>,
    /// LoRA adapters the gateway may load on a server of their base model, with that base.
    pub loadable: BTreeMap<String, String>,
    /// Bumped whenever a server's reported model set changes; the next snapshot read rebuilds.
    pub epoch: Arc<AtomicU64>,
}

pub(crate) fn build_ring(servers: &[Arc<Server>], config: &RingConfig) -> Result<Ring, RingError> {
    Ring::new(
        servers
            .iter()
            .map(|s| Member {
                id: s.id.clone(),
                weight: s.weight,
            })
            .collect(),
        config.clone(),
    )
}
