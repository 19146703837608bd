//! The side calls to a server: the load poll, `/v1/models`, `/metrics`, a `ringmaster
//! worker`'s tokenizer and KV event stream, LoRA adapter loads. hyper's pooled client over the
//! same TLS and with the same credentials as the requests, each call with a deadline of its
//! own that covers the headers and the body.
//!
//! This module must not judge what the answers mean (the follower and the adapter calls do).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use tokio::time::Instant;

/// The connector every client of a server uses: plain TCP for `http://`, rustls for
/// `https://`.
pub(super) type Connector =
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

/// A connector with `tls` (the server's client configuration: for a plain server one that is
/// never used) that opens connections within `connect_timeout`; `h2` for HTTP/2 with prior
/// knowledge.
pub(super) fn connector(
    mut tls: rustls::ClientConfig,
    connect_timeout: Duration,
    h2: bool,
) -> Connector {
    // hyper-rustls offers the protocols it was enabled for itself.
    tls.alpn_protocols.clear();
    let mut tcp = hyper_util::client::legacy::connect::HttpConnector::new();
    tcp.set_connect_timeout(Some(connect_timeout));
    tcp.set_nodelay(true);
    tcp.enforce_http(false);
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if h2 {
        builder.enable_http2().wrap_connector(tcp)
    } else {
        builder.enable_http1().wrap_connector(tcp)
    }
}

/// Why a side call failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum SideError {
    /// No answer (or not all of it) within the call's deadline.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The connection or the exchange failed.
    #[error("{0}")]
    Failed(String),
    /// The server answered with an error status.
    #[error("HTTP {0}")]
    Status(http::StatusCode),
    /// The answer is larger than the call takes.
    #[error("the answer is larger than {0} bytes")]
    TooLarge(usize),
}

impl SideError {
    /// Whether the deadline passed.
    pub(super) fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout(_))
    }
}

/// A server's answer to a side call: its status, and its body to read before the deadline.
pub(super) struct SideAnswer {
    pub(super) status: http::StatusCode,
    body: Incoming,
    deadline: Option<(Instant, Duration)>,
}

impl SideAnswer {
    /// The body, at most `limit` bytes, read before the call's deadline.
    pub(super) async fn bytes(self, limit: usize) -> Result<Bytes, SideError> {
        let read = Limited::new(self.body, limit).collect();
        let collected = match self.deadline {
            Some((at, timeout)) => tokio::time::timeout_at(at, read)
                .await
                .map_err(|_| SideError::Timeout(timeout))?,
            None => read.await,
        };
        collected.map(|c| c.to_bytes()).map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                SideError::TooLarge(limit)
            } else {
                SideError::Failed(super::error_chain(&*e))
            }
        })
    }

    /// `Err` for a status other than 2xx.
    pub(super) fn success(self) -> Result<Self, SideError> {
        if self.status.is_success() {
            Ok(self)
        } else {
            Err(SideError::Status(self.status))
        }
    }

    /// The body as it arrives (a stream without an end, like `/kv/events`).
    pub(super) fn into_body(self) -> Incoming {
        self.body
    }
}

/// The side calls' client of one server.
#[derive(Debug, Clone)]
pub(super) struct SideClient {
    client: hyper_util::client::legacy::Client<Connector, Full<Bytes>>,
    /// `http(s)://HOST:PORT`.
    base: String,
    /// The server's credentials, sensitive.
    credentials: Vec<(http::HeaderName, http::HeaderValue)>,
}

impl SideClient {
    /// A client of the server at `base` through `connector`.
    pub(super) fn new(
        connector: Connector,
        base: &str,
        credentials: Vec<(http::HeaderName, http::HeaderValue)>,
        settings: &super::UpstreamSettings,
    ) -> Self {
        let mut builder =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new());
        builder
            .pool_idle_timeout(settings.pool_idle_timeout)
            .pool_max_idle_per_host(settings.pool_max_idle.min(4));
        if settings.http2_prior_knowledge {
            builder.http2_only(true);
        }
        Self {
            client: builder.build(connector),
            base: base.to_owned(),
            credentials,
        }
    }

    /// `GET path`, its headers within `timeout` (and its body too, read by
    /// [`SideAnswer::bytes`]); no deadline for a stream.
    pub(super) async fn get(
        &self,
        path: &str,
        timeout: Option<Duration>,
    ) -> Result<SideAnswer, SideError> {
        self.call(http::Method::GET, path, None, timeout).await
    }

    /// `POST path` with a JSON body.
    pub(super) async fn post_json(
        &self,
        path: &str,
        body: &serde_json::Value,
        timeout: Duration,
    ) -> Result<SideAnswer, SideError> {
        let body = serde_json::to_vec(body).map_err(|e| SideError::Failed(e.to_string()))?;
        self.call(http::Method::POST, path, Some(body.into()), Some(timeout))
            .await
    }

    async fn call(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Bytes>,
        timeout: Option<Duration>,
    ) -> Result<SideAnswer, SideError> {
        let mut request = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if body.is_some() {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
        }
        for (name, value) in &self.credentials {
            request = request.header(name, value);
        }
        let request = request
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| SideError::Failed(e.to_string()))?;
        let deadline = timeout.map(|t| (Instant::now() + t, t));
        let sent = self.client.request(request);
        let response = match deadline {
            Some((at, timeout)) => tokio::time::timeout_at(at, sent)
                .await
                .map_err(|_| SideError::Timeout(timeout))?,
            None => sent.await,
        }
        .map_err(|e| SideError::Failed(super::error_chain(&e)))?;
        Ok(SideAnswer {
            status: response.status(),
            body: response.into_body(),
            deadline,
        })
    }
}
