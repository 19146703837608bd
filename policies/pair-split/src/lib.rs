//! A pair router with separate prefill and decode policies, as SMG (`--prefill-policy`,
//! `--decode-policy`: smg `model_gateway/src/routers/http/pd_router.rs`) and vllm-router
//! (`docs/model-routing/pd-disaggregation.md`) configure them: each leg's server is chosen
//! on its own, and every request is split unless the decode server would compute fewer than
//! `min_uncached_tokens` of it (vllm-router's `pd_uncached_token_threshold`; 0, SMG's
//! behaviour, splits every request).
//!
//! - `prefill_policy`: `cache_aware` (the default, as the docs recommend: the prefill server
//!   holding the longest prefix; while the prefill servers' loads are imbalanced, as SGLang's
//!   cache-aware router judges it, the least loaded) or `least_loaded`.
//! - `decode_policy`: `power_of_two` (the default: of two servers drawn by the routing key,
//!   the one with fewer in flight) or `least_loaded`.
//!
//! Configuration (all optional): `prefill_policy`, `decode_policy`, `min_uncached_tokens`
//! (default 0), `balance_abs_threshold` (32) and `balance_rel_threshold` (1.5) for
//! `cache_aware`.

use ringmaster_policy_sdk::ConfigError;
use ringmaster_policy_sdk::config::{
    ConfigSource, HostConfig, OrTrap, get_f64_in, get_string, get_u32,
};
use ringmaster_policy_sdk::decide::{
    best_prefix_match, least_in_flight, load_imbalanced, matched, power_of_two, uncached_tokens,
};
use ringmaster_policy_sdk::host::{self, cluster};
use ringmaster_policy_sdk::router::{Decision, Guest};
use ringmaster_policy_sdk::types::{Pair, Request, Role, Server};

/// The reason given when no server can take the request.
pub const NO_SERVER: &str = "no healthy GPU server";

/// How the prefill server is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillPolicy {
    /// The longest prefix held, unless the loads are imbalanced.
    CacheAware,
    /// The fewest in flight.
    LeastLoaded,
}

/// How the decode server is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodePolicy {
    /// The less loaded of two drawn by the routing key.
    PowerOfTwo,
    /// The fewest in flight.
    LeastLoaded,
}

/// The policy's configuration, validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// The prefill leg's policy.
    pub prefill: PrefillPolicy,
    /// The decode leg's policy.
    pub decode: DecodePolicy,
    /// Requests the decode server would compute fewer prompt tokens of stay whole there.
    pub min_uncached_tokens: u32,
    /// `cache_aware`'s imbalance: more in flight than this over the least loaded …
    pub balance_abs_threshold: u32,
    /// … and more than this times as many.
    pub balance_rel_threshold: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            prefill: PrefillPolicy::CacheAware,
            decode: DecodePolicy::PowerOfTwo,
            min_uncached_tokens: 0,
            balance_abs_threshold: 32,
            balance_rel_threshold: 1.5,
        }
    }
}

impl Settings {
    /// Reads the settings from `source`, defaults for the keys that are not set.
    pub fn from_config(source: &(impl ConfigSource + ?Sized)) -> Result<Self, ConfigError> {
        let d = Self::default();
        let prefill = match get_string(source, "prefill_policy", "cache_aware").as_str() {
            "cache_aware" => PrefillPolicy::CacheAware,
            "least_loaded" => PrefillPolicy::LeastLoaded,
            other => {
                return Err(ConfigError::new(
                    "prefill_policy",
                    other,
                    "\"cache_aware\" or \"least_loaded\"",
                ));
            }
        };
        let decode = match get_string(source, "decode_policy", "power_of_two").as_str() {
            "power_of_two" => DecodePolicy::PowerOfTwo,
            "least_loaded" => DecodePolicy::LeastLoaded,
            other => {
                return Err(ConfigError::new(
                    "decode_policy",
                    other,
                    "\"power_of_two\" or \"least_loaded\"",
                ));
            }
        };
        Ok(Self {
            prefill,
            decode,
            min_uncached_tokens: get_u32(source, "min_uncached_tokens", d.min_uncached_tokens)?,
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
                1000.0,
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
    /// The request's routing key (the power of two's draw).
    pub routing_key: u64,
}

/// Decides the pair for a request: `None` with no healthy server.
pub fn choose(
    settings: &Settings,
    (servers, prefill): (&[Server], &[Server]),
    facts: &Facts,
) -> Option<Pair> {
    let decode = match settings.decode {
        DecodePolicy::PowerOfTwo => power_of_two(servers, facts.routing_key),
        DecodePolicy::LeastLoaded => least_in_flight(servers),
    }?;
    let whole = |reason: String| Pair {
        decode: decode.id.clone(),
        prefill: None,
        reason,
    };
    if decode.role != Role::Decode {
        return Some(whole(format!("{} takes whole requests", decode.id)));
    }
    let on_decode = uncached_tokens(
        facts.prompt_tokens,
        matched(&facts.matches, &decode.id),
        facts.prefix_hashes,
    );
    if on_decode < u64::from(settings.min_uncached_tokens) {
        return Some(whole(format!(
            "{on_decode} uncached tokens on {}: under the threshold",
            decode.id
        )));
    }
    let chosen = match settings.prefill {
        PrefillPolicy::CacheAware
            if !load_imbalanced(
                prefill,
                settings.balance_abs_threshold,
                settings.balance_rel_threshold,
            ) =>
        {
            best_prefix_match(prefill, &facts.matches)
                .map(|(server, _)| server)
                .or_else(|| least_in_flight(prefill))
        }
        _ => least_in_flight(prefill),
    };
    match chosen {
        Some(p) => Some(Pair {
            decode: decode.id.clone(),
            prefill: Some(p.id.clone()),
            reason: "prefill and decode chosen apart".to_owned(),
        }),
        None => Some(whole("no healthy prefill server".to_owned())),
    }
}

/// The component's export.
#[derive(Debug)]
pub struct PairSplit;

impl Guest for PairSplit {
    fn route(req: &Request) -> Decision {
        static SETTINGS: std::sync::OnceLock<Settings> = std::sync::OnceLock::new();
        let settings = *SETTINGS.get_or_init(|| Settings::from_config(&HostConfig).or_trap());
        let servers = cluster::servers();
        let prefill = cluster::prefill_servers();
        let facts = Facts {
            prompt_tokens: req.prompt_tokens(),
            prefix_hashes: req.prefix_hash_count() as usize,
            matches: host::prefix_matches_for(req.prefix_hash_count()),
            routing_key: req.routing_key(),
        };
        match choose(&settings, (&servers, &prefill), &facts) {
            Some(pair) => Decision::Pair(pair),
            None => Decision::Reject(NO_SERVER.to_owned()),
        }
    }
}

ringmaster_policy_sdk::router::export!(PairSplit);

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_policy_sdk::testing::{ServerBuilder, server};

    #[test]
    fn each_leg_has_its_own_policy_and_every_request_is_split() {
        let servers = [
            server("d0").role(Role::Decode).in_flight(5),
            server("d1").role(Role::Decode).in_flight(1),
        ];
        let prefill = [
            server("p0").role(Role::Prefill),
            server("p1").role(Role::Prefill).in_flight(2),
        ];
        let facts = Facts {
            prompt_tokens: 100,
            prefix_hashes: 4,
            matches: vec![("p1".into(), 3), ("d1".into(), 4)],
            routing_key: 0,
        };
        let least = Settings {
            decode: DecodePolicy::LeastLoaded,
            ..Settings::default()
        };
        let pair = choose(&least, (&servers, &prefill), &facts).unwrap();
        assert_eq!(pair.decode, "d1");
        assert_eq!(pair.prefill.as_deref(), Some("p1"), "cache-aware prefill");
        // vllm-router's threshold: d1 holds it all.
        let threshold = Settings {
            min_uncached_tokens: 1,
            ..least
        };
        assert_eq!(
            choose(&threshold, (&servers, &prefill), &facts)
                .unwrap()
                .prefill,
            None
        );
        // Power of two: always one of the two drawn, never an unhealthy one.
        for key in 0..32 {
            let pair = choose(
                &Settings::default(),
                (&servers, &prefill),
                &Facts {
                    routing_key: key,
                    ..facts.clone()
                },
            )
            .unwrap();
            assert!(pair.decode == "d0" || pair.decode == "d1");
            assert!(pair.prefill.is_some());
        }
        assert!(Settings::from_config(&[("decode_policy", "random")][..]).is_err());
    }
}
