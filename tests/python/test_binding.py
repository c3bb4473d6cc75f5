"""The ctypes binding on 2+ real ranks: every collective round-trips numpy arrays, torch CPU
tensors and raw buffers of every dtype; statuses arrive as the right exception with
comm_last_error's message; lifecycle calls behave as comm.h says."""

import array
import ctypes

import numpy as np
import torch

import libcomm
from harness import case, expect_raises, main

NP_DTYPES = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.uint32,
             np.int64, np.uint64]
TORCH_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                torch.uint8, torch.int32, torch.int64]


def values(rank, n, dtype):
    """Small integers, exact in every dtype, different per rank and element."""
    return (np.arange(n) % 7 + rank + 1).astype(dtype)


@case
def version_and_library(comm):
    major, _ = libcomm.version()
    assert major == 1
    assert libcomm.library_path


@case
def allreduce_every_numpy_dtype_and_op(comm):
    n, size = 33, comm.size
    ranks = [values(r, n, np.float64) for r in range(size)]
    want = {"sum": sum(ranks), "prod": np.prod(ranks, axis=0), "min": np.min(ranks, axis=0),
            "max": np.max(ranks, axis=0)}
    for dt in NP_DTYPES:
        for op, expect in want.items():
            x = values(comm.rank, n, dt)
            out = comm.allreduce(x, np.empty_like(x), op=op)
            assert out.dtype == np.dtype(dt)
            np.testing.assert_array_equal(out, expect.astype(dt), err_msg=f"{dt} {op}")
            assert comm.allreduce(x, op=op) is x  # in place
            np.testing.assert_array_equal(x, expect.astype(dt), err_msg=f"{dt} {op} in place")
    x = np.full(n, comm.rank * 2 + 1, np.float32)
    comm.allreduce(x, op="avg")
    np.testing.assert_array_equal(x, np.full(n, float(size), np.float32))


@case
def allreduce_every_torch_dtype(comm):
    for dt in TORCH_DTYPES:
        t = torch.from_numpy(values(comm.rank, 17, np.float32)).to(dt)
        expect = sum(torch.from_numpy(values(r, 17, np.float32)) for r in range(comm.size))
        out = comm.allreduce(t)
        assert out is t and t.dtype == dt
        assert torch.equal(t, expect.to(dt)), (dt, t, expect)
    # bfloat16 from numpy: its bits held as uint16, the dtype said explicitly.
    bits = libcomm.bfloat16_bits(np.full(8, 1.5 + comm.rank, np.float32))
    comm.allreduce(bits, dtype="bfloat16")
    np.testing.assert_array_equal(libcomm.bfloat16_values(bits),
                                  np.full(8, sum(1.5 + r for r in range(comm.size)), np.float32))


@case
def every_collective_on_numpy_and_torch(comm):
    size, rank = comm.size, comm.rank
    for make in (lambda a: a, torch.from_numpy):
        # broadcast from the last rank, in place and out of place
        x = make(np.full(6, rank, np.int32))
        comm.broadcast(x, root=size - 1)
        assert list(x) == [size - 1] * 6
        src = make(np.full(6, 10 + rank, np.float64))
        out = make(np.zeros(6, np.float64))
        assert comm.broadcast(src, root=0, recvbuf=out) is out
        assert list(out) == [10.0] * 6
        # reduce to rank 0 (non-root recvbuf untouched)
        out = make(np.zeros(4, np.float32))
        comm.reduce(make(np.full(4, rank + 1, np.float32)), out, op="sum", root=0)
        assert list(out) == ([size * (size + 1) / 2] * 4 if rank == 0 else [0.0] * 4)
        # allgather: rank r's block at r, allocated when no recvbuf is given
        gathered = comm.allgather(make(np.arange(3, dtype=np.int64) + 100 * rank))
        assert [int(v) for v in gathered] == [100 * r + i for r in range(size) for i in range(3)]
        # reduce_scatter: block `rank` of the sum
        send = make(np.tile(np.arange(size, dtype=np.float32), 2).reshape(2, size).T.copy()
                    .ravel() + rank)
        got = comm.reduce_scatter(send)
        expect = [rank * size + sum(range(size))] * 2
        assert [float(v) for v in got] == expect, (got, expect)
        # alltoall: block r goes to rank r
        send = make(np.array([100 * rank + r for r in range(size) for _ in range(2)], np.int64))
        got = comm.alltoall(send)
        assert [int(v) for v in got] == [100 * r + rank for r in range(size) for _ in range(2)]
    comm.barrier()


@case
def send_recv_ring_in_a_group(comm):
    size, rank = comm.size, comm.rank
    out = np.full(5, rank, np.float32)
    got = np.zeros(5, np.float32)
    with libcomm.group():
        comm.send(out, (rank + 1) % size)
        comm.recv(got, (rank - 1) % size)
    np.testing.assert_array_equal(got, np.full(5, (rank - 1) % size, np.float32))


@case
def receive_from_any_rank_reports_the_source(comm):
    size, rank = comm.size, comm.rank
    if rank != 0:
        for i in range(3):
            comm.send(np.array([rank, i], np.int32), 0)
    else:
        nxt = [0] * size
        for m in range(3 * (size - 1)):
            got = np.full(2, -1, np.int32)
            if m % 2:
                req = comm.irecv_any(got)
                assert req.source is None  # not before it completed
                req.wait()
                src = req.source
            else:
                _, src = comm.recv_any(got)
            assert got[0] == src and got[1] == nxt[src], (m, got, src, nxt)  # in the order sent
            nxt[src] += 1
        assert nxt[1:] == [3] * (size - 1)
        expect_raises(libcomm.InvalidArgumentError, lambda: comm.recv_any(np.zeros(0, np.int32)))
    comm.barrier()


@case
def monitored_barrier_passes_when_every_rank_arrives(comm):
    c = comm.dup()  # a failure would abort it (comm.h): its own communicator
    try:
        c.barrier_monitored(20000, wait_all=True)
    finally:
        c.destroy()


@case
def nonblocking_complete_in_issue_order(comm):
    size, rank = comm.size, comm.rank
    xs = [np.full(1000, rank + i, np.float32) for i in range(8)]
    reqs = [comm.iallreduce(x) for x in xs]
    b = comm.ibroadcast(np.full(3, rank, np.int64), root=0)
    g = comm.iallgather(np.array([rank], np.int32))
    bar = comm.ibarrier()
    while not reqs[-1].test():
        pass
    for i, (x, r) in enumerate(zip(xs, reqs)):
        assert r.wait() is x
        np.testing.assert_array_equal(x, np.full(1000, sum(range(size)) + size * i, np.float32))
    assert list(b.wait()) == [0, 0, 0]
    assert list(g.wait()) == list(range(size))
    assert bar.wait() is None and bar.done
    # non-blocking send/recv pair between ranks 0 and 1
    if rank < 2:
        buf = np.full(4, rank, np.uint8)
        req = comm.isend(buf, 1) if rank == 0 else comm.irecv(buf, 0)
        req.wait()
        assert list(buf) == [0] * 4
    rs = comm.ireduce_scatter(np.ones(2 * size, np.float64))
    aa = comm.ialltoall(np.full(size, rank, np.int32))
    rd = comm.ireduce(np.ones(2, np.float32), np.zeros(2, np.float32), root=0)
    assert list(rs.wait()) == [size] * 2
    assert list(aa.wait()) == list(range(size))
    rd.wait()


@case
def raw_buffers(comm):
    size, rank = comm.size, comm.rank
    b = bytearray(np.full(4, rank + 1, np.float32).tobytes())
    comm.allreduce(b, dtype="float32")
    assert list(np.frombuffer(b, np.float32)) == [size * (size + 1) / 2] * 4
    a = array.array("d", [rank] * 3)  # its format says float64
    comm.allreduce(memoryview(a))
    assert list(a) == [sum(range(size))] * 3
    c = (ctypes.c_int32 * 3)(rank, rank, rank)
    comm.allreduce(c, op="max")
    assert list(c) == [size - 1] * 3
    mem = comm.mem_alloc(64)
    view = mem.numpy(np.int64)
    view[:] = rank
    comm.allreduce(mem.raw("int64"))
    assert list(view) == [sum(range(size))] * 8
    raw = libcomm.RawBuffer(view.ctypes.data, 8, "uint64")
    comm.broadcast(raw, root=0)
    mem.free()
    # count 0 moves nothing and needs no memory
    comm.allreduce(libcomm.RawBuffer(0, 0, "float32"))
    comm.allreduce(np.zeros(0, np.float32))


@case
def dup_and_split(comm):
    size, rank = comm.size, comm.rank
    with comm.dup() as d:
        assert (d.rank, d.size) == (rank, size)
        assert list(d.allreduce(np.ones(2, np.int32))) == [size] * 2
    halves = comm.split(rank % 2, key=-rank)  # key reverses the order inside each half
    members = [r for r in range(size) if r % 2 == rank % 2]
    assert halves.size == len(members)
    assert halves.rank == len(members) - 1 - members.index(rank)
    assert list(halves.allgather(np.array([rank], np.int32))) == sorted(members, reverse=True)
    halves.destroy()
    halves.destroy()  # idempotent
    none = comm.split(-1 if rank == 0 else 0)
    assert (none is None) == (rank == 0)
    if none is not None:
        assert none.size == size - 1
        none.destroy()


@case
def shrink_makes_a_communicator_and_ends_the_old_one(comm):
    size, rank = comm.size, comm.rank
    expect_raises(libcomm.InvalidArgumentError, comm.shrink, [rank], contains=("excludes itself",))
    d = comm.dup()  # shrink ends the communicator it is called on: use a copy
    s = d.shrink([])
    assert (s.rank, s.size) == (rank, size)
    assert list(s.allreduce(np.ones(2, np.int32))) == [size] * 2
    expect_raises(libcomm.InvalidUsageError, d.allreduce, np.ones(2, np.int32),
                  contains=("only comm_destroy",))  # only destroy is left
    s.destroy()
    d.destroy()


@case
def bad_input_raises_invalid_argument_and_leaves_comm_usable(comm):
    x = np.ones(8, np.float32)
    e = expect_raises(libcomm.InvalidArgumentError, comm.broadcast, x, root=comm.size + 3,
                      contains=("comm_broadcast", f"rank {comm.rank}", "root"))
    assert e.status == 1 and isinstance(e, libcomm.CommError) and isinstance(e, ValueError)
    expect_raises(libcomm.InvalidArgumentError, comm.allreduce, x, op="median",
                  contains=("median",))
    expect_raises(libcomm.InvalidArgumentError, comm.allreduce, x, np.ones(7, np.float32),
                  contains=("recvbuf holds 7", "needs 8"))
    expect_raises(libcomm.InvalidArgumentError, comm.allreduce, x, np.ones(8, np.float64),
                  contains=("float32", "float64"))
    expect_raises(libcomm.InvalidArgumentError, comm.allreduce, np.ones(4, np.complex64),
                  contains=("complex64",))
    expect_raises(libcomm.InvalidArgumentError, comm.allreduce, np.ones((4, 4), np.float32)[:, 0],
                  contains=("contiguous",))
    expect_raises(libcomm.InvalidArgumentError, comm.allreduce, "text", contains=("str",))
    expect_raises(libcomm.InvalidArgumentError, comm.allreduce, memoryview(bytearray(8)).cast("c"),
                  contains=("dtype=",))
    expect_raises(libcomm.InvalidArgumentError, comm.allreduce, bytearray(6), dtype="float32",
                  contains=("whole number",))
    expect_raises(libcomm.InvalidArgumentError, comm.allreduce, torch.ones(4, dtype=torch.bool))
    expect_raises(libcomm.InvalidArgumentError, comm.send, x, peer=comm.size,
                  contains=("comm_send",))
    expect_raises(libcomm.InvalidArgumentError, comm.reduce_scatter, np.ones(comm.size + 1),
                  contains=("multiple",))
    ro = np.ones(8, np.float32)
    ro.flags.writeable = False
    expect_raises(libcomm.InvalidArgumentError, comm.allreduce, ro, contains=("read-only",))
    expect_raises(libcomm.InvalidArgumentError, comm.exclude, [comm.rank], contains=("comm_exclude", "this rank"))
    # Nothing moved: the communicator still agrees across ranks.
    assert list(comm.allreduce(np.ones(2, np.int64))) == [comm.size] * 2


@case
def failed_init_carries_last_error(comm):
    e = expect_raises(libcomm.CommError, libcomm.Communicator, init_method="bogus://nowhere",
                      timeout_ms=2000)
    assert e.status in (1, 3) and "bogus" in str(e), str(e)
    assert libcomm.status_string(4).startswith("COMM_ERR_TIMEOUT")


@case
def abort_fails_every_later_call_and_context_manager_cleans_up(comm):
    d = comm.dup()
    d.abort()
    d.abort()  # idempotent
    e = expect_raises(libcomm.AbortedError, d.allreduce, np.ones(4, np.float32),
                      contains=("comm_allreduce",))
    assert e.status == 6
    d.destroy()
    expect_raises(libcomm.InvalidArgumentError, d.allreduce, np.ones(4, np.float32),
                  contains=("destroyed",))
    with comm.dup() as d2:
        pass
    assert d2._handle is None
    # A block that raises aborts before destroying: no graceful wait on peers.
    try:
        with comm.dup() as d3:
            raise KeyError("boom")
    except KeyError:
        pass
    assert d3._handle is None
    assert comm.async_error() is None


if __name__ == "__main__":
    main()
