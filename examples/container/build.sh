#!/usr/bin/env bash
# Builds the gateway's container image without pulling a base image: stages a root file
# system (the ringmaster binary with its debug sections stripped, the shared libraries `ldd`
# says it links, a passwd entry for the non-root user 65532, Debian's CA bundle, the
# directories it reads and writes) and builds Containerfile FROM scratch with podman (or
# buildah).
#
#   examples/container/build.sh [--binary PATH] [--tag ringmaster:latest] [--stage-only DIR]
#
# --binary defaults to the release build (cargo build --release -p ringmaster); --stage-only
# writes the root file system and the Containerfile to DIR and builds nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
binary=${CARGO_TARGET_DIR:-$root/target}/release/ringmaster
tag=ringmaster:latest
stage_only=
while [ $# -gt 0 ]; do
  case $1 in
    --binary) binary=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --stage-only) stage_only=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$binary" ] || { echo "$binary is missing: cargo build --release -p ringmaster (or pass --binary)" >&2; exit 1; }

stage=${stage_only:-$(mktemp -d)}
[ -n "$stage_only" ] || trap 'rm -rf "$stage"' EXIT
rootfs=$stage/rootfs
rm -rf "$rootfs"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ringmaster/config" "$rootfs/etc/ssl/certs" \
  "$rootfs/var/cache/ringmaster" "$rootfs/tmp"
# Debug sections are most of a build's size; the symbols stay for backtraces.
objcopy --strip-debug "$binary" "$rootfs/usr/local/bin/ringmaster"
# The shared libraries it links, at the paths the loader looks for them.
ldd "$binary" | awk '/=> \// { print $3 } /^[ \t]*\/.*ld-linux/ { print $1 }' | sort -u |
  while read -r lib; do
    mkdir -p "$rootfs$(dirname "$lib")"
    cp -L "$lib" "$rootfs$lib"
  done
printf 'root:x:0:0:root:/root:/sbin/nologin\nringmaster:x:65532:65532:ringmaster:/var/cache/ringmaster:/sbin/nologin\n' \
  > "$rootfs/etc/passwd"
printf 'root:x:0:\nringmaster:x:65532:\n' > "$rootfs/etc/group"
# For https:// servers and providers verified against the system's roots.
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
fi
chmod 1777 "$rootfs/tmp"
# The cache is the user's (a volume mounted there replaces it).
chown -R 65532:65532 "$rootfs/var/cache/ringmaster" 2>/dev/null || true
cp "$here/Containerfile" "$stage/Containerfile"
if [ -n "$stage_only" ]; then
  echo "staged in $stage ($(du -sh "$rootfs" | cut -f1))"
  exit 0
fi
if command -v podman >/dev/null 2>&1; then
  podman build --pull=never -t "$tag" -f "$stage/Containerfile" "$stage"
elif command -v buildah >/dev/null 2>&1; then
  buildah bud --pull-never -t "$tag" -f "$stage/Containerfile" "$stage"
else
  echo "neither podman nor buildah is installed (Debian: apt-get install podman)" >&2
  exit 1
fi
echo "built $tag ($(du -sh "$rootfs" | cut -f1) staged)"
