//! Ringmaster's wire formats: every JSON shape that crosses a socket, as serde types, and
//! nothing else (no I/O, no validation, no logic).
//!
//! - [`openai`]: chat completions and completions, requests, chunks, whole answers, usage and
//!   errors, as clients send them and as vLLM, SGLang, TGI, llama.cpp's server, Ollama and
//!   `ringmaster worker` answer;
//! - [`anthropic`]: the Messages API's request, message, stream events and errors;
//! - [`chat`]: the chat the doors build and the engines take (messages, tools, sampling);
//! - [`responses`]: OpenAI's Responses API: request, items, response object, stream events;
//! - [`worker`]: `ringmaster worker`'s load report, KV events and tokenizer description;
//! - [`models`]: the model list both APIs read;
//! - [`sse`]: server-sent event frames;
//! - [`object`]: a JSON object edited at its top level, its values passed as their text;
//! - [`reserved`]: the fields and headers only the gateway may set (a split request's legs).
//!
//! The gateway's doors, the pool's client, the worker and the tests' fake servers all compile
//! against these types; nothing else writes these shapes. Fields a reader drops borrow from
//! its buffer ([`Str`]).

#![deny(missing_docs)]

pub mod anthropic;
pub mod chat;
pub mod models;
pub mod object;
pub mod openai;
pub mod reserved;
pub mod responses;
mod skipped;
pub mod sse;
mod str;
pub mod worker;

pub use crate::skipped::Skipped;
pub use crate::str::Str;

/// The API a server speaks: which of these wire formats its requests and replies take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Api {
    /// OpenAI's chat completions (`/v1/chat/completions`, and `/v1/completions` for a raw
    /// prompt): vLLM, SGLang, TGI, llama.cpp's server, Ollama, `ringmaster worker`.
    #[default]
    Chat,
    /// Anthropic's Messages (`/v1/messages`): Anthropic, vLLM, LiteLLM.
    Messages,
    /// OpenAI's Responses (`/v1/responses`): OpenAI, vLLM, SGLang.
    Responses,
}

impl Api {
    /// Every API.
    pub const ALL: [Api; 3] = [Api::Chat, Api::Messages, Api::Responses];

    /// Its name in the config (`api = "…"`), in metrics and in `/admin/servers`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Messages => "messages",
            Self::Responses => "responses",
        }
    }

    /// The API named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|api| api.as_str() == name)
    }
}
