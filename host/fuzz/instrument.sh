#!/bin/sh
# RUSTC_WORKSPACE_WRAPPER for the fuzz build (host/fuzz/run.sh): compiles the workspace's own
# crates with libFuzzer's coverage instrumentation (SanitizerCoverage: 8-bit counters, the PC
# table, comparison tracing), the flags cargo-fuzz passes, all of them stable rustc options.
# Dependencies are not members, so they are built plain and their artifacts are the ones the
# normal build made: coverage guides the fuzzer through our parsers, not through serde's.
# Build scripts, test harnesses (run.sh builds host/fuzz/tests/corpora.rs beside the targets)
# and version queries are passed through untouched: linked with the instrumentation, they would
# need libFuzzer's callbacks.
rustc=$1
shift
case " $* " in
  *" --crate-name build_script_"*|*" --test "*|*" -vV "*|*" - "*)
    exec "$rustc" "$@" ;;
  *" --crate-name "*)
    exec "$rustc" "$@" \
      -Cpasses=sancov-module \
      -Cllvm-args=-sanitizer-coverage-level=4 \
      -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
      -Cllvm-args=-sanitizer-coverage-pc-table \
      -Cllvm-args=-sanitizer-coverage-trace-compares \
      --cfg fuzzing ;;
  *)
    exec "$rustc" "$@" ;;
esac
