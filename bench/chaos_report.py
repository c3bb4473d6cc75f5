#!/usr/bin/python3
"""What one bench/chaos_train.py run did, from its files (bench/chaos_slot.py names them): the
steps every rank at the end committed, whether their final parameters are bitwise equal, the
steps redone, per event the time lost and its parts, the final loss against the failure-free
band; and, as a script, the summary over the runs' JSON lines:

    bench/chaos_report.py summary RESULTS.jsonl...

Time lost per failure (lost(): slowest rank for each part): detection (from the signal to the
first rank's recovery start: for a SIGSTOP, the timeout), agree, teardown, shrink, redo (the
example's "recovered" line), plus the step that admitted the replacement minus the median step,
whose parts are grow (comm_grow admitting the joiner) and state (the members' state transfer;
the joiner's own receive time and bytes are kept too).
"""

import glob
import json
import os
import re
import statistics
import sys

HEADER = ("| run | hosts x ranks | seed | events (kind@s:slot) | special | steps | ranks at end | params bitwise equal "
          "| steps redone | lost per SIGKILL (s) | lost per SIGSTOP (s) | final loss (band) | hang | wall (s) |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
STEP = re.compile(r"^\[(\d+)\] step (\d+) loss [0-9.]+ eval ([0-9.]+) size (\d+) took ([0-9.]+)$")
FINAL = re.compile(r"^\[(\d+)\] final step (\d+) params ([0-9a-f]{64})$")
FINAL_LOSS = re.compile(r"^\[(\d+)\] final loss ([0-9.]+)$")
RECOVERED = re.compile(r"^# \[(\d+)\] recovered at step (\d+): failed \[([0-9, ]*)\] in the (.*), now (\S+) ranks, "
                       r"started ([0-9.]+), step took ([0-9.]+) s, recovery ([0-9.]+) s \(([^)]*)\), (.*)$")
ADMITTED = re.compile(r"^# \[(\d+)\] admitted at step (\d+): now (\d+) ranks, grow ([0-9.]+) s, state ([0-9.]+) s, "
                      r"(\d+) bytes \+ parameters (\d+) bytes, step took ([0-9.]+) s$")
JOINED = re.compile(r"^# \[(\d+)\] joined at step (\d+), (\d+) ranks, slot (\d+), state ([0-9.]+) s, (\d+) bytes "
                    r"\+ parameters (\d+) bytes, at ([0-9.]+)$")
PARTS = ("detect", "agree", "teardown", "shrink", "redo", "grow", "state")


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def processes(rundir):
    """{(slot, k): output lines} for every process the run started."""
    out = {}
    for path in glob.glob(os.path.join(rundir, "out.*.*")):
        _, s, k = os.path.basename(path).split(".")
        out[(int(s), int(k))] = read(path).splitlines()
    return out


def slot_exit(rundir, s, k):
    m = re.search(rf"^[0-9.]+ exit {k} code (-?\d+)$", read(os.path.join(rundir, f"slot.{s}")), re.M)
    return int(m.group(1)) if m else None


def summarize(rundir, n, steps, seed, events, hung, wall, band, index, shape):
    procs = processes(rundir)
    finals, final_loss, took, curve, recs, admits, joins = {}, {}, [], {}, [], {}, {}
    for key, lines in procs.items():
        for line in lines:
            if m := FINAL.match(line):
                finals[key] = (int(m.group(2)), m.group(3))
            elif m := FINAL_LOSS.match(line):
                final_loss[key] = float(m.group(2))
            elif m := STEP.match(line):
                took.append(float(m.group(5)))
                curve[int(m.group(2))] = float(m.group(3))  # equal parameters: any rank's
            elif m := RECOVERED.match(line):
                parts = dict(zip(m.group(9).split()[::2], map(float, m.group(9).split()[1::2])))
                recs.append({"step": int(m.group(2)), "failed": m.group(3), "started": float(m.group(6)),
                             "took": float(m.group(7)), "parts": parts, "outcome": m.group(10)})
            elif m := ADMITTED.match(line):
                a = admits.setdefault(int(m.group(2)), {"grow": 0.0, "state": 0.0, "took": 0.0})
                for name, v in (("grow", m.group(4)), ("state", m.group(5)), ("took", m.group(8))):
                    a[name] = max(a[name], float(v))
                a["bytes"] = int(m.group(6)) + int(m.group(7))
            elif m := JOINED.match(line):
                joins[key] = {"step": int(m.group(2)), "state": float(m.group(5)),
                              "bytes": int(m.group(6)) + int(m.group(7)), "at": float(m.group(8))}
    median = statistics.median(took) if took else 0.0
    # The ranks at the end: each slot's last process, if it committed the end.
    last = {s: max(k for (t, k) in procs if t == s) for s in {s for s, _ in procs}}
    at_end = [(s, k) for s, k in last.items() if (s, k) in finals]
    done = [finals[p][0] for p in at_end]
    equal = len({finals[p][1] for p in at_end}) == 1 and len(at_end) > 0
    redone = sorted({r["step"] for r in recs if r["outcome"] == "redone"})
    # One recovery per (step, failed set), on all its ranks: the slowest's step and parts.
    groups = {}
    for r in recs:
        g = groups.setdefault((r["step"], r["failed"]), {"start": r["started"], "took": 0.0, "parts": {}, "n": 0})
        g["start"] = min(g["start"], r["started"])
        g["took"] = max(g["took"], r["took"])
        for name, v in r["parts"].items():
            g["parts"][name] = max(g["parts"].get(name, 0.0), v)
    # Each recovery belongs to the latest events before it not yet accounted for, as many as it
    # found failed (two kills agreed on in one round are one recovery); an event with no recovery
    # of its own (a replacement killed before it was admitted) takes none.
    taken = [False] * len(events)
    per_event = [None] * len(events)
    for key in sorted(groups, key=lambda k: groups[k]["start"]):
        g = groups[key]
        count = max(1, len([x for x in key[1].split(",") if x.strip()]))
        for i in sorted(range(len(events)), key=lambda i: -events[i]["t"]):
            e = events[i]
            if count and not taken[i] and e["t"] <= g["start"]:
                taken[i] = True
                count -= 1
                if per_event[i] is None:
                    per_event[i] = dict(g["parts"], detect=g["start"] - e["t"],
                                        lost_recovery=max(0.0, g["took"] - median), step=key[0])
                    g["n"] += 1
    for i, e in enumerate(events):
        pe = per_event[i] if per_event[i] is not None else {"lost_recovery": 0.0, "none": True}
        # Its replacement: the slot's next process, which says at which step it joined.
        j = joins.get((e["slot"], e["k"] + 1))
        if j:
            a = admits.get(j["step"], {"grow": 0.0, "state": 0.0, "took": median})
            pe.update(grow=a["grow"], state=a["state"], lost_join=max(0.0, a["took"] - median),
                      joiner_state=j["state"], bytes=j["bytes"], joined_after=j["at"] - e["t"])
        else:
            pe.update(lost_join=0.0, replaced=False)
        pe["lost"] = lost(pe)
        e["result"] = pe
    kill_lost = [e["result"]["lost"] for e in events if e["kind"] != "stop" and not e["result"].get("none")]
    stop_lost = [e["result"]["lost"] for e in events if e["kind"] == "stop"]
    fl = final_loss.get(at_end[0]) if at_end else None
    in_band = None
    outside = None  # logged steps whose held-out loss is outside the band (the curve)
    own_seed = None  # % from the same seed's failure-free final loss, where the band has it
    if band and fl is not None:
        in_band = band["final"][0] <= fl <= band["final"][1]
        if str(seed) in band.get("by_seed", {}):
            ref = band["by_seed"][str(seed)]
            own_seed = 100.0 * (fl - ref) / ref
        limits = {int(k): v for k, v in band["curve"].items()}
        outside = sum(1 for st, v in curve.items() if st in limits and not limits[st][0] <= v <= limits[st][1])
    special = "; ".join(f"{e['kind']} slot {e['slot']} ({e['note']})" for e in events if e["kind"] != "kill" and e["note"])
    joiner_fates = {f"{s}.{k}": slot_exit(rundir, s, k) for (s, k) in procs if k > 0 and (s, k) not in joins}
    row = {"run": index, "shape": shape, "seed": seed, "events": events, "steps_done": min(done) if done else 0,
           "steps": steps, "ranks_at_end": len(at_end), "n": n, "equal": equal, "redone": len(redone),
           "hung": hung, "lost_kill": kill_lost, "lost_stop": stop_lost, "final_loss": fl, "in_band": in_band, "own_seed_pct": own_seed,
           "curve": curve, "steps_outside_band": outside, "median_step_s": median, "wall_s": wall, "dir": rundir, "special": special,
           "unadmitted_joiners": joiner_fates}
    row["ok"] = (not hung and equal and row["steps_done"] == steps and len(at_end) == n and in_band is not False)
    fmt = lambda v: ",".join(f"{x:.2f}" for x in v) or "-"  # noqa: E731
    band_text = (f"{fl:.4f} ({'in' if in_band else 'OUT' if in_band is False else '?'}"
                 + (f", {own_seed:+.2f} % from its seed's" if own_seed is not None else "")
                 + (f", curve outside at {outside} of {len(curve)} steps" if outside is not None else "") + ")"
                 if fl is not None else "-")
    evs = " ".join("{}@{:.0f}s:s{}".format(e["kind"], e["rel"], e["slot"]) for e in events) or "-"
    print(f"| {index} | {shape} | {seed} | {evs} "
          f"| {special or '-'} | {row['steps_done']}/{steps} | {len(at_end)}/{n} | {'yes' if equal else 'NO'} "
          f"| {len(redone)} | {fmt(kill_lost)} | {fmt(stop_lost)} | {band_text} | {'HUNG' if hung else 'no'} "
          f"| {wall:.0f} |", flush=True)
    for e in events:
        r = e["result"]
        print(f"#   {e['kind']}@{e['rel']:.1f}s slot {e['slot']}: lost {r['lost']:.2f} s = recovery "
              f"{r['lost_recovery']:.2f} + join {r['lost_join']:.2f}; "
              + " ".join(f"{p} {r[p]:.3f}" for p in PARTS if p in r)
              + (f"; joiner received {r['bytes']} bytes in {r['joiner_state']:.3f} s, joined {r['joined_after']:.1f} s "
                 "after the signal" if "bytes" in r else "; no replacement joined")
              + ("; no recovery of its own" if r.get("none") else ""), flush=True)
    if joiner_fates:
        print(f"#   replacements never admitted (slot.k: exit code): {joiner_fates}", flush=True)
    return row


def lost(r):
    """From the signal until the survivors train again (detection, agreement, teardown, shrink,
    redo), plus what the step that admitted the replacement took beyond the median step. (Not
    the recovering step's excess alone: a failure noticed in a step boundary's comm_grow stalls
    the step before the one that reports the recovery.)"""
    return sum(r.get(p, 0.0) for p in ("detect", "agree", "teardown", "shrink", "redo")) + r.get("lost_join", 0.0)


def band(rows):
    """The failure-free band: min-max of the held-out loss at each logged step and at the end, and
    each seed's final loss (a chaos run of that seed is also held against its own seed's)."""
    rows = [dict(r, curve={int(k): v for k, v in r["curve"].items()}) for r in rows]  # JSON keys are text
    steps = set.intersection(*(set(r["curve"]) for r in rows))
    return {"seeds": [r["seed"] for r in rows], "final": [min(r["final_loss"] for r in rows),
                                                          max(r["final_loss"] for r in rows)],
            "by_seed": {str(r["seed"]): r["final_loss"] for r in rows},
            "curve": {s: [min(r["curve"][s] for r in rows), max(r["curve"][s] for r in rows)] for s in sorted(steps)}}


def median_seed(band_data):
    """The seed whose failure-free final loss is the band's median (the lower middle for an even count)."""
    by_seed = sorted(band_data["by_seed"].items(), key=lambda kv: kv[1])
    return int(by_seed[(len(by_seed) - 1) // 2][0])


def spread(values):
    if not values:
        return "-"
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f} (n={len(values)})"


def summary(paths, timeout_s=10.0):
    rows = [json.loads(line) for p in paths for line in open(p) if line.strip()]
    kills = [e["result"] for r in rows for e in r["events"] if e["kind"] != "stop" and not e["result"].get("none")]
    stops = [e["result"] for r in rows for e in r["events"] if e["kind"] == "stop"]
    for r in kills + stops:
        r["lost"] = lost(r)  # runs recorded before lost() was defined so carry the parts
    print(f"runs {len(rows)}: all steps {sum(r['steps_done'] == r['steps'] for r in rows)}, world full at the end "
          f"{sum(r['ranks_at_end'] == r['n'] for r in rows)}, params bitwise equal {sum(r['equal'] for r in rows)}, "
          f"hangs {sum(r['hung'] for r in rows)}, final loss in band {sum(bool(r['in_band']) for r in rows)}, "
          f"steps redone {spread([r['redone'] for r in rows])}")
    own = [r["own_seed_pct"] for r in rows if r.get("own_seed_pct") is not None]
    if own:  # the band's edge seeds put a run outside however small its deviation: this says how small
        print(f"final loss against the same seed's failure-free run (%, min / median / max): {spread(own)}; "
              f"within 0.5 %: {sum(abs(x) <= 0.5 for x in own)} of {len(own)}")
    for name, rs in (("SIGKILL", kills), ("SIGSTOP", stops)):
        # Issue 35's bounds: a SIGKILL 3 s plus the state transfer, a SIGSTOP COMM_TIMEOUT_MS + 3 s.
        bound = (lambda r: 3 + r.get("state", 0)) if name == "SIGKILL" else (lambda r: timeout_s + 3)
        print(f"lost per {name} (min / median / max): {spread([r['lost'] for r in rs])}; over the issue's bound: "
              f"{sum(r['lost'] > bound(r) for r in rs)}")
        for p in PARTS + ("lost_recovery", "lost_join", "joiner_state", "joined_after"):
            print(f"  {p}: {spread([r[p] for r in rs if p in r])}")
    print(f"state bytes: {sorted({r['bytes'] for r in kills + stops if 'bytes' in r})}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "summary":
        summary(sys.argv[2:])
    else:
        sys.exit(__doc__)
