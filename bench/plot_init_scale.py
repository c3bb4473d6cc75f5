#!/usr/bin/python3
"""Init time and file descriptors per rank against the number of ranks, one line per label, from
the lines bench/init_scale.sh appends to CSV=FILE (label,ranks,limit,init_s,fds_init,fds_pre).

  bench/plot_init_scale.py docs/init-scale.csv --out docs/init-scale     # .png and .svg

Lines starting with '#' are comments. Rows with the same label and ranks (repeats, or runs under
different limits) become one point: the median init time and the largest descriptor count.
Uses Debian's python3-matplotlib (hence /usr/bin/python3); nothing in CI runs it.
"""
import argparse
import csv
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullFormatter, ScalarFormatter  # noqa: E402


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--out", default="init-scale", help="output prefix: PREFIX.png and PREFIX.svg")
    ap.add_argument("--title", default="")
    args = ap.parse_args(argv)
    series = {}  # label -> ranks -> ([init_s], [fds])
    for path in args.csv:
        with open(path) as f:
            for row in csv.reader(line for line in f if line.strip() and not line.startswith("#")):
                label, ranks, _limit, init_s, fds = row[:5]
                point = series.setdefault(label, {}).setdefault(int(ranks), ([], []))
                point[0].append(float(init_s))
                point[1].append(int(fds))
    if not series:
        sys.exit("plot_init_scale: no rows in " + ", ".join(args.csv))
    fig, (ax_t, ax_f) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, points in series.items():
        ranks = sorted(points)
        ax_t.plot(ranks, [statistics.median(points[n][0]) for n in ranks], marker="o", label=label)
        ax_f.plot(ranks, [max(points[n][1]) for n in ranks], marker="o", label=label)
    for ax, what in ((ax_t, "init time, slowest rank (s)"), (ax_f, "file descriptors per rank after init")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks (processes on one 2-core machine)")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        ax.xaxis.set_major_formatter(ScalarFormatter())
    ax_f.set_yticks([8, 16, 32, 64, 128, 256, 512, 1024])
    ax_f.yaxis.set_major_formatter(ScalarFormatter())
    ax_f.yaxis.set_minor_formatter(NullFormatter())
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(f"{args.out}.{ext}", dpi=110)
    print(f"wrote {args.out}.png and {args.out}.svg")


if __name__ == "__main__":
    main(sys.argv[1:])
