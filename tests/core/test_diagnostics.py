#!/usr/bin/env python3
"""Diagnostics as NCCL_DEBUG users expect them, on real ranks under comm-run:
COMM_DEBUG_FILE per rank (%h %p %r), the VERSION level and the init INFO line, warnings for a
bad COMM_DEBUG / COMM_DEBUG_SUBSYS and for a COMM_* typo, and COMM_ALGO=bogus refused at init.

  test_diagnostics.py BUILD_DIR [unittest args]
"""
import glob
import os
import re
import socket
import subprocess
import sys
import tempfile
import unittest

BUILD = os.path.abspath(sys.argv[1])
COMM_RUN = os.path.join(BUILD, "tools", "comm-run", "comm-run")
BENCH = os.path.join(BUILD, "bench", "comm-bench")
# The environment of a user who set nothing of libcomm's.
BASE = {k: v for k, v in os.environ.items() if not k.startswith(("COMM_", "NCCL_"))}
BASE["COMM_TIMEOUT_MS"] = "60000"


def job(env, nranks=2, expect=0):
    cmd = [COMM_RUN, "-n", str(nranks), "--bind", "none", "--", BENCH, "-b", "8", "-e", "8", "-n", "1", "-w", "0"]
    done = subprocess.run(cmd, env=dict(BASE, **env), capture_output=True, text=True, timeout=120)
    if expect is not None and done.returncode != expect:
        raise AssertionError(f"status {done.returncode}, want {expect}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}")
    return done


def lines(text, level):
    return [l for l in text.splitlines() if f" libcomm {level} " in l]


class Diagnostics(unittest.TestCase):
    def test_debug_file_per_rank_with_host_pid_and_rank(self):
        with tempfile.TemporaryDirectory() as tmp:
            done = job({"COMM_DEBUG": "INFO", "COMM_DEBUG_FILE": os.path.join(tmp, "comm.%h.%p.r%r.log")})
            self.assertEqual(lines(done.stderr, "INFO"), [], "with COMM_DEBUG_FILE nothing is logged to stderr")
            files = sorted(glob.glob(os.path.join(tmp, "*")))
            self.assertEqual(len(files), 2, files)
            host = socket.gethostname()
            for rank in (0, 1):
                [path] = [f for f in files if f.endswith(f".r{rank}.log")]
                self.assertRegex(os.path.basename(path), r"^comm\." + re.escape(host) + r"\.\d+\.r%d\.log$" % rank)
                pid = os.path.basename(path).split(".")[-3]
                with open(path) as f:
                    text = f.read()
                self.assertTrue(all(f":{pid}:" in l for l in text.splitlines()), text)  # %p is this process
                self.assertEqual(len(lines(text, "VERSION")), 1, text)
                [ready] = [l for l in lines(text, "INFO") if f"rank {rank} of 2 ready" in l]
                self.assertRegex(ready, r"libcomm \d+\.\d+\.\d+ \(git [0-9a-f]+(-dirty)?\)|libcomm \S+ \(git unknown\)")
                self.assertIn("transport ", ready)
                self.assertIn("COMM_DEBUG=INFO", ready)           # every COMM_*/NCCL_* set
                self.assertIn("COMM_TIMEOUT_MS=60000", ready)

    def test_version_level_prints_only_the_version(self):
        done = job({"COMM_DEBUG": "VERSION"})
        self.assertEqual(len(lines(done.stderr, "VERSION")), 2, done.stderr)  # one per process
        self.assertEqual(lines(done.stderr, "INFO"), [])
        self.assertRegex(lines(done.stderr, "VERSION")[0], r"libcomm version \d+\.\d+\.\d+ \(git ")

    def test_a_typo_in_a_comm_variable_names_the_real_one(self):
        done = job({"COMM_TIMEOUT": "5000"})
        warns = [l for l in lines(done.stderr, "WARN") if "COMM_TIMEOUT " in l]
        self.assertEqual(len(warns), 2, done.stderr)  # each rank, once
        self.assertIn("did you mean COMM_TIMEOUT_MS?", warns[0])
        self.assertEqual(lines(job({}).stderr, "WARN"), [], "a clean environment warns about nothing")

    def test_invalid_debug_level_and_subsystem_warn(self):
        done = job({"COMM_DEBUG": "LOUD"})
        self.assertTrue(any("COMM_DEBUG='LOUD' is not one of" in l for l in lines(done.stderr, "WARN")), done.stderr)
        # An unknown subsystem used to leave an empty mask that silenced even warnings.
        done = job({"COMM_DEBUG_SUBSYS": "NETWORK", "COMM_TYPO_VAR": "1"})
        warns = lines(done.stderr, "WARN")
        self.assertTrue(any("unknown subsystem 'NETWORK'" in l for l in warns), done.stderr)
        self.assertTrue(any("COMM_TYPO_VAR is set" in l for l in warns), done.stderr)

    def test_unknown_algorithm_is_refused_at_init_with_the_list(self):
        # Before: one rank passed comm_init and failed its first collective ("gathering the header");
        # two failed inside init's barrier ("internal #1"), one rank killed by the other's failure.
        for nranks in (1, 2):
            with self.subTest(nranks=nranks):
                done = job({"COMM_ALGO": "bogus"}, nranks=nranks, expect=None)
                self.assertNotEqual(done.returncode, 0)
                self.assertIn("comm_init: COMM_ALGO='bogus' names no algorithm; known: allreduce: ring", done.stderr)
                self.assertIn("set COMM_ALGO to one of these, or unset it", done.stderr)
                self.assertNotIn("gathering the header", done.stderr)
                self.assertNotIn("internal #", done.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v", *sys.argv[2:]])
