#!/usr/bin/env python3
"""Per-peer bytes and whole-call waits over shared memory, from a real 3-process job (issue 36).

    tests/observe/test_shm_counts.py BUILD_DIR

3 local ranks of tests/observe/rank_loop under comm-run (COMM_TRANSPORT=shm), rank 2 sleeping 50 ms
before each of 6 all-reduces; COMM_METRICS_TEXTFILE writes each rank's final counts at exit. Twice:
300001 floats (the direct all-reduce, shm_direct: rank r owns slice r of 100001, 100000, 100000
elements, reads each peer's input of its slice and each peer's result slice), then 16 floats (the
slots, shm_slots: each rank reads each peer's 64-byte slot). Neither moves a message, so the bytes
are what the algorithm determines: per call, from and to peer p on rank r, (len(p) + len(r)) * 4
bytes, and 64 bytes for the slots; the runtime's own dissemination barrier (the "internal"
collective) adds its one byte per message, one each way per peer with 3 ranks. Asserted exactly. The waits: on ranks 0 and 1, peer 2 must have the largest
libcomm_peer_recv_wait_seconds_total (only the ranking is asserted, never a time). Then the large
job over UCX (COMM_TRANSPORT=ucx, where libcomm was built with it): a ring, so rank 0 receives only
from rank 2, and must have waited for it. Exits 77 (skipped) without the metrics plugin.
"""
import os
import shutil
import subprocess
import sys
import tempfile

from procs import plugin_missing, read_textfile

BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
RANKS, SLOW, SLOW_MS, ITERATIONS = 3, 2, 50, 6
OWN_BYTES = 1  # the runtime's own barrier: its one-byte message each way per peer


def run_loop(out, transport, count):
    """rank_loop's job of `count` floats under comm-run over `transport`, rank SLOW sleeping SLOW_MS
    per call; each rank's final counts in out/final-<r>.prom."""
    env = dict(os.environ, COMM_TRANSPORT=transport, COMM_TIMEOUT_MS="60000",
               COMM_METRICS_TEXTFILE=os.path.join(out, "final-%r.prom"))
    for key in ("COMM_ALGO", "COMM_METRICS_ADDR", "COMM_STRAGGLER_MS"):
        env.pop(key, None)
    return subprocess.run([os.path.join(BUILD, "tools/comm-run/comm-run"), "-n", str(RANKS), "--bind", "none",
                           "--timeout-s", "60", "--", os.path.join(BUILD, "tests/observe/rank_loop"), str(ITERATIONS),
                           str(SLOW), str(SLOW_MS), str(count)], env=env, capture_output=True, text=True, timeout=90)


def slice_len(count, b):
    return count // RANKS + (1 if b < count % RANKS else 0)


def check(tmp, count, algorithm, per_call):
    """Runs the job of `count` floats; per_call(r, p): the bytes each way between ranks r and p in a call."""
    out = os.path.join(tmp, str(count))
    os.mkdir(out)
    run = run_loop(out, "shm", count)
    if run.returncode != 0:
        print(f"FAIL: the job of {count} floats failed (exit {run.returncode}):\n{(run.stdout + run.stderr)[-4000:]}")
        return False
    ok = True
    for r in range(RANKS):
        path = os.path.join(out, f"final-{r}.prom")
        if not os.path.exists(path):
            print(f"FAIL: rank {r} wrote no {path}:\n{(run.stdout + run.stderr)[-3000:]}")
            return False
        peers, algos = read_textfile(path)
        if algos.get("allreduce") != algorithm:
            print(f"FAIL: rank {r} ran the all-reduce of {count} floats with {algos.get('allreduce')}, not {algorithm}")
            ok = False
        whole = {p: v.get("libcomm_peer_recv_wait_seconds_total", 0.0) for p, v in peers.items()}
        print(f"{algorithm} rank {r}: whole-call waits "
              f"{', '.join(f'{p}: {w * 1000:.1f} ms' for p, w in sorted(whole.items()))}")
        for p in range(RANKS):
            if p == r:
                continue
            expected = ITERATIONS * per_call(r, p)
            for metric in ("libcomm_peer_sent_bytes_total", "libcomm_peer_received_bytes_total"):
                got = peers.get(p, {}).get(metric, 0)
                print(f"  peer {p}: {metric} {got:.0f} (the all-reduces' {expected})")
                if got != expected + OWN_BYTES:
                    print(f"FAIL: rank {r} peer {p}: {metric} is {got:.0f}, not {expected} (+ {OWN_BYTES} of the "
                          "runtime's own barrier)")
                    ok = False
        if r != SLOW and (not whole or max(whole, key=whole.get) != SLOW or whole[SLOW] <= 0):
            print(f"FAIL: rank {r} should have waited longest for rank {SLOW}, which sleeps {SLOW_MS} ms per call; "
                  f"its whole-call waits: {whole}")
            ok = False
    return ok


def ucx_waits(tmp, count):
    """The large job over UCX: rank 0's whole-call waits name rank 2 (its ring neighbour, the slow one)."""
    out = os.path.join(tmp, "ucx")
    os.mkdir(out)
    run = run_loop(out, "ucx", count)
    if run.returncode != 0 and "UNAVAILABLE" in run.stdout + run.stderr:
        print("SKIP (this part): libcomm was built without UCX")
        return True
    if run.returncode != 0:
        print(f"FAIL: the UCX job failed (exit {run.returncode}):\n{(run.stdout + run.stderr)[-4000:]}")
        return False
    peers, _ = read_textfile(os.path.join(out, "final-0.prom"))
    whole = {p: v.get("libcomm_peer_recv_wait_seconds_total", 0.0) for p, v in peers.items()}
    print(f"ucx rank 0: whole-call waits {', '.join(f'{p}: {w * 1000:.1f} ms' for p, w in sorted(whole.items()))}")
    if not whole or max(whole, key=whole.get) != SLOW or whole[SLOW] <= 0:
        print(f"FAIL: over UCX rank 0 should have waited longest for rank {SLOW}; its whole-call waits: {whole}")
        return False
    return True


def main():
    if plugin_missing(BUILD):
        print(plugin_missing(BUILD))
        return 77
    tmp = tempfile.mkdtemp(prefix="libcomm-shm-counts-")
    try:
        large = 300001
        ok = check(tmp, large, "shm_direct", lambda r, p: (slice_len(large, p) + slice_len(large, r)) * 4)
        ok = check(tmp, 16, "shm_slots", lambda r, p: 16 * 4) and ok
        ok = ucx_waits(tmp, large) and ok
        if ok:
            print(f"OK: over shared memory, the bytes each way per peer are the algorithms', and ranks 0-{SLOW - 1} "
                  f"waited longest for rank {SLOW} (over UCX too)")
        return 0 if ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
