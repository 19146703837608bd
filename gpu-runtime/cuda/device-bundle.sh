#!/usr/bin/env bash
# Prepares the GPU checks for a GPU machine without a Rust toolchain or a network (the device
# machines lent to sessions): builds the CUDA test binaries here, in release, stripped, into
# .gpu-bundle/ (git-ignored), with run.sh to run them there. Carry `.gpu-bundle` and run
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
               binaries bench -p ringmaster-gpu-runtime --features cuda --bench gpu_streams) | sort -u); do
  name=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
  cp "$exe" "$out/$name"
  strip "$out/$name"
done
cat >"$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# On the GPU machine, from the repository root: every GPU check, failing on any skip.
set -uo pipefail
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
status=0
check() {
  echo "== $*"
  log=$(mktemp)
  "$@" 2>&1 | tee "$log"
  if [ "${PIPESTATUS[0]}" -ne 0 ]; then status=1; fi
  if grep -q "skipping" "$log"; then echo "(a check skipped)"; status=1; fi
}
# cudarc (built for CUDA 12.8) looks for libnvrtc.so and libcublas.so by name; the H200
# machines have CUDA 13's under PyTorch's venv only as libnvrtc.so.13 and so on (the API calls
# used are the same in 13), so link the first found of each under the plain name.
mkdir -p libs
for lib in nvrtc nvrtc-builtins cublas cublasLt; do
  f=$(find /usr/local/cuda* /opt /usr/lib -name "lib$lib.so*" 2>/dev/null | grep -v stub | sort | head -1)
  if [ -n "$f" ]; then ln -sf "$f" "libs/lib$lib.so"; echo "lib$lib: $f"; fi
done
export LD_LIBRARY_PATH="$PWD/libs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export RINGMASTER_REQUIRE_NVRTC=1
check ./ringmaster_cuda --nocapture --test-threads 1
if [ -f model.gguf ]; then
  export RINGMASTER_MODEL="$PWD/model.gguf"
  check ./ringmaster_gpu_runtime model::tests::gpu --nocapture --test-threads 1
  check ./gpu_streams
else
  echo "no model.gguf: only the synthetic-model GPU test runs"
  check ./ringmaster_gpu_runtime model::tests::gpu::gpu_forward_matches --nocapture
fi
exit $status
RUN
chmod +x "$out/run.sh"
du -sh "$out"/*
