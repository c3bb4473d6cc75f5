#!/usr/bin/env python3
"""Intra-node all-reduce: libcomm against Open MPI and Gloo on this machine (issue 3's benchmark).

  bench/compare_allreduce.py                      # 2 ranks, fp32 sum, 8 B .. 256 MiB, 3 rounds
  bench/compare_allreduce.py --np 4 --max 64M     # more ranks than cores: MPI with --oversubscribe

Every round runs, one after the other so that a shared machine's drifts hit all alike:
  copy-bandwidth     B = read+write bandwidth one core gets while the other cores copy too
  libcomm            comm-bench (comm-run, pinned rank i -> CPU i), ordinary buffers (-R 0)
  libcomm -R 1       comm-bench on comm_mem_alloc buffers (shared memory peers read in place)
  mpi                comm-bench-mpi under mpirun --bind-to core (rank i -> core i), as installed
  mpi malloc         the same with glibc's mmap threshold off (-x MALLOC_MMAP_MAX_=0
                     -x MALLOC_TRIM_THRESHOLD_=68719476736): no fresh 64 MiB temporary per call
  gloo ALGO          comm-bench-gloo (TCP loopback, comm-run), for each Gloo algorithm
All blocking calls (-z 1), time = max over ranks of the mean of -n iterations. Per size the
summary takes the median over rounds; Open MPI counts at its best (the faster of its two
variants at each size), Gloo at its best algorithm. Ratios > 1: libcomm is faster.
Limits: ordinary buffers must move >= 3.5x the buffer per rank (B / 3.5), comm_mem_alloc
buffers 2.5x (B / 2.5); the targets are checked at the end. Logs and JSON go to --out.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "68719476736"}


def variants(args, build):
    bench = os.path.join(build, "bench")
    mpi = ["mpirun", "--allow-run-as-root", "-np", str(args.np), "--bind-to", "core", "--map-by", "core"]
    if args.np > (os.cpu_count() or 1):
        mpi += ["--oversubscribe", "--bind-to", "none"]
    out = [("libcomm", benchlib.comm_run(build, args.np, [os.path.join(bench, "comm-bench"), "-R", "0"]), {}),
           ("libcomm -R 1", benchlib.comm_run(build, args.np, [os.path.join(bench, "comm-bench"), "-R", "1"]), {})]
    if "mpi" in args.peers:
        prog = os.path.join(bench, "comm-bench-mpi")
        out.append(("mpi", mpi + [prog], {}))
        malloc = []
        for k, v in MALLOC_ENV.items():
            malloc += ["-x", f"{k}={v}"]
        out.append(("mpi malloc", mpi + malloc + [prog], {}))
    if "gloo" in args.peers:
        for algo in args.gloo_algos.split(","):
            out.append((f"gloo {algo}", benchlib.comm_run(build, args.np, [os.path.join(bench, "comm-bench-gloo"),
                                                                             "--algo", algo]), {}))
    for name, cmd, _ in out:
        prog = next(c for c in cmd if c.startswith(bench))
        benchlib.require_built("compare_allreduce.py", name, prog, "openmpi-bin libopenmpi-dev libgloo-dev")
    return out


def size_of(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.upper().rstrip("B")
    return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)


def prefix(args):
    return ["chrt", "-f", "1"] if args.priority == "rt" else []


def copy_bandwidth(args, build):
    prog = os.path.join(build, "bench", "copy-bandwidth")
    done = subprocess.run(prefix(args) + [prog, "-n", str(min(args.np, os.cpu_count() or 1)), "-t", "2"],
                          stdout=subprocess.PIPE, text=True, check=True)
    m = re.search(r"^B (\S+) GB/s", done.stdout, re.M)
    return float(m.group(1)), done.stdout


def table(rows, names, place, args, B):
    """Prints one placement's table; returns its per-size entries."""
    med = benchlib.medians({n: rows[n] for n in names})
    gloo = [n for n in names if n.startswith("gloo")]
    mpi = [n for n in names if n.startswith("mpi")]

    def best(group, s, key):
        vals = [med[n][s][key] for n in group if s in med[n]]
        if not vals:
            return float("nan")
        return max(vals) if key == "busbw" else min(vals)

    head = ["libcomm", "libcomm -R 1"] + (["mpi best"] if mpi else []) + (["gloo best"] if gloo else [])
    print(f"# {place.replace('_', ' ')}: time (us) and busbw (GB/s); x = the peer's time / libcomm's (> 1: libcomm "
          "is faster)")
    print("#" + f"{'size (B)':>11}" + "".join(f"{h + ' us':>17}" for h in head) +
          "".join(f"{h + ' GB/s':>19}" for h in head) +
          (f"{'x mpi':>8}{'-R1 x mpi':>11}" if mpi else "") + (f"{'x gloo':>8}" if gloo else ""))
    out = []
    for s in sorted(med["libcomm"]):
        t = {h: med[h][s]["time_us"] for h in ("libcomm", "libcomm -R 1")}
        bw = {h: med[h][s]["busbw"] for h in ("libcomm", "libcomm -R 1")}
        if mpi:
            t["mpi best"], bw["mpi best"] = best(mpi, s, "time_us"), best(mpi, s, "busbw")
        if gloo:
            t["gloo best"], bw["gloo best"] = best(gloo, s, "time_us"), best(gloo, s, "busbw")
        line = f"{s:>12}" + "".join(f"{t[h]:>17.2f}" for h in head) + "".join(f"{bw[h]:>19.3f}" for h in head)
        entry = {"size": s, "time_us": t, "busbw": bw, "variants": {n: med[n].get(s) for n in names}}
        if mpi:
            entry["x_mpi"] = t["mpi best"] / t["libcomm"]
            entry["x_mpi_R1"] = t["mpi best"] / t["libcomm -R 1"]
            line += f"{entry['x_mpi']:>8.2f}{entry['x_mpi_R1']:>11.2f}"
        if gloo:
            entry["x_gloo"] = t["gloo best"] / t["libcomm"]
            line += f"{entry['x_gloo']:>8.2f}"
        out.append(entry)
        print(line)
    return out


def targets(entries, B):
    """(what, value, goal) for each of issue 3's targets this run covers."""
    def at(size):
        return next((e for e in entries if e["size"] == size), None)

    checks = []
    e64, e16 = at(64 << 20), at(16 << 20)
    if e64:
        checks.append(("ordinary buffers >= 80% of B/3.5 at 64 MiB", e64["busbw"]["libcomm"] / (B / 3.5), 0.8))
        checks.append(("comm_mem_alloc buffers >= 80% of B/2.5 at 64 MiB", e64["busbw"]["libcomm -R 1"] / (B / 2.5),
                       0.8))
    for e, what in ((e16, "16 MiB"), (e64, "64 MiB")):
        if e and "x_mpi" in e:
            checks.append((f"ordinary buffers >= 1.3x Open MPI's busbw at {what}", e["x_mpi"], 1.3))
    if e64 and "x_mpi" in e64:
        checks.append(("comm_mem_alloc buffers >= 2x Open MPI at 64 MiB", e64["x_mpi_R1"], 2.0))
    small = [e for e in entries if e["size"] <= 4096 and "x_mpi" in e]
    if small:
        worst = min(small, key=lambda e: e["x_mpi"])
        checks.append((f"time <= Open MPI's from {small[0]['size']} B to 4 KiB (worst: {worst['size']} B)",
                       worst["x_mpi"], 1.0))
    return checks


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--min", default="8")
    ap.add_argument("--max", default="256M")
    ap.add_argument("--factor", default="2")
    ap.add_argument("--iters", default="20", help="iterations per size above --split")
    ap.add_argument("--small-iters", default="1000", help="iterations per size up to --split (latency-bound: the "
                    "mean of many calls is what a shared machine lets one measure)")
    ap.add_argument("--split", default="64K")
    ap.add_argument("--warmup", default="5")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--small-rounds", type=int, default=9,
                    help="rounds for sizes up to --split (at least --rounds): a run of either library lands in "
                         "a fast or a slow mode (vCPU placement, ~0.25 vs ~0.35 us here), so the median of 3 "
                         "is a coin toss; small runs take a second each")
    ap.add_argument("--small-warmup", default="200", help="warm-up calls per size up to --split")
    ap.add_argument("--peers", default="mpi,gloo")
    ap.add_argument("--gloo-algos", default="ring,ring_chunked,halving_doubling")
    ap.add_argument("--place", choices=["in_place", "out_of_place"], default="out_of_place",
                    help="which half of the table to compare (Gloo is in place only: its out-of-place time "
                         "includes a copy)")
    ap.add_argument("--priority", choices=["none", "rt"], default="none",
                    help="rt: every run (every library alike) under chrt -f 1, so that other jobs on a shared "
                         "machine cannot preempt it; use short runs, it holds the cores while it runs")
    ap.add_argument("--pause", type=float, default=0, help="seconds to sleep between runs (leave the machine to others)")
    benchlib.add_build_arg(ap)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    build = os.path.abspath(args.build)
    out_dir = benchlib.results_dir(args.out, "allreduce")
    common = ["-f", args.factor, "-z", "1", "-d", "float", "-o", "sum"]
    split = size_of(args.split)
    ranges = []  # (label, comm-bench arguments)
    if size_of(args.min) <= split:
        ranges.append(("small", ["-b", args.min, "-e", str(min(split, size_of(args.max))), "-n", args.small_iters,
                                 "-w", args.small_warmup]))
    first_large = size_of(args.min)
    while first_large <= split:
        first_large *= int(args.factor)
    if first_large <= size_of(args.max):
        ranges.append(("large", ["-b", str(first_large), "-e", args.max, "-n", args.iters, "-w", args.warmup]))
    bench_args = common
    total_rounds = max(args.rounds, args.small_rounds if ranges and ranges[0][0] == "small" else 0)

    runs = variants(args, build)
    names = [n for n, _, _ in runs]
    rows = {}  # placement -> name -> size -> {"time_us": [...], "busbw": [...]}
    limits = []
    for rnd in range(1, total_rounds + 1):
        # Rounds beyond --rounds repeat only the small sizes (see --small-rounds).
        these = ranges if rnd <= args.rounds else [r for r in ranges if r[0] == "small"]
        if rnd <= args.rounds:
            b, text = copy_bandwidth(args, build)
            limits.append(b)
            with open(os.path.join(out_dir, f"copy-bandwidth.round{rnd}.log"), "w") as f:
                f.write(text)
        for (name, cmd, env), (part, sizes) in ((r, p) for r in runs for p in these):
            stem = benchlib.stem(out_dir, name, part, f"round{rnd}")
            time.sleep(args.pause)
            full = prefix(args) + cmd + sizes + bench_args + ["--json", stem + ".json", "--label", name]
            benchlib.announce(f"# round {rnd}/{total_rounds}: {name}: {' '.join(full)}")
            _, json_rows = benchlib.run("compare_allreduce.py", name, full, stem, dict(os.environ, **env))
            for place in ("out_of_place", "in_place"):
                benchlib.add_samples(rows.setdefault(place, {}), name, json_rows, place,
                                     {"time_us": "time_us", "busbw": "busbw"})

    B = statistics.median(limits)
    summary = {"np": args.np, "rounds": args.rounds, "small_rounds": total_rounds, "priority": args.priority, "B": B, "B_rounds": limits,
               "command": sys.argv, "bench_args": bench_args, "names": names}
    print(f"# all-reduce float32 sum, {args.np} ranks, blocking calls; median of {args.rounds} alternating rounds"
          + (f" ({total_rounds} up to {args.split})" if total_rounds > args.rounds else "")
          + (", every run under chrt -f 1" if args.priority == "rt" else ""))
    print(f"# B (read+write GB/s per core, all cores copying) = {B:.2f} (rounds: "
          + ", ".join(f"{x:.2f}" for x in limits) + f"); B/3.5 = {B / 3.5:.2f}, B/2.5 = {B / 2.5:.2f} GB/s")
    for place in ("out_of_place", "in_place"):
        summary[place] = table(rows[place], names, place, args, B)
    checks = targets(summary[args.place], B)
    summary["targets_place"] = args.place
    summary["targets"] = []
    print(f"# targets (issue 3), {args.place.replace('_', ' ')}:")
    for what, value, goal in checks:
        ok = value >= goal
        summary["targets"].append({"target": what, "value": value, "met": ok})
        print(f"#   {'met    ' if ok else 'MISSED '} {what}: {value:.2f}" + (" of the limit" if "%" in what else "x"))
    benchlib.write_summary(out_dir, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
