#!/usr/bin/env python3
"""comm-top names the rank that holds a job up, within 5 s (issue 36).

    tests/observe/test_comm_top.py BUILD_DIR stopped     a SIGSTOPped rank, through its peers' waits
    tests/observe/test_comm_top.py BUILD_DIR straggler   a rank whose loop sleeps 200 ms per step
    tests/observe/test_comm_top.py BUILD_DIR store       the ranks found through the job's store while it
                                                         lives, proving COMM_AUTH_TOKEN (a wrong one is refused)

4 local ranks of rank_loop (all-reduces in a loop) under comm-run, with COMM_METRICS_ADDR and
COMM_METRICS_FILE; comm-top --json reads the files. COMM_TIMEOUT_MS is 120 s: comm-top must name
the rank long before anything times out. In the store mode the job runs with COMM_AUTH_TOKEN and
no COMM_METRICS_FILE: comm-top --store (MASTER_PORT fixed by the test) must find all 4 ranks with the
token, and be refused, naming COMM_AUTH_TOKEN, with a wrong one or none. Exits 77 (skipped) when the metrics plugin was not built.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from procs import COMM_TOP, comm_top, names_stopped, plugin_missing, rank_pids, stop_group

BUILD = os.path.abspath(sys.argv[1])
MODE = sys.argv[2]
RANKS, CULPRIT, WITHIN_S = 4, 2, 5.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def store_mode():
    """comm-top --store: the ranks from the job's store, the token proven; a wrong token refused."""
    token, port = "observe-s3cret", free_port()
    env = dict(os.environ, COMM_METRICS_ADDR="127.0.0.1:0", COMM_TIMEOUT_MS="120000", COMM_AUTH_TOKEN=token,
               MASTER_PORT=str(port))
    env.pop("COMM_METRICS_FILE", None)
    job = subprocess.Popen([os.path.join(BUILD, "tools/comm-run/comm-run"), "-n", str(RANKS), "--bind", "none",
                            "--timeout-s", "90", "--", os.path.join(BUILD, "tests/observe/rank_loop"), "0", "-1", "0",
                            "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    top_env = dict(os.environ, COMM_TOP_STORE=os.path.join(BUILD, "tools/comm-top/comm-top-store"))
    top_env.pop("COMM_AUTH_TOKEN", None)

    def top(token_value):
        e = dict(top_env, **({"COMM_AUTH_TOKEN": token_value} if token_value else {}))
        return subprocess.run([sys.executable, COMM_TOP, "--json", "--interval", "0.3", "--store", f"127.0.0.1:{port}"],
                              env=e, capture_output=True, text=True, timeout=60)
    try:
        deadline, run, ranks = time.monotonic() + 30, None, []
        while time.monotonic() < deadline and job.poll() is None:
            run = top(token)
            if run.returncode == 0:
                rows = json.loads(run.stdout)["comms"].get("0", {}).get("ranks", [])
                ranks = sorted(r["rank"] for r in rows if r.get("answered") and r.get("last_done_seq", 0) > 0)
                if ranks == list(range(RANKS)):
                    break
            time.sleep(0.3)
        if ranks != list(range(RANKS)):
            print(f"FAIL: comm-top --store with the job's COMM_AUTH_TOKEN did not find the {RANKS} ranks (found {ranks});"
                  f" last run: exit {run.returncode if run else None}\n{(run.stdout + run.stderr)[-3000:] if run else ''}"
                  f"{job.stdout.read1().decode(errors='replace') if job.poll() is not None else ''}")
            return 1
        print(f"OK: comm-top --store found ranks {ranks} through the job's store, proving COMM_AUTH_TOKEN")
        for wrong in ("not-the-token", None):
            run = top(wrong)
            out = run.stdout + run.stderr
            if run.returncode == 0 or "COMM_AUTH_TOKEN" not in run.stderr or token in out:
                print(f"FAIL: comm-top --store with {'a wrong' if wrong else 'no'} COMM_AUTH_TOKEN must fail naming "
                      f"COMM_AUTH_TOKEN (and never print the token); exit {run.returncode}:\n{out[-3000:]}")
                return 1
            print(f"OK: {'a wrong' if wrong else 'no'} token is refused:", run.stderr.strip().splitlines()[-1][:300])
        if job.poll() is not None:
            print("FAIL: the job ended while comm-top asked its store:", job.stdout.read1().decode(errors="replace"))
            return 1
        return 0
    finally:
        stop_group(job, grace_s=15)


def main():
    if plugin_missing(BUILD):
        print(plugin_missing(BUILD))
        return 77
    if MODE == "store":
        return store_mode()
    tmp = tempfile.mkdtemp(prefix="libcomm-comm-top-")
    targets = os.path.join(tmp, "targets")
    os.mkdir(targets)
    env = dict(os.environ, COMM_METRICS_ADDR="127.0.0.1:0", COMM_METRICS_FILE=os.path.join(targets, "rank-%r.json"),
               COMM_TIMEOUT_MS="120000")
    slow = ["3", "200"] if MODE == "straggler" else ["-1", "0"]
    job = subprocess.Popen([os.path.join(BUILD, "tools/comm-run/comm-run"), "-n", str(RANKS), "--bind", "none",
                            "--timeout-s", "90", "--", os.path.join(BUILD, "tests/observe/rank_loop"), "0", *slow, "1"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    stopped = None
    try:
        deadline = time.monotonic() + 30
        while len(os.listdir(targets)) < RANKS and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.1)
        if len([f for f in os.listdir(targets) if f.endswith(".json")]) < RANKS:
            print("FAIL: the ranks did not write their metrics files:", job.stdout.read1().decode(errors="replace")
                  if job.poll() is not None else os.listdir(targets))
            return 1
        if MODE == "stopped":
            time.sleep(0.5)  # a few calls in, so every rank has heard from its peers
            pids = rank_pids(parent=job.pid)
            stopped = pids[CULPRIT]
            os.kill(stopped, signal.SIGSTOP)
        start = time.monotonic()
        last = None
        while time.monotonic() - start < WITHIN_S:
            view = comm_top(targets, "--interval", "0.5", "--hang-s", "0.5")
            elapsed = time.monotonic() - start
            if view is None:
                continue
            last = view
            comm = view["comms"].get("0", {})
            if MODE == "stopped":
                text = names_stopped(view, CULPRIT)
                if text:
                    print(f"OK after {elapsed:.1f} s: {text}")
                    break
            else:
                named = [s for s in comm.get("stragglers", []) if s["rank"] == 3]
                others = [s for s in comm.get("stragglers", []) if s["rank"] != 3]
                if named and not others:
                    print(f"OK after {elapsed:.1f} s: {named[0]['text']}")
                    break
        else:
            print(f"FAIL: comm-top did not name the {'stopped rank ' + str(CULPRIT) if MODE == 'stopped' else 'slow rank 3'}"
                  f" within {WITHIN_S} s; its last view:\n{json.dumps(last, indent=1)}")
            return 1
        print(json.dumps(last["comms"]["0"]["ranks"], indent=None))
        return 0
    finally:
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGCONT)
            except OSError:
                pass
        stop_group(job, grace_s=15)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
