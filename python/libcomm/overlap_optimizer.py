"""overlap_forward's optimizer (torch_ddp.DistributedDataParallel.overlap_optimizer): each
module's update is applied in its forward pre-hook once its reduced gradients are in. Split out
of torch_ddp.py, which wraps the model; this wraps the optimizer."""

import weakref

import torch

_live_overlapped = weakref.WeakSet()


class _OverlappedOptimizer:
    """An optimizer whose step() is applied per module, in that module's forward pre-hook, once
    the module's reduced gradients are in (engine.wait). Every other attribute is the optimizer's."""

    def __init__(self, ddp, optimizer):
        self._ddp = ddp
        self.optimizer = optimizer
        self._index = {id(p): i for i, p in enumerate(ddp._params)}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in self._index:
                    raise ValueError("libcomm DDP: overlap_optimizer: the optimizer holds a parameter the "
                                     "model does not (or one without requires_grad)")
        self._owed = {}        # id(p) -> p: stepped by the optimizer, update not applied yet
        self._zero_owed = None  # None, or set_to_none of a deferred zero_grad
        self._hooks = []
        self._groups = []  # each hooked module's parameters, in module order
        seen = set()
        for module in ddp.module.modules():
            mine = [p for p in module.parameters(recurse=False) if id(p) in self._index and id(p) not in seen]
            seen.update(id(p) for p in mine)
            if mine:
                self._groups.append(mine)
                self._hooks.append(module.register_forward_pre_hook(self._make_pre_hook(mine)))
        _live_overlapped.add(self)
        _patch_clip_grad_norm()

    def __getattr__(self, name):
        return getattr(self.optimizer, name)

    def _make_pre_hook(self, params):
        def pre_hook(*_unused):
            if not self._owed:
                return
            mine = [p for p in params if id(p) in self._owed]
            if mine and not self._arrived(mine):
                self._apply_arrived_meanwhile(mine)
            self._apply(mine)
        return pre_hook

    def _arrived(self, params):
        return all(self._ddp.engine.test(self._index[id(p)]) for p in params)

    def _apply_arrived_meanwhile(self, waiting_for):
        """While this module's gradients are still on the wire, updates the modules (later in the
        forward) whose gradients have all arrived, so that their updates are off the critical path
        when the last gradients land. Stops as soon as the awaited ones are in."""
        waiting = {id(p) for p in waiting_for}
        for group in self._groups:
            owed = [p for p in group if id(p) in self._owed and id(p) not in waiting]
            if not owed or not self._arrived(owed):
                continue
            self._apply(owed)
            if self._arrived(waiting_for):
                return

    def _apply(self, params):
        """Waits for these parameters' gradients, runs the optimizer on them alone, and the
        deferred zero_grad after."""
        if not params:
            return
        for p in params:
            self._ddp.engine.wait(self._index[id(p)])
        chosen = {id(p) for p in params}
        saved = [g["params"] for g in self.optimizer.param_groups]
        try:
            for g in self.optimizer.param_groups:
                g["params"] = [p for p in g["params"] if id(p) in chosen]
            self.optimizer.step()
        finally:
            for g, ps in zip(self.optimizer.param_groups, saved):
                g["params"] = ps
        for p in params:
            del self._owed[id(p)]
            if self._zero_owed is not None:
                _zero(p, self._zero_owed)
        if not self._owed:
            self._zero_owed = None
            self._ddp._in_flight = False

    def step(self, closure=None):
        if closure is not None:
            raise ValueError("libcomm DDP: an overlapped optimizer's step() takes no closure (it runs "
                             "per module, in the next forward)")
        self.flush()  # a step not followed by a forward yet: apply it first
        for g in self.optimizer.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    self._owed[id(p)] = p

    def zero_grad(self, set_to_none=False):
        later = set(self._owed)
        for g in self.optimizer.param_groups:
            for p in g["params"]:
                if id(p) not in later:
                    _zero(p, set_to_none)
        if later:
            self._zero_owed = set_to_none

    def flush(self):
        """Applies every owed update now (before saving, evaluating, or the next backward)."""
        if self._owed:
            self._apply(list(self._owed.values()))
        self._ddp._in_flight = False

    def state_dict(self):
        self.flush()
        return self.optimizer.state_dict()

    def load_state_dict(self, state):
        self.flush()
        self.optimizer.load_state_dict(state)


def _zero(p, set_to_none):
    """What torch's Optimizer.zero_grad does to one parameter."""
    if p.grad is None:
        return
    if set_to_none:
        p.grad = None
    else:
        if p.grad.grad_fn is not None:
            p.grad.detach_()
        else:
            p.grad.requires_grad_(False)
        p.grad.zero_()


_clip_patched = False


def _patch_clip_grad_norm():
    """Global-norm clipping needs every gradient: refuse it while an overlapped step is in flight."""
    global _clip_patched
    if _clip_patched:
        return
    _clip_patched = True
    original = torch.nn.utils.clip_grad_norm_

    def clip_grad_norm_(parameters, *args, **kwargs):
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        ids = {id(p) for p in params}
        for opt in list(_live_overlapped):
            if opt._ddp._in_flight and ids & set(opt._index):
                raise RuntimeError(
                    "libcomm DDP overlap_forward: clip_grad_norm_ needs every reduced gradient, but this step's "
                    "gradients are still arriving (they are applied per layer in the next forward); use "
                    "overlap_forward=False to clip by the global norm")
        return original(params, *args, **kwargs)

    torch.nn.utils.clip_grad_norm_ = clip_grad_norm_
    torch.nn.utils.clip_grad.clip_grad_norm_ = clip_grad_norm_
