"""The start gate of the Python process tests (test_engine_processes.py, test_torch_backend_kill.py):
the parent makes a directory and passes it as TEST_START_GATE; each rank marks itself ready there and
waits, up to 120 s, until every rank has, so a test's short timeout bounds init and not process start-up."""

import os
import time


def wait_for_every_rank(rank, size):
    """Every rank has started (and imported what it needs) before any calls init: the short
    timeout also bounds init, and on a busy host one process can start seconds after another."""
    gate = os.environ["TEST_START_GATE"]
    open(os.path.join(gate, f"ready-{rank}"), "w").close()
    deadline = time.monotonic() + 120
    while len(os.listdir(gate)) < size and time.monotonic() < deadline:
        time.sleep(0.01)
