//! A learning router (`ringmaster:policy@0.2.0`, world `learning-router`): it keeps a routing
//! history and what it learned about each server's time to first token in the host's `state`
//! store, and learns from every request's outcome through `observe`.
//!
//! - **Routing history.** Each routing key's last server is kept under `route/KEY`, so a
//!   conversation's turns return to the server that holds its KV cache, across instances and
//!   across a swap to a new version (when the operator keeps state).
//! - **What it learns.** After each request, `observe` folds its TTFT into an exponentially
//!   weighted average for the server that served it (`ttft/SERVER`, weight `alpha`); a failed
//!   request counts as `error_penalty_ms`.
//! - **The decision.** Among the first `candidates` servers clockwise on the ring from the key
//!   that are healthy (none: the request is rejected), the remembered server keeps the request unless its learned TTFT is worse than the best
//!   candidate's by more than `slack` (1.0: twice as slow); otherwise, and for a new key, the
//!   candidate with the lowest learned TTFT wins (one never measured counts as 0, so every
//!   server is tried). Ties go to the ring's order.
//!
//! Configuration (all optional): `candidates` (default 2), `alpha` (0.2), `slack` (1.0),
//! `error_penalty_ms` (5000).

use std::sync::OnceLock;

use ringmaster_policy_sdk::host::{cluster, ring};
use ringmaster_policy_sdk::learning_router::{Decision, Guest};
use ringmaster_policy_sdk::store;
use ringmaster_policy_sdk::types::{Outcome, Request};
use ringmaster_policy_sdk::{OrTrap, config_f64, config_u32};

/// The reason given when no server can take the request.
pub const NO_SERVER: &str = "no healthy GPU server";

/// The policy's configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Ring candidates considered per request.
    pub candidates: u32,
    /// Weight of the newest sample in a server's TTFT average.
    pub alpha: f64,
    /// How much slower than the best candidate the remembered server may be and keep a key.
    pub slack: f64,
    /// The TTFT a failed request counts as, in milliseconds.
    pub error_penalty_ms: f64,
}

impl Settings {
    fn from_host() -> Self {
        let settings = Self {
            candidates: config_u32("candidates", 2).or_trap().max(1),
            alpha: config_f64("alpha", 0.2).or_trap(),
            slack: config_f64("slack", 1.0).or_trap(),
            error_penalty_ms: config_f64("error_penalty_ms", 5000.0).or_trap(),
        };
        if !(0.0..=1.0).contains(&settings.alpha) || settings.slack < 0.0 {
            panic!("learned-ttft: alpha must be within 0..=1 and slack at least 0");
        }
        settings
    }

    /// Read once per instance: an instance lives within one version, whose config is fixed.
    fn get() -> Self {
        static SETTINGS: OnceLock<Settings> = OnceLock::new();
        *SETTINGS.get_or_init(Self::from_host)
    }
}

/// The state key of a routing key's last server.
pub fn route_key(routing_key: u64) -> String {
    format!("route/{routing_key:016x}")
}

/// The state key of a server's learned TTFT (microseconds, an `f64`).
pub fn ttft_key(server: &str) -> String {
    format!("ttft/{server}")
}

/// The server for a request: `candidates` in ring order, the key's `remembered` server, and
/// what was learned of each (`learned(id)`: mean TTFT in µs, `None` when never measured).
pub fn choose(
    candidates: &[String],
    remembered: Option<&str>,
    learned: impl Fn(&str) -> Option<f64>,
    slack: f64,
) -> Option<String> {
    let cost = |id: &str| learned(id).unwrap_or(0.0);
    // `min_by` keeps the first of equals: ties go to the ring's order.
    let best = candidates
        .iter()
        .min_by(|a, b| cost(a).total_cmp(&cost(b)))?;
    if let Some(kept) = remembered.filter(|id| candidates.iter().any(|c| c == id))
        && cost(kept) <= cost(best) * (1.0 + slack)
    {
        return Some(kept.to_owned());
    }
    Some(best.clone())
}

/// The sample an outcome contributes to its server's average, in µs (`None`: nothing to learn).
pub fn sample_us(outcome: &Outcome, error_penalty_ms: f64) -> Option<f64> {
    match (&outcome.error, outcome.ttft_us) {
        (Some(_), _) => Some(error_penalty_ms * 1000.0),
        (None, Some(us)) => Some(us as f64),
        (None, None) => None,
    }
}

/// The first `n` healthy servers clockwise from `key`. The ring may still list servers that
/// drain or fail their health checks: when the first `n` are not all healthy, the whole ring
/// order is asked for (one more host call).
fn healthy_candidates(key: u64, n: u32) -> Vec<String> {
    let healthy = |id: &String| cluster::get(id).is_some_and(|s| s.healthy);
    let first = ring::candidates(key, n);
    if first.iter().all(healthy) {
        return first;
    }
    ring::candidates(key, u32::MAX)
        .into_iter()
        .filter(healthy)
        .take(n as usize)
        .collect()
}

/// The component's exports.
#[derive(Debug)]
pub struct LearnedTtft;

impl Guest for LearnedTtft {
    fn route(req: &Request) -> Decision {
        let settings = Settings::get();
        let key = req.routing_key();
        let candidates = healthy_candidates(key, settings.candidates);
        let history = route_key(key);
        let remembered = store::get_string(&history);
        let choice = choose(
            &candidates,
            remembered.as_deref(),
            |id| store::get_f64(&ttft_key(id)),
            settings.slack,
        );
        match choice {
            Some(server) => {
                if remembered.as_deref() != Some(server.as_str()) {
                    store::set_string(&history, &server);
                }
                Decision::Route(server)
            }
            None => Decision::Reject(NO_SERVER.to_owned()),
        }
    }

    fn observe(outcome: Outcome) {
        let settings = Settings::get();
        store::add("observed", 1);
        if let Some(sample) = sample_us(&outcome, settings.error_penalty_ms) {
            let key = ttft_key(&outcome.server);
            let mean = store::ewma(store::get_f64(&key), sample, settings.alpha);
            store::set_f64(&key, mean);
        }
    }
}

ringmaster_policy_sdk::learning_router::export!(LearnedTtft);

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn unmeasured_servers_are_tried_first_in_ring_order() {
        let cands = ids(&["b", "a"]);
        let learned = |id: &str| (id == "b").then_some(900.0);
        assert_eq!(choose(&cands, None, learned, 1.0).as_deref(), Some("a"));
        assert_eq!(choose(&cands, None, |_| None, 1.0).as_deref(), Some("b"));
    }

    #[test]
    fn the_remembered_server_keeps_its_key_until_clearly_slower() {
        let cands = ids(&["a", "b"]);
        let learned = |id: &str| Some(if id == "a" { 100.0 } else { 180.0 });
        assert_eq!(
            choose(&cands, Some("b"), learned, 1.0).as_deref(),
            Some("b")
        );
        let learned = |id: &str| Some(if id == "a" { 100.0 } else { 250.0 });
        assert_eq!(
            choose(&cands, Some("b"), learned, 1.0).as_deref(),
            Some("a")
        );
    }

    #[test]
    fn a_remembered_server_off_the_candidates_is_dropped() {
        let cands = ids(&["a", "b"]);
        assert_eq!(
            choose(&cands, Some("gone"), |_| None, 1.0).as_deref(),
            Some("a")
        );
        assert_eq!(choose(&[], Some("a"), |_| None, 1.0), None);
    }

    #[test]
    fn errors_count_as_the_penalty() {
        let mut outcome = Outcome {
            request_id: "req".into(),
            routing_key: 1,
            server: "a".into(),
            as_decided: true,
            ttft_us: Some(1500),
            prompt_tokens: 10,
            cached_tokens: 0,
            output_tokens: 5,
            error: None,
        };
        assert_eq!(sample_us(&outcome, 5000.0), Some(1500.0));
        outcome.error = Some("reset".into());
        assert_eq!(sample_us(&outcome, 5000.0), Some(5_000_000.0));
        outcome.error = None;
        outcome.ttft_us = None;
        assert_eq!(sample_us(&outcome, 5000.0), None);
    }
}
