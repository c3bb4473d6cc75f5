#!/usr/bin/python3
"""Chaos for fault-tolerant training (issue 35): examples/fault_tolerant_train.py on netsim hosts
while this driver SIGKILLs a random rank (rank 0 included) every ~--kill-every seconds and
SIGSTOPs one once (woken after 2 x COMM_TIMEOUT_MS + 5 s: it must find itself excluded and exit).

    sudo bench/chaos_train.py --runs 20 --hosts 4 --ranks-per-host 1 --steps 300
    sudo bench/chaos_train.py --runs 20 --hosts 4 --ranks-per-host 2 --steps 300

Each rank runs under a small wrapper (this script with --rank), so that netsim, which stops the
job when a rank fails, sees a killed rank as done; the ranks meet in a file:// store, which
outlives rank 0 (the agreement needs it). An event is only made while at least 3 ranks are left
(each removal must leave a majority; no replacement joins while comm_grow is not implemented).
Per run it prints: the events, the steps every survivor committed, whether their final parameters
are bitwise equal, the steps redone, and the time lost per failure (the slowest survivor's step
that recovered, minus the median step), then a summary line per run for docs/benchmarks.md.
"""

import argparse
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
EXAMPLE = os.path.join(ROOT, "examples", "fault_tolerant_train.py")
NETSIM = os.path.join(ROOT, "tools", "netsim", "netsim")
PY = "/usr/bin/python3"
FINAL = re.compile(r"^\[(\d+)\] final step (\d+) params ([0-9a-f]{64})$")
STEP = re.compile(r"^\[(\d+)\] step (\d+) .* took ([0-9.]+)$")
RECOVERED = re.compile(r"^# \[(\d+)\] recovered at step (\d+): failed \[([0-9, ]*)\] in the (.*), now (\d+) "
                       r"ranks, step took ([0-9.]+) s, recovery ([0-9.]+) s \(([^)]*)\), (.*)$")


def rank_wrapper(rundir, rest):
    """One rank: the example as a child, its pid and exit code in rundir; exits 0 for netsim."""
    rank = os.environ["RANK"]
    with open(os.path.join(rundir, f"out.{rank}"), "w") as out:
        child = subprocess.Popen([PY, EXAMPLE] + rest, stdout=out, stderr=subprocess.STDOUT)
        with open(os.path.join(rundir, f"pid.{rank}.tmp"), "w") as f:
            f.write(str(child.pid))
        os.rename(os.path.join(rundir, f"pid.{rank}.tmp"), os.path.join(rundir, f"pid.{rank}"))
        code = child.wait()
    with open(os.path.join(rundir, f"code.{rank}"), "w") as f:
        f.write(str(code))
    return 0


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def one_run(args, index):
    n = args.hosts * args.ranks_per_host
    rundir = tempfile.mkdtemp(prefix=f"chaos_{index}_")
    store = os.path.join(rundir, "store")
    os.mkdir(store)
    rest = ["--steps", str(args.steps), "--log-every", "1", "--step-sleep", str(args.step_sleep),
            "--seed", str(index), "--init-method", "file://" + store]
    env = dict(os.environ, COMM_TIMEOUT_MS=str(args.timeout_ms), OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    with open(os.path.join(rundir, "netsim.log"), "w") as log:
        ns = subprocess.Popen([NETSIM, "--hosts", str(args.hosts), "--ranks-per-host", str(args.ranks_per_host),
                               "--rate", args.rate, "--port", str(29500 + index % 500), "--", PY,
                               os.path.abspath(__file__), "--rank", rundir] + rest,
                              stdout=log, stderr=subprocess.STDOUT, env=env)
    rng = random.Random(1000 + index)
    start = time.monotonic()
    pids = {}
    while len(pids) < n and time.monotonic() - start < 300 and ns.poll() is None:
        for r in range(n):
            text = read(os.path.join(rundir, f"pid.{r}"))
            if text:
                pids[r] = int(text)
        time.sleep(0.2)
    # Events start once every rank trains (its first step line).
    while ns.poll() is None and time.monotonic() - start < 300 and not all(
            re.search(r"^\[\d+\] step 0 ", read(os.path.join(rundir, f"out.{r}")) or "", re.M) for r in range(n)):
        time.sleep(0.2)
    t_train = time.monotonic()
    events, gone, stopped, cont_at = [], set(), None, None
    next_at = t_train + args.kill_every * rng.uniform(0.7, 1.3)
    hung = False
    while ns.poll() is None:
        now = time.monotonic()
        if now - start > args.deadline_s:
            hung = True
            ns.send_signal(signal.SIGINT)  # netsim removes its namespaces and stops the ranks
            try:
                ns.wait(timeout=60)
            except subprocess.TimeoutExpired:
                ns.kill()
            break
        if stopped is not None and now >= cont_at:
            os.kill(pids[stopped], signal.SIGCONT)
            stopped = None
        if now >= next_at:
            next_at = now + args.kill_every * rng.uniform(0.7, 1.3)
            live = [r for r in range(n) if r not in gone and read(os.path.join(rundir, f"code.{r}")) is None
                    and "final step" not in (read(os.path.join(rundir, f"out.{r}")) or "")]
            if len(live) - 1 >= 2 and len(live) == n - len(gone):
                victim = rng.choice(live)
                kind = "SIGSTOP" if args.stop and not any(e[1] == "SIGSTOP" for e in events) and events else "SIGKILL"
                try:
                    os.kill(pids[victim], signal.SIGSTOP if kind == "SIGSTOP" else signal.SIGKILL)
                except ProcessLookupError:
                    continue
                if kind == "SIGSTOP":
                    # The survivors time out on it (one timeout), then their agreement waits up to
                    # another for a rank nobody saw gone: woken later, it must find itself excluded.
                    stopped, cont_at = victim, now + 2 * args.timeout_ms / 1000 + 5
                gone.add(victim)
                events.append((round(now - t_train, 1), kind, victim))
        time.sleep(0.1)
    wall = time.monotonic() - t_train
    return summarize(args, index, rundir, n, events, gone, hung, wall)


def summarize(args, index, rundir, n, events, gone, hung, wall):
    finals, steps_ok, took, recs = {}, {}, [], []
    codes = {r: read(os.path.join(rundir, f"code.{r}")) for r in range(n)}
    for r in range(n):
        text = read(os.path.join(rundir, f"out.{r}")) or ""
        for line in text.splitlines():
            m = FINAL.match(line)
            if m:
                finals[r] = (int(m.group(2)), m.group(3))
            m = STEP.match(line)
            if m:
                took.append(float(m.group(3)))
            m = RECOVERED.match(line)
            if m:
                parts = dict(zip(m.group(8).split()[::2], map(float, m.group(8).split()[1::2])))
                recs.append((r, int(m.group(2)), m.group(3), float(m.group(6)), parts, m.group(9)))
    survivors = [r for r in range(n) if r not in gone]
    done = [finals.get(r, (0, ""))[0] for r in survivors]
    equal = len({finals.get(r, (0, "x"))[1] for r in survivors}) == 1 and all(r in finals for r in survivors)
    median = statistics.median(took) if took else 0.0
    redone = sorted({s for _, s, _, _, _, o in recs if o == "redone"})
    # One recovery per event, in order (the failed ranks it names are ranks of the communicator
    # of that moment, renumbered after each shrink): the slowest survivor's step and parts.
    groups = {}
    for _, step, failed, step_s, parts, _ in recs:
        g = groups.setdefault((step, failed), {"lost": 0.0, "parts": {}})
        g["lost"] = max(g["lost"], step_s - median)
        for k, v in parts.items():
            g["parts"][k] = max(g["parts"].get(k, 0.0), v)
    per_kind = {"SIGKILL": [], "SIGSTOP": []}
    breakdown = []
    for i, key in enumerate(sorted(groups)):
        kind = events[i][1] if i < len(events) else "SIGKILL"
        per_kind[kind].append(groups[key]["lost"])
        breakdown.append(kind[3:].lower() + " " + "/".join(f"{groups[key]['parts'].get(k, 0):.2f}"
                                                           for k in ("agree", "teardown", "shrink", "redo")))
    stopped_ok = all(codes.get(v) == "3" for _, k, v in events if k == "SIGSTOP")
    row = {"run": index, "ranks": n, "events": events, "steps": f"{min(done) if done else 0}/{args.steps}",
           "survivors": len(survivors), "equal": equal, "redone": len(redone), "hung": hung,
           "lost_kill": per_kind["SIGKILL"], "lost_stop": per_kind["SIGSTOP"], "stopped_exits": stopped_ok,
           "median_step_s": median, "wall_s": wall, "dir": rundir}
    fmt = lambda v: ",".join(f"{x:.2f}" for x in v) or "-"  # noqa: E731
    print(f"| {index} | {args.hosts}x{args.ranks_per_host} | {' '.join(f'{k[3:].lower()}@{t:.0f}s:r{v}' for t, k, v in events) or '-'} "
          f"| {row['steps']} | {len(survivors)} | {'yes' if equal else 'NO'} | {len(redone)} | {fmt(per_kind['SIGKILL'])} "
          f"| {fmt(per_kind['SIGSTOP'])} | {'; '.join(breakdown) or '-'} | {'yes' if stopped_ok else 'NO'} "
          f"| {'HUNG' if hung else 'no'} | {wall:.0f} |", flush=True)
    return row


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--rank":
        return rank_wrapper(sys.argv[2], sys.argv[3:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--ranks-per-host", type=int, default=1)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--step-sleep", type=float, default=0.1)
    ap.add_argument("--timeout-ms", type=int, default=10000)
    ap.add_argument("--kill-every", type=float, default=15.0)
    ap.add_argument("--rate", default="none")
    ap.add_argument("--no-stop", dest="stop", action="store_false")
    ap.add_argument("--deadline-s", type=float, default=900)
    ap.add_argument("--first", type=int, default=0, help="index of the first run (its seed)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("chaos_train.py: netsim needs root")
    print(f"# chaos_train: {args.hosts} hosts x {args.ranks_per_host} ranks, {args.steps} steps, "
          f"COMM_TIMEOUT_MS={args.timeout_ms}, an event every ~{args.kill_every:.0f} s while >= 3 ranks are left "
          f"(one SIGSTOP, woken after 2 timeouts + 5 s); time lost = the recovering step minus the median step")
    print("| run | hosts x ranks | events (kind@s:rank) | steps | survivors | params bitwise equal | steps redone "
          "| lost per SIGKILL (s) | lost per SIGSTOP (s) | agree/teardown/shrink/redo (s) | stopped rank exits "
          "| hang | wall (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    bad = 0
    for i in range(args.first, args.first + args.runs):
        row = one_run(args, i)
        bad += row["hung"] or not row["equal"] or row["steps"] != f"{args.steps}/{args.steps}"
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
