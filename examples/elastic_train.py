#!/usr/bin/python3
"""Elastic restart under torchrun: checkpoint, lose a rank, restart, resume with the same losses.

The model and task are train_transformer.py's, trained with libcomm's DDP wrapper. Every
--ckpt-every steps rank 0 writes the model, the optimizer and the RNG state to --ckpt
atomically (a temporary file, then os.replace: a rank killed while writing leaves the last
checkpoint whole). With --kill-rank R --kill-step S, rank R SIGKILLs itself at step S in the
first attempt; the other ranks get the error from their all-reduce and exit, torchrun
(--max-restarts 1) starts the group again, every rank loads the checkpoint and training goes on
from the step after it. The batches are a function of (seed, rank, step), so the resumed run
prints the same `step N loss L params P` lines as one that was never interrupted, bit for bit:

    python3 -m torch.distributed.run --standalone --nproc_per_node 2 --max-restarts 1 \\
        --redirects 1 --tee 1 examples/elastic_train.py --ckpt /tmp/ckpt.pt --kill-rank 1 --kill-step 5

(Debian's torch 1.13 needs --redirects 1 --tee 1.) tests/python/test_elastic.py runs it against
an uninterrupted run.
"""

import argparse
import os
import signal
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

from train_transformer import TinyTransformer  # noqa: E402


def batch_for(seed, rank, step, batch, seq_len, vocab):
    """The batch of (rank, step): no generator state to carry across a restart."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 10_007 + step)
    tokens = torch.randint(0, vocab, (batch, seq_len), generator=g)
    return tokens, torch.cumsum(tokens, dim=1) % vocab


def save_atomically(path, state):
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(state, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)  # atomic: readers see the old checkpoint or the new one, never half


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--ckpt", required=True, help="checkpoint file (shared by the ranks)")
    ap.add_argument("--ckpt-every", type=int, default=3)
    ap.add_argument("--kill-rank", type=int, default=-1)
    ap.add_argument("--kill-step", type=int, default=-1)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=16)
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    import libcomm
    from libcomm.torch_ddp import DistributedDataParallel

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    comm = libcomm.Communicator()
    rank = comm.rank
    torch.manual_seed(args.seed)
    model = TinyTransformer(args.vocab, args.d_model, args.layers, args.heads, args.seq_len)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    start = 0
    if os.path.exists(args.ckpt):
        state = torch.load(args.ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        start = state["step"] + 1
        print(f"# attempt {attempt}: resumed from {args.ckpt} after step {state['step']}", flush=True)
    ddp = DistributedDataParallel(model, comm)
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(start, args.steps):
        if attempt == 0 and rank == args.kill_rank and step == args.kill_step:
            print(f"# rank {rank}: SIGKILL at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        tokens, target = batch_for(args.seed, rank, step, args.batch, args.seq_len, args.vocab)
        loss = loss_fn(ddp(tokens).reshape(-1, args.vocab), target.reshape(-1))
        loss.backward()
        opt.step()
        t = torch.tensor([loss.item()], dtype=torch.float64)
        comm.allreduce(t, op="avg")
        checksum = sum(p.detach().double().sum().item() for p in model.parameters())
        print(f"step {step} loss {t.item()!r} params {checksum!r}", flush=True)
        if rank == 0 and (step + 1) % args.ckpt_every == 0:
            save_atomically(args.ckpt, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                                        "rng": torch.get_rng_state(), "step": step})
    ddp.close()
    comm.destroy()


if __name__ == "__main__":
    main()
