"""libcomm from Python: a ctypes binding of comm.h (no compilation step).

    import libcomm
    with libcomm.Communicator() as comm:        # rank and size from torchrun / comm-run / mpirun
        x = numpy.ones(4, numpy.float32)
        comm.allreduce(x, op="avg")

The library is found through LIBCOMM_LIBRARY, then the repository's build/ (from a source
checkout), then the loader's search path (an installed libcomm.so.1), then next to the package.
Every failing call raises a CommError subclass whose message is comm_last_error's.
"""

from ._lib import path as library_path
from ._version import __version__
from .buffers import (BFLOAT16, FLOAT16, FLOAT32, FLOAT64, INT8, INT32, INT64, UINT8, UINT32,
                      UINT64, RawBuffer, dtype_code)
from .communicator import (ANY_SOURCE, OPS, Communicator, MemBuffer, Request, bfloat16_bits, bfloat16_values,
                           group, version)
from .errors import (AbortedError, CommError, CommSystemError, CommTimeoutError, InternalError,
                     InvalidArgumentError, InvalidUsageError, RemoteError, UnavailableError,
                     status_string)

__all__ = [
    "__version__", "Communicator", "Request", "MemBuffer", "RawBuffer", "group", "version", "library_path",
    "dtype_code", "bfloat16_bits", "bfloat16_values", "status_string", "OPS", "ANY_SOURCE",
    "CommError", "InvalidArgumentError", "InvalidUsageError", "CommSystemError",
    "CommTimeoutError", "RemoteError", "AbortedError", "UnavailableError", "InternalError",
    "FLOAT32", "FLOAT64", "FLOAT16", "BFLOAT16", "INT8", "UINT8", "INT32", "UINT32", "INT64",
    "UINT64",
]


def __getattr__(name):
    # The engine binds symbols that only newer libraries have: loaded on first use.
    if name in ("Engine", "EngineConfig"):
        from . import engine
        return getattr(engine, name)
    raise AttributeError(name)
