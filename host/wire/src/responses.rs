//! OpenAI's Responses API: the request (`POST /v1/responses`), its input items, the response
//! object, the stream's events, and a server's own replies read back.
//!
//! Every field the API defines is named in the request, those the gateway does not use as
//! [`Skipped`], so that the door (reading through `serde_ignored`) can tell a field nobody
//! knows from one it chose not to use. Items are one permissive struct whose `type` says
//! which of its fields mean something (a message without `type` is a message, as the API
//! takes it). The reply side writes borrowed values: an output item's text is written from
//! the reply being folded, never copied into a tree first.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::{Skipped, Str};

/// `POST /v1/responses`.
#[derive(Debug, Default, Deserialize)]
pub struct Request<'a> {
    /// The model.
    #[serde(default, borrow)]
    pub model: Option<Str<'a>>,
    /// The input: text (one user message), or items ([`Input`]), as the JSON text it came as
    /// (kept as it is for the response store).
    #[serde(default, borrow)]
    pub input: Option<&'a RawValue>,
    /// The system prompt.
    #[serde(default, borrow)]
    pub instructions: Option<Str<'a>>,
    /// Tools: functions, namespaces of functions, and hosted tools (a list of [`Tool`]), as
    /// the JSON text it came as (echoed in the response).
    #[serde(default, borrow)]
    pub tools: Option<&'a RawValue>,
    /// `auto`, `none`, `required`, a function, a hosted tool or `allowed_tools`
    /// ([`ToolChoice`]), as the JSON text it came as.
    #[serde(default, borrow)]
    pub tool_choice: Option<&'a RawValue>,
    /// Whether several calls may come in one turn.
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// Most tokens to generate, reasoning included.
    #[serde(default)]
    pub max_output_tokens: Option<i64>,
    /// Most hosted tool calls.
    #[serde(default)]
    pub max_tool_calls: Option<Skipped>,
    /// Sampling temperature.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Log probabilities of the top tokens.
    #[serde(default)]
    pub top_logprobs: Option<i64>,
    /// The text output's format and verbosity ([`TextConfig`]), as the JSON text it came as.
    #[serde(default, borrow)]
    pub text: Option<&'a RawValue>,
    /// Reasoning effort and summaries ([`ReasoningConfig`]), as the JSON text it came as.
    #[serde(default, borrow)]
    pub reasoning: Option<&'a RawValue>,
    /// Extra output to include (`reasoning.encrypted_content`, …).
    #[serde(default, borrow)]
    pub include: Option<Vec<Str<'a>>>,
    /// Key-value metadata, echoed in the response.
    #[serde(default, borrow)]
    pub metadata: Option<&'a RawValue>,
    /// Which requests share a prompt prefix: the session key.
    #[serde(default, borrow)]
    pub prompt_cache_key: Option<Str<'a>>,
    /// How long a cached prompt is kept.
    #[serde(default)]
    pub prompt_cache_retention: Option<Skipped>,
    /// OpenAI's abuse-tracking id.
    #[serde(default)]
    pub safety_identifier: Option<Skipped>,
    /// The end user (deprecated for `safety_identifier` and `prompt_cache_key`).
    #[serde(default, borrow)]
    pub user: Option<Str<'a>>,
    /// Whether the response is kept for `previous_response_id` and `GET` (default true).
    #[serde(default)]
    pub store: Option<bool>,
    /// Whether to stream.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Stream settings (`include_obfuscation`).
    #[serde(default)]
    pub stream_options: Option<Skipped>,
    /// The response this one continues.
    #[serde(default, borrow)]
    pub previous_response_id: Option<Str<'a>>,
    /// A conversation of the Conversations API.
    #[serde(default)]
    pub conversation: Option<Skipped>,
    /// Run in the background.
    #[serde(default)]
    pub background: Option<bool>,
    /// `auto` or `disabled`.
    #[serde(default)]
    pub truncation: Option<Skipped>,
    /// The service tier.
    #[serde(default)]
    pub service_tier: Option<Skipped>,
    /// A stored prompt template.
    #[serde(default)]
    pub prompt: Option<Skipped>,
    /// vLLM's and SGLang's extension: top-k sampling.
    #[serde(default)]
    pub top_k: Option<i64>,
}

/// `input`: text, or items.
#[derive(Debug)]
pub enum Input<'a> {
    /// One user message's text.
    Text(Str<'a>),
    /// Items.
    List(Vec<Item<'a>>),
}
crate::str::string_or_list!(Input, "a string or a list of input items");

/// One input or output item: a message, a function call or its output, reasoning, a hosted
/// tool's call; `type` says which fields mean something.
#[derive(Debug, Default, Deserialize)]
pub struct Item<'a> {
    /// `message` (the default when `role` is there), `function_call`,
    /// `function_call_output`, `reasoning`, `web_search_call`, `item_reference`, ….
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<Str<'a>>,
    /// The item's id.
    #[serde(default, borrow)]
    pub id: Option<Str<'a>>,
    /// A message's author: `user`, `assistant`, `system`, `developer`.
    #[serde(default, borrow)]
    pub role: Option<Str<'a>>,
    /// A message's content (text, or parts); a reasoning item's text parts.
    #[serde(default, borrow)]
    pub content: Option<Content<'a>>,
    /// `in_progress`, `completed`, `incomplete`.
    #[serde(default)]
    pub status: Option<Skipped>,
    /// A function call's id, which its output names.
    #[serde(default, borrow)]
    pub call_id: Option<Str<'a>>,
    /// A function call's function.
    #[serde(default, borrow)]
    pub name: Option<Str<'a>>,
    /// The namespace of a function offered inside a `namespace` tool.
    #[serde(default, borrow)]
    pub namespace: Option<Str<'a>>,
    /// A function call's arguments (JSON text).
    #[serde(default, borrow)]
    pub arguments: Option<Str<'a>>,
    /// A function call's output: text, or parts.
    #[serde(default, borrow)]
    pub output: Option<Content<'a>>,
    /// A reasoning item's summary parts.
    #[serde(default, borrow)]
    pub summary: Option<Vec<Part<'a>>>,
    /// A reasoning item's encrypted reasoning (only OpenAI reads it).
    #[serde(default)]
    pub encrypted_content: Option<Skipped>,
    /// A message's phase (`commentary`, `final_answer`: Codex's own marker).
    #[serde(default)]
    pub phase: Option<Skipped>,
}

/// Content: text, or parts.
#[derive(Debug)]
pub enum Content<'a> {
    /// Text.
    Text(Str<'a>),
    /// Parts.
    List(Vec<Part<'a>>),
}
crate::str::string_or_list!(Content, "a string or a list of content parts");

/// One content part: `input_text`, `input_image`, `input_file`, `output_text`, `refusal`,
/// `reasoning_text`, `summary_text`.
#[derive(Debug, Default, Deserialize)]
pub struct Part<'a> {
    /// Its type.
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<Str<'a>>,
    /// The text.
    #[serde(default, borrow)]
    pub text: Option<Str<'a>>,
    /// `input_image`: an http(s) or `data:` URL.
    #[serde(default, borrow)]
    pub image_url: Option<Str<'a>>,
    /// `input_image`, `input_file`: a Files API id.
    #[serde(default, borrow)]
    pub file_id: Option<Str<'a>>,
    /// `input_image`: `low`, `high`, `auto`.
    #[serde(default)]
    pub detail: Option<Skipped>,
    /// `input_file`: the file itself.
    #[serde(default)]
    pub file_data: Option<Skipped>,
    /// `input_file`: where it is.
    #[serde(default)]
    pub file_url: Option<Skipped>,
    /// `input_file`: its name.
    #[serde(default)]
    pub filename: Option<Skipped>,
    /// `refusal`: the model's refusal.
    #[serde(default, borrow)]
    pub refusal: Option<Str<'a>>,
    /// `output_text`: citations.
    #[serde(default)]
    pub annotations: Option<Skipped>,
    /// `output_text`: log probabilities.
    #[serde(default)]
    pub logprobs: Option<Skipped>,
}

/// A tool offered.
#[derive(Debug, Default, Deserialize)]
pub struct Tool<'a> {
    /// `function`, `namespace`, `custom`, or a hosted tool (`web_search`, `file_search`,
    /// `code_interpreter`, `image_generation`, `computer_use_preview`, `mcp`, `local_shell`).
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<Str<'a>>,
    /// A function's or a namespace's name.
    #[serde(default, borrow)]
    pub name: Option<Str<'a>>,
    /// What it does.
    #[serde(default, borrow)]
    pub description: Option<Str<'a>>,
    /// A function's parameters' JSON schema, as the JSON text it came as.
    #[serde(default, borrow)]
    pub parameters: Option<&'a RawValue>,
    /// Strict schema adherence.
    #[serde(default)]
    pub strict: Option<Skipped>,
    /// A namespace's functions.
    #[serde(default, borrow)]
    pub tools: Option<Vec<Tool<'a>>>,
    /// A hosted tool's or a custom tool's settings: what the fleet cannot run is dropped
    /// whole, so these are only read over.
    #[serde(default)]
    pub external_web_access: Option<Skipped>,
    /// `custom`: the input's grammar.
    #[serde(default)]
    pub format: Option<Skipped>,
    /// `web_search`: filters.
    #[serde(default)]
    pub filters: Option<Skipped>,
    /// `web_search`: the user's location.
    #[serde(default)]
    pub user_location: Option<Skipped>,
    /// `web_search`: how much context to search.
    #[serde(default)]
    pub search_context_size: Option<Skipped>,
    /// `file_search`: the stores.
    #[serde(default)]
    pub vector_store_ids: Option<Skipped>,
    /// `code_interpreter`: the container.
    #[serde(default)]
    pub container: Option<Skipped>,
    /// `mcp`: the server.
    #[serde(default)]
    pub server_label: Option<Skipped>,
    /// `mcp`: where it is.
    #[serde(default)]
    pub server_url: Option<Skipped>,
    /// Loaded only when a tool search finds it.
    #[serde(default)]
    pub defer_loading: Option<Skipped>,
}

/// `tool_choice`: a mode, or an object naming a function, a hosted tool or allowed tools.
#[derive(Debug)]
pub enum ToolChoice<'a> {
    /// `auto`, `none`, `required`.
    Mode(Str<'a>),
    /// `{"type": "function", "name": …}`, `{"type": "web_search"}`,
    /// `{"type": "allowed_tools", "mode": …, "tools": [...]}`.
    Object(ToolChoiceObject<'a>),
}

/// An object `tool_choice`.
#[derive(Debug, Default, Deserialize)]
pub struct ToolChoiceObject<'a> {
    /// `function`, `allowed_tools`, `custom`, `mcp`, or a hosted tool's type.
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<Str<'a>>,
    /// `function`: which.
    #[serde(default, borrow)]
    pub name: Option<Str<'a>>,
    /// `allowed_tools`: `auto` or `required`.
    #[serde(default, borrow)]
    pub mode: Option<Str<'a>>,
    /// `allowed_tools`: the tools allowed (`{"type": "function", "name": …}`).
    #[serde(default, borrow)]
    pub tools: Option<Vec<ToolChoiceObject<'a>>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for ToolChoice<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = ToolChoice<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"auto\", \"none\", \"required\" or a tool choice object")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(ToolChoice::Mode(v.into()))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(ToolChoice::Mode(v.to_owned().into()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                ToolChoiceObject::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(ToolChoice::Object)
            }
        }
        deserializer.deserialize_any(Visit)
    }
}

/// `text`.
#[derive(Debug, Default, Deserialize)]
pub struct TextConfig<'a> {
    /// `{"type": "text"}`, `{"type": "json_object"}`, or
    /// `{"type": "json_schema", "name", "schema", "strict"}`.
    #[serde(default, borrow)]
    pub format: Option<TextFormat<'a>>,
    /// `low`, `medium`, `high`.
    #[serde(default)]
    pub verbosity: Option<Skipped>,
}

/// `text.format`.
#[derive(Debug, Default, Deserialize)]
pub struct TextFormat<'a> {
    /// `text`, `json_object`, `json_schema`.
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<Str<'a>>,
    /// `json_schema`: its name.
    #[serde(default, borrow)]
    pub name: Option<Str<'a>>,
    /// `json_schema`: the schema.
    #[serde(default, borrow)]
    pub schema: Option<&'a RawValue>,
    /// `json_schema`: strict adherence.
    #[serde(default)]
    pub strict: Option<bool>,
    /// `json_schema`: what it is for.
    #[serde(default)]
    pub description: Option<Skipped>,
}

/// `reasoning`.
#[derive(Debug, Default, Deserialize)]
pub struct ReasoningConfig<'a> {
    /// `none`, `minimal`, `low`, `medium`, `high`, `xhigh`.
    #[serde(default, borrow)]
    pub effort: Option<Str<'a>>,
    /// `auto`, `concise`, `detailed`.
    #[serde(default)]
    pub summary: Option<Skipped>,
    /// The deprecated name of `summary`.
    #[serde(default)]
    pub generate_summary: Option<Skipped>,
}

/// The response object: what `POST` answers whole, `GET` returns, and the stream's
/// `response.*` events carry. Its echoed settings are the request's JSON text as it came.
#[derive(Clone, Debug, Serialize)]
pub struct Response<'a> {
    /// `resp_…`.
    pub id: &'a str,
    /// `response`.
    pub object: &'static str,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
    /// `in_progress`, `completed`, `incomplete`, `failed`, `cancelled`.
    pub status: &'a str,
    /// Why it is incomplete (`{"reason": "max_output_tokens"}`).
    pub incomplete_details: Option<IncompleteDetails>,
    /// What failed.
    pub error: Option<ResponseError<'a>>,
    /// The model that answered.
    pub model: &'a str,
    /// The output items.
    pub output: &'a [OutputItem<'a>],
    /// The usage (none while in progress).
    pub usage: Option<ResponseUsage>,
    /// The request's settings, echoed.
    #[serde(flatten)]
    pub echo: &'a Echo,
}

/// The request's settings a response echoes, as JSON text (each `null` when not given).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Echo {
    /// `instructions`.
    pub instructions: Option<String>,
    /// `metadata` (an object).
    pub metadata: Box<RawValue>,
    /// `max_output_tokens`.
    pub max_output_tokens: Option<u32>,
    /// `parallel_tool_calls`.
    pub parallel_tool_calls: bool,
    /// `previous_response_id`.
    pub previous_response_id: Option<String>,
    /// `reasoning` (an object).
    pub reasoning: Box<RawValue>,
    /// `store`.
    pub store: bool,
    /// `temperature`.
    pub temperature: Option<f32>,
    /// `text` (an object).
    pub text: Box<RawValue>,
    /// `tool_choice`.
    pub tool_choice: Box<RawValue>,
    /// `tools`.
    pub tools: Box<RawValue>,
    /// `top_p`.
    pub top_p: Option<f32>,
    /// `truncation`.
    pub truncation: &'static str,
    /// `user`.
    pub user: Option<String>,
    /// `prompt_cache_key`.
    pub prompt_cache_key: Option<String>,
}

/// `incomplete_details`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct IncompleteDetails {
    /// `max_output_tokens` or `content_filter`.
    pub reason: &'static str,
}

/// A response's `error`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ResponseError<'a> {
    /// `server_error`, `rate_limit_exceeded`, ….
    pub code: &'a str,
    /// What went wrong.
    pub message: &'a str,
}

/// A response's `usage`.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ResponseUsage {
    /// Prompt tokens, cached or not.
    pub input_tokens: u32,
    /// Of those, the cached.
    pub input_tokens_details: InputTokensDetails,
    /// Generated tokens, reasoning included.
    pub output_tokens: u32,
    /// Of those, the reasoning.
    pub output_tokens_details: OutputTokensDetails,
    /// The two together.
    pub total_tokens: u32,
}

/// `usage.input_tokens_details`.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct InputTokensDetails {
    /// Prompt tokens the server's prefix cache held.
    pub cached_tokens: u32,
}

/// `usage.output_tokens_details`.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct OutputTokensDetails {
    /// Reasoning tokens (not counted apart here: 0).
    pub reasoning_tokens: u32,
}

/// An output item as written.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem<'a> {
    /// The model's text.
    Message {
        /// `msg_…`.
        id: &'a str,
        /// `in_progress` or `completed`.
        status: &'a str,
        /// `assistant`.
        role: &'static str,
        /// The text parts (none while in progress).
        content: Vec<OutputPart<'a>>,
    },
    /// A function call.
    FunctionCall {
        /// `fc_…`.
        id: &'a str,
        /// `in_progress` or `completed`.
        status: &'a str,
        /// The call's id.
        call_id: &'a str,
        /// The function.
        name: &'a str,
        /// Its namespace, for a function offered inside one.
        #[serde(skip_serializing_if = "Option::is_none")]
        namespace: Option<&'a str>,
        /// Its arguments (JSON text).
        arguments: &'a str,
    },
    /// The model's reasoning.
    Reasoning {
        /// `rs_…`.
        id: &'a str,
        /// `in_progress` or `completed`.
        status: &'a str,
        /// Summaries (none here).
        summary: [(); 0],
        /// The reasoning's text parts.
        content: Vec<OutputPart<'a>>,
        /// Encrypted reasoning (only OpenAI makes it).
        encrypted_content: Option<&'a str>,
    },
}

/// A content part as written.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputPart<'a> {
    /// Text.
    OutputText {
        /// The text.
        text: &'a str,
        /// Citations (none).
        annotations: [(); 0],
        /// Log probabilities (none).
        logprobs: [(); 0],
    },
    /// Reasoning text.
    ReasoningText {
        /// The text.
        text: &'a str,
    },
}

impl<'a> OutputPart<'a> {
    /// An `output_text` part.
    pub fn text(text: &'a str) -> Self {
        Self::OutputText {
            text,
            annotations: [],
            logprobs: [],
        }
    }
}

/// The events of a streamed response, each with its `sequence_number`.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type")]
pub enum StreamEvent<'a> {
    /// First.
    #[serde(rename = "response.created")]
    Created {
        /// Its place in the stream.
        sequence_number: u64,
        /// The response, in progress.
        response: Response<'a>,
    },
    /// Second.
    #[serde(rename = "response.in_progress")]
    InProgress {
        /// Its place in the stream.
        sequence_number: u64,
        /// The response, in progress.
        response: Response<'a>,
    },
    /// An output item begins.
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded {
        /// Its place in the stream.
        sequence_number: u64,
        /// The item's place in `output`.
        output_index: u32,
        /// The item, empty.
        item: OutputItem<'a>,
    },
    /// An output item is complete.
    #[serde(rename = "response.output_item.done")]
    OutputItemDone {
        /// Its place in the stream.
        sequence_number: u64,
        /// The item's place in `output`.
        output_index: u32,
        /// The item, whole.
        item: OutputItem<'a>,
    },
    /// A content part begins.
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded {
        /// Its place in the stream.
        sequence_number: u64,
        /// The item.
        item_id: &'a str,
        /// The item's place in `output`.
        output_index: u32,
        /// The part's place in the item.
        content_index: u32,
        /// The part, empty.
        part: OutputPart<'a>,
    },
    /// A content part is complete.
    #[serde(rename = "response.content_part.done")]
    ContentPartDone {
        /// Its place in the stream.
        sequence_number: u64,
        /// The item.
        item_id: &'a str,
        /// The item's place in `output`.
        output_index: u32,
        /// The part's place in the item.
        content_index: u32,
        /// The part, whole.
        part: OutputPart<'a>,
    },
    /// More text.
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        /// Its place in the stream.
        sequence_number: u64,
        /// The item.
        item_id: &'a str,
        /// The item's place in `output`.
        output_index: u32,
        /// The part's place in the item.
        content_index: u32,
        /// The text.
        delta: &'a str,
        /// Log probabilities (none).
        logprobs: [(); 0],
    },
    /// The text is complete.
    #[serde(rename = "response.output_text.done")]
    OutputTextDone {
        /// Its place in the stream.
        sequence_number: u64,
        /// The item.
        item_id: &'a str,
        /// The item's place in `output`.
        output_index: u32,
        /// The part's place in the item.
        content_index: u32,
        /// All of it.
        text: &'a str,
        /// Log probabilities (none).
        logprobs: [(); 0],
    },
    /// More reasoning.
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningTextDelta {
        /// Its place in the stream.
        sequence_number: u64,
        /// The item.
        item_id: &'a str,
        /// The item's place in `output`.
        output_index: u32,
        /// The part's place in the item.
        content_index: u32,
        /// The text.
        delta: &'a str,
    },
    /// The reasoning is complete.
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningTextDone {
        /// Its place in the stream.
        sequence_number: u64,
        /// The item.
        item_id: &'a str,
        /// The item's place in `output`.
        output_index: u32,
        /// The part's place in the item.
        content_index: u32,
        /// All of it.
        text: &'a str,
    },
    /// More of a function call's arguments.
    #[serde(rename = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta {
        /// Its place in the stream.
        sequence_number: u64,
        /// The item.
        item_id: &'a str,
        /// The item's place in `output`.
        output_index: u32,
        /// The piece.
        delta: &'a str,
    },
    /// A function call's arguments are complete.
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone {
        /// Its place in the stream.
        sequence_number: u64,
        /// The item.
        item_id: &'a str,
        /// The item's place in `output`.
        output_index: u32,
        /// The function.
        name: &'a str,
        /// All of them.
        arguments: &'a str,
    },
    /// Last, on success.
    #[serde(rename = "response.completed")]
    Completed {
        /// Its place in the stream.
        sequence_number: u64,
        /// The response, whole.
        response: Response<'a>,
    },
    /// Last, when `max_output_tokens` or a filter cut it short.
    #[serde(rename = "response.incomplete")]
    Incomplete {
        /// Its place in the stream.
        sequence_number: u64,
        /// The response, as far as it went.
        response: Response<'a>,
    },
    /// Last, when it failed.
    #[serde(rename = "response.failed")]
    Failed {
        /// Its place in the stream.
        sequence_number: u64,
        /// The response, with its error.
        response: Response<'a>,
    },
    /// A failure outside the response (before it began, or of the stream).
    #[serde(rename = "error")]
    Error {
        /// Its place in the stream.
        sequence_number: u64,
        /// `server_error`, ….
        code: &'a str,
        /// What went wrong.
        message: &'a str,
        /// The parameter at fault.
        param: Option<&'a str>,
    },
}

impl StreamEvent<'_> {
    /// The SSE `event:` name (the event's `type`).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Created { .. } => "response.created",
            Self::InProgress { .. } => "response.in_progress",
            Self::OutputItemAdded { .. } => "response.output_item.added",
            Self::OutputItemDone { .. } => "response.output_item.done",
            Self::ContentPartAdded { .. } => "response.content_part.added",
            Self::ContentPartDone { .. } => "response.content_part.done",
            Self::OutputTextDelta { .. } => "response.output_text.delta",
            Self::OutputTextDone { .. } => "response.output_text.done",
            Self::ReasoningTextDelta { .. } => "response.reasoning_text.delta",
            Self::ReasoningTextDone { .. } => "response.reasoning_text.done",
            Self::FunctionCallArgumentsDelta { .. } => "response.function_call_arguments.delta",
            Self::FunctionCallArgumentsDone { .. } => "response.function_call_arguments.done",
            Self::Completed { .. } => "response.completed",
            Self::Incomplete { .. } => "response.incomplete",
            Self::Failed { .. } => "response.failed",
            Self::Error { .. } => "error",
        }
    }

    /// Appends the event as an SSE frame, `event: NAME\ndata: JSON\n\n`.
    pub fn write_sse(&self, out: &mut Vec<u8>) {
        crate::sse::event(out, self.name(), self);
    }
}

/// `DELETE /v1/responses/{id}`'s answer.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Deleted<'a> {
    /// The response's id.
    pub id: &'a str,
    /// `response`.
    pub object: &'static str,
    /// `true`.
    pub deleted: bool,
}

/// `GET /v1/responses/{id}/input_items`'s answer: a page of the items, as stored (JSON text).
#[derive(Debug, Serialize)]
pub struct ItemList<'a> {
    /// `list`.
    pub object: &'static str,
    /// The items.
    pub data: Vec<&'a RawValue>,
    /// The first item's id.
    pub first_id: Option<&'a str>,
    /// The last item's id.
    pub last_id: Option<&'a str>,
    /// Whether more follow.
    pub has_more: bool,
}

/// One event of a Responses server's stream, or its whole answer (the response object): what
/// the pool reads back from servers that speak this API.
#[derive(Debug, Default, Deserialize)]
pub struct StreamEventIn<'a> {
    /// The event's `type` (`response.output_text.delta`, …); absent in a whole answer.
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<Str<'a>>,
    /// `response.created`, `.completed`, `.incomplete`, `.failed`: the response.
    #[serde(default, borrow)]
    pub response: Option<Box<ResponseIn<'a>>>,
    /// `response.output_item.added` / `.done`: the item.
    #[serde(default, borrow)]
    pub item: Option<ItemIn<'a>>,
    /// The item's place in `output`.
    #[serde(default)]
    pub output_index: Option<u32>,
    /// Deltas' text.
    #[serde(default, borrow)]
    pub delta: Option<Str<'a>>,
    /// `error`: what went wrong.
    #[serde(default, borrow)]
    pub message: Option<Str<'a>>,
    /// A whole answer: its id.
    #[serde(default, borrow)]
    pub id: Option<Str<'a>>,
    /// A whole answer: `completed`, `incomplete`, `failed`.
    #[serde(default, borrow)]
    pub status: Option<Str<'a>>,
    /// A whole answer: its output.
    #[serde(default, borrow)]
    pub output: Option<Vec<ItemIn<'a>>>,
    /// A whole answer: its usage.
    #[serde(default)]
    pub usage: Option<UsageIn>,
    /// A whole answer: why it is incomplete.
    #[serde(default, borrow)]
    pub incomplete_details: Option<IncompleteIn<'a>>,
    /// A whole answer or an `error` event: the error.
    #[serde(default, borrow)]
    pub error: Option<ErrorIn<'a>>,
}

/// A response as a server sends it.
#[derive(Debug, Default, Deserialize)]
pub struct ResponseIn<'a> {
    /// `resp_…`.
    #[serde(default, borrow)]
    pub id: Option<Str<'a>>,
    /// `completed`, `incomplete`, `failed`, ….
    #[serde(default, borrow)]
    pub status: Option<Str<'a>>,
    /// The output.
    #[serde(default, borrow)]
    pub output: Option<Vec<ItemIn<'a>>>,
    /// The usage.
    #[serde(default)]
    pub usage: Option<UsageIn>,
    /// Why it is incomplete.
    #[serde(default, borrow)]
    pub incomplete_details: Option<IncompleteIn<'a>>,
    /// What failed.
    #[serde(default, borrow)]
    pub error: Option<ErrorIn<'a>>,
}

/// An output item as a server sends it.
#[derive(Debug, Default, Deserialize)]
pub struct ItemIn<'a> {
    /// `message`, `function_call`, `reasoning`, ….
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<Str<'a>>,
    /// A function call's id.
    #[serde(default, borrow)]
    pub call_id: Option<Str<'a>>,
    /// A function call's function.
    #[serde(default, borrow)]
    pub name: Option<Str<'a>>,
    /// Its namespace.
    #[serde(default, borrow)]
    pub namespace: Option<Str<'a>>,
    /// A function call's arguments.
    #[serde(default, borrow)]
    pub arguments: Option<Str<'a>>,
    /// A message's or a reasoning item's parts.
    #[serde(default, borrow)]
    pub content: Option<Vec<Part<'a>>>,
}

/// `usage` as a server reports it.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub struct UsageIn {
    /// Prompt tokens.
    #[serde(default)]
    pub input_tokens: Option<u32>,
    /// Generated tokens.
    #[serde(default)]
    pub output_tokens: Option<u32>,
    /// Of the prompt, the cached.
    #[serde(default)]
    pub input_tokens_details: Option<CachedIn>,
}

/// `usage.input_tokens_details`.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub struct CachedIn {
    /// Prompt tokens from the cache.
    #[serde(default)]
    pub cached_tokens: Option<u32>,
}

/// `incomplete_details`.
#[derive(Debug, Default, Deserialize)]
pub struct IncompleteIn<'a> {
    /// `max_output_tokens`, `content_filter`.
    #[serde(default, borrow)]
    pub reason: Option<Str<'a>>,
}

/// An error as a server reports it.
#[derive(Debug, Default, Deserialize)]
pub struct ErrorIn<'a> {
    /// Its code.
    #[serde(default, borrow)]
    pub code: Option<Str<'a>>,
    /// What went wrong.
    #[serde(default, borrow)]
    pub message: Option<Str<'a>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codex_shaped_input_reads() {
        let request: Request<'_> = serde_json::from_str(
            r#"{"model":"m","input":[
                {"type":"message","role":"developer","content":[{"type":"input_text","text":"Be precise."}]},
                {"role":"user","content":"hi"},
                {"type":"function_call","call_id":"c1","name":"close_agent","namespace":"multi_agent_v1","arguments":"{}"},
                {"type":"function_call_output","call_id":"c1","output":"ok"},
                {"type":"reasoning","summary":[],"encrypted_content":"xyz"}],
              "tools":[{"type":"function","name":"exec_command","strict":false,"parameters":{"type":"object"}},
                       {"type":"namespace","name":"multi_agent_v1","description":"d","tools":[{"type":"function","name":"close_agent","parameters":{}}]},
                       {"type":"web_search","external_web_access":false}],
              "tool_choice":"auto","reasoning":{"summary":"auto"},"store":false,"stream":true,
              "include":["reasoning.encrypted_content"],"prompt_cache_key":"s-1"}"#,
        )
        .unwrap();
        let items: Input<'_> = serde_json::from_str(request.input.unwrap().get()).unwrap();
        let Input::List(items) = items else {
            panic!("items")
        };
        assert_eq!(items.len(), 5);
        assert_eq!(items[1].role.as_deref(), Some("user"));
        assert!(matches!(&items[1].content, Some(Content::Text(t)) if t == "hi"));
        assert_eq!(items[2].namespace.as_deref(), Some("multi_agent_v1"));
        let tools: Vec<Tool<'_>> = serde_json::from_str(request.tools.unwrap().get()).unwrap();
        assert_eq!(
            tools[1].tools.as_ref().unwrap()[0].name.as_deref(),
            Some("close_agent")
        );
        let choice: ToolChoice<'_> =
            serde_json::from_str(request.tool_choice.unwrap().get()).unwrap();
        assert!(matches!(choice, ToolChoice::Mode(m) if m == "auto"));
    }

    #[test]
    fn events_are_written_with_their_type_and_name() {
        let mut out = Vec::new();
        StreamEvent::OutputTextDelta {
            sequence_number: 4,
            item_id: "msg_1",
            output_index: 0,
            content_index: 0,
            delta: "hi",
            logprobs: [],
        }
        .write_sse(&mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":4,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"hi\",\"logprobs\":[]}\n\n"
        );
        let item = OutputItem::FunctionCall {
            id: "fc_1",
            status: "completed",
            call_id: "c1",
            name: "close_agent",
            namespace: Some("multi_agent_v1"),
            arguments: "{}",
        };
        assert_eq!(
            serde_json::to_string(&item).unwrap(),
            r#"{"type":"function_call","id":"fc_1","status":"completed","call_id":"c1","name":"close_agent","namespace":"multi_agent_v1","arguments":"{}"}"#
        );
    }
}
