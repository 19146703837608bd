//! [`UpstreamRequest`]: a request as a server gets it, encoded once from the engines' request
//! into OpenAI's wire shape (`ringmaster_wire::openai::Request`), borrowing every string; a
//! retry on another server sends the same bytes.

use ringmaster_gpu_runtime::{GenerateRequest, ToolChoice};
use ringmaster_wire::openai;

use super::ReplyMode;

/// Which OpenAI endpoint a request goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions` (a raw prompt).
    Completions,
}

/// A request as a server gets it, encoded once: every attempt (a retry on another server of
/// the same pool) sends these bytes again.
#[derive(Clone, Debug)]
pub struct UpstreamRequest {
    pub(super) endpoint: Endpoint,
    pub(super) body: bytes::Bytes,
    pub(super) mode: ReplyMode,
    pub(super) request_id: String,
    /// `traceparent` (and `tracestate`) for this attempt: the gateway's span, or the client's
    /// own context passed on.
    pub(super) trace_context: Vec<(http::HeaderName, http::HeaderValue)>,
}

impl UpstreamRequest {
    /// `request` for servers that serve it as `model`, its reply asked for as `mode` says.
    pub fn encode(request: &GenerateRequest, model: &str, mode: ReplyMode) -> Self {
        let (endpoint, body) = wire_request(request, model, mode == ReplyMode::Whole);
        // The wire types serialize infallibly (strings, numbers, raw JSON text).
        let body = serde_json::to_vec(&body).unwrap_or_default();
        Self {
            endpoint,
            body: bytes::Bytes::from(body),
            mode,
            request_id: request.request_id.clone(),
            trace_context: Vec::new(),
        }
    }

    /// The trace context the next attempt sends (each attempt is its own span).
    pub fn set_trace_context(&mut self, headers: Vec<(http::HeaderName, http::HeaderValue)>) {
        self.trace_context = headers;
    }

    /// The encoded body.
    pub fn body(&self) -> &[u8] {
        &self.body
    }
}

/// A sampling value as the client wrote it (`0.7`, not `0.699999988079071`).
fn widen(value: f32) -> f64 {
    value.to_string().parse().unwrap_or(f64::from(value))
}

/// The server endpoint and OpenAI body for `request`, borrowing from it. A `whole` answer is
/// asked for without a stream.
pub(super) fn wire_request<'a>(
    request: &'a GenerateRequest,
    model: &'a str,
    whole: bool,
) -> (Endpoint, openai::Request<'a>) {
    let sampling = &request.sampling;
    let mut body = openai::Request {
        model: Some(model.into()),
        max_tokens: Some(i64::from(request.max_tokens)),
        stream: Some(!whole),
        stream_options: (!whole).then_some(openai::StreamOptions {
            include_usage: Some(true),
            continuous_usage_stats: Some(true),
            include_obfuscation: None,
        }),
        temperature: sampling.temperature.map(widen),
        top_p: sampling.top_p.map(widen),
        top_k: sampling.top_k.map(i64::from),
        seed: sampling.seed.and_then(|s| i64::try_from(s).ok()),
        stop: (!request.stop_sequences.is_empty())
            .then(|| openai::Stop::List(request.stop_sequences.iter().map(Into::into).collect())),
        // vLLM's and SGLang's extension (and `ringmaster worker`'s): run to `max_tokens`.
        ignore_eos: sampling.ignore_eos.then_some(true),
        // `ringmaster worker`'s scheduling priority (other servers ignore unknown fields).
        ringmaster_priority: Some(request.priority),
        ..openai::Request::default()
    };
    if let Some(offer) = &request.tools {
        body.tools = Some(
            offer
                .tools
                .iter()
                .map(|tool| openai::Tool {
                    kind: Some("function".into()),
                    function: Some(openai::Function {
                        name: Some(tool.name.as_str().into()),
                        description: tool.description.as_deref().map(Into::into),
                        parameters: Some(tool.parameters.as_ref()),
                    }),
                })
                .collect(),
        );
        body.tool_choice = Some(match &offer.choice {
            ToolChoice::Auto => openai::ToolChoice::Mode("auto".into()),
            ToolChoice::None => openai::ToolChoice::Mode("none".into()),
            ToolChoice::Required => openai::ToolChoice::Mode("required".into()),
            ToolChoice::Named(name) => openai::ToolChoice::named(name.as_str()),
        });
        body.parallel_tool_calls = offer.parallel;
    }
    if let Some(prompt) = &request.prompt {
        body.prompt = Some(openai::Prompt::Text(prompt.into()));
        return (Endpoint::Completions, body);
    }
    let mut messages = Vec::with_capacity(request.messages.len() + 1);
    if let Some(system) = &request.system {
        messages.push(openai::Message {
            role: "system".into(),
            content: Some(openai::Content::Text(system.into())),
            ..openai::Message::default()
        });
    }
    for m in &request.messages {
        let content = if m.images.is_empty() {
            openai::Content::Text(m.text.as_str().into())
        } else {
            let mut parts: Vec<openai::Part<'_>> = m
                .images
                .iter()
                .map(|image| openai::Part::image(image.url.as_str()))
                .collect();
            if !m.text.is_empty() {
                parts.push(openai::Part::text(m.text.as_str()));
            }
            openai::Content::List(parts)
        };
        messages.push(openai::Message {
            role: match (m.role, &m.tool_call_id) {
                (_, Some(_)) => "tool",
                (ringmaster_gpu_runtime::Role::User, None) => "user",
                (ringmaster_gpu_runtime::Role::Assistant, None) => "assistant",
            }
            .into(),
            content: Some(content),
            tool_calls: (!m.tool_calls.is_empty()).then(|| {
                m.tool_calls
                    .iter()
                    .map(|call| openai::ToolCall {
                        index: None,
                        id: Some(call.id.as_str().into()),
                        kind: Some("function".into()),
                        function: Some(openai::FunctionCall {
                            name: Some(call.name.as_str().into()),
                            arguments: Some(openai::Arguments::Text(
                                call.arguments.as_str().into(),
                            )),
                        }),
                    })
                    .collect()
            }),
            tool_call_id: m.tool_call_id.as_deref().map(Into::into),
            ..openai::Message::default()
        });
    }
    body.messages = Some(messages);
    (Endpoint::Chat, body)
}
