"""A rank killed in the middle of a collective on backend "libcomm": the others raise a
RuntimeError carrying libcomm's message within the process group's timeout, their next call
fails at once, and destroying the group does not hang. The same for a rank that stops (SIGSTOP:
alive, silent): only the timeout given to init_process_group can end that wait.

Started without a launcher (comm-run would stop the survivors as soon as one rank dies): this
script spawns 3 ranks of itself with mpirun's variables (OMPI_COMM_WORLD_*), which
libcomm.torch_backend maps to torch's env://. Exits 77 (meson: SKIP) without the extension.

Whether the victim's last all-reduce is still on the wire when it dies is the scheduler's call (on
a busy host it may finish first): the survivors then call one more all-reduce, which the victim
never joins, so they must raise whichever way it went. Time bounds are the timeout + SLACK_S:
they tell "ended by the deadline" from "hung", and a busy host may add seconds to anything."""

import datetime
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from start_gate import wait_for_every_rank

RANKS = 3
TIMEOUT_S = 5.0
SLACK_S = 20.0


def child():
    import libcomm.torch_backend  # noqa: F401
    import torch
    import torch.distributed as dist

    wait_for_every_rank(int(os.environ["OMPI_COMM_WORLD_RANK"]), RANKS)
    dist.init_process_group("libcomm", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    rank, size = dist.get_rank(), dist.get_world_size()
    t = torch.ones(1 << 24)  # 64 MiB, ~20 ms on a quiet host: caught in the middle (16 MiB took ~5 ms, the
    # victim's sleep below, and sometimes finished first)
    dist.all_reduce(t)
    assert t[0].item() == size
    if rank == size - 1:
        dist.all_reduce(t, async_op=True)
        time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGSTOP if os.environ["TEST_KILL_HOW"] == "stop" else signal.SIGKILL)
    start = time.monotonic()
    try:
        dist.all_reduce(t)  # the victim's last (it may complete before the victim dies)
        dist.all_reduce(t)  # one the victim never joins
        raise SystemExit(f"rank {rank}: all_reduce with a dead peer returned")
    except RuntimeError as e:
        took = time.monotonic() - start
        print(f"rank {rank}: raised after {took:.2f} s: {str(e)[:300]}", flush=True)
        assert "libcomm" in str(e), e
        assert took < TIMEOUT_S + SLACK_S, f"took {took:.2f} s, timeout {TIMEOUT_S} s"
        if os.environ["TEST_KILL_HOW"] == "stop":
            assert took > TIMEOUT_S / 2, f"raised after {took:.2f} s, before the timeout?"
    start = time.monotonic()
    try:
        dist.broadcast(t, src=0)
        raise SystemExit(f"rank {rank}: broadcast on a broken communicator returned")
    except RuntimeError as e:
        assert time.monotonic() - start < TIMEOUT_S + SLACK_S
        print(f"rank {rank}: next call raised too: {str(e)[:120]}", flush=True)
    start = time.monotonic()
    dist.destroy_process_group()
    print(f"rank {rank}: destroyed in {time.monotonic() - start:.2f} s", flush=True)
    sys.stdout.flush()
    os._exit(0)


def run(how):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    gate = tempfile.mkdtemp(prefix="comm-torch-kill-")
    for rank in range(RANKS):
        env = dict(os.environ, TEST_KILL_CHILD="1", TEST_KILL_HOW=how, TEST_START_GATE=gate, OMPI_COMM_WORLD_RANK=str(rank),
                   OMPI_COMM_WORLD_SIZE=str(RANKS), OMPI_COMM_WORLD_LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "COMM_TIMEOUT_MS"):
            env.pop(name, None)  # the timeout must come from init_process_group
        procs.append(subprocess.Popen([sys.executable, __file__], env=env))
    deadline = time.monotonic() + 60 + 2 * SLACK_S  # starting torch on a busy host takes a while
    codes = []
    for p in procs[:-1]:
        try:
            codes.append(p.wait(timeout=max(1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            sys.exit(f"FAIL ({how}): a rank hung (killed after {60 + 2 * SLACK_S:.0f} s)")
    if how == "stop":
        procs[-1].kill()
    codes.append(procs[-1].wait(timeout=30))
    shutil.rmtree(gate, ignore_errors=True)
    print(f"{how}: exit codes {codes}", flush=True)
    assert codes[-1] == -signal.SIGKILL, f"the victim should end by SIGKILL: {codes}"
    assert all(c == 0 for c in codes[:-1]), f"survivors failed: {codes}"
    print(f"ok ({how}): the survivors raised within the timeout ({TIMEOUT_S} s)", flush=True)


def main():
    import torch_backend_or_skip  # noqa: F401 - registers "libcomm", or SKIP
    run("kill")
    run("stop")


if __name__ == "__main__":
    child() if os.environ.get("TEST_KILL_CHILD") == "1" else main()
