"""Device buffers through the binding, 2 ranks under comm-run, over the fake CUDA runtime the device
tests use (tests/device/fake_cudart.cc, via COMM_CUDA_LIBRARY; no libnccl: the staged path): an
object with __cuda_array_interface__ over "device" memory from the fake cudaMalloc reaches libcomm
with its stream (not NULL), and every collective gives the host path's results; mixing host and
device buffers, and device buffers in a non-blocking call, are refused. A torch CUDA tensor takes
the same path (its device's current stream); Debian's torch has no CUDA, tools/gpu-check runs it.

    LIBCOMM_FAKE_CUDART=path/libfake_cudart.so (also COMM_CUDA_LIBRARY)"""

import ctypes
import os

import numpy as np

from harness import case, expect_raises, main
import libcomm

cuda = ctypes.CDLL(os.environ["LIBCOMM_FAKE_CUDART"])
cuda.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
cuda.cudaFree.argtypes = [ctypes.c_void_p]
cuda.cudaStreamCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
cuda.fake_cuda_waits.argtypes = [ctypes.c_void_p, ctypes.c_void_p]


class DeviceArray:
    """What CuPy or Numba hands out: device memory described by __cuda_array_interface__. The fake
    runtime's device memory is host memory, so .host is a numpy view of it for the checks."""

    def __init__(self, n, dtype=np.float32, stream=None):
        self.dtype = np.dtype(dtype)
        ptr = ctypes.c_void_p()
        assert cuda.cudaMalloc(ctypes.byref(ptr), n * self.dtype.itemsize) == 0
        self.ptr, self.n, self.stream = ptr.value, n, stream
        raw = (ctypes.c_uint8 * (n * self.dtype.itemsize)).from_address(self.ptr)
        self.host = np.frombuffer(raw, dtype=self.dtype)

    @property
    def __cuda_array_interface__(self):
        return {"data": (self.ptr, False), "shape": (self.n,), "typestr": self.dtype.str,
                "strides": None, "version": 3, "stream": self.stream}

    def __del__(self):
        cuda.cudaFree(self.ptr)


def new_stream():
    s = ctypes.c_void_p()
    assert cuda.cudaStreamCreateWithFlags(ctypes.byref(s), 1) == 0
    return s.value


@case
def allreduce_in_place_and_out_of_place(comm):
    stream = new_stream()
    x = DeviceArray(1000, stream=stream)
    x.host[:] = np.arange(1000, dtype=np.float32) * (comm.rank + 1)
    assert libcomm.buffers.as_buf(x).stream == stream
    comm.allreduce(x)
    np.testing.assert_array_equal(x.host, np.arange(1000, dtype=np.float32) * 3)
    out = DeviceArray(1000, stream=stream)
    comm.allreduce(x, out, op="max")
    np.testing.assert_array_equal(out.host, np.arange(1000, dtype=np.float32) * 3)


@case
def the_stream_reaches_libcomm(comm):
    # libcomm checks a stream's buffers: host memory under a stream is refused, which only a
    # call that passed the stream (not NULL) can be.
    host = np.ones(4, np.float32)
    expect_raises(libcomm.InvalidArgumentError, comm.allreduce,
                  libcomm.RawBuffer(host.ctypes.data, 4, "float32", host, stream=new_stream()),
                  contains=["host memory but a stream was passed"])
    comm.barrier()


@case
def other_collectives(comm):
    n = comm.size
    x = DeviceArray(8, np.int32)
    x.host[:] = comm.rank + 10
    g = DeviceArray(8 * n, np.int32)
    comm.allgather(x, g)
    np.testing.assert_array_equal(g.host, np.repeat(np.arange(n, dtype=np.int32) + 10, 8))
    b = DeviceArray(5, np.float64)
    b.host[:] = 7.5 if comm.rank == 0 else 0
    comm.broadcast(b, root=0)
    np.testing.assert_array_equal(b.host, np.full(5, 7.5))
    rs = DeviceArray(4 * n)
    rs.host[:] = np.arange(4 * n, dtype=np.float32)
    r = DeviceArray(4)
    comm.reduce_scatter(rs, r)
    np.testing.assert_array_equal(r.host, np.arange(4 * n, dtype=np.float32)[4 * comm.rank:4 * comm.rank + 4] * n)
    bf = DeviceArray(4, np.uint16)  # bfloat16 bits: the dtype says what they hold
    bf.host[:] = libcomm.bfloat16_bits(np.full(4, 1.5, np.float32))
    comm.allreduce(bf, dtype="bfloat16")
    np.testing.assert_array_equal(libcomm.bfloat16_values(bf.host), np.full(4, 3.0, np.float32))


@case
def mixing_and_nonblocking_are_refused(comm):
    x = DeviceArray(4)
    expect_raises(libcomm.InvalidArgumentError, comm.allreduce, x, np.zeros(4, np.float32),
                  contains=["device memory", "host memory"])
    expect_raises(libcomm.InvalidArgumentError, comm.iallreduce, x, contains=["blocking call"])
    expect_raises(libcomm.InvalidArgumentError, comm.allgather, x, contains=["receive buffer"])
    comm.barrier()


if __name__ == "__main__":
    main()
