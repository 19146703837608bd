//! The Anthropic Messages API as the gateway speaks it: request parsing, validation, and the
//! response and stream-event shapes.
//!
//! Parsing goes raw → validated: [`parse_messages_request`] turns body bytes into a
//! [`MessagesRequest`] whose invariants hold (a known model, `max_tokens` in range, at least one
//! message, text, `tool_use` and `tool_result` content only, tools with names and schemas), or
//! into an [`ApiError`] that names the offending field. Nothing
//! past this module sees the raw JSON. This module does no I/O and knows nothing of routing.

use ringmaster_gpu_runtime::{Image, ToolCall, ToolChoice, ToolOffer, ToolSpec};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// Longest `metadata.user_id` accepted (Anthropic's own limit).
pub const MAX_USER_ID_CHARS: usize = 256;

/// Who wrote a message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The human side (and the results of the tools the model called).
    #[default]
    User,
    /// The model side (earlier turns, or a prefill of the reply).
    Assistant,
}

/// A request to `POST /v1/messages` after validation.
#[derive(Clone, Debug, PartialEq)]
pub struct MessagesRequest {
    /// The requested model, one this gateway serves.
    pub model: String,
    /// The system prompt, with text blocks joined.
    pub system: Option<String>,
    /// The conversation, each message's text blocks joined.
    pub messages: Vec<Message>,
    /// Upper bound on generated tokens, at least 1.
    pub max_tokens: u32,
    /// Whether to answer with server-sent events.
    pub stream: bool,
    /// Sampling temperature in `[0, 1]`.
    pub temperature: Option<f32>,
    /// Nucleus sampling mass in `(0, 1]`.
    pub top_p: Option<f32>,
    /// Top-k sampling.
    pub top_k: Option<u32>,
    /// Strings that end generation when produced.
    pub stop_sequences: Vec<String>,
    /// `metadata.user_id`, used as the session id for routing when present.
    pub user_id: Option<String>,
    /// Ringmaster's extension (vLLM's `ignore_eos`): generate exactly `max_tokens`, for
    /// replays and benchmarks that must carry a trace's output lengths.
    pub ignore_eos: bool,
    /// A sampling seed (OpenAI's `seed`).
    pub seed: Option<u64>,
    /// A raw prompt (OpenAI's `/v1/completions`), tokenized without the chat template; it is
    /// also `messages`' one user message, so routing and the filters read it like a chat.
    pub raw_prompt: Option<String>,
    /// Which API the reply is written in.
    pub format: ReplyFormat,
    /// The tools the model may call (`None`: none offered, or `tool_choice` none with none).
    pub tools: Option<Box<ToolOffer>>,
}

impl MessagesRequest {
    /// Whether the conversation offers tools or holds tool calls or results: only servers
    /// that call tools can take it.
    pub fn uses_tools(&self) -> bool {
        self.tools.is_some()
            || self
                .messages
                .iter()
                .any(|m| !m.tool_calls.is_empty() || m.tool_call_id.is_some())
    }

    /// Whether a message shows images: only servers that read images can take it.
    pub fn uses_images(&self) -> bool {
        self.messages.iter().any(|m| !m.images.is_empty())
    }
}

/// The API a reply is written in: the one the request came in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReplyFormat {
    /// Anthropic's Messages API.
    #[default]
    Messages,
    /// OpenAI's chat completions; `include_usage` asks for a last chunk with usage.
    OpenAiChat {
        /// `stream_options.include_usage`.
        include_usage: bool,
    },
    /// OpenAI's (legacy) completions.
    OpenAiCompletion {
        /// `stream_options.include_usage`.
        include_usage: bool,
    },
}

impl ReplyFormat {
    /// Whether the reply is OpenAI's.
    pub fn is_openai(self) -> bool {
        !matches!(self, Self::Messages)
    }
}

/// One message of a validated request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// Its text.
    pub text: String,
    /// The tools an assistant message called (Anthropic's `tool_use` blocks, OpenAI's
    /// `tool_calls`).
    pub tool_calls: Vec<ToolCall>,
    /// Set when the message is a tool's result (Anthropic's `tool_result` block, OpenAI's
    /// `tool` message): the call it answers. Its `text` is the result.
    pub tool_call_id: Option<String>,
    /// The images a user message shows (Anthropic's `image` blocks, OpenAI's `image_url`
    /// parts), before its text.
    pub images: Vec<Image>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequest {
    model: String,
    max_tokens: Option<i64>,
    messages: Vec<RawMessage>,
    #[serde(default)]
    system: Option<RawContent>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    top_k: Option<i64>,
    #[serde(default)]
    stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    metadata: Option<RawMetadata>,
    #[serde(default)]
    ignore_eos: bool,
    /// Tools: the client runs them, the servers' models call them ([`tool_offer`]).
    #[serde(default)]
    tools: Option<serde_json::Value>,
    #[serde(default)]
    tool_choice: Option<serde_json::Value>,
    // Fields current SDKs send that this gateway knows but does not (fully) support: each is
    // accepted where it changes nothing and refused by name otherwise (`unsupported_fields`),
    // never reported as an unknown field.
    #[serde(default)]
    service_tier: Option<serde_json::Value>,
    /// Prompt caching, which the servers' prefix caches always do: accepted and ignored.
    #[serde(default)]
    #[allow(dead_code)]
    cache_control: Option<serde_json::Value>,
    #[serde(default)]
    thinking: Option<serde_json::Value>,
    #[serde(default)]
    mcp_servers: Option<serde_json::Value>,
    #[serde(default)]
    container: Option<serde_json::Value>,
}

/// Refuses, by name, the known fields this gateway cannot honour, and lets through those that
/// change nothing here: `service_tier` `auto` or `standard_only` (tiers come from the API
/// key); a top-level `cache_control` (prefix caching is always on); `thinking` disabled.
fn unsupported_fields(raw: &RawRequest) -> Result<(), ApiError> {
    let refuse = |field: &str, what: &str| {
        Err(ApiError::invalid(format!(
            "{field}: {what} is not supported by this gateway yet (the field is known, the feature \
             is not served); leave it out"
        )))
    };
    if let Some(tier) = &raw.service_tier
        && !matches!(tier.as_str(), Some("auto" | "standard_only"))
    {
        return refuse(
            "service_tier",
            "a service tier other than \"auto\" or \"standard_only\" (tiers come from the API key)",
        );
    }
    if let Some(thinking) = &raw.thinking
        && thinking.get("type").and_then(|t| t.as_str()) != Some("disabled")
    {
        return refuse("thinking", "extended thinking");
    }
    if raw.mcp_servers.as_ref().is_some_and(|m| !m.is_null()) {
        return refuse("mcp_servers", "the MCP connector");
    }
    if raw.container.as_ref().is_some_and(|c| !c.is_null()) {
        return refuse("container", "code execution containers");
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMessage {
    role: Role,
    content: RawContent,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawContent {
    Text(String),
    Blocks(Vec<RawBlock>),
}

#[derive(Deserialize)]
struct RawBlock {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
    /// `tool_use`: the call's id, the tool and its input.
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    input: Option<serde_json::Value>,
    /// `tool_result`: the call it answers, the result, and whether it is an error.
    #[serde(default)]
    tool_use_id: Option<String>,
    #[serde(default)]
    content: Option<RawContent>,
    #[serde(default)]
    is_error: Option<bool>,
    /// `image`: where the image is (`base64` data or a `url`).
    #[serde(default)]
    source: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetadata {
    #[serde(default)]
    user_id: Option<String>,
}

/// What the validator needs to know about the gateway.
#[derive(Clone, Copy, Debug)]
pub struct Limits<'a> {
    /// Models this gateway serves.
    pub models: &'a [String],
    /// Largest `max_tokens` accepted.
    pub max_output_tokens: u32,
}

/// Parses and validates a Messages request body.
pub fn parse_messages_request(
    body: &[u8],
    limits: Limits<'_>,
) -> Result<MessagesRequest, ApiError> {
    let raw = parse_json::<RawRequest>(body)?;
    validate(raw, limits)
}

/// Parses and validates a `POST /v1/messages/count_tokens` body: a Messages request whose
/// `max_tokens` may be left out (nothing is generated).
pub fn parse_count_tokens_request(
    body: &[u8],
    limits: Limits<'_>,
) -> Result<MessagesRequest, ApiError> {
    let mut raw = parse_json::<RawRequest>(body)?;
    raw.max_tokens.get_or_insert(1);
    validate(raw, limits)
}

/// Parses `body` as JSON into `T`, with client-facing messages for every failure.
pub fn parse_json<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, ApiError> {
    if body.is_empty() {
        return Err(ApiError::invalid(
            "request body is empty; expected a JSON object",
        ));
    }
    let text = std::str::from_utf8(body).map_err(|e| {
        ApiError::invalid(format!(
            "request body is not valid UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        ))
    })?;
    serde_json::from_str(text).map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                "request body is not valid JSON"
            }
            _ => "request body does not match the expected schema",
        };
        ApiError::invalid(format!("{what}: {e}"))
    })
}

fn validate(mut raw: RawRequest, limits: Limits<'_>) -> Result<MessagesRequest, ApiError> {
    unsupported_fields(&raw)?;
    if raw.model.trim().is_empty() {
        return Err(ApiError::invalid("model: must not be empty"));
    }
    let max_tokens = match raw.max_tokens {
        None => return Err(ApiError::invalid("max_tokens: field required")),
        Some(n) => max_tokens_in_limits(n, "max_tokens", limits)?,
    };
    if raw.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages: at least one message is required",
        ));
    }
    let tools = tool_offer(raw.tools.take(), raw.tool_choice.take())?;
    let mut messages = Vec::with_capacity(raw.messages.len());
    for (i, m) in raw.messages.into_iter().enumerate() {
        let field = format!("messages.{i}.content");
        match m.content {
            RawContent::Text(text) => messages.push(Message {
                role: m.role,
                text,
                ..Message::default()
            }),
            RawContent::Blocks(blocks) => message_blocks(m.role, blocks, &field, &mut messages)?,
        }
    }
    let system = raw
        .system
        .map(|s| content_text(s, "system"))
        .transpose()?
        .filter(|s| !s.is_empty());
    let temperature = unit_interval(raw.temperature, "temperature", true)?;
    let top_p = unit_interval(raw.top_p, "top_p", false)?;
    let top_k = match raw.top_k {
        None => None,
        Some(k) if k < 0 => {
            return Err(ApiError::invalid(format!(
                "top_k: must be non-negative, got {k}"
            )));
        }
        Some(k) => Some(
            u32::try_from(k).map_err(|_| ApiError::invalid(format!("top_k: {k} is too large")))?,
        ),
    };
    let stop_sequences = raw.stop_sequences.unwrap_or_default();
    if let Some(i) = stop_sequences.iter().position(String::is_empty) {
        return Err(ApiError::invalid(format!(
            "stop_sequences.{i}: must not be empty"
        )));
    }
    let user_id = raw.metadata.and_then(|m| m.user_id);
    if let Some(id) = &user_id
        && id.chars().count() > MAX_USER_ID_CHARS
    {
        return Err(ApiError::invalid(format!(
            "metadata.user_id: longer than {MAX_USER_ID_CHARS} characters"
        )));
    }
    if !limits.models.contains(&raw.model) {
        return Err(ApiError::not_found(format!(
            "model: {:?} is not served here; available models: {}",
            raw.model,
            limits.models.join(", ")
        )));
    }
    Ok(MessagesRequest {
        model: raw.model,
        system,
        messages,
        max_tokens,
        stream: raw.stream.unwrap_or(false),
        temperature,
        top_p,
        top_k,
        stop_sequences,
        user_id: user_id.filter(|id| !id.is_empty()),
        ignore_eos: raw.ignore_eos,
        seed: None,
        raw_prompt: None,
        format: ReplyFormat::Messages,
        tools,
    })
}

/// The tools offered (`tools`, `tool_choice`), validated: each a client tool with a name and
/// an input schema (server tools, which Anthropic runs itself, are refused by name).
fn tool_offer(
    tools: Option<serde_json::Value>,
    choice: Option<serde_json::Value>,
) -> Result<Option<Box<ToolOffer>>, ApiError> {
    let tools = match tools {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Array(tools)) => tools,
        Some(_) => return Err(ApiError::invalid("tools: must be a list of tools")),
    };
    let mut specs = Vec::with_capacity(tools.len());
    for (i, tool) in tools.into_iter().enumerate() {
        let serde_json::Value::Object(mut tool) = tool else {
            return Err(ApiError::invalid(format!("tools.{i}: must be an object")));
        };
        if let Some(kind) = tool.get("type").and_then(|t| t.as_str())
            && kind != "custom"
        {
            return Err(ApiError::invalid(format!(
                "tools.{i}.type: {kind:?} is a server tool, and server tools are not supported \
                 by this gateway (it runs no tools itself); only client tools (with an \
                 input_schema) are"
            )));
        }
        let name = match tool.remove("name") {
            Some(serde_json::Value::String(name)) if !name.is_empty() => name,
            _ => {
                return Err(ApiError::invalid(format!(
                    "tools.{i}.name: field required (a non-empty string)"
                )));
            }
        };
        let parameters = match tool.remove("input_schema") {
            Some(schema @ serde_json::Value::Object(_)) => schema,
            _ => {
                return Err(ApiError::invalid(format!(
                    "tools.{i}.input_schema: field required (a JSON schema object)"
                )));
            }
        };
        let description = match tool.remove("description") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(d)) => Some(d),
            Some(_) => {
                return Err(ApiError::invalid(format!(
                    "tools.{i}.description: must be a string"
                )));
            }
        };
        specs.push(ToolSpec {
            name,
            description,
            parameters,
        });
    }
    let (choice, parallel) = match choice {
        None | Some(serde_json::Value::Null) => (ToolChoice::Auto, None),
        Some(choice) => {
            let parallel = match choice.get("disable_parallel_tool_use") {
                None | Some(serde_json::Value::Null) => None,
                Some(serde_json::Value::Bool(disabled)) => Some(!disabled),
                Some(_) => {
                    return Err(ApiError::invalid(
                        "tool_choice.disable_parallel_tool_use: must be true or false",
                    ));
                }
            };
            let kind = choice.get("type").and_then(|t| t.as_str());
            let choice = match kind {
                Some("auto") => ToolChoice::Auto,
                Some("none") => ToolChoice::None,
                Some("any") => ToolChoice::Required,
                Some("tool") => match choice.get("name").and_then(|n| n.as_str()) {
                    Some(name) if specs.iter().any(|t| t.name == name) => {
                        ToolChoice::Named(name.to_owned())
                    }
                    Some(name) => {
                        return Err(ApiError::invalid(format!(
                            "tool_choice.name: {name:?} is not one of the tools offered"
                        )));
                    }
                    None => {
                        return Err(ApiError::invalid(
                            "tool_choice.name: field required with type \"tool\"",
                        ));
                    }
                },
                _ => {
                    return Err(ApiError::invalid(
                        "tool_choice.type: must be one of \"auto\", \"any\", \"tool\", \"none\"",
                    ));
                }
            };
            (choice, parallel)
        }
    };
    tool_offer_of(specs, choice, parallel)
}

/// The offer of `specs` (`None` when there are none and none is asked for); both APIs'
/// parsers end here.
pub(crate) fn tool_offer_of(
    specs: Vec<ToolSpec>,
    choice: ToolChoice,
    parallel: Option<bool>,
) -> Result<Option<Box<ToolOffer>>, ApiError> {
    if specs.is_empty() {
        return match choice {
            ToolChoice::Auto | ToolChoice::None => Ok(None),
            _ => Err(ApiError::invalid(
                "tool_choice: asks for a tool call, but no tools are offered",
            )),
        };
    }
    Ok(Some(Box::new(ToolOffer {
        tools: specs,
        choice,
        parallel,
    })))
}

/// One message's content blocks as messages: an assistant's text and `tool_use` blocks make
/// one message with its calls; a user's `tool_result` blocks make one tool-result message
/// each (first, as OpenAI servers expect them right after the calls), then its text.
fn message_blocks(
    role: Role,
    blocks: Vec<RawBlock>,
    field: &str,
    out: &mut Vec<Message>,
) -> Result<(), ApiError> {
    if blocks.is_empty() {
        return Err(ApiError::invalid(format!(
            "{field}: at least one content block is required"
        )));
    }
    let mut message = Message {
        role,
        ..Message::default()
    };
    let mut has_text = false;
    for (i, block) in blocks.into_iter().enumerate() {
        let at = format!("{field}.{i}");
        match (block.kind.as_str(), role) {
            ("text", _) => {
                let Some(text) = block.text else {
                    return Err(ApiError::invalid(format!("{at}.text: field required")));
                };
                message.text.push_str(&text);
                has_text = true;
            }
            ("tool_use", Role::Assistant) => {
                let (Some(id), Some(name)) = (block.id, block.name) else {
                    return Err(ApiError::invalid(format!(
                        "{at}: a tool_use block needs an id and a name"
                    )));
                };
                let input = match block.input {
                    Some(input @ serde_json::Value::Object(_)) => input,
                    None | Some(serde_json::Value::Null) => serde_json::json!({}),
                    Some(_) => {
                        return Err(ApiError::invalid(format!("{at}.input: must be an object")));
                    }
                };
                message.tool_calls.push(ToolCall {
                    id,
                    name,
                    arguments: input.to_string(),
                });
            }
            ("tool_result", Role::User) => {
                let Some(id) = block.tool_use_id else {
                    return Err(ApiError::invalid(format!(
                        "{at}.tool_use_id: field required"
                    )));
                };
                let mut text = match block.content {
                    None => String::new(),
                    Some(content) => content_text(content, &format!("{at}.content"))?,
                };
                if block.is_error == Some(true) {
                    text.insert_str(0, "Error: ");
                }
                out.push(Message {
                    role: Role::User,
                    text,
                    tool_call_id: Some(id),
                    ..Message::default()
                });
            }
            ("image", Role::User) => message.images.push(image(block.source, &at)?),
            ("tool_use", Role::User)
            | ("tool_result", Role::Assistant)
            | ("image", Role::Assistant) => {
                return Err(ApiError::invalid(format!(
                    "{at}.type: a {:?} block belongs in {} message",
                    block.kind,
                    if block.kind == "tool_use" {
                        "an assistant"
                    } else {
                        "a user"
                    }
                )));
            }
            (other, _) => return Err(unsupported_block(other, &at)),
        }
    }
    if has_text || !message.tool_calls.is_empty() || !message.images.is_empty() {
        out.push(message);
    }
    Ok(())
}

/// Image types every vision model takes (Anthropic's list).
const IMAGE_TYPES: [&str; 4] = ["image/jpeg", "image/png", "image/gif", "image/webp"];

/// An `image` block's source as the URL OpenAI servers take: `base64` data becomes a `data:`
/// URL, a `url` stays as it is.
fn image(source: Option<serde_json::Value>, at: &str) -> Result<Image, ApiError> {
    let source = source.unwrap_or_default();
    let field = |name: &str| source.get(name).and_then(|v| v.as_str());
    match field("type") {
        Some("base64") => {
            let media_type = field("media_type").unwrap_or_default();
            if !IMAGE_TYPES.contains(&media_type) {
                return Err(ApiError::invalid(format!(
                    "{at}.source.media_type: must be one of {}",
                    IMAGE_TYPES.join(", ")
                )));
            }
            let Some(data) = field("data").filter(|d| !d.is_empty()) else {
                return Err(ApiError::invalid(format!(
                    "{at}.source.data: field required (the image, base64-encoded)"
                )));
            };
            Ok(Image {
                url: format!("data:{media_type};base64,{data}"),
            })
        }
        Some("url") => match field("url") {
            Some(url) if url.starts_with("https://") || url.starts_with("http://") => Ok(Image {
                url: url.to_owned(),
            }),
            _ => Err(ApiError::invalid(format!(
                "{at}.source.url: field required (an http or https URL)"
            ))),
        },
        Some("file") => Err(ApiError::invalid(format!(
            "{at}.source.type: \"file\" (the Files API) is not supported by this gateway; \
             send the image as base64 or a URL"
        ))),
        _ => Err(ApiError::invalid(format!(
            "{at}.source.type: must be \"base64\" or \"url\""
        ))),
    }
}

/// The 400 for a content block this gateway does not take, naming its feature.
fn unsupported_block(kind: &str, at: &str) -> ApiError {
    let feature = match kind {
        "server_tool_use" | "web_search_tool_result" | "mcp_tool_use" | "mcp_tool_result" => {
            " (server tools are not supported by this gateway)"
        }
        "image" => " (images go in user messages)",
        "document" => " (documents are not supported by this gateway yet)",
        "thinking" | "redacted_thinking" => {
            " (extended thinking is not supported by this gateway yet)"
        }
        _ => "",
    };
    ApiError::invalid(format!(
        "{at}.type: content blocks of type {kind:?} are not supported here; \"text\", \
         \"tool_use\" and \"tool_result\" are{feature}"
    ))
}

/// `n` as a `max_tokens` (named `field` in messages): at least 1, at most the gateway's limit.
pub(crate) fn max_tokens_in_limits(
    n: i64,
    field: &str,
    limits: Limits<'_>,
) -> Result<u32, ApiError> {
    if n < 1 {
        return Err(ApiError::invalid(format!(
            "{field}: must be at least 1, got {n}"
        )));
    }
    if n > i64::from(limits.max_output_tokens) {
        return Err(ApiError::invalid(format!(
            "{field}: {n} is greater than this gateway's limit of {}",
            limits.max_output_tokens
        )));
    }
    Ok(u32::try_from(n).expect("bounded above by a u32"))
}

/// The text of a system prompt or a tool's result: its text blocks, joined.
fn content_text(content: RawContent, field: &str) -> Result<String, ApiError> {
    match content {
        RawContent::Text(text) => Ok(text),
        RawContent::Blocks(blocks) => {
            let mut text = String::new();
            for (i, block) in blocks.into_iter().enumerate() {
                if block.kind != "text" {
                    return Err(unsupported_block(&block.kind, &format!("{field}.{i}")));
                }
                let Some(block_text) = block.text else {
                    return Err(ApiError::invalid(format!(
                        "{field}.{i}.text: field required"
                    )));
                };
                text.push_str(&block_text);
            }
            Ok(text)
        }
    }
}

fn unit_interval(value: Option<f64>, field: &str, zero_ok: bool) -> Result<Option<f32>, ApiError> {
    match value {
        None => Ok(None),
        Some(v) if v.is_finite() && v <= 1.0 && (v > 0.0 || (zero_ok && v == 0.0)) => {
            Ok(Some(v as f32))
        }
        Some(v) => Err(ApiError::invalid(format!(
            "{field}: must be {} 0 and at most 1, got {v}",
            if zero_ok { "at least" } else { "greater than" }
        ))),
    }
}

/// Why generation stopped, as Anthropic names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model finished its turn.
    EndTurn,
    /// `max_tokens` was reached.
    MaxTokens,
    /// One of `stop_sequences` was produced.
    StopSequence,
    /// The safety filter (or the server's own content filter) blocked the rest of the reply.
    Refusal,
    /// The model called a tool (a server's `tool_calls`).
    ToolUse,
}

/// Token accounting of one response.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Prompt tokens that were computed (not read from the KV cache).
    pub input_tokens: u32,
    /// Generated tokens.
    pub output_tokens: u32,
    /// Prompt tokens served from the GPU server's prefix cache.
    pub cache_read_input_tokens: u32,
    /// Prompt tokens written to an explicit cache; always 0 (no `cache_control` support).
    pub cache_creation_input_tokens: u32,
}

/// A content block of a response.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// A call of one of the request's tools.
    ToolUse {
        /// The call's id (the server's), which the client's `tool_result` names.
        id: String,
        /// The tool.
        name: String,
        /// Its input (`{}` in a stream's `content_block_start`: it comes as
        /// `input_json_delta`s).
        input: serde_json::Value,
    },
}

impl ContentBlock {
    /// A text block holding `text`.
    pub fn text(text: String) -> Self {
        Self::Text { text }
    }
}

/// What a `content_block_delta` adds to its block.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockDelta {
    /// More text.
    TextDelta {
        /// The new text.
        text: String,
    },
    /// More of a tool call's input, as JSON text (whole only once all pieces are joined).
    InputJsonDelta {
        /// The new piece.
        partial_json: String,
    },
}

/// The non-streaming response body, also the `message` of `message_start`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MessageResponse {
    /// `msg_…`.
    pub id: String,
    /// Always `"message"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Always `assistant`.
    pub role: Role,
    /// The model that answered.
    pub model: String,
    /// The reply (empty in `message_start`).
    pub content: Vec<ContentBlock>,
    /// Why generation stopped (`null` in `message_start`).
    pub stop_reason: Option<StopReason>,
    /// The stop sequence that matched, if any.
    pub stop_sequence: Option<String>,
    /// Token accounting.
    pub usage: Usage,
}

/// The server-sent events of a streamed reply, in Anthropic's order.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    /// First event: the message with empty content.
    MessageStart {
        /// The message so far.
        message: MessageResponse,
    },
    /// A content block opens.
    ContentBlockStart {
        /// Block index: 0 for the text, then one per tool call.
        index: u32,
        /// The empty block.
        content_block: ContentBlock,
    },
    /// Keep-alive.
    Ping,
    /// Text arrives.
    ContentBlockDelta {
        /// Block index.
        index: u32,
        /// What is added.
        delta: BlockDelta,
    },
    /// The content block is complete.
    ContentBlockStop {
        /// Block index.
        index: u32,
    },
    /// Top-level changes at the end: the stop reason and final usage.
    MessageDelta {
        /// The stop reason.
        delta: MessageDeltaBody,
        /// Final usage.
        usage: Usage,
    },
    /// Last event.
    MessageStop,
    /// A failure after the stream began.
    Error {
        /// `{"type":…,"message":…}`.
        error: serde_json::Value,
    },
}

/// The `delta` of `message_delta`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MessageDeltaBody {
    /// Why generation stopped.
    pub stop_reason: StopReason,
    /// The stop sequence that matched, if any.
    pub stop_sequence: Option<String>,
}

impl StreamEvent {
    /// The SSE `event:` name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::MessageStart { .. } => "message_start",
            Self::ContentBlockStart { .. } => "content_block_start",
            Self::Ping => "ping",
            Self::ContentBlockDelta { .. } => "content_block_delta",
            Self::ContentBlockStop { .. } => "content_block_stop",
            Self::MessageDelta { .. } => "message_delta",
            Self::MessageStop => "message_stop",
            Self::Error { .. } => "error",
        }
    }

    /// A text delta event for block `index`.
    pub fn text(index: u32, text: String) -> Self {
        Self::ContentBlockDelta {
            index,
            delta: BlockDelta::TextDelta { text },
        }
    }

    /// The event as an SSE frame: `event: NAME\ndata: JSON\n\n`.
    pub fn to_sse(&self) -> String {
        let mut out = Vec::new();
        self.write_sse(&mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// Appends the event's SSE frame to `out` (frames of one batch share one buffer, and so
    /// one write to the client).
    pub fn write_sse(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(self.name().as_bytes());
        out.extend_from_slice(b"\ndata: ");
        if serde_json::to_writer(&mut *out, self).is_err() {
            out.extend_from_slice(b"{}");
        }
        out.extend_from_slice(b"\n\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> (Vec<String>, u32) {
        (vec!["sim-llama-3-8b".to_owned()], 4096)
    }

    fn parse(body: &str) -> Result<MessagesRequest, ApiError> {
        let (models, max) = limits();
        parse_messages_request(
            body.as_bytes(),
            Limits {
                models: &models,
                max_output_tokens: max,
            },
        )
    }

    #[test]
    fn fields_sdks_send_are_accepted_or_refused_by_name_never_as_unknown() {
        let with = |extra: &str| {
            parse(&format!(
                r#"{{"model":"sim-llama-3-8b","max_tokens":8,"messages":[{{"role":"user","content":"Hi"}}]{extra}}}"#
            ))
        };
        // Nothing to change here: accepted.
        for ok in [
            r#","tools":[]"#,
            r#","tool_choice":{"type":"auto"}"#,
            r#","service_tier":"auto""#,
            r#","cache_control":{"type":"ephemeral"}"#,
            r#","thinking":{"type":"disabled"}"#,
        ] {
            assert!(with(ok).is_ok(), "{ok}");
        }
        // Features not served: refused, naming the field and the feature.
        for (extra, field, feature) in [
            (
                r#","tools":[{"type":"web_search_20250305","name":"web_search"}]"#,
                "tools.0.type",
                "server tool",
            ),
            (
                r#","service_tier":"priority""#,
                "service_tier",
                "service tier",
            ),
            (
                r#","thinking":{"type":"enabled","budget_tokens":1024}"#,
                "thinking",
                "extended thinking",
            ),
            (
                r#","mcp_servers":[{"type":"url","url":"https://x","name":"x"}]"#,
                "mcp_servers",
                "MCP",
            ),
        ] {
            let err = with(extra).unwrap_err();
            let message = err.message();
            assert!(
                message.starts_with(&format!("{field}: "))
                    && message.contains(feature)
                    && message.contains("not supported")
                    && !message.contains("unknown field"),
                "{extra}: {message}"
            );
        }
        let err = parse(
            r#"{"model":"sim-llama-3-8b","max_tokens":8,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"url","url":"https://x/y.pdf"}}]}]}"#,
        )
        .unwrap_err();
        assert!(
            err.message().starts_with("messages.0.content.0.type:")
                && err.message().contains("documents are not supported"),
            "{}",
            err.message()
        );
        // A field nobody sends is still an unknown field.
        assert!(
            with(r#","colour":"blue""#)
                .unwrap_err()
                .message()
                .contains("unknown field")
        );
    }

    #[test]
    fn tools_and_tool_blocks_become_an_offer_and_messages() {
        let req = parse(
            r#"{"model":"sim-llama-3-8b","max_tokens":16,
                "tools":[{"name":"get_weather","description":"Weather","input_schema":{"type":"object"},
                          "cache_control":{"type":"ephemeral"}}],
                "tool_choice":{"type":"tool","name":"get_weather","disable_parallel_tool_use":true},
                "messages":[{"role":"user","content":"Weather in Paris?"},
                            {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"get_weather","input":{"city":"Paris"}}]},
                            {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"18 C","is_error":true},
                                                      {"type":"text","text":"Thanks"}]}]}"#,
        )
        .unwrap();
        let offer = req.tools.as_deref().unwrap();
        assert_eq!(offer.tools.len(), 1);
        assert_eq!(offer.tools[0].name, "get_weather");
        assert_eq!(offer.tools[0].description.as_deref(), Some("Weather"));
        assert_eq!(offer.choice, ToolChoice::Named("get_weather".into()));
        assert_eq!(offer.parallel, Some(false));
        assert!(req.uses_tools());
        assert_eq!(req.messages.len(), 4);
        assert_eq!(req.messages[1].role, Role::Assistant);
        assert_eq!(
            req.messages[1].tool_calls,
            [ToolCall {
                id: "t1".into(),
                name: "get_weather".into(),
                arguments: r#"{"city":"Paris"}"#.into()
            }]
        );
        assert_eq!(req.messages[2].tool_call_id.as_deref(), Some("t1"));
        assert_eq!(req.messages[2].text, "Error: 18 C");
        assert_eq!(req.messages[3].text, "Thanks");
        assert_eq!(req.messages[3].tool_call_id, None);

        // `tool_choice` none with no tools is nothing; asking for a call with none is an error.
        let none = parse(
            r#"{"model":"sim-llama-3-8b","max_tokens":8,"tools":[],"tool_choice":{"type":"none"},"messages":[{"role":"user","content":"Hi"}]}"#,
        )
        .unwrap();
        assert!(none.tools.is_none() && !none.uses_tools());
        for (body, starts) in [
            (
                r#""tool_choice":{"type":"any"}"#,
                "tool_choice: asks for a tool call",
            ),
            (
                r#""tools":[{"name":"x","input_schema":{}}],"tool_choice":{"type":"tool","name":"y"}"#,
                "tool_choice.name:",
            ),
            (r#""tools":[{"name":"x"}]"#, "tools.0.input_schema:"),
            (r#""tools":[{"input_schema":{}}]"#, "tools.0.name:"),
            (r#""tools":{}"#, "tools: must be a list"),
        ] {
            let err = parse(&format!(
                r#"{{"model":"sim-llama-3-8b","max_tokens":8,{body},"messages":[{{"role":"user","content":"Hi"}}]}}"#
            ))
            .unwrap_err();
            assert!(
                err.message().starts_with(starts),
                "{body}: {}",
                err.message()
            );
        }
        // Blocks in the wrong turn.
        for (role, block, starts) in [
            (
                "user",
                r#"{"type":"tool_use","id":"t","name":"x","input":{}}"#,
                "messages.0.content.0.type: a \"tool_use\" block belongs in an assistant message",
            ),
            (
                "assistant",
                r#"{"type":"tool_result","tool_use_id":"t","content":"x"}"#,
                "messages.0.content.0.type: a \"tool_result\" block belongs in a user message",
            ),
            (
                "assistant",
                r#"{"type":"tool_use","id":"t","name":"x","input":[1]}"#,
                "messages.0.content.0.input: must be an object",
            ),
        ] {
            assert_block_refused(role, block, starts);
        }
    }

    /// A one-message request whose `role` turn holds `block` is refused with a message that
    /// starts with `starts`.
    fn assert_block_refused(role: &str, block: &str, starts: &str) {
        let err = parse(&format!(
            r#"{{"model":"sim-llama-3-8b","max_tokens":8,"messages":[{{"role":"{role}","content":[{block}]}}]}}"#
        ))
        .unwrap_err();
        assert!(
            err.message().starts_with(starts),
            "{block}: {}",
            err.message()
        );
    }

    #[test]
    fn image_blocks_become_urls_of_user_messages() {
        let req = parse(
            r#"{"model":"sim-llama-3-8b","max_tokens":8,"messages":[{"role":"user","content":[
                {"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},
                {"type":"image","source":{"type":"url","url":"https://example.com/cat.jpg"}},
                {"type":"text","text":"What are these?"}]}]}"#,
        )
        .unwrap();
        assert!(req.uses_images());
        let urls: Vec<&str> = req.messages[0]
            .images
            .iter()
            .map(|i| i.url.as_str())
            .collect();
        assert_eq!(
            urls,
            [
                "data:image/png;base64,iVBORw0KGgo=",
                "https://example.com/cat.jpg"
            ]
        );
        assert_eq!(req.messages[0].text, "What are these?");
        for (block, role, starts) in [
            (
                r#"{"type":"image","source":{"type":"base64","media_type":"image/bmp","data":"x"}}"#,
                "user",
                "messages.0.content.0.source.media_type: must be one of",
            ),
            (
                r#"{"type":"image","source":{"type":"base64","media_type":"image/png"}}"#,
                "user",
                "messages.0.content.0.source.data: field required",
            ),
            (
                r#"{"type":"image","source":{"type":"url","url":"ftp://x"}}"#,
                "user",
                "messages.0.content.0.source.url:",
            ),
            (
                r#"{"type":"image","source":{"type":"file","file_id":"f"}}"#,
                "user",
                "messages.0.content.0.source.type: \"file\"",
            ),
            (
                r#"{"type":"image","source":{"type":"url","url":"https://x/y.png"}}"#,
                "assistant",
                "messages.0.content.0.type: a \"image\" block belongs in a user message",
            ),
        ] {
            assert_block_refused(role, block, starts);
        }
    }

    #[test]
    fn accepts_string_and_block_content() {
        let req = parse(
            r#"{"model":"sim-llama-3-8b","max_tokens":16,
                "system":[{"type":"text","text":"Be "},{"type":"text","text":"brief.","cache_control":{"type":"ephemeral"}}],
                "messages":[{"role":"user","content":"Hi"},
                            {"role":"assistant","content":[{"type":"text","text":"Hello"}]},
                            {"role":"user","content":"More"}],
                "stream":true,"temperature":0.5,"top_p":0.9,"top_k":40,
                "stop_sequences":["END"],"metadata":{"user_id":"session-7"}}"#,
        )
        .unwrap();
        assert_eq!(req.system.as_deref(), Some("Be brief."));
        assert_eq!(req.messages.len(), 3);
        assert_eq!(req.messages[1].role, Role::Assistant);
        assert_eq!(req.messages[1].text, "Hello");
        assert!(req.stream);
        assert_eq!(req.top_k, Some(40));
        assert_eq!(req.user_id.as_deref(), Some("session-7"));
    }

    #[test]
    fn names_the_problem() {
        let cases = [
            ("", "empty"),
            ("{", "not valid JSON"),
            (
                r#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":"x"}]}"#,
                "max_tokens: field required",
            ),
            (
                r#"{"model":"sim-llama-3-8b","max_tokens":"ten","messages":[]}"#,
                "expected i64",
            ),
            (
                r#"{"model":"sim-llama-3-8b","max_tokens":0,"messages":[{"role":"user","content":"x"}]}"#,
                "at least 1",
            ),
            (
                r#"{"model":"sim-llama-3-8b","max_tokens":5000,"messages":[{"role":"user","content":"x"}]}"#,
                "limit of 4096",
            ),
            (
                r#"{"model":"sim-llama-3-8b","max_tokens":5,"messages":[]}"#,
                "at least one message",
            ),
            (
                r#"{"model":"sim-llama-3-8b","max_tokens":5,"messages":[{"role":"robot","content":"x"}]}"#,
                "unknown variant `robot`",
            ),
            (
                r#"{"model":"sim-llama-3-8b","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image"}]}]}"#,
                "messages.0.content.0.source.type: must be",
            ),
            (
                r#"{"model":"sim-llama-3-8b","max_tokens":5,"messages":[{"role":"user","content":"x"}],"temperature":1.5}"#,
                "temperature",
            ),
            (
                r#"{"model":"sim-llama-3-8b","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f"}]}"#,
                "tools.0.input_schema: field required",
            ),
            (
                r#"{"model":"sim-llama-3-8b","max_tokens":5,"messages":[{"role":"user","content":"x"}],"stop_sequences":[""]}"#,
                "stop_sequences.0",
            ),
        ];
        for (body, needle) in cases {
            let err = parse(body).unwrap_err();
            assert_eq!(
                err.kind(),
                crate::error::ErrorKind::InvalidRequest,
                "{body}"
            );
            assert!(err.message().contains(needle), "{body}: {}", err.message());
        }
    }

    #[test]
    fn invalid_utf8_is_a_client_error() {
        let (models, max) = limits();
        let err = parse_messages_request(
            b"{\"model\":\"\xff\"}",
            Limits {
                models: &models,
                max_output_tokens: max,
            },
        )
        .unwrap_err();
        assert!(err.message().contains("UTF-8"), "{}", err.message());
    }

    #[test]
    fn unknown_model_is_not_found() {
        let err =
            parse(r#"{"model":"gpt-9","max_tokens":5,"messages":[{"role":"user","content":"x"}]}"#)
                .unwrap_err();
        assert_eq!(err.kind(), crate::error::ErrorKind::NotFound);
        assert!(err.message().contains("gpt-9"));
    }

    #[test]
    fn sse_frames_carry_name_and_type() {
        let frame = StreamEvent::text(0, "hi".into()).to_sse();
        assert!(frame.starts_with("event: content_block_delta\ndata: {"));
        assert!(frame.contains(r#""type":"content_block_delta""#));
        assert!(frame.contains(r#""delta":{"type":"text_delta","text":"hi"}"#));
        assert!(frame.ends_with("\n\n"));
        assert_eq!(
            StreamEvent::MessageStop.to_sse(),
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        );
    }

    mod never_panics {
        use super::*;
        use proptest::prelude::*;

        fn json_value() -> impl Strategy<Value = serde_json::Value> {
            let leaf = prop_oneof![
                Just(serde_json::Value::Null),
                any::<bool>().prop_map(serde_json::Value::from),
                any::<i64>().prop_map(serde_json::Value::from),
                any::<f64>()
                    .prop_filter("finite", |f| f.is_finite())
                    .prop_map(serde_json::Value::from),
                ".{0,12}".prop_map(serde_json::Value::from),
                Just(serde_json::Value::from("sim-llama-3-8b")),
                Just(serde_json::Value::from("user")),
                Just(serde_json::Value::from("text")),
            ];
            leaf.prop_recursive(4, 48, 6, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..4)
                        .prop_map(serde_json::Value::from),
                    proptest::collection::btree_map(
                        prop_oneof![
                            Just("model".to_owned()),
                            Just("max_tokens".to_owned()),
                            Just("messages".to_owned()),
                            Just("role".to_owned()),
                            Just("content".to_owned()),
                            Just("type".to_owned()),
                            Just("text".to_owned()),
                            Just("system".to_owned()),
                            Just("stream".to_owned()),
                            Just("top_k".to_owned()),
                            Just("metadata".to_owned()),
                            Just("user_id".to_owned()),
                            "[a-z_]{1,8}",
                        ],
                        inner,
                        0..6,
                    )
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
                ]
            })
        }

        proptest! {
            #[test]
            fn arbitrary_bytes_give_a_client_error(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
                let (models, max) = limits();
                if let Err(e) = parse_messages_request(&bytes, Limits { models: &models, max_output_tokens: max }) {
                    prop_assert!(e.kind().status().is_client_error());
                    prop_assert!(!e.message().is_empty());
                }
            }

            #[test]
            fn near_valid_json_gives_a_request_or_a_client_error(value in json_value()) {
                let (models, max) = limits();
                let bytes = serde_json::to_vec(&value).unwrap();
                match parse_messages_request(&bytes, Limits { models: &models, max_output_tokens: max }) {
                    Ok(request) => {
                        prop_assert!(!request.messages.is_empty());
                        prop_assert!(request.max_tokens >= 1 && request.max_tokens <= max);
                    }
                    Err(e) => prop_assert!(e.kind().status().is_client_error()),
                }
            }
        }
    }
}
