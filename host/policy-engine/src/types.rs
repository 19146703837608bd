//! The values that cross between the host and a policy: what the gateway passes in, what a
//! policy answers, and the [`RouterHost`] questions a router may ask during a call.
//!
//! The records that go into a policy derive wasmtime's `ComponentType` + `Lower` with the WIT
//! field names, so a call copies them straight into the guest without an intermediate Rust
//! value; the answers derive `Lift` the same way.

use std::time::SystemTime;

use wasmtime::component::{ComponentType, Lift, Lower};

/// One request as policies see it (`ringmaster:policy/types.request`): its shape, routing key
/// and prefix hashes, never its text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyRequest {
    /// The gateway's request id (`req_…`), for log lines.
    pub id: String,
    /// The requested model.
    pub model: String,
    /// The caller's tier.
    pub tier: String,
    /// The session id, when the request carried one.
    pub session_id: Option<String>,
    /// The routing key: a hash of the session id, or of the system prompt and first user turn.
    pub routing_key: u64,
    /// Chained hashes of the prompt's fixed-size chunks (`h[i]` covers chunks `0..=i`).
    pub prefix_hashes: Vec<u64>,
    /// Estimated prompt tokens.
    pub prompt_tokens: u32,
    /// Requested `max_tokens`.
    pub max_tokens: u32,
    /// Priority assigned by admission (0 = lowest).
    pub priority: u8,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// Headers the operator chose to pass to policies (lower-case names).
    pub headers: Vec<(String, String)>,
    /// The door it came in by: `messages`, `chat_completions`, `completions` or `responses`
    /// (0.2.0's `request.door`; 0.1.0's record has no door).
    pub door: &'static str,
}

/// 0.1.0's request record, lent from a [`PolicyRequest`]: 0.1.0 copies the whole record into
/// the guest, and its record has no door.
#[derive(ComponentType, Lower)]
#[component(record)]
pub(crate) struct RequestV0_1<'a> {
    id: &'a str,
    model: &'a str,
    tier: &'a str,
    #[component(name = "session-id")]
    session_id: Option<&'a str>,
    #[component(name = "routing-key")]
    routing_key: u64,
    #[component(name = "prefix-hashes")]
    prefix_hashes: &'a [u64],
    #[component(name = "prompt-tokens")]
    prompt_tokens: u32,
    #[component(name = "max-tokens")]
    max_tokens: u32,
    priority: u8,
    stream: bool,
    headers: &'a [(String, String)],
}

impl<'a> From<&'a PolicyRequest> for RequestV0_1<'a> {
    fn from(request: &'a PolicyRequest) -> Self {
        Self {
            id: &request.id,
            model: &request.model,
            tier: &request.tier,
            session_id: request.session_id.as_deref(),
            routing_key: request.routing_key,
            prefix_hashes: &request.prefix_hashes,
            prompt_tokens: request.prompt_tokens,
            max_tokens: request.max_tokens,
            priority: request.priority,
            stream: request.stream,
            headers: &request.headers,
        }
    }
}

/// What a server does in a disaggregated fleet (0.3.0's `types.role`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum PolicyRole {
    /// Whole requests.
    #[default]
    Both,
    /// Prompts only, for a decode server.
    Prefill,
    /// Decoding from a prefill server's KV cache; whole requests too.
    Decode,
}

/// One GPU server's state as the gateway knows it (`ringmaster:policy/types.server`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerView {
    /// The server's id on the ring.
    pub id: String,
    /// What it does (0.3.0's `role`; older contracts see no prefill servers).
    pub role: PolicyRole,
    /// Whether it is serving (false while it drains or fails health checks).
    pub healthy: bool,
    /// Its ring weight.
    pub weight: u32,
    /// Requests routed to it that have not finished.
    pub in_flight: u32,
    /// Requests queued inside it.
    pub waiting: u32,
    /// KV-cache blocks in use.
    pub kv_blocks_used: u32,
    /// KV-cache blocks in all.
    pub kv_blocks_total: u32,
}

/// What the host answers to a router's (and an admission policy's) imports during one call.
///
/// The gateway implements it over its pool snapshot; the engine calls it synchronously, on the
/// calling thread, only while [`RouterPolicy::route`](crate::RouterPolicy::route) or
/// [`AdmissionPolicy::admit`](crate::AdmissionPolicy::admit) runs. An implementation may borrow
/// (it need not be `'static`): the engine never keeps it past the call.
pub trait RouterHost: Send + Sync {
    /// `ring.lookup`: the server owning `key`, the first virtual node clockwise.
    fn ring_lookup(&self, key: u64) -> Option<String>;
    /// `ring.candidates`: the first `n` distinct servers clockwise from `key`.
    fn ring_candidates(&self, key: u64, n: u32) -> Vec<String>;
    /// `ring.lookup-bounded`: the first server clockwise from `key` under its bounded-load cap.
    fn ring_lookup_bounded(&self, key: u64) -> Option<String>;
    /// `cluster.servers`: every server in the pool.
    fn servers(&self) -> Vec<ServerView>;
    /// `cluster.get`: one server by id.
    fn server(&self, id: &str) -> Option<ServerView>;
    /// `cluster.prefix-matches`: for the request being decided, how many of its leading prefix
    /// hashes each server is estimated to hold (servers with none left out).
    fn prefix_matches(&self) -> Vec<(String, u32)>;
    /// `cluster.prefill-backlog`: each server's estimated prompt tokens routed to it and not
    /// yet begun (servers with none left out).
    fn prefill_backlog(&self) -> Vec<(String, u64)> {
        Vec::new()
    }
    /// `cluster.adapters`: the LoRA adapters each server holds (servers with none left out).
    fn adapters(&self) -> Vec<(String, Vec<String>)> {
        Vec::new()
    }
    /// `cluster.prefill-servers` (0.3.0): the prefill servers.
    fn prefill_servers(&self) -> Vec<ServerView> {
        Vec::new()
    }
    /// For the request being decided, how many of its leading prefix hashes each prefill
    /// server is estimated to hold (0.3.0's `cluster.prefix-matches` adds them to
    /// [`prefix_matches`](Self::prefix_matches)).
    fn prefill_prefix_matches(&self) -> Vec<(String, u32)> {
        Vec::new()
    }
    /// Each prefill server's prefill backlog (0.3.0's `cluster.prefill-backlog` adds them to
    /// [`prefill_backlog`](Self::prefill_backlog)).
    fn prefill_servers_backlog(&self) -> Vec<(String, u64)> {
        Vec::new()
    }
    /// Whether a router may name `id` as a pair's prefill server: a healthy prefill server.
    fn prefill_routable(&self, _id: &str) -> bool {
        false
    }
    /// Whether a router may send a request to `id`: a server in the pool that is healthy.
    ///
    /// The engine checks every `route(id)` answer with it. The default asks
    /// [`server`](Self::server); override it when that can be answered without building a
    /// [`ServerView`].
    fn routable(&self, id: &str) -> bool {
        self.server(id).is_some_and(|s| s.healthy)
    }
}

/// A router's answer (`router.decision`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteDecision {
    /// Send the request to the server with this id (the host's pair rule decides whether a
    /// prefill server computes its prompt).
    Route(String),
    /// Refuse it with this reason (the client gets 529 overloaded).
    Reject(String),
    /// Split it between `prefill` and `decode`, or (no `prefill`) serve it whole on `decode`:
    /// the router decided (0.3.0's `decision.pair`).
    Pair {
        /// The server the client's tokens come from.
        decode: String,
        /// The prefill server, when the request is split.
        prefill: Option<String>,
        /// Why.
        reason: String,
    },
}

/// 0.1.0's and 0.2.0's `router.decision` as the guest returns it.
#[derive(ComponentType, Lift)]
#[component(variant)]
pub(crate) enum WitDecision {
    #[component(name = "route")]
    Route(String),
    #[component(name = "reject")]
    Reject(String),
}

impl From<WitDecision> for RouteDecision {
    fn from(d: WitDecision) -> Self {
        match d {
            WitDecision::Route(id) => Self::Route(id),
            WitDecision::Reject(reason) => Self::Reject(reason),
        }
    }
}

/// 0.3.0's `types.pair` as the guest returns it.
#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct WitPair {
    decode: String,
    prefill: Option<String>,
    reason: String,
}

/// 0.3.0's `router.decision` as the guest returns it.
#[derive(ComponentType, Lift)]
#[component(variant)]
pub(crate) enum WitDecisionV3 {
    #[component(name = "route")]
    Route(String),
    #[component(name = "reject")]
    Reject(String),
    #[component(name = "pair")]
    Pair(WitPair),
}

impl From<WitDecisionV3> for RouteDecision {
    fn from(d: WitDecisionV3) -> Self {
        match d {
            WitDecisionV3::Route(id) => Self::Route(id),
            WitDecisionV3::Reject(reason) => Self::Reject(reason),
            WitDecisionV3::Pair(pair) => Self::Pair {
                decode: pair.decode,
                prefill: pair.prefill,
                reason: pair.reason,
            },
        }
    }
}

/// The gateway's load when a request arrives (`admission.load`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ComponentType, Lower)]
#[component(record)]
pub struct AdmissionLoad {
    /// Requests running on GPU servers.
    #[component(name = "in-flight")]
    pub in_flight: u32,
    /// Requests waiting in the gateway's queue.
    pub queued: u32,
    /// The queue's capacity.
    #[component(name = "queue-capacity")]
    pub queue_capacity: u32,
    /// Healthy servers.
    pub servers: u32,
}

/// An admission policy's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdmissionVerdict {
    /// Run it now with this priority (0 = lowest).
    Accept(u8),
    /// Queue it until a server frees up.
    Queue,
    /// Refuse it (the client gets 429 with `retry-after`).
    Reject {
        /// Why, for the client.
        reason: String,
        /// When to retry, in milliseconds.
        retry_after_ms: u32,
    },
}

/// `admission.rejection` as the guest returns it.
#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct WitRejection {
    reason: String,
    #[component(name = "retry-after-ms")]
    retry_after_ms: u32,
}

/// `admission.verdict` as the guest returns it.
#[derive(ComponentType, Lift)]
#[component(variant)]
pub(crate) enum WitVerdict {
    #[component(name = "accept")]
    Accept(u8),
    #[component(name = "queue")]
    Queue,
    #[component(name = "reject")]
    Reject(WitRejection),
}

impl From<WitVerdict> for AdmissionVerdict {
    fn from(v: WitVerdict) -> Self {
        match v {
            WitVerdict::Accept(p) => Self::Accept(p),
            WitVerdict::Queue => Self::Queue,
            WitVerdict::Reject(r) => Self::Reject {
                reason: r.reason,
                retry_after_ms: r.retry_after_ms,
            },
        }
    }
}

/// A safety filter's answer (`safety-filter.verdict`).
#[derive(Debug, Clone, PartialEq, Eq, ComponentType, Lift)]
#[component(variant)]
pub enum SafetyVerdict {
    /// Let it through.
    #[component(name = "allow")]
    Allow,
    /// Stop it, with a reason the client sees.
    #[component(name = "block")]
    Block(String),
}

/// `log.level`, in either version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

/// What happened to a request a learning router decided (`types.outcome`, 0.2.0), handed to
/// its `observe` export once the request ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, ComponentType, Lower)]
#[component(record)]
pub struct Outcome {
    /// The request's id.
    #[component(name = "request-id")]
    pub request_id: String,
    /// Its routing key.
    #[component(name = "routing-key")]
    pub routing_key: u64,
    /// The server that served it.
    pub server: String,
    /// Whether the router's own choice served it (false after a retry or a spill).
    #[component(name = "as-decided")]
    pub as_decided: bool,
    /// Time to the first token in microseconds; `None` when it failed before one.
    #[component(name = "ttft-us")]
    pub ttft_us: Option<u64>,
    /// Prompt tokens, as the server counted them.
    #[component(name = "prompt-tokens")]
    pub prompt_tokens: u32,
    /// Of those, the tokens its prefix cache held.
    #[component(name = "cached-tokens")]
    pub cached_tokens: u32,
    /// Tokens generated.
    #[component(name = "output-tokens")]
    pub output_tokens: u32,
    /// Why it failed, when it did.
    pub error: Option<String>,
}

/// What was loaded: shown by the admin API and used to make an unchanged reload a no-op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyInfo {
    /// The name it was loaded under (the tag on its log lines and counters).
    pub name: String,
    /// Hex xxh3-128 of the component's bytes.
    pub hash: String,
    /// When it was loaded.
    pub loaded_at: SystemTime,
    /// The component's size in bytes.
    pub size: usize,
}
