#!/usr/bin/env bash
# Init time on messy networks (docs/topology.md, "Messy networks"; issue 34) against the clean
# network: for each scenario, rounds of 2 simulated hosts (tools/netsim --messy KIND), one
# init-scale rank each (bench/init_scale.c: comm_init, a barrier, the first 8-byte all-reduce,
# which makes the lazy connections), the clean network run in the same round. Prints, per
# scenario, the median over rounds of the slowest rank's init_s and of its init+barrier+first
# all-reduce, and the difference to the clean network's. Needs root (netsim).
#   sudo bench/messy_init.sh [--rounds N] [--hosts H] [--build DIR] [SCENARIO...]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rounds=3 hosts=2 build="$root/build"
while (($#)); do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
scenarios=("$@")
((${#scenarios[@]})) || scenarios=(island firewall storeport asymmetric lookalike ipv6)
netsim="$root/tools/netsim/netsim"

one() {  # kind ("" clean): "init_s total_s" of the slowest rank, or "fail"
  local kind=$1 out
  local args=(--hosts "$hosts" --rate none)
  [[ -n $kind ]] && args+=(--messy "$kind")
  out=$(env -u NCCL_SOCKET_IFNAME -u COMM_SOCKET_IFNAME COMM_TIMEOUT_MS=120000 timeout 150 \
    "$netsim" "${args[@]}" -- "$build/bench/init-scale" 1 2>&1) || { echo fail; return; }
  grep -o 'init_s=[0-9.]* barrier_s=[0-9.]* first8_s=[0-9.]*' <<<"$out" |
    awk -F'[= ]' '{i = $2; t = $2 + $4 + $6; if (i > mi) mi = i; if (t > mt) mt = t} END {printf "%.3f %.3f\n", mi, mt}'
}

median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

printf '# %d hosts, %d rounds, %s; the machine: %s\n' "$hosts" "$rounds" "$(date -u +%FT%TZ)" "$(uptime | sed 's/.*load/load/')"
printf '%-12s %10s %10s %12s %12s\n' scenario init_s clean_init total_s clean_total
for s in "${scenarios[@]}"; do
  : >"/tmp/messy_init.$$.m" && : >"/tmp/messy_init.$$.c"
  for ((r = 0; r < rounds; r++)); do
    one "" >>"/tmp/messy_init.$$.c"
    one "$s" >>"/tmp/messy_init.$$.m"
  done
  if grep -q fail "/tmp/messy_init.$$.m"; then
    printf '%-12s %10s\n' "$s" "FAILED($(grep -c fail "/tmp/messy_init.$$.m")/$rounds)"
    continue
  fi
  mi=$(cut -d' ' -f1 "/tmp/messy_init.$$.m" | median) mt=$(cut -d' ' -f2 "/tmp/messy_init.$$.m" | median)
  ci=$(grep -v fail "/tmp/messy_init.$$.c" | cut -d' ' -f1 | median) ct=$(grep -v fail "/tmp/messy_init.$$.c" | cut -d' ' -f2 | median)
  printf '%-12s %10.3f %10.3f %12.3f %12.3f\n' "$s" "$mi" "$ci" "$mt" "$ct"
done
rm -f "/tmp/messy_init.$$".*
