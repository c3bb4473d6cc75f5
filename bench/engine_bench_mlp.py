#!/usr/bin/python3
"""A model torch really computes (an MLP on the CPU), trained with torch's DDP over gloo and with
libcomm's DDP wrapper, bucket order (FIFO, as torch's DDP) and priority partitions with the
optimizer deferred into the next forward (overlap_forward), alternating blocks of steps in one run.

    comm-run -n 2 --bind none -- /usr/bin/python3 bench/engine_bench_mlp.py
    tools/netsim/netsim --hosts 2 --rate 2gbit -- /usr/bin/python3 bench/engine_bench_mlp.py

A step is zero_grad, forward, backward, optimizer step (SGD with momentum); a block is --block
steps timed together (overlap_forward carries a step's communication into the next forward), then
a barrier. Prints per engine the median step time of the slowest rank, and at the end the largest
difference of libcomm's parameters from torch DDP's after the same steps on the same data.
Install libopenblas0-pthread first (Debian's default BLAS is the slow reference one)."""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import libcomm  # noqa: E402
from benchlib import init_gloo_beside  # noqa: E402
from libcomm.torch_ddp import DistributedDataParallel as CommDDP  # noqa: E402


def mlp(width, depth, inputs, outputs):
    layers = [torch.nn.Linear(inputs, width), torch.nn.ReLU()]
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, outputs))
    return torch.nn.Sequential(*layers)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--depth", type=int, default=5, help="hidden width x width layers")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--block", type=int, default=4, help="steps timed together")
    ap.add_argument("--iters", type=int, default=5, help="blocks per engine")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    ap.add_argument("--partition-mb", type=float, default=None)
    ap.add_argument("--engines", default="gloo,fifo,overlap")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    comm = libcomm.Communicator()
    rank, size = comm.rank, comm.size
    init_gloo_beside(rank, size)

    torch.manual_seed(0)
    base = mlp(args.width, args.depth, args.width, 16)
    nparams = sum(p.numel() for p in base.parameters())
    names = args.engines.split(",")
    models, opts = {}, {}
    for name in names:
        m = mlp(args.width, args.depth, args.width, 16)
        m.load_state_dict(base.state_dict())
        if name == "gloo":
            w = torch.nn.parallel.DistributedDataParallel(m)
        else:
            os.environ["COMM_ENGINE_SCHEDULE"] = "fifo" if name == "fifo" else "priority"
            w = CommDDP(m, comm, overlap_forward=name == "overlap", partition_mb=args.partition_mb)
            os.environ.pop("COMM_ENGINE_SCHEDULE")
        opt = torch.optim.SGD(w.parameters(), lr=1e-3, momentum=0.9)
        if name == "overlap":
            opt = w.overlap_optimizer(opt)
        models[name], opts[name] = w, opt
    label = {"gloo": "torch DDP (gloo)", "fifo": "libcomm fifo", "overlap": "libcomm overlap"}

    g = torch.Generator().manual_seed(rank)
    data = [(torch.randn(args.batch, args.width, generator=g), torch.randn(args.batch, 16, generator=g))
            for _ in range(args.block)]

    def block(name):
        w, opt = models[name], opts[name]
        dist.barrier()
        t0 = time.perf_counter()
        for x, y in data:
            opt.zero_grad()
            torch.nn.functional.mse_loss(w(x), y).backward()
            opt.step()
        if name == "overlap":
            opt.flush()  # the block's last step applied before the clock stops
        t = torch.tensor([(time.perf_counter() - t0) * 1000 / len(data)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    for name in names:  # warm-up (first touch of buffers, gloo's pairs)
        block(name)
    times = {name: [] for name in names}
    for _ in range(args.iters):
        for name in names:
            times[name].append(block(name))
    # Compute alone: the same steps with no DDP (plain model, local optimizer).
    plain = mlp(args.width, args.depth, args.width, 16)
    popt = torch.optim.SGD(plain.parameters(), lr=1e-3, momentum=0.9)
    comp = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        for x, y in data:
            popt.zero_grad()
            torch.nn.functional.mse_loss(plain(x), y).backward()
            popt.step()
        comp.append((time.perf_counter() - t0) * 1000 / len(data))

    def med(v):
        return sorted(v)[len(v) // 2]

    diffs = {}
    ref = models.get("gloo")
    for name in names:
        if name == "gloo" or ref is None:
            continue
        d = max((p.detach() - q.detach()).abs().max().item()
                for p, q in zip(ref.module.parameters(), models[name].module.parameters()))
        diffs[name] = d
    if rank == 0:
        s = models[names[-1]].stats() if names[-1] != "gloo" else {}
        print(f"# engine_bench_mlp: {size} ranks, MLP {args.width}x{args.depth}, {nparams / 1e6:.1f}M float32 "
              f"parameters, batch {args.batch}, {args.threads} thread(s); compute alone (no DDP) "
              f"{med(comp):.1f} ms/step; partitions {s.get('num_partitions', '-')}")
        print(f"# medians of {args.iters} blocks of {args.block} steps, engines alternating; slowest rank")
        print(f"{'engine':>18} {'step_ms':>9} {'vs gloo':>8}")
        for name in names:
            ratio = med(times["gloo"]) / med(times[name]) if "gloo" in times else float("nan")
            print(f"{label[name]:>18} {med(times[name]):9.1f} {ratio:7.3f}x")
        for name, d in diffs.items():
            print(f"# {label[name]}: largest |parameter - torch DDP's| after the same steps: {d:.3g}")
        for name in names:
            if name == "gloo":
                continue
            st = models[name].stats()
            parts = sorted(st["partitions"], key=lambda p: p["wire_order"])
            print(f"# {label[name]} last step: comm {st['comm_us'] / 1e3:.0f} ms in {st['num_partitions']} partitions, "
                  f"{st['rounds']} rounds ({st['round_us'] / 1e3:.1f} ms), exposed {st['exposed_comm_us'] / 1e3:.0f} ms, "
                  f"forward waits {st['forward_wait_us'] / 1e3:.0f} ms; wire order by first parameter: "
                  f"{[p['first_param'] for p in parts]}")
    for w in models.values():
        if hasattr(w, "close"):
            w.close()
    dist.destroy_process_group()
    comm.destroy()
    sys.stdout.flush()
    os._exit(0)  # see bench/engine_bench_torch.py: gloo's worker thread at interpreter exit


if __name__ == "__main__":
    main()
