#!/usr/bin/python3
"""Data-parallel training of a small transformer with libcomm's gradient engine.

The task (generated, no download): each position of a token sequence must predict the
running sum of the tokens so far, modulo the vocabulary size, so the model has to attend
to the whole prefix. Every rank draws its own batches; the engine averages the gradients.

    comm-run -n 2 -- /usr/bin/python3 examples/train_transformer.py
    torchrun --standalone --nproc_per_node 2 --redirects 1 --tee 1 examples/train_transformer.py
    comm-run -n 2 -- /usr/bin/python3 examples/train_transformer.py --backend gloo   # torch DDP
    comm-run -n 2 -- /usr/bin/python3 examples/train_transformer.py --backend libcomm-pg
        # torch's own DDP on the torch.distributed backend "libcomm" (libcomm.torch_backend)

Each rank prints `step N loss L params P`: L is the loss averaged over the ranks' batches,
P a checksum of this rank's parameters; both are identical on every rank when the replicas
are in sync. With the same --seed the libcomm and gloo runs print the same curve (to
fp32 rounding).
"""

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))


class TinyTransformer(torch.nn.Module):
    def __init__(self, vocab, d_model, layers, heads, seq_len):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        self.pos = torch.nn.Parameter(torch.randn(seq_len, d_model) * 0.02)
        layer = torch.nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model,
                                                 dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers)
        self.head = torch.nn.Linear(d_model, vocab)
        mask = torch.triu(torch.full((seq_len, seq_len), float("-inf")), diagonal=1)
        self.register_buffer("causal_mask", mask)

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        h = self.encoder(h, mask=self.causal_mask[: tokens.shape[1], : tokens.shape[1]])
        return self.head(h)


def make_batch(generator, batch, seq_len, vocab):
    tokens = torch.randint(0, vocab, (batch, seq_len), generator=generator)
    return tokens, torch.cumsum(tokens, dim=1) % vocab


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["libcomm", "gloo", "libcomm-pg"], default="libcomm",
                    help="libcomm's engine; torch's DDP over gloo (the reference); or torch's DDP "
                         "over the torch.distributed backend \"libcomm\"")
    ap.add_argument("--comm-hook", choices=["allreduce", "fp16"], default=None,
                    help="torch DDP only: register torch's allreduce_hook or fp16_compress_hook")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=16, help="sequences per rank and step")
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=16)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--accumulate", type=int, default=1,
                    help="micro-batches per step; all but the last under no_sync()")
    ap.add_argument("--bucket-cap-mb", type=float, default=25)
    ap.add_argument("--first-bucket-mb", type=float, default=None,
                    help="libcomm only: the first bucket's cap (default 1 MiB, as torch's DDP)")
    ap.add_argument("--gradient-as-bucket-view", action="store_true")
    ap.add_argument("--wire-dtype", choices=["bfloat16", "float16"], default=None,
                    help="libcomm only: compress fp32 gradients on the wire")
    ap.add_argument("--static-graph", action="store_true")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    # Different initial weights per rank on purpose: wrapping broadcasts rank 0's.
    rank_env = int(os.environ.get("RANK", "0"))
    torch.manual_seed(args.seed + 1000 * rank_env)
    model = TinyTransformer(args.vocab, args.d_model, args.layers, args.heads, args.seq_len)

    if args.backend == "libcomm":
        import libcomm
        from libcomm.torch_ddp import DistributedDataParallel
        comm = libcomm.Communicator()
        rank, size = comm.rank, comm.size
        ddp = DistributedDataParallel(model, comm, bucket_cap_mb=args.bucket_cap_mb,
                                      first_bucket_mb=args.first_bucket_mb,
                                      gradient_as_bucket_view=args.gradient_as_bucket_view,
                                      static_graph=args.static_graph,
                                      wire_dtype=args.wire_dtype)

        def mean_over_ranks(x):
            t = torch.tensor([x], dtype=torch.float64)
            comm.allreduce(t, op="avg")
            return t.item()
    else:
        import torch.distributed as dist
        if args.backend == "libcomm-pg":
            import libcomm.torch_backend  # noqa: F401 - registers the backend "libcomm"
        # env://: torchrun's or comm-run's variables. The one line a user changes: "gloo" -> "libcomm".
        dist.init_process_group("libcomm" if args.backend == "libcomm-pg" else "gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=args.bucket_cap_mb,
            gradient_as_bucket_view=args.gradient_as_bucket_view, static_graph=args.static_graph)
        if args.comm_hook:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            hook = {"allreduce": default_hooks.allreduce_hook,
                    "fp16": default_hooks.fp16_compress_hook}[args.comm_hook]
            ddp.register_comm_hook(None, hook)  # None: the default process group

        def mean_over_ranks(x):
            t = torch.tensor([x], dtype=torch.float64)
            dist.all_reduce(t)
            return t.item() / size

    nparams = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(f"# {args.backend}: {size} ranks, {nparams} parameters, {args.steps} steps, "
              f"batch {args.batch} x {args.accumulate} per rank", flush=True)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    data = torch.Generator().manual_seed(args.seed * 7919 + rank)
    loss_fn = torch.nn.CrossEntropyLoss()
    start = time.perf_counter()
    for step in range(args.steps):
        opt.zero_grad()
        total = 0.0
        for micro in range(args.accumulate):
            tokens, target = make_batch(data, args.batch, args.seq_len, args.vocab)
            if micro < args.accumulate - 1:
                with ddp.no_sync():
                    loss = loss_fn(ddp(tokens).reshape(-1, args.vocab), target.reshape(-1))
                    (loss / args.accumulate).backward()
            else:
                loss = loss_fn(ddp(tokens).reshape(-1, args.vocab), target.reshape(-1))
                (loss / args.accumulate).backward()  # returns with averaged gradients
            total += loss.item() / args.accumulate
        opt.step()
        mean = mean_over_ranks(total)
        checksum = sum(p.detach().double().sum().item() for p in model.parameters())
        print(f"step {step} loss {mean:.9g} params {checksum:.12g}", flush=True)
        if not math.isfinite(mean):
            raise SystemExit(f"rank {rank}: loss is {mean} at step {step}")
    elapsed = time.perf_counter() - start
    if rank == 0:
        line = f"# {elapsed / max(args.steps, 1) * 1e3:.2f} ms per step"
        if args.backend == "libcomm":
            s = ddp.stats()
            line += (f"; last step: {s['num_buckets']} buckets, {s['bytes']} bytes, exposed "
                     f"communication {s['exposed_comm_us']:.0f} us of {s['comm_us']:.0f} us, "
                     f"overlap {s['overlap_ratio']:.2f}")
        print(line, flush=True)
    if args.backend == "libcomm":
        ddp.close()
        comm.destroy()
    else:
        torch.distributed.destroy_process_group()
        # torch 1.13: the DDP reducer still holds gloo's process group; destroyed at interpreter
        # exit, ~ProcessGroupGloo joins a worker thread that waits for the GIL the exiting main
        # thread holds, and the rank hangs (seen in CI-like runs). Nothing is left to tear down.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
