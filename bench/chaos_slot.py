#!/usr/bin/python3
"""One slot of bench/chaos_train.py's job: netsim runs this in the slot's host (its network
namespace, with the job's environment, RANK being the slot), and it keeps the slot filled the way
`comm-run --replace-failed` does for a local job (tools/comm-run/launcher.cc, replace_excluded):

- it starts examples/fault_tolerant_train.py, then acts on the exclusions the ranks'
  comm_agree_failed (and the members' comm_exclude of a joiner whose admission they undid) record
  in the job store (libcomm/src/grow.h: job/exclusions and
  job/exclusion/<n>, "<slot> <generation>"): a record about the process it runs now (the
  generation, which counts the replacements started in the slot) brings a replacement with
  COMM_JOIN=1 in the same namespace and environment; a process still alive (stopped) is
  SIGKILLed first, so that a slot never holds two processes; a replacement that dies before the
  members admitted it (job/slot/<slot>/joins, the admissions, still below the replacements
  started) is started again, since no member can exclude it; so is a process that no record named
  within RECORD_WAIT_S of its exit (a record the store did not take);
- comm-run cannot do this here: it serves its store on 127.0.0.1 of its own namespace, which the
  netsim hosts cannot reach. The store is the job's file:// directory instead (it outlives every
  rank), read here as libcomm's file store writes it (libcomm/base/store/file_store.cc: one file
  per key, "%XX" for bytes outside [A-Za-z0-9_-], renamed into place).

It exits 0 (netsim stops the job when a rank fails) once its process ends with the job, or the
slot is empty when the job ended (a process killed after the last collective is never excluded);
a replacement not admitted by then is SIGKILLed 20 s after the job ended. Files in RUNDIR:
pid.SLOT ("PID K": the slot's K-th process), out.SLOT.K (its output), slot.SLOT (what this did,
with the monotonic clock, which every namespace shares).

    chaos_slot.py RUNDIR EXAMPLE_ARGS...      (bench/chaos_train.py passes them)
"""

import glob
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "fault_tolerant_train.py")
PY = "/usr/bin/python3"
JOB_END_GRACE_S = 20.0
RECORD_WAIT_S = 3.0  # as comm-run's kRecordWaitS (tools/comm-run/launcher.cc, restart_unadmitted)
MAX_UNNAMED = 3      # as its kMaxRestarts


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def key_file(store, key):
    """libcomm's file store's file for a short key (file_store.cc, key_path)."""
    return os.path.join(store, "k" + "".join(c if c.isalnum() or c in "_-" else "%{:02X}".format(ord(c)) for c in key))


class Slot:
    def __init__(self, rundir, rest):
        self.rundir, self.rest = rundir, rest
        self.slot = int(os.environ["RANK"])
        self.store = rest[rest.index("--init-method") + 1][len("file://"):]
        self.proc, self.k = None, -1   # the process in the slot and its index (0: the first)
        self.replacements = 0          # as comm-run's replacements_: the generation it runs now
        self.seen = 0                  # exclusion records read
        self.job_end = None            # when this first saw the job end (a final line)
        self.exited_at = None          # when the slot's process exited non-zero (no record yet)
        self.unnamed = 0               # restarts in a row without a record (reset by one)
        self.log = open(os.path.join(rundir, f"slot.{self.slot}"), "a", buffering=1)

    def note(self, what):
        self.log.write(f"{time.monotonic():.3f} {what}\n")

    def start(self, join):
        self.k += 1
        env = dict(os.environ)
        if join:
            env["COMM_JOIN"] = "1"
        out = open(os.path.join(self.rundir, f"out.{self.slot}.{self.k}"), "w")
        self.proc = subprocess.Popen([PY, EXAMPLE] + self.rest, stdout=out, stderr=subprocess.STDOUT, env=env)
        out.close()
        tmp = os.path.join(self.rundir, f"pid.{self.slot}.tmp")
        with open(tmp, "w") as f:
            f.write(f"{self.proc.pid} {self.k}")
        os.rename(tmp, os.path.join(self.rundir, f"pid.{self.slot}"))
        self.exited_at = None
        self.note(f"start {self.k} pid {self.proc.pid} join {int(join)}")

    def new_exclusions(self):
        n = int(read(key_file(self.store, "job/exclusions")) or 0)
        out = []
        while self.seen < n:
            # Counted before written (grow_records.cc): the record follows within moments.
            text = read(key_file(self.store, f"job/exclusion/{self.seen + 1}"))
            if text is None:
                break
            self.seen += 1
            m = re.match(r"^(-?\d+) (\d+)$", text.strip())
            if m:
                out.append((int(m.group(1)), int(m.group(2))))
        return out

    def job_ended(self):
        return any(re.search(r"^\[\d+\] final step ", read(p) or "", re.M)
                   for p in glob.glob(os.path.join(self.rundir, "out.*")))

    def run(self):
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        self.start(join=False)
        while True:
            code = self.proc.poll() if self.proc else None
            if self.proc and code is not None:
                self.note(f"exit {self.k} code {code}")
                if code == 0:
                    return 0
                self.proc = None
                self.exited_at = time.monotonic()
                admitted = int(read(key_file(self.store, f"job/slot/{self.slot}/joins")) or 0)
                if self.k > 0 and admitted < self.replacements and self.job_end is None:
                    # A replacement that died before the members admitted it: no one will ever
                    # exclude it (it was never a member), so no record brings the next one.
                    self.note(f"restart: {self.k} died before it was admitted ({admitted} < {self.replacements})")
                    self.start(join=True)
            if (self.proc is None and self.exited_at is not None and self.job_end is None and
                    time.monotonic() - self.exited_at >= RECORD_WAIT_S and self.unnamed < MAX_UNNAMED):
                # Capped, as comm-run's: a job that has lost its majority ends, and its slots'
                # processes all exit unnamed.
                self.unnamed += 1
                self.note(f"restart: no record named {self.k} within {RECORD_WAIT_S:.0f} s of its exit")
                self.replacements += 1
                self.start(join=True)
            for slot, gen in self.new_exclusions():
                if slot != self.slot or gen != self.replacements:
                    continue  # another slot's, or about a process this slot no longer runs
                self.note(f"excluded generation {gen}")
                if self.proc:
                    self.note(f"sigkill {self.k}: excluded but alive (stopped?)")
                    self.proc.kill()
                    self.note(f"exit {self.k} code {self.proc.wait()}")
                    self.proc = None
                self.replacements += 1
                self.unnamed = 0
                self.start(join=True)
            if self.job_end is None and self.job_ended():
                self.job_end = time.monotonic()
                self.note("job ended")
            if self.job_end is not None:
                if self.proc is None:
                    return 0
                if time.monotonic() - self.job_end > JOB_END_GRACE_S:
                    self.note(f"sigkill {self.k}: still running {JOB_END_GRACE_S:.0f} s after the job ended")
                    self.proc.kill()
                    self.note(f"exit {self.k} code {self.proc.wait()}")
                    return 0
            time.sleep(0.05)

    def stop(self, signum, frame):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.note(f"stopped by signal {signum}")
        sys.exit(0)


if __name__ == "__main__":
    sys.exit(Slot(sys.argv[1], sys.argv[2:]).run())
