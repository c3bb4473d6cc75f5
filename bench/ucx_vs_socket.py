#!/usr/bin/env python3
"""UCX against libcomm's own socket transport: all-reduce, the same sizes and ranks, one run.

  bench/ucx_vs_socket.py                               # loopback, then netsim hosts if root
  sudo bench/ucx_vs_socket.py --rounds 5 --hosts 2 --rate 2gbit -- -b 8 -e 16M -f 8 -n 20 -w 5

Each round runs every variant once, in turn (socket, then UCX over TCP, then UCX with its own
choice of wires), so slow drifts of a shared machine hit all of them alike; the summary is the
median time and busbw per size over the rounds, and UCX's ratio to the socket transport.
  loopback: ranks on this host (comm-run), all over 127.0.0.1: COMM_TRANSPORT=socket against
            COMM_TRANSPORT=ucx with UCX_TLS=tcp on lo (same wire), and UCX's default choice
            (shared memory and cma between local ranks) for reference.
  netsim:   one rank per simulated host (tools/netsim: network namespaces, tbf-shaped links of
            --rate), COMM_TRANSPORT=socket against COMM_TRANSPORT=ucx with UCX_TLS=tcp on eth0.
            Needs root; skipped otherwise (or with --no-netsim).
Logs and JSON of every run go to --out. A benchmark, not a test: CI does not run it.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402


def variants(setting):
    if setting == "loopback":
        return [("socket", {"COMM_TRANSPORT": "socket"}),
                ("ucx tcp", {"COMM_TRANSPORT": "ucx", "UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo"}),
                ("ucx shm/cma", {"COMM_TRANSPORT": "ucx"})]
    return [("socket", {"COMM_TRANSPORT": "socket"}),
            ("ucx tcp", {"COMM_TRANSPORT": "ucx", "UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "eth0"})]


def command(args, build, setting, json_path, label):
    bench = [os.path.join(build, "bench", "comm-bench"), *args.bench_args, "--json", json_path, "--label", label]
    if setting == "netsim":
        return benchlib.netsim(["--hosts", str(args.hosts), "--rate", args.rate], bench)
    return benchlib.comm_run(build, args.np, bench)


def run_setting(args, build, setting, out_dir):
    runs = variants(setting)
    data = {}  # name -> size -> {"time": [...], "busbw": [...]}
    for rnd in range(1, args.rounds + 1):
        for name, extra_env in runs:
            stem = benchlib.stem(out_dir, setting, name, f"round{rnd}")
            cmd = command(args, build, setting, stem + ".json", name)
            env = dict(os.environ, UCX_MEM_EVENTS="no", **extra_env)
            if "UCX_TLS" not in extra_env:
                env.pop("UCX_TLS", None)
                env.pop("UCX_NET_DEVICES", None)
            benchlib.announce(f"# {setting} round {rnd}/{args.rounds}: {name}: "
                              f"{' '.join(f'{k}={v}' for k, v in extra_env.items())} {' '.join(cmd)}")
            _, rows = benchlib.run("ucx_vs_socket.py", f"{setting} {name}", cmd, stem, env)
            benchlib.add_samples(data, name, rows, "in_place", {"time": "time_us", "busbw": "busbw"})
    names = [n for n, _ in runs]
    sizes = sorted(data["socket"])
    med = benchlib.medians(data)
    where = (f"{args.np} ranks on this host" if setting == "loopback"
             else f"{args.hosts} netsim hosts, {args.rate} tbf links")
    print(f"\n## all-reduce, {where}: in place, median of {args.rounds} alternating rounds")
    head = "".join(f"{n + ' us':>15}" for n in names) + "".join(f"{n + ' GB/s':>17}" for n in names)
    ratios = [n for n in names if n != "socket"]
    print(f"#{'size (B)':>11}" + head + "".join(f"{'socket/' + n + ' time':>24}" for n in ratios))
    summary = []
    for s in sizes:
        line = f"{s:>12}"
        line += "".join(f"{med[n][s]['time']:>15.1f}" for n in names)
        line += "".join(f"{med[n][s]['busbw']:>17.4f}" for n in names)
        entry = {"size": s, "median": {n: med[n][s] for n in names}, "speedup_over_socket": {}}
        for n in ratios:
            r = med["socket"][s]["time"] / med[n][s]["time"] if med[n][s]["time"] else float("nan")
            entry["speedup_over_socket"][n] = r
            line += f"{r:>24.3f}"
        summary.append(entry)
        print(line)
    print("# socket/ucx time > 1: UCX is faster at that size")
    return {"setting": setting, "where": where, "sizes": summary}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", type=int, default=2, help="ranks on loopback")
    ap.add_argument("--hosts", type=int, default=2, help="netsim hosts (one rank each)")
    ap.add_argument("--rate", default="2gbit", help="netsim link rate per direction (tc syntax)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-netsim", action="store_true")
    benchlib.add_build_arg(ap)
    ap.add_argument("--out", default=None, help="folder for logs and JSON (default bench/results/ucx-<time>)")
    ap.add_argument("bench_args", nargs="*", help="comm-bench arguments, after -- (default -b 8 -e 16M -f 8 -n 20 -w 5)")
    args = ap.parse_args(argv)
    if not args.bench_args:
        args.bench_args = ["-b", "8", "-e", "16M", "-f", "8", "-n", "20", "-w", "5"]
    build = os.path.abspath(args.build)
    out_dir = benchlib.results_dir(args.out, "ucx")
    settings = ["loopback"]
    if not args.no_netsim:
        if os.geteuid() == 0:
            settings.append("netsim")
        else:
            print("# netsim skipped: needs root (network namespaces)", file=sys.stderr)
    results = [run_setting(args, build, s, out_dir) for s in settings]
    benchlib.write_summary(out_dir, {"bench_args": args.bench_args, "rounds": args.rounds, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
