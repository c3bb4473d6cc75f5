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

from procs import SOURCE, comm_top, names_stopped, plugin_missing, rank_pids, stop_group

BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
HOSTS, CULPRIT, WITHIN_S = 4, 2, 10.0
MARK = "LIBCOMM_COMM_TOP_NETSIM_TEST"


def main():
    if os.geteuid() != 0:
        print("SKIP: netsim needs root (network namespaces, tc)")
        return 77
    if plugin_missing(BUILD):
        print(plugin_missing(BUILD))
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
        pids = rank_pids(mark=(MARK, mark))
        if len([f for f in os.listdir(targets) if f.endswith(".json")]) < HOSTS or sorted(pids) != list(range(HOSTS)):
            print(f"FAIL: the ranks did not all start and write their metrics files (files {os.listdir(targets)}, "
                  f"ranks {sorted(pids)}):", job.stdout.read1().decode(errors="replace") if job.poll() is not None else "")
            return 1
        time.sleep(0.5)  # a few calls in, so every rank has heard from its peers
        stopped = pids[CULPRIT]
        os.kill(stopped, signal.SIGSTOP)
        start, last = time.monotonic(), None
        while time.monotonic() - start < WITHIN_S:
            view = comm_top(targets, "--interval", "0.5", "--hang-s", "0.5", netns_of=pids[0])
            if view is None:
                continue
            last = view
            text = names_stopped(view, CULPRIT)
            if text:
                print(f"OK after {time.monotonic() - start:.1f} s, across {HOSTS} netsim hosts: {text}")
                print(json.dumps(view["comms"]["0"]["ranks"], indent=None))
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
