#!/usr/bin/env python3
"""Time lost per failure with comm_agree_failed (issue 35): N ranks of tests/abi/rank_worker in
its `agree` mode (an all-reduce every ~20 ms), one rank SIGKILLed or SIGSTOPped at step 10; for
each survivor, from the signal to its failed step (detection), to the agreed set (agreement) and
to the shrunk communicator (shrink). Medians over --trials runs, one line per phase.

    python3 bench/agree_timing.py --build build --ranks 4 --trials 5 --signal KILL --transport socket

World rank 0 serves the job store the agreement meets in, so the victim is rank --victim (not 0).
"""

import argparse
import os
import signal
import socket
import statistics
import subprocess
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trial(args):
    worker = os.path.join(args.build, "tests", "abi", "rank_worker")
    port = free_port()
    procs, files = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.ranks):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("COMM_", "RANK", "WORLD_SIZE"))}
            env.update(RANK=str(r), WORLD_SIZE=str(args.ranks), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(args.ranks),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), COMM_TIMEOUT_MS=str(args.timeout_ms),
                       ABI_STEPS="60")
            if args.transport != "auto":
                env["COMM_TRANSPORT"] = args.transport
            path = os.path.join(tmp, f"rank{r}.out")
            files.append(path)
            procs.append(subprocess.Popen([worker, "agree"], env=env, stdout=open(path, "w"), stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "ITER 10 " not in open(files[args.victim]).read():
            time.sleep(0.005)
        sig = signal.SIGKILL if args.signal == "KILL" else signal.SIGSTOP
        at = time.monotonic() * 1000.0  # CLOCK_MONOTONIC, as the worker's TIME lines
        procs[args.victim].send_signal(sig)
        for r, p in enumerate(procs):
            if r == args.victim:
                continue
            p.wait(timeout=300)
        if sig == signal.SIGSTOP:
            procs[args.victim].send_signal(signal.SIGCONT)
        procs[args.victim].wait(timeout=300)
        phases = {"detection": [], "agreement": [], "shrink": []}
        for r, path in enumerate(files):
            if r == args.victim:
                continue
            t = {}
            for line in open(path):
                if line.startswith("TIME ") and line.split()[1] not in t:
                    t[line.split()[1]] = float(line.split()[2])
            if not {"failed", "agreed", "shrunk"} <= set(t):
                raise SystemExit(f"rank {r} did not agree and shrink:\n" + open(path).read()[-2000:])
            phases["detection"].append(t["failed"] - at)
            phases["agreement"].append(t["agreed"] - t["failed"])
            phases["shrink"].append(t["shrunk"] - t["agreed"])
        return {k: max(v) for k, v in phases.items()}  # the slowest survivor's, per phase


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--victim", type=int, default=2)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--signal", choices=["KILL", "STOP"], default="KILL")
    ap.add_argument("--transport", default="auto")
    ap.add_argument("--timeout-ms", type=int, default=3000)
    args = ap.parse_args()
    runs = [trial(args) for _ in range(args.trials)]
    print(f"# {args.ranks} ranks, {args.transport}, SIG{args.signal} of rank {args.victim}, COMM_TIMEOUT_MS="
          f"{args.timeout_ms}, {args.trials} trials; ms, the slowest survivor's per trial")
    for phase in ("detection", "agreement", "shrink"):
        values = [r[phase] for r in runs]
        print(f"{phase:10s} median {statistics.median(values):8.1f}  min {min(values):8.1f}  max {max(values):8.1f}")


if __name__ == "__main__":
    main()
