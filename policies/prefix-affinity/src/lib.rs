//! Prefix affinity by prefill cost, with a slack cap: the server that would begin answering
//! a request soonest, counting the prefill work queued there and the part of the prompt its
//! cache does not hold, unless that would overload it.
//!
//! For each request:
//!
//! 1. **Room.** A server has room while its in-flight requests are under
//!    `ceil(c × (total + 1) × weight / total-weight) + slack`: the ring's bounded-load cap with
//!    `slack` more requests, because at low concurrency the bare cap leaves almost no room and
//!    every spill throws away the cache a conversation built. `c` is the host's factor when
//!    the host guards the slot (`host.load_factor`), else `load_factor`. Under the host's
//!    guard the host's cap still holds: a choice inside the slack but over the host's cap is
//!    spilled by the host along the key's ring order (`policy-over-cap`).
//! 2. **Cost.** For each server with room: its prefill backlog (`cluster.prefill-backlog`:
//!    prompt tokens routed there and not yet begun, after their own cache credit) plus the
//!    request's prompt tokens it would compute, that is less `cache_weight` × the tokens its
//!    cache holds (`cluster.prefix-matches`, as a share of the request's prefix hashes). This
//!    is the time to the first token in prefill tokens, the quantity the tail of TTFT is made
//!    of when prefill dominates. A prefix every server holds (a system prompt shared by all
//!    traffic) lowers every cost alike and decides nothing; a long prompt goes where the
//!    queue of prefill work is short, which a request count cannot see (one 100k-token prompt
//!    weighs as much as fifty short ones).
//! 3. The cheapest wins; ties go to fewer in flight, then to the key's ring order. When no
//!    server has room, the least loaded takes it.
//!
//! **Why a cached token weighs 16.** At weight 1 the cost is this request's own time to the
//! first token, and the policy spreads conversations for it: on the conversation trace
//! (`host/replay/scenarios/conversation.toml`, every router deciding alone) it had the
//! lowest TTFT p99 (9.48 s) but reused only 12.0 % of the prompt tokens. A cached prefix is
//! worth more than its own prefill: the conversation's next turn finds it there, and a prefix
//! kept on one server is not stored twice in the fleet. Measured on the three replays
//! (conversation, the same at a quarter of the KV capacity, Azure's code trace): weights 8 to
//! 32 reuse 0.94–0.97×, 1.05–1.06× and 0.98–0.99× what one shared LRU of the fleet's memory
//! holds, with TTFT p99 within 0.5 s of weight 1's; 16 was the best of them on the
//! quarter-capacity run and within noise elsewhere. Adding in-flight requests to the cost (256
//! to 4,096 tokens each) changed nothing measurable.
//!
//! Each outcome is counted: `decision_cache` when the chosen server holds more of the prompt
//! than the least any server holds, else `decision_least_loaded`.
//! Run it with `[policies] router_bounded_load = "policy"` so that the slack is the policy's
//! to use; under the host's guard the host's own cap still applies.
//!
//! Configuration (all optional):
//!
//! | key | default | meaning |
//! | --- | --- | --- |
//! | `cache_weight` | 16 | prefill tokens one cached prompt token is worth (0: ignore caches) |
//! | `slack` | 2 | requests a server may carry over the bounded-load cap |
//! | `load_factor` | 1.25 | the cap's factor when the policy decides alone |
//!
//! A malformed value is logged and traps, so a new configuration with one never goes live.

use ringmaster_policy_sdk::ConfigError;
use ringmaster_policy_sdk::config::{
    ConfigSource, HostConfig, OrTrap, get_f64_in, get_string, get_u32,
};
use ringmaster_policy_sdk::decide::{backlog, matched, ring_rank, uncached_tokens};
use ringmaster_policy_sdk::host::{self, cluster, ring};
use ringmaster_policy_sdk::router::{Decision, Guest};
use ringmaster_policy_sdk::types::{Request, Server};

/// The reason given when no server can take the request.
pub const NO_SERVER: &str = "no healthy GPU server";

/// The policy's configuration, validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Prefill tokens one cached prompt token is worth.
    pub cache_weight: f64,
    /// Requests a server may carry over the bounded-load cap.
    pub slack: u32,
    /// The cap's factor.
    pub load_factor: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            cache_weight: 16.0,
            slack: 2,
            load_factor: 1.25,
        }
    }
}

impl Settings {
    /// Reads the settings from `source`, defaults for the keys that are not set; under the
    /// host's guard (`host.bounded_load = host`) the host's factor is the one that counts.
    pub fn from_config(source: &(impl ConfigSource + ?Sized)) -> Result<Self, ConfigError> {
        let d = Self::default();
        let own = get_f64_in(source, "load_factor", d.load_factor, 1.0, f64::INFINITY)?;
        let load_factor = if get_string(source, "host.bounded_load", "policy") == "host" {
            get_f64_in(source, "host.load_factor", own, 1.0, f64::INFINITY)?
        } else {
            own
        };
        Ok(Self {
            cache_weight: get_f64_in(source, "cache_weight", d.cache_weight, 0.0, 1000.0)?,
            slack: get_u32(source, "slack", d.slack)?,
            load_factor,
        })
    }

    /// How many requests `server` may carry when `total` are in flight on servers of
    /// `total_weight`.
    pub fn room(&self, server: &Server, total: u64, total_weight: u64) -> u64 {
        let share = (total + 1) as f64 * f64::from(server.weight) / total_weight.max(1) as f64;
        (self.load_factor * share).ceil() as u64 + u64::from(self.slack)
    }
}

/// What the host told the policy about one request, gathered before deciding.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// The request's estimated prompt tokens.
    pub prompt_tokens: u32,
    /// How many prefix hashes the request has.
    pub prefix_hashes: usize,
    /// `cluster.prefix-matches`.
    pub matches: Vec<(String, u32)>,
    /// `cluster.prefill-backlog`.
    pub backlogs: Vec<(String, u64)>,
    /// The key's servers in ring order.
    pub ring_order: Vec<String>,
}

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// The cheapest server, which holds more of the prompt than the least any holds.
    Cache(String),
    /// The cheapest holds no more than any other (or nobody has room): the least loaded.
    LeastLoaded(String),
}

/// Decides for a request, given the healthy servers and what the host said about it. `None`
/// with no healthy server.
pub fn choose(settings: &Settings, servers: &[Server], facts: &Facts) -> Option<Choice> {
    let healthy: Vec<&Server> = servers.iter().filter(|s| s.healthy).collect();
    if healthy.is_empty() {
        return None;
    }
    let total: u64 = healthy.iter().map(|s| u64::from(s.in_flight)).sum();
    let total_weight: u64 = healthy.iter().map(|s| u64::from(s.weight)).sum();
    let has_room = |s: &Server| u64::from(s.in_flight) < settings.room(s, total, total_weight);
    let held = |s: &Server| matched(&facts.matches, &s.id);
    let floor = healthy.iter().map(|s| held(s)).min().unwrap_or(0);
    let rank = |s: &Server| ring_rank(&facts.ring_order, &s.id);
    let prompt = f64::from(facts.prompt_tokens);
    let cost = |s: &Server| {
        let cached =
            prompt - uncached_tokens(facts.prompt_tokens, held(s), facts.prefix_hashes) as f64;
        backlog(&facts.backlogs, &s.id) as f64 + prompt - settings.cache_weight * cached
    };
    let cheapest = healthy
        .iter()
        .filter(|s| has_room(s))
        .map(|s| (cost(s), *s))
        .min_by(|(ca, a), (cb, b)| {
            ca.total_cmp(cb)
                .then(a.in_flight.cmp(&b.in_flight))
                .then(rank(a).cmp(&rank(b)))
        });
    match cheapest {
        Some((_, server)) if held(server) > floor => Some(Choice::Cache(server.id.clone())),
        Some((_, server)) => Some(Choice::LeastLoaded(server.id.clone())),
        None => healthy
            .iter()
            .min_by(|a, b| a.in_flight.cmp(&b.in_flight).then(rank(a).cmp(&rank(b))))
            .map(|s| Choice::LeastLoaded(s.id.clone())),
    }
}

/// The component's export.
#[derive(Debug)]
pub struct PrefixAffinity;

impl Guest for PrefixAffinity {
    fn route(req: &Request) -> Decision {
        // The configuration is fixed for an instance's life (a new one loads the policy
        // again), so it is read on the first call only: this is the default router, on
        // every request's path.
        static SETTINGS: std::sync::OnceLock<Settings> = std::sync::OnceLock::new();
        let settings = *SETTINGS.get_or_init(|| Settings::from_config(&HostConfig).or_trap());
        let servers = cluster::servers();
        let facts = Facts {
            prompt_tokens: req.prompt_tokens(),
            prefix_hashes: req.prefix_hash_count() as usize,
            matches: host::prefix_matches_for(req.prefix_hash_count()),
            backlogs: cluster::prefill_backlog(),
            ring_order: ring::candidates(req.routing_key(), servers.len() as u32),
        };
        match choose(&settings, &servers, &facts) {
            Some(Choice::Cache(id)) => {
                host::count("decision_cache");
                Decision::Route(id)
            }
            Some(Choice::LeastLoaded(id)) => {
                host::count("decision_least_loaded");
                Decision::Route(id)
            }
            None => Decision::Reject(NO_SERVER.to_owned()),
        }
    }
}

ringmaster_policy_sdk::router::export!(PrefixAffinity);

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_policy_sdk::testing::server;

    fn pairs<T: Copy>(list: &[(&str, T)]) -> Vec<(String, T)> {
        list.iter().map(|(id, n)| ((*id).to_owned(), *n)).collect()
    }

    fn order(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| (*s).to_owned()).collect()
    }

    fn loaded(id: &str, in_flight: u32) -> Server {
        let mut s = server(id);
        s.in_flight = in_flight;
        s
    }

    /// A 1,000-token prompt of 10 prefix hashes.
    fn facts(matches: &[(&str, u32)], backlogs: &[(&str, u64)], ring: &[&str]) -> Facts {
        Facts {
            prompt_tokens: 1000,
            prefix_hashes: 10,
            matches: pairs(matches),
            backlogs: pairs(backlogs),
            ring_order: order(ring),
        }
    }

    #[test]
    fn settings_follow_the_hosts_guard() {
        let empty: [(&str, &str); 0] = [];
        assert_eq!(Settings::from_config(&empty[..]), Ok(Settings::default()));
        let host = [("host.bounded_load", "host"), ("host.load_factor", "2")];
        let under_host = Settings::from_config(&host[..]).unwrap();
        assert_eq!((under_host.load_factor, under_host.slack), (2.0, 2));
        let alone = [("host.bounded_load", "policy"), ("load_factor", "1.5")];
        assert_eq!(Settings::from_config(&alone[..]).unwrap().load_factor, 1.5);
        assert!(Settings::from_config(&[("slack", "-1")][..]).is_err());
        assert!(Settings::from_config(&[("load_factor", "0.5")][..]).is_err());
        assert!(Settings::from_config(&[("cache_weight", "-1")][..]).is_err());
    }

    #[test]
    fn a_prefix_every_server_holds_decides_nothing() {
        let servers = [server("a"), server("b"), server("c")];
        // Everyone holds the same system prompt: the ring order breaks the tie.
        let f = facts(&[("a", 2), ("b", 2), ("c", 2)], &[], &["c", "a", "b"]);
        let choice = choose(&Settings::default(), &servers, &f);
        assert_eq!(choice, Some(Choice::LeastLoaded("c".into())));
        // b holds more: it computes less.
        let f = facts(&[("a", 2), ("b", 6), ("c", 2)], &[], &["c", "a", "b"]);
        let choice = choose(&Settings::default(), &servers, &f);
        assert_eq!(choice, Some(Choice::Cache("b".into())));
    }

    #[test]
    fn the_queue_of_prefill_work_outweighs_a_small_saving() {
        let servers = [server("a"), server("b")];
        let own_time = Settings {
            cache_weight: 1.0,
            ..Settings::default()
        };
        // a holds 60 % (600 tokens saved) but has 2,000 tokens queued: b starts sooner.
        let f = facts(&[("a", 6)], &[("a", 2000)], &["a", "b"]);
        assert_eq!(
            choose(&own_time, &servers, &f),
            Some(Choice::LeastLoaded("b".into()))
        );
        // At the default weight the 600 cached tokens count as 9,600: a keeps it.
        assert_eq!(
            choose(&Settings::default(), &servers, &f),
            Some(Choice::Cache("a".into()))
        );
        // 20,000 queued outweigh that too.
        let f = facts(&[("a", 6)], &[("a", 20_000)], &["a", "b"]);
        assert_eq!(
            choose(&Settings::default(), &servers, &f),
            Some(Choice::LeastLoaded("b".into()))
        );
        // With 300 queued, a's cache wins even at weight 1.
        let f = facts(&[("a", 6)], &[("a", 300)], &["b", "a"]);
        assert_eq!(
            choose(&own_time, &servers, &f),
            Some(Choice::Cache("a".into()))
        );
        // A cache weight of 0 ignores caches: the empty queue wins.
        let blind = Settings {
            cache_weight: 0.0,
            ..Settings::default()
        };
        assert_eq!(
            choose(&blind, &servers, &f),
            Some(Choice::LeastLoaded("b".into()))
        );
    }

    #[test]
    fn the_cap_has_slack_and_a_full_server_is_passed_over() {
        // 4 in flight on 2 servers: cap = ceil(1.25 × 5 / 2) + 2 = 6.
        let servers = [loaded("a", 4), loaded("b", 0)];
        let f = facts(&[("a", 8)], &[], &["b", "a"]);
        assert_eq!(
            choose(&Settings::default(), &servers, &f),
            Some(Choice::Cache("a".into()))
        );
        let servers = [loaded("a", 8), loaded("b", 0)];
        // cap = ceil(1.25 × 9 / 2) + 2 = 8: a is full, b takes it.
        assert_eq!(
            choose(&Settings::default(), &servers, &f),
            Some(Choice::LeastLoaded("b".into()))
        );
    }

    #[test]
    fn unhealthy_servers_are_never_chosen() {
        let mut down = server("a");
        down.healthy = false;
        let servers = [down, server("b")];
        let f = facts(&[("a", 10)], &[], &["a", "b"]);
        assert_eq!(
            choose(&Settings::default(), &servers, &f),
            Some(Choice::LeastLoaded("b".into()))
        );
        assert_eq!(choose(&Settings::default(), &[], &f), None);
    }
}
