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
# Whether podman can build an image here at all: a one-file image FROM scratch. A chroot
# cannot (unpacking a layer remounts a root it does not own: "remount /, flags: 0x44000:
# invalid argument", as in a cold tests/fresh-root.sh run); such a machine says so and skips
# the image. Past the probe, the real image failing to build is a failure.
probe_dir=$(mktemp -d)
echo probe > "$probe_dir/probe"
printf 'FROM scratch\nCOPY probe /probe\n' > "$probe_dir/Containerfile"
if ! probe=$(podman build --pull=never -q -t "$tag-probe" -f "$probe_dir/Containerfile" "$probe_dir" 2>&1); then
  rm -rf "$probe_dir"
  echo "NOTE: the image is NOT BUILT or RUN here: podman cannot build images on this machine ($(tail -n 1 <<<"$probe"))"
  exit 0
fi
rm -rf "$probe_dir"
podman rmi -f "$tag-probe" >/dev/null 2>&1 || true
examples/container/build.sh --binary "$binary" --tag "$tag"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cleanup() {
  podman rm -f "$name" >/dev/null 2>&1 || true
  podman rmi -f "$tag" >/dev/null 2>&1 || true
}
trap cleanup EXIT
run_options=(--runtime runc)
# A machine that cannot run containers at all (a chroot, a sandbox without the privileges the
# runtime needs) says so and skips the run; the image itself failing is a failure.
if ! probe=$(podman "${run_options[@]}" run --rm --read-only --network host --ulimit nofile=4096:4096 \
    --ulimit nproc=4096:4096 "$tag" --version 2>&1); then
  if grep -qiE "OCI|cgroup|namespace|permission denied" <<<"$probe"; then
    echo "NOTE: the image was built, but its gateway is NOT RUN here: podman cannot run containers on this machine ($probe)"
    exit 0
  fi
  echo "the image's binary does not start: $probe" >&2
  exit 1
fi
# runc: crun refuses the hybrid cgroup layout some machines (this CI's among them) have; the
# limits are set because podman's own (raised to the maximum) are refused in some sandboxes.
podman "${run_options[@]}" run -d --name "$name" --read-only --network host --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 --tmpfs /var/cache/ringmaster:rw,U \
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
