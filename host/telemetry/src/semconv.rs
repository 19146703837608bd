//! The attribute names on the gateway's spans: OpenTelemetry's GenAI semantic conventions
//! (`gen_ai.*`, as of semconv 1.37), its HTTP and server conventions, and `ringmaster.*` for
//! what only a router has (the policy that decided and what it saw).

/// `chat` (both doors; the Messages API is a chat too).
pub const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
/// `anthropic` or `openai`: the API the client spoke.
pub const GEN_AI_PROVIDER_NAME: &str = "gen_ai.provider.name";
/// The model the client asked for.
pub const GEN_AI_REQUEST_MODEL: &str = "gen_ai.request.model";
/// The client's `max_tokens`.
pub const GEN_AI_REQUEST_MAX_TOKENS: &str = "gen_ai.request.max_tokens";
/// The client's `temperature`.
pub const GEN_AI_REQUEST_TEMPERATURE: &str = "gen_ai.request.temperature";
/// The model the servers served it as.
pub const GEN_AI_RESPONSE_MODEL: &str = "gen_ai.response.model";
/// Why the generation stopped, as a list.
pub const GEN_AI_RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
/// The request id the client sees in `request-id`.
pub const GEN_AI_RESPONSE_ID: &str = "gen_ai.response.id";
/// Prompt tokens as the server counted them.
pub const GEN_AI_USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
/// Generated tokens.
pub const GEN_AI_USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
/// Whether the client asked for a stream.
pub const REQUEST_STREAM: &str = "ringmaster.request.stream";
/// Seconds to the first token (the span event `gen_ai.first_token` marks the moment).
pub const GEN_AI_TIME_TO_FIRST_TOKEN: &str = "gen_ai.server.time_to_first_token";
/// The event at the first token.
pub const EVENT_FIRST_TOKEN: &str = "gen_ai.first_token";

/// `POST` and the like.
pub const HTTP_REQUEST_METHOD: &str = "http.request.method";
/// The path's route (`/v1/messages`).
pub const HTTP_ROUTE: &str = "http.route";
/// The status the client got.
pub const HTTP_RESPONSE_STATUS_CODE: &str = "http.response.status_code";
/// The class of error (`rate_limit_error`, `overloaded_error`, an upstream outcome).
pub const ERROR_TYPE: &str = "error.type";
/// The server an attempt went to (host of its URL, or the in-process server's id).
pub const SERVER_ADDRESS: &str = "server.address";

/// `req_…`, as in the logs.
pub const REQUEST_ID: &str = "ringmaster.request_id";
/// The door: `messages` or `openai-chat`, …
pub const DOOR: &str = "ringmaster.door";
/// The caller's tenant.
pub const TENANT: &str = "ringmaster.tenant";
/// The caller's tier.
pub const TIER: &str = "ringmaster.tier";
/// Where the routing key came from (`session`, `prefix`).
pub const ROUTING_KEY_SOURCE: &str = "ringmaster.routing.key_source";
/// The prompt's chained block hashes counted.
pub const PREFIX_BLOCKS: &str = "ringmaster.routing.prefix_blocks";
/// The policy slot (`router`).
pub const POLICY_SLOT: &str = "ringmaster.policy.slot";
/// The variant that decided (`native` when the host's ring decided alone).
pub const POLICY_VARIANT: &str = "ringmaster.policy.variant";
/// The deciding component's content hash.
pub const POLICY_VERSION: &str = "ringmaster.policy.version";
/// The policy call's time, microseconds.
pub const POLICY_DURATION_US: &str = "ringmaster.policy.duration_us";
/// A policy fault that sent the request to the fallback (`trap`, `deadline`, …).
pub const POLICY_FAULT: &str = "ringmaster.policy.fault";
/// Why this server: `affinity`, `policy-other`, `spill`, `fallback`, …
pub const ROUTING_REASON: &str = "ringmaster.routing.reason";
/// Whether the bounded-load walk passed the preferred server by.
pub const ROUTING_SPILLED: &str = "ringmaster.routing.spilled";
/// The chosen server.
pub const ROUTING_SERVER: &str = "ringmaster.routing.server";
/// The prompt's leading prefix blocks the chosen server was seen to hold (absent when the
/// policy never asked for the prefix matches).
pub const ROUTING_CACHED_BLOCKS: &str = "ringmaster.routing.cached_prefix_blocks";
/// The prompt tokens the chosen server was charged to compute after that credit.
pub const ROUTING_UNCACHED_TOKENS: &str = "ringmaster.routing.uncached_tokens";
/// The chosen server's requests in flight, this one included.
pub const ROUTING_IN_FLIGHT: &str = "ringmaster.routing.in_flight";
/// The chosen server's waiting requests as it last reported.
pub const ROUTING_WAITING: &str = "ringmaster.routing.waiting";
/// The prompt tokens queued for prefill on the chosen server.
pub const ROUTING_PREFILL_BACKLOG: &str = "ringmaster.routing.prefill_backlog";
/// The bounded-load cap.
pub const ROUTING_CAPACITY: &str = "ringmaster.routing.capacity";
/// Servers in the snapshot the decision saw.
pub const ROUTING_CANDIDATES: &str = "ringmaster.routing.candidates";
/// Whether the request was split between a prefill and a decode server: `split`, `whole`,
/// `bypass`, `no_prefill_server`.
pub const ROUTING_PAIR: &str = "ringmaster.routing.pair";
/// The prefill server of a split request.
pub const ROUTING_PREFILL_SERVER: &str = "ringmaster.routing.prefill_server";
/// Which leg of a split request an upstream span is: `prefill` or `decode`.
pub const LEG: &str = "ringmaster.leg";
/// Whether the request waited in the admission queue.
pub const ADMISSION_QUEUED: &str = "ringmaster.admission.queued";
/// The attempt's number (1 for the first).
pub const ATTEMPT: &str = "ringmaster.attempt";
/// How an attempt ended: `ok`, `refused`, `unreachable`, `timeout`, …
pub const ATTEMPT_OUTCOME: &str = "ringmaster.attempt.outcome";
/// Why the next attempt was made (the failed attempt's error).
pub const RETRY_REASON: &str = "ringmaster.retry.reason";
/// Prompt tokens the server found in its cache.
pub const USAGE_CACHED_TOKENS: &str = "ringmaster.usage.cached_tokens";
