//! Recording the gateway's own traffic as a trace in Mooncake's format, so an operator can
//! replay what their fleet really saw against a new policy (`ringmaster bench replay`).
//!
//! One JSON line per finished request: `timestamp` (milliseconds since recording began),
//! `input_length` and `output_length` (the server's token counts) and `hash_ids`, one per
//! 512-token block of the prompt. Never text: block `i`'s id is the gateway's chained prefix
//! hash (over 256-byte chunks of the canonical prompt) at the end of its
//! [`RECORD_BLOCK_BYTES`] bytes, so two requests share ids exactly as far as they share a
//! prefix, as in Mooncake's traces. The block is a fixed number of bytes (about 512 tokens
//! of English), not each request's own bytes per token: an earlier turn and its follow-up
//! must cut their shared prefix at the same places. Past the hashed part of a long prompt
//! (`max_prefix_hashes`) the ids go on as a chain of the last one, which repeats only where
//! the whole hashed prefix did. This module must not
//! decide anything about requests; a write that fails is logged once and recording stops.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde::Serialize;
use tracing::{info, warn};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Tokens per block of a recorded trace (Mooncake's).
pub const RECORD_BLOCK_TOKENS: u32 = 512;

/// Canonical prompt bytes a block's id covers: 512 tokens at 4 bytes a token.
pub const RECORD_BLOCK_BYTES: usize = 2048;

/// Why recording could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot record traffic to {path}: {source}")]
pub struct RecordError {
    path: PathBuf,
    source: std::io::Error,
}

/// Writes finished requests to a trace file.
#[derive(Debug)]
pub struct TraceRecorder {
    path: PathBuf,
    started: Instant,
    out: Mutex<std::io::BufWriter<std::fs::File>>,
    broken: AtomicBool,
    /// Switched by the config (`[record] enabled`) and the admin API (`/admin/record`).
    enabled: AtomicBool,
}

/// What a request contributes to the trace before it finishes.
#[derive(Clone, Debug)]
pub struct RecordStart {
    arrival_ms: u64,
    prefix_hashes: Vec<u64>,
    chunk_bytes: usize,
}

#[derive(Serialize)]
struct Line<'a> {
    timestamp: u64,
    input_length: u32,
    output_length: u32,
    hash_ids: &'a [u64],
}

impl TraceRecorder {
    /// Appends to `path` (created when missing), recording at once when `enabled`.
    pub fn open(path: &Path, enabled: bool) -> Result<Self, RecordError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| RecordError {
                path: path.to_owned(),
                source,
            })?;
        info!(path = %path.display(), enabled, "record.opened");
        Ok(Self {
            path: path.to_owned(),
            started: Instant::now(),
            out: Mutex::new(std::io::BufWriter::new(file)),
            broken: AtomicBool::new(false),
            enabled: AtomicBool::new(enabled),
        })
    }

    /// Starts or stops recording; whether it was recording before.
    pub fn set_enabled(&self, enabled: bool) -> bool {
        let was = self.enabled.swap(enabled, Ordering::Relaxed);
        if was != enabled {
            info!(path = %self.path.display(), enabled, "record.switched");
        }
        was
    }

    /// Whether finished requests are being written (switched on, and no write has failed).
    pub fn is_recording(&self) -> bool {
        self.enabled.load(Ordering::Relaxed) && !self.broken.load(Ordering::Relaxed)
    }

    /// The trace file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A request arriving at `arrived`, with the prefix hashes routing computed for it.
    pub fn start(
        &self,
        arrived: Instant,
        prefix_hashes: &[u64],
        chunk_bytes: usize,
    ) -> RecordStart {
        RecordStart {
            arrival_ms: arrived.saturating_duration_since(self.started).as_millis() as u64,
            prefix_hashes: prefix_hashes.to_vec(),
            chunk_bytes,
        }
    }

    /// The request finished with these token counts: its line goes out.
    pub fn finish(&self, start: &RecordStart, prompt_tokens: u32, output_tokens: u32) {
        if !self.is_recording() || prompt_tokens == 0 {
            return;
        }
        let ids = block_ids(start, prompt_tokens);
        let line = Line {
            timestamp: start.arrival_ms,
            input_length: prompt_tokens,
            output_length: output_tokens,
            hash_ids: &ids,
        };
        let mut out = self
            .out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let written = serde_json::to_writer(&mut *out, &line)
            .map_err(std::io::Error::other)
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush());
        if let Err(e) = written
            && !self.broken.swap(true, Ordering::Relaxed)
        {
            warn!(path = %self.path.display(), error = %e, "record.stopped");
        }
    }
}

/// One id per [`RECORD_BLOCK_TOKENS`] tokens of a `prompt_tokens`-token prompt.
fn block_ids(start: &RecordStart, prompt_tokens: u32) -> Vec<u64> {
    let blocks = prompt_tokens.div_ceil(RECORD_BLOCK_TOKENS) as usize;
    let chunks_per_block = (RECORD_BLOCK_BYTES / start.chunk_bytes.max(1)).max(1);
    let mut ids = Vec::with_capacity(blocks);
    let mut last = 0u64;
    for block in 0..blocks {
        let chunk = (block + 1) * chunks_per_block - 1;
        last = match start.prefix_hashes.get(chunk) {
            Some(&hash) => hash,
            // Past the hashed part (or a prompt shorter than a block): chained from the last.
            None => xxh3_64_with_seed(&(block as u64).to_le_bytes(), last),
        };
        ids.push(last);
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(hashes: &[u64]) -> RecordStart {
        RecordStart {
            arrival_ms: 0,
            prefix_hashes: hashes.to_vec(),
            chunk_bytes: 256,
        }
    }

    #[test]
    fn ids_follow_the_shared_prefix() {
        // A block is 8 chunks of 256 bytes.
        let a: Vec<u64> = (1..=24).collect();
        let mut b = a.clone();
        b[23] = 99; // b's hash at the third block's end differs
        let ids_a = block_ids(&start(&a), 1536);
        let ids_b = block_ids(&start(&b), 1536);
        assert_eq!(ids_a.len(), 3);
        assert_eq!(ids_a[0], ids_b[0], "the first block is shared");
        assert_eq!(ids_a[0], 8, "the hash at the first block's last chunk");
        assert_eq!(ids_a[1], ids_b[1]);
        assert_ne!(ids_a[2], ids_b[2]);
        // A prompt longer than its hashes goes on with chained ids, the same for the same
        // prefix.
        let long_a = block_ids(&start(&a[..8]), 1536);
        let long_b = block_ids(&start(&b[..8]), 1536);
        assert_eq!(long_a, long_b);
        assert_eq!(long_a.len(), 3);
    }

    #[test]
    fn lines_are_mooncake_json() {
        let dir = std::env::temp_dir().join(format!("ringmaster-record-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("trace.jsonl");
        let recorder = TraceRecorder::open(&path, false).unwrap();
        let s = recorder.start(Instant::now(), &[5, 6, 7, 8, 9, 10, 11, 12], 256);
        recorder.finish(&s, 600, 41);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "",
            "off: nothing written"
        );
        assert!(!recorder.set_enabled(true));
        recorder.finish(&s, 600, 42);
        let text = std::fs::read_to_string(&path).unwrap();
        let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["input_length"], 600);
        assert_eq!(line["output_length"], 42);
        assert_eq!(line["hash_ids"].as_array().unwrap().len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
