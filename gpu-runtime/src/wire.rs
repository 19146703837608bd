//! The wire protocol between `ringmaster worker` and a gateway, as one set of serde types both
//! ends use: the load report (`GET /load`), the prefix cache's events (`GET /kv/events`) and
//! the tokenizer description (`GET /tokenizer`). The chat endpoints are OpenAI's, whose shapes
//! the gateway reads from any server (see the gateway's `remote::chunks`).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::TokenizerSpec;
use crate::block::{BlockHash, KvEvent};

/// A block's chained hash on the wire: 16 lower-case hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HexHash(pub u64);

impl Serialize for HexHash {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format!("{:016x}", self.0))
    }
}

impl<'de> Deserialize<'de> for HexHash {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        u64::from_str_radix(&text, 16)
            .map(HexHash)
            .map_err(|_| serde::de::Error::custom(format!("bad block hash {text:?}")))
    }
}

/// One event of `GET /kv/events`, the `data` of its SSE frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum KvWireEvent {
    /// The first event: every block the prefix cache holds.
    Snapshot {
        /// Their hashes.
        hashes: Vec<HexHash>,
    },
    /// A block entered the cache.
    Stored {
        /// Its hash.
        hash: HexHash,
    },
    /// A block left the cache.
    Evicted {
        /// Its hash.
        hash: HexHash,
    },
    /// The subscriber fell behind and missed this many events: its view is stale, and it
    /// should reconnect for a new snapshot.
    Lagged {
        /// Events missed.
        missed: u64,
    },
}

impl KvWireEvent {
    /// The snapshot of `hashes`.
    pub fn snapshot(hashes: &[BlockHash]) -> Self {
        Self::Snapshot {
            hashes: hashes.iter().map(|h| HexHash(h.0)).collect(),
        }
    }
}

impl From<&KvEvent> for KvWireEvent {
    fn from(event: &KvEvent) -> Self {
        match event {
            KvEvent::Stored(h) => Self::Stored { hash: HexHash(h.0) },
            KvEvent::Evicted(h) => Self::Evicted { hash: HexHash(h.0) },
        }
    }
}

/// `GET /tokenizer`: how the worker tokenizes, so a gateway hashes a prompt's blocks exactly
/// as the worker's engine does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizerDescription {
    /// Tokens per KV block.
    pub block_size: usize,
    /// The tokenizer's fingerprint (16 hex digits); equal fingerprints tokenize alike.
    pub fingerprint: String,
    /// The tokenizer itself.
    pub tokenizer: TokenizerSpec,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_events_read_back_as_written() {
        for event in [
            KvWireEvent::snapshot(&[BlockHash(1), BlockHash(u64::MAX)]),
            KvWireEvent::from(&KvEvent::Stored(BlockHash(0xabc))),
            KvWireEvent::from(&KvEvent::Evicted(BlockHash(7))),
            KvWireEvent::Lagged { missed: 3 },
        ] {
            let text = serde_json::to_string(&event).unwrap();
            assert_eq!(serde_json::from_str::<KvWireEvent>(&text).unwrap(), event);
        }
        assert_eq!(
            serde_json::to_string(&KvWireEvent::from(&KvEvent::Stored(BlockHash(0xabc)))).unwrap(),
            r#"{"type":"stored","hash":"0000000000000abc"}"#
        );
        assert!(serde_json::from_str::<KvWireEvent>(r#"{"type":"stored","hash":"xyz"}"#).is_err());
    }

    #[test]
    fn a_load_report_reads_back_and_missing_fields_read_as_zero() {
        let report = crate::LoadReport {
            running: 3,
            busy_seconds_total: 1.5,
            ..Default::default()
        };
        let text = serde_json::to_string(&report).unwrap();
        assert_eq!(
            serde_json::from_str::<crate::LoadReport>(&text).unwrap(),
            report
        );
        let partial: crate::LoadReport = serde_json::from_str(r#"{"waiting":2}"#).unwrap();
        assert_eq!(partial.waiting, 2);
        assert_eq!(partial.running, 0);
    }
}
