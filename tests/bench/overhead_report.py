"""The overhead benchmark's table: added latency over the direct baseline of the same run,
maximum rates, CPU per request, peak RSS and new upstream connections, with the issue's
targets as ratios against HAProxy (same API run) and sglang-router.

    python3 tests/bench/overhead_report.py results.json > overhead.md
"""

import json
import sys


def by_phase(target):
    return {p["phase"]: p for p in target["phases"]}


def fmt_us(v):
    return f"{v:,.0f} µs"


def main(path):
    runs = json.load(open(path))
    out = []
    for api in ("messages", "openai"):
        targets = [t for t in runs if t["api"] == api]
        if not targets:
            continue
        direct = by_phase(next(t for t in targets if t["target"] == "direct"))
        out.append(f"### {api} API\n")
        out.append(
            "| target | plain@500 added p50 / p99 | plain@2000 added p50 / p99 | "
            "stream@500 added p50 / p99 | stream@2000 added p50 / p99 | max req/s plain / stream | "
            "CPU µs per request (plain max) | peak RSS | new upstream conns per request (plain max) |"
        )
        out.append("|---|---|---|---|---|---|---|---|---|")
        for t in targets:
            ph = by_phase(t)
            cells = [t["target"]]
            for name in ("plain@500", "plain@2000", "stream@500", "stream@2000"):
                p = ph[name]
                if t["target"] == "direct":
                    cells.append(f"{fmt_us(p['p50_us'])} / {fmt_us(p['p99_us'])} (baseline)")
                else:
                    d = direct[name]
                    cells.append(
                        f"+{fmt_us(p['p50_us'] - d['p50_us'])} / +{fmt_us(p['p99_us'] - d['p99_us'])}"
                        + ("" if p["ok"] == p["total"] else f" ({p['total'] - p['ok']} failed)")
                    )
            pm, sm = ph["plain@max"], ph["stream@max"]
            cells.append(f"{pm['rps']:,.0f} / {sm['rps']:,.0f}")
            n = max(pm["ok"], 1)
            cpu = pm.get("cpu_s", 0)
            cells.append("—" if t["target"] == "direct" else f"{cpu / n * 1e6:,.1f}")
            rss = max(pm.get("peak_rss_kib", 0), sm.get("peak_rss_kib", 0))
            cells.append("—" if t["target"] == "direct" else f"{rss / 1024:,.1f} MiB")
            conns = pm.get("new_upstream_connections", 0)
            cells.append(f"{conns / n:.4f} ({conns} for {n:,})")
            out.append("| " + " | ".join(cells) + " |")
        out.append("")

    def find(target, api):
        return next((by_phase(t) for t in runs if t["target"] == target and t["api"] == api), None)

    rm, hm, dm = find("ringmaster", "messages"), find("haproxy", "messages"), find("direct", "messages")
    sg, ho = find("sglang", "openai"), find("haproxy", "openai")
    if rm and hm and dm:
        out.append("### Targets (Ringmaster against HAProxy in the same Messages run)\n")
        out.append("| target | measured | goal | met |")
        out.append("|---|---|---|---|")
        for name in ("plain@500", "plain@2000", "stream@500", "stream@2000"):
            r = rm[name]["p50_us"] - dm[name]["p50_us"]
            h = hm[name]["p50_us"] - dm[name]["p50_us"]
            if h <= 0:
                # HAProxy's p50 fell within the direct baseline's noise: no ratio can be formed.
                out.append(f"| added p50 {name} | +{r:,.0f} µs; HAProxy {h:+,.0f} µs (within the baseline's noise) | ≤ 2× | no ratio |")
                continue
            ratio = r / h
            out.append(f"| added p50 {name} | {ratio:.2f}× HAProxy (+{r:,.0f} vs +{h:,.0f} µs) | ≤ 2× | {'yes' if ratio <= 2 else 'no'} |")
        p99 = rm["stream@2000"]["p99_us"] - dm["stream@2000"]["p99_us"]
        out.append(f"| added p99 stream@2000 | +{p99:,.0f} µs | < 1,000 µs | {'yes' if p99 < 1000 else 'no'} |")
        ratio = rm["plain@max"]["rps"] / max(hm["plain@max"]["rps"], 1)
        out.append(f"| max req/s | {ratio:.2f}× HAProxy ({rm['plain@max']['rps']:,.0f} vs {hm['plain@max']['rps']:,.0f}) | ≥ 0.6× | {'yes' if ratio >= 0.6 else 'no'} |")
        if sg and ho:
            # sglang-router was measured in the OpenAI run: compare through HAProxy's rate there.
            sg_rel = sg["plain@max"]["rps"] / max(ho["plain@max"]["rps"], 1)
            ratio_sg = ratio / sg_rel if sg_rel > 0 else float("inf")
            out.append(f"| max req/s vs sglang-router | {ratio_sg:.2f}× (each relative to HAProxy in its run) | ≥ 3× | {'yes' if ratio_sg >= 3 else 'no'} |")
        cpu_r = rm["plain@max"]["cpu_s"] / max(rm["plain@max"]["ok"], 1)
        cpu_h = hm["plain@max"]["cpu_s"] / max(hm["plain@max"]["ok"], 1)
        ratio = cpu_r / cpu_h if cpu_h > 0 else float("inf")
        out.append(f"| CPU per request | {ratio:.2f}× HAProxy ({cpu_r * 1e6:,.1f} vs {cpu_h * 1e6:,.1f} µs) | ≤ 2× | {'yes' if ratio <= 2 else 'no'} |")
        conns = rm["plain@max"].get("new_upstream_connections", 0)
        per = conns / max(rm["plain@max"]["ok"], 1)
        # The pool grows to the client's concurrency (64 connections) once, then reuses them.
        out.append(f"| new upstream connections per request | {per:.4f} ({conns} for {rm['plain@max']['ok']:,} requests at 64 client connections) | 0 at steady state | {'yes' if conns <= 2 * 64 else 'no'} |")
        out.append("")
    ro, do = find("ringmaster", "openai"), find("direct", "openai")
    if ro and sg and do:
        out.append("### Targets (Ringmaster's OpenAI door against sglang-router in the same OpenAI run)\n")
        out.append("| target | measured | goal | met |")
        out.append("|---|---|---|---|")
        ratio = ro["plain@max"]["rps"] / max(sg["plain@max"]["rps"], 1)
        out.append(f"| max req/s | {ratio:.2f}× sglang-router ({ro['plain@max']['rps']:,.0f} vs {sg['plain@max']['rps']:,.0f}) | ≥ 3× | {'yes' if ratio >= 3 else 'no'} |")
        ratio = ro["stream@max"]["rps"] / max(sg["stream@max"]["rps"], 1)
        out.append(f"| max req/s, streamed | {ratio:.2f}× sglang-router ({ro['stream@max']['rps']:,.0f} vs {sg['stream@max']['rps']:,.0f}) | ≥ 3× | {'yes' if ratio >= 3 else 'no'} |")
        for name in ("plain@500", "stream@2000"):
            r = ro[name]["p50_us"] - do[name]["p50_us"]
            g = sg[name]["p50_us"] - do[name]["p50_us"]
            out.append(f"| added p50 {name} | +{r:,.0f} µs vs sglang-router +{g:,.0f} µs | — | — |")
        if ho:
            r = ro["plain@max"]["rps"] / max(ho["plain@max"]["rps"], 1)
            out.append(f"| max req/s vs HAProxy (OpenAI run) | {r:.2f}× | ≥ 0.6× | {'yes' if r >= 0.6 else 'no'} |")
        out.append("")
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1])
