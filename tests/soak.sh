#!/usr/bin/env bash
# The soak (tests/soak/soak.py says what it asserts): a started gateway under steady mixed
# load on both doors through the official SDKs, router swaps every 5 s, servers joining and
# draining every 7 s, a remote server killed or hung every 15 s; it fails on any request no
# injected fault explains, on resident memory growing past its bound after warm-up, and on
# leaked KV blocks, policy instances, connections or file descriptors. The load runs on core
# 0, the gateway on core 1.
#
#   tests/soak.sh [--seconds N] [--workers N] [--report FILE] [--release]
#
# Default 600 s (tests/run runs it for 60). Binaries from $CARGO_TARGET_DIR (default target/):
# debug unless --release (built here when missing); the SDKs from $RINGMASTER_VENV (default
# .venv, made by tests/run).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
target_dir=${CARGO_TARGET_DIR:-$root/target}
profile=debug
args=()
while [ $# -gt 0 ]; do
  case $1 in
    --release) profile=release; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ "$profile" = release ] && [ ! -x "$target_dir/release/ringmaster" -o ! -x "$target_dir/release/fake-upstream" ]; then
  cargo build --release -p ringmaster -p ringmaster-tests --bin ringmaster --bin fake-upstream
fi
for bin in ringmaster fake-upstream; do
  [ -x "$target_dir/$profile/$bin" ] || { echo "soak: $target_dir/$profile/$bin is missing (cargo build --workspace, or --release)" >&2; exit 1; }
done
venv=${RINGMASTER_VENV:-$root/.venv}
"$venv/bin/python" -c 'import anthropic, openai' 2>/dev/null || {
  echo "soak: $venv has no anthropic and openai SDKs (tests/run makes it from tests/python/requirements.txt)" >&2; exit 1; }
command -v taskset >/dev/null || { echo "soak: taskset (util-linux) is missing" >&2; exit 1; }
exec taskset -c 0 "$venv/bin/python" tests/soak/soak.py \
  --bin "$target_dir/$profile/ringmaster" --fake "$target_dir/$profile/fake-upstream" \
  --components policies/dist "${args[@]}"
