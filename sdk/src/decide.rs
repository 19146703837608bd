//! Pure decision helpers over plain inputs.
//!
//! Everything here takes values a policy has already gathered from the host (the server
//! list, the prefix matches, a counter) and calls no host function, so it runs in native unit
//! tests as it does inside the gateway. The built-in policies under `policies/` are made of
//! these pieces.
//!
//! Conventions: only healthy servers are ever picked; ties end with the lower server id, so
//! every helper is deterministic for a given input.

use crate::types::{Role, Server};

/// The healthy servers, in the order given.
pub fn healthy(servers: &[Server]) -> impl Iterator<Item = &Server> {
    servers.iter().filter(|s| s.healthy)
}

/// The least and the most in-flight requests among the healthy servers; `None` when there is
/// no healthy server.
pub fn in_flight_range(servers: &[Server]) -> Option<(u32, u32)> {
    healthy(servers).fold(None, |range, s| match range {
        None => Some((s.in_flight, s.in_flight)),
        Some((lo, hi)) => Some((lo.min(s.in_flight), hi.max(s.in_flight))),
    })
}

/// Whether the healthy servers' in-flight load is imbalanced: the busiest has more than
/// `abs_threshold` requests more than the idlest, **and** more than `rel_threshold` times as
/// many (SGLang's cache-aware router uses the same two-sided test).
pub fn load_imbalanced(servers: &[Server], abs_threshold: u32, rel_threshold: f64) -> bool {
    match in_flight_range(servers) {
        None => false,
        Some((lo, hi)) => hi - lo > abs_threshold && f64::from(hi) > rel_threshold * f64::from(lo),
    }
}

/// The healthy server with the fewest in-flight requests; ties go to fewer waiting, then to
/// the lower id.
pub fn least_in_flight(servers: &[Server]) -> Option<&Server> {
    healthy(servers)
        .min_by(|a, b| (a.in_flight, a.waiting, &a.id).cmp(&(b.in_flight, b.waiting, &b.id)))
}

/// The healthy servers sharing the smallest `load`, in the order given (empty when none is
/// healthy).
pub fn all_least_loaded(servers: &[Server], load: impl Fn(&Server) -> u64) -> Vec<&Server> {
    let Some(min) = healthy(servers).map(&load).min() else {
        return Vec::new();
    };
    healthy(servers).filter(|s| load(s) == min).collect()
}

/// Of `tied`, the first to appear in `order` (for instance the ring's candidates for the
/// request's key); when none appears there, the one with the lowest id.
pub fn first_in_order<'a>(tied: &[&'a Server], order: &[String]) -> Option<&'a Server> {
    order
        .iter()
        .find_map(|id| tied.iter().find(|s| &s.id == id).copied())
        .or_else(|| tied.iter().min_by(|a, b| a.id.cmp(&b.id)).copied())
}

/// How many of the request's leading prefix hashes server `id` holds, by `matches` (what
/// the host's `cluster.prefix-matches` returns; a server it leaves out holds none).
pub fn matched(matches: &[(String, u32)], id: &str) -> u32 {
    matches
        .iter()
        .find(|(server, _)| server == id)
        .map_or(0, |(_, n)| *n)
}

/// Server `id`'s prefill backlog in prompt tokens, by `backlogs` (what the host's
/// `cluster.prefill-backlog` returns; a server it leaves out has none).
pub fn backlog(backlogs: &[(String, u64)], id: &str) -> u64 {
    backlogs
        .iter()
        .find(|(server, _)| server == id)
        .map_or(0, |(_, n)| *n)
}

/// The prompt tokens a server holding `matched` of a request's `total` leading prefix hashes
/// still has to compute, of its `prompt_tokens` (all of them when `total` is 0).
pub fn uncached_tokens(prompt_tokens: u32, matched: u32, total: usize) -> u64 {
    let tokens = f64::from(prompt_tokens) * (1.0 - coverage(matched, total));
    tokens.round() as u64
}

/// Where server `id` stands in `order` (for instance the ring's candidates for the request's
/// key), for breaking ties; `usize::MAX` when it is not there.
pub fn ring_rank(order: &[String], id: &str) -> usize {
    order.iter().position(|s| s == id).unwrap_or(usize::MAX)
}

/// The healthy server estimated to hold the longest prefix of the request, with the number
/// of leading prefix hashes it holds; ties go to fewer in-flight requests, then to the lower
/// id. `None` when no healthy server holds any.
///
/// `matches` is what the host's `cluster.prefix-matches` returns; servers it names that are
/// not in `servers` (or not healthy) are ignored.
pub fn best_prefix_match<'a>(
    servers: &'a [Server],
    matches: &[(String, u32)],
) -> Option<(&'a Server, u32)> {
    matches
        .iter()
        .filter(|(_, matched)| *matched > 0)
        .filter_map(|(id, matched)| {
            healthy(servers)
                .find(|s| &s.id == id)
                .map(|s| (s, *matched))
        })
        .min_by(|(a, am), (b, bm)| {
            bm.cmp(am)
                .then(a.in_flight.cmp(&b.in_flight))
                .then(a.id.cmp(&b.id))
        })
}

/// The fraction of a request's `total` prefix hashes that `matched` covers (0 when the
/// request has none).
pub fn coverage(matched: u32, total: usize) -> f64 {
    if total == 0 {
        0.0
    } else {
        (f64::from(matched) / total as f64).min(1.0)
    }
}

/// The `counter`-th healthy server in id order, wrapping around; `None` when none is healthy.
pub fn round_robin(servers: &[Server], counter: u64) -> Option<&Server> {
    let mut ids: Vec<&Server> = healthy(servers).collect();
    if ids.is_empty() {
        return None;
    }
    ids.sort_by(|a, b| a.id.cmp(&b.id));
    let index = usize::try_from(counter % ids.len() as u64).unwrap_or(0);
    Some(ids[index])
}

/// Lower-cases `patterns` for [`first_match`]. Empty patterns are kept so that indices stay
/// those of the configuration; they never match.
pub fn lowercase_patterns(patterns: &[String]) -> Vec<String> {
    patterns.iter().map(|p| p.to_lowercase()).collect()
}

/// The index of the first of `lowercase_patterns` that occurs in `text`, ignoring case; empty
/// patterns never match.
pub fn first_match(text: &str, lowercase_patterns: &[String]) -> Option<usize> {
    if lowercase_patterns.iter().all(String::is_empty) {
        return None;
    }
    let text = text.to_lowercase();
    lowercase_patterns
        .iter()
        .position(|p| !p.is_empty() && text.contains(p.as_str()))
}

// ---- Disaggregated fleets: which servers split a request (0.3.0's pairs) ----

/// One entry of `cluster.prefix-matches`: a server and the leading prefix hashes it holds.
pub type PrefixMatch = (String, u32);
/// One entry of `cluster.prefill-backlog`: a server and its queued prompt tokens.
pub type Backlog = (String, u64);

/// The healthy servers of `servers` that can decode a request another server prefilled.
pub fn decode_servers(servers: &[Server]) -> impl Iterator<Item = &Server> {
    healthy(servers).filter(|s| s.role == Role::Decode)
}

/// Of the healthy `candidates`, the one with the least prefill work ahead for a prompt of
/// `prompt_tokens` in `total` prefix hashes: its backlog plus the tokens it does not hold.
/// Ties go to the first in the order given. With that work, and those uncached tokens.
pub fn least_prefill_work<'a>(
    candidates: &'a [Server],
    (matches, backlogs): (&[PrefixMatch], &[Backlog]),
    prompt_tokens: u32,
    total: usize,
) -> Option<(&'a Server, u64, u64)> {
    healthy(candidates)
        .map(|s| {
            let uncached = uncached_tokens(prompt_tokens, matched(matches, &s.id), total);
            (
                s,
                backlog(backlogs, &s.id).saturating_add(uncached),
                uncached,
            )
        })
        .min_by_key(|(_, work, _)| *work)
}

/// Whether a request the decode server would prefill `uncached_on_decode` tokens of is worth
/// splitting by the gateway's own rule: at least `min_uncached_tokens`, and (unless
/// `wait_for_busy_prefill`) a prefill server with no more work ahead (`prefill_work`) than the
/// decode server would have doing the prompt itself (`decode_backlog + uncached_on_decode`).
pub fn worth_splitting(
    uncached_on_decode: u64,
    (decode_backlog, prefill_work): (u64, u64),
    min_uncached_tokens: u64,
    wait_for_busy_prefill: bool,
) -> bool {
    uncached_on_decode >= min_uncached_tokens
        && (wait_for_busy_prefill
            || prefill_work <= decode_backlog.saturating_add(uncached_on_decode))
}

/// llm-d's prefix-based decider (`prefix-based-pd-decider`): split iff the decode server
/// would compute at least `non_cached_tokens` of the prompt and the prompt has at least
/// `min_prompt_tokens` (each 0: no bound).
pub fn llm_d_splits(
    uncached_on_decode: u64,
    prompt_tokens: u32,
    non_cached_tokens: u64,
    min_prompt_tokens: u32,
) -> bool {
    uncached_on_decode >= non_cached_tokens && prompt_tokens >= min_prompt_tokens
}

/// NVIDIA Dynamo's `isl_bounding` rule for conditional disaggregation: prefill on the decode
/// server when the effective input length (the prompt tokens it would compute) is under
/// `threshold` **and** under `ratio` of the raw input length; split otherwise.
pub fn dynamo_prefills_locally(effective: u64, raw: u32, threshold: u64, ratio: f64) -> bool {
    raw > 0 && effective < threshold && (effective as f64) < ratio * f64::from(raw)
}

/// Of two servers drawn by `seed` from the healthy `servers`, the one with fewer requests in
/// flight (the power of two choices, as SMG's and vllm-router's `power_of_two`); ties go to the
/// first drawn.
pub fn power_of_two(servers: &[Server], seed: u64) -> Option<&Server> {
    let healthy: Vec<&Server> = healthy(servers).collect();
    let n = healthy.len() as u64;
    if n == 0 {
        return None;
    }
    let first = healthy[(seed % n) as usize];
    let second = healthy[((seed / n.max(1)).wrapping_add(1 + seed % n) % n) as usize];
    Some(if second.in_flight < first.in_flight {
        second
    } else {
        first
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{ServerBuilder, server};
    use crate::types::Role;

    #[test]
    fn unhealthy_servers_are_never_picked() {
        let servers = [
            server("a").in_flight(0).unhealthy(),
            server("b").in_flight(9),
        ];
        assert_eq!(least_in_flight(&servers).unwrap().id, "b");
        assert_eq!(round_robin(&servers, 0).unwrap().id, "b");
        assert_eq!(round_robin(&servers, 1).unwrap().id, "b");
        assert_eq!(in_flight_range(&servers), Some((9, 9)));
        let matches = [("a".to_owned(), 8), ("b".to_owned(), 1)];
        assert_eq!(best_prefix_match(&servers, &matches).unwrap().0.id, "b");
    }

    #[test]
    fn backlog_and_uncached_tokens() {
        let backlogs = [("a".to_owned(), 900)];
        assert_eq!(backlog(&backlogs, "a"), 900);
        assert_eq!(backlog(&backlogs, "b"), 0, "left out: none");
        assert_eq!(uncached_tokens(1000, 0, 10), 1000);
        assert_eq!(uncached_tokens(1000, 4, 10), 600);
        assert_eq!(uncached_tokens(1000, 12, 10), 0, "never below zero");
        assert_eq!(
            uncached_tokens(1000, 0, 0),
            1000,
            "no hashes: nothing cached"
        );
    }

    #[test]
    fn nothing_healthy_gives_nothing() {
        let servers = [server("a").unhealthy()];
        assert!(least_in_flight(&servers).is_none());
        assert!(round_robin(&servers, 3).is_none());
        assert!(in_flight_range(&servers).is_none());
        assert!(!load_imbalanced(&servers, 0, 0.0));
        assert!(all_least_loaded(&servers, |s| u64::from(s.in_flight)).is_empty());
        assert!(least_in_flight(&[]).is_none());
    }

    #[test]
    fn imbalance_needs_both_thresholds() {
        let servers = |lo, hi| [server("a").in_flight(lo), server("b").in_flight(hi)];
        // 40 apart and 5x: imbalanced.
        assert!(load_imbalanced(&servers(10, 50), 32, 1.5));
        // 40 apart but only 1.4x: balanced.
        assert!(!load_imbalanced(&servers(100, 140), 32, 1.5));
        // 4x but only 3 apart: balanced.
        assert!(!load_imbalanced(&servers(1, 4), 32, 1.5));
        // Exactly at the absolute threshold is not over it.
        assert!(!load_imbalanced(&servers(0, 32), 32, 1.5));
        assert!(load_imbalanced(&servers(0, 33), 32, 1.5));
    }

    #[test]
    fn least_in_flight_breaks_ties_by_waiting_then_id() {
        let servers = [
            server("c").in_flight(1).waiting(0),
            server("b").in_flight(1).waiting(2),
            server("a").in_flight(1).waiting(0),
        ];
        assert_eq!(least_in_flight(&servers).unwrap().id, "a");
    }

    #[test]
    fn ties_follow_the_given_order() {
        let servers = [
            server("a").in_flight(2),
            server("b").in_flight(1),
            server("c").in_flight(1),
        ];
        let tied = all_least_loaded(&servers, |s| u64::from(s.in_flight));
        let ids: Vec<_> = tied.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["b", "c"]);
        let order = ["x".to_owned(), "c".to_owned(), "b".to_owned()];
        assert_eq!(first_in_order(&tied, &order).unwrap().id, "c");
        assert_eq!(first_in_order(&tied, &[]).unwrap().id, "b");
        assert!(first_in_order(&[], &order).is_none());
    }

    #[test]
    fn best_prefix_match_prefers_length_then_load_then_id() {
        let servers = [
            server("a").in_flight(5),
            server("b").in_flight(3),
            server("c").in_flight(3),
        ];
        let m = |list: &[(&str, u32)]| -> Vec<(String, u32)> {
            list.iter().map(|(id, n)| ((*id).to_owned(), *n)).collect()
        };
        let pick = |list: &[(&str, u32)]| {
            best_prefix_match(&servers, &m(list)).map(|(s, n)| (s.id.clone(), n))
        };
        assert_eq!(pick(&[("a", 4), ("b", 2)]), Some(("a".into(), 4)));
        assert_eq!(pick(&[("a", 4), ("b", 4)]), Some(("b".into(), 4)));
        assert_eq!(pick(&[("c", 4), ("b", 4)]), Some(("b".into(), 4)));
        assert_eq!(pick(&[("zz", 9), ("c", 1)]), Some(("c".into(), 1)));
        assert_eq!(pick(&[("a", 0)]), None);
        assert_eq!(pick(&[]), None);
    }

    #[test]
    fn matched_and_ring_rank_look_servers_up() {
        let matches = vec![("a".to_owned(), 3), ("b".to_owned(), 7)];
        assert_eq!(matched(&matches, "b"), 7);
        assert_eq!(matched(&matches, "c"), 0);
        let order = vec!["c".to_owned(), "a".to_owned()];
        assert_eq!(ring_rank(&order, "a"), 1);
        assert_eq!(ring_rank(&order, "b"), usize::MAX);
    }

    #[test]
    fn coverage_is_a_fraction() {
        assert_eq!(coverage(0, 0), 0.0);
        assert_eq!(coverage(3, 4), 0.75);
        assert_eq!(coverage(9, 4), 1.0);
    }

    #[test]
    fn round_robin_cycles_in_id_order() {
        let servers = [server("c"), server("a"), server("b")];
        let picks: Vec<_> = (0..7)
            .map(|n| round_robin(&servers, n).unwrap().id.clone())
            .collect();
        assert_eq!(picks, ["a", "b", "c", "a", "b", "c", "a"]);
        assert_eq!(round_robin(&servers, u64::MAX).unwrap().id, "a");
    }

    #[test]
    fn patterns_match_ignoring_case() {
        let patterns = lowercase_patterns(&["".into(), "Secret".into(), "ÄRGER".into()]);
        assert_eq!(first_match("no SECRETS here", &patterns), Some(1));
        assert_eq!(first_match("viel ärger", &patterns), Some(2));
        assert_eq!(first_match("harmless", &patterns), None);
        assert_eq!(
            first_match("anything", &lowercase_patterns(&["".into()])),
            None
        );
        assert_eq!(first_match("anything", &[]), None);
    }

    #[test]
    fn pair_helpers_follow_the_peers_rules() {
        let servers = [
            server("d1").role(Role::Decode).in_flight(3),
            server("w").in_flight(0),
            server("d2").role(Role::Decode).in_flight(1).unhealthy(),
        ];
        let decode: Vec<_> = decode_servers(&servers).map(|s| s.id.as_str()).collect();
        assert_eq!(decode, ["d1"]);
        let prefill = [
            server("p1").role(Role::Prefill),
            server("p2").role(Role::Prefill),
        ];
        let matches = [("p2".to_owned(), 5)];
        let backlogs = [("p1".to_owned(), 100)];
        // p2 holds half the prompt: 500 tokens to do against p1's 100 + 1000.
        let (best, work, uncached) =
            least_prefill_work(&prefill, (&matches, &backlogs), 1000, 10).unwrap();
        assert_eq!((best.id.as_str(), work, uncached), ("p2", 500, 500));
        assert!(worth_splitting(1000, (0, 500), 256, false));
        assert!(
            !worth_splitting(100, (0, 50), 256, false),
            "under the threshold"
        );
        assert!(
            !worth_splitting(1000, (0, 2000), 256, false),
            "prefill busier"
        );
        assert!(worth_splitting(1000, (0, 2000), 256, true), "waits for it");
        assert!(llm_d_splits(16, 10, 16, 0));
        assert!(!llm_d_splits(15, 10, 16, 0));
        assert!(!llm_d_splits(100, 10, 0, 20));
        // Dynamo: 1,000 of 10,000 tokens to compute is local; 3,000 of 4,000 is split.
        assert!(dynamo_prefills_locally(1000, 10_000, 2048, 0.7));
        assert!(!dynamo_prefills_locally(3000, 4000, 2048, 0.7));
        assert!(
            !dynamo_prefills_locally(1500, 2000, 2048, 0.7),
            "over 0.7 of the raw"
        );
        let pick = power_of_two(&servers, 7).unwrap();
        assert!(pick.healthy);
        assert!(power_of_two(&[], 1).is_none());
    }

    #[test]
    fn power_of_two_draws_as_the_other_sdks_do() {
        let servers = [
            server("a").in_flight(5),
            server("b").in_flight(1),
            server("c").in_flight(3),
        ];
        // seed 7 on 3 servers: first 7 % 3 = 1 (b), second (7 / 3 + 1 + 1) % 3 = 1 (b).
        assert_eq!(power_of_two(&servers, 7).unwrap().id, "b");
        // seed 3: first a, second (1 + 1 + 0) % 3 = 2 (c), which has fewer in flight.
        assert_eq!(power_of_two(&servers, 3).unwrap().id, "c");
        assert!(power_of_two(&servers, u64::MAX).is_some());
    }
}
