"""From confirmed winners to the profile libcomm loads (schema: libcomm/src/tuning/README.md)."""
import math
import statistics

from . import grid

FORMAT, VERSION = "libcomm-tuning-profile", 1


def size_range(sizes, first, last):
    """Each measured size stands for the sizes nearer to it (geometrically) than to the next one."""
    i, j = sizes.index(first), sizes.index(last)
    lo = sizes[i] if i == 0 else int(math.isqrt(sizes[i - 1] * sizes[i])) + 1
    hi = sizes[j] if j == len(sizes) - 1 else int(math.isqrt(sizes[j] * sizes[j + 1]))
    return lo, hi


def call_entries(collective, ranks, transport, sizes, winners, metric="busbw"):
    """winners: {size: (setting, sweep stats, confirm stats)}; consecutive sizes with the same
    setting become one entry. collective "engine": the sizes are models' gradient bytes and the
    metric is steps per second."""
    entries, run = [], []

    def flush():
        if not run:
            return
        setting = winners[run[0]][0]
        lo, hi = size_range(sizes, run[0], run[-1])
        confirmed = [winners[s][2] for s in run]
        entries.append({
            "collective": collective, "ranks": ranks, "transport": transport, "min_bytes": lo, "max_bytes": hi,
            "settings": setting,
            "measured": {
                "gain": round(min(c["gain"] for c in confirmed), 4),  # the confirmation run's, the smallest
                "sweep_gain": [round(winners[s][1]["gain"], 4) for s in run],
                "confirm_gain": [round(c["gain"], 4) for c in confirmed],
                "spread": [round(max(winners[s][1]["spread"], winners[s][2]["spread"]), 4) for s in run],
                "default_" + metric: [round(c["default_busbw"], 4) for c in confirmed],
                metric: [round(c["busbw"], 4) for c in confirmed],
                "sizes": run[:],
            },
        })
        run.clear()

    for size in sizes:
        if size in winners and run and winners[run[-1]][0] != winners[size][0]:
            flush()
        if size in winners:
            run.append(size)
        else:
            flush()
    flush()
    return entries


def communicator_entry(ranks, transport, setting, sweep, confirm):
    gains = [confirm[s]["gain"] for s in confirm]
    return {
        "collective": "*", "ranks": ranks, "transport": transport, "settings": setting,
        "measured": {"gain": round(statistics.geometric_mean(gains), 4),
                     "confirm_gain": {str(s): round(confirm[s]["gain"], 4) for s in confirm},
                     "sweep_gain": {str(s): round(sweep[s]["gain"], 4) for s in sweep}},
    }


def document(entries, meta):
    return {"format": FORMAT, "version": VERSION, **meta, "entries": entries}


def transport_name(transport, hosts, ranks):
    """The profile's transport for a sweep: what libcomm's matcher calls the communicator
    (one rank per host, as under netsim, is "socket"; NCCL's settings are "nccl")."""
    if transport == "nccl":
        return "nccl"
    if transport == "socket" or hosts >= ranks:
        return "socket"
    return "shm" if hosts == 1 else "shm+socket"


__all__ = ["call_entries", "communicator_entry", "document", "transport_name", "grid"]
