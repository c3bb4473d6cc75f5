#!/usr/bin/python3
"""busbw against message size, one line per library/transport/algorithm, from comm-bench JSON.

  bench/plot_busbw.py results/*.json --out docs/busbw            # docs/busbw.png and .svg
  bench/plot_busbw.py a.json b.json --in-place --limit 0.2385:"iperf3 goodput" --title "4 hosts"

Any set of JSON files written by comm-bench, comm-bench-gloo or comm-bench-mpi (--json FILE).
Files with the same label (repeated runs) become one line: the median per size.
Uses Debian's python3-matplotlib (hence /usr/bin/python3).
"""
import argparse
import json
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def label_of(run):
    if run.get("label"):
        return run["label"]
    return f'{run["library"]} {run.get("transport", "")} {run.get("algorithm", "")}'.strip()


def human(size):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:g} {unit}" if unit == "B" else f"{size:g}{unit[0]}"
        size /= 1024
    return str(size)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="comm-bench --json files")
    ap.add_argument("--out", default="busbw", help="output prefix: PREFIX.png and PREFIX.svg")
    ap.add_argument("--in-place", action="store_true", help="plot the in-place busbw (default out of place)")
    ap.add_argument("--title", default=None)
    ap.add_argument("--limit", action="append", default=[], metavar="GBPS:TEXT",
                    help="a horizontal line, e.g. the link's goodput in GB/s")
    args = ap.parse_args(argv)

    series = {}  # label -> size -> [busbw]
    colls, nranks = set(), set()
    for path in args.json:
        with open(path) as f:
            run = json.load(f)
        colls.add(run.get("collective", "?"))
        nranks.add(run.get("nranks"))
        key = "in_place" if args.in_place else "out_of_place"
        for row in run["rows"]:
            if row["size"] > 0:
                series.setdefault(label_of(run), {}).setdefault(row["size"], []).append(row[key]["busbw"])

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=100)
    for label in sorted(series):
        sizes = sorted(series[label])
        ax.plot(sizes, [statistics.median(series[label][s]) for s in sizes], marker="o", markersize=3, label=label)
    for spec in args.limit:
        value, _, text = spec.partition(":")
        ax.axhline(float(value), color="gray", linestyle="--", linewidth=1)
        ax.annotate(text or value, (0.01, float(value)), xycoords=("axes fraction", "data"),
                    textcoords="offset points", xytext=(0, 3), fontsize=8, color="gray")
    ax.set_xscale("log", base=2)
    ticks = sorted({s for v in series.values() for s in v})
    if ticks:
        step = max(1, len(ticks) // 10)
        ax.set_xticks(ticks[::step])
        ax.set_xticklabels([human(t) for t in ticks[::step]], rotation=45, fontsize=8)
    ax.set_xlabel("message size")
    ax.set_ylabel(f'busbw, GB/s ({"in place" if args.in_place else "out of place"})')
    ranks = ", ".join(str(n) for n in sorted(n for n in nranks if n is not None))
    ax.set_title(args.title or f'{", ".join(sorted(colls))}, {ranks} ranks')
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(f"{args.out}.{ext}")
    print(f"wrote {args.out}.png and {args.out}.svg")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
