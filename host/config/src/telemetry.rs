//! `[telemetry]`: the request traces, exported over OTLP. Off unless an endpoint is named, in
//! this section or by the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_ENDPOINT` variables; what the file sets wins over the environment, and
//! what it leaves out the exporter and the SDK read from the `OTEL_*` variables themselves
//! (headers, compression, the sampler, the resource). This module only validates; the
//! `ringmaster-telemetry` crate builds the pipeline.

use serde::Deserialize;

use crate::error::{ConfigError, invalid};

/// `[telemetry]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    /// Where traces go: `http://collector:4318` (OTLP/HTTP; `/v1/traces` is added when the
    /// URL has no path) or `http://collector:4317` with `protocol = "grpc"`.
    pub otlp_endpoint: Option<String>,
    /// `http/protobuf` (default) or `grpc`.
    pub protocol: Option<String>,
    /// The share of new traces kept, 0.0 to 1.0 (default: `OTEL_TRACES_SAMPLER`, else 1.0).
    /// A client's `traceparent` decides for its own trace either way.
    pub sample_ratio: Option<f64>,
    /// `service.name` on every span (default: `OTEL_SERVICE_NAME`, else `ringmaster`).
    pub service_name: Option<String>,
    /// Send the trace context on to the servers in `traceparent` (default true), so an
    /// engine that continues it (vLLM, SGLang) shows its work under the gateway's span.
    pub propagate: Option<bool>,
    /// How long one export may take, milliseconds (default 10000).
    pub export_timeout_ms: Option<u64>,
}

/// How spans travel to the collector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/HTTP with protobuf bodies (port 4318 by convention).
    #[default]
    HttpProtobuf,
    /// OTLP/gRPC (port 4317 by convention).
    Grpc,
}

impl OtlpProtocol {
    /// `http/protobuf` or `grpc`, as `OTEL_EXPORTER_OTLP_PROTOCOL` spells them.
    pub fn parse(name: &str) -> Option<Self> {
        match name.trim() {
            "http/protobuf" | "http" => Some(Self::HttpProtobuf),
            "grpc" => Some(Self::Grpc),
            _ => None,
        }
    }

    /// The name as the OTLP specification spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HttpProtobuf => "http/protobuf",
            Self::Grpc => "grpc",
        }
    }
}

/// Where and how spans are exported.
#[derive(Clone, Debug, PartialEq)]
pub struct OtlpExport {
    /// The collector's URL (for OTLP/HTTP, the full `/v1/traces` URL).
    pub endpoint: String,
    /// How.
    pub protocol: OtlpProtocol,
    /// One export's limit.
    pub timeout: std::time::Duration,
}

/// `[telemetry]`, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct TelemetrySettings {
    /// The exporter (`None`: traces are off and the request path builds no spans for them).
    pub export: Option<OtlpExport>,
    /// The share of new traces kept (the file's `sample_ratio`, else what
    /// `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` say, else all of them).
    pub sample_ratio: f64,
    /// `service.name` (`None`: `OTEL_SERVICE_NAME`, else `ringmaster`).
    pub service_name: Option<String>,
    /// Whether servers are sent the trace context.
    pub propagate: bool,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self {
            export: None,
            sample_ratio: 1.0,
            service_name: None,
            propagate: true,
        }
    }
}

impl TelemetrySettings {
    /// Whether traces are exported.
    pub fn enabled(&self) -> bool {
        self.export.is_some()
    }
}

/// Validates `[telemetry]`, reading the `OTEL_*` variables through `env`.
pub(crate) fn telemetry_settings(
    raw: RawTelemetry,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<TelemetrySettings, ConfigError> {
    let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let protocol = match raw.protocol {
        Some(name) => OtlpProtocol::parse(&name).ok_or_else(|| {
            invalid(
                "telemetry.protocol",
                format!("{name:?} is not one of \"http/protobuf\", \"grpc\""),
            )
        })?,
        None => match set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL"))
        {
            None => OtlpProtocol::default(),
            Some(name) => OtlpProtocol::parse(&name).ok_or_else(|| {
                invalid(
                    "OTEL_EXPORTER_OTLP_PROTOCOL",
                    format!(
                        "{name:?} is not one this build exports with (\"http/protobuf\", \"grpc\")"
                    ),
                )
            })?,
        },
    };
    // A signal's own endpoint is used as it is; the general one gets the signal's path.
    let endpoint = match raw.otlp_endpoint.filter(|e| !e.trim().is_empty()) {
        Some(url) => Some(signal_url(&url, protocol, "telemetry.otlp_endpoint")?),
        None => match set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            Some(url) => Some(checked_url(&url, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")?),
            None => set("OTEL_EXPORTER_OTLP_ENDPOINT")
                .map(|url| signal_url(&url, protocol, "OTEL_EXPORTER_OTLP_ENDPOINT"))
                .transpose()?,
        },
    };
    let disabled = set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    if let Some(ratio) = raw.sample_ratio
        && !(0.0..=1.0).contains(&ratio)
    {
        return Err(invalid(
            "telemetry.sample_ratio",
            format!("{ratio} is not between 0.0 and 1.0"),
        ));
    }
    let sample_ratio = match raw.sample_ratio {
        Some(ratio) => ratio,
        None => env_sampler(
            set("OTEL_TRACES_SAMPLER").as_deref(),
            set("OTEL_TRACES_SAMPLER_ARG").as_deref(),
        )?,
    };
    let timeout_ms = raw.export_timeout_ms.unwrap_or(10_000);
    if timeout_ms == 0 {
        return Err(invalid("telemetry.export_timeout_ms", "must be positive"));
    }
    Ok(TelemetrySettings {
        export: endpoint.filter(|_| !disabled).map(|endpoint| OtlpExport {
            endpoint,
            protocol,
            timeout: std::time::Duration::from_millis(timeout_ms),
        }),
        sample_ratio,
        service_name: raw.service_name.filter(|s| !s.trim().is_empty()),
        propagate: raw.propagate.unwrap_or(true),
    })
}

/// The share `OTEL_TRACES_SAMPLER` keeps. Every sampler the gateway implements honours a
/// client's sampled flag (the parent-based ones); the specification's names without
/// `parentbased_` are read as their parent-based forms.
fn env_sampler(sampler: Option<&str>, arg: Option<&str>) -> Result<f64, ConfigError> {
    let ratio = || -> Result<f64, ConfigError> {
        match arg {
            None => Ok(1.0),
            Some(text) => text
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or_else(|| {
                    invalid(
                        "OTEL_TRACES_SAMPLER_ARG",
                        format!("{text:?} is not a ratio between 0.0 and 1.0"),
                    )
                }),
        }
    };
    match sampler.map(str::trim) {
        None | Some("always_on" | "parentbased_always_on") => Ok(1.0),
        Some("always_off" | "parentbased_always_off") => Ok(0.0),
        Some("traceidratio" | "parentbased_traceidratio") => ratio(),
        Some(other) => Err(invalid(
            "OTEL_TRACES_SAMPLER",
            format!(
                "{other:?} is not one of always_on, always_off, traceidratio and their parentbased_ forms"
            ),
        )),
    }
}

fn checked_url(url: &str, key: &str) -> Result<String, ConfigError> {
    let url = url.trim();
    let parsed: http::Uri = url
        .parse()
        .map_err(|e| invalid(key, format!("{url:?} is not a URL: {e}")))?;
    match parsed.scheme_str() {
        Some("http" | "https") if parsed.host().is_some() => Ok(url.to_owned()),
        _ => Err(invalid(
            key,
            format!("{url:?} must be an http:// or https:// URL with a host"),
        )),
    }
}

/// The URL spans are sent to: for OTLP/HTTP, `/v1/traces` under a base URL that has no path
/// of its own (as the specification says of `OTEL_EXPORTER_OTLP_ENDPOINT`).
fn signal_url(url: &str, protocol: OtlpProtocol, key: &str) -> Result<String, ConfigError> {
    let url = checked_url(url, key)?;
    if protocol == OtlpProtocol::Grpc {
        return Ok(url);
    }
    let parsed: http::Uri = url.parse().map_err(|_| invalid(key, "not a URL"))?;
    if matches!(parsed.path(), "" | "/") {
        Ok(format!("{}/v1/traces", url.trim_end_matches('/')))
    } else {
        Ok(url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, env: &[(&str, &str)]) -> Result<TelemetrySettings, ConfigError> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        telemetry_settings(toml::from_str(text).unwrap(), &|name| {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn off_unless_an_endpoint_is_named() {
        let settings = parse("", &[]).unwrap();
        assert!(!settings.enabled());
        assert!(settings.propagate);
    }

    #[test]
    fn the_file_names_the_collector_and_http_gets_the_traces_path() {
        let settings = parse(r#"otlp_endpoint = "http://127.0.0.1:4318""#, &[]).unwrap();
        let export = settings.export.unwrap();
        assert_eq!(export.endpoint, "http://127.0.0.1:4318/v1/traces");
        assert_eq!(export.protocol, OtlpProtocol::HttpProtobuf);
        let grpc = parse(
            "otlp_endpoint = \"http://127.0.0.1:4317\"\nprotocol = \"grpc\"",
            &[],
        )
        .unwrap();
        assert_eq!(grpc.export.unwrap().endpoint, "http://127.0.0.1:4317");
        let explicit = parse(r#"otlp_endpoint = "http://c:4318/custom/path""#, &[]).unwrap();
        assert_eq!(
            explicit.export.unwrap().endpoint,
            "http://c:4318/custom/path"
        );
    }

    #[test]
    fn the_standard_variables_switch_it_on_and_the_file_wins() {
        let on = parse("", &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318/")]).unwrap();
        assert_eq!(on.export.unwrap().endpoint, "http://otel:4318/v1/traces");
        let signal = parse(
            "",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:9999/x"),
            ],
        )
        .unwrap();
        assert_eq!(signal.export.unwrap().endpoint, "http://traces:9999/x");
        let grpc = parse(
            "",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ],
        )
        .unwrap();
        assert_eq!(grpc.export.unwrap().protocol, OtlpProtocol::Grpc);
        let file = parse(
            r#"otlp_endpoint = "http://file:4318""#,
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318")],
        )
        .unwrap();
        assert_eq!(file.export.unwrap().endpoint, "http://file:4318/v1/traces");
        let disabled = parse(
            r#"otlp_endpoint = "http://file:4318""#,
            &[("OTEL_SDK_DISABLED", "true")],
        )
        .unwrap();
        assert!(!disabled.enabled());
    }

    #[test]
    fn the_sampler_variables_give_the_ratio_unless_the_file_does() {
        assert_eq!(parse("", &[]).unwrap().sample_ratio, 1.0);
        let env = [
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ];
        assert_eq!(parse("", &env).unwrap().sample_ratio, 0.25);
        assert_eq!(parse("sample_ratio = 0.5", &env).unwrap().sample_ratio, 0.5);
        let off = [("OTEL_TRACES_SAMPLER", "always_off")];
        assert_eq!(parse("", &off).unwrap().sample_ratio, 0.0);
        let bad = [("OTEL_TRACES_SAMPLER", "jaeger_remote")];
        assert!(
            parse("", &bad)
                .unwrap_err()
                .to_string()
                .contains("OTEL_TRACES_SAMPLER")
        );
        let bad_arg = [
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "2"),
        ];
        assert!(parse("", &bad_arg).is_err());
    }

    #[test]
    fn bad_values_are_refused_with_the_key() {
        for (text, key) in [
            (
                r#"otlp_endpoint = "collector:4318""#,
                "telemetry.otlp_endpoint",
            ),
            (r#"otlp_endpoint = "ftp://c/""#, "telemetry.otlp_endpoint"),
            (r#"protocol = "http/json""#, "telemetry.protocol"),
            ("sample_ratio = 1.5", "telemetry.sample_ratio"),
            ("export_timeout_ms = 0", "telemetry.export_timeout_ms"),
        ] {
            let error = parse(text, &[]).unwrap_err().to_string();
            assert!(error.contains(key), "{text}: {error}");
        }
        let error = parse("", &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")])
            .unwrap_err()
            .to_string();
        assert!(error.contains("OTEL_EXPORTER_OTLP_PROTOCOL"), "{error}");
    }
}
