//! Fake disaggregated servers on loopback, for the end-to-end tests of split requests: vLLM
//! with `NixlConnector` and SGLang, each as a prefill or a decode server. They check every
//! field of each leg, and the legs' order, as the engines' own sources define them, and keep
//! what they got and what they found wrong ([`PdLog`]):
//!
//! - vLLM NIXL prefill leg: vllm-project/vllm
//!   `tests/v1/kv_connector/nixl_integration/toy_proxy_server.py` (`send_request_to_service`:
//!   the `kv_transfer_params` asking for a remote decode, `stream` false, `max_tokens` 1 and
//!   `max_completion_tokens` 1 when present, no `stream_options`, no `min_tokens` or
//!   `min_completion_tokens`, an `X-Request-Id`); its answer's `kv_transfer_params` as
//!   `vllm/distributed/kv_transfer/kv_connector/v1/nixl/scheduler.py` (`request_finished`)
//!   returns them for a length-capped prefill;
//! - vLLM NIXL decode leg: the request as the client sent it, plus those parameters verbatim
//!   (the same `remote_request_id`, and `remote_engine_id`, `remote_host`, `remote_port`,
//!   which `update_state_after_alloc` requires), the same `X-Request-Id`, after the prefill
//!   answered;
//! - SGLang, both legs: `bootstrap_host`, `bootstrap_port` and `bootstrap_room` (in
//!   `[0, 2^63)`) of sgl-project/sglang `python/sglang/srt/entrypoints/openai/protocol.py`
//!   ("For PD disaggregation"), `routed_dp_rank` and `disagg_prefill_dp_rank`, the same body
//!   on both legs, and both legs in flight at once (each waits for the other's arrival, as the
//!   engines' bootstrap does).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// Which engine a fake server is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PdEngine {
    /// vLLM with `NixlConnector`.
    VllmNixl,
    /// SGLang, a prefill server's bootstrap on this port.
    Sglang {
        /// Its `--disaggregation-bootstrap-port` (what the legs must name).
        bootstrap_port: u16,
    },
}

/// Which leg it serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PdRole {
    /// The prompt.
    Prefill,
    /// The tokens.
    Decode,
}

/// A fault it answers with instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PdFault {
    /// None: it serves its leg.
    None,
    /// HTTP 503 to every generation request.
    Unavailable,
    /// A NIXL prefill that stopped before the length cap (an end of turn on its one token):
    /// no `kv_transfer_params` in its answer.
    NoParams,
    /// An SGLang prefill that meets its decode leg and then never answers; it notes when
    /// its connection is closed.
    Hold,
    /// A decode that streams one token, then holds its stream open until it is cut.
    HoldStream,
}

/// What the fake servers of one test share: what each leg got, and every violation found.
#[derive(Debug, Default)]
pub struct PdLog {
    /// Each leg: `(server, role, body, x-request-id)`, in order of arrival.
    pub legs: Vec<(String, PdRole, Value, Option<String>)>,
    /// What the engines' protocol forbids, as found.
    pub violations: Vec<String>,
    /// NIXL prefills answered: their `X-Request-Id` and the parameters they returned.
    pub prefilled: HashMap<String, Value>,
    /// SGLang legs seen per bootstrap room: `(prefill arrived, decode arrived)`.
    pub rooms: HashMap<u64, (bool, bool)>,
    /// Held legs whose connection the gateway closed.
    pub cancelled: Vec<String>,
}

/// A handle on a [`PdLog`] shared by several servers.
pub type SharedLog = Arc<Mutex<PdLog>>;

/// Prompt tokens every answer reports.
pub const PROMPT_TOKENS: u32 = 120;
/// Of those, the tokens a prefill server reports cached.
pub const PREFILL_CACHED: u32 = 48;

/// One running fake server; it stops when dropped.
#[derive(Debug)]
pub struct PdServer {
    /// Where it listens.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl PdServer {
    /// Starts a server of `engine` for `role` on 127.0.0.1, logging into `log`.
    pub async fn start(engine: PdEngine, role: PdRole, fault: PdFault, log: &SharedLog) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = Server {
            name: format!("{}:{}", role_name(role), addr.port()),
            engine,
            role,
            fault,
            log: log.clone(),
        };
        let task = tokio::spawn(async move {
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            while let Ok((stream, _)) = listener.accept().await {
                let server = server.clone();
                let builder = builder.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let server = server.clone();
                        async move { Ok::<_, Infallible>(server.answer(req).await) }
                    });
                    let _ = builder
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, task }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for PdServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn role_name(role: PdRole) -> &'static str {
    match role {
        PdRole::Prefill => "prefill",
        PdRole::Decode => "decode",
    }
}

/// What a NIXL prefill leg must carry in `kv_transfer_params`.
fn nixl_prefill_params() -> Value {
    json!({"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
           "remote_block_ids": null, "remote_host": null, "remote_port": null})
}

type Body = BoxBody<Bytes, std::io::Error>;

#[derive(Clone, Debug)]
struct Server {
    name: String,
    engine: PdEngine,
    role: PdRole,
    fault: PdFault,
    log: SharedLog,
}

impl Server {
    fn log(&self) -> std::sync::MutexGuard<'_, PdLog> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn violation(&self, what: String) {
        self.log().violations.push(format!("{}: {what}", self.name));
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<Body> {
        if req.method() == hyper::Method::GET {
            // `/v1/models`, `/health`: what the gateway asks of a server at start.
            return json_answer(
                StatusCode::OK,
                &json!({"object": "list", "data": [{"id": "fake", "object": "model",
                        "created": 0, "owned_by": "fake"}]}),
            );
        }
        let request_id = req
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let Ok(body) = req.into_body().collect().await.map(|b| b.to_bytes()) else {
            return json_answer(StatusCode::BAD_REQUEST, &json!({}));
        };
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        self.log().legs.push((
            self.name.clone(),
            self.role,
            body.clone(),
            request_id.clone(),
        ));
        if self.fault == PdFault::Unavailable {
            return json_answer(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({"error": {"message": "unavailable", "type": "server_error"}}),
            );
        }
        match (self.engine, self.role) {
            (PdEngine::VllmNixl, PdRole::Prefill) => self.nixl_prefill(&body, request_id),
            (PdEngine::VllmNixl, PdRole::Decode) => self.nixl_decode(&body, request_id),
            (PdEngine::Sglang { bootstrap_port }, role) => {
                self.sglang_leg(&body, bootstrap_port, role).await
            }
        }
    }

    fn nixl_prefill(&self, body: &Value, request_id: Option<String>) -> Response<Body> {
        if body["kv_transfer_params"] != nixl_prefill_params() {
            self.violation(format!(
                "kv_transfer_params {} is not a remote-decode request",
                body["kv_transfer_params"]
            ));
        }
        if body["stream"] != false {
            self.violation(format!("stream {} on a prefill", body["stream"]));
        }
        if body["max_tokens"] != 1 {
            self.violation(format!("max_tokens {} on a prefill", body["max_tokens"]));
        }
        if body
            .get("max_completion_tokens")
            .is_some_and(|v| *v != json!(1))
        {
            self.violation("max_completion_tokens is not 1 on a prefill".to_owned());
        }
        for field in ["stream_options", "min_tokens", "min_completion_tokens"] {
            if body.get(field).is_some() {
                self.violation(format!("{field} on a prefill"));
            }
        }
        let Some(request_id) = request_id.filter(|id| !id.is_empty()) else {
            self.violation("no X-Request-Id on a prefill".to_owned());
            return json_answer(StatusCode::BAD_REQUEST, &json!({}));
        };
        let params = json!({"do_remote_prefill": true, "do_remote_decode": false,
            "remote_block_ids": [1, 2, 3, 4, 5, 6, 7], "remote_engine_id": self.name,
            "remote_request_id": request_id, "remote_host": "127.0.0.1",
            "remote_port": 5600, "tp_size": 1});
        let mut answer = json!({"id": format!("cmpl-{request_id}"), "object": "chat.completion",
            "created": 0, "model": "fake",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "a"},
                         "finish_reason": "length"}],
            "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 1,
                      "total_tokens": PROMPT_TOKENS + 1,
                      "prompt_tokens_details": {"cached_tokens": PREFILL_CACHED}}});
        if self.fault == PdFault::NoParams {
            answer["choices"][0]["finish_reason"] = json!("stop");
        } else {
            answer["kv_transfer_params"] = params.clone();
            self.log().prefilled.insert(request_id, params);
        }
        json_answer(StatusCode::OK, &answer)
    }

    fn nixl_decode(&self, body: &Value, request_id: Option<String>) -> Response<Body> {
        if let Some(params) = body.get("kv_transfer_params") {
            let remote = params["remote_request_id"].as_str().unwrap_or_default();
            let prefilled = self.log().prefilled.get(remote).cloned();
            match prefilled {
                None => self.violation(format!(
                    "kv_transfer_params {params} name no prefill that answered before"
                )),
                Some(returned) if returned != *params => self.violation(format!(
                    "kv_transfer_params {params} are not the prefill's {returned}"
                )),
                Some(_) => {}
            }
            for field in [
                "remote_engine_id",
                "remote_request_id",
                "remote_host",
                "remote_port",
            ] {
                if params.get(field).is_none_or(Value::is_null) {
                    self.violation(format!("kv_transfer_params without {field}"));
                }
            }
            if request_id.as_deref() != Some(remote) {
                self.violation(format!(
                    "X-Request-Id {request_id:?} is not the prefill's {remote:?}"
                ));
            }
        }
        if body["max_tokens"] == 1 && body["stream"] == false {
            self.violation("the decode leg got the prefill's body".to_owned());
        }
        self.decode_answer(body)
    }

    async fn sglang_leg(&self, body: &Value, bootstrap_port: u16, role: PdRole) -> Response<Body> {
        if body["bootstrap_host"] != "127.0.0.1" {
            self.violation(format!("bootstrap_host {}", body["bootstrap_host"]));
        }
        if body["bootstrap_port"] != bootstrap_port {
            self.violation(format!(
                "bootstrap_port {} (the prefill's is {bootstrap_port})",
                body["bootstrap_port"]
            ));
        }
        // Noticed when the leg's handler or its body is dropped: the gateway closed it.
        let hold = (role == PdRole::Prefill && self.fault == PdFault::Hold).then(|| CancelGuard {
            log: self.log.clone(),
            name: self.name.clone(),
        });
        let room = body["bootstrap_room"].as_u64();
        let Some(room) = room.filter(|r| *r < 1 << 63) else {
            self.violation(format!("bootstrap_room {}", body["bootstrap_room"]));
            return json_answer(StatusCode::BAD_REQUEST, &json!({}));
        };
        {
            let mut log = self.log();
            let seen = log.rooms.entry(room).or_default();
            match role {
                PdRole::Prefill => seen.0 = true,
                PdRole::Decode => seen.1 = true,
            }
        }
        // As the engines' bootstrap: each leg waits for the other to arrive.
        let met = async {
            loop {
                let seen = self.log().rooms.get(&room).copied().unwrap_or_default();
                if seen.0 && seen.1 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(3), met)
            .await
            .is_err()
        {
            self.violation(format!(
                "the other leg of room {room} never came while this one waited"
            ));
            return json_answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                &json!({"error": {"message": "bootstrap timed out", "type": "server_error"}}),
            );
        }
        match role {
            PdRole::Decode => self.decode_answer(body),
            PdRole::Prefill if hold.is_some() => sse_answer(StreamBody::new(held(hold)).boxed()),
            PdRole::Prefill => json_answer(
                StatusCode::OK,
                &json!({"id": "sgl-prefill", "object": "chat.completion", "created": 0,
                        "model": "fake",
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "a"},
                                     "finish_reason": "length"}],
                        "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 1,
                                  "total_tokens": PROMPT_TOKENS + 1,
                                  "prompt_tokens_details": {"cached_tokens": PREFILL_CACHED}}}),
            ),
        }
    }

    /// A decode server's reply: three tokens, streamed or whole as asked, its usage counting
    /// the whole prompt as cached (it received it).
    fn decode_answer(&self, body: &Value) -> Response<Body> {
        let hold = (self.fault == PdFault::HoldStream).then(|| CancelGuard {
            log: self.log.clone(),
            name: self.name.clone(),
        });
        let usage = json!({"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 3,
                           "total_tokens": PROMPT_TOKENS + 3,
                           "prompt_tokens_details": {"cached_tokens": PROMPT_TOKENS}});
        if body["stream"] != true {
            return json_answer(
                StatusCode::OK,
                &json!({"id": "dec", "object": "chat.completion", "created": 0, "model": "fake",
                        "choices": [{"index": 0,
                                     "message": {"role": "assistant", "content": "one two three"},
                                     "finish_reason": "stop"}],
                        "usage": usage}),
            );
        }
        let chunk = |delta: Value, finish: Value, usage: Value| {
            let mut frame = b"data: ".to_vec();
            frame.extend_from_slice(
                json!({"id": "dec", "object": "chat.completion.chunk", "created": 0,
                       "model": "fake",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                       "usage": usage})
                .to_string()
                .as_bytes(),
            );
            frame.extend_from_slice(b"\n\n");
            Ok::<_, std::io::Error>(Frame::data(Bytes::from(frame)))
        };
        let mut frames = vec![chunk(
            json!({"role": "assistant", "content": "one "}),
            Value::Null,
            Value::Null,
        )];
        if hold.is_some() {
            let first = futures_util::stream::iter(frames);
            return sse_answer(
                StreamBody::new(futures_util::StreamExt::chain(first, held(hold))).boxed(),
            );
        }
        frames.push(chunk(json!({"content": "two "}), Value::Null, Value::Null));
        frames.push(chunk(
            json!({"content": "three"}),
            json!("stop"),
            Value::Null,
        ));
        frames.push(chunk(json!({}), Value::Null, usage));
        frames.push(Ok(Frame::data(Bytes::from_static(b"data: [DONE]\n\n"))));
        sse_answer(StreamBody::new(futures_util::stream::iter(frames)).boxed())
    }
}

/// A body that never ends, holding `guard` until it is dropped.
fn held(
    guard: Option<CancelGuard>,
) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, std::io::Error>> + Send {
    futures_util::stream::unfold(guard, |guard| async move {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(guard);
        None
    })
}

/// Notes in the log that a held leg's body was dropped (its connection closed).
struct CancelGuard {
    log: SharedLog,
    name: String,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .cancelled
            .push(self.name.clone());
    }
}

fn json_answer(status: StatusCode, value: &Value) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(value.to_string()))
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}

fn sse_answer(body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    response
}
