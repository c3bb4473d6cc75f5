"""DistributedDataParallel on libcomm's gradient engine, for torch 1.13 (Debian's python3-torch).

    comm = libcomm.Communicator()
    model = libcomm.torch_ddp.DistributedDataParallel(model, comm)
    loss = model(x).sum(); loss.backward(); optimizer.step()

What it does, as torch's own DDP does it:
- At wrap time, parameters and buffers are broadcast from rank 0, so every replica starts equal.
- Each parameter's AccumulateGrad node gets a hook (torch 1.13 has no post-accumulate-grad
  hook; `p.expand_as(p).grad_fn.next_functions[0][0]` is that node, the way torch's DDP finds
  it). The first hook of a backward calls engine.begin(); each hook hands the gradient's
  current storage to engine.grad_ready, so its bucket's all-reduce starts while backward goes
  on; a callback queued on the autograd engine calls engine.end() when backward finishes, so
  `loss.backward()` returns with averaged gradients and optimizer.step() (and gradient
  clipping before it) sees them.
- no_sync(): backward accumulates locally; the next synced backward reduces the sum.
- gradient_as_bucket_view: each p.grad is a view of the engine's bucket storage (no copy in or
  out); a gradient the framework replaced (zero_grad(set_to_none=True)) is copied back in.
- find_unused_parameters: parameters without a gradient in this backward are reported with
  their current gradient or zeros (DDP's rule); an all-reduced used-map tells which were unused
  on every rank, and those keep grad None, as with torch's DDP.
"""

import ctypes

import numpy as np
import torch

from .communicator import Communicator
from .engine import Engine

_execution_engine = torch.autograd.Variable._execution_engine


def _tensor_at(address, like):
    """A tensor of like's shape and dtype over memory libcomm owns (no copy)."""
    nbytes = like.numel() * like.element_size()
    if nbytes == 0:
        return torch.zeros_like(like)
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
    return torch.from_numpy(raw).view(like.dtype).view(like.shape)


class DistributedDataParallel(torch.nn.Module):
    def __init__(self, module, comm=None, *, bucket_cap_mb=25, first_bucket_mb=None,
                 gradient_as_bucket_view=False, find_unused_parameters=False,
                 static_graph=False, broadcast_buffers=True, wire_dtype=None, trace_file=None,
                 engine_factory=Engine):
        super().__init__()
        self.module = module
        self._owns_comm = comm is None
        self._user_comm = Communicator() if comm is None else comm
        # The wrapper's own collectives (initial broadcast, buffers, the used-map) run on a
        # duplicate, so they can never interleave differently with the trainer's.
        self._comm = self._user_comm.dup()
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.find_unused_parameters = find_unused_parameters
        self.static_graph = static_graph
        self.broadcast_buffers = broadcast_buffers
        self.require_backward_grad_sync = True

        seen = set()
        self._params = []
        for p in module.parameters():  # definition order, shared parameters once
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                self._params.append(p)
        for p in self._params:
            if p.device.type != "cpu" or p.layout != torch.strided or not p.is_contiguous():
                raise ValueError(f"libcomm DDP: parameter of shape {tuple(p.shape)} on {p.device}"
                                 " is not a dense contiguous CPU tensor; only those are supported")
        self._broadcast_state()

        self.engine = engine_factory(
            self._user_comm, bucket_cap_bytes=int(bucket_cap_mb * (1 << 20)),
            first_bucket_bytes=None if first_bucket_mb is None else int(first_bucket_mb * (1 << 20)),
            gradient_as_bucket_view=gradient_as_bucket_view, static_graph=static_graph,
            find_unused_parameters=find_unused_parameters, wire_dtype=wire_dtype,
            trace_file=trace_file)
        for p in self._params:
            self.engine.register(p.numel(), p.dtype)
        self.engine.finalize()
        self._layout = None
        self._views = [None] * len(self._params)
        if gradient_as_bucket_view:
            self._install_views()

        n = len(self._params)
        self._ready = np.zeros(n, np.int32)   # this backward: hook fired for parameter i
        self._in_backward = False
        self._step_sync = True
        self._pending_sync = None             # set by forward; consumed by the next backward
        self.unused_parameters = []           # indices unused on every rank, last synced step
        self._accumulators = []               # the AccumulateGrad nodes must stay alive
        for i, p in enumerate(self._params):
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._make_hook(i))
            self._accumulators.append(acc)

    # ---- state shared at wrap time and each forward ----
    def _broadcast_state(self):
        with torch.no_grad():
            for t in list(self._params) + list(self.module.buffers()):
                self._broadcast_tensor(t)

    def _broadcast_tensor(self, t):
        if t.is_contiguous():
            self._comm.broadcast(t.data, root=0)
        else:
            tmp = t.data.contiguous()
            self._comm.broadcast(tmp, root=0)
            t.data.copy_(tmp)

    # ---- gradient views ----
    def _install_views(self, rebuilt=False):
        self._layout = self.engine.stats().get("layout_version")
        for i, p in enumerate(self._params):
            view = _tensor_at(self.engine.grad_view(i), p)
            old = self._views[i]
            if rebuilt:
                # The engine carried the values over and freed the old storage: the old view
                # must not be read any more, only replaced.
                if p.grad is not None and old is not None and p.grad.data_ptr() == old.data_ptr():
                    p.grad = view
            elif p.grad is not None:
                # A gradient torch has not made yet stays None (as in torch's DDP): the first
                # backward's hook copies it in and makes it the view.
                with torch.no_grad():
                    view.copy_(p.grad)
                p.grad = view
            self._views[i] = view

    def _refresh_views(self):
        # With static_graph the engine rebuilds its buckets once, after the first synced step.
        if self._layout is not None and self.engine.stats().get("layout_version") != self._layout:
            self._install_views(rebuilt=True)

    # ---- the step ----
    def forward(self, *inputs, **kwargs):
        if torch.is_grad_enabled():
            self._pending_sync = self.require_backward_grad_sync
            if self.broadcast_buffers:
                with torch.no_grad():
                    for b in self.module.buffers():
                        self._broadcast_tensor(b)
        return self.module(*inputs, **kwargs)

    def _make_hook(self, i):
        p = self._params[i]

        def hook(*_unused):
            if not self._in_backward:
                self._begin_backward()
            if not self._step_sync:
                return
            grad = p.grad
            if self.gradient_as_bucket_view:
                view = self._views[i]
                if grad is None or grad.data_ptr() != view.data_ptr():
                    # The framework replaced the gradient (set_to_none): back into the bucket.
                    with torch.no_grad():
                        view.copy_(grad if grad is not None else torch.zeros_like(p))
                    p.grad = view
                grad = view
            self._ready[i] = 1
            self.engine.grad_ready(i, grad.data_ptr() if grad.numel() else None)
        return hook

    def _begin_backward(self):
        sync = self.require_backward_grad_sync if self._pending_sync is None else self._pending_sync
        self._pending_sync = None
        self._step_sync = sync
        self._ready[:] = 0
        self.engine.begin(sync)
        self._in_backward = True
        _execution_engine.queue_callback(self._end_backward)

    def _end_backward(self):
        self._in_backward = False
        created = []
        if self._step_sync and self.find_unused_parameters:
            created = self._report_unused()
        self.engine.end()
        if self._step_sync:
            if self.find_unused_parameters:
                for i in created:
                    if i in self.unused_parameters:
                        self._params[i].grad = None  # unused everywhere: as torch's DDP leaves it
            if self.gradient_as_bucket_view and self.static_graph:
                self._refresh_views()

    def _report_unused(self):
        """DDP's find_unused_parameters: a parameter this rank did not reach is reported with
        what its gradient holds (zeros when it has none), so every rank reduces the same set;
        the used-map all-reduce (max) says which no rank reached."""
        created = []
        for i in np.flatnonzero(self._ready == 0):
            i = int(i)
            p = self._params[i]
            if self.gradient_as_bucket_view:
                if p.grad is None or p.grad.data_ptr() != self._views[i].data_ptr():
                    with torch.no_grad():
                        self._views[i].copy_(p.grad if p.grad is not None else
                                             torch.zeros_like(p))
                    if p.grad is None:
                        created.append(i)
                    p.grad = self._views[i]
            elif p.grad is None:
                p.grad = torch.zeros_like(p)
                created.append(i)
            self.engine.grad_ready(i, p.grad.data_ptr() if p.numel() else None)
        used = self._ready.copy()
        self._comm.allreduce(used, op="max")
        self.unused_parameters = [int(i) for i in np.flatnonzero(used == 0)]
        return created

    # ---- DDP's API ----
    def no_sync(self):
        """Backward passes inside accumulate locally; the next synced one reduces the sum."""
        ddp = self

        class _NoSync:
            def __enter__(self):
                self.old = ddp.require_backward_grad_sync
                ddp.require_backward_grad_sync = False

            def __exit__(self, *exc):
                ddp.require_backward_grad_sync = self.old
                return False
        return _NoSync()

    def stats(self):
        return self.engine.stats()

    def close(self):
        """Frees the engine and the wrapper's communicator (and the one it made, if any)."""
        if self.engine is not None:
            if self.gradient_as_bucket_view:
                for p, view in zip(self._params, self._views):
                    if p.grad is not None and view is not None and p.grad.data_ptr() == view.data_ptr():
                        p.grad = p.grad.clone()  # the bucket storage is about to go
            self.engine.destroy()
            self.engine = None
            self._comm.destroy()
            if self._owns_comm:
                self._user_comm.destroy()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


