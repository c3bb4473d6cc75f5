#!/usr/bin/python3
"""The torch.distributed backend "libcomm" against gloo and against comm_allreduce called
directly, all in one job, alternating (the machines are shared: a ratio measured in one run is
the result, docs/torch-backend.md).

  all-reduce: per size, the time of one dist.all_reduce on the libcomm backend, on gloo, and of
              comm_allreduce called directly (ctypes, no torch) on the backend's communicator,
              ROUNDS alternating rounds of ITERS calls each, medians.
  ddp:        two copies of the same model, one in torch's DDP on the libcomm backend, one on
              gloo; ROUNDS alternating rounds of STEPS training steps each; median step times.

  comm-run -n 2 -- /usr/bin/python3 bench/torch_backend_bench.py
  tools/netsim/netsim --hosts 2 --rate 2gbit -- /usr/bin/python3 bench/torch_backend_bench.py

Rank 0 prints the tables (markdown)."""

import argparse
import faulthandler
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import libcomm.torch_backend  # noqa: E402,F401
from libcomm._lib import lib  # noqa: E402
from train_transformer import TinyTransformer, make_batch  # noqa: E402


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def timed(fn, iters):
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def bench_allreduce(args, rank, size, gloo, comm):
    rows = []
    for nbytes in args.sizes:
        n = nbytes // 4
        t = torch.ones(n)  # touched before timing
        handle, ptr = comm, t.data_ptr()

        def direct():
            status = lib.comm_allreduce(handle, ptr, ptr, n, 0, 0, None)  # float32, sum
            if status != 0:
                raise RuntimeError(lib.comm_last_error(None).decode())

        impls = {"comm_allreduce": direct, "libcomm backend": lambda: dist.all_reduce(t),
                 "gloo": lambda: dist.all_reduce(t, group=gloo)}
        iters = args.iters if nbytes <= (4 << 20) else max(3, args.iters // 10)
        times = {k: [] for k in impls}
        for _ in range(args.rounds):
            for name, fn in impls.items():
                for _ in range(args.warmup):
                    fn()
                times[name].append(timed(fn, iters))
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        best = {k: min(v) * 1e3 for k, v in times.items()}
        rows.append((nbytes, med, best))
    if rank == 0:
        print(f"\n### all_reduce, float32 sum, {size} ranks: median of {args.rounds} alternating rounds (ms per call)\n")
        print("| bytes | comm_allreduce direct | libcomm backend | gloo | backend / direct | gloo / backend "
              "| best rounds: backend / direct | gloo / backend |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for nbytes, m, lo in rows:
            d, b, g = m["comm_allreduce"], m["libcomm backend"], m["gloo"]
            print(f"| {nbytes} | {d:.3f} | {b:.3f} | {g:.3f} | {b / d:.3f} | {g / b:.2f} "
                  f"| {lo['libcomm backend'] / lo['comm_allreduce']:.3f} | {lo['gloo'] / lo['libcomm backend']:.2f} |",
                  flush=True)


def bench_ddp(args, rank, size, gloo):
    torch.manual_seed(args.seed)
    make = lambda: TinyTransformer(args.vocab, args.d_model, args.layers, args.heads, args.seq_len)  # noqa: E731
    base = make()
    nparams = sum(p.numel() for p in base.parameters())
    setups = {}
    for name, group in (("libcomm backend", None), ("gloo", gloo)):
        model = make()
        model.load_state_dict(base.state_dict())
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group,
                                                        bucket_cap_mb=args.bucket_cap_mb)
        opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
        setups[name] = (ddp, opt, torch.Generator().manual_seed(rank))
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(name):
        ddp, opt, gen = setups[name]
        tokens, target = make_batch(gen, args.batch, args.seq_len, args.vocab)
        opt.zero_grad()
        loss = loss_fn(ddp(tokens).reshape(-1, args.vocab), target.reshape(-1))
        loss.backward()
        opt.step()
        return loss.item()

    times = {k: [] for k in setups}
    for name in setups:
        step(name)  # first step: buckets built, memory touched
    for _ in range(args.rounds):
        for name in setups:
            times[name].append(timed(lambda: step(name), args.steps))
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    if rank == 0:
        print(f"\n### torch DDP step, {size} ranks, {nparams} parameters ({nparams * 4 / 1e6:.1f} MB of fp32 "
              f"gradients), bucket cap {args.bucket_cap_mb} MB, batch {args.batch}x{args.seq_len}: median of "
              f"{args.rounds} alternating rounds of {args.steps} steps (ms per step)\n")
        print("| libcomm backend | gloo | gloo / libcomm |")
        print("|---:|---:|---:|")
        b, g = med["libcomm backend"], med["gloo"]
        print(f"| {b:.1f} | {g:.1f} | {g / b:.2f} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["all", "allreduce", "ddp"], default="all")
    ap.add_argument("--sizes", default="4M,25M", help="all-reduce sizes in bytes (K, M suffixes)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--iters", type=int, default=20, help="calls per round (a tenth, at least 3, above 4 MiB)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="DDP steps per round")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--bucket-cap-mb", type=float, default=25)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if os.environ.get("BENCH_TRACEBACK_S"):  # a stuck run prints where it is, then ends
        faulthandler.dump_traceback_later(float(os.environ["BENCH_TRACEBACK_S"]), exit=True)
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    torch.set_num_threads(args.threads)

    dist.init_process_group("libcomm")
    rank, size = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    # comm_allreduce called directly on the backend's own communicator (the same transport and
    # buffers; nothing else is in flight on the group while it runs).
    comm = dist.distributed_c10d._get_default_group()._comm_handle()
    if rank == 0:
        load = os.getloadavg()
        print(f"# torch_backend_bench: {size} ranks, {time.strftime('%Y-%m-%d %H:%M')}, load average "
              f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores", flush=True)
    if args.mode in ("all", "allreduce"):
        bench_allreduce(args, rank, size, gloo, comm)
    if args.mode in ("all", "ddp"):
        bench_ddp(args, rank, size, gloo)
    dist.barrier()
    if rank == 0:
        load = os.getloadavg()
        print(f"\n# load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    sys.stdout.flush()
    os._exit(0)  # torch 1.13's gloo group can hang at interpreter exit (examples/train_transformer.py)


if __name__ == "__main__":
    main()
