"""A plain stand-in for libcomm.Engine: one blocking all-reduce (avg) per reported gradient
at end(), no buckets, no overlap. The integration tests run the PyTorch wrapper on it as
well as on the real engine, so a difference between the two points at the engine, and the
wrapper's logic is tested where the engine is not built."""


import numpy as np

import libcomm
from libcomm.buffers import ITEMSIZE, RawBuffer, dtype_code


class ReferenceEngine:
    def __init__(self, comm, *, gradient_as_bucket_view=False, **_options):
        self.comm = comm.dup()
        self.params = []
        self.views = []
        self.ready = {}
        self.in_step = False
        self.sync = True
        self.steps = 0
        self.view = gradient_as_bucket_view

    def register(self, count, dtype="float32"):
        self.params.append((int(count), dtype_code(dtype)))
        return len(self.params) - 1

    def finalize(self):
        if self.view:
            self.views = [np.zeros(max(c * ITEMSIZE[d], 1), np.uint8) for c, d in self.params]

    def begin(self, sync=True):
        assert not self.in_step, "begin twice"
        self.in_step, self.sync, self.ready = True, bool(sync), {}

    def grad_ready(self, index, ptr=None):
        assert self.in_step and index not in self.ready, f"grad_ready({index}) out of order"
        self.ready[index] = ptr if ptr is not None else self.grad_view(index)

    def grad_view(self, index):
        return self.views[index].ctypes.data

    def end(self):
        assert self.in_step, "end without begin"
        self.in_step = False
        self.steps += 1
        if not self.sync:
            return
        missing = [i for i in range(len(self.params)) if i not in self.ready]
        if missing:
            raise libcomm.InvalidUsageError(f"gradients {missing} never reported", 2)
        for i, (count, dtype) in enumerate(self.params):
            if count:
                self.comm.allreduce(RawBuffer(self.ready[i], count, dtype), op="avg")

    def stats(self):
        return {"steps": self.steps, "layout_version": 1}

    def destroy(self):
        self.comm.destroy()


