//! Request traces as the replay reads them: Mooncake's JSONL format (arrival, token counts,
//! prefix-block hashes) and the conversations it implies.
//!
//! This module owns parsing a trace and reconstructing its turns, and the synthetic prefix
//! model for traces that carry no prefixes (Azure's). It must not render prompts
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
    /// The conversation it belongs to, where the trace says (a made-up agent trace does;
    /// Mooncake's and Azure's do not).
    pub session: Option<u64>,
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
            session: None,
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

/// How prefixes are made up for a trace that has none (Azure's LLM inference traces give
/// arrival times and token counts only): each request belongs to one of `groups` shared
/// prefixes (a system prompt or a document), drawn with a skew toward the first ones, and the
/// first `shared_fraction` of its prompt is that group's; the rest is its own. Deterministic
/// for a given `seed`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct SyntheticPrefixes {
    /// Shared prefixes to draw from.
    pub groups: u32,
    /// Fraction of each prompt (0 to 1) taken from its group's prefix.
    pub shared_fraction: f64,
    /// Seed of the draws.
    pub seed: u64,
}

impl Default for SyntheticPrefixes {
    fn default() -> Self {
        Self {
            groups: 64,
            shared_fraction: 0.5,
            seed: 1,
        }
    }
}

impl SyntheticPrefixes {
    /// The block ids of request `index` with `input_tokens` prompt tokens.
    fn blocks(&self, index: usize, input_tokens: u32) -> Vec<u64> {
        let draw = xxhash_rust::xxh3::xxh3_64_with_seed(&(index as u64).to_le_bytes(), self.seed);
        // u² skews the draw toward the low groups: a few popular prefixes, a long tail.
        let u = (draw >> 11) as f64 / (1u64 << 53) as f64;
        let group = ((u * u) * f64::from(self.groups.max(1))) as u64;
        let blocks = input_tokens.div_ceil(TRACE_BLOCK_TOKENS) as usize;
        let shared =
            ((f64::from(input_tokens) * self.shared_fraction) as u32 / TRACE_BLOCK_TOKENS) as usize;
        (0..blocks)
            .map(|i| {
                let (owner, salt) = if i < shared {
                    (group, 0x5348_4152_4544u64) // "SHARED"
                } else {
                    (index as u64, 0x004f_574e_u64) // "OWN"
                };
                xxhash_rust::xxh3::xxh3_64_with_seed(
                    &[owner.to_le_bytes(), (i as u64).to_le_bytes()].concat(),
                    self.seed ^ salt,
                )
            })
            .collect()
    }
}

/// Reads an Azure LLM inference trace (`TIMESTAMP,ContextTokens,GeneratedTokens`, timestamps
/// like `2023-11-16 18:15:46.6805900`): arrivals from the first request's, block ids from
/// `prefixes`. At most `limit` requests.
pub fn load_azure(
    path: &Path,
    limit: Option<usize>,
    prefixes: SyntheticPrefixes,
) -> Result<Vec<TraceRequest>, TraceError> {
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| TraceError::Io {
        path: shown.clone(),
        source,
    })?;
    parse_azure(std::io::BufReader::new(file), &shown, limit, prefixes)
}

/// Parses an Azure trace from `reader` (`name` names it in errors).
pub fn parse_azure(
    reader: impl BufRead,
    name: &str,
    limit: Option<usize>,
    prefixes: SyntheticPrefixes,
) -> Result<Vec<TraceRequest>, TraceError> {
    let mut requests = Vec::new();
    let mut first: Option<f64> = None;
    for (index, line) in reader.lines().enumerate() {
        let bad = |why: String| TraceError::Line {
            path: name.to_owned(),
            line: index + 1,
            why,
        };
        let line = line.map_err(|e| bad(e.to_string()))?;
        if index == 0 && line.starts_with("TIMESTAMP") {
            continue;
        }
        if line.trim().is_empty() {
            continue;
        }
        if limit.is_some_and(|n| requests.len() >= n) {
            break;
        }
        let mut fields = line.split(',');
        let (Some(time), Some(context), Some(generated), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(bad(
                "expected TIMESTAMP,ContextTokens,GeneratedTokens".into()
            ));
        };
        let at = seconds_of(time.trim()).ok_or_else(|| {
            bad(format!(
                "{time:?} is not a time like 2023-11-16 18:15:46.68"
            ))
        })?;
        let input: u32 = context
            .trim()
            .parse()
            .map_err(|_| bad(format!("ContextTokens {context:?} is not a count")))?;
        let output: u32 = generated
            .trim()
            .parse()
            .map_err(|_| bad(format!("GeneratedTokens {generated:?} is not a count")))?;
        if input == 0 {
            return Err(bad("ContextTokens must be at least 1".into()));
        }
        let start = *first.get_or_insert(at);
        requests.push(TraceRequest {
            arrival: Duration::from_secs_f64((at - start).max(0.0)),
            input_tokens: input,
            output_tokens: output,
            blocks: prefixes.blocks(requests.len(), input),
            session: None,
        });
    }
    requests.sort_by_key(|r| r.arrival);
    Ok(requests)
}

/// Seconds since 1970 of `YYYY-MM-DD HH:MM:SS[.fraction]` (UTC; the trace has no zone).
fn seconds_of(text: &str) -> Option<f64> {
    let (date, time) = text.split_once(' ')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (year, month, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':');
    let (hour, minute, second) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<f64>().ok()?,
    );
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + hour * 3_600 + minute * 60) as f64 + second)
}

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
    fn azure_lines_get_arrivals_and_synthetic_prefixes() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                    2023-11-16 18:17:03.9799600,4808,10\n\
                    2023-11-16 18:17:04.0319600,3180,8\n\
                    2023-11-16 19:14:19.9280160,549,173\n";
        let prefixes = SyntheticPrefixes {
            groups: 1,
            shared_fraction: 0.5,
            seed: 7,
        };
        let requests = parse_azure(text.as_bytes(), "a.csv", None, prefixes).unwrap();
        assert_eq!(requests.len(), 3);
        assert_eq!(requests[0].arrival, Duration::ZERO);
        assert_eq!(requests[1].arrival.as_millis(), 52);
        assert_eq!(requests[2].arrival.as_secs(), 57 * 60 + 15);
        assert_eq!(requests[0].blocks.len(), 10);
        // One group: the first half of every prompt is the same prefix.
        assert_eq!(requests[0].blocks[..3], requests[1].blocks[..3]);
        assert_ne!(requests[0].blocks[5], requests[1].blocks[5]);
        let again = parse_azure(text.as_bytes(), "a.csv", None, prefixes).unwrap();
        assert_eq!(requests, again, "deterministic for a seed");
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,x,1\n";
        let err = parse_azure(text.as_bytes(), "a.csv", None, prefixes).unwrap_err();
        assert!(
            err.to_string().starts_with("a.csv:2: ContextTokens"),
            "{err}"
        );
        assert_eq!(seconds_of("1970-01-02 00:00:01.5"), Some(86_401.5));
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
