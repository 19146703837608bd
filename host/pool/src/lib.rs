//! Ringmaster's server pool: which servers exist and which models each serves, how loaded and
//! how healthy they are, which one gets a request, and how a request reaches it.
//!
//! - [`server`]: one server, its backend and its requests in flight;
//! - [`generation`]: a started request's events as the pool hands them over, with what a
//!   relay of the server's own answer needs;
//! - [`snapshot`]: the pool at one instant, with one ring per served model;
//! - [`Pool`] (membership: add, remove, drain) and [`selection`] (the bounded-load walk,
//!   policy choices under the cap, failover and retries);
//! - [`remote`]: the client of remote OpenAI-compatible servers (pooled connections, stream
//!   decoding, timeouts, ejection);
//! - [`kv_view`] and [`prefix_index`]: what each server's cache holds, as it reports it or as
//!   the routing history estimates it;
//! - [`input`]: what routing knows about a request, computed once by the gateway;
//! - [`autoscale`]: the autoscaling signal, the fleet's work over its capacity;
//! - [`settings`]: the engines' and the ring's settings from the configuration's.
//!
//! It knows no client-facing API (the gateway parses requests and renders replies) and no
//! policy logic (the gateway's router slot asks policies and hands their answer here).

#![deny(missing_docs)]

pub mod autoscale;
pub mod engine_index;
pub mod generation;
pub mod input;
pub mod kv_view;
mod local_events;
mod pool;
pub mod prefix_index;
pub mod remote;
pub mod selection;
pub mod server;
pub mod settings;
pub mod snapshot;

pub use generation::{Generation, RelaySource, RelayState};
pub use input::{KeySource, RoutingInput};
pub use pool::Pool;
pub use ringmaster_config::CapGuard;
pub use ringmaster_config::servers::{GpuPlacement, ServerAddress, ServerSpec};
pub use selection::{Decision, DecisionReason};
pub use server::{
    Backend, BackendError, InFlight, MODEL_MAX_RUNNING, MODEL_STEP_TOKEN_BUDGET,
    ModelCatalogueSpec, PoolError, Server, ServerTemplates,
};
pub use snapshot::{ModelCatalogue, PoolSnapshot};
