#!/usr/bin/env bash
# The hierarchical all-reduce against the flat ring on simulated hosts with several ranks each
# (tools/netsim --ranks-per-host): shared memory inside a host, tbf-shaped links between hosts.
#   1. busbw over sizes, hierarchical and ring alternating round by round (medians);
#   2. bytes per host link per all-reduce of BYTES_SIZE, from tbf's counters: two runs that differ
#      only in the number of timed calls, so init, warm-up and the check cancel out;
#   3. the same busbw with one host's link at half rate (SLOW_HOST);
#   4. (PARTS=cyclic, not by default) the busbw with ranks placed cyclically over the hosts.
# Prints markdown tables. Needs root (netsim).
#
#   sudo bench/netsim_hierarchical.sh                 # HOSTS=8 PER_HOST=2 RATE=500mbit ROUNDS=3
#   sudo PARTS="bytes" bench/netsim_hierarchical.sh   # one part: sweep, bytes, slow, cyclic
#   sudo RATE=100mbit ROUNDS=2 SIZES="-b 4M -e 16M -f 4" PARTS="sweep slow cyclic" bench/netsim_hierarchical.sh
#
# BUILD: the build directory (default build); SIZES: comm-bench -b/-e/-f for the sweeps
# (default "-b 1M -e 64M -f 4"); BYTES_SIZE (default 16M); SLOW_HOST (default 3); NETSIM_OPTS:
# more netsim options for every run (e.g. "--latency 100ms", a longer tbf queue). Each sweep also
# prints the packets tbf dropped per run (sum over every link and direction, median).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
HOSTS=${HOSTS:-8} PER_HOST=${PER_HOST:-2} RATE=${RATE:-500mbit} ROUNDS=${ROUNDS:-3}
SIZES=${SIZES:--b 1M -e 64M -f 4} BYTES_SIZE=${BYTES_SIZE:-16M} SLOW_HOST=${SLOW_HOST:-3}
PARTS=${PARTS:-sweep bytes slow}
bench=$BUILD/bench/comm-bench
netsim=tools/netsim/netsim
[[ -x $bench ]] || { echo "netsim_hierarchical.sh: $bench is missing; build first (ninja -C $BUILD)" >&2; exit 2; }
((EUID == 0)) || { echo "netsim_hierarchical.sh: needs root (netsim makes network namespaces); run it with sudo" >&2; exit 2; }
[[ ${RATE,,} =~ ^([0-9]+)(kbit|mbit|gbit)$ ]] || { echo "netsim_hierarchical.sh: RATE as 500mbit or 1gbit, not '$RATE'" >&2; exit 2; }
case ${BASH_REMATCH[2]} in kbit) k=1 ;; mbit) k=1000 ;; gbit) k=1000000 ;; esac
half="$((BASH_REMATCH[1] * k / 2))kbit"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export COMM_TIMEOUT_MS=${COMM_TIMEOUT_MS:-120000}

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $HOSTS hosts x $PER_HOST ranks, links $RATE per direction; half rate = $half"

run() {  # file, netsim options, comm-bench options...
  local f=$1 opts=$2; shift 2
  # shellcheck disable=SC2086
  timeout 900 "$netsim" --hosts "$HOSTS" --ranks-per-host "$PER_HOST" --rate "$RATE" --stats ${NETSIM_OPTS:-} $opts -- \
    "$bench" -w 1 "$@" >"$f" 2>&1 || { echo "FAILED: netsim $opts -- comm-bench $*" >&2; tail -5 "$f" >&2; return 1; }
}

sweep() {  # tag, netsim options
  local tag=$1 opts=$2 r a
  for ((r = 1; r <= ROUNDS; r++)); do
    for a in hierarchical ring; do
      # shellcheck disable=SC2086
      run "$out/$tag-$a-$r.txt" "$opts" $SIZES -n 3 -c 1 --algo "$a" --csv "$out/$tag-$a-$r.csv"
    done
  done
  python3 - "$out" "$tag" <<'PY'
import csv, glob, re, statistics, sys
out, tag = sys.argv[1:]
rows = {}
for path in sorted(glob.glob(f"{out}/{tag}-*.csv")):
    algo = path.rsplit("/", 1)[1][len(tag) + 1:].rsplit("-", 1)[0]
    for row in csv.DictReader(open(path)):
        assert row["oop_wrong"] == "0" and row["ip_wrong"] == "0", f"#wrong in {path}: {row}"
        rows.setdefault(int(row["size"]), {}).setdefault(algo, []).append(float(row["ip_busbw"]))
drops = {}
for path in sorted(glob.glob(f"{out}/{tag}-*.txt")):
    algo = path.rsplit("/", 1)[1][len(tag) + 1:].rsplit("-", 1)[0]
    n = sum(int(m) for line in open(path, errors="replace") if line.startswith("# netsim: host")
            for m in re.findall(r"dropped (\d+)", line))
    drops.setdefault(algo, []).append(n)
print("packets dropped by tbf per run (all links, both directions; median): " +
      ", ".join(f"{a} {statistics.median(v):.0f}" for a, v in sorted(drops.items())))
print()
print("| size | hierarchical busbw GB/s | ring busbw GB/s | hierarchical / ring |")
print("|---:|---:|---:|---:|")
for size in sorted(rows):
    h, r = (statistics.median(rows[size][a]) for a in ("hierarchical", "ring"))
    print(f"| {size >> 20} MiB | {h:.4f} | {r:.4f} | {h / r:.2f} |")
PY
}

if [[ " $PARTS " == *" sweep "* ]]; then
  echo; echo "## busbw, $HOSTS x $PER_HOST, all links $RATE (in-place, medians of $ROUNDS)"
  sweep sweep ""
fi

if [[ " $PARTS " == *" bytes "* ]]; then
  echo; echo "## bytes per host link per $BYTES_SIZE all-reduce (tbf counters; (run with -n 6) - (run with -n 2) over 8 calls)"
  for p in block cyclic; do
    for a in hierarchical ring; do
      for n in 2 6; do run "$out/bytes-$p-$a-$n.txt" "--placement $p" -b "$BYTES_SIZE" -e "$BYTES_SIZE" -n $n -c 0 --algo "$a"; done
    done
  done
  python3 - "$out" "$HOSTS" "$PER_HOST" "$BYTES_SIZE" <<'PY'
import re, sys
out, hosts, per, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
S = int(size[:-1]) << {"K": 10, "M": 20, "G": 30}[size[-1]]
n, h = hosts * per, hosts
def counters(path):
    c = {}
    for line in open(path, errors="replace"):
        m = re.search(r"# netsim: host (\d+) (sends|receives): +Sent (\d+) bytes", line)
        if m:
            c[(int(m[1]), m[2])] = int(m[3])
    return c
print(f"S = {S} bytes; a bandwidth-optimal all-reduce moves 2(h-1)/h S = {2*(h-1)/h:.3f} S over each host link "
      f"each way (h = {h} hosts); a flat ring over n = {n} ranks moves 2(n-1)/n S = {2*(n-1)/n:.3f} S per ring hop.")
print()
print("| placement | algorithm | sent per host link (mean, min-max) / S | received per host link / S |")
print("|---|---|---:|---:|")
for p in ("block", "cyclic"):
    for a in ("hierarchical", "ring"):
        lo, hi = counters(f"{out}/bytes-{p}-{a}-2.txt"), counters(f"{out}/bytes-{p}-{a}-6.txt")
        cells = []
        for d in ("sends", "receives"):
            v = [(hi[(i, d)] - lo[(i, d)]) / 8 / S for i in range(hosts)]
            cells.append(f"{sum(v) / len(v):.3f} ({min(v):.3f}-{max(v):.3f})")
        print(f"| {p} | {a} | {cells[0]} | {cells[1]} |")
PY
fi

if [[ " $PARTS " == *" cyclic "* ]]; then
  echo; echo "## busbw, $HOSTS x $PER_HOST placed cyclically (rank r on host r % $HOSTS), all links $RATE (in-place, medians of $ROUNDS)"
  sweep cyclic "--placement cyclic"
fi

if [[ " $PARTS " == *" slow "* ]]; then
  echo; echo "## busbw with host $SLOW_HOST's link at $half (the others $RATE; in-place, medians of $ROUNDS)"
  sweep slow "--host-rate $SLOW_HOST=$half"
fi
