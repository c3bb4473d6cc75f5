#!/usr/bin/python3
"""Chaos for fault-tolerant training (issue 35): examples/fault_tolerant_train.py on netsim hosts
while this driver SIGKILLs a random rank (rank 0 included) every ~--kill-every seconds and SIGSTOPs
one once, and every lost rank is replaced by a joiner (COMM_JOIN=1) on its host.

    sudo bench/chaos_train.py --calm --runs 5 --first 0 --hosts 4 --ranks-per-host 1 --band band41.json
    sudo bench/chaos_train.py --runs 10 --hosts 4 --ranks-per-host 1 --band band41.json --results r.jsonl

The replacements: netsim runs bench/chaos_slot.py for each slot in its host's network namespace;
it does what `comm-run --replace-failed` does for a local job (comm-run cannot serve netsim hosts:
its store listens on 127.0.0.1 of its own namespace), reading the exclusions from the job's
file:// store, which outlives every rank. An event is made only while every slot holds a member
(the world is back at N ranks) and before --events-until of the steps (so that the last
replacement joins before the end). The events, in order: one kill during an agreement or a join,
tried again at the next event until it happens (--special: "agree", a second member killed 0.02-0.3 s after the
first, only where the two leave a strict majority; "join-member", a member killed 0-0.3 s after
a replacement said it is joining; "join-joiner", that replacement itself killed then; by default
the kind cycles with the run's index); a SIGSTOP (the survivors time out on it and exclude
it, its slot's supervisor SIGKILLs it and starts its replacement); then SIGKILLs.

The loss: --calm runs are failure-free, of seed index modulo 5 (--first 0 --runs 5: seeds 0-4), and
write the band to --band. A chaos run trains at one seed, as a job does (--seed, by default the
band's median seed: two failure-free seeds end below it and two above), so that its final loss is
held against the spread of the seeds around it; a run at the band's lowest or highest seed lies
outside for any deviation in one direction, however small. Its distance from its own seed's
failure-free run is reported beside it. bench/chaos_report.py reads each run's files.
"""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

import chaos_report

HERE = os.path.dirname(os.path.abspath(__file__))
NETSIM = os.path.join(HERE, "..", "tools", "netsim", "netsim")
SLOT = os.path.join(HERE, "chaos_slot.py")
PY = "/usr/bin/python3"


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


class Job:
    """The run's files as the slots' supervisors write them (bench/chaos_slot.py)."""

    def __init__(self, rundir, n):
        self.rundir, self.n = rundir, n

    def current(self, s):
        """(pid, k) of the process slot s runs now, or None."""
        text = read(os.path.join(self.rundir, f"pid.{s}"))
        return tuple(map(int, text.split())) if text else None

    def out(self, s, k):
        return read(os.path.join(self.rundir, f"out.{s}.{k}")) or ""

    def is_member(self, s, gone):
        cur = self.current(s)
        if cur is None or (s, cur[1]) in gone:
            return False
        text = self.out(s, cur[1])
        if "final step" in text or "stops:" in text:
            return False
        return cur[1] == 0 or "joined at step" in text

    def joining_since(self, s):
        """The monotonic time a replacement in slot s said it is joining (not joined yet), or None."""
        cur = self.current(s)
        if cur is None or cur[1] == 0:
            return None
        text = self.out(s, cur[1])
        m = re.search(r"^# \[joiner\] joining at ([0-9.]+)$", text, re.M)
        return float(m.group(1)) if m and "joined at step" not in text else None

    def step(self):
        best = -1
        for s in range(self.n):
            cur = self.current(s)
            if cur:
                for m in re.finditer(r"^\[\d+\] step (\d+) ", self.out(s, cur[1]), re.M):
                    best = max(best, int(m.group(1)))
        return best


def special_kind(args, index, n):
    if args.special:
        return args.special
    kinds = (["agree"] if n >= 6 else []) + ["join-member", "join-joiner"]
    return kinds[index % len(kinds)]


def sweep(rundir, netsim_pid):
    """What a run may leave behind when it hung (netsim's SIGINT stops neither the slots' supervisors
    nor the ranks they restart): every process whose command line names the run's directory, and
    netsim's network namespaces (nsim<pid>-*)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if rundir.encode() not in f.read():
                    continue
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for name in names:
        if name.startswith(f"nsim{netsim_pid}-"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def one_run(args, index):
    n = args.hosts * args.ranks_per_host
    rundir = tempfile.mkdtemp(prefix=f"chaos_{index}_")
    store = os.path.join(rundir, "store")
    os.mkdir(store)
    seed = index % 5 if args.calm or args.seed == "index" else args.seed_value
    rest = ["--steps", str(args.steps), "--log-every", "1", "--step-sleep", str(args.step_sleep),
            "--seed", str(seed), "--after-join", "0", "--init-method", "file://" + store]
    env = dict(os.environ, COMM_TIMEOUT_MS=str(args.timeout_ms), OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    with open(os.path.join(rundir, "netsim.log"), "w") as log:
        ns = subprocess.Popen([NETSIM, "--hosts", str(args.hosts), "--ranks-per-host", str(args.ranks_per_host),
                               "--rate", args.rate, "--port", str(29500 + index % 500), "--", PY, SLOT, rundir] + rest,
                              stdout=log, stderr=subprocess.STDOUT, env=env)
    job = Job(rundir, n)
    rng = random.Random(1000 + index)
    start = time.monotonic()
    # Events start once every rank trains (its first step line).
    while ns.poll() is None and time.monotonic() - start < 300 and not all(
            re.search(r"^\[\d+\] step 0 ", job.out(s, 0), re.M) for s in range(n)):
        time.sleep(0.2)
    t_train = time.monotonic()
    special = None if args.calm else special_kind(args, index, n)
    events, gone, stopped = [], set(), None
    armed = None  # a join-* special: waiting for the replacement of this slot to say it joins
    next_at = t_train + args.kill_every * rng.uniform(0.7, 1.3)
    hung = False

    def hit(s, kind, note=""):
        cur = job.current(s)
        try:
            os.kill(cur[0], signal.SIGSTOP if kind == "stop" else signal.SIGKILL)
        except ProcessLookupError:
            return False
        gone.add((s, cur[1]))
        events.append({"t": time.monotonic(), "rel": round(time.monotonic() - t_train, 1), "kind": kind,
                       "slot": s, "k": cur[1], "note": note})
        return True

    while ns.poll() is None:
        now = time.monotonic()
        if now - start > args.deadline_s:
            hung = True
            ns.send_signal(signal.SIGINT)  # netsim removes its namespaces and stops the slots
            try:
                ns.wait(timeout=60)
            except subprocess.TimeoutExpired:
                ns.kill()
            break
        if stopped and now >= stopped[1]:
            # Never excluded (its supervisor would have SIGKILLed it): wake it, and say so.
            cur = job.current(stopped[0][0])
            if cur and cur[1] == stopped[0][1]:
                os.kill(cur[0], signal.SIGCONT)
                events[-1]["note"] += " woken: never excluded"
            stopped = None
        if armed is not None:
            since = job.joining_since(armed[0])
            cur = job.current(armed[0])
            if since is None and cur and cur[1] > armed[2] and job.is_member(armed[0], gone):
                armed = None  # it joined before the kill came: the next kill tries again
                special = special_kind(args, index, n)
            elif since is not None and now >= since + armed[1]:
                members = [s for s in range(n) if job.is_member(s, gone)]
                if armed[3] == "join-joiner":
                    hit(armed[0], "kill-joiner", f"the joiner, {now - since:.2f} s after it said joining")
                elif len(members) >= 3:
                    hit(rng.choice(members), "kill-join", f"a member, {now - since:.2f} s after slot "
                                                          f"{armed[0]}'s joiner said joining")
                armed = None
        full = all(job.is_member(s, gone) for s in range(n))
        if not args.calm and now >= next_at and full and armed is None and job.step() < args.events_until * args.steps:
            next_at = now + args.kill_every * rng.uniform(0.7, 1.3)
            victim = rng.randrange(n)
            if special is None and args.stop and not any(e["kind"] == "stop" for e in events):
                if hit(victim, "stop"):
                    stopped = ((victim, events[-1]["k"]), now + 2 * args.timeout_ms / 1000 + 5)
            elif special == "agree":
                if hit(victim, "kill"):
                    time.sleep(rng.uniform(0.02, 0.3))
                    other = rng.choice([s for s in range(n) if s != victim and job.is_member(s, gone)])
                    hit(other, "kill-agree", f"{time.monotonic() - events[-1]['t']:.2f} s after the first")
                special = None
            elif special:
                if hit(victim, "kill"):
                    # The join: from its "joining" line to its admission at the members' next step
                    # boundary, a few tenths of a second.
                    armed = (victim, rng.uniform(0.0, 0.3), events[-1]["k"], special)
                special = None
            else:
                hit(victim, "kill")
        time.sleep(0.05)
    wall = time.monotonic() - t_train
    if hung:
        sweep(rundir, ns.pid)
    return chaos_report.summarize(rundir, n, args.steps, seed, events, hung, wall, args.band_data, index,
                                  f"{args.hosts}x{args.ranks_per_host}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--ranks-per-host", type=int, default=1)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--step-sleep", type=float, default=0.1)
    ap.add_argument("--timeout-ms", type=int, default=10000)
    ap.add_argument("--kill-every", type=float, default=15.0)
    ap.add_argument("--events-until", type=float, default=0.85, help="no event after this fraction of the steps")
    ap.add_argument("--rate", default="none")
    ap.add_argument("--no-stop", dest="stop", action="store_false")
    ap.add_argument("--special", choices=["agree", "join-member", "join-joiner"], default=None)
    ap.add_argument("--calm", action="store_true", help="failure-free runs: the loss band, written to --band")
    ap.add_argument("--band", help="JSON file of the failure-free band (written with --calm, read otherwise)")
    ap.add_argument("--results", help="append each run's row as a JSON line here")
    ap.add_argument("--deadline-s", type=float, default=600)
    ap.add_argument("--first", type=int, default=0, help="index of the first run (a --calm run's seed: index %% 5)")
    ap.add_argument("--seed", default="median",
                    help="a chaos run's training seed: 'median' (the --band's median seed), 'index' (index %% 5), or a number")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("chaos_train.py: netsim needs root")
    args.band_data = None
    if args.band and not args.calm:
        with open(args.band) as f:
            args.band_data = json.load(f)
    if args.calm or args.seed == "index":
        args.seed_value = None
    elif args.seed == "median":
        if not args.band_data:
            sys.exit("chaos_train.py: --seed median needs a --band (written by --calm)")
        args.seed_value = chaos_report.median_seed(args.band_data)
    elif args.seed.isdigit():
        args.seed_value = int(args.seed)
    else:
        sys.exit(f"chaos_train.py: --seed {args.seed!r}: expected median, index or a number")
    print(f"# chaos_train: {args.hosts} hosts x {args.ranks_per_host} ranks, {args.steps} steps, "
          f"COMM_TIMEOUT_MS={args.timeout_ms}, " + ("failure-free" if args.calm else
          f"an event every ~{args.kill_every:.0f} s while the world is full, replacements joining"))
    print(chaos_report.HEADER)
    rows, bad = [], 0
    for i in range(args.first, args.first + args.runs):
        row = one_run(args, i)
        rows.append(row)
        if args.results:
            with open(args.results, "a") as f:
                f.write(json.dumps(row) + "\n")
        bad += not row["ok"]
    if args.calm and args.band:
        with open(args.band, "w") as f:
            json.dump(chaos_report.band(rows), f)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
