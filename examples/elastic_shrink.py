#!/usr/bin/python3
"""Carry on without a dead rank: comm_shrink instead of a restart.

train_transformer.py's model, trained with libcomm's DDP wrapper on --nprocs ranks that this
script starts itself (each with torchrun's variables; a launcher such as torchrun would end
the whole group when one rank dies, which is what examples/elastic_train.py relies on). With
--kill-rank R --kill-step S, rank R SIGKILLs itself at the start of step S. The others fail in
that step's gradient all-reduce, agree on which rank failed without being told (the flags only
choose the victim; Communicator.agree_failed() asks the library, comm_agree_failed), shrink
without it and redo step S on the smaller communicator: no restart, no checkpoint, the replicas
stay equal.

    python3 examples/elastic_shrink.py --nprocs 4 --kill-rank 3 --kill-step 4

Each rank prints `[rank] step N loss L params P`: its rank in the communicator of that step,
its own batch's loss, and a checksum of its parameters (equal on every rank: the replicas agree),
and after the failure `# rank R: the survivors agreed that ranks [..] failed`.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)


def say(line):
    """One write per line: the ranks share stdout, and a pipe keeps writes up to 4 KiB whole."""
    os.write(1, (line + "\n").encode())


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nprocs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--kill-rank", type=int, default=3)
    ap.add_argument("--kill-step", type=int, default=4)
    ap.add_argument("--timeout-ms", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--transport", default="auto", help="COMM_TRANSPORT for the ranks (auto: shared memory here)")
    return ap.parse_args(argv)


def launch(args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(args.nprocs):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.nprocs), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(args.nprocs), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   COMM_TIMEOUT_MS=str(args.timeout_ms), COMM_TRANSPORT=args.transport, ELASTIC_SHRINK_RANK="1")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + sys.argv[1:], env=env))
    bad = 0
    for r, p in enumerate(procs):
        code = p.wait()
        expected = -signal.SIGKILL if r == args.kill_rank else 0
        if code != expected:
            say(f"# rank {r} ended with {code}, expected {expected}")
            bad += 1
    return 1 if bad else 0


def rank_main(args):
    import torch
    import libcomm
    from libcomm.torch_ddp import DistributedDataParallel
    from elastic_train import batch_for
    from train_transformer import TinyTransformer

    torch.set_num_threads(1)
    comm = libcomm.Communicator()
    torch.manual_seed(args.seed)
    model = TinyTransformer(16, 32, 1, 4, 16)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    ddp = DistributedDataParallel(model, comm)
    loss_fn = torch.nn.CrossEntropyLoss()
    step = 0
    while step < args.steps:
        if step == args.kill_step and comm.size == args.nprocs and comm.rank == args.kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            opt.zero_grad()
            tokens, target = batch_for(args.seed, comm.rank, step, 8, 16, 16)
            loss = loss_fn(ddp(tokens).reshape(-1, 16), target.reshape(-1))
            loss.backward()  # the gradient all-reduce: where the survivors see the death
        except Exception as e:  # libcomm.errors.CommError, or torch's wrapping of it
            say(f"# rank {comm.rank}: step {step} failed: {str(e).splitlines()[0][:200]}")
            try:
                ddp.close()
            except Exception:
                pass
            old = comm
            failed = old.agree_failed()  # the same list on every survivor, learned, not told
            say(f"# rank {old.rank}: the survivors agreed that ranks {failed} failed")
            comm = old.shrink(failed)
            old.destroy()
            say(f"# rank {comm.rank}: shrank to {comm.size} ranks")
            ddp = DistributedDataParallel(model, comm)  # the replicas are equal: nothing to repair
            continue  # redo this step (the optimizer has not stepped)
        opt.step()
        checksum = sum(p.detach().double().sum().item() for p in model.parameters())
        say(f"[{comm.rank}] step {step} loss {loss.item()!r} params {checksum!r}")
        step += 1
    ddp.close()
    comm.destroy()
    return 0


def main(argv=None):
    args = parse_args(argv)
    if os.environ.get("ELASTIC_SHRINK_RANK") == "1":
        return rank_main(args)
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
