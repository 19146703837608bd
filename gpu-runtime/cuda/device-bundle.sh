#!/usr/bin/env bash
# Prepares the GPU checks for a GPU machine without a Rust toolchain or a network (the device
# machines lent to sessions): builds the CUDA test binaries here, in release, stripped, into
# .gpu-bundle/ (git-ignored), with run.sh to run them there (each check under its own timeout,
# every log and figure under $OUT; the streams bench on both steps, the first selected by
# RINGMASTER_GPU_PATH=v1, so the baseline is re-measured on the same card). Carry `.gpu-bundle` and run
# `.gpu-bundle/run.sh`. The SmolLM2 tests and the 32-stream bench need the model: put it at
# .gpu-bundle/model.gguf (98 MB, over one call's 64 MiB carry: split it across two calls into
# ignored folders, which stay while the machine is warm, and join them there); without it the
# synthetic-model GPU test still compares the GPU forward pass with the CPU one. What worked on
# an H200 (2026-12-04): `tar czf` the bundle (6 MB) into one carried folder with the model's
# first 50 MB (`split -b 50000000`), the rest in a second; the first call unpacks both into
# /tmp and runs the kernel checks, the second (sent at once: a machine stays warm 30 s) joins
# the model and runs the rest: 1.5 minutes of device time in all.
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
               binaries bench -p ringmaster-gpu-runtime --features cuda --bench streams) | sort -u); do
  name=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
  cp "$exe" "$out/$name"
  strip "$out/$name"
done
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
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
status=0
check() {
  local seconds=$1 name=$2
  shift 2
  echo "== $name: $* (at most ${seconds}s)"
  timeout "$seconds" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  tail -n 40 "$out/$name.log"
  if [ "$rc" -ne 0 ]; then echo "$name FAILED (exit $rc)"; status=1; fi
  if grep -q "skipping" "$out/$name.log"; then echo "$name skipped a check"; status=1; fi
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
export RINGMASTER_REQUIRE_NVRTC=1
check 60 kernels ./ringmaster_cuda --nocapture --test-threads 1 || { echo "the kernel checks failed: no bench"; exit 1; }
if [ -f model.gguf ]; then
  export RINGMASTER_MODEL="$PWD/model.gguf"
  check 120 model ./ringmaster_gpu_runtime model::tests::gpu --nocapture --test-threads 1 || { echo "the model checks failed: no bench"; exit 1; }
  check 150 streams-v1 env RINGMASTER_GPU_PATH=v1 RINGMASTER_BENCH_STREAMS=1,32 \
    RINGMASTER_BENCH_OUT="$out" ./streams && mv "$out/streams.json" "$out/streams-v1.json"
  check 150 streams-v2 env RINGMASTER_GPU_PATH=v2 RINGMASTER_BENCH_STREAMS=1,8,32,64 \
    RINGMASTER_BENCH_OUT="$out" ./streams && mv "$out/streams.json" "$out/streams-v2.json"
  echo "== the figures"
  grep -h "^|" "$out/streams-v1.log" "$out/streams-v2.log"
else
  echo "no model.gguf: only the synthetic-model GPU test runs"
  check 120 model ./ringmaster_gpu_runtime model::tests::gpu::gpu_forward_matches --nocapture
fi
exit $status
RUN
chmod +x "$out/run.sh"
du -sh "$out"/*
