//! An OpenTelemetry collector's receiving end on loopback, for the tests of the gateway's
//! traces: OTLP/HTTP (`POST /v1/traces`, protobuf) and OTLP/gRPC (the `TraceService/Export`
//! call over HTTP/2), both decoded with `opentelemetry-proto`'s generated types into
//! [`ReceivedSpan`]s a test can look through.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;
use serde_json::Value;
use tokio::net::TcpListener;

/// One span as received.
#[derive(Clone, Debug)]
pub struct ReceivedSpan {
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// 16 hex digits, empty for a root.
    pub parent_span_id: String,
    /// The span's name.
    pub name: String,
    /// OTLP's kind: 1 internal, 2 server, 3 client.
    pub kind: i32,
    /// Attributes as JSON values (strings, numbers, booleans, arrays).
    pub attributes: BTreeMap<String, Value>,
    /// The names of its events.
    pub events: Vec<String>,
    /// OTLP's status code: 0 unset, 1 ok, 2 error.
    pub status: i32,
    /// Start and end, Unix nanoseconds.
    pub start_ns: u64,
    /// End.
    pub end_ns: u64,
    /// The resource's `service.name`.
    pub service: String,
    /// How it came: `http` or `grpc`.
    pub transport: &'static str,
}

impl ReceivedSpan {
    /// The attribute `key` as a string, if it is one.
    pub fn str(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).and_then(Value::as_str)
    }

    /// The attribute `key` as an integer, if it is one.
    pub fn int(&self, key: &str) -> Option<i64> {
        self.attributes.get(key).and_then(Value::as_i64)
    }
}

/// A running receiver; it stops when dropped.
#[derive(Debug)]
pub struct OtlpReceiver {
    /// Where it listens (both protocols on one port).
    pub addr: SocketAddr,
    spans: Arc<Received>,
    task: tokio::task::JoinHandle<()>,
}

/// What came: the spans (when kept) and how many.
#[derive(Debug, Default)]
struct Received {
    keep: bool,
    count: std::sync::atomic::AtomicUsize,
    spans: Mutex<Vec<ReceivedSpan>>,
}

type Body = BoxBody<Bytes, Infallible>;

impl OtlpReceiver {
    /// Starts on 127.0.0.1, port 0, keeping every span.
    pub async fn start() -> Self {
        Self::start_with(true).await
    }

    /// Starts on 127.0.0.1, port 0, only counting the spans (a benchmark's long run).
    pub async fn counting() -> Self {
        Self::start_with(false).await
    }

    async fn start_with(keep: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans = Arc::new(Received {
            keep,
            ..Received::default()
        });
        let kept = spans.clone();
        let task = tokio::spawn(async move {
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            while let Ok((stream, _)) = listener.accept().await {
                let kept = kept.clone();
                let builder = builder.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let kept = kept.clone();
                        async move { Ok::<_, Infallible>(receive(req, &kept).await) }
                    });
                    let _ = builder
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, spans, task }
    }

    /// The base URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far (none when only counting).
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans
            .spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many spans came.
    pub fn received(&self) -> usize {
        self.spans.count.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The spans of `trace_id`, once at least `count` of them are in (or whatever came
    /// within `within`).
    pub async fn trace(&self, trace_id: &str, count: usize, within: Duration) -> Vec<ReceivedSpan> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let spans: Vec<ReceivedSpan> = self
                .spans()
                .into_iter()
                .filter(|s| s.trace_id == trace_id)
                .collect();
            if spans.len() >= count || tokio::time::Instant::now() >= deadline {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn receive(req: Request<Incoming>, kept: &Received) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let Ok(body) = req.into_body().collect().await.map(|b| b.to_bytes()) else {
        return plain(StatusCode::BAD_REQUEST, "unreadable body");
    };
    match path.as_str() {
        "/v1/traces" => match ExportTraceServiceRequest::decode(body) {
            Ok(export) => {
                keep(kept, export, "http");
                let mut response = Response::new(Full::new(Bytes::new()).boxed());
                response.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/x-protobuf"),
                );
                response
            }
            Err(e) => plain(StatusCode::BAD_REQUEST, &format!("not OTLP: {e}")),
        },
        "/opentelemetry.proto.collector.trace.v1.TraceService/Export" => {
            // gRPC: one length-prefixed message (flag byte, four bytes of length).
            let message = (body.len() >= 5 && body[0] == 0)
                .then(|| body.slice(5..))
                .and_then(|m| ExportTraceServiceRequest::decode(m).ok());
            let status = match message {
                Some(export) => {
                    keep(kept, export, "grpc");
                    "0"
                }
                None => "3",
            };
            grpc_answer(status)
        }
        _ => plain(StatusCode::NOT_FOUND, "no such path"),
    }
}

fn keep(kept: &Received, export: ExportTraceServiceRequest, transport: &'static str) {
    let count: usize = export
        .resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .map(|s| s.spans.len())
        .sum();
    kept.count
        .fetch_add(count, std::sync::atomic::Ordering::Relaxed);
    if !kept.keep {
        return;
    }
    let mut spans = kept.spans.lock().unwrap_or_else(PoisonError::into_inner);
    for resource in export.resource_spans {
        let service = resource
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
            .and_then(|a| a.value.as_ref()?.value.as_ref())
            .map(json)
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                spans.push(ReceivedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name,
                    kind: span.kind,
                    attributes: span
                        .attributes
                        .iter()
                        .filter_map(|a| {
                            Some((a.key.clone(), json(a.value.as_ref()?.value.as_ref()?)))
                        })
                        .collect(),
                    events: span.events.into_iter().map(|e| e.name).collect(),
                    status: span.status.map_or(0, |s| s.code),
                    start_ns: span.start_time_unix_nano,
                    end_ns: span.end_time_unix_nano,
                    service: service.clone(),
                    transport,
                });
            }
        }
    }
}

fn json(value: &AnyValue) -> Value {
    match value {
        AnyValue::StringValue(s) => Value::from(s.as_str()),
        AnyValue::BoolValue(b) => Value::from(*b),
        AnyValue::IntValue(i) => Value::from(*i),
        AnyValue::DoubleValue(d) => Value::from(*d),
        AnyValue::ArrayValue(array) => Value::Array(
            array
                .values
                .iter()
                .filter_map(|v| v.value.as_ref().map(json))
                .collect(),
        ),
        other => Value::from(format!("{other:?}")),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn plain(status: StatusCode, text: &str) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(text.to_owned())).boxed());
    *response.status_mut() = status;
    response
}

/// A gRPC answer: an empty `ExportTraceServiceResponse`, then `grpc-status` in the trailers.
fn grpc_answer(status: &'static str) -> Response<Body> {
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static(status));
    let frames = futures_util::stream::iter([
        Ok::<_, Infallible>(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 0]))),
        Ok(Frame::trailers(trailers)),
    ]);
    let mut response = Response::new(StreamBody::new(frames).boxed());
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

/// One trace drawn as a waterfall (SVG): a row per span in tree order, its bar from start to
/// end in milliseconds from the trace's start, labelled with its name and the attributes an
/// operator looks at first.
pub fn waterfall(spans: &[ReceivedSpan], path: &std::path::Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let plot_error = |e: &dyn std::fmt::Display| anyhow::anyhow!("plotting: {e}");
    // Tree order: each span after its parent, siblings by start.
    let mut ordered: Vec<(usize, &ReceivedSpan)> = Vec::new();
    fn walk<'a>(
        spans: &'a [ReceivedSpan],
        parent: &str,
        depth: usize,
        out: &mut Vec<(usize, &'a ReceivedSpan)>,
    ) {
        let mut children: Vec<&ReceivedSpan> = spans
            .iter()
            .filter(|s| s.parent_span_id == parent)
            .collect();
        children.sort_by_key(|s| s.start_ns);
        for child in children {
            out.push((depth, child));
            walk(spans, &child.span_id, depth + 1, out);
        }
    }
    let ids: std::collections::HashSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    let mut roots: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| !ids.contains(s.parent_span_id.as_str()))
        .collect();
    roots.sort_by_key(|s| s.start_ns);
    for root in roots {
        ordered.push((0, root));
        walk(spans, &root.span_id, 1, &mut ordered);
    }
    let start = spans.iter().map(|s| s.start_ns).min().unwrap_or(0);
    let end = spans.iter().map(|s| s.end_ns).max().unwrap_or(start + 1);
    let ms = |ns: u64| (ns.saturating_sub(start)) as f64 / 1e6;
    let width_ms = ms(end).max(0.001) * 1.02;
    let rows = ordered.len().max(1);
    let height = 90 + 34 * rows as u32;
    let root = SVGBackend::new(path, (1100, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "One request's trace, as the OTLP receiver got it",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(10)
        .build_cartesian_2d(0.0..width_ms, 0.0..rows as f64)
        .map_err(|e| plot_error(&e))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("milliseconds from the request's arrival")
        .draw()
        .map_err(|e| plot_error(&e))?;
    let colours = [
        RGBColor(36, 87, 197),
        RGBColor(208, 100, 27),
        RGBColor(31, 122, 58),
        RGBColor(142, 68, 173),
    ];
    for (row, (depth, span)) in ordered.iter().enumerate() {
        let top = (rows - row) as f64 - 0.15;
        let bottom = (rows - row - 1) as f64 + 0.15;
        let (from, to) = (
            ms(span.start_ns),
            ms(span.end_ns).max(ms(span.start_ns) + width_ms / 400.0),
        );
        let colour = colours[depth % colours.len()];
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(from, bottom), (to, top)],
                colour.mix(0.55).filled(),
            )))
            .map_err(|e| plot_error(&e))?;
        let detail = match span.name.as_str() {
            "route" => format!(
                "variant {} · {} → {} · {} µs",
                span.str("ringmaster.policy.variant").unwrap_or("?"),
                span.str("ringmaster.routing.reason").unwrap_or("?"),
                span.str("ringmaster.routing.server").unwrap_or("?"),
                span.int("ringmaster.policy.duration_us").unwrap_or(0)
            ),
            "upstream" => format!(
                "attempt {} · {} · {}",
                span.int("ringmaster.attempt").unwrap_or(0),
                span.str("server.address").unwrap_or("?"),
                span.str("ringmaster.attempt.outcome").unwrap_or("?")
            ),
            "admission" => format!(
                "queued {}",
                span.attributes
                    .get("ringmaster.admission.queued")
                    .cloned()
                    .unwrap_or_default()
            ),
            _ if span.kind == 2 => format!(
                "{} · in {} out {} tokens · TTFT {:.1} ms · {}",
                span.str("ringmaster.request_id").unwrap_or(""),
                span.int("gen_ai.usage.input_tokens").unwrap_or(0),
                span.int("gen_ai.usage.output_tokens").unwrap_or(0),
                span.attributes
                    .get("gen_ai.server.time_to_first_token")
                    .and_then(Value::as_f64)
                    .unwrap_or(0.0)
                    * 1e3,
                span.int("http.response.status_code")
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            ),
            _ => String::new(),
        };
        let label = format!(
            "{}{}  {:.2} ms  {}",
            "   ".repeat(*depth),
            span.name,
            ms(span.end_ns) - ms(span.start_ns),
            detail
        );
        chart
            .draw_series(std::iter::once(Text::new(
                label,
                (width_ms * 0.005, bottom + 0.12),
                ("sans-serif", 14).into_font().color(&BLACK),
            )))
            .map_err(|e| plot_error(&e))?;
    }
    root.present().map_err(|e| plot_error(&e))?;
    Ok(())
}
