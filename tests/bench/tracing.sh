#!/usr/bin/env bash
# What request traces cost (not part of tests/run): one gateway binary in front of the same
# two fast fake upstreams, Messages API, the default router, run three ways alternated within
# each round: traces off, on with every trace sampled, on with 1 % sampled. "On" exports
# OTLP/HTTP to an in-test sink (decodes every batch, counts the spans). Each way is measured
# plain and streamed at 2,000 req/s (p50, p99) and at the maximum rate with 64 connections
# (req/s, the gateway's CPU per request). The gateway and the upstreams share core 1; oha and
# the sink run on core 0. Off against the binary before traces existed: tests/bench/paired.sh.
#
#   tests/bench/tracing.sh [BINARY] [--rounds 3] [--seconds 5] [--out DIR]
#
# Prints one JSON line per phase and way, then medians and ratios to "off" (tracing.md in --out).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
# shellcheck source=tests/bench/lib.sh
source "$root/tests/bench/lib.sh"
bin=""
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then bin=$(realpath "$1"); shift; fi
bench_setup "$@"
work=$(mktemp -d)

oha=$(bench_oha)
step "build: the gateway, fake-upstream and otlp-sink (release)"
cargo build --release --locked -p ringmaster -p ringmaster-tests \
  --bin ringmaster --bin fake-upstream --bin otlp-sink >&2
fake=$target_dir/release/fake-upstream
bin=${bin:-$target_dir/release/ringmaster}

pids=()
trap bench_cleanup EXIT
start_upstreams 19001:8 19002:8
taskset -c 0 "$target_dir/release/otlp-sink" --stats 127.0.0.1:19009 >"$work/sink.url" &
pids+=($!)
wait_port 19009
sink=$(head -1 "$work/sink.url")

for way in off all one-percent; do
  two_server_config 127.0.0.1:18080 > "$work/$way.toml"
done
printf '[telemetry]\notlp_endpoint = "%s"\nsample_ratio = 1.0\n' "$sink" >> "$work/all.toml"
printf '[telemetry]\notlp_endpoint = "%s"\nsample_ratio = 0.01\n' "$sink" >> "$work/one-percent.toml"

cpu_s() { awk -v t="$(getconf CLK_TCK)" '{print ($14 + $15) / t}' "/proc/$1/stat"; }
spans() { curl -s http://127.0.0.1:19009/stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["spans"])'; }

plain='{"model":"fake","max_tokens":8,"messages":[{"role":"user","content":"Hello there, how are you today?"}]}'
stream='{"model":"fake","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"Hello there, how are you today?"}]}'
url=http://127.0.0.1:18080/v1/messages

one() { # way -> JSON lines
  local way=$1 pid
  RUST_LOG=warn taskset -c 1 "$bin" serve --config "$work/$way.toml" >"$work/$way.log" 2>&1 &
  pid=$!
  wait_port 18080
  sleep 1
  phase warmup "$url" "$plain" 200 >/dev/null
  for spec in "plain@2000:$plain:2000" "stream@2000:$stream:2000" "plain@max:$plain:" "stream@max:$stream:"; do
    local name=${spec%%:*} rest=${spec#*:}
    local body=${rest%:*} rate=${rest##*:}
    local cpu0 spans0 r cpu1 spans1
    cpu0=$(cpu_s $pid); spans0=$(spans)
    r=$(phase "$name" "$url" "$body" "$rate")
    sleep 6 # the batch exporter's last batch of the phase (it sends every 5 s)
    cpu1=$(cpu_s $pid); spans1=$(spans)
    python3 -c "import json,sys; r=json.loads(sys.argv[1]); r.update(gateway=sys.argv[2], cpu_us_per_request=(float(sys.argv[4])-float(sys.argv[3]))*1e6/max(r['ok'],1), spans_per_request=(int(sys.argv[6])-int(sys.argv[5]))/max(r['ok'],1)); print(json.dumps(r))" "$r" "$way" "$cpu0" "$cpu1" "$spans0" "$spans1"
  done
  kill $pid; wait $pid 2>/dev/null || true
  sleep 1
}

lines=()
for round in $(seq 1 "$rounds"); do
  step "round $round of $rounds"
  case $((round % 3)) in
    1) order="off all one-percent" ;;
    2) order="all one-percent off" ;;
    0) order="one-percent off all" ;;
  esac
  for way in $order; do
    while read -r line; do lines+=("$line"); echo "$line"; done < <(one "$way")
  done
done
python3 - "$out/tracing.md" "${lines[@]}" <<'PY'
import json, statistics, sys
rows = [json.loads(x) for x in sys.argv[2:]]
phases = ["plain@2000", "stream@2000", "plain@max", "stream@max"]
ways = ["off", "all", "one-percent"]
def med(way, phase, key):
    v = [r[key] for r in rows if r["gateway"] == way and r["phase"] == phase]
    return statistics.median(v) if v else float("nan")
out = ["| phase | measure | off | on, all sampled | on, 1 % sampled | all / off | 1 % / off | spans per request (all) |",
       "|---|---|---|---|---|---|---|---|"]
for p in phases:
    keys = ["p50_us", "p99_us", "cpu_us_per_request"] if "@max" not in p else ["rps", "cpu_us_per_request"]
    for k in keys:
        o, a, s = (med(w, p, k) for w in ways)
        out.append(f"| {p} | {k} | {o:,.1f} | {a:,.1f} | {s:,.1f} | {a / o if o else float('nan'):.2f} | {s / o if o else float('nan'):.2f} | {med('all', p, 'spans_per_request'):.2f} |")
text = "\n".join(out)
open(sys.argv[1], "w").write(text + "\n")
print(text)
PY
