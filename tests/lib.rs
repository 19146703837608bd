//! Support for the end-to-end tests in `e2e/` and the benchmarks in `bench/`: a fake
//! OpenAI-compatible server with the stream shapes and faults of real ones.

#![deny(missing_docs)]

pub mod fake_upstream;
pub mod kv_publisher;
pub mod otlp_receiver;
pub mod pd_upstream;
