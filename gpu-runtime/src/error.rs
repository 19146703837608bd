//! The engine's error type.
//!
//! This module owns [`EngineError`], the one error the engine's API returns. It must not carry
//! prompt text (errors end up in logs).

/// Why the engine refused a request or a configuration.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request can never fit in this engine's KV cache, not even alone: its prompt plus
    /// `max_tokens` needs more blocks than the pool has. Rejected at submit; retrying on the
    /// same engine cannot help, a smaller `max_tokens` or a bigger server can.
    #[error(
        "prompt of {prompt_tokens} tokens with max_tokens {max_tokens} does not fit in a KV cache of {capacity_tokens} tokens"
    )]
    PromptTooLong {
        /// Tokens in the rendered prompt.
        prompt_tokens: u32,
        /// The request's `max_tokens`.
        max_tokens: u32,
        /// Tokens the whole KV cache holds.
        capacity_tokens: u32,
    },
    /// The prompt plus `max_tokens` is longer than the model's context. Rejected at submit.
    #[error(
        "prompt of {prompt_tokens} tokens with max_tokens {max_tokens} exceeds the model's context of {context_tokens} tokens"
    )]
    ContextTooLong {
        /// Tokens in the rendered prompt.
        prompt_tokens: u32,
        /// The request's `max_tokens`.
        max_tokens: u32,
        /// The model's context length.
        context_tokens: u32,
    },
    /// The prompt has no tokens (an empty raw prompt). Rejected at submit.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The request offers tools, which an engine running a model cannot serve (its models
    /// have no tool-calling chat template nor a parser of the calls; simulated servers take
    /// tools). Rejected at submit.
    #[error(
        "tool use is not supported by Ringmaster's model engines (simulated servers take tools)"
    )]
    ToolsUnsupported,
    /// A message shows images, which an in-process engine cannot read (its models read
    /// text). Rejected at submit.
    #[error("image input is not supported by in-process engines")]
    ImagesUnsupported,
    /// The engine task is gone (it panicked, or its runtime shut down).
    #[error("the engine has stopped")]
    Stopped,
    /// The configuration cannot be used; the message says which field and why.
    #[error("invalid engine configuration: {0}")]
    InvalidConfig(String),
}
