"""Engine: the gradient engine of comm.h (comm_engine_*): bucketed, overlapped all-reduce.

    eng = Engine(comm, bucket_cap_bytes=25 << 20)
    idx = [eng.register(p.size, "float32") for p in params]   # definition order
    eng.finalize()                                            # collective: every rank the same list
    each step: eng.begin(sync=True); eng.grad_ready(i, grad_i) as backward makes each; eng.end()

grad_ready may be called from any thread and returns at once; end() blocks until every
reported gradient holds the reduced value (avg by default).
"""

import ctypes

from . import errors
from ._lib import COMM_UNSET, c_comm, c_engine, c_status, lib
from .buffers import as_buf, dtype_code
from .communicator import op_code
from .errors import check, invalid

COMM_ENGINE_CONFIG_VERSION = 2
COMM_ENGINE_STATS_VERSION = 2
MAX_BUCKETS = 64
MAX_UNUSED = 64
MAX_PARTITIONS = 256


class EngineConfig(ctypes.Structure):
    """comm_engine_config_t (comm.h); every field COMM_UNSET / NULL unless set."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("version", ctypes.c_int),
        ("bucket_cap_bytes", ctypes.c_int64),
        ("first_bucket_bytes", ctypes.c_int64),
        ("op", ctypes.c_int),
        ("wire_dtype", ctypes.c_int),
        ("gradient_as_bucket_view", ctypes.c_int),
        ("static_graph", ctypes.c_int),
        ("find_unused_parameters", ctypes.c_int),
        ("stream", ctypes.c_void_p),
        ("trace_file", ctypes.c_char_p),
        ("partition_bytes", ctypes.c_int64),
        ("overlap_forward", ctypes.c_int),
    ]


class BucketStats(ctypes.Structure):
    _fields_ = [
        ("first_param", ctypes.c_int),
        ("num_params", ctypes.c_int),
        ("bytes", ctypes.c_uint64),
        ("ready_us", ctypes.c_double),
        ("start_us", ctypes.c_double),
        ("done_us", ctypes.c_double),
    ]


class PartitionStats(ctypes.Structure):
    _fields_ = [
        ("bucket", ctypes.c_int),
        ("priority", ctypes.c_int),
        ("first_param", ctypes.c_int),
        ("num_params", ctypes.c_int),
        ("bytes", ctypes.c_uint64),
        ("wire_order", ctypes.c_int),
        ("ready_us", ctypes.c_double),
        ("start_us", ctypes.c_double),
        ("done_us", ctypes.c_double),
    ]


class EngineStats(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("version", ctypes.c_int),
        ("steps", ctypes.c_uint64),
        ("synced_steps", ctypes.c_uint64),
        ("last_synced", ctypes.c_int),
        ("num_buckets", ctypes.c_int),
        ("layout_version", ctypes.c_int),
        ("bytes", ctypes.c_uint64),
        ("step_us", ctypes.c_double),
        ("exposed_comm_us", ctypes.c_double),
        ("comm_us", ctypes.c_double),
        ("overlap_ratio", ctypes.c_double),
        ("wait_us", ctypes.c_double),
        ("num_unused", ctypes.c_int),
        ("unused", ctypes.c_int * MAX_UNUSED),
        ("num_bucket_stats", ctypes.c_int),
        ("buckets", BucketStats * MAX_BUCKETS),
        ("num_partitions", ctypes.c_int),
        ("rounds", ctypes.c_uint64),
        ("round_us", ctypes.c_double),
        ("forward_wait_us", ctypes.c_double),
        ("num_partition_stats", ctypes.c_int),
        ("partitions", PartitionStats * MAX_PARTITIONS),
    ]


class HookArgs(ctypes.Structure):
    """comm_engine_hook_args_t: the partition a reduce hook reduces in place."""
    _fields_ = [
        ("buffer", ctypes.c_void_p),
        ("count", ctypes.c_size_t),
        ("dtype", ctypes.c_int),
        ("partition", ctypes.c_int),
        ("bucket", ctypes.c_int),
        ("params", ctypes.POINTER(ctypes.c_int)),
        ("num_params", ctypes.c_int),
        ("wire_order", ctypes.c_int),
        ("num_partitions", ctypes.c_int),
    ]


REDUCE_HOOK = ctypes.CFUNCTYPE(c_status, ctypes.POINTER(HookArgs), ctypes.c_void_p)

_bound = False


def _bind():
    global _bound
    if _bound:
        return
    if not hasattr(lib, "comm_engine_create"):
        raise errors.UnavailableError(
            "libcomm: this libcomm.so has no gradient engine (comm_engine_create); "
            "rebuild it from a tree that has libcomm/src/engine/", errors.UNAVAILABLE)
    p, i = ctypes.c_void_p, ctypes.c_int
    protos = {
        "comm_engine_create": [c_comm, ctypes.POINTER(EngineConfig), ctypes.POINTER(c_engine)],
        "comm_engine_register": [c_engine, ctypes.c_size_t, i, ctypes.POINTER(i)],
        "comm_engine_finalize": [c_engine],
        "comm_engine_begin": [c_engine, i],
        "comm_engine_grad_ready": [c_engine, i, p],
        "comm_engine_grad_view": [c_engine, i, ctypes.POINTER(p)],
        "comm_engine_end": [c_engine],
        "comm_engine_wait": [c_engine, i],
        "comm_engine_test": [c_engine, i, ctypes.POINTER(i)],
        "comm_engine_set_priority": [c_engine, i, i],
        "comm_engine_set_reduce_hook": [c_engine, REDUCE_HOOK, p],
        "comm_engine_stats": [c_engine, ctypes.POINTER(EngineStats)],
        "comm_engine_unused": [c_engine, ctypes.POINTER(i), i, ctypes.POINTER(i)],
        "comm_engine_destroy": [c_engine],
    }
    for name, argtypes in protos.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = c_status
    _bound = True


def _flag(value):
    return COMM_UNSET if value is None else int(bool(value))


class Engine:
    """comm_engine_t. Options left None take the environment's or the default (comm.h)."""

    def __init__(self, comm, *, bucket_cap_bytes=None, first_bucket_bytes=None, op=None,
                 wire_dtype=None, gradient_as_bucket_view=None, static_graph=None,
                 find_unused_parameters=None, trace_file=None, stream=None,
                 partition_bytes=None, overlap_forward=None):
        """stream: device gradients produced on that CUDA stream (a cudaStream_t address, or an
        object with .cuda_stream such as torch.cuda.Stream); pass their device addresses (ints)
        to grad_ready. end() then makes that stream wait for the reduced gradients (comm.h)."""
        _bind()
        if stream is not None and not isinstance(stream, int):
            stream = getattr(stream, "cuda_stream", None)
            if not isinstance(stream, int):
                raise invalid("libcomm: Engine: stream must be a cudaStream_t address (int) or have "
                              ".cuda_stream (torch.cuda.Stream)")
        cfg = EngineConfig(
            ctypes.sizeof(EngineConfig), COMM_ENGINE_CONFIG_VERSION,
            COMM_UNSET if bucket_cap_bytes is None else int(bucket_cap_bytes),
            COMM_UNSET if first_bucket_bytes is None else int(first_bucket_bytes),
            COMM_UNSET if op is None else op_code(op),
            COMM_UNSET if wire_dtype is None else dtype_code(wire_dtype),
            _flag(gradient_as_bucket_view), _flag(static_graph), _flag(find_unused_parameters),
            stream or None, None if trace_file is None else str(trace_file).encode(),
            COMM_UNSET if partition_bytes is None else int(partition_bytes), _flag(overlap_forward))
        self.comm = comm
        self.rank = comm.rank
        self.gradient_as_bucket_view = bool(gradient_as_bucket_view)
        handle = ctypes.c_void_p()
        check(lib.comm_engine_create(comm._live(), ctypes.byref(cfg), ctypes.byref(handle)),
              f"comm_engine_create (rank {self.rank})")
        self._handle = handle.value
        self.num_params = 0
        self._held = {}  # arrays handed to grad_ready in this step, alive until end() / next begin()
        self.overlap_forward = bool(overlap_forward)
        self._c_hook = None
        self._hook_error = None  # what the reduce hook raised, re-raised by end()

    def _live(self):
        if self._handle is None:
            raise invalid("libcomm: this engine was destroyed; make a new one")
        return self._handle

    def register(self, count, dtype="float32"):
        """One parameter's gradient (count elements of dtype), in definition order; its index."""
        index = ctypes.c_int()
        if int(count) < 0:
            raise invalid(f"libcomm: Engine.register: negative count {count}")
        check(lib.comm_engine_register(self._live(), int(count), dtype_code(dtype),
                                       ctypes.byref(index)),
              f"comm_engine_register (rank {self.rank}, parameter {self.num_params})")
        self.num_params += 1
        return index.value

    def set_priority(self, index, priority):
        """Before finalize: lower = needed sooner by the next forward (default: the index)."""
        check(lib.comm_engine_set_priority(self._live(), int(index), int(priority)),
              f"comm_engine_set_priority (rank {self.rank}, gradient {index})")

    def set_reduce_hook(self, hook):
        """Before finalize: hook(args) reduces each partition of a synced step in place of the
        engine's all-reduce (comm.h, comm_engine_set_reduce_hook). It runs on the engine's thread
        (holding the GIL while it runs), with args a HookArgs (buffer address, count, dtype code,
        partition, bucket, params, wire_order, num_partitions). An exception it raises fails the
        step: end() raises it (after the engine broke, as a failed all-reduce breaks it)."""
        if hook is None:
            c_hook = None
        else:
            def c_hook_fn(args, _user):
                try:
                    hook(args.contents)
                    return 0
                except BaseException as e:  # noqa: BLE001 - must not unwind into C
                    self._hook_error = e
                    return errors.INTERNAL
            c_hook = REDUCE_HOOK(c_hook_fn)
        check(lib.comm_engine_set_reduce_hook(self._live(), c_hook, None),
              f"comm_engine_set_reduce_hook (rank {self.rank})")
        self._c_hook = c_hook  # the engine calls it until destroy: keep it alive

    def finalize(self):
        check(lib.comm_engine_finalize(self._live()), f"comm_engine_finalize (rank {self.rank})")

    def begin(self, sync=True):
        self._check(lib.comm_engine_begin(self._live(), 1 if sync else 0),
              f"comm_engine_begin (rank {self.rank})")
        self._held = {}  # overlap_forward: the last step's partitions are done now

    def grad_ready(self, index, grad=None):
        """Gradient `index` is final for this step. grad: its current storage (an address, a
        numpy array, a torch CPU tensor), or None for its bucket view."""
        if grad is None or isinstance(grad, int):
            ptr = grad
        else:
            ptr = as_buf(grad, what=f"grad_ready: gradient {index}").ptr or None
            # end() writes the result there: the array must outlive the step.
            self._held[index] = grad
        status = lib.comm_engine_grad_ready(self._live(), int(index), ptr)
        if status:  # the message is only built on failure: this runs once per gradient
            self._check(status, f"comm_engine_grad_ready (rank {self.rank}, gradient {index})")

    def grad_view(self, index):
        """With gradient_as_bucket_view: the address of gradient `index` in the bucket storage
        (valid until stats()['layout_version'] changes)."""
        ptr = ctypes.c_void_p()
        check(lib.comm_engine_grad_view(self._live(), int(index), ctypes.byref(ptr)),
              f"comm_engine_grad_view (rank {self.rank}, gradient {index})")
        return ptr.value or 0

    def _check(self, status, what):
        """check(), but the reduce hook's own exception first when it broke the engine."""
        if status and self._hook_error is not None:
            error, self._hook_error = self._hook_error, None
            raise error
        check(status, what)

    def end(self):
        try:
            self._check(lib.comm_engine_end(self._live()), f"comm_engine_end (rank {self.rank})")
        finally:
            if not self.overlap_forward:  # else the comm thread still writes into them
                self._held = {}

    def wait(self, index):
        """Until gradient `index` holds this step's reduced value (overlap_forward)."""
        status = lib.comm_engine_wait(self._live(), int(index))
        if status:
            self._check(status, f"comm_engine_wait (rank {self.rank}, gradient {index})")

    def test(self, index):
        """True when gradient `index` holds this step's reduced value (wait() would not block)."""
        done = ctypes.c_int(0)
        status = lib.comm_engine_test(self._live(), int(index), ctypes.byref(done))
        if status:
            self._check(status, f"comm_engine_test (rank {self.rank}, gradient {index})")
        return bool(done.value)

    def stats(self):
        """The last synced step's numbers as a dict (times in microseconds from its begin)."""
        s = EngineStats()
        s.size, s.version = ctypes.sizeof(EngineStats), COMM_ENGINE_STATS_VERSION
        check(lib.comm_engine_stats(self._live(), ctypes.byref(s)),
              f"comm_engine_stats (rank {self.rank})")
        out = {name: getattr(s, name) for name, _ in EngineStats._fields_
               if name not in ("size", "version", "unused", "buckets", "num_bucket_stats",
                               "partitions", "num_partition_stats")}
        out["unused"] = list(s.unused[: min(s.num_unused, MAX_UNUSED)])
        out["buckets"] = [{name: getattr(b, name) for name, _ in BucketStats._fields_}
                          for b in s.buckets[: s.num_bucket_stats]]
        out["partitions"] = [{name: getattr(p, name) for name, _ in PartitionStats._fields_}
                             for p in s.partitions[: s.num_partition_stats]]
        return out

    def unused(self):
        """Indices of the gradients reduced as zeros in the last synced step."""
        count = ctypes.c_int()
        check(lib.comm_engine_unused(self._live(), None, 0, ctypes.byref(count)),
              f"comm_engine_unused (rank {self.rank})")
        arr = (ctypes.c_int * max(count.value, 1))()
        check(lib.comm_engine_unused(self._live(), arr, count.value, ctypes.byref(count)),
              f"comm_engine_unused (rank {self.rank})")
        return list(arr[: count.value])

    def destroy(self):
        if self._handle is None:
            return
        handle, self._handle = self._handle, None
        self._held = {}
        check(lib.comm_engine_destroy(handle), f"comm_engine_destroy (rank {self.rank})")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.destroy()
        return False
