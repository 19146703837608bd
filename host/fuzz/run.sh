#!/usr/bin/env bash
# Builds the fuzz targets with libFuzzer's coverage instrumentation and runs each for a
# bounded time from its committed corpus (host/fuzz/corpus/TARGET, read only; what the run
# finds is kept in a scratch copy). Fails on the first panic, crash, timeout or
# out-of-memory, naming the input that caused it. Prints and writes a table of executions per
# target (host/fuzz/README.md says how to reproduce a finding).
#
#   host/fuzz/run.sh [--seconds N] [--seed S] [--report FILE] [TARGET ...]
#
# S: libFuzzer's random seed (default: a new one each run). tests/run passes a fixed one, so
# that a CI run explores what the last one did and a finding there is one the code brought,
# not the dice; longer runs by hand leave it out to explore further.
# N: seconds per target (default 6: nine targets in about a minute). The targets are built in
# $CARGO_TARGET_DIR (default target/) with the dev profile, for the whole workspace with the
# features tests/run builds (RINGMASTER_FUZZ_FEATURES, default the CUDA ones) and one test
# target beside them: cargo then resolves every dependency exactly as tests/run's build did
# and reuses it, recompiling only the workspace's own crates with the instrumentation.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
seconds=6
seed=0
report=
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --report) report=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all=$(sed -n 's/^name = "\([a-z_]*\)"$/\1/p' host/fuzz/Cargo.toml | grep -v '^ringmaster')
[ ${#targets[@]} -gt 0 ] || read -r -a targets <<< "$(echo $all)"
target_dir=${CARGO_TARGET_DIR:-$root/target}

echo "fuzz: building ${#targets[@]} targets with coverage instrumentation"
bins=()
for t in "${targets[@]}"; do bins+=(--bin "$t"); done
features=${RINGMASTER_FUZZ_FEATURES:-ringmaster-gpu-runtime/cuda,ringmaster/cuda}
RUSTC_WORKSPACE_WRAPPER="$root/host/fuzz/instrument.sh" \
  cargo build --locked --workspace --features "$features" --test corpora "${bins[@]}"

scratch=$(mktemp -d "${TMPDIR:-/tmp}/ringmaster-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
printf "%-18s %12s %10s %8s\n" target executions exec/s new-units | tee "$scratch/report"
total=0
for t in "${targets[@]}"; do
  seeds=host/fuzz/corpus/$t
  mkdir -p "$scratch/$t/corpus" "$scratch/$t/artifacts"
  [ -d "$seeds" ] || seeds=
  log=$scratch/$t/log
  # -rss_limit_mb: a parser that allocates what its input claims is a finding, not a crash
  # of the machine; -timeout: one input taking 10 s is a hang.
  if ! "$target_dir/debug/$t" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
      -print_final_stats=1 -seed="$seed" -artifact_prefix="$scratch/$t/artifacts/" \
      "$scratch/$t/corpus" ${seeds:+"$seeds"} > "$log" 2>&1; then
    echo "fuzz: $t FAILED; the end of its log:" >&2
    tail -40 "$log" >&2
    for found in "$scratch/$t/artifacts"/*; do
      [ -f "$found" ] || continue
      mkdir -p "$root/host/fuzz/findings"
      cp "$found" "$root/host/fuzz/findings/$t-$(basename "$found")"
      echo "fuzz: input kept in host/fuzz/findings/$t-$(basename "$found") ($(wc -c < "$found") bytes); reproduce: $target_dir/debug/$t $root/host/fuzz/findings/$t-$(basename "$found")" >&2
    done
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  per_second=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  units=$(find "$scratch/$t/corpus" -type f | wc -l)
  total=$((total + ${runs:-0}))
  printf '%-18s %12s %10s %8s\n' "$t" "${runs:-?}" "${per_second:-?}" "$units" | tee -a "$scratch/report"
done
printf '%-18s %12s\n' total "$total" | tee -a "$scratch/report"
[ -z "$report" ] || cp "$scratch/report" "$report"
