#!/usr/bin/env bash
# The front door's costs, side by side in one run on loopback (not part of tests/run):
#
#   1. everything on versus everything off: API keys with tenants and token buckets, the
#      tiered admission policy with the fair queue, the blocklist safety filter and pings,
#      against a bare gateway, at a steady 500 req/s, plain and streamed (p50, p99, ratio);
#   2. a light key's TTFT (a one-token stream) at 100 req/s, alone and while another key
#      floods the gateway as fast as 64 connections go (and is refused by its limit);
#   3. the safety filter's added TTFT (a one-token stream) and per-token delay (a 256-token
#      stream), filter on versus off.
#
# The gateway and the fake OpenAI-compatible upstreams (tests/bin/fake_upstream.rs) share
# core 1; oha (crates.io), the load generator, runs on core 0.
#
#   tests/bench/front_door.sh [--seconds 5] [--rounds 3] [--out tests/bench/results]
#   RINGMASTER_BENCH_BIN=/path/to/older/ringmaster tests/bench/front_door.sh ...   (compare)
#
# Every comparison runs --rounds times (3 by default), the two sides alternated within a round;
# the table gives the median of each side and of the per-round ratios, with the ratios' range,
# because one run on a shared VM moves by tens of percent.
#
# Writes front_door.json and front_door.md under --out; BENCHMARKS.md quotes them.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
# shellcheck source=tests/bench/lib.sh
source "$root/tests/bench/lib.sh"
bench_setup "$@"
work=$(mktemp -d)

step "tools: oha"
oha=$(bench_oha)
step "build: ringmaster and fake-upstream (release)"
cargo build --release --locked -p ringmaster -p ringmaster-tests --bin ringmaster --bin fake-upstream >&2
# RINGMASTER_BENCH_BIN: another gateway binary to measure (an older build, to compare).
ringmaster=${RINGMASTER_BENCH_BIN:-$target_dir/release/ringmaster}
fake=$target_dir/release/fake-upstream

pids=()
trap bench_cleanup EXIT

step "upstreams: two of 8 tokens (:19001, :19002), one of 256 tokens (:19003), core 1"
start_upstreams 19001:8 19002:8 19003:256

base='listen = "127.0.0.1:18090"
models = ["fake"]
[limits]
max_waiting_per_server = 1000000'
servers='[[servers]]
address = "http://127.0.0.1:19001"
[[servers]]
address = "http://127.0.0.1:19002"'
long_server='[[servers]]
address = "http://127.0.0.1:19003"'
keys='[[tenants]]
name = "light"
requests_per_minute = 10000000
input_tokens_per_minute = 1000000000
output_tokens_per_minute = 1000000000
[[tenants]]
name = "flood"
requests_per_minute = 60
[[api_keys]]
key = "sk-bench-light-key"
tenant = "light"
tier = "gold"
[[api_keys]]
key = "sk-bench-flood-key"
tenant = "flood"
tier = "free"'
admission='[policies.admission]
source = "builtin:tiered"
queue_priority = { gold = 2, free = 0 }
config = { max_in_flight_per_server = "100000" }'
safety='[policies.safety]
source = "builtin:blocklist"
config = { patterns = "open the pod bay doors, a second pattern, and a third one" }'

printf '%s\n%s\n' "$base" "$servers" > "$work/off.toml"
printf '%s\n%s\n%s\n%s\n%s\n' "$base" "$servers" "$keys" "$admission" "$safety" > "$work/on.toml"
printf '%s\n%s\n' "$base" "$long_server" > "$work/long-off.toml"
printf '%s\n%s\n%s\n' "$base" "$long_server" "$safety" > "$work/long-safety.toml"
printf '%s\n%s\n%s\n' "$base" "$servers" "$safety" > "$work/safety.toml"

start_gateway() { # config name
  RUST_LOG=warn taskset -c 1 "$ringmaster" serve --config "$work/$1.toml" >"$work/$1.log" 2>&1 &
  gateway_pid=$!
  pids+=("$gateway_pid")
  wait_port 18090
  sleep 1
}
stop_gateway() {
  kill "$gateway_pid" 2>/dev/null || true
  wait "$gateway_pid" 2>/dev/null || true
  # The port must be free before the next one binds it.
  for _ in $(seq 1 50); do
    (exec 3<>/dev/tcp/127.0.0.1/18090) 2>/dev/null || return 0
    sleep 0.1
  done
}

url=http://127.0.0.1:18090/v1/messages
plain='{"model":"fake","max_tokens":8,"messages":[{"role":"user","content":"Hello there, how are you today?"}]}'
stream='{"model":"fake","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"Hello there, how are you today?"}]}'
one_token='{"model":"fake","max_tokens":1,"stream":true,"messages":[{"role":"user","content":"Hello there, how are you today?"}]}'
long='{"model":"fake","max_tokens":256,"stream":true,"messages":[{"role":"user","content":"Hello there, how are you today?"}]}'
light=(-H 'x-api-key: sk-bench-light-key')
flood=(-H 'x-api-key: sk-bench-flood-key')

results=()
record() { results+=("$(python3 -c 'import json,sys; r=json.loads(sys.argv[2]); r["group"]=sys.argv[1]; r["round"]=int(sys.argv[3]); print(json.dumps(r))' "$1" "$2" "$round")"); }

for round in $(seq 1 "$rounds"); do

step "round $round of $rounds: 1. everything off versus everything on, 500 req/s"
for config in off on; do
  start_gateway $config
  phase warmup "$url" "$plain" 200 "${light[@]}" >/dev/null
  record "features-$config" "$(phase plain@500 "$url" "$plain" 500 "${light[@]}")"
  record "features-$config" "$(phase stream@500 "$url" "$stream" 500 "${light[@]}")"
  stop_gateway
done

step "round $round of $rounds: 2. a light key's TTFT, alone and while another key floods"
start_gateway on
phase warmup "$url" "$one_token" 100 "${light[@]}" >/dev/null
record flood-none "$(phase light@100 "$url" "$one_token" 100 "${light[@]}")"
phase flood "$url" "$plain" "" "${flood[@]}" > "$work/flood.json" &
flood_pid=$!
sleep 0.5
record flood-on "$(phase light@100 "$url" "$one_token" 100 "${light[@]}")"
wait "$flood_pid"
record flood-on "$(cat "$work/flood.json")"
stop_gateway

step "round $round of $rounds: 3. the safety filter: added TTFT and per-token delay"
for config in off safety; do
  start_gateway $config
  phase warmup "$url" "$one_token" 200 >/dev/null
  record "safety-ttft-$config" "$(phase ttft@200 "$url" "$one_token" 200)"
  stop_gateway
done
for config in long-off long-safety; do
  start_gateway $config
  phase warmup "$url" "$long" 20 >/dev/null
  record "safety-tokens-$config" "$(phase tokens256@50 "$url" "$long" 50)"
  stop_gateway
done
done

python3 - "$out" "${results[@]}" <<'PY'
import json, statistics, sys
out = sys.argv[1]
rows = [json.loads(x) for x in sys.argv[2:]]
json.dump(rows, open(f"{out}/front_door.json", "w"), indent=1)
rounds = sorted({r["round"] for r in rows})
by = {(r["group"], r["phase"], r["round"]): r for r in rows}
med = statistics.median

def pair(a, b, q):
    """The medians of side a and side b of q over the rounds, and of the per-round b / a."""
    xs = [by[a + (n,)][q] for n in rounds]
    ys = [by[b + (n,)][q] for n in rounds]
    ratios = [y / x for x, y in zip(xs, ys) if x]
    return med(xs), med(ys), med(ratios), min(ratios), max(ratios)

def row(label, a, b, q, extra=""):
    x, y, r, lo, hi = pair(a, b, q)
    return f"| {label}{extra(x, y) if extra else ''} | {x:.0f} | {y:.0f} | {r:.2f} ({lo:.2f}–{hi:.2f}) |"

lines = [f"Medians of {len(rounds)} rounds; the last column is the median of the per-round ratios (their range).", "",
         "| measure | off | on | on / off |", "| --- | --- | --- | --- |"]
for kind in ("plain@500", "stream@500"):
    for q in ("p50_us", "p99_us"):
        lines.append(row(f"{kind} {q[:3]} (µs), all front-door features", ("features-off", kind), ("features-on", kind), q))
for q in ("p50_us", "p99_us"):
    lines.append(row(f"light key TTFT {q[:3]} (µs), alone / while another key floods", ("flood-none", "light@100"), ("flood-on", "light@100"), q))
flood = [by[("flood-on", "flood", n)] for n in rounds]
lines.append(f"| flood: requests sent, answered 2xx, rate reached (medians) | {med(f['total'] for f in flood):.0f} | {med(f['ok'] for f in flood):.0f} | {med(f['rps'] for f in flood):.0f}/s |")
for q in ("p50_us", "p99_us"):
    lines.append(row(f"TTFT {q[:3]} (µs), blocklist filter off / on", ("safety-ttft-off", "ttft@200"), ("safety-ttft-safety", "ttft@200"), q,
                     lambda x, y: f" (added: {y - x:.0f} µs)"))
lines.append(row("256-token stream p50 (µs), filter off / on", ("safety-tokens-long-off", "tokens256@50"), ("safety-tokens-long-safety", "tokens256@50"), "p50_us",
                 lambda x, y: f" (added per token: {(y - x) / 256:.2f} µs)"))
open(f"{out}/front_door.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
