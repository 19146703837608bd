//! The OpenAI API as the gateway speaks it: `POST /v1/chat/completions` and
//! `POST /v1/completions` parsed into the same validated [`MessagesRequest`] the Messages API
//! makes, so both doors share routing, admission, policies, A/B variants, limits and metrics;
//! and the reply's events written back as OpenAI chunks and bodies, errors in OpenAI's shape.
//!
//! Tools (`tools`, `tool_choice`, `parallel_tool_calls`, assistant `tool_calls`, `tool`
//! messages) are read into the same tool offer and messages the Messages API makes, and a
//! reply's `tool_use` blocks are written back as `tool_calls`. Fields OpenAI clients send that
//! this gateway knows but does not serve (logprobs, penalties, images, `n > 1`, the deprecated
//! `functions`) are refused with a 400 naming the field and the feature, never as unknown
//! fields. This module does no I/O and knows nothing of routing.

use serde::{Deserialize, Serialize};

use crate::api::{
    BlockDelta, ContentBlock, Limits, Message, MessageResponse, MessagesRequest, ReplyFormat, Role,
    StopReason, StreamEvent, Usage,
};
use crate::error::{ApiError, ErrorKind};
use ringmaster_gpu_runtime::{Image, ToolCall, ToolChoice, ToolOffer, ToolSpec};

/// `max_tokens` of a completion that names none (OpenAI's own default).
pub const DEFAULT_COMPLETION_MAX_TOKENS: u32 = 16;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawChatRequest {
    model: String,
    messages: Vec<RawChatMessage>,
    #[serde(flatten)]
    common: RawCommon,
    #[serde(default)]
    max_completion_tokens: Option<i64>,
    #[serde(default)]
    tools: Option<serde_json::Value>,
    #[serde(default)]
    tool_choice: Option<serde_json::Value>,
    #[serde(default)]
    parallel_tool_calls: Option<serde_json::Value>,
    #[serde(default)]
    functions: Option<serde_json::Value>,
    #[serde(default)]
    function_call: Option<serde_json::Value>,
    #[serde(default)]
    response_format: Option<serde_json::Value>,
    #[serde(default)]
    top_logprobs: Option<serde_json::Value>,
    #[serde(default)]
    modalities: Option<serde_json::Value>,
    #[serde(default)]
    audio: Option<serde_json::Value>,
    #[serde(default)]
    prediction: Option<serde_json::Value>,
    #[serde(default)]
    reasoning_effort: Option<serde_json::Value>,
    #[serde(default)]
    web_search_options: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCompletionRequest {
    model: String,
    prompt: serde_json::Value,
    #[serde(flatten)]
    common: RawCommon,
    #[serde(default)]
    echo: Option<bool>,
    #[serde(default)]
    suffix: Option<serde_json::Value>,
    #[serde(default)]
    best_of: Option<i64>,
}

/// The fields both endpoints share. (`flatten` and `deny_unknown_fields` do not mix in serde,
/// so the outer structs deny and this one collects.)
#[derive(Deserialize)]
struct RawCommon {
    #[serde(default)]
    max_tokens: Option<i64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<RawStreamOptions>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    /// vLLM's and SGLang's extension (`-1`: off).
    #[serde(default)]
    top_k: Option<i64>,
    #[serde(default)]
    seed: Option<i64>,
    #[serde(default)]
    stop: Option<RawStop>,
    #[serde(default)]
    n: Option<i64>,
    #[serde(default)]
    user: Option<String>,
    /// OpenAI's hint for which requests share a prompt prefix: a session key here.
    #[serde(default)]
    prompt_cache_key: Option<String>,
    #[serde(default)]
    safety_identifier: Option<String>,
    #[serde(default)]
    ignore_eos: Option<bool>,
    #[serde(default)]
    logprobs: Option<serde_json::Value>,
    #[serde(default)]
    logit_bias: Option<serde_json::Value>,
    #[serde(default)]
    presence_penalty: Option<f64>,
    #[serde(default)]
    frequency_penalty: Option<f64>,
    #[serde(default)]
    repetition_penalty: Option<f64>,
    #[serde(default)]
    metadata: Option<serde_json::Value>,
    #[serde(default)]
    store: Option<bool>,
    #[serde(default)]
    service_tier: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
    /// vLLM's extension; the gateway always asks its servers for it.
    #[serde(default)]
    #[allow(dead_code)]
    continuous_usage_stats: Option<bool>,
    #[serde(default)]
    #[allow(dead_code)]
    include_obfuscation: Option<bool>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawStop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawChatMessage {
    role: String,
    #[serde(default)]
    content: Option<RawChatContent>,
    #[serde(default)]
    #[allow(dead_code)]
    name: Option<String>,
    #[serde(default)]
    tool_calls: Option<serde_json::Value>,
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default)]
    function_call: Option<serde_json::Value>,
    #[serde(default)]
    refusal: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawChatContent {
    Text(String),
    Parts(Vec<RawPart>),
}

#[derive(Deserialize)]
struct RawPart {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    image_url: Option<RawImageUrl>,
}

#[derive(Deserialize)]
struct RawImageUrl {
    url: String,
    /// `auto`, `low` or `high`: a hint servers may ignore; not passed on.
    #[serde(default)]
    #[allow(dead_code)]
    detail: Option<String>,
}

fn unsupported(field: &str, feature: &str) -> ApiError {
    ApiError::invalid(format!(
        "{field}: {feature} is not supported by this gateway yet (the field is known, the feature \
         is not served); leave it out"
    ))
}

/// Whether a JSON value says nothing: absent, `null`, `false`, `0`, `""`, `[]` or `{}`.
fn is_empty(value: Option<&serde_json::Value>) -> bool {
    use serde_json::Value;
    match value {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => !b,
        Some(Value::Number(n)) => n.as_f64() == Some(0.0),
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(Value::Object(o)) => o.is_empty(),
    }
}

/// Parses and validates a `/v1/chat/completions` body.
pub fn parse_chat_request(body: &[u8], limits: Limits<'_>) -> Result<MessagesRequest, ApiError> {
    let mut raw = crate::api::parse_json::<RawChatRequest>(body)?;
    if !is_empty(raw.functions.as_ref()) || !is_empty(raw.function_call.as_ref()) {
        return Err(unsupported(
            if raw.functions.is_some() {
                "functions"
            } else {
                "function_call"
            },
            "the deprecated function calling (use tools and tool_choice)",
        ));
    }
    let tools = tool_offer(
        raw.tools.take(),
        raw.tool_choice.take(),
        raw.parallel_tool_calls.take(),
    )?;
    if let Some(format) = &raw.response_format
        && !format.is_null()
        && format.get("type").and_then(|t| t.as_str()) != Some("text")
    {
        return Err(unsupported(
            "response_format",
            "structured output (only {\"type\": \"text\"})",
        ));
    }
    if !is_empty(raw.top_logprobs.as_ref()) {
        return Err(unsupported("top_logprobs", "log probabilities"));
    }
    if let Some(modalities) = &raw.modalities
        && modalities
            .as_array()
            .is_none_or(|m| m.iter().any(|x| x.as_str() != Some("text")))
    {
        return Err(unsupported("modalities", "output other than text"));
    }
    for (field, value, feature) in [
        ("audio", &raw.audio, "audio output"),
        ("prediction", &raw.prediction, "predicted outputs"),
        (
            "reasoning_effort",
            &raw.reasoning_effort,
            "reasoning effort",
        ),
        ("web_search_options", &raw.web_search_options, "web search"),
    ] {
        if !is_empty(value.as_ref()) {
            return Err(unsupported(field, feature));
        }
    }
    if raw.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages: at least one message is required",
        ));
    }
    let mut system: Option<String> = None;
    let mut messages = Vec::with_capacity(raw.messages.len());
    for (i, m) in raw.messages.into_iter().enumerate() {
        if !is_empty(m.function_call.as_ref()) {
            return Err(unsupported(
                &format!("messages.{i}.function_call"),
                "the deprecated function calling (use tool_calls)",
            ));
        }
        let _ = m.refusal;
        let role = match m.role.as_str() {
            "system" | "developer" => None,
            "user" => Some(Role::User),
            "assistant" | "tool" => Some(Role::Assistant),
            "function" => {
                return Err(unsupported(
                    &format!("messages.{i}.role"),
                    "the deprecated function calling (use role \"tool\")",
                ));
            }
            other => {
                return Err(ApiError::invalid(format!(
                    "messages.{i}.role: {other:?} is not one of \"system\", \"developer\", \
                     \"user\", \"assistant\", \"tool\""
                )));
            }
        };
        let tool_call_id = match (m.role.as_str(), m.tool_call_id) {
            ("tool", Some(id)) => Some(id),
            ("tool", None) => {
                return Err(ApiError::invalid(format!(
                    "messages.{i}.tool_call_id: field required in a tool message"
                )));
            }
            (_, Some(_)) => {
                return Err(ApiError::invalid(format!(
                    "messages.{i}.tool_call_id: only a tool message names a call"
                )));
            }
            (_, None) => None,
        };
        let tool_calls = match m.tool_calls {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(_) if m.role != "assistant" => {
                return Err(ApiError::invalid(format!(
                    "messages.{i}.tool_calls: only an assistant message calls tools"
                )));
            }
            Some(calls) => tool_calls(calls, &format!("messages.{i}.tool_calls"))?,
        };
        let (text, images) = match m.content {
            None => (String::new(), Vec::new()),
            Some(content) => content_parts(content, &format!("messages.{i}.content"))?,
        };
        if !images.is_empty() && m.role != "user" {
            return Err(ApiError::invalid(format!(
                "messages.{i}.content: images go in user messages, not in a {:?} message",
                m.role
            )));
        }
        match role {
            None if messages.is_empty() => match system.as_mut() {
                Some(s) => {
                    s.push_str("\n\n");
                    s.push_str(&text);
                }
                None => system = Some(text),
            },
            None => {
                return Err(ApiError::invalid(format!(
                    "messages.{i}: a system or developer message after the conversation began is \
                     not supported; put system messages first"
                )));
            }
            Some(_) if tool_call_id.is_some() => messages.push(Message {
                role: Role::User,
                text,
                tool_call_id,
                ..Message::default()
            }),
            Some(role) => messages.push(Message {
                role,
                text,
                tool_calls,
                tool_call_id: None,
                images,
            }),
        }
    }
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages: at least one user or assistant message is required",
        ));
    }
    let max_tokens = raw.max_completion_tokens.or(raw.common.max_tokens);
    let field = if raw.max_completion_tokens.is_some() {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    let mut request = common(
        raw.model,
        raw.common,
        max_tokens,
        field,
        limits.max_output_tokens,
        limits,
        true,
    )?;
    request.system = system.filter(|s| !s.is_empty());
    request.messages = messages;
    request.tools = tools;
    Ok(request)
}

/// The tools offered (`tools`, `tool_choice`, `parallel_tool_calls`), validated: functions
/// with a name and (optionally) a JSON schema for their parameters.
fn tool_offer(
    tools: Option<serde_json::Value>,
    choice: Option<serde_json::Value>,
    parallel: Option<serde_json::Value>,
) -> Result<Option<Box<ToolOffer>>, ApiError> {
    use serde_json::Value;
    let tools = match tools {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(tools)) => tools,
        Some(_) => return Err(ApiError::invalid("tools: must be a list of tools")),
    };
    let mut specs = Vec::with_capacity(tools.len());
    for (i, tool) in tools.into_iter().enumerate() {
        let kind = tool.get("type").and_then(Value::as_str);
        if kind != Some("function") {
            return Err(match kind {
                Some(kind) => unsupported(&format!("tools.{i}.type"), &format!("{kind:?} tools")),
                None => ApiError::invalid(format!("tools.{i}.type: field required (\"function\")")),
            });
        }
        let Some(Value::Object(mut function)) = tool.get("function").cloned() else {
            return Err(ApiError::invalid(format!(
                "tools.{i}.function: field required (an object)"
            )));
        };
        let name = match function.remove("name") {
            Some(Value::String(name)) if !name.is_empty() => name,
            _ => {
                return Err(ApiError::invalid(format!(
                    "tools.{i}.function.name: field required (a non-empty string)"
                )));
            }
        };
        let parameters = match function.remove("parameters") {
            None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
            Some(schema @ Value::Object(_)) => schema,
            Some(_) => {
                return Err(ApiError::invalid(format!(
                    "tools.{i}.function.parameters: must be a JSON schema object"
                )));
            }
        };
        let description = match function.remove("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(d)) => Some(d),
            Some(_) => {
                return Err(ApiError::invalid(format!(
                    "tools.{i}.function.description: must be a string"
                )));
            }
        };
        specs.push(ToolSpec {
            name,
            description,
            parameters,
        });
    }
    let choice = match choice {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(choice)) => match choice.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(format!(
                    "tool_choice: {other:?} is not one of \"auto\", \"none\", \"required\" or a \
                     named function"
                )));
            }
        },
        Some(choice) => match choice.pointer("/function/name").and_then(Value::as_str) {
            Some(name) if specs.iter().any(|t| t.name == name) => {
                ToolChoice::Named(name.to_owned())
            }
            Some(name) => {
                return Err(ApiError::invalid(format!(
                    "tool_choice.function.name: {name:?} is not one of the tools offered"
                )));
            }
            None => {
                return Err(ApiError::invalid(
                    "tool_choice: must be \"auto\", \"none\", \"required\" or \
                     {\"type\": \"function\", \"function\": {\"name\": …}}",
                ));
            }
        },
    };
    let parallel = match parallel {
        None | Some(Value::Null) => None,
        Some(Value::Bool(parallel)) => Some(parallel),
        Some(_) => {
            return Err(ApiError::invalid(
                "parallel_tool_calls: must be true or false",
            ));
        }
    };
    crate::api::tool_offer_of(specs, choice, parallel)
}

/// An assistant message's `tool_calls`: each a function call with an id, a name and its
/// arguments as JSON text.
fn tool_calls(calls: serde_json::Value, field: &str) -> Result<Vec<ToolCall>, ApiError> {
    use serde_json::Value;
    let Value::Array(calls) = calls else {
        return Err(ApiError::invalid(format!("{field}: must be a list")));
    };
    calls
        .into_iter()
        .enumerate()
        .map(|(i, call)| {
            let id = call.get("id").and_then(Value::as_str);
            let name = call.pointer("/function/name").and_then(Value::as_str);
            let arguments = match call.pointer("/function/arguments") {
                Some(Value::String(text)) => text.clone(),
                None | Some(Value::Null) => "{}".to_owned(),
                Some(object @ Value::Object(_)) => object.to_string(),
                Some(_) => {
                    return Err(ApiError::invalid(format!(
                        "{field}.{i}.function.arguments: must be JSON text"
                    )));
                }
            };
            match (id, name) {
                (Some(id), Some(name)) => Ok(ToolCall {
                    id: id.to_owned(),
                    name: name.to_owned(),
                    arguments,
                }),
                _ => Err(ApiError::invalid(format!(
                    "{field}.{i}: a tool call needs an id and a function name"
                ))),
            }
        })
        .collect()
}

/// Parses and validates a `/v1/completions` body.
pub fn parse_completion_request(
    body: &[u8],
    limits: Limits<'_>,
) -> Result<MessagesRequest, ApiError> {
    let raw = crate::api::parse_json::<RawCompletionRequest>(body)?;
    let prompt = match raw.prompt {
        serde_json::Value::String(s) => s,
        serde_json::Value::Array(mut items) if items.len() == 1 && items[0].is_string() => items
            .pop()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        serde_json::Value::Array(items) if items.iter().all(serde_json::Value::is_string) => {
            return Err(unsupported("prompt", "more than one prompt per request"));
        }
        serde_json::Value::Array(_) => {
            return Err(unsupported("prompt", "prompts given as token ids"));
        }
        _ => return Err(ApiError::invalid("prompt: must be a string")),
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid("prompt: must not be empty"));
    }
    if raw.echo == Some(true) {
        return Err(unsupported("echo", "echoing the prompt"));
    }
    if !is_empty(raw.suffix.as_ref()) {
        return Err(unsupported("suffix", "insertion (suffix)"));
    }
    if raw.best_of.is_some_and(|b| b != 1) {
        return Err(unsupported("best_of", "best-of sampling"));
    }
    let max_tokens = raw.common.max_tokens;
    let mut request = common(
        raw.model,
        raw.common,
        max_tokens,
        "max_tokens",
        DEFAULT_COMPLETION_MAX_TOKENS.min(limits.max_output_tokens),
        limits,
        false,
    )?;
    request.messages = vec![Message {
        role: Role::User,
        text: prompt.clone(),
        ..Message::default()
    }];
    request.raw_prompt = Some(prompt);
    Ok(request)
}

/// What both endpoints validate alike; the caller fills in the prompt.
fn common(
    model: String,
    raw: RawCommon,
    max_tokens: Option<i64>,
    max_tokens_field: &str,
    default_max_tokens: u32,
    limits: Limits<'_>,
    chat: bool,
) -> Result<MessagesRequest, ApiError> {
    if model.trim().is_empty() {
        return Err(ApiError::invalid("model: must not be empty"));
    }
    let max_tokens = match max_tokens {
        None => default_max_tokens,
        Some(n) => crate::api::max_tokens_in_limits(n, max_tokens_field, limits)?,
    };
    if raw.n.is_some_and(|n| n != 1) {
        return Err(unsupported("n", "more than one choice per request"));
    }
    if !is_empty(raw.logprobs.as_ref()) {
        return Err(unsupported("logprobs", "log probabilities"));
    }
    if !is_empty(raw.logit_bias.as_ref()) {
        return Err(unsupported("logit_bias", "logit bias"));
    }
    for (field, value) in [
        ("presence_penalty", raw.presence_penalty),
        ("frequency_penalty", raw.frequency_penalty),
    ] {
        if value.is_some_and(|v| v != 0.0) {
            return Err(unsupported(field, "a non-zero penalty"));
        }
    }
    if raw.repetition_penalty.is_some_and(|v| v != 1.0) {
        return Err(unsupported("repetition_penalty", "a repetition penalty"));
    }
    if raw.store == Some(true) {
        return Err(unsupported("store", "stored completions"));
    }
    if let Some(tier) = &raw.service_tier
        && !tier.is_null()
        && !matches!(tier.as_str(), Some("auto" | "default"))
    {
        return Err(unsupported(
            "service_tier",
            "a service tier other than \"auto\" or \"default\" (tiers come from the API key)",
        ));
    }
    let _ = (raw.metadata, raw.safety_identifier);
    let temperature = match raw.temperature {
        None => None,
        Some(t) if t.is_finite() && (0.0..=2.0).contains(&t) => Some(t as f32),
        Some(t) => {
            return Err(ApiError::invalid(format!(
                "temperature: must be at least 0 and at most 2, got {t}"
            )));
        }
    };
    let top_p = match raw.top_p {
        None => None,
        Some(p) if p.is_finite() && p > 0.0 && p <= 1.0 => Some(p as f32),
        Some(p) => {
            return Err(ApiError::invalid(format!(
                "top_p: must be greater than 0 and at most 1, got {p}"
            )));
        }
    };
    let top_k = match raw.top_k {
        None | Some(-1 | 0) => None,
        Some(k) if k < 0 => {
            return Err(ApiError::invalid(format!(
                "top_k: must be -1 (off) or positive, got {k}"
            )));
        }
        Some(k) => Some(
            u32::try_from(k).map_err(|_| ApiError::invalid(format!("top_k: {k} is too large")))?,
        ),
    };
    let seed = match raw.seed {
        None => None,
        Some(s) => Some(
            u64::try_from(s)
                .map_err(|_| ApiError::invalid(format!("seed: must be non-negative, got {s}")))?,
        ),
    };
    let stop_sequences = match raw.stop {
        None => Vec::new(),
        Some(RawStop::One(s)) => vec![s],
        Some(RawStop::Many(v)) => v,
    };
    if let Some(i) = stop_sequences.iter().position(String::is_empty) {
        return Err(ApiError::invalid(format!("stop.{i}: must not be empty")));
    }
    let session = raw.prompt_cache_key.or(raw.user).filter(|s| !s.is_empty());
    if let Some(id) = &session
        && id.chars().count() > crate::api::MAX_USER_ID_CHARS
    {
        return Err(ApiError::invalid(format!(
            "user: longer than {} characters",
            crate::api::MAX_USER_ID_CHARS
        )));
    }
    if !limits.models.contains(&model) {
        return Err(ApiError::not_found(format!(
            "model: {model:?} is not served here; available models: {}",
            limits.models.join(", ")
        )));
    }
    let stream = raw.stream.unwrap_or(false);
    let include_usage = raw
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    if raw.stream_options.is_some() && !stream {
        return Err(ApiError::invalid(
            "stream_options: allowed only when stream is true",
        ));
    }
    Ok(MessagesRequest {
        model,
        system: None,
        messages: Vec::new(),
        max_tokens,
        stream,
        temperature,
        top_p,
        top_k,
        stop_sequences,
        user_id: session,
        ignore_eos: raw.ignore_eos.unwrap_or(false),
        seed,
        raw_prompt: None,
        format: if chat {
            ReplyFormat::OpenAiChat { include_usage }
        } else {
            ReplyFormat::OpenAiCompletion { include_usage }
        },
        tools: None,
    })
}

/// A message's text and images (`image_url` parts: an http(s) or `data:` URL).
fn content_parts(content: RawChatContent, field: &str) -> Result<(String, Vec<Image>), ApiError> {
    match content {
        RawChatContent::Text(text) => Ok((text, Vec::new())),
        RawChatContent::Parts(parts) => {
            let mut text = String::new();
            let mut images = Vec::new();
            for (i, part) in parts.into_iter().enumerate() {
                match (part.kind.as_str(), part.text) {
                    ("text", Some(t)) => text.push_str(&t),
                    ("text", None) => {
                        return Err(ApiError::invalid(format!(
                            "{field}.{i}.text: field required"
                        )));
                    }
                    ("image_url", _) => match part.image_url {
                        Some(image)
                            if ["https://", "http://", "data:image/"]
                                .iter()
                                .any(|scheme| image.url.starts_with(scheme)) =>
                        {
                            images.push(Image { url: image.url });
                        }
                        _ => {
                            return Err(ApiError::invalid(format!(
                                "{field}.{i}.image_url.url: field required (an http(s) URL or a \
                                 data:image/… URL)"
                            )));
                        }
                    },
                    ("input_audio", _) => {
                        return Err(unsupported(&format!("{field}.{i}"), "audio input"));
                    }
                    ("file", _) => return Err(unsupported(&format!("{field}.{i}"), "file input")),
                    (other, _) => {
                        return Err(ApiError::invalid(format!(
                            "{field}.{i}.type: content parts of type {other:?} are not supported; \
                             \"text\" and \"image_url\" are"
                        )));
                    }
                }
            }
            Ok((text, images))
        }
    }
}

/// OpenAI's `finish_reason` for a stop reason.
pub fn finish_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::EndTurn | StopReason::StopSequence => "stop",
        StopReason::MaxTokens => "length",
        StopReason::Refusal => "content_filter",
        StopReason::ToolUse => "tool_calls",
    }
}

/// OpenAI's usage block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct OpenAiUsage {
    /// Every prompt token, cached or not.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// The two together.
    pub total_tokens: u32,
    /// Of the prompt, what the server's prefix cache held.
    pub prompt_tokens_details: PromptTokensDetails,
}

/// `usage.prompt_tokens_details`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens read from the prefix cache.
    pub cached_tokens: u32,
}

impl From<Usage> for OpenAiUsage {
    fn from(usage: Usage) -> Self {
        let prompt = usage.input_tokens + usage.cache_read_input_tokens;
        Self {
            prompt_tokens: prompt,
            completion_tokens: usage.output_tokens,
            total_tokens: prompt + usage.output_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: usage.cache_read_input_tokens,
            },
        }
    }
}

/// Seconds since the Unix epoch, for `created`.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The whole reply of a non-streamed request, as OpenAI's body for `format`.
pub fn whole_body(message: &MessageResponse, chat: bool, created: u64) -> serde_json::Value {
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for block in &message.content {
        match block {
            ContentBlock::Text { text: more } => text.push_str(more),
            ContentBlock::ToolUse { id, name, input } => tool_calls.push(serde_json::json!({
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": input.to_string()},
            })),
        }
    }
    let finish = message.stop_reason.map(finish_reason);
    let usage = OpenAiUsage::from(message.usage);
    if chat {
        let mut reply = serde_json::json!({"role": "assistant", "content": text, "refusal": null});
        if !tool_calls.is_empty() {
            // OpenAI's shape: no content beside the calls unless the model wrote some.
            if text.is_empty() {
                reply["content"] = serde_json::Value::Null;
            }
            reply["tool_calls"] = serde_json::Value::Array(tool_calls);
        }
        serde_json::json!({
            "id": message.id,
            "object": "chat.completion",
            "created": created,
            "model": message.model,
            "choices": [{
                "index": 0,
                "message": reply,
                "logprobs": null,
                "finish_reason": finish,
            }],
            "usage": usage,
        })
    } else {
        serde_json::json!({
            "id": message.id,
            "object": "text_completion",
            "created": created,
            "model": message.model,
            "choices": [{
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": finish,
            }],
            "usage": usage,
        })
    }
}

/// Writes a reply's events as OpenAI stream chunks (`data: {…}\n\n`, ending `data: [DONE]`).
#[derive(Debug)]
pub struct ChunkWriter {
    id: String,
    model: String,
    created: u64,
    chat: bool,
    include_usage: bool,
    /// The block index of each tool call so far: its place here is its OpenAI `index`.
    tool_blocks: Vec<u32>,
    /// Relaying a server's own chunks: only what they lack is written (the role, text and
    /// tool chunks never; the finish unless the server's came). `None`: everything.
    relay: Option<Relayed>,
}

/// What a relayed server reply has already sent.
#[derive(Clone, Copy, Debug)]
struct Relayed {
    /// The server's chunk with the finish went out.
    finish: bool,
}

#[derive(Serialize)]
struct Chunk<'a, C> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: C,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<OpenAiUsage>,
}

#[derive(Serialize)]
struct ChatChoice<'a> {
    index: u32,
    delta: ChatDelta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
}

#[derive(Serialize)]
struct ChatDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[ToolCallDelta<'a>; 1]>,
}

/// A piece of a tool call in a stream: the first carries its id, type and name.
#[derive(Serialize)]
struct ToolCallDelta<'a> {
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    function: FunctionDelta<'a>,
}

#[derive(Serialize)]
struct FunctionDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    arguments: &'a str,
}

#[derive(Serialize)]
struct TextChoice<'a> {
    index: u32,
    text: &'a str,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
}

impl ChunkWriter {
    /// A writer for one reply; `id` is the reply's id (`chatcmpl-…`, `cmpl-…`).
    pub fn new(id: String, model: String, format: ReplyFormat) -> Self {
        let (chat, include_usage) = match format {
            ReplyFormat::OpenAiChat { include_usage } => (true, include_usage),
            ReplyFormat::OpenAiCompletion { include_usage } => (false, include_usage),
            ReplyFormat::Messages => (true, false),
        };
        Self {
            id,
            model,
            created: unix_now(),
            chat,
            include_usage,
            tool_blocks: Vec::new(),
            relay: None,
        }
    }

    /// The reply is a relay of the server's own chunks, `finish` once its finishing chunk
    /// went out: from now on only what those lack is written.
    pub fn relay_from(&mut self, finish: bool) {
        self.relay = Some(Relayed { finish });
    }

    fn chunk(
        &self,
        out: &mut Vec<u8>,
        content: Option<&str>,
        role: bool,
        finish: Option<&'static str>,
    ) {
        self.chat_chunk(out, content, None, role, finish);
    }

    /// A chunk: a chat chunk with `content` or a tool call's piece, or a completion's text.
    fn chat_chunk(
        &self,
        out: &mut Vec<u8>,
        content: Option<&str>,
        tool_call: Option<ToolCallDelta<'_>>,
        role: bool,
        finish: Option<&'static str>,
    ) {
        out.extend_from_slice(b"data: ");
        let written = if self.chat {
            serde_json::to_writer(
                &mut *out,
                &Chunk {
                    id: &self.id,
                    object: "chat.completion.chunk",
                    created: self.created,
                    model: &self.model,
                    choices: [ChatChoice {
                        index: 0,
                        delta: ChatDelta {
                            role: role.then_some("assistant"),
                            content,
                            tool_calls: tool_call.map(|call| [call]),
                        },
                        logprobs: None,
                        finish_reason: finish,
                    }],
                    usage: None,
                },
            )
        } else {
            serde_json::to_writer(
                &mut *out,
                &Chunk {
                    id: &self.id,
                    object: "text_completion",
                    created: self.created,
                    model: &self.model,
                    choices: [TextChoice {
                        index: 0,
                        text: content.unwrap_or(""),
                        logprobs: None,
                        finish_reason: finish,
                    }],
                    usage: None,
                },
            )
        };
        if written.is_err() {
            out.extend_from_slice(b"{}");
        }
        out.extend_from_slice(b"\n\n");
    }

    /// The last chunk with the usage (choices empty), when the client asked for it.
    fn usage_chunk(&self, usage: Usage, out: &mut Vec<u8>) {
        if !self.include_usage {
            return;
        }
        out.extend_from_slice(b"data: ");
        let chunk = Chunk {
            id: &self.id,
            object: if self.chat {
                "chat.completion.chunk"
            } else {
                "text_completion"
            },
            created: self.created,
            model: &self.model,
            choices: [(); 0],
            usage: Some(OpenAiUsage::from(usage)),
        };
        if serde_json::to_writer(&mut *out, &chunk).is_err() {
            out.extend_from_slice(b"{}");
        }
        out.extend_from_slice(b"\n\n");
    }

    /// Appends what `event` is in OpenAI's stream to `out` (some events are nothing there).
    pub fn write(&mut self, event: &StreamEvent, out: &mut Vec<u8>) {
        if let Some(relayed) = self.relay {
            match event {
                // The server's chunks carried these.
                StreamEvent::MessageStart { .. }
                | StreamEvent::ContentBlockStart { .. }
                | StreamEvent::ContentBlockDelta { .. }
                | StreamEvent::ContentBlockStop { .. } => return,
                StreamEvent::MessageDelta { usage, .. } if relayed.finish => {
                    self.usage_chunk(*usage, out);
                    return;
                }
                _ => {}
            }
        }
        match event {
            StreamEvent::MessageStart { .. } if self.chat => {
                self.chunk(out, Some(""), true, None);
            }
            StreamEvent::ContentBlockDelta {
                delta: BlockDelta::TextDelta { text },
                ..
            } => {
                self.chunk(out, Some(text), false, None);
            }
            StreamEvent::ContentBlockStart {
                index,
                content_block: ContentBlock::ToolUse { id, name, .. },
            } if self.chat => {
                self.tool_blocks.push(*index);
                let call = ToolCallDelta {
                    index: self.tool_blocks.len() - 1,
                    id: Some(id),
                    kind: Some("function"),
                    function: FunctionDelta {
                        name: Some(name),
                        arguments: "",
                    },
                };
                self.chat_chunk(out, None, Some(call), false, None);
            }
            StreamEvent::ContentBlockDelta {
                index,
                delta: BlockDelta::InputJsonDelta { partial_json },
            } => {
                if let Some(ordinal) = self.tool_blocks.iter().position(|b| b == index) {
                    let call = ToolCallDelta {
                        index: ordinal,
                        id: None,
                        kind: None,
                        function: FunctionDelta {
                            name: None,
                            arguments: partial_json,
                        },
                    };
                    self.chat_chunk(out, None, Some(call), false, None);
                }
            }
            StreamEvent::MessageDelta { delta, usage } => {
                self.chunk(
                    out,
                    (!self.chat).then_some(""),
                    false,
                    Some(finish_reason(delta.stop_reason)),
                );
                self.usage_chunk(*usage, out);
            }
            StreamEvent::MessageStop => out.extend_from_slice(b"data: [DONE]\n\n"),
            // A comment line: ignored by every SSE client, and traffic for every proxy.
            StreamEvent::Ping => out.extend_from_slice(b": ping\n\n"),
            StreamEvent::Error { error } => {
                let message = error
                    .get("message")
                    .and_then(|m| m.as_str())
                    .unwrap_or("the reply failed");
                out.extend_from_slice(b"data: ");
                let body = serde_json::json!({"error": {
                    "message": message, "type": "server_error", "param": null, "code": null,
                }});
                if serde_json::to_writer(&mut *out, &body).is_err() {
                    out.extend_from_slice(b"{}");
                }
                out.extend_from_slice(b"\n\n");
            }
            StreamEvent::MessageStart { .. }
            | StreamEvent::ContentBlockStart { .. }
            | StreamEvent::ContentBlockStop { .. } => {}
        }
    }
}

/// OpenAI's status for an error: the same as Anthropic's, but `503` for the non-standard `529`.
pub fn error_status(error: &ApiError) -> http::StatusCode {
    match error.kind() {
        ErrorKind::Overloaded => http::StatusCode::SERVICE_UNAVAILABLE,
        kind => kind.status(),
    }
}

/// OpenAI's error body: `{"error":{"message","type","param","code"}}`.
pub fn error_body(error: &ApiError) -> serde_json::Value {
    let (kind, code) = match error.kind() {
        ErrorKind::InvalidRequest
        | ErrorKind::UnsupportedMediaType
        | ErrorKind::MethodNotAllowed
        | ErrorKind::Conflict
        | ErrorKind::RequestTooLarge => ("invalid_request_error", None),
        ErrorKind::Authentication => ("invalid_request_error", Some("invalid_api_key")),
        ErrorKind::PermissionDenied => ("invalid_request_error", Some("model_not_allowed")),
        ErrorKind::NotFound => ("invalid_request_error", Some("not_found")),
        ErrorKind::RateLimit => ("rate_limit_error", Some("rate_limit_exceeded")),
        ErrorKind::Api => ("server_error", None),
        ErrorKind::Overloaded | ErrorKind::Unavailable => ("server_error", Some("overloaded")),
    };
    serde_json::json!({"error": {
        "message": error.message(), "type": kind, "param": null, "code": code,
    }})
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: &str = "sim-llama-3-8b";

    fn limits(models: &[String]) -> Limits<'_> {
        Limits {
            models,
            max_output_tokens: 4096,
        }
    }

    fn chat(body: &str) -> Result<MessagesRequest, ApiError> {
        let models = vec![MODEL.to_owned()];
        parse_chat_request(body.as_bytes(), limits(&models))
    }

    fn completion(body: &str) -> Result<MessagesRequest, ApiError> {
        let models = vec![MODEL.to_owned()];
        parse_completion_request(body.as_bytes(), limits(&models))
    }

    #[test]
    fn a_chat_request_becomes_the_same_request_the_messages_api_makes() {
        let request = chat(
            r#"{"model":"sim-llama-3-8b","messages":[
                {"role":"system","content":"Be brief."},
                {"role":"developer","content":[{"type":"text","text":"No lists."}]},
                {"role":"user","content":"Hi"},
                {"role":"assistant","content":"Hello"},
                {"role":"user","content":[{"type":"text","text":"More"}]}],
              "max_completion_tokens":20,"temperature":1.5,"stop":"END","seed":7,
              "stream":true,"stream_options":{"include_usage":true},"user":"u-1"}"#,
        )
        .unwrap();
        assert_eq!(request.system.as_deref(), Some("Be brief.\n\nNo lists."));
        assert_eq!(request.messages.len(), 3);
        assert_eq!(request.messages[2].text, "More");
        assert_eq!(request.max_tokens, 20);
        assert_eq!(request.temperature, Some(1.5));
        assert_eq!(request.stop_sequences, ["END"]);
        assert_eq!(request.seed, Some(7));
        assert_eq!(request.user_id.as_deref(), Some("u-1"));
        assert!(request.stream);
        assert_eq!(
            request.format,
            ReplyFormat::OpenAiChat {
                include_usage: true
            }
        );
        // No max_tokens: the gateway's limit.
        let request =
            chat(r#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":"Hi"}]}"#)
                .unwrap();
        assert_eq!(request.max_tokens, 4096);
        assert!(!request.stream);
    }

    #[test]
    fn a_completion_request_carries_its_raw_prompt() {
        let request = completion(r#"{"model":"sim-llama-3-8b","prompt":["Once upon"]}"#).unwrap();
        assert_eq!(request.raw_prompt.as_deref(), Some("Once upon"));
        assert_eq!(request.max_tokens, DEFAULT_COMPLETION_MAX_TOKENS);
        assert_eq!(
            request.format,
            ReplyFormat::OpenAiCompletion {
                include_usage: false
            }
        );
        for (body, needle) in [
            (
                r#"{"model":"sim-llama-3-8b","prompt":["a","b"]}"#,
                "more than one prompt",
            ),
            (
                r#"{"model":"sim-llama-3-8b","prompt":[1,2,3]}"#,
                "token ids",
            ),
            (
                r#"{"model":"sim-llama-3-8b","prompt":""}"#,
                "must not be empty",
            ),
            (
                r#"{"model":"sim-llama-3-8b","prompt":"x","echo":true}"#,
                "echo",
            ),
        ] {
            let err = completion(body).unwrap_err();
            assert!(err.message().contains(needle), "{body}: {}", err.message());
        }
    }

    #[test]
    fn known_features_not_served_are_refused_by_name() {
        let with = |extra: &str| {
            chat(&format!(
                r#"{{"model":"sim-llama-3-8b","messages":[{{"role":"user","content":"Hi"}}]{extra}}}"#
            ))
        };
        for ok in [
            r#","tools":[]"#,
            r#","tool_choice":"none""#,
            r#","n":1"#,
            r#","logprobs":false"#,
            r#","presence_penalty":0"#,
            r#","response_format":{"type":"text"}"#,
            r#","service_tier":"auto""#,
            r#","top_k":-1"#,
            r#","metadata":{"a":"b"}"#,
        ] {
            assert!(with(ok).is_ok(), "{ok}: {:?}", with(ok).err());
        }
        for (extra, field, feature) in [
            (
                r#","functions":[{"name":"f"}]"#,
                "functions",
                "deprecated function calling",
            ),
            (
                r#","tools":[{"type":"custom","custom":{"name":"f"}}]"#,
                "tools.0.type",
                "\"custom\" tools",
            ),
            (r#","n":2"#, "n", "more than one choice"),
            (r#","logprobs":true"#, "logprobs", "log probabilities"),
            (
                r#","frequency_penalty":0.5"#,
                "frequency_penalty",
                "penalty",
            ),
            (
                r#","response_format":{"type":"json_object"}"#,
                "response_format",
                "structured output",
            ),
            (r#","service_tier":"flex""#, "service_tier", "service tier"),
        ] {
            let err = with(extra).unwrap_err();
            assert!(
                err.message().starts_with(&format!("{field}: "))
                    && err.message().contains(feature)
                    && err.message().contains("not supported"),
                "{extra}: {}",
                err.message()
            );
        }
        let err = chat(
            r#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"x","format":"wav"}}]}]}"#,
        )
        .unwrap_err();
        assert!(err.message().contains("audio input"), "{}", err.message());
        let req = chat(
            r#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":[{"type":"text","text":"What is it?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA","detail":"low"}}]}]}"#,
        )
        .unwrap();
        assert_eq!(req.messages[0].images[0].url, "data:image/png;base64,AAAA");
        assert_eq!(req.messages[0].text, "What is it?");
        for body in [
            r#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"file:///etc/passwd"}}]}]}"#,
            r#"{"model":"sim-llama-3-8b","messages":[{"role":"assistant","content":[{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}]}"#,
        ] {
            let err = chat(body).unwrap_err();
            assert!(
                err.message().starts_with("messages.0.content"),
                "{}",
                err.message()
            );
        }
        let err = with(r#","frobnicate":1"#).unwrap_err();
        assert!(err.message().contains("unknown field"), "{}", err.message());
    }

    #[test]
    fn tools_tool_calls_and_tool_messages_are_read() {
        let req = chat(
            r#"{"model":"sim-llama-3-8b",
                "tools":[{"type":"function","function":{"name":"lookup","description":"Find","parameters":{"type":"object"}}},
                         {"type":"function","function":{"name":"bare"}}],
                "tool_choice":"required","parallel_tool_calls":true,
                "messages":[{"role":"user","content":"Find Paris"},
                            {"role":"assistant","content":null,"tool_calls":[
                                {"id":"c1","type":"function","function":{"name":"lookup","arguments":"{\"q\":1}"}}]},
                            {"role":"tool","tool_call_id":"c1","content":"found"}]}"#,
        )
        .unwrap();
        let offer = req.tools.as_deref().unwrap();
        assert_eq!(offer.tools.len(), 2);
        assert_eq!(offer.tools[0].description.as_deref(), Some("Find"));
        assert_eq!(
            offer.tools[1].parameters,
            serde_json::json!({"type": "object", "properties": {}}),
            "a function without parameters takes none"
        );
        assert_eq!(offer.choice, ToolChoice::Required);
        assert_eq!(offer.parallel, Some(true));
        assert_eq!(req.messages.len(), 3);
        assert_eq!(req.messages[1].tool_calls[0].arguments, r#"{"q":1}"#);
        assert_eq!(req.messages[1].text, "");
        assert_eq!(req.messages[2].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(req.messages[2].role, Role::User);
        assert_eq!(req.messages[2].text, "found");
        for (body, starts) in [
            (
                r#""messages":[{"role":"tool","content":"x"}]"#,
                "messages.0.tool_call_id: field required",
            ),
            (
                r#""messages":[{"role":"user","content":"x","tool_calls":[]}]"#,
                "messages.0.tool_calls: only an assistant",
            ),
            (
                r#""messages":[{"role":"assistant","content":"x","tool_calls":[{"id":"c"}]}]"#,
                "messages.0.tool_calls.0: a tool call needs",
            ),
            (
                r#""messages":[{"role":"user","content":"x"}],"tool_choice":"required""#,
                "tool_choice: asks for a tool call",
            ),
            (
                r#""messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes""#,
                "tool_choice: \"sometimes\"",
            ),
            (
                r#""messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}"#,
                "tool_choice.function.name:",
            ),
        ] {
            let err = chat(&format!(r#"{{"model":"sim-llama-3-8b",{body}}}"#)).unwrap_err();
            assert!(
                err.message().starts_with(starts),
                "{body}: {}",
                err.message()
            );
        }
    }

    #[test]
    fn bad_values_name_their_field() {
        for (body, needle) in [
            (
                r#"{"model":"nope","messages":[{"role":"user","content":"Hi"}]}"#,
                "not served",
            ),
            (
                r#"{"model":"sim-llama-3-8b","messages":[]}"#,
                "messages: at least one",
            ),
            (
                r#"{"model":"sim-llama-3-8b","messages":[{"role":"system","content":"S"}]}"#,
                "user or assistant",
            ),
            (
                r#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":"Hi"},{"role":"system","content":"S"}]}"#,
                "after the conversation began",
            ),
            (
                r#"{"model":"sim-llama-3-8b","messages":[{"role":"robot","content":"Hi"}]}"#,
                "messages.0.role",
            ),
            (
                r#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":"Hi"}],"temperature":2.5}"#,
                "temperature",
            ),
            (
                r#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":"Hi"}],"max_tokens":0}"#,
                "max_tokens: must be at least 1",
            ),
            (
                r#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":"Hi"}],"max_completion_tokens":99999}"#,
                "max_completion_tokens: 99999 is greater",
            ),
            (
                r#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":"Hi"}],"stream_options":{"include_usage":true}}"#,
                "stream_options",
            ),
        ] {
            let err = chat(body).unwrap_err();
            assert!(err.message().contains(needle), "{body}: {}", err.message());
        }
    }

    #[test]
    fn tool_use_blocks_are_written_as_tool_call_chunks_and_a_whole_message() {
        let mut writer = ChunkWriter::new(
            "chatcmpl-1".into(),
            MODEL.into(),
            ReplyFormat::OpenAiChat {
                include_usage: false,
            },
        );
        let mut out = Vec::new();
        for (call, index) in [("call_a", 1), ("call_b", 2)] {
            writer.write(
                &StreamEvent::ContentBlockStart {
                    index,
                    content_block: ContentBlock::ToolUse {
                        id: call.into(),
                        name: "lookup".into(),
                        input: serde_json::json!({}),
                    },
                },
                &mut out,
            );
            writer.write(
                &StreamEvent::ContentBlockDelta {
                    index,
                    delta: BlockDelta::InputJsonDelta {
                        partial_json: "{\"q\":1}".into(),
                    },
                },
                &mut out,
            );
        }
        let text = String::from_utf8(out).unwrap();
        let chunks: Vec<serde_json::Value> = text
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let calls: Vec<&serde_json::Value> = chunks
            .iter()
            .map(|c| &c["choices"][0]["delta"]["tool_calls"][0])
            .collect();
        assert_eq!(calls.len(), 4, "{text}");
        assert_eq!(
            *calls[0],
            serde_json::json!({"index": 0, "id": "call_a", "type": "function",
                               "function": {"name": "lookup", "arguments": ""}})
        );
        assert_eq!(
            *calls[1],
            serde_json::json!({"index": 0, "function": {"arguments": "{\"q\":1}"}})
        );
        assert_eq!(calls[2]["index"], 1, "the second call is OpenAI's index 1");
        assert_eq!(calls[3]["index"], 1);

        let message = MessageResponse {
            id: "chatcmpl-1".into(),
            kind: "message",
            role: Role::Assistant,
            model: MODEL.into(),
            content: vec![ContentBlock::ToolUse {
                id: "call_a".into(),
                name: "lookup".into(),
                input: serde_json::json!({"q": 1}),
            }],
            stop_reason: Some(StopReason::ToolUse),
            stop_sequence: None,
            usage: Usage::default(),
        };
        let body = whole_body(&message, true, 0);
        let reply = &body["choices"][0];
        assert_eq!(reply["finish_reason"], "tool_calls");
        assert_eq!(reply["message"]["content"], serde_json::Value::Null);
        assert_eq!(
            reply["message"]["tool_calls"],
            serde_json::json!([{"id": "call_a", "type": "function",
                                "function": {"name": "lookup", "arguments": "{\"q\":1}"}}])
        );
    }

    #[test]
    fn a_stream_is_written_as_openai_chunks_ending_in_done() {
        use crate::api::MessageDeltaBody;
        let mut writer = ChunkWriter::new(
            "chatcmpl-1".into(),
            MODEL.into(),
            ReplyFormat::OpenAiChat {
                include_usage: true,
            },
        );
        let message = MessageResponse {
            id: "chatcmpl-1".into(),
            kind: "message",
            role: Role::Assistant,
            model: MODEL.into(),
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: Usage::default(),
        };
        let usage = Usage {
            input_tokens: 3,
            output_tokens: 2,
            cache_read_input_tokens: 5,
            cache_creation_input_tokens: 0,
        };
        let mut out = Vec::new();
        for event in [
            StreamEvent::MessageStart { message },
            StreamEvent::ContentBlockStart {
                index: 0,
                content_block: ContentBlock::text(String::new()),
            },
            StreamEvent::Ping,
            StreamEvent::text(0, "Hel".into()),
            StreamEvent::text(0, "lo".into()),
            StreamEvent::ContentBlockStop { index: 0 },
            StreamEvent::MessageDelta {
                delta: MessageDeltaBody {
                    stop_reason: StopReason::MaxTokens,
                    stop_sequence: None,
                },
                usage,
            },
            StreamEvent::MessageStop,
        ] {
            writer.write(&event, &mut out);
        }
        let text = String::from_utf8(out).unwrap();
        let data: Vec<&str> = text
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .collect();
        assert_eq!(data.len(), 6, "{text}");
        assert!(text.contains(": ping\n\n"));
        let chunks: Vec<serde_json::Value> = data[..5]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(chunks[1]["choices"][0]["delta"]["content"], "Hel");
        assert_eq!(chunks[2]["choices"][0]["delta"]["content"], "lo");
        assert_eq!(chunks[3]["choices"][0]["finish_reason"], "length");
        assert_eq!(chunks[4]["choices"], serde_json::json!([]));
        assert_eq!(chunks[4]["usage"]["prompt_tokens"], 8);
        assert_eq!(chunks[4]["usage"]["total_tokens"], 10);
        assert_eq!(
            chunks[4]["usage"]["prompt_tokens_details"]["cached_tokens"],
            5
        );
        assert!(
            chunks
                .iter()
                .all(|c| c["object"] == "chat.completion.chunk")
        );
        assert_eq!(data[5], "[DONE]");
    }

    proptest::proptest! {
        #[test]
        fn any_body_is_a_request_or_a_client_error(
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..256),
            field in "(max_tokens|temperature|n|stop|prompt|messages|tools|seed|top_k)",
            value in "(-?[0-9]{1,12}(\\.[0-9]+)?|\"[a-z ]{0,8}\"|null|true|\\[\\]|\\{\\})",
        ) {
            let models = vec![MODEL.to_owned()];
            let structured = format!(
                r#"{{"model":"sim-llama-3-8b","messages":[{{"role":"user","content":"Hi"}}],"prompt":"x","{field}":{value}}}"#
            );
            for bytes in [body.as_slice(), structured.as_bytes()] {
                for parsed in [
                    parse_chat_request(bytes, limits(&models)),
                    parse_completion_request(bytes, limits(&models)),
                ] {
                    match parsed {
                        Ok(request) => proptest::prop_assert!((1..=4096).contains(&request.max_tokens)),
                        Err(error) => proptest::prop_assert!(error.kind().status().is_client_error()),
                    }
                }
            }
        }
    }

    #[test]
    fn errors_have_openai_shape_and_standard_statuses() {
        let error = ApiError::new(ErrorKind::Overloaded, "full");
        assert_eq!(error_status(&error), http::StatusCode::SERVICE_UNAVAILABLE);
        let body = error_body(&ApiError::new(ErrorKind::RateLimit, "slow down"));
        assert_eq!(body["error"]["message"], "slow down");
        assert_eq!(body["error"]["type"], "rate_limit_error");
        assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    }
}
