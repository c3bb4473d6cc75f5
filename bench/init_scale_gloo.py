#!/usr/bin/python3
"""One rank of bench/init_scale.sh's Gloo rows (DRIVER=bench/init_scale_gloo.py): torch.distributed's
init_process_group("gloo") (Debian's python3-torch 1.13: ProcessGroupGloo connects a full mesh with
Gloo's connectFullMesh inside init; a TCPStore on rank 0 at MASTER_ADDR:MASTER_PORT), then the same
steps as bench/init_scale.c: a barrier, a first and later 8 B all-reduces, a checked 1 MiB
all-reduce; prints the same INIT_SCALE line.

Importing torch takes seconds of CPU per process (tens of seconds when hundreds start on 2 cores),
and comm_init has nothing like it, so init is timed from the moment every rank has imported torch:
each rank creates a file in INIT_SCALE_GLOO_DIR (default /tmp/init-scale-gloo-<TORCHELASTIC_RUN_ID>)
and waits (polling, with a deadline) until all WORLD_SIZE files are there."""

import datetime
import os
import resource
import sys
import time

import torch
import torch.distributed as dist


def open_fds():
    return len(os.listdir("/proc/self/fd")) - 1  # the listing's own descriptor


def store_connections():
    """Established TCP connections on MASTER_PORT's local side: the TCPStore's clients (as init_scale.c)."""
    port = int(os.environ["MASTER_PORT"])
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == "01":
                n += 1
    return n


def all_imported(rank, size, deadline_s=600):
    d = os.environ.get("INIT_SCALE_GLOO_DIR", f"/tmp/init-scale-gloo-{os.environ.get('TORCHELASTIC_RUN_ID', 'x')}")
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, str(rank)), "w").close()
    end = time.monotonic() + deadline_s
    while len(os.listdir(d)) < size:
        if time.monotonic() > end:
            sys.exit(f"init_scale_gloo: rank {rank}: only {len(os.listdir(d))} of {size} ranks imported torch "
                     f"within {deadline_s} s (files in {d})")
        time.sleep(0.05)


def main():
    later = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    all_imported(rank, size)
    fds_pre = open_fds()

    t0 = time.monotonic()
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                            rank=rank, world_size=size, timeout=datetime.timedelta(seconds=600))
    t_init = time.monotonic() - t0
    fds_init = open_fds()
    store_init = store_connections() if rank == 0 else -1

    t = time.monotonic()
    dist.barrier()
    t_barrier = time.monotonic() - t

    x = torch.tensor([float(rank)], dtype=torch.float64)
    t = time.monotonic()
    dist.all_reduce(x)
    t_first = time.monotonic() - t
    assert x.item() == size * (size - 1) / 2, f"rank {rank}: 8 B all-reduce gave {x.item()}"
    t = time.monotonic()
    for _ in range(later):
        x = torch.tensor([float(rank)], dtype=torch.float64)
        dist.all_reduce(x)
    t_later = (time.monotonic() - t) / later if later > 0 else 0

    count = (1 << 20) // 4
    big = ((torch.arange(count, dtype=torch.int64) + rank) % 7).to(torch.float32)
    t = time.monotonic()
    dist.all_reduce(big)
    t_big = time.monotonic() - t
    idx = torch.arange(0, count, 997)
    want = sum(((idx + r) % 7) for r in range(size)).to(torch.float32)
    assert torch.equal(big[idx], want), f"rank {rank}: 1 MiB all-reduce is wrong"

    fds_end = open_fds()
    store_end = store_connections() if rank == 0 else -1
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"INIT_SCALE rank={rank} size={size} init_s={t_init:.4f} barrier_s={t_barrier:.4f} first8_s={t_first:.5f} "
          f"later8_s={t_later:.6f} big_s={t_big:.4f} fds_init={fds_init} fds_end={fds_end} rss_kb={rss_kb} "
          f"store_init={store_init} store_end={store_end} fds_pre={fds_pre}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
