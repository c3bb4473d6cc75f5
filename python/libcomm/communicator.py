"""Communicator: comm_t with its collectives, blocking and non-blocking, on host buffers."""

import ctypes
import threading

import numpy as np

from . import errors
from ._lib import COMM_CONFIG_VERSION, COMM_UNSET, CommConfig, lib
from .buffers import DTYPE_NAMES, ITEMSIZE, NUMPY_OF, RawBuffer, as_buf, empty_like, void_p
from .errors import check, invalid

ANY_SOURCE = -2  # COMM_ANY_SOURCE (comm.h)

OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}


def op_code(op):
    if isinstance(op, str) and op.lower() in OPS:
        return OPS[op.lower()]
    if isinstance(op, int) and not isinstance(op, bool) and op in OPS.values():
        return op
    raise invalid(f"libcomm: op {op!r} is not one of {', '.join(OPS)}")


def version():
    major, minor = ctypes.c_int(), ctypes.c_int()
    check(lib.comm_get_version(ctypes.byref(major), ctypes.byref(minor)), "comm_get_version")
    return major.value, minor.value


class Request:
    """A non-blocking collective in flight. wait() returns its result buffer; the buffers
    stay referenced until it completes, so Python cannot free memory libcomm still writes."""

    def __init__(self, comm, handle, what, result, keep, source=None):
        self._comm = comm
        self._handle = handle
        self._what = what
        self._result = result
        self._keep = keep
        self._done = False
        self._source = source  # a receive from any rank: the ctypes int libcomm writes the rank to
        comm._pending.add(self)

    @property
    def source(self):
        """A receive from any rank (irecv_any): the rank its message came from, once complete
        (None before, and for every other request)."""
        return self._source.value if self._done and self._source is not None else None

    def _finish(self, status):
        self._done = True
        self._handle = None
        self._comm._pending.discard(self)
        self._keep = None
        check(status, self._what)

    def wait(self):
        if not self._done:
            self._finish(lib.comm_wait(self._handle))
        return self._result

    def test(self):
        """True once complete (raising if it failed); never blocks."""
        if self._done:
            return True
        done = ctypes.c_int(0)
        status = lib.comm_test(self._handle, ctypes.byref(done))
        if done.value or status != errors.OK:
            self._finish(status)
        return self._done

    @property
    def done(self):
        return self._done


class MemBuffer:
    """Memory from comm_mem_alloc (peers on the host reach it directly). Free it before
    the communicator is destroyed, or let destroy() free it."""

    def __init__(self, comm, address, nbytes):
        self.comm = comm
        self.address = address
        self.nbytes = nbytes

    def raw(self, dtype="float32"):
        code = as_buf(RawBuffer(0, 0, dtype)).dtype
        return RawBuffer(self.address, self.nbytes // ITEMSIZE[code], dtype, self)

    def numpy(self, dtype=np.float32):
        """A numpy array over this memory (no copy); valid until free()."""
        dt = np.dtype(dtype)
        arr_t = ctypes.c_char * self.nbytes
        raw = np.frombuffer(arr_t.from_address(self.address), dtype=np.uint8)
        return raw[: self.nbytes - self.nbytes % dt.itemsize].view(dt)

    def free(self):
        if self.address:
            address, self.address = self.address, 0
            self.comm._allocs.discard(self)
            check(lib.comm_mem_free(self.comm._live(), ctypes.c_void_p(address)), "comm_mem_free")


class Communicator:
    """A group of ranks. Communicator() joins the job the launcher started (torchrun,
    comm-run, mpirun, Slurm: rank and size from their environment); keyword arguments
    override the environment as comm_config_t's fields do.

    Used by one thread at a time, as comm.h says; abort() from any thread. As a context
    manager it is destroyed on exit, after an abort when the block raised, so that a rank
    that failed never leaves its peers waiting out the timeout in a graceful shutdown."""

    def __init__(self, init_method=None, rank=None, world_size=None, timeout_ms=None,
                 transport=None, *, _handle=None):
        self._pending = set()
        self._allocs = set()
        self._lock = threading.Lock()
        if _handle is not None:
            self._handle = _handle
        else:
            cfg = CommConfig(ctypes.sizeof(CommConfig), COMM_CONFIG_VERSION,
                             init_method.encode() if init_method else None,
                             COMM_UNSET if rank is None else rank,
                             COMM_UNSET if world_size is None else world_size,
                             COMM_UNSET if timeout_ms is None else timeout_ms,
                             transport.encode() if transport else None)
            handle = ctypes.c_void_p()
            check(lib.comm_init(ctypes.byref(cfg), ctypes.byref(handle)), "comm_init")
            self._handle = handle.value
        r, n = ctypes.c_int(), ctypes.c_int()
        check(lib.comm_rank(self._handle, ctypes.byref(r)), "comm_rank")
        check(lib.comm_size(self._handle, ctypes.byref(n)), "comm_size")
        self.rank, self.size = r.value, n.value

    # ---- lifecycle ----
    def _live(self):
        if self._handle is None:
            raise invalid("libcomm: this communicator was destroyed; make a new one")
        return self._handle

    def dup(self):
        out = ctypes.c_void_p()
        check(lib.comm_dup(self._live(), ctypes.byref(out)), f"comm_dup (rank {self.rank})")
        return Communicator(_handle=out.value)

    def split(self, color, key=None):
        """MPI/NCCL split; color < 0 takes no part and returns None."""
        out = ctypes.c_void_p()
        check(lib.comm_split(self._live(), int(color), self.rank if key is None else int(key),
                             ctypes.byref(out)), f"comm_split (rank {self.rank})")
        return Communicator(_handle=out.value) if out.value else None

    def agree_failed(self):
        """After a failure, the ranks still alive agree, without being told, on the failed ranks
        (comm_agree_failed, ULFM's MPIX_Comm_agree over the failed group): returns them, ascending,
        the same list on every survivor. Raises on a rank the others agreed had failed (it came
        too late: stopped, cut off; it must exit) and on a side without a majority."""
        failed = (ctypes.c_int * self.size)()
        n = ctypes.c_int(0)
        check(lib.comm_agree_failed(self._live(), failed, self.size, ctypes.byref(n)),
              f"comm_agree_failed (rank {self.rank})")
        return [failed[i] for i in range(min(n.value, self.size))]

    def agree(self, flag):
        """agree_failed that also agrees on a flag (comm_agree, ULFM's MPIX_Comm_agree): returns
        (the bitwise AND of the flags of the ranks still alive, the failed ranks), the same on
        every survivor. One decision where ranks saw an operation end differently: each passes 1
        when it completed it."""
        value = ctypes.c_int(int(flag))
        failed = (ctypes.c_int * self.size)()
        n = ctypes.c_int(0)
        check(lib.comm_agree(self._live(), ctypes.byref(value), failed, self.size, ctypes.byref(n)),
              f"comm_agree (rank {self.rank})")
        return value.value, [failed[i] for i in range(min(n.value, self.size))]

    def exclude(self, ranks):
        """Records in the job store that these ranks leave the job (comm_exclude): a launcher that
        serves the store (comm-run --replace-failed) SIGKILLs each one that still runs and starts
        its replacement. For the members of a grow whose admission they undo. Local; works on a
        broken communicator; several ranks may name the same process."""
        named = [int(r) for r in ranks]
        arr = (ctypes.c_int * max(1, len(named)))(*named)
        check(lib.comm_exclude(self._live(), arr, len(named)), f"comm_exclude (rank {self.rank})")

    def shrink(self, exclude=None):
        """ncclCommShrink: the ranks not in `exclude` (every one of them passing the same list)
        make a new communicator, renumbered densely in their old order. Works on a communicator
        that failed (a peer died); afterwards this one can only be destroyed. exclude=None: the
        library finds the failed ranks itself (agree_failed, then shrink without them)."""
        if exclude is None:
            out = ctypes.c_void_p()
            check(lib.comm_shrink(self._live(), None, -1, ctypes.byref(out)),  # COMM_SHRINK_AGREE
                  f"comm_shrink (rank {self.rank})")
            return Communicator(_handle=out.value)
        excluded = [int(r) for r in exclude]
        arr = (ctypes.c_int * max(1, len(excluded)))(*excluded)
        out = ctypes.c_void_p()
        check(lib.comm_shrink(self._live(), arr, len(excluded), ctypes.byref(out)),
              f"comm_shrink (rank {self.rank})")
        return Communicator(_handle=out.value)

    def grow(self, n_join=None):
        """ncclCommGrow: every member calls it; the members keep their ranks 0..size-1 and the
        joiners (processes started with the job's environment plus COMM_JOIN=1, whose
        Communicator() waits for this call) take the next ranks. n_join=None: admit the joiners
        waiting now (cheap enough to call every step), returning None when nobody waits; n_join=N:
        wait (up to the timeout) for exactly N. Returns the new Communicator; this one stays usable."""
        out = ctypes.c_void_p()
        check(lib.comm_grow(self._live(), -1 if n_join is None else int(n_join),  # COMM_GROW_WAITING
                            ctypes.byref(out)), f"comm_grow (rank {self.rank})")
        return Communicator(_handle=out.value) if out.value else None

    def abort(self):
        """Local, non-blocking, idempotent, any thread; every pending and later call raises."""
        handle = self._handle
        if handle is not None:
            check(lib.comm_abort(handle), "comm_abort")

    def async_error(self):
        """The exception of the first error that ended a background operation, or None."""
        status = lib.comm_get_async_error(self._live())
        if status == errors.OK:
            return None
        try:
            check(status, f"background operation on rank {self.rank}")
        except errors.CommError as e:
            return e

    def destroy(self):
        """Graceful (bounded by the timeout); immediate after abort(). Idempotent."""
        if self._handle is None:
            return
        for mem in list(self._allocs):
            try:
                mem.free()
            except errors.CommError:
                pass
        handle, self._handle = self._handle, None
        pending, self._pending = self._pending, set()
        for req in pending:
            req._done = True  # comm_destroy frees what it ends
        check(lib.comm_destroy(handle), f"comm_destroy (rank {self.rank})")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            try:
                self.abort()
            except errors.CommError:
                pass
        self.destroy()
        return False

    def __repr__(self):
        state = "destroyed" if self._handle is None else f"rank {self.rank} of {self.size}"
        return f"<libcomm.Communicator {state}>"

    # ---- memory ----
    def mem_alloc(self, nbytes):
        ptr = ctypes.c_void_p()
        check(lib.comm_mem_alloc(self._live(), int(nbytes), ctypes.byref(ptr)), "comm_mem_alloc")
        mem = MemBuffer(self, ptr.value or 0, int(nbytes))
        self._allocs.add(mem)
        return mem

    # ---- the calls ----
    def _run(self, name, blocking, args, result, keep, stream=0):
        """stream: 0 for host buffers, else the cudaStream_t of device buffers (blocking calls
        only: comm.h's non-blocking calls take host memory)."""
        what = f"{name if blocking else 'comm_i' + name[5:]} (rank {self.rank} of {self.size})"
        if blocking:
            check(getattr(lib, name)(self._live(), *args, void_p(stream)), what)
            return result
        if stream:
            raise invalid(f"libcomm: {what}: device buffers go through the blocking call (it is "
                          "enqueued on their stream and returns at once); the non-blocking calls "
                          "take host memory")
        req = ctypes.c_void_p()
        check(getattr(lib, "comm_i" + name[5:])(self._live(), *args, ctypes.byref(req)), what)
        return Request(self, req.value, what, result, keep)

    def _pair(self, op, sendbuf, recvbuf, dtype, recv_count, alloc_count=None):
        """Resolves send and receive buffers (recvbuf None: in place, or a fresh one when
        alloc_count is given) and checks that the receive side holds recv_count(send)."""
        send = as_buf(sendbuf, dtype, f"{op}: sendbuf")
        if recvbuf is None:
            recvbuf = sendbuf if alloc_count is None else empty_like(sendbuf, alloc_count(send),
                                                                     send)
        if recvbuf is sendbuf:
            recv = send
        else:
            # Typed buffers say their dtype (checked against the send side); raw bytes
            # take the send side's.
            typed = isinstance(recvbuf, np.ndarray) or type(recvbuf).__module__.startswith("torch")
            recv = as_buf(recvbuf, dtype if (dtype is not None or typed) else send.dtype,
                          f"{op}: recvbuf")
        if recv.stream != send.stream:
            where = lambda b: f"device memory (stream {b.stream:#x})" if b.stream else "host memory"
            raise invalid(f"libcomm: {op}: sendbuf is {where(send)} but recvbuf {where(recv)}; both "
                          "must be host memory, or device memory on one stream")
        if recv.dtype != send.dtype:
            raise invalid(f"libcomm: {op}: sendbuf holds {DTYPE_NAMES[send.dtype]} but recvbuf "
                          f"{DTYPE_NAMES[recv.dtype]}; both must be the same dtype")
        want = recv_count(send)
        if recv.count != want:
            raise invalid(f"libcomm: {op} on rank {self.rank}: recvbuf holds {recv.count} "
                          f"elements, the call needs {want}")
        if not recv.writable:
            raise invalid(f"libcomm: {op}: recvbuf is read-only")
        return send, recv, recvbuf

    def _allreduce(self, blocking, sendbuf, recvbuf, op, dtype):
        send, recv, out = self._pair("allreduce", sendbuf, recvbuf, dtype, lambda s: s.count)
        return self._run("comm_allreduce", blocking,
                         (void_p(send.ptr), void_p(recv.ptr), send.count, send.dtype,
                          op_code(op)), out, (sendbuf, out, send, recv), send.stream)

    def _broadcast(self, blocking, buf, root, recvbuf, dtype):
        send, recv, out = self._pair("broadcast", buf, recvbuf, dtype, lambda s: s.count)
        return self._run("comm_broadcast", blocking,
                         (void_p(send.ptr), void_p(recv.ptr), send.count, send.dtype, int(root)),
                         out, (buf, out, send, recv), send.stream)

    def _reduce(self, blocking, sendbuf, recvbuf, op, root, dtype):
        send, recv, out = self._pair("reduce", sendbuf, recvbuf, dtype, lambda s: s.count)
        return self._run("comm_reduce", blocking,
                         (void_p(send.ptr), void_p(recv.ptr), send.count, send.dtype, op_code(op),
                          int(root)), out, (sendbuf, out, send, recv), send.stream)

    def _allgather(self, blocking, sendbuf, recvbuf, dtype):
        n = self.size
        send, recv, out = self._pair("allgather", sendbuf, recvbuf, dtype,
                                     lambda s: s.count * n, lambda s: s.count * n)
        return self._run("comm_allgather", blocking,
                         (void_p(send.ptr), void_p(recv.ptr), send.count, send.dtype), out,
                         (sendbuf, out, send, recv), send.stream)

    def _reduce_scatter(self, blocking, sendbuf, recvbuf, op, dtype):
        n = self.size
        send = as_buf(sendbuf, dtype, "reduce_scatter: sendbuf")
        if send.count % n:
            raise invalid(f"libcomm: reduce_scatter on rank {self.rank}: sendbuf holds "
                          f"{send.count} elements, not a multiple of the {n} ranks")
        send, recv, out = self._pair("reduce_scatter", sendbuf, recvbuf, dtype,
                                     lambda s: s.count // n, lambda s: s.count // n)
        return self._run("comm_reduce_scatter", blocking,
                         (void_p(send.ptr), void_p(recv.ptr), recv.count, send.dtype,
                          op_code(op)), out, (sendbuf, out, send, recv), send.stream)

    def _alltoall(self, blocking, sendbuf, recvbuf, dtype):
        n = self.size
        send = as_buf(sendbuf, dtype, "alltoall: sendbuf")
        if send.count % n:
            raise invalid(f"libcomm: alltoall on rank {self.rank}: sendbuf holds {send.count} "
                          f"elements, not a multiple of the {n} ranks")
        send, recv, out = self._pair("alltoall", sendbuf, recvbuf, dtype,
                                     lambda s: s.count, lambda s: s.count)
        return self._run("comm_alltoall", blocking,
                         (void_p(send.ptr), void_p(recv.ptr), send.count // n, send.dtype), out,
                         (sendbuf, out, send, recv), send.stream)

    def _send(self, blocking, buf, peer, dtype):
        b = as_buf(buf, dtype, "send: buf")
        return self._run("comm_send", blocking, (void_p(b.ptr), b.count, b.dtype, int(peer)),
                         None, (buf, b), b.stream)

    def _recv(self, blocking, buf, peer, dtype):
        b = as_buf(buf, dtype, "recv: buf")
        if not b.writable:
            raise invalid("libcomm: recv: buf is read-only")
        return self._run("comm_recv", blocking, (void_p(b.ptr), b.count, b.dtype, int(peer)),
                         buf, (buf, b), b.stream)

    # Blocking: each returns its receive buffer (the send buffer when in place).
    def allreduce(self, sendbuf, recvbuf=None, op="sum", dtype=None):
        return self._allreduce(True, sendbuf, recvbuf, op, dtype)

    def broadcast(self, buf, root=0, recvbuf=None, dtype=None):
        """In place on `buf` unless recvbuf is given (then buf is the root's source)."""
        return self._broadcast(True, buf, root, recvbuf, dtype)

    def reduce(self, sendbuf, recvbuf=None, op="sum", root=0, dtype=None):
        return self._reduce(True, sendbuf, recvbuf, op, root, dtype)

    def allgather(self, sendbuf, recvbuf=None, dtype=None):
        """recvbuf: size x len(sendbuf) elements, rank r's block at r; allocated if None."""
        return self._allgather(True, sendbuf, recvbuf, dtype)

    def reduce_scatter(self, sendbuf, recvbuf=None, op="sum", dtype=None):
        """sendbuf: size blocks; this rank receives the reduction of block `rank`."""
        return self._reduce_scatter(True, sendbuf, recvbuf, op, dtype)

    def alltoall(self, sendbuf, recvbuf=None, dtype=None):
        """sendbuf: size blocks, block r goes to rank r; recvbuf block r came from rank r."""
        return self._alltoall(True, sendbuf, recvbuf, dtype)

    def barrier(self):
        check(lib.comm_barrier(self._live(), None), f"comm_barrier (rank {self.rank})")

    def send(self, buf, peer, dtype=None):
        return self._send(True, buf, peer, dtype)

    def recv(self, buf, peer, dtype=None):
        return self._recv(True, buf, peer, dtype)

    # Non-blocking: each returns a Request; request.wait() returns the receive buffer.
    def iallreduce(self, sendbuf, recvbuf=None, op="sum", dtype=None):
        return self._allreduce(False, sendbuf, recvbuf, op, dtype)

    def ibroadcast(self, buf, root=0, recvbuf=None, dtype=None):
        return self._broadcast(False, buf, root, recvbuf, dtype)

    def ireduce(self, sendbuf, recvbuf=None, op="sum", root=0, dtype=None):
        return self._reduce(False, sendbuf, recvbuf, op, root, dtype)

    def iallgather(self, sendbuf, recvbuf=None, dtype=None):
        return self._allgather(False, sendbuf, recvbuf, dtype)

    def ireduce_scatter(self, sendbuf, recvbuf=None, op="sum", dtype=None):
        return self._reduce_scatter(False, sendbuf, recvbuf, op, dtype)

    def ialltoall(self, sendbuf, recvbuf=None, dtype=None):
        return self._alltoall(False, sendbuf, recvbuf, dtype)

    def ibarrier(self):
        req = ctypes.c_void_p()
        what = f"comm_ibarrier (rank {self.rank} of {self.size})"
        check(lib.comm_ibarrier(self._live(), ctypes.byref(req)), what)
        return Request(self, req.value, what, None, None)

    def isend(self, buf, peer, dtype=None):
        return self._send(False, buf, peer, dtype)

    def irecv(self, buf, peer, dtype=None):
        return self._recv(False, buf, peer, dtype)

    # A receive from any rank (COMM_ANY_SOURCE, comm.h): the first message no earlier receive
    # takes; messages from one rank still arrive in the order they were sent.
    def recv_any(self, buf, dtype=None):
        """Blocking; returns (buf, source): the rank the message came from."""
        b = self._recv_buf(buf, dtype)
        source = ctypes.c_int(ANY_SOURCE)
        what = f"comm_recv_any (rank {self.rank} of {self.size})"
        check(lib.comm_recv_any(self._live(), void_p(b.ptr), b.count, b.dtype, ctypes.byref(source),
                                void_p(0)), what)
        return buf, source.value

    def irecv_any(self, buf, dtype=None):
        """Non-blocking; request.wait() returns buf, request.source the rank once complete."""
        b = self._recv_buf(buf, dtype)
        source = ctypes.c_int(ANY_SOURCE)
        req = ctypes.c_void_p()
        what = f"comm_irecv_any (rank {self.rank} of {self.size})"
        check(lib.comm_irecv_any(self._live(), void_p(b.ptr), b.count, b.dtype, ctypes.byref(source),
                                 ctypes.byref(req)), what)
        return Request(self, req.value, what, buf, (buf, b, source), source)

    def _recv_buf(self, buf, dtype):
        b = as_buf(buf, dtype, "recv: buf")
        if not b.writable:
            raise invalid("libcomm: recv: buf is read-only")
        if b.stream:
            raise invalid("libcomm: a receive from any rank takes host memory")
        return b

    def barrier_monitored(self, timeout_ms, wait_all=False):
        """comm_barrier_monitored (gloo's monitoredBarrier): rank 0 waits up to timeout_ms for
        every rank. Raises CommTimeoutError naming the missing ranks (rank 0) or rank 0's silence
        (the others); on failure this communicator is aborted (give it one of its own: dup())."""
        missing = (ctypes.c_int * max(self.size, 1))()
        n_missing = ctypes.c_int(0)
        what = f"comm_barrier_monitored (rank {self.rank} of {self.size})"
        check(lib.comm_barrier_monitored(self._live(), int(timeout_ms), 1 if wait_all else 0, missing,
                                         self.size, ctypes.byref(n_missing)), what)


class group:
    """`with libcomm.group(): ...` batches the sends and receives inside (NCCL's
    group semantics), so that a ring of blocking sends cannot deadlock."""

    def __enter__(self):
        check(lib.comm_group_start(), "comm_group_start")
        return self

    def __exit__(self, exc_type, exc, tb):
        check(lib.comm_group_end(), "comm_group_end")
        return False


def bfloat16_bits(values):
    """fp32 values -> bfloat16 bits as uint16 (round to nearest even), for numpy users."""
    f = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = f + np.uint32(0x7FFF) + ((f >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(NUMPY_OF[3])


def bfloat16_values(bits):
    """bfloat16 bits (uint16) -> fp32 values."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
