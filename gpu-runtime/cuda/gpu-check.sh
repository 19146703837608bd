#!/usr/bin/env bash
# The GPU checks, for a machine with an NVIDIA GPU and its driver (run from the repository
# root): the CUDA kernels against the CPU kernels on the device, with nothing skipped.
# NVRTC comes from the CUDA toolkit, or from the PyPI wheel nvidia-cuda-nvrtc-cu12 on
# LD_LIBRARY_PATH (tests/run shows how).
set -euo pipefail
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
log=$(mktemp)
RINGMASTER_REQUIRE_NVRTC=1 cargo test --release -p ringmaster-cuda -- --nocapture >"$log" 2>&1 \
  || { cat "$log"; echo "GPU checks failed" >&2; exit 1; }
cat "$log"
if grep -q "skipping" "$log"; then
  echo "a GPU test skipped: no usable device" >&2
  exit 1
fi
echo "GPU checks passed"
