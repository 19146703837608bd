#!/usr/bin/env bash
# tests/deploy/image.sh's one skip, tested without podman: image.sh is run with a fake podman
# first on PATH that fails at one step each time, and must skip (exit 0, saying SKIPPED) only
# when the one-file probe image fails to build or to run, and fail when podman runs the probe
# but the real image fails: to build, or to start with "permission denied" (the case the
# script once took for a machine that cannot run containers, and passed).
#   tests/deploy/image-probe.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
# Each call is logged; $FAKE_PODMAN_FAILS names the step that fails, as podman fails there.
cat > "$work/bin/podman" <<'FAKE'
#!/usr/bin/env bash
echo "podman $*" >> "$FAKE_PODMAN_LOG"
probe=no
case " $* " in *-probe\ *) probe=yes ;; esac
fail() { echo "$1" >&2; exit "$2"; }
case $1 in
  build)
    [ "$probe" = yes ] && [ "$FAKE_PODMAN_FAILS" = probe-build ] \
      && fail 'Error: mounting new container: remount /, flags: 0x44000: invalid argument' 125
    [ "$probe" = no ] && [ "$FAKE_PODMAN_FAILS" = build ] \
      && fail 'Error: building at STEP "COPY rootfs/ /": copier: put: permission denied' 125
    exit 0 ;;
  --runtime)
    [ "$probe" = yes ] && [ "$FAKE_PODMAN_FAILS" = probe-run ] \
      && fail 'Error: OCI runtime error: runc: runc create failed: mount proc to rootfs/proc: permission denied' 126
    [ "$probe" = no ] && [ "$FAKE_PODMAN_FAILS" = run ] \
      && fail 'Error: runc: runc create failed: exec: "/usr/local/bin/ringmaster": permission denied: OCI permission denied' 126
    [ "$FAKE_PODMAN_FAILS" = none ] || exit 0
    # Past every failure: the real run has to be real, and this fake cannot serve.
    fail 'fake podman: no container runs here' 125 ;;
  *) exit 0 ;;
esac
FAKE
chmod +x "$work/bin/podman"
cp /bin/true "$work/ringmaster"

# case NAME: runs image.sh failing at step NAME; sets $rc, $out (both streams) and $calls.
case_run() {
  : > "$work/log"
  set +e
  out=$(PATH="$work/bin:$PATH" FAKE_PODMAN_FAILS=$1 FAKE_PODMAN_LOG="$work/log" \
    tests/deploy/image.sh "$work/ringmaster" 2>&1)
  rc=$?
  set -e
  calls=$(cat "$work/log")
}
failures=0
expect() {
  if ! eval "$2"; then
    echo "FAIL ($1): $3"
    echo "  exit $rc; output:"; sed 's/^/    /' <<<"$out"
    echo "  podman calls:"; sed 's/^/    /' <<<"$calls"
    failures=$((failures + 1))
  fi
}

for step in probe-build probe-run; do
  case_run "$step"
  expect "$step" '[ "$rc" = 0 ]' "a machine where the one-file probe fails to ${step#probe-} skips"
  expect "$step" 'grep -q "^SKIPPED: the container image is NOT BUILT or RUN" <<<"$out"' "and says so"
  expect "$step" '! grep -q "podman build --pull=never -t localhost" <<<"$calls"' \
    "and builds no real image"
done

case_run build
expect build '[ "$rc" != 0 ]' "past the probe, the real image failing to build fails"
expect build '! grep -q SKIPPED <<<"$out"' "without a skip"

case_run run
expect run '[ "$rc" != 0 ]' "past the probe, the real image's 'permission denied' fails"
expect run '! grep -q SKIPPED <<<"$out"' "without a skip"
expect run 'grep -q "does not start, on a machine where podman runs containers" <<<"$out"' \
  "and says the image is at fault"

if [ "$failures" -gt 0 ]; then
  exit 1
fi
echo "ok: image.sh skips only when the one-file probe fails to build or run, and fails when the real image does"
