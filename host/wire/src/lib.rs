//! Ringmaster's wire formats: every JSON shape that crosses a socket, as serde types, and
//! nothing else (no I/O, no validation, no logic).
//!
//! - [`openai`]: chat completions and completions, requests, chunks, whole answers, usage and
//!   errors, as clients send them and as vLLM, SGLang, TGI, llama.cpp's server, Ollama and
//!   `ringmaster worker` answer;
//! - [`anthropic`]: the Messages API's request, message, stream events and errors;
//! - [`worker`]: `ringmaster worker`'s load report, KV events and tokenizer description;
//! - [`models`]: the model list both APIs read;
//! - [`sse`]: server-sent event frames.
//!
//! The gateway's doors, the pool's client, the worker and the tests' fake servers all compile
//! against these types; nothing else writes these shapes. Fields a reader drops borrow from
//! its buffer ([`Str`]).

#![deny(missing_docs)]

pub mod anthropic;
pub mod models;
pub mod openai;
pub mod sse;
mod str;
pub mod worker;

pub use crate::str::Str;
