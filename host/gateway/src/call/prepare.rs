//! Phase 1, prepare: from the body to a [`Call`] decided on one pool snapshot. The body is
//! parsed by its door (once), the model's pool resolved (or a `[[fallback]]` pool when its own
//! servers cannot take the request: [`super::spill`]), what this pool cannot serve refused,
//! the safety filter's input check run, the prompt hashed (once) into the routing key and
//! prefix hashes, and the request as policies see it built. `POST /admin/route/explain` runs
//! this same phase, so it explains the decisions the path makes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ringmaster_api::{ApiError, ErrorKind, Request};
use ringmaster_config::SpillReason;
use ringmaster_policy_engine::PolicyRequest;
use ringmaster_pool::PoolSnapshot;

use super::spill::spill;
use super::{AdapterUse, Call, CallInput};
use crate::state::Gateway;
use ringmaster_slots::routing::routing_input;

impl Call {
    /// Phase 1, prepare: the body parsed by its door, the model's pool resolved, what the
    /// pool cannot serve refused, the safety filter's input check, the routing key and prefix
    /// hashes, and the request as policies see it, all on one pool snapshot.
    pub fn prepare(
        gateway: &Arc<Gateway>,
        input: CallInput,
        started: Instant,
        request_id: &str,
    ) -> Result<Self, ApiError> {
        let CallInput {
            door,
            body,
            session,
            caller,
            passed_headers,
            queue_timeout,
            trace_context,
            relay_headers,
            prior,
        } = input;
        // The request's one view of the pool: admission, the router, assignment and the
        // metrics all decide on it.
        let fleet = gateway.pool.snapshot();
        let prior = prior.as_ref().map(|p| ringmaster_api::responses::Prior {
            id: &p.id,
            items: &p.items,
        });
        let mut request = door.parse_continuing(&body, gateway.limits(&fleet), prior)?;
        // A request its model's own servers cannot take now spills to a `[[fallback]]` pool
        // when a rule covers it, else is refused.
        let own = model_pool(gateway, &fleet, &request.model)
            // No own server serves the model at all: only a rule that names it.
            .map_err(|e| ((SpillReason::NoServer, request.model.clone(), true), e))
            .and_then(
                |found| match serving_now(gateway, &fleet, &found.1, &found.0) {
                    Ok(()) => Ok(found),
                    Err((reason, e)) => Err(((reason, found.0, false), e)),
                },
            );
        let mut spilled = None;
        let (served_model, pool, adapter) = match own {
            Ok(found) => found,
            Err(((reason, model, named_only), refusal)) => {
                match spill(gateway, &fleet, &caller.tenant, &model, reason, named_only) {
                    Some(to) => {
                        spilled = Some(to.name);
                        (to.served_model, to.pool, AdapterUse::None)
                    }
                    None => return Err(refusal),
                }
            }
        };
        // The body is kept only for a server that would take it as it came.
        let relays = pool.servers.iter().any(|s| {
            matches!(s.engine(), ringmaster_pool::Backend::Remote(_)) && s.api() == door.api()
        });
        let body = relays.then_some(body);
        if pool
            .servers
            .iter()
            .any(|s| matches!(s.engine(), ringmaster_pool::Backend::Local(_)))
            && let Some(refusal) = unserved_in_process(&request, &pool)
        {
            return Err(refusal);
        }
        if relay_headers
            .iter()
            .any(|(name, _)| name == "anthropic-beta")
        {
            // The client's betas mean nothing to a server of another API (a relayed body
            // keeps them).
            request.fields.unused("anthropic-beta");
        }
        if gateway.safety.slot.current().is_some() {
            gateway
                .safety
                .check_input(&gateway.metrics, &request.prompt_text())?;
        }
        let input = routing_input(&request, session.as_deref(), gateway.config.prefix_hashing);
        let policy = PolicyRequest {
            id: request_id.to_owned(),
            model: request.model.clone(),
            tier: caller.tier.to_string(),
            session_id: session.or_else(|| request.session.clone()),
            routing_key: input.key,
            prefix_hashes: input.prefix_hashes.clone(),
            prompt_tokens: request.estimated_tokens,
            max_tokens: request.max_tokens,
            priority: 0,
            stream: request.stream,
            headers: passed_headers,
            door: door.label(),
        };
        // The request's span (opened by the HTTP layer) is described once its trace is known
        // to be recorded; otherwise nothing is built for it.
        let trace = {
            let span = tracing::Span::current();
            ringmaster_telemetry::is_sampled(&span).then_some(span)
        };
        if let Some(span) = &trace {
            describe(span, request_id, &request, &served_model, &caller, &input);
        }
        Ok(Self {
            gateway: gateway.clone(),
            id: request_id.to_owned(),
            started,
            caller,
            request,
            served_model,
            adapter,
            pool,
            input,
            policy,
            queue_timeout,
            trace,
            trace_context,
            body,
            relay_headers,
            spilled,
        })
    }
}

/// Refuses a request its model's pool cannot take now: no server serves the model, none can
/// be reached, or every one's queue is full (each with a `retry-after`, and the reason a
/// `[[fallback]]` rule would spill it for).
fn serving_now(
    gateway: &Gateway,
    fleet: &PoolSnapshot,
    pool: &PoolSnapshot,
    served_model: &str,
) -> Result<(), (SpillReason, ApiError)> {
    let no_server = |e| Err((SpillReason::NoServer, e));
    if pool.servers.is_empty() && !fleet.servers.is_empty() {
        return no_server(
            ApiError::new(
                ErrorKind::Unavailable,
                format!("no GPU server serves the model {served_model:?} now; retry shortly"),
            )
            .with_retry_after(Duration::from_secs(1)),
        );
    }
    if !pool.servers.is_empty() && pool.servers.iter().all(|s| !s.engine().is_reachable()) {
        return no_server(
            ApiError::new(
                ErrorKind::Unavailable,
                "no GPU server can be reached (every worker is down); retry shortly",
            )
            .with_retry_after(Duration::from_secs(1)),
        );
    }
    if !pool.servers.is_empty()
        && pool
            .servers
            .iter()
            .all(|s| s.engine().load().waiting >= gateway.config.max_waiting_per_server)
    {
        return Err((
            SpillReason::Overloaded,
            ApiError::new(
                ErrorKind::Overloaded,
                "every GPU server's queue is full; retry shortly",
            )
            .with_retry_after(Duration::from_secs(1)),
        ));
    }
    Ok(())
}

/// The pool a request for `model` is routed in, the name it is served under, and whether it
/// is a LoRA adapter: the pool of the servers that hold it, or, with `[lora]
/// load_on_demand` when none of those has room, the base model's pool (the chosen server
/// loads it).
pub(crate) fn model_pool(
    gateway: &Gateway,
    fleet: &PoolSnapshot,
    model: &str,
) -> Result<(String, Arc<PoolSnapshot>, AdapterUse), ApiError> {
    if let Some(source) = gateway.config.lora.loadable(model)
        && let Some((_, base)) = fleet.model(&source.base)
        && !base.servers.is_empty()
    {
        let routable: Vec<_> = base.servers.iter().filter(|s| s.is_routable()).collect();
        let total: u64 = routable.iter().map(|s| s.fleet_in_flight()).sum();
        // The ring's bounded-load cap over the base model's servers.
        let cap = (gateway.config.ring.load_factor * (total + 1) as f64
            / routable.len().max(1) as f64)
            .ceil() as u64;
        let holder_with_room = routable
            .iter()
            .any(|s| s.has_adapter(model) && s.fleet_in_flight() < cap);
        if !holder_with_room {
            return Ok((
                model.to_owned(),
                base.clone(),
                AdapterUse::Load(source.clone()),
            ));
        }
    }
    let (served, pool) = resolve_model(fleet, model)?;
    let adapter = if fleet.adapters.contains_key(served) {
        AdapterUse::Held
    } else {
        AdapterUse::None
    };
    Ok((served.to_owned(), pool, adapter))
}

/// The pool of the model a request names, and the name it is served under.
pub(crate) fn resolve_model<'a>(
    snapshot: &'a PoolSnapshot,
    model: &str,
) -> Result<(&'a str, Arc<PoolSnapshot>), ApiError> {
    snapshot
        .model(model)
        .map(|(served, pool)| (served, pool.clone()))
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "model: {model:?} is not served here; available models: {}",
                snapshot.accepted.join(", ")
            ))
        })
}

/// The 400 for what an engine of this crate cannot serve (tools, images), naming the feature;
/// `None` when the request asks for neither. Such engines run in the gateway's process or in
/// a `ringmaster worker`; pools of OpenAI-compatible servers serve both features. Tools pass
/// when every server of `pool` is a simulated one of this process, which simulates the calls
/// (`EngineHandle::simulates_tool_calls`).
pub(crate) fn unserved_in_process(request: &Request, pool: &PoolSnapshot) -> Option<ApiError> {
    let simulates_tools = !pool.servers.is_empty()
        && pool.servers.iter().all(|s| {
            matches!(s.engine(), ringmaster_pool::Backend::Local(e) if e.simulates_tool_calls())
        });
    if request.uses_tools() && !simulates_tools {
        return Some(ApiError::invalid(format!(
            "tools: tool use (tool calling) is not supported for the model {:?}: its servers run \
             Ringmaster's own engine on a model, which does not call tools (the feature is served by \
             simulated servers and by pools of OpenAI-compatible servers with tool calling); \
             leave tools out",
            request.model
        )));
    }
    if request.uses_images() {
        return Some(ApiError::invalid(format!(
            "image input is not supported for the model {:?}: its servers run Ringmaster's own \
             engine, which reads text only (images are served by pools of OpenAI-compatible \
             servers with a vision model); send text only",
            request.model
        )));
    }
    if request.output_format.is_some() {
        return Some(ApiError::invalid(format!(
            "structured output (a JSON format) is not supported for the model {:?}: its servers \
             run Ringmaster's own engine, which does not constrain its output (pools of vLLM or \
             SGLang servers serve it); ask for text",
            request.model
        )));
    }
    None
}

/// The request's span: what was asked, by whom, keyed how (the GenAI semantic conventions'
/// request attributes and `ringmaster.*`).
fn describe(
    span: &tracing::Span,
    request_id: &str,
    request: &Request,
    served_model: &str,
    caller: &crate::auth::Caller,
    input: &ringmaster_pool::RoutingInput,
) {
    use ringmaster_telemetry::SpanExt;
    use ringmaster_telemetry::semconv as k;
    span.rename(format!("chat {}", request.model));
    span.attribute(k::GEN_AI_OPERATION_NAME, "chat");
    span.attribute(k::GEN_AI_PROVIDER_NAME, request.door.provider());
    span.attribute(k::GEN_AI_REQUEST_MODEL, request.model.clone());
    span.attribute(k::GEN_AI_RESPONSE_MODEL, served_model.to_owned());
    span.attribute(k::GEN_AI_REQUEST_MAX_TOKENS, i64::from(request.max_tokens));
    if let Some(temperature) = request.sampling.temperature {
        span.attribute(k::GEN_AI_REQUEST_TEMPERATURE, f64::from(temperature));
    }
    span.attribute(k::REQUEST_STREAM, request.stream);
    span.attribute(k::GEN_AI_RESPONSE_ID, request_id.to_owned());
    span.attribute(k::REQUEST_ID, request_id.to_owned());
    span.attribute(k::DOOR, request.door.label());
    span.attribute(k::TENANT, caller.tenant.to_string());
    span.attribute(k::TIER, caller.tier.to_string());
    span.attribute(k::ROUTING_KEY_SOURCE, input.source.as_str());
    span.attribute(k::PREFIX_BLOCKS, input.prefix_hashes.len() as i64);
}
