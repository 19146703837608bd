//! The Anthropic Messages API as the gateway speaks it: request parsing, validation, and the
//! response and stream-event shapes.
//!
//! Parsing goes raw → validated: [`parse_messages_request`] turns body bytes into a
//! [`MessagesRequest`] whose invariants hold (a known model, `max_tokens` in range, at least one
//! message, text-only content), or into an [`ApiError`] that names the offending field. Nothing
//! past this module sees the raw JSON. This module does no I/O and knows nothing of routing.

use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// Longest `metadata.user_id` accepted (Anthropic's own limit).
pub const MAX_USER_ID_CHARS: usize = 256;

/// Who wrote a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The human side.
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// Its text.
    pub text: String,
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
    // Fields current SDKs send that this gateway knows but does not (fully) support: each is
    // accepted where it changes nothing and refused by name otherwise (`unsupported_fields`),
    // never reported as an unknown field.
    #[serde(default)]
    tools: Option<serde_json::Value>,
    #[serde(default)]
    tool_choice: Option<serde_json::Value>,
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
/// change nothing here: no tools (or an empty list) with `tool_choice` `auto` or `none`;
/// `service_tier` `auto` or `standard_only` (tiers come from the API key); a top-level
/// `cache_control` (prefix caching is always on); `thinking` disabled.
fn unsupported_fields(raw: &RawRequest) -> Result<(), ApiError> {
    let refuse = |field: &str, what: &str| {
        Err(ApiError::invalid(format!(
            "{field}: {what} is not supported by this gateway yet (the field is known, the feature \
             is not served); leave it out"
        )))
    };
    let has_tools = raw
        .tools
        .as_ref()
        .is_some_and(|t| !t.is_null() && t.as_array().is_none_or(|a| !a.is_empty()));
    if has_tools {
        return refuse("tools", "tool use");
    }
    if let Some(choice) = &raw.tool_choice {
        let kind = choice.get("type").and_then(|t| t.as_str());
        if !matches!(kind, Some("auto" | "none")) && !choice.is_null() {
            return refuse("tool_choice", "tool use");
        }
    }
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

fn validate(raw: RawRequest, limits: Limits<'_>) -> Result<MessagesRequest, ApiError> {
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
    let messages = raw
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let text = content_text(m.content, &format!("messages.{i}.content"))?;
            Ok(Message { role: m.role, text })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
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
    })
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

fn content_text(content: RawContent, field: &str) -> Result<String, ApiError> {
    match content {
        RawContent::Text(text) => Ok(text),
        RawContent::Blocks(blocks) => {
            if blocks.is_empty() && field != "system" {
                return Err(ApiError::invalid(format!(
                    "{field}: at least one content block is required"
                )));
            }
            let mut text = String::new();
            for (i, block) in blocks.into_iter().enumerate() {
                if block.kind != "text" {
                    let feature = match block.kind.as_str() {
                        "tool_use" | "tool_result" | "server_tool_use" => {
                            " (tool use is not supported by this gateway yet)"
                        }
                        "image" | "document" => {
                            " (images and documents are not supported by this gateway yet)"
                        }
                        "thinking" | "redacted_thinking" => {
                            " (extended thinking is not supported by this gateway yet)"
                        }
                        _ => "",
                    };
                    return Err(ApiError::invalid(format!(
                        "{field}.{i}.type: content blocks of type {:?} are not supported; only \"text\" is{feature}",
                        block.kind
                    )));
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

/// A text content block of a response.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TextBlock {
    /// Always `"text"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The text.
    pub text: String,
}

impl TextBlock {
    /// A text block holding `text`.
    pub fn new(text: String) -> Self {
        Self { kind: "text", text }
    }
}

/// The non-streaming response body, also the `message` of `message_start`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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
    pub content: Vec<TextBlock>,
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
        /// Block index (always 0: one text block).
        index: u32,
        /// The empty block.
        content_block: TextBlock,
    },
    /// Keep-alive.
    Ping,
    /// Text arrives.
    ContentBlockDelta {
        /// Block index.
        index: u32,
        /// The new text.
        delta: TextDelta,
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

/// A `text_delta`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TextDelta {
    /// Always `"text_delta"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The new text.
    pub text: String,
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

    /// A text delta event for block 0.
    pub fn text(text: String) -> Self {
        Self::ContentBlockDelta {
            index: 0,
            delta: TextDelta {
                kind: "text_delta",
                text,
            },
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
                r#","tools":[{"name":"get_weather","input_schema":{"type":"object"}}]"#,
                "tools",
                "tool use",
            ),
            (
                r#","tool_choice":{"type":"any"}"#,
                "tool_choice",
                "tool use",
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
            r#"{"model":"sim-llama-3-8b","max_tokens":8,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"42"}]}]}"#,
        )
        .unwrap_err();
        assert!(
            err.message().contains("tool use is not supported"),
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
                "\"image\" are not supported",
            ),
            (
                r#"{"model":"sim-llama-3-8b","max_tokens":5,"messages":[{"role":"user","content":"x"}],"temperature":1.5}"#,
                "temperature",
            ),
            (
                r#"{"model":"sim-llama-3-8b","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f"}]}"#,
                "tools: tool use is not supported",
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
        let frame = StreamEvent::text("hi".into()).to_sse();
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
