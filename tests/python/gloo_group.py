"""torch.distributed over gloo beside libcomm in the Python tests: rank 0 picks a free port and
shares it through the libcomm communicator (imported by the tests that compare with torch's DDP)."""

import datetime
import socket

import numpy as np
import torch.distributed as dist


def gloo(comm):
    """Initialises the default process group once (gloo, 60 s timeout: a failed peer is no 30 min wait)."""
    if dist.is_initialized():
        return
    port = np.zeros(1, np.int64)
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port[0] = s.getsockname()[1]
    comm.broadcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{int(port[0])}", rank=comm.rank,
                            world_size=comm.size, timeout=datetime.timedelta(seconds=60))
