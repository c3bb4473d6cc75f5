#!/usr/bin/python3
"""torch's own distributed test suite (DistributedTest._DistTestBase, installed with Debian's
python3-torch 1.13) on libcomm or on gloo, run as torch's test/distributed/test_distributed_spawn.py
runs it: env BACKEND and WORLD_SIZE, spawned ranks, a file:// rendezvous in a fresh TEMP_DIR.

    tests/python/torch_suite.py --backend libcomm --world-size 2 [-k PATTERN ...] [--results FILE]

The suite opens most of its tests to BACKEND == "gloo" only (timeouts, monitored_barrier, sparse
all-reduce, CPU DDP, the profiler); its plugin list is empty. So both runs set BACKEND=gloo, and the
libcomm run builds every group the suite asks gloo for as a libcomm group: torch's
_new_process_group_helper calls distributed_c10d.ProcessGroupGloo(store, rank, size, timeout), which
this file replaces, in every rank, by libcomm's creator (python/libcomm/torch_backend.py). That is
what a user does who keeps a script written for gloo and swaps the group underneath it. torch still
records the group as "gloo" (dist.get_backend() says "gloo"), so the libcomm group is made with
profiling name "gloo" and its events read "gloo:all_reduce", the names the suite looks for; a group
made with init_process_group("libcomm") names them "libcomm:all_reduce". Torch's installed files are
not edited.

Only test_backend_group (asserts isinstance(group, dist.ProcessGroupGloo)) cannot pass on libcomm.
"""

import os
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]

# torch's run_tests() writes a JUnit XML report when CI is set (common_utils.IS_CI), which needs
# xmlrunner, a package Debian does not ship; CI=true is how .ci/run is started.
os.environ.pop("CI", None)

# Read before torch's test modules are imported (they read BACKEND and WORLD_SIZE at import);
# spawned ranks inherit the environment and import this file again as __mp_main__.
if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["libcomm", "gloo"], default="libcomm")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=120, help="seconds per test before its ranks are killed")
    parser.add_argument("-k", action="append", default=[], help="unittest -k pattern (repeatable)")
    parser.add_argument("--list", action="store_true", help="print the test names and exit")
    parser.add_argument("--results", help="append one line per test to this file: its name and outcome")
    args, rest = parser.parse_known_args()
    os.environ["BACKEND"] = "gloo"
    os.environ["WORLD_SIZE"] = str(args.world_size)
    os.environ["LIBCOMM_SUITE_BACKEND"] = args.backend
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(args.timeout)
    # torch's run_test.py runs the suite with env:// and with file://; the file:// run is the one
    # whose timeout tests run (file:// can be set up again after destroy_process_group).
    import tempfile

    os.environ.setdefault("INIT_METHOD", "file://" + tempfile.mkdtemp(prefix="torch-suite-") + "/")
    sys.path.insert(0, str(_ROOT / "python"))
    # torch's common_utils parses sys.argv when imported, and hands what it leaves to unittest.
    sys.argv = [sys.argv[0], "-v"] + rest + [a for k in args.k for a in ("-k", k)]

try:
    import expecttest  # noqa: F401
except ImportError:
    # torch's common_utils only takes expecttest.TestCase as the base of its TestCase (for
    # assertExpectedInline, which this suite never calls); Debian does not package it.
    import types
    import unittest

    sys.modules["expecttest"] = types.SimpleNamespace(TestCase=unittest.TestCase, ACCEPT=False)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.distributed_c10d as c10d  # noqa: E402

if os.environ.get("LIBCOMM_SUITE_BACKEND") == "libcomm":
    if str(_ROOT / "python") not in sys.path:
        sys.path.insert(0, str(_ROOT / "python"))
    import torch_backend_or_skip  # noqa: F401  (exits 77, meson's SKIP, when the extension was not built)
    import libcomm.torch_backend as _tb

    def _libcomm_for_gloo(store, rank, size, timeout=c10d.default_pg_timeout):
        return _tb.create_process_group(store, rank, size, timeout, profiling_name="gloo")

    _gloo = c10d.ProcessGroupGloo
    _wrap = c10d._create_process_group_wrapper

    def _wrapper_with_gloo_helper(*args, **kwargs):
        # TORCH_DISTRIBUTED_DEBUG=DETAIL wraps each group in torch's _ProcessGroupWrapper, whose
        # binding takes only a real ProcessGroupGloo as the helper that checks the calls agree:
        # the helper stays gloo, the wrapped group (the data path) is libcomm.
        c10d.ProcessGroupGloo = _gloo
        try:
            return _wrap(*args, **kwargs)
        finally:
            c10d.ProcessGroupGloo = _libcomm_for_gloo

    c10d.ProcessGroupGloo = _libcomm_for_gloo
    c10d._create_process_group_wrapper = _wrapper_with_gloo_helper

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


def _record_outcomes(path):
    """Appends "<test> <outcome>" per finished test to path (ok, FAIL, ERROR, skip, xfail)."""
    import unittest

    def wrap(name, outcome):
        original = getattr(unittest.TestResult, name)

        def record(self, test, *rest):
            with open(path, "a") as f:
                f.write(f"{test.id().split('.')[-1]} {outcome}\n")
            return original(self, test, *rest)

        setattr(unittest.TestResult, name, record)

    for name, outcome in (("addSuccess", "ok"), ("addFailure", "FAIL"), ("addError", "ERROR"),
                          ("addSkip", "skip"), ("addExpectedFailure", "xfail"),
                          ("addUnexpectedSuccess", "FAIL")):
        wrap(name, outcome)


if __name__ == "__main__":
    if args.results:
        _record_outcomes(args.results)
    if args.list:
        import unittest

        for t in unittest.TestLoader().loadTestsFromTestCase(TestDistBackendWithSpawn):
            print(t.id().split(".")[-1])
        sys.exit(0)
    run_tests()
