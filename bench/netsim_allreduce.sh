#!/usr/bin/env bash
# The README's multi-host measurement, on simulated hosts: all-reduce on HOSTS netsim hosts with
# RATE links; libcomm beside each Gloo algorithm (ROUNDS alternating rounds, medians), the TCP
# goodput of one link (iperf3, ROUNDS times, median), and a busbw plot over sizes.
#   sudo bench/netsim_allreduce.sh            # BUILD_DIR=build HOSTS=4 RATE=2gbit ROUNDS=3 SIZE=64M
#   sudo BUSY=2 bench/netsim_allreduce.sh     # the same while BUSY busy loops keep the cores busy (a
#                                             # trainer computing); iperf3 of one link is measured
#                                             # unloaded, an iperf3 ring (bench/iperf_ring.sh) loaded
# SWEEP=0 leaves out the sweep over sizes and its plot.
# Results (logs, JSON, summary, plot) go to OUT (default bench/results/netsim-<time>).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=$(cd "${BUILD_DIR:-$ROOT/build}" && pwd)
HOSTS=${HOSTS:-4} RATE=${RATE:-2gbit} ROUNDS=${ROUNDS:-3} SIZE=${SIZE:-64M}
OUT=${OUT:-$ROOT/bench/results/netsim-$(date +%Y%m%d-%H%M%S)}
netsim="$ROOT/tools/netsim/netsim"
mkdir -p "$OUT"

((EUID == 0)) || { echo "netsim_allreduce.sh: needs root (network namespaces)" >&2; exit 2; }
command -v iperf3 >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends iperf3
[[ -x $BUILD_DIR/bench/comm-bench-gloo ]] ||
  { echo "comm-bench-gloo is not built: apt-get install libgloo-dev, then meson setup --reconfigure $BUILD_DIR" >&2; exit 2; }

echo "==> iperf3 goodput of one $RATE link, $ROUNDS times"
goodputs=()
for ((r = 1; r <= ROUNDS; r++)); do
  line=$("$netsim" --hosts 2 --rate "$RATE" --iperf 10 2>/dev/null | tee -a "$OUT/iperf3.txt" | grep "goodput")
  echo "$line"
  goodputs+=("$(awk '{for (i = 1; i <= NF; i++) if ($i == "GB/s") print $(i - 1)}' <<<"$line")")
done
goodput=$(printf '%s\n' "${goodputs[@]}" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
echo "# iperf3 median goodput: $goodput GB/s" | tee -a "$OUT/iperf3.txt"

BUSY=${BUSY:-0}
busy_pids=()
stop_busy() { ((${#busy_pids[@]} == 0)) || kill "${busy_pids[@]}" 2>/dev/null || true; }
trap stop_busy EXIT
for ((i = 0; i < BUSY; i++)); do
  (while :; do :; done) &
  busy_pids+=($!)
done
# The ceiling under the same load: TCP alone in a ring (each host sends to the next), the traffic
# of a ring all-reduce, with the busy loops running. Both cores also carry the kernel's TCP,
# veth, bridge and tbf work, which the busy loops slow down too.
echo "==> iperf3 ring on $HOSTS hosts under the same load${BUSY:+ ($BUSY busy loops)}, $ROUNDS times"
ring_goodputs=()
for ((r = 1; r <= ROUNDS; r++)); do
  lines=$("$netsim" --hosts "$HOSTS" --rate "$RATE" -- "$ROOT/bench/iperf_ring.sh" 10 2>/dev/null | tee -a "$OUT/iperf3-ring.txt")
  # A ring moves at the pace of its slowest link.
  ring_goodputs+=("$(awk '/iperf3 ring/ {v = $(NF - 1); if (min == "" || v < min) min = v} END {print min}' <<<"$lines")")
  echo "# round $r: slowest link ${ring_goodputs[-1]} GB/s"
done
ring_goodput=$(printf '%s\n' "${ring_goodputs[@]}" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
echo "# iperf3 ring median (slowest link): $ring_goodput GB/s" | tee -a "$OUT/iperf3-ring.txt"

echo "==> all-reduce $SIZE on $HOSTS hosts: libcomm and Gloo, $ROUNDS alternating rounds${BUSY:+ ($BUSY busy loops)}"
python3 "$ROOT/bench/compare.py" --build "$BUILD_DIR" --netsim "--hosts $HOSTS --rate $RATE" --peers gloo \
  --rounds "$ROUNDS" --out "$OUT/compare" -- -b "$SIZE" -e "$SIZE" -n 5 -w 2 -c 1 | tee "$OUT/compare.txt"
python3 - "$OUT/compare/summary.json" "$goodput" "$ring_goodput" <<'PY' | tee -a "$OUT/compare.txt"
import json, sys
summary, goodput, ring = json.load(open(sys.argv[1])), float(sys.argv[2]), float(sys.argv[3])
for e in summary["sizes"]:
    lib = e["busbw"]["libcomm"]
    print(f"# {e['size']} B: libcomm {lib:.4f} GB/s = {lib / goodput * 100:.1f}% of iperf3's {goodput:.4f} GB/s; "
          f"{lib / ring * 100:.1f}% of the iperf3 ring's {ring:.4f} GB/s under the same load; "
          f"{e['ratio']['best gloo']:.3f} x the best Gloo algorithm")
PY

if [[ ${SWEEP:-1} == 0 ]]; then echo "==> results in $OUT (SWEEP=0: no sweep, no plot)"; exit 0; fi
echo "==> busbw over sizes (one run each) for the plot"
sweep=(-b 64K -e "$SIZE" -f 4 -n 5 -w 2 -c 1)
"$netsim" --hosts "$HOSTS" --rate "$RATE" -- "$BUILD_DIR/bench/comm-bench" "${sweep[@]}" \
  --json "$OUT/sweep-libcomm.json" --label "libcomm (socket)" | tee "$OUT/sweep-libcomm.log"
for algo in ring ring_chunked halving_doubling; do
  "$netsim" --hosts "$HOSTS" --rate "$RATE" -- "$BUILD_DIR/bench/comm-bench-gloo" --algo "$algo" "${sweep[@]}" \
    --json "$OUT/sweep-gloo-$algo.json" --label "gloo $algo" > "$OUT/sweep-gloo-$algo.log"
done
/usr/bin/python3 "$ROOT/bench/plot_busbw.py" "$OUT"/sweep-*.json --out "$OUT/busbw" \
  --limit "$goodput:iperf3 goodput ($RATE link)" \
  --title "all-reduce, $HOSTS netsim hosts, $RATE tbf links"
echo "==> results in $OUT"
