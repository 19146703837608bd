#!/usr/bin/env bash
# The data plane's overhead benchmark, side by side in one run on loopback (not part of
# tests/run): Ringmaster (its default Wasm prefix-affinity router on the path, and again with
# the consistent-hash component as `ringmaster-ring`), HAProxy
# (Debian's package: balance hdr(x-session-id), hash-type consistent, hash-balance-factor 125),
# sglang-router 0.3.2 (cache_aware) and vllm-router 0.1.17 (consistent_hash) from PyPI, each in
# its own virtualenv, in front of the same two fast fake OpenAI-compatible upstreams
# (tests/bin/fake_upstream.rs), and the direct baseline. The load generator is oha (crates.io)
# with a fixed rate and latency correction, pinned to core 0; the router under test and both
# upstreams share core 1.
#
# Two runs, as the routers speak different APIs: the Messages API (direct, Ringmaster,
# HAProxy) and the OpenAI API (direct, Ringmaster's OpenAI door, HAProxy, sglang-router,
# vllm-router). Phases per
# target: non-streaming and streaming at 500 and 2,000 req/s (p50 and p99), and the maximum
# rate with 64 connections (non-streaming and streaming), with the CPU seconds and the peak
# RSS of the router's process tree during it, and the new upstream connections per request.
#
#   tests/bench/overhead.sh [--seconds 5] [--rounds 3] [--out tests/bench/results]
#
# Writes results.json and a Markdown table (overhead.md) under --out; BENCHMARKS.md quotes it.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
# shellcheck source=tests/bench/lib.sh
source "$root/tests/bench/lib.sh"
bench_setup "$@"

step "tools: haproxy, oha, sglang-router, vllm-router"
if ! command -v haproxy >/dev/null; then
  apt-get update -qq && apt-get install -y -qq haproxy
fi
oha=$(bench_oha)
for peer in sglang:sglang-router==0.3.2 vllm:vllm-router==0.1.17; do
  dir=$cache/${peer%%:*}
  if [ ! -f "$dir/.installed" ]; then
    python3 -m venv "$dir"
    "$dir/bin/pip" install --quiet --disable-pip-version-check "${peer#*:}"
    touch "$dir/.installed"
  fi
done

bench_build

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # The routers' last log lines stay beside the results (the peers log every request).
  for log in "$work"/*.log; do
    [ -f "$log" ] && tail -n 200 "$log" > "$out/$(basename "$log")"
  done
  rm -rf "$work"
}
trap cleanup EXIT

step "upstreams on 127.0.0.1:19001 and :19002 (core 1)"
start_upstreams 19001:8 19002:8
two_server_config 127.0.0.1:18080 > "$work/ringmaster.toml"
# The same gateway with the ring component as its router (the default until prefix-affinity).
{ cat "$work/ringmaster.toml"; printf '[[policies.router]]\nname = "ring"\nsource = "builtin:consistent-hash"\n'; } \
  > "$work/ringmaster-ring.toml"
haproxy_config 127.0.0.1:18081 > "$work/haproxy.cfg"

start_target() { # name -> prints pid and port
  case $1 in
    ringmaster)
      RUST_LOG=warn taskset -c 1 "$ringmaster" serve --config "$work/ringmaster.toml" >"$work/ringmaster.log" 2>&1 &
      echo "$! 18080" ;;
    ringmaster-ring)
      RUST_LOG=warn taskset -c 1 "$ringmaster" serve --config "$work/ringmaster-ring.toml" >"$work/ringmaster-ring.log" 2>&1 &
      echo "$! 18080" ;;
    haproxy)
      taskset -c 1 haproxy -f "$work/haproxy.cfg" -db >"$work/haproxy.log" 2>&1 &
      echo "$! 18081" ;;
    sglang)
      taskset -c 1 "$cache/sglang/bin/python" -m sglang_router.launch_router --host 127.0.0.1 --port 18082 \
        --worker-urls http://127.0.0.1:19001 http://127.0.0.1:19002 --policy cache_aware \
        >"$work/sglang.log" 2>&1 &
      echo "$! 18082" ;;
    vllm)
      taskset -c 1 "$cache/vllm/bin/vllm-router" --host 127.0.0.1 --port 18083 \
        --worker-urls http://127.0.0.1:19001 http://127.0.0.1:19002 --policy consistent_hash \
        >"$work/vllm.log" 2>&1 &
      echo "$! 18083" ;;
  esac
}

# CPU seconds (user + system) of a process and its descendants.
tree_pids() { echo "$1"; for c in $(pgrep -P "$1" || true); do tree_pids "$c"; done; }
tree_cpu() {
  local total=0 tick
  tick=$(getconf CLK_TCK)
  for p in $(tree_pids "$1"); do
    if [ -r "/proc/$p/stat" ]; then
      total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat")))
    fi
  done
  python3 -c "print($total / $tick)"
}
tree_rss_kib() {
  local total=0
  for p in $(tree_pids "$1"); do
    local hwm
    hwm=$(awk '/VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
    total=$((total + ${hwm:-0}))
  done
  echo $total
}
upstream_connections() { # connections the two fake upstreams accepted so far
  local total=0
  for port in 19001 19002; do
    total=$((total + $(curl -s "http://127.0.0.1:$port/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["connections"])')))
  done
  echo $total
}
upstream_requests() {
  local total=0
  for port in 19001 19002; do
    total=$((total + $(curl -s "http://127.0.0.1:$port/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["requests"])')))
  done
  echo $total
}

messages_body='{"model":"fake","max_tokens":8,"messages":[{"role":"user","content":"Hello there, how are you today?"}]}'
messages_stream='{"model":"fake","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"Hello there, how are you today?"}]}'
openai_body='{"model":"fake","max_tokens":8,"messages":[{"role":"user","content":"Hello there, how are you today?"}]}'
openai_stream='{"model":"fake","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"Hello there, how are you today?"}]}'

run_target() { # target api -> JSON object
  local target=$1 api=$2 pid port url plain stream
  if [ "$target" = direct ]; then
    pid=; port=19001
  else
    read -r pid port < <(start_target "$target")
    pids+=("$pid")
    wait_port "$port"
    sleep 1
  fi
  if [ "$api" = messages ]; then
    url=http://127.0.0.1:$port/v1/messages; plain=$messages_body; stream=$messages_stream
  else
    url=http://127.0.0.1:$port/v1/chat/completions; plain=$openai_body; stream=$openai_stream
  fi
  step "$target ($api)"
  # Warm-up (connections, JIT of the policy, caches).
  phase warmup "$url" "$plain" 200 >/dev/null
  local results=()
  results+=("$(phase plain@500 "$url" "$plain" 500)")
  results+=("$(phase plain@2000 "$url" "$plain" 2000)")
  results+=("$(phase stream@500 "$url" "$stream" 500)")
  results+=("$(phase stream@2000 "$url" "$stream" 2000)")
  local cpu0 cpu1 conns0 conns1 reqs0 reqs1
  for kind in plain stream; do
    local body=$plain
    [ $kind = stream ] && body=$stream
    cpu0=0; [ -n "$pid" ] && cpu0=$(tree_cpu "$pid")
    conns0=$(upstream_connections); reqs0=$(upstream_requests)
    local r
    r=$(phase "$kind@max" "$url" "$body")
    cpu1=0; [ -n "$pid" ] && cpu1=$(tree_cpu "$pid")
    conns1=$(upstream_connections); reqs1=$(upstream_requests)
    local rss=0; [ -n "$pid" ] && rss=$(tree_rss_kib "$pid")
    results+=("$(python3 -c "import json,sys; r=json.loads(sys.argv[1]); r['cpu_s']=float(sys.argv[2])-float(sys.argv[3]); r['peak_rss_kib']=int(sys.argv[4]); r['new_upstream_connections']=int(sys.argv[6])-int(sys.argv[5]); r['upstream_requests']=int(sys.argv[8])-int(sys.argv[7]); print(json.dumps(r))" "$r" "$cpu1" "$cpu0" "$rss" "$conns0" "$conns1" "$reqs0" "$reqs1")")
  done
  if [ -n "$pid" ]; then
    if [ "$target" = ringmaster ]; then
      curl -s "http://127.0.0.1:$port/metrics" > "$out/ringmaster-metrics.txt" || true
    fi
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  python3 -c "import json,sys; print(json.dumps({'target': sys.argv[1], 'api': sys.argv[2], 'round': int(sys.argv[3]), 'phases': [json.loads(x) for x in sys.argv[4:]]}))" "$target" "$api" "$round" "${results[@]}"
}

# Rounds, alternated: the VM's speed drifts between runs by more than the differences
# measured, so each round measures every target once, in the reverse order of the round
# before, and the report takes medians. The peers (sglang-router, vllm-router) are measured
# in the first round only: the targets are ratios to HAProxy.
all=()
for round in $(seq 1 "$rounds"); do
  step "round $round of $rounds"
  messages_targets=(direct ringmaster ringmaster-ring haproxy)
  openai_targets=(direct ringmaster haproxy)
  [ "$round" = 1 ] && openai_targets+=(sglang vllm)
  if [ $((round % 2)) = 0 ]; then
    messages_targets=(direct haproxy ringmaster-ring ringmaster)
    openai_targets=(direct haproxy ringmaster)
  fi
  for target in "${messages_targets[@]}"; do all+=("$(run_target "$target" messages)"); done
  for target in "${openai_targets[@]}"; do all+=("$(run_target "$target" openai)"); done
done
python3 - "$out/results.json" "${all[@]}" <<'PY'
import json, sys
json.dump([json.loads(x) for x in sys.argv[2:]], open(sys.argv[1], "w"), indent=1)
PY
python3 "$root/tests/bench/overhead_report.py" "$out/results.json" > "$out/overhead.md"
cat "$out/overhead.md"
