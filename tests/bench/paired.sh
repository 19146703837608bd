#!/usr/bin/env bash
# Two gateway binaries against each other, alternated in one run on loopback (not part of
# tests/run): whether a data-plane change moved anything, when this VM's speed drifts more
# between whole benchmark runs than the change itself. Each round runs A then B (then B then
# A, so neither always goes first) in front of the same two fast fake upstreams, through the
# Messages door (translated to the upstreams' OpenAI API) or the OpenAI door (`--door openai`:
# the same API, relayed), with the default router on the path: plain and streamed at 2,000 req/s (p50 and p99) and at
# the maximum rate with 64 connections, with the gateway's CPU per request and the new upstream
# connections per request. The gateways and both upstreams share core 1; oha runs on core 0.
#
#   tests/bench/paired.sh OLD_BINARY NEW_BINARY [--door messages|openai] [--rounds 3] [--seconds 5] [--out DIR]
#
# Prints one JSON line per phase and gateway, then medians and B/A ratios (paired.md in --out).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
[ $# -ge 2 ] || { echo "usage: $0 OLD_BINARY NEW_BINARY [--door messages|openai] [--rounds N] [--seconds S] [--out DIR]" >&2; exit 2; }
bin_a=$(realpath "$1"); bin_b=$(realpath "$2"); shift 2
door=messages
options=()
while [ $# -gt 0 ]; do
  case $1 in
    --door) door=$2; shift 2 ;;
    *) options+=("$1"); shift ;;
  esac
done
set -- "${options[@]}"
# shellcheck source=tests/bench/lib.sh
source "$root/tests/bench/lib.sh"
bench_setup "$@"
work=$(mktemp -d)

oha=$(bench_oha)
step "build: fake-upstream (release)"
cargo build --release --locked -p ringmaster-tests --bin fake-upstream >&2
fake=$target_dir/release/fake-upstream

pids=()
trap bench_cleanup EXIT

start_upstreams 19001:8 19002:8
two_server_config 127.0.0.1:18080 > "$work/gateway.toml"

connections() {
  local total=0
  for port in 19001 19002; do
    total=$((total + $(curl -s "http://127.0.0.1:$port/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["connections"])')))
  done
  echo $total
}
cpu_s() { awk -v t="$(getconf CLK_TCK)" '{print ($14 + $15) / t}' "/proc/$1/stat"; }

plain='{"model":"fake","max_tokens":8,"messages":[{"role":"user","content":"Hello there, how are you today?"}]}'
stream='{"model":"fake","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"Hello there, how are you today?"}]}'
case $door in
  messages) url=http://127.0.0.1:18080/v1/messages ;;
  openai) url=http://127.0.0.1:18080/v1/chat/completions ;;
  *) echo "--door is messages or openai, not $door" >&2; exit 2 ;;
esac

one() { # label binary -> JSON lines
  local label=$1 bin=$2 pid
  RUST_LOG=warn taskset -c 1 "$bin" serve --config "$work/gateway.toml" >"$work/$label.log" 2>&1 &
  pid=$!
  wait_port 18080
  sleep 1
  phase warmup "$url" "$plain" 200 >/dev/null
  for spec in "plain@2000:$plain:2000" "stream@2000:$stream:2000" "plain@max:$plain:" "stream@max:$stream:"; do
    local name=${spec%%:*} rest=${spec#*:}
    local body=${rest%:*} rate=${rest##*:}
    local cpu0 conns0 r cpu1 conns1
    cpu0=$(cpu_s $pid); conns0=$(connections)
    r=$(phase "$name" "$url" "$body" "$rate")
    cpu1=$(cpu_s $pid); conns1=$(connections)
    python3 -c "import json,sys; r=json.loads(sys.argv[1]); r.update(gateway=sys.argv[2], cpu_us_per_request=(float(sys.argv[4])-float(sys.argv[3]))*1e6/max(r['ok'],1), new_connections_per_request=(int(sys.argv[6])-int(sys.argv[5]))/max(r['ok'],1)); print(json.dumps(r))" "$r" "$label" "$cpu0" "$cpu1" "$conns0" "$conns1"
  done
  kill $pid; wait $pid 2>/dev/null || true
  sleep 1
}

lines=()
for round in $(seq 1 "$rounds"); do
  step "round $round of $rounds"
  if [ $((round % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for label in $order; do
    bin=$bin_a; [ "$label" = B ] && bin=$bin_b
    while read -r line; do lines+=("$line"); echo "$line"; done < <(one "$label" "$bin")
  done
done
python3 - "$out/paired.md" "${lines[@]}" <<'PY'
import json, statistics, sys
rows = [json.loads(x) for x in sys.argv[2:]]
phases = ["plain@2000", "stream@2000", "plain@max", "stream@max"]
def med(label, phase, key):
    v = [r[key] for r in rows if r["gateway"] == label and r["phase"] == phase]
    return statistics.median(v) if v else float("nan")
out = ["| phase | measure | A (old) median | B (new) median | B / A |", "|---|---|---|---|---|"]
for p in phases:
    keys = ["p50_us", "p99_us"] if "@max" not in p else ["rps", "cpu_us_per_request", "new_connections_per_request"]
    for k in keys:
        a, b = med("A", p, k), med("B", p, k)
        ratio = b / a if a else float("nan")
        out.append(f"| {p} | {k} | {a:,.2f} | {b:,.2f} | {ratio:.2f} |")
text = "\n".join(out)
open(sys.argv[1], "w").write(text + "\n")
print(text)
PY
