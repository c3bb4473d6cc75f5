"""register_comm_hook on libcomm's DDP wrapper, 2 ranks under comm-run: the shipped hooks give the
gradients (and, after SGD steps, the parameters) of the engine's own paths bit for bit
(allreduce_hook = the built-in all-reduce, bf16/fp16_compress_hook = wire_dtype="bfloat16"/
"float16": both average with op="avg" over the same rounded values); a custom hook sees every
partition once per step, in the same sequence on every rank, with its parameters; misuse is
refused; an exception in a hook comes out of backward on every rank without a hang."""

import torch

from harness import case, expect_raises, main
from libcomm.comm_hooks import (PowerSGDState, allreduce_hook, bf16_compress_hook, fp16_compress_hook,
                                powerSGD_hook)
from libcomm.torch_ddp import DistributedDataParallel

# Small buckets and partitions: several of each, a parameter split across partitions.
OPTS = dict(bucket_cap_mb=0.01, first_bucket_mb=0.004, partition_mb=0.003)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(16, 48)
        self.mid = torch.nn.Linear(48, 48)
        self.out = torch.nn.Linear(48, 4)

    def forward(self, x):
        return self.out(torch.tanh(self.mid(torch.relu(self.inp(x)))))


def train(comm, steps=3, hook=None, view=False, state=None, **opts):
    """Gradients after each backward and parameters at the end: the same seed and data per rank."""
    torch.manual_seed(0)
    model = DistributedDataParallel(Net(), comm, gradient_as_bucket_view=view, **{**OPTS, **opts})
    if hook is not None:
        model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + comm.rank)
    grads = []
    for _ in range(steps):
        opt.zero_grad()
        x = torch.randn(8, 16, generator=gen)
        model(x).square().mean().backward()
        grads.append([p.grad.clone() for p in model.module.parameters()])
        opt.step()
    params = [p.detach().clone() for p in model.module.parameters()]
    model.close()
    return grads, params


def assert_same(a, b, what):
    (ga, pa), (gb, pb) = a, b
    for step, (x, y) in enumerate(zip(ga, gb)):
        for i, (u, v) in enumerate(zip(x, y)):
            assert torch.equal(u, v), f"{what}: step {step} gradient {i} differs by {(u - v).abs().max()}"
    for i, (u, v) in enumerate(zip(pa, pb)):
        assert torch.equal(u, v), f"{what}: parameter {i} differs after the steps"


@case
def allreduce_hook_is_the_builtin_allreduce(comm):
    assert_same(train(comm, hook=allreduce_hook), train(comm), "allreduce_hook vs the engine")


@case
def bf16_hook_is_wire_dtype_bf16(comm):
    hooked, wire, exact = train(comm, hook=bf16_compress_hook), train(comm, wire_dtype="bfloat16"), train(comm)
    assert_same(hooked, wire, "bf16_compress_hook vs wire_dtype=bfloat16")
    # Not vacuous: bf16 rounding did change the gradients.
    assert any(not torch.equal(u, v) for u, v in zip(hooked[0][0], exact[0][0])), "bf16 hook changed nothing"


@case
def fp16_hook_is_wire_dtype_fp16(comm):
    assert_same(train(comm, hook=fp16_compress_hook), train(comm, wire_dtype="float16"),
                "fp16_compress_hook vs wire_dtype=float16")


@case
def hooks_with_bucket_views(comm):
    assert_same(train(comm, hook=bf16_compress_hook, view=True), train(comm, wire_dtype="bfloat16", view=True),
                "bf16_compress_hook vs wire_dtype=bfloat16, gradient_as_bucket_view")


@case
def hooks_with_static_graph_and_overlap_forward(comm):
    # static_graph rebuilds the partitions after the first step; overlap_forward runs hooks after
    # end() returned (here end() still waits per gradient, without an overlapped optimizer).
    for opts in (dict(static_graph=True), dict(overlap_forward=True)):
        assert_same(train(comm, hook=bf16_compress_hook, **opts), train(comm, wire_dtype="bfloat16", **opts),
                    f"bf16_compress_hook vs wire_dtype=bfloat16, {opts}")


@case
def powerSGD_before_its_start_is_the_allreduce(comm):
    assert_same(train(comm, hook=powerSGD_hook, state=PowerSGDState(start_powerSGD_iter=10)), train(comm),
                "powerSGD_hook before start_powerSGD_iter vs the engine")


@case
def powerSGD_at_full_rank_is_the_average(comm):
    # The average's rank is at most 16 (2 ranks x 8 samples, a sum of outer products per sample):
    # with rank 16, P P^T projects on its column space, so P Q^T is the average (to the rounding
    # of fp32 Gram-Schmidt: 2e-4 of the largest element measured with Debian's reference BLAS,
    # 1.3e-3 with OpenBLAS, which docs tell users to install; a wrong average is off by O(1)).
    # Partitions large enough to hold whole matrices.
    state = PowerSGDState(matrix_approximation_rank=16, start_powerSGD_iter=0, min_compression_rate=0,
                          use_error_feedback=False)
    (g_psgd, _), (g_ref, _) = (train(comm, steps=2, hook=powerSGD_hook, state=state, partition_mb=1),
                              train(comm, steps=2, partition_mb=1))
    for step, (x, y) in enumerate(zip(g_psgd, g_ref)):
        for i, (u, v) in enumerate(zip(x, y)):
            err, scale = (u - v).abs().max().item(), v.abs().max().item()
            assert err <= 5e-3 * scale, f"step {step} gradient {i}: {err} off, of {scale}"
    assert state.iter == 2


@case
def powerSGD_rank1_compresses_and_ranks_agree(comm):
    state = PowerSGDState(matrix_approximation_rank=1, start_powerSGD_iter=1)
    (grads, params), (exact, _) = (train(comm, steps=4, hook=powerSGD_hook, state=state, partition_mb=1),
                                  train(comm, steps=4, partition_mb=1))
    assert state.error and state.qs, "PowerSGD never compressed"
    mid = 2  # self.mid.weight: 48 x 48, rank 1 from step 1
    assert not torch.allclose(grads[2][mid], exact[2][mid], rtol=1e-3), "rank-1 gradient equals the exact one"
    flat = torch.cat([p.reshape(-1) for p in params])
    both = comm.allgather(flat).reshape(comm.size, -1)
    assert torch.equal(both[0], both[1]), "the ranks' parameters differ after PowerSGD steps"
    assert torch.isfinite(flat).all()


@case
def a_custom_hook_sees_each_partition_once_in_the_same_order(comm):
    calls = []

    def hook(state, bucket):
        assert state == "mine"
        calls.append((bucket.index(), bucket.bucket_index(), bucket.is_last(),
                      sorted(id(p) for p in bucket.parameters())))
        buf = bucket.buffer()
        bucket.comm.allreduce(buf, op="sum")  # a collective on the hook's own communicator
        fut = torch.futures.Future()
        fut.set_result(buf.mul_(0.5))
        return fut

    torch.manual_seed(0)
    model = DistributedDataParallel(Net(), comm, **OPTS)
    model.register_comm_hook("mine", hook)
    for step in range(2):
        calls.clear()
        model(torch.randn(8, 16)).sum().backward()
        n = model.stats()["num_partitions"]
        assert n > 3, f"only {n} partitions: the test wants several"
        assert sorted(c[0] for c in calls) == list(range(n)), f"step {step}: partitions called {calls}"
        assert [c[2] for c in calls] == [False] * (n - 1) + [True], "is_last() is not the last call"
        order = torch.tensor([c[0] for c in calls], dtype=torch.int32)
        both = comm.allgather(order).reshape(comm.size, -1)
        assert torch.equal(both[0], both[1]), f"ranks called the hook in different orders: {both}"
        seen = set().union(*(set(c[3]) for c in calls))
        assert seen == {id(p) for p in model.module.parameters()}, "a parameter was in no partition"
    model.close()


@case
def misuse_is_refused(comm):
    model = DistributedDataParallel(Net(), comm, **OPTS)
    expect_raises(TypeError, model.register_comm_hook, None, 42, contains=["not callable"])
    model.register_comm_hook(None, allreduce_hook)
    expect_raises(RuntimeError, model.register_comm_hook, None, allreduce_hook, contains=["once"])
    model.close()
    model = DistributedDataParallel(Net(), comm, **OPTS)
    model(torch.randn(2, 16)).sum().backward()
    expect_raises(RuntimeError, model.register_comm_hook, None, allreduce_hook, contains=["before the first backward"])
    model.close()


@case
def an_exception_in_the_hook_comes_out_of_backward(comm):
    def hook(state, bucket):
        raise ValueError(f"hook failed on purpose, rank {comm.rank}")

    model = DistributedDataParallel(Net(), comm, **OPTS)
    model.register_comm_hook(None, hook)
    e = expect_raises(Exception, model(torch.randn(2, 16)).sum().backward)
    assert "hook failed on purpose" in str(e), f"backward raised {e!r}"
    model.close()


if __name__ == "__main__":
    main()
