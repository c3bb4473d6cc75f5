#!/usr/bin/env bash
# The init verdict travels down a binomial tree (docs/design/base.md, "Hot keys"; verdict_tree.h):
# a rank whose parent (its rank with the lowest set bit cleared) is not rank 0 gets the verdict
# from that parent, checked against the digest rank 0 put in the store, instead of from rank 0's
# store. Checks that 64 ranks take it so and then all-reduce correctly; that a parent that never
# answers (COMM_TEST_INIT_TREE=stall:R), answers wrongly (corrupt:R) or is gone (exit:R) sends
# its children to the store with one INFO line naming it, and the job still starts (or, for a
# dead rank it needs, fails naming it).
# Before the tree, part 1 failed (no rank said it had the verdict from its parent).
# Usage: test_init_tree.sh PATH/TO/comm-run PATH/TO/init-scale
set -uo pipefail
RUN=${1:?usage: test_init_tree.sh PATH/TO/comm-run PATH/TO/init-scale}
DRIVER=${2:?usage: test_init_tree.sh PATH/TO/comm-run PATH/TO/init-scale}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }
export COMM_DEBUG=INFO COMM_DEBUG_SUBSYS=INIT COMM_TIMEOUT_MS=8000  # a parent's slice: 1 s
from_parent='init verdict from parent rank'
fallback() { echo "rank $1: the init verdict from parent rank $2 failed"; }

# 1. 64 ranks: the 57 whose parent is not rank 0 take the verdict from it; the all-reduces check.
N=64
COMM_TIMEOUT_MS=60000 "$RUN" -n "$N" --bind none --timeout-s 150 -- "$DRIVER" 1 >"$TMP/tree.txt" 2>&1
rc=$?
reported=$(grep -c 'INIT_SCALE ' "$TMP/tree.txt")
took=$(grep -c "$from_parent" "$TMP/tree.txt")
fell=$(grep -c 'reading it from the store' "$TMP/tree.txt")
if [[ $rc == 0 && $reported == "$N" && $took == 57 ]]; then
  pass "$N ranks: 57 took the verdict from their parent ($fell fell back to the store), all-reduces checked"
else
  fail "$N ranks: rc $rc, $reported of $N ranks reported, $took of 57 took the verdict from their parent"
  grep -v 'INIT_SCALE' "$TMP/tree.txt" | tail -5
fi

# 2. Rank 4 never answers: its children 5 and 6 read the store after their slice; the job runs.
COMM_TEST_INIT_TREE=stall:4 "$RUN" -n 8 --bind none --timeout-s 60 -- "$DRIVER" 1 >"$TMP/stall.txt" 2>&1
rc=$?
reported=$(grep -c 'INIT_SCALE ' "$TMP/stall.txt")
if [[ $rc == 0 && $reported == 8 ]] && grep -q "$(fallback 5 4)" "$TMP/stall.txt" &&
    grep -q "$(fallback 6 4)" "$TMP/stall.txt"; then
  pass "a stalled parent: its children read the store, naming it, and the job ran"
else
  fail "a stalled parent: rc $rc, $reported of 8 ranks reported; fallbacks: $(grep -c 'reading it from the store' "$TMP/stall.txt")"
  grep -v 'INIT_SCALE' "$TMP/stall.txt" | tail -5
fi

# 3. Rank 2 answers with one byte flipped: rank 3 finds the digest wrong and reads the store.
COMM_TEST_INIT_TREE=corrupt:2 "$RUN" -n 8 --bind none --timeout-s 60 -- "$DRIVER" 1 >"$TMP/corrupt.txt" 2>&1
rc=$?
reported=$(grep -c 'INIT_SCALE ' "$TMP/corrupt.txt")
if [[ $rc == 0 && $reported == 8 ]] && grep "$(fallback 3 2)" "$TMP/corrupt.txt" | grep -q 'does not match the digest'; then
  pass "a wrong answer: the child found the digest wrong, read the store, and the job ran"
else
  fail "a wrong answer: rc $rc, $reported of 8 ranks reported; rank 3's line: $(grep "$(fallback 3 2)" "$TMP/corrupt.txt")"
  grep -v 'INIT_SCALE' "$TMP/corrupt.txt" | tail -5
fi

# 4. Rank 2 exits after joining (status 0: comm-run leaves the others running): rank 3 reads the
# store, naming it; init fails naming rank 2 (over sockets, whose refused dial names the peer;
# shared memory's setup gate times out without a name, as it does without the tree).
COMM_TRANSPORT=socket COMM_TEST_INIT_TREE=exit:2 "$RUN" -n 8 --bind none --timeout-s 60 -- "$DRIVER" 1 \
  >"$TMP/exit.txt" 2>&1
rc=$?
if [[ $rc != 0 ]] && grep -q "$(fallback 3 2)" "$TMP/exit.txt" &&
    grep -q 'comm_init: .*rank 2 refused the connection' "$TMP/exit.txt"; then
  pass "a dead parent: its child read the store, naming it, and init failed naming rank 2 (rc $rc)"
else
  fail "a dead parent: rc $rc; rank 3's line: $(grep "$(fallback 3 2)" "$TMP/exit.txt")"
  grep -v 'INIT_SCALE' "$TMP/exit.txt" | tail -8
fi
exit $((failures > 0))
