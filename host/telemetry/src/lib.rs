//! What Ringmaster writes down about its traffic: the traffic recording ([`record`], a trace
//! `ringmaster bench replay` reads), the last errors answered ([`recent`], for the status
//! page), and request traces: the OpenTelemetry pipeline `[telemetry]` switches on (an OTLP
//! exporter over HTTP or gRPC, the sampler, the resource), the W3C trace context read from a
//! client's headers and written into a server's, and the attribute names the spans carry
//! ([`semconv`]: the GenAI semantic conventions and `ringmaster.*`).
//!
//! It owns no span: the gateway opens them with `tracing` and adds attributes through
//! [`SpanExt`]; this crate only turns them into OpenTelemetry spans when an exporter is on.
//! With tracing off nothing here runs on the request path but [`enabled`] (one relaxed load)
//! and the pass-through of a client's `traceparent`. It must not know the request path, the
//! pool or HTTP beyond header maps.

pub mod recent;
pub mod record;
pub mod semconv;

use std::sync::atomic::{AtomicBool, Ordering};

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};
use ringmaster_config::{OtlpProtocol, TelemetrySettings};
use tracing::Span;
use tracing_opentelemetry::{OpenTelemetryLayer, OpenTelemetrySpanExt};

pub use opentelemetry::trace::Status;
pub use opentelemetry::{Array, KeyValue, Value};

/// The `tracing` layer that turns spans into exported OpenTelemetry spans.
pub type SpanLayer<S> = OpenTelemetryLayer<S, SdkTracer>;

/// Whether an exporter is installed (set once by [`layer`]).
static ENABLED: AtomicBool = AtomicBool::new(false);
/// The share of new traces kept, as a threshold on 32 random bits (`u32::MAX` + 1: all).
static KEEP_BELOW: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1 << 32);

/// `traceparent`, the W3C trace context's header.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// `tracestate`, the vendors' part of the W3C trace context.
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Why traces could not be switched on.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The OTLP exporter refused its settings.
    #[error("the OTLP exporter for {endpoint} ({protocol}) could not be built: {source}")]
    Exporter {
        /// Where it was to send spans.
        endpoint: String,
        /// How.
        protocol: &'static str,
        /// Why not.
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

/// The installed pipeline. Dropping it flushes the spans still buffered and stops the
/// exporter (a gateway that stops sends what it has).
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
        ENABLED.store(false, Ordering::Relaxed);
    }
}

/// The `tracing` layer that exports spans as `settings` say, with the pipeline behind it, or
/// `None` when traces are off. gRPC needs a Tokio runtime entered while this runs (its
/// channel's task lives there).
pub fn layer<S>(
    settings: &TelemetrySettings,
) -> Result<Option<(SpanLayer<S>, Telemetry)>, TelemetryError>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    let Some(export) = &settings.export else {
        return Ok(None);
    };
    let built = match export.protocol {
        OtlpProtocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(&export.endpoint)
            .with_timeout(export.timeout)
            .build(),
        OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(&export.endpoint)
            .with_timeout(export.timeout)
            .build(),
    };
    let exporter = built.map_err(|source| TelemetryError::Exporter {
        endpoint: export.endpoint.clone(),
        protocol: export.protocol.as_str(),
        source,
    })?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    resource = match &settings.service_name {
        Some(name) => resource.with_service_name(name.clone()),
        // The SDK's own default is `unknown_service`; `OTEL_SERVICE_NAME` still wins.
        None if std::env::var_os("OTEL_SERVICE_NAME").is_none() => {
            resource.with_service_name("ringmaster")
        }
        None => resource,
    };
    let resource = resource
        .with_attribute(KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION").to_owned(),
        ))
        .build();
    // The gateway samples at the head ([`head_sampled`]) and opens an exported span only for a
    // kept trace, so an unsampled request costs what it costs with traces off; the SDK keeps
    // every span it is given (a client's unsampled parent is never given to it).
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
        .build();
    KEEP_BELOW.store(
        (settings.sample_ratio.clamp(0.0, 1.0) * 4_294_967_296.0) as u64,
        Ordering::Relaxed,
    );
    let tracer = provider.tracer("ringmaster");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        // Spans carry what is set on them, not the source file and thread of each.
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_level(false)
        .with_tracked_inactivity(false);
    ENABLED.store(true, Ordering::Relaxed);
    Ok(Some((layer, Telemetry { provider })))
}

/// Whether spans are exported at all: the request path builds its child spans and
/// attributes only then.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Whether the request whose headers and id these are is traced: a client's `traceparent`
/// decides by its sampled flag; a new trace is kept at the configured ratio, drawn from the
/// request id's random hex (a `req_` and a v4 UUID's digits). Only meaningful when
/// [`enabled`].
pub fn head_sampled(headers: &HeaderMap, request_id: &str) -> bool {
    if let Some(parent) = headers.get(TRACEPARENT).and_then(|v| v.to_str().ok()) {
        // version-traceid-spanid-flags; a malformed one starts a new trace.
        let parts: Vec<&str> = parent.trim().split('-').collect();
        if parts.len() == 4
            && parts[1].len() == 32
            && parts[2].len() == 16
            && let Ok(flags) = u8::from_str_radix(parts[3], 16)
        {
            return flags & 1 == 1;
        }
    }
    let draw = request_id
        .get(4..12)
        .and_then(|hex| u32::from_str_radix(hex, 16).ok())
        .unwrap_or(0);
    u64::from(draw) < KEEP_BELOW.load(Ordering::Relaxed)
}

/// Makes `span` (just opened, before anything reads its context) a child of the trace a
/// client's `traceparent` names; a missing or malformed header leaves it a new trace's root.
pub fn continue_trace(span: &Span, headers: &HeaderMap) {
    if !headers.contains_key(TRACEPARENT) {
        return;
    }
    let parent =
        TraceContextPropagator::new().extract(&opentelemetry_http::HeaderExtractor(headers));
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}

/// A server span's answer, in OpenTelemetry's HTTP terms: the method, the route's label, the
/// status and, for an error, its type (a 5xx marks the span failed).
pub fn describe_response(
    span: &Span,
    method: &str,
    route: &'static str,
    status: u16,
    error: Option<&str>,
) {
    span.attribute(semconv::HTTP_REQUEST_METHOD, method.to_owned());
    span.attribute(semconv::HTTP_ROUTE, route);
    span.attribute(semconv::HTTP_RESPONSE_STATUS_CODE, i64::from(status));
    if let Some(error) = error {
        span.attribute(semconv::ERROR_TYPE, error.to_owned());
        if status >= 500 {
            span.failed(error.to_owned());
        }
    }
}

/// Whether `span` is recorded and exported (exporter on, and its trace sampled).
pub fn is_sampled(span: &Span) -> bool {
    enabled() && span.context().span().span_context().is_sampled()
}

/// The trace context headers that make `span` the parent of a server's work.
pub fn context_headers(span: &Span) -> Vec<(HeaderName, HeaderValue)> {
    let mut headers = HeaderMap::new();
    TraceContextPropagator::new().inject_context(
        &span.context(),
        &mut opentelemetry_http::HeaderInjector(&mut headers),
    );
    trace_headers(&headers)
}

/// A client's own `traceparent` and `tracestate`, passed on as they came when the gateway
/// exports no spans of its own (the server's work then joins the client's trace directly).
pub fn trace_headers(headers: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    [TRACEPARENT, TRACESTATE]
        .into_iter()
        .filter_map(|name| headers.get(&name).cloned().map(|value| (name, value)))
        .collect()
}

/// Attributes and events on a span, through to OpenTelemetry (no-ops without the layer).
pub trait SpanExt {
    /// One attribute.
    fn attribute(&self, key: &'static str, value: impl Into<opentelemetry::Value>);
    /// A point in the span's time with attributes (`gen_ai.first_token`).
    fn event(&self, name: &'static str, attributes: Vec<KeyValue>);
    /// Marks the span failed with `why`.
    fn failed(&self, why: impl Into<String>);
    /// Names the span anew (a request's name needs its model, known after its body is read,
    /// and the span has started by then).
    fn rename(&self, name: String);
}

impl SpanExt for Span {
    fn attribute(&self, key: &'static str, value: impl Into<opentelemetry::Value>) {
        self.set_attribute(key, value);
    }

    fn event(&self, name: &'static str, attributes: Vec<KeyValue>) {
        self.add_event(name, attributes);
    }

    fn failed(&self, why: impl Into<String>) {
        self.set_status(Status::error(why.into()));
    }

    fn rename(&self, name: String) {
        self.context().span().update_name(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_trace_context_passes_through_as_it_came() {
        let mut headers = HeaderMap::new();
        let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        headers.insert(TRACEPARENT, HeaderValue::from_static(parent));
        headers.insert(TRACESTATE, HeaderValue::from_static("vendor=x"));
        let passed = trace_headers(&headers);
        assert_eq!(passed.len(), 2);
        assert_eq!(passed[0].1, parent);
        assert!(trace_headers(&HeaderMap::new()).is_empty());
    }

    #[test]
    fn a_client_decides_for_its_trace_and_new_ones_are_drawn_from_the_request_id() {
        let mut sampled = HeaderMap::new();
        sampled.insert(
            TRACEPARENT,
            HeaderValue::from_static("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        );
        let mut unsampled = HeaderMap::new();
        unsampled.insert(
            TRACEPARENT,
            HeaderValue::from_static("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"),
        );
        KEEP_BELOW.store(0, Ordering::Relaxed);
        assert!(head_sampled(&sampled, "req_00000000"));
        assert!(!head_sampled(&HeaderMap::new(), "req_00000000"));
        KEEP_BELOW.store(1 << 32, Ordering::Relaxed);
        assert!(!head_sampled(&unsampled, "req_ffffffff"));
        assert!(head_sampled(&HeaderMap::new(), "req_ffffffff"));
        // A quarter: ids spread evenly are kept about a quarter of the time.
        KEEP_BELOW.store(1 << 30, Ordering::Relaxed);
        let kept = (0..4096u32)
            .filter(|i| {
                head_sampled(
                    &HeaderMap::new(),
                    &format!("req_{:08x}", i.wrapping_mul(1_048_573)),
                )
            })
            .count();
        assert!((900..1150).contains(&kept), "{kept}");
        KEEP_BELOW.store(1 << 32, Ordering::Relaxed);
    }

    #[test]
    fn off_without_an_endpoint() {
        let layer = layer::<tracing_subscriber::Registry>(&TelemetrySettings::default()).unwrap();
        assert!(layer.is_none());
        assert!(!enabled());
        // Without the layer a span has no context to send on.
        assert!(context_headers(&Span::none()).is_empty());
    }
}
