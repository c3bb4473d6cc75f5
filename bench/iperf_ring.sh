#!/usr/bin/env bash
# The TCP ceiling of a ring, for comparing a ring all-reduce with: run on every netsim host, each
# host sends to the next one (RANK+1 mod WORLD_SIZE) with iperf3 for SECONDS while receiving from
# the previous one, which is the traffic of a ring all-reduce. Prints each host's goodput.
#   sudo tools/netsim/netsim --hosts 4 --rate 2gbit -- bench/iperf_ring.sh 10
# bench/netsim_allreduce.sh runs it under the same busy loops as the all-reduce.
set -euo pipefail
seconds=${1:-10}
: "${RANK:?run me under tools/netsim/netsim}" "${WORLD_SIZE:?}" "${MASTER_ADDR:?}"
subnet=${MASTER_ADDR%.*}
me="$subnet.$((RANK + 1))"
next="$subnet.$(((RANK + 1) % WORLD_SIZE + 1))"
port=$((5201 + RANK))  # one server per host, on a port the sender knows
iperf3 -s -1 -B "$me" -p "$port" >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
next_port=$((5201 + (RANK + 1) % WORLD_SIZE))
for ((try = 0; try < 50; ++try)); do  # the next host's server may not listen yet
  if out=$(iperf3 -c "$next" -p "$next_port" -t "$seconds" -f m 2>/dev/null); then break; fi
  out=""
  sleep 0.2
done
[[ -n $out ]] || { echo "iperf_ring: host $RANK could not reach $next:$next_port" >&2; exit 1; }
gbps=$(awk '/receiver/ {for (i = 1; i <= NF; i++) if ($i == "Mbits/sec") print $(i - 1) / 1000}' <<<"$out")
echo "# iperf3 ring: host $RANK -> $next: $gbps Gbit/s = $(awk -v g="$gbps" 'BEGIN {printf "%.4f", g / 8}') GB/s"
wait $server 2>/dev/null || true
