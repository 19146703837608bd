//! The background work of a remote server's client: polling its load (the active health
//! check) and mirroring its prefix cache from its own event stream.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, Weak};
use std::time::Duration;

use http_body_util::BodyExt;
use ringmaster_gpu_runtime::TokenizerSpec;
use ringmaster_wire::models::ModelList;
use ringmaster_wire::worker::{Load, TokenizerDescription};
use tracing::{debug, info, warn};

use super::side::{SideClient, SideError};
use super::sse::SseDecoder;
use super::{
    KV_FOLLOW_CHECK, KV_RECONNECT_MAX, KV_UNSUPPORTED_RETRY, LOAD_POLL_INTERVAL, RemoteWorker,
};
use crate::kv_view::ReportedCache;

/// How long one load poll may take before the server counts as unreachable.
const LOAD_POLL_TIMEOUT: Duration = Duration::from_secs(2);

/// Largest tokenizer description read (a BPE vocabulary and its merges).
const TOKENIZER_LIMIT: usize = 64 * 1024 * 1024;

/// Longest KV event line accepted (a snapshot of a large cache is one line).
const KV_EVENT_LIMIT: usize = 256 * 1024 * 1024;

/// How one connection to a worker's event stream ended.
#[derive(Debug, thiserror::Error)]
enum FollowEnd {
    /// The worker has no such endpoint, or reports its cache in another block size.
    #[error("the worker does not report its KV cache: {0}")]
    Unsupported(String),
    /// The connection failed or closed, or the stream said something wrong.
    #[error("{0}")]
    Lost(String),
    /// The worker was removed from the pool.
    #[error("the worker was removed")]
    Removed,
}

/// Keeps `worker.kv` in step with the worker's cache while the worker is in the pool.
pub(super) async fn follow_kv(worker: Weak<RemoteWorker>) {
    let mut backoff = Duration::from_millis(250);
    loop {
        let Some((side, url, kv)) = worker
            .upgrade()
            .map(|w| (w.side.clone(), w.url.clone(), w.kv.clone()))
        else {
            return;
        };
        let end = follow_once(&side, &url, &kv, &worker).await;
        let was_synced = kv.is_synced();
        kv.mark_stale();
        let wait = match end {
            FollowEnd::Removed => return,
            FollowEnd::Unsupported(why) => {
                info!(worker = %url, %why, "remote.kv_unsupported");
                KV_UNSUPPORTED_RETRY
            }
            FollowEnd::Lost(why) => {
                if was_synced {
                    warn!(worker = %url, %why, "remote.kv_stale");
                    backoff = Duration::from_millis(250);
                } else {
                    debug!(worker = %url, %why, "remote.kv_unavailable");
                }
                let wait = backoff;
                backoff = (backoff * 2).min(KV_RECONNECT_MAX);
                wait
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// One connection: fetch the tokenizer, then apply events until the stream ends.
async fn follow_once(
    side: &SideClient,
    url: &str,
    kv: &Arc<ReportedCache>,
    worker: &Weak<RemoteWorker>,
) -> FollowEnd {
    let lost = |e: SideError| FollowEnd::Lost(e.to_string());
    let described = match side.get("/tokenizer", Some(Duration::from_secs(30))).await {
        Ok(r) if r.status == http::StatusCode::NOT_FOUND => {
            return FollowEnd::Unsupported("no /tokenizer".into());
        }
        Ok(r) => match r.success() {
            Ok(r) => r.bytes(TOKENIZER_LIMIT).await.map_err(lost),
            Err(e) => Err(lost(e)),
        },
        Err(e) => Err(lost(e)),
    };
    let described = match described {
        Ok(bytes) => bytes,
        Err(end) => return end,
    };
    let described: TokenizerDescription<TokenizerSpec> = match serde_json::from_slice(&described) {
        Ok(described) => described,
        Err(e) => return FollowEnd::Unsupported(format!("its tokenizer: {e}")),
    };
    if described.block_size != ringmaster_gpu_runtime::BLOCK_SIZE {
        return FollowEnd::Unsupported(format!(
            "block size {} (this gateway hashes {}-token blocks)",
            described.block_size,
            ringmaster_gpu_runtime::BLOCK_SIZE
        ));
    }
    let spec = described.tokenizer;
    let kv_for_build = kv.clone();
    // Building a BPE tokenizer takes a while: off the async threads.
    match tokio::task::spawn_blocking(move || kv_for_build.set_scheme(&spec)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return FollowEnd::Unsupported(format!("its tokenizer: {e}")),
        Err(e) => return FollowEnd::Lost(e.to_string()),
    }
    let response = match side.get("/kv/events", None).await {
        Ok(r) if r.status == http::StatusCode::NOT_FOUND => {
            return FollowEnd::Unsupported("no /kv/events".into());
        }
        Ok(r) => match r.success() {
            Ok(r) => r,
            Err(e) => return lost(e),
        },
        Err(e) => return lost(e),
    };
    let mut body = response.into_body();
    let mut events = SseDecoder::new(KV_EVENT_LIMIT);
    let mut check = tokio::time::interval(KV_FOLLOW_CHECK);
    loop {
        let chunk = tokio::select! {
            frame = body.frame() => frame,
            _ = check.tick() => {
                if worker.strong_count() == 0 {
                    return FollowEnd::Removed;
                }
                continue;
            }
        };
        let bytes = match chunk {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(bytes) => bytes,
                // Trailers: nothing to read.
                Err(_) => continue,
            },
            Some(Err(e)) => return FollowEnd::Lost(super::error_chain(&e)),
            None => return FollowEnd::Lost("the event stream ended".into()),
        };
        events.push(&bytes);
        while let Some(event) = events.next_event() {
            let data = match event.map(std::str::from_utf8) {
                Ok(Ok(data)) => data,
                Ok(Err(e)) => return FollowEnd::Lost(format!("an event is not UTF-8: {e}")),
                Err(e) => return FollowEnd::Lost(e.to_string()),
            };
            let first_sync = !kv.is_synced();
            if let Err(e) = kv.apply(data) {
                return FollowEnd::Lost(e.to_string());
            }
            if first_sync && kv.is_synced() {
                info!(worker = %url, blocks = kv.len(), "remote.kv_synced");
            }
        }
    }
}

pub(super) async fn poll_load(worker: Weak<RemoteWorker>) {
    let mut interval = tokio::time::interval(LOAD_POLL_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks = 0u64;
    // Whether `/load` is there (a `ringmaster worker`), and else whether `/metrics` holds an
    // engine's families; a server with neither is asked for `/metrics` again only now and then.
    let mut has_load_endpoint = true;
    let mut metrics_retry_at: Option<tokio::time::Instant> = None;
    loop {
        interval.tick().await;
        let Some(worker) = worker.upgrade() else {
            return;
        };
        worker.prune_idle();
        if worker.models_epoch.is_some()
            && ticks.is_multiple_of(MODELS_POLL_EVERY)
            && let Ok(Some(models)) = fetch_models(&worker).await
        {
            worker.set_models(models);
        }
        ticks += 1;
        let scrape_now = !has_load_endpoint
            && metrics_retry_at.is_none_or(|at| tokio::time::Instant::now() >= at);
        let fetched = if scrape_now {
            scrape_metrics(&worker).await
        } else {
            fetch_load(&worker).await
        };
        match fetched {
            Ok(Fetched::Load(load, source)) => {
                *worker.load.lock().unwrap_or_else(PoisonError::into_inner) = load;
                worker.set_load_source(source);
                metrics_retry_at = None;
            }
            Ok(Fetched::NoLoadEndpoint) => has_load_endpoint = false,
            Ok(Fetched::NoMetrics) => {
                // Any OpenAI server without either: it answered, so it is up; its load is what
                // the gateway counts in flight there.
                worker.set_load_source(LoadSource::InFlightOnly);
                metrics_retry_at = Some(tokio::time::Instant::now() + METRICS_ABSENT_RETRY);
            }
            Err(e) => {
                worker.polled(Err(e.to_string()));
                if worker.reachable.swap(false, Ordering::Relaxed) {
                    warn!(worker = %worker.url, error = %e, "remote.unreachable");
                }
                continue;
            }
        }
        worker.polled(Ok(()));
        if !worker.reachable.swap(true, Ordering::Relaxed) {
            info!(worker = %worker.url, "remote.reachable");
        }
    }
}

/// How often a server without `/load` or known `/metrics` is scraped again.
const METRICS_ABSENT_RETRY: Duration = Duration::from_secs(60);

/// Where a remote server's load figures come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadSource {
    /// Not polled yet.
    Unknown,
    /// A `ringmaster worker`'s `/load`.
    Worker,
    /// An engine's Prometheus `/metrics`.
    Metrics(super::engine_metrics::EngineKind),
    /// Neither: only the requests the gateway has in flight there.
    InFlightOnly,
}

/// One poll's answer.
enum Fetched {
    Load(Load, LoadSource),
    NoLoadEndpoint,
    NoMetrics,
}

/// Largest `/load` answer read.
const LOAD_LIMIT: usize = 64 * 1024;

async fn fetch_load(worker: &RemoteWorker) -> Result<Fetched, SideError> {
    let response = worker.side.get("/load", Some(LOAD_POLL_TIMEOUT)).await?;
    if response.status == http::StatusCode::NOT_FOUND {
        return Ok(Fetched::NoLoadEndpoint);
    }
    let body = response.success()?.bytes(LOAD_LIMIT).await?;
    let load = serde_json::from_slice::<Load>(&body)
        .map_err(|e| SideError::Failed(format!("its /load: {e}")))?;
    Ok(Fetched::Load(load, LoadSource::Worker))
}

/// Most bytes of a `/metrics` answer read (vLLM's is tens of kilobytes).
const METRICS_LIMIT: usize = 4 * 1024 * 1024;

async fn scrape_metrics(worker: &RemoteWorker) -> Result<Fetched, SideError> {
    let response = worker.side.get("/metrics", Some(LOAD_POLL_TIMEOUT)).await?;
    if !response.status.is_success() {
        // The server answered: up, but with nothing to read.
        return Ok(Fetched::NoMetrics);
    }
    let body = match response.bytes(METRICS_LIMIT).await {
        Err(SideError::TooLarge(_)) => return Ok(Fetched::NoMetrics),
        read => read?,
    };
    let Ok(text) = std::str::from_utf8(&body) else {
        return Ok(Fetched::NoMetrics);
    };
    Ok(match super::engine_metrics::read_metrics(text) {
        Some((kind, load)) => Fetched::Load(load, LoadSource::Metrics(kind)),
        None => Fetched::NoMetrics,
    })
}

/// Load polls between two reads of `/v1/models` (every 5 s).
const MODELS_POLL_EVERY: u64 = 20;

/// The model ids a server lists at `/v1/models`, each with its `parent` (a LoRA adapter's
/// base model); `None` when it has no such endpoint.
async fn fetch_models(
    worker: &RemoteWorker,
) -> Result<Option<Vec<(String, Option<String>)>>, SideError> {
    let response = worker
        .side
        .get("/v1/models", Some(LOAD_POLL_TIMEOUT))
        .await?;
    if !response.status.is_success() {
        return Ok(None);
    }
    // A hosted provider lists hundreds of models: a few megabytes at most.
    let body = response.bytes(8 * 1024 * 1024).await?;
    let Ok(listed) = serde_json::from_slice::<ModelList<'_>>(&body) else {
        return Ok(None);
    };
    Ok(Some(
        listed
            .data
            .into_iter()
            .map(|m| (m.id.into_owned(), m.parent.map(|p| p.into_owned())))
            .collect(),
    ))
}
