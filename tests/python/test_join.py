"""join() for uneven inputs, 2 ranks under comm-run, against torch's DDP with torch's Join over
gloo on the same seeds and data: rank 0 with 5 batches and rank 1 with 3; the other way round with
find_unused_parameters; no_sync steps inside (the joined rank must shadow only the synced ones);
even inputs. Every case finishes without a hang; each step's gradients and the final parameters
(every rank takes the last joiner's) agree with torch's within fp32 tolerance."""

import contextlib

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from gloo_group import gloo
from harness import case, main
from libcomm.torch_ddp import DistributedDataParallel

TOL = dict(rtol=1e-5, atol=1e-6)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(16, 32)
        self.norm = torch.nn.BatchNorm1d(32)  # a buffer the forward broadcasts
        self.out = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.out(torch.relu(self.norm(self.inp(x))))




def run(model, context, batches, accumulate):
    """accumulate: every other batch is a no_sync one, its gradient kept for the next."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    with context:
        for step, x in enumerate(batches):
            local = accumulate and step % 2 == 0
            with model.no_sync() if local else contextlib.nullcontext():
                model(x).square().mean().backward()
            grads.append([p.grad.clone() for p in model.module.parameters()])
            if not local:
                opt.step()
                opt.zero_grad()
    return grads, [p.detach().clone() for p in model.module.parameters()]


def compare(comm, counts, accumulate=False, **opts):
    gloo(comm)
    torch.manual_seed(7)
    a = Net()
    b = Net()
    b.load_state_dict(a.state_dict())
    gen = torch.Generator().manual_seed(50 + comm.rank)
    batches = [torch.randn(8, 16, generator=gen) for _ in range(counts[comm.rank])]
    ours = DistributedDataParallel(a, comm, bucket_cap_mb=0.002, **opts)
    g_ours, p_ours = run(ours, ours.join(), batches, accumulate)
    theirs = TorchDDP(b, bucket_cap_mb=0.002, **opts)
    g_theirs, p_theirs = run(theirs, Join([theirs]), batches, accumulate)
    assert len(g_ours) == counts[comm.rank]
    for step, (x, y) in enumerate(zip(g_ours, g_theirs)):
        for i, (u, v) in enumerate(zip(x, y)):
            assert torch.allclose(u, v, **TOL), f"step {step} gradient {i}: {(u - v).abs().max()} off torch's"
    for i, (u, v) in enumerate(zip(p_ours, p_theirs)):
        assert torch.allclose(u, v, **TOL), f"final parameter {i}: {(u - v).abs().max()} off torch's"
    both = comm.allgather(torch.cat([p.reshape(-1) for p in p_ours])).reshape(comm.size, -1)
    assert torch.equal(both[0], both[1]), "the ranks end with different models"
    ours.close()


@case
def rank1_has_fewer_batches(comm):
    compare(comm, [5, 3])


@case
def rank0_has_fewer_batches_find_unused(comm):
    compare(comm, [2, 4], find_unused_parameters=True)


@case
def no_sync_steps_inside(comm):
    compare(comm, [6, 3], accumulate=True)


@case
def even_inputs_are_unchanged(comm):
    compare(comm, [3, 3])


if __name__ == "__main__":
    main()
