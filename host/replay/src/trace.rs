//! Request traces as the replay reads them: Mooncake's JSONL format (arrival, token counts,
//! prefix-block hashes) and the conversations it implies.
//!
//! This module owns parsing a trace and reconstructing its turns. It must not render prompts
//! ([`crate::render`]) nor know about servers. A Mooncake line is
//! `{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [..]}`, one id per
//! [`TRACE_BLOCK_TOKENS`]-token block of the prompt, where an id depends on the whole prefix
//! before it. A later turn of a conversation shows up as a request whose ids begin with all of
//! an earlier request's *complete* blocks (the earlier prompt's last block was partial, and
//! the reply and the new message follow it).

use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use xxhash_rust::xxh3::Xxh3;

/// Tokens per block of a Mooncake trace's `hash_ids`.
pub const TRACE_BLOCK_TOKENS: u32 = 512;

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("cannot read the trace {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        source: std::io::Error,
    },
    /// A line is not a Mooncake request.
    #[error("{path}:{line}: {why}")]
    Line {
        /// The file.
        path: String,
        /// The line (from 1).
        line: usize,
        /// What is wrong with it.
        why: String,
    },
}

/// One request of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRequest {
    /// When it arrives, from the trace's start.
    pub arrival: Duration,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Reply tokens.
    pub output_tokens: u32,
    /// The prompt's block ids, one per [`TRACE_BLOCK_TOKENS`] tokens (the last may be
    /// partial).
    pub blocks: Vec<u64>,
}

impl TraceRequest {
    /// How many of the prompt's blocks are complete (all but a partial last one).
    pub fn complete_blocks(&self) -> usize {
        let whole = (self.input_tokens / TRACE_BLOCK_TOKENS) as usize;
        whole.min(self.blocks.len())
    }

    /// Tokens in block `index` (the last block may be partial).
    pub fn block_tokens(&self, index: usize) -> u32 {
        let start = index as u32 * TRACE_BLOCK_TOKENS;
        self.input_tokens
            .saturating_sub(start)
            .min(TRACE_BLOCK_TOKENS)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MooncakeLine {
    timestamp: u64,
    input_length: u32,
    output_length: u32,
    hash_ids: Vec<u64>,
}

/// Reads a Mooncake-format JSONL trace: at most `limit` requests (all when `None`), sorted by
/// arrival.
pub fn load_mooncake(path: &Path, limit: Option<usize>) -> Result<Vec<TraceRequest>, TraceError> {
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| TraceError::Io {
        path: shown.clone(),
        source,
    })?;
    parse_mooncake(std::io::BufReader::new(file), &shown, limit)
}

/// Parses Mooncake JSONL from `reader` (`name` names it in errors).
pub fn parse_mooncake(
    reader: impl BufRead,
    name: &str,
    limit: Option<usize>,
) -> Result<Vec<TraceRequest>, TraceError> {
    let mut requests = Vec::new();
    for (index, line) in reader.lines().enumerate() {
        if limit.is_some_and(|n| requests.len() >= n) {
            break;
        }
        let bad = |why: String| TraceError::Line {
            path: name.to_owned(),
            line: index + 1,
            why,
        };
        let line = line.map_err(|e| bad(e.to_string()))?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed: MooncakeLine =
            serde_json::from_str(&line).map_err(|e| bad(format!("not a Mooncake request: {e}")))?;
        let expected = parsed.input_length.div_ceil(TRACE_BLOCK_TOKENS) as usize;
        if parsed.hash_ids.len() != expected {
            return Err(bad(format!(
                "{} hash_ids for {} input tokens (expected {expected}, one per {TRACE_BLOCK_TOKENS})",
                parsed.hash_ids.len(),
                parsed.input_length
            )));
        }
        requests.push(TraceRequest {
            arrival: Duration::from_millis(parsed.timestamp),
            input_tokens: parsed.input_length,
            output_tokens: parsed.output_length,
            blocks: parsed.hash_ids,
        });
    }
    // Stable: requests at one timestamp keep the file's order.
    requests.sort_by_key(|r| r.arrival);
    Ok(requests)
}

/// Fewest complete blocks an earlier request must share for a later one to count as its next
/// turn: in the conversation trace every request begins with one shared block (a system
/// prompt), which makes no conversation.
pub const MIN_TURN_BLOCKS: usize = 2;

/// Each request's previous turn (an index into the same slice), if it has one: the latest
/// earlier request whose complete blocks (at least [`MIN_TURN_BLOCKS`]) are the longest run
/// this request's ids begin with.
pub fn previous_turns(requests: &[TraceRequest]) -> Vec<Option<usize>> {
    // Prefix of complete blocks (as a hash of the ids, and their count) -> the latest request
    // that ends there.
    let mut ends: HashMap<(usize, u64), usize> = HashMap::new();
    let mut parents = Vec::with_capacity(requests.len());
    for (index, request) in requests.iter().enumerate() {
        let mut hasher = Xxh3::new();
        let mut parent = None;
        // Only a strictly shorter prefix can be an earlier turn: the request itself adds to it.
        let longest = request.blocks.len().saturating_sub(1);
        let mut prefixes = Vec::with_capacity(longest);
        for id in &request.blocks[..longest] {
            hasher.update(&id.to_le_bytes());
            prefixes.push(hasher.digest());
        }
        for len in (MIN_TURN_BLOCKS..=longest).rev() {
            if let Some(&earlier) = ends.get(&(len, prefixes[len - 1])) {
                parent = Some(earlier);
                break;
            }
        }
        parents.push(parent);
        let complete = request.complete_blocks();
        if complete >= MIN_TURN_BLOCKS {
            let mut hasher = Xxh3::new();
            for id in &request.blocks[..complete] {
                hasher.update(&id.to_le_bytes());
            }
            ends.insert((complete, hasher.digest()), index);
        }
    }
    parents
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(ms: u64, input: u32, blocks: &[u64]) -> String {
        format!(
            r#"{{"timestamp": {ms}, "input_length": {input}, "output_length": 10, "hash_ids": {blocks:?}}}"#
        )
    }

    #[test]
    fn parses_and_finds_turns() {
        let text = [
            request(0, 1100, &[0, 1, 2]),
            request(0, 700, &[0, 9]),
            request(3000, 2000, &[0, 1, 3, 4]),
            request(6000, 2100, &[0, 1, 3, 4, 5]),
            request(6000, 600, &[0, 7]),
        ]
        .join("\n");
        let requests = parse_mooncake(text.as_bytes(), "t", None).unwrap();
        assert_eq!(requests.len(), 5);
        assert_eq!(requests[0].complete_blocks(), 2);
        assert_eq!(requests[0].block_tokens(2), 76);
        assert_eq!(requests[2].complete_blocks(), 3);
        // 2 starts with 0's complete blocks [0, 1]; 3 with 2's complete [0, 1, 3]; 4 shares
        // only the universal block 0 with 1, which makes no conversation.
        assert_eq!(
            previous_turns(&requests),
            vec![None, None, Some(0), Some(2), None]
        );
    }

    #[test]
    fn bad_lines_say_where() {
        let text = format!("{}\n{{\"timestamp\": 1}}", request(0, 10, &[0]));
        let err = parse_mooncake(text.as_bytes(), "t.jsonl", None).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("t.jsonl:2: not a Mooncake request"),
            "{err}"
        );
        let text = request(0, 1100, &[0, 1]);
        let err = parse_mooncake(text.as_bytes(), "t.jsonl", None).unwrap_err();
        assert!(err.to_string().contains("expected 3"), "{err}");
    }

    #[test]
    fn the_fixture_parses_with_its_conversations() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/mooncake_conversation_head.jsonl");
        let requests = load_mooncake(&path, None).unwrap();
        assert_eq!(requests.len(), 1000);
        assert_eq!(load_mooncake(&path, Some(10)).unwrap().len(), 10);
        assert!(requests.windows(2).all(|w| w[0].arrival <= w[1].arrival));
        let turns = previous_turns(&requests);
        let follow_ups = turns.iter().filter(|p| p.is_some()).count();
        assert!(follow_ups > 50 && follow_ups < 1000, "{follow_ups}");
        // A turn's parent came before it and shares at least two blocks with it.
        for (index, parent) in turns.iter().enumerate() {
            if let Some(p) = parent {
                assert!(*p < index);
                let shared = requests[*p].complete_blocks();
                assert!(shared >= MIN_TURN_BLOCKS);
                assert_eq!(
                    requests[index].blocks[..shared],
                    requests[*p].blocks[..shared]
                );
            }
        }
    }
}
