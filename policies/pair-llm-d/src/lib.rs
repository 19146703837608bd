//! A pair router after llm-d's disaggregation profile handler (llm-d-router
//! `pkg/epp/framework/plugins/scheduling/profilehandler/disagg`, `deploy/config/pd-epp-config.yaml`):
//! the **decode** profile first, then the **decider**, then the **prefill** profile.
//!
//! - Each profile scores its servers with llm-d's sample weights: the prefix-cache scorer
//!   (the share of the prompt's prefix hashes a server holds) × 2 plus the queue scorer (its
//!   waiting requests, scaled so the shortest queue scores 1 and the longest 0) × 1; the best
//!   score wins, ties to the key's ring order, then the lower id.
//! - The `prefix-based-pd-decider`: split when the decode server would compute at least
//!   `non_cached_tokens` of the prompt and the prompt has at least `prompt_tokens` tokens
//!   (llm-d's defaults are 0, off; its sample config sets 16).
//!
//! Configuration (all optional):
//!
//! | key | default | meaning |
//! | --- | --- | --- |
//! | `non_cached_tokens` | 16 | split when the decode server would compute at least this many |
//! | `prompt_tokens` | 0 | and the prompt has at least this many |
//! | `prefix_weight` | 2 | the prefix-cache scorer's weight |
//! | `queue_weight` | 1 | the queue scorer's weight |

use ringmaster_policy_sdk::ConfigError;
use ringmaster_policy_sdk::config::{ConfigSource, HostConfig, OrTrap, get_f64_in, get_u32};
use ringmaster_policy_sdk::decide::{
    coverage, healthy, llm_d_splits, matched, ring_rank, uncached_tokens,
};
use ringmaster_policy_sdk::host::{self, cluster, ring};
use ringmaster_policy_sdk::router::{Decision, Guest};
use ringmaster_policy_sdk::types::{Pair, Request, Role, Server};

/// The reason given when no server can take the request.
pub const NO_SERVER: &str = "no healthy GPU server";

/// The policy's configuration, validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Split when the decode server would compute at least this many prompt tokens.
    pub non_cached_tokens: u32,
    /// And the prompt has at least this many.
    pub prompt_tokens: u32,
    /// The prefix-cache scorer's weight.
    pub prefix_weight: f64,
    /// The queue scorer's weight.
    pub queue_weight: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            non_cached_tokens: 16,
            prompt_tokens: 0,
            prefix_weight: 2.0,
            queue_weight: 1.0,
        }
    }
}

impl Settings {
    /// Reads the settings from `source`, defaults for the keys that are not set.
    pub fn from_config(source: &(impl ConfigSource + ?Sized)) -> Result<Self, ConfigError> {
        let d = Self::default();
        Ok(Self {
            non_cached_tokens: get_u32(source, "non_cached_tokens", d.non_cached_tokens)?,
            prompt_tokens: get_u32(source, "prompt_tokens", d.prompt_tokens)?,
            prefix_weight: get_f64_in(source, "prefix_weight", d.prefix_weight, 0.0, 100.0)?,
            queue_weight: get_f64_in(source, "queue_weight", d.queue_weight, 0.0, 100.0)?,
        })
    }

    /// The best of `servers` by the weighted scores, for a prompt of `total` prefix hashes.
    fn best<'a>(
        &self,
        servers: &'a [Server],
        (matches, total): (&[(String, u32)], usize),
        order: &[String],
    ) -> Option<&'a Server> {
        let candidates: Vec<&Server> = healthy(servers).collect();
        let (lo, hi) = candidates.iter().fold((u32::MAX, 0), |(lo, hi), s| {
            (lo.min(s.waiting), hi.max(s.waiting))
        });
        let queue = |s: &Server| {
            if hi > lo {
                1.0 - f64::from(s.waiting - lo) / f64::from(hi - lo)
            } else {
                1.0
            }
        };
        let score = |s: &Server| {
            self.prefix_weight * coverage(matched(matches, &s.id), total)
                + self.queue_weight * queue(s)
        };
        candidates.into_iter().min_by(|a, b| {
            score(b)
                .total_cmp(&score(a))
                .then(ring_rank(order, &a.id).cmp(&ring_rank(order, &b.id)))
                .then(a.id.cmp(&b.id))
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
    /// The key's servers in ring order.
    pub ring_order: Vec<String>,
}

/// Decides the pair for a request: `None` with no healthy server.
pub fn choose(
    settings: &Settings,
    (servers, prefill): (&[Server], &[Server]),
    facts: &Facts,
) -> Option<Pair> {
    let prompt = (facts.matches.as_slice(), facts.prefix_hashes);
    let decode = settings.best(servers, prompt, &facts.ring_order)?;
    let on_decode = uncached_tokens(
        facts.prompt_tokens,
        matched(&facts.matches, &decode.id),
        facts.prefix_hashes,
    );
    let whole = |reason: String| Pair {
        decode: decode.id.clone(),
        prefill: None,
        reason,
    };
    if decode.role != Role::Decode {
        return Some(whole(format!("{} takes whole requests", decode.id)));
    }
    if !llm_d_splits(
        on_decode,
        facts.prompt_tokens,
        u64::from(settings.non_cached_tokens),
        settings.prompt_tokens,
    ) {
        return Some(whole(format!(
            "the decider keeps it on {}: {on_decode} uncached tokens",
            decode.id
        )));
    }
    match settings.best(prefill, prompt, &facts.ring_order) {
        Some(p) => Some(Pair {
            decode: decode.id.clone(),
            prefill: Some(p.id.clone()),
            reason: format!(
                "the decider splits it: {on_decode} uncached tokens on {}",
                decode.id
            ),
        }),
        None => Some(whole("no healthy prefill server".to_owned())),
    }
}

/// The component's export.
#[derive(Debug)]
pub struct PairLlmD;

impl Guest for PairLlmD {
    fn route(req: &Request) -> Decision {
        static SETTINGS: std::sync::OnceLock<Settings> = std::sync::OnceLock::new();
        let settings = *SETTINGS.get_or_init(|| Settings::from_config(&HostConfig).or_trap());
        let servers = cluster::servers();
        let prefill = cluster::prefill_servers();
        let facts = Facts {
            prompt_tokens: req.prompt_tokens(),
            prefix_hashes: req.prefix_hash_count() as usize,
            matches: host::prefix_matches_for(req.prefix_hash_count()),
            ring_order: ring::candidates(req.routing_key(), servers.len() as u32),
        };
        match choose(&settings, (&servers, &prefill), &facts) {
            Some(pair) => Decision::Pair(pair),
            None => Decision::Reject(NO_SERVER.to_owned()),
        }
    }
}

ringmaster_policy_sdk::router::export!(PairLlmD);

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_policy_sdk::testing::{ServerBuilder, server};

    fn facts(matches: &[(&str, u32)]) -> Facts {
        Facts {
            prompt_tokens: 1000,
            prefix_hashes: 10,
            matches: matches.iter().map(|(s, n)| ((*s).to_owned(), *n)).collect(),
            ring_order: Vec::new(),
        }
    }

    #[test]
    fn decode_first_by_prefix_and_queue_then_the_decider_then_prefill() {
        let servers = [
            server("d0").role(Role::Decode).waiting(4),
            server("d1").role(Role::Decode),
        ];
        let prefill = [
            server("p0").role(Role::Prefill),
            server("p1").role(Role::Prefill),
        ];
        // d0 holds the whole prompt: 2 × 1.0 + 0 beats d1's 0 + 1; nothing to split.
        let pair = choose(
            &Settings::default(),
            (&servers, &prefill),
            &facts(&[("d0", 10), ("p1", 3)]),
        )
        .unwrap();
        assert_eq!((pair.decode.as_str(), pair.prefill), ("d0", None));
        // Nobody holds it: the shorter queue decodes, the prefill server holding most
        // prefills.
        let pair = choose(
            &Settings::default(),
            (&servers, &prefill),
            &facts(&[("p1", 3)]),
        )
        .unwrap();
        assert_eq!(pair.decode, "d1");
        assert_eq!(pair.prefill.as_deref(), Some("p1"));
        // Under the prompt bound: whole.
        let short = Settings {
            prompt_tokens: 2000,
            ..Settings::default()
        };
        let pair = choose(&short, (&servers, &prefill), &facts(&[])).unwrap();
        assert_eq!(pair.prefill, None);
    }

    #[test]
    fn the_configuration_is_checked() {
        assert!(Settings::from_config(&[("prefix_weight", "-1")][..]).is_err());
        let set = Settings::from_config(&[("non_cached_tokens", "0")][..]).unwrap();
        assert_eq!(set.non_cached_tokens, 0);
    }
}
