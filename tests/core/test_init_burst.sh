#!/usr/bin/env bash
# A burst (issue 25): 256 ranks started at once by a shell loop, as srun or mpirun start them,
# with COMM_AUTH_TOKEN set, over sockets; rank 0 under ulimit -n 256 (it serves the store to 255
# clients through at most 192 descriptors), every other rank under ulimit -n 64, so their peak
# descriptor count fits in 64 or they fail. Each runs init, a barrier and checked 8 B and 1 MiB
# all-reduces (bench/init_burst.sh, bench/init_scale.c). Before the store told a burst from a
# flood, rank 0's store closed ranks that were slow to say hello ("64 connections were already
# waiting to say hello"), those failed at once, and the others waited out their timeout.
# Usage: test_init_burst.sh PATH/TO/init-scale
set -uo pipefail
DRIVER=${1:?usage: test_init_burst.sh PATH/TO/init-scale}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
N=${INIT_BURST_RANKS:-256}
out=$(DRIVER=$DRIVER LIMIT=256 LIMIT_REST=64 TIMEOUT_S=240 "$ROOT/bench/init_burst.sh" "$N" 2>&1)
rc=$?
echo "$out"
if [[ $rc == 0 ]] && echo "$out" | grep -Eq "^ +$N +256 "; then
  echo "ok: $N ranks at once with a token: init, barrier, 8 B and 1 MiB all-reduces on every rank, the rest under ulimit -n 64"
else
  echo "FAIL: $N ranks at once with a token (rc $rc)"
  exit 1
fi
