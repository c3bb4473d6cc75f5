#!/usr/bin/python3
"""Training that survives a lost rank: libcomm's DDP with fault_tolerant=True (issue 35).

The MLP of bench/engine_bench_mlp.py (SGD with momentum, an LR schedule) trained for --steps steps:

    comm-run -n 4 --bind none -- /usr/bin/python3 examples/fault_tolerant_train.py --steps 50
    tools/netsim/netsim --hosts 4 -- /usr/bin/python3 examples/fault_tolerant_train.py

Kill a rank while it trains (a launcher that ends the job on the first death, as comm-run without
--replace-failed does, ends it too: start the ranks yourself, as tests/python/test_fault_tolerant.py
does, or with comm-run --replace-failed). The survivors agree on the failed rank, shrink, redo the
step it broke and go on; every rank ends with

    [R] final step N params <sha256 of the parameters>

R being its rank at the end, N the committed steps: equal on every survivor, as is the hash, and
`[R] final loss E`, the loss on a fixed held-out batch (the same for every seed). With
--log-every K each rank also prints `[R] step S loss L eval E ...` every K steps (L: this rank's
batch; E: the held-out loss), `# [R] recovered at step S: ...` after each recovery (with `started
T`, the monotonic clock when it began) and `# [R] recovery cause: ...` (the failure's first
line), `# [R] admitted ...` after each grow that admitted a
replacement, and a replacement `# [R] joined at step S ...` with the state it received.

The task: a fixed linear teacher (the same for every seed) to learn, so that the loss falls and
runs with different seeds make a band. A rank's batch is a function of (seed, step, slot), the
slot being the launcher's RANK, which a replacement inherits; while a slot is empty the members
train on its batches too (ddp.slots), so the job sees the batches of a failure-free run but for
the steps a failure interrupted (redone without the lost rank's batch). --kill-rank R --kill-step S makes rank R
SIGKILL itself at the start of step S (for a quick look without a test driver).
"""

import argparse
import hashlib
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))


def say(line):
    """One write per line: the ranks share stdout, and a pipe keeps writes up to 4 KiB whole."""
    os.write(1, (line + "\n").encode())


def params_sha256(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


class Sampler:
    """The data's position (a joiner continues from it): batches are a function of (seed,
    position, rank at start), so a redone step sees the same batch."""

    def __init__(self):
        self.position = 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]

    def advance(self):
        """At the commit, before the step boundary where a joiner receives the position."""
        self.position += 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=3, help="hidden width x width layers")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--log-every", type=int, default=0)
    ap.add_argument("--step-sleep", type=float, default=0.0, help="seconds of sleep per step (a slower job to kill)")
    ap.add_argument("--until-size", type=int, default=0,
                    help="after --steps, go on until the job has this many ranks again (a replacement joined)")
    ap.add_argument("--max-steps", type=int, default=2000, help="with --until-size: stop there anyway")
    ap.add_argument("--after-join", type=int, default=5, help="steps trained after the last join")
    ap.add_argument("--init-method", default=None, help="e.g. file:///DIR: a job store that outlives rank 0 "
                    "(with env://, the default, rank 0's process serves it and the survivors of its death cannot agree)")
    ap.add_argument("--kill-rank", type=int, default=-1)
    ap.add_argument("--kill-step", type=int, default=-1)
    args = ap.parse_args(argv)

    import torch
    import libcomm
    from libcomm.fault_tolerance import FaultToleranceError
    from libcomm.torch_ddp import DistributedDataParallel
    from engine_bench_mlp import mlp

    torch.set_num_threads(1)
    if os.environ.get("COMM_JOIN") == "1":
        say(f"# [joiner] joining at {time.monotonic():.3f}")  # a driver may kill during the join
    comm = libcomm.Communicator(init_method=args.init_method)
    me = comm.rank  # the rank at start names this process in every line
    slot = int(os.environ.get("RANK", me))  # its data: a replacement's RANK is its slot's
    teach = torch.Generator().manual_seed(4242)
    teacher = torch.randn(args.width, 16, generator=teach) / args.width ** 0.5
    held_out = torch.randn(256, args.width, generator=teach)

    def held_out_loss():
        with torch.no_grad():  # the plain module: no collective
            return torch.nn.functional.mse_loss(model(held_out), held_out @ teacher).item()
    torch.manual_seed(args.seed)
    model = mlp(args.width, args.depth, args.width, 16)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=max(1, args.steps // 3), gamma=0.5)
    ddp = DistributedDataParallel(model, comm, fault_tolerant=True)
    sampler = Sampler()
    # A replacement started with COMM_JOIN=1 receives all this here (and the step, the
    # parameters, the RNG states); the members send it when they admit it, at a step boundary.
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ddp.register_state(optimizer=opt, scheduler=sched, sampler=sampler)
    if os.environ.get("COMM_JOIN") == "1":
        j = ddp.joins[-1] if ddp.joins else {}
        say(f"# [{me}] joined at step {ddp.committed_steps}, {ddp.comm.size} ranks, slot {slot}, state "
            f"{j.get('seconds', 0):.3f} s, {j.get('bytes', 0)} bytes + parameters {param_bytes} bytes, "
            f"at {time.monotonic():.3f}")
    world = int(os.environ.get("WORLD_SIZE", comm.size))  # the slots of a whole job

    def my_slots(members):
        """This process's slot, then the empty slots it takes over: the i-th empty one goes to
        the member i (mod their number), in the members' order, which every member sees alike."""
        empty = [s for s in range(world) if s not in members]
        at = members.index(slot)
        return [slot] + [s for i, s in enumerate(empty) if i % len(members) == at]
    seen, seen_joins, shown_slots = 0, len(ddp.joins), None
    try:
        def more():  # the same answer on every member, the joiner's too: all checked after ddp.step()
            done = ddp.committed_steps
            if done < args.steps:
                return True
            if ddp.joins and done < ddp.joins[-1]["step"] + args.after_join:
                return True
            return ddp.comm.size < args.until_size and done < args.max_steps
        while more():
            step = sampler.position
            t0 = time.monotonic()
            if step == args.kill_step and me == args.kill_rank:
                os.kill(os.getpid(), signal.SIGKILL)
            # The batch is a function of (seed, step, slot): a redone step uses the same. While a
            # slot is empty, the members also train on its batches (ddp.slots), so that the step's
            # gradient is still the mean over the whole global batch.
            if ddp.slots != shown_slots:
                shown_slots = ddp.slots
                say(f"# [{me}] slots {shown_slots}, training on {my_slots(shown_slots)}")
            mine = my_slots(ddp.slots)
            xs, ys = [], []
            for s in mine:
                g = torch.Generator().manual_seed(args.seed * 1000003 + sampler.position * 1009 + s)
                xs.append(torch.randn(args.batch, args.width, generator=g))
                ys.append(xs[-1] @ teacher + 0.1 * torch.randn(args.batch, 16, generator=g))
            x, y = (xs[0], ys[0]) if len(mine) == 1 else (torch.cat(xs), torch.cat(ys))
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            if len(ddp.slots) < world:
                # The all-reduce averages over the members: weighted so that the sum is the mean
                # over the world's batches (a whole job's loss is left as it was, bit for bit).
                loss = loss * (len(mine) * len(ddp.slots) / world)
            loss.backward()  # a failed all-reduce is recorded here, not raised
            ddp.step(opt, sched, on_commit=sampler.advance)  # the commit vote; after a failure, agree, shrink, redo
            for r in ddp.recoveries[seen:]:
                say(f"# [{me}] recovered at step {r['step']}: failed {r['failed']} in the {r['phase']}, "
                    f"now {r.get('size')} ranks, started {r.get('started', 0):.3f}, step took "
                    f"{time.monotonic() - t0:.3f} s, recovery "
                    f"{r.get('seconds', 0):.3f} s ({' '.join(f'{k} {v:.3f}' for k, v in r.get('parts', {}).items())}), "
                    f"{r.get('outcome')}")
                say(f"# [{me}] recovery cause: {r.get('error')}")
            seen = len(ddp.recoveries)
            for j in ddp.joins[seen_joins:]:
                if not j.get("joined"):
                    say(f"# [{me}] admitted at step {j['step']}: now {j['size']} ranks, grow {j.get('grow', 0):.3f} s, "
                        f"state {j['seconds']:.3f} s, {j.get('bytes', 0)} bytes + parameters {param_bytes} bytes, "
                        f"step took {time.monotonic() - t0:.3f} s")
            seen_joins = len(ddp.joins)
            if args.log_every and step % args.log_every == 0:
                say(f"[{me}] step {step} loss {loss.item():.6f} eval {held_out_loss():.6f} size {ddp.comm.size} "
                    f"took {time.monotonic() - t0:.3f}")
            if args.step_sleep:
                time.sleep(args.step_sleep)
    except FaultToleranceError as e:
        say(f"# [{me}] stops: {str(e).splitlines()[0]}")
        return 3
    say(f"[{ddp.comm.rank}] final loss {held_out_loss():.6f}")
    say(f"[{ddp.comm.rank}] final step {ddp.committed_steps} params {params_sha256(model)}")
    ddp.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
