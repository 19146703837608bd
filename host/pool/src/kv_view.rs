//! What each GPU server's prefix cache actually holds, as the server reports it, and how a
//! request's prompt matches it.
//!
//! Every engine in this process publishes its cache (`EngineHandle::cached_prefix_blocks`);
//! a `ringmaster worker` hands out its tokenizer (`GET /tokenizer`) and streams its cache's
//! changes (`GET /kv/events`: a snapshot, then every block stored and evicted), which
//! [`ReportedCache`] mirrors. To match a request against such a server the gateway renders the
//! request's chat with *that server's* tokenizer, hashes its full blocks exactly as the engine
//! does (`block::block_hashes`), and counts how many lead the prompt in the server's cache:
//! the blocks the server would not recompute. Servers sharing a tokenizer (one fingerprint)
//! share one tokenization per request ([`PromptBlocks`]).
//!
//! Policies read the answer through `cluster.prefix-matches`, in units of the request's
//! `prefix-hashes` (fixed-size chunks of the prompt text, which do not depend on a
//! tokenizer): `cached tokens × prefix hashes / prompt tokens`, rounded down, so a policy's
//! coverage ratio is the server's cached share of the prompt. The prompts of requests in flight
//! on a server count too (the pool tracks their prefix hashes until they finish): a burst of
//! requests sharing a prefix follows the first one before its prefill is reported. A server
//! that reports nothing (an
//! OpenAI server without these endpoints, or a worker whose event stream is down) falls back
//! to the gateway's routing-history estimate ([`crate::prefix_index`]).
//!
//! This module holds state and arithmetic only; the remote worker's client
//! ([`crate::remote`]) does the I/O.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use ringmaster_gpu_runtime::block::{BlockHash, block_hashes};
use ringmaster_gpu_runtime::{BLOCK_SIZE, ChatMessage, Tokenizer, TokenizerSpec};
use ringmaster_wire::worker::KvEvent as KvWireEvent;

/// A request's chat as the engines render it, borrowed from the request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChatPrompt<'a> {
    /// The system prompt.
    pub system: Option<&'a str>,
    /// The turns.
    pub messages: &'a [ChatMessage],
    /// The LoRA adapter the request is for, if any: its blocks are keyed apart from the base
    /// model's, as the engines key them (vLLM's `lora_name`).
    pub adapter: Option<&'a str>,
}

/// A server's tokenizer with the fingerprint of its description: servers with one
/// fingerprint tokenize alike.
#[derive(Clone, Debug)]
pub struct Scheme {
    /// `TokenizerSpec::fingerprint`.
    pub fingerprint: u64,
    /// The tokenizer.
    pub tokenizer: Arc<dyn Tokenizer>,
}

impl Scheme {
    /// The scheme of a tokenizer in this process.
    pub fn of(tokenizer: Arc<dyn Tokenizer>) -> Self {
        Self {
            fingerprint: tokenizer.spec().fingerprint(),
            tokenizer,
        }
    }
}

/// One request's prompt, tokenized once per tokenizer and hashed once per tokenizer and
/// salt it is matched under.
#[derive(Debug)]
pub struct PromptBlocks<'a> {
    chat: ChatPrompt<'a>,
    /// (fingerprint, tokens).
    tokens: Vec<(u64, Vec<u32>)>,
    /// (fingerprint, salt, block hashes, prompt tokens).
    done: Vec<(u64, u64, Vec<BlockHash>, usize)>,
}

impl<'a> PromptBlocks<'a> {
    /// Nothing tokenized yet.
    pub fn new(chat: ChatPrompt<'a>) -> Self {
        Self {
            chat,
            tokens: Vec::new(),
            done: Vec::new(),
        }
    }

    /// The prompt's full-block hashes under `scheme`, and its length in tokens.
    pub fn under(&mut self, scheme: &Scheme) -> (&[BlockHash], usize) {
        self.salted(scheme, 0)
    }

    /// The prompt's full-block hashes as the engines key them: salted with the request's
    /// adapter, if it names one.
    pub fn keyed(&mut self, scheme: &Scheme) -> (&[BlockHash], usize) {
        let salt = self.chat.adapter.map_or(0, |adapter| {
            crate::engine_index::chain_salt(Some(adapter), None)
        });
        self.salted(scheme, salt)
    }

    fn salted(&mut self, scheme: &Scheme, salt: u64) -> (&[BlockHash], usize) {
        let fingerprint = scheme.fingerprint;
        let i = match self
            .done
            .iter()
            .position(|(f, s, _, _)| *f == fingerprint && *s == salt)
        {
            Some(i) => i,
            None => {
                let t = match self.tokens.iter().position(|(f, _)| *f == fingerprint) {
                    Some(t) => t,
                    None => {
                        let tokens = scheme
                            .tokenizer
                            .encode_chat(self.chat.system, self.chat.messages);
                        self.tokens.push((fingerprint, tokens));
                        self.tokens.len() - 1
                    }
                };
                let tokens = &self.tokens[t].1;
                let hashes = match salt {
                    0 => block_hashes(tokens),
                    salt => crate::engine_index::salted_block_hashes(tokens, salt),
                };
                self.done.push((fingerprint, salt, hashes, tokens.len()));
                self.done.len() - 1
            }
        };
        let (_, _, hashes, tokens) = &self.done[i];
        (hashes, *tokens)
    }
}

/// `held_blocks` leading cached blocks of a `prompt_tokens`-token prompt, in units of the
/// request's text chunks: the same share of its `prompt_chunks` chunks, rounded down, and at
/// most `prefix_hashes` (the hashes a request carries are capped; its chunks are not).
pub fn in_prefix_units(
    held_blocks: usize,
    prompt_tokens: usize,
    prompt_chunks: usize,
    prefix_hashes: usize,
) -> u32 {
    if prompt_tokens == 0 {
        return 0;
    }
    let held_tokens = (held_blocks * BLOCK_SIZE).min(prompt_tokens);
    let units = held_tokens as u128 * prompt_chunks as u128 / prompt_tokens as u128;
    u32::try_from(units.min(prefix_hashes as u128)).unwrap_or(u32::MAX)
}

/// Why a worker's KV event could not be applied.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// The worker fell behind its own event buffer: the view is stale until a new snapshot.
    #[error("the event stream lagged ({missed} events missed)")]
    Lagged {
        /// Events the worker dropped for this subscriber.
        missed: u64,
    },
    /// The event is not what `/kv/events` sends.
    #[error("malformed KV event: {0}")]
    Malformed(String),
}

/// A remote worker's prefix cache as its event stream reports it.
#[derive(Debug, Default)]
pub struct ReportedCache {
    scheme: RwLock<Option<Scheme>>,
    hashes: Mutex<HashSet<u64>>,
    /// A snapshot was applied and no event has been missed since.
    synced: AtomicBool,
    events: AtomicU64,
    resyncs: AtomicU64,
}

impl ReportedCache {
    /// The worker's tokenizer, once fetched.
    pub fn scheme(&self) -> Option<Scheme> {
        self.scheme
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Sets the worker's tokenizer from its `/tokenizer` description, unless it is the one
    /// already held (building a 49k-token BPE tokenizer takes a while).
    pub fn set_scheme(&self, spec: &TokenizerSpec) -> Result<(), String> {
        let fingerprint = spec.fingerprint();
        if self
            .scheme()
            .is_some_and(|held| held.fingerprint == fingerprint)
        {
            return Ok(());
        }
        let tokenizer = spec.build()?;
        *self.scheme.write().unwrap_or_else(PoisonError::into_inner) = Some(Scheme {
            fingerprint,
            tokenizer,
        });
        Ok(())
    }

    /// How many of `hashes` lead in the cache; `None` while the view is not synced.
    pub fn held_blocks(&self, hashes: &[BlockHash]) -> Option<usize> {
        if !self.synced.load(Ordering::Acquire) {
            return None;
        }
        let held = self.hashes.lock().unwrap_or_else(PoisonError::into_inner);
        Some(hashes.iter().take_while(|h| held.contains(&h.0)).count())
    }

    /// Whether the view tracks the worker now.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Blocks the view holds.
    pub fn len(&self) -> usize {
        self.hashes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether the view holds no block.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Events applied since the gateway started (snapshots count one per hash).
    pub fn events_total(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }

    /// Times the view was rebuilt from a snapshot.
    pub fn resyncs_total(&self) -> u64 {
        self.resyncs.load(Ordering::Relaxed)
    }

    /// The stream is gone or lagged: stop answering from the view until the next snapshot.
    pub fn mark_stale(&self) {
        self.synced.store(false, Ordering::Release);
    }

    /// Replaces the whole view with `hashes` (an engine's index after a clear or a reset) and
    /// counts it as a resync.
    pub(crate) fn replace_all(&self, hashes: impl Iterator<Item = u64>) {
        let fresh: HashSet<u64> = hashes.collect();
        *self.hashes.lock().unwrap_or_else(PoisonError::into_inner) = fresh;
        self.resyncs.fetch_add(1, Ordering::Relaxed);
    }

    /// Applies an engine batch's net changes, in order: `(hash, true)` stored, `false` gone.
    pub(crate) fn change(&self, changes: &[(u64, bool)]) {
        if changes.is_empty() {
            return;
        }
        let mut held = self.hashes.lock().unwrap_or_else(PoisonError::into_inner);
        for &(hash, stored) in changes {
            if stored {
                held.insert(hash);
            } else {
                held.remove(&hash);
            }
        }
        drop(held);
        self.events
            .fetch_add(changes.len() as u64, Ordering::Relaxed);
    }

    /// The engine's stream is live (again): answer from the view.
    pub(crate) fn mark_synced(&self) {
        self.synced.store(true, Ordering::Release);
    }

    /// Sets the tokenizer the gateway was told the engine uses (`tokenizer = …`).
    pub(crate) fn set_scheme_built(&self, scheme: Scheme) {
        *self.scheme.write().unwrap_or_else(PoisonError::into_inner) = Some(scheme);
    }

    /// Applies one `/kv/events` message (the JSON of an SSE `data:` line).
    pub fn apply(&self, data: &str) -> Result<(), EventError> {
        let event: KvWireEvent =
            serde_json::from_str(data).map_err(|e| EventError::Malformed(e.to_string()))?;
        match event {
            KvWireEvent::Snapshot { hashes } => {
                let fresh: HashSet<u64> = hashes.into_iter().map(|h| h.0).collect();
                self.events.fetch_add(fresh.len() as u64, Ordering::Relaxed);
                *self.hashes.lock().unwrap_or_else(PoisonError::into_inner) = fresh;
                self.resyncs.fetch_add(1, Ordering::Relaxed);
                self.synced.store(true, Ordering::Release);
            }
            KvWireEvent::Stored { hash } => {
                self.hashes
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(hash.0);
                self.events.fetch_add(1, Ordering::Relaxed);
            }
            KvWireEvent::Evicted { hash } => {
                self.hashes
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&hash.0);
                self.events.fetch_add(1, Ordering::Relaxed);
            }
            KvWireEvent::StoredMany { hashes } => {
                let mut held = self.hashes.lock().unwrap_or_else(PoisonError::into_inner);
                held.extend(hashes.iter().map(|h| h.0));
                self.events
                    .fetch_add(hashes.len() as u64, Ordering::Relaxed);
            }
            KvWireEvent::EvictedMany { hashes } => {
                let mut held = self.hashes.lock().unwrap_or_else(PoisonError::into_inner);
                for hash in &hashes {
                    held.remove(&hash.0);
                }
                self.events
                    .fetch_add(hashes.len() as u64, Ordering::Relaxed);
            }
            KvWireEvent::Lagged { missed } => {
                self.mark_stale();
                return Err(EventError::Lagged { missed });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use ringmaster_gpu_runtime::{Role, SimTokenizer};

    use super::*;

    fn chat(system: &str, user: &str) -> (String, Vec<ChatMessage>) {
        (
            system.to_owned(),
            vec![ChatMessage {
                role: Role::User,
                text: user.into(),
                ..Default::default()
            }],
        )
    }

    #[test]
    fn events_build_the_view_and_a_lag_makes_it_stale() {
        let cache = ReportedCache::default();
        assert_eq!(cache.held_blocks(&[BlockHash(1)]), None, "not synced yet");
        cache
            .apply(r#"{"type":"snapshot","hashes":["0000000000000001","00000000000000ff"]}"#)
            .unwrap();
        assert_eq!(cache.held_blocks(&[BlockHash(1), BlockHash(2)]), Some(1));
        cache
            .apply(r#"{"type":"stored","hash":"0000000000000002"}"#)
            .unwrap();
        assert_eq!(cache.held_blocks(&[BlockHash(1), BlockHash(2)]), Some(2));
        cache
            .apply(r#"{"type":"evicted","hash":"0000000000000001"}"#)
            .unwrap();
        assert_eq!(cache.held_blocks(&[BlockHash(1), BlockHash(2)]), Some(0));
        assert_eq!(cache.len(), 2);
        // A worker's batches: runs of stores and of evictions.
        cache
            .apply(r#"{"type":"stored_many","hashes":["0000000000000001","0000000000000003"]}"#)
            .unwrap();
        assert_eq!(cache.held_blocks(&[BlockHash(1), BlockHash(2)]), Some(2));
        cache
            .apply(r#"{"type":"evicted_many","hashes":["0000000000000001","0000000000000003"]}"#)
            .unwrap();
        assert_eq!(cache.len(), 2);
        assert_eq!(
            cache.apply(r#"{"type":"lagged","missed":7}"#),
            Err(EventError::Lagged { missed: 7 })
        );
        assert_eq!(cache.held_blocks(&[BlockHash(2)]), None);
        // A new snapshot replaces the view entirely.
        cache
            .apply(r#"{"type":"snapshot","hashes":["0000000000000003"]}"#)
            .unwrap();
        assert_eq!(cache.held_blocks(&[BlockHash(3)]), Some(1));
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.resyncs_total(), 2);
    }

    #[test]
    fn malformed_events_are_refused_without_changing_the_view() {
        let cache = ReportedCache::default();
        cache.apply(r#"{"type":"snapshot","hashes":[]}"#).unwrap();
        for bad in [
            "not json",
            r#"{"type":"stored"}"#,
            r#"{"type":"stored","hash":"xyz"}"#,
            r#"{"type":"snapshot","hashes":"all"}"#,
            r#"{"type":"snapshot","hashes":["1","nope"]}"#,
            r#"{"type":"moved"}"#,
        ] {
            assert!(
                matches!(cache.apply(bad), Err(EventError::Malformed(_))),
                "{bad}"
            );
        }
        assert!(cache.is_empty());
        assert!(cache.is_synced());
    }

    #[test]
    fn a_prompt_is_tokenized_once_per_tokenizer() {
        let scheme = Scheme::of(Arc::new(SimTokenizer::new()));
        let long: String = (0..100).map(|i| format!("word{i} ")).collect();
        let (system, messages) = chat(&long, "hi");
        let mut blocks = PromptBlocks::new(ChatPrompt {
            system: Some(&system),
            messages: &messages,
            adapter: None,
        });
        let (hashes, tokens) = blocks.under(&scheme);
        let (hashes, tokens) = (hashes.to_vec(), tokens);
        assert_eq!(hashes.len(), tokens / BLOCK_SIZE);
        let expected = scheme.tokenizer.encode_chat(Some(&system), &messages);
        assert_eq!(hashes, block_hashes(&expected));
        assert_eq!(blocks.under(&scheme.clone()).0, &hashes[..]);
        assert_eq!(blocks.done.len(), 1);
    }

    #[test]
    fn a_tokenizer_spec_is_built_once_per_fingerprint() {
        let cache = ReportedCache::default();
        cache.set_scheme(&TokenizerSpec::Sim).unwrap();
        let first = cache.scheme().unwrap();
        cache.set_scheme(&TokenizerSpec::Sim).unwrap();
        assert!(Arc::ptr_eq(
            &first.tokenizer,
            &cache.scheme().unwrap().tokenizer
        ));
        assert_eq!(first.fingerprint, TokenizerSpec::Sim.fingerprint());
    }

    #[test]
    fn cached_blocks_convert_to_prefix_units() {
        // A 160-token prompt of 10 chunks: each chunk stands for 16 tokens' worth.
        assert_eq!(in_prefix_units(0, 160, 10, 10), 0);
        assert_eq!(in_prefix_units(5, 160, 10, 10), 5);
        assert_eq!(in_prefix_units(10, 160, 10, 10), 10);
        // Never more than the prompt, whatever the server claims.
        assert_eq!(in_prefix_units(50, 160, 10, 10), 10);
        // Rounded down: 3 blocks of 100 tokens over 7 chunks is 48/100 × 7 = 3.36.
        assert_eq!(in_prefix_units(3, 100, 7, 7), 3);
        assert_eq!(in_prefix_units(3, 0, 7, 7), 0);
        assert_eq!(in_prefix_units(3, 100, 0, 0), 0);
        // A long prompt whose hashes were capped at 4 of its 20 chunks: holding a quarter of
        // it covers every hash the request carries.
        assert_eq!(in_prefix_units(5, 320, 20, 4), 4);
        assert_eq!(in_prefix_units(1, 320, 20, 4), 1);
    }
}
