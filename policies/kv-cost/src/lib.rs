//! A KV-cost router, after NVIDIA Dynamo's KV router: the server where the request costs the
//! fewest KV blocks, counting the prefill it would still have to do and the decoding already
//! running there.
//!
//! Written from Dynamo's published description of its KV-aware routing (the `KvRouter`
//! docs: "cost = overlap_score_weight × prefill_blocks + decode_blocks", where prefill blocks
//! are the request's blocks not already cached on the worker and decode blocks are the
//! worker's active blocks; the lowest cost wins, and with a temperature of 0 the choice is
//! deterministic). No Dynamo code was used. Here, per healthy server:
//!
//! - `prefill_blocks` = the prefill the server has queued (Dynamo's router counts the prompt
//!   tokens of the requests it routed that have not started; here the host's
//!   `cluster.prefill-backlog`, which counts the same) plus the request's estimated prompt
//!   tokens not covered by the server's cached prefix (the host's `cluster.prefix-matches`,
//!   as a fraction of the request's prefix hashes), in blocks of 16 tokens;
//! - `decode_blocks` = the server's KV blocks in use (`kv-blocks-used`);
//! - `cost = overlap_weight × prefill_blocks + decode_blocks`.
//!
//! The lowest cost wins; ties go to the key's ring order (so a new prompt lands stably).
//! With no healthy server the request is rejected. Each decision counts
//! `decision_cached` (the winner held part of the prompt) or `decision_cold`.
//!
//! Configuration: `overlap_weight` (default 1.0, Dynamo's `overlap_score_weight`).

use ringmaster_policy_sdk::ConfigError;
use ringmaster_policy_sdk::config::{ConfigSource, HostConfig, OrTrap, get_f64_in};
use ringmaster_policy_sdk::decide::{backlog, coverage, matched, ring_rank};
use ringmaster_policy_sdk::host::{self, cluster, ring};
use ringmaster_policy_sdk::router::{Decision, Guest};
use ringmaster_policy_sdk::types::{Request, Server};

/// The reason given when no server can take the request.
pub const NO_SERVER: &str = "no healthy GPU server";

/// Tokens per KV block (the servers' block size).
pub const BLOCK_TOKENS: f64 = 16.0;

/// Dynamo's default weight of the prefill term.
pub const DEFAULT_OVERLAP_WEIGHT: f64 = 1.0;

/// Reads `overlap_weight`.
pub fn overlap_weight(source: &(impl ConfigSource + ?Sized)) -> Result<f64, ConfigError> {
    get_f64_in(
        source,
        "overlap_weight",
        DEFAULT_OVERLAP_WEIGHT,
        0.0,
        f64::INFINITY,
    )
}

/// What the request costs on `server`, which has `queued` prefill tokens ahead of it.
pub fn cost(
    weight: f64,
    server: &Server,
    queued: u64,
    prompt_tokens: u32,
    matched: u32,
    prefix_len: usize,
) -> f64 {
    let cached = coverage(matched, prefix_len) * f64::from(prompt_tokens);
    let uncached = (f64::from(prompt_tokens) - cached).max(0.0);
    let prefill_blocks = ((queued as f64 + uncached) / BLOCK_TOKENS).ceil();
    weight * prefill_blocks + f64::from(server.kv_blocks_used)
}

/// The cheapest healthy server and whether it held part of the prompt; `None` with none.
pub fn choose<'a>(
    weight: f64,
    servers: &'a [Server],
    matches: &[(String, u32)],
    backlogs: &[(String, u64)],
    prompt_tokens: u32,
    prefix_len: usize,
    ring_order: &[String],
) -> Option<(&'a Server, bool)> {
    let held = |s: &Server| matched(matches, &s.id);
    let rank = |s: &Server| ring_rank(ring_order, &s.id);
    servers
        .iter()
        .filter(|s| s.healthy)
        .map(|s| {
            let queued = backlog(backlogs, &s.id);
            (
                s,
                cost(weight, s, queued, prompt_tokens, held(s), prefix_len),
            )
        })
        .min_by(|(a, ca), (b, cb)| ca.total_cmp(cb).then(rank(a).cmp(&rank(b))))
        .map(|(s, _)| (s, held(s) > 0))
}

/// The component's export.
#[derive(Debug)]
pub struct KvCost;

impl Guest for KvCost {
    fn route(req: &Request) -> Decision {
        let weight = overlap_weight(&HostConfig).or_trap();
        let servers = cluster::servers();
        let matches = host::prefix_matches_for(req.prefix_hash_count());
        let order = ring::candidates(req.routing_key(), servers.len() as u32);
        match choose(
            weight,
            &servers,
            &matches,
            &cluster::prefill_backlog(),
            req.prompt_tokens(),
            req.prefix_hash_count() as usize,
            &order,
        ) {
            Some((server, cached)) => {
                host::count(if cached {
                    "decision_cached"
                } else {
                    "decision_cold"
                });
                Decision::Route(server.id.clone())
            }
            None => Decision::Reject(NO_SERVER.to_owned()),
        }
    }
}

ringmaster_policy_sdk::router::export!(KvCost);

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_policy_sdk::testing::server;

    fn used(id: &str, blocks: u32) -> Server {
        let mut s = server(id);
        s.kv_blocks_used = blocks;
        s
    }

    fn order(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_cost_is_uncached_prefill_plus_active_blocks() {
        // 1,600 tokens, half cached: 50 prefill blocks, plus 30 in use.
        assert_eq!(cost(1.0, &used("a", 30), 0, 1600, 5, 10), 80.0);
        assert_eq!(cost(2.0, &used("a", 30), 0, 1600, 5, 10), 130.0);
        assert_eq!(cost(1.0, &used("a", 0), 0, 1600, 0, 0), 100.0);
        // 320 queued prefill tokens add 20 blocks.
        assert_eq!(cost(1.0, &used("a", 30), 320, 1600, 5, 10), 100.0);
    }

    #[test]
    fn a_cached_prefix_wins_until_the_server_is_busy() {
        let servers = [used("a", 10), used("b", 10)];
        let matches = vec![("b".to_owned(), 8)];
        let (pick, cached) =
            choose(1.0, &servers, &matches, &[], 1600, 10, &order(&["a", "b"])).unwrap();
        assert_eq!((pick.id.as_str(), cached), ("b", true));
        // b holds 80 % (saves 80 blocks) but decodes 200 more blocks: a is cheaper.
        let servers = [used("a", 10), used("b", 210)];
        let (pick, cached) =
            choose(1.0, &servers, &matches, &[], 1600, 10, &order(&["b", "a"])).unwrap();
        assert_eq!((pick.id.as_str(), cached), ("a", false));
        // Or when its queue of prefill is long.
        let servers = [used("a", 10), used("b", 10)];
        let queued = vec![("b".to_owned(), 3200)];
        let (pick, _) = choose(
            1.0,
            &servers,
            &matches,
            &queued,
            1600,
            10,
            &order(&["b", "a"]),
        )
        .unwrap();
        assert_eq!(pick.id, "a");
    }

    #[test]
    fn ties_follow_the_ring_and_the_unhealthy_are_skipped() {
        let mut down = used("a", 0);
        down.healthy = false;
        let servers = [down, used("b", 5), used("c", 5)];
        let (pick, _) = choose(1.0, &servers, &[], &[], 100, 0, &order(&["a", "c", "b"])).unwrap();
        assert_eq!(pick.id, "c");
        assert!(choose(1.0, &[], &[], &[], 100, 0, &[]).is_none());
        assert!(overlap_weight(&[("overlap_weight", "-1")][..]).is_err());
    }
}
