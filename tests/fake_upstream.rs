//! A fake OpenAI-compatible server on loopback, for the end-to-end tests and the overhead
//! benchmark: it answers at once, in the stream shape of a chosen real server, or with a
//! chosen fault. It also answers Anthropic's `/v1/messages` (for a proxy that passes requests
//! through unchanged, like HAProxy in the benchmark) and counts the connections it accepted,
//! so a test can tell whether a client reuses them.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// How the fake server answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behavior {
    /// vLLM with `continuous_usage_stats`: usage in every chunk, then a usage chunk, `[DONE]`.
    Vllm,
    /// OpenAI's `include_usage`: no usage in the chunks, a usage chunk of its own, `[DONE]`.
    OpenAi,
    /// TGI and llama.cpp's server: usage (and llama.cpp's `timings`) in the finishing chunk.
    UsageInFinish,
    /// Ollama without `stream_options`: no usage at all, `[DONE]`.
    NoUsage,
    /// A stream that ends with the body (EOF), without `[DONE]`.
    EofOnly,
    /// A whole JSON answer where a stream was asked.
    Whole,
    /// `finish_reason: "tool_calls"`.
    ToolCalls,
    /// vLLM's stream, after 600 ms without a byte (a long prefill behind a queue).
    SlowStart,
    /// No text: a call of the first tool the request offers (`get_weather` if none), its
    /// arguments `{"city": "Paris"}` in three pieces, as vLLM streams calls (or whole).
    CallsTool,
    /// HTTP 500 with an OpenAI error body.
    Status500,
    /// HTTP 429.
    Status429,
    /// Accepts the connection, reads the request, never answers.
    Hang,
    /// A stream of malformed JSON.
    Garbage,
    /// One token, then the connection is cut.
    CloseAfterToken,
    /// The headers, then the connection is cut before any event.
    CloseBeforeFirst,
    /// One token, then an error object in the stream.
    ErrorMidStream,
    /// A `data:` line that never ends.
    EndlessLine,
}

/// A running fake server; it stops when dropped.
#[derive(Debug)]
pub struct FakeUpstream {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Connections accepted so far.
    pub connections: Arc<AtomicUsize>,
    /// Requests answered so far (chat, completions and messages).
    pub requests: Arc<AtomicUsize>,
    /// The body of the last request (chat, completions and messages).
    pub last_request: Arc<std::sync::Mutex<Bytes>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeUpstream {
    /// Starts a server on 127.0.0.1 (port 0) that answers with `behavior`, streaming `tokens`
    /// text chunks.
    pub async fn start(behavior: Behavior, tokens: usize) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serve(listener, behavior, tokens)
    }

    /// Serves `listener` with `behavior`.
    pub fn serve(listener: TcpListener, behavior: Behavior, tokens: usize) -> Self {
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let last_request = Arc::new(std::sync::Mutex::new(Bytes::new()));
        let (conns, reqs, last) = (connections.clone(), requests.clone(), last_request.clone());
        let task = tokio::spawn(async move {
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            while let Ok((stream, _)) = listener.accept().await {
                conns.fetch_add(1, Ordering::Relaxed);
                let _ = stream.set_nodelay(true);
                let (reqs, conns, last) = (reqs.clone(), conns.clone(), last.clone());
                let builder = builder.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let (reqs, conns, last) = (reqs.clone(), conns.clone(), last.clone());
                        async move {
                            let counts = Counts {
                                requests: &reqs,
                                connections: &conns,
                                last_request: &last,
                            };
                            Ok::<_, Infallible>(answer(req, behavior, tokens, counts).await)
                        }
                    });
                    let _ = builder
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            connections,
            requests,
            last_request,
            task,
        }
    }

    /// The last request's body as JSON (`null` before any).
    pub fn last_request_json(&self) -> serde_json::Value {
        let body = self
            .last_request
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = BoxBody<Bytes, std::io::Error>;

fn full(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(
        Full::new(body.into())
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert("content-type", content_type.parse().unwrap());
    response
}

fn sse(frames: Vec<Result<Bytes, std::io::Error>>) -> Response<Body> {
    // A cut waits a moment, so that what came before it is on the wire first (hyper drops
    // what it has buffered when a body fails).
    let frames = futures_util::StreamExt::then(stream::iter(frames), |frame| async move {
        if frame.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        frame.map(Frame::data)
    });
    let body = StreamBody::new(frames);
    let mut response = Response::new(BodyExt::boxed(body));
    response
        .headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    response
}

fn data(json: &str) -> Result<Bytes, std::io::Error> {
    Ok(Bytes::from(format!("data: {json}\n\n")))
}

fn cut() -> Result<Bytes, std::io::Error> {
    Err(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "cut by the fake server",
    ))
}

const DONE: &str = "[DONE]";

/// What the server counts and keeps of its requests.
struct Counts<'a> {
    requests: &'a AtomicUsize,
    connections: &'a AtomicUsize,
    last_request: &'a std::sync::Mutex<Bytes>,
}

async fn answer(
    req: Request<Incoming>,
    behavior: Behavior,
    tokens: usize,
    counts: Counts<'_>,
) -> Response<Body> {
    let Counts {
        requests,
        connections,
        last_request,
    } = counts;
    let path = req.uri().path().to_owned();
    if req.method() == hyper::Method::GET {
        return match path.as_str() {
            // For the benchmark: connections accepted and requests answered so far.
            "/stats" => full(
                StatusCode::OK,
                "application/json",
                format!(
                    r#"{{"connections":{},"requests":{}}}"#,
                    connections.load(Ordering::Relaxed),
                    requests.load(Ordering::Relaxed)
                ),
            ),
            // A `ringmaster worker`'s own endpoints: an ordinary OpenAI server has none.
            "/load" | "/tokenizer" | "/kv/events" => full(
                StatusCode::NOT_FOUND,
                "application/json",
                r#"{"error":"not found"}"#,
            ),
            // `/health`, `/v1/models`, and what the peer routers ask of a worker at start
            // (`/get_model_info`, `/get_server_info`): one answer that satisfies each.
            _ => full(
                StatusCode::OK,
                "application/json",
                r#"{"object":"list","data":[{"id":"fake","object":"model","owned_by":"fake"}],"model_path":"fake","tokenizer_path":"fake","is_generation":true}"#,
            ),
        };
    }
    let body = req.into_body().collect().await.map(|b| b.to_bytes());
    let Ok(body) = body else {
        return full(StatusCode::BAD_REQUEST, "application/json", "{}");
    };
    requests.fetch_add(1, Ordering::Relaxed);
    *last_request
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = body.clone();
    let streamed = memfind(&body, b"\"stream\":true");
    if path == "/v1/messages" {
        return messages(streamed, tokens);
    }
    let completions = path == "/v1/completions";
    let choice = |content: &str, finish: Option<&str>| {
        let finish = finish.map_or("null".to_owned(), |f| format!("\"{f}\""));
        if completions {
            format!(r#"{{"index":0,"text":"{content}","finish_reason":{finish}}}"#)
        } else {
            format!(r#"{{"index":0,"delta":{{"content":"{content}"}},"finish_reason":{finish}}}"#)
        }
    };
    let chunk = |content: &str, finish: Option<&str>, usage: Option<usize>| {
        let usage = usage.map_or("null".to_owned(), |n| {
            format!(
                r#"{{"prompt_tokens":12,"completion_tokens":{n},"prompt_tokens_details":{{"cached_tokens":4}}}}"#
            )
        });
        format!(
            r#"{{"id":"chatcmpl-fake","object":"chat.completion.chunk","created":0,"model":"fake","choices":[{}],"usage":{usage}}}"#,
            choice(content, finish)
        )
    };
    let usage_chunk = format!(
        r#"{{"id":"chatcmpl-fake","object":"chat.completion.chunk","choices":[],"usage":{{"prompt_tokens":12,"completion_tokens":{tokens},"prompt_tokens_details":{{"cached_tokens":4}}}}}}"#
    );
    // A request that does not ask for a stream gets one JSON answer, as real servers do.
    if !streamed {
        match behavior {
            Behavior::Vllm
            | Behavior::UsageInFinish
            | Behavior::EofOnly
            | Behavior::Whole
            | Behavior::SlowStart => {
                return whole(completions, tokens, "stop", true);
            }
            Behavior::OpenAi => return whole(completions, tokens, "length", true),
            Behavior::ToolCalls => return whole(completions, tokens, "tool_calls", true),
            Behavior::CallsTool => return whole_tool_call(&body),
            Behavior::NoUsage => return whole(completions, tokens, "stop", false),
            _ => {}
        }
    }
    let mut frames = Vec::new();
    let body_tokens = |frames: &mut Vec<_>, usage: bool| {
        for i in 0..tokens {
            let mut frame = chunk("tok ", None, usage.then_some(i + 1));
            if i == 0 {
                // As TGI and llama.cpp's server do: the role comes with the first text.
                frame = frame.replacen(r#""delta":{"#, r#""delta":{"role":"assistant","#, 1);
            }
            frames.push(data(&frame));
        }
    };
    match behavior {
        Behavior::Vllm | Behavior::SlowStart => {
            if behavior == Behavior::SlowStart {
                tokio::time::sleep(Duration::from_millis(600)).await;
            }
            body_tokens(&mut frames, true);
            frames.push(data(&chunk("", Some("stop"), Some(tokens))));
            frames.push(data(&usage_chunk));
            frames.push(data(DONE));
        }
        Behavior::OpenAi => {
            body_tokens(&mut frames, false);
            frames.push(data(&chunk("", Some("length"), None)));
            frames.push(data(&usage_chunk));
            frames.push(data(DONE));
        }
        Behavior::UsageInFinish => {
            body_tokens(&mut frames, false);
            frames.push(data(&format!(
                r#"{{"id":"chatcmpl-fake","object":"chat.completion.chunk","model":"fake","choices":[{}],"usage":{{"prompt_tokens":12,"completion_tokens":{tokens}}},"timings":{{"cache_n":4}}}}"#,
                choice("", Some("stop"))
            )));
            frames.push(data(DONE));
        }
        Behavior::NoUsage => {
            body_tokens(&mut frames, false);
            frames.push(data(&chunk("", Some("stop"), None)));
            frames.push(data(DONE));
        }
        Behavior::EofOnly => {
            body_tokens(&mut frames, false);
            frames.push(data(&chunk("", Some("stop"), None)));
        }
        Behavior::ToolCalls => {
            body_tokens(&mut frames, false);
            frames.push(data(&chunk("", Some("tool_calls"), None)));
            frames.push(data(DONE));
        }
        Behavior::CallsTool => {
            let name = offered_tool(&body);
            let piece = |call: &str| {
                format!(
                    r#"{{"id":"chatcmpl-fake","object":"chat.completion.chunk","model":"fake","choices":[{{"index":0,"delta":{{"tool_calls":[{call}]}},"finish_reason":null}}]}}"#
                )
            };
            frames.push(data(
                r#"{"id":"chatcmpl-fake","object":"chat.completion.chunk","model":"fake","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
            ));
            frames.push(data(&piece(&format!(
                r#"{{"index":0,"id":"call_fake_1","type":"function","function":{{"name":"{name}","arguments":""}}}}"#
            ))));
            frames.push(data(&piece(
                r#"{"index":0,"function":{"arguments":"{\"city\": "}}"#,
            )));
            frames.push(data(&piece(
                r#"{"index":0,"function":{"arguments":"\"Paris\"}"}}"#,
            )));
            frames.push(data(&chunk("", Some("tool_calls"), None)));
            frames.push(data(
                r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":4}}}"#,
            ));
            frames.push(data(DONE));
        }
        Behavior::Whole => return whole(completions, tokens, "stop", true),
        Behavior::Status500 => {
            return full(
                StatusCode::INTERNAL_SERVER_ERROR,
                "application/json",
                r#"{"error":{"message":"the fake server fails","type":"server_error"}}"#,
            );
        }
        Behavior::Status429 => {
            return full(
                StatusCode::TOO_MANY_REQUESTS,
                "application/json",
                r#"{"error":{"message":"slow down","type":"rate_limit"}}"#,
            );
        }
        Behavior::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Behavior::Garbage => {
            frames.push(Ok(Bytes::from_static(
                b"data: {\"choices\": [{\"delta\": nope\n\n",
            )));
            frames.push(data(DONE));
        }
        Behavior::CloseAfterToken => {
            frames.push(data(&chunk("tok ", None, None)));
            frames.push(cut());
        }
        Behavior::CloseBeforeFirst => {
            frames.push(cut());
        }
        Behavior::ErrorMidStream => {
            frames.push(data(&chunk("tok ", None, None)));
            frames.push(data(
                r#"{"error":{"message":"the fake server ran out of memory","type":"server_error"}}"#,
            ));
            frames.push(data(DONE));
        }
        Behavior::EndlessLine => {
            let line = futures_util::StreamExt::chain(
                stream::once(async { Ok(Frame::data(Bytes::from_static(b"data: "))) }),
                stream::repeat_with(|| Ok(Frame::data(Bytes::from(vec![b'x'; 64 * 1024])))),
            );
            let mut response = Response::new(BodyExt::boxed(StreamBody::new(line)));
            response
                .headers_mut()
                .insert("content-type", "text/event-stream".parse().unwrap());
            return response;
        }
    }
    sse(frames)
}

/// A whole OpenAI answer with `tokens` text tokens.
fn whole(completions: bool, tokens: usize, finish: &str, with_usage: bool) -> Response<Body> {
    let text = "tok ".repeat(tokens);
    let content = if completions {
        format!(r#"{{"index":0,"text":"{text}","finish_reason":"{finish}"}}"#)
    } else {
        format!(
            r#"{{"index":0,"message":{{"role":"assistant","content":"{text}"}},"finish_reason":"{finish}"}}"#
        )
    };
    let usage = if with_usage {
        format!(
            r#","usage":{{"prompt_tokens":12,"completion_tokens":{tokens},"prompt_tokens_details":{{"cached_tokens":4}}}}"#
        )
    } else {
        String::new()
    };
    full(
        StatusCode::OK,
        "application/json",
        format!(r#"{{"id":"x","object":"chat.completion","choices":[{content}]{usage}}}"#),
    )
}

/// The name of the first tool a request offers (`get_weather` if none).
fn offered_tool(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|b| {
            b.pointer("/tools/0/function/name")
                .and_then(|n| n.as_str())
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "get_weather".to_owned())
}

/// A whole answer that calls the first tool offered.
fn whole_tool_call(body: &[u8]) -> Response<Body> {
    let name = offered_tool(body);
    full(
        StatusCode::OK,
        "application/json",
        format!(
            r#"{{"id":"x","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":null,"tool_calls":[{{"id":"call_fake_1","type":"function","function":{{"name":"{name}","arguments":"{{\"city\": \"Paris\"}}"}}}}]}},"finish_reason":"tool_calls"}}],"usage":{{"prompt_tokens":12,"completion_tokens":9,"prompt_tokens_details":{{"cached_tokens":4}}}}}}"#
        ),
    )
}

/// An Anthropic Messages answer (for a pass-through proxy), plain or streamed.
fn messages(streamed: bool, tokens: usize) -> Response<Body> {
    if !streamed {
        let text = "tok ".repeat(tokens);
        return full(
            StatusCode::OK,
            "application/json",
            format!(
                r#"{{"id":"msg_fake","type":"message","role":"assistant","model":"fake","content":[{{"type":"text","text":"{text}"}}],"stop_reason":"end_turn","stop_sequence":null,"usage":{{"input_tokens":12,"output_tokens":{tokens}}}}}"#
            ),
        );
    }
    let mut frames = vec![
        Ok(Bytes::from_static(
            b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_fake\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"fake\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\n",
        )),
        Ok(Bytes::from_static(
            b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        )),
    ];
    for _ in 0..tokens {
        frames.push(Ok(Bytes::from_static(
            b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"tok \"}}\n\n",
        )));
    }
    frames.push(Ok(Bytes::from(format!(
        "event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":0}}\n\nevent: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\",\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":{tokens}}}}}\n\nevent: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"
    ))));
    sse(frames)
}

fn memfind(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
