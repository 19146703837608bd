//! Routing quality on the trace fixture (the first 1,000 requests of Mooncake's conversation
//! trace), replayed through the real routing code on the modelled clock.
//!
//! A replay's figures depend only on the scenario, never on the machine's speed, so these
//! tests can assert them: a run repeats exactly; the ring reuses more cache than round-robin
//! and so leaves the servers less prefill; the bounded-load cap holds at every assignment;
//! cache-aware routing on the servers' reported caches reuses at least as much as the ring;
//! and no router reuses more than the unbounded oracle allows.

use std::path::Path;
use std::sync::OnceLock;

use ringmaster_replay::report::PolicySummary;
use ringmaster_replay::{Report, Scenario, run_scenario, runtime};

const REQUESTS: usize = 600;

fn scenario(routers: &[&str]) -> Scenario {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let routers = routers
        .iter()
        .map(|r| format!("{r:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let text = format!(
        "trace = \"mooncake_conversation_head.jsonl\"\nrequests = {REQUESTS}\nservers = 8\n\
         routers = [{routers}]\n"
    );
    Scenario::from_toml(&text, &base).unwrap()
}

fn replay(scenario: &Scenario) -> Report {
    runtime()
        .unwrap()
        .block_on(run_scenario(scenario, |_| {}))
        .unwrap()
}

/// One replay of the fixture by the three built-in routers the tests compare, shared.
fn compared() -> &'static Report {
    static REPORT: OnceLock<Report> = OnceLock::new();
    REPORT.get_or_init(|| {
        let report = replay(&scenario(&[
            "builtin:consistent-hash",
            "builtin:round-robin",
            "builtin:cache-aware",
        ]));
        eprintln!("{}", report.table());
        report
    })
}

fn router<'a>(report: &'a Report, name: &str) -> &'a PolicySummary {
    report
        .routers
        .iter()
        .find(|r| r.policy == name)
        .unwrap_or_else(|| panic!("no {name} in the report"))
}

#[test]
fn a_replay_repeats_exactly() {
    let scenario = scenario(&["builtin:consistent-hash"]);
    let first = serde_json::to_value(&replay(&scenario).routers).unwrap();
    let second = serde_json::to_value(&replay(&scenario).routers).unwrap();
    assert_eq!(first, second);
}

#[test]
fn every_request_is_answered_and_the_cap_holds() {
    let report = compared();
    assert_eq!(report.requests, REQUESTS);
    assert!(report.follow_ups > 50, "{} later turns", report.follow_ups);
    for r in &report.routers {
        assert_eq!(r.failed, 0, "{r:?}");
        assert_eq!(r.over_cap, 0, "{}: the host's cap held", r.policy);
        assert_eq!(r.policy_faults, 0, "{r:?}");
        // A prefix cache cannot reuse what the trace never repeated (the servers count in
        // blocks of 16 tokens, the oracle in 512, hence the small allowance).
        assert!(
            r.token_hit_ratio <= report.unbounded.ratio() + 0.01,
            "{}: {} over the unbounded oracle's {}",
            r.policy,
            r.token_hit_ratio,
            report.unbounded.ratio()
        );
    }
}

#[test]
fn the_ring_leaves_less_prefill_than_round_robin() {
    let report = compared();
    let ring = router(report, "builtin:consistent-hash");
    let round_robin = router(report, "builtin:round-robin");
    assert!(
        ring.token_hit_ratio > 1.2 * round_robin.token_hit_ratio,
        "ring {} against round-robin {}",
        ring.token_hit_ratio,
        round_robin.token_hit_ratio
    );
    assert!(ring.uncached_tokens < round_robin.uncached_tokens);
    assert!(
        ring.load_max_mean_requests <= 1.25,
        "{}",
        ring.load_max_mean_requests
    );
}

#[test]
fn cache_aware_routing_reuses_at_least_what_the_ring_does() {
    let report = compared();
    let ring = router(report, "builtin:consistent-hash");
    let aware = router(report, "builtin:cache-aware");
    assert!(
        aware.token_hit_ratio >= ring.token_hit_ratio,
        "cache-aware {} against the ring {}",
        aware.token_hit_ratio,
        ring.token_hit_ratio
    );
}

#[test]
fn on_a_scale_event_only_the_changed_servers_keys_move() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let text = "trace = \"mooncake_conversation_head.jsonl\"\nrequests = 300\nservers = 8\n\
                routers = [\"builtin:consistent-hash\"]\n\
                [[scale]]\nat_s = 60\nremove = \"replay-3\"\n\
                [[scale]]\nat_s = 30\nadd = \"replay-8\"\n";
    let scenario = Scenario::from_toml(text, &base).unwrap();
    let report = replay(&scenario);
    let run = &report.runs[0];
    assert_eq!(report.routers[0].failed, 0, "a removed server drains");
    let changes: Vec<&str> = run.scale.iter().map(|e| e.change.as_str()).collect();
    assert_eq!(
        changes,
        ["add replay-8", "remove replay-3"],
        "in time order"
    );
    for event in &run.scale {
        assert_eq!(event.error, None);
        assert_eq!(event.moved_elsewhere, 0, "{event:?}");
        // About a ninth of the keys go to the new server, and a ninth leave the removed one.
        assert!((600..=1800).contains(&event.keys_moved), "{event:?}");
    }
    // The added server served requests after it joined.
    let added = run.servers.iter().find(|s| s.id == "replay-8").unwrap();
    assert!(added.requests > 0);
    assert!(
        Scenario::from_toml(
            "trace = \"t\"\nrouters = [\"native\"]\n[[scale]]\nat_s = 1\n",
            &base
        )
        .unwrap_err()
        .contains("exactly one of add and remove")
    );
}

#[test]
fn recorded_traffic_replays_as_a_trace() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let dir = std::env::temp_dir().join(format!("ringmaster-replay-record-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let recorded = dir.join("recorded.jsonl");
    let text = format!(
        "trace = \"mooncake_conversation_head.jsonl\"\nrequests = 200\nservers = 8\n\
         routers = [\"builtin:consistent-hash\"]\nrecord = {:?}\n",
        recorded.display().to_string()
    );
    let report = replay(&Scenario::from_toml(&text, &base).unwrap());
    let run = &report.runs[0];
    let again = ringmaster_replay::trace::load_mooncake(&recorded, None).unwrap();
    assert_eq!(again.len(), 200, "one line per finished request");
    // The lines carry the servers' token counts, never text, and the recording's own
    // conversations: later turns share leading blocks with earlier ones.
    let mut prompts: Vec<u32> = run.outcomes.iter().map(|o| o.prompt_tokens).collect();
    let mut recorded_prompts: Vec<u32> = again.iter().map(|r| r.input_tokens).collect();
    prompts.sort_unstable();
    recorded_prompts.sort_unstable();
    assert_eq!(prompts, recorded_prompts);
    let turns = ringmaster_replay::trace::previous_turns(&again);
    assert!(
        turns.iter().any(Option::is_some),
        "conversations survive the recording"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn shared_prefixes_without_conversations_need_more_than_a_key() {
    // Azure's arrivals and lengths with made-up shared prefixes: the routing key (system
    // prompt plus first message) is unique per request, so the ring spreads like round-robin,
    // while a router that looks at the servers' caches finds the shared part.
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let text = "trace = \"azure_code_head.csv\"\nformat = \"azure\"\nservers = 4\n\
                routers = [\"builtin:consistent-hash\", \"builtin:prefix-affinity\"]\n\
                [synthetic]\ngroups = 8\nshared_fraction = 0.5\nseed = 3\n";
    let report = replay(&Scenario::from_toml(text, &base).unwrap());
    assert_eq!(report.requests, 400);
    assert_eq!(report.follow_ups, 0, "no conversations in this trace");
    let ring = router(&report, "builtin:consistent-hash");
    let affinity = router(&report, "builtin:prefix-affinity");
    assert_eq!(ring.failed + affinity.failed, 0);
    assert!(
        affinity.token_hit_ratio > ring.token_hit_ratio,
        "prefix-affinity {} against the ring {}",
        affinity.token_hit_ratio,
        ring.token_hit_ratio
    );
}

/// One server four times slower than the others: the learning router (`learned-ttft`, which
/// learns each server's TTFT through `observe`) sends it less than the ring does and keeps
/// the tail shorter; a scenario naming a server the fleet lacks is refused.
#[test]
fn a_learning_router_sends_less_to_a_slow_server_than_the_ring() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let text = format!(
        "trace = \"mooncake_conversation_head.jsonl\"\nrequests = {REQUESTS}\nservers = 4\n\
         routers = [\"builtin:consistent-hash\", \"builtin:learned-ttft\"]\n\
         slowdown = {{ \"replay-3\" = 4.0 }}\n"
    );
    let scenario = Scenario::from_toml(&text, &base).unwrap();
    assert_eq!(scenario.fleet.slowdown.get("replay-3"), Some(&4.0));
    let report = replay(&scenario);
    eprintln!("{}", report.table());
    let served_by_slow = |i: usize| {
        report.runs[i]
            .servers
            .iter()
            .find(|s| s.id == "replay-3")
            .map_or(0, |s| s.requests)
    };
    let (ring, learner) = (served_by_slow(0), served_by_slow(1));
    assert!(
        learner < ring,
        "the slow server served {learner} (learned) against {ring} (ring)"
    );
    let (ring, learner) = (
        router(&report, "builtin:consistent-hash"),
        router(&report, "builtin:learned-ttft"),
    );
    assert!(
        learner.ttft_p99_s < ring.ttft_p99_s,
        "TTFT p99 {} (learned) against {} (ring)",
        learner.ttft_p99_s,
        ring.ttft_p99_s
    );
    assert_eq!(report.runs[1].policy_faults, 0);
    let err = Scenario::from_toml(
        "trace = \"t\"\nservers = 4\nrouters = [\"native\"]\nslowdown = { \"replay-9\" = 2.0 }\n",
        &base,
    )
    .unwrap_err();
    assert!(err.contains("replay-0..replay-3"), "{err}");
}

/// The default router reading each server's cache three ways: from the engine, from the
/// engine's changes written and read back as vLLM's KV event batches, and not at all (the
/// routing-history estimate). The event view is the engine's cache, so it routes exactly as
/// the in-process view does (the whole trace's comparison is in BENCHMARKS.md).
#[test]
fn the_engine_event_view_routes_as_the_in_process_view_does() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let text = format!(
        "trace = \"mooncake_conversation_head.jsonl\"\nrequests = {REQUESTS}\nservers = 8\n\
         kv_blocks = 6556\nrouters = [\"builtin:prefix-affinity\"]\n\
         cache_views = [\"in_process\", \"vllm_events\", \"routing_history\"]\n"
    );
    let report = replay(&Scenario::from_toml(&text, &base).unwrap());
    eprintln!("{}", report.table());
    let in_process = router(&report, "builtin:prefix-affinity · in_process");
    let events = router(&report, "builtin:prefix-affinity · vllm_events");
    let history = router(&report, "builtin:prefix-affinity · routing_history");
    // Every step's changes arrive whole and in order: the index is the engine's cache, and
    // every decision is the same.
    assert_eq!(events.uncached_tokens, in_process.uncached_tokens);
    assert_eq!(events.decisions, in_process.decisions);
    assert_eq!(
        (events.ttft_p50_s, events.ttft_p99_s),
        (in_process.ttft_p50_s, in_process.ttft_p99_s)
    );
    // The estimate reads nothing from the engines: other decisions.
    assert_ne!(history.uncached_tokens, in_process.uncached_tokens);
    assert_eq!(history.failed, in_process.failed);
}

#[test]
fn an_unknown_cache_view_is_refused_with_the_known_ones() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let text = "trace = \"mooncake_conversation_head.jsonl\"\nrouters = [\"native\"]\n\
                cache_views = [\"psychic\"]\n";
    let error = Scenario::from_toml(text, &base).unwrap_err();
    assert!(
        error.contains("cache_views") && error.contains("vllm_events"),
        "{error}"
    );
}

/// Claude Code's billing line on a made-up agent trace: kept, it makes every engine's prefix
/// cache miss; taken out (the gateway's default), it costs nothing at all.
#[test]
fn the_billing_line_costs_the_cache_everything_unless_the_gateway_takes_it_out() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scenario = Scenario::from_toml(
        "format = \"agent\"\nservers = 3\nbilling_line = [\"none\", \"raw\", \"hygiene\"]\n\
         routers = [\"builtin:prefix-affinity\"]\n[agent]\nsessions = 6\nturns_max = 10\n",
        base,
    )
    .unwrap();
    let report = replay(&scenario);
    let hit = |line: &str| {
        router(
            &report,
            &format!("builtin:prefix-affinity · billing line {line}"),
        )
        .token_hit_ratio
    };
    eprintln!("{}", report.table());
    assert!(hit("none") > 0.5, "{}", hit("none"));
    assert!(hit("raw") < 0.05, "{}", hit("raw"));
    assert!(
        (hit("hygiene") - hit("none")).abs() <= 0.01,
        "{} vs {}",
        hit("hygiene"),
        hit("none")
    );
}

/// A goodput sweep over an aggregated and a disaggregated fleet: the split requests go to the
/// prefill servers and decode elsewhere, the decode servers' token gaps are shorter than an
/// aggregated server's (no prompt chunks in their steps), attainment falls as the rate rises,
/// and the goodput is bracketed by runs within 10 % of each other.
#[test]
fn a_goodput_sweep_splits_requests_and_measures_their_token_gaps() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let text = "trace = \"mooncake_conversation_head.jsonl\"\nrequests = 300\nservers = 4\n\
                routers = [\"builtin:prefix-affinity\"]\n\
                [disaggregation]\nlayouts = [\"aggregated\", \"1P3D\"]\n\
                pair_rules = [{ min_uncached_tokens = 0, when_prefill_busy = \"wait\" }, {}]\n\
                rates = [1.0, 4.0]\n\
                [[disaggregation.slo]]\nname = \"tight\"\nttft_s = 5.0\nitl_s = 0.02\n";
    let scenario = Scenario::from_toml(text, &base).unwrap();
    assert_eq!(scenario.runs(), 6);
    let report = replay(&scenario);
    assert_eq!(
        report.goodput.len(),
        3,
        "aggregated, and 1P3D with two rules"
    );
    let aggregated = &report.goodput[0];
    let always = &report.goodput[1];
    assert_eq!(aggregated.points[0].split, 0);
    assert_eq!(always.points[0].split, 300, "every request split");
    // Decode servers that never prefill: their worst token gaps are a decode step's.
    assert!(
        always.points[0].itl_s[2] < aggregated.points[0].itl_s[2],
        "ITL p99 {} split against {} aggregated",
        always.points[0].itl_s[2],
        aggregated.points[0].itl_s[2]
    );
    for row in &report.goodput {
        assert_eq!(row.points.len(), 2);
        assert!(row.points[1].attainment[0] <= row.points[0].attainment[0] + 1e-9);
        assert_eq!(row.points[0].failed, 0);
        // The goodput is a bracket of two runs, not a figure between them: the lower end met
        // 90 %, the upper end missed it and is within 10 % of it, and nothing run above the
        // lower end met it.
        let bracket = row.goodput[0];
        let all = row.all_points();
        let attained = |rate: f64| {
            all.iter()
                .find(|p| p.rate_rps == rate)
                .unwrap_or_else(|| panic!("{}: {rate} req/s was not run", row.label))
                .attainment[0]
        };
        if let Some(pass) = bracket.pass_rps {
            assert!(attained(pass) >= 0.9, "{}: {bracket:?}", row.label);
            assert!(
                all.iter()
                    .all(|p| p.rate_rps <= pass || p.attainment[0] < 0.9)
            );
        }
        if let Some(fail) = bracket.fail_rps {
            assert!(attained(fail) < 0.9, "{}: {bracket:?}", row.label);
        }
        if let (Some(pass), Some(fail)) = (bracket.pass_rps, bracket.fail_rps) {
            assert!(
                fail <= pass * ringmaster_replay::goodput::BRACKET_RATIO * (1.0 + 1e-9),
                "{}: {bracket:?}",
                row.label
            );
            // From a 4x gap, the bisection took runs of its own.
            assert!(!row.bisection.is_empty(), "{}", row.label);
        }
    }
    let table = ringmaster_replay::goodput::table(
        &report.goodput,
        &scenario.goodput.as_ref().unwrap().slos,
        0,
    );
    assert!(
        table.contains("| 1P3D · split at ≥ 0 uncached tokens, waiting for busy prefill servers |"),
        "{table}"
    );
}
