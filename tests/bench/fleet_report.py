"""fleet.sh's report: the replay runs, the propagation timings and the bucket phases as
fleet.json and fleet.md (the table BENCHMARKS.md quotes), each target beside its reading.

    python3 tests/bench/fleet_report.py replay.jsonl propagation.json buckets.jsonl OUT_DIR
"""

import json
import statistics
import sys
from pathlib import Path


def main() -> None:
    replay_path, propagation_path, buckets_path, out = sys.argv[1:5]
    runs = [json.loads(line) for line in Path(replay_path).read_text().splitlines() if line.strip()]
    propagation = json.loads(Path(propagation_path).read_text())
    phases = [json.loads(line) for line in Path(buckets_path).read_text().splitlines() if line.strip()]

    def run(mode: str, replicas: int) -> dict:
        """The cell's median run by hit ratio and TTFT p99 (each its own median), with the
        ranges over its repeats."""
        cell = [r for r in runs if r["mode"] == mode and r["replicas"] == replicas]
        merged = dict(cell[0])
        for key in ("token_hit_ratio", "ttft_p50_s", "ttft_p99_s"):
            values = [r[key] for r in cell]
            merged[key] = statistics.median(values)
            merged[key + "_range"] = (min(values), max(values))
        merged["ok"] = sum(r["ok"] for r in cell)
        merged["requests"] = sum(r["requests"] for r in cell)
        merged["repeats"] = len(cell)
        return merged

    lines = ["### Replicas on one Redis (`tests/bench/fleet.sh`)", ""]
    first = runs[0]
    repeats = run("cluster", 1)["repeats"]
    lines.append(
        f"The conversation trace's first {first['requests']} requests at {first['speedup']}x, "
        "spread at random over the replicas, in front of 8 shared `ringmaster worker --simulated` "
        "processes (the simulator's default KV capacity, time scale 1/speedup); each cell run "
        f"{repeats} times, interleaved: medians [ranges]; "
        "![hit ratio against replicas](tests/bench/results/fleet-hit-ratio.svg)"
    )
    lines += ["", "| replicas | mode | token hit ratio | vs 1 replica | TTFT p50 | TTFT p99 | vs 1 replica | ok |",
              "|---|---|---|---|---|---|---|---|"]
    for mode in ("cluster", "alone"):
        base = run(mode, 1)
        for replicas in (1, 2, 4):
            r = run(mode, replicas)
            lo, hi = r["token_hit_ratio_range"]
            p99_lo, p99_hi = r["ttft_p99_s_range"]
            lines.append(
                f"| {replicas} | {'--cluster' if mode == 'cluster' else 'alone'} | "
                f"{r['token_hit_ratio'] * 100:.1f} % [{lo * 100:.1f}–{hi * 100:.1f}] | "
                f"{ratio(r['token_hit_ratio'], base['token_hit_ratio'])} | "
                f"{r['ttft_p50_s'] * 1e3:.0f} ms | {r['ttft_p99_s'] * 1e3:.0f} ms [{p99_lo * 1e3:.0f}–{p99_hi * 1e3:.0f}] | "
                f"{ratio(r['ttft_p99_s'], base['ttft_p99_s'])} | {r['ok']}/{r['requests']} |"
            )
    four, one = run("cluster", 4), run("cluster", 1)
    hit_4 = four["token_hit_ratio"] / one["token_hit_ratio"] if one["token_hit_ratio"] else 0
    ttft_4 = four["ttft_p99_s"] / one["ttft_p99_s"] if one["ttft_p99_s"] else 0

    steady = {m: [p for p in phases if p["phase"] == f"{m}-steady"] for m in ("alone", "cluster")}
    fast = {m: [p for p in phases if p["phase"] == f"{m}-max"] for m in ("alone", "cluster")}
    rounds = len(steady["alone"])
    added = [c["p50_us"] - a["p50_us"] for a, c in zip(steady["alone"], steady["cluster"])]
    rate = [c["rps"] / a["rps"] for a, c in zip(fast["alone"], fast["cluster"]) if a["rps"]]

    lines += ["", "| target | reading | met |", "|---|---|---|",
              f"| hit ratio at 4 replicas within 5 % of one (with --cluster) | {hit_4:.3f}× | {yes(abs(1 - hit_4) <= 0.05)} |",
              f"| TTFT p99 at 4 replicas within 5 % of one (with --cluster) | {ttft_4:.3f}× | {yes(abs(1 - ttft_4) <= 0.05)} |",
              f"| a change on one replica serves on all within 1 s (p99 of {propagation['changes']}) | "
              f"{propagation['seen_p99_ms']:.1f} ms (p50 {propagation['seen_p50_ms']:.1f} ms, max {propagation['seen_max_ms']:.1f} ms) | "
              f"{yes(propagation['seen_p99_ms'] < 1000)} |",
              f"| shared buckets: added p50 at 500 req/s under 200 µs (median of {rounds} rounds [range]) | "
              f"{statistics.median(added):+.0f} µs [{min(added):+.0f}, {max(added):+.0f}] | {yes(statistics.median(added) < 200)} |",
              f"| shared buckets: max rate at least 0.8× alone | {statistics.median(rate):.2f}× [{min(rate):.2f}–{max(rate):.2f}] "
              f"({statistics.median([p['rps'] for p in fast['cluster']]):,.0f} vs {statistics.median([p['rps'] for p in fast['alone']]):,.0f} req/s) | "
              f"{yes(statistics.median(rate) >= 0.8)} |"]
    lines.append("")
    Path(out, "fleet.md").write_text("\n".join(lines) + "\n")
    Path(out, "fleet.json").write_text(json.dumps(
        {"replay": runs, "propagation": propagation, "buckets": phases}, indent=2) + "\n")


def ratio(value: float, base: float) -> str:
    return f"{value / base:.3f}×" if base else "—"


def yes(met: bool) -> str:
    return "yes" if met else "**no**"


if __name__ == "__main__":
    main()
