#!/usr/bin/env python3
"""libcomm beside its peers: the same sizes on the same ranks, run alternately, per-size ratios.

  bench/compare.py --np 2 --peers mpi,gloo -- -b 1K -e 64M -f 4
  bench/compare.py --peers "" --baseline /tmp/build-old -- -b 8 -e 64M -f 8 -z 1   # a change, before/after
  sudo bench/compare.py --netsim "--hosts 4 --rate 2gbit" --peers gloo --rounds 3 -- -b 64M -e 64M -n 5 -w 2

Every round runs libcomm (comm-bench), then each peer variant (comm-bench-gloo --algo A for each
Gloo algorithm, comm-bench-mpi), so that slow drifts of a shared machine hit all of them alike;
the summary is the median busbw per size over the rounds, and libcomm's ratio to each peer and
to the best Gloo algorithm (> 1: libcomm is faster). Logs and JSON of every run go to --out.
Ranks are local (comm-run; mpirun for MPI) or, with --netsim, one per simulated host.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
import nccl_log  # noqa: E402


def variants(args, build):
    out = [("libcomm", os.path.join(build, "bench", "comm-bench"), [])]
    for algo in filter(None, args.libcomm_algos.split(",")):
        out.append((f"libcomm {algo}", os.path.join(build, "bench", "comm-bench"), ["--algo", algo]))
    for peer in filter(None, args.peers.split(",")):
        if peer == "gloo":
            for algo in args.gloo_algos.split(","):
                out.append((f"gloo {algo}", os.path.join(build, "bench", "comm-bench-gloo"), ["--algo", algo]))
        elif peer == "mpi":
            out.append(("mpi", os.path.join(build, "bench", "comm-bench-mpi"), []))
        else:
            sys.exit(f"compare.py: unknown peer '{peer}' (mpi, gloo)")
    if args.baseline:  # another build of libcomm (e.g. before a change), with its own comm-run and library
        out.append(("baseline", os.path.join(os.path.abspath(args.baseline), "bench", "comm-bench"), []))
    for name, prog, _ in out:
        benchlib.require_built("compare.py", name, prog, "libgloo-dev libopenmpi-dev openmpi-bin")
    return out


def command(args, build, name, prog, extra, json_path):
    bench = [prog, *extra, *args.bench_args, "--json", json_path, "--label", name]
    if args.netsim is not None:
        if name == "mpi":
            sys.exit("compare.py: MPI under --netsim is not supported (mpirun launches its own ranks); drop mpi")
        return benchlib.netsim(args.netsim.split(), bench)
    if name == "mpi":
        return ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(args.np), *bench]
    return benchlib.comm_run(os.path.abspath(args.baseline) if name == "baseline" else build, args.np, bench)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", type=int, default=2, help="local ranks (ignored with --netsim: one per host)")
    ap.add_argument("--peers", default="mpi,gloo", help="comma list: mpi, gloo (default both)")
    ap.add_argument("--gloo-algos", default="ring,ring_chunked,halving_doubling")
    ap.add_argument("--libcomm-algos", default="", help="also run libcomm with these COMM_ALGO values")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--netsim", default=None, metavar="ARGS", help='run on simulated hosts: netsim ARGS, e.g. "--hosts 4 --rate 2gbit"')
    benchlib.add_build_arg(ap)
    ap.add_argument("--baseline", default=None, metavar="BUILD",
                    help="also run another build of libcomm (its comm-run and comm-bench), e.g. one made before a change")
    ap.add_argument("--out", default=None, help="folder for logs and JSON (default bench/results/compare-<time>)")
    ap.add_argument("--out-of-place", action="store_true",
                    help="compare out-of-place busbw (default in place: Gloo's algorithms are in place only, its "
                         "out-of-place time includes a copy)")
    ap.add_argument("bench_args", nargs="*", help="comm-bench arguments, after --")
    args = ap.parse_args(argv)
    build = os.path.abspath(args.build)
    out_dir = benchlib.results_dir(args.out, "compare")
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none")

    runs = variants(args, build)
    place = "out_of_place" if args.out_of_place else "in_place"
    busbw = {}  # name -> size -> {"busbw": [one per round]}
    for rnd in range(1, args.rounds + 1):
        for name, prog, extra in runs:
            stem = benchlib.stem(out_dir, name, f"round{rnd}")
            cmd = command(args, build, name, prog, extra, stem + ".json")
            benchlib.announce(f"# round {rnd}/{args.rounds}: {name}: {' '.join(cmd)}")
            output, rows = benchlib.run("compare.py", name, cmd, stem, env)
            if len(rows) != len(nccl_log.parse(output, strict=False)["rows"]):
                sys.exit(f"compare.py: {name}: the table and {stem}.json disagree")
            benchlib.add_samples(busbw, name, rows, place, {"busbw": "busbw"})

    names = [n for n, _, _ in runs]
    gloo = [n for n in names if n.startswith("gloo")]
    sizes = sorted(busbw.get("libcomm", {}))
    med = {n: {s: v["busbw"] for s, v in benchlib.medians(busbw.get(n, {})).items()} for n in names}
    summary = {"bench_args": args.bench_args, "rounds": args.rounds, "netsim": args.netsim,
               "np": None if args.netsim else args.np, "sizes": []}
    peer_cols = [n for n in names if n != "libcomm"] + (["best gloo"] if gloo else [])
    summary["place"] = place
    width = {n: max(len(n) + 2, 10) for n in names + peer_cols}
    print(f"# busbw (GB/s, {place.replace('_', ' ')}), median of {args.rounds} alternating rounds")
    print("#" + f"{'size (B)':>11}" + "".join(f"{n:>{width[n]}}" for n in names))
    for s in sizes:
        print(f"{s:>12}" + "".join(f"{med[n].get(s, float('nan')):>{width[n]}.4f}" for n in names))
    print("# libcomm's busbw / the peer's (> 1: libcomm is faster)")
    print("#" + f"{'size (B)':>11}" + "".join(f"{n:>{width[n]}}" for n in peer_cols))
    for s in sizes:
        entry = {"size": s, "busbw": {n: med[n].get(s) for n in names}, "ratio": {}}
        line = f"{s:>12}"
        for n in peer_cols:
            peer = max(med[g].get(s, 0) for g in gloo) if n == "best gloo" else med[n].get(s, 0)
            ratio = med["libcomm"][s] / peer if peer else float("nan")
            entry["ratio"][n] = ratio
            line += f"{ratio:>{width[n]}.3f}"
        summary["sizes"].append(entry)
        print(line)
    benchlib.write_summary(out_dir, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
