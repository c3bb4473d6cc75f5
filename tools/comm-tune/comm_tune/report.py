"""The report: per rank count, a table per size of the best setting against the default, and a
heat map (size x setting, colour = busbw relative to the default) as PNG and SVG."""
import os


def human(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def table(ranks, sizes, results, verdicts, metric="busbw"):
    """results: {setting name: {size: stats}}; verdicts: {size: (best name or None, text)}."""
    lines = [f"### {ranks} ranks", "",
             f"| size | default {metric} | best setting | its {metric} | gain (median ratio) | spread | verdict |",
             "|---:|---:|---|---:|---:|---:|---|"]
    for size in sizes:
        best, verdict = verdicts[size]
        if best is None:
            d = next(iter(results.values()))[size]["default_busbw"] if results else 0
            lines.append(f"| {human(size)} | {d:.2f} | (default) | {d:.2f} | 1.000 | | {verdict} |")
            continue
        st = results[best][size]
        lines.append(f"| {human(size)} | {st['default_busbw']:.2f} | {best} | {st['busbw']:.2f} | "
                     f"{st['gain']:.3f} | {st['spread']:.3f} | {verdict} |")
    return "\n".join(lines) + "\n"


def heatmap(path_stem, title, sizes, results, metric="busbw", ylabel="message size (bytes)"):
    """Writes path_stem.png and .svg; returns the two paths (none without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import TwoSlopeNorm
    except ImportError:
        return []
    names = list(results)
    data = [[results[n][s]["gain"] for n in names] for s in sizes]
    lo = min(min(row) for row in data)
    hi = max(max(row) for row in data)
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(lo, 0.99), vmax=max(hi, 1.01))
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(names), 1.2 + 0.45 * len(sizes)))
    im = ax.imshow(data, cmap="RdBu", norm=norm, aspect="auto")
    ax.set_xticks(range(len(names)), [n.replace(" ", "\n").replace("=", "=\n") for n in names], fontsize=7)
    ax.set_yticks(range(len(sizes)), [human(s) for s in sizes], fontsize=8)
    ax.set_xlabel("setting")
    ax.set_ylabel(ylabel)
    for i, s in enumerate(sizes):
        for j, n in enumerate(names):
            st = results[n][s]
            mark = "*" if st["significant"] else ""
            ax.text(j, i, f"{st['gain']:.2f}{mark}", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=ax, label=f"{metric} / default {metric} (same run, alternating)")
    ax.set_title(title + "\n* = gain above the spread in every pair", fontsize=9)
    fig.tight_layout()
    paths = [path_stem + ".png", path_stem + ".svg"]
    for p in paths:
        fig.savefig(p, dpi=110)
    plt.close(fig)
    return [os.path.basename(p) for p in paths]
