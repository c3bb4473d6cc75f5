#!/usr/bin/env bash
# comm-run's contract, with shell commands as ranks: environment, prefixes, pinning, failure
# handling, signal forwarding, timeouts. Usage: test_comm_run.sh PATH/TO/comm-run
# Single quotes on purpose (the ranks expand $RANK); pass never fails, so A && pass || fail is safe.
# shellcheck disable=SC2016,SC2015
set -uo pipefail
# Job control: background jobs get their own process group and keep SIGINT (without it, bash
# starts them with SIGINT ignored and the Ctrl-C test could not deliver one).
set -m

RUN=${1:?usage: test_comm_run.sh PATH/TO/comm-run}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }
expect_eq() {  # name expected actual
  if [[ "$2" == "$3" ]]; then pass "$1"; else fail "$1: expected [$2], got [$3]"; fi
}
expect_match() {  # name regex text
  if [[ "$3" =~ $2 ]]; then pass "$1"; else fail "$1: [$3] does not match /$2/"; fi
}

# --- environment and prefixes ---
out=$("$RUN" -n 3 -- sh -c 'echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR' | sort)
expect_eq "torchrun environment, one prefixed line per rank" \
  "$(printf '[0] 0 3 0 3 127.0.0.1\n[1] 1 3 1 3 127.0.0.1\n[2] 2 3 2 3 127.0.0.1')" "$out"

ports=$("$RUN" -n 3 -- sh -c 'echo $MASTER_PORT $TORCHELASTIC_RUN_ID' | sed 's/^\[[0-9]*\] //' | sort -u)
expect_match "one free port and one run id shared by all ranks" '^[0-9]+ comm-run-[0-9-]+$' "$ports"

out=$(MASTER_PORT=41234 "$RUN" -n 2 -- sh -c 'echo $MASTER_PORT' | sort -u)
expect_eq "a MASTER_PORT already set is kept" "$(printf '[0] 41234\n[1] 41234')" "$out"

out=$("$RUN" -n 1 -- sh -c 'echo $RANK')
expect_eq "one rank: no prefix" "0" "$out"

out=$("$RUN" -n 2 --no-prefix -- sh -c 'echo r$RANK' | sort)
expect_eq "--no-prefix" "$(printf 'r0\nr1')" "$out"

out=$("$RUN" -n 2 --quiet-prefix -- sh -c 'echo r$RANK' | sort)
expect_eq "--quiet-prefix: rank 0 bare, others prefixed" "$(printf '[1] r1\nr0')" "$out"

out=$("$RUN" -n 2 -- sh -c 'echo err$RANK >&2' 2>&1 >/dev/null | sort)
expect_eq "stderr is prefixed and stays on stderr" "$(printf '[0] err0\n[1] err1')" "$out"

out=$("$RUN" -n 2 -- sh -c 'printf "a\nb"; sleep 0.2; printf c' | sort)
expect_eq "lines are reassembled; a last partial line is flushed" \
  "$(printf '[0] a\n[0] bc\n[1] a\n[1] bc')" "$out"

out=$("$RUN" -n 2 -- sh -c 'printf "one\n"; sh -c "sleep 5" >/dev/null 2>&1 & exit 0')
expect_eq "exits without waiting for a leftover process" "$(printf '[0] one\n[1] one')" "$(sort <<<"$out")"

# --- pinning ---
parent=$(grep Cpus_allowed_list /proc/self/status | awk '{print $2}')
out=$("$RUN" -n 2 --bind none -- sh -c 'grep Cpus_allowed_list /proc/self/status' | awk '{print $3}' | sort -u)
expect_eq "--bind none keeps the parent's CPU set" "$parent" "$out"
out=$("$RUN" -n 2 -- sh -c 'grep Cpus_allowed_list /proc/self/status' | awk '{print $3}')
bad=0
for cpus in $out; do [[ "$cpus" =~ ^[0-9]+$ ]] || bad=1; done
expect_eq "default binding pins each rank to one CPU" "0" "$bad"
first=$("$RUN" -n 1 -- sh -c 'grep Cpus_allowed_list /proc/self/status' | awk '{print $2}')
expect_eq "rank 0 gets the first allowed CPU" "${parent%%[-,]*}" "$first"

# --- failures ---
# The time bounds below tell "stopped by comm-run" from "ran its 60 s sleep": 45 s leaves a busy
# host (CI beside other jobs) all the seconds it may add, and still fails a launcher that waits.
start=$SECONDS
"$RUN" -n 3 -- sh -c 'if [ "$RANK" = 2 ]; then exit 3; fi; sleep 60' >"$TMP/out" 2>"$TMP/err"
rc=$?
expect_eq "exit status is the failing rank's" "3" "$rc"
expect_match "the failing rank is named" 'rank 2 exited with status 3' "$(cat "$TMP/err")"
(( SECONDS - start < 45 )) && pass "the other ranks were stopped" || fail "ranks not stopped in time"

"$RUN" -n 3 -- sh -c 'exit $RANK' >/dev/null 2>"$TMP/err"
rc=$?
[[ $rc -ne 0 ]] && pass "sh -c 'exit \$RANK' fails the job" || fail "exit \$RANK returned 0"
expect_match "names rank 1 or 2" 'job failed: rank [12] exited with status [12]' "$(cat "$TMP/err")"

"$RUN" -n 2 -- sh -c 'if [ "$RANK" = 1 ]; then kill -9 $$; fi; sleep 60' >/dev/null 2>"$TMP/err"
rc=$?
expect_eq "a rank killed by a signal: 128+signal" "137" "$rc"
expect_match "names the signal" 'rank 1 killed by signal 9' "$(cat "$TMP/err")"

# A rank that ignores SIGTERM is killed after the grace period. Rank 0 fails only once rank 1
# ignores SIGTERM (a marker file), so a loaded machine cannot turn this into a plain SIGTERM.
start=$SECONDS
MARK="$TMP/ignoring" "$RUN" -n 2 --grace-s 1 -- sh -c '
  if [ "$RANK" = 1 ]; then trap "" TERM; touch "$MARK"; sleep 60; exit 0; fi
  while [ ! -e "$MARK" ]; do sleep 0.05; done; exit 1' >/dev/null 2>"$TMP/err"
rc=$?
expect_eq "grace period then SIGKILL: status of the first failure" "1" "$rc"
expect_match "the stubborn rank is reported" 'rank 1 killed by signal 9' "$(cat "$TMP/err")"
(( SECONDS - start < 45 )) && pass "SIGKILL after the grace period" || fail "grace period not enforced"

"$RUN" -n 2 -- /nonexistent/program >/dev/null 2>"$TMP/err"
rc=$?
expect_eq "a program that cannot run: 127" "127" "$rc"
expect_match "says why" "cannot run '/nonexistent/program'" "$(cat "$TMP/err")"

"$RUN" -n 2 -- true && pass "all ranks exit 0: exit 0" || fail "all ranks exit 0: non-zero"

# --- signals and time limits ---
# Each rank says when its handler is in place (a marker file); then comm-run gets the SIGINT.
READY="$TMP/ready" "$RUN" -n 2 -- sh -c 'trap "echo got-INT-$RANK; kill \$!; exit 0" INT; touch "$READY.$RANK"; sleep 60 & wait' \
  >"$TMP/out" 2>"$TMP/err" &
pid=$!
for _ in $(seq 1 1200); do [[ -e "$TMP/ready.0" && -e "$TMP/ready.1" ]] && break; sleep 0.05; done
kill -INT "$pid"
wait "$pid"
rc=$?
expect_eq "Ctrl-C: exit 130" "130" "$rc"
expect_eq "Ctrl-C reaches every rank" "$(printf '[0] got-INT-0\n[1] got-INT-1')" "$(sort "$TMP/out")"

start=$SECONDS
"$RUN" -n 2 --timeout-s 1 -- sleep 60 >/dev/null 2>"$TMP/err"
rc=$?
expect_eq "--timeout-s: exit 124" "124" "$rc"
(( SECONDS - start < 45 )) && pass "--timeout-s stops the job" || fail "--timeout-s too slow"

# --- usage and parameters ---
"$RUN" --help | grep -q -- '--quiet-prefix' && pass "--help documents the prefixes" || fail "--help"
"$RUN" -- true >/dev/null 2>&1 && fail "missing -n accepted" || pass "missing -n refused"
"$RUN" -n 0 -- true >/dev/null 2>&1 && fail "-n 0 accepted" || pass "-n 0 refused"
# Into a file first: grep -q stops reading at the first match, and with pipefail the SIGPIPE
# of a writer still writing (the registry outgrew one 4 KiB stdio buffer) would fail the check.
"$RUN" --params >"$TMP/params" && grep -q COMM_TIMEOUT_MS "$TMP/params" && pass "--params prints the registry" ||
  fail "--params"

if (( failures > 0 )); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
