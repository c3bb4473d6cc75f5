#!/usr/bin/env bash
# NCCL_SOCKET_IFNAME semantics on simulated hosts: two network namespaces joined by a veth pair,
# each with a decoy bridge named docker0 that is up and has an address. comm-topo, run inside
# each namespace, must choose the veth (NCCL's default order passes over docker*), and docker0
# only when NCCL_SOCKET_IFNAME asks for it. Only addresses inside the namespaces are used.
# Needs root and `ip netns`; otherwise it skips (exit 77) saying why. Always cleans up.
set -euo pipefail

COMM_TOPO=${1:?usage: test_topology_netns.sh PATH/TO/comm-topo}

skip() { echo "SKIP: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"
command -v python3 >/dev/null || skip "python3 is needed to read comm-topo --json"

A="ctopo$$a"
B="ctopo$$b"
cleanup() {
  ip netns del "$A" 2>/dev/null || true
  ip netns del "$B" 2>/dev/null || true
  ip link del "vct$$a" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$A" 2>/dev/null || skip "ip netns add failed (no CAP_SYS_ADMIN or no netns support here)"
ip netns add "$B"
ip link add "vct$$a" type veth peer name "vct$$b"
ip link set "vct$$a" netns "$A"
ip link set "vct$$b" netns "$B"

setup_host() {  # namespace, its veth, its address
  local ns=$1 dev=$2 addr=$3
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "$dev" name veth0
  ip -n "$ns" addr add "$addr/24" dev veth0
  ip -n "$ns" link set veth0 up
  ip -n "$ns" link add docker0 type bridge
  ip -n "$ns" addr add 172.17.0.1/16 dev docker0
  ip -n "$ns" link set docker0 up
}
setup_host "$A" "vct$$a" 10.231.7.1
setup_host "$B" "vct$$b" 10.231.7.2

# First chosen interface, and the kinds the probe saw, from comm-topo --json inside a namespace.
chosen() {  # namespace, NCCL_SOCKET_IFNAME value ("" = unset)
  local ns=$1 spec=$2
  local envs=(env -u COMM_SOCKET_IFNAME -u NCCL_SOCKET_IFNAME -u COMM_TOPO_XML -u NCCL_TOPO_FILE)
  [[ -n $spec ]] && envs+=("NCCL_SOCKET_IFNAME=$spec")
  ip netns exec "$ns" "${envs[@]}" "$COMM_TOPO" --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
kinds = {i["name"]: i["kind"] for i in d["topology"]["interfaces"]}
first = d["plan"]["interfaces"][0]["name"] if d["plan"]["interfaces"] else "none"
print(first, kinds.get("veth0", "?"), kinds.get("docker0", "?"))'
}

fail=0
expect() {  # namespace, spec, expected interface
  local got
  got=$(chosen "$1" "$2")
  read -r first veth_kind docker_kind <<<"$got"
  if [[ $first == "$3" ]]; then
    echo "ok: $1 NCCL_SOCKET_IFNAME='$2' -> $first (veth0 is $veth_kind, docker0 is $docker_kind)"
  else
    echo "FAIL: $1 NCCL_SOCKET_IFNAME='$2' chose $first, expected $3 (veth0 is $veth_kind, docker0 is $docker_kind)"
    fail=1
  fi
}

for ns in "$A" "$B"; do
  expect "$ns" "" veth0          # NCCL's default order: not docker*, lo, virbr*
  expect "$ns" "docker0" docker0 # asked for by prefix
  expect "$ns" "=docker0" docker0
  expect "$ns" "^docker" veth0
  expect "$ns" "^=veth0" docker0 # the only other one besides lo, which comes last
done

# The namespaces are joined: the veth pair carries traffic between the two simulated hosts.
if command -v ping >/dev/null; then
  ip netns exec "$A" ping -c 1 -W 2 10.231.7.2 >/dev/null || { echo "FAIL: $A cannot reach $B over veth0"; fail=1; }
fi
exit $fail
