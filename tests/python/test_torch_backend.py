"""torch.distributed on backend "libcomm" (python/libcomm/torch_backend.py), every collective
checked against gloo's answer in the same job (a second process group), on 2-4 ranks, started
by comm-run or torchrun (env://). Exits 77 (meson: SKIP) when the extension is not built.

Inputs are small integers, so every dtype and every order of reduction gives exact results and
libcomm's answer must equal gloo's bit for bit. Where gloo (torch 1.13) lacks a call
(_allgather_base, reduce_scatter, alltoall of lists, AVG, bfloat16) the reference is built from
gloo calls it has."""

import datetime
import os
import sys

import torch_backend_or_skip  # noqa: F401 - registers "libcomm", or SKIP

import harness

import torch
import torch.distributed as dist

R = dist.ReduceOp
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64]
GLOO_DTYPES = {torch.float32, torch.float64, torch.float16, torch.int8, torch.uint8, torch.int32,
               torch.int64}
CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def data(rank, n, dtype, small=False):
    """Rank r's input: small integers, 1..2 for products (no overflow in any dtype), else 1..5."""
    i = torch.arange(n, dtype=torch.int64)
    v = (i + 3 * rank) % 2 + 1 if small else (i + 3 * rank) % 5 + 1
    return v.to(dtype)


def reference_allreduce(t, op, gloo):
    """gloo's all_reduce of t, computed in a dtype gloo has when it lacks t's."""
    work = t.clone() if t.dtype in GLOO_DTYPES else t.to(torch.float64)
    dist.all_reduce(work, op=op, group=gloo)
    return work.to(t.dtype)


def same(a, b, what):
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} vs {b.dtype}"
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} vs {tuple(b.shape)}"
    assert torch.equal(a, b), f"{what}:\nlibcomm {a}\ngloo    {b}"


def raises(fn, *texts):
    try:
        fn()
    except RuntimeError as e:
        for text in texts:
            assert text in str(e), f"message {str(e)!r} lacks {text!r}"
        return
    raise AssertionError(f"{fn} did not raise")


@case
def allreduce_every_dtype_and_op(rank, size, gloo):
    for dtype in DTYPES:
        for op in (R.SUM, R.PRODUCT, R.MIN, R.MAX):
            for n in (0, 1, 7, 1000):
                t = data(rank, n, dtype, small=op == R.PRODUCT)
                ref = reference_allreduce(t, op, gloo)
                dist.all_reduce(t, op=op)
                same(t, ref, f"all_reduce {dtype} {op} n={n}")


@case
def allreduce_avg(rank, size, gloo):
    # gloo has no AVG: its SUM, divided once (integers: truncated toward zero, as comm.h says).
    for dtype in DTYPES:
        t = data(rank, 100, dtype)
        ref = reference_allreduce(t, R.SUM, gloo)
        if dtype.is_floating_point:
            ref = (ref.to(torch.float64) / size).to(dtype)
        else:
            ref = torch.div(ref, size, rounding_mode="trunc")
        dist.all_reduce(t, op=R.AVG)
        same(t, ref, f"all_reduce AVG {dtype}")


@case
def allreduce_non_contiguous(rank, size, gloo):
    # A strided view is copied to contiguous memory and back. gloo (torch 1.13) reduces the
    # first elements of the storage instead, so its reference is a contiguous copy, written back.
    base = data(rank, 64, torch.float32).view(8, 8)
    ours, theirs = base.clone(), base.clone()
    dist.all_reduce(ours[:, ::2].t())
    dense = theirs[:, ::2].t().contiguous()
    dist.all_reduce(dense, group=gloo)
    theirs[:, ::2].t().copy_(dense)
    same(ours, theirs, "all_reduce of a transposed, strided view")
    assert torch.equal(ours[:, 1::2], base[:, 1::2]), "elements outside the view changed"


@case
def allreduce_coalesced(rank, size, gloo):
    ts = [data(rank, 10, torch.float32), data(rank, 6, torch.float32).view(2, 3)]
    refs = [reference_allreduce(t, R.SUM, gloo) for t in ts]
    dist.all_reduce_coalesced(ts)
    for t, ref in zip(ts, refs):
        same(t, ref, "all_reduce_coalesced")


@case
def errors_are_clear(rank, size, gloo):
    t = torch.ones(4)
    for op in (R.BAND, R.BOR, R.BXOR):
        raises(lambda: dist.all_reduce(t, op=op), "libcomm allreduce", "not supported")
    raises(lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool)), "dtype Bool is not supported")
    # torch.distributed itself sends complex tensors as float pairs (view_as_real), for SUM.
    c = torch.full((4,), 1 + 2j, dtype=torch.complex64)
    dist.all_reduce(c)
    same(c, torch.full((4,), size * (1 + 2j), dtype=torch.complex64), "complex64 all_reduce")
    raises(lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16)), "dtype Short is not supported")
    raises(lambda: dist.broadcast(t, src=size), "not a rank")
    raises(lambda: dist.all_gather_into_tensor(torch.zeros(3), t), "_allgather_base")
    raises(lambda: dist.all_to_all_single(torch.zeros(4 * size), torch.zeros(4 * size),
                                          [1] * (size + 1), None), "split sizes")
    # Nothing moved: the process group still works.
    x = torch.ones(3)
    dist.all_reduce(x)
    same(x, torch.full((3,), float(size)), "all_reduce after rejected calls")


@case
def broadcast_every_root(rank, size, gloo):
    for dtype in DTYPES:
        for root in range(size):
            t = data(rank, 33, dtype)
            ref = t.clone()
            if dtype in GLOO_DTYPES:
                dist.broadcast(ref, src=root, group=gloo)
            else:
                ref = data(root, 33, dtype)
            dist.broadcast(t, src=root)
            same(t, ref, f"broadcast {dtype} root {root}")


@case
def reduce_to_each_root(rank, size, gloo):
    for root in range(size):
        for op in (R.SUM, R.MAX):
            t = data(rank, 50, torch.float32)
            ref = t.clone()
            dist.reduce(ref, dst=root, op=op, group=gloo)
            before = t.clone()
            dist.reduce(t, dst=root, op=op)
            if rank == root:
                same(t, ref, f"reduce {op} root {root}")
            else:
                same(t, before, f"reduce leaves non-root {rank}'s tensor alone")


@case
def allgather_list_and_into_tensor(rank, size, gloo):
    for dtype in DTYPES:
        t = data(rank, 12, dtype).view(3, 4)
        ours = [torch.zeros_like(t) for _ in range(size)]
        dist.all_gather(ours, t)
        if dtype in GLOO_DTYPES:
            ref = [torch.zeros_like(t) for _ in range(size)]
            dist.all_gather(ref, t, group=gloo)
        else:
            ref = [data(r, 12, dtype).view(3, 4) for r in range(size)]
        for r in range(size):
            same(ours[r], ref[r], f"all_gather {dtype} from rank {r}")
        flat = torch.zeros(size * 3, 4, dtype=dtype)
        dist.all_gather_into_tensor(flat, t)
        same(flat, torch.cat(ref), f"all_gather_into_tensor {dtype}")
    obj = {"rank": rank, "text": "x" * rank}
    got = [None] * size
    dist.all_gather_object(got, obj)
    assert got == [{"rank": r, "text": "x" * r} for r in range(size)], got


@case
def reduce_scatter_list_and_tensor(rank, size, gloo):
    for op in (R.SUM, R.MIN, R.AVG):
        full = data(rank, 6 * size, torch.float64)
        ref = reference_allreduce(full, R.SUM if op == R.AVG else op, gloo)
        if op == R.AVG:
            ref = ref / size
        mine = ref[6 * rank: 6 * (rank + 1)]
        out = torch.zeros(6, dtype=torch.float64)
        dist.reduce_scatter(out, list(full.chunk(size)), op=op)
        same(out, mine, f"reduce_scatter {op}")
        out2 = torch.zeros(6, dtype=torch.float64)
        dist.reduce_scatter_tensor(out2, full, op=op)
        same(out2, mine, f"reduce_scatter_tensor {op}")


@case
def alltoall_equal_and_uneven(rank, size, gloo):
    t = data(rank, 4 * size, torch.int32) + 100 * rank
    ours, ref = torch.zeros_like(t), torch.zeros_like(t)
    dist.all_to_all_single(ours, t)
    dist.all_to_all_single(ref, t, group=gloo)
    same(ours, ref, "all_to_all_single, equal splits")
    # Rank r sends r + p + 1 rows of 3 to rank p.
    in_splits = [rank + p + 1 for p in range(size)]
    out_splits = [p + rank + 1 for p in range(size)]
    x = (torch.arange(sum(in_splits) * 3, dtype=torch.float32) + 1000 * rank).view(-1, 3)
    ours = torch.zeros(sum(out_splits), 3)
    ref = torch.zeros_like(ours)
    dist.all_to_all_single(ours, x, out_splits, in_splits)
    dist.all_to_all_single(ref, x, out_splits, in_splits, group=gloo)
    same(ours, ref, "all_to_all_single, uneven splits")
    # Lists of tensors of different sizes (gloo 1.13 has no all_to_all: reference from the above).
    ins = list(x.split(in_splits))
    outs = [torch.zeros(s, 3) for s in out_splits]
    dist.all_to_all(outs, ins)
    same(torch.cat(outs), ref, "all_to_all of lists")


@case
def gather_and_scatter(rank, size, gloo):
    for root in range(size):
        t = data(rank, 9, torch.float32)
        ours = [torch.zeros(9) for _ in range(size)] if rank == root else None
        ref = [torch.zeros(9) for _ in range(size)] if rank == root else None
        dist.gather(t, ours, dst=root)
        dist.gather(t, ref, dst=root, group=gloo)
        if rank == root:
            for r in range(size):
                same(ours[r], ref[r], f"gather root {root} from {r}")
        parts = [data(r, 5, torch.int64) * (root + 1) for r in range(size)] if rank == root else None
        out, out_ref = torch.zeros(5, dtype=torch.int64), torch.zeros(5, dtype=torch.int64)
        dist.scatter(out, parts, src=root)
        dist.scatter(out_ref, parts, src=root, group=gloo)
        same(out, out_ref, f"scatter root {root}")
    objs = [{"from": 0, "n": size}] if rank == 0 else [None]
    dist.broadcast_object_list(objs, src=0)
    assert objs == [{"from": 0, "n": size}], objs


@case
def send_recv_with_tags(rank, size, gloo):
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    # Every rank sends and receives at once (a ring): must not deadlock.
    out = torch.arange(1000, dtype=torch.float32) + rank
    inbox = torch.zeros(1000)
    reqs = [dist.isend(out, nxt, tag=7), dist.irecv(inbox, prv, tag=7)]
    for r in reqs:
        r.wait()
    same(inbox, torch.arange(1000, dtype=torch.float32) + prv, "ring isend/irecv")
    if rank == 0:
        dist.send(torch.tensor([5, 6, 7]), 1, tag=3)
        dist.send(torch.tensor([8, 9]), 1, tag=4)
    elif rank == 1:
        a, b = torch.zeros(3, dtype=torch.int64), torch.zeros(4, dtype=torch.int64)[::2]
        src = dist.recv(a, 0, tag=3)
        dist.recv(b, 0, tag=4)  # a strided destination
        assert src == 0
        same(a, torch.tensor([5, 6, 7]), "recv")
        same(b, torch.tensor([8, 9]), "recv into a strided view")
    ops = [dist.P2POp(dist.isend, out, nxt), dist.P2POp(dist.irecv, inbox, prv)]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    same(inbox, torch.arange(1000, dtype=torch.float32) + prv, "batch_isend_irecv")


@case
def async_work_and_futures(rank, size, gloo):
    t = torch.ones(1 << 16)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    assert work.is_completed() and work.is_success()
    same(t, torch.full((1 << 16,), float(size)), "async all_reduce")
    works = [dist.all_reduce(torch.ones(100) * i, async_op=True) for i in range(20)]
    fut = works[-1].get_future()
    assert fut.wait()[0][0].item() == 19.0 * size
    for w in works:
        w.wait()
        assert w.is_completed()
    # A future's callback that makes a blocking call of the same group (runs on the worker).
    def callback(f):
        x = torch.ones(2)
        dist.all_reduce(x)
        return x
    chained = dist.all_reduce(torch.ones(1 << 16), async_op=True).get_future().then(callback)
    same(chained.wait(), torch.full((2,), float(size)), "all_reduce inside a future's callback")
    b = dist.barrier(async_op=True)
    b.wait()
    assert b.is_completed()


@case
def subgroup_of_libcomm(rank, size, gloo):
    # new_group makes a second libcomm communicator (its own rendezvous through the store).
    evens = dist.new_group([r for r in range(size) if r % 2 == 0], backend="libcomm")
    if rank % 2 == 0:
        t = torch.full((4,), float(rank))
        dist.all_reduce(t, group=evens)
        same(t, torch.full((4,), float(sum(range(0, size, 2)))), "all_reduce in a subgroup")


def main():
    timeout = datetime.timedelta(seconds=float(os.environ.get("TEST_PG_TIMEOUT_S", "60")))
    # TEST_INIT: env (default), tcp (init_method tcp://), or file (a torch FileStore handed in).
    how = os.environ.get("TEST_INIT", "env")
    if how == "env":
        dist.init_process_group("libcomm", timeout=timeout)
    else:
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if how == "tcp":
            url = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
            dist.init_process_group("libcomm", init_method=url, rank=rank, world_size=size,
                                    timeout=timeout)
        else:
            # One file per job (a FileStore file left by an earlier job would count its ranks).
            path = f"{os.environ['TEST_STORE_FILE']}.{os.environ['MASTER_PORT']}"
            store = dist.FileStore(path, size)
            dist.init_process_group("libcomm", store=store, rank=rank, world_size=size,
                                    timeout=timeout)
    rank, size = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "libcomm"
    gloo = dist.new_group(backend="gloo")
    # A failure ends the job at once (the launcher stops the rest); os._exit skips torch's teardown.
    harness.run_cases(CASES, rank, lambda fn: fn(rank, size, gloo), lambda: (sys.stdout.flush(), os._exit(1)))
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        if how == "file":
            os.unlink(path)
        print(f"ok: every collective on {size} ranks matches gloo", flush=True)
    sys.stdout.flush()
    # torch 1.13: gloo's process group can hang at interpreter exit (examples/train_transformer.py).
    os._exit(0)


if __name__ == "__main__":
    main()
