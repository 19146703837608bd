//! Anthropic's Messages API: the request (`POST /v1/messages` and `count_tokens`), the whole
//! message, the stream's events, usage and the error body.
//!
//! The request's fields are all optional so that the door, not serde, says what is missing.
//! Every field the API defines is named here, those the gateway does not use as
//! [`Skipped`] (read over, never copied), so that a field nobody knows can be told apart:
//! the door reads through `serde_ignored` and decides what to do with the rest (pass it on,
//! drop it, or refuse it: `[api] unknown_fields`). The reply types borrow what they write (a
//! token's text is written straight from the buffer it arrived in), and a tool call's input
//! is written as the JSON text it was collected as. [`StreamEventIn`] reads a Messages
//! server's own replies (streamed or whole) back.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::{Skipped, Str};

/// `POST /v1/messages` (and `POST /v1/messages/count_tokens`): every field the API defines.
#[derive(Debug, Default, Deserialize)]
pub struct Request<'a> {
    /// The model.
    #[serde(default, borrow)]
    pub model: Option<Str<'a>>,
    /// Most tokens to generate (required, but by the door's word).
    #[serde(default)]
    pub max_tokens: Option<i64>,
    /// The conversation.
    #[serde(default, borrow)]
    pub messages: Option<Vec<Message<'a>>>,
    /// The system prompt: text, or text blocks.
    #[serde(default, borrow)]
    pub system: Option<Content<'a>>,
    /// Whether to stream.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Sampling temperature.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Top-k sampling.
    #[serde(default)]
    pub top_k: Option<i64>,
    /// Strings that end generation.
    #[serde(default, borrow)]
    pub stop_sequences: Option<Vec<Str<'a>>>,
    /// `user_id`.
    #[serde(default, borrow)]
    pub metadata: Option<Metadata<'a>>,
    /// Ringmaster's extension (vLLM's `ignore_eos`): generate exactly `max_tokens`.
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// Tools the model may call.
    #[serde(default, borrow)]
    pub tools: Option<Vec<Tool<'a>>>,
    /// Whether and which tool must be called.
    #[serde(default, borrow)]
    pub tool_choice: Option<ToolChoice<'a>>,
    /// The service tier.
    #[serde(default)]
    pub service_tier: Option<Value>,
    /// Prompt caching.
    #[serde(default)]
    pub cache_control: Option<Skipped>,
    /// Extended thinking: `{"type": "enabled", "budget_tokens": N}`, `adaptive` or `disabled`.
    #[serde(default, borrow)]
    pub thinking: Option<Thinking<'a>>,
    /// Output settings: `effort` and a structured `format`.
    #[serde(default, borrow)]
    pub output_config: Option<OutputConfig<'a>>,
    /// Server-side context editing (clearing old tool results and thinking): a server without
    /// it sees the whole context instead.
    #[serde(default)]
    pub context_management: Option<Skipped>,
    /// Where inference runs (Anthropic's data residency).
    #[serde(default)]
    pub inference_geo: Option<Skipped>,
    /// The MCP connector.
    #[serde(default)]
    pub mcp_servers: Option<Value>,
    /// Code execution containers.
    #[serde(default)]
    pub container: Option<Value>,
}

/// `thinking`.
#[derive(Debug, Default, Deserialize)]
pub struct Thinking<'a> {
    /// `enabled`, `adaptive` or `disabled`.
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<Str<'a>>,
    /// `enabled`: the most tokens to think with.
    #[serde(default)]
    pub budget_tokens: Option<i64>,
    /// Whether thinking is shown (`summarized`, `omitted`).
    #[serde(default)]
    pub display: Option<Skipped>,
}

/// `output_config`.
#[derive(Debug, Default, Deserialize)]
pub struct OutputConfig<'a> {
    /// `low`, `medium`, `high`, `max`: how hard the model works.
    #[serde(default, borrow)]
    pub effort: Option<Str<'a>>,
    /// Structured output: `{"type": "json_schema", "schema": {...}}`.
    #[serde(default, borrow)]
    pub format: Option<OutputFormat<'a>>,
}

/// `output_config.format`.
#[derive(Debug, Default, Deserialize)]
pub struct OutputFormat<'a> {
    /// `json_schema`.
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<Str<'a>>,
    /// The schema, as the JSON text it came as.
    #[serde(default, borrow)]
    pub schema: Option<&'a RawValue>,
}

/// `metadata`.
#[derive(Debug, Default, Deserialize)]
pub struct Metadata<'a> {
    /// The end user: a session key for routing.
    #[serde(default, borrow)]
    pub user_id: Option<Str<'a>>,
}

/// Who wrote a message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The human side (and the results of the tools the model called).
    #[default]
    User,
    /// The model side.
    Assistant,
    /// Instructions in the middle of a conversation (Claude Code sends its environment so).
    System,
}

/// One message.
#[derive(Debug, Deserialize)]
pub struct Message<'a> {
    /// Who wrote it.
    pub role: Role,
    /// Its content.
    #[serde(borrow)]
    pub content: Content<'a>,
}

/// Content: a string, or blocks.
#[derive(Debug)]
pub enum Content<'a> {
    /// Text.
    Text(Str<'a>),
    /// Blocks.
    List(Vec<Block<'a>>),
}
crate::str::string_or_list!(Content, "a string or a list of content blocks");

/// One content block, of any type: each type reads the fields it has.
#[derive(Debug, Default, Deserialize)]
pub struct Block<'a> {
    /// `text`, `image`, `tool_use`, `tool_result`, `document`, `thinking`, ….
    #[serde(rename = "type", default, borrow)]
    pub kind: Str<'a>,
    /// `text`: the text.
    #[serde(default, borrow)]
    pub text: Option<Str<'a>>,
    /// `tool_use`: the call's id.
    #[serde(default, borrow)]
    pub id: Option<Str<'a>>,
    /// `tool_use`: the tool.
    #[serde(default, borrow)]
    pub name: Option<Str<'a>>,
    /// `tool_use`: its input, as the JSON text it came as.
    #[serde(default, borrow)]
    pub input: Option<&'a RawValue>,
    /// `tool_result`: the call it answers.
    #[serde(default, borrow)]
    pub tool_use_id: Option<Str<'a>>,
    /// `tool_result`: the result.
    #[serde(default, borrow)]
    pub content: Option<Box<Content<'a>>>,
    /// `tool_result`: whether it is an error.
    #[serde(default)]
    pub is_error: Option<bool>,
    /// `image` and `document`: where it is.
    #[serde(default, borrow)]
    pub source: Option<ImageSource<'a>>,
    /// `thinking`: the model's reasoning.
    #[serde(default, borrow)]
    pub thinking: Option<Str<'a>>,
    /// `thinking`: its signature (Anthropic's own, checked only by Anthropic).
    #[serde(default)]
    pub signature: Option<Skipped>,
    /// `redacted_thinking`: the encrypted reasoning.
    #[serde(default)]
    pub data: Option<Skipped>,
    /// Prompt caching breakpoints.
    #[serde(default)]
    pub cache_control: Option<Skipped>,
    /// `text` and `document`: citations.
    #[serde(default)]
    pub citations: Option<Skipped>,
    /// `document`: its title.
    #[serde(default)]
    pub title: Option<Skipped>,
    /// `document`: context about it.
    #[serde(default)]
    pub context: Option<Skipped>,
    /// `tool_use`: who called it (programmatic tool calling).
    #[serde(default)]
    pub caller: Option<Skipped>,
}

/// An image's or a document's source.
#[derive(Debug, Default, Deserialize)]
pub struct ImageSource<'a> {
    /// `base64`, `url`, `file` (and `text` or `content` for documents).
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<Str<'a>>,
    /// `base64`: the image type.
    #[serde(default, borrow)]
    pub media_type: Option<Str<'a>>,
    /// `base64`: the image.
    #[serde(default, borrow)]
    pub data: Option<Str<'a>>,
    /// `url`: where it is.
    #[serde(default, borrow)]
    pub url: Option<Str<'a>>,
    /// `file`: the Files API's id.
    #[serde(default)]
    pub file_id: Option<Skipped>,
}

/// A tool offered.
#[derive(Debug, Default, Deserialize)]
pub struct Tool<'a> {
    /// Absent or `custom` for a client tool; a server tool's versioned type otherwise.
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<Str<'a>>,
    /// Its name.
    #[serde(default, borrow)]
    pub name: Option<Str<'a>>,
    /// What it does.
    #[serde(default, borrow)]
    pub description: Option<Str<'a>>,
    /// Its input's JSON schema, as the JSON text it came as.
    #[serde(default, borrow)]
    pub input_schema: Option<&'a RawValue>,
    /// Prompt caching breakpoints.
    #[serde(default)]
    pub cache_control: Option<Skipped>,
    /// Loaded only when a tool search finds it (the tool is offered all the same here).
    #[serde(default)]
    pub defer_loading: Option<Skipped>,
    /// Examples of its input.
    #[serde(default)]
    pub input_examples: Option<Skipped>,
    /// Strict schema adherence.
    #[serde(default)]
    pub strict: Option<Skipped>,
    /// Streams its input without buffering.
    #[serde(default)]
    pub eager_input_streaming: Option<Skipped>,
    /// Who may call it (programmatic tool calling).
    #[serde(default)]
    pub allowed_callers: Option<Skipped>,
}

/// `tool_choice`.
#[derive(Debug, Default, Deserialize)]
pub struct ToolChoice<'a> {
    /// `auto`, `any`, `tool` or `none`.
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<Str<'a>>,
    /// `tool`: which.
    #[serde(default, borrow)]
    pub name: Option<Str<'a>>,
    /// At most one call.
    #[serde(default)]
    pub disable_parallel_tool_use: Option<bool>,
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model finished its turn.
    EndTurn,
    /// `max_tokens` was reached.
    MaxTokens,
    /// One of `stop_sequences` was produced.
    StopSequence,
    /// A filter blocked the rest of the reply.
    Refusal,
    /// The model called a tool.
    ToolUse,
}

/// Token accounting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Prompt tokens computed (not read from a cache).
    pub input_tokens: u32,
    /// Generated tokens.
    pub output_tokens: u32,
    /// Prompt tokens read from the server's prefix cache.
    pub cache_read_input_tokens: u32,
    /// Prompt tokens written to an explicit cache (always 0 here).
    pub cache_creation_input_tokens: u32,
}

/// A content block of a reply.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock<'a> {
    /// Text.
    Text {
        /// The text.
        text: &'a str,
    },
    /// The model's reasoning (its signature empty: only Anthropic's own are checked).
    Thinking {
        /// The reasoning.
        thinking: &'a str,
        /// Always empty here.
        signature: &'a str,
    },
    /// A call of one of the request's tools.
    ToolUse {
        /// The call's id.
        id: &'a str,
        /// The tool.
        name: &'a str,
        /// Its input, a JSON object (`{}` in a stream's `content_block_start`).
        input: &'a RawValue,
    },
}

/// What a `content_block_delta` adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockDelta<'a> {
    /// More text.
    TextDelta {
        /// The text.
        text: &'a str,
    },
    /// More of a tool call's input, as JSON text.
    InputJsonDelta {
        /// The piece.
        partial_json: &'a str,
    },
    /// More reasoning.
    ThinkingDelta {
        /// The reasoning.
        thinking: &'a str,
    },
}

/// A whole reply, and the `message` of `message_start`.
#[derive(Clone, Debug, Serialize)]
pub struct MessageResponse<'a> {
    /// `msg_…`.
    pub id: &'a str,
    /// `message`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `assistant`.
    pub role: Role,
    /// The model that answered.
    pub model: &'a str,
    /// The reply (empty in `message_start`).
    pub content: Vec<ContentBlock<'a>>,
    /// Why it stopped (`null` in `message_start`).
    pub stop_reason: Option<StopReason>,
    /// The stop sequence that matched.
    pub stop_sequence: Option<&'a str>,
    /// Token accounting.
    pub usage: Usage,
}

impl<'a> MessageResponse<'a> {
    /// An assistant message with nothing in it yet.
    pub fn empty(id: &'a str, model: &'a str, usage: Usage) -> Self {
        Self {
            id,
            kind: "message",
            role: Role::Assistant,
            model,
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage,
        }
    }
}

/// `message_delta`'s `delta`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MessageDelta<'a> {
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// The stop sequence that matched.
    pub stop_sequence: Option<&'a str>,
}

/// The events of a streamed reply.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent<'a> {
    /// First: the message with empty content.
    MessageStart {
        /// The message so far.
        message: MessageResponse<'a>,
    },
    /// A content block opens.
    ContentBlockStart {
        /// Its index.
        index: u32,
        /// The empty block.
        content_block: ContentBlock<'a>,
    },
    /// Keep-alive.
    Ping,
    /// A block grows.
    ContentBlockDelta {
        /// Its index.
        index: u32,
        /// What is added.
        delta: BlockDelta<'a>,
    },
    /// A block is complete.
    ContentBlockStop {
        /// Its index.
        index: u32,
    },
    /// The stop reason and the final usage.
    MessageDelta {
        /// The stop.
        delta: MessageDelta<'a>,
        /// Final usage.
        usage: Usage,
    },
    /// Last.
    MessageStop,
    /// A failure after the stream began.
    Error {
        /// `{"type": …, "message": …}`.
        error: ErrorObject<'a>,
    },
}

impl StreamEvent<'_> {
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

    /// Appends the event as an SSE frame, `event: NAME\ndata: JSON\n\n`.
    pub fn write_sse(&self, out: &mut Vec<u8>) {
        crate::sse::event(out, self.name(), self);
    }
}

/// Appends the `content_block_delta` of `text` for block `index`: the same frame as
/// [`StreamEvent::ContentBlockDelta`] with a text delta writes, without building the event
/// (a reply's most frequent frame, one per token).
pub fn write_text_delta(out: &mut Vec<u8>, index: u32, text: &str) {
    out.extend_from_slice(
        b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":",
    );
    out.extend_from_slice(index.to_string().as_bytes());
    out.extend_from_slice(b",\"delta\":{\"type\":\"text_delta\",\"text\":");
    crate::sse::json_string(out, text);
    out.extend_from_slice(b"}}\n\n");
}

/// An error: its type and message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ErrorObject<'a> {
    /// `invalid_request_error`, `overloaded_error`, ….
    #[serde(rename = "type")]
    pub kind: &'a str,
    /// What went wrong.
    pub message: &'a str,
}

/// An error response body: `{"type": "error", "error": {...}}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ErrorResponse<'a> {
    /// `error`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The error.
    pub error: ErrorObject<'a>,
}

impl<'a> ErrorResponse<'a> {
    /// An error of `kind` saying `message`.
    pub fn new(kind: &'a str, message: &'a str) -> Self {
        Self {
            kind: "error",
            error: ErrorObject { kind, message },
        }
    }
}

/// `count_tokens`' answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenCount {
    /// The prompt's tokens.
    pub input_tokens: u64,
}

/// The JSON text of an empty object, a streamed tool call's input at its start.
pub fn empty_input() -> &'static RawValue {
    // A constant, checked by the tests: `{}` is valid JSON.
    serde_json::from_str("{}").unwrap_or_else(|_| unreachable!("{{}} is JSON"))
}

/// One event of a Messages server's stream, or (with [`StreamEventIn::message`]'s fields
/// at the top) its whole answer: what the pool reads back from servers that speak this API.
#[derive(Debug, Default, Deserialize)]
pub struct StreamEventIn<'a> {
    /// `message_start`, `content_block_start`, `content_block_delta`, …, `error`; `message`
    /// for a whole answer.
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<Str<'a>>,
    /// `message_start`: the message so far.
    #[serde(default, borrow)]
    pub message: Option<MessageIn<'a>>,
    /// A whole answer's content.
    #[serde(default, borrow)]
    pub content: Option<Vec<BlockIn<'a>>>,
    /// A whole answer's stop reason.
    #[serde(default, borrow)]
    pub stop_reason: Option<Str<'a>>,
    /// A whole answer's matched stop sequence.
    #[serde(default, borrow)]
    pub stop_sequence: Option<Str<'a>>,
    /// The block an event is about.
    #[serde(default)]
    pub index: Option<u32>,
    /// `content_block_start`: the block.
    #[serde(default, borrow)]
    pub content_block: Option<BlockIn<'a>>,
    /// `content_block_delta` (a block's delta) and `message_delta` (the stop).
    #[serde(default, borrow)]
    pub delta: Option<DeltaIn<'a>>,
    /// `message_delta` and a whole answer: the usage.
    #[serde(default)]
    pub usage: Option<UsageIn>,
    /// `error`: what went wrong.
    #[serde(default, borrow)]
    pub error: Option<ErrorIn<'a>>,
}

/// `message_start`'s message.
#[derive(Debug, Default, Deserialize)]
pub struct MessageIn<'a> {
    /// `msg_…`.
    #[serde(default, borrow)]
    pub id: Option<Str<'a>>,
    /// Its usage so far.
    #[serde(default)]
    pub usage: Option<UsageIn>,
}

/// A content block as a server sends it.
#[derive(Debug, Default, Deserialize)]
pub struct BlockIn<'a> {
    /// `text`, `tool_use`, `thinking`, `redacted_thinking`, ….
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<Str<'a>>,
    /// `text`: the text.
    #[serde(default, borrow)]
    pub text: Option<Str<'a>>,
    /// `thinking`: the reasoning.
    #[serde(default, borrow)]
    pub thinking: Option<Str<'a>>,
    /// `tool_use`: the call's id.
    #[serde(default, borrow)]
    pub id: Option<Str<'a>>,
    /// `tool_use`: the tool.
    #[serde(default, borrow)]
    pub name: Option<Str<'a>>,
    /// `tool_use`: its input (`{}` at a stream's block start).
    #[serde(default, borrow)]
    pub input: Option<&'a RawValue>,
}

/// A delta as a server sends it.
#[derive(Debug, Default, Deserialize)]
pub struct DeltaIn<'a> {
    /// `text_delta`, `input_json_delta`, `thinking_delta`, `signature_delta`; absent in
    /// `message_delta`.
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<Str<'a>>,
    /// `text_delta`.
    #[serde(default, borrow)]
    pub text: Option<Str<'a>>,
    /// `input_json_delta`.
    #[serde(default, borrow)]
    pub partial_json: Option<Str<'a>>,
    /// `thinking_delta`.
    #[serde(default, borrow)]
    pub thinking: Option<Str<'a>>,
    /// `message_delta`: why it stopped.
    #[serde(default, borrow)]
    pub stop_reason: Option<Str<'a>>,
    /// `message_delta`: the stop sequence that matched.
    #[serde(default, borrow)]
    pub stop_sequence: Option<Str<'a>>,
}

/// Usage as a server reports it (each count where it has one).
#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub struct UsageIn {
    /// Prompt tokens computed.
    #[serde(default)]
    pub input_tokens: Option<u32>,
    /// Generated tokens.
    #[serde(default)]
    pub output_tokens: Option<u32>,
    /// Prompt tokens read from the cache.
    #[serde(default)]
    pub cache_read_input_tokens: Option<u32>,
    /// Prompt tokens written to the cache.
    #[serde(default)]
    pub cache_creation_input_tokens: Option<u32>,
}

/// An error as a server reports it.
#[derive(Debug, Default, Deserialize)]
pub struct ErrorIn<'a> {
    /// `overloaded_error`, ….
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<Str<'a>>,
    /// What went wrong.
    #[serde(default, borrow)]
    pub message: Option<Str<'a>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_events_are_anthropics_frames() {
        let mut out = Vec::new();
        StreamEvent::ContentBlockDelta {
            index: 0,
            delta: BlockDelta::TextDelta { text: "hi" },
        }
        .write_sse(&mut out);
        StreamEvent::MessageStop.write_sse(&mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n\
             event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        );
        let input = RawValue::from_string(r#"{"city":"Paris"}"#.into()).unwrap();
        let block = ContentBlock::ToolUse {
            id: "t1",
            name: "get_weather",
            input: &input,
        };
        assert_eq!(
            serde_json::to_string(&block).unwrap(),
            r#"{"type":"tool_use","id":"t1","name":"get_weather","input":{"city":"Paris"}}"#
        );
        assert_eq!(empty_input().get(), "{}");
    }

    #[test]
    fn the_text_delta_fast_path_writes_the_events_own_frame() {
        for text in ["hi", "a \"quoted\" line\nand é \u{1}"] {
            let (mut fast, mut slow) = (Vec::new(), Vec::new());
            write_text_delta(&mut fast, 12, text);
            StreamEvent::ContentBlockDelta {
                index: 12,
                delta: BlockDelta::TextDelta { text },
            }
            .write_sse(&mut slow);
            assert_eq!(
                String::from_utf8(fast).unwrap(),
                String::from_utf8(slow).unwrap()
            );
        }
    }

    #[test]
    fn a_request_reads_with_string_or_block_content() {
        let request: Request<'_> = serde_json::from_str(
            r#"{"model":"m","max_tokens":5,"system":[{"type":"text","text":"Be brief."}],
                "messages":[{"role":"user","content":"Hi"},
                            {"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"a": 1}}]}]}"#,
        )
        .unwrap();
        let messages = request.messages.unwrap();
        assert!(matches!(&messages[0].content, Content::Text(t) if t == "Hi"));
        let Content::List(blocks) = &messages[1].content else {
            panic!("blocks")
        };
        assert_eq!(blocks[0].input.unwrap().get(), r#"{"a": 1}"#);
        assert!(matches!(request.system, Some(Content::List(_))));
    }
}
