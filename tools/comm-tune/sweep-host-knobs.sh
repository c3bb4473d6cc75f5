#!/usr/bin/env bash
# The issue's demonstration on this machine: a small sweep of libcomm's host knobs over 2 and 4
# local ranks (shared memory, then sockets), each finishing within the time it announced, then
# a fresh alternating run that checks the profile beats the defaults where it claims a gain.
#   tools/comm-tune/sweep-host-knobs.sh [OUT_DIR]     (needs build/ with comm-run and comm-bench)
# With NETSIM=1 (root), also over simulated hosts with 1 gbit links (tools/netsim).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-comm-tune-host}
mkdir -p "$out"
cat > "$out/grid-shm.json" <<'JSON'
{"settings": [{"shm_chunk_bytes": 32768}, {"shm_chunk_bytes": 524288}, {"chunk_bytes": 65536},
              {"algo": "ring"}, {"shm_slot_bytes": 65536}]}
JSON
cat > "$out/grid-socket.json" <<'JSON'
{"settings": [{"algo": "recursive_doubling"}, {"chunk_bytes": 2097152}, {"chunk_bytes": 131072},
              {"socket_nconns": 1}, {"socket_nconns": 4}]}
JSON
status=0
run() {  # name, then comm-tune arguments
  local name=$1; shift
  /usr/bin/python3 "$here/comm-tune" --out "$out/$name" "$@" 2>"$out/$name.progress" | tee "$out/$name.log"
  /usr/bin/python3 "$here/verify-profile" "$out/$name/profile.json" --repeats 5 -n 20 ${VERIFY_LAUNCHER:+--launcher "$VERIFY_LAUNCHER"} 2>/dev/null |
    tee "$out/$name.verify" || status=1
}
run shm --ranks 2,4 --grid-file "$out/grid-shm.json" -b 16K -e 4M -f 4 -n 20 -w 3 --repeats 3
run socket --ranks 2,4 --transport socket --grid-file "$out/grid-socket.json" -b 64K -e 16M -f 4 -n 20 -w 3 \
  --repeats 3 --halving
if [ "${NETSIM:-0}" = 1 ]; then
  root=$(cd "$here/../.." && pwd)
  VERIFY_LAUNCHER="$root/tools/netsim/netsim --hosts {ranks} --rate 1gbit --" run netsim --ranks 2,4 --hosts ranks --launcher "$root/tools/netsim/netsim --hosts {ranks} --rate 1gbit --" \
    --grid chunk_bytes=131072,2097152 --grid-file "$out/grid-socket.json" -b 256K -e 16M -f 4 -n 10 -w 2 --repeats 3
fi
exit $status
