//! What a caller sends the engine and what the engine streams back.
//!
//! This module owns the generate request and the events of a generation stream. The chat they
//! carry (messages, tools, sampling) is `ringmaster_wire::chat`, shared with the doors. It
//! holds no behaviour; it must not depend on the scheduler, the block manager or any executor,
//! so that the gateway can build and match these types without knowing how the engine works.

pub use ringmaster_wire::chat::{
    ChatMessage, Effort, Image, OutputFormat, Role, SamplingParams, ToolCall, ToolChoice,
    ToolOffer, ToolSpec,
};

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
    /// Tools the model may call (`None`: none offered). Remote servers and the simulated
    /// executor take them; an engine running a model refuses a request that offers any.
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
    /// The model called a tool (a remote server's `tool_calls`, or the simulated model's
    /// call).
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
    /// A piece of a tool call (a remote server's `tool_calls` delta, or the simulated model's
    /// call, one piece per generated token): the first piece of each call carries its id and
    /// name, every piece a part of its arguments' JSON text.
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

impl GenerateEvent {
    /// Whether nothing comes after this event: `Finished` or `Failed` ends a stream.
    pub fn is_last(&self) -> bool {
        matches!(self, Self::Finished { .. } | Self::Failed { .. })
    }
}
