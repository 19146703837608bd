//! A coding agent's traffic, made up (no public trace has it): Claude Code–shaped sessions
//! for [`crate::run_scenario`] to replay.
//!
//! Every session begins with the same long system prompt and tool definitions (Claude Code's
//! are 12 to 21 tools and about 10 to 20 thousand tokens, shared by every session of every
//! user), then grows a turn at a time: the model's reply (a tool call and a little text), the
//! tool's result (a file read, a command's output: hundreds to thousands of tokens), and the
//! next request carries all of it. Sessions start as a Poisson process; within one, the next
//! request comes after the reply's modelled time and the tool's run. Each request names its
//! session (Claude Code's `metadata.user_id`) and, where the scenario says so, carries Claude
//! Code's billing line as the system prompt's first block, new on every request
//! ([`crate::render`] writes it; the gateway's `volatile_prefix` takes it out or not).
//!
//! Blocks follow the Mooncake trace's convention ([`crate::trace`]): ids of 512-token blocks,
//! the shared prefix's ids the same in every session, a turn's ids the previous turn's
//! complete blocks followed by new ones. The conversations are known here, so the earlier
//! turns are the session's own ([`earlier_turns`]; a prefix-only search would take another
//! session's first turn, whose complete blocks are all shared, for this one's past).
//! Deterministic for a given seed.

use std::time::Duration;

use serde::Serialize;

use crate::trace::{TRACE_BLOCK_TOKENS, TraceRequest};

/// The shape of the made-up traffic.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct AgentTrace {
    /// Sessions.
    pub sessions: u32,
    /// Requests per session, at least (a turn is one request).
    pub turns_min: u32,
    /// Requests per session, at most.
    pub turns_max: u32,
    /// The system prompt and tools every session shares, tokens.
    pub shared_tokens: u32,
    /// The user's first message, tokens.
    pub first_message_tokens: u32,
    /// A tool result, tokens, at least.
    pub tool_result_min: u32,
    /// A tool result, tokens, at most.
    pub tool_result_max: u32,
    /// A reply, tokens, at least.
    pub output_min: u32,
    /// A reply, tokens, at most.
    pub output_max: u32,
    /// Mean seconds between two sessions' starts.
    pub session_every_s: f64,
    /// Seconds between a reply and the next request (the tool's run), at least.
    pub think_min_s: f64,
    /// At most.
    pub think_max_s: f64,
    /// Seed of every draw.
    pub seed: u64,
}

impl Default for AgentTrace {
    fn default() -> Self {
        Self {
            sessions: 64,
            turns_min: 8,
            turns_max: 20,
            shared_tokens: 14_000,
            first_message_tokens: 300,
            tool_result_min: 300,
            tool_result_max: 3_000,
            output_min: 60,
            output_max: 400,
            session_every_s: 4.0,
            think_min_s: 1.0,
            think_max_s: 6.0,
            seed: 7,
        }
    }
}

/// A deterministic draw stream.
struct Draws {
    state: u64,
}

impl Draws {
    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        xxhash_rust::xxh3::xxh3_64(&self.state.to_le_bytes())
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn between(&mut self, low: u32, high: u32) -> u32 {
        low + (self.unit() * f64::from(high.saturating_sub(low) + 1)) as u32
    }

    fn seconds(&mut self, low: f64, high: f64) -> f64 {
        low + self.unit() * (high - low).max(0.0)
    }
}

/// Ids of blocks no other request has: the top bit set, so they never meet the shared
/// prefix's small ids.
fn own_block(draws: &mut Draws) -> u64 {
    draws.next() | (1 << 63)
}

impl AgentTrace {
    /// The requests, in arrival order.
    pub fn requests(&self) -> Vec<TraceRequest> {
        let mut draws = Draws {
            state: self.seed ^ 0x4147_454e_5453, // "AGENTS"
        };
        let mut requests = Vec::new();
        let mut session_start = 0.0f64;
        let shared_blocks = u64::from(self.shared_tokens / TRACE_BLOCK_TOKENS);
        for session in 0..self.sessions {
            // Exponential gaps: a Poisson process of session starts.
            session_start += -self.session_every_s * (1.0 - draws.unit()).ln();
            let turns = draws.between(self.turns_min, self.turns_max.max(self.turns_min));
            let mut at = session_start;
            // The prompt so far: the shared prefix, then this session's text.
            let mut tokens = self.shared_tokens + self.first_message_tokens;
            let mut blocks: Vec<u64> = (0..shared_blocks).collect();
            for _ in 0..turns {
                // Complete blocks keep their ids; the partial last block and what is new
                // get new ones (a block's id stands for everything before it too).
                let complete = (tokens / TRACE_BLOCK_TOKENS) as usize;
                blocks.truncate(complete.max(shared_blocks as usize));
                while blocks.len() < tokens.div_ceil(TRACE_BLOCK_TOKENS) as usize {
                    blocks.push(own_block(&mut draws));
                }
                let output = draws.between(self.output_min, self.output_max);
                requests.push(TraceRequest {
                    arrival: Duration::from_secs_f64(at),
                    input_tokens: tokens,
                    output_tokens: output,
                    blocks: blocks.clone(),
                    session: Some(u64::from(session)),
                });
                // The reply's modelled time (a prefill of what is new, a decode of the
                // reply), then the tool's run.
                at += 0.5 + f64::from(output) * 0.01;
                at += draws.seconds(self.think_min_s, self.think_max_s);
                tokens += output + draws.between(self.tool_result_min, self.tool_result_max);
            }
        }
        requests.sort_by_key(|r| r.arrival);
        requests
    }
}

/// For each request, the complete-block counts of its session's earlier requests, oldest
/// first (what [`crate::render`] cuts its messages at).
pub fn earlier_turns(requests: &[TraceRequest]) -> Vec<Vec<usize>> {
    let mut seen: std::collections::HashMap<u64, Vec<usize>> = std::collections::HashMap::new();
    requests
        .iter()
        .map(|request| match request.session {
            Some(session) => {
                let turns = seen.entry(session).or_default();
                let earlier = turns.clone();
                turns.push(request.complete_blocks());
                earlier
            }
            None => Vec::new(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_share_their_prefix_and_grow_turn_by_turn() {
        let trace = AgentTrace {
            sessions: 4,
            ..AgentTrace::default()
        };
        let requests = trace.requests();
        assert_eq!(requests, trace.requests(), "deterministic");
        let shared = (trace.shared_tokens / TRACE_BLOCK_TOKENS) as usize;
        assert!(
            requests
                .iter()
                .all(|r| r.blocks[..shared] == (0..shared as u64).collect::<Vec<_>>())
        );
        // Each turn begins with its session's previous turn's complete blocks.
        let turns = earlier_turns(&requests);
        for (i, request) in requests.iter().enumerate() {
            let previous = requests[..i]
                .iter()
                .rev()
                .find(|r| r.session == request.session);
            assert_eq!(turns[i].is_empty(), previous.is_none(), "request {i}");
            if let Some(previous) = previous {
                let kept = previous.complete_blocks();
                assert_eq!(request.blocks[..kept], previous.blocks[..kept]);
                assert!(request.input_tokens > previous.input_tokens);
            }
        }
        let per_session = requests.iter().filter(|r| r.session == Some(0)).count() as u32;
        assert!((trace.turns_min..=trace.turns_max).contains(&per_session));
    }
}
