//! Write Ringmaster policies in Rust.
//!
//! A Ringmaster policy is a WebAssembly component that targets one of the worlds of the WIT
//! package `ringmaster:policy@0.3.0` (see `wit/policy.wit`): a **router** picks the GPU server
//! for a request (a **learning router** also hears how each request went), an **admission**
//! policy decides whether a request runs now, waits or is refused, and a **safety filter**
//! checks the text going in and coming out. This crate
//! owns what a policy author in Rust needs and nothing of the gateway: it must not depend on
//! `host/`.
//!
//! - [`router`], [`learning_router`], [`admission`] and [`safety`]: the bindings `wit-bindgen`
//!   generates for each world: the `Guest` trait to implement, the world's types, and an
//!   `export!` macro.
//! - [`types`] and [`host`]: the request (a resource: each getter is one host call, so a
//!   policy pays only for what it reads), the records shared by every world, and the host's
//!   interfaces a policy may call (the ring, the cluster view, the shared `state` store, log
//!   lines, counters, its configuration).
//! - [`store`]: typed helpers over `state` (numbers, strings).
//! - [`config`]: typed configuration values with defaults and clear errors
//!   ([`config_f64`], [`config_u32`], …).
//! - [`decide`]: pure decision helpers over plain inputs (server lists, prefix matches), the
//!   building blocks of the built-in policies.
//! - [`testing`]: builders for those plain inputs in native unit tests.
//!
//! # Writing a policy
//!
//! A policy is a crate with `crate-type = ["cdylib", "rlib"]` that implements the world's
//! `Guest` trait on a unit struct and exports it:
//!
//! ```no_run
//! use ringmaster_policy_sdk::router::{Decision, Guest};
//! use ringmaster_policy_sdk::{host::ring, types::Request};
//!
//! struct Sticky;
//!
//! impl Guest for Sticky {
//!     fn route(req: &Request) -> Decision {
//!         match ring::lookup(req.routing_key()) {
//!             Some(server) => Decision::Route(server),
//!             None => Decision::Reject("no healthy GPU server".into()),
//!         }
//!     }
//! }
//!
//! ringmaster_policy_sdk::router::export!(Sticky);
//! # fn main() {}
//! ```
//!
//! Build it for `wasm32-unknown-unknown` (release, `panic = "abort"`) and turn the core module
//! into a component with `wasm-tools component new` or the `wit-component` crate; inside this
//! repository `cargo xtask policies` does both for every crate under `policies/`. The component
//! imports only the `ringmaster:policy` interfaces it calls: no WASI, no files, no network.
//!
//! Because this crate carries the bindings of all three worlds, a module built with it also
//! holds the import-only descriptions of the two worlds it does not export. Encoded as is (by
//! `wasm-tools component new`), the component gets their records and variants as unused type
//! imports, which hosts ignore; `cargo xtask policies` drops those descriptions first, so its
//! components describe exactly one world and cannot call an import their world lacks.
//!
//! # Keep the logic testable
//!
//! The host's interfaces exist only inside the gateway: called from a native test, they panic.
//! So put the decision in a pure function over plain values (the servers, the prefix matches,
//! the configuration) and keep the `Guest` impl a thin shim that gathers those values from the
//! host and calls it. `cargo test` then exercises the real logic natively; the built-in
//! policies under `policies/` are written this way.
//!
//! # What can go wrong
//!
//! - A panic is a trap: the gateway falls back to its built-in consistent-hash decision, counts
//!   the fault and, after repeated faults, rolls the policy back. A new version is probed with
//!   sample requests before it is swapped in, so a policy that traps on a bad configuration
//!   (see [`config::OrTrap`]) never goes live with it.
//! - Every call has a deadline and a memory cap; a policy that loops or allocates without bound
//!   is stopped and treated as a trap.
//! - The gateway may create a fresh instance for any call, and runs several at once: keep what
//!   decisions share (a session table, what a learning router learned) in
//!   [`host::state`] (see [`store`]), not in the instance's own memory.
//! - Prompt text reaches only the safety filter. Never write it (or anything derived from it)
//!   to a log line.

#![deny(missing_docs)]

pub mod config;
pub mod decide;
pub mod store;
pub mod testing;

pub use config::{
    ConfigError, ConfigSource, HostConfig, OrTrap, config_bool, config_f64, config_list,
    config_string, config_u8, config_u32,
};

/// Bindings for the `router` world: implement [`router::Guest`] and call
/// [`router::export!`](crate::router::export).
///
/// This module also generates the host interfaces every world shares ([`host`]) and the
/// shared records ([`types`]); the other worlds' bindings reuse them, so a
/// [`types::Request`] is the same Rust type in every world.
#[allow(unsafe_code, missing_docs, clippy::all)]
pub mod router {
    wit_bindgen::generate!({
        world: "router",
        path: "../wit/policy.wit",
        pub_export_macro: true,
        default_bindings_module: "ringmaster_policy_sdk::router",
        additional_derives: [PartialEq, Eq],
    });
}

/// Bindings for the `learning-router` world: implement [`learning_router::Guest`] (`route`
/// and `observe`) and call [`learning_router::export!`](crate::learning_router::export).
#[allow(unsafe_code, missing_docs, clippy::all)]
pub mod learning_router {
    wit_bindgen::generate!({
        world: "learning-router",
        path: "../wit/policy.wit",
        pub_export_macro: true,
        default_bindings_module: "ringmaster_policy_sdk::learning_router",
        additional_derives: [PartialEq, Eq],
        with: {
            "ringmaster:policy/types@0.3.0": crate::router::ringmaster::policy::types,
            "ringmaster:policy/ring@0.3.0": crate::router::ringmaster::policy::ring,
            "ringmaster:policy/cluster@0.3.0": crate::router::ringmaster::policy::cluster,
            "ringmaster:policy/state@0.3.0": crate::router::ringmaster::policy::state,
            "ringmaster:policy/log@0.3.0": crate::router::ringmaster::policy::log,
            "ringmaster:policy/metrics@0.3.0": crate::router::ringmaster::policy::metrics,
            "ringmaster:policy/config@0.3.0": crate::router::ringmaster::policy::config,
        },
    });
}

/// Bindings for the `admission` world: implement [`admission::Guest`] and call
/// [`admission::export!`](crate::admission::export).
#[allow(unsafe_code, missing_docs, clippy::all)]
pub mod admission {
    wit_bindgen::generate!({
        world: "admission",
        path: "../wit/policy.wit",
        pub_export_macro: true,
        default_bindings_module: "ringmaster_policy_sdk::admission",
        additional_derives: [PartialEq, Eq],
        with: {
            "ringmaster:policy/types@0.3.0": crate::router::ringmaster::policy::types,
            "ringmaster:policy/cluster@0.3.0": crate::router::ringmaster::policy::cluster,
            "ringmaster:policy/state@0.3.0": crate::router::ringmaster::policy::state,
            "ringmaster:policy/log@0.3.0": crate::router::ringmaster::policy::log,
            "ringmaster:policy/metrics@0.3.0": crate::router::ringmaster::policy::metrics,
            "ringmaster:policy/config@0.3.0": crate::router::ringmaster::policy::config,
        },
    });
}

/// Bindings for the `safety-filter` world: implement [`safety::Guest`] and call
/// [`safety::export!`](crate::safety::export).
#[allow(unsafe_code, missing_docs, clippy::all)]
pub mod safety {
    wit_bindgen::generate!({
        world: "safety-filter",
        path: "../wit/policy.wit",
        pub_export_macro: true,
        default_bindings_module: "ringmaster_policy_sdk::safety",
        additional_derives: [PartialEq, Eq],
        with: {
            "ringmaster:policy/state@0.3.0": crate::router::ringmaster::policy::state,
            "ringmaster:policy/log@0.3.0": crate::router::ringmaster::policy::log,
            "ringmaster:policy/metrics@0.3.0": crate::router::ringmaster::policy::metrics,
            "ringmaster:policy/config@0.3.0": crate::router::ringmaster::policy::config,
        },
    });
}

/// What every world shares: the [`Request`](types::Request) resource, the
/// [`Server`](types::Server) record and a learning router's [`Outcome`](types::Outcome).
pub mod types {
    pub use crate::router::ringmaster::policy::types::{Outcome, Pair, Request, Role, Server};
}

/// The host's interfaces a policy may import.
///
/// Which ones a component may actually call depends on its world: a router may use all of
/// them, an admission policy all but [`ring`](host::ring), a safety filter only
/// [`log`](host::log), [`metrics`](host::metrics) and [`config`](host::config). Outside the
/// gateway (in a native test) every function here panics.
pub mod host {
    pub use crate::router::ringmaster::policy::{cluster, config, log, metrics, ring, state};

    /// Writes a `debug` log line; the host tags it with the policy and the request id.
    pub fn debug(message: &str) {
        log::write(log::Level::Debug, message);
    }

    /// Writes an `info` log line.
    pub fn info(message: &str) {
        log::write(log::Level::Info, message);
    }

    /// Writes a `warn` log line.
    pub fn warn(message: &str) {
        log::write(log::Level::Warn, message);
    }

    /// Writes an `error` log line.
    pub fn error(message: &str) {
        log::write(log::Level::Error, message);
    }

    /// Adds one to counter `name` (ASCII letters, digits and `_`, at most 64 bytes).
    pub fn count(name: &str) {
        metrics::counter_add(name, 1);
    }

    /// `cluster.prefix-matches` for a request with `prefix_hashes` prefix hashes, without the
    /// host call when it has none (nothing of it can be cached).
    pub fn prefix_matches_for(prefix_hashes: u32) -> Vec<(String, u32)> {
        if prefix_hashes == 0 {
            Vec::new()
        } else {
            cluster::prefix_matches()
        }
    }
}
