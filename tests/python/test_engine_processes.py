"""The engine's partition schedule across real processes (no launcher: this script spawns its
ranks with torchrun's variables, because comm-run would stop the survivors when one dies):

- order: 3 and 4 ranks report gradients in a different random order each, with small random
  pauses; every rank ran the partitions in the same order (the stats' wire_order, gathered), and
  the gradients equal a plain all-reduce of each (max: exact whatever the association).
- death: with overlap_forward, the last rank exits in the middle of a step (after end(), with
  partitions still on the wire); every survivor's next engine call (wait, or begin) fails within
  the timeout, naming the error, and destroy returns. The dying rank never reports gradient 0, so
  the partitions that hold it cannot finish before it goes, whatever the scheduler does (it used
  to report all of them: on a busy host its engine thread could finish the step before the exit,
  and the survivors went on).

Time bounds are the timeout + SLACK_S: they tell "ended by the deadline" from "hung", and a busy
host (CI beside other jobs) may add seconds to anything (tests/support/loaded_host.h)."""

import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

from start_gate import wait_for_every_rank

TIMEOUT_MS = 4000
SLACK_S = 20

SIZES = [3, 5000, 1, 20000, 0, 257, 4096, 700, 9000]


def child():
    import libcomm
    wait_for_every_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    comm = libcomm.Communicator(timeout_ms=TIMEOUT_MS)
    rank, size = comm.rank, comm.size
    scenario = os.environ["TEST_SCENARIO"]
    eng = libcomm.Engine(comm, bucket_cap_bytes=32 << 10, first_bucket_bytes=4 << 10, partition_bytes=2048,
                         op="max", overlap_forward=scenario == "death")
    for n in SIZES:
        eng.register(n, "float32")
    eng.finalize()
    rng = random.Random(rank * 7 + 1)
    if scenario == "order":
        for step in range(3):
            gs = [np.random.default_rng(100 * step + 10 * rank + i).standard_normal(n).astype(np.float32)
                  for i, n in enumerate(SIZES)]
            want = [g.copy() for g in gs]
            order = list(range(len(SIZES)))
            rng.shuffle(order)
            eng.begin(True)
            for i in order:
                time.sleep(rng.random() * 0.004)
                eng.grad_ready(i, gs[i])
            eng.end()
            for i, w in enumerate(want):
                comm.allreduce(w, op="max")
                assert np.array_equal(gs[i], w), f"rank {rank} step {step} gradient {i} differs"
            s = eng.stats()
            mine = np.array([p["wire_order"] for p in s["partitions"]], np.int32)
            every = np.zeros(size * len(mine), np.int32)
            comm.allgather(mine, every)
            for r in range(size):
                assert np.array_equal(every[r * len(mine):(r + 1) * len(mine)], mine), \
                    f"rank {rank} step {step}: wire order differs from rank {r}'s"
            assert s["num_partitions"] > s["num_buckets"] and s["rounds"] >= 1, s
            # Rounds without news are not held (schedule.cc): at most ~2 per partition, not thousands.
            assert s["rounds"] <= 2 * s["num_partitions"] + 2, f"{s['rounds']} rounds for {s['num_partitions']} partitions"
        print(f"rank {rank}: same wire order on {size} ranks, {s['num_partitions']} partitions, "
              f"{s['rounds']} rounds", flush=True)
    else:
        big = [np.ones(n, np.float32) for n in SIZES]
        eng.begin(True)
        dying = rank == size - 1
        for i in reversed(range(1 if dying else 0, len(SIZES))):
            eng.grad_ready(i, big[i])
        if dying:
            os._exit(0)  # gone in the middle of the step, gradient 0 never reported
        eng.end()
        start = time.monotonic()
        try:
            for i in range(len(SIZES)):
                eng.wait(i)
            eng.begin(True)
            raise SystemExit(f"rank {rank}: the engine went on without a peer")
        except libcomm.CommError as e:
            took = time.monotonic() - start
            print(f"rank {rank}: raised after {took:.2f} s: {str(e)[:200]}", flush=True)
            assert took < TIMEOUT_MS / 1000 + SLACK_S, f"took {took:.2f} s"
        try:
            eng.begin(True)
            raise SystemExit(f"rank {rank}: begin on a broken engine returned")
        except libcomm.CommError:
            pass
        start = time.monotonic()
        try:
            eng.destroy()
        except libcomm.CommError:
            pass
        assert time.monotonic() - start < TIMEOUT_MS / 1000 + SLACK_S
    sys.stdout.flush()
    os._exit(0)


def run(scenario, ranks):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    gate = tempfile.mkdtemp(prefix="comm-engine-processes-")
    for rank in range(ranks):
        env = dict(os.environ, TEST_ENGINE_CHILD="1", TEST_SCENARIO=scenario, TEST_START_GATE=gate, RANK=str(rank),
                   WORLD_SIZE=str(ranks), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        env.pop("COMM_TIMEOUT_MS", None)
        procs.append(subprocess.Popen([sys.executable, __file__], env=env))
    deadline = time.monotonic() + 90
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            sys.exit(f"FAIL ({scenario}, {ranks} ranks): a rank hung (killed after 90 s)")
    shutil.rmtree(gate, ignore_errors=True)
    assert all(c == 0 for c in codes), f"{scenario}, {ranks} ranks: exit codes {codes}"
    print(f"ok {scenario} on {ranks} ranks", flush=True)


def main():
    run("order", 3)
    run("order", 4)
    run("death", 3)


if __name__ == "__main__":
    child() if os.environ.get("TEST_ENGINE_CHILD") == "1" else main()
