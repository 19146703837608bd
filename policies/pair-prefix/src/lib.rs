//! The gateway's own pair rule as a router: decode first, by prefix and load; split only when
//! it pays; prefill by least work.
//!
//! For each request:
//!
//! 1. **Decode server.** Among the servers a request may be routed to, the one that would
//!    begin answering soonest: its prefill backlog plus the prompt tokens it would compute
//!    (less what its cache holds), ties to fewer in flight, then the key's ring order.
//! 2. **Worth splitting?** Only a decode server (`role = decode`) takes a prefill server's
//!    KV cache. It is split when the decode server would compute at least
//!    `min_uncached_tokens` of the prompt itself (fewer: it holds most of it, and a transfer
//!    would only add time) and, unless `when_prefill_busy = "wait"`, some prefill server has
//!    no more prefill work ahead than the decode server would doing the prompt (Dynamo's
//!    `prefill_load` rule).
//! 3. **Prefill server.** The one with the least prefill work ahead for this prompt: its
//!    backlog plus the tokens it does not hold.
//!
//! It answers `pair`, with the reason, every time: whole on the decode server, or split.
//!
//! Configuration (all optional):
//!
//! | key | default | meaning |
//! | --- | --- | --- |
//! | `min_uncached_tokens` | 256 | split only when the decode server would compute this many |
//! | `when_prefill_busy` | `decode` | `wait`: split even when every prefill server is busier |
//!
//! A malformed value is logged and traps, so a new configuration with one never goes live.

use ringmaster_policy_sdk::ConfigError;
use ringmaster_policy_sdk::config::{ConfigSource, HostConfig, OrTrap, get_string, get_u32};
use ringmaster_policy_sdk::decide::{
    backlog, least_prefill_work, matched, ring_rank, uncached_tokens, worth_splitting,
};
use ringmaster_policy_sdk::host::{self, cluster, ring};
use ringmaster_policy_sdk::router::{Decision, Guest};
use ringmaster_policy_sdk::types::{Pair, Request, Role, Server};

/// The reason given when no server can take the request.
pub const NO_SERVER: &str = "no healthy GPU server";

/// The policy's configuration, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Split only when the decode server would compute this many prompt tokens.
    pub min_uncached_tokens: u32,
    /// Split even when every prefill server has more work ahead than the decode server.
    pub wait_for_busy_prefill: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            min_uncached_tokens: 256,
            wait_for_busy_prefill: false,
        }
    }
}

impl Settings {
    /// Reads the settings from `source`, defaults for the keys that are not set.
    pub fn from_config(source: &(impl ConfigSource + ?Sized)) -> Result<Self, ConfigError> {
        let d = Self::default();
        let busy = get_string(source, "when_prefill_busy", "decode");
        let wait_for_busy_prefill = match busy.as_str() {
            "decode" => false,
            "wait" => true,
            other => {
                return Err(ConfigError::new(
                    "when_prefill_busy",
                    other,
                    "\"decode\" or \"wait\"",
                ));
            }
        };
        Ok(Self {
            min_uncached_tokens: get_u32(source, "min_uncached_tokens", d.min_uncached_tokens)?,
            wait_for_busy_prefill,
        })
    }
}

/// What the host told the policy about one request.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// Estimated prompt tokens.
    pub prompt_tokens: u32,
    /// Prefix hashes.
    pub prefix_hashes: usize,
    /// `cluster.prefix-matches` (prefill servers too).
    pub matches: Vec<(String, u32)>,
    /// `cluster.prefill-backlog` (prefill servers too).
    pub backlogs: Vec<(String, u64)>,
    /// The key's servers in ring order.
    pub ring_order: Vec<String>,
}

/// Decides the pair for a request: `None` with no healthy server.
pub fn choose(
    settings: &Settings,
    (servers, prefill): (&[Server], &[Server]),
    facts: &Facts,
) -> Option<Pair> {
    let uncached = |s: &Server| {
        uncached_tokens(
            facts.prompt_tokens,
            matched(&facts.matches, &s.id),
            facts.prefix_hashes,
        )
    };
    let rank = |s: &Server| ring_rank(&facts.ring_order, &s.id);
    let decode = servers.iter().filter(|s| s.healthy).min_by(|a, b| {
        let cost = |s: &Server| backlog(&facts.backlogs, &s.id).saturating_add(uncached(s));
        cost(a)
            .cmp(&cost(b))
            .then(a.in_flight.cmp(&b.in_flight))
            .then(rank(a).cmp(&rank(b)))
    })?;
    let whole = |reason: String| Pair {
        decode: decode.id.clone(),
        prefill: None,
        reason,
    };
    if decode.role != Role::Decode {
        return Some(whole(format!("{} takes whole requests", decode.id)));
    }
    let on_decode = uncached(decode);
    let Some((prefill, work, _)) = least_prefill_work(
        prefill,
        (&facts.matches, &facts.backlogs),
        facts.prompt_tokens,
        facts.prefix_hashes,
    ) else {
        return Some(whole("no healthy prefill server".to_owned()));
    };
    let decode_backlog = backlog(&facts.backlogs, &decode.id);
    if !worth_splitting(
        on_decode,
        (decode_backlog, work),
        u64::from(settings.min_uncached_tokens),
        settings.wait_for_busy_prefill,
    ) {
        return Some(whole(format!(
            "{} computes {on_decode} prompt tokens itself (prefill servers: {work} ahead)",
            decode.id
        )));
    }
    Some(Pair {
        decode: decode.id.clone(),
        prefill: Some(prefill.id.clone()),
        reason: format!(
            "{} would compute {on_decode} prompt tokens; {} has {work} ahead",
            decode.id, prefill.id
        ),
    })
}

/// The component's export.
#[derive(Debug)]
pub struct PairPrefix;

impl Guest for PairPrefix {
    fn route(req: &Request) -> Decision {
        static SETTINGS: std::sync::OnceLock<Settings> = std::sync::OnceLock::new();
        let settings = *SETTINGS.get_or_init(|| Settings::from_config(&HostConfig).or_trap());
        let servers = cluster::servers();
        let prefill = cluster::prefill_servers();
        let facts = Facts {
            prompt_tokens: req.prompt_tokens(),
            prefix_hashes: req.prefix_hash_count() as usize,
            matches: host::prefix_matches_for(req.prefix_hash_count()),
            backlogs: cluster::prefill_backlog(),
            ring_order: ring::candidates(req.routing_key(), servers.len() as u32),
        };
        match choose(&settings, (&servers, &prefill), &facts) {
            Some(pair) => {
                host::count(if pair.prefill.is_some() {
                    "decision_split"
                } else {
                    "decision_whole"
                });
                Decision::Pair(pair)
            }
            None => Decision::Reject(NO_SERVER.to_owned()),
        }
    }
}

ringmaster_policy_sdk::router::export!(PairPrefix);

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_policy_sdk::testing::{ServerBuilder, server};

    fn fleet() -> (Vec<Server>, Vec<Server>) {
        (
            vec![
                server("d0").role(Role::Decode),
                server("d1").role(Role::Decode).in_flight(2),
            ],
            vec![
                server("p0").role(Role::Prefill),
                server("p1").role(Role::Prefill),
            ],
        )
    }

    fn facts(matches: &[(&str, u32)], backlogs: &[(&str, u64)]) -> Facts {
        Facts {
            prompt_tokens: 4000,
            prefix_hashes: 10,
            matches: matches.iter().map(|(s, n)| ((*s).to_owned(), *n)).collect(),
            backlogs: backlogs
                .iter()
                .map(|(s, n)| ((*s).to_owned(), *n))
                .collect(),
            ring_order: vec!["d1".into(), "d0".into()],
        }
    }

    #[test]
    fn a_long_prompt_is_split_to_the_prefill_server_that_holds_it() {
        let (servers, prefill) = fleet();
        let pair = choose(
            &Settings::default(),
            (&servers, &prefill),
            &facts(&[("p1", 5)], &[]),
        )
        .unwrap();
        assert_eq!(pair.decode, "d0", "least work, then fewer in flight");
        assert_eq!(pair.prefill.as_deref(), Some("p1"));
    }

    #[test]
    fn a_prompt_the_decode_server_holds_stays_whole() {
        let (servers, prefill) = fleet();
        let pair = choose(
            &Settings::default(),
            (&servers, &prefill),
            &facts(&[("d0", 10)], &[]),
        )
        .unwrap();
        assert_eq!((pair.decode.as_str(), pair.prefill), ("d0", None));
    }

    #[test]
    fn busy_prefill_servers_leave_the_prompt_to_the_decode_server_unless_told_to_wait() {
        let (servers, prefill) = fleet();
        let busy = facts(&[], &[("p0", 50_000), ("p1", 60_000)]);
        let pair = choose(&Settings::default(), (&servers, &prefill), &busy).unwrap();
        assert_eq!(pair.prefill, None, "{}", pair.reason);
        let wait = Settings {
            wait_for_busy_prefill: true,
            ..Settings::default()
        };
        let pair = choose(&wait, (&servers, &prefill), &busy).unwrap();
        assert_eq!(pair.prefill.as_deref(), Some("p0"));
    }

    #[test]
    fn whole_servers_and_no_prefill_servers_mean_whole() {
        let pair = choose(
            &Settings::default(),
            (&[server("w")], &[server("p").role(Role::Prefill)]),
            &facts(&[], &[]),
        )
        .unwrap();
        assert_eq!(pair.prefill, None);
        let (servers, _) = fleet();
        let pair = choose(&Settings::default(), (&servers, &[]), &facts(&[], &[])).unwrap();
        assert_eq!(pair.prefill, None);
        assert!(choose(&Settings::default(), (&[], &[]), &facts(&[], &[])).is_none());
    }

    #[test]
    fn the_configuration_is_checked() {
        let set = Settings::from_config(
            &[("min_uncached_tokens", "0"), ("when_prefill_busy", "wait")][..],
        )
        .unwrap();
        assert_eq!(
            set,
            Settings {
                min_uncached_tokens: 0,
                wait_for_busy_prefill: true
            }
        );
        assert!(Settings::from_config(&[("when_prefill_busy", "later")][..]).is_err());
    }
}
