//! Whether a routed request is split between a prefill and a decode server, and which prefill
//! server computes its prompt: the host's pair rule ([`plan`]), applied after the router chose
//! the decode server (the server it names is where the tokens come from).
//!
//! The rule, llm-d's order (decode first, then the decider, then prefill): a request is split
//! only when its server is a decode server (`role = "decode"`), a healthy prefill server of
//! the same connector is there, and the decode server would compute at least
//! `[disaggregation] min_uncached_tokens` of the prompt itself (fewer: it holds most of the
//! prompt, and a split would only add a transfer). The prefill server is the one with the
//! least work ahead of it for this prompt: its prefill backlog plus the prompt tokens it does
//! not hold; ties go to a rendezvous hash of the routing key, so one prefix keeps going to one
//! prefill server. When even that server has more prefill work ahead than the decode server
//! would have doing the prompt itself, the decode server serves it whole (Dynamo's
//! `prefill_load` rule: prefill servers that fall behind stop costing TTFT). Nothing here
//! sends anything: the call carries the legs out.

use std::sync::Arc;

use ringmaster_config::{Connector, DisaggregationSettings, WhenPrefillBusy};
use ringmaster_pool::kv_view::ChatPrompt;
use ringmaster_pool::{Backend, InFlight, Pool, PoolSnapshot, Server};

use super::view::prefix_matches_of;
use ringmaster_pool::RoutingInput;

/// What became of a request's chance to be split (the `outcome` label of
/// `ringmaster_pair_decisions_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PairOutcome {
    /// Split: a prefill server computes the prompt, the decode server the tokens.
    Split,
    /// Whole: its server takes whole requests only (`role = "both"`).
    Whole,
    /// Whole on the decode server: it would compute fewer prompt tokens than the split's
    /// threshold.
    Bypass,
    /// Whole on the decode server: no healthy prefill server of its connector.
    NoPrefillServer,
    /// Whole on the decode server: the least busy prefill server has more prefill work ahead
    /// than the decode server would have doing this prompt itself.
    PrefillBusy,
    /// Whole: the router (a `ringmaster:policy@0.3.0` pair) named no prefill server, or one
    /// that cannot hand its KV cache to the decode server.
    RouterWhole,
}

impl PairOutcome {
    /// Every outcome.
    pub const ALL: [PairOutcome; 6] = [
        PairOutcome::Split,
        PairOutcome::Whole,
        PairOutcome::Bypass,
        PairOutcome::NoPrefillServer,
        PairOutcome::PrefillBusy,
        PairOutcome::RouterWhole,
    ];

    /// Its name in metrics, explain and traces.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Split => "split",
            Self::Whole => "whole",
            Self::Bypass => "bypass",
            Self::NoPrefillServer => "no_prefill_server",
            Self::PrefillBusy => "prefill_busy",
            Self::RouterWhole => "router_whole",
        }
    }
}

/// The pair decided for a request, before anything is counted.
#[derive(Clone, Debug)]
pub struct PairPlan {
    /// Split or not, and why not.
    pub outcome: PairOutcome,
    /// The prefill server, when split, with the prompt tokens it is expected to compute.
    pub prefill: Option<(Arc<Server>, u64)>,
    /// Why, in words (explain, traces, debug logs).
    pub why: String,
}

/// A request's prefill leg: its server and its slot there.
#[derive(Debug)]
pub struct PrefillLeg {
    /// The prefill server.
    pub server: Arc<Server>,
    /// The leg's slot on it (its prefill backlog charged), released when the leg ends.
    pub in_flight: InFlight,
    /// How the KV cache moves (the pair's connector).
    pub connector: Connector,
}

/// The host's pair rule for a request routed to `decode`, which would compute
/// `uncached_on_decode` of its `prompt_tokens` itself.
pub fn plan(
    pool: &Pool,
    snapshot: &PoolSnapshot,
    decode: &Arc<Server>,
    (uncached_on_decode, prompt_tokens): (u64, u32),
    prompt: (&RoutingInput, ChatPrompt<'_>),
    rule: &DisaggregationSettings,
) -> PairPlan {
    let role = decode.role();
    let whole = |outcome, why: String| PairPlan {
        outcome,
        prefill: None,
        why,
    };
    let Some(connector) = role.connector.filter(|_| role.takes_handoffs()) else {
        return whole(
            PairOutcome::Whole,
            format!("{} takes whole requests", decode.id()),
        );
    };
    let candidates = candidates(snapshot, decode, connector, &[]);
    if candidates.is_empty() {
        return whole(
            PairOutcome::NoPrefillServer,
            format!(
                "no healthy {} prefill server for {}",
                connector.as_str(),
                decode.id()
            ),
        );
    }
    if uncached_on_decode < u64::from(rule.min_uncached_tokens) {
        return whole(
            PairOutcome::Bypass,
            format!(
                "{} would compute {uncached_on_decode} prompt tokens itself, under \
                 min_uncached_tokens {}",
                decode.id(),
                rule.min_uncached_tokens
            ),
        );
    }
    let Some((server, tokens, work)) = least_work(pool, &candidates, prompt, prompt_tokens) else {
        return whole(PairOutcome::NoPrefillServer, "no prefill server".to_owned());
    };
    // Dynamo's `prefill_load` rule: a split only pays while a prefill server would start on
    // the prompt no later than the decode server would finish it itself.
    let local = decode
        .fleet_prefill_backlog()
        .saturating_add(uncached_on_decode);
    if work > local && rule.when_prefill_busy == WhenPrefillBusy::Decode {
        return whole(
            PairOutcome::PrefillBusy,
            format!(
                "{} has {work} prefill tokens ahead, more than the {local} {} would compute \
                 doing this prompt itself",
                server.id(),
                decode.id()
            ),
        );
    }
    PairPlan {
        outcome: PairOutcome::Split,
        why: format!(
            "{} would compute {uncached_on_decode} prompt tokens (min_uncached_tokens {}); \
             {} has the least prefill work ahead ({work} tokens, {tokens} of them this \
             prompt's)",
            decode.id(),
            rule.min_uncached_tokens,
            server.id()
        ),
        prefill: Some((server, tokens)),
    }
}

/// The pair a router of `ringmaster:policy@0.3.0` chose: `prefill` (none: whole) for the
/// request its decision put on `decode`, with the router's `reason`. A prefill server that
/// cannot hand its KV cache to `decode` (not a decode server, another connector, gone) leaves
/// the request whole, and says why.
pub fn chosen(
    pool: &Pool,
    snapshot: &PoolSnapshot,
    decode: &Arc<Server>,
    (prefill, reason): (Option<&str>, String),
    prompt: (&RoutingInput, ChatPrompt<'_>),
    prompt_tokens: u32,
) -> PairPlan {
    let whole = |why: String| PairPlan {
        outcome: PairOutcome::RouterWhole,
        prefill: None,
        why,
    };
    let Some(prefill) = prefill else {
        return whole(reason);
    };
    let role = decode.role();
    let Some(connector) = role.connector.filter(|_| role.takes_handoffs()) else {
        return whole(format!(
            "{reason} (but {} takes whole requests: not split)",
            decode.id()
        ));
    };
    let candidates: Vec<Arc<Server>> = candidates(snapshot, decode, connector, &[])
        .into_iter()
        .filter(|s| s.id() == prefill)
        .collect();
    match least_work(pool, &candidates, prompt, prompt_tokens) {
        Some((server, tokens, _)) => PairPlan {
            outcome: PairOutcome::Split,
            prefill: Some((server, tokens)),
            why: reason,
        },
        None => whole(format!(
            "{reason} (but {prefill} is not a healthy {} prefill server for {}: not split)",
            connector.as_str(),
            decode.id()
        )),
    }
}

/// For a prefill leg that failed: the prefill server with the least work ahead for
/// `decode`'s pair that is not one of `tried` (ids), counted in flight.
pub fn next_prefill(
    pool: &Pool,
    snapshot: &PoolSnapshot,
    decode: &Arc<Server>,
    tried: &[String],
    prompt: (&RoutingInput, ChatPrompt<'_>),
    prompt_tokens: u32,
) -> Option<PrefillLeg> {
    let connector = decode.role().connector?;
    let candidates = candidates(snapshot, decode, connector, tried);
    let (server, tokens, _) = least_work(pool, &candidates, prompt, prompt_tokens)?;
    PairPlan {
        outcome: PairOutcome::Split,
        prefill: Some((server, tokens)),
        why: String::new(),
    }
    .count(pool, prompt.0)
}

/// The healthy prefill servers that can hand `decode` their KV cache (the same connector,
/// and in this process when it is), but those in `exclude`.
fn candidates(
    snapshot: &PoolSnapshot,
    decode: &Server,
    connector: Connector,
    exclude: &[String],
) -> Vec<Arc<Server>> {
    let local = matches!(decode.engine(), Backend::Local(_));
    snapshot
        .prefill
        .iter()
        .filter(|s| {
            s.is_routable()
                && s.role().connector == Some(connector)
                && matches!(s.engine(), Backend::Local(_)) == local
                && !exclude.iter().any(|id| id == s.id())
        })
        .cloned()
        .collect()
}

/// Of `candidates`, the one with the least prefill work ahead for this prompt (its backlog
/// plus the prompt tokens it does not hold), with those tokens and that work; ties go to a
/// rendezvous hash of the routing key.
fn least_work(
    pool: &Pool,
    candidates: &[Arc<Server>],
    prompt: (&RoutingInput, ChatPrompt<'_>),
    prompt_tokens: u32,
) -> Option<(Arc<Server>, u64, u64)> {
    let (input, _) = prompt;
    let matches = prefix_matches_of(candidates, pool.prefixes(), prompt);
    let chunks = input.prompt_chunks.max(input.prefix_hashes.len());
    let uncached = |server: &Server| -> u64 {
        let held = matches
            .iter()
            .find(|m| m.server == server.id())
            .map_or(0, |m| m.hashes as usize);
        if chunks == 0 {
            return u64::from(prompt_tokens);
        }
        u64::from(prompt_tokens) * (chunks - held.min(chunks)) as u64 / chunks as u64
    };
    candidates
        .iter()
        .map(|s| {
            let tokens = uncached(s);
            let work = s.fleet_prefill_backlog().saturating_add(tokens);
            let tie = xxhash_rust::xxh3::xxh3_64_with_seed(s.id().as_bytes(), input.key);
            (work, tie, s, tokens)
        })
        .min_by_key(|(work, tie, _, _)| (*work, *tie))
        .map(|(work, _, s, tokens)| (s.clone(), tokens, work))
}

impl PairPlan {
    /// Carries the plan out: the prefill leg counted in flight on its server, its prompt
    /// tokens charged to the server's prefill backlog.
    pub fn count(&self, pool: &Pool, input: &RoutingInput) -> Option<PrefillLeg> {
        let (server, tokens) = self.prefill.as_ref()?;
        let mut in_flight = pool.count_leg(server, input);
        in_flight.charge_prefill(*tokens);
        Some(PrefillLeg {
            server: server.clone(),
            in_flight,
            connector: server.role().connector?,
        })
    }
}
