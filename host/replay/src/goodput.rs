//! Goodput of a fleet (DistServe, OSDI 2024): the highest request rate at which a share of the
//! requests (`attainment`, 90 % by default) meet both a time-to-first-token SLO and an
//! inter-token SLO (the request's mean gap between tokens after the first). Each fleet layout
//! (aggregated, or `xPyD`: x prefill and y decode servers) and pair rule is replayed at
//! several multiples of the trace's own arrival rate; attainment is read at each, against each
//! SLO, and the goodput is where it crosses the target.
//!
//! This module owns the sweep and its figures; it must not write files ([`crate::publish`]).

use serde::Serialize;

use crate::report::percentile;
use crate::run::{self, RunData};
use crate::trace::TraceRequest;
use crate::{BillingLine, Fleet, PairRun, ReplayError};

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

/// A pair of SLOs a request must meet.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Slo {
    /// Its name in the tables.
    pub name: String,
    /// Time to first token, seconds.
    pub ttft_s: f64,
    /// The request's mean gap between tokens after the first, seconds.
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
    /// Per rate, in order.
    pub points: Vec<RatePoint>,
    /// Per SLO, the goodput.
    pub goodput: Vec<Goodput>,
}

/// A goodput against one SLO.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Goodput {
    /// The highest rate that meets the attainment, requests per second (interpolated where
    /// attainment crosses the target; `None`: not even the lowest rate does).
    pub rps: Option<f64>,
    /// Whether even the highest rate met it (the goodput is at least that).
    pub at_least: bool,
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
    let mut points = Vec::new();
    for &rate in &spec.rates {
        progress(&format!("{label} at {rate}× the trace's rate"));
        let data = run::replay_at(
            &fleet,
            (router, "in_process", BillingLine::None),
            (requests, turns),
            &[],
            rate,
        )
        .await?;
        points.push(point(&data, base * rate, spec));
    }
    let goodput = (0..spec.slos.len())
        .map(|slo| goodput(&points, slo, spec.attainment))
        .collect();
    Ok(GoodputRow {
        label,
        layout,
        rule,
        points,
        goodput,
    })
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
                .filter(|o| o.tpot_s.is_none_or(|t| t <= slo.itl_s))
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

/// The highest rate whose attainment of SLO `slo` meets `target`, interpolated linearly
/// between the last rate that meets it and the next (which does not); whether the highest
/// rate met it.
pub fn goodput(points: &[RatePoint], slo: usize, target: f64) -> Goodput {
    let at = |p: &RatePoint| p.attainment.get(slo).copied().unwrap_or(0.0);
    let mut best = None;
    for (i, point) in points.iter().enumerate() {
        if at(point) < target {
            continue;
        }
        best = Some(point.rate_rps);
        match points.get(i + 1) {
            Some(next) if at(next) < target => {
                let drop = at(point) - at(next);
                let share = if drop > 0.0 {
                    (at(point) - target) / drop
                } else {
                    0.0
                };
                best = Some(point.rate_rps + share * (next.rate_rps - point.rate_rps));
            }
            Some(_) => {}
            None => {
                return Goodput {
                    rps: best,
                    at_least: true,
                };
            }
        }
    }
    Goodput {
        rps: best,
        at_least: false,
    }
}

/// The Markdown table of `rows`: per SLO, goodput against the aggregated fleet's; each row's
/// requests split and latencies at the rate given by `at` (an index into the rates); its
/// attainment of the first SLO per rate.
pub fn table(rows: &[GoodputRow], slos: &[Slo], at: usize) -> String {
    let aggregated = rows.iter().find(|r| r.layout.prefill == 0);
    let mut out = String::from("| fleet · pair rule |");
    for slo in slos {
        out.push_str(&format!(" goodput, {} (req/s) |", slo.name));
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
            let value = match (goodput.rps, goodput.at_least) {
                (None, _) => "< lowest rate".to_owned(),
                (Some(g), true) => format!("≥ {g:.2}"),
                (Some(g), false) => format!("{g:.2}"),
            };
            let base = aggregated
                .and_then(|a| a.goodput.get(i))
                .and_then(|g| g.rps);
            let ratio = match (goodput.rps, base) {
                (Some(g), Some(a)) if a > 0.0 && row.layout.prefill > 0 => {
                    format!(" ({:.2}×)", g / a)
                }
                _ => String::new(),
            };
            out.push_str(&format!(" {value}{ratio} |"));
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

    fn point(rate_rps: f64, attainment: f64) -> RatePoint {
        RatePoint {
            rate_rps,
            attainment: vec![attainment],
            ttft_s: [0.0; 3],
            itl_s: [0.0; 3],
            failed: 0,
            split: 0,
        }
    }

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

    #[test]
    fn goodput_is_where_attainment_crosses_the_target() {
        let points = [point(1.0, 1.0), point(2.0, 0.95), point(3.0, 0.85)];
        let crossed = goodput(&points, 0, 0.9);
        assert!((crossed.rps.unwrap() - 2.5).abs() < 1e-9);
        assert!(!crossed.at_least);
        assert_eq!(
            goodput(&points[..2], 0, 0.9),
            Goodput {
                rps: Some(2.0),
                at_least: true
            }
        );
        assert_eq!(goodput(&[point(1.0, 0.5)], 0, 0.9).rps, None);
        // A rate that misses between two that meet does not end the search.
        let bumpy = [point(1.0, 0.95), point(2.0, 0.85), point(3.0, 0.92)];
        assert_eq!(
            goodput(&bumpy, 0, 0.9),
            Goodput {
                rps: Some(3.0),
                at_least: true
            }
        );
    }
}
