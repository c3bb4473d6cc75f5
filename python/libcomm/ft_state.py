"""What makes a process a replica, for DDP's fault_tolerant=True (issue 35): sent to the ranks that
join (comm_grow), and hashed on every rank before the first step after a join (PCCL's check).

The shared part: parameters and buffers (broadcast by torch_ddp.py's _broadcast_state, as at
wrap time), the committed step, and the state_dict() of what the user registered with
ddp.register_state(optimizer=..., scheduler=..., sampler=..., **more). Rank 0 also sends its RNG
states (torch, numpy, python's random): a joiner takes them, as it takes the place of a rank whose
own states died with it; they are not hashed (replicas may draw differently, e.g. dropout per rank).
"""

import hashlib
import json
import random

import numpy as np
import torch


def _state_of(obj):
    """An object's state: state_dict(), or a DistributedSampler's epoch."""
    if hasattr(obj, "state_dict"):
        return obj.state_dict()
    if hasattr(obj, "epoch"):
        return {"epoch": obj.epoch}
    raise TypeError(f"libcomm DDP: register_state: {type(obj).__name__} has neither state_dict() "
                    "nor epoch; register what has state_dict()/load_state_dict()")


def _load_into(obj, state):
    if hasattr(obj, "load_state_dict"):
        obj.load_state_dict(state)
    elif hasattr(obj, "set_epoch"):
        obj.set_epoch(state["epoch"])
    else:
        obj.epoch = state["epoch"]


def _encode(value, tensors):
    """JSON-able, tensors out of line: a peer's blob is data, never a pickle to run."""
    if isinstance(value, torch.Tensor):
        tensors.append(value.detach().contiguous().cpu())
        return {"T": len(tensors) - 1}
    if isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        return {"N": [a.dtype.str, list(a.shape), _encode(torch.from_numpy(a.view(np.uint8).reshape(-1)), tensors)]}
    if isinstance(value, dict):
        return {"D": [[_encode(k, tensors), _encode(v, tensors)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return {"L" if isinstance(value, list) else "U": [_encode(v, tensors) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"V": value}
    raise TypeError(f"libcomm DDP: register_state: cannot send a {type(value).__name__} in a "
                    "state_dict (tensors, numbers, strings, lists, tuples and dicts only)")


def _decode(value, tensors):
    (kind, v), = value.items()
    if kind == "T":
        return tensors[v]
    if kind == "N":
        dtype, shape, data = v
        return _decode(data, tensors).numpy().view(np.dtype(dtype)).reshape(shape)
    if kind == "D":
        return {_decode(k, tensors): _decode(x, tensors) for k, x in v}
    if kind in ("L", "U"):
        out = [_decode(x, tensors) for x in v]
        return out if kind == "L" else tuple(out)
    return v


_DTYPES = {str(t): t for t in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                                torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool)}


def pack(step, registered):
    """Rank 0's blob: the step, each registered object's state, its RNG states, as bytes."""
    blob = {"step": int(step), "state": {name: _state_of(obj) for name, obj in registered.items()},
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                    "python": random.getstate()}}
    tensors = []
    tree = _encode(blob, tensors)
    meta = [[str(t.dtype), list(t.shape)] for t in tensors]
    head = json.dumps({"tree": tree, "tensors": meta}).encode()
    body = [np.frombuffer(t.view(torch.uint8).reshape(-1).numpy().tobytes() if t.numel() else b"",
                          np.uint8) for t in tensors]
    return np.concatenate([np.array([len(head)], np.int64).view(np.uint8),
                           np.frombuffer(head, np.uint8)] + body).astype(np.uint8)


def unpack(raw, registered, what, rng=True):
    """Loads a blob into the registered objects and (rng) the RNGs; returns the step."""
    n = int(raw[:8].view(np.int64)[0])
    head = json.loads(raw[8:8 + n].tobytes())
    tensors, at = [], 8 + n
    for dtype, shape in head["tensors"]:
        t = torch.empty(shape, dtype=_DTYPES[dtype])
        nbytes = t.numel() * t.element_size()
        if nbytes:
            t.view(-1).view(torch.uint8).copy_(torch.from_numpy(raw[at:at + nbytes].copy()))
        tensors.append(t)
        at += nbytes
    blob = _decode(head["tree"], tensors)
    missing = sorted(set(blob["state"]) - set(registered))
    if missing:
        raise RuntimeError(f"{what}rank 0 sent the state of {missing}, which this rank did not "
                           "register: every rank calls ddp.register_state(...) with the same names "
                           "(a joiner before its first forward)")
    for name, state in blob["state"].items():
        _load_into(registered[name], state)
    if rng:
        torch.set_rng_state(blob["rng"]["torch"])
        np.random.set_state(blob["rng"]["numpy"])
        random.setstate(blob["rng"]["python"])
    return blob["step"]


def broadcast_blob(comm, raw):
    """raw (a uint8 array) from rank 0 to every rank (None on the others)."""
    size = np.array([0 if raw is None else raw.size], np.int64)
    comm.broadcast(size, root=0)
    buf = raw if comm.rank == 0 else np.empty(int(size[0]), np.uint8)
    if buf.size:
        comm.broadcast(buf, root=0)
    return buf


def _hash_value(h, value):
    """Tensors by their bytes, containers in order, the rest by repr (floats repr exactly)."""
    if isinstance(value, torch.Tensor):
        t = value.detach().contiguous().cpu()
        h.update(repr((t.dtype, tuple(t.shape))).encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes())
    elif isinstance(value, dict):
        for k in sorted(value, key=repr):
            h.update(repr(k).encode())
            _hash_value(h, value[k])
    elif isinstance(value, (list, tuple)):
        h.update(b"[")
        for v in value:
            _hash_value(h, v)
        h.update(b"]")
    else:
        h.update(repr(value).encode())


def digest(ddp, step, registered):
    """sha256 of the shared part on this rank, and a per-part digest to say what differs."""
    parts = {"parameters": ddp._params, "buffers": list(ddp.module.buffers()), "step": step}
    parts.update({name: _state_of(obj) for name, obj in registered.items()})
    total = hashlib.sha256()
    each = {}
    for name in sorted(parts):
        h = hashlib.sha256()
        _hash_value(h, parts[name])
        each[name] = h.hexdigest()[:12]
        total.update(h.digest())
    return np.frombuffer(total.digest(), np.uint8).copy(), each


def broadcast_parts(comm, parts):
    """Rank 0's per-part digests ({name: hex}) on every rank: after a mismatch, to say what differs."""
    raw = np.frombuffer(json.dumps(parts, sort_keys=True).encode(), np.uint8).copy() if comm.rank == 0 else None
    return json.loads(broadcast_blob(comm, raw).tobytes())


def gather_digests(comm, mine):
    """Every rank's 32-byte digest, one row per rank."""
    return comm.allgather(mine).reshape(comm.size, 32)
