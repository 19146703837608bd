//! The configuration's one error type, and how a section names a bad value.

use std::time::Duration;

/// A configuration problem, named precisely. Each message holds its cause's words and no
/// variant exposes that cause as its [`source`](std::error::Error::source) too: a printer
/// that walks the chain (anyhow's `{:#}` and `Caused by:`) would show a TOML error's
/// snippet twice.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {error}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// The TOML is malformed or has unknown keys (the message shows where, with a snippet).
    #[error("config is not valid: {0}")]
    Parse(toml::de::Error),
    /// A value breaks an invariant.
    #[error("config key `{key}`: {problem}")]
    Invalid {
        /// The key, dotted.
        key: String,
        /// What is wrong.
        problem: String,
    },
    /// A value the configuration took from the environment breaks an invariant: the variable
    /// is named, since no file holds the value.
    #[error("environment variable {variable}: {problem}")]
    Env {
        /// The variable.
        variable: String,
        /// What is wrong.
        problem: String,
    },
}

impl From<toml::de::Error> for ConfigError {
    fn from(error: toml::de::Error) -> Self {
        Self::Parse(error)
    }
}

impl ConfigError {
    /// `key`'s value breaks an invariant: for the checks only the crate a setting configures
    /// can make (whether this CPU has the kernels asked for), made where it is applied, so
    /// that they read like every other configuration error.
    pub fn invalid(key: impl Into<String>, problem: impl Into<String>) -> Self {
        invalid(key, problem)
    }
}

pub(crate) fn invalid(key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        problem: problem.into(),
    }
}

pub(crate) fn duration_ms(key: &str, ms: f64) -> Result<Duration, ConfigError> {
    if !ms.is_finite() || ms < 0.0 {
        return Err(invalid(
            key,
            format!("{ms} is not a non-negative number of milliseconds"),
        ));
    }
    Ok(Duration::from_secs_f64(ms / 1000.0))
}
