#!/usr/bin/env bash
# TLS termination, side by side in one run on loopback (not part of tests/run): Ringmaster's
# front door with `[tls]` and HAProxy (Debian's package, OpenSSL) terminating the same ECDSA
# P-256 certificate, in front of the same two fake OpenAI-compatible upstreams. Two phases per
# target, each with the router's CPU seconds per request:
#
# - keep-alive: the maximum rate of 64 HTTPS connections kept open (non-streaming chat);
# - handshakes: every request on a new connection (oha --disable-keepalive), so the rate is
#   the new TLS handshakes per second (64 at a time).
#
# oha is pinned to core 0; the router and both upstreams share core 1. Rounds alternate the
# order; the report takes medians.
#
#   tests/bench/tls.sh [--seconds 5] [--rounds 3] [--out tests/bench/results/tls]
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
# shellcheck source=tests/bench/lib.sh
source "$root/tests/bench/lib.sh"
bench_setup "$@"

command -v haproxy >/dev/null || { apt-get update -qq && apt-get install -y -qq haproxy; }
command -v openssl >/dev/null || { apt-get update -qq && apt-get install -y -qq openssl; }
oha=$(bench_oha)
bench_build

work=$(mktemp -d)
pids=()
trap bench_cleanup EXIT

step "certificates (openssl, ECDSA P-256) and configs"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
  -keyout "$work/tls.key" -out "$work/tls.crt" 2>/dev/null
cat "$work/tls.crt" "$work/tls.key" > "$work/haproxy.pem"
{
  two_server_config 127.0.0.1:18443
  printf '[tls]\ncert = "%s"\nkey = "%s"\n' "$work/tls.crt" "$work/tls.key"
} > "$work/ringmaster.toml"
haproxy_config "127.0.0.1:18444 ssl crt $work/haproxy.pem alpn http/1.1" > "$work/haproxy.cfg"
start_upstreams 19001:8 19002:8

tree_cpu() { # CPU seconds (user + system) of one process
  python3 -c "import os,sys; t=os.sysconf('SC_CLK_TCK'); f=open(f'/proc/{sys.argv[1]}/stat').read().rsplit(')',1)[1].split(); print((int(f[11])+int(f[12]))/t)" "$1"
}
body='{"model":"fake","max_tokens":8,"messages":[{"role":"user","content":"Hello there, how are you today?"}]}'

run_target() { # target -> JSON object
  local target=$1 pid port
  case $target in
    ringmaster)
      RUST_LOG=warn taskset -c 1 "$ringmaster" serve --config "$work/ringmaster.toml" >"$work/ringmaster.log" 2>&1 &
      pid=$!; port=18443 ;;
    haproxy)
      taskset -c 1 haproxy -f "$work/haproxy.cfg" -db >"$work/haproxy.log" 2>&1 &
      pid=$!; port=18444 ;;
  esac
  pids+=("$pid")
  wait_port "$port"
  sleep 1
  local url=https://127.0.0.1:$port/v1/chat/completions
  step "$target"
  phase warmup "$url" "$body" 200 --insecure >/dev/null
  local results=() kind cpu0 cpu1 r
  for kind in keepalive handshakes; do
    local extra=(--insecure)
    [ "$kind" = handshakes ] && extra+=(--disable-keepalive)
    cpu0=$(tree_cpu "$pid")
    r=$(phase "$kind" "$url" "$body" "" "${extra[@]}")
    cpu1=$(tree_cpu "$pid")
    results+=("$(python3 -c "import json,sys; r=json.loads(sys.argv[1]); r['cpu_s']=float(sys.argv[2])-float(sys.argv[3]); r['cpu_us_per_request']=r['cpu_s']*1e6/max(r['ok'],1); print(json.dumps(r))" "$r" "$cpu1" "$cpu0")")
  done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  python3 -c "import json,sys; print(json.dumps({'target': sys.argv[1], 'round': int(sys.argv[2]), 'phases': [json.loads(x) for x in sys.argv[3:]]}))" "$target" "$round" "${results[@]}"
}

all=()
for round in $(seq 1 "$rounds"); do
  step "round $round of $rounds"
  targets=(ringmaster haproxy)
  [ $((round % 2)) = 0 ] && targets=(haproxy ringmaster)
  for target in "${targets[@]}"; do all+=("$(run_target "$target")"); done
done
python3 - "$out/tls.json" "${all[@]}" <<'PY' | tee "$out/tls.md"
import json, statistics, sys
runs = [json.loads(x) for x in sys.argv[2:]]
json.dump(runs, open(sys.argv[1], "w"), indent=1)
def median(target, phase, key):
    return statistics.median(p[key] for r in runs if r["target"] == target
                             for p in r["phases"] if p["phase"] == phase)
print("| phase | Ringmaster req/s | HAProxy req/s | ratio | Ringmaster CPU µs/req | HAProxy CPU µs/req | failed |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for phase in ("keepalive", "handshakes"):
    rm, ha = median("ringmaster", phase, "rps"), median("haproxy", phase, "rps")
    failed = sum(p["total"] - p["ok"] for r in runs for p in r["phases"] if p["phase"] == phase)
    print(f"| {phase} | {rm:,.0f} | {ha:,.0f} | {rm / ha:.2f}x | "
          f"{median('ringmaster', phase, 'cpu_us_per_request'):,.0f} | "
          f"{median('haproxy', phase, 'cpu_us_per_request'):,.0f} | {failed} |")
PY
