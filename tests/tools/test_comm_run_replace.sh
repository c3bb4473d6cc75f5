#!/usr/bin/env bash
# comm-run --replace-failed (issue 35): a job of 4 ranks (tests/abi/grow_worker.c, "train") where
# one rank is lost once: SIGKILLed (rank 0, whose process would have served the store without
# comm-run serving it), then SIGSTOPped (rank 2: comm-run SIGKILLs it once the others exclude it).
# The survivors agree and shrink; comm-run starts a replacement with COMM_JOIN=1, which joins at
# the next comm_grow; the job finishes its steps on 4 ranks and comm-run exits 0. Then a lost rank
# whose replacement is lost too: replaced twice; one whose replacement dies before it joins:
# started again. Without the
# flag a lost rank still ends the job. Usage: test_comm_run_replace.sh comm-run grow_worker
set -uo pipefail

RUN=${1:?usage: test_comm_run_replace.sh PATH/TO/comm-run PATH/TO/grow_worker}
WORKER=${2:?usage: test_comm_run_replace.sh PATH/TO/comm-run PATH/TO/grow_worker}
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

# One job: its output and comm-run's status. A busy 2-core host: generous outer limits only.
run_job() {  # name, then env assignments
  local name=$1
  shift
  out=$(env COMM_TIMEOUT_MS=4000 GROW_STEPS=12 "$@" timeout 170 "$RUN" -n 4 --bind none --replace-failed \
        --timeout-s 150 -- "$WORKER" train 2>&1)
  status=$?
  if [[ $status -eq 0 ]]; then pass "$name: comm-run exits 0"; else fail "$name: comm-run exited $status"; fi
  # Every rank ends at the same step (12, or later when the survivors went on while the joiner
  # started), with 4 ranks.
  local finals steps
  finals=$(grep -cE '^\[[0-3]\] FINAL [0-9]+ [0-3] 4$' <<<"$out")
  steps=$(grep -E '^\[[0-3]\] FINAL ' <<<"$out" | awk '{print $3}' | sort -u)
  if [[ $finals -eq 4 && $(wc -l <<<"$steps") -eq 1 && $steps -ge ${GROW_STEPS_MIN:-12} ]]; then
    pass "$name: 4 ranks finish the steps together on 4 ranks"; else
    fail "$name: $finals of 4 ranks finished on 4 ranks (steps: $steps)"; fi
  if grep -q "starting its replacement #1 with COMM_JOIN=1" <<<"$out"; then pass "$name: a replacement joined"; else
    fail "$name: no replacement started"; fi
  if [[ $failures -gt 0 ]]; then echo "--- output of $name:"; echo "$out"; fi
}

run_job "rank 0 SIGKILLed" GROW_VICTIM=0
if grep -q "rank 0 killed by signal 9 (Killed); the others go on" <<<"$out"; then pass "the others went on"; else
  fail "comm-run did not leave the others running"; fi

run_job "rank 2 SIGSTOPped" GROW_VICTIM=2 GROW_STOP=1
if grep -q "rank 2 was excluded by the others but still runs (stopped?): SIGKILL" <<<"$out"; then
  pass "the stopped rank was SIGKILLed before its replacement started"; else fail "the stopped rank was not killed"; fi

# The replacement is lost too (a second failure, in the grown communicator): replaced again. The
# exclusion records carry the slot's generation, so the first loss never kills the second process.
mark=$(mktemp -u /tmp/grow-again-XXXXXX)
run_job "rank 3 SIGKILLed, then its replacement" GROW_VICTIM=3 GROW_AGAIN="$mark" GROW_STEPS=24
rm -f "$mark"
if grep -q "starting its replacement #2 with COMM_JOIN=1" <<<"$out" && \
   ! grep -q "starting its replacement #3" <<<"$out"; then pass "the lost replacement was replaced once"; else
  fail "not exactly two replacements"; fi

# The replacement dies before it asks to join: never a member, so no exclusion names it; comm-run
# starts it again (else the slot stays empty and the job never has 4 ranks again).
mark=$(mktemp -u /tmp/grow-early-XXXXXX)
run_job "rank 1 SIGKILLed, its replacement dies before joining" GROW_VICTIM=1 GROW_EARLY="$mark"
rm -f "$mark"
if grep -q "rank 1: its replacement #1 killed by signal 9 (Killed) before the others admitted it: starting it again" \
   <<<"$out"; then pass "the unadmitted replacement was started again"; else fail "the unadmitted replacement was not restarted"; fi

# The replacement dies once a comm_grow answered it: counted into the slot, so comm-run cannot
# tell it from a member, and the members' comm_grow fails (shared memory waits for it); they record
# it excluded, and comm-run replaces it (else the slot stays empty: no agreement ever names it).
# The members give the set-up up when its liveness counter stops (libcomm/src/setup_watch.h), not
# at their timeout (15 s here): a member says so in a warning.
mark=$(mktemp -u /tmp/grow-hello-XXXXXX)
run_job "rank 2 SIGKILLed, its replacement dies once answered" GROW_VICTIM=2 GROW_HELLO_EXIT="$mark" \
  COMM_TIMEOUT_MS=15000
rm -f "$mark"
if grep -q "starting its replacement #2 with COMM_JOIN=1" <<<"$out"; then
  pass "the replacement that died in its join was replaced"; else fail "the replacement that died in its join was not replaced"; fi
failed_grows=$(grep -E '^\[[0-3]\] GROW_FAILED ' <<<"$out" || true)
if [[ -n $failed_grows ]] && grep -q "set-up given up: .* a joiner, gave no sign of life" <<<"$out"; then
  pass "the dead joiner's silence ended the members' set-up"; else
  fail "the dead joiner's set-up did not end on its silence: [$failed_grows]"; echo "$out" | tail -30; fi

# The replacement dies once registered, before any grow answered it: the lowest member admits only
# a joiner whose liveness counter it saw move (libcomm/src/grow.cc), so the dead one is never
# admitted (its ticket is withdrawn) and comm-run starts it again. Admitted, it failed the grow and
# an exclusion of its slot's generation was recorded, which comm-run took for the replacement it
# had started meanwhile.
mark=$(mktemp -u /tmp/grow-registered-XXXXXX)
run_job "rank 3 SIGKILLed, its replacement dies once registered" GROW_VICTIM=3 GROW_REGISTERED_EXIT="$mark"
rm -f "$mark"
if grep -q "rank 3: its replacement #1 exited with status 9 before the others admitted it: starting it again" \
   <<<"$out" && ! grep -q "set-up given up" <<<"$out"; then
  pass "the replacement that died waiting was never admitted, and started again"; else
  fail "the replacement that died waiting was admitted, or not started again"; echo "$out" | tail -30; fi

# Without --replace-failed: unchanged, a lost rank ends the job.
out=$(env COMM_TIMEOUT_MS=4000 GROW_STEPS=12 GROW_VICTIM=1 timeout 120 "$RUN" -n 4 --bind none --timeout-s 100 -- \
      "$WORKER" train 2>&1)
status=$?
if [[ $status -ne 0 ]] && grep -q "comm-run: job failed: rank 1 killed by signal 9" <<<"$out"; then
  pass "without --replace-failed a lost rank ends the job"; else fail "without the flag: status $status"; echo "$out"; fi

[[ $failures -eq 0 ]] && echo "all passed" || { echo "$failures failed"; exit 1; }
