//! What `ringmaster policy` does for a policy author, outside this repository.
//!
//! - [`scaffold`]: a standalone project for a router in Rust or Python: its own build file,
//!   the WIT it targets, the SDK (vendored, so it builds offline and never drifts from the
//!   WIT), a sample policy and a unit test in the language's own test runner.
//! - [`build`]: the project to a component, finding (or, where allowed, installing) the
//!   toolchain: [`toolchain`] for Rust, a cached virtualenv with `componentize-py` for Python.
//! - [`check`]: a component against the worlds and the sandbox, with its size and timings.
//! - [`wasm`]: a Rust guest's core module to a component (shared with `cargo xtask policies`).
//!
//! `build` and `check` load components, so they come with the `engine` feature (on by
//! default); `cargo xtask` uses the rest without it, and so without wasmtime.
//!
//! This crate must not talk to a running gateway (the binary pushes over HTTP) and must not
//! know about the replay (the binary runs it).

#[cfg(feature = "engine")]
pub mod build;
#[cfg(feature = "engine")]
pub mod check;
pub mod scaffold;
pub mod toolchain;
pub mod wasm;

use std::path::PathBuf;

/// Why a kit operation failed; every message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum KitError {
    /// No toolchain can build the guest here (the message names what to install).
    #[error("{0}")]
    Toolchain(String),
    /// A program could not be started.
    #[error("running {command}: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A program ran and failed.
    #[error("{command} failed: {detail}")]
    Failed {
        /// The command line.
        command: String,
        /// Its error output, or its exit status.
        detail: String,
    },
    /// A core module could not become a component.
    #[error("{0}")]
    Wasm(String),
    /// A core module did not parse.
    #[error("the guest's core module does not parse: {0}")]
    Parse(#[from] wasmparser::BinaryReaderError),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The project or the request is not what the kit can work with.
    #[error("{0}")]
    Project(String),
    /// The component did not load into the policy engine.
    #[cfg(feature = "engine")]
    #[error(transparent)]
    Policy(#[from] ringmaster_policy_engine::PolicyError),
}

/// The kit's result.
pub type Result<T, E = KitError> = std::result::Result<T, E>;

pub(crate) fn io_error(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> KitError {
    let path = path.into();
    move |source| KitError::Io { path, source }
}
