//! The HTTP side of the doors: what `POST /v1/messages`, `/v1/chat/completions`,
//! `/v1/completions` and `/v1/responses` read from the request's headers and body before the
//! call's phases ([`crate::call`]) (a Responses request's earlier conversation is looked up
//! here, the one wait before them), a streamed reply that starts early while it waits
//! ([`crate::reply::early`]), `POST /v1/messages/count_tokens`, `GET /v1/streams/{id}`, and
//! the stored responses' own routes (`GET`, `DELETE`, `cancel`, `input_items`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::HeaderValue;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use ringmaster_api::{ApiError, Door};
use tracing::debug;

use crate::body::ResponseBody;
use crate::call::prepare::{resolve_model, unserved_in_process};
use crate::call::{Call, CallInput, Prior};
use crate::reply::early;
use crate::respond::{json_response, read_json_body, refuse_unread};
use crate::state::Gateway;
use ringmaster_slots::routing::MAX_SESSION_ID_BYTES;

/// `POST /v1/messages`, `/v1/chat/completions` and `/v1/completions`.
pub(crate) async fn answer(
    gateway: &Arc<Gateway>,
    req: Request<Incoming>,
    door: Door,
    started: Instant,
    request_id: &str,
) -> Result<Response<ResponseBody>, ApiError> {
    let checked = (|| -> Result<_, ApiError> {
        let headers = req.headers();
        let caller =
            crate::auth::authenticate_at(&gateway.keys.current(), &gateway.metrics, headers, door)?;
        let session = session_header(headers, &gateway.config.session_headers)?;
        Ok((caller, session, queue_timeout_header(headers)?))
    })();
    let (caller, session, queue_timeout) = match checked {
        Ok(checked) => checked,
        // Refused on the head alone: the client hears it once it has sent its body.
        Err(e) => return Err(refuse_unread(req, e).await),
    };
    let passed_headers = passed_headers(req.headers(), &gateway.config.policies.pass_headers);
    let trace_context = ringmaster_telemetry::trace_headers(req.headers());
    let relay_headers = relay_headers(door, req.headers());
    let body = read_json_body(gateway, req).await?;
    let prior = prior(gateway, door, &body, Some(&caller.owner)).await?;
    let input = CallInput {
        door,
        queue_timeout,
        trace_context,
        body,
        session,
        caller,
        passed_headers,
        relay_headers,
        prior,
    };
    let call = Call::prepare(gateway, input, started, request_id)?;
    let every = match gateway.config.stream_ping {
        Some(every) if call.request.stream => every,
        // Only a stream starts early: everything else runs here, unboxed.
        _ => return call.run().await,
    };
    // A streamed reply that is not ready within a ping interval starts early ([`early`]).
    let mut pending: early::Pending = Box::pin(call.run());
    // The first poll runs until the reply's first wait: only a stream that then waits needs
    // the timer.
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(pending.as_mut().poll(cx))).await;
    if let std::task::Poll::Ready(reply) = first {
        return reply;
    }
    let interval = tokio::time::sleep(every);
    tokio::pin!(interval);
    tokio::select! {
        biased;
        reply = &mut pending => return reply,
        () = &mut interval => {}
    }
    debug!("stream.started_early");
    let stream_id = gateway.streams.enabled().then_some(request_id);
    Ok(early::response(
        pending,
        door,
        every,
        stream_id,
        tracing::Span::current(),
    ))
}

/// `POST /v1/messages/count_tokens`: the prompt rendered with the chat template and counted
/// with the tokenizer of the model's pool (a server that reports its tokenizer: a local model
/// server, a `ringmaster worker`). A pool of servers that report none is estimated (four bytes
/// a token over text, tool calls and the tools offered, a bound per image), and the answer
/// says so in `x-ringmaster-token-count: estimated`.
pub(crate) async fn count_tokens(
    gateway: &Arc<Gateway>,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, ApiError> {
    let caller =
        crate::auth::authenticate_request(&gateway.keys.current(), &gateway.metrics, req.headers())
            .await;
    let caller = match caller {
        Ok(caller) => caller,
        Err(e) => return Err(refuse_unread(req, e).await),
    };
    let body = read_json_body(gateway, req).await?;
    let fleet = gateway.pool.snapshot();
    let request = ringmaster_api::messages::parse_count_tokens(&body, gateway.limits(&fleet))?;
    caller
        .may_use(&request.model)
        .map_err(crate::auth::refused)?;
    let (_, pool) = resolve_model(&fleet, &request.model)?;
    let scheme = pool.servers.iter().find_map(|s| s.cache_scheme());
    // Only Ringmaster's own engines report a tokenizer, and they serve neither tools (but
    // simulated ones) nor images: a count of a prompt they would refuse would only mislead.
    if scheme.is_some()
        && let Some(refusal) = unserved_in_process(&request, &pool)
    {
        return Err(refusal);
    }
    let (tokens, exact) = match scheme {
        Some(scheme) => (
            scheme
                .tokenizer
                .encode_chat(request.system.as_deref(), &request.messages)
                .len() as u64,
            true,
        ),
        None => (u64::from(request.estimated_tokens), false),
    };
    let mut response = json_response(
        StatusCode::OK,
        &ringmaster_wire::anthropic::TokenCount {
            input_tokens: tokens,
        },
    );
    response.headers_mut().insert(
        "x-ringmaster-token-count",
        HeaderValue::from_static(if exact { "exact" } else { "estimated" }),
    );
    Ok(response)
}

/// `GET /v1/streams/{id}`: a resumable stream again, from after its `Last-Event-ID` (from the
/// start without one). 404 once the stream is gone, or when another key started it.
pub(crate) fn resume_stream(
    gateway: &Arc<Gateway>,
    req: &Request<Incoming>,
    id: &str,
) -> Result<Response<ResponseBody>, ApiError> {
    let caller =
        crate::auth::authenticate(&gateway.keys.current(), &gateway.metrics, req.headers())?;
    if !gateway.streams.enabled() {
        return Err(ApiError::not_found(
            "streams are not resumable on this gateway ([limits] resume_window_ms is 0)",
        ));
    }
    let last = match req.headers().get("last-event-id") {
        None => 0,
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| ApiError::invalid("last-event-id: must be an event id (a number)"))?,
    };
    let body = gateway
        .streams
        .resume(id, &caller.owner, last)
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "stream {id:?} is not known here (finished and expired, or never started)"
            ))
        })?;
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    Ok(response)
}

/// `GET /v1/responses/{id}`, `DELETE /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`
/// and `GET /v1/responses/{id}/input_items`: a stored response (or one in flight here) as its
/// key sees it.
pub(crate) async fn stored_response(
    gateway: &Arc<Gateway>,
    req: Request<Incoming>,
    rest: &str,
) -> Result<Response<ResponseBody>, ApiError> {
    let caller =
        crate::auth::authenticate_request(&gateway.keys.current(), &gateway.metrics, req.headers())
            .await?;
    let owner: &str = &caller.owner;
    let (id, action) = match rest.split_once('/') {
        Some((id, action)) => (id, Some(action)),
        None => (rest, None),
    };
    let method = req.method().clone();
    let responses = gateway.responses();
    let not_found = || {
        ApiError::not_found(format!(
            "no response {id:?} is stored here (it was not stored, was deleted, or expired)"
        ))
    };
    let wrong_method = |allowed: &str| {
        ApiError::new(
            ringmaster_api::ErrorKind::MethodNotAllowed,
            format!("method {method} is not allowed on /v1/responses/{rest} ({allowed} is)"),
        )
    };
    match action {
        None if method == http::Method::GET => match responses.find(id, owner).await {
            Some(stored) => Ok(crate::call::json_body(
                stored.response.get().as_bytes().to_vec(),
            )),
            None if responses.is_running(id) => Ok(json_response(
                StatusCode::OK,
                &serde_json::json!({"id": id, "object": "response", "status": "in_progress", "output": []}),
            )),
            None => Err(not_found()),
        },
        None if method == http::Method::DELETE => {
            if responses.delete(id, owner).await {
                Ok(json_response(
                    StatusCode::OK,
                    &ringmaster_wire::responses::Deleted {
                        id,
                        object: "response",
                        deleted: true,
                    },
                ))
            } else {
                Err(not_found())
            }
        }
        None => Err(wrong_method("GET or DELETE")),
        Some("cancel") if method == http::Method::POST => {
            if !responses.cancel(id) {
                return match responses.find(id, owner).await {
                    Some(_) => Err(ApiError::invalid(format!(
                        "response {id:?} is not in progress: only a response being generated \
                         can be cancelled"
                    ))),
                    None => Err(not_found()),
                };
            }
            // The cancelled reply stores itself as it ends: answer with that when it does.
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                if let Some(stored) = responses.find(id, owner).await {
                    return Ok(crate::call::json_body(
                        stored.response.get().as_bytes().to_vec(),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(json_response(
                StatusCode::OK,
                &serde_json::json!({"id": id, "object": "response", "status": "cancelled", "output": []}),
            ))
        }
        Some("cancel") => Err(wrong_method("POST")),
        Some("input_items") if method == http::Method::GET => {
            let stored = responses.find(id, owner).await.ok_or_else(not_found)?;
            input_items(&req, &stored)
        }
        Some("input_items") => Err(wrong_method("GET")),
        Some(_) => Err(ApiError::not_found(format!(
            "no route for {method} /v1/responses/{rest}"
        ))),
    }
}

/// A page of a stored response's input items: `order` (`desc`, the default, or `asc`),
/// `limit` (1 to 100, default 20), `after` (an item id).
fn input_items(
    req: &Request<Incoming>,
    stored: &ringmaster_responses::Stored,
) -> Result<Response<ResponseBody>, ApiError> {
    let query: Vec<(String, String)> = req
        .uri()
        .query()
        .map(|q| {
            q.split('&')
                .filter_map(|pair| pair.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
        .unwrap_or_default();
    let param = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let limit = match param("limit") {
        None => 20,
        Some(n) => n
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=100).contains(n))
            .ok_or_else(|| ApiError::invalid("limit: must be between 1 and 100"))?,
    };
    let mut items: Vec<&serde_json::value::RawValue> = stored
        .conversation
        .iter()
        .skip(stored.turn_start)
        .map(AsRef::as_ref)
        .collect();
    match param("order") {
        None | Some("desc") => items.reverse(),
        Some("asc") => {}
        Some(_) => return Err(ApiError::invalid("order: must be \"asc\" or \"desc\"")),
    }
    let id_of = |item: &serde_json::value::RawValue| {
        #[derive(serde::Deserialize)]
        struct Id {
            id: Option<String>,
        }
        serde_json::from_str::<Id>(item.get())
            .ok()
            .and_then(|i| i.id)
    };
    if let Some(after) = param("after") {
        let at = items
            .iter()
            .position(|item| id_of(item).as_deref() == Some(after))
            .ok_or_else(|| {
                ApiError::invalid(format!("after: no item {after:?} in this response"))
            })?;
        items.drain(..=at);
    }
    let has_more = items.len() > limit;
    items.truncate(limit);
    let first = items.first().and_then(|i| id_of(i));
    let last = items.last().and_then(|i| id_of(i));
    Ok(json_response(
        StatusCode::OK,
        &ringmaster_wire::responses::ItemList {
            object: "list",
            data: items,
            first_id: first.as_deref(),
            last_id: last.as_deref(),
            has_more,
        },
    ))
}

/// The client's headers that go with its body to a server of its own API: Anthropic's
/// version and betas (Claude Code sends eight betas; a server without them refuses what they
/// enable).
pub fn relay_headers(
    door: Door,
    headers: &http::HeaderMap,
) -> Vec<(http::HeaderName, HeaderValue)> {
    const MESSAGES: [http::HeaderName; 2] = [
        http::HeaderName::from_static("anthropic-version"),
        http::HeaderName::from_static("anthropic-beta"),
    ];
    let names: &[http::HeaderName] = match door {
        Door::Messages => &MESSAGES,
        Door::Chat | Door::Completions | Door::Responses => &[],
    };
    names
        .iter()
        .filter_map(|name| Some((name.clone(), headers.get(name)?.clone())))
        .collect()
}

/// The stored response a Responses body's `previous_response_id` continues (`owner`: the key
/// that may see it; `None`: any). A body that names none has none; one that names a response
/// not found here is answered by the door (404 naming the field).
pub async fn prior(
    gateway: &Gateway,
    door: Door,
    body: &[u8],
    owner: Option<&str>,
) -> Result<Option<Prior>, ApiError> {
    if door != Door::Responses {
        return Ok(None);
    }
    let Some(id) = ringmaster_api::responses::previous_response_id(body) else {
        return Ok(None);
    };
    let responses = gateway.responses();
    let stored = match owner {
        Some(owner) => responses.find(&id, owner).await,
        None => responses.find_any(&id).await,
    };
    Ok(stored.map(|stored| Prior {
        items: stored.items(),
        id,
    }))
}

/// The configured headers a request carries, for policies (lower-case names, visible ASCII
/// values only).
pub fn passed_headers(headers: &http::HeaderMap, names: &[String]) -> Vec<(String, String)> {
    names
        .iter()
        .filter_map(|name| {
            let value = headers.get(name.as_str())?.to_str().ok()?;
            Some((name.clone(), value.to_owned()))
        })
        .collect()
}

/// The longest a request lets itself wait in the admission queue.
pub(crate) fn queue_timeout_header(
    headers: &http::HeaderMap,
) -> Result<Option<Duration>, ApiError> {
    const NAME: &str = "x-ringmaster-queue-timeout-ms";
    let Some(value) = headers.get(NAME) else {
        return Ok(None);
    };
    let ms = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .ok_or_else(|| {
            ApiError::invalid(format!("{NAME}: must be a positive number of milliseconds"))
        })?;
    Ok(Some(Duration::from_millis(ms)))
}

/// The session id from the first of `names` the request carries.
pub fn session_header(
    headers: &http::HeaderMap,
    names: &[http::HeaderName],
) -> Result<Option<String>, ApiError> {
    let Some((name, value)) = names
        .iter()
        .find_map(|name| headers.get(name).map(|value| (name, value)))
    else {
        return Ok(None);
    };
    let text = value
        .to_str()
        .map_err(|_| ApiError::invalid(format!("{name}: must be visible ASCII")))?;
    if text.len() > MAX_SESSION_ID_BYTES {
        return Err(ApiError::invalid(format!(
            "{name}: longer than {MAX_SESSION_ID_BYTES} bytes"
        )));
    }
    Ok(Some(text.to_owned()).filter(|s| !s.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_session_header_present_wins() {
        let names: Vec<http::HeaderName> = ringmaster_slots::routing::DEFAULT_SESSION_HEADERS
            .iter()
            .map(|h| http::HeaderName::from_static(h))
            .collect();
        let mut headers = http::HeaderMap::new();
        assert_eq!(session_header(&headers, &names).unwrap(), None);
        headers.insert("x-claude-code-session-id", "cc-1".parse().unwrap());
        assert_eq!(
            session_header(&headers, &names).unwrap().as_deref(),
            Some("cc-1")
        );
        headers.insert("x-session-id", "generic".parse().unwrap());
        assert_eq!(
            session_header(&headers, &names).unwrap().as_deref(),
            Some("generic")
        );
        headers.insert(
            "x-session-id",
            "a".repeat(MAX_SESSION_ID_BYTES + 1).parse().unwrap(),
        );
        let err = session_header(&headers, &names).unwrap_err();
        assert!(
            err.message().starts_with("x-session-id: longer than"),
            "{}",
            err.message()
        );
        // Only the configured names count.
        let only: Vec<http::HeaderName> = vec![http::HeaderName::from_static("x-team-session")];
        assert_eq!(session_header(&headers, &only).unwrap(), None);
    }
}
