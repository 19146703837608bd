//! Ringmaster's inference engine: a paged KV cache with prefix sharing, iteration-level
//! continuous batching, and a pluggable executor.
//!
//! This crate owns everything between "a chat request arrived" and "these tokens came out":
//! tokenizing, the KV block pool and its prefix cache ([`block`]), the scheduler
//! ([`scheduler`]), the executor boundary ([`executor`]) and the async engine that ties them
//! together ([`EngineHandle`]), and the stream a request's events are read from
//! ([`GenerationStream`]). It must not depend on the gateway: the gateway drives engines through
//! [`EngineHandle`] and reads their [`LoadReport`], which is the worker protocol's `Load` from
//! `ringmaster-wire` (serde types only; the one crate of `host/` this one uses).
//!
//! Three executors implement the [`Executor`] trait: [`SimExecutor`], which replaces model math
//! with a cost model ([`SimCostModel`], defaults resembling one H100 serving a Llama-3-8B-class
//! model) and a modelled clock; [`model::ModelExecutor`], a llama GGUF model on the CPU
//! kernels of `ringmaster-kernels`; and, with the `cuda` feature, `model::GpuExecutor`, the
//! same model on one CUDA GPU through `ringmaster-cuda` (re-exported as `cuda`). The block
//! manager, prefix cache and scheduler are the same for all and do not know which executor
//! runs. Around the engine: worker mode (one engine over HTTP) is the `ringmaster-worker`
//! crate in `host/`, speaking the worker protocol of `ringmaster-wire`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ringmaster_gpu_runtime::EngineError> {
//! use ringmaster_gpu_runtime::*;
//!
//! let engine = EngineHandle::spawn(EngineConfig::simulated("gpu-0"))?;
//! let mut stream = engine.submit(GenerateRequest {
//!     request_id: "req-1".into(),
//!     system: Some("You are terse.".into()),
//!     messages: vec![ChatMessage { role: Role::User, text: "Hello".into(), ..Default::default() }],
//!     max_tokens: 64,
//!     stop_sequences: vec![],
//!     sampling: SamplingParams::default(),
//!     prompt: None,
//!     priority: 0,
//!     tools: None,
//!     effort: None,
//!     output_format: None,
//! })?;
//! while let Some(event) = stream.next().await {
//!     if let GenerateEvent::Token { text } = event {
//!         print!("{text}");
//!     }
//! }
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod block;
mod config;
pub mod cost;
mod engine;
mod error;
pub mod executor;
mod generation;
pub mod handoff;
pub mod measure;
pub mod model;
/// The CUDA back end's kernels and device memory (feature `cuda`).
#[cfg(feature = "cuda")]
pub use ringmaster_cuda as cuda;
mod output;
mod request;
pub mod scheduler;
pub mod tokenizer;

pub use block::BLOCK_SIZE;
pub use block::{KvEvent, StoredBlock};
pub use config::EngineConfig;
pub use cost::{DEFAULT_KV_BLOCKS, SimCostModel};
pub use engine::{EngineHandle, KV_EVENT_BUFFER, LoadReport};
pub use error::EngineError;
pub use executor::{
    Executor, SampledToken, ScheduledSeq, SimExecutor, StepKind, StepOutcome, StepPlan,
};
pub use generation::{EventSource, GenerationStream};
pub use handoff::{ImportRefusal, KvContents, KvHandoff};
pub use request::{
    ChatMessage, Effort, FinishReason, GenerateEvent, GenerateRequest, Image, OutputFormat, Role,
    SamplingParams, ToolCall, ToolChoice, ToolOffer, ToolSpec,
};
pub use tokenizer::{SimTokenizer, Tokenizer, TokenizerSpec};
