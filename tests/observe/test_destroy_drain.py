#!/usr/bin/env python3
"""comm_destroy right after a collective does not reset a peer still receiving over a slow link.

    tests/observe/test_destroy_drain.py BUILD_DIR

4 netsim hosts (tools/netsim/netsim, root); host 3 sends at 10 Mbit/s (tbf, --shape host), the others
at 2 Gbit/s. All-to-alls of 256 KiB per peer (tests/observe/rank_loop, RANK_LOOP_COLL=alltoall), 8
times, then comm_destroy and exit at once, as test_slow_link.py's job. Rank 3 is done as soon as the
kernel has its bytes and the others' have come (fast), while its own still cross the slow link; its
peers beat every 50 ms meanwhile (COMM_HEARTBEAT_MS), so bytes reach rank 3 after it finished. Before
comm_destroy waited for its peers' closes (transports/socket/teardown.cc), rank 3's close met bytes
and reset the connections, and a peer failed with "rank 3 reset its connection" in 2 of 3 runs here
(6 Dec 2026). Every rank must exit 0, every round. Exits 77 (skipped) without root.
"""
import os
import subprocess
import sys

BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOSTS, SLOW, ITERATIONS, COUNT, ROUNDS = 4, 3, 8, 65536, 5  # COUNT floats per peer: 256 KiB


def main():
    if os.geteuid() != 0:
        print("SKIP: netsim needs root (network namespaces, tc)")
        return 77
    env = dict(os.environ, RANK_LOOP_COLL="alltoall", COMM_TIMEOUT_MS="60000", COMM_HEARTBEAT_MS="50")
    for key in ("COMM_METRICS_ADDR", "COMM_METRICS_TEXTFILE"):
        env.pop(key, None)
    for round_ in range(ROUNDS):
        cmd = [os.path.join(SOURCE, "tools/netsim/netsim"), "--hosts", str(HOSTS), "--rate", "2gbit",
               "--host-rate", f"{SLOW}=10mbit", "--shape", "host", "--port", str(29300 + (os.getpid() + round_) % 200),
               "--", os.path.join(BUILD, "tests/observe/rank_loop"), str(ITERATIONS), "-1", "0", str(COUNT)]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=100)
        if run.returncode != 0:
            print(f"FAIL: round {round_ + 1} of {ROUNDS}: the job failed (exit {run.returncode}):\n"
                  f"{(run.stdout + run.stderr)[-4000:]}")
            return 1
    print(f"OK: {ROUNDS} rounds, every rank received all of rank {SLOW}'s last all-to-all after rank {SLOW} destroyed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
