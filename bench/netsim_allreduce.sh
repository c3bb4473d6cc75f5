#!/usr/bin/env bash
# The README's multi-host measurement, on simulated hosts: all-reduce on HOSTS netsim hosts with
# RATE links; libcomm beside each Gloo algorithm (ROUNDS alternating rounds, medians), the TCP
# goodput of one link (iperf3, ROUNDS times, median), and a busbw plot over sizes.
#   sudo bench/netsim_allreduce.sh            # BUILD_DIR=build HOSTS=4 RATE=2gbit ROUNDS=3 SIZE=64M
#   sudo BUSY=2 bench/netsim_allreduce.sh     # the same while BUSY busy loops keep the cores busy (a
#                                             # trainer computing); iperf3 is measured unloaded
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
echo "==> all-reduce $SIZE on $HOSTS hosts: libcomm and Gloo, $ROUNDS alternating rounds${BUSY:+ ($BUSY busy loops)}"
python3 "$ROOT/bench/compare.py" --build "$BUILD_DIR" --netsim "--hosts $HOSTS --rate $RATE" --peers gloo \
  --rounds "$ROUNDS" --out "$OUT/compare" -- -b "$SIZE" -e "$SIZE" -n 5 -w 2 -c 1 | tee "$OUT/compare.txt"
python3 - "$OUT/compare/summary.json" "$goodput" <<'PY' | tee -a "$OUT/compare.txt"
import json, sys
summary, goodput = json.load(open(sys.argv[1])), float(sys.argv[2])
for e in summary["sizes"]:
    lib = e["busbw"]["libcomm"]
    print(f"# {e['size']} B: libcomm {lib:.4f} GB/s = {lib / goodput * 100:.1f}% of iperf3's {goodput:.4f} GB/s; "
          f"{e['ratio']['best gloo']:.3f} x the best Gloo algorithm")
PY

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
