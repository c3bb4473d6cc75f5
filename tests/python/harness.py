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


def run_cases(cases, rank, call, on_failure):
    """Runs each case as call(fn) (TEST_CASE=name runs that one alone), printing "ok NAME (t s)" on
    rank 0. The first failure prints the rank, the case and the traceback, then on_failure() runs:
    a failed case may leave peers in a collective, so it must end the run, never hang. Returns the
    number of failures (0 or 1)."""
    only = os.environ.get("TEST_CASE")
    for fn in cases:
        if only and only != fn.__name__:
            continue
        start = time.monotonic()
        try:
            call(fn)
        except Exception:  # noqa: BLE001 - every failure is reported, then the run fails
            print(f"FAIL rank {rank} {fn.__name__}:\n{traceback.format_exc()}", flush=True)
            on_failure()
            return 1
        if rank == 0:
            print(f"ok {fn.__name__} ({time.monotonic() - start:.2f} s)", flush=True)
    return 0


def main(comm=None):
    own = comm is None
    if own:
        comm = libcomm.Communicator(timeout_ms=int(os.environ.get("COMM_TIMEOUT_MS", "30000")))
    failed = run_cases(CASES, comm.rank, lambda fn: fn(comm), comm.abort)
    if own:
        comm.destroy()
    sys.exit(1 if failed else 0)
