#!/usr/bin/env bash
# netsim smoke test: 2 simulated hosts (network namespaces, 2 Gbit/s tbf links, a decoy docker0
# in each), all-reduce 1 MiB checked on every element; then nothing of netsim may be left.
# Then 2 hosts x 2 ranks (--ranks-per-host): environment, namespaces, a checked hierarchical
# all-reduce. Skips (77) without root or without network namespaces.  test_netsim.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
netsim="$src/tools/netsim/netsim"

if ((EUID != 0)); then
  out=$("$netsim" --hosts 2 -- true 2>&1) && { echo "FAIL: netsim ran without root"; exit 1; }
  grep -q "needs root" <<<"$out" || { echo "FAIL: no clear 'needs root' message: $out"; exit 1; }
  echo "SKIP: not root (netsim said: $out)"
  exit 77
fi
if ! ip netns add "nsimprobe$$" 2>/dev/null; then
  echo "SKIP: cannot create network namespaces here"
  exit 77
fi
ip netns del "nsimprobe$$"

before=$(ip netns list | grep -c '^nsim' || true)
out=$(COMM_TIMEOUT_MS=30000 timeout 120 "$netsim" --hosts 2 --rate 2gbit --decoy -- \
  "$build/bench/comm-bench" -b 1M -e 1M -n 3 -w 1 -c 1 2>&1)
echo "$out"
rows=$(grep -v '^#' <<<"$out" | grep -v '^\[' | grep -c . || true)
[[ $rows == 1 ]] || { echo "FAIL: want 1 row, got $rows"; exit 1; }
grep -q '^# Out of bounds values : 0 OK' <<<"$out" || { echo "FAIL: check failed"; exit 1; }
after=$(ip netns list | grep -c '^nsim' || true)
[[ $after == "$before" ]] || { echo "FAIL: netsim left namespaces: $(ip netns list)"; exit 1; }

# A failing command fails the run, and everything is removed all the same.
if "$netsim" --hosts 2 -- sh -c 'exit 3' 2>/dev/null; then echo "FAIL: a failing rank did not fail netsim"; exit 1; fi
after=$(ip netns list | grep -c '^nsim' || true)
[[ $after == "$before" ]] || { echo "FAIL: netsim left namespaces after a failure"; exit 1; }

# Each host gets its own rank, MASTER_ADDR of host 0, and no COMM_HOST_ID.
envs=$(COMM_HOST_ID=shared "$netsim" --hosts 3 -- sh -c 'echo "r=$RANK n=$WORLD_SIZE m=$MASTER_ADDR l=$LOCAL_WORLD_SIZE h=${COMM_HOST_ID-unset}"' 2>/dev/null)
echo "$envs"
for want in "r=0 n=3 m=10.77.0.1 l=1 h=unset" "[1] r=1 n=3 m=10.77.0.1 l=1 h=unset" "[2] r=2 n=3 m=10.77.0.1 l=1 h=unset"; do
  grep -qxF "$want" <<<"$envs" || { echo "FAIL: missing '$want'"; exit 1; }
done
# --ranks-per-host: ranks of one host share its namespace (one host to libcomm: shared memory),
# numbered host by host; the hierarchical all-reduce runs there (no fallback warning) and is right.
envs=$("$netsim" --hosts 2 --ranks-per-host 2 -- sh -c 'echo "r=$RANK n=$WORLD_SIZE l=$LOCAL_RANK/$LOCAL_WORLD_SIZE g=$GROUP_RANK ns=$(readlink /proc/self/ns/net)"' 2>/dev/null)
echo "$envs"
for r in 0 1 2 3; do
  want="r=$r n=4 l=$((r % 2))/2 g=$((r / 2))"
  grep -q "^\(\[$r\] \)\?$want ns=" <<<"$envs" || { echo "FAIL: missing '$want'"; exit 1; }
done
nets=$(sed 's/.* g=\([0-9]\) ns=\(.*\)/\1 \2/' <<<"$envs" | sort -u)
[[ $(wc -l <<<"$nets") == 2 && $(cut -d' ' -f1 <<<"$nets" | sort -u | wc -l) == 2 ]] ||
  { echo "FAIL: want one network namespace per host: $nets"; exit 1; }
out=$(COMM_TIMEOUT_MS=30000 timeout 120 "$netsim" --hosts 2 --ranks-per-host 2 --rate 2gbit --host-rate 1=1gbit -- \
  "$build/bench/comm-bench" -b 1M -e 1M -n 2 -w 1 -c 1 --algo hierarchical 2>&1)
echo "$out"
grep -q '^# Out of bounds values : 0 OK' <<<"$out" || { echo "FAIL: 2 x 2 hierarchical check failed"; exit 1; }
if grep -qE "cannot run .* on [0-9]+ ranks" <<<"$out"; then echo "FAIL: hierarchical fell back on 2 hosts x 2 ranks"; exit 1; fi
after=$(ip netns list | grep -c '^nsim' || true)
[[ $after == "$before" ]] || { echo "FAIL: netsim left namespaces: $(ip netns list)"; exit 1; }
echo "PASS"
