//! `POST /admin/route/explain`: a request's routing decision, nothing run, from the request
//! path's own prepare phase and the router slot's own decision (see [`explain`]).

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use ringmaster_api::Door;
use ringmaster_api::{ApiError, ErrorKind};
use ringmaster_gateway::call::{Call, CallInput};
use ringmaster_gateway::respond::{json_response, read_any_json_body};
use ringmaster_gateway::{Gateway, ResponseBody};
use ringmaster_tenancy::Caller;
use serde_json::json;

use crate::query_param;

/// `POST /admin/route/explain`: a request's routing decision, nothing run. The body goes
/// through the request path's own prepare phase (the door's parser, the configured session
/// headers, the model's pool, the routing key and prefix hashes, the request as policies see
/// it) and the router slot's own variant pick, policy call and carrying-out, with nothing
/// counted. `?door=chat|completions|responses` explains an OpenAI body (Messages by default);
/// `?tier=T` the decision for a caller of tier `T`.
pub(crate) async fn explain(
    gateway: &Arc<Gateway>,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, ApiError> {
    let door = match query_param(&req, "door").as_deref() {
        None => Door::Messages,
        Some(name) => Door::named(name).ok_or_else(|| {
            ApiError::invalid(format!(
                "door: {name:?} is not one of \"messages\", \"chat\", \"completions\", \
                 \"responses\""
            ))
        })?,
    };
    let tier = query_param(&req, "tier").unwrap_or_else(|| "anonymous".to_owned());
    let session = ringmaster_gateway::doors::session_header(
        req.headers(),
        &gateway.config().session_headers,
    )?;
    let passed_headers = ringmaster_gateway::doors::passed_headers(
        req.headers(),
        &gateway.config().policies.pass_headers,
    );
    let relay_headers = ringmaster_gateway::doors::relay_headers(door, req.headers());
    let body = read_any_json_body(gateway, req).await?;
    // Any key's stored response may be explained (the admin token is every key's).
    let prior = ringmaster_gateway::doors::prior(gateway, door, &body, None).await?;
    let input = CallInput {
        door,
        body,
        session,
        caller: Caller::unlimited(&tier, "admin-explain"),
        passed_headers,
        queue_timeout: None,
        trace_context: Vec::new(),
        relay_headers,
        prior,
    };
    let call = Call::prepare(gateway, input, std::time::Instant::now(), "explain")?;
    let snapshot = &call.pool;
    let explained = gateway.router().explain(
        gateway.pool(),
        snapshot,
        (&call.input, call.chat()),
        &call.policy,
    );
    if let Some(reason) = &explained.rejected {
        return Err(ApiError::new(
            ErrorKind::Overloaded,
            format!("the router policy would decline the request: {reason}"),
        ));
    }
    let decision = explained
        .decision
        .ok_or_else(|| ApiError::new(ErrorKind::Overloaded, "no GPU servers in the pool"))?;
    let input = &call.input;
    let prefix_matches: Vec<_> = ringmaster_slots::router::prefix_matches(
        snapshot,
        gateway.pool().prefixes(),
        (input, call.chat()),
    )
    .into_iter()
    .map(|m| {
        json!({
            "server": m.server,
            "hashes": m.hashes,
            "tokens": m.tokens,
            "source": m.source.as_str(),
        })
    })
    .collect();
    let total: u64 = snapshot.servers.iter().map(|s| s.fleet_in_flight()).sum();
    let candidates: Vec<_> = snapshot
        .ring
        .candidates(input.key, snapshot.servers.len())
        .into_iter()
        .map(|i| {
            let server = &snapshot.servers[i];
            json!({
                "id": server.id(),
                "in_flight": server.fleet_in_flight(),
                "in_flight_here": server.in_flight(),
                "capacity": snapshot.ring.capacity(i, total),
            })
        })
        .collect();
    let preferred = decision.preferred.as_ref().map_or("?", |s| s.id());
    let why = match (decision.reason, &explained.fault) {
        (_, Some(fault)) => format!(
            "the router policy faulted ({}); the host's ring decided instead",
            fault.kind()
        ),
        (ringmaster_pool::DecisionReason::Affinity, None) => {
            "the routing key's owner on the ring is under its bounded-load cap".to_owned()
        }
        (ringmaster_pool::DecisionReason::BoundedLoadSpill, None) => format!(
            "the key's owner {preferred} is at its bounded-load cap; the next server clockwise under its cap takes it"
        ),
        (ringmaster_pool::DecisionReason::Policy, None) => {
            "the router policy chose this server, under its bounded-load cap".to_owned()
        }
        (ringmaster_pool::DecisionReason::PolicyOverCap, None) => format!(
            "the router policy chose {preferred}, which is at its bounded-load cap; the ring spilled it onward"
        ),
        (ringmaster_pool::DecisionReason::Failover, None) => format!(
            "{preferred} is unreachable or ejected; the next routable server on the ring takes it"
        ),
    };
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "router": explained.variant.as_ref().map_or_else(
                || "native ring".to_owned(),
                |v| format!("{} ({})", v.name, v.policy.info().hash),
            ),
            "variant": explained.variant.as_ref().map(|v| v.name.to_string()),
            "policy_chose": explained.chosen,
            "routing_key": {
                "source": input.source.as_str(),
                "hash": format!("{:016x}", input.key),
            },
            "prefix_hashes": input.prefix_hashes.len(),
            // System-prompt lines `[routing] volatile_prefix` took out of the key and hashes.
            "volatile_lines": call.request.volatile.as_ref().map_or(0, |lines| lines.lines().count()),
            "prefix_matches": prefix_matches,
            "candidates": candidates,
            "chosen": decision.server.id(),
            "reason": decision.reason.as_str(),
            "why": why,
            "preferred": decision.preferred.as_ref().map(|s| s.id()),
            "skipped": decision.skipped.iter().map(|s| s.id()).collect::<Vec<_>>(),
            "capacity": decision.capacity,
            // Whether the request would be split between a prefill server and the chosen one.
            "pair": explained.pair.as_ref().map(|pair| json!({
                "outcome": pair.outcome.as_str(),
                "prefill": pair.prefill.as_ref().map(|(server, _)| server.id()),
                "prefill_tokens": pair.prefill.as_ref().map(|(_, tokens)| tokens),
                "why": pair.why,
            })),
        }),
    ))
}
