//! The HTTP front: accepting connections on the public listener and the admin API's own
//! ([`Listener`]), each over TLS when configured (`ringmaster_tls`: the handshake first, with
//! the certificate current then), dispatching paths to their handlers (the doors are
//! [`crate::doors`]), and stamping every response.
//!
//! Every response, success or error, carries a `request-id` header, and every log line of a
//! request carries the same id through a `tracing` span. Errors are built as [`ApiError`]s and
//! turned into their door's JSON in one place ([`crate::respond::error_response`]). A streamed
//! reply is a body hyper polls in the connection's task; if the client goes away (or takes
//! nothing for `client_send_timeout_ms`, [`ringmaster_serve::send_timeout`]), hyper drops it, and with it
//! the engine's stream, which cancels the generation and frees its KV blocks.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;
use tokio::net::TcpListener;
use tracing::{Instrument, debug, info, info_span, warn};

use ringmaster_api::{ApiError, Door, ErrorKind};
use ringmaster_wire::models::{Model, ModelList};

use crate::body::{ResponseBody, full};
use crate::metrics::ResponseLabels;
use crate::respond::{error_response, json_response, refuse_unread};
use crate::state::Gateway;

/// Which of the gateway's listeners a connection came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// The public one (`listen`, with `[tls]`): the doors, health and metrics, and the admin
    /// API unless it has a listener of its own.
    Public,
    /// The admin API's own (`[admin] listen`): the admin API, `/ui`, health and metrics.
    Admin,
}

/// Serves the gateway on `listener` until `shutdown` resolves, then gives in-flight requests
/// the configured grace period. With `[tls]`, every connection's TLS handshake comes first
/// (within the head's read timeout), with the certificate current at that moment.
pub async fn serve(
    gateway: Arc<Gateway>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let background = crate::background::Serving::start(&gateway);
    serve_on(gateway, listener, Listener::Public, shutdown).await;
    drop(background);
    Ok(())
}

/// Serves the admin API's own listener (`[admin] listen`) until `shutdown` resolves.
pub async fn serve_admin(
    gateway: Arc<Gateway>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_on(gateway, listener, Listener::Admin, shutdown).await;
    Ok(())
}

async fn serve_on(
    gateway: Arc<Gateway>,
    listener: TcpListener,
    kind: Listener,
    shutdown: impl Future<Output = ()>,
) {
    let (tls, name) = match kind {
        Listener::Public => (gateway.tls.clone(), "gateway"),
        Listener::Admin => (gateway.admin_tls.clone(), "admin"),
    };
    let front = ringmaster_serve::http::Front::new(
        gateway.config.client,
        gateway.config.client_send_timeout,
        gateway.connections.clone(),
        ringmaster_serve::http::FrontCounters {
            slow_clients: gateway.metrics.slow_client_disconnects.clone(),
            tls_failures: gateway.metrics.tls_handshake_failures.clone(),
        },
        tls,
    );
    let graceful = ringmaster_serve::accept_until(listener, shutdown, |stream, peer, graceful| {
        let Some(slot) = gateway.connections.try_open() else {
            debug!(%peer, open = gateway.connections.open(), "connection.refused");
            gateway.connections.refuse(stream);
            return None;
        };
        let served = gateway.clone();
        let connection =
            front
                .clone()
                .serve(stream, peer, graceful.watcher(), move |req, in_flight| {
                    handle(served.clone(), req, (peer, kind), in_flight)
                });
        Some(async move {
            let _slot = slot;
            connection.await;
        })
    })
    .await;
    if kind == Listener::Public {
        gateway.stopping.cancel();
    }
    ringmaster_serve::drain(graceful, gateway.config.shutdown_grace, name).await;
}

/// The address of the client a request came from, in the request's extensions (the admin
/// API's audit trail names it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// Handles one request: routes by path, turns errors into responses, stamps the request id.
async fn handle(
    gateway: Arc<Gateway>,
    mut req: Request<Incoming>,
    (peer, listener): (SocketAddr, Listener),
    in_flight: ringmaster_serve::conn::InFlight,
) -> Response<ResponseBody> {
    req.extensions_mut().insert(PeerAddr(peer));
    let request_id = format!("req_{}", uuid::Uuid::new_v4().simple());
    // With traces on, the span is an OpenTelemetry server span continuing the client's
    // `traceparent`; with them off it is only the log lines' request id.
    let traced = ringmaster_telemetry::enabled()
        && ringmaster_telemetry::head_sampled(req.headers(), &request_id);
    let span = if traced {
        // `otel.kind` marks the spans the exporter takes; an unsampled request's span is the
        // plain one below and costs what it costs with traces off.
        let span = info_span!(
            "request",
            request_id = %request_id,
            otel.kind = "server",
        );
        ringmaster_telemetry::continue_trace(&span, req.headers());
        span
    } else {
        info_span!("request", request_id = %request_id)
    };
    async move {
        let started = Instant::now();
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let door = Door::at(&path);
        let route = door.map_or_else(|| path_label(&path), Door::label);
        // The doors (and token counting) are what an overloaded gateway sheds; health,
        // metrics and the admin API stay answered so an operator can see and act.
        let admitted = match door.is_some() || path == "/v1/messages/count_tokens" {
            true => gateway.overload.admit().map(Some),
            false => Ok(None),
        };
        let (pending, result) = match admitted {
            Ok(pending) => (
                pending,
                dispatch(&gateway, req, (door, listener), started, &request_id).await,
            ),
            // Shed on the head alone: the client hears it once it has sent its body.
            Err(shed) => (None, Err(refuse_unread(req, shed).await)),
        };
        if let Err(e) = &result
            && e.kind() == ErrorKind::RateLimit
            && let Some(delay) = gateway.config.rate_limit_delay
        {
            // A refused client waits for its retry anyway: holding the refusal a little
            // keeps a flooding client's connections from taking the core from everyone
            // else's requests (each connection sends its next request only after this answer).
            let hold = e.retry_after().map_or(delay, |after| after.min(delay));
            tokio::time::sleep(jittered(hold, &request_id)).await;
        }
        let error_type = result
            .as_ref()
            .err()
            .filter(|_| traced)
            .map(|e| e.kind().anthropic_type().to_owned());
        let mut response = result.unwrap_or_else(|e| {
            if e.kind() == ErrorKind::Api {
                warn!(error = %e, "request.internal_error");
            }
            gateway.recent_errors.push(ringmaster_telemetry::recent::RecentError {
                at_ms: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
                request_id: request_id.clone(),
                route,
                status: e.kind().status().as_u16(),
                kind: e.kind().anthropic_type(),
                message: e.message().to_owned(),
            });
            // A stored response's routes answer in the Responses API's shape, every other
            // path that is no door in Anthropic's.
            let shape = door.unwrap_or(if path.starts_with("/v1/responses/") {
                Door::Responses
            } else {
                Door::Messages
            });
            error_response(shape, &e)
        });
        response.headers_mut().insert(
            &crate::respond::header_names::REQUEST_ID,
            HeaderValue::from_str(&request_id).expect("request ids are ASCII"),
        );
        let status = response.status().as_u16();
        if traced {
            // The request's span stays open while a streamed reply runs.
            ringmaster_telemetry::describe_response(
                &tracing::Span::current(),
                method.as_str(),
                route,
                status,
                error_type.as_deref(),
            );
        }
        gateway
            .metrics
            .responses
            .get_or_create(&ResponseLabels { route, status })
            .inc();
        if gateway.config.access_log {
            info!(%method, path, status, %peer, elapsed_ms = started.elapsed().as_millis() as u64, "request.done");
        } else {
            debug!(%method, path, status, %peer, elapsed_ms = started.elapsed().as_millis() as u64, "request.done");
        }
        crate::body::hold_until_sent(response, (in_flight, pending))
    }
    .instrument(span)
    .await
}

/// `hold` shortened by up to half, by the request's own (random) id: a flood's connections,
/// refused together, come back spread over the second half of the hold instead of all at once,
/// so their next refusals do not arrive as one burst in front of other keys' requests.
fn jittered(hold: Duration, request_id: &str) -> Duration {
    let id = request_id.trim_start_matches("req_");
    let spread = id
        .get(..4)
        .and_then(|hex| u16::from_str_radix(hex, 16).ok())
        .map_or(0.0, |n| f64::from(n) / f64::from(u16::MAX));
    hold.mul_f64(1.0 - spread / 2.0)
}

/// The metric label of a path that is no door.
fn path_label(path: &str) -> &'static str {
    match path {
        "/v1/messages/count_tokens" => "count_tokens",
        p if p.starts_with("/v1/streams/") => "streams",
        p if p.starts_with("/v1/responses/") => "stored_responses",
        p if p.starts_with("/v1/models") => "models",
        "/healthz" | "/readyz" => "health",
        "/metrics" => "metrics",
        p if p.starts_with("/admin/") => "admin",
        p if p == "/ui" || p.starts_with("/ui/") => "ui",
        _ => "other",
    }
}

async fn dispatch(
    gateway: &Arc<Gateway>,
    req: Request<Incoming>,
    (door, listener): (Option<Door>, Listener),
    started: Instant,
    request_id: &str,
) -> Result<Response<ResponseBody>, ApiError> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let admin_path = path.starts_with("/admin/") || path == "/ui" || path.starts_with("/ui/");
    let operator_path = matches!(path.as_str(), "/healthz" | "/readyz" | "/metrics");
    match listener {
        Listener::Public if admin_path && gateway.config.admin_listener.is_some() => {
            let wrong = ApiError::not_found(
                "the admin API is served on its own listener ([admin] listen), not this one",
            );
            return Err(refuse_unread(req, wrong).await);
        }
        Listener::Admin if !admin_path && !operator_path => {
            let wrong = ApiError::not_found(format!(
                "this listener serves the admin API only; {path} is on the public one"
            ));
            return Err(refuse_unread(req, wrong).await);
        }
        _ => {}
    }
    let allow = |allowed: &[Method]| -> Result<(), ApiError> {
        if allowed.contains(&method) {
            Ok(())
        } else {
            Err(ApiError::new(
                ErrorKind::MethodNotAllowed,
                format!("method {method} is not allowed on {path}"),
            ))
        }
    };
    if let Some(door) = door {
        allow(&[Method::POST])?;
        return crate::doors::answer(gateway, req, door, started, request_id).await;
    }
    match path.as_str() {
        "/v1/messages/count_tokens" => {
            allow(&[Method::POST])?;
            crate::doors::count_tokens(gateway, req).await
        }
        p if p.starts_with("/v1/streams/") => {
            allow(&[Method::GET])?;
            crate::doors::resume_stream(gateway, &req, &p["/v1/streams/".len()..])
        }
        p if p.starts_with("/v1/responses/") => {
            let rest = p["/v1/responses/".len()..].to_owned();
            crate::doors::stored_response(gateway, req, &rest).await
        }
        "/v1/models" => {
            allow(&[Method::GET])?;
            crate::auth::authenticate_request(
                &gateway.keys.current(),
                &gateway.metrics,
                req.headers(),
            )
            .await?;
            Ok(crate::call::json_body(models_json(gateway)))
        }
        p if p.starts_with("/v1/models/") => {
            allow(&[Method::GET])?;
            crate::auth::authenticate_request(
                &gateway.keys.current(),
                &gateway.metrics,
                req.headers(),
            )
            .await?;
            let id = &p["/v1/models/".len()..];
            let snapshot = gateway.pool.snapshot();
            if snapshot.accepted.iter().any(|m| m == id) {
                let mut model = Model::new(id, OWNER);
                model.parent = snapshot.adapters.get(id).map(|p| p.as_str().into());
                Ok(json_response(StatusCode::OK, &model))
            } else {
                Err(ApiError::not_found(format!(
                    "model: {id:?} is not served here"
                )))
            }
        }
        "/healthz" => {
            allow(&[Method::GET, Method::HEAD])?;
            Ok(json_response(StatusCode::OK, &json!({"status": "ok"})))
        }
        "/readyz" => {
            allow(&[Method::GET, Method::HEAD])?;
            // Ready means a request could be served now: a server in the pool that is not
            // draining, reachable and not ejected, not merely listed.
            let snapshot = gateway.pool.snapshot();
            let servers = snapshot.servers.len();
            let routable = snapshot.servers.iter().filter(|s| s.is_routable()).count();
            if servers == 0 {
                Err(ApiError::new(
                    ErrorKind::Unavailable,
                    "no GPU servers in the pool",
                ))
            } else if routable == 0 {
                Err(ApiError::new(
                    ErrorKind::Unavailable,
                    format!("none of the {servers} GPU servers is reachable"),
                ))
            } else {
                Ok(json_response(
                    StatusCode::OK,
                    &json!({"status": "ready", "servers": servers, "routable": routable}),
                ))
            }
        }
        "/metrics" => {
            allow(&[Method::GET])?;
            let mut response = Response::new(full(gateway.metrics.encode()));
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            Ok(response)
        }
        // The status page's static files: served by the admin API's crate, its data behind
        // the admin token like every other admin call.
        p if p.starts_with("/admin/") || p == "/ui" || p.starts_with("/ui/") => {
            match gateway.admin_routes() {
                Some(admin) => admin.handle(gateway, req).await,
                None => Err(ApiError::not_found(
                    "the admin API is not mounted in this gateway",
                )),
            }
        }
        _ => {
            let nowhere = ApiError::not_found(format!("no route for {method} {path}"));
            Err(refuse_unread(req, nowhere).await)
        }
    }
}

/// Who owns the models this gateway lists (OpenAI's `owned_by`).
const OWNER: &str = "ringmaster";

fn models_json(gateway: &Gateway) -> Vec<u8> {
    let snapshot = gateway.pool.snapshot();
    let mut list = ModelList::new(&snapshot.accepted, OWNER);
    // An adapter is listed as vLLM lists it: with its base model as `parent`.
    for model in &mut list.data {
        model.parent = snapshot.adapters.get(&*model.id).map(|p| p.as_str().into());
    }
    serde_json::to_vec(&list).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_refusal_waits_between_half_and_all_of_the_hold() {
        let hold = Duration::from_millis(200);
        assert_eq!(jittered(hold, "req_0000aaaa"), hold);
        assert_eq!(jittered(hold, "req_ffffaaaa"), Duration::from_millis(100));
        let spread: std::collections::BTreeSet<Duration> = (0..64)
            .map(|_| jittered(hold, &format!("req_{}", uuid::Uuid::new_v4().simple())))
            .collect();
        assert!(spread.iter().all(|d| *d >= hold / 2 && *d <= hold));
        assert!(spread.len() > 32, "ids spread the holds");
    }
}
