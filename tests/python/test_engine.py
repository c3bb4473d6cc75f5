"""libcomm.Engine through the binding on real ranks: reduced gradients equal a plain
all-reduce of each gradient (avg), with gradients reported in a different order per rank and
from another thread; bucket views; no_sync; stats as a dict; misuse raises the right
exception with the engine's message."""

import random
import threading

import numpy as np

import libcomm
from harness import case, expect_raises, main

SIZES = [3, 1000, 1, 70000, 0, 257, 4096]


def grads(rank, step):
    rng = np.random.default_rng(1000 * step + rank)
    return [rng.standard_normal(n).astype(np.float32) for n in SIZES]


def expected(comm, step):
    return [sum(grads(r, step)[i].astype(np.float64) for r in range(comm.size)) / comm.size
            for i in range(len(SIZES))]


def make(comm, **opts):
    eng = libcomm.Engine(comm, bucket_cap_bytes=64 << 10, first_bucket_bytes=8 << 10, **opts)
    for n in SIZES:
        eng.register(n, "float32")
    eng.finalize()
    return eng


@case
def reduced_gradients_equal_a_plain_allreduce(comm):
    with make(comm) as eng:
        for step in range(3):
            gs = grads(comm.rank, step)
            order = list(range(len(SIZES)))
            random.Random(step * 10 + comm.rank).shuffle(order)  # differs per rank
            eng.begin(sync=True)
            worker = threading.Thread(target=lambda: [eng.grad_ready(i, gs[i]) for i in order])
            worker.start()
            worker.join()
            eng.end()
            for i, (g, want) in enumerate(zip(gs, expected(comm, step))):
                plain = grads(comm.rank, step)[i]
                comm.allreduce(plain, op="avg")
                np.testing.assert_array_equal(g, plain, err_msg=f"step {step} gradient {i}")
                np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-6)
        s = eng.stats()
        assert s["synced_steps"] == 3 and s["num_buckets"] >= 2, s
        assert s["bytes"] > 0 and 0.0 <= s["overlap_ratio"] <= 1.0, s
        assert len(s["buckets"]) == min(s["num_buckets"], 64)


@case
def bucket_views_and_no_sync(comm):
    with make(comm, gradient_as_bucket_view=True) as eng:
        views = []
        for i, n in enumerate(SIZES):
            addr = eng.grad_view(i)
            views.append(libcomm.MemBuffer(comm, addr, 4 * n).numpy(np.float32) if n else
                         np.zeros(0, np.float32))
        total = [np.zeros(n, np.float32) for n in SIZES]
        for v in views:
            v[:] = 0
        for step in range(3):  # two local steps, then the synced one reduces the sum
            sync = step == 2
            eng.begin(sync=sync)
            for i in reversed(range(len(SIZES))):
                views[i] += grads(comm.rank, step)[i]
                if sync:
                    eng.grad_ready(i)  # None: the gradient is its view
            eng.end()
            for i in range(len(SIZES)):
                total[i] += sum(grads(r, step)[i] for r in range(comm.size)) / comm.size
        for i in range(len(SIZES)):
            np.testing.assert_allclose(views[i], total[i], rtol=1e-5, atol=1e-5)


@case
def wire_dtype_bfloat16_within_its_rounding(comm):
    with make(comm, wire_dtype="bf16") as eng:
        gs = grads(comm.rank, 7)
        eng.begin()
        for i in reversed(range(len(SIZES))):
            eng.grad_ready(i, gs[i])
        eng.end()
        for g, want in zip(gs, expected(comm, 7)):
            # bf16 keeps 8 significant bits: each input and the result round once.
            np.testing.assert_allclose(g, want, rtol=2 ** -6, atol=2 ** -6)
        assert eng.stats()["bytes"] == 2 * sum(SIZES)


@case
def misuse_raises_with_a_message(comm):
    eng = make(comm)
    try:
        expect_raises(libcomm.CommError, eng.end, contains=("begin",))
        expect_raises(libcomm.CommError, eng.register, 4, "float32")
        eng.begin()
        g = np.ones(SIZES[0], np.float32)
        expect_raises(libcomm.InvalidArgumentError, eng.grad_ready, len(SIZES), g)
        expect_raises(libcomm.InvalidArgumentError, eng.grad_ready, -1, g)
        eng.grad_ready(0, g)
        e = expect_raises(libcomm.CommError, eng.grad_ready, 0, g)
        assert "0" in str(e)
        for i in range(1, len(SIZES)):
            eng.grad_ready(i, np.ones(SIZES[i], np.float32))
        eng.end()
        np.testing.assert_array_equal(g, np.ones(SIZES[0], np.float32))
    finally:
        eng.destroy()
    expect_raises(libcomm.InvalidArgumentError, eng.begin, contains=("destroyed",))


if __name__ == "__main__":
    main()
