#!/usr/bin/env bash
# The socket address table travels in the init verdict (docs/design/base.md, "Hot keys"): each rank
# listens before the init check and sends its address with its fingerprint, so it makes one
# contribution and one read of rank 0's store at init instead of two. Checks that the world's
# socket transport adopts that table on every rank; and that when one rank's guess of "every
# rank on this host" (LOCAL_WORLD_SIZE == WORLD_SIZE) is wrong, every rank alike falls back to
# listening again and gathering addresses through the store, and the job still runs.
# Before the table was in the verdict, the first part failed (no rank said so).
# Usage: test_init_table.sh PATH/TO/comm-run PATH/TO/init-scale
set -uo pipefail
RUN=${1:?usage: test_init_table.sh PATH/TO/comm-run PATH/TO/init-scale}
DRIVER=${2:?usage: test_init_table.sh PATH/TO/comm-run PATH/TO/init-scale}
N=8
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }
export COMM_TRANSPORT=socket COMM_DEBUG=INFO COMM_DEBUG_SUBSYS=NET COMM_TIMEOUT_MS=60000
adopted='socket transport listening on .* (address table from the init verdict)'

# 1. Every rank adopts the table from the verdict.
"$RUN" -n "$N" --bind none --timeout-s 100 -- "$DRIVER" 1 >"$TMP/table.txt" 2>&1
rc=$?
reported=$(grep -c 'INIT_SCALE ' "$TMP/table.txt")
took=$(grep -c "$adopted" "$TMP/table.txt")
if [[ $rc == 0 && $reported == "$N" && $took == "$N" ]]; then
  pass "$N ranks: every rank's socket transport took its address table from the init verdict"
else
  fail "$N ranks: rc $rc, $reported of $N ranks reported, $took of $N took the table from the verdict"
  grep -v 'INIT_SCALE' "$TMP/table.txt" | tail -5
fi

# 2. Rank 5 guesses wrong (its launcher says it is alone on its host): nobody uses the table.
"$RUN" -n "$N" --bind none --timeout-s 100 -- \
  sh -c "if [ \"\$RANK\" = 5 ]; then export LOCAL_WORLD_SIZE=1; fi && exec \"$DRIVER\" 1" >"$TMP/mixed.txt" 2>&1
rc=$?
reported=$(grep -c 'INIT_SCALE ' "$TMP/mixed.txt")
took=$(grep -c "$adopted" "$TMP/mixed.txt")
if [[ $rc == 0 && $reported == "$N" && $took == 0 ]]; then
  pass "one rank's wrong guess: every rank gathered addresses through the store, and the job ran"
else
  fail "one rank's wrong guess: rc $rc, $reported of $N ranks reported, $took took the table from the verdict (expected 0)"
  grep -v 'INIT_SCALE' "$TMP/mixed.txt" | tail -5
fi
exit $((failures > 0))
