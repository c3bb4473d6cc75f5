#!/usr/bin/env bash
# The meson suite on a busy host, ROUNDS times in a row (default 3): two busy loops (one per core
# here) and a second job that keeps spawning processes (4 local ranks of comm-bench, again and
# again) run beside it the whole time, as on a CI machine shared with another job. Stops at the
# first round that fails. Tests must hold there: none asserts a wall-clock order or time the
# scheduler decides (docs/design/tools.md, "Testing tiers"). Run after ./scripts/test.sh has built build/.
#
#   ./scripts/test_loaded.sh            # 3 rounds, BUSY=2
#   ROUNDS=1 BUSY=4 ./scripts/test_loaded.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
ROUNDS=${ROUNDS:-3}
[[ -x $BUILD_DIR/tools/comm-run/comm-run ]] || { echo "test_loaded.sh: build $BUILD_DIR first (./scripts/test.sh)" >&2; exit 2; }
ninja -C "$BUILD_DIR" >/dev/null  # the suite must not rebuild under the load
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
for ((i = 0; i < ${BUSY:-2}; i++)); do
  (while :; do :; done) &
  pids+=($!)
done
(while :; do
  timeout 120 "$BUILD_DIR/tools/comm-run/comm-run" -n 4 --bind none --quiet-prefix -- \
    "$BUILD_DIR/bench/comm-bench" -b 8 -e 1M -f 4 -n 5 -w 1 -c 1 >/dev/null 2>&1 || true
done) &
pids+=($!)
echo "load: ${BUSY:-2} busy loops and a comm-run/comm-bench spawner; $(nproc) cores; $(uptime)"
for ((round = 1; round <= ROUNDS; round++)); do
  start=$(date +%s)
  if meson test -C "$BUILD_DIR" --no-rebuild --print-errorlogs >"$BUILD_DIR/loaded-round-$round.log" 2>&1; then
    echo "round $round of $ROUNDS: passed in $(($(date +%s) - start)) s ($(grep -aE '^(Ok|Fail|Timeout):' "$BUILD_DIR/loaded-round-$round.log" | tr -s ' \n' ' '))"
  else
    echo "round $round of $ROUNDS: FAILED after $(($(date +%s) - start)) s; $BUILD_DIR/loaded-round-$round.log:"
    grep -aE '^ *[0-9]+/[0-9]+ .*(FAIL|TIMEOUT)' "$BUILD_DIR/loaded-round-$round.log" | head -20
    exit 1
  fi
done
