//! What a caller sends the engine and what the engine streams back.
//!
//! This module owns the plain data types of the engine's API: chat messages, sampling
//! parameters, the generate request, and the events of a generation stream. It holds no
//! behaviour; it must not depend on the scheduler, the block manager or any executor, so that
//! the gateway can build and match these types without knowing how the engine works.

/// Who wrote a chat message. The leading system prompt is not a message: it is
/// [`GenerateRequest::system`]; [`Role::System`] is an instruction later in the conversation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Role {
    /// The end user (and the results of tools the model called, which the caller runs).
    #[default]
    User,
    /// The model (an earlier reply, replayed in a multi-turn conversation).
    Assistant,
    /// Instructions in the middle of a conversation (a coding agent's environment, a
    /// developer message after the first turn).
    System,
}

impl Role {
    /// The role's name in a ChatML prompt.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::System => "system",
        }
    }
}

/// One turn of a conversation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: Role,
    /// What it says.
    pub text: String,
    /// The tools an assistant turn called (empty for most turns).
    pub tool_calls: Vec<ToolCall>,
    /// Set when this message is the result of a tool call: the call's id. Its `text` is
    /// the result (OpenAI's `role: "tool"` message, Anthropic's `tool_result` block).
    pub tool_call_id: Option<String>,
    /// Images a user message shows, before its text (only remote servers read them).
    pub images: Vec<Image>,
}

/// An image in a message, as OpenAI's `image_url` names it: an `https://` URL, or the image
/// itself as a `data:` URL (`data:image/png;base64,…`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Image {
    /// The URL.
    pub url: String,
}

/// A call of a tool, as the model made it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCall {
    /// The call's id, which its result names.
    pub id: String,
    /// The tool.
    pub name: String,
    /// The arguments, a JSON object as text.
    pub arguments: String,
}

/// A tool the model may call.
#[derive(Clone, Debug)]
pub struct ToolSpec {
    /// Its name.
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// Its arguments' JSON schema, as the JSON text it came as (passed on, never re-encoded).
    pub parameters: Box<serde_json::value::RawValue>,
}

impl PartialEq for ToolSpec {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.description == other.description
            && self.parameters.get() == other.parameters.get()
    }
}

/// Whether and which tool the model must call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// No tool.
    None,
    /// Some tool.
    Required,
    /// This tool.
    Named(String),
}

/// The tools offered with a request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolOffer {
    /// The tools.
    pub tools: Vec<ToolSpec>,
    /// Whether and which one must be called (`None`: the client did not say, and a server is
    /// not told either).
    pub choice: Option<ToolChoice>,
    /// Whether several calls may come in one turn (`None`: the server's default).
    pub parallel: Option<bool>,
}

/// How hard a reasoning model thinks before it answers (OpenAI's `reasoning_effort`,
/// Anthropic's `thinking` and `output_config.effort`). Only remote servers with reasoning
/// take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effort {
    /// No reasoning.
    None,
    /// The least.
    Minimal,
    /// Little.
    Low,
    /// The default.
    Medium,
    /// Much.
    High,
    /// The most.
    Max,
}

impl Effort {
    /// OpenAI's name of it (`xhigh` for the most).
    pub fn as_openai(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Minimal => "minimal",
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
            Self::Max => "xhigh",
        }
    }

    /// Reads OpenAI's or Anthropic's name (`none`, `minimal`, `low`, `medium`, `high`,
    /// `xhigh`, `max`).
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "none" => Self::None,
            "minimal" => Self::Minimal,
            "low" => Self::Low,
            "medium" => Self::Medium,
            "high" => Self::High,
            "xhigh" | "max" => Self::Max,
            _ => return None,
        })
    }

    /// The effort a thinking budget of `tokens` asks for.
    pub fn from_budget(tokens: u32) -> Self {
        match tokens {
            0 => Self::None,
            1..=2_048 => Self::Low,
            2_049..=16_384 => Self::Medium,
            _ => Self::High,
        }
    }
}

/// Structured output: the answer is JSON (OpenAI's `response_format`, Responses'
/// `text.format`, Anthropic's `output_config.format`). Only remote servers take it.
#[derive(Clone, Debug)]
pub enum OutputFormat {
    /// Any JSON object.
    JsonObject,
    /// JSON following a schema.
    JsonSchema {
        /// The schema's name.
        name: String,
        /// The schema, as the JSON text it came as.
        schema: Box<serde_json::value::RawValue>,
        /// Strict adherence.
        strict: Option<bool>,
    },
}

impl PartialEq for OutputFormat {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::JsonObject, Self::JsonObject) => true,
            (
                Self::JsonSchema {
                    name,
                    schema,
                    strict,
                },
                Self::JsonSchema {
                    name: n,
                    schema: s,
                    strict: t,
                },
            ) => name == n && schema.get() == s.get() && strict == t,
            _ => false,
        }
    }
}

/// How to pick output tokens. The simulated executor accepts all of them and uses only
/// `seed` (to vary its text); a model executor applies them.
#[derive(Clone, Debug, Default)]
pub struct SamplingParams {
    /// Softmax temperature; `None` for the executor's default.
    pub temperature: Option<f32>,
    /// Nucleus sampling mass; `None` for no nucleus cut.
    pub top_p: Option<f32>,
    /// Keep only the `k` most likely tokens; `None` for no cut.
    pub top_k: Option<u32>,
    /// Seed for reproducible sampling; `None` lets the executor choose.
    pub seed: Option<u64>,
    /// Keep generating past the end-of-turn token until `max_tokens` (vLLM's `ignore_eos`):
    /// a replay or a benchmark gets exactly the output length it asks for.
    pub ignore_eos: bool,
}

/// One chat completion to run.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    /// The caller's id for the request; appears in the engine's logs.
    pub request_id: String,
    /// The system prompt, if any.
    pub system: Option<String>,
    /// The conversation so far; the engine generates the next assistant turn.
    pub messages: Vec<ChatMessage>,
    /// Most tokens to generate (the end-of-turn token counts as one).
    pub max_tokens: u32,
    /// Generation stops when the output contains any of these (empty strings are ignored);
    /// the matched text is never streamed.
    pub stop_sequences: Vec<String>,
    /// How to pick tokens.
    pub sampling: SamplingParams,
    /// A raw prompt, tokenized without the chat template (OpenAI-style completions); when set,
    /// `system` and `messages` are ignored.
    pub prompt: Option<String>,
    /// Scheduling priority, 0 = lowest (the admission policy's verdict). When the KV cache
    /// runs out, the lowest-priority running sequence is preempted first.
    pub priority: u8,
    /// Tools the model may call (`None`: none offered). Only remote servers take them; a
    /// local engine refuses a request that offers any.
    pub tools: Option<Box<ToolOffer>>,
    /// How hard a reasoning model thinks (`None`: the server's default). Only remote servers
    /// with reasoning are told.
    pub effort: Option<Effort>,
    /// Structured output (`None`: text). Only remote servers take it.
    pub output_format: Option<Box<OutputFormat>>,
}

/// Why a generation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The model ended its turn.
    EndOfTurn,
    /// `max_tokens` tokens were generated.
    MaxTokens,
    /// The output contained this stop sequence.
    StopSequence(String),
    /// The model called a tool (a remote server's `tool_calls`).
    ToolCalls,
    /// The server's own content filter stopped the reply (a remote server's `content_filter`).
    ContentFilter,
}

/// One event of a [`crate::GenerationStream`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GenerateEvent {
    /// Sent once, right before the first `Token`: the prompt is prefilled and the first token
    /// sampled.
    Started {
        /// Tokens in the rendered prompt.
        prompt_tokens: u32,
        /// Of those, tokens whose KV came from the prefix cache.
        cached_tokens: u32,
    },
    /// Reasoning before the answer (a remote reasoning model's `reasoning_content`, thinking
    /// blocks, reasoning items). Local engines never send it.
    Reasoning {
        /// The text.
        text: String,
    },
    /// Generated text. It never contains any part of a matched stop sequence: text that could
    /// be the start of one is held back until it is known not to be.
    Token {
        /// The text, possibly spanning several tokens (or a part of one).
        text: String,
    },
    /// A piece of a tool call (a remote server's `tool_calls` delta): the first piece of each
    /// call carries its id and name, every piece a part of its arguments' JSON text.
    ToolCall {
        /// Which call of the turn (0 for the first).
        index: u32,
        /// The call's id (first piece only).
        id: Option<String>,
        /// The tool's name (first piece only).
        name: Option<String>,
        /// More of the arguments' JSON text.
        arguments: String,
    },
    /// The server failed after the stream began (a remote server's error object, a broken or
    /// malformed stream). The last event; local engines never send it.
    Failed {
        /// What went wrong, for the client.
        message: String,
    },
    /// The last event.
    Finished {
        /// Why generation ended.
        reason: FinishReason,
        /// Tokens in the rendered prompt.
        prompt_tokens: u32,
        /// Of those, tokens whose KV came from the prefix cache.
        cached_tokens: u32,
        /// Tokens generated, the end-of-turn token included.
        output_tokens: u32,
    },
}
