//! LoRA adapters a remote server loads at the gateway's request (`[lora] load_on_demand`):
//! vLLM's `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`. Which adapters a
//! server holds is otherwise what its `/v1/models` lists (see [`super::RemoteWorker::adapters`]);
//! this module only adds to and takes from that list, and keeps when each was last asked for.
//!
//! Loads on one server are serialised (two requests for one missing adapter load it once).
//! Past the per-server limit the adapter asked for least recently is unloaded, unless it was
//! asked for within `[lora] busy_ms` (its requests may still run): the limit is then enforced
//! at a later load, once one has gone quiet.

use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ringmaster_config::{AdapterSource, LoraSettings};
use serde_json::json;
use tokio::time::Instant;

use super::RemoteWorker;
use super::health::RemoteError;

/// How long a load may take (vLLM reads the adapter's weights from disk).
const LOAD_TIMEOUT: Duration = Duration::from_secs(120);

/// How adapters came and went on one server at the gateway's request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct AdapterCounts {
    /// Loads that succeeded.
    pub loaded: u64,
    /// Loads the server refused or that failed.
    pub load_failures: u64,
    /// Adapters unloaded past the limit.
    pub unloaded: u64,
}

impl RemoteWorker {
    /// Records that a request for adapter `name` is sent here now.
    pub fn touch_adapter(&self, name: &str) {
        let mut used = self
            .adapter_use
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match used.get_mut(name) {
            Some(at) => *at = Instant::now(),
            None => {
                used.insert(name.to_owned(), Instant::now());
            }
        }
    }

    /// Makes sure adapter `name` is loaded here (loading it from `source` when the server
    /// does not list it), then unloads the least recently asked-for past `settings`'
    /// `max_per_server`, leaving those asked for within its `busy`.
    pub async fn ensure_adapter(
        &self,
        name: &str,
        source: &AdapterSource,
        settings: &LoraSettings,
    ) -> Result<(), RemoteError> {
        self.touch_adapter(name);
        if self.has_adapter(name) {
            return Ok(());
        }
        let _one_at_a_time = self.adapter_loads.lock().await;
        if self.has_adapter(name) {
            return Ok(());
        }
        let started = Instant::now();
        let result = self
            .post_adapter(
                "/v1/load_lora_adapter",
                json!({"lora_name": name, "lora_path": source.path}),
            )
            .await;
        match result {
            // vLLM answers 400 for an adapter it already holds (loaded by someone else since
            // its last `/v1/models`).
            Ok(()) | Err(AdapterCall::AlreadyLoaded) => {
                self.adapter_counts
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .loaded += 1;
                tracing::info!(
                    server = %self.url, adapter = name, base = %source.base,
                    ms = started.elapsed().as_millis() as u64, "remote.adapter_loaded"
                );
                self.add_model(name, &source.base);
            }
            Err(AdapterCall::Failed(error)) => {
                self.adapter_counts
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .load_failures += 1;
                tracing::warn!(server = %self.url, adapter = name, error = %error, "remote.adapter_load_failed");
                return Err(error);
            }
        }
        self.unload_past(settings, name).await;
        Ok(())
    }

    /// How adapters came and went here at the gateway's request.
    pub fn adapter_counts(&self) -> AdapterCounts {
        *self
            .adapter_counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    async fn unload_past(&self, settings: &LoraSettings, keep: &str) {
        loop {
            let held = self.adapters();
            if held.len() <= settings.max_per_server {
                return;
            }
            let victim = {
                let used = self
                    .adapter_use
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                // Never asked for through this gateway: the oldest of all.
                held.keys()
                    .filter(|a| a.as_str() != keep)
                    .map(|a| (used.get(a).copied(), a.clone()))
                    .filter(|(at, _)| at.is_none_or(|at| at.elapsed() >= settings.busy))
                    .min_by_key(|(at, _)| *at)
                    .map(|(_, a)| a)
            };
            let Some(victim) = victim else {
                return;
            };
            match self
                .post_adapter("/v1/unload_lora_adapter", json!({"lora_name": victim}))
                .await
            {
                Ok(()) | Err(AdapterCall::AlreadyLoaded) => {
                    self.adapter_counts
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .unloaded += 1;
                    tracing::info!(server = %self.url, adapter = %victim, "remote.adapter_unloaded");
                    self.remove_model(&victim);
                }
                Err(AdapterCall::Failed(error)) => {
                    tracing::warn!(server = %self.url, adapter = %victim, error = %error, "remote.adapter_unload_failed");
                    return;
                }
            }
        }
    }

    async fn post_adapter(&self, path: &str, body: serde_json::Value) -> Result<(), AdapterCall> {
        let response = self
            .side
            .post_json(path, &body, LOAD_TIMEOUT)
            .await
            .map_err(|e| {
                AdapterCall::Failed(RemoteError::Unreachable {
                    url: self.url.clone(),
                    why: e.to_string(),
                    timeout: e.is_timeout(),
                })
            })?;
        let status = response.status;
        if status.is_success() {
            return Ok(());
        }
        let text = response
            .bytes(64 * 1024)
            .await
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        if status == http::StatusCode::BAD_REQUEST && text.contains("already been loaded") {
            return Err(AdapterCall::AlreadyLoaded);
        }
        Err(AdapterCall::Failed(RemoteError::Failed {
            url: self.url.clone(),
            status: status.as_u16(),
            message: format!(
                "{path} for {body}: {}",
                text.chars().take(300).collect::<String>()
            ),
        }))
    }

    /// Lists `name` (an adapter of `base`) among the server's models until its next
    /// `/v1/models` says otherwise.
    fn add_model(&self, name: &str, base: &str) {
        let mut models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        let mut adapters = self.adapters.lock().unwrap_or_else(PoisonError::into_inner);
        if !models.iter().any(|m| m == name) {
            models.push(name.to_owned());
            models.sort();
        }
        adapters.insert(name.to_owned(), base.to_owned());
        drop((models, adapters));
        self.bump_models_epoch();
    }

    fn remove_model(&self, name: &str) {
        let mut models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        let mut adapters = self.adapters.lock().unwrap_or_else(PoisonError::into_inner);
        models.retain(|m| m != name);
        adapters.remove(name);
        drop((models, adapters));
        self.adapter_use
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
        self.bump_models_epoch();
    }

    fn bump_models_epoch(&self) {
        if let Some(epoch) = &self.models_epoch {
            epoch.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// How one adapter call ended, other than success.
enum AdapterCall {
    /// 400 "already been loaded" (or, unloading, already gone).
    AlreadyLoaded,
    Failed(RemoteError),
}
