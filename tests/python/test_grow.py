"""Issue 35, comm_grow from Python: run under `comm-run -n 3 --replace-failed`. Every rank checks
that Communicator.grow() gives None while nobody waits; rank 1's first process SIGKILLs itself at
step 3; the survivors shrink (agreeing on the failed rank), redo the step, and at each step
boundary call grow(); comm-run starts rank 1's replacement with COMM_JOIN=1, whose
libcomm.Communicator() returns the grown communicator. The job ends when 10 steps are done on all
3 ranks; each all-reduce is checked; comm-run exits 0 only when every slot's last process did."""

import os
import signal
import sys
import time

import numpy as np

import libcomm


def main():
    joining = os.environ.get("COMM_JOIN") == "1"
    world = int(os.environ["WORLD_SIZE"])
    comm = libcomm.Communicator()
    first_rank = comm.rank
    step = np.zeros(1, dtype=np.int64)
    if joining:
        assert comm.size == world, f"the joiner's communicator has {comm.size} ranks, not {world}"
        comm.broadcast(step, root=0)  # where the members are: right after their grow()
    else:
        assert comm.grow() is None, "grow() with nobody waiting must give None"
    grown = joining
    deadline = time.monotonic() + 100
    while True:
        assert time.monotonic() < deadline, "the job did not finish within 100 s"
        if not grown:
            bigger = comm.grow()
            if bigger is not None:
                comm.destroy()
                comm = bigger
                comm.broadcast(step, root=0)
        grown = False
        if step[0] >= 10 and comm.size == world:
            break
        if not joining and first_rank == 1 and step[0] == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        x = np.ones(64, dtype=np.float32)
        try:
            comm.allreduce(x)
        except libcomm.CommError:
            smaller = comm.shrink()  # the library finds the failed rank
            comm.destroy()
            comm = smaller
            continue  # the step again, on the survivors
        assert x[0] == comm.size, f"all-reduce gave {x[0]} on {comm.size} ranks"
        step[0] += 1
        time.sleep(0.02)
    print(f"FINAL {step[0]} {comm.rank} {comm.size}", flush=True)
    comm.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
