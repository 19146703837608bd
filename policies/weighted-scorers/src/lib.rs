//! Weighted scorers, after llm-d's inference scheduler: each healthy server gets a score from
//! 0 to 1 per signal, the weighted sum decides.
//!
//! Written from llm-d's published description of its scheduler (the inference-scheduler's
//! scorer plugins and their default profile: `queue-scorer` weight 2,
//! `kv-cache-utilization-scorer` weight 2, `prefix-cache-scorer` weight 3; the highest total
//! wins). No llm-d code was used. Here:
//!
//! - **queue** = 1 − (waiting − least waiting) / (most waiting − least waiting) over the
//!   healthy servers (1 for all when they are equal), from the servers' queues (`waiting`);
//! - **kv** = 1 − `kv-blocks-used` / `kv-blocks-total`;
//! - **prefix** = the fraction of the request's prefix hashes the server is estimated to hold
//!   (the host's `cluster.prefix-matches`).
//!
//! The highest `queue_weight × queue + kv_weight × kv + prefix_weight × prefix` wins; ties go
//! to the key's ring order. With no healthy server the request is rejected.
//!
//! Configuration: `queue_weight` (2), `kv_weight` (2), `prefix_weight` (3), each ≥ 0.

use ringmaster_policy_sdk::ConfigError;
use ringmaster_policy_sdk::config::{ConfigSource, HostConfig, OrTrap, get_f64_in};
use ringmaster_policy_sdk::decide::{coverage, matched, ring_rank};
use ringmaster_policy_sdk::host::{self, cluster, ring};
use ringmaster_policy_sdk::router::{Decision, Guest};
use ringmaster_policy_sdk::types::{Request, Server};

/// The reason given when no server can take the request.
pub const NO_SERVER: &str = "no healthy GPU server";

/// The scorers' weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights {
    /// Of the queue score.
    pub queue: f64,
    /// Of the KV-utilisation score.
    pub kv: f64,
    /// Of the prefix score.
    pub prefix: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Self {
            queue: 2.0,
            kv: 2.0,
            prefix: 3.0,
        }
    }
}

impl Weights {
    /// Reads the weights from `source`, defaults for the keys that are not set.
    pub fn from_config(source: &(impl ConfigSource + ?Sized)) -> Result<Self, ConfigError> {
        let d = Self::default();
        let weight = |key, default| get_f64_in(source, key, default, 0.0, f64::INFINITY);
        Ok(Self {
            queue: weight("queue_weight", d.queue)?,
            kv: weight("kv_weight", d.kv)?,
            prefix: weight("prefix_weight", d.prefix)?,
        })
    }
}

/// Every healthy server with its total score, in the order given.
pub fn scores<'a>(
    weights: &Weights,
    servers: &'a [Server],
    matches: &[(String, u32)],
    prefix_len: usize,
) -> Vec<(&'a Server, f64)> {
    let healthy: Vec<&Server> = servers.iter().filter(|s| s.healthy).collect();
    let least = healthy.iter().map(|s| s.waiting).min().unwrap_or(0);
    let most = healthy.iter().map(|s| s.waiting).max().unwrap_or(0);
    healthy
        .into_iter()
        .map(|s| {
            let queue = if most == least {
                1.0
            } else {
                1.0 - f64::from(s.waiting - least) / f64::from(most - least)
            };
            let kv = if s.kv_blocks_total == 0 {
                0.0
            } else {
                1.0 - f64::from(s.kv_blocks_used.min(s.kv_blocks_total))
                    / f64::from(s.kv_blocks_total)
            };
            let matched = matched(matches, &s.id);
            let prefix = coverage(matched, prefix_len);
            (
                s,
                weights.queue * queue + weights.kv * kv + weights.prefix * prefix,
            )
        })
        .collect()
}

/// The best-scoring healthy server (ties: ring order); `None` with none.
pub fn choose<'a>(
    weights: &Weights,
    servers: &'a [Server],
    matches: &[(String, u32)],
    prefix_len: usize,
    ring_order: &[String],
) -> Option<&'a Server> {
    let rank = |s: &Server| ring_rank(ring_order, &s.id);
    scores(weights, servers, matches, prefix_len)
        .into_iter()
        .max_by(|(a, sa), (b, sb)| sa.total_cmp(sb).then(rank(b).cmp(&rank(a))))
        .map(|(s, _)| s)
}

/// The component's export.
#[derive(Debug)]
pub struct WeightedScorers;

impl Guest for WeightedScorers {
    fn route(req: &Request) -> Decision {
        let weights = Weights::from_config(&HostConfig).or_trap();
        let servers = cluster::servers();
        let matches = host::prefix_matches_for(req.prefix_hash_count());
        let order = ring::candidates(req.routing_key(), servers.len() as u32);
        match choose(
            &weights,
            &servers,
            &matches,
            req.prefix_hash_count() as usize,
            &order,
        ) {
            Some(server) => Decision::Route(server.id.clone()),
            None => Decision::Reject(NO_SERVER.to_owned()),
        }
    }
}

ringmaster_policy_sdk::router::export!(WeightedScorers);

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_policy_sdk::testing::server;

    fn state(id: &str, waiting: u32, used: u32) -> Server {
        let mut s = server(id);
        s.waiting = waiting;
        s.kv_blocks_used = used;
        s.kv_blocks_total = 1000;
        s
    }

    fn order(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn scores_are_the_weighted_sum_of_the_three_signals() {
        let servers = [state("a", 0, 500), state("b", 10, 0)];
        let matches = vec![("b".to_owned(), 5)];
        let s = scores(&Weights::default(), &servers, &matches, 10);
        // a: queue 1, kv 0.5, prefix 0 → 2 + 1 = 3; b: queue 0, kv 1, prefix 0.5 → 2 + 1.5.
        assert_eq!(s[0].1, 3.0);
        assert_eq!(s[1].1, 3.5);
        assert_eq!(
            choose(
                &Weights::default(),
                &servers,
                &matches,
                10,
                &order(&["a", "b"])
            )
            .unwrap()
            .id,
            "b"
        );
    }

    #[test]
    fn ties_follow_the_ring_and_weights_are_validated() {
        let servers = [state("a", 0, 0), state("b", 0, 0)];
        assert_eq!(
            choose(&Weights::default(), &servers, &[], 0, &order(&["b", "a"]))
                .unwrap()
                .id,
            "b"
        );
        assert!(Weights::from_config(&[("prefix_weight", "-2")][..]).is_err());
        let custom = Weights::from_config(&[("queue_weight", "0")][..]).unwrap();
        assert_eq!(custom.queue, 0.0);
        assert!(choose(&Weights::default(), &[], &[], 0, &[]).is_none());
    }
}
