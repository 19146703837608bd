//! A prefix-cache router, after AIBrix's prefix-cache routing: the least loaded of the servers
//! holding enough of the prompt, unless the load is imbalanced.
//!
//! Written from AIBrix's published description of its algorithm (the gateway routing
//! algorithms' README, "Prefix Cache Aware": if the running requests of the busiest and the
//! idlest pod differ by more than an absolute count, default 8, the pod with the fewest
//! running requests; else the least loaded of the pods whose prefix match reaches a
//! threshold, default 50 %; else, again, the fewest running requests). No AIBrix code was
//! used. Here "running" is the requests in flight from this gateway, and the prefix match is
//! the host's `cluster.prefix-matches` as a fraction of the request's prefix hashes; only the
//! servers with the best such fraction are candidates. Ties: ring order. With no healthy
//! server the request is rejected. Branches are counted (`decision_imbalance`,
//! `decision_prefix`, `decision_least_loaded`).
//!
//! Configuration: `imbalance_abs_count` (8), `match_threshold` (0.5, a fraction).

use ringmaster_policy_sdk::ConfigError;
use ringmaster_policy_sdk::config::{ConfigSource, HostConfig, OrTrap, get_f64_in, get_u32};
use ringmaster_policy_sdk::decide::{coverage, in_flight_range, matched, ring_rank};
use ringmaster_policy_sdk::host::{self, cluster, ring};
use ringmaster_policy_sdk::router::{Decision, Guest};
use ringmaster_policy_sdk::types::{Request, Server};

/// The reason given when no server can take the request.
pub const NO_SERVER: &str = "no healthy GPU server";

/// The policy's configuration, validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// In-flight difference above which the load counts as imbalanced.
    pub imbalance_abs_count: u32,
    /// Fraction of the prompt's prefix hashes a server must hold to be a candidate.
    pub match_threshold: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            imbalance_abs_count: 8,
            match_threshold: 0.5,
        }
    }
}

impl Settings {
    /// Reads the settings from `source`, defaults for the keys that are not set.
    pub fn from_config(source: &(impl ConfigSource + ?Sized)) -> Result<Self, ConfigError> {
        let d = Self::default();
        Ok(Self {
            imbalance_abs_count: get_u32(source, "imbalance_abs_count", d.imbalance_abs_count)?,
            match_threshold: get_f64_in(source, "match_threshold", d.match_threshold, 0.0, 1.0)?,
        })
    }
}

/// Which branch decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Branch {
    /// The load was imbalanced.
    Imbalance,
    /// The least loaded server holding enough of the prompt.
    Prefix,
    /// Nobody held enough.
    LeastLoaded,
}

/// The server and the branch that chose it; `None` with no healthy server.
pub fn choose<'a>(
    settings: &Settings,
    servers: &'a [Server],
    matches: &[(String, u32)],
    prefix_len: usize,
    ring_order: &[String],
) -> Option<(&'a Server, Branch)> {
    let rank = |s: &Server| ring_rank(ring_order, &s.id);
    let least = |pool: &mut dyn Iterator<Item = &'a Server>| {
        pool.min_by(|a, b| a.in_flight.cmp(&b.in_flight).then(rank(a).cmp(&rank(b))))
    };
    let healthy = || servers.iter().filter(|s| s.healthy);
    let (lo, hi) = in_flight_range(servers)?;
    if hi - lo > settings.imbalance_abs_count {
        return least(&mut healthy()).map(|s| (s, Branch::Imbalance));
    }
    let fraction = |s: &Server| {
        let matched = matched(matches, &s.id);
        coverage(matched, prefix_len)
    };
    let best = healthy().map(fraction).fold(0.0, f64::max);
    if best > 0.0 && best >= settings.match_threshold {
        let mut candidates = healthy().filter(|s| fraction(s) >= best);
        if let Some(server) = least(&mut candidates) {
            return Some((server, Branch::Prefix));
        }
    }
    least(&mut healthy()).map(|s| (s, Branch::LeastLoaded))
}

/// The component's export.
#[derive(Debug)]
pub struct PrefixCache;

impl Guest for PrefixCache {
    fn route(req: &Request) -> Decision {
        let settings = Settings::from_config(&HostConfig).or_trap();
        let servers = cluster::servers();
        let matches = host::prefix_matches_for(req.prefix_hash_count());
        let order = ring::candidates(req.routing_key(), servers.len() as u32);
        match choose(
            &settings,
            &servers,
            &matches,
            req.prefix_hash_count() as usize,
            &order,
        ) {
            Some((server, branch)) => {
                host::count(match branch {
                    Branch::Imbalance => "decision_imbalance",
                    Branch::Prefix => "decision_prefix",
                    Branch::LeastLoaded => "decision_least_loaded",
                });
                Decision::Route(server.id.clone())
            }
            None => Decision::Reject(NO_SERVER.to_owned()),
        }
    }
}

ringmaster_policy_sdk::router::export!(PrefixCache);

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_policy_sdk::testing::server;

    fn loaded(id: &str, in_flight: u32) -> Server {
        let mut s = server(id);
        s.in_flight = in_flight;
        s
    }

    fn order(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_least_loaded_holder_of_enough_prefix_wins() {
        let servers = [loaded("a", 3), loaded("b", 1), loaded("c", 0)];
        let m = vec![
            ("a".to_owned(), 8),
            ("b".to_owned(), 8),
            ("c".to_owned(), 2),
        ];
        let (pick, branch) = choose(
            &Settings::default(),
            &servers,
            &m,
            10,
            &order(&["a", "b", "c"]),
        )
        .unwrap();
        assert_eq!((pick.id.as_str(), branch), ("b", Branch::Prefix));
        // Under the threshold: the least loaded.
        let m = vec![("a".to_owned(), 4)];
        let (pick, branch) = choose(
            &Settings::default(),
            &servers,
            &m,
            10,
            &order(&["a", "b", "c"]),
        )
        .unwrap();
        assert_eq!((pick.id.as_str(), branch), ("c", Branch::LeastLoaded));
    }

    #[test]
    fn imbalance_overrides_the_cache() {
        let servers = [loaded("a", 12), loaded("b", 3)];
        let m = vec![("a".to_owned(), 10)];
        let (pick, branch) =
            choose(&Settings::default(), &servers, &m, 10, &order(&["a", "b"])).unwrap();
        assert_eq!((pick.id.as_str(), branch), ("b", Branch::Imbalance));
        assert!(choose(&Settings::default(), &[], &m, 10, &[]).is_none());
        assert!(Settings::from_config(&[("match_threshold", "2")][..]).is_err());
    }
}
