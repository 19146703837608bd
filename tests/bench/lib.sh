# Shared by the loopback benchmarks (overhead.sh, front_door.sh); sourced, not run. Expects
# $work (a scratch directory), $seconds (per phase) and $cache (tools) to be set.

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
