#!/usr/bin/env bash
# Init at scale: N ranks as processes on this machine over sockets (COMM_TRANSPORT=socket),
# each under `ulimit -n LIMIT` when LIMIT is set. Per size: the job's wall time, the slowest
# rank's comm_init, barrier, first 8 B all-reduce and checked 1 MiB all-reduce, the mean later
# 8 B all-reduce, the most file descriptors a rank holds after init and at the end, the largest
# peak RSS, and the established connections at rank 0's store after init and at the end.
#
#   bench/init_scale.sh                      # sizes 16 64 256 512, no limit
#   LIMIT=256 bench/init_scale.sh 512        # the issue's target
#   BUILD=../base/build DRIVER=/tmp/init-scale bench/init_scale.sh 64 256   # another build
#
# BUILD: the build directory (comm-run, and the driver unless DRIVER is set); TIMEOUT_S: per
# size (default 600); LATER: later 8 B all-reduces timed (default 10). Extra COMM_* variables
# pass through (e.g. COMM_SOCKET_EAGER=1 for the full mesh at init). CSV=FILE appends one line
# per size (label, ranks, limit, init_s, fds_init max, fds before init) for bench/plot_init_scale.py;
# LABEL names the rows there (default libcomm).
#
#   DRIVER=bench/init_scale_gloo.py LABEL=gloo bench/init_scale.sh 16 64   # torch's gloo (full mesh)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DRIVER=${DRIVER:-$BUILD/bench/init-scale}
RUN=$BUILD/tools/comm-run/comm-run
SIZES=${*:-16 64 256 512}
for f in "$RUN" "$DRIVER"; do
  [[ -x $f ]] || { echo "init_scale.sh: $f is missing; build first (ninja -C $BUILD)" >&2; exit 2; }
done
limit_cmd=""
[[ -n ${LIMIT:-} ]] && limit_cmd="ulimit -n $LIMIT && "
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo " ranks  limit  wall_s   init_s   barr_s first8_ms later8_ms   1MiB_s fds_init(r0/rest) fds_end  rss_MB store(init/end) fds_pre"
for n in $SIZES; do
  start=$(date +%s.%N)
  rc=0
  COMM_TRANSPORT=socket timeout "${TIMEOUT_S:-600}" "$RUN" -n "$n" --bind none -- \
    sh -c "${limit_cmd}exec \"$DRIVER\" ${LATER:-10}" >"$out/$n.txt" 2>&1 || rc=$?
  wall=$(echo "$(date +%s.%N) - $start" | bc)
  python3 bench/init_scale_report.py "$out/$n.txt" "$n" "${LIMIT:--}" "$wall" "$rc" "${CSV:-}" "${LABEL:-libcomm}"
done
