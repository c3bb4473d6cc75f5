"""What the observability tests share about the jobs they start and what those jobs write
(tests/observe/test_*.py): ending a job, finding its ranks, running comm-top, reading a rank's
final counts (COMM_METRICS_TEXTFILE)."""
import json
import os
import re
import signal
import subprocess
import sys

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMM_TOP = os.path.join(SOURCE, "tools", "comm-top", "comm-top")
SAMPLE = re.compile(r'^(libcomm_\w+)\{([^}]*)\}\s+(\S+)$')
LABEL = re.compile(r'(\w+)="([^"]*)"')


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


def plugin_missing(build):
    """A skip message when the metrics plugin was not built, else None."""
    if os.path.exists(os.path.join(build, "libcomm_metrics.so")):
        return None
    return "SKIP: the metrics plugin was not built (apt-get install prometheus-cpp-dev)"


def rank_pids(parent=None, mark=None):
    """{RANK: pid} of the rank processes: comm-run's children (parent: its pid), or the processes
    named rank_loop whose environment carries mark = (variable, value) (netsim starts them)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if parent is not None:
                with open(f"/proc/{pid}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) != parent:
                        continue
            else:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() != "rank_loop":
                        continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            if mark is not None and env.get(mark[0].encode()) != mark[1].encode():
                continue
            out[int(env[b"RANK"])] = int(pid)
        except (OSError, ValueError, KeyError, IndexError):
            pass
    return out


def comm_top(targets, *extra, netns_of=None):
    """comm-top --json's view, or None; netns_of: run it in that process's network namespace."""
    cmd = [sys.executable, COMM_TOP, "--json", *extra, targets]
    if netns_of is not None:
        cmd = ["nsenter", f"--net=/proc/{netns_of}/ns/net"] + cmd
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    return json.loads(run.stdout) if run.returncode == 0 and run.stdout else None


def names_stopped(view, culprit):
    """The hang text when comm-top's view of comm 0 names `culprit` as the hang's culprit and as
    silent (its metrics do not answer), else None."""
    comm = (view or {}).get("comms", {}).get("0", {})
    hang = comm.get("hang") or {}
    if culprit in hang.get("culprits", []) and culprit in comm.get("silent", []):
        return hang["text"]
    return None


def read_textfile(path):
    """({peer: {metric: value}}, {collective: algorithm}) of comm 0 in one rank's textfile."""
    peers, algos = {}, {}
    with open(path) as f:
        for line in f:
            m = SAMPLE.match(line.strip())
            if not m:
                continue
            labels = dict(LABEL.findall(m.group(2)))
            if labels.get("comm") != "0":
                continue
            if "peer" in labels:
                peers.setdefault(int(labels["peer"]), {})[m.group(1)] = float(m.group(3))
            if m.group(1) == "libcomm_collective_algorithm_info":
                algos[labels["collective"]] = labels["algorithm"]
    return peers, algos
