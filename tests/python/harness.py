"""A few lines of test running for the multi-rank Python tests (started by comm-run, so
every rank runs the same cases in the same order). Each case gets the communicator; a
failure prints the rank, the case and the traceback, and the process exits non-zero."""

import os
import sys
import time
import traceback

import libcomm

CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def expect_raises(exc_type, fn, *args, contains=(), **kwargs):
    try:
        fn(*args, **kwargs)
    except exc_type as e:
        for text in contains:
            assert text in str(e), f"{exc_type.__name__} message {str(e)!r} lacks {text!r}"
        return e
    raise AssertionError(f"{getattr(fn, '__name__', fn)} did not raise {exc_type.__name__}")


def main(comm=None):
    own = comm is None
    if own:
        comm = libcomm.Communicator(timeout_ms=int(os.environ.get("COMM_TIMEOUT_MS", "30000")))
    failed = 0
    only = os.environ.get("TEST_CASE")
    for fn in CASES:
        if only and only != fn.__name__:
            continue
        start = time.monotonic()
        try:
            fn(comm)
        except Exception:  # noqa: BLE001 - every failure is reported, then the run fails
            failed += 1
            print(f"FAIL rank {comm.rank} {fn.__name__}:\n{traceback.format_exc()}", flush=True)
            # A failed case may leave peers in a collective: end this run, never hang.
            comm.abort()
            break
        if comm.rank == 0:
            print(f"ok {fn.__name__} ({time.monotonic() - start:.2f} s)", flush=True)
    if own:
        comm.destroy()
    sys.exit(1 if failed else 0)
