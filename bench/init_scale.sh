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

echo " ranks  limit  wall_s   init_s   barr_s first8_ms later8_ms   1MiB_s fds_init(r0/max) fds_end  rss_MB store(init/end) fds_pre"
for n in $SIZES; do
  start=$(date +%s.%N)
  rc=0
  COMM_TRANSPORT=socket timeout "${TIMEOUT_S:-600}" "$RUN" -n "$n" --bind none -- \
    sh -c "${limit_cmd}exec \"$DRIVER\" ${LATER:-10}" >"$out/$n.txt" 2>&1 || rc=$?
  wall=$(echo "$(date +%s.%N) - $start" | bc)
  python3 - "$out/$n.txt" "$n" "${LIMIT:--}" "$wall" "$rc" "${CSV:-}" "${LABEL:-libcomm}" <<'PY'
import sys
path, n, limit, wall, rc = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
csv, label = sys.argv[6], sys.argv[7]
rows = []
for line in open(path, errors="replace"):
    if "INIT_SCALE " in line:
        rows.append({k: float(v) for k, v in (kv.split("=") for kv in line.split("INIT_SCALE ", 1)[1].split())})
if len(rows) < n or rc != 0:
    lines = [l.strip() for l in open(path, errors="replace") if "INIT_SCALE" not in l]
    errs = ([l for l in lines if "init_scale:" in l] or lines)[:2] + lines[-1:]  # the first rank errors, the verdict
    print(f"{n:6d} {limit:>6} {wall:7.1f}  FAILED (rc {rc}, {len(rows)} of {n} ranks reported): " + " | ".join(errs))
    sys.exit(0)
mx = lambda k: max(r[k] for r in rows)
mean = lambda k: sum(r[k] for r in rows) / len(rows)
r0 = next(r for r in rows if r["rank"] == 0)
print(f"{n:6d} {limit:>6} {wall:7.1f} {mx('init_s'):8.2f} {mx('barrier_s'):8.3f} {mx('first8_s')*1e3:9.2f} "
      f"{mean('later8_s')*1e3:9.3f} {mx('big_s'):8.2f} {int(r0['fds_init']):8d}/{int(mx('fds_init')):<7d} "
      f"{int(mx('fds_end')):7d} {mx('rss_kb')/1024:7.1f} {int(r0['store_init']):8d}/{int(r0['store_end']):<6d} "
      f"{int(mx('fds_pre')) if 'fds_pre' in r0 else '-':>7}")
if csv:
    with open(csv, "a") as f:
        f.write(f"{label},{n},{limit},{mx('init_s'):.4f},{int(mx('fds_init'))},{int(mx('fds_pre')) if 'fds_pre' in r0 else ''}\n")
PY
done
