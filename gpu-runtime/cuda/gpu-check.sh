#!/usr/bin/env bash
# The GPU checks, for a machine with an NVIDIA GPU and its driver (run from the repository
# root), in one go:
#   1. the CUDA kernels against the CPU kernels on the device (ringmaster-cuda);
#   2. SmolLM2 on the GPU against the CPU model, and answering through the engine
#      (ringmaster-gpu-runtime's `gpu` tests);
#   3. the streams benchmark on the first step (the baseline) and the second: TTFT p50/p99,
#      tokens/s per stream and in all, the batch figures.
# Nothing may skip. NVRTC comes from the CUDA toolkit, or from the PyPI wheel
# nvidia-cuda-nvrtc-cu12 on LD_LIBRARY_PATH (tests/run shows how); the model from
# `cargo xtask model` (or RINGMASTER_MODEL).
set -euo pipefail
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
log=$(mktemp)
run() {
  echo "== $*"
  if ! "$@" >"$log" 2>&1; then
    cat "$log"
    echo "GPU check failed: $*" >&2
    exit 1
  fi
  cat "$log"
  if grep -q "skipping" "$log"; then
    echo "a GPU check skipped: no usable device, NVRTC or model" >&2
    exit 1
  fi
}
export RINGMASTER_REQUIRE_NVRTC=1 RINGMASTER_REQUIRE_MODEL=1
run cargo test --release -p ringmaster-cuda -- --nocapture
run cargo test --release -p ringmaster-gpu-runtime --features cuda --lib -- model::tests::gpu --nocapture
RINGMASTER_GPU_PATH=v1 RINGMASTER_BENCH_STREAMS=1,32 run cargo bench -p ringmaster-gpu-runtime --features cuda --bench streams
RINGMASTER_GPU_PATH=v2 run cargo bench -p ringmaster-gpu-runtime --features cuda --bench streams
echo "GPU checks passed"
