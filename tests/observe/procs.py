"""What the observability tests share about the jobs they start (tests/observe/test_*.py)."""
import os
import signal
import subprocess


def stop_group(proc, grace_s=10):
    """Ends a job started with start_new_session=True, whole group: SIGTERM, then SIGKILL after grace_s
    (comm-run forwards SIGTERM to its ranks; a rank that ignores it still goes)."""
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
