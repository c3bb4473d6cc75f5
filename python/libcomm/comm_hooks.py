"""Comm hooks for libcomm's DistributedDataParallel, as torch's DDP has them (torch 1.13,
torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py):

    model.register_comm_hook(None, libcomm.comm_hooks.bf16_compress_hook)

hook(state, bucket) -> torch.futures.Future[Tensor] (or a Tensor): the bucket's reduced values.
The engine calls it on its own thread, once per partition of a synced step (a bucket cut into
pieces of up to partition_bytes, docs/engine.md "Partitions and priorities"), in the same
sequence on every rank, in place of its all-reduce; the result is copied back into the buffer and
from there into the gradients. `state` is the hook's own: the hooks below take a
libcomm.Communicator, or None for the wrapper's hook communicator (bucket.comm, a duplicate no
other thread uses). Unlike torch's, they average with op="avg" (no divide before a sum), as
the engine's built-in all-reduce and wire_dtype do, so bf16_compress_hook gives the gradients of
wire_dtype="bfloat16".
"""

import ctypes

import numpy as np
import torch

from .buffers import BFLOAT16, FLOAT16, FLOAT32, FLOAT64

_TORCH_DTYPE = {FLOAT32: torch.float32, FLOAT64: torch.float64, FLOAT16: torch.float16,
                BFLOAT16: torch.bfloat16}


class GradBucket:
    """What a hook gets: torch's GradBucket, for one partition of libcomm's engine."""

    def __init__(self, args, params, comm):
        self._args = args
        self._params = params
        self.comm = comm
        dtype = _TORCH_DTYPE.get(args.dtype)
        if dtype is None:
            raise ValueError(f"libcomm DDP comm hook: wire dtype code {args.dtype} is not a float type")
        nbytes = args.count * torch.tensor([], dtype=dtype).element_size()
        if nbytes == 0:
            self._buffer = torch.zeros(0, dtype=dtype)
        else:
            raw = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(args.buffer))
            self._buffer = torch.from_numpy(raw).view(dtype)

    def index(self):
        """The partition's index (torch: the bucket's)."""
        return self._args.partition

    def bucket_index(self):
        """The engine's bucket this partition is part of."""
        return self._args.bucket

    def buffer(self):
        """The partition's flat values (the engine's memory: valid only during the hook)."""
        return self._buffer

    def set_buffer(self, tensor):
        with torch.no_grad():
            self._buffer.copy_(tensor.reshape(-1))

    def parameters(self):
        """The parameters whose gradients (whole or in part) are in this partition."""
        return [self._params[self._args.params[i]] for i in range(self._args.num_params)]

    def is_last(self):
        """The last partition of this step's sequence."""
        return self._args.wire_order == self._args.num_partitions - 1


def _comm(state, bucket):
    return bucket.comm if state is None else state


def _future(tensor):
    fut = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def allreduce_hook(state, bucket):
    """The engine's built-in reduction, as a hook (torch: default_hooks.allreduce_hook)."""
    buf = bucket.buffer()
    _comm(state, bucket).allreduce(buf, op="avg")
    return _future(buf)


def _compress_hook(dtype):
    def hook(state, bucket):
        buf = bucket.buffer()
        compressed = buf.to(dtype)
        _comm(state, bucket).allreduce(compressed, op="avg")
        return _future(compressed.to(buf.dtype))
    hook.__name__ = f"{str(dtype).split('.')[-1]}_compress_hook"
    return hook


fp16_compress_hook = _compress_hook(torch.float16)
fp16_compress_hook.__doc__ = "Averages in float16 (torch: default_hooks.fp16_compress_hook)."
bf16_compress_hook = _compress_hook(torch.bfloat16)
bf16_compress_hook.__doc__ = "Averages in bfloat16 (torch: default_hooks.bf16_compress_hook)."
