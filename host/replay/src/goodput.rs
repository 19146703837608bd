//! Goodput of a fleet (DistServe, Zhong et al., OSDI 2024): the highest request rate at which
//! a share of the requests (`attainment`, 90 % by default) meet both a time-to-first-token
//! (TTFT) SLO and a time-per-output-token (TPOT) SLO. Each fleet layout (aggregated, or `xPyD`:
//! x prefill and y decode servers) and pair rule is replayed at the scenario's multiples of the
//! trace's own arrival rate; then, per SLO, more runs bisect between the highest rate that met
//! the target and the next one run above it, which did not, until the two are within
//! [`BRACKET_RATIO`] of each other. The goodput is reported as that bracket of two measured
//! rates, never a figure interpolated between them: between two rates run, attainment can fall
//! in any shape, so a figure interpolated across a 2× gap could be anywhere in that gap.
//!
//! The SLOs, as DistServe defines them (see [`SLO_DEFINITIONS`]): a request's TTFT is the time
//! from its arrival to its first token; its TPOT is (end-to-end latency − TTFT) / (output
//! tokens − 1), the mean time per token after the first. A request meets an SLO when it did not
//! fail, its TTFT is within the bound, and its TPOT is (a one-token answer has no TPOT and is
//! judged on its TTFT alone).
//!
//! What can go wrong: attainment need not fall monotonically with the rate (a layout whose
//! queues settle differently can miss at one rate and meet at a higher one). The bracket is
//! then where attainment last crosses the target among the rates run: its lower end is the
//! highest rate of all those run that met it, its upper end the lowest run above that, and
//! every rate run above the lower end missed.
//!
//! This module owns the sweep, the bisection and its figures; it must not write files
//! ([`crate::publish`]).

use serde::Serialize;

use crate::report::percentile;
use crate::run::{self, Outcome, RunData};
use crate::trace::TraceRequest;
use crate::{BillingLine, Fleet, PairRun, ReplayError};

/// How narrow the bisection makes each bracket: the lowest rate that missed the target is at
/// most this multiple of the highest that met it (10 %). Each halving (in ratio) of the
/// bracket costs a replay of the whole trace; from a 2× gap between the scenario's rates, three
/// runs reach it.
pub const BRACKET_RATIO: f64 = 1.10;

/// The SLO definitions the tables are read against, for the text beside them (its 10 % is
/// [`BRACKET_RATIO`]).
pub const SLO_DEFINITIONS: &str = "SLOs as DistServe (Zhong et al., OSDI 2024) defines them: \
     **TTFT** is the time from a request's arrival to its first token; **TPOT**, per request, \
     is (end-to-end latency − TTFT) / (output tokens − 1), its mean time per output token \
     after the first. A request meets an SLO when it did not fail and both its TTFT and its \
     TPOT are within the SLO's bounds (a one-token answer has no TPOT and is judged on its \
     TTFT). Goodput is the highest rate at which the target share of requests meet it, \
     reported as a bracket of two measured rates, `a–b`: a met the target, b (at most 10 % \
     above a) missed it, and every rate run above a missed it; `≥ a`: even the highest rate \
     run met it; `< b`: not even the lowest did. Nothing is interpolated.";

/// A fleet's layout: how many of its servers are prefill servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// Prefill servers (0: aggregated).
    pub prefill: usize,
    /// Decode servers (all of them, aggregated).
    pub decode: usize,
}

impl Layout {
    /// `aggregated`, or `xPyD`, for `servers` in all.
    pub fn parse(name: &str, servers: usize) -> Result<Self, String> {
        if name == "aggregated" {
            return Ok(Self {
                prefill: 0,
                decode: servers,
            });
        }
        let parsed = name
            .strip_suffix('D')
            .and_then(|rest| rest.split_once('P'))
            .and_then(|(p, d)| Some((p.parse::<usize>().ok()?, d.parse::<usize>().ok()?)));
        match parsed {
            Some((prefill, decode)) if prefill > 0 && decode > 0 && prefill + decode == servers => {
                Ok(Self { prefill, decode })
            }
            _ => Err(format!(
                "layout {name:?}: expected \"aggregated\" or xPyD with x + y = {servers} servers \
                 (x, y at least 1)"
            )),
        }
    }

    /// Its name.
    pub fn name(&self) -> String {
        if self.prefill == 0 {
            "aggregated".to_owned()
        } else {
            format!("{}P{}D", self.prefill, self.decode)
        }
    }
}

/// What a goodput sweep replays and what it counts as good.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GoodputSpec {
    /// The layouts compared.
    pub layouts: Vec<Layout>,
    /// The host pair rules compared on each disaggregated layout.
    pub pair_rules: Vec<PairRule>,
    /// Routers that answer the pair themselves (`ringmaster:policy@0.3.0`), each replayed on
    /// every disaggregated layout.
    pub pair_routers: Vec<String>,
    /// Multiples of the trace's arrival rate.
    pub rates: Vec<f64>,
    /// The SLOs goodput is measured against (each run is read against every one).
    pub slos: Vec<Slo>,
    /// The share of requests that must meet both.
    pub attainment: f64,
    /// The KV link between servers, GB/s.
    pub link_gbps: Option<f64>,
    /// Its setup time per transfer, µs.
    pub link_latency_us: Option<f64>,
}

/// A pair of SLOs a request must meet (see [`SLO_DEFINITIONS`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Slo {
    /// Its name in the tables.
    pub name: String,
    /// Time to first token, seconds.
    pub ttft_s: f64,
    /// Time per output token after the first (DistServe's TPOT), seconds; the scenario's
    /// `itl_s`.
    pub itl_s: f64,
}

/// A host pair rule: `[disaggregation]`'s keys (`None`: the gateway's default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PairRule {
    /// `min_uncached_tokens`.
    pub min_uncached_tokens: Option<u32>,
    /// `when_prefill_busy`: `decode` or `wait`.
    pub when_prefill_busy: Option<&'static str>,
}

impl PairRule {
    /// How a table names it.
    pub fn label(&self) -> String {
        let threshold = self.min_uncached_tokens.map_or_else(
            || "the default rule".to_owned(),
            |t| format!("split at ≥ {t} uncached tokens"),
        );
        match self.when_prefill_busy {
            Some("wait") => format!("{threshold}, waiting for busy prefill servers"),
            Some(_) => format!("{threshold}, decoding whole past busy prefill servers"),
            None => threshold,
        }
    }
}

/// One layout and rule at one rate.
#[derive(Clone, Debug, Serialize)]
pub struct RatePoint {
    /// Requests per second offered.
    pub rate_rps: f64,
    /// Per SLO, the share of requests that met both its bounds.
    pub attainment: Vec<f64>,
    /// TTFT p50 / p90 / p99, seconds.
    pub ttft_s: [f64; 3],
    /// Inter-token gaps over every token, p50 / p90 / p99, seconds.
    pub itl_s: [f64; 3],
    /// Requests that failed.
    pub failed: usize,
    /// Requests split between a prefill and a decode server.
    pub split: u64,
}

/// One layout and rule over every rate.
#[derive(Clone, Debug, Serialize)]
pub struct GoodputRow {
    /// `layout` or `layout · rule`.
    pub label: String,
    /// The layout.
    pub layout: Layout,
    /// The pair rule (`None`: aggregated).
    pub rule: Option<PairRule>,
    /// Per rate of the scenario's, in order.
    pub points: Vec<RatePoint>,
    /// The runs the bisection added, in the order they ran.
    pub bisection: Vec<RatePoint>,
    /// Per SLO, the goodput.
    pub goodput: Vec<Goodput>,
}

impl GoodputRow {
    /// Every run, the scenario's rates and the bisection's, by rate.
    pub fn all_points(&self) -> Vec<&RatePoint> {
        let mut all: Vec<&RatePoint> = self.points.iter().chain(&self.bisection).collect();
        all.sort_by(|a, b| a.rate_rps.total_cmp(&b.rate_rps));
        all
    }
}

/// A goodput against one SLO: the bracket of measured rates it lies in.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Goodput {
    /// The highest rate run whose attainment met the target, requests per second (`None`:
    /// not even the lowest rate run did).
    pub pass_rps: Option<f64>,
    /// The lowest rate run above `pass_rps` (above nothing: the lowest rate run), which
    /// missed the target (`None`: nothing run above `pass_rps` missed it, so the goodput is at
    /// least that).
    pub fail_rps: Option<f64>,
}

impl Goodput {
    /// The bracket as a table writes it: `a–b`, `≥ a` or `< b`.
    pub fn label(&self) -> String {
        match (self.pass_rps, self.fail_rps) {
            (Some(pass), Some(fail)) => format!("{pass:.2}–{fail:.2}"),
            (Some(pass), None) => format!("≥ {pass:.2}"),
            (None, Some(fail)) => format!("< {fail:.2}"),
            (None, None) => "–".to_owned(),
        }
    }

    /// The goodput's bounds, `[low, high]`: nothing known below is 0, nothing above infinite.
    fn bounds(&self) -> (f64, f64) {
        (
            self.pass_rps.unwrap_or(0.0),
            self.fail_rps.unwrap_or(f64::INFINITY),
        )
    }
}

/// What the bisection does next, given every rate run so far.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Step {
    /// Run this rate (requests per second) and ask again.
    Run(f64),
    /// The bracket is narrow enough, or cannot be narrowed (see [`Goodput`]).
    Done(Goodput),
}

/// The bisection's next step for one SLO, from `runs`: each rate run (requests per second, any
/// order) and whether its attainment met the target. The bracket is the highest rate that met
/// it and the lowest run above that; while the upper end is more than [`BRACKET_RATIO`] times
/// the lower, the next run is at their geometric mean (the bracket's ratio is what must shrink,
/// and the geometric mean halves it in log terms). A bracket with a missing end cannot be
/// narrowed by bisecting and is done: the lowest rate missed, or nothing above the highest
/// rate that met it missed.
pub fn next_step(runs: &[(f64, bool)]) -> Step {
    let pass = runs
        .iter()
        .filter(|(_, met)| *met)
        .map(|(rate, _)| *rate)
        .max_by(f64::total_cmp);
    let fail = runs
        .iter()
        .filter(|(rate, met)| !*met && pass.is_none_or(|p| *rate > p))
        .map(|(rate, _)| *rate)
        .min_by(f64::total_cmp);
    let bracket = Goodput {
        pass_rps: pass,
        fail_rps: fail,
    };
    match (pass, fail) {
        (Some(pass), Some(fail)) if fail > pass * BRACKET_RATIO => Step::Run((pass * fail).sqrt()),
        _ => Step::Done(bracket),
    }
}

/// The trace's own arrival rate: requests per second from the first arrival to the last.
pub fn trace_rate(requests: &[TraceRequest]) -> f64 {
    match (requests.first(), requests.last()) {
        (Some(first), Some(last)) if last.arrival > first.arrival => {
            requests.len() as f64 / (last.arrival - first.arrival).as_secs_f64()
        }
        _ => 1.0,
    }
}

/// Sweeps `spec` over `fleet` routed by `router`: one row per aggregated layout, one per
/// disaggregated layout and pair rule. `progress` hears each run's label.
pub async fn sweep(
    fleet: &Fleet,
    router: &str,
    spec: &GoodputSpec,
    (requests, turns): (&[TraceRequest], &[Vec<usize>]),
    mut progress: impl FnMut(&str),
) -> Result<Vec<GoodputRow>, ReplayError> {
    let mut rows = Vec::new();
    for layout in &spec.layouts {
        let rules: Vec<Option<PairRule>> = if layout.prefill == 0 {
            vec![None]
        } else {
            spec.pair_rules.iter().copied().map(Some).collect()
        };
        for rule in rules {
            let label = match rule {
                None => layout.name(),
                Some(rule) => format!("{} · {}", layout.name(), rule.label()),
            };
            rows.push(
                sweep_row(
                    fleet,
                    (router, *layout, rule, label),
                    spec,
                    (requests, turns),
                    &mut progress,
                )
                .await?,
            );
        }
    }
    Ok(rows)
}

/// Sweeps each of `spec.pair_routers` over every disaggregated layout: the router answers
/// the pair itself, so the host's rules do not apply and each layout is one row.
pub async fn sweep_pair_routers(
    fleet: &Fleet,
    spec: &GoodputSpec,
    (requests, turns): (&[TraceRequest], &[Vec<usize>]),
    mut progress: impl FnMut(&str),
) -> Result<Vec<GoodputRow>, ReplayError> {
    let mut rows = Vec::new();
    for router in &spec.pair_routers {
        for layout in spec.layouts.iter().filter(|l| l.prefill > 0) {
            let label = format!("{} · {router}", layout.name());
            rows.push(
                sweep_row(
                    fleet,
                    (router, *layout, None, label),
                    spec,
                    (requests, turns),
                    &mut progress,
                )
                .await?,
            );
        }
    }
    Ok(rows)
}

/// One row: `router` on `layout` under `rule` (`None`: the gateway's default) at every rate.
async fn sweep_row(
    fleet: &Fleet,
    (router, layout, rule, label): (&str, Layout, Option<PairRule>, String),
    spec: &GoodputSpec,
    (requests, turns): (&[TraceRequest], &[Vec<usize>]),
    progress: &mut impl FnMut(&str),
) -> Result<GoodputRow, ReplayError> {
    let base = trace_rate(requests);
    let fleet = Fleet {
        servers: layout.prefill + layout.decode,
        prefill_servers: layout.prefill,
        pair: PairRun {
            min_uncached_tokens: rule.and_then(|r| r.min_uncached_tokens),
            link_gbps: spec.link_gbps,
            link_latency_us: spec.link_latency_us,
            when_prefill_busy: rule.and_then(|r| r.when_prefill_busy),
        },
        ..fleet.clone()
    };
    let run_at = |rate: f64| {
        run::replay_at(
            &fleet,
            (router, "in_process", BillingLine::None),
            (requests, turns),
            &[],
            rate,
        )
    };
    let mut points = Vec::new();
    for &rate in &spec.rates {
        progress(&format!("{label} at {rate}× the trace's rate"));
        points.push(point(&run_at(rate).await?, base * rate, spec));
    }
    // Each SLO's bracket in turn; a run made for one counts for the others too.
    let mut bisection: Vec<RatePoint> = Vec::new();
    let mut goodput = Vec::with_capacity(spec.slos.len());
    for (slo, bounds) in spec.slos.iter().enumerate() {
        loop {
            let runs: Vec<(f64, bool)> = points
                .iter()
                .chain(&bisection)
                .map(|p| (p.rate_rps, meets(p, slo, spec.attainment)))
                .collect();
            match next_step(&runs) {
                Step::Done(bracket) => {
                    goodput.push(bracket);
                    break;
                }
                Step::Run(rate_rps) => {
                    let multiple = rate_rps / base;
                    progress(&format!(
                        "{label} at {multiple:.3}× the trace's rate (bisecting {})",
                        bounds.name
                    ));
                    bisection.push(point(&run_at(multiple).await?, rate_rps, spec));
                }
            }
        }
    }
    Ok(GoodputRow {
        label,
        layout,
        rule,
        points,
        bisection,
        goodput,
    })
}

/// Whether the run `point` met the attainment `target` of SLO `slo`.
fn meets(point: &RatePoint, slo: usize, target: f64) -> bool {
    point.attainment.get(slo).is_some_and(|a| *a >= target)
}

/// A request's TPOT as DistServe defines it: (end-to-end latency − TTFT) / (output tokens − 1);
/// `None` for a request that failed before its first token or answered fewer than two.
pub fn tpot(outcome: &Outcome) -> Option<f64> {
    let ttft = outcome.ttft_s?;
    (outcome.output_tokens >= 2)
        .then(|| (outcome.e2e_s - ttft).max(0.0) / f64::from(outcome.output_tokens - 1))
}

/// What one run at `rate_rps` measured against the SLOs.
fn point(data: &RunData, rate_rps: f64, spec: &GoodputSpec) -> RatePoint {
    let total = data.outcomes.len().max(1);
    let attainment = spec
        .slos
        .iter()
        .map(|slo| {
            let good = data
                .outcomes
                .iter()
                .filter(|o| o.error.is_none())
                .filter(|o| o.ttft_s.is_some_and(|t| t <= slo.ttft_s))
                .filter(|o| tpot(o).is_none_or(|t| t <= slo.itl_s))
                .count();
            good as f64 / total as f64
        })
        .collect();
    let mut ttft: Vec<f64> = data.outcomes.iter().filter_map(|o| o.ttft_s).collect();
    let mut gaps: Vec<f64> = data
        .outcomes
        .iter()
        .flat_map(|o| o.gaps.iter().map(|g| f64::from(*g)))
        .collect();
    let quantiles = |values: &mut Vec<f64>| {
        [
            percentile(values, 0.50),
            percentile(values, 0.90),
            percentile(values, 0.99),
        ]
    };
    RatePoint {
        rate_rps,
        attainment,
        ttft_s: quantiles(&mut ttft),
        itl_s: quantiles(&mut gaps),
        failed: data.outcomes.iter().filter(|o| o.error.is_some()).count(),
        split: data
            .pairs
            .iter()
            .find(|(outcome, _)| outcome == "split")
            .map_or(0, |(_, n)| *n),
    }
}

/// The Markdown table of `rows`: per SLO, the goodput's bracket and its ratio to the aggregated
/// fleet's (a range: both are brackets); each row's requests split and latencies at the rate
/// given by `at` (an index into the scenario's rates); its attainment of the first SLO at each
/// of the scenario's rates (the bisection's runs are in the JSON and the plots).
pub fn table(rows: &[GoodputRow], slos: &[Slo], at: usize) -> String {
    let aggregated = rows.iter().find(|r| r.layout.prefill == 0);
    let mut out = String::from("| fleet · pair rule |");
    for slo in slos {
        out.push_str(&format!(" goodput, {} (req/s, met–missed) |", slo.name));
    }
    out.push_str(
        " split | TTFT p50 / p90 / p99 | ITL p50 / p90 / p99 | attainment per rate (first SLO) |\n|---|",
    );
    for _ in slos {
        out.push_str("---|");
    }
    out.push_str("---|---|---|---|\n");
    for row in rows {
        out.push_str(&format!("| {} |", row.label));
        for (i, goodput) in row.goodput.iter().enumerate() {
            let ratio = aggregated
                .and_then(|a| a.goodput.get(i))
                .filter(|_| row.layout.prefill > 0)
                .map_or_else(String::new, |base| ratio(goodput, base));
            out.push_str(&format!(" {}{ratio} |", goodput.label()));
        }
        let point = row.points.get(at).or(row.points.last());
        let (split, ttft, itl) = point.map_or_else(
            || ("–".to_owned(), "–".to_owned(), "–".to_owned()),
            |p| {
                (
                    p.split.to_string(),
                    format!(
                        "{} / {} / {}",
                        ms(p.ttft_s[0]),
                        ms(p.ttft_s[1]),
                        ms(p.ttft_s[2])
                    ),
                    format!(
                        "{} / {} / {}",
                        ms(p.itl_s[0]),
                        ms(p.itl_s[1]),
                        ms(p.itl_s[2])
                    ),
                )
            },
        );
        let attainment = row
            .points
            .iter()
            .map(|p| {
                format!(
                    "{:.0} %",
                    100.0 * p.attainment.first().copied().unwrap_or(0.0)
                )
            })
            .collect::<Vec<_>>()
            .join(" · ");
        out.push_str(&format!(" {split} | {ttft} | {itl} | {attainment} |\n"));
    }
    out
}

/// The ratio of `goodput` to `base` as far as the two brackets bound it: above
/// `low / base's high`, below `high / base's low` (empty when neither end is known).
fn ratio(goodput: &Goodput, base: &Goodput) -> String {
    let (low, high) = goodput.bounds();
    let (base_low, base_high) = base.bounds();
    let floor = low / base_high;
    let ceiling = if base_low > 0.0 {
        high / base_low
    } else {
        f64::INFINITY
    };
    match (floor > 0.0, ceiling.is_finite()) {
        (true, true) => format!(" ({floor:.2}–{ceiling:.2}×)"),
        (true, false) => format!(" (≥ {floor:.2}×)"),
        (false, true) => format!(" (< {ceiling:.2}×)"),
        (false, false) => String::new(),
    }
}

fn ms(seconds: f64) -> String {
    if seconds >= 10.0 {
        format!("{seconds:.1} s")
    } else if seconds >= 1.0 {
        format!("{seconds:.2} s")
    } else {
        format!("{:.0} ms", seconds * 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_named_as_the_field_names_them() {
        assert_eq!(
            Layout::parse("2P6D", 8).unwrap(),
            Layout {
                prefill: 2,
                decode: 6
            }
        );
        assert_eq!(Layout::parse("aggregated", 8).unwrap().name(), "aggregated");
        assert_eq!(Layout::parse("4P4D", 8).unwrap().name(), "4P4D");
        for bad in ["3P3D", "0P8D", "8P0D", "2p6d", "P6D"] {
            assert!(Layout::parse(bad, 8).is_err(), "{bad}");
        }
    }

    /// Runs the scenario's `rates`, then the bisection, against a synthetic `attainment` of
    /// the rate, as `sweep_row` does against replays; returns the bracket and the rates the
    /// bisection added.
    fn bisect(rates: &[f64], attainment: impl Fn(f64) -> f64, target: f64) -> (Goodput, Vec<f64>) {
        let mut runs: Vec<(f64, bool)> = rates
            .iter()
            .map(|&r| (r, attainment(r) >= target))
            .collect();
        let mut added = Vec::new();
        loop {
            match next_step(&runs) {
                Step::Done(bracket) => return (bracket, added),
                Step::Run(rate) => {
                    assert!(added.len() < 32, "the bisection does not end: {added:?}");
                    assert!(
                        runs.iter().all(|(r, _)| (r - rate).abs() > 1e-12),
                        "{rate} was run already"
                    );
                    runs.push((rate, attainment(rate) >= target));
                    added.push(rate);
                }
            }
        }
    }

    fn within_ten_percent(bracket: Goodput) -> bool {
        let (pass, fail) = (bracket.pass_rps.unwrap(), bracket.fail_rps.unwrap());
        pass < fail && fail <= pass * BRACKET_RATIO * (1.0 + 1e-12)
    }

    #[test]
    fn a_step_in_attainment_is_bracketed_within_ten_percent_by_runs() {
        // Rates 2x apart, as the scenarios' are; the step anywhere between the lowest and the
        // highest.
        let rates = [1.0, 2.0, 4.0, 8.0];
        let mut step = 1.01;
        while step < 8.0 {
            let attainment = |rate: f64| if rate <= step { 0.95 } else { 0.40 };
            let (bracket, added) = bisect(&rates, attainment, 0.9);
            let (pass, fail) = (bracket.pass_rps.unwrap(), bracket.fail_rps.unwrap());
            assert!(
                pass <= step && step < fail,
                "step {step}: bracket {pass}–{fail}"
            );
            assert!(within_ten_percent(bracket), "step {step}: {pass}–{fail}");
            // A 2x gap takes three halvings of its ratio: 2 → 1.41 → 1.19 → 1.09.
            assert_eq!(added.len(), 3, "step {step}: {added:?}");
            // Both ends were run: neither is a point between runs.
            assert!(rates.contains(&pass) || added.contains(&pass));
            assert!(rates.contains(&fail) || added.contains(&fail));
            step *= 1.07;
        }
    }

    #[test]
    fn a_smooth_fall_is_bracketed_where_it_crosses_the_target() {
        // Attainment falls linearly and crosses 90 % at 2.5 req/s.
        let attainment = |rate: f64| (1.0 - 0.04 * rate).clamp(0.0, 1.0);
        let (bracket, _) = bisect(&[0.5, 1.0, 2.0, 4.0], attainment, 0.9);
        assert!(within_ten_percent(bracket), "{bracket:?}");
        assert!(bracket.pass_rps.unwrap() <= 2.5 && 2.5 < bracket.fail_rps.unwrap());
        assert!(attainment(bracket.pass_rps.unwrap()) >= 0.9);
        assert!(attainment(bracket.fail_rps.unwrap()) < 0.9);
    }

    #[test]
    fn a_rate_that_always_or_never_meets_the_target_is_reported_as_such() {
        let rates = [1.0, 2.0, 4.0];
        let (always, added) = bisect(&rates, |_| 1.0, 0.9);
        assert!(added.is_empty(), "{added:?}");
        assert_eq!(
            always,
            Goodput {
                pass_rps: Some(4.0),
                fail_rps: None
            }
        );
        assert_eq!(always.label(), "≥ 4.00");
        let (never, added) = bisect(&rates, |_| 0.5, 0.9);
        assert!(added.is_empty(), "{added:?}");
        assert_eq!(
            never,
            Goodput {
                pass_rps: None,
                fail_rps: Some(1.0)
            }
        );
        assert_eq!(never.label(), "< 1.00");
        // Exactly the target meets it.
        assert_eq!(bisect(&[1.0], |_| 0.9, 0.9).0.pass_rps, Some(1.0));
    }

    #[test]
    fn attainment_that_rises_again_is_bracketed_at_its_last_crossing() {
        // Meets at 1, misses at 2, meets again at 3, misses from 3.5 on.
        let attainment = |rate: f64| match rate {
            r if r <= 1.5 => 0.95,
            r if r <= 2.5 => 0.80,
            r if r <= 3.5 => 0.92,
            _ => 0.30,
        };
        let (bracket, added) = bisect(&[1.0, 2.0, 3.0, 4.0], attainment, 0.9);
        assert!(within_ten_percent(bracket), "{bracket:?}");
        let (pass, fail) = (bracket.pass_rps.unwrap(), bracket.fail_rps.unwrap());
        assert!(pass <= 3.5 && 3.5 < fail, "{pass}–{fail}");
        // Every rate run above the lower end missed.
        for rate in [1.0, 2.0, 3.0, 4.0].iter().chain(&added) {
            assert!(*rate <= pass || attainment(*rate) < 0.9, "{rate}");
        }
    }

    #[test]
    fn a_bracket_within_ten_percent_is_not_bisected_further() {
        assert_eq!(
            next_step(&[(1.0, true), (1.1, false)]),
            Step::Done(Goodput {
                pass_rps: Some(1.0),
                fail_rps: Some(1.1)
            })
        );
        match next_step(&[(1.0, true), (1.2, false)]) {
            Step::Run(rate) => assert!((rate - 1.2f64.sqrt()).abs() < 1e-12, "{rate}"),
            done => panic!("a 20 % bracket is bisected: {done:?}"),
        }
        // A miss below the highest rate that met the target is not the bracket's upper end.
        assert_eq!(
            next_step(&[(1.0, false), (2.0, true), (2.1, false)]),
            Step::Done(Goodput {
                pass_rps: Some(2.0),
                fail_rps: Some(2.1)
            })
        );
    }

    #[test]
    fn the_ratio_to_the_aggregated_fleet_spans_both_brackets() {
        let bracket = |pass, fail| Goodput {
            pass_rps: pass,
            fail_rps: fail,
        };
        let aggregated = bracket(Some(2.0), Some(2.2));
        // Above 3 / 2.2, below 3.3 / 2.
        assert_eq!(
            ratio(&bracket(Some(3.0), Some(3.3)), &aggregated),
            " (1.36–1.65×)"
        );
        assert_eq!(ratio(&bracket(Some(3.0), None), &aggregated), " (≥ 1.36×)");
        assert_eq!(ratio(&bracket(None, Some(1.0)), &aggregated), " (< 0.50×)");
        assert_eq!(
            ratio(&bracket(Some(3.0), Some(3.3)), &bracket(None, Some(1.0))),
            " (≥ 3.00×)"
        );
        assert_eq!(
            ratio(&bracket(None, Some(1.0)), &bracket(None, Some(1.0))),
            ""
        );
    }

    #[test]
    fn tpot_is_the_time_after_the_first_token_over_the_tokens_after_it() {
        let outcome = |ttft_s, e2e_s, output_tokens| Outcome {
            ttft_s,
            e2e_s,
            output_tokens,
            ..Outcome::default()
        };
        // 2 s after the first token for 4 more tokens.
        let tpot_s = tpot(&outcome(Some(0.5), 2.5, 5)).unwrap();
        assert!((tpot_s - 0.5).abs() < 1e-12, "{tpot_s}");
        assert_eq!(
            tpot(&outcome(Some(0.5), 0.5, 1)),
            None,
            "one token: no TPOT"
        );
        assert_eq!(tpot(&outcome(None, 3.0, 0)), None, "failed first");
    }

    #[test]
    fn a_request_meets_an_slo_only_within_both_bounds() {
        let spec = GoodputSpec {
            layouts: vec![],
            pair_rules: vec![],
            pair_routers: vec![],
            rates: vec![1.0],
            slos: vec![Slo {
                name: "s".into(),
                ttft_s: 1.0,
                itl_s: 0.1,
            }],
            attainment: 0.9,
            link_gbps: None,
            link_latency_us: None,
        };
        let outcome = |ttft_s: f64, e2e_s: f64, output_tokens: u32| Outcome {
            ttft_s: Some(ttft_s),
            e2e_s,
            output_tokens,
            ..Outcome::default()
        };
        let data = RunData {
            outcomes: vec![
                outcome(0.5, 1.4, 10), // TTFT 0.5, TPOT 0.1: met
                outcome(1.5, 2.4, 10), // TTFT over
                outcome(0.5, 2.0, 10), // TPOT 0.167 over
                outcome(0.9, 0.9, 1),  // one token, TTFT within: met
            ],
            load: vec![],
            servers: vec![],
            decisions: vec![],
            policy_faults: 0,
            over_cap: 0,
            makespan_s: 0.0,
            scale: vec![],
            pairs: vec![],
        };
        let measured = point(&data, 1.0, &spec);
        assert!(
            (measured.attainment[0] - 0.5).abs() < 1e-12,
            "{:?}",
            measured.attainment
        );
        assert!(meets(&measured, 0, 0.5) && !meets(&measured, 0, 0.51));
    }
}
