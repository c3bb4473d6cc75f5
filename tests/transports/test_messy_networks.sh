#!/usr/bin/env bash
# Messy networks (docs/topology.md, "Messy networks"; issue 34): simulated hosts (tools/netsim,
# network namespaces) whose first interface does not carry the job, NCCL_SOCKET_IFNAME unset.
# Each scenario runs bench/init_scale.c's rank on every host (init, barrier, checked all-reduces):
#   island, firewall, storeport, asymmetric, lookalike, ipv6: 2 hosts; the job completes, long
#       before COMM_TIMEOUT_MS (120 s here, where the old single-address dial waited or failed);
#   hostname: the silent firewall, MASTER_ADDR a host name whose first address is host 0's
#       firewalled eth0 (the store's connection moves on to the next address after
#       COMM_SOCKET_CONNECT_TIMEOUT_MS, rank 0 listens on every address of the name);
#   tree8: 8 hosts, storeport (the verdict's tree on: a parent's route is the firewalled eth0);
#   hosts4x2: 4 hosts x 2 ranks, island (shared memory inside a host, sockets between; the
#       reachability summary down the init verdict's tree);
#   prefix: the island with NCCL_SOCKET_IFNAME=eth, a prefix both interfaces match: the
#       reachability check at init chooses eth1 among the user's set;
#   eager: the asymmetric path with COMM_SOCKET_EAGER=1 (every pair connected at init, the
#       higher rank dialing: rank 1, whose SYNs host 0 drops on eth0);
#   none, none-firewall: NCCL_SOCKET_IFNAME=eth0 (the island, or the silent firewall): every rank
#       fails within 15 s, naming the peer, its address with the interface and the error, and
#       the fix (NCCL_SOCKET_IFNAME=eth1).
# Only addresses inside the namespaces netsim makes are used; netsim removes them on exit.
# Needs root, `ip netns` and (firewall kinds) iptables; otherwise it skips (exit 77) saying why.
# Usage: test_messy_networks.sh SCENARIO BUILD_DIR SOURCE_DIR
set -uo pipefail
scenario=${1:?usage: test_messy_networks.sh SCENARIO BUILD_DIR SOURCE_DIR}
build=${2:?} src=${3:?}
netsim="$src/tools/netsim/netsim"
rank="$build/bench/init-scale"

skip() { echo "SKIP: $*"; exit 77; }
((EUID == 0)) || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"
ip netns add "messyprobe$$" 2>/dev/null || skip "ip netns add failed (no CAP_SYS_ADMIN or no netns support here)"
ip netns del "messyprobe$$"

hosts=2 per_host=1 kind=$scenario expect=ok spec="" extra=() eager=0
case $scenario in
  island|firewall|storeport|asymmetric|lookalike|ipv6) ;;
  hostname) kind=firewall extra=(--master-name master) ;;
  tree8) hosts=8 kind=storeport ;;
  hosts4x2) hosts=4 per_host=2 kind=island ;;
  prefix) kind=island spec=eth ;;
  eager) kind=asymmetric eager=1 ;;
  none) kind=island expect=fail spec=eth0 ;;
  none-firewall) kind=firewall expect=fail spec=eth0 ;;
  *) echo "unknown scenario '$scenario'"; exit 2 ;;
esac
if [[ $kind == firewall || $kind == storeport || $kind == asymmetric ]]; then
  command -v iptables >/dev/null || skip "iptables is not installed (scripts/lib.sh lists it among the test packages)"
fi

out=$(mktemp)
trap 'rm -f "$out"' EXIT
envs=(env -u COMM_SOCKET_IFNAME -u NCCL_SOCKET_IFNAME COMM_TIMEOUT_MS=120000 COMM_DEBUG=INFO COMM_DEBUG_SUBSYS=NET)
[[ -n $spec ]] && envs+=("NCCL_SOCKET_IFNAME=$spec")
((eager)) && envs+=(COMM_SOCKET_EAGER=1)
# A rank ignores SIGTERM (inherited), so that the first rank to fail does not stop the others
# before they say why they fail; a watchdog beside it kills it at 90 s (COMM_TIMEOUT_MS is 120 s),
# so netsim, which waits for its ranks, always gets to remove its namespaces.
start=$(date +%s.%N)
"${envs[@]}" timeout 110 "$netsim" --hosts "$hosts" --ranks-per-host "$per_host" --rate none --messy "$kind" "${extra[@]}" -- \
  sh -c "trap '' TERM; '$rank' 1 & pid=\$!; (sleep 90; kill -KILL \$pid) >/dev/null 2>&1 & dog=\$!; wait \$pid; rc=\$?; kill -KILL \$dog 2>/dev/null; exit \$rc" >"$out" 2>&1
rc=$?
took=$(echo "$(date +%s.%N) - $start" | bc)
world=$((hosts * per_host))
fail=0
bad() { echo "FAIL: $scenario: $*"; fail=1; }

if [[ $expect == ok ]]; then
  reported=$(grep -c 'INIT_SCALE rank=' "$out")
  [[ $rc == 0 ]] || bad "the job failed (status $rc)"
  [[ $reported == "$world" ]] || bad "$reported of $world ranks finished"
  # The old dial retried an unreachable first address until COMM_TIMEOUT_MS (120 s); anything
  # near that is the bug, whatever the machine's load.
  (($(echo "$took < 60" | bc))) || bad "took ${took} s (COMM_TIMEOUT_MS is 120 s)"
  # Reachability proven at init (libcomm/src/reachability.cc): every rank says once, at INFO,
  # which interfaces reach which peers and why the others were dropped.
  said=$(grep -c 'reachability at init' "$out")
  [[ $said == "$world" ]] || bad "$said of $world ranks said what reachability at init found (want one line each)"
  # Rank 0's summary of the round goes down the init verdict's tree (docs/design/base.md, "Hot
  # keys"): the ranks whose parent is not rank 0 (3, 5, 6, 7 of 8) take it from their parent.
  if [[ $scenario == hosts4x2 ]]; then
    n=$(grep -c 'reachability summary from parent rank' "$out")
    [[ $n == 4 ]] || bad "$n of 4 ranks (3, 5, 6, 7) took the reachability summary from their parent in the init tree"
  fi
  says() {  # what, pattern: every rank's reachability line matches it
    local n
    n=$(grep 'reachability at init' "$out" | grep -c -- "$2")
    [[ $n == "$world" ]] || bad "$n of $world ranks' reachability lines name $1"
  }
  # Unanswered, given up once eth1 answered; or, when the scheduler left the prober waiting past
  # ARP's 3 s on the island, the kernel's EHOSTUNREACH.
  noanswer='eth0 10\.76\.0\.[0-9]*/24: \(no answer from rank [0-9]* at 10\.76\.0\.[0-9]*:[0-9]* to the TCP handshake within [0-9]* ms\|no route to rank [0-9]* at 10\.76\.0\.[0-9]*:[0-9]* (EHOSTUNREACH)\).*; using eth1$'
  case $kind in
    island|firewall|storeport|ipv6)
      # eth0 reaches nobody (storeport: it is the route to the store, so it would be dialed first).
      says "eth0, the unanswered handshake and eth1" "$noanswer" ;;
    asymmetric)
      # Host 0 drops SYNs on eth0: rank 1's dial fails there, rank 0's goes through. Both drop it.
      grep 'rank 0: reachability at init' "$out" |
        grep -q 'eth0 10\.76\.0\.1/24: rank 1 (from 10\.76\.0\.2) cannot reach 10\.76\.0\.1:[0-9]*: no answer to the TCP handshake within [0-9]* ms (this host reaches it there: a path that works one way only).*; using eth1$' ||
        bad "rank 0 does not say that rank 1 cannot reach its eth0 (one way only)"
      grep 'rank 1: reachability at init' "$out" |
        grep -q 'eth0 10\.76\.0\.2/24: no answer from rank 0 at 10\.76\.0\.1:[0-9]*.*; using eth1$' ||
        bad "rank 1 does not say that rank 0's eth0 did not answer"
      # Both ranks learned it at init, so no dial (lazy or eager) spends its first try on eth0.
      grep -q ': cannot reach rank [0-9]* at ' "$out" && bad "a dial tried eth0 first, which init had proven dropped" ;;
    lookalike)
      says "the bridge, its address as this host's own and eth1" \
        "br-1a2b3c4d 172\.17\.0\.1/16: rank [0-9]*'s address 172\.17\.0\.1 is this host's own .*; using eth1$" ;;
  esac
else
  [[ $rc != 0 ]] || bad "the job succeeded with no working interface"
  (($(echo "$took < 15" | bc))) || bad "failing took ${took} s, want under 15 s (COMM_TIMEOUT_MS is 120 s)"
  for ((r = 0; r < world; r++)); do
    prefix=""
    ((r > 0)) && prefix="[$r] "
    line=$(grep -F "${prefix}init_scale: comm_init:" "$out" | head -1)
    [[ -n $line ]] || { bad "rank $r did not fail with a message"; continue; }
    grep -q "cannot be reached at any of its addresses: 10\.76\.0\.[0-9]*:[0-9]* (its eth0, from eth0 10\.76\.0\.[0-9]*): " <<<"$line" ||
      bad "rank $r does not name the peer's address, its interface and error: $line"
    grep -q "NCCL_SOCKET_IFNAME=eth1" <<<"$line" || bad "rank $r does not give the fix (NCCL_SOCKET_IFNAME=eth1): $line"
    if [[ $kind == island ]]; then
      grep -q "EHOSTUNREACH" <<<"$line" || bad "rank $r: no EHOSTUNREACH: $line"
    else
      grep -q "no answer to the TCP handshake" <<<"$line" || bad "rank $r: no 'no answer to the TCP handshake': $line"
    fi
    grep -q "not tried yet" <<<"$line" && bad "rank $r says a dial in progress was not tried: $line"
  done
fi
if ((fail)); then
  echo "--- output (last 40 lines)"
  tail -40 "$out"
else
  echo "ok: $scenario ($hosts hosts x $per_host ranks, --messy $kind): $([[ $expect == ok ]] && echo completed || echo failed as it should) in ${took} s"
  [[ $expect == ok ]] && grep -h 'INIT_SCALE rank=0 ' "$out"
  [[ $expect == ok ]] && grep -h "rank 0: reachability at init" "$out"
  [[ $expect == fail ]] && grep -F 'init_scale: comm_init:' "$out" | head -1
fi
exit $fail
