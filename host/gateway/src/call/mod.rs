//! One request's way through the gateway: a [`Call`] carried through its phases in order.
//!
//! 1. [`prepare`]: the body parsed by its door, the model's pool resolved, the safety filter's
//!    input check, the routing key and prefix hashes (hashed once), the request as policies
//!    see it, all decided on one pool snapshot. `POST /admin/route/explain` runs this same
//!    phase.
//! 2. [`admit`]: the token buckets, then the admission policy and the fair queue.
//! 3. [`route`]: the router slot's variant decides, the pool carries it out under the
//!    bounded-load cap; the decision is counted.
//! 4. [`attempt`]: the generation starts on the chosen server, retried on the next one before
//!    the first token where another server can help; a remote server's body is encoded once.
//! 5. [`answer`]: the reply machine ([`crate::reply`]), streamed or collected, in the door's terms.
//! 6. record ([`track`]): latencies, the variant's statistics, the token charges, the learning
//!    router's observation, the traffic recording, as the reply goes.
//!
//! The HTTP layer in front ([`crate::doors`]) reads headers and the body and hands over a
//! [`CallInput`]; in-process callers (the trace replay) build one directly.

mod admit;
mod answer;
pub(crate) mod attempt;
mod legs;
mod local_pair;
pub(crate) mod prepare;
mod route;
mod spill;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Response, StatusCode};
use ringmaster_api::{ApiError, Door, Request};
use ringmaster_policy_engine::PolicyRequest;
use ringmaster_pool::kv_view::ChatPrompt;
use ringmaster_pool::{PoolSnapshot, RoutingInput};

use crate::auth::Caller;
use crate::body::ResponseBody;
use crate::respond::header_names;
use crate::state::Gateway;
use tracing::debug;

/// A request as the HTTP layer hands it over: the body as read, and what was taken from the
/// headers. In-process callers (the trace replay) build it directly.
#[derive(Debug)]
pub struct CallInput {
    /// The door it came in by.
    pub door: Door,
    /// The JSON body.
    pub body: Bytes,
    /// The session id from the configured session headers, if any.
    pub session: Option<String>,
    /// Who sent it.
    pub caller: Caller,
    /// The headers passed on to policies.
    pub passed_headers: Vec<(String, String)>,
    /// The request's own limit on its wait in the admission queue
    /// (`x-ringmaster-queue-timeout-ms`), when it sets one.
    pub queue_timeout: Option<Duration>,
    /// The client's `traceparent` and `tracestate`, passed on to the server as they came when
    /// the gateway records no span of its own for the request.
    pub trace_context: Vec<(HeaderName, HeaderValue)>,
    /// The client's headers of its API that go with its body when it is relayed to a server
    /// of the same API (`anthropic-version`, `anthropic-beta`).
    pub relay_headers: Vec<(HeaderName, HeaderValue)>,
    /// The conversation a Responses request's `previous_response_id` continues, as found.
    pub prior: Option<Prior>,
}

/// A stored response a Responses request continues: its id and its items (JSON array text).
#[derive(Clone, Debug)]
pub struct Prior {
    /// The response's id.
    pub id: String,
    /// Its conversation and output.
    pub items: String,
}

/// One request between its phases.
#[derive(Debug)]
pub struct Call {
    /// The gateway it runs in.
    pub gateway: Arc<Gateway>,
    /// `req_…`.
    pub id: String,
    /// When it arrived.
    pub started: Instant,
    /// Who sent it.
    pub caller: Caller,
    /// The validated request.
    pub request: Request,
    /// The name its model's servers serve it under (an alias's target).
    pub served_model: String,
    /// Whether that name is a LoRA adapter, and whether the server it goes to may have to
    /// load it first.
    pub adapter: AdapterUse,
    /// The request's one view of its model's pool (a new one after a wait in the queue).
    pub pool: Arc<PoolSnapshot>,
    /// The routing key and prefix hashes.
    pub input: RoutingInput,
    /// The request as policies see it.
    pub policy: PolicyRequest,
    /// Its own limit on its wait in the admission queue.
    pub queue_timeout: Option<Duration>,
    /// The request's span when its trace is recorded and exported (`None`: tracing is off or
    /// the trace was not sampled, and no phase builds spans or attributes for it).
    pub trace: Option<tracing::Span>,
    /// The client's trace context, for the server when there is no span of our own.
    pub trace_context: Vec<(HeaderName, HeaderValue)>,
    /// The client's body, kept when a server of its pool speaks the door's API (relayed to
    /// it with only what routing must set changed).
    pub body: Option<Bytes>,
    /// The client's headers that go with a relayed body.
    pub relay_headers: Vec<(HeaderName, HeaderValue)>,
    /// The `[[fallback]]` pool it spilled to, if it did.
    pub spilled: Option<String>,
}

impl Call {
    /// The prompt, as the pool matches it against the caches servers report.
    pub fn chat(&self) -> ChatPrompt<'_> {
        ChatPrompt {
            adapter: self.adapter.name(&self.served_model),
            ..chat(&self.request)
        }
    }
}

/// `request`'s prompt as the pool reads it.
pub(crate) fn chat(request: &Request) -> ChatPrompt<'_> {
    ChatPrompt {
        system: request.system.as_deref(),
        messages: &request.messages,
        adapter: None,
    }
}

/// A request's model as a LoRA adapter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdapterUse {
    /// A base model (or one no server lists as an adapter).
    None,
    /// An adapter its pool's servers hold.
    Held,
    /// An adapter none with room holds (`[lora] load_on_demand`): the base model's pool is
    /// routed, and the chosen server loads it first.
    Load(ringmaster_config::AdapterSource),
}

impl AdapterUse {
    /// The adapter's name (`served`) if the request's model is one.
    pub fn name<'a>(&self, served: &'a str) -> Option<&'a str> {
        match self {
            Self::None => None,
            Self::Held | Self::Load(_) => Some(served),
        }
    }
}

/// A request from its parsed input to its answer: every phase, in order. `started` is when
/// the request arrived.
pub async fn handle(
    gateway: &Arc<Gateway>,
    input: CallInput,
    started: Instant,
    request_id: &str,
) -> Result<Response<ResponseBody>, ApiError> {
    Call::prepare(gateway, input, started, request_id)?
        .run()
        .await
}

impl Call {
    /// Every phase after prepare, in order, to the answer with the gateway's headers.
    pub async fn run(mut self) -> Result<Response<ResponseBody>, ApiError> {
        match self.trace.clone() {
            Some(parent) => {
                use tracing::Instrument;
                let span =
                    tracing::info_span!(parent: &parent, "admission", otel.kind = "internal");
                self.admit().instrument(span).await?;
            }
            None => self.admit().await?,
        }
        let (routed, mut tracker) = self.route()?;
        let spilled = self
            .spilled
            .as_deref()
            .and_then(|pool| HeaderValue::from_str(pool).ok());
        let mut started = match self.attempt(routed).await {
            Ok(started) => started,
            Err(e) => {
                tracker.failed(e.message());
                return Err(e);
            }
        };
        // The successful attempt's span lasts as long as the reply it carries.
        tracker.attempt_span = started.span.take();
        if let Some(observation) = tracker.observation.as_mut() {
            started
                .decision
                .server
                .id()
                .clone_into(&mut observation.server);
        }
        let attempts = started.attempts;
        let dropped = std::mem::take(&mut started.dropped);
        let server = HeaderValue::from_str(started.decision.server.id()).ok();
        let variant = HeaderValue::from_str(&tracker.label.variant).ok();
        // The router version that decided (absent when the native ring decided alone).
        let version = tracker
            .variant
            .as_ref()
            .and_then(|v| HeaderValue::from_str(&v.policy.info().hash).ok());
        let door = self.request.door;
        let clamped = self
            .request
            .clamped
            .and_then(|c| HeaderValue::from_str(&c.header_value()).ok());
        let caller = self.caller.clone();
        let caller_gateway = self.gateway.clone();
        let mut response = self.answer(tracker, started).await?;
        let headers = response.headers_mut();
        if let Some(value) = server {
            headers.insert(&header_names::SERVER, value);
        }
        headers.insert(&header_names::ATTEMPTS, HeaderValue::from(attempts));
        if let Some(value) = variant {
            headers.insert(&header_names::VARIANT, value);
        }
        if let Some(value) = version {
            headers.insert(&header_names::POLICY_VERSION, value);
        }
        if let Some(value) = spilled {
            headers.insert(&header_names::FALLBACK, value);
        }
        if let Some(value) = clamped {
            headers.insert(&header_names::CLAMPED, value);
        }
        crate::auth::rate_limit_headers(&caller, headers, door);
        if !dropped.is_empty() {
            for field in &dropped {
                caller_gateway.metrics.dropped_field(door.label(), field);
            }
            debug!(fields = ?dropped, "request.fields_dropped");
            if let Some(value) = dropped_header(&dropped) {
                headers.insert(&header_names::DROPPED, value);
            }
        }
        Ok(response)
    }
}

/// Longest `x-ringmaster-dropped` value: the names that fit, then `…`.
const MAX_DROPPED_HEADER_BYTES: usize = 1024;

/// `x-ringmaster-dropped`: the fields the server never saw, comma-separated.
fn dropped_header(fields: &[String]) -> Option<HeaderValue> {
    let mut value = String::new();
    for field in fields {
        if value.len() + field.len() + 2 > MAX_DROPPED_HEADER_BYTES {
            value.push_str(", …");
            break;
        }
        if !value.is_empty() {
            value.push_str(", ");
        }
        value.extend(field.chars().filter(|c| c.is_ascii_graphic() || *c == ' '));
    }
    HeaderValue::from_str(&value).ok()
}

/// A JSON body answer.
pub(crate) fn json_body(body: Vec<u8>) -> Response<ResponseBody> {
    let mut response = Response::new(crate::body::full(body));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
