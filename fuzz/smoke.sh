#!/bin/sh
# meson test fuzz-smoke: SECONDS, then pairs of (fuzz target built with driver.cc, its corpus).
# Each replays its corpus and SECONDS of mutations of it; any crash or failed check fails.
set -eu
seconds=$1
shift
while [ $# -ge 2 ]; do
  "$1" --seconds "$seconds" "$2"
  shift 2
done
