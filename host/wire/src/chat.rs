//! The chat that doors and engines share: messages, images, tools, reasoning effort,
//! structured output and sampling, as plain data. The doors build them from the clients'
//! requests; the engines and the pool's remote clients take them. No serde derive: each
//! wire format has its own shapes, and these are what those shapes mean.
//!
//! They live here, below both the doors (`ringmaster-api`) and the engine
//! (`ringmaster-gpu-runtime`), so that a front door builds without the engine.

/// Who wrote a chat message. The leading system prompt is not a message: it is
/// the request's system prompt (the engine's `GenerateRequest::system`); [`Role::System`] is an instruction later in the conversation.
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
