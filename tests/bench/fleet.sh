#!/usr/bin/env bash
# Gateways as replicas on one Redis (`--cluster`), measured on loopback (not part of tests/run):
#
#   1. the conversation trace (tests/traces) replayed on the wall clock through 1, 2 and 4
#      replicas (each request to one at random) in front of one shared fleet of 8 simulated
#      workers (`ringmaster worker --simulated`, KV events and all), with --cluster and
#      without: the token hit ratio and TTFT p99 per replica count (target: 4 replicas within
#      5 % of one), and the plot of hit ratio against replicas;
#   2. how fast a change made on one replica serves on all: 50 weight changes on replica 0,
#      each timed until replicas 1 and 2 answer with it (target: p99 under 1 s);
#   3. the shared buckets' cost per request: one gateway with a limited key before a fake
#      upstream, with --cluster (a local Redis) and without, at a steady 500 req/s (added
#      p50, target under 200 µs) and as fast as 64 connections go (target: at least 0.8×).
#
#   tests/bench/fleet.sh [--seconds 5] [--rounds 3] [--out tests/bench/results]
#                        [--requests 2000] [--speedup 20] [--repeats 3]
#
# Part 1 runs every cell --repeats times, the cells interleaved (a wall-clock replay moves by
# a point or two of hit ratio between identical runs); the report gives each cell's median
# and range.
#
# Part 3 alternates the two sides within each of --rounds rounds. The load generators (oha,
# fleet-replay), Redis and the simulated workers run on core 0, the replicas on core 1. Writes fleet.json,
# fleet.md and fleet-hit-ratio.svg under --out; BENCHMARKS.md quotes them.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
# shellcheck source=tests/bench/lib.sh
source "$root/tests/bench/lib.sh"
requests=2000
speedup=20
repeats=3
args=()
while [ $# -gt 0 ]; do
  case $1 in
    --requests) requests=$2; shift 2 ;;
    --speedup) speedup=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
bench_setup "${args[@]}"
work=$(mktemp -d)
trace=${RINGMASTER_TRACE:-$root/tests/traces/mooncake_fast25_conversation_trace.jsonl}
[ -f "$trace" ] || { echo "no trace at $trace (set RINGMASTER_TRACE)" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "redis-server is not installed (apt-get install redis-server)" >&2; exit 1; }

step "tools: oha"
oha=$(bench_oha)
step "build: ringmaster, fleet-replay and fake-upstream (release)"
cargo build --release --locked -p ringmaster -p ringmaster-tests --bin ringmaster --bin fleet-replay --bin fake-upstream >&2
ringmaster=$target_dir/release/ringmaster
replay=$target_dir/release/fleet-replay
fake=$target_dir/release/fake-upstream

pids=()
trap bench_cleanup EXIT

# stop PID...: stops the given processes and forgets them.
stop() {
  local pid keep=()
  for pid in "$@"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    case " $* " in *" $pid "*) ;; *) keep+=("$pid") ;; esac
  done
  pids=("${keep[@]}")
}

start_redis() {
  rm -rf "$work/redis" && mkdir -p "$work/redis"
  # Redis is the replicas' infrastructure, not what is measured: it runs beside the load
  # generator on core 0 (in production it is a machine of its own).
  taskset -c 0 redis-server --port 0 --unixsocket "$work/redis/redis.sock" --save "" \
    --appendonly yes --dir "$work/redis" >/dev/null 2>&1 &
  redis_pid=$!
  pids+=("$redis_pid")
  for _ in $(seq 1 100); do [ -S "$work/redis/redis.sock" ] && return 0; sleep 0.05; done
  echo "redis-server did not start" >&2; return 1
}
redis_url() { echo "redis+unix://$work/redis/redis.sock"; }

# start_replica PORT CONFIG [CLUSTER_URL]: a gateway replica on core 1.
start_replica() {
  local port=$1 config=$2 url=${3:-}
  local cluster=()
  [ -n "$url" ] && cluster=(--cluster "$url" --replica "r$port")
  RUST_LOG=warn taskset -c 1 "$ringmaster" serve -c "$config" --listen "127.0.0.1:$port" "${cluster[@]}" \
    >"$work/replica-$port.log" 2>&1 &
  pids+=($!)
  wait_port "$port"
}

admin_token=fleet-bench-admin-token-0123

# ---------------------------------------------------------------------------------------------
step "1. the conversation trace through 1, 2 and 4 replicas ($requests requests, ${speedup}x, $repeats repeats)"
time_scale=$(python3 -c "print(1 / $speedup)")
fleet_config=$work/fleet.toml
{
  echo "models = [\"replay\"]"
  echo "admin_token = \"$admin_token\""
  echo "[limits]"
  echo "max_body_bytes = 268435456"
  echo "max_output_tokens = 1000000"
  echo "max_waiting_per_server = 1000000000"
  for i in $(seq 0 7); do
    echo "[[servers]]"
    echo "address = \"http://127.0.0.1:$((19100 + i))\""
    echo "models = [\"replay\"]"
  done
} >"$fleet_config"
runs=()
for repeat in $(seq 1 "$repeats"); do
for mode in cluster alone; do
  for replicas in 1 2 4; do
    workers=()
    for i in $(seq 0 7); do
      # The workers are the fleet, not what is measured (machines of their own in
      # production): core 0, beside the load generator and Redis, so that the replicas on
      # core 1 contend only with each other.
      RUST_LOG=warn taskset -c 0 "$ringmaster" worker --simulated --name replay \
        --time-scale "$time_scale" --max-running 256 --step-token-budget 8192 \
        --listen "127.0.0.1:$((19100 + i))" >"$work/worker-$i.log" 2>&1 &
      workers+=($!); pids+=($!)
    done
    for i in $(seq 0 7); do wait_port $((19100 + i)); done
    url=
    if [ "$mode" = cluster ]; then start_redis; url=$(redis_url); fi
    gateways=()
    replica_pids=()
    for r in $(seq 0 $((replicas - 1))); do
      start_replica $((18100 + r)) "$fleet_config" "$url"
      replica_pids+=("${pids[-1]}")
      gateways+=(--gateway "http://127.0.0.1:$((18100 + r))")
    done
    # The workers' KV event streams reach every replica before the first request.
    sleep 1
    out_json=$work/replay-$mode-$replicas.json
    taskset -c 0 "$replay" run --trace "$trace" --limit "$requests" --speedup "$speedup" \
      "${gateways[@]}" --out "$out_json" >&2
    runs+=("$(python3 -c "import json,sys; d=json.load(open('$out_json')); d['mode']='$mode'; d['replicas']=$replicas; d['repeat']=$repeat; print(json.dumps(d))")")
    stop "${replica_pids[@]}" "${workers[@]}"
    if [ "$mode" = cluster ]; then stop "$redis_pid"; fi
  done
done
done
printf '%s\n' "${runs[@]}" >"$work/replay.jsonl"

# ---------------------------------------------------------------------------------------------
step "2. a change on one replica, seen on all (50 changes, 3 replicas)"
start_upstreams 19001:8
small=$work/small.toml
cat >"$small" <<TOML
models = ["fake"]
admin_token = "$admin_token"
[[servers]]
address = "http://127.0.0.1:19001"
TOML
start_redis
for r in 0 1 2; do start_replica $((18110 + r)) "$small" "$(redis_url)"; done
python3 - "$admin_token" >"$work/propagation.json" <<'PY'
import json, sys, time, urllib.request
token = sys.argv[1]
bases = [f"http://127.0.0.1:{18110 + r}" for r in range(3)]
def call(method, url):
    req = urllib.request.Request(url, method=method, headers={"x-admin-token": token})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())
def weight(base):
    variants = call("GET", base + "/admin/policies")["router"]["variants"]
    return next(v["weight"] for v in variants if v["name"] == "default")
seen, answered = [], []
for i in range(50):
    w = 100 + (i % 2) + 1
    t0 = time.perf_counter()
    call("POST", f"{bases[0]}/admin/policies/router/weight?variant=default&weight={w}")
    answered.append(time.perf_counter() - t0)
    pending = set(bases[1:])
    while pending:
        for base in list(pending):
            if weight(base) == w:
                pending.discard(base)
        if time.perf_counter() - t0 > 10:
            raise SystemExit(f"change {i} not seen on all within 10 s")
    seen.append(time.perf_counter() - t0)
def q(v, p):
    v = sorted(v); return v[min(len(v) - 1, round((len(v) - 1) * p))]
print(json.dumps({"changes": len(seen), "seen_p50_ms": q(seen, .5) * 1e3, "seen_p99_ms": q(seen, .99) * 1e3,
                  "seen_max_ms": max(seen) * 1e3, "answered_p50_ms": q(answered, .5) * 1e3}))
PY
cat "$work/propagation.json" >&2
stop "${pids[@]}"

# ---------------------------------------------------------------------------------------------
step "3. the shared buckets' cost: --cluster against alone ($rounds rounds)"
start_upstreams 19001:8
limited=$work/limited.toml
cat >"$limited" <<TOML
models = ["fake"]
[limits]
max_waiting_per_server = 1000000
[[tenants]]
name = "acme"
requests_per_minute = 100000000
input_tokens_per_minute = 1000000000
output_tokens_per_minute = 1000000000
[[api_keys]]
key = "sk-bench-acme-0001"
tenant = "acme"
[[servers]]
address = "http://127.0.0.1:19001"
TOML
start_redis
body='{"model":"fake","max_tokens":8,"messages":[{"role":"user","content":"Hello, bench"}]}'
: >"$work/buckets.jsonl"
for round in $(seq 1 "$rounds"); do
  for mode in alone cluster; do
    url=
    [ "$mode" = cluster ] && url=$(redis_url)
    start_replica 18120 "$limited" "$url"
    gw=${pids[-1]}
    phase "$mode-steady" http://127.0.0.1:18120/v1/messages "$body" 500 -H 'x-api-key: sk-bench-acme-0001' \
      | python3 -c "import json,sys; d=json.load(sys.stdin); d['round']=$round; print(json.dumps(d))" >>"$work/buckets.jsonl"
    phase "$mode-max" http://127.0.0.1:18120/v1/messages "$body" "" -H 'x-api-key: sk-bench-acme-0001' \
      | python3 -c "import json,sys; d=json.load(sys.stdin); d['round']=$round; print(json.dumps(d))" >>"$work/buckets.jsonl"
    stop "$gw"
  done
done

# ---------------------------------------------------------------------------------------------
step "report"
"$replay" plot --runs "$work/replay.jsonl" --out "$out/fleet-hit-ratio.svg"
python3 "$root/tests/bench/fleet_report.py" "$work/replay.jsonl" "$work/propagation.json" \
  "$work/buckets.jsonl" "$out"
cat "$out/fleet.md"
