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
- register_comm_hook(state, hook): torch's comm hooks, per partition (libcomm/comm_hooks.py).
- join(): uneven inputs, as torch's Join context manager does for its DDP (see join()).
- gradient_as_bucket_view: each p.grad is a view of the engine's bucket storage (no copy in or
  out); a gradient the framework replaced (zero_grad(set_to_none=True)) is copied back in.
- find_unused_parameters: parameters without a gradient in this backward are reported with
  their current gradient or zeros (DDP's rule); an all-reduced used-map tells which were unused
  on every rank, and those keep grad None, as with torch's DDP.
- overlap_forward (ByteScheduler's scheduled optimizer): `opt = model.overlap_optimizer(opt)`;
  backward returns once every gradient is reported, `opt.step()` returns at once, and each
  module's parameters are updated in a forward pre-hook of that module just after their reduced
  gradients arrive (the engine sends the first layers' partitions first), so the next forward
  starts while the last layers are still on the wire. `opt.zero_grad()` is deferred the same way.
  Elementwise optimizers (SGD, momentum, Adam, AdamW) give the parameters a plain step gives;
  global-norm clipping (torch.nn.utils.clip_grad_norm_) while gradients are in flight is refused.
  A parameter used in forward by another module than the one that owns it (tied weights used
  before their owner runs) would be read before its update: keep overlap_forward off for those.
"""

import ctypes
import os

import numpy as np
import torch

from .communicator import Communicator
from .engine import Engine
from .fault_tolerance import FaultTolerance
from .overlap_optimizer import _OverlappedOptimizer

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
                 engine_factory=Engine, overlap_forward=False, partition_mb=None,
                 fault_tolerant=False):
        super().__init__()
        if fault_tolerant and overlap_forward:
            raise ValueError("libcomm DDP: fault_tolerant=True cannot keep overlap_forward=True: its "
                             "optimizer updates parameters during the next forward, before a failed "
                             "step could be redone; use overlap_forward=False")
        self._ft = None                       # fault_tolerance.FaultTolerance when fault_tolerant
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

        self._engine_args = dict(
            bucket_cap_bytes=int(bucket_cap_mb * (1 << 20)),
            first_bucket_bytes=None if first_bucket_mb is None else int(first_bucket_mb * (1 << 20)),
            gradient_as_bucket_view=gradient_as_bucket_view, static_graph=static_graph,
            find_unused_parameters=find_unused_parameters, wire_dtype=wire_dtype,
            trace_file=trace_file, **({"overlap_forward": True} if overlap_forward else {}),
            **({} if partition_mb is None else {"partition_bytes": int(partition_mb * (1 << 20))}))
        self._engine_factory = engine_factory
        self.overlap_forward = bool(overlap_forward)
        self._overlapped = None               # the _OverlappedOptimizer, once made
        self._in_flight = False               # overlap_forward: this step's gradients still arriving
        self._comm_hook = None                # (state, hook) of register_comm_hook
        self._reduce_hook = None              # the engine's side of it, kept for a rebuild
        self._hook_comm = None                # the hooks' own communicator
        self._stepped = False                 # a backward ran: too late for register_comm_hook
        self._joining = False                 # inside join(): each training forward says "active"
        self._layout = None
        self._closed = False                  # close() ran: the hooks do nothing any more
        self._views = [None] * len(self._params)
        self.engine = self._make_engine()

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
        if fault_tolerant:
            self._ft = FaultTolerance(self)
            # A replacement (COMM_JOIN=1): comm is the grown communicator, and the wrap above
            # paired with the members' (fault_tolerance.py, _as_at_wrap); the rest of the state
            # comes at register_state() or the first forward.
            self._ft.joining = os.environ.get("COMM_JOIN") == "1"

    def _make_engine(self, reduce_hook=None):
        engine = self._engine_factory(self._user_comm, **self._engine_args)
        for p in self._params:
            engine.register(p.numel(), p.dtype)
        if reduce_hook is not None:
            engine.set_reduce_hook(reduce_hook)
        engine.finalize()
        self.engine = engine
        if self.gradient_as_bucket_view:
            self._install_views()
        return engine

    # ---- state shared at wrap time and each forward ----
    def _broadcast_state(self):
        with torch.no_grad():
            for t in list(self._params) + list(self.module.buffers()):
                self._broadcast_tensor(t)

    def _broadcast_tensor(self, t, root=0):
        if t.is_contiguous():
            self._comm.broadcast(t.data, root=root)
        else:
            tmp = t.data.contiguous()
            self._comm.broadcast(tmp, root=root)
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
            if self._ft is not None:
                self._ft.before_forward()
                return self.module(*inputs, **kwargs)
            root = 0
            if self._joining:
                # The counterpart of the joined ranks' in _shadow_until_all_joined: buffers come
                # from the highest active rank (rank 0 may have joined with stale ones), as torch's.
                root = self._join_round(True)[0]
            if self.broadcast_buffers:
                with torch.no_grad():
                    for b in self.module.buffers():
                        self._broadcast_tensor(b, root=root)
        return self.module(*inputs, **kwargs)

    def _forward_collectives(self):
        """fault_tolerant: what a training forward sends, also redone after a failure."""
        if self.broadcast_buffers:
            with torch.no_grad():
                for b in self.module.buffers():
                    self._broadcast_tensor(b)

    def _make_hook(self, i):
        p = self._params[i]

        def hook(*_unused):
            if self.engine is None and (self._ft is None or self._closed):
                return  # closed: the module was wrapped again (e.g. on a shrunk communicator)
            # fault_tolerant: no engine while a failed admission at the step boundary left the
            # wrapper half-switched (fault_tolerance.py, _grow): this backward still runs, keeps
            # the local gradients and sets pending_vote, and should_commit() recovers.
            if not self._in_backward:
                self._begin_backward()
            if not self._step_sync:
                return
            grad = p.grad
            if self.gradient_as_bucket_view and self._views[i] is not None:
                view = self._views[i]
                if grad is None or grad.data_ptr() != view.data_ptr():
                    # The framework replaced the gradient (set_to_none): back into the bucket.
                    with torch.no_grad():
                        view.copy_(grad if grad is not None else torch.zeros_like(p))
                    p.grad = view
                grad = view
            self._ready[i] = 1
            if self._ft is not None:
                self._ft.keep(i, grad)
                self._ft.guard(lambda: self.engine.grad_ready(i, grad.data_ptr() if grad.numel() else None))
                return
            self.engine.grad_ready(i, grad.data_ptr() if grad.numel() else None)
        return hook

    def _begin_backward(self):
        if self._overlapped is not None:
            self._overlapped.flush()  # what forward did not reach (the engine drains too)
        self._in_flight = False
        sync = self.require_backward_grad_sync if self._pending_sync is None else self._pending_sync
        self._pending_sync = None
        self._step_sync = sync
        self._ready[:] = 0
        if self._ft is not None:
            self._ft.begin_backward(sync)
        else:
            self.engine.begin(sync)
        self._stepped = True
        self._in_backward = True
        _execution_engine.queue_callback(self._end_backward)

    def _end_backward(self):
        self._in_backward = False
        created = []
        if self._step_sync and self.find_unused_parameters:
            created = self._report_unused()
        if self._ft is not None:
            self._ft.guard(lambda: self.engine.end())
            self._ft.end_backward(self._step_sync)
        else:
            self.engine.end()
        if self.overlap_forward and self._step_sync:
            if self._overlapped is None:
                # No overlapped optimizer: the caller reads gradients after backward, as usual.
                for i in range(len(self._params)):
                    self.engine.wait(i)
            else:
                self._in_flight = True
        if self._step_sync:
            if self.find_unused_parameters:
                for i in created:
                    if i in self.unused_parameters:
                        self._params[i].grad = None  # unused everywhere: as torch's DDP leaves it
            if self.gradient_as_bucket_view and self.static_graph and (self._ft is None or self._ft.failure is None):
                self._refresh_views()

    def _report_unused(self):
        """DDP's find_unused_parameters: a parameter this rank did not reach is reported with
        what its gradient holds (zeros when it has none), so every rank reduces the same set;
        the used-map all-reduce (max) says which no rank reached."""
        created = []
        for i in np.flatnonzero(self._ready == 0):
            i = int(i)
            p = self._params[i]
            if self.gradient_as_bucket_view and self._views[i] is not None:
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
            if self._ft is not None:
                self._ft.keep(i, p.grad)
                self._ft.guard(lambda: self.engine.grad_ready(i, p.grad.data_ptr() if p.numel() else None))
            else:
                self.engine.grad_ready(i, p.grad.data_ptr() if p.numel() else None)
        used = self._ready.copy()
        if self._ft is not None:
            if self._ft.guard(lambda: self._comm.allreduce(used, None, "max")) is None:
                return created  # failed: the recovery redoes the used-map
        else:
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

    def join(self, enable=True):
        """Uneven inputs, as torch's `with Join([model]):` for its DDP:

            with model.join():
                for x in my_batches:        # some ranks have fewer
                    model(x).sum().backward(); opt.step()

        Inside, each training forward (grad enabled) first all-reduces "still active, synced or
        not"; a rank that leaves the block (out of batches) shadows the others' steps until every
        rank has left: it takes part in their buffer broadcasts and their gradient reduction with
        zeros, so the active ranks' gradients are the sum over the active ranks divided by the
        world size (torch's default, divide_by_initial_world_size=True). At the end every rank
        takes the model of the last rank to join, as torch's DDP does. Each rank must run
        forward and backward (synced) as a pair inside; the joined rank's gradients are not
        meaningful afterwards (with bucket views they hold the last shadow step's values). Not
        with overlap_forward."""
        ddp = self

        class _Join:
            def __enter__(self):
                if enable:
                    if ddp.overlap_forward:
                        raise ValueError("libcomm DDP: join() does not work with overlap_forward=True")
                    if ddp._ft is not None:
                        raise ValueError("libcomm DDP: join() does not work with fault_tolerant=True "
                                         "(a rank that ran out of batches cannot redo a step)")
                    ddp._joining = True
                return ddp

            def __exit__(self, exc_type, *exc):
                if not enable:
                    return False
                try:
                    if exc_type is None:
                        ddp._shadow_until_all_joined()
                finally:
                    ddp._joining = False
                return False
        return _Join()

    def _join_round(self, active):
        """One join() round: (highest active rank or -1, whether the active ranks sync)."""
        flags = np.array([self._comm.rank + 1, int(self._pending_sync)] if active else [0, 0], np.int32)
        self._comm.allreduce(flags, op="max")
        return int(flags[0]) - 1, bool(flags[1])

    def _shadow_until_all_joined(self):
        """The joined rank's side of join(): one round per step of the others, then their step."""
        zeros = None
        shadowed = False
        while True:
            root, sync = self._join_round(False)
            if root < 0:
                break
            shadowed = True
            if self.broadcast_buffers:
                with torch.no_grad():
                    for b in self.module.buffers():
                        self._broadcast_tensor(b, root=root)
            if not sync:
                continue  # a no_sync step: nothing to reduce
            if zeros is None:
                zeros = [torch.zeros_like(p) for p in self._params]
            for z in zeros:
                z.zero_()  # the last shadow step left the reduced values there
            self.engine.begin(True)
            for i, z in enumerate(zeros):
                self.engine.grad_ready(i, z.data_ptr() if z.numel() else None)
            if self.find_unused_parameters:
                self._comm.allreduce(np.zeros(len(self._params), np.int32), op="max")  # the used-map
            self.engine.end()
            self._stepped = True
        # As torch's DDP join hook: every rank ends with the model of the highest-ranked of the
        # last to join (those that never shadowed a step).
        root = np.array([self._comm.rank if not shadowed else -1], np.int32)
        self._comm.allreduce(root, op="max")
        with torch.no_grad():
            for t in list(self._params) + list(self.module.buffers()):
                self._broadcast_tensor(t, root=int(root[0]))

    def register_comm_hook(self, state, hook):
        """torch DDP's comm hook: hook(state, bucket) -> Future[Tensor] reduces each partition
        instead of the engine's all-reduce (libcomm.comm_hooks: GradBucket, allreduce_hook,
        fp16_compress_hook, bf16_compress_hook). Every rank registers the same hook, before the
        first backward, once. The hook runs on the engine's thread; bucket.comm is a communicator
        of its own (state=None in the shipped hooks), safe for collectives from inside a hook."""
        from .comm_hooks import GradBucket
        if self._comm_hook is not None:
            raise RuntimeError("libcomm DDP: register_comm_hook can only be called once")
        if self._stepped:
            raise RuntimeError("libcomm DDP: register_comm_hook must be called before the first backward")
        if not callable(hook):
            raise TypeError(f"libcomm DDP: register_comm_hook: the hook {hook!r} is not callable")
        if self._ft is not None and state is not None:
            raise ValueError("libcomm DDP: fault_tolerant=True takes comm hooks without state only "
                             f"(state=None, as allreduce_hook and the compress hooks): a state such as "
                             f"{type(state).__name__} (PowerSGD's error feedback and warm start) is per "
                             "rank and already updated by a step that a failure makes the survivors redo")
        if not hasattr(self.engine, "set_reduce_hook"):
            raise NotImplementedError(f"libcomm DDP: the engine {type(self.engine).__name__} has no reduce hooks")
        # The engine takes its hook before finalize: a new engine replaces the one made at wrap
        # time (collective, as this call is on every rank). Views' values survive the swap.
        self._hook_comm = self._user_comm.dup()
        params, ddp = self._params, self

        def reduce(args):
            bucket = GradBucket(args, params, ddp._hook_comm)  # rebuilt after a shrink
            out = hook(state, bucket)
            if isinstance(out, torch.futures.Future):
                out = out.wait()
            if not isinstance(out, torch.Tensor):
                raise TypeError(f"libcomm DDP comm hook {getattr(hook, '__name__', hook)} returned "
                                f"{type(out).__name__}, not a Future[Tensor] or Tensor")
            if out.numel() != bucket.buffer().numel():
                raise ValueError(f"libcomm DDP comm hook returned {out.numel()} elements for a "
                                 f"partition of {bucket.buffer().numel()}")
            if out.data_ptr() != bucket.buffer().data_ptr():
                bucket.set_buffer(out)

        if self.gradient_as_bucket_view:
            for i, p in enumerate(self._params):
                if p.grad is not None and self._views[i] is not None and \
                        p.grad.data_ptr() == self._views[i].data_ptr():
                    p.grad = p.grad.clone()  # the old bucket storage goes with the old engine
            self._views = [None] * len(self._params)
        old = self.engine
        self.engine = None
        old.destroy()
        self._make_engine(reduce)
        self._reduce_hook = reduce
        self._comm_hook = (state, hook)

    # ---- fault_tolerant=True (fault_tolerance.py) ----
    def should_commit(self):
        """After each synced backward: True once this step's gradients, averaged over the ranks that
        are still members, are in every p.grad alike (a failed step is redone on the survivors
        first); then call optimizer.step(). Raises FaultToleranceError when this rank must exit."""
        if self._ft is None:
            raise ValueError("libcomm DDP: should_commit() needs DistributedDataParallel(..., fault_tolerant=True)")
        return self._ft.should_commit()

    def step(self, optimizer, scheduler=None, on_commit=None):
        """should_commit(), then optimizer.step(), scheduler.step() and on_commit() (when given),
        then the step boundary, where ranks waiting to join are admitted and receive the registered
        state. Advance a data position in on_commit: after the boundary would be too late, the
        joiner would get the position of the step just committed and train one batch behind."""
        committed = self.should_commit()
        if committed:
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            if on_commit is not None:
                on_commit()
            self._ft.boundary()
        return committed

    def register_state(self, optimizer=None, scheduler=None, sampler=None, **more):
        """fault_tolerant: what a joining rank receives beside the parameters and buffers (each
        an object with state_dict()/load_state_dict(), or a sampler with an epoch), and what every
        rank hashes after a join. Every rank calls it with the same names, after the wrap (and
        register_comm_hook); on a joiner it receives the state at once."""
        if self._ft is None:
            raise ValueError("libcomm DDP: register_state() needs DistributedDataParallel(..., fault_tolerant=True)")
        self._ft.register(dict(optimizer=optimizer, scheduler=scheduler, sampler=sampler, **more))

    @property
    def comm(self):
        """The communicator of the members now (after a shrink, the shrunk one: the one passed in
        was destroyed)."""
        return self._user_comm

    @property
    def committed_steps(self):
        return None if self._ft is None else self._ft.step

    @property
    def slots(self):
        """fault_tolerant: the launcher slot (RANK) of every member, in rank order, the same on
        every member; a replacement has its slot's. The slots missing from it are the ranks lost
        and not yet replaced: a loop can train on their batches too (examples/fault_tolerant_train.py)."""
        return None if self._ft is None else list(self._ft.slots)

    @property
    def joins(self):
        """fault_tolerant: one dict per admission of joiners (step, size, seconds, repaired: the ranks
        whose state differed from rank 0's and was taken from it again; joined=True on the joiner's
        side)."""
        return [] if self._ft is None else list(self._ft.joins)

    @property
    def recoveries(self):
        """fault_tolerant: one dict per recovery (step, failed ranks, size, seconds, outcome)."""
        return [] if self._ft is None else list(self._ft.recoveries)

    def overlap_optimizer(self, optimizer):
        """The optimizer, deferred per module (overlap_forward=True): see the module docstring."""
        if not self.overlap_forward:
            raise ValueError("libcomm DDP: overlap_optimizer needs DistributedDataParallel(..., "
                             "overlap_forward=True)")
        if self._overlapped is not None:
            raise ValueError("libcomm DDP: overlap_optimizer was already called for this model")
        self._overlapped = _OverlappedOptimizer(self, optimizer)
        return self._overlapped

    def close(self):
        """Frees the engine and the wrapper's communicator (and the one it made, if any)."""
        self._closed = True
        if self.engine is not None:
            if self._overlapped is not None:
                self._overlapped.flush()
            if self.gradient_as_bucket_view:
                for p, view in zip(self._params, self._views):
                    if p.grad is not None and view is not None and p.grad.data_ptr() == view.data_ptr():
                        p.grad = p.grad.clone()  # the bucket storage is about to go
            self.engine.destroy()
            self.engine = None
            self._comm.destroy()
            if self._hook_comm is not None:
                self._hook_comm.destroy()
            if self._owns_comm:
                self._user_comm.destroy()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass
