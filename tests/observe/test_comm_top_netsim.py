#!/usr/bin/env python3
"""comm-top names a SIGSTOPped rank across netsim hosts, from its peers' view (issue 36).

    tests/observe/test_comm_top_netsim.py BUILD_DIR

test_comm_top.py's "stopped" case with the ranks on 4 netsim hosts (tools/netsim/netsim, one network
namespace each, root) instead of one: rank_loop's all-reduces over sockets, each rank serving its
metrics on its own host's address (COMM_METRICS_ADDR=10.77.0.<host + 1>:0, which only the simulated
hosts reach) and writing its target into a shared COMM_METRICS_FILE folder. After a few calls rank 2
gets SIGSTOP; comm-top, run inside host 0's namespace (nsenter into rank 0's), must name rank 2 as
the hang's culprit and as silent (its metrics do not answer) within 10 s, long before COMM_TIMEOUT_MS
(120 s). Exits 77 (skipped) without root or without the metrics plugin.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from procs import stop_group

BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMM_TOP = os.path.join(SOURCE, "tools", "comm-top", "comm-top")
HOSTS, CULPRIT, WITHIN_S = 4, 2, 10.0
MARK = "LIBCOMM_COMM_TOP_NETSIM_TEST"


def rank_pids(mark):
    """{RANK: pid} of this test's rank_loop processes (their environment carries MARK=mark)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != "rank_loop":
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            if env.get(MARK.encode()) == mark.encode():
                out[int(env[b"RANK"])] = int(pid)
        except (OSError, ValueError, KeyError):
            pass
    return out


def comm_top(netns_of, targets):
    """comm-top --json inside the network namespace of process netns_of (a simulated host)."""
    run = subprocess.run(["nsenter", f"--net=/proc/{netns_of}/ns/net", sys.executable, COMM_TOP, "--json",
                          "--interval", "0.5", "--hang-s", "0.5", targets], capture_output=True, text=True, timeout=30)
    return json.loads(run.stdout) if run.returncode == 0 and run.stdout else None


def main():
    if os.geteuid() != 0:
        print("SKIP: netsim needs root (network namespaces, tc)")
        return 77
    if not os.path.exists(os.path.join(BUILD, "libcomm_metrics.so")):
        print("SKIP: the metrics plugin was not built (apt-get install prometheus-cpp-dev)")
        return 77
    tmp = tempfile.mkdtemp(prefix="libcomm-comm-top-netsim-")
    targets = os.path.join(tmp, "targets")
    os.mkdir(targets)
    mark = str(os.getpid())
    env = dict(os.environ, COMM_METRICS_FILE=os.path.join(targets, "rank-%r.json"), COMM_TIMEOUT_MS="120000",
               **{MARK: mark})
    for key in ("COMM_METRICS_ADDR", "COMM_METRICS_TEXTFILE"):
        env.pop(key, None)
    # Each rank listens on its own host's address (netsim's 10.77.0.0/24, host h at .h+1).
    serve = 'COMM_METRICS_ADDR=10.77.0.$((GROUP_RANK + 1)):0 exec "$0" "$@"'
    job = subprocess.Popen([os.path.join(SOURCE, "tools/netsim/netsim"), "--hosts", str(HOSTS), "--rate", "2gbit",
                            "--port", str(29700 + os.getpid() % 200), "--", "sh", "-c", serve,
                            os.path.join(BUILD, "tests/observe/rank_loop"), "0", "-1", "0", "1"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    stopped = None
    try:
        deadline = time.monotonic() + 60
        while len(os.listdir(targets)) < HOSTS and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.1)
        pids = rank_pids(mark)
        if len([f for f in os.listdir(targets) if f.endswith(".json")]) < HOSTS or sorted(pids) != list(range(HOSTS)):
            print(f"FAIL: the ranks did not all start and write their metrics files (files {os.listdir(targets)}, "
                  f"ranks {sorted(pids)}):", job.stdout.read1().decode(errors="replace") if job.poll() is not None else "")
            return 1
        time.sleep(0.5)  # a few calls in, so every rank has heard from its peers
        stopped = pids[CULPRIT]
        os.kill(stopped, signal.SIGSTOP)
        start, last = time.monotonic(), None
        while time.monotonic() - start < WITHIN_S:
            view = comm_top(pids[0], targets)
            if view is None:
                continue
            last = view
            comm = view["comms"].get("0", {})
            hang = comm.get("hang") or {}
            if CULPRIT in hang.get("culprits", []) and CULPRIT in comm.get("silent", []):
                print(f"OK after {time.monotonic() - start:.1f} s, across {HOSTS} netsim hosts: {hang['text']}")
                print(json.dumps(comm["ranks"], indent=None))
                return 0
        print(f"FAIL: comm-top (in host 0's namespace) did not name the stopped rank {CULPRIT} within {WITHIN_S} s; "
              f"its last view:\n{json.dumps(last, indent=1)}")
        return 1
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
