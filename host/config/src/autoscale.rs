//! `[autoscale]`: the autoscaling signal's thresholds and the capacity assumed for servers
//! that report none.

use crate::error::{ConfigError, invalid};
use crate::raw::RawAutoscale;

/// `[autoscale]`, validated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AutoscaleSettings {
    /// Above this utilisation, scale up (0.7).
    pub scale_up: f64,
    /// Below this utilisation, scale down (0.2).
    pub scale_down: f64,
    /// Capacity of a server that reports no KV cache, in tokens (32768).
    pub server_capacity_tokens: u64,
    /// Work of one in-flight request on such a server, in tokens (1024).
    pub tokens_per_request: u64,
}

impl Default for AutoscaleSettings {
    fn default() -> Self {
        Self {
            scale_up: 0.7,
            scale_down: 0.2,
            server_capacity_tokens: 32_768,
            tokens_per_request: 1024,
        }
    }
}

/// Validates `[autoscale]`.
pub(crate) fn autoscale_settings(raw: RawAutoscale) -> Result<AutoscaleSettings, ConfigError> {
    let defaults = AutoscaleSettings::default();
    let settings = AutoscaleSettings {
        scale_up: raw.scale_up.unwrap_or(defaults.scale_up),
        scale_down: raw.scale_down.unwrap_or(defaults.scale_down),
        server_capacity_tokens: raw
            .server_capacity_tokens
            .unwrap_or(defaults.server_capacity_tokens),
        tokens_per_request: raw
            .tokens_per_request
            .unwrap_or(defaults.tokens_per_request),
    };
    if !(settings.scale_down.is_finite() && settings.scale_up.is_finite())
        || settings.scale_down < 0.0
        || settings.scale_down >= settings.scale_up
    {
        return Err(invalid(
            "autoscale",
            "scale_down must be at least 0 and below scale_up",
        ));
    }
    if settings.server_capacity_tokens == 0 {
        return Err(invalid(
            "autoscale.server_capacity_tokens",
            "must be at least 1",
        ));
    }
    Ok(settings)
}
