//! One pool server as the gateway sees it: its backend (an engine in this process or a remote
//! server), the requests in flight there and the prefixes they carry, and how it is started.
//! It decides nothing about routing.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ringmaster_gpu_runtime::{EngineConfig, EngineError, EngineHandle};
use ringmaster_ring::RingError;

use ringmaster_config::LocalCacheView;
use ringmaster_config::servers::{GpuPlacement, ServerAddress, ServerSpec};

/// A pool change that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// A server with this id is already in the pool (or still draining).
    #[error("a server with id {0:?} already exists")]
    Duplicate(String),
    /// No active server has this id.
    #[error("no server with id {0:?}")]
    Unknown(String),
    /// The ring rejected the member set.
    #[error("ring: {0}")]
    Ring(#[from] RingError),
    /// The server's engine could not start.
    #[error("cannot start server {id:?}: {source}")]
    Engine {
        /// The server.
        id: String,
        /// Why.
        source: EngineError,
    },
    /// The server's model could not be loaded.
    #[error("cannot start server {id:?}: {source}")]
    Model {
        /// The server.
        id: String,
        /// Why.
        source: ringmaster_gpu_runtime::model::ModelError,
    },
    /// An `https://` server's TLS files could not be used.
    #[error("cannot start server {id:?}: {source}")]
    Tls {
        /// The server.
        id: String,
        /// Why.
        source: ringmaster_tls::TlsError,
    },
}

/// How new servers are made: the simulated servers' engine template, and how model servers
/// run their model.
#[derive(Clone, Debug)]
pub struct ServerTemplates {
    /// Simulated servers (and the engine settings model servers start from).
    pub simulator: EngineConfig,
    /// Model (`gguf:`) servers.
    pub model: ringmaster_gpu_runtime::model::ModelOptions,
    /// The GPU model servers run on; `None` for the CPU.
    pub model_gpu: Option<GpuPlacement>,
    /// How remote servers' clients behave.
    pub upstream: crate::remote::UpstreamSettings,
    /// The model names and aliases the pools per model are built from.
    pub models: ModelCatalogueSpec,
    /// How routing learns what the engines in this process hold.
    pub local_cache_view: ringmaster_config::LocalCacheView,
}

/// The config's part of the [`crate::snapshot::ModelCatalogue`].
#[derive(Clone, Debug, Default)]
pub struct ModelCatalogueSpec {
    /// The config's top-level `models`.
    pub defaults: Vec<String>,
    /// `[aliases]`.
    pub aliases: BTreeMap<String, String>,
    /// LoRA adapters the gateway may load (`[lora] load_on_demand`), each with its base model.
    pub loadable: BTreeMap<String, String>,
}

impl From<EngineConfig> for ServerTemplates {
    fn from(simulator: EngineConfig) -> Self {
        Self {
            simulator,
            model: Default::default(),
            model_gpu: None,
            upstream: Default::default(),
            models: Default::default(),
            local_cache_view: Default::default(),
        }
    }
}

/// Sequences a CPU model server runs at once.
pub const MODEL_MAX_RUNNING: u32 = 16;
/// Tokens a CPU model server computes per step.
pub const MODEL_STEP_TOKEN_BUDGET: u32 = 512;

/// One GPU server as the gateway sees it.
#[derive(Debug)]
pub struct Server {
    pub(crate) id: String,
    /// Stable small number for the prefix index while the server lives.
    pub(crate) slot: usize,
    pub(crate) address: ServerAddress,
    pub(crate) weight: u32,
    pub(crate) engine: Backend,
    pub(crate) in_flight: AtomicU64,
    pub(crate) peak_in_flight: AtomicU64,
    pub(crate) requests_total: AtomicU64,
    pub(crate) draining: AtomicBool,
    /// The pool's wake-up for requests waiting in the admission queue.
    pub(crate) released: Arc<tokio::sync::Notify>,
    /// How long loading its model took (model servers only).
    pub(crate) model_load: Option<std::time::Duration>,
    /// A local engine's tokenizer (a remote worker's is fetched; see [`Backend::cache_scheme`]).
    pub(crate) local_scheme: Option<crate::kv_view::Scheme>,
    /// Where routing reads a local engine's cache from (`[simulator] cache_view`).
    pub(crate) local_view: LocalView,
    /// Prefix hashes of the requests in flight here, counted: what the server will hold once
    /// it has prefilled them, before its cache reports them.
    pub(crate) pending: Mutex<HashMap<u64, u32>>,
    /// Estimated prompt tokens of the requests routed here that it has not begun to answer,
    /// less what its cache was estimated to hold (see [`InFlight::charge_prefill`]).
    pub(crate) prefill_backlog: AtomicU64,
    /// Requests other gateway replicas have in flight here, as they last reported
    /// ([`Self::set_remote_load`]; zero without a cluster).
    pub(crate) remote_in_flight: AtomicU64,
    /// Prefill tokens other replicas have queued here, as they last reported.
    pub(crate) remote_prefill: AtomicU64,
    /// The models the config says it serves.
    pub(crate) configured_models: Option<Vec<String>>,
    /// The API it speaks and how (a remote server's; this process's engines speak none).
    pub(crate) protocol: ringmaster_config::ServerProtocol,
    /// Its TLS files and credentials (values redacted in any `Debug`).
    access: ringmaster_config::ServerAccess,
    /// The spill-over pool it belongs to (`None`: routed by model).
    spill_pool: Option<String>,
    /// Its part in a disaggregated fleet.
    pub(crate) role: ringmaster_config::ServerRole,
}

impl Server {
    /// Ring id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Its part in a disaggregated fleet: whole requests, prefill legs or decode legs.
    pub fn role(&self) -> ringmaster_config::ServerRole {
        self.role
    }

    /// The API it speaks, whether it reasons, whether it wants volatile lines back.
    pub fn protocol(&self) -> ringmaster_config::ServerProtocol {
        self.protocol
    }

    /// The spill-over pool (`[[fallback]]`) it belongs to; `None` for the fleet's own servers.
    pub fn spill_pool(&self) -> Option<&str> {
        self.spill_pool.as_deref()
    }

    /// Its TLS files and credentials; only [`ringmaster_config::Secret::expose`] shows a value.
    pub fn access(&self) -> &ringmaster_config::ServerAccess {
        &self.access
    }

    /// The wire format its requests and replies take.
    pub fn api(&self) -> ringmaster_wire::Api {
        match self.protocol.api {
            ringmaster_config::ServerApi::Chat => ringmaster_wire::Api::Chat,
            ringmaster_config::ServerApi::Messages => ringmaster_wire::Api::Messages,
            ringmaster_config::ServerApi::Responses => ringmaster_wire::Api::Responses,
        }
    }

    /// The kind of server a request is encoded for: its API and what it takes (a
    /// `ringmaster worker` is known by its `/load`).
    pub fn target(&self) -> crate::remote::Target {
        use crate::remote::LoadSource;
        use crate::remote::engine_metrics::EngineKind;
        let source = self.load_source();
        crate::remote::Target {
            api: self.api(),
            reasoning: self.protocol.reasoning,
            ringmaster: source == Some(LoadSource::Worker),
            vllm: matches!(
                source,
                Some(LoadSource::Worker | LoadSource::Metrics(EngineKind::Vllm))
            ),
        }
    }
    /// Address.
    pub fn address(&self) -> &ServerAddress {
        &self.address
    }
    /// Ring weight.
    pub fn weight(&self) -> u32 {
        self.weight
    }
    /// Slot in the prefix index.
    pub fn slot(&self) -> usize {
        self.slot
    }
    /// The engine that runs requests.
    pub fn engine(&self) -> &Backend {
        &self.engine
    }
    /// Requests the gateway has routed here that have not finished.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Acquire)
    }
    /// Estimated prompt tokens routed here that it has not begun to answer, after the cache
    /// credit each was given when it was routed: the prefill work queued ahead of the next
    /// request, which the request count cannot tell from a queue of short prompts.
    pub fn prefill_backlog(&self) -> u64 {
        self.prefill_backlog.load(Ordering::Acquire)
    }
    /// Requests in flight here from every gateway replica: this one's, exact, plus the others'
    /// last reports. What the bounded-load cap and the policies' views count.
    pub fn fleet_in_flight(&self) -> u64 {
        self.in_flight() + self.remote_in_flight.load(Ordering::Relaxed)
    }
    /// Prefill tokens queued here by every replica (this one's plus the others' reports).
    pub fn fleet_prefill_backlog(&self) -> u64 {
        self.prefill_backlog() + self.remote_prefill.load(Ordering::Relaxed)
    }
    /// The other replicas' load here, as last reported: (in flight, prefill tokens).
    pub fn remote_load(&self) -> (u64, u64) {
        (
            self.remote_in_flight.load(Ordering::Relaxed),
            self.remote_prefill.load(Ordering::Relaxed),
        )
    }
    /// Records the other replicas' load here (the cluster's load fan-out).
    pub fn set_remote_load(&self, in_flight: u64, prefill: u64) {
        self.remote_in_flight.store(in_flight, Ordering::Relaxed);
        self.remote_prefill.store(prefill, Ordering::Relaxed);
    }
    /// Highest `in_flight` seen at any assignment.
    pub fn peak_in_flight(&self) -> u64 {
        self.peak_in_flight.load(Ordering::Relaxed)
    }
    /// Requests routed here since it joined.
    pub fn requests_total(&self) -> u64 {
        self.requests_total.load(Ordering::Relaxed)
    }
    /// Whether it was removed and is finishing its last requests.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
    /// Whether it runs in this process (a simulated server or a model on this machine).
    pub fn is_local(&self) -> bool {
        matches!(self.engine, Backend::Local(_))
    }
    /// The models it serves: the config's list, else what a remote server reports; `None`
    /// while unknown (a remote server that has not answered yet takes any model the gateway
    /// accepts; an engine in this process takes the config's top-level `models`).
    pub fn served_models(&self) -> Option<Vec<String>> {
        if let Some(models) = &self.configured_models {
            return Some(models.clone());
        }
        match &self.engine {
            Backend::Remote(worker) => worker.models(),
            Backend::Local(_) => None,
        }
    }
    /// The LoRA adapters the server lists at `/v1/models`, each with its base model (none for
    /// an engine in this process).
    pub fn adapters(&self) -> BTreeMap<String, String> {
        match &self.engine {
            Backend::Remote(worker) => worker.adapters(),
            Backend::Local(_) => BTreeMap::new(),
        }
    }
    /// Adapters loaded and unloaded here at the gateway's request (`None` for an engine in
    /// this process).
    pub fn adapter_counts(&self) -> Option<crate::remote::adapters::AdapterCounts> {
        match &self.engine {
            Backend::Remote(worker) => Some(worker.adapter_counts()),
            Backend::Local(_) => None,
        }
    }
    /// Whether the server lists `model` as a LoRA adapter.
    pub fn has_adapter(&self, model: &str) -> bool {
        match &self.engine {
            Backend::Remote(worker) => worker.has_adapter(model),
            Backend::Local(_) => false,
        }
    }
    /// Times a remote server was ejected after consecutive failures (0 for a local engine).
    pub fn ejections_total(&self) -> u64 {
        match &self.engine {
            Backend::Remote(worker) => worker.health().ejections_total(),
            Backend::Local(_) => 0,
        }
    }
    /// Whether new requests may go there: not draining, reachable and not ejected.
    pub fn is_routable(&self) -> bool {
        !self.is_draining() && self.engine.is_reachable()
    }
    /// How long loading its model took (model servers only).
    pub fn model_load(&self) -> Option<std::time::Duration> {
        self.model_load
    }
    /// The tokenizer under which the server's cache is reported; `None` while unknown.
    pub fn cache_scheme(&self) -> Option<crate::kv_view::Scheme> {
        match &self.engine {
            Backend::Local(_) => self.local_scheme.clone(),
            Backend::Remote(worker) => worker.kv().scheme(),
        }
    }
    /// How many of `hashes` (a prompt's block hashes under [`Self::cache_scheme`]) lead in
    /// the server's own report of its cache; `None` while it has none.
    pub fn held_blocks(
        &self,
        hashes: &[ringmaster_gpu_runtime::block::BlockHash],
    ) -> Option<usize> {
        match (&self.engine, &self.local_view) {
            (Backend::Local(engine), LocalView::Engine) => {
                Some(engine.cached_prefix_blocks(hashes))
            }
            (Backend::Local(_), LocalView::VllmEvents(cache)) => cache.held_blocks(hashes),
            (Backend::Local(_), LocalView::RoutingHistory) => None,
            (Backend::Remote(worker), _) => worker.kv().held_blocks(hashes),
        }
    }
    /// How many of `hashes` (a request's prefix hashes) lead the prompt of some request in
    /// flight here.
    pub fn pending_prefix(&self, hashes: &[u64]) -> u32 {
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let n = hashes
            .iter()
            .take_while(|h| pending.contains_key(h))
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }
    /// A worker's event stream: events applied and snapshots taken (reconnections); zeros for
    /// an engine in this process, whose cache is read directly.
    pub fn reported_cache_events(&self) -> (u64, u64) {
        match (&self.engine, &self.local_view) {
            (Backend::Local(_), LocalView::VllmEvents(cache)) => {
                (cache.events_total(), cache.resyncs_total())
            }
            (Backend::Local(_), _) => (0, 0),
            (Backend::Remote(worker), _) => {
                (worker.kv().events_total(), worker.kv().resyncs_total())
            }
        }
    }
    /// Where a remote server's load figures come from (`None` for an engine in this process).
    pub fn load_source(&self) -> Option<crate::remote::LoadSource> {
        match &self.engine {
            Backend::Remote(worker) => Some(worker.load_source()),
            Backend::Local(_) => None,
        }
    }
    /// Which view of the server's cache routing reads now.
    pub fn cache_view(&self) -> CacheView {
        match &self.engine {
            Backend::Local(_) => match self.local_view {
                LocalView::Engine => CacheView::InProcess,
                LocalView::VllmEvents(_) => CacheView::EngineEvents,
                LocalView::RoutingHistory => CacheView::RoutingHistory,
            },
            Backend::Remote(worker) => {
                let live = worker.kv().is_synced() && worker.kv().scheme().is_some();
                match (worker.engine_feed(), live) {
                    (Some(_), true) => CacheView::EngineEvents,
                    (None, true) => CacheView::WorkerEvents,
                    (_, false) => CacheView::RoutingHistory,
                }
            }
        }
    }
    /// The engine's KV event feed's counters, for a server that has one configured.
    pub fn engine_feed(&self) -> Option<crate::remote::engine_events::EngineFeedReport> {
        match &self.engine {
            Backend::Remote(worker) => worker.engine_feed().map(|f| f.report()),
            Backend::Local(_) => None,
        }
    }
    /// The engine's KV event feed's configuration, for a server that has one.
    pub fn engine_feed_spec(
        &self,
    ) -> Option<(
        ringmaster_config::KvEventsSpec,
        Option<ringmaster_config::TokenizerSource>,
    )> {
        match &self.engine {
            Backend::Remote(worker) => worker
                .engine_feed()
                .map(|f| (f.spec.clone(), f.tokenizer.clone())),
            Backend::Local(_) => None,
        }
    }
    /// Blocks in the server's reported cache, and whether the report is live.
    pub fn reported_cache(&self) -> (usize, bool) {
        match (&self.engine, &self.local_view) {
            (Backend::Local(_), LocalView::VllmEvents(cache)) => (cache.len(), cache.is_synced()),
            (Backend::Local(engine), _) => (engine.cached_block_count(), true),
            (Backend::Remote(worker), _) => (worker.kv().len(), worker.kv().is_synced()),
        }
    }
}

/// Where routing reads an engine in this process from.
#[derive(Debug)]
pub(crate) enum LocalView {
    /// The engine's own cache (or a remote server: unused).
    Engine,
    /// The index built from the engine's events written as vLLM's ([`crate::local_events`]).
    VllmEvents(Arc<crate::kv_view::ReportedCache>),
    /// Nothing: the routing-history estimate.
    RoutingHistory,
}

/// Where routing learns what a server's KV cache holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheView {
    /// An engine in this process: read directly.
    InProcess,
    /// A `ringmaster worker`'s `/kv/events`.
    WorkerEvents,
    /// A vLLM or SGLang engine's KV events, matched through the configured tokenizer.
    EngineEvents,
    /// Neither (no events, no tokenizer, or the stream is down): the gateway's estimate from
    /// where it sent each prefix.
    RoutingHistory,
}

/// Holds one request's slot on a server; dropping it releases the slot.
#[derive(Debug)]
pub struct InFlight {
    pub(crate) server: Arc<Server>,
    /// The request's prefix hashes, counted in the server's `pending` until the drop.
    pub(crate) hashes: Vec<u64>,
    /// Its share of the server's `prefill_backlog` until the server begins to answer.
    pub(crate) prefill: u64,
}

impl InFlight {
    /// The server the request runs on.
    pub fn server(&self) -> &Arc<Server> {
        &self.server
    }

    /// Counts `tokens` (the request's prompt tokens the server is expected to compute) in
    /// the server's [`Server::prefill_backlog`] until [`Self::prefilled`] or the drop.
    pub fn charge_prefill(&mut self, tokens: u64) {
        self.server
            .prefill_backlog
            .fetch_add(tokens, Ordering::AcqRel);
        self.prefill += tokens;
    }

    /// The server began to answer: the request's prompt leaves its backlog (once).
    pub fn prefilled(&mut self) {
        let tokens = std::mem::take(&mut self.prefill);
        if tokens > 0 {
            self.server
                .prefill_backlog
                .fetch_sub(tokens, Ordering::AcqRel);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.prefilled();
        if !self.hashes.is_empty() {
            let mut pending = self
                .server
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            for hash in &self.hashes {
                if let Some(count) = pending.get_mut(hash) {
                    *count -= 1;
                    if *count == 0 {
                        pending.remove(hash);
                    }
                }
            }
        }
        self.server.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.server.released.notify_waiters();
    }
}

/// What serves a pool server's requests: an engine in this process, or a remote worker.
#[derive(Debug, Clone)]
pub enum Backend {
    /// An engine in this process (simulated or a model).
    Local(EngineHandle),
    /// A `ringmaster worker` over HTTP.
    Remote(Arc<crate::remote::RemoteWorker>),
}

/// Why a request could not be started on a server.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The local engine refused it.
    #[error(transparent)]
    Engine(#[from] ringmaster_gpu_runtime::EngineError),
    /// The remote worker refused it or could not be reached.
    #[error(transparent)]
    Remote(#[from] crate::remote::RemoteError),
}

impl Backend {
    /// The server's load (a remote worker's as of its last poll).
    pub fn load(&self) -> ringmaster_gpu_runtime::LoadReport {
        match self {
            Self::Local(engine) => engine.load(),
            Self::Remote(worker) => worker.load(),
        }
    }

    /// Whether requests can reach it (a remote worker's last load poll succeeded).
    pub fn is_reachable(&self) -> bool {
        match self {
            Self::Local(_) => true,
            Self::Remote(worker) => worker.is_reachable(),
        }
    }
}

pub(crate) fn start_server(
    spec: &ServerSpec,
    slot: usize,
    templates: &ServerTemplates,
    released: &Arc<tokio::sync::Notify>,
    models_epoch: &Arc<AtomicU64>,
) -> Result<Arc<Server>, PoolError> {
    let mut model_load = None;
    let engine = match &spec.address {
        ServerAddress::Simulated {
            name,
            slowdown_percent,
        } => {
            let mut config = templates.simulator.clone();
            config.name = name.clone();
            // Modelled time runs `slowdown` times slower on this one server.
            config.time_scale *= f64::from(*slowdown_percent) / 100.0;
            Backend::Local(
                EngineHandle::spawn(config).map_err(|source| PoolError::Engine {
                    id: spec.id.clone(),
                    source,
                })?,
            )
        }
        ServerAddress::Model { path, name } => {
            let mut config = templates.simulator.clone();
            config.name = name.clone();
            config.kv_blocks = templates.model.kv_blocks;
            config.max_running = MODEL_MAX_RUNNING;
            config.step_token_budget = MODEL_STEP_TOKEN_BUDGET;
            // Step durations are measured, not modelled: the clock must not add to them.
            config.time_scale = 1.0;
            let started = std::time::Instant::now();
            let engine = match templates.model_gpu {
                Some(gpu) => start_gpu_model(spec, path, gpu, config)?,
                None => {
                    let executor =
                        ringmaster_gpu_runtime::model::ModelExecutor::load(path, &templates.model)
                            .map_err(|source| PoolError::Model {
                                id: spec.id.clone(),
                                source,
                            })?;
                    tracing::info!(
                        server = %spec.id,
                        model = %path.display(),
                        load_ms = started.elapsed().as_millis() as u64,
                        kv_blocks = config.kv_blocks,
                        threads = templates.model.threads,
                        kernels = executor.cpu().isa().name(),
                        "pool.model_loaded"
                    );
                    EngineHandle::spawn_with_executor(config, executor).map_err(|source| {
                        PoolError::Engine {
                            id: spec.id.clone(),
                            source,
                        }
                    })?
                }
            };
            model_load = Some(started.elapsed());
            Backend::Local(engine)
        }
        ServerAddress::Remote { url, .. } => {
            tracing::info!(server = %spec.id, worker = %url, "pool.remote_worker");
            Backend::Remote(
                crate::remote::RemoteWorker::start_in_pool(
                    url,
                    templates.upstream.clone(),
                    &crate::remote::RemoteAccess::of(spec),
                    // A server whose models the config names needs no discovery.
                    spec.models.is_none().then(|| models_epoch.clone()),
                    spec.kv_events
                        .clone()
                        .map(|feed| (feed, spec.tokenizer.clone())),
                )
                .map_err(|source| PoolError::Tls {
                    id: spec.id.clone(),
                    source,
                })?,
            )
        }
    };
    let local_scheme = match &engine {
        Backend::Local(engine) => Some(crate::kv_view::Scheme::of(engine.tokenizer().clone())),
        Backend::Remote(_) => None,
    };
    let local_view = match (&engine, templates.local_cache_view) {
        (Backend::Remote(_), _) | (_, LocalCacheView::InProcess) => LocalView::Engine,
        (Backend::Local(engine), LocalCacheView::VllmEvents) => {
            LocalView::VllmEvents(crate::local_events::follow(&spec.id, engine))
        }
        (Backend::Local(_), LocalCacheView::RoutingHistory) => LocalView::RoutingHistory,
    };
    Ok(Arc::new(Server {
        id: spec.id.clone(),
        slot,
        address: spec.address.clone(),
        weight: spec.weight,
        engine,
        in_flight: AtomicU64::new(0),
        peak_in_flight: AtomicU64::new(0),
        requests_total: AtomicU64::new(0),
        draining: AtomicBool::new(false),
        released: released.clone(),
        model_load,
        local_scheme,
        local_view,
        pending: Mutex::new(HashMap::new()),
        prefill_backlog: AtomicU64::new(0),
        remote_in_flight: AtomicU64::new(0),
        remote_prefill: AtomicU64::new(0),
        configured_models: spec.models.clone(),
        protocol: spec.protocol,
        access: spec.access.clone(),
        spill_pool: spec.pool.clone(),
        role: spec.role,
    }))
}

/// A model server's engine on a GPU: the pool is the executor's, so the engine's `kv_blocks`
/// is taken from it.
#[cfg(feature = "cuda")]
fn start_gpu_model(
    spec: &ServerSpec,
    path: &std::path::Path,
    gpu: GpuPlacement,
    mut config: EngineConfig,
) -> Result<EngineHandle, PoolError> {
    let started = std::time::Instant::now();
    let executor =
        ringmaster_gpu_runtime::model::GpuExecutor::load(path, gpu.ordinal, gpu.kv_blocks)
            .map_err(|source| PoolError::Model {
                id: spec.id.clone(),
                source,
            })?;
    config = config.sized_for_gpu();
    config.kv_blocks = executor.kv_blocks();
    tracing::info!(
        server = %spec.id,
        model = %path.display(),
        gpu = %executor.device_name(),
        load_ms = started.elapsed().as_millis() as u64,
        kv_blocks = config.kv_blocks,
        "pool.model_loaded"
    );
    EngineHandle::spawn_with_executor(config, executor).map_err(|source| PoolError::Engine {
        id: spec.id.clone(),
        source,
    })
}

/// Without the `cuda` feature the config refuses a GPU placement, so this is never reached.
#[cfg(not(feature = "cuda"))]
fn start_gpu_model(
    spec: &ServerSpec,
    path: &std::path::Path,
    gpu: GpuPlacement,
    _config: EngineConfig,
) -> Result<EngineHandle, PoolError> {
    Err(PoolError::Model {
        id: spec.id.clone(),
        source: ringmaster_gpu_runtime::model::ModelError::Unsupported {
            path: path.display().to_string(),
            why: format!(
                "GPU {} needs a build with CUDA support (--features cuda)",
                gpu.ordinal
            ),
        },
    })
}
