//! The Responses API's state: stored responses (`store`, `previous_response_id`, `GET`,
//! `DELETE`, `input_items`) and the responses in flight (`cancel`).
//!
//! A stored response is one JSON document: the response object as the client got it, the
//! conversation it answered (the earlier responses' items, then this request's input, each
//! item with an id), where this request's input begins in it, and the API key that made it
//! (another key is answered 404). Alone, a gateway keeps them in memory, bounded in bytes
//! and by a time to live, least recently used first out ([`LocalStore`]); a replica of a
//! fleet keeps them in the fleet's Redis with the same time to live ([`FleetStore`]), so a
//! follow-up may land on any replica. A response in flight can be cancelled on the replica
//! that runs it.
//!
//! What can go wrong: Redis not answering (a follow-up then fails as not found, a store is
//! logged and lost: the reply itself is never held back for the store), a response evicted
//! or expired (404 naming why it may be gone).

#![deny(missing_docs)]

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Why a cancelled response ended (its stream's `response.failed`, its stored status
/// `cancelled`).
pub const CANCELLED: &str = "the response was cancelled (POST /v1/responses/{id}/cancel)";

/// What a store answers.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where stored responses live.
pub trait ResponseStore: Send + Sync + std::fmt::Debug {
    /// The stored JSON of response `id`, if any.
    fn get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Arc<str>>>;
    /// Stores `json` as response `id`.
    fn put(&self, id: String, json: Arc<str>) -> StoreFuture<'_, ()>;
    /// Deletes response `id`; whether it was stored.
    fn delete<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool>;
}

/// Stored responses in this process's memory.
#[derive(Debug)]
pub struct LocalStore {
    ttl: Duration,
    max_bytes: usize,
    held: Mutex<Held>,
}

#[derive(Debug)]
struct Held {
    entries: lru::LruCache<String, (Instant, Arc<str>)>,
    bytes: usize,
}

impl Default for LocalStore {
    fn default() -> Self {
        Self::new(
            ringmaster_config::DEFAULT_RESPONSE_TTL,
            ringmaster_config::DEFAULT_RESPONSE_STORE_MB * 1024 * 1024,
        )
    }
}

impl LocalStore {
    /// A store keeping responses for `ttl`, at most `max_bytes` of them.
    pub fn new(ttl: Duration, max_bytes: usize) -> Self {
        Self {
            ttl,
            max_bytes,
            held: Mutex::new(Held {
                entries: lru::LruCache::unbounded(),
                bytes: 0,
            }),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ResponseStore for LocalStore {
    fn get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Arc<str>>> {
        let mut held = self.held();
        let found = match held.entries.get(id) {
            Some((stored, json)) if stored.elapsed() < self.ttl => Some(json.clone()),
            Some(_) => {
                if let Some((_, json)) = held.entries.pop(id) {
                    held.bytes -= json.len();
                }
                None
            }
            None => None,
        };
        Box::pin(std::future::ready(found))
    }

    fn put(&self, id: String, json: Arc<str>) -> StoreFuture<'_, ()> {
        let mut held = self.held();
        held.bytes += json.len();
        if let Some((_, old)) = held.entries.put(id, (Instant::now(), json)) {
            held.bytes -= old.len();
        }
        while held.bytes > self.max_bytes {
            let Some((_, (_, evicted))) = held.entries.pop_lru() else {
                break;
            };
            held.bytes -= evicted.len();
        }
        Box::pin(std::future::ready(()))
    }

    fn delete<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        let mut held = self.held();
        let removed = match held.entries.pop(id) {
            Some((_, json)) => {
                held.bytes -= json.len();
                true
            }
            None => false,
        };
        Box::pin(std::future::ready(removed))
    }
}

/// Stored responses in the fleet's Redis.
#[derive(Debug)]
pub struct FleetStore {
    cluster: Arc<ringmaster_cluster::Cluster>,
    ttl: Duration,
}

impl FleetStore {
    /// A store in `cluster`'s Redis keeping responses for `ttl`.
    pub fn new(cluster: Arc<ringmaster_cluster::Cluster>, ttl: Duration) -> Self {
        Self { cluster, ttl }
    }
}

impl ResponseStore for FleetStore {
    fn get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Arc<str>>> {
        Box::pin(async move {
            match self.cluster.get_response(id).await {
                Ok(bytes) => bytes.and_then(|b| String::from_utf8(b).ok()).map(Arc::from),
                Err(error) => {
                    warn!(%error, response = id, "responses.get_failed");
                    None
                }
            }
        })
    }

    fn put(&self, id: String, json: Arc<str>) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            if let Err(error) = self
                .cluster
                .put_response(&id, json.as_bytes(), self.ttl)
                .await
            {
                warn!(%error, response = %id, "responses.store_failed");
            }
        })
    }

    fn delete<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            match self.cluster.delete_response(id).await {
                Ok(deleted) => deleted,
                Err(error) => {
                    warn!(%error, response = id, "responses.delete_failed");
                    false
                }
            }
        })
    }
}

/// One stored response, as the store holds it.
#[derive(Debug, Serialize, Deserialize)]
pub struct Stored {
    /// The API key (its label) that made it.
    pub owner: String,
    /// The response object.
    pub response: Box<RawValue>,
    /// The conversation it answered: earlier items, then this request's input.
    pub conversation: Vec<Box<RawValue>>,
    /// Where this request's input begins in `conversation`.
    pub turn_start: usize,
}

impl Stored {
    /// The items a follow-up continues: the conversation, then this response's output, as a
    /// JSON array's text.
    pub fn items(&self) -> String {
        let output: Vec<Box<RawValue>> = serde_json::from_str::<OutputOnly>(self.response.get())
            .map(|r| r.output)
            .unwrap_or_default();
        let all: Vec<&RawValue> = self
            .conversation
            .iter()
            .chain(output.iter())
            .map(AsRef::as_ref)
            .collect();
        serde_json::to_string(&all).unwrap_or_else(|_| "[]".to_owned())
    }
}

#[derive(Deserialize)]
struct OutputOnly {
    #[serde(default)]
    output: Vec<Box<RawValue>>,
}

/// The stored responses and those in flight.
#[derive(Debug)]
pub struct Responses {
    store: Arc<dyn ResponseStore>,
    in_flight: Mutex<HashMap<String, CancellationToken>>,
}

impl Responses {
    /// Responses kept in `store`.
    pub fn new(store: Arc<dyn ResponseStore>) -> Self {
        Self {
            store,
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// Response `id` as `owner` may see it (another key's is not found).
    pub async fn find(&self, id: &str, owner: &str) -> Option<Stored> {
        self.find_any(id)
            .await
            .filter(|stored| stored.owner == owner)
    }

    /// Response `id`, whoever made it (the admin API's explain).
    pub async fn find_any(&self, id: &str) -> Option<Stored> {
        let json = self.store.get(id).await?;
        match serde_json::from_str(&json) {
            Ok(stored) => Some(stored),
            Err(error) => {
                warn!(%error, response = id, "responses.unreadable");
                None
            }
        }
    }

    /// Deletes response `id` if `owner` made it.
    pub async fn delete(&self, id: &str, owner: &str) -> bool {
        self.find(id, owner).await.is_some() && self.store.delete(id).await
    }

    /// A response begins: it can be cancelled until it ends ([`Saver`] ends it).
    pub fn begin(&self, id: &str) -> CancellationToken {
        let token = CancellationToken::new();
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.to_owned(), token.clone());
        token
    }

    /// Cancels response `id` if it is in flight here; whether it was.
    pub fn cancel(&self, id: &str) -> bool {
        match self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
        {
            Some(token) => {
                token.cancel();
                true
            }
            None => false,
        }
    }

    /// Whether response `id` is in flight here.
    pub fn is_running(&self, id: &str) -> bool {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(id)
    }

    fn end(&self, id: &str) {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }

    /// Stores a finished response (in the background: the reply never waits for the store).
    fn save(self: &Arc<Self>, id: String, stored: Stored) {
        let json: Arc<str> = match serde_json::to_string(&stored) {
            Ok(json) => Arc::from(json),
            Err(_) => return,
        };
        let responses = self.clone();
        tokio::spawn(async move {
            debug!(response = %id, bytes = json.len(), "responses.stored");
            responses.store.put(id, json).await;
        });
    }
}

/// What a Responses request keeps to store its response at the end, and its cancellation.
#[derive(Debug)]
pub struct Saver {
    responses: Arc<Responses>,
    id: String,
    owner: String,
    /// `None`: `store: false`; the response is only cancellable.
    conversation: Option<(Vec<Box<RawValue>>, usize)>,
    /// Cancelled by `POST /v1/responses/{id}/cancel`.
    pub cancel: CancellationToken,
}

impl Saver {
    /// The saver of response `id` to `owner`'s request, whose context says what to keep.
    pub fn new(
        responses: &Arc<Responses>,
        id: &str,
        owner: &str,
        context: &ringmaster_api::responses::Context,
    ) -> Self {
        let conversation = context.store.then(|| {
            let mut items: Vec<Box<RawValue>> = context
                .prior_items
                .as_deref()
                .and_then(|prior| serde_json::from_str(prior).ok())
                .unwrap_or_default();
            let turn_start = items.len();
            items.extend(with_ids(&context.input_items, id));
            (items, turn_start)
        });
        Self {
            cancel: responses.begin(id),
            responses: responses.clone(),
            id: id.to_owned(),
            owner: owner.to_owned(),
            conversation,
        }
    }

    /// The response finished as `response` (its JSON): stored when the request asked (as
    /// `cancelled` when it was).
    pub fn finished(mut self, response: &[u8]) {
        let Some((conversation, turn_start)) = self.conversation.take() else {
            return;
        };
        let response = if self.cancel.is_cancelled() {
            let Ok(mut value) = serde_json::from_slice::<Value>(response) else {
                return;
            };
            value["status"] = "cancelled".into();
            serde_json::value::to_raw_value(&value).ok()
        } else {
            serde_json::from_slice::<Box<RawValue>>(response).ok()
        };
        let Some(response) = response else {
            return;
        };
        let stored = Stored {
            owner: self.owner.clone(),
            response,
            conversation,
            turn_start,
        };
        self.responses.save(self.id.clone(), stored);
    }
}

impl Drop for Saver {
    fn drop(&mut self) {
        self.responses.end(&self.id);
    }
}

/// The items of a JSON array's text, each with an `id` (`item_…` from the response's id for
/// those that had none), as stored and listed.
fn with_ids(items: &str, response_id: &str) -> Vec<Box<RawValue>> {
    let Ok(list) = serde_json::from_str::<Vec<Value>>(items) else {
        return Vec::new();
    };
    let unique = response_id.strip_prefix("resp_").unwrap_or(response_id);
    list.into_iter()
        .enumerate()
        .filter_map(|(i, mut item)| {
            if let Some(map) = item.as_object_mut()
                && !map.contains_key("id")
            {
                map.insert("id".into(), format!("item_{unique}_{i}").into());
            }
            serde_json::value::to_raw_value(&item).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_local_store_keeps_responses_within_its_bytes_and_time() {
        let store = LocalStore::new(Duration::from_millis(200), 20);
        store.put("a".into(), Arc::from("0123456789")).await;
        store.put("b".into(), Arc::from("0123456789")).await;
        assert!(store.get("a").await.is_some());
        // Over the bound: the least recently used (b) goes.
        store.put("c".into(), Arc::from("0123456789")).await;
        assert!(store.get("b").await.is_none());
        assert!(store.get("a").await.is_some());
        assert!(store.delete("c").await);
        assert!(!store.delete("c").await);
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(store.get("a").await.is_none(), "expired");
    }

    #[tokio::test]
    async fn a_stored_response_continues_with_its_output_and_only_for_its_owner() {
        let responses = Arc::new(Responses::new(Arc::new(LocalStore::default())));
        let context = ringmaster_api::responses::Context {
            store: true,
            input_items: r#"[{"type":"message","role":"user","content":"2+2?"}]"#.into(),
            ..Default::default()
        };
        let saver = Saver::new(&responses, "resp_1", "key-a", &context);
        assert!(responses.is_running("resp_1"));
        saver.finished(
            br#"{"id":"resp_1","object":"response","status":"completed","output":[{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"4"}]}]}"#,
        );
        assert!(!responses.is_running("resp_1"));
        let stored = loop {
            if let Some(stored) = responses.find("resp_1", "key-a").await {
                break stored;
            }
            tokio::task::yield_now().await;
        };
        let items: Vec<Value> = serde_json::from_str(&stored.items()).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0]["id"], "item_1_0");
        assert_eq!(items[1]["id"], "msg_1");
        assert!(responses.find("resp_1", "key-b").await.is_none());
        assert!(!responses.delete("resp_1", "key-b").await);
        assert!(responses.delete("resp_1", "key-a").await);
    }
}
