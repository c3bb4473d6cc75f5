"""Finding and loading libcomm.so, and the C prototypes the binding calls.

The binding is ctypes only, so nothing is compiled: the prototypes below mirror comm.h and
must change with it. ctypes releases the GIL for the length of every foreign call, so a
blocking collective on one thread does not stop the others (autograd hooks included).
"""

import ctypes
import ctypes.util
import os
from pathlib import Path

c_status = ctypes.c_int
c_comm = ctypes.c_void_p
c_request = ctypes.c_void_p
c_engine = ctypes.c_void_p
_p = ctypes.c_void_p
_size = ctypes.c_size_t
_int = ctypes.c_int


class CommConfig(ctypes.Structure):
    """comm_config_t: versioned, every field has an explicit unset value."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("version", ctypes.c_int),
        ("init_method", ctypes.c_char_p),
        ("rank", ctypes.c_int),
        ("world_size", ctypes.c_int),
        ("timeout_ms", ctypes.c_int),
        ("transport", ctypes.c_char_p),
    ]


COMM_UNSET = -1
COMM_CONFIG_VERSION = 1


def _candidates():
    """Where libcomm.so is looked for, in order: LIBCOMM_LIBRARY; the repository's build/ when
    the package runs from a source checkout; the loader's search path (an installed
    libcomm.so.1: ldconfig's cache, LD_LIBRARY_PATH); a copy next to the package (a wheel
    that bundles it)."""
    explicit = os.environ.get("LIBCOMM_LIBRARY")
    if explicit:
        # Set on purpose: never fall back silently to another copy.
        return [explicit], True
    out = []
    here = Path(__file__).resolve().parent
    # python/libcomm/_lib.py -> repository root; `meson setup build` puts libcomm.so there.
    # Installed (site-packages), parents[1] has no meson.build: no build/ of a stranger is used.
    root = here.parents[1]
    if (root / "meson.build").exists() and (root / "libcomm" / "include").is_dir():
        for build in ("build", "builddir"):
            for name in ("libcomm.so.1", "libcomm.so"):
                path = root / build / name
                if path.exists():
                    out.append(str(path))
    # The soname first: dlopen searches LD_LIBRARY_PATH, ldconfig's cache and /lib, /usr/lib.
    out.append("libcomm.so.1")
    found = ctypes.util.find_library("comm")
    if found and found != "libcomm.so.1":
        out.append(found)
    out.append(str(here / "libcomm.so.1"))
    return out, False


def _load():
    paths, explicit = _candidates()
    errors = []
    for path in paths:
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append(f"{path}: {e}")
            if explicit:
                break
    raise OSError(
        "libcomm: cannot load libcomm.so (" + "; ".join(errors) + "). Set LIBCOMM_LIBRARY to the "
        "library's path, build it with `meson setup build && ninja -C build`, or install it (`meson install -C build`, "
        "then ldconfig).")


# Each entry: name -> (argtypes). Every call returns comm_status_t except where noted.
_PROTOTYPES = {
    "comm_get_async_error": [c_comm],
    "comm_get_version": [ctypes.POINTER(_int), ctypes.POINTER(_int)],
    "comm_init": [ctypes.POINTER(CommConfig), ctypes.POINTER(c_comm)],
    "comm_dup": [c_comm, ctypes.POINTER(c_comm)],
    "comm_split": [c_comm, _int, _int, ctypes.POINTER(c_comm)],
    "comm_shrink": [c_comm, ctypes.POINTER(_int), _int, ctypes.POINTER(c_comm)],
    "comm_agree_failed": [c_comm, ctypes.POINTER(_int), _int, ctypes.POINTER(_int)],
    "comm_agree": [c_comm, ctypes.POINTER(_int), ctypes.POINTER(_int), _int, ctypes.POINTER(_int)],
    "comm_exclude": [c_comm, ctypes.POINTER(_int), _int],
    "comm_grow": [c_comm, _int, ctypes.POINTER(c_comm)],
    "comm_abort": [c_comm],
    "comm_destroy": [c_comm],
    "comm_rank": [c_comm, ctypes.POINTER(_int)],
    "comm_size": [c_comm, ctypes.POINTER(_int)],
    "comm_mem_alloc": [c_comm, _size, ctypes.POINTER(_p)],
    "comm_mem_free": [c_comm, _p],
    "comm_allreduce": [c_comm, _p, _p, _size, _int, _int, _p],
    "comm_broadcast": [c_comm, _p, _p, _size, _int, _int, _p],
    "comm_reduce": [c_comm, _p, _p, _size, _int, _int, _int, _p],
    "comm_allgather": [c_comm, _p, _p, _size, _int, _p],
    "comm_reduce_scatter": [c_comm, _p, _p, _size, _int, _int, _p],
    "comm_alltoall": [c_comm, _p, _p, _size, _int, _p],
    "comm_barrier": [c_comm, _p],
    "comm_send": [c_comm, _p, _size, _int, _int, _p],
    "comm_recv": [c_comm, _p, _size, _int, _int, _p],
    "comm_group_start": [],
    "comm_group_end": [],
    "comm_iallreduce": [c_comm, _p, _p, _size, _int, _int, ctypes.POINTER(c_request)],
    "comm_ibroadcast": [c_comm, _p, _p, _size, _int, _int, ctypes.POINTER(c_request)],
    "comm_ireduce": [c_comm, _p, _p, _size, _int, _int, _int, ctypes.POINTER(c_request)],
    "comm_iallgather": [c_comm, _p, _p, _size, _int, ctypes.POINTER(c_request)],
    "comm_ireduce_scatter": [c_comm, _p, _p, _size, _int, _int, ctypes.POINTER(c_request)],
    "comm_ialltoall": [c_comm, _p, _p, _size, _int, ctypes.POINTER(c_request)],
    "comm_ibarrier": [c_comm, ctypes.POINTER(c_request)],
    "comm_isend": [c_comm, _p, _size, _int, _int, ctypes.POINTER(c_request)],
    "comm_irecv": [c_comm, _p, _size, _int, _int, ctypes.POINTER(c_request)],
    "comm_recv_any": [c_comm, _p, _size, _int, ctypes.POINTER(_int), _p],
    "comm_irecv_any": [c_comm, _p, _size, _int, ctypes.POINTER(_int), ctypes.POINTER(c_request)],
    "comm_barrier_monitored": [c_comm, _int, _int, ctypes.POINTER(_int), _int, ctypes.POINTER(_int)],
    "comm_wait": [c_request],
    "comm_test": [c_request, ctypes.POINTER(_int)],
}


# Since ABI 1.6 to 1.11: bound when the library has them (an older one still loads; calling them raises).
_NEWER = {"comm_barrier_monitored", "comm_recv_any", "comm_irecv_any", "comm_agree_failed", "comm_grow",
          "comm_agree", "comm_exclude"}


def _bind(lib):
    for name, argtypes in _PROTOTYPES.items():
        if name in _NEWER and not hasattr(lib, name):
            continue
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = c_status
    lib.comm_status_string.argtypes = [c_status]
    lib.comm_status_string.restype = ctypes.c_char_p
    lib.comm_last_error.argtypes = [c_comm]
    lib.comm_last_error.restype = ctypes.c_char_p
    return lib


lib, path = _load()
_bind(lib)
