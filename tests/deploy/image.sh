#!/usr/bin/env bash
# The container image, built and run once: examples/container/build.sh from BINARY (FROM
# scratch, nothing pulled), then the image's gateway started by podman with a read-only root
# file system as its non-root user, on the host's loopback, with its embedded default
# configuration (simulated servers); it must answer /healthz and a Messages request, and
# hold no shell.
#   tests/deploy/image.sh BINARY
set -euo pipefail
cd "$(dirname "$0")/../.."
binary=$1
tag=localhost/ringmaster-test:$$
name=ringmaster-image-test-$$
# The only skip: a one-file probe. Whether podman can build and run an image here at all is
# asked of an image of one file, a static executable (ldconfig: static on every glibc system,
# and `--version` needs nothing beside it), built FROM scratch and run with the real run's
# options. A chroot cannot build one (unpacking a layer remounts a root it does not own:
# "remount /, flags: 0x44000: invalid argument", as in a cold tests/fresh-root.sh run), a
# sandbox without the runtime's privileges cannot run one; such a machine says so loudly and
# skips. Past the probe, podman works here, so anything failing with the real image (its
# build, its start, a "permission denied" from its binary) is the image's fault, and fails.
# runc: crun refuses the hybrid cgroup layout some machines (this CI's among them) have; the
# limits are set because podman's own (raised to the maximum) are refused in some sandboxes.
run_options=(--runtime runc)
container_options=(--read-only --network host --ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
skip() {
  local banner="########################################################################"
  local message
  message=$(printf '%s\nSKIPPED: the container image is NOT BUILT or RUN on this machine: %s\n%s' \
    "$banner" "$1" "$banner")
  # On both streams: a log that keeps only one of them still shows it.
  echo "$message"
  echo "$message" >&2
  exit 0
}
probe_executable=
for candidate in "$(command -v ldconfig 2>/dev/null || true)" /sbin/ldconfig /usr/sbin/ldconfig; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] \
      && LC_ALL=C ldd "$candidate" 2>&1 | grep -qE 'statically linked|not a dynamic executable'; then
    probe_executable=$candidate
    break
  fi
done
if [ -z "$probe_executable" ]; then
  echo "no static ldconfig here to probe podman with: the image test cannot tell a machine that cannot run containers from a broken image" >&2
  exit 1
fi
probe_dir=$(mktemp -d)
cp "$probe_executable" "$probe_dir/probe"
printf 'FROM scratch\nCOPY probe /probe\nENTRYPOINT ["/probe"]\n' > "$probe_dir/Containerfile"
if ! probe=$(podman build --pull=never -q -t "$tag-probe" -f "$probe_dir/Containerfile" "$probe_dir" 2>&1); then
  rm -rf "$probe_dir"
  skip "podman cannot build even a one-file image ($(tail -n 1 <<<"$probe"))"
fi
rm -rf "$probe_dir"
if ! probe=$(podman "${run_options[@]}" run --rm "${container_options[@]}" --user 65532:65532 \
    "$tag-probe" --version 2>&1); then
  podman rmi -f "$tag-probe" >/dev/null 2>&1 || true
  skip "podman built a one-file image but cannot run it ($(tail -n 1 <<<"$probe"))"
fi
podman rmi -f "$tag-probe" >/dev/null 2>&1 || true
examples/container/build.sh --binary "$binary" --tag "$tag"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cleanup() {
  podman rm -f "$name" >/dev/null 2>&1 || true
  podman rmi -f "$tag" >/dev/null 2>&1 || true
}
trap cleanup EXIT
if ! started=$(podman "${run_options[@]}" run --rm "${container_options[@]}" "$tag" --version 2>&1); then
  echo "the image's binary does not start, on a machine where podman runs containers: $started" >&2
  exit 1
fi
podman "${run_options[@]}" run -d --name "$name" "${container_options[@]}" --tmpfs /var/cache/ringmaster:rw,U \
  "$tag" serve --listen "127.0.0.1:$port" >/dev/null
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null || { podman logs "$name"; exit 1; }
answer=$(curl -fsS "http://127.0.0.1:$port/v1/messages" -H 'content-type: application/json' \
  -d '{"model":"sim-llama-3-8b","max_tokens":4,"messages":[{"role":"user","content":"Hello from a container"}]}')
echo "$answer" | python3 -c 'import json,sys; assert json.load(sys.stdin)["type"] == "message"'
user=$(podman inspect "$name" --format '{{.Config.User}}')
[ "$user" = "65532:65532" ] || { echo "the image runs as $user, not 65532:65532" >&2; exit 1; }
if podman exec "$name" /bin/sh -c true >/dev/null 2>&1; then
  echo "the image has a shell" >&2; exit 1
fi
size=$(podman image inspect "$tag" --format '{{.Size}}')
echo "ok: the image ($((size / 1024 / 1024)) MiB, user 65532, read-only root, no shell) served a request"
