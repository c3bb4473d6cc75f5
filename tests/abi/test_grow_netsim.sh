#!/usr/bin/env bash
# comm_grow across simulated hosts (issue 35): tools/netsim, 2 hosts (network namespaces) x 2
# ranks, shared memory inside a host and sockets between (the routed transport). Rank 2 (host 1)
# SIGKILLs itself; the survivors agree and shrink; a joiner started with COMM_JOIN=1 in host 1's
# namespace (its wrapper, after the rank died) is admitted through comm_grow(COMM_GROW_WAITING),
# and the all-reduce on the 4 is right everywhere. Plaintext, then COMM_TLS=1 with COMM_AUTH_TOKEN.
# Skips (77) without root or network namespaces.  test_grow_netsim.sh SOURCE_DIR grow_worker
set -uo pipefail
src=${1:?usage: test_grow_netsim.sh SOURCE_DIR grow_worker}
export W=${2:?usage: test_grow_netsim.sh SOURCE_DIR grow_worker}
netsim="$src/tools/netsim/netsim"
if ((EUID != 0)); then echo "SKIP: netsim needs root"; exit 77; fi
if ! ip netns add "nsimprobe$$" 2>/dev/null; then echo "SKIP: cannot create network namespaces here"; exit 77; fi
ip netns del "nsimprobe$$"

failures=0
check() {  # name, then env assignments
  local name=$1 out n
  shift
  # A SIGKILL is seen at once: the timeout only bounds a hang on a busy host.
  out=$(env GROW_VICTIM=2 COMM_TIMEOUT_MS=20000 "$@" timeout 150 "$netsim" --hosts 2 --ranks-per-host 2 --rate none \
    -- bash -c 'if [ "$RANK" = 2 ]; then "$W" member; COMM_JOIN=1 exec "$W" joiner; else exec "$W" member; fi' 2>&1)
  n=$(grep -cE '(^|\] )GROW 0 [0-2] 4$' <<<"$out")
  [[ $n -eq 3 ]] || { echo "FAIL: $name: $n of 3 survivors grew to 4 ranks"; failures=$((failures + 1)); }
  grep -qE '(^|\] )INIT 0 3 4$' <<<"$out" || { echo "FAIL: $name: the joiner is not rank 3 of 4"; failures=$((failures + 1)); }
  n=$(grep -cE '(^|\] )RESULT ok$' <<<"$out")
  [[ $n -eq 11 ]] || { echo "FAIL: $name: $n of 11 all-reduces right"; failures=$((failures + 1)); }
  grep -qE 'RESULT bad|MSG ' <<<"$out" && { echo "FAIL: $name: an error"; failures=$((failures + 1)); }
  n=$(grep -cE '(^|\] )DONE 0$' <<<"$out")
  [[ $n -eq 4 ]] || { echo "FAIL: $name: $n of 4 processes done"; failures=$((failures + 1)); }
  if ((failures > 0)); then echo "--- $name:"; grep -v ' ITER ' <<<"$out" | grep -v '^ITER'; else echo "ok: $name"; fi
}
check "plaintext"
check "TLS" COMM_TLS=1 COMM_AUTH_TOKEN=grow-netsim-token
((failures == 0)) && echo "all passed" || exit 1
