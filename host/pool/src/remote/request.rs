//! [`UpstreamRequest`]: a request as a server gets it, encoded once per kind of server (its
//! API, whether it reasons, whether it is a `ringmaster worker`) from the engines' request
//! into that API's wire shape, borrowing every string where the wire types allow; or the
//! client's own body, relayed to a server that speaks the client's API. A retry on a server of
//! the same kind sends the same bytes.
//!
//! Strict in what it sends: a server gets what the client asked for and what its own API
//! defines, nothing else (`ringmaster_priority` only to `ringmaster worker`s, a
//! `tool_choice` only when the client named one, a reasoning effort only to a reasoning
//! server).

use ringmaster_gpu_runtime::{
    Effort, GenerateRequest, OutputFormat, Role, ToolCall, ToolChoice, ToolOffer,
};
use ringmaster_wire::{Api, openai};
use serde_json::{Map, Value, json};

use super::ReplyMode;

/// Which endpoint a request goes to, and so how its reply reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions` (a raw prompt).
    Completions,
    /// `/v1/messages`.
    Messages,
    /// `/v1/responses`.
    Responses,
}

impl Endpoint {
    /// The endpoint of `api` (a chat server's chat endpoint).
    pub fn of(api: Api) -> Self {
        match api {
            Api::Chat => Self::Chat,
            Api::Messages => Self::Messages,
            Api::Responses => Self::Responses,
        }
    }

    /// The API its replies are in.
    pub fn api(self) -> Api {
        match self {
            Self::Chat | Self::Completions => Api::Chat,
            Self::Messages => Api::Messages,
            Self::Responses => Api::Responses,
        }
    }
}

/// The kind of server a request is encoded for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Target {
    /// Its API.
    pub api: Api,
    /// A reasoning model: it is told the effort.
    pub reasoning: bool,
    /// A `ringmaster worker`: it takes `ringmaster_priority`.
    pub ringmaster: bool,
    /// A server known to take vLLM's extensions (its `/metrics` are vLLM's, or it is a
    /// `ringmaster worker`): a stream's usage in every chunk (`continuous_usage_stats`).
    pub vllm: bool,
}

/// A request as a server gets it, encoded once: every attempt on a server of the same
/// [`Target`] sends these bytes again.
#[derive(Clone, Debug)]
pub struct UpstreamRequest {
    pub(super) endpoint: Endpoint,
    pub(super) body: bytes::Bytes,
    pub(super) mode: ReplyMode,
    pub(super) request_id: String,
    /// `traceparent` (and `tracestate`) for this attempt: the gateway's span, or the client's
    /// own context passed on.
    pub(super) trace_context: Vec<(http::HeaderName, http::HeaderValue)>,
    /// Headers of the client's passed on with a relayed body (`anthropic-version`,
    /// `anthropic-beta`).
    pub(super) headers: Vec<(http::HeaderName, http::HeaderValue)>,
}

impl UpstreamRequest {
    /// `request` for chat servers that serve it as `model`, its reply asked for as `mode` says.
    pub fn encode(request: &GenerateRequest, model: &str, mode: ReplyMode) -> Self {
        Self::encode_for(request, model, mode, Target::default())
    }

    /// `request` for servers of `target` that serve it as `model`.
    pub fn encode_for(
        request: &GenerateRequest,
        model: &str,
        mode: ReplyMode,
        target: Target,
    ) -> Self {
        let whole = mode.is_whole();
        let (endpoint, body) = match target.api {
            Api::Chat => {
                let (endpoint, body) = wire_request(request, model, whole, target);
                // The wire types serialize infallibly (strings, numbers, raw JSON text).
                (endpoint, serde_json::to_vec(&body).unwrap_or_default())
            }
            Api::Messages => (
                Endpoint::Messages,
                messages_request(request, model, whole, target),
            ),
            Api::Responses => (
                Endpoint::Responses,
                responses_request(request, model, whole, target),
            ),
        };
        Self {
            endpoint,
            body: bytes::Bytes::from(body),
            mode,
            request_id: request.request_id.clone(),
            trace_context: Vec::new(),
            headers: Vec::new(),
        }
    }

    /// The client's own `body` (already edited for the server: its model, its volatile
    /// lines) for `endpoint` of a server that speaks the client's API, with the client's
    /// `headers` that API defines.
    pub fn relayed(
        endpoint: Endpoint,
        body: bytes::Bytes,
        mode: ReplyMode,
        request_id: String,
        headers: Vec<(http::HeaderName, http::HeaderValue)>,
    ) -> Self {
        Self {
            endpoint,
            body,
            mode,
            request_id,
            trace_context: Vec::new(),
            headers,
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

    /// The endpoint it goes to.
    pub fn endpoint(&self) -> Endpoint {
        self.endpoint
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
    target: Target,
) -> (Endpoint, openai::Request<'a>) {
    let sampling = &request.sampling;
    let mut body = openai::Request {
        model: Some(model.into()),
        max_tokens: Some(i64::from(request.max_tokens)),
        stream: Some(!whole),
        stream_options: (!whole).then_some(openai::StreamOptions {
            include_usage: Some(true),
            // vLLM's extension: the cached-token count with the first token. Only for a
            // server known to take it: a strict one refuses a field OpenAI does not define.
            continuous_usage_stats: target.vllm.then_some(true),
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
        // `ringmaster worker`'s scheduling priority: no other server defines it, and a strict
        // one refuses it.
        ringmaster_priority: target.ringmaster.then_some(request.priority),
        reasoning_effort: request
            .effort
            .filter(|_| target.reasoning)
            .map(|effort| effort.as_openai().into()),
        response_format: request.output_format.as_deref().map(response_format),
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
        body.tool_choice = offer.choice.as_ref().map(|choice| match choice {
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
                (role, None) => role.as_str(),
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

/// Structured output as OpenAI's `response_format`.
fn response_format(format: &OutputFormat) -> Value {
    match format {
        OutputFormat::JsonObject => json!({"type": "json_object"}),
        OutputFormat::JsonSchema {
            name,
            schema,
            strict,
        } => {
            let mut spec = json!({"name": name, "schema": schema});
            if let Some(strict) = strict {
                spec["strict"] = (*strict).into();
            }
            json!({"type": "json_schema", "json_schema": spec})
        }
    }
}

/// A thinking budget for an effort (Anthropic's `thinking.budget_tokens`, at least 1,024),
/// under the request's `max_tokens`.
fn thinking_budget(effort: Effort, max_tokens: u32) -> Option<u32> {
    let budget: u32 = match effort {
        Effort::None => return None,
        Effort::Minimal | Effort::Low => 1_024,
        Effort::Medium => 4_096,
        Effort::High => 16_384,
        Effort::Max => 32_768,
    };
    (max_tokens > 1_024).then(|| budget.min(max_tokens - 1))
}

/// A tool call's arguments as a JSON value (`{}` when they are not JSON).
fn arguments(call: &ToolCall) -> Value {
    serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}))
}

/// An image URL as an Anthropic image source: a `data:` URL's bytes, else the URL.
fn image_source(url: &str) -> Value {
    match url
        .strip_prefix("data:")
        .and_then(|rest| rest.split_once(";base64,"))
    {
        Some((media_type, data)) => {
            json!({"type": "base64", "media_type": media_type, "data": data})
        }
        None => json!({"type": "url", "url": url}),
    }
}

/// The body of `request` for a Messages server (`/v1/messages`).
pub(super) fn messages_request(
    request: &GenerateRequest,
    model: &str,
    whole: bool,
    target: Target,
) -> Vec<u8> {
    let mut body = Map::new();
    body.insert("model".into(), model.into());
    body.insert("max_tokens".into(), request.max_tokens.into());
    body.insert("stream".into(), (!whole).into());
    let mut system = request.system.clone().unwrap_or_default();
    if let Some(prompt) = &request.prompt {
        // A raw prompt is one user turn here: no Messages server takes text without a chat.
        body.insert(
            "messages".into(),
            json!([{"role": "user", "content": prompt}]),
        );
    } else {
        body.insert(
            "messages".into(),
            Value::Array(messages_turns(&request.messages, &mut system)),
        );
    }
    if !system.is_empty() {
        body.insert("system".into(), system.into());
    }
    let sampling = &request.sampling;
    if let Some(t) = sampling.temperature {
        body.insert("temperature".into(), widen(t).into());
    }
    if let Some(p) = sampling.top_p {
        body.insert("top_p".into(), widen(p).into());
    }
    if let Some(k) = sampling.top_k {
        body.insert("top_k".into(), k.into());
    }
    if !request.stop_sequences.is_empty() {
        body.insert("stop_sequences".into(), json!(request.stop_sequences));
    }
    if let Some(offer) = &request.tools {
        messages_tools(offer, &mut body);
    }
    if target.reasoning
        && let Some(effort) = request.effort
    {
        let thinking = match thinking_budget(effort, request.max_tokens) {
            Some(budget) => json!({"type": "enabled", "budget_tokens": budget}),
            None => json!({"type": "disabled"}),
        };
        body.insert("thinking".into(), thinking);
    }
    if let Some(OutputFormat::JsonSchema { schema, .. }) = request.output_format.as_deref() {
        body.insert(
            "output_config".into(),
            json!({"format": {"type": "json_schema", "schema": schema}}),
        );
    }
    serde_json::to_vec(&body).unwrap_or_default()
}

/// The conversation as Messages turns: tool results (and the user's text after them) in one
/// user turn, an assistant's text and calls in one assistant turn; leading system messages
/// join `system`.
fn messages_turns(
    messages: &[ringmaster_gpu_runtime::ChatMessage],
    system: &mut String,
) -> Vec<Value> {
    let mut turns: Vec<Value> = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        if m.role == Role::System && i == 0 {
            if !system.is_empty() {
                system.push_str("\n\n");
            }
            system.push_str(&m.text);
            continue;
        }
        let mut blocks: Vec<Value> = Vec::new();
        let role = match (&m.tool_call_id, m.role) {
            (Some(id), _) => {
                let mut content: Vec<Value> = m
                    .images
                    .iter()
                    .map(|image| json!({"type": "image", "source": image_source(&image.url)}))
                    .collect();
                if !m.text.is_empty() || content.is_empty() {
                    content.insert(0, json!({"type": "text", "text": m.text}));
                }
                blocks.push(json!({"type": "tool_result", "tool_use_id": id, "content": content}));
                "user"
            }
            (None, role) => {
                for image in &m.images {
                    blocks.push(json!({"type": "image", "source": image_source(&image.url)}));
                }
                if !m.text.is_empty() {
                    blocks.push(json!({"type": "text", "text": m.text}));
                }
                for call in &m.tool_calls {
                    blocks.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": arguments(call)}));
                }
                role.as_str()
            }
        };
        if blocks.is_empty() {
            blocks.push(json!({"type": "text", "text": ""}));
        }
        // Anthropic's turns alternate: a turn of the same role as the last joins it.
        if let Some(last) = turns.last_mut()
            && last["role"] == role
            && let Some(content) = last["content"].as_array_mut()
        {
            content.extend(blocks);
            continue;
        }
        turns.push(json!({"role": role, "content": blocks}));
    }
    turns
}

fn messages_tools(offer: &ToolOffer, body: &mut Map<String, Value>) {
    let tools: Vec<Value> = offer
        .tools
        .iter()
        .map(|tool| {
            let mut spec = json!({"name": tool.name, "input_schema": tool.parameters});
            if let Some(description) = &tool.description {
                spec["description"] = description.as_str().into();
            }
            spec
        })
        .collect();
    body.insert("tools".into(), tools.into());
    let disable_parallel = offer.parallel.map(|parallel| !parallel);
    let choice = match (&offer.choice, disable_parallel) {
        (None, None) => return,
        (None | Some(ToolChoice::Auto), _) => json!({"type": "auto"}),
        (Some(ToolChoice::None), _) => json!({"type": "none"}),
        (Some(ToolChoice::Required), _) => json!({"type": "any"}),
        (Some(ToolChoice::Named(name)), _) => json!({"type": "tool", "name": name}),
    };
    let mut choice = choice;
    if let Some(disable) = disable_parallel {
        choice["disable_parallel_tool_use"] = disable.into();
    }
    body.insert("tool_choice".into(), choice);
}

/// The body of `request` for a Responses server (`/v1/responses`): nothing stored there (the
/// gateway keeps its own responses), the whole conversation as items.
pub(super) fn responses_request(
    request: &GenerateRequest,
    model: &str,
    whole: bool,
    target: Target,
) -> Vec<u8> {
    let mut body = Map::new();
    body.insert("model".into(), model.into());
    body.insert("max_output_tokens".into(), request.max_tokens.into());
    body.insert("stream".into(), (!whole).into());
    body.insert("store".into(), false.into());
    if let Some(system) = &request.system {
        body.insert("instructions".into(), system.as_str().into());
    }
    let mut items: Vec<Value> = Vec::with_capacity(request.messages.len() + 1);
    if let Some(prompt) = &request.prompt {
        items.push(json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]}));
    }
    for m in &request.messages {
        if let Some(id) = &m.tool_call_id {
            items.push(json!({"type": "function_call_output", "call_id": id, "output": m.text}));
            continue;
        }
        if m.role == Role::Assistant {
            if !m.text.is_empty() {
                items.push(json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": m.text}]}));
            }
            for call in &m.tool_calls {
                items.push(json!({"type": "function_call", "call_id": call.id, "name": call.name, "arguments": call.arguments}));
            }
            continue;
        }
        let mut content: Vec<Value> = m
            .images
            .iter()
            .map(|image| json!({"type": "input_image", "image_url": image.url}))
            .collect();
        content.push(json!({"type": "input_text", "text": m.text}));
        let role = if m.role == Role::System {
            "developer"
        } else {
            "user"
        };
        items.push(json!({"type": "message", "role": role, "content": content}));
    }
    body.insert("input".into(), items.into());
    let sampling = &request.sampling;
    if let Some(t) = sampling.temperature {
        body.insert("temperature".into(), widen(t).into());
    }
    if let Some(p) = sampling.top_p {
        body.insert("top_p".into(), widen(p).into());
    }
    if let Some(offer) = &request.tools {
        let tools: Vec<Value> = offer
            .tools
            .iter()
            .map(|tool| {
                let mut spec =
                    json!({"type": "function", "name": tool.name, "parameters": tool.parameters});
                if let Some(description) = &tool.description {
                    spec["description"] = description.as_str().into();
                }
                spec
            })
            .collect();
        body.insert("tools".into(), tools.into());
        if let Some(choice) = &offer.choice {
            let choice = match choice {
                ToolChoice::Auto => json!("auto"),
                ToolChoice::None => json!("none"),
                ToolChoice::Required => json!("required"),
                ToolChoice::Named(name) => json!({"type": "function", "name": name}),
            };
            body.insert("tool_choice".into(), choice);
        }
        if let Some(parallel) = offer.parallel {
            body.insert("parallel_tool_calls".into(), parallel.into());
        }
    }
    if target.reasoning
        && let Some(effort) = request.effort
    {
        body.insert("reasoning".into(), json!({"effort": effort.as_openai()}));
    }
    if let Some(format) = request.output_format.as_deref() {
        let format = match format {
            OutputFormat::JsonObject => json!({"type": "json_object"}),
            OutputFormat::JsonSchema {
                name,
                schema,
                strict,
            } => json!({"type": "json_schema", "name": name, "schema": schema, "strict": strict}),
        };
        body.insert("text".into(), json!({"format": format}));
    }
    serde_json::to_vec(&body).unwrap_or_default()
}
