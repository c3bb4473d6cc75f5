#!/usr/bin/env bash
# TLS against plaintext (COMM_TLS, issue 28): a SIZE all-reduce with COMM_TLS=0 and COMM_TLS=1
# alternating round by round, so both see the same load; per round the in-place busbw, the CPU
# seconds of every rank (user + system) and the load average; then medians, the ratio TLS /
# plaintext and the CPU that TLS adds per byte a rank sends.
#   sudo bench/tls_compare.sh                  # MODE=netsim HOSTS=4 RATE=2gbit ROUNDS=5 SIZE=64M
#   MODE=local bench/tls_compare.sh            # 2 ranks on this host over sockets (comm-run)
#   sudo BUSY=2 bench/tls_compare.sh           # the same with 2 busy loops running
# COMM_AUTH_TOKEN is set (the PSK comes from it) unless already set. Logs go to OUT.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=$(cd "${BUILD_DIR:-$ROOT/build}" && pwd)
MODE=${MODE:-netsim} HOSTS=${HOSTS:-4} RATE=${RATE:-2gbit} ROUNDS=${ROUNDS:-5} SIZE=${SIZE:-64M}
ITERS=${ITERS:-5} WARMUP=${WARMUP:-2} BUSY=${BUSY:-0}
OUT=${OUT:-$ROOT/bench/results/tls-$MODE-$(date +%Y%m%d-%H%M%S)}
export COMM_AUTH_TOKEN=${COMM_AUTH_TOKEN:-tls-bench-token}
mkdir -p "$OUT"
if [[ $MODE == netsim ]]; then
  ((EUID == 0)) || { echo "tls_compare.sh: MODE=netsim needs root (network namespaces)" >&2; exit 2; }
  ranks=$HOSTS
else
  ranks=2
fi

busy_pids=()
stop_busy() { ((${#busy_pids[@]} == 0)) || kill "${busy_pids[@]}" 2>/dev/null || true; }
trap stop_busy EXIT
for ((i = 0; i < BUSY; i++)); do
  (while :; do :; done) &
  busy_pids+=($!)
done

bench=("$BUILD_DIR/bench/comm-bench" -b "$SIZE" -e "$SIZE" -n "$ITERS" -w "$WARMUP" -c 1)
# The whole machine's CPU (every core, /proc/stat): seconds busy (user, nice, system, irq, softirq,
# steal) and seconds elapsed, so a round says how many cores it kept busy, the kernel's network
# work (veth, bridge, tbf, TCP in softirq) and other jobs included, and so how much room was left.
machine_cpu() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6}' /proc/stat; }
run_one() {  # $1: COMM_TLS; prints "busbw cpu_seconds time_us cores_busy"
  local log="$OUT/round$2-tls$1.txt"
  local busy0 idle0 busy1 idle1
  read -r busy0 idle0 < <(machine_cpu)
  if [[ $MODE == netsim ]]; then
    COMM_TLS=$1 /usr/bin/time -f "%U %S" -o "$log.time" \
      "$ROOT/tools/netsim/netsim" --hosts "$HOSTS" --rate "$RATE" -- "${bench[@]}" >"$log" 2>&1
  else
    COMM_TLS=$1 COMM_TRANSPORT=socket /usr/bin/time -f "%U %S" -o "$log.time" \
      "$BUILD_DIR/tools/comm-run/comm-run" -n 2 --quiet-prefix -- "${bench[@]}" >"$log" 2>&1
  fi
  read -r busy1 idle1 < <(machine_cpu)
  local busbw wrong time_us
  busbw=$(awk '$1 ~ /^[0-9]+$/ && NF >= 13 {v = $12} END {print v}' "$log")
  # The in-place time (microseconds, more digits than busbw's two decimals): the ratios use it.
  time_us=$(awk '$1 ~ /^[0-9]+$/ && NF >= 13 {v = $10} END {print v}' "$log")
  wrong=$(awk '$1 ~ /^[0-9]+$/ && NF >= 13 {w += $9 + $13} END {print w + 0}' "$log")
  [[ -n $busbw && $wrong == 0 ]] || { echo "tls_compare.sh: round $2 COMM_TLS=$1 failed, see $log" >&2; exit 1; }
  echo "$busbw $(awk '{print $1 + $2}' "$log.time") $time_us $(awk -v b=$((busy1 - busy0)) -v i=$((idle1 - idle0)) 'BEGIN {printf "%.2f", (b + i) ? b / (b + i) * '"$(nproc)"' : 0}')"
}

echo "# $MODE, $ranks ranks$([[ $MODE == netsim ]] && echo ", $RATE links"), $SIZE all-reduce, -n $ITERS -w $WARMUP, $BUSY busy loops, commit $(git -C "$ROOT" rev-parse --short HEAD)" | tee "$OUT/summary.txt"
echo "# round  COMM_TLS  busbw(GB/s)  cpu(s)  load(1 min)  time(us)  cores busy (of $(nproc))" | tee -a "$OUT/summary.txt"
for ((r = 1; r <= ROUNDS; r++)); do
  # Which goes first alternates too, so neither always runs right after the other.
  order=(0 1)
  ((r % 2 == 0)) && order=(1 0)
  for tls in "${order[@]}"; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    read -r busbw cpu time_us cores < <(run_one "$tls" "$r")
    printf '  %5d  %8d  %11s  %6s  %11s  %8s  %s\n' "$r" "$tls" "$busbw" "$cpu" "$load" "$time_us" "$cores" | tee -a "$OUT/summary.txt"
  done
done

python3 - "$OUT/summary.txt" "$SIZE" "$ranks" "$ITERS" "$WARMUP" <<'PY' | tee -a "$OUT/summary.txt"
import statistics, sys
path, size, ranks, iters, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
nbytes = int(size[:-1]) * mult[size[-1]] if size[-1] in mult else int(size)
rows = [l.split() for l in open(path) if l.startswith("  ")]
by = {t: [r for r in rows if r[1] == t] for t in ("0", "1")}
bw = {t: statistics.median(float(r[2]) for r in by[t]) for t in by}
cpu = {t: statistics.median(float(r[3]) for r in by[t]) for t in by}
# Per round, plaintext's time over TLS's (= the busbw ratio, from the time's extra digits).
ratios = [float(a[5]) / float(b[5]) for a, b in zip(by["0"], by["1"])]
cores = {t: statistics.median(float(r[6]) for r in by[t]) for t in by}
# Bytes every rank sends in one run: a ring all-reduce sends 2 (n-1)/n of the buffer per call;
# comm-bench runs warm-up and timed calls out of place and in place.
sent = ranks * 2 * (ranks - 1) / ranks * nbytes * 2 * (iters + warmup)
print(f"# median busbw: plaintext {bw['0']:.2f} GB/s, TLS {bw['1']:.2f} GB/s, TLS / plaintext (times) {statistics.median(ratios):.3f} "
      f"(per round: {', '.join(f'{x:.3f}' for x in ratios)})")
print(f"# median CPU of all ranks: plaintext {cpu['0']:.2f} s, TLS {cpu['1']:.2f} s; TLS adds "
      f"{(cpu['1'] - cpu['0']) / sent * 1e9:.2f} ns per byte sent ({sent / 2**30:.1f} GiB sent per run)")
print(f"# machine cores busy (median, every process and the kernel): plaintext {cores['0']:.2f}, TLS {cores['1']:.2f}")
PY
