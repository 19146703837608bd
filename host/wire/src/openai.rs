//! OpenAI's chat completions and (legacy) completions, as clients send them and as servers
//! (vLLM, SGLang, TGI, llama.cpp's server, Ollama, `ringmaster worker`) answer them.
//!
//! One [`Request`] type serves both endpoints and both directions: the gateway's OpenAI door
//! reads it from clients, the pool's client writes it to servers, the worker and the tests'
//! fake servers read it again. It lists every field any of them knows, each optional, so that
//! a door can serve, drop or refuse each by name; a field nobody knows is left to the reader
//! (the door reads through `serde_ignored` and applies `[api] unknown_fields`; the tests'
//! strict server refuses it, as OpenAI does). [`Chunk`] is one streamed chunk or one
//! whole answer, in every server's dialect (where the usage comes, llama.cpp's `timings`,
//! vLLM's `stop_reason`, SGLang's `matched_stop`, error objects of three shapes). Strings
//! borrow from the buffer they were read from ([`Str`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::Str;

/// `POST /v1/chat/completions` (with `messages`) or `POST /v1/completions` (with `prompt`).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Request<'a> {
    /// The model.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub model: Option<Str<'a>>,
    /// The conversation (chat).
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<Message<'a>>>,
    /// The raw prompt (completions): a string, or a list of strings or token ids.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<Prompt<'a>>,
    /// Most tokens to generate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<i64>,
    /// Most tokens to generate (chat's newer name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<i64>,
    /// Whether to stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// What a stream carries besides the text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Top-k sampling (vLLM's and SGLang's extension; `-1` is off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    /// Sampling seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// Stop sequences: one string or several.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop<'a>>,
    /// Choices per request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<i64>,
    /// The end user.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub user: Option<Str<'a>>,
    /// OpenAI's hint for which requests share a prompt prefix.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub prompt_cache_key: Option<Str<'a>>,
    /// OpenAI's abuse-tracking id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safety_identifier: Option<Value>,
    /// vLLM's and SGLang's extension: keep generating past the end of the turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
    /// Log probabilities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Value>,
    /// Token biases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<Value>,
    /// Presence penalty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    /// Frequency penalty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    /// vLLM's repetition penalty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f64>,
    /// Key-value metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// Stored completions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<bool>,
    /// The service tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<Value>,
    /// Tools the model may call (chat).
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Tool<'a>>>,
    /// Whether and which tool must be called.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice<'a>>,
    /// Whether several calls may come in one turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// The deprecated function calling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub functions: Option<Value>,
    /// The deprecated function calling's choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_call: Option<Value>,
    /// Structured output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<Value>,
    /// Log probabilities of the top tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<Value>,
    /// Output modalities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modalities: Option<Value>,
    /// Audio output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio: Option<Value>,
    /// Predicted outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<Value>,
    /// Reasoning effort: `none`, `minimal`, `low`, `medium`, `high`, `xhigh`.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<Str<'a>>,
    /// How long the answer should be: `low`, `medium`, `high`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verbosity: Option<Value>,
    /// How long a cached prompt is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache_retention: Option<Value>,
    /// Web search.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_search_options: Option<Value>,
    /// Echo the prompt (completions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo: Option<bool>,
    /// Insertion after the completion (completions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suffix: Option<Value>,
    /// Best-of sampling (completions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_of: Option<i64>,
    /// `ringmaster worker`'s scheduling priority, 0 = lowest (other servers ignore it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ringmaster_priority: Option<u8>,
}

/// The fields of [`Request`] that only `/v1/chat/completions` takes.
pub const CHAT_ONLY_FIELDS: [&str; 15] = [
    "messages",
    "max_completion_tokens",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "response_format",
    "top_logprobs",
    "modalities",
    "audio",
    "prediction",
    "reasoning_effort",
    "web_search_options",
    "ringmaster_priority",
];

/// The fields of [`Request`] that only `/v1/completions` takes.
pub const COMPLETIONS_ONLY_FIELDS: [&str; 5] =
    ["prompt", "echo", "suffix", "best_of", "ringmaster_priority"];

/// `stream_options`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// A last chunk with the usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_usage: Option<bool>,
    /// vLLM's extension: the usage so far in every chunk (how a gateway learns the prompt's
    /// and the cache's token counts with the first token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuous_usage_stats: Option<bool>,
    /// OpenAI's padding against length side channels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_obfuscation: Option<bool>,
}

/// `stop`: one string or several.
#[derive(Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Stop<'a> {
    /// One.
    Text(Str<'a>),
    /// Several.
    List(Vec<Str<'a>>),
}
crate::str::string_or_list!(Stop, "a string or a list of strings");

/// `prompt`: a string, or a list (of strings, or of token ids).
#[derive(Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Prompt<'a> {
    /// One prompt.
    Text(Str<'a>),
    /// Prompts, or token ids, as given.
    List(Vec<Value>),
}
crate::str::string_or_list!(Prompt, "a string or a list");

/// One message of a chat.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Message<'a> {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    #[serde(borrow)]
    pub role: Str<'a>,
    /// The text, or parts (text and images).
    #[serde(default, borrow)]
    pub content: Option<Content<'a>>,
    /// The author's name.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub name: Option<Str<'a>>,
    /// The tools an assistant message called.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall<'a>>>,
    /// The call a tool message answers.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<Str<'a>>,
    /// The deprecated function calling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_call: Option<Value>,
    /// An assistant's refusal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<Value>,
    /// An assistant's reasoning as vLLM returned it (sent back by some clients).
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<Str<'a>>,
    /// The same, under vLLM's newer name.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Str<'a>>,
    /// An assistant's annotations (citations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Value>,
    /// An assistant's earlier audio answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio: Option<Value>,
}

/// A message's content.
#[derive(Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Content<'a> {
    /// Text.
    Text(Str<'a>),
    /// Parts: text, images (and kinds nobody here serves).
    List(Vec<Part<'a>>),
}
crate::str::string_or_list!(Content, "a string or a list of content parts");

/// One content part.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Part<'a> {
    /// `text`, `image_url`, `input_audio`, `file`.
    #[serde(rename = "type", borrow)]
    pub kind: Str<'a>,
    /// A text part's text.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub text: Option<Str<'a>>,
    /// An image part's image.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub image_url: Option<ImageUrl<'a>>,
}

impl<'a> Part<'a> {
    /// A text part.
    pub fn text(text: impl Into<Str<'a>>) -> Self {
        Self {
            kind: "text".into(),
            text: Some(text.into()),
            image_url: None,
        }
    }

    /// An image part.
    pub fn image(url: impl Into<Str<'a>>) -> Self {
        Self {
            kind: "image_url".into(),
            text: None,
            image_url: Some(ImageUrl {
                url: url.into(),
                detail: None,
            }),
        }
    }
}

/// `image_url`: an http(s) URL, or the image itself as a `data:` URL.
#[derive(Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageUrl<'a> {
    /// The URL.
    #[serde(borrow)]
    pub url: Str<'a>,
    /// `auto`, `low` or `high`: a hint servers may ignore.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub detail: Option<Str<'a>>,
}

/// A tool offered.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Tool<'a> {
    /// `function` (OpenAI also has `custom`).
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<Str<'a>>,
    /// The function.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub function: Option<Function<'a>>,
}

/// A function offered as a tool.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Function<'a> {
    /// Its name.
    #[serde(default, borrow)]
    pub name: Option<Str<'a>>,
    /// What it does.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub description: Option<Str<'a>>,
    /// Its parameters' JSON schema, as the JSON text it came as.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<&'a RawValue>,
}

/// `tool_choice`: `"auto"`, `"none"`, `"required"`, or a named function.
#[derive(Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ToolChoice<'a> {
    /// `auto`, `none` or `required`.
    Mode(Str<'a>),
    /// `{"type": "function", "function": {"name": …}}`.
    Function(NamedFunction<'a>),
}

/// A named function as `tool_choice`.
#[derive(Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedFunction<'a> {
    /// `function`.
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<Str<'a>>,
    /// The function.
    #[serde(default, borrow)]
    pub function: Option<FunctionName<'a>>,
}

/// `{"name": …}`.
#[derive(Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionName<'a> {
    /// The name.
    #[serde(default, borrow)]
    pub name: Option<Str<'a>>,
}

impl<'a> ToolChoice<'a> {
    /// The named function `name`.
    pub fn named(name: impl Into<Str<'a>>) -> Self {
        Self::Function(NamedFunction {
            kind: Some("function".into()),
            function: Some(FunctionName {
                name: Some(name.into()),
            }),
        })
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for ToolChoice<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = ToolChoice<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"auto\", \"none\", \"required\" or a named function")
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
                NamedFunction::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(ToolChoice::Function)
            }
        }
        deserializer.deserialize_any(Visit)
    }
}

/// A tool call: whole in a message, or a piece of one in a stream's delta.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolCall<'a> {
    /// Which call of the turn a streamed piece belongs to (whole calls have none: their place
    /// in the list is their index).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    /// The call's id (a stream's first piece of each call).
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub id: Option<Str<'a>>,
    /// `function` (a stream's first piece of each call).
    #[serde(
        rename = "type",
        default,
        borrow,
        skip_serializing_if = "Option::is_none"
    )]
    pub kind: Option<Str<'a>>,
    /// The function and (a piece of) its arguments.
    #[serde(default, borrow)]
    pub function: Option<FunctionCall<'a>>,
}

/// The function of a tool call.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall<'a> {
    /// The tool (a stream's first piece of each call).
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub name: Option<Str<'a>>,
    /// (More of) the arguments.
    #[serde(default, borrow)]
    pub arguments: Option<Arguments<'a>>,
}

/// A tool call's arguments: JSON text (OpenAI's shape), or a JSON object as some servers
/// send in whole answers.
#[derive(Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Arguments<'a> {
    /// JSON text.
    Text(Str<'a>),
    /// A JSON value.
    Json(Value),
}

impl Arguments<'_> {
    /// The arguments as JSON text.
    pub fn into_text(self) -> String {
        match self {
            Self::Text(text) => text.into_owned(),
            Self::Json(value) => value.to_string(),
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Arguments<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Arguments<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("JSON text or a JSON object")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Arguments::Text(v.into()))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Arguments::Text(v.to_owned().into()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                Value::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(Arguments::Json)
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Arguments::Json(Value::Null))
            }
        }
        deserializer.deserialize_any(Visit)
    }
}

/// One streamed chunk (`chat.completion.chunk`, `text_completion`), or one whole answer
/// (`chat.completion`): the fields every server's dialect uses.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Chunk<'a> {
    /// The reply's id (`chatcmpl-…`, `cmpl-…`), the same in every chunk.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub id: Option<Str<'a>>,
    /// `chat.completion.chunk`, `chat.completion`, `text_completion`; vLLM's errors say `error`.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub object: Option<Str<'a>>,
    /// Seconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<u64>,
    /// The model that answered.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub model: Option<Str<'a>>,
    /// The choices (one; none in a usage chunk).
    #[serde(default, borrow)]
    pub choices: Vec<Choice<'a>>,
    /// Token accounting (where and whether it comes differs by server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// llama.cpp's server: `cache_n` prompt tokens came from its cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
    /// An error in the stream: OpenAI's `{"error": {...}}` or TGI's `{"error": "..."}`.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorField<'a>>,
    /// vLLM's error message (with `object: "error"`).
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub message: Option<Str<'a>>,
}

impl Chunk<'_> {
    /// The error this chunk carries, if it is one.
    pub fn error(&self) -> Option<String> {
        match &self.error {
            Some(ErrorField::Text(text)) => return Some(text.to_string()),
            Some(ErrorField::Object(error)) => {
                return Some(
                    error
                        .message
                        .as_deref()
                        .unwrap_or("(no message)")
                        .to_owned(),
                );
            }
            None => {}
        }
        (self.object.as_deref() == Some("error"))
            .then(|| self.message.as_deref().unwrap_or("(no message)").to_owned())
    }
}

/// One choice of a chunk or answer.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Choice<'a> {
    /// Its index (0).
    #[serde(default)]
    pub index: u32,
    /// A chat chunk's new text or tool-call pieces.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub delta: Option<Delta<'a>>,
    /// A whole chat answer's message.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub message: Option<ReplyMessage<'a>>,
    /// A completion's text.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub text: Option<Str<'a>>,
    /// Always `null` here (no log probabilities are served).
    #[serde(default)]
    pub logprobs: Option<Value>,
    /// `stop`, `length`, `tool_calls`, `content_filter` (TGI: `eos_token`, `stop_sequence`);
    /// `null` until the last.
    #[serde(default, borrow)]
    pub finish_reason: Option<Str<'a>>,
    /// vLLM and SGLang: the stop string that matched (or the stop token's id).
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<MatchedStop<'a>>,
    /// SGLang's spelling of the same.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub matched_stop: Option<MatchedStop<'a>>,
}

/// What a chat chunk adds.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Delta<'a> {
    /// `assistant`, in the first chunk.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub role: Option<Str<'a>>,
    /// More text.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub content: Option<Str<'a>>,
    /// Pieces of tool calls.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall<'a>>>,
    /// More reasoning (vLLM's and SGLang's reasoning parsers, DeepSeek's API).
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<Str<'a>>,
    /// The same, under vLLM's newer name.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Str<'a>>,
}

/// A whole chat answer's message.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplyMessage<'a> {
    /// `assistant`.
    #[serde(default, borrow)]
    pub role: Option<Str<'a>>,
    /// The text (`null` beside tool calls when the model wrote none).
    #[serde(default, borrow)]
    pub content: Option<Str<'a>>,
    /// The model's refusal (`null` here).
    #[serde(default)]
    pub refusal: Option<Value>,
    /// The tools it called.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall<'a>>>,
    /// Its reasoning (vLLM's and SGLang's reasoning parsers).
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<Str<'a>>,
    /// The same, under vLLM's newer name.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Str<'a>>,
}

/// `stop_reason` / `matched_stop`: the stop string that matched, or a stop token's id.
#[derive(Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum MatchedStop<'a> {
    /// A stop string.
    Text(Str<'a>),
    /// A token id (or anything else): not a matched string.
    Other(Value),
}

impl<'de: 'a, 'a> Deserialize<'de> for MatchedStop<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = MatchedStop<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a stop string or a token id")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(MatchedStop::Text(v.into()))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(MatchedStop::Text(v.to_owned().into()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
                Ok(MatchedStop::Other(v.into()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
                Ok(MatchedStop::Other(v.into()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
                Ok(MatchedStop::Other(v.into()))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
                Ok(MatchedStop::Other(v.into()))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(MatchedStop::Other(Value::Null))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> Result<Self::Value, A::Error> {
                Value::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
                    .map(MatchedStop::Other)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                Value::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(MatchedStop::Other)
            }
        }
        deserializer.deserialize_any(Visit)
    }
}

/// Token accounting. Every count is optional on the way in (servers leave some out).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Every prompt token, cached or not.
    #[serde(default)]
    pub prompt_tokens: Option<u32>,
    /// Generated tokens.
    #[serde(default)]
    pub completion_tokens: Option<u32>,
    /// The two together.
    #[serde(default)]
    pub total_tokens: Option<u32>,
    /// Of the prompt, what the server's prefix cache held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

impl Usage {
    /// The whole block: `prompt` tokens of which `cached` came from the cache, `completion`
    /// generated.
    pub fn new(prompt: u32, cached: u32, completion: u32) -> Self {
        Self {
            prompt_tokens: Some(prompt),
            completion_tokens: Some(completion),
            total_tokens: Some(prompt.saturating_add(completion)),
            prompt_tokens_details: Some(PromptTokensDetails {
                cached_tokens: Some(cached),
            }),
        }
    }
}

/// `usage.prompt_tokens_details`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens read from the prefix cache.
    #[serde(default)]
    pub cached_tokens: Option<u32>,
}

/// llama.cpp's `timings`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timings {
    /// Prompt tokens from the cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_n: Option<u32>,
}

/// An error field: OpenAI's object, or TGI's bare string.
#[derive(Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ErrorField<'a> {
    /// TGI: `"error": "..."`.
    Text(Str<'a>),
    /// OpenAI: `"error": {"message": ...}`.
    Object(ErrorObject<'a>),
}

impl<'de: 'a, 'a> Deserialize<'de> for ErrorField<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = ErrorField<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an error message or an error object")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(ErrorField::Text(v.into()))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(ErrorField::Text(v.to_owned().into()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                ErrorObject::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(ErrorField::Object)
            }
        }
        deserializer.deserialize_any(Visit)
    }
}

/// OpenAI's error object.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorObject<'a> {
    /// What went wrong.
    #[serde(default, borrow)]
    pub message: Option<Str<'a>>,
    /// `invalid_request_error`, `rate_limit_error`, `server_error`, ….
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<Str<'a>>,
    /// The field at fault (`null` here).
    #[serde(default)]
    pub param: Option<Value>,
    /// A machine-readable code (a string here; vLLM sends the status as a number), or `null`.
    #[serde(default)]
    pub code: Option<Value>,
}

/// An error response body: `{"error": {...}}`.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorResponse<'a> {
    /// The error.
    #[serde(borrow)]
    pub error: ErrorObject<'a>,
}

impl<'a> ErrorResponse<'a> {
    /// An error of `kind` saying `message`, with `code` (or `null`).
    pub fn new(kind: &'a str, message: &'a str, code: Option<&'a str>) -> Self {
        Self {
            error: ErrorObject {
                message: Some(message.into()),
                kind: Some(kind.into()),
                param: None,
                code: code.map(Value::from),
            },
        }
    }
}

/// The frame of a streamed text piece, its fixed parts written once per reply: the same frame
/// a [`Chunk`] with the text (a chat's `delta.content`, a completion's `text`) writes, without
/// building the chunk (a reply's most frequent frame, one per token).
#[derive(Clone, Debug)]
pub struct TextFrame {
    prefix: Vec<u8>,
    suffix: &'static [u8],
}

impl TextFrame {
    /// The text frames of reply `id` from `model`, made at `created`, a chat's (else a
    /// completion's).
    pub fn new(id: &str, model: &str, created: u64, chat: bool) -> Self {
        let mut prefix = b"data: {\"id\":".to_vec();
        crate::sse::json_string(&mut prefix, id);
        prefix.extend_from_slice(b",\"object\":");
        crate::sse::json_string(&mut prefix, if chat { CHAT_CHUNK } else { TEXT_COMPLETION });
        prefix.extend_from_slice(b",\"created\":");
        prefix.extend_from_slice(created.to_string().as_bytes());
        prefix.extend_from_slice(b",\"model\":");
        crate::sse::json_string(&mut prefix, model);
        if chat {
            prefix.extend_from_slice(b",\"choices\":[{\"index\":0,\"delta\":{\"content\":");
        } else {
            prefix.extend_from_slice(b",\"choices\":[{\"index\":0,\"text\":");
        }
        let suffix: &'static [u8] = if chat {
            b"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
        } else {
            b",\"logprobs\":null,\"finish_reason\":null}]}\n\n"
        };
        Self { prefix, suffix }
    }

    /// Appends the frame of `text`.
    pub fn write(&self, out: &mut Vec<u8>, text: &str) {
        out.extend_from_slice(&self.prefix);
        crate::sse::json_string(out, text);
        out.extend_from_slice(self.suffix);
    }
}

/// `object` of a streamed chat chunk.
pub const CHAT_CHUNK: &str = "chat.completion.chunk";
/// `object` of a whole chat answer.
pub const CHAT_COMPLETION: &str = "chat.completion";
/// `object` of a completion, streamed or whole.
pub const TEXT_COMPLETION: &str = "text_completion";

/// Ends an OpenAI stream.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_reads_back_as_written() {
        let request = Request {
            model: Some("m".into()),
            messages: Some(vec![Message {
                role: "user".into(),
                content: Some(Content::List(vec![
                    Part::image("https://x/y.png"),
                    Part::text("What is this?"),
                ])),
                ..Message::default()
            }]),
            max_tokens: Some(8),
            stop: Some(Stop::Text("END".into())),
            tool_choice: Some(ToolChoice::named("f")),
            ..Request::default()
        };
        let text = serde_json::to_string(&request).unwrap();
        assert_eq!(
            text,
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/y.png"}},{"type":"text","text":"What is this?"}]}],"max_tokens":8,"stop":"END","tool_choice":{"type":"function","function":{"name":"f"}}}"#
        );
        let back: Request<'_> = serde_json::from_str(&text).unwrap();
        assert_eq!(back.tool_choice, Some(ToolChoice::named("f")));
        assert_eq!(back.stop, Some(Stop::Text("END".into())));
        let choice: Request<'_> =
            serde_json::from_str(r#"{"tool_choice":"auto","stop":["a","b"],"prompt":[1,2]}"#)
                .unwrap();
        assert_eq!(choice.tool_choice, Some(ToolChoice::Mode("auto".into())));
        assert_eq!(choice.stop, Some(Stop::List(vec!["a".into(), "b".into()])));
        assert_eq!(choice.prompt, Some(Prompt::List(vec![1.into(), 2.into()])));
    }

    #[test]
    fn chunks_of_every_dialect_read() {
        let chunk: Chunk<'_> = serde_json::from_str(
            r#"{"id":"c1","choices":[{"index":0,"delta":{"content":"Hi","tool_calls":[{"index":0,"id":"t","function":{"name":"f","arguments":"{\"a\""}}]},"finish_reason":"stop","stop_reason":7}],"usage":{"prompt_tokens":3},"timings":{"cache_n":2}}"#,
        )
        .unwrap();
        let choice = &chunk.choices[0];
        assert_eq!(
            choice.delta.as_ref().unwrap().content.as_deref(),
            Some("Hi")
        );
        assert!(
            choice
                .delta
                .as_ref()
                .unwrap()
                .content
                .as_ref()
                .unwrap()
                .is_borrowed()
        );
        assert_eq!(choice.stop_reason, Some(MatchedStop::Other(7.into())));
        assert_eq!(chunk.timings.unwrap().cache_n, Some(2));
        for (body, message) in [
            (r#"{"error":{"message":"boom"}}"#, "boom"),
            (r#"{"error":"tgi says no"}"#, "tgi says no"),
            (
                r#"{"object":"error","message":"vllm says no"}"#,
                "vllm says no",
            ),
        ] {
            let chunk: Chunk<'_> = serde_json::from_str(body).unwrap();
            assert_eq!(chunk.error().as_deref(), Some(message));
        }
    }

    #[test]
    fn the_text_frame_fast_path_writes_the_chunks_own_frame() {
        for chat in [true, false] {
            let frame = TextFrame::new("chatcmpl-1", "m\"x", 7, chat);
            let text = "tok \"é\"\n";
            let mut fast = Vec::new();
            frame.write(&mut fast, text);
            let choice = if chat {
                Choice {
                    delta: Some(Delta {
                        content: Some(text.into()),
                        ..Delta::default()
                    }),
                    ..Choice::default()
                }
            } else {
                Choice {
                    text: Some(text.into()),
                    ..Choice::default()
                }
            };
            let chunk = Chunk {
                id: Some("chatcmpl-1".into()),
                object: Some(if chat { CHAT_CHUNK } else { TEXT_COMPLETION }.into()),
                created: Some(7),
                model: Some("m\"x".into()),
                choices: vec![choice],
                ..Chunk::default()
            };
            let mut slow = Vec::new();
            crate::sse::data(&mut slow, &chunk);
            assert_eq!(
                String::from_utf8(fast).unwrap(),
                String::from_utf8(slow).unwrap()
            );
        }
    }

    #[test]
    fn an_error_body_is_openais_shape() {
        assert_eq!(
            serde_json::to_string(&ErrorResponse::new(
                "rate_limit_error",
                "slow down",
                Some("rate_limit_exceeded")
            ))
            .unwrap(),
            r#"{"error":{"message":"slow down","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}}"#
        );
    }
}
