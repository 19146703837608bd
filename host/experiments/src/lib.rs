//! Ringmaster's experiments: the per-variant samples of the router slot's A/B variants and its
//! shadow ([`VariantStats`]), the statistics that compare them in a form that survives being
//! read as often as an operator likes ([`stats`]), and the guardrails that say when a
//! candidate is worse beyond doubt ([`guardrails`]). No I/O, no clock, no knowledge of the
//! gateway: the gateway records into the samples and acts on the guardrails' word.

#![deny(missing_docs)]

pub mod guardrails;
mod samples;
pub mod stats;

pub use samples::{TTFT_SAMPLES_PER_VARIANT, VariantFigures, VariantStats};
