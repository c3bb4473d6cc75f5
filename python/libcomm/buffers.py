"""What a collective's buffer argument may be, and how it becomes (pointer, count, dtype).

Accepted: numpy arrays, torch tensors (CPU, or CUDA: on the tensor's current stream), objects
with the buffer protocol (bytearray, memoryview, array.array, ctypes arrays; a dtype is needed when
their format does not say it), objects with __cuda_array_interface__ (CuPy, Numba: device memory,
on the stream the interface names), and RawBuffer (an address, a count and a dtype, e.g. memory
from Communicator.mem_alloc; with stream=, device memory). Every buffer must be contiguous:
libcomm reads and writes `count` elements from its start.
"""

import ctypes
from dataclasses import dataclass

import numpy as np

from .errors import invalid

# comm_dtype_t values (fixed forever by comm.h).
FLOAT32, FLOAT64, FLOAT16, BFLOAT16, INT8, UINT8, INT32, UINT32, INT64, UINT64 = range(10)

DTYPE_NAMES = {
    FLOAT32: "float32", FLOAT64: "float64", FLOAT16: "float16", BFLOAT16: "bfloat16",
    INT8: "int8", UINT8: "uint8", INT32: "int32", UINT32: "uint32", INT64: "int64", UINT64: "uint64",
}
ITEMSIZE = {FLOAT32: 4, FLOAT64: 8, FLOAT16: 2, BFLOAT16: 2, INT8: 1, UINT8: 1, INT32: 4,
            UINT32: 4, INT64: 8, UINT64: 8}
_BY_NAME = {name: code for code, name in DTYPE_NAMES.items()}
_BY_NAME.update({"float": FLOAT32, "double": FLOAT64, "half": FLOAT16, "bf16": BFLOAT16,
                 "fp32": FLOAT32, "fp64": FLOAT64, "fp16": FLOAT16})
_NUMPY = {np.dtype(np.float32): FLOAT32, np.dtype(np.float64): FLOAT64,
          np.dtype(np.float16): FLOAT16, np.dtype(np.int8): INT8, np.dtype(np.uint8): UINT8,
          np.dtype(np.int32): INT32, np.dtype(np.uint32): UINT32, np.dtype(np.int64): INT64,
          np.dtype(np.uint64): UINT64}
# numpy has no bfloat16: its bits are held as uint16 where numpy must see them.
NUMPY_OF = {code: dt for dt, code in _NUMPY.items()}
NUMPY_OF[BFLOAT16] = np.dtype(np.uint16)


def _torch_dtypes():
    import torch
    return {torch.float32: FLOAT32, torch.float64: FLOAT64, torch.float16: FLOAT16,
            torch.bfloat16: BFLOAT16, torch.int8: INT8, torch.uint8: UINT8, torch.int32: INT32,
            torch.int64: INT64}


def dtype_code(dtype):
    """comm_dtype_t of a name ("float32", "bf16"...), a numpy or torch dtype, or an int."""
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        if dtype in DTYPE_NAMES:
            return dtype
    elif isinstance(dtype, str):
        if dtype.lower() in _BY_NAME:
            return _BY_NAME[dtype.lower()]
    elif type(dtype).__module__ == "torch":
        code = _torch_dtypes().get(dtype)
        if code is not None:
            return code
    else:
        try:
            code = _NUMPY.get(np.dtype(dtype))
        except TypeError:
            code = None
        if code is not None:
            return code
    raise invalid(f"libcomm: dtype {dtype!r} is not one of libcomm's "
                  f"({', '.join(DTYPE_NAMES.values())})")


@dataclass
class RawBuffer:
    """A buffer libcomm knows only by address: `count` elements of `dtype` at `address`.
    The caller keeps the memory alive for as long as a call on it runs."""
    address: int
    count: int
    dtype: object = "float32"
    owner: object = None  # kept alive with the buffer
    stream: object = None  # None: host memory; a cudaStream_t (int, or .cuda_stream): device memory


@dataclass
class Buf:
    ptr: int        # 0 when there is no memory (count 0)
    count: int
    dtype: int
    writable: bool
    keep: object    # the Python object whose memory this is, held while a request runs
    stream: int = 0  # 0: host memory; else device memory, the cudaStream_t the call is enqueued on


def cuda_stream(value):
    """comm_stream_t of a stream: an address, an object with .cuda_stream (torch.cuda.Stream).
    0 and None are CUDA's default stream, which comm.h cannot take as NULL (NULL means host
    buffers): they become cudaStreamLegacy (1), the same stream by its explicit handle."""
    if value is not None and not isinstance(value, int):
        value = getattr(value, "cuda_stream", value)
        if not isinstance(value, int):
            raise invalid(f"libcomm: stream {value!r} is neither a cudaStream_t address (int) nor "
                          "has .cuda_stream (torch.cuda.Stream)")
    return int(value) if value else 1


_MEMVIEW_FORMATS = {"f": FLOAT32, "d": FLOAT64, "e": FLOAT16, "b": INT8, "B": UINT8,
                    "i": INT32, "I": UINT32, "q": INT64, "Q": UINT64, "l": INT64, "L": UINT64}


def as_buf(obj, dtype=None, what="buffer"):
    """(pointer, count, dtype) of `obj`; raises InvalidArgumentError naming `what`."""
    if isinstance(obj, Buf):
        return obj
    if isinstance(obj, RawBuffer):
        if obj.count < 0:
            raise invalid(f"libcomm: {what}: negative count {obj.count}")
        return Buf(int(obj.address or 0), int(obj.count), dtype_code(obj.dtype), True, obj,
                   0 if obj.stream is None else cuda_stream(obj.stream))
    if isinstance(obj, np.ndarray):
        return _numpy_buf(obj, dtype, what)
    if type(obj).__module__.startswith("torch"):
        return _torch_buf(obj, dtype, what)
    if hasattr(obj, "__cuda_array_interface__"):
        return _cuda_array_buf(obj, dtype, what)
    try:
        view = memoryview(obj)
    except TypeError:
        raise invalid(f"libcomm: {what} is a {type(obj).__name__}; expected a numpy array, a "
                      "torch tensor, a buffer-protocol object, an object with "
                      "__cuda_array_interface__ or libcomm.RawBuffer") from None
    if not view.c_contiguous:
        raise invalid(f"libcomm: {what} is not contiguous; pass a contiguous buffer")
    if dtype is None:
        fmt = view.format.lstrip("@=<")
        if fmt not in _MEMVIEW_FORMATS or view.itemsize != ITEMSIZE[_MEMVIEW_FORMATS[fmt]]:
            raise invalid(f"libcomm: {what} has format {view.format!r}; pass dtype=... to say "
                          "what its bytes hold")
        dtype = _MEMVIEW_FORMATS[fmt]
    code = dtype_code(dtype)
    if view.nbytes % ITEMSIZE[code]:
        raise invalid(f"libcomm: {what} has {view.nbytes} bytes, not a whole number of "
                      f"{DTYPE_NAMES[code]} elements")
    arr = np.frombuffer(view.cast("B"), dtype=np.uint8)  # no copy; gives the address
    return Buf(arr.ctypes.data if view.nbytes else 0, view.nbytes // ITEMSIZE[code], code,
               not view.readonly, (obj, arr))


def _numpy_buf(arr, dtype, what):
    if not arr.flags.c_contiguous:
        raise invalid(f"libcomm: {what} (numpy array) is not C-contiguous; use "
                      "np.ascontiguousarray")
    if dtype is None:
        code = _NUMPY.get(arr.dtype)
        if code is None:
            raise invalid(f"libcomm: {what} has numpy dtype {arr.dtype}, which libcomm does not "
                          f"reduce ({', '.join(DTYPE_NAMES.values())})")
    else:
        code = dtype_code(dtype)  # e.g. bfloat16 bits held in a uint16 array
        if arr.nbytes % ITEMSIZE[code]:
            raise invalid(f"libcomm: {what} has {arr.nbytes} bytes, not a whole number of "
                          f"{DTYPE_NAMES[code]} elements")
    return Buf(arr.ctypes.data if arr.size else 0, arr.nbytes // ITEMSIZE[code], code,
               bool(arr.flags.writeable), arr)


def _cuda_array_buf(obj, dtype, what):
    """__cuda_array_interface__ (version 2 or 3): device memory on the interface's stream."""
    iface = obj.__cuda_array_interface__
    ptr, readonly = iface["data"]
    shape = tuple(int(n) for n in iface["shape"])
    np_dtype = np.dtype(iface["typestr"])
    strides = iface.get("strides")
    if strides is not None:
        want, step = [], np_dtype.itemsize
        for n in reversed(shape):
            want.insert(0, step)
            step *= n
        if tuple(strides) != tuple(want) and int(np.prod(shape)) > 1:
            raise invalid(f"libcomm: {what} (__cuda_array_interface__) is not C-contiguous")
    if iface.get("mask") is not None:
        raise invalid(f"libcomm: {what} (__cuda_array_interface__) has a mask; pass plain memory")
    code = _NUMPY.get(np_dtype) if dtype is None else dtype_code(dtype)
    if code is None:
        raise invalid(f"libcomm: {what} has typestr {iface['typestr']!r}, which libcomm does not "
                      "reduce; pass dtype=... to say what its bytes hold")
    nbytes = int(np.prod(shape)) * np_dtype.itemsize
    if nbytes % ITEMSIZE[code]:
        raise invalid(f"libcomm: {what} has {nbytes} bytes, not a whole number of "
                      f"{DTYPE_NAMES[code]} elements")
    # Version 3's "stream": the stream the producer last used (1 legacy, 2 per-thread default);
    # absent or None: no ordering needed, the default stream serves.
    return Buf(int(ptr or 0) if nbytes else 0, nbytes // ITEMSIZE[code], code, not readonly, obj,
               cuda_stream(iface.get("stream")))


def _torch_buf(t, dtype, what):
    import torch
    if not isinstance(t, torch.Tensor):
        raise invalid(f"libcomm: {what} is a {type(t).__name__}, not a tensor")
    if t.device.type not in ("cpu", "cuda"):
        raise invalid(f"libcomm: {what} is on {t.device}; libcomm takes CPU and CUDA tensors")
    if not t.is_contiguous():
        raise invalid(f"libcomm: {what} (torch tensor) is not contiguous; use .contiguous()")
    code = _torch_dtypes().get(t.dtype) if dtype is None else dtype_code(dtype)
    if code is None:
        raise invalid(f"libcomm: {what} has torch dtype {t.dtype}, which libcomm does not reduce")
    nbytes = t.numel() * t.element_size()
    # A CUDA tensor's call is enqueued on its device's current stream, as torch's own collectives.
    stream = cuda_stream(torch.cuda.current_stream(t.device)) if t.device.type == "cuda" else 0
    return Buf(t.data_ptr() if nbytes else 0, nbytes // ITEMSIZE[code], code, True, t, stream)


def empty_like(obj, count, buf):
    """A fresh buffer of the same kind as `obj` with `count` elements of buf.dtype."""
    if type(obj).__module__.startswith("torch"):
        import torch
        return torch.empty(count, dtype=obj.dtype, device=obj.device)
    if isinstance(obj, np.ndarray):
        return np.empty(count, dtype=obj.dtype)
    raise invalid("libcomm: pass the receive buffer explicitly for raw buffers")


def void_p(ptr):
    return ctypes.c_void_p(ptr) if ptr else None
