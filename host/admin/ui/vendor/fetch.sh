#!/usr/bin/env bash
# Refreshes the status page's chart library from npm (uPlot, MIT; LICENSE-uPlot beside it).
# The files are committed so that building the gateway needs no npm; this script says where
# they came from and checks they are what was reviewed. Change VERSION and the sums together.
set -euo pipefail
cd "$(dirname "$0")"
VERSION=1.6.32
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "uplot@$VERSION" >/dev/null && tar xzf "uplot-$VERSION.tgz")
cp "$work/package/dist/uPlot.iife.min.js" "$work/package/dist/uPlot.min.css" .
cp "$work/package/LICENSE" LICENSE-uPlot
sha256sum --check <<'SUMS'
19c8d4c6ad88929a79f4ae49d6f7161566dfd0ba3d15cc495e974f787eb78f1f  uPlot.iife.min.js
df630c6a8d6f8eeaff264b50f73ce5b114f646ffd9a0bb74f049b0a00135fa04  uPlot.min.css
SUMS
