//! The `state` interface's store: a bounded key/value map the host owns, shared by every warm
//! instance of one policy, so a policy can keep what its instances' separate memories cannot
//! (a routing history, what a learning router has learned).
//!
//! It owns the map, its caps and its least-recently-used eviction, and nothing of who may use
//! it: the engine hands each loaded version the store its slot chose ([`StateMode`]). Every
//! operation takes one short lock; none of them can fail the call or grow past the caps.

use std::sync::{Mutex, PoisonError};

use lru::LruCache;

/// Entries one policy's store may hold unless configured otherwise.
pub const DEFAULT_STATE_MAX_ENTRIES: u32 = 65_536;
/// Bytes (keys and values) one policy's store may hold unless configured otherwise.
pub const DEFAULT_STATE_MAX_BYTES: u64 = 16 * 1024 * 1024;

/// What a newly loaded version of a policy starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StateMode {
    /// The store of the version it replaces (of the same name), or a new one for a new name.
    #[default]
    Keep,
    /// A new, empty store; the version it replaces keeps its own until it is dropped.
    Fresh,
}

impl StateMode {
    /// `keep` or `fresh`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Keep => "keep",
            Self::Fresh => "fresh",
        }
    }

    /// Parses `keep` or `fresh` (also `drop`, an alias of `fresh`).
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "keep" => Some(Self::Keep),
            "fresh" | "drop" => Some(Self::Fresh),
            _ => None,
        }
    }
}

/// How full a store is (the `state.usage` answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StateUsage {
    /// Entries held.
    pub entries: u32,
    /// Bytes held (keys and values).
    pub bytes: u64,
    /// The most entries it may hold.
    pub max_entries: u32,
    /// The most bytes it may hold.
    pub max_bytes: u64,
}

/// One policy's store.
#[derive(Debug)]
pub struct StateStore {
    inner: Mutex<Inner>,
    max_entries: u32,
    max_bytes: u64,
}

#[derive(Debug)]
struct Inner {
    map: LruCache<String, Vec<u8>>,
    bytes: u64,
}

fn entry_bytes(key: &str, value: &[u8]) -> u64 {
    (key.len() + value.len()) as u64
}

impl StateStore {
    /// An empty store with these caps (each at least 1).
    pub fn new(max_entries: u32, max_bytes: u64) -> Self {
        let max_entries = max_entries.max(1);
        Self {
            inner: Mutex::new(Inner {
                // Unbounded in the LRU's own terms: both caps are enforced here, in `evict`.
                map: LruCache::unbounded(),
                bytes: 0,
            }),
            max_entries,
            max_bytes: max_bytes.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The value under `key` (and marks it recently used).
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.lock().map.get(key).cloned()
    }

    /// Stores `value` under `key`, evicting the least recently used entries to stay under the
    /// caps; false, storing nothing, when the entry alone is over the byte cap.
    pub fn set(&self, key: String, value: Vec<u8>) -> bool {
        let size = entry_bytes(&key, &value);
        if size > self.max_bytes {
            return false;
        }
        let key_len = key.len() as u64;
        let mut inner = self.lock();
        if let Some(old) = inner.map.put(key, value) {
            inner.bytes -= key_len + old.len() as u64;
        }
        inner.bytes += size;
        self.evict(&mut inner);
        true
    }

    /// Removes `key`; whether it was there.
    pub fn remove(&self, key: &str) -> bool {
        let mut inner = self.lock();
        match inner.map.pop(key) {
            Some(old) => {
                inner.bytes -= entry_bytes(key, &old);
                true
            }
            None => false,
        }
    }

    /// Adds `delta` to the little-endian `i64` under `key` (absent or another length: 0),
    /// wrapping, and returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> i64 {
        let mut inner = self.lock();
        if let Some(value) = inner.map.get_mut(key) {
            let old = <[u8; 8]>::try_from(value.as_slice()).map_or(0, i64::from_le_bytes);
            let new = old.wrapping_add(delta);
            let old_len = value.len();
            *value = new.to_le_bytes().to_vec();
            inner.bytes = inner.bytes - old_len as u64 + 8;
            self.evict(&mut inner);
            return new;
        }
        let size = entry_bytes(key, &[0; 8]);
        if size > self.max_bytes {
            return delta;
        }
        inner.map.put(key.to_owned(), delta.to_le_bytes().to_vec());
        inner.bytes += size;
        self.evict(&mut inner);
        delta
    }

    /// How full it is.
    pub fn usage(&self) -> StateUsage {
        let inner = self.lock();
        StateUsage {
            entries: u32::try_from(inner.map.len()).unwrap_or(u32::MAX),
            bytes: inner.bytes,
            max_entries: self.max_entries,
            max_bytes: self.max_bytes,
        }
    }

    fn evict(&self, inner: &mut Inner) {
        while inner.map.len() > self.max_entries as usize || inner.bytes > self.max_bytes {
            match inner.map.pop_lru() {
                Some((key, value)) => inner.bytes -= entry_bytes(&key, &value),
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_remove() {
        let store = StateStore::new(10, 1000);
        assert!(store.set("a".into(), b"one".to_vec()));
        assert_eq!(store.get("a").as_deref(), Some(&b"one"[..]));
        assert!(store.set("a".into(), b"three".to_vec()));
        assert_eq!(store.usage().bytes, 6);
        assert!(store.remove("a"));
        assert!(!store.remove("a"));
        assert_eq!(
            store.usage(),
            StateUsage {
                entries: 0,
                bytes: 0,
                max_entries: 10,
                max_bytes: 1000
            }
        );
    }

    #[test]
    fn evicts_least_recently_used_past_either_cap() {
        let store = StateStore::new(3, 1000);
        for key in ["a", "b", "c"] {
            store.set(key.into(), vec![0]);
        }
        store.get("a");
        store.set("d".into(), vec![0]);
        assert!(store.get("b").is_none(), "b was the least recently used");
        assert!(store.get("a").is_some() && store.get("c").is_some() && store.get("d").is_some());

        let store = StateStore::new(100, 10);
        store.set("k1".into(), vec![0; 4]);
        store.set("k2".into(), vec![0; 4]);
        assert!(store.get("k1").is_none(), "12 bytes > 10: k1 evicted");
        assert_eq!(store.usage().bytes, 6);
        assert!(
            !store.set("big".into(), vec![0; 10]),
            "an entry over the cap is refused"
        );
        assert!(store.get("k2").is_some(), "and evicts nothing");
    }

    #[test]
    fn add_counts_and_resets_foreign_values() {
        let store = StateStore::new(10, 1000);
        assert_eq!(store.add("n", 5), 5);
        assert_eq!(store.add("n", -7), -2);
        assert_eq!(store.get("n"), Some((-2i64).to_le_bytes().to_vec()));
        store.set("s".into(), b"text".to_vec());
        assert_eq!(store.add("s", 1), 1);
        assert_eq!(store.usage().bytes, 9 + 9);
        assert_eq!(store.add("m", i64::MAX), i64::MAX);
        assert_eq!(store.add("m", 1), i64::MIN, "wraps");
    }

    #[test]
    fn shared_between_threads() {
        let store = std::sync::Arc::new(StateStore::new(10, 1000));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        store.add("hits", 1);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(store.add("hits", 0), 4000);
    }
}
