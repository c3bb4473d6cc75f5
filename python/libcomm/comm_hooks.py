"""Comm hooks for libcomm's DistributedDataParallel, as torch's DDP has them (torch 1.13,
torch/distributed/algorithms/ddp_comm_hooks/: default_hooks.py, powerSGD_hook.py):

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


class PowerSGDState:
    """PowerSGD's state (torch: powerSGD_hook.PowerSGDState; Vogels et al., NeurIPS 2019).

    comm: the communicator of its collectives (None: bucket.comm). Matrix gradients (ndim > 1)
    of a partition are sent as rank-`matrix_approximation_rank` factors P, Q when that is at least
    `min_compression_rate` times smaller; the rest, and every partition during the first
    `start_powerSGD_iter` steps, are averaged uncompressed. Error feedback and warm start as torch's."""

    def __init__(self, comm=None, matrix_approximation_rank=1, start_powerSGD_iter=10,
                 min_compression_rate=2, use_error_feedback=True, warm_start=True, random_seed=0,
                 orthogonalization_epsilon=0.0):
        self.comm = comm
        self.matrix_approximation_rank = int(matrix_approximation_rank)
        self.start_powerSGD_iter = int(start_powerSGD_iter)
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = use_error_feedback
        self.warm_start = warm_start
        self.random_seed = int(random_seed)
        self.orthogonalization_epsilon = orthogonalization_epsilon
        self.iter = 0
        self.error = {}  # partition -> this rank's compression error, added back next step
        self.qs = {}     # (partition, parameter position) -> Q of the last step (warm start)


def _orthogonalize(m, eps):
    """Gram-Schmidt on the columns of m (n x r), in place."""
    for i in range(m.shape[1]):
        col = m[:, i:i + 1]
        col.div_(col.norm() + eps if eps else col.norm())
        if i + 1 < m.shape[1]:
            rest = m[:, i + 1:]
            rest.sub_(col @ (col.t() @ rest))


def _whole_gradients(bucket):
    """(position, parameter, view of its gradient in the buffer) for a partition of whole
    parameters; None for a piece of one larger parameter (docs/engine.md, "Partitions and priorities")."""
    buf, params = bucket.buffer(), bucket.parameters()
    if len(params) == 1 and params[0].numel() != buf.numel():
        return None
    out, at = [], 0
    for k, p in enumerate(params):
        out.append((k, p, buf[at:at + p.numel()].view(p.shape)))
        at += p.numel()
    return out


def powerSGD_hook(state, bucket):
    """Low-rank compressed averaging (torch: powerSGD_hook.powerSGD_hook); state: PowerSGDState."""
    comm = _comm(state.comm, bucket)
    compressing = state.iter >= state.start_powerSGD_iter
    if bucket.is_last():
        state.iter += 1  # steps, counted at each step's last partition (as torch's)
    grads = _whole_gradients(bucket)
    if not compressing or grads is None:
        return allreduce_hook(comm, bucket)
    buf = bucket.buffer()
    work = buf.float()  # factors in fp32 whatever the wire dtype
    key = bucket.index()
    if state.use_error_feedback:
        if key in state.error:
            work.add_(state.error[key])
        before = work.clone()
    compress, plain = [], []
    at = 0
    for k, p, _ in grads:
        view = work[at:at + p.numel()]
        at += p.numel()
        if p.dim() > 1:
            n, m = p.shape[0], p.numel() // p.shape[0]
            r = min(n, m, state.matrix_approximation_rank)
            if n * m >= state.min_compression_rate * (n + m) * r:
                compress.append((k, view.view(n, m), r))
                continue
        plain.append(view)
    if plain:
        flat = torch.cat(plain)
        comm.allreduce(flat, op="avg")
        at = 0
        for view in plain:
            view.copy_(flat[at:at + view.numel()])
            at += view.numel()
    if compress:
        qs = []
        for k, mat, r in compress:
            q = state.qs.get((key, k)) if state.warm_start else None
            if q is None:
                gen = torch.Generator().manual_seed(state.random_seed * 1_000_003 + key * 1009 + k)
                q = torch.randn(mat.shape[1], r, generator=gen)
            _orthogonalize(q, state.orthogonalization_epsilon)
            qs.append(q)
        ps = torch.cat([(mat @ q).reshape(-1) for (_, mat, _), q in zip(compress, qs)])
        comm.allreduce(ps, op="sum")  # orthogonalized next: the scale does not matter
        p_views, at = [], 0
        for (_, mat, r) in compress:
            p = ps[at:at + mat.shape[0] * r].view(mat.shape[0], r)
            at += mat.shape[0] * r
            _orthogonalize(p, state.orthogonalization_epsilon)
            p_views.append(p)
        new_qs = torch.cat([(mat.t() @ p).reshape(-1) for (_, mat, _), p in zip(compress, p_views)])
        comm.allreduce(new_qs, op="avg")
        at = 0
        for (k, mat, r), p in zip(compress, p_views):
            q = new_qs[at:at + mat.shape[1] * r].view(mat.shape[1], r)
            at += mat.shape[1] * r
            mat.copy_(p @ q.t())
            if state.warm_start:
                state.qs[(key, k)] = q.clone()
    if state.use_error_feedback:
        state.error[key] = before - work
    return _future(work.to(buf.dtype))
