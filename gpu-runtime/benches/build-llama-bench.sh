#!/usr/bin/env bash
# Builds llama.cpp's `llama-bench` from the source bundled in the PyPI sdist of
# llama-cpp-python (the only route to llama.cpp from this network), for the model benchmark's
# side-by-side comparison. Takes about 25 minutes on 2 cores; the result is cached.
#
# Usage: gpu-runtime/benches/build-llama-bench.sh [DIR]   (default: $RINGMASTER_CACHE_DIR/llama.cpp,
# else ~/.cache/ringmaster/llama.cpp). Prints the path of the built binary last.
set -euo pipefail
version=0.3.36
dir=${1:-${RINGMASTER_CACHE_DIR:-$HOME/.cache/ringmaster}/llama.cpp}
bin="$dir/build/bin/llama-bench"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
if ! command -v cmake >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq cmake g++ make
  else
    echo "cmake is missing: install cmake (apt-get install cmake) and run again" >&2
    exit 1
  fi
fi
mkdir -p "$dir"
cd "$dir"
sdist="llama_cpp_python-$version.tar.gz"
if [ ! -f "$sdist" ]; then
  # The sdist itself, found through PyPI's simple index (pip download would try to build
  # its metadata, which needs the whole Python build chain).
  python3 - "$sdist" <<'PY'
import json, sys, urllib.request
name = sys.argv[1]
req = urllib.request.Request("https://pypi.org/simple/llama-cpp-python/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req))["files"]
url = next(f["url"] for f in files if f["filename"] == name)
urllib.request.urlretrieve(url, name + ".part")
PY
  mv "$sdist.part" "$sdist"
fi
rm -rf src && mkdir src && tar -xzf "$sdist" -C src --strip-components=1
cmake -S src/vendor/llama.cpp -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_TOOLS=ON >/dev/null
cmake --build build --target llama-bench -j "${JOBS:-2}"
echo "$bin"
