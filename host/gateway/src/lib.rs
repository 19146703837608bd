//! Ringmaster's gateway: the running server in front of a pool of inference servers, in named
//! rooms around one state ([`Gateway`], in `state`):
//!
//! - **start-up** (`start`): the servers started, the policies loaded, the gates built;
//! - **the server loop** (`service`, over `ringmaster_serve`): connections under their
//!   limits, paths dispatched, every response stamped;
//! - **the doors** ([`doors`]): what each client-facing API's route reads from a request's head
//!   and body before the call;
//! - **the call** ([`call`]): one request carried through its phases, admit → prepare → route →
//!   attempt (one leg, or a prefill leg and a decode leg) → answer;
//! - **replies** (`reply`, [`respond`], `body`): one reply state machine, streamed or collected,
//!   and the error and JSON responses;
//! - **gates** ([`auth`], [`admission`], [`safety`]): keys and limits, the admission policy and
//!   its fair queue, the safety filter (overload shedding is `ringmaster_serve::overload`);
//! - **operations** ([`metrics`], `collectors`, `track`, [`fleet`], `reload`, `background`):
//!   what an operator watches and the per-request accounting behind it (`track`), the fleet's
//!   adapters, policy files reloaded when they change, and every background loop of the
//!   gateway's, started in one place (`background`).
//!
//! Arrows run down that list's reverse: the call uses the gates and replies, never the
//! reverse; every room reads the state and the state knows no room above the gates.
//!
//! Words, one meaning each: a **door** is a client-facing API (Messages, Chat, Completions,
//! Responses); a **server** one inference endpoint and a **pool** the servers of one model; a
//! **route** the router slot's decision (a server, or a prefill/decode pair; only the metrics'
//! `route` label keeps HTTP's sense, a path's label, as dashboards know it); an **attempt**
//! one try of sending a routed request (a retry is another attempt); a **leg** one server's
//! part of a split request; a **variant** one router version in an experiment; the
//! **record**ing the traffic written as a trace; a **gate** a check a request passes before it
//! is routed.
//!
//! It never logs a prompt or a key. Start one with [`Gateway::start`] and [`serve`].

#![deny(missing_docs)]

pub mod admission;
pub mod auth;
mod background;
mod body;
pub mod call;
mod collectors;
pub mod doors;
pub mod fleet;
pub mod metrics;
mod reload;
mod reply;
pub mod respond;
pub mod safety;
mod service;
mod start;
mod state;
mod track;

/// The server pool (its own crate).
pub use ringmaster_pool as pool;

pub use body::ResponseBody;
pub use body::full as full_body;
pub use reload::POLICY_WATCH_INTERVAL;
/// The configuration (its own crate).
pub use ringmaster_config as config;
pub use ringmaster_config::{Config, RawConfig};
pub use service::{Listener, PeerAddr, serve, serve_admin};
pub use start::StartError;
pub use state::{AdminFuture, AdminRoutes, Gateway};
