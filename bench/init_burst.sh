#!/usr/bin/env bash
# Init in a burst: N ranks started at once by a shell loop, as srun or mpirun start them (no
# launcher process in between, every rank connecting to rank 0's store in the same second), over
# sockets, each under `ulimit -n LIMIT`, with COMM_AUTH_TOKEN set unless TOKEN is empty, and BUSY
# busy loops beside them. One row per size, with bench/init_scale.sh's columns
# (bench/init_scale_report.py); exits non-zero when a size failed.
#
#   bench/init_burst.sh 512                  # ulimit -n 256, a token (issue 25's target)
#   LIMIT=1024 bench/init_burst.sh 1024      # the default ulimit -n
#   TOKEN= BUSY=2 bench/init_burst.sh 512    # no token, two busy loops
#   LIMIT_REST=64 bench/init_burst.sh 512    # ranks but 0 under ulimit -n 64: their peak fits in 64
#   FLOOD=300 bench/init_burst.sh 256        # 300 connections that never say hello, during the burst
#   PAUSE0=6 bench/init_burst.sh 96          # rank 0 stopped (SIGSTOP) 6 times for PAUSE0_S=1.5 s, 0.3 s
#                                            # apart, from its start: a rank 0 the scheduler leaves waiting
#
# BUILD: the build directory; TIMEOUT_S: per size (default 600), also each rank's COMM_TIMEOUT_MS;
# LATER: later 8 B all-reduces timed (default 2). CSV/LABEL as in bench/init_scale.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DRIVER=${DRIVER:-$BUILD/bench/init-scale}
SIZES=${*:-256 512}
LIMIT=${LIMIT:-256}
LIMIT_REST=${LIMIT_REST:-$LIMIT}
TOKEN=${TOKEN-burst-$RANDOM-$RANDOM}
TIMEOUT_S=${TIMEOUT_S:-600}
[[ -x $DRIVER ]] || { echo "init_burst.sh: $DRIVER is missing; build first (ninja -C $BUILD)" >&2; exit 2; }
out=${KEEP:-$(mktemp -d)}; mkdir -p "$out"
helpers=()
cleanup() {
  for p in "${helpers[@]}"; do kill "$p" 2>/dev/null || true; done
  [[ -n ${KEEP:-} ]] || rm -rf "$out"
}
trap cleanup EXIT
for ((i = 0; i < ${BUSY:-0}; i++)); do
  (while :; do :; done) &
  helpers+=($!)
done
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

echo "# ranks started at once by a shell loop; ulimit -n $LIMIT (ranks but 0: $LIMIT_REST); token: $([[ -n $TOKEN ]] && echo set || echo none); busy loops: ${BUSY:-0}; flood: ${FLOOD:-0}; rank 0 paused: ${PAUSE0:-0}x${PAUSE0_S:-1.5}s"
echo " ranks  limit  wall_s   init_s   barr_s first8_ms later8_ms   1MiB_s fds_init(r0/rest) fds_end  rss_MB store(init/end) fds_pre"
failed=0
for n in $SIZES; do
  port=$(free_port)
  flood_pid=""
  if [[ -n ${FLOOD:-} ]]; then
    python3 bench/store_flood.py 127.0.0.1 "$port" "$FLOOD" "$TIMEOUT_S" &
    flood_pid=$!
  fi
  start=$(date +%s.%N)
  pids=()
  for ((r = 0; r < n; r++)); do
    lim=$LIMIT_REST
    ((r == 0)) && lim=$LIMIT
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n \
      COMM_TRANSPORT=socket COMM_TIMEOUT_MS=$((TIMEOUT_S * 1000)) COMM_AUTH_TOKEN=$TOKEN \
      timeout "$TIMEOUT_S" bash -c "ulimit -n $lim && exec \"$DRIVER\" ${LATER:-2}" >"$out/$n.$r.txt" 2>&1 &
    pids+=($!)
  done
  pause_pid=""
  if [[ -n ${PAUSE0:-} ]]; then
    # Rank 0 is the child of its `timeout` (bash execs the driver): stop and continue it.
    (
      r0=""
      for ((t = 0; t < 100; t++)); do
        r0=$(pgrep -P "${pids[0]}" | head -1) && break
        sleep 0.05
      done
      [[ -n $r0 ]] || exit 0
      for ((k = 0; k < PAUSE0; k++)); do
        sleep 0.3
        kill -STOP "$r0" 2>/dev/null || break
        sleep "${PAUSE0_S:-1.5}"
        kill -CONT "$r0" 2>/dev/null || break
      done
    ) &
    pause_pid=$!
    helpers+=("$pause_pid")
  fi
  rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  [[ -n $pause_pid ]] && { wait "$pause_pid" 2>/dev/null || true; }
  wall=$(python3 -c "import time; print(f'{time.time() - $start:.1f}')")
  [[ -n $flood_pid ]] && { kill "$flood_pid" 2>/dev/null; wait "$flood_pid" 2>/dev/null || true; }
  cat "$out/$n".*.txt >"$out/$n.txt"
  row=$(python3 bench/init_scale_report.py "$out/$n.txt" "$n" "$LIMIT" "$wall" "$rc" "${CSV:-}" "${LABEL:-libcomm}")
  echo "$row"
  [[ $row == *FAILED* ]] && failed=1
done
exit $failed
