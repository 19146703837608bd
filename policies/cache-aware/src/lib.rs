//! A cache-aware router: the longest cached prefix, balanced against load.
//!
//! For each request, in this order:
//!
//! 1. **Balance.** If the healthy servers' load is imbalanced (the busiest has more than
//!    `balance_abs_threshold` in-flight requests more than the idlest, *and* more than
//!    `balance_rel_threshold` times as many), the request goes to the least loaded server:
//!    reusing a cache is not worth a long queue.
//! 2. **Cache.** Else, if some healthy server is estimated to hold at least
//!    `cache_threshold` of the request's prefix hashes (`cluster.prefix-matches`), the request
//!    goes to the one holding the most (ties: fewer in-flight requests, then the lower id).
//! 3. **Ring.** Else the host's consistent-hash ring with bounded loads decides
//!    (`ring.lookup-bounded`), which places new prefixes stably; with no healthy server there
//!    the request is rejected.
//!
//! The design follows SGLang's cache-aware router (a prefix tree per worker there; the
//! host's prefix-hash estimate here). Each branch taken is counted (`decision_balance`,
//! `decision_cache`, `decision_ring`).
//!
//! Configuration (all optional):
//!
//! | key | default | meaning |
//! | --- | --- | --- |
//! | `cache_threshold` | 0.5 | fraction (0 to 1) of the prefix a server must hold to win on cache |
//! | `balance_abs_threshold` | 32 | in-flight difference above which load counts as imbalanced |
//! | `balance_rel_threshold` | 1.5 | ratio (≥ 1) above which load counts as imbalanced |
//!
//! A malformed value is logged and traps, so a new configuration with one never goes live.

use ringmaster_policy_sdk::ConfigError;
use ringmaster_policy_sdk::config::{ConfigSource, HostConfig, OrTrap, get_f64_in, get_u32};
use ringmaster_policy_sdk::decide::{
    best_prefix_match, coverage, least_in_flight, load_imbalanced,
};
use ringmaster_policy_sdk::host::{self, cluster, ring};
use ringmaster_policy_sdk::router::{Decision, Guest};
use ringmaster_policy_sdk::types::{Request, Server};

/// The reason given when no server can take the request.
pub const NO_SERVER: &str = "no healthy GPU server";

/// The policy's configuration, validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Fraction (0 to 1) of the request's prefix hashes the best server must hold.
    pub cache_threshold: f64,
    /// In-flight difference between the busiest and the idlest server above which the load
    /// counts as imbalanced.
    pub balance_abs_threshold: u32,
    /// Ratio between the busiest and the idlest server above which the load counts as
    /// imbalanced.
    pub balance_rel_threshold: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            cache_threshold: 0.5,
            balance_abs_threshold: 32,
            balance_rel_threshold: 1.5,
        }
    }
}

impl Settings {
    /// Reads the settings from `source`, defaults for the keys that are not set.
    pub fn from_config(source: &(impl ConfigSource + ?Sized)) -> Result<Self, ConfigError> {
        let d = Self::default();
        Ok(Self {
            cache_threshold: get_f64_in(source, "cache_threshold", d.cache_threshold, 0.0, 1.0)?,
            balance_abs_threshold: get_u32(
                source,
                "balance_abs_threshold",
                d.balance_abs_threshold,
            )?,
            balance_rel_threshold: get_f64_in(
                source,
                "balance_rel_threshold",
                d.balance_rel_threshold,
                1.0,
                f64::INFINITY,
            )?,
        })
    }
}

/// Where a request goes, before the ring is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// Load is imbalanced: the least loaded server.
    Balance(String),
    /// The server holding the longest prefix of the request.
    Cache(String),
    /// Neither: let the ring decide.
    Ring,
}

/// Decides for a request with `prefix_len` prefix hashes, given the servers and the host's
/// prefix-match estimate.
pub fn choose(
    settings: &Settings,
    prefix_len: usize,
    servers: &[Server],
    matches: &[(String, u32)],
) -> Choice {
    if load_imbalanced(
        servers,
        settings.balance_abs_threshold,
        settings.balance_rel_threshold,
    ) && let Some(server) = least_in_flight(servers)
    {
        return Choice::Balance(server.id.clone());
    }
    if let Some((server, matched)) = best_prefix_match(servers, matches)
        && coverage(matched, prefix_len) >= settings.cache_threshold
    {
        return Choice::Cache(server.id.clone());
    }
    Choice::Ring
}

/// The component's export.
#[derive(Debug)]
pub struct CacheAware;

impl Guest for CacheAware {
    fn route(req: &Request) -> Decision {
        let settings = Settings::from_config(&HostConfig).or_trap();
        let servers = cluster::servers();
        let matches = host::prefix_matches_for(req.prefix_hash_count());
        match choose(
            &settings,
            req.prefix_hash_count() as usize,
            &servers,
            &matches,
        ) {
            Choice::Balance(id) => {
                host::count("decision_balance");
                Decision::Route(id)
            }
            Choice::Cache(id) => {
                host::count("decision_cache");
                Decision::Route(id)
            }
            Choice::Ring => {
                host::count("decision_ring");
                match ring::lookup_bounded(req.routing_key()) {
                    Some(id) => Decision::Route(id),
                    None => Decision::Reject(NO_SERVER.to_owned()),
                }
            }
        }
    }
}

ringmaster_policy_sdk::router::export!(CacheAware);

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_policy_sdk::testing::{ServerBuilder, server};

    fn matches(list: &[(&str, u32)]) -> Vec<(String, u32)> {
        list.iter().map(|(id, n)| ((*id).to_owned(), *n)).collect()
    }

    #[test]
    fn defaults_match_the_documentation() {
        let empty: [(&str, &str); 0] = [];
        assert_eq!(Settings::from_config(&empty[..]), Ok(Settings::default()));
        assert_eq!(
            Settings::default(),
            Settings {
                cache_threshold: 0.5,
                balance_abs_threshold: 32,
                balance_rel_threshold: 1.5
            }
        );
    }

    #[test]
    fn settings_are_read_and_validated() {
        let cfg = [
            ("cache_threshold", "0.8"),
            ("balance_abs_threshold", "10"),
            ("balance_rel_threshold", "2"),
        ];
        assert_eq!(
            Settings::from_config(&cfg[..]),
            Ok(Settings {
                cache_threshold: 0.8,
                balance_abs_threshold: 10,
                balance_rel_threshold: 2.0
            })
        );
        for bad in [
            [("cache_threshold", "1.2")],
            [("cache_threshold", "half")],
            [("balance_abs_threshold", "-3")],
            [("balance_rel_threshold", "0.5")],
        ] {
            let err = Settings::from_config(&bad[..]).unwrap_err();
            assert_eq!(err.key(), bad[0].0);
        }
    }

    #[test]
    fn best_cached_prefix_wins_when_balanced() {
        let servers = [
            server("a").in_flight(4),
            server("b").in_flight(6),
            server("c"),
        ];
        let m = matches(&[("a", 2), ("b", 6)]);
        assert_eq!(
            choose(&Settings::default(), 8, &servers, &m),
            Choice::Cache("b".into())
        );
    }

    #[test]
    fn short_matches_fall_back_to_the_ring() {
        let servers = [server("a"), server("b")];
        // 3 of 8 is under the 0.5 threshold.
        let m = matches(&[("a", 3)]);
        assert_eq!(choose(&Settings::default(), 8, &servers, &m), Choice::Ring);
        // Exactly at the threshold is enough.
        let m = matches(&[("a", 4)]);
        assert_eq!(
            choose(&Settings::default(), 8, &servers, &m),
            Choice::Cache("a".into())
        );
        // No prefix, no matches: the ring.
        assert_eq!(choose(&Settings::default(), 0, &servers, &[]), Choice::Ring);
    }

    #[test]
    fn imbalance_overrides_the_cache() {
        let servers = [
            server("a").in_flight(80),
            server("b").in_flight(10),
            server("c").in_flight(12),
        ];
        let m = matches(&[("a", 8)]);
        assert_eq!(
            choose(&Settings::default(), 8, &servers, &m),
            Choice::Balance("b".into())
        );
    }

    #[test]
    fn a_large_but_proportionally_small_gap_is_balanced() {
        // 40 apart but 1.2x: the cache still wins.
        let servers = [server("a").in_flight(240), server("b").in_flight(200)];
        let m = matches(&[("a", 8)]);
        assert_eq!(
            choose(&Settings::default(), 8, &servers, &m),
            Choice::Cache("a".into())
        );
    }

    #[test]
    fn ties_on_the_prefix_go_to_the_less_loaded() {
        let servers = [server("a").in_flight(7), server("b").in_flight(3)];
        let m = matches(&[("a", 8), ("b", 8)]);
        assert_eq!(
            choose(&Settings::default(), 8, &servers, &m),
            Choice::Cache("b".into())
        );
    }

    #[test]
    fn unhealthy_servers_are_ignored() {
        let servers = [
            server("a").unhealthy().in_flight(0),
            server("b").in_flight(50),
            server("c").in_flight(60),
        ];
        // "a" is idle but not serving, so load looks balanced (50 vs 60) and "a"'s cache is
        // unusable.
        let m = matches(&[("a", 8), ("c", 5)]);
        assert_eq!(
            choose(&Settings::default(), 8, &servers, &m),
            Choice::Cache("c".into())
        );
        let none = [server("a").unhealthy()];
        assert_eq!(
            choose(&Settings::default(), 8, &none, &matches(&[("a", 8)])),
            Choice::Ring
        );
    }
}
