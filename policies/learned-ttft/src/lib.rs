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
//!   that are healthy (none: the request is rejected), each has an expected wait: its learned
//!   TTFT times the requests queued on it plus one (a server never measured is taken to be as
//!   fast as the mean of the measured ones). The key's remembered server (else its owner on
//!   the ring) keeps it unless its expected wait is more than `1 + slack` times the best
//!   candidate's (1.0: twice); then the best one takes it. Ties go to the ring's order.
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

/// One candidate as the decision sees it: its id, its queue now (in flight plus waiting) and
/// its learned TTFT in µs (`None`: never measured).
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The server's id.
    pub id: String,
    /// Requests in flight on it plus those waiting inside it.
    pub queue: u32,
    /// Its learned mean TTFT in µs.
    pub learned_us: Option<f64>,
}

/// A candidate's expected wait: its learned TTFT (a server never measured is taken to be as
/// fast as the mean of those measured, so a new server neither wins every key nor starves)
/// times the requests ahead of this one plus one.
fn expected_wait(candidate: &Candidate, prior_us: f64) -> f64 {
    candidate.learned_us.unwrap_or(prior_us) * f64::from(candidate.queue.saturating_add(1))
}

/// The server for a request among `candidates` (healthy, in ring order: the first is the key's
/// owner), given the key's `remembered` server. The remembered server, else the owner, keeps
/// the key unless its expected wait is more than `1 + slack` times the best candidate's;
/// then the best one takes it. Ties go to the ring's order.
pub fn choose(candidates: &[Candidate], remembered: Option<&str>, slack: f64) -> Option<String> {
    let measured: Vec<f64> = candidates.iter().filter_map(|c| c.learned_us).collect();
    let prior = if measured.is_empty() {
        1.0
    } else {
        measured.iter().sum::<f64>() / measured.len() as f64
    };
    let wait = |c: &Candidate| expected_wait(c, prior);
    // `min_by` keeps the first of equals: ties go to the ring's order.
    let best = candidates
        .iter()
        .min_by(|a, b| wait(a).total_cmp(&wait(b)))?;
    let keeper = remembered
        .and_then(|id| candidates.iter().find(|c| c.id == id))
        .unwrap_or(&candidates[0]);
    if wait(keeper) <= wait(best) * (1.0 + slack) {
        Some(keeper.id.clone())
    } else {
        Some(best.id.clone())
    }
}

/// The sample an outcome contributes to its server's average, in µs (`None`: nothing to learn).
pub fn sample_us(outcome: &Outcome, error_penalty_ms: f64) -> Option<f64> {
    match (&outcome.error, outcome.ttft_us) {
        (Some(_), _) => Some(error_penalty_ms * 1000.0),
        (None, Some(us)) => Some(us as f64),
        (None, None) => None,
    }
}

/// The first `n` healthy servers clockwise from `key`, with their queues and what was learned
/// of each. The ring may still list servers that drain or fail their health checks: when the
/// first `n` are not all healthy, the whole ring order is asked for (one more host call).
fn candidates(key: u64, n: u32) -> Vec<Candidate> {
    let view = |id: String| {
        let server = cluster::get(&id).filter(|s| s.healthy)?;
        Some(Candidate {
            learned_us: store::get_f64(&ttft_key(&id)),
            queue: server.in_flight.saturating_add(server.waiting),
            id,
        })
    };
    let first: Vec<String> = ring::candidates(key, n);
    let wanted = first.len();
    let healthy: Vec<Candidate> = first.into_iter().filter_map(view).collect();
    if healthy.len() == wanted {
        return healthy;
    }
    ring::candidates(key, u32::MAX)
        .into_iter()
        .filter_map(view)
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
        let candidates = candidates(key, settings.candidates);
        let history = route_key(key);
        let remembered = store::get_string(&history);
        let choice = choose(&candidates, remembered.as_deref(), settings.slack);
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

    fn cand(id: &str, queue: u32, learned_us: Option<f64>) -> Candidate {
        Candidate {
            id: id.to_owned(),
            queue,
            learned_us,
        }
    }

    #[test]
    fn the_owner_keeps_new_keys_on_an_even_fleet() {
        let cands = [cand("b", 2, None), cand("a", 1, None)];
        assert_eq!(choose(&cands, None, 1.0).as_deref(), Some("b"));
        // Unmeasured servers take the mean of the measured: no stampede to the new one.
        let cands = [cand("b", 1, Some(100.0)), cand("a", 0, None)];
        assert_eq!(choose(&cands, None, 1.0).as_deref(), Some("b"));
    }

    #[test]
    fn the_remembered_server_keeps_its_key_until_clearly_slower() {
        let cands = [cand("a", 0, Some(100.0)), cand("b", 0, Some(180.0))];
        assert_eq!(choose(&cands, Some("b"), 1.0).as_deref(), Some("b"));
        let cands = [cand("a", 0, Some(100.0)), cand("b", 0, Some(250.0))];
        assert_eq!(choose(&cands, Some("b"), 1.0).as_deref(), Some("a"));
        // A queue counts as much as slowness: three requests ahead are four waits.
        let cands = [cand("a", 3, Some(100.0)), cand("b", 0, Some(100.0))];
        assert_eq!(choose(&cands, Some("a"), 1.0).as_deref(), Some("b"));
    }

    #[test]
    fn a_remembered_server_off_the_candidates_is_dropped() {
        let cands = [cand("a", 0, None), cand("b", 0, None)];
        assert_eq!(choose(&cands, Some("gone"), 1.0).as_deref(), Some("a"));
        assert_eq!(choose(&[], Some("a"), 1.0), None);
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
