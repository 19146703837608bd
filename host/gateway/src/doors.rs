//! The HTTP side of the doors: what `POST /v1/messages`, `/v1/chat/completions` and
//! `/v1/completions` read from the request's headers and body before the call's phases
//! ([`crate::call`]), a streamed reply that starts early while it waits
//! ([`crate::reply::early`]), `POST /v1/messages/count_tokens`, and `GET /v1/streams/{id}`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::HeaderValue;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use ringmaster_api::{ApiError, Door};
use tracing::debug;

use crate::Gateway;
use crate::body::ResponseBody;
use crate::call::prepare::{resolve_model, unserved_in_process};
use crate::call::{Call, CallInput};
use crate::reply::early;
use crate::respond::{json_response, read_json_body};
use crate::routing::MAX_SESSION_ID_BYTES;

/// `POST /v1/messages`, `/v1/chat/completions` and `/v1/completions`.
pub(crate) async fn answer(
    gateway: &Arc<Gateway>,
    req: Request<Incoming>,
    door: Door,
    started: Instant,
    request_id: &str,
) -> Result<Response<ResponseBody>, ApiError> {
    let caller = crate::auth::authenticate(&gateway.auth, &gateway.metrics, req.headers())?;
    let session = session_header(req.headers(), &gateway.config.session_headers)?;
    let passed_headers = passed_headers(req.headers(), &gateway.config.policies.pass_headers);
    let queue_timeout = queue_timeout_header(req.headers())?;
    let trace_context = ringmaster_telemetry::trace_headers(req.headers());
    let body = read_json_body(gateway, req).await?;
    let input = CallInput {
        door,
        queue_timeout,
        trace_context,
        body,
        session,
        caller,
        passed_headers,
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
        crate::auth::authenticate_request(&gateway.auth, &gateway.metrics, req.headers()).await?;
    let body = read_json_body(gateway, req).await?;
    let fleet = gateway.pool.snapshot();
    let request = ringmaster_api::messages::parse_count_tokens(&body, gateway.limits(&fleet))?;
    caller
        .may_use(&request.model)
        .map_err(crate::auth::refused)?;
    let (_, pool) = resolve_model(&fleet, &request.model)?;
    let scheme = pool.servers.iter().find_map(|s| s.cache_scheme());
    // Only Ringmaster's own engines report a tokenizer, and they serve neither tools nor
    // images: a count of a prompt they would refuse would only mislead.
    if scheme.is_some()
        && let Some(refusal) = unserved_in_process(&request)
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
    let caller = crate::auth::authenticate(&gateway.auth, &gateway.metrics, req.headers())?;
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
        .resume(id, &caller.key_label, last)
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
        let names: Vec<http::HeaderName> = crate::routing::DEFAULT_SESSION_HEADERS
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
