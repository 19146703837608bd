//! Remote workers as pool servers: a `ringmaster worker` reached over HTTP.
//!
//! A request goes to the worker's `/v1/chat/completions` (or `/v1/completions` for a raw
//! prompt), streamed, with two extensions vLLM also has: `stream_options.
//! continuous_usage_stats` (usage in every chunk, so the prompt and cached token counts arrive
//! with the first token) and `stop_reason` on the finishing chunk (which stop sequence matched);
//! plus `ringmaster_priority`. The chunks become the same [`GenerateEvent`]s a local engine
//! sends, so the rest of the gateway does not know the difference. Dropping the stream drops the
//! HTTP response, which closes the connection, which cancels the generation on the worker.
//!
//! The worker's load (`/load`) is polled every [`LOAD_POLL_INTERVAL`] for routing and metrics;
//! while it cannot be reached, its load reads as full (`waiting` at `u32::MAX`) so that routing
//! avoids it.
//!
//! The worker's prefix cache is mirrored from its own reports: its tokenizer (`/tokenizer`,
//! fetched on every (re)connection, rebuilt only when its fingerprint changes) and its event
//! stream (`/kv/events`: a snapshot, then each block stored and evicted) feed a
//! [`ReportedCache`]. While the stream is down or has lagged the mirror is marked stale and
//! routing falls back to the gateway's own estimate; the client reconnects with backoff
//! (250 ms doubling to [`KV_RECONNECT_MAX`]). A worker without these endpoints (any other
//! OpenAI server) is asked again only every [`KV_UNSUPPORTED_RETRY`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use ringmaster_gpu_runtime::{
    FinishReason, GenerateEvent, GenerateRequest, GenerationStream, LoadReport, TokenizerSpec,
};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::kv_view::ReportedCache;

/// Longest wait between attempts to reconnect to a worker's KV event stream.
pub const KV_RECONNECT_MAX: Duration = Duration::from_secs(5);

/// How often a worker without `/tokenizer` or `/kv/events` is asked again.
pub const KV_UNSUPPORTED_RETRY: Duration = Duration::from_secs(60);

/// How often a follower of a removed worker's event stream notices and stops.
const KV_FOLLOW_CHECK: Duration = Duration::from_secs(1);

/// How often a worker's load is fetched.
pub const LOAD_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// How long connecting to a worker may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a worker may take to answer a request's headers. A worker answers a streamed
/// request at once (tokens follow as they come), so this only catches a hung worker.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a request could not be started on a worker.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The worker could not be reached (a retry elsewhere or later can help).
    #[error("the worker at {url} cannot be reached: {why}")]
    Unreachable {
        /// The worker.
        url: String,
        /// What failed.
        why: String,
    },
    /// The worker refused the request as invalid (the client's to fix).
    #[error("{message}")]
    Refused {
        /// The worker's message.
        message: String,
    },
    /// The worker failed (its status and message).
    #[error("the worker at {url} answered {status}: {message}")]
    Failed {
        /// The worker.
        url: String,
        /// Its status.
        status: u16,
        /// Its message.
        message: String,
    },
}

/// A client of one worker.
#[derive(Debug)]
pub struct RemoteWorker {
    url: String,
    client: reqwest::Client,
    response_timeout: Duration,
    load: Mutex<LoadReport>,
    reachable: AtomicBool,
    kv: Arc<ReportedCache>,
}

impl RemoteWorker {
    /// A client of the worker at `url` (`http://HOST:PORT`), polling its load in the
    /// background while the client lives. Needs a tokio runtime.
    pub fn start(url: &str) -> Arc<Self> {
        Self::start_with_timeout(url, RESPONSE_TIMEOUT)
    }

    fn start_with_timeout(url: &str, response_timeout: Duration) -> Arc<Self> {
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .build()
            .unwrap_or_default();
        let worker = Arc::new(Self {
            url: url.trim_end_matches('/').to_owned(),
            client,
            response_timeout,
            load: Mutex::new(LoadReport::default()),
            // Unknown until the first poll: assume reachable so the first requests are tried.
            reachable: AtomicBool::new(true),
            kv: Arc::new(ReportedCache::default()),
        });
        tokio::spawn(poll_load(Arc::downgrade(&worker)));
        tokio::spawn(follow_kv(Arc::downgrade(&worker)));
        worker
    }

    /// The worker's prefix cache as its event stream reports it.
    pub fn kv(&self) -> &ReportedCache {
        &self.kv
    }

    /// The worker's last reported load; full while it cannot be reached.
    pub fn load(&self) -> LoadReport {
        let mut load = self
            .load
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if !self.reachable.load(Ordering::Relaxed) {
            load.waiting = u32::MAX;
        }
        load
    }

    /// Whether the last load poll reached the worker.
    pub fn is_reachable(&self) -> bool {
        self.reachable.load(Ordering::Relaxed)
    }

    /// Starts `request` on the worker; the stream yields its events as a local engine would.
    pub async fn submit(&self, request: GenerateRequest) -> Result<GenerationStream, RemoteError> {
        let (path, body) = openai_body(&request);
        let unreachable = |e: reqwest::Error| RemoteError::Unreachable {
            url: self.url.clone(),
            why: e.to_string(),
        };
        let send = self
            .client
            .post(format!("{}{path}", self.url))
            .json(&body)
            .send();
        let response = tokio::time::timeout(self.response_timeout, send)
            .await
            .map_err(|_| RemoteError::Unreachable {
                url: self.url.clone(),
                why: format!("no answer within {:?}", self.response_timeout),
            })?
            .map_err(unreachable)?;
        let status = response.status();
        if !status.is_success() {
            let message = response
                .json::<Value>()
                .await
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
                .unwrap_or_else(|| status.to_string());
            return Err(if status.as_u16() == 400 {
                RemoteError::Refused { message }
            } else {
                RemoteError::Failed {
                    url: self.url.clone(),
                    status: status.as_u16(),
                    message,
                }
            });
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let request_id = request.request_id;
        let url = self.url.clone();
        tokio::spawn(async move {
            let mut reader = ChunkReader::default();
            let mut bytes = response.bytes_stream();
            while let Some(next) = bytes.next().await {
                let chunk = match next {
                    Ok(chunk) => chunk,
                    Err(e) => {
                        warn!(request_id = %request_id, worker = %url, error = %e, "remote.stream_broken");
                        return;
                    }
                };
                for event in reader.feed(&chunk) {
                    let last = matches!(event, GenerateEvent::Finished { .. });
                    if tx.send(event).is_err() {
                        // The client went away: dropping the response cancels the generation.
                        debug!(request_id = %request_id, "remote.cancelled");
                        return;
                    }
                    if last {
                        return;
                    }
                }
            }
        });
        Ok(GenerationStream::from_channel(rx))
    }
}

/// The worker endpoint and OpenAI body for `request`.
fn openai_body(request: &GenerateRequest) -> (&'static str, Value) {
    let mut body = json!({
        "max_tokens": request.max_tokens,
        "stream": true,
        "stream_options": { "include_usage": true, "continuous_usage_stats": true },
        "ringmaster_priority": request.priority,
    });
    let sampling = &request.sampling;
    if let Some(t) = sampling.temperature {
        body["temperature"] = json!(t);
    }
    if let Some(p) = sampling.top_p {
        body["top_p"] = json!(p);
    }
    if let Some(k) = sampling.top_k {
        body["top_k"] = json!(k);
    }
    if let Some(seed) = sampling.seed {
        body["seed"] = json!(seed);
    }
    if !request.stop_sequences.is_empty() {
        body["stop"] = json!(request.stop_sequences);
    }
    if let Some(prompt) = &request.prompt {
        body["prompt"] = json!(prompt);
        return ("/v1/completions", body);
    }
    let mut messages = Vec::new();
    if let Some(system) = &request.system {
        messages.push(json!({ "role": "system", "content": system }));
    }
    for m in &request.messages {
        let role = match m.role {
            ringmaster_gpu_runtime::Role::User => "user",
            ringmaster_gpu_runtime::Role::Assistant => "assistant",
        };
        messages.push(json!({ "role": role, "content": m.text }));
    }
    body["messages"] = json!(messages);
    ("/v1/chat/completions", body)
}

/// Turns the worker's SSE bytes into engine events.
#[derive(Debug, Default)]
struct ChunkReader {
    buffer: String,
    started: bool,
    finish: Option<FinishReason>,
    finished: bool,
}

impl ChunkReader {
    fn feed(&mut self, bytes: &[u8]) -> Vec<GenerateEvent> {
        self.buffer.push_str(&String::from_utf8_lossy(bytes));
        let mut events = Vec::new();
        while let Some(end) = self.buffer.find("\n\n") {
            let frame: String = self.buffer.drain(..end + 2).collect();
            for line in frame.lines() {
                if let Some(data) = line.strip_prefix("data: ") {
                    self.data(data, &mut events);
                }
            }
        }
        events
    }

    fn data(&mut self, data: &str, events: &mut Vec<GenerateEvent>) {
        if self.finished || data == "[DONE]" {
            return;
        }
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            return;
        };
        let usage = &chunk["usage"];
        let count = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
        let prompt_tokens = count(&usage["prompt_tokens"]);
        let cached_tokens = count(&usage["prompt_tokens_details"]["cached_tokens"]);
        if !self.started && usage.is_object() {
            self.started = true;
            events.push(GenerateEvent::Started {
                prompt_tokens,
                cached_tokens,
            });
        }
        if let Some(choice) = chunk["choices"].get(0) {
            let text = choice["delta"]["content"]
                .as_str()
                .or_else(|| choice["text"].as_str())
                .unwrap_or("");
            if !text.is_empty() {
                events.push(GenerateEvent::Token { text: text.into() });
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                self.finish = Some(match (reason, choice["stop_reason"].as_str()) {
                    ("length", _) => FinishReason::MaxTokens,
                    (_, Some(matched)) => FinishReason::StopSequence(matched.into()),
                    _ => FinishReason::EndOfTurn,
                });
            }
        } else if let Some(reason) = self.finish.take() {
            // The closing usage chunk (no choices).
            self.finished = true;
            events.push(GenerateEvent::Finished {
                reason,
                prompt_tokens,
                cached_tokens,
                output_tokens: count(&usage["completion_tokens"]),
            });
        }
    }
}

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
async fn follow_kv(worker: Weak<RemoteWorker>) {
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
    let mut buffer = String::new();
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
        buffer.push_str(&String::from_utf8_lossy(&bytes));
        while let Some(end) = buffer.find("\n\n") {
            let frame: String = buffer.drain(..end + 2).collect();
            for data in frame.lines().filter_map(|l| l.strip_prefix("data: ")) {
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
}

async fn poll_load(worker: Weak<RemoteWorker>) {
    let mut interval = tokio::time::interval(LOAD_POLL_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let Some(worker) = worker.upgrade() else {
            return;
        };
        let fetched = async {
            worker
                .client
                .get(format!("{}/load", worker.url))
                .timeout(Duration::from_secs(2))
                .send()
                .await?
                .error_for_status()?
                .json::<Value>()
                .await
        }
        .await;
        match fetched {
            Ok(load) => {
                *worker.load.lock().unwrap_or_else(PoisonError::into_inner) = load_report(&load);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_chunks_become_engine_events_across_split_reads() {
        let stream = concat!(
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],",
            "\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":0,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}],\"usage\":{}}\n\n",
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\",\"stop_reason\":\"END\"}],\"usage\":{}}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":3,",
            "\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n",
            "data: [DONE]\n\n",
        );
        let mut reader = ChunkReader::default();
        let mut events = Vec::new();
        // Feed in awkward pieces: frames split mid-way.
        for piece in stream.as_bytes().chunks(7) {
            events.extend(reader.feed(piece));
        }
        assert_eq!(
            events,
            [
                GenerateEvent::Started {
                    prompt_tokens: 40,
                    cached_tokens: 32
                },
                GenerateEvent::Token { text: "Hel".into() },
                GenerateEvent::Finished {
                    reason: FinishReason::StopSequence("END".into()),
                    prompt_tokens: 40,
                    cached_tokens: 32,
                    output_tokens: 3,
                },
            ]
        );
    }

    #[tokio::test]
    async fn a_hung_worker_is_unreachable_after_the_response_timeout() {
        // Accepts connections and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let worker = RemoteWorker::start_with_timeout(&url, Duration::from_millis(300));
        let request = GenerateRequest {
            request_id: "r".into(),
            system: None,
            messages: Vec::new(),
            max_tokens: 1,
            stop_sequences: Vec::new(),
            sampling: Default::default(),
            prompt: Some("x".into()),
            priority: 0,
        };
        let err = worker.submit(request).await.unwrap_err();
        assert!(matches!(err, RemoteError::Unreachable { .. }), "{err}");
        assert!(err.to_string().contains("no answer within"), "{err}");
    }

    #[test]
    fn a_raw_prompt_goes_to_completions_and_a_chat_to_chat_completions() {
        let mut request = GenerateRequest {
            request_id: "r".into(),
            system: Some("Be brief.".into()),
            messages: vec![ringmaster_gpu_runtime::ChatMessage {
                role: ringmaster_gpu_runtime::Role::User,
                text: "Hi".into(),
            }],
            max_tokens: 9,
            stop_sequences: vec!["x".into()],
            sampling: Default::default(),
            prompt: None,
            priority: 3,
        };
        let (path, body) = openai_body(&request);
        assert_eq!(path, "/v1/chat/completions");
        assert_eq!(body["messages"][0]["role"], "system");
        assert_eq!(body["messages"][1]["content"], "Hi");
        assert_eq!(body["ringmaster_priority"], 3);
        assert_eq!(body["stop"], json!(["x"]));
        request.prompt = Some("Once".into());
        let (path, body) = openai_body(&request);
        assert_eq!(path, "/v1/completions");
        assert_eq!(body["prompt"], "Once");
    }
}
