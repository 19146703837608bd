//! A pair router after NVIDIA Dynamo's disaggregated routing (ai-dynamo/dynamo
//! `docs/components/router/router-disaggregated-serving.md`): the prefill server by the KV
//! router's cost, the decode server by load alone (Dynamo routes decode with `overlap_score_credit
//! = 0`), and conditional disaggregation by `isl_bounding`.
//!
//! - **Decode server**: the fewest requests in flight (then waiting, then the key's ring
//!   order).
//! - **Prefill locally?** Dynamo's `isl_bounding`: the decode server prefills the request
//!   itself when its effective input length (the prompt tokens it would compute) is under
//!   `eff_isl_threshold` **and** under `eff_isl_ratio` of the raw input length; otherwise the
//!   request is split.
//! - **Prefill server**: the least cost by the KV router's cost function
//!   (`docs/components/router/router-design.md`): `kv_overlap_score_weight` × the prompt
//!   tokens it would compute (its new prefill blocks) plus the prompt tokens queued on it (its
//!   active blocks); ties to the lower id. Overlap alone would send every prompt sharing a
//!   system prompt to one prefill server.
//!
//! Configuration (all optional):
//!
//! | key | default | meaning |
//! | --- | --- | --- |
//! | `eff_isl_threshold` | 2048 | `--router-conditional-disagg-eff-isl-threshold` |
//! | `eff_isl_ratio` | 0.7 | the share of the raw input length under which it stays local |
//! | `kv_overlap_score_weight` | 1.0 | `--kv-overlap-score-weight`: prefill cost against load |

use ringmaster_policy_sdk::ConfigError;
use ringmaster_policy_sdk::config::{ConfigSource, HostConfig, OrTrap, get_f64_in, get_u32};
use ringmaster_policy_sdk::decide::{
    backlog, dynamo_prefills_locally, healthy, matched, ring_rank, uncached_tokens,
};
use ringmaster_policy_sdk::host::{self, cluster, ring};
use ringmaster_policy_sdk::router::{Decision, Guest};
use ringmaster_policy_sdk::types::{Pair, Request, Role, Server};

/// The reason given when no server can take the request.
pub const NO_SERVER: &str = "no healthy GPU server";

/// The policy's configuration, validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Effective input lengths under this stay on the decode server (with the ratio).
    pub eff_isl_threshold: u32,
    /// And under this share of the raw input length.
    pub eff_isl_ratio: f64,
    /// The weight of the tokens a prefill server would compute against those queued there.
    pub kv_overlap_score_weight: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            eff_isl_threshold: 2048,
            eff_isl_ratio: 0.7,
            kv_overlap_score_weight: 1.0,
        }
    }
}

impl Settings {
    /// Reads the settings from `source`, defaults for the keys that are not set.
    pub fn from_config(source: &(impl ConfigSource + ?Sized)) -> Result<Self, ConfigError> {
        let d = Self::default();
        Ok(Self {
            eff_isl_threshold: get_u32(source, "eff_isl_threshold", d.eff_isl_threshold)?,
            eff_isl_ratio: get_f64_in(source, "eff_isl_ratio", d.eff_isl_ratio, 0.0, 1.0)?,
            kv_overlap_score_weight: get_f64_in(
                source,
                "kv_overlap_score_weight",
                d.kv_overlap_score_weight,
                0.0,
                100.0,
            )?,
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
    let decode = healthy(servers).min_by(|a, b| {
        a.in_flight
            .cmp(&b.in_flight)
            .then(a.waiting.cmp(&b.waiting))
            .then(ring_rank(&facts.ring_order, &a.id).cmp(&ring_rank(&facts.ring_order, &b.id)))
    })?;
    let effective = uncached_tokens(
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
    if dynamo_prefills_locally(
        effective,
        facts.prompt_tokens,
        u64::from(settings.eff_isl_threshold),
        settings.eff_isl_ratio,
    ) {
        return Some(whole(format!(
            "isl_bounding keeps it local: effective {effective} of {} tokens",
            facts.prompt_tokens
        )));
    }
    let cost = |s: &Server| {
        let to_compute = uncached_tokens(
            facts.prompt_tokens,
            matched(&facts.matches, &s.id),
            facts.prefix_hashes,
        );
        settings.kv_overlap_score_weight * to_compute as f64
            + backlog(&facts.backlogs, &s.id) as f64
    };
    let prefill = healthy(prefill).min_by(|a, b| cost(a).total_cmp(&cost(b)).then(a.id.cmp(&b.id)));
    match prefill {
        Some(p) => Some(Pair {
            decode: decode.id.clone(),
            prefill: Some(p.id.clone()),
            reason: format!(
                "effective input {effective} of {} tokens: disaggregated",
                facts.prompt_tokens
            ),
        }),
        None => Some(whole("no healthy prefill server".to_owned())),
    }
}

/// The component's export.
#[derive(Debug)]
pub struct PairDynamo;

impl Guest for PairDynamo {
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
            Some(pair) => Decision::Pair(pair),
            None => Decision::Reject(NO_SERVER.to_owned()),
        }
    }
}

ringmaster_policy_sdk::router::export!(PairDynamo);

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_policy_sdk::testing::{ServerBuilder, server};

    fn facts(prompt_tokens: u32, matches: &[(&str, u32)]) -> Facts {
        Facts {
            prompt_tokens,
            prefix_hashes: 10,
            matches: matches.iter().map(|(s, n)| ((*s).to_owned(), *n)).collect(),
            backlogs: vec![("p0".into(), 500)],
            ring_order: Vec::new(),
        }
    }

    #[test]
    fn decode_by_load_prefill_by_cost_and_isl_bounding_between() {
        let servers = [
            server("d0").role(Role::Decode).in_flight(3),
            server("d1").role(Role::Decode).in_flight(1),
        ];
        let prefill = [
            server("p0").role(Role::Prefill),
            server("p1").role(Role::Prefill),
        ];
        // 10,000 tokens, nothing cached on d1: split, to p1 (6,000 to compute against p0's
        // 10,000 plus 500 queued).
        let pair = choose(
            &Settings::default(),
            (&servers, &prefill),
            &facts(10_000, &[("p1", 4), ("d0", 10)]),
        )
        .unwrap();
        assert_eq!(
            pair.decode, "d1",
            "by load: d0 holding it all does not count"
        );
        assert_eq!(pair.prefill.as_deref(), Some("p1"));
        // d1 holds 9 of 10 hashes: effective 1,000 < 2,048 and < 0.7 × 10,000: local.
        let pair = choose(
            &Settings::default(),
            (&servers, &prefill),
            &facts(10_000, &[("d1", 9)]),
        )
        .unwrap();
        assert_eq!(pair.prefill, None, "{}", pair.reason);
        // A short prompt never cached: effective = raw, over 0.7 of it: split.
        let pair = choose(&Settings::default(), (&servers, &prefill), &facts(500, &[])).unwrap();
        assert_eq!(pair.prefill.as_deref(), Some("p1"), "p0 has a backlog");
    }

    #[test]
    fn a_shared_prefix_does_not_pile_every_prompt_on_one_prefill_server() {
        let servers = [server("d0").role(Role::Decode)];
        let prefill = [
            server("p0").role(Role::Prefill),
            server("p1").role(Role::Prefill),
        ];
        // p0 holds the shared system prompt (2 of 10 hashes) but has 20,000 tokens queued:
        // 8,000 + 20,000 against p1's 10,000.
        let facts = Facts {
            prompt_tokens: 10_000,
            prefix_hashes: 10,
            matches: vec![("p0".into(), 2)],
            backlogs: vec![("p0".into(), 20_000)],
            ring_order: Vec::new(),
        };
        let pair = choose(&Settings::default(), (&servers, &prefill), &facts).unwrap();
        assert_eq!(pair.prefill.as_deref(), Some("p1"), "{}", pair.reason);
        // With no queue, the overlap wins.
        let idle = Facts {
            backlogs: Vec::new(),
            ..facts
        };
        let pair = choose(&Settings::default(), (&servers, &prefill), &idle).unwrap();
        assert_eq!(pair.prefill.as_deref(), Some("p0"), "{}", pair.reason);
    }
}
