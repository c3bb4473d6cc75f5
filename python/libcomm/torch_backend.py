"""libcomm as a torch.distributed backend: importing this module registers "libcomm".

    import libcomm.torch_backend                 # PYTHONPATH=python
    torch.distributed.init_process_group("libcomm")    # was: init_process_group("gloo")

Then every torch.distributed call (all_reduce, all_gather, all_to_all, send/recv, barrier, ...)
and torch's own DistributedDataParallel run on libcomm, on CPU tensors. The process group is a
C++ extension (python/libcomm/csrc/process_group_libcomm.cc) that meson builds when
libtorch-dev is installed; docs/torch-backend.md says what each collective maps to.

Rendezvous goes through the store torch hands in (env://, tcp://, file://, or your own Store):
the group's rank 0 picks a free TCP port on its host, publishes "host:port" in that store, and
every rank calls comm_init with init_method tcp://host:port and the group's rank and size. The
timeout of init_process_group / new_group becomes comm_config_t.timeout_ms.

Environment: LIBCOMM_TORCH_EXTENSION (the extension's path), LIBCOMM_PG_ADDR (the address rank 0
advertises, when the route to the store's host is not the one peers should use),
LIBCOMM_PG_TRANSPORT (comm_config_t.transport).
"""

import datetime
import importlib.machinery
import importlib.util
import ipaddress
import os
import socket
from pathlib import Path

import torch.distributed as dist

BACKEND = "libcomm"
_STORE_KEY = "libcomm/rendezvous"
_INT_MAX = 2**31 - 1


def _extension_path():
    explicit = os.environ.get("LIBCOMM_TORCH_EXTENSION")
    if explicit is not None:
        return explicit or None  # set but empty: "not built" (the tests of a build without it)
    # python/libcomm/torch_backend.py -> repository root; meson builds the module in build*/python/.
    root = Path(__file__).resolve().parents[2]
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    builds = [root / "build"] + sorted(p for p in root.glob("build*") if p.name != "build")
    for build in builds:
        for suffix in suffixes:
            path = build / "python" / ("_torch_backend" + suffix)
            if path.exists():
                return str(path)
    return None


def _load_extension():
    path = _extension_path()
    if path is None and os.environ.get("LIBCOMM_TORCH_EXTENSION") is None:
        try:
            from . import _torch_backend  # an installed copy beside this file
            return _torch_backend
        except ImportError:
            pass
    if path is None:
        raise ImportError(
            "libcomm.torch_backend: the C++ extension _torch_backend is not built. Install "
            "libtorch-dev, pybind11-dev and python3-dev (scripts/lib.sh lists them), then "
            "`meson setup --reconfigure build && ninja -C build`; or set LIBCOMM_TORCH_EXTENSION.")
    spec = importlib.util.spec_from_file_location("libcomm._torch_backend", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_ext = _load_extension()
ProcessGroupLibcomm = _ext.ProcessGroupLibcomm


def _store_host(store):
    """The host of the TCPStore under torch's PrefixStores, or None (file store, hash store)."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    if isinstance(store, dist.TCPStore):
        return store.host
    return os.environ.get("MASTER_ADDR")


def _advertised_host(store):
    """The address of this host that the other ranks reach: the one on the route to the store's
    host (they all reach that one), loopback when the store is local."""
    explicit = os.environ.get("LIBCOMM_PG_ADDR")
    if explicit:
        return explicit
    target = _store_host(store)
    if not target:
        return "127.0.0.1"
    try:
        infos = socket.getaddrinfo(target, 1, type=socket.SOCK_DGRAM)
    except socket.gaierror:
        return "127.0.0.1"
    family, _, _, _, addr = infos[0]
    if ipaddress.ip_address(addr[0].split("%")[0]).is_loopback:
        return "127.0.0.1" if family == socket.AF_INET else "::1"
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(addr)  # UDP: no packet is sent, the kernel only picks the route
        return s.getsockname()[0]


def _free_port(host):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _timeout_ms(timeout):
    if not isinstance(timeout, datetime.timedelta):
        raise TypeError(f"libcomm: timeout must be a datetime.timedelta, got {type(timeout).__name__}")
    ms = int(timeout.total_seconds() * 1000)
    if ms <= 0:
        raise ValueError(f"libcomm: timeout must be positive, got {timeout}")
    return min(ms, _INT_MAX)


def create_process_group(store, rank, world_size, timeout, profiling_name=BACKEND):
    """torch.distributed's creator for backend "libcomm": (store, rank, size, timeout).

    profiling_name: the prefix of the group's profiler events ("libcomm:all_reduce"); a caller that
    has torch record the group under another backend name passes that name, since torch's tools
    look events up by dist.get_backend() (tests/python/torch_suite.py does, for "gloo")."""
    timeout_ms = _timeout_ms(timeout)
    if rank == 0:
        host = _advertised_host(store)
        # The port is free now; comm_init binds it again at once (SO_REUSEADDR). Another process
        # taking it in between makes comm_init fail with a clear error, never a hang.
        port = _free_port(host)
        store.set(_STORE_KEY, f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    address = store.get(_STORE_KEY).decode()
    transport = os.environ.get("LIBCOMM_PG_TRANSPORT", "")
    return ProcessGroupLibcomm(rank, world_size, "tcp://" + address, timeout_ms, transport, profiling_name)


def _launcher_env():
    """torch's env:// reads RANK and WORLD_SIZE only; mpirun and srun set their own names. Fill in
    torch's from them, as libcomm's env:// does, never overriding what is set. MASTER_ADDR and
    MASTER_PORT (torch's store) must still be given: mpirun -x MASTER_ADDR=... -x MASTER_PORT=..."""
    for rank, size, local in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
                              ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")):
        if "RANK" not in os.environ and rank in os.environ and size in os.environ:
            os.environ["RANK"] = os.environ[rank]
            os.environ["WORLD_SIZE"] = os.environ[size]
            if local in os.environ:
                os.environ.setdefault("LOCAL_RANK", os.environ[local])


def _register():
    if BACKEND.upper() in dist.Backend._plugins:  # imported twice (e.g. under two names)
        return
    dist.Backend.register_backend(BACKEND, create_process_group)


_launcher_env()
_register()
