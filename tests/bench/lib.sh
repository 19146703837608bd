# Shared by the loopback benchmarks (overhead.sh, front_door.sh, paired.sh); sourced, not run,
# from the repository root ($root). `bench_setup "$@"` reads the options and sets $seconds (per
# phase), $rounds, $out, $cache (tools) and $target_dir; the phases expect $work (a scratch
# directory) too.

# bench_setup [--seconds S] [--rounds N] [--out DIR]: the options every benchmark takes, over
# the defaults below (a script that repeats nothing ignores --rounds).
bench_setup() {
  seconds=5
  rounds=3
  out=$root/tests/bench/results
  while [ $# -gt 0 ]; do
    case $1 in
      --seconds) seconds=$2; shift 2 ;;
      --rounds) rounds=$2; shift 2 ;;
      --out) out=$2; shift 2 ;;
      *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
  done
  mkdir -p "$out"
  cache=${RINGMASTER_BENCH_CACHE:-/var/cache/ringmaster/bench}
  mkdir -p "$cache"
  target_dir=${CARGO_TARGET_DIR:-$root/target}
}

# bench_cleanup: stops every process in $pids and removes $work (trap it on EXIT).
bench_cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}

step() { printf '\n==> %s\n' "$*" >&2; }

# oha (crates.io), the load generator, built once into the bench cache.
bench_oha() {
  if [ ! -x "$cache/oha/bin/oha" ]; then
    cargo install --locked --root "$cache/oha" oha >&2
  fi
  echo "$cache/oha/bin/oha"
}

wait_port() {
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "nothing listens on port $1" >&2
  return 1
}

# phase NAME URL BODY [RATE] [extra oha args...] -> one JSON line: p50/p99 in µs, the rate
# reached, the 2xx count and the total. With RATE, a fixed rate with latency correction;
# without, as fast as 64 connections go. oha runs on core 0.
phase() {
  local name=$1 url=$2 body=$3 rate=${4:-} json
  shift 4 2>/dev/null || shift $#
  json=$(mktemp -p "$work" oha.XXXX.json)
  local args=(-z "${seconds}s" --no-tui --output-format json -m POST
    -H 'content-type: application/json' -H 'x-session-id: bench-session-1'
    -H 'anthropic-version: 2023-06-01' -d "$body" "$@")
  if [ -n "$rate" ]; then
    args+=(-q "$rate" --latency-correction -c 64)
  else
    args+=(-c 64)
  fi
  taskset -c 0 "$oha" "${args[@]}" "$url" >"$json" 2>"$json.err" || { cat "$json.err" >&2; return 1; }
  python3 - "$json" "$name" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
lat = d.get("latencyPercentiles", {})
s = d.get("summary", {})
codes = d.get("statusCodeDistribution", {})
ok = sum(v for k, v in codes.items() if k.startswith("2"))
print(json.dumps({"phase": sys.argv[2], "p50_us": (lat.get("p50") or 0) * 1e6,
                  "p99_us": (lat.get("p99") or 0) * 1e6, "rps": s.get("requestsPerSec", 0),
                  "ok": ok, "total": sum(codes.values()), "codes": codes,
                  "errors": d.get("errorDistribution", {})}))
PY
}

# start_upstreams PORT:TOKENS...: fake OpenAI-compatible servers ($fake) on core 1, one per
# argument, each answering TOKENS tokens; their pids are added to $pids.
start_upstreams() {
  local spec
  for spec in "$@"; do
    taskset -c 1 "$fake" --listen "127.0.0.1:${spec%%:*}" --tokens "${spec##*:}" &
    pids+=($!)
    wait_port "${spec%%:*}"
  done
}

# two_server_config LISTEN: a gateway config for the two 8-token upstreams on :19001 and
# :19002, with no queue limit in the way.
two_server_config() {
  cat <<TOML
listen = "$1"
models = ["fake"]
[limits]
max_waiting_per_server = 1000000
[[servers]]
address = "http://127.0.0.1:19001"
[[servers]]
address = "http://127.0.0.1:19002"
TOML
}

# bench_build: the release gateway and fake upstream, as $ringmaster and $fake.
bench_build() {
  step "build: ringmaster and fake-upstream (release)"
  cargo build --release --locked -p ringmaster -p ringmaster-tests --bin ringmaster --bin fake-upstream >&2
  ringmaster=$target_dir/release/ringmaster
  fake=$target_dir/release/fake-upstream
}

# haproxy_config BIND: HAProxy (one thread) in front of the two upstreams on :19001 and
# :19002, hashing the session header on a consistent ring with bounded loads (the ring
# Ringmaster's is compared with), on the `bind` line BIND.
haproxy_config() {
  cat <<CFG
global
  maxconn 4096
  nbthread 1
defaults
  mode http
  timeout connect 2s
  timeout client 60s
  timeout server 60s
  option http-keep-alive
frontend fe
  bind $1
  default_backend be
backend be
  balance hdr(x-session-id)
  hash-type consistent
  hash-balance-factor 125
  http-reuse always
  server a 127.0.0.1:19001
  server b 127.0.0.1:19002
CFG
}
