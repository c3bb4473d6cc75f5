#!/usr/bin/python3
"""engine-bench's layer list and synthetic backward under PyTorch 1.13: libcomm's DDP wrapper
(python/libcomm/torch_ddp.py on the gradient engine) against torch's own DDP over gloo, on the
same model and links, alternating in one run.

    comm-run -n 2 --bind none -- /usr/bin/python3 bench/engine_bench_torch.py
    sudo tools/netsim/netsim --hosts 2 --rate 2gbit -- /usr/bin/python3 bench/engine_bench_torch.py

Each layer is an autograd Function whose backward waits its share of --compute-ms (an
accelerator computing) and then hands back its parameters' gradients (buffers made once, so no
step allocates): DDP's hooks see them in backward order, as in a real model. Per iteration, for
each engine: compute alone (a copy of the model that no DDP hooked), communication alone (the same backward with no
compute), and the step; medians of the slowest rank's times. gloo's store listens on
MASTER_PORT + 1 (libcomm's uses MASTER_PORT)."""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import init_gloo_beside  # noqa: E402


def layer_list(layers, d, vocab):
    """(count, layer) in definition order: bench/engine_bench.cc's list."""
    t = [(vocab * d, 0)]
    for l in range(layers):
        for n in (d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d):
            t.append((n, l + 1))
    t += [(d, layers + 1), (d, layers + 1)]
    return t


class Layer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, box, *params):
        ctx.box = box
        return x.clone()

    @staticmethod
    def backward(ctx, gx):
        ms, grads = ctx.box["ms"], ctx.box["grads"]
        if ms > 0:
            time.sleep(ms / 1000)
        return (gx, None, *grads)


class Model(torch.nn.Module):
    def __init__(self, tensors, rank):
        super().__init__()
        self.params = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(n)) for n, _ in tensors])
        self.layers = sorted({l for _, l in tensors})
        self.of = {l: [i for i, (_, ll) in enumerate(tensors) if ll == l] for l in self.layers}
        total = sum(n for n, l in tensors if l > 0)  # the embedding's backward: next to nothing
        self.share = {l: sum(tensors[i][0] for i in self.of[l]) / total if l > 0 else 0.0
                      for l in self.layers}
        self.boxes = {l: {"ms": 0.0, "grads": [torch.full((tensors[i][0],), 1e-3 * (rank + 1))
                                               for i in self.of[l]]} for l in self.layers}

    def set_compute(self, ms):
        for l in self.layers:
            self.boxes[l]["ms"] = ms * self.share[l]

    def forward(self, x):
        for l in self.layers:
            x = Layer.apply(x, self.boxes[l], *[self.params[i] for i in self.of[l]])
        return x.sum()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--compute-ms", type=float, default=-1,
                    help="backward compute per step (default: the larger measured comm-only time)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--bucket-cap-mb", type=float, default=25)
    args = ap.parse_args()
    # After the arguments: --help works where the library is not built or not found.
    import libcomm
    from libcomm.torch_ddp import DistributedDataParallel as CommDDP
    torch.set_num_threads(1)

    comm = libcomm.Communicator()
    rank, size = comm.rank, comm.size
    init_gloo_beside(rank, size)

    tensors = layer_list(args.layers, args.d_model, args.vocab)
    total = sum(n for n, _ in tensors)
    x = torch.ones(1)
    models = {"torch DDP (gloo)": Model(tensors, rank), "libcomm": Model(tensors, rank)}
    # Compute alone runs a model no DDP has hooked (libcomm's hooks would run its engine).
    plain = Model(tensors, rank)
    wrapped = {
        "torch DDP (gloo)": torch.nn.parallel.DistributedDataParallel(
            models["torch DDP (gloo)"], bucket_cap_mb=args.bucket_cap_mb),
        "libcomm": CommDDP(models["libcomm"], comm, bucket_cap_mb=args.bucket_cap_mb),
    }

    def timed(fn):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        t = torch.tensor([(time.perf_counter() - t0) * 1000])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def step(name, use_ddp):
        m = wrapped[name] if use_ddp else plain
        (models[name] if use_ddp else plain).zero_grad(set_to_none=False)
        m(x).backward()

    def med(v):
        return sorted(v)[len(v) // 2]

    for name in wrapped:
        models[name].set_compute(0)
        for _ in range(args.warmup):
            timed(lambda: step(name, True))
    compute_ms = args.compute_ms
    if compute_ms < 0:
        compute_ms = max(med([timed(lambda: step(name, True)) for _ in range(3)]) for name in wrapped)
    res = {name: {"compute": [], "comm": [], "step": []} for name in wrapped}
    for _ in range(args.iters):
        for name in wrapped:
            plain.set_compute(compute_ms)
            res[name]["compute"].append(timed(lambda: step(name, False)))
            models[name].set_compute(0)
            res[name]["comm"].append(timed(lambda: step(name, True)))
            models[name].set_compute(compute_ms)
            res[name]["step"].append(timed(lambda: step(name, True)))
    if rank == 0:
        print(f"# engine_bench_torch: {size} ranks, {len(tensors)} tensors, {total / 1e6:.1f}M float32 "
              f"parameters, compute {compute_ms:.0f} ms per backward (waits), bucket cap {args.bucket_cap_mb} MB")
        print(f"# medians of {args.iters} iterations, engines alternating; the slowest rank's time")
        print(f"{'engine':>18} {'compute_ms':>11} {'comm_ms':>9} {'step_ms':>9} {'step/max':>9}")
        steps = {}
        for name, r in res.items():
            c, m, s = med(r["compute"]), med(r["comm"]), med(r["step"])
            steps[name] = s
            print(f"{name:>18} {c:11.1f} {m:9.1f} {s:9.1f} {s / max(c, m):9.3f}")
        print(f"# libcomm step / torch DDP step: {steps['libcomm'] / steps['torch DDP (gloo)']:.3f}")
    for w in wrapped.values():
        if hasattr(w, "close"):
            w.close()
    dist.destroy_process_group()
    comm.destroy()
    # torch 1.13: DDP's reducer still holds gloo's process group; destroyed at interpreter exit,
    # ~ProcessGroupGloo joins a worker thread that waits for the GIL the exiting thread holds.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
