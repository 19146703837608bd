#!/usr/bin/env bash
# Prepares the GPU checks for a GPU machine without a Rust toolchain or a network (the device
# machines lent to sessions): builds the CUDA test binaries and benches here, in release,
# stripped, into .gpu-bundle/ (git-ignored) with SmolLM2's shapes (shapes.gguf, 1.8 MB: the
# benches time random weights of those shapes, so the 98 MB model need not travel) and run.sh,
# which runs every check under its own timeout with every log and figure under $OUT: the kernel
# checks, both steps against the CPU forward, then the step bench and the streams bench on the
# first step (RINGMASTER_GPU_PATH=v1, the baseline) and the second on the same card.
#
# One call does it (the bundle is ~10 MB):
#   gpu-runtime/cuda/device-bundle.sh                      (here, once)
#   run: command "cd .gpu-bundle && ./run.sh", carry [".gpu-bundle"], timeout_s 300
# With the real model at .gpu-bundle/model.gguf (two calls' carry: split it) run.sh also checks
# SmolLM2 against the CPU model and times the real weights.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.gpu-bundle
grep -qxF "/$out/" .git/info/exclude 2>/dev/null || echo "/$out/" >>.git/info/exclude
rm -rf "$out"
mkdir -p "$out"
binaries() {
  cargo "$@" --locked --no-run --message-format=json |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])'
}
for exe in $( (binaries test --release -p ringmaster-cuda --lib
               binaries test --release -p ringmaster-gpu-runtime --features cuda --lib
               binaries bench -p ringmaster-gpu-runtime --features cuda --bench streams
               binaries bench -p ringmaster-gpu-runtime --features cuda --bench gpu_step) | sort -u); do
  name=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
  cp "$exe" "$out/$name"
  strip "$out/$name"
done
# The model's shapes without its weights (1.8 MB for SmolLM2): on the GPU machine the benches
# time random weights of those shapes, so the model need not travel (98 MB, over a call's carry).
model=${RINGMASTER_MODEL:-${RINGMASTER_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ringmaster/models}/SmolLM2-135M-Instruct.Q4_1.gguf}
if [ -f "$model" ]; then
  cargo run --release --locked -q -p ringmaster-gpu-runtime --example model_shapes -- "$model" "$out/shapes.gguf"
else
  echo "note: no model at $model (cargo xtask model): the bundle carries no shapes, and the benches need model.gguf there"
fi
cat >"$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# On the GPU machine: every GPU check, each under its own timeout, failing on any skip, with
# every log and figure written under $OUT (or ./out): the kernel checks (ringmaster-cuda),
# the model checks (both steps against the CPU forward, the sampling kernel against its Rust
# mirror), then the streams bench on the first step (the baseline, 1 and 32 streams) and the
# second (1, 8, 32, 64 streams) on the same card.
set -uo pipefail
cd "$(dirname "$0")"
out=${OUT:-$PWD/out}
mkdir -p "$out"
# RINGMASTER_DRY_RUN=1: on a machine without a GPU, walk every step (skips allowed, the streams
# bench on the CPU executor with a few tokens), so the device's minutes only measure.
dry=${RINGMASTER_DRY_RUN:-0}
bench_env=()
if [ "$dry" = 1 ]; then
  bench_env=(RINGMASTER_BENCH_DEVICE=cpu RINGMASTER_BENCH_TOKENS=4 RINGMASTER_BENCH_ROUNDS=1)
  echo "dry run: no GPU expected; the streams bench runs on the CPU"
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
fi
status=0
check() {
  local seconds=$1 name=$2
  shift 2
  echo "== $name: $* (at most ${seconds}s)"
  timeout "$seconds" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  tail -n 40 "$out/$name.log"
  if [ "$rc" -ne 0 ]; then echo "$name FAILED (exit $rc)"; status=1; fi
  if grep -q "skipping" "$out/$name.log"; then
    echo "$name skipped a check"
    if [ "$dry" != 1 ]; then status=1; rc=1; fi
  fi
  return $rc
}
# cudarc (built for CUDA 12.8) looks for libnvrtc.so and libcublas.so by name. Link each found
# library under the plain name and also put its own folder on LD_LIBRARY_PATH: a cuBLAS whose
# RUNPATH is $ORIGIN finds libcublasLt there, not beside a symlink.
mkdir -p libs
dirs=""
for lib in nvrtc nvrtc-builtins cublas cublasLt; do
  f=$(find /usr/local/cuda* /opt /usr/lib /usr/local/lib -name "lib$lib.so*" 2>/dev/null | grep -v stub | sort | head -1)
  if [ -n "$f" ]; then ln -sf "$f" "libs/lib$lib.so"; dirs="$dirs:$(dirname "$f")"; echo "lib$lib: $f"; fi
done
export LD_LIBRARY_PATH="$PWD/libs$dirs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
[ "$dry" = 1 ] || export RINGMASTER_REQUIRE_NVRTC=1
check 60 kernels ./ringmaster_cuda --nocapture --test-threads 1 || { echo "the kernel checks failed: no bench"; exit 1; }
if [ -f model.gguf ]; then
  # The real model: its checks against the CPU model, and the benches on it.
  export RINGMASTER_MODEL="$PWD/model.gguf"
  check 120 model ./ringmaster_gpu_runtime model::tests::gpu --nocapture --test-threads 1 || { echo "the model checks failed: no bench"; exit 1; }
elif [ -f shapes.gguf ]; then
  # SmolLM2's shapes with random weights for the timing; the synthetic model for correctness.
  export RINGMASTER_BENCH_SHAPES="$PWD/shapes.gguf"
  check 120 model ./ringmaster_gpu_runtime model::tests::gpu::gpu_forward_matches --nocapture || { echo "the model checks failed: no bench"; exit 1; }
else
  echo "no model.gguf and no shapes.gguf: only the synthetic-model GPU test runs"
  check 120 model ./ringmaster_gpu_runtime model::tests::gpu::gpu_forward_matches --nocapture
  exit $status
fi
check 90 step-v1 env RINGMASTER_GPU_PATH=v1 RINGMASTER_BENCH_OUT="$out" ./gpu_step
check 90 step-v2 env RINGMASTER_GPU_PATH=v2 RINGMASTER_BENCH_OUT="$out" ./gpu_step
check 90 step-v2-eager env RINGMASTER_GPU_PATH=v2 RINGMASTER_GPU_GRAPHS=0 RINGMASTER_BENCH_OUT="$out" ./gpu_step
check 120 streams-v1 env RINGMASTER_GPU_PATH=v1 RINGMASTER_BENCH_STREAMS=1,32 \
  RINGMASTER_BENCH_OUT="$out" "${bench_env[@]}" ./streams && mv "$out/streams.json" "$out/streams-v1.json"
check 120 streams-v2 env RINGMASTER_GPU_PATH=v2 RINGMASTER_BENCH_STREAMS=1,8,32,64 \
  RINGMASTER_BENCH_OUT="$out" "${bench_env[@]}" ./streams && mv "$out/streams.json" "$out/streams-v2.json"
echo "== the figures"
grep -h "^|" "$out"/step-v1.log "$out"/step-v2.log "$out"/step-v2-eager.log "$out"/streams-v1.log "$out"/streams-v2.log
echo "exit $status"

exit $status
RUN
chmod +x "$out/run.sh"
du -sh "$out"/*
