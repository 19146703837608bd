//! The background work of a remote server's client: polling its load (the active health
//! check) and mirroring its prefix cache from its own event stream.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use ringmaster_gpu_runtime::{LoadReport, TokenizerSpec};
use serde_json::Value;
use tracing::{debug, info, warn};

use super::sse::SseDecoder;
use super::{
    KV_FOLLOW_CHECK, KV_RECONNECT_MAX, KV_UNSUPPORTED_RETRY, LOAD_POLL_INTERVAL, RemoteWorker,
};
use crate::kv_view::ReportedCache;

/// How long one load poll may take before the server counts as unreachable.
const LOAD_POLL_TIMEOUT: Duration = Duration::from_secs(2);

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
        let Some((client, url, kv)) = worker
            .upgrade()
            .map(|w| (w.client.clone(), w.url.clone(), w.kv.clone()))
        else {
            return;
        };
        let end = follow_once(&client, &url, &kv, &worker).await;
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
    client: &reqwest::Client,
    url: &str,
    kv: &Arc<ReportedCache>,
    worker: &Weak<RemoteWorker>,
) -> FollowEnd {
    let lost = |e: reqwest::Error| FollowEnd::Lost(e.to_string());
    let described = match client
        .get(format!("{url}/tokenizer"))
        .timeout(Duration::from_secs(30))
        .send()
        .await
    {
        Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => {
            return FollowEnd::Unsupported("no /tokenizer".into());
        }
        Ok(r) => match r.error_for_status() {
            Ok(r) => r.json::<Value>().await.map_err(lost),
            Err(e) => Err(lost(e)),
        },
        Err(e) => Err(lost(e)),
    };
    let described = match described {
        Ok(v) => v,
        Err(end) => return end,
    };
    if described["block_size"].as_u64() != Some(ringmaster_gpu_runtime::BLOCK_SIZE as u64) {
        return FollowEnd::Unsupported(format!(
            "block size {} (this gateway hashes {}-token blocks)",
            described["block_size"],
            ringmaster_gpu_runtime::BLOCK_SIZE
        ));
    }
    let spec: TokenizerSpec = match serde_json::from_value(described["tokenizer"].clone()) {
        Ok(spec) => spec,
        Err(e) => return FollowEnd::Unsupported(format!("its tokenizer: {e}")),
    };
    let kv_for_build = kv.clone();
    // Building a BPE tokenizer takes a while: off the async threads.
    match tokio::task::spawn_blocking(move || kv_for_build.set_scheme(&spec)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return FollowEnd::Unsupported(format!("its tokenizer: {e}")),
        Err(e) => return FollowEnd::Lost(e.to_string()),
    }
    let response = match client.get(format!("{url}/kv/events")).send().await {
        Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => {
            return FollowEnd::Unsupported("no /kv/events".into());
        }
        Ok(r) => match r.error_for_status() {
            Ok(r) => r,
            Err(e) => return lost(e),
        },
        Err(e) => return lost(e),
    };
    let mut body = response.bytes_stream();
    let mut events = SseDecoder::new(KV_EVENT_LIMIT);
    let mut check = tokio::time::interval(KV_FOLLOW_CHECK);
    loop {
        let chunk = tokio::select! {
            chunk = body.next() => chunk,
            _ = check.tick() => {
                if worker.strong_count() == 0 {
                    return FollowEnd::Removed;
                }
                continue;
            }
        };
        let bytes = match chunk {
            Some(Ok(bytes)) => bytes,
            Some(Err(e)) => return lost(e),
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
    loop {
        interval.tick().await;
        let Some(worker) = worker.upgrade() else {
            return;
        };
        if worker.models_epoch.is_some()
            && ticks.is_multiple_of(MODELS_POLL_EVERY)
            && let Ok(Some(models)) = fetch_models(&worker).await
        {
            worker.set_models(models);
        }
        ticks += 1;
        let fetched = async {
            let response = worker
                .client
                .get(format!("{}/load", worker.url))
                .timeout(LOAD_POLL_TIMEOUT)
                .send()
                .await?;
            if response.status() == reqwest::StatusCode::NOT_FOUND {
                // Any OpenAI server that is not a `ringmaster worker`: it answered, so it is
                // up; its load is what the gateway counts in flight there.
                return Ok(None);
            }
            response.error_for_status()?.json::<Value>().await.map(Some)
        }
        .await;
        match fetched {
            Ok(load) => {
                if let Some(load) = load {
                    *worker.load.lock().unwrap_or_else(PoisonError::into_inner) =
                        load_report(&load);
                }
                if !worker.reachable.swap(true, Ordering::Relaxed) {
                    info!(worker = %worker.url, "remote.reachable");
                }
            }
            Err(e) => {
                if worker.reachable.swap(false, Ordering::Relaxed) {
                    warn!(worker = %worker.url, error = %e, "remote.unreachable");
                }
            }
        }
    }
}

/// Load polls between two reads of `/v1/models` (every 5 s).
const MODELS_POLL_EVERY: u64 = 20;

/// The model ids a server lists at `/v1/models`; `None` when it has no such endpoint.
async fn fetch_models(worker: &RemoteWorker) -> reqwest::Result<Option<Vec<String>>> {
    #[derive(serde::Deserialize)]
    struct Listed {
        #[serde(default)]
        data: Vec<Model>,
    }
    #[derive(serde::Deserialize)]
    struct Model {
        id: String,
    }
    let response = worker
        .client
        .get(format!("{}/v1/models", worker.url))
        .timeout(LOAD_POLL_TIMEOUT)
        .send()
        .await?;
    if !response.status().is_success() {
        return Ok(None);
    }
    let listed: Listed = match response.json().await {
        Ok(listed) => listed,
        Err(_) => return Ok(None),
    };
    Ok(Some(listed.data.into_iter().map(|m| m.id).collect()))
}

/// A worker's `/load` JSON as a [`LoadReport`] (missing fields read as 0).
fn load_report(v: &Value) -> LoadReport {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let n32 = |k: &str| u32::try_from(n(k)).unwrap_or(u32::MAX);
    LoadReport {
        running: n32("running"),
        waiting: n32("waiting"),
        kv_blocks_total: n32("kv_blocks_total"),
        kv_blocks_used: n32("kv_blocks_used"),
        kv_blocks_cached: n32("kv_blocks_cached"),
        prompt_tokens_total: n("prompt_tokens_total"),
        cached_prompt_tokens_total: n("cached_prompt_tokens_total"),
        generated_tokens_total: n("generated_tokens_total"),
        requests_finished: n("requests_finished"),
        requests_cancelled: n("requests_cancelled"),
        preemptions: n("preemptions"),
        steps: n("steps"),
        last_batch_size: n32("last_batch_size"),
        step_sequences_total: n("step_sequences_total"),
        step_tokens_total: n("step_tokens_total"),
        step_budget_tokens_total: n("step_budget_tokens_total"),
        prefill_tokens_total: n("prefill_tokens_total"),
        decode_tokens_total: n("decode_tokens_total"),
        busy_seconds_total: v["busy_seconds_total"].as_f64().unwrap_or(0.0),
    }
}
