#!/usr/bin/env bash
# What the two-leg orchestration of a disaggregated request costs over one leg, on loopback
# (not part of tests/run; issue 39's target: p50 under 300 µs above a one-leg request).
#
# Two fast fake vLLM servers (tests/bin/fake_upstream.rs: a prefill leg, one carrying
# `kv_transfer_params.do_remote_decode`, is answered at once with one token and the
# `kv_transfer_params` a decode leg needs, as vLLM's NixlConnector answers it) and the gateway
# (release build, its default Wasm router) share core 1; oha (crates.io), with a fixed rate and
# latency correction, runs on core 0. Two gateways, measured in alternating rounds:
#
# - one-leg:  the decode server alone, as a server taking whole requests;
# - two-leg:  the same decode server plus a prefill server, both `disaggregation = "vllm-nixl"`,
#             `[disaggregation] min_uncached_tokens = 0` and `when_prefill_busy = "wait"`, so
#             every request is split: the prefill leg, then the decode leg with the parameters.
#
# Phases: the OpenAI chat door, plain and streamed, at 500 req/s. The added p50 and p99 of each
# round are two-leg minus one-leg in that round; the table gives the median of the rounds with
# the range, and the split share read from the gateway's own metric.
#
#   tests/bench/pair_overhead.sh [--seconds 5] [--rounds 3] [--out tests/bench/results]
#
# Writes pair-overhead.json and pair-overhead.md under --out.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
# shellcheck source=tests/bench/lib.sh
source "$root/tests/bench/lib.sh"
bench_setup "$@"

oha=$(bench_oha)
bench_build

work=$(mktemp -d)
pids=()
trap bench_cleanup EXIT

taskset -c 1 "$fake" --listen 127.0.0.1:19011 --behavior vllm --tokens 8 >"$work/prefill.log" 2>&1 &
pids+=($!)
taskset -c 1 "$fake" --listen 127.0.0.1:19012 --behavior vllm --tokens 8 >"$work/decode.log" 2>&1 &
pids+=($!)
wait_port 19011
wait_port 19012

cat >"$work/one-leg.toml" <<TOML
listen = "127.0.0.1:18090"
models = ["fake"]
[limits]
max_waiting_per_server = 1000000
[[servers]]
address = "http://127.0.0.1:19012"
TOML
cat >"$work/two-leg.toml" <<TOML
listen = "127.0.0.1:18091"
models = ["fake"]
[limits]
max_waiting_per_server = 1000000
[disaggregation]
min_uncached_tokens = 0
when_prefill_busy = "wait"
[[servers]]
address = "http://127.0.0.1:19011"
role = "prefill"
disaggregation = "vllm-nixl"
[[servers]]
address = "http://127.0.0.1:19012"
role = "decode"
disaggregation = "vllm-nixl"
TOML

start_gateway() { # name port -> pid
  RUST_LOG=warn taskset -c 1 "$ringmaster" serve --config "$work/$1.toml" >"$work/$1.log" 2>&1 &
  local pid=$!
  wait_port "$2"
  echo "$pid"
}

plain='{"model":"fake","max_tokens":8,"messages":[{"role":"user","content":"Summarise the meeting notes in three bullet points, please."}]}'
streamed='{"model":"fake","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"Summarise the meeting notes in three bullet points, please."}]}'

results="$work/rows.jsonl"
: >"$results"
for round in $(seq 1 "$rounds"); do
  order=(one-leg two-leg)
  if [ $((round % 2)) -eq 0 ]; then order=(two-leg one-leg); fi
  for target in "${order[@]}"; do
    port=18090
    [ "$target" = two-leg ] && port=18091
    pid=$(start_gateway "$target" "$port")
    url="http://127.0.0.1:$port/v1/chat/completions"
    step "round $round: $target"
    seconds_was=$seconds
    seconds=3
    phase warmup "$url" "$plain" 200 >/dev/null
    seconds=$seconds_was
    for kind in plain streamed; do
      body=$plain
      [ "$kind" = streamed ] && body=$streamed
      line=$(phase "$kind@500" "$url" "$body" 500)
      split=$(curl -s "http://127.0.0.1:$port/metrics" |
        awk '/^ringmaster_pair_decisions_total\{.*outcome="split"/ {s += $2} END {print s + 0}')
      requests=$(curl -s "http://127.0.0.1:$port/metrics" |
        awk '/^ringmaster_pair_decisions_total\{/ {s += $2} END {print s + 0}')
      echo "$line" | python3 -c 'import json,sys; d=json.load(sys.stdin); d.update(round=int(sys.argv[1]), target=sys.argv[2], split=float(sys.argv[3]), decided=float(sys.argv[4])); print(json.dumps(d))' \
        "$round" "$target" "$split" "$requests" >>"$results"
    done
    kill "$pid"
    wait "$pid" 2>/dev/null || true
  done
done

python3 - "$results" "$out" "$rounds" "$seconds" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out, rounds, seconds = sys.argv[2], int(sys.argv[3]), sys.argv[4]
def cell(values, unit="µs", sign=False):
    med = statistics.median(values)
    fmt = (lambda v: f"{v:+.0f} {unit}") if sign else (lambda v: f"{v:.0f} {unit}")
    return f"{fmt(med)} [{fmt(min(values))}–{fmt(max(values))}]"
lines = [f"{rounds} round(s) of {seconds} s per phase at 500 req/s; each cell the median of the "
         "rounds, [min–max] beside it; added = two-leg minus one-leg in the same round.", "",
         "| phase | one-leg p50 / p99 | two-leg p50 / p99 | added p50 | added p99 | requests split (two-leg) | non-2xx |",
         "|---|---|---|---|---|---|---|"]
summary = {}
for phase in ["plain@500", "streamed@500"]:
    one = {r["round"]: r for r in rows if r["phase"] == phase and r["target"] == "one-leg"}
    two = {r["round"]: r for r in rows if r["phase"] == phase and r["target"] == "two-leg"}
    common = sorted(set(one) & set(two))
    added50 = [two[k]["p50_us"] - one[k]["p50_us"] for k in common]
    added99 = [two[k]["p99_us"] - one[k]["p99_us"] for k in common]
    split = [two[k]["split"] / max(two[k]["decided"], 1) for k in common]
    bad = sum(r["total"] - r["ok"] for r in list(one.values()) + list(two.values()))
    summary[phase] = {"added_p50_us": statistics.median(added50),
                      "added_p99_us": statistics.median(added99),
                      "split_share": min(split)}
    lines.append(
        f"| {phase} | {cell([one[k]['p50_us'] for k in common])} / {cell([one[k]['p99_us'] for k in common])}"
        f" | {cell([two[k]['p50_us'] for k in common])} / {cell([two[k]['p99_us'] for k in common])}"
        f" | {cell(added50, sign=True)} | {cell(added99, sign=True)} | {min(split):.1%} (lowest round) | {bad} |")
open(f"{out}/pair-overhead.md", "w").write("\n".join(lines) + "\n")
json.dump({"rows": rows, "summary": summary}, open(f"{out}/pair-overhead.json", "w"), indent=1)
print("\n".join(lines))
PY
