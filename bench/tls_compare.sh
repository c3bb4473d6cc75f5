#!/usr/bin/env bash
# TLS against plaintext (COMM_TLS, issues 28 and 33): a SIZE all-reduce in several arms, the arms
# alternating round by round (their order rotating) so that all see the same load; per round the
# in-place busbw, the CPU seconds of every rank (user + system), the load average and the machine's
# busy cores; then per arm the medians, its ratio to plaintext and the CPU it adds per byte sent.
# The arms: plaintext (COMM_TLS=0), tls (COMM_TLS=1, the process's AES-GCM: ipsec-mb where it has a
# VAES path), tls-openssl (COMM_TLS_CIPHER=openssl), and with BASELINE_BUILD_DIR another build's
# TLS (tls-baseline: e.g. the commit before a change, built in a worktree).
#   sudo bench/tls_compare.sh                  # MODE=netsim HOSTS=4 RATE=2gbit ROUNDS=5 SIZE=64M
#   MODE=local bench/tls_compare.sh            # 2 ranks on this host over sockets (comm-run)
#   sudo BUSY=2 bench/tls_compare.sh           # the same with 2 busy loops running
#   sudo BASELINE_BUILD_DIR=/work/wt-base/build bench/tls_compare.sh
# COMM_AUTH_TOKEN is set (the PSK comes from it) unless already set. Logs go to OUT.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=$(cd "${BUILD_DIR:-$ROOT/build}" && pwd)
MODE=${MODE:-netsim} HOSTS=${HOSTS:-4} RATE=${RATE:-2gbit} ROUNDS=${ROUNDS:-5} SIZE=${SIZE:-64M}
ITERS=${ITERS:-5} WARMUP=${WARMUP:-2} BUSY=${BUSY:-0} BASELINE_BUILD_DIR=${BASELINE_BUILD_DIR:-}
OUT=${OUT:-$ROOT/bench/results/tls-$MODE-$(date +%Y%m%d-%H%M%S)}
export COMM_AUTH_TOKEN=${COMM_AUTH_TOKEN:-tls-bench-token}
mkdir -p "$OUT"
if [[ $MODE == netsim ]]; then
  ((EUID == 0)) || { echo "tls_compare.sh: MODE=netsim needs root (network namespaces)" >&2; exit 2; }
  ranks=$HOSTS
else
  ranks=2
fi
# arm name -> "COMM_TLS build-dir COMM_TLS_CIPHER"
declare -A arm_spec=([plaintext]="0 $BUILD_DIR auto" [tls]="1 $BUILD_DIR auto" [tls-openssl]="1 $BUILD_DIR openssl")
arms=(plaintext tls tls-openssl)
if [[ -n $BASELINE_BUILD_DIR ]]; then
  arm_spec[tls-baseline]="1 $(cd "$BASELINE_BUILD_DIR" && pwd) auto"
  arms+=(tls-baseline)
fi

busy_pids=()
stop_busy() { ((${#busy_pids[@]} == 0)) || kill "${busy_pids[@]}" 2>/dev/null || true; }
trap stop_busy EXIT
for ((i = 0; i < BUSY; i++)); do
  (while :; do :; done) &
  busy_pids+=($!)
done

bench_args=(-b "$SIZE" -e "$SIZE" -n "$ITERS" -w "$WARMUP" -c 1)
# The whole machine's CPU (every core, /proc/stat): seconds busy (user, nice, system, irq, softirq,
# steal) and seconds elapsed, so a round says how many cores it kept busy, the kernel's network
# work (veth, bridge, tbf, TCP in softirq) and other jobs included, and so how much room was left.
machine_cpu() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6}' /proc/stat; }
run_one() {  # $1: arm, $2: round; prints "busbw cpu_seconds time_us cores_busy"
  local tls dir cipher
  read -r tls dir cipher <<<"${arm_spec[$1]}"
  local log="$OUT/round$2-$1.txt"
  local busy0 idle0 busy1 idle1
  read -r busy0 idle0 < <(machine_cpu)
  if [[ $MODE == netsim ]]; then
    COMM_TLS=$tls COMM_TLS_CIPHER=$cipher /usr/bin/time -f "%U %S" -o "$log.time" \
      "$ROOT/tools/netsim/netsim" --hosts "$HOSTS" --rate "$RATE" -- "$dir/bench/comm-bench" "${bench_args[@]}" >"$log" 2>&1
  else
    COMM_TLS=$tls COMM_TLS_CIPHER=$cipher COMM_TRANSPORT=socket /usr/bin/time -f "%U %S" -o "$log.time" \
      "$dir/tools/comm-run/comm-run" -n 2 --quiet-prefix -- "$dir/bench/comm-bench" "${bench_args[@]}" >"$log" 2>&1
  fi
  read -r busy1 idle1 < <(machine_cpu)
  local busbw wrong time_us
  busbw=$(awk '$1 ~ /^[0-9]+$/ && NF >= 13 {v = $12} END {print v}' "$log")
  # The in-place time (microseconds, more digits than busbw's two decimals): the ratios use it.
  time_us=$(awk '$1 ~ /^[0-9]+$/ && NF >= 13 {v = $10} END {print v}' "$log")
  wrong=$(awk '$1 ~ /^[0-9]+$/ && NF >= 13 {w += $9 + $13} END {print w + 0}' "$log")
  [[ -n $busbw && $wrong == 0 ]] || { echo "tls_compare.sh: round $2 arm $1 failed, see $log" >&2; exit 1; }
  echo "$busbw $(awk '{print $1 + $2}' "$log.time") $time_us $(awk -v b=$((busy1 - busy0)) -v i=$((idle1 - idle0)) 'BEGIN {printf "%.2f", (b + i) ? b / (b + i) * '"$(nproc)"' : 0}')"
}

echo "# $MODE, $ranks ranks$([[ $MODE == netsim ]] && echo ", $RATE links"), $SIZE all-reduce, -n $ITERS -w $WARMUP, $BUSY busy loops, commit $(git -C "$ROOT" rev-parse --short HEAD)$([[ -n $BASELINE_BUILD_DIR ]] && echo ", baseline $BASELINE_BUILD_DIR ($(git -C "$BASELINE_BUILD_DIR/.." rev-parse --short HEAD 2>/dev/null || echo '?'))")" | tee "$OUT/summary.txt"
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); AVX-512: $(grep -qw avx512f /proc/cpuinfo && echo yes || echo no), VAES: $(grep -qw vaes /proc/cpuinfo && echo yes || echo no)" | tee -a "$OUT/summary.txt"
echo "# round  arm           busbw(GB/s)  cpu(s)  load(1 min)  time(us)  cores busy (of $(nproc))" | tee -a "$OUT/summary.txt"
for ((r = 1; r <= ROUNDS; r++)); do
  # The arms' order rotates, so none always runs right after another.
  for ((k = 0; k < ${#arms[@]}; k++)); do
    arm=${arms[$(((k + r) % ${#arms[@]}))]}
    load=$(cut -d' ' -f1 /proc/loadavg)
    read -r busbw cpu time_us cores < <(run_one "$arm" "$r")
    printf '  %5d  %-12s  %11s  %6s  %11s  %8s  %s\n' "$r" "$arm" "$busbw" "$cpu" "$load" "$time_us" "$cores" | tee -a "$OUT/summary.txt"
  done
done

python3 - "$OUT/summary.txt" "$SIZE" "$ranks" "$ITERS" "$WARMUP" <<'PY' | tee -a "$OUT/summary.txt"
import statistics, sys
path, size, ranks, iters, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
nbytes = int(size[:-1]) * mult[size[-1]] if size[-1] in mult else int(size)
rows = [l.split() for l in open(path) if l.startswith("  ")]
arms = list(dict.fromkeys(r[1] for r in rows))
by = {a: {int(r[0]): r for r in rows if r[1] == a} for a in arms}
# Bytes every rank sends in one run: a ring all-reduce sends 2 (n-1)/n of the buffer per call;
# comm-bench runs warm-up and timed calls out of place and in place.
sent = ranks * 2 * (ranks - 1) / ranks * nbytes * 2 * (iters + warmup)
plain = by["plaintext"]
cpu0 = statistics.median(float(r[3]) for r in plain.values())
print(f"# per arm, medians; 'of plaintext' is plaintext's in-place time over the arm's, per round ({sent / 2**30:.1f} GiB sent per run)")
for a in arms:
    bw = statistics.median(float(r[2]) for r in by[a].values())
    cpu = statistics.median(float(r[3]) for r in by[a].values())
    cores = statistics.median(float(r[6]) for r in by[a].values())
    ratios = [float(plain[k][5]) / float(by[a][k][5]) for k in sorted(by[a]) if k in plain]
    line = f"# {a:12s} busbw {bw:.3f} GB/s, cores busy {cores:.2f}, CPU {cpu:.2f} s"
    if a != "plaintext":
        line += (f", of plaintext {statistics.median(ratios):.3f} (per round: {', '.join(f'{x:.3f}' for x in ratios)}),"
                 f" adds {(cpu - cpu0) / sent * 1e9:.2f} ns per byte sent")
    print(line)
PY
