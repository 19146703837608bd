//! Routing quality over real sockets: 100 concurrent multi-turn conversations that share one
//! system prompt, on 4 simulated servers, routed by the ring and by round-robin.
//!
//! The ring must leave at most a third of the uncached prompt tokens (prefill work) that
//! round-robin leaves, and the bounded-load cap must hold at every assignment: the chosen
//! server's in-flight count never exceeds `ceil(1.25 × (total in flight) / 4)`.
//!
//! Two arrival patterns run side by side. `Realistic`: conversations open over ~10 modelled
//! seconds and users think between turns, as in chat traffic. `Herd`: all 100 conversations
//! fire their first turn at the same instant. The cap is checked in both and the one-third
//! bound in the realistic one. Spills are what the ring pays for its cap: while few requests
//! are in flight, `ceil(1.25 × (total + 1) / 4)` leaves little slack over the uneven spread of
//! 100 conversation keys, a spilled turn misses its history on the server that takes it, and
//! the next turn, back at the key's owner, misses the spilled one. Cache-aware routing (policies)
//! is what recovers that: the last test runs the cache-aware component, matching prompts against
//! the caches the servers report, on the same traffic.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::support::{TestGateway, metric_sum};

const SERVERS: usize = 4;
const CONVERSATIONS: usize = 100;
const TURNS: usize = 8;
const REPLY_TOKENS: u32 = 256;
/// The tests here run one at a time: each drives 100 conversations against modelled time, and
/// two at once on a 2-core machine skew the overlap that time decides.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Modelled seconds → real seconds for the simulated servers.
/// Large enough that modelled time, not the test machine's scheduling noise, decides how many
/// requests overlap (a decode step is 0.4 ms real).
const TIME_SCALE: f64 = 0.1;

/// How conversations arrive.
#[derive(Clone, Copy, Debug)]
enum Arrival {
    /// Openings spread over 10 modelled seconds; 0.4–2 modelled seconds of thinking per turn.
    Realistic,
    /// Every conversation at once, no thinking.
    Herd,
}

impl Arrival {
    fn start_delay(self, id: usize) -> std::time::Duration {
        match self {
            // 0–500 ms real = 0–10 s modelled, in a scrambled order.
            Self::Realistic => {
                std::time::Duration::from_millis((id * 37 % CONVERSATIONS) as u64 * 5)
            }
            Self::Herd => std::time::Duration::ZERO,
        }
    }

    fn think_time(self, id: usize, turn: usize) -> std::time::Duration {
        match self {
            // 20–100 ms real = 0.4–2 s modelled.
            Self::Realistic => std::time::Duration::from_millis(((id + turn) % 5 + 1) as u64 * 20),
            Self::Herd => std::time::Duration::ZERO,
        }
    }
}

/// Figures of one run.
#[derive(Debug)]
struct Run {
    prompt_tokens: u64,
    uncached_tokens: u64,
    peak_in_flight: Vec<u64>,
    over_cap: f64,
    spills: f64,
    /// Requests a router policy sent to the server holding the most of the prompt.
    cache_decisions: f64,
}

fn words(seed: usize, count: usize) -> String {
    const VOCAB: [&str; 16] = [
        "river", "lantern", "copper", "meadow", "signal", "harbor", "velvet", "orbit", "thistle",
        "granite", "echo", "saffron", "willow", "cipher", "ember", "quartz",
    ];
    (0..count)
        .map(|i| {
            VOCAB[(seed.wrapping_mul(2654435761) >> 3).wrapping_add(i * 7 + seed) % VOCAB.len()]
        })
        .collect::<Vec<_>>()
        .join(" ")
}

async fn conversation(gw: Arc<TestGateway>, system: Arc<String>, id: usize, arrival: Arrival) {
    tokio::time::sleep(arrival.start_delay(id)).await;
    let mut messages: Vec<Value> = Vec::new();
    for turn in 0..TURNS {
        if turn > 0 {
            tokio::time::sleep(arrival.think_time(id, turn)).await;
        }
        let text = if turn == 0 {
            format!("Conversation {id}. {}", words(id, 60))
        } else {
            format!(
                "Turn {turn} of conversation {id}: {}",
                words(id * 31 + turn, 40)
            )
        };
        messages.push(json!({"role": "user", "content": text}));
        let request = json!({
            "model": "sim-llama-3-8b", "max_tokens": REPLY_TOKENS,
            "system": system.as_str(), "messages": messages,
        });
        let response = gw.post_messages(&request).await;
        assert_eq!(response.status(), 200, "conversation {id} turn {turn}");
        let body: Value = response.json().await.unwrap();
        let reply = body["content"][0]["text"].as_str().unwrap().to_owned();
        messages.push(json!({"role": "assistant", "content": reply}));
    }
}

async fn run(strategy: &str, arrival: Arrival) -> Run {
    run_with(&format!("[routing]\nstrategy = \"{strategy}\""), arrival).await
}

async fn run_with(toml: &str, arrival: Arrival) -> Run {
    let gw = Arc::new(TestGateway::simulated(SERVERS, TIME_SCALE, toml).await);
    let system = Arc::new(format!(
        "You are the support assistant of a large online bookshop. {}",
        words(7, 700)
    ));
    let tasks: Vec<_> = (0..CONVERSATIONS)
        .map(|id| tokio::spawn(conversation(gw.clone(), system.clone(), id, arrival)))
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let servers = gw.servers().await;
    let mut run = Run {
        prompt_tokens: 0,
        uncached_tokens: 0,
        peak_in_flight: Vec::new(),
        over_cap: 0.0,
        spills: 0.0,
        cache_decisions: 0.0,
    };
    for server in servers["servers"].as_array().unwrap() {
        let engine = &server["engine"];
        let prompt = engine["prompt_tokens_total"].as_u64().unwrap();
        let cached = engine["cached_prompt_tokens_total"].as_u64().unwrap();
        run.prompt_tokens += prompt;
        run.uncached_tokens += prompt - cached;
        run.peak_in_flight
            .push(server["peak_in_flight"].as_u64().unwrap());
        assert_eq!(server["in_flight"], 0);
    }
    let metrics = gw.metrics().await;
    let decisions = metric_sum(&metrics, "ringmaster_routing_load_to_cap_ratio_count", "");
    let within = metric_sum(
        &metrics,
        "ringmaster_routing_load_to_cap_ratio_bucket",
        "le=\"1.0\"",
    );
    run.over_cap = decisions - within;
    run.cache_decisions = metric_sum(
        &metrics,
        "ringmaster_policy_counter_total",
        "counter=\"decision_cache\"",
    );
    // The native ring labels its spills `bounded-load-spill`; when the consistent-hash policy
    // decides, every decision off the key's owner is a spill (`policy-other`), and the host's
    // own cap enforcement shows as `policy-over-cap`.
    run.spills = ["bounded-load-spill", "policy-other", "policy-over-cap"]
        .iter()
        .map(|reason| {
            let labels = format!("reason=\"{reason}\"");
            metric_sum(&metrics, "ringmaster_routing_decisions_total", &labels)
        })
        .sum();
    run
}

fn report(arrival: Arrival, ring: &Run, round_robin: &Run) -> f64 {
    let ratio = ring.uncached_tokens as f64 / round_robin.uncached_tokens as f64;
    eprintln!(
        "routing quality, {arrival:?} arrivals ({CONVERSATIONS} conversations x {TURNS} turns, {SERVERS} servers):\n  \
         consistent-hash: prompt {} tokens, uncached {} ({:.1} %), peak in flight per server {:?}, spills {}\n  \
         round-robin:     prompt {} tokens, uncached {} ({:.1} %), peak in flight per server {:?}\n  \
         uncached ratio ring / round-robin = {ratio:.3}",
        ring.prompt_tokens,
        ring.uncached_tokens,
        100.0 * ring.uncached_tokens as f64 / ring.prompt_tokens as f64,
        ring.peak_in_flight,
        ring.spills,
        round_robin.prompt_tokens,
        round_robin.uncached_tokens,
        100.0 * round_robin.uncached_tokens as f64 / round_robin.prompt_tokens as f64,
        round_robin.peak_in_flight,
    );
    assert_eq!(
        ring.prompt_tokens, round_robin.prompt_tokens,
        "same traffic both ways"
    );
    assert_eq!(
        ring.over_cap, 0.0,
        "an assignment exceeded the bounded-load cap"
    );
    let cap = (1.25 * CONVERSATIONS as f64 / SERVERS as f64).ceil() as u64;
    assert!(
        ring.peak_in_flight.iter().all(|&p| p <= cap),
        "peak {:?} over {cap}",
        ring.peak_in_flight
    );
    ratio
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ring_leaves_a_third_of_round_robins_prefill_and_holds_the_cap() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let ring = run("consistent-hash", Arrival::Realistic).await;
    let round_robin = run("round-robin", Arrival::Realistic).await;
    let ratio = report(Arrival::Realistic, &ring, &round_robin);
    assert!(
        ratio <= 1.0 / 3.0,
        "ring left {ratio:.3} of round-robin's uncached prompt tokens"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thundering_herd_holds_the_cap_and_still_beats_round_robin() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let ring = run("consistent-hash", Arrival::Herd).await;
    let round_robin = run("round-robin", Arrival::Herd).await;
    let ratio = report(Arrival::Herd, &ring, &round_robin);
    assert!(ring.spills > 0.0, "a herd exercises the bounded-load spill");
    assert!(
        ratio < 0.6,
        "ring left {ratio:.3} of round-robin's uncached prompt tokens"
    );
}

/// The cache-aware component routing on what the servers report they cache (plus the prompts
/// in flight on each), against the plain ring, on the same traffic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_aware_routing_on_the_servers_reported_caches() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let component =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/dist/cache-aware.wasm");
    if !component.is_file() {
        assert!(
            std::env::var_os("RINGMASTER_REQUIRE_POLICIES").is_none(),
            "{} is missing (cargo xtask policies)",
            component.display()
        );
        eprintln!("skipping: {} is not built", component.display());
        return;
    }
    let toml = format!(
        "[[policies.router]]\nname = \"cache-aware\"\nsource = \"{}\"\n",
        component.display()
    );
    for arrival in [Arrival::Herd, Arrival::Realistic] {
        let aware = run_with(&toml, arrival).await;
        let ring = run("consistent-hash", arrival).await;
        eprintln!(
            "cache-aware, {arrival:?}: uncached {} of {} prompt tokens ({:.1} %), {} cache decisions, peak in flight {:?}; ring uncached {} ({:.1} %)",
            aware.uncached_tokens,
            aware.prompt_tokens,
            100.0 * aware.uncached_tokens as f64 / aware.prompt_tokens as f64,
            aware.cache_decisions,
            aware.peak_in_flight,
            ring.uncached_tokens,
            100.0 * ring.uncached_tokens as f64 / ring.prompt_tokens as f64,
        );
        assert_eq!(
            aware.prompt_tokens, ring.prompt_tokens,
            "same traffic both ways"
        );
        assert_eq!(aware.over_cap, 0.0, "the host's cap held under the policy");
        // Every turn after a conversation's first finds its history cached on the server that
        // served the previous turn, as that server reports it: at least those 700 of the 800
        // requests take the cache branch. How much prefill that saves against the ring is a
        // timing-dependent figure (0.74–0.93 of the ring's uncached tokens, measured), printed
        // above rather than asserted.
        assert!(
            aware.cache_decisions >= (CONVERSATIONS * (TURNS - 1)) as f64,
            "{} of {} requests routed on a reported cache hit",
            aware.cache_decisions,
            CONVERSATIONS * TURNS
        );
    }
}
