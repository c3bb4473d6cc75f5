"""The PyTorch wrapper against torch's own DDP (gloo backend) on the same seed and data:
after every backward the gradients agree within fp32 tolerance, and after every optimizer
step the parameters do; the same for no_sync accumulation, unused parameters (find_unused_parameters,
grads None where torch leaves None), gradient_as_bucket_view and static_graph.

LIBCOMM_TEST_ENGINES (comma list): "engine" (libcomm's gradient engine) and/or "reference"
(tests/python/reference_engine.py: one plain all-reduce per gradient)."""

import warnings
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import libcomm
from gloo_group import gloo
from harness import case, expect_raises, main
from libcomm.torch_ddp import DistributedDataParallel
from reference_engine import ReferenceEngine

# torch warns that static_graph makes find_unused_parameters redundant; both are tested on purpose.
warnings.filterwarnings("ignore", message=".*_set_static_graph.*")

ENGINES = {"engine": libcomm.Engine, "reference": ReferenceEngine}
USE = [e for e in os.environ.get("LIBCOMM_TEST_ENGINES", "engine,reference").split(",") if e]
TOL = dict(rtol=1e-6, atol=1e-7)


class Net(torch.nn.Module):
    """An MLP with layers of different sizes, plus a branch only rank 0 uses and a layer no
    rank uses (for find_unused_parameters)."""

    def __init__(self, branches=False):
        super().__init__()
        self.inp = torch.nn.Linear(16, 48)
        self.mid = torch.nn.Linear(48, 48)
        self.out = torch.nn.Linear(48, 4)
        self.branches = branches
        if branches:
            self.rank0_only = torch.nn.Linear(48, 48)
            self.never = torch.nn.Linear(48, 48)

    def forward(self, x, rank=0):
        h = torch.relu(self.inp(x))
        h = torch.tanh(self.mid(h))
        if self.branches and rank == 0:
            h = h + torch.sigmoid(self.rank0_only(h))
        return self.out(h)




def twin_models(comm, branches=False):
    """Two equal models; rank > 0 starts from different weights, as both wrappers must
    broadcast rank 0's at wrap time."""
    torch.manual_seed(1234 + comm.rank)
    a = Net(branches)
    b = Net(branches)
    b.load_state_dict(a.state_dict())
    return a, b


def batch(comm, step):
    g = torch.Generator().manual_seed(100 * step + comm.rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def compare_grads(theirs, ours, what):
    for (name, p), q in zip(theirs.module.named_parameters(), ours.module.parameters()):
        if p.grad is None or q.grad is None:
            assert p.grad is None and q.grad is None, \
                f"{what}: {name}: torch DDP grad {p.grad is None and 'None' or 'set'}, ours " \
                f"{q.grad is None and 'None' or 'set'}"
            continue
        torch.testing.assert_close(q.grad, p.grad, **TOL, msg=lambda m: f"{what}: {name}: {m}")


def compare_params(theirs, ours, what):
    for (name, p), q in zip(theirs.module.named_parameters(), ours.module.parameters()):
        torch.testing.assert_close(q.data, p.data, **TOL, msg=lambda m: f"{what}: {name}: {m}")


def identical_on_every_rank(comm, model, what):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    lo, hi = flat.clone(), flat.clone()
    comm.allreduce(lo, op="min")
    comm.allreduce(hi, op="max")
    assert torch.equal(lo, hi), f"{what}: replicas differ"


def run_steps(comm, engine, steps=3, accumulate=1, branches=False, find_unused=False, **opts):
    gloo(comm)
    a, b = twin_models(comm, branches)
    theirs = TorchDDP(a, find_unused_parameters=find_unused,
                      gradient_as_bucket_view=opts.get("gradient_as_bucket_view", False),
                      static_graph=opts.get("static_graph", False))
    ours = DistributedDataParallel(b, comm, engine_factory=ENGINES[engine],
                                   find_unused_parameters=find_unused, **opts)
    what = f"{engine} {opts} accumulate={accumulate} find_unused={find_unused}"
    compare_params(theirs, ours, what + " after wrap")
    opt_a = torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    opt_b = torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    try:
        for step in range(steps):
            for micro in range(accumulate):
                x, y = batch(comm, step * accumulate + micro)
                last = micro == accumulate - 1
                for model in (theirs, ours):
                    if last:
                        loss = torch.nn.functional.mse_loss(model(x, comm.rank), y)
                        loss.backward()
                    else:
                        with model.no_sync():
                            loss = torch.nn.functional.mse_loss(model(x, comm.rank), y)
                            loss.backward()
            compare_grads(theirs, ours, f"{what} step {step}")
            opt_a.step()
            opt_b.step()
            opt_a.zero_grad()
            opt_b.zero_grad()
            compare_params(theirs, ours, f"{what} step {step}")
        identical_on_every_rank(comm, ours.module, what)
        if engine == "engine" and "first_bucket_mb" in opts:
            s = ours.stats()
            assert s["num_buckets"] >= 3, f"{what}: {s['num_buckets']} buckets; the case needs several"
            if opts.get("static_graph"):
                assert s["layout_version"] == 2, f"{what}: no static-graph rebuild: {s}"
        return ours
    finally:
        ours.close()


@case
def gradients_equal_torch_ddp(comm):
    for engine in USE:
        run_steps(comm, engine)
        run_steps(comm, engine, bucket_cap_mb=0.002, first_bucket_mb=0.001)  # many buckets


@case
def gradient_as_bucket_view_and_static_graph(comm):
    for engine in USE:
        run_steps(comm, engine, gradient_as_bucket_view=True, bucket_cap_mb=0.005, first_bucket_mb=0.002)
        run_steps(comm, engine, static_graph=True, bucket_cap_mb=0.005, first_bucket_mb=0.002)
        run_steps(comm, engine, steps=4, static_graph=True, gradient_as_bucket_view=True,
                  bucket_cap_mb=0.005, first_bucket_mb=0.002)


@case
def no_sync_accumulates_then_reduces_the_sum(comm):
    for engine in USE:
        run_steps(comm, engine, accumulate=3)
        run_steps(comm, engine, accumulate=2, gradient_as_bucket_view=True)


@case
def unused_parameters(comm):
    for engine in USE:
        ours = run_steps(comm, engine, branches=True, find_unused=True)
        names = [n for n, p in ours.module.named_parameters()]
        assert sorted(names[i] for i in ours.unused_parameters) == ["never.bias", "never.weight"]
        run_steps(comm, engine, branches=True, find_unused=True, gradient_as_bucket_view=True)
        run_steps(comm, engine, steps=4, branches=True, find_unused=True, static_graph=True,
                  gradient_as_bucket_view=True, bucket_cap_mb=0.005, first_bucket_mb=0.002)


@case
def unused_parameter_without_find_unused_is_an_error(comm):
    for engine in USE:
        torch.manual_seed(5)
        ours = DistributedDataParallel(Net(branches=True), comm, engine_factory=ENGINES[engine])
        try:
            x, _ = batch(comm, 0)
            e = expect_raises(Exception, lambda: ours(x, comm.rank).sum().backward())
            assert "never" in str(e) or "6" in str(e) or "report" in str(e) or "unused" in str(e), e
        finally:
            ours.close()


@case
def overlap_forward_matches_torch_ddp(comm):
    """The deferred optimizer (updates in each module's forward pre-hook) against torch's DDP
    with a plain step: 20 steps of SGD with momentum and of AdamW, partitions that split the
    layers; then global-norm clipping while gradients are in flight is refused."""
    if "engine" not in USE:
        return
    gloo(comm)
    for name in ("sgd", "adamw"):
        def make(params):
            if name == "sgd":
                return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3)
            return torch.optim.AdamW(params, lr=1e-2, weight_decay=1e-2)
        a, b = twin_models(comm)
        theirs = TorchDDP(a)
        ours = DistributedDataParallel(b, comm, overlap_forward=True, partition_mb=0.001,
                                       bucket_cap_mb=0.005, first_bucket_mb=0.002)
        opt_a = make(theirs.parameters())
        opt_b = ours.overlap_optimizer(make(ours.parameters()))
        try:
            for step in range(20):
                x, y = batch(comm, step)
                for model, opt in ((theirs, opt_a), (ours, opt_b)):
                    opt.zero_grad()
                    torch.nn.functional.mse_loss(model(x, comm.rank), y).backward()
                    opt.step()
            opt_b.flush()
            compare_params(theirs, ours, f"overlap_forward {name} after 20 steps")
            identical_on_every_rank(comm, ours.module, f"overlap_forward {name}")
            s = ours.stats()
            assert s["num_partitions"] > s["num_buckets"], f"no parameter was split: {s['num_partitions']} partitions"
            x, y = batch(comm, 99)
            ours(x, comm.rank).sum().backward()
            e = expect_raises(RuntimeError, lambda: torch.nn.utils.clip_grad_norm_(ours.parameters(), 1.0))
            assert "clip_grad_norm_" in str(e), e
            opt_b.step()
            opt_b.flush()
            torch.nn.utils.clip_grad_norm_(ours.parameters(), 1.0)  # nothing in flight: allowed
        finally:
            ours.close()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
