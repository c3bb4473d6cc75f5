#!/usr/bin/env python3
"""A link slowed with tc tbf shows as that peer's wait (issue 36).

    tests/observe/test_slow_link.py BUILD_DIR

4 netsim hosts (tools/netsim/netsim, one network namespace each, root), every link at 2 Gbit/s but
host 3's outgoing one at 10 Mbit/s (tbf, --shape host). Every rank runs all-to-alls of 256 KiB per
peer (tests/observe/rank_loop, RANK_LOOP_COLL=alltoall), so each rank receives from each other;
COMM_METRICS_TEXTFILE writes each rank's final counts at exit. On ranks 0, 1 and 2, peer 3 must
have the largest libcomm_peer_transfer_wait_seconds_total (their waits for its bytes in transit),
and the bytes each way must be the all-to-alls' (each peer's share); comm-top, reading those final
counts, must name rank 3's link as the slow one, seen by at least two of ranks 0, 1 and 2 (a rank
descheduled on a busy machine may delay its own bytes too). Only the ranking is asserted, never a time: at
10 Mbit/s against 2 Gbit/s the slow link's share is a hundredfold, whatever the machine's load.
Exits 77 (skipped) without root or without the metrics plugin.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from procs import COMM_TOP, SOURCE, plugin_missing, read_textfile

BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
HOSTS, SLOW, ITERATIONS, COUNT = 4, 3, 8, 65536  # COUNT floats per peer: 256 KiB


def main():
    if os.geteuid() != 0:
        print("SKIP: netsim needs root (network namespaces, tc)")
        return 77
    if plugin_missing(BUILD):
        print(plugin_missing(BUILD))
        return 77
    tmp = tempfile.mkdtemp(prefix="libcomm-slow-link-")
    try:
        env = dict(os.environ, RANK_LOOP_COLL="alltoall", COMM_TIMEOUT_MS="60000",
                   COMM_METRICS_TEXTFILE=os.path.join(tmp, "final-%r.prom"))
        cmd = [os.path.join(SOURCE, "tools/netsim/netsim"), "--hosts", str(HOSTS), "--rate", "2gbit",
               "--host-rate", f"{SLOW}=10mbit", "--shape", "host", "--port", str(29600 + os.getpid() % 300), "--",
               os.path.join(BUILD, "tests/observe/rank_loop"), str(ITERATIONS), "-1", "0", str(COUNT)]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=100)
        if run.returncode != 0:
            print(f"FAIL: the job failed (exit {run.returncode}):\n{(run.stdout + run.stderr)[-4000:]}")
            return 1
        views = {}
        for r in range(HOSTS):
            path = os.path.join(tmp, f"final-{r}.prom")
            if not os.path.exists(path):
                print(f"FAIL: rank {r} wrote no {path} (COMM_METRICS_TEXTFILE):\n{(run.stdout + run.stderr)[-3000:]}")
                return 1
            views[r] = read_textfile(path)[0]
        ok = True
        expected = ITERATIONS * COUNT * 4
        for r in range(HOSTS):
            waits = {p: v.get("libcomm_peer_transfer_wait_seconds_total", 0.0) for p, v in views[r].items()}
            whole = {p: v.get("libcomm_peer_recv_wait_seconds_total", 0.0) for p, v in views[r].items()}
            print(f"rank {r}: transfer waits {', '.join(f'{p}: {w * 1000:.0f} ms' for p, w in sorted(waits.items()))};"
                  f" whole-call waits {', '.join(f'{p}: {w * 1000:.0f} ms' for p, w in sorted(whole.items()))}")
            for p, v in views[r].items():
                for metric in ("libcomm_peer_sent_bytes_total", "libcomm_peer_received_bytes_total"):
                    # The all-to-alls' bytes, and a byte or two of the runtime's own (a barrier's message).
                    if not expected <= v.get(metric, 0) <= expected + 16:
                        print(f"FAIL: rank {r} peer {p}: {metric} is {v.get(metric)}, not {expected} (+ a barrier's)")
                        ok = False
            if len(views[r]) != HOSTS - 1:
                print(f"FAIL: rank {r} lists peers {sorted(views[r])}, not the {HOSTS - 1} others")
                ok = False
            if r != SLOW and waits and max(waits, key=waits.get) != SLOW:
                print(f"FAIL: rank {r} waited longest for peer {max(waits, key=waits.get)}'s bytes, not the slow "
                      f"link's rank {SLOW}")
                ok = False
        # comm-top reads the same final counts and names the slow link.
        top = subprocess.run([sys.executable, COMM_TOP, "--json", "--interval",
                              "0", *[os.path.join(tmp, f"final-{r}.prom") for r in range(HOSTS)]],
                             capture_output=True, text=True, timeout=30)
        links = json.loads(top.stdout)["comms"].get("0", {}).get("slow_links", []) if top.returncode == 0 else None
        top_link = max(links or [{"rank": None, "seen_by": []}], key=lambda l: len(l["seen_by"]))
        if top_link["rank"] != SLOW or len(set(top_link["seen_by"]) & set(range(SLOW))) < 2:
            print(f"FAIL: comm-top --json on the final counts should name rank {SLOW}'s link, seen by most of ranks "
                  f"0-{SLOW - 1}; it says {links} (exit {top.returncode}) {top.stderr[-2000:]}")
            ok = False
        else:
            print("OK: comm-top says:", top_link["text"])
        if ok:
            print(f"OK: ranks 0-{SLOW - 1} each waited longest for rank {SLOW}'s bytes (its link slowed with tbf)")
        return 0 if ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
