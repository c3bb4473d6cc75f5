#!/usr/bin/env python3
"""comm-bench's table, read by a parser written for nccl-tests logs; its check; its options.

  test_comm_bench.py BUILD_DIR SOURCE_DIR [unittest args]
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

BUILD, SOURCE = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
sys.path.insert(0, os.path.join(SOURCE, "bench"))
import nccl_log  # noqa: E402

COMM_RUN = os.path.join(BUILD, "tools", "comm-run", "comm-run")
BENCH = os.path.join(BUILD, "bench", "comm-bench")
# sendrecv's in-place column is timed, not checked: one buffer sent from and received into races
# with the neighbour's read (that race, not latency, is what failed its in-place checks over shm).
COLLECTIVES = ["allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv"]
ENV = dict(os.environ, COMM_TIMEOUT_MS="60000")
ENV.pop("COMM_BENCH_CORRUPT", None)


def run(nranks, *bench_args, env=None, prog=BENCH, expect=0):
    cmd = [COMM_RUN, "-n", str(nranks), "--bind", "none", "--quiet-prefix", "--", prog, *bench_args]
    done = subprocess.run(cmd, env=env or ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=300)
    if expect is not None and done.returncode != expect:
        raise AssertionError(f"{' '.join(cmd)}: status {done.returncode}, want {expect}\n"
                             f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}")
    return done


def sizes(lo, hi, factor):
    out = [lo]
    while out[-1] * factor <= hi:
        out.append(out[-1] * factor)
    return out


class TableParsesAsNcclTests(unittest.TestCase):
    def check_table(self, out, nrows, in_place_checked=True):
        for line in out.splitlines():  # a row or a comment: nothing else on stdout
            if line.strip() and not line.startswith("#"):
                nccl_log.parse_row(line)
        parsed = nccl_log.parse(out)  # strict: every non-comment line is a 13-column row
        self.assertEqual(len(parsed["rows"]), nrows, out)
        self.assertIsNotNone(parsed["avg_busbw"], "no '# Avg bus bandwidth' footer")
        self.assertEqual(parsed["out_of_bounds"], 0, out)
        self.assertTrue(parsed["ok"])
        for row in parsed["rows"]:
            self.assertEqual((row["oop_wrong"], row["ip_wrong"]), (0, 0 if in_place_checked else None), row)
        self.assertIsNotNone(nccl_log.header_value(parsed, "transport"), "no '# transport:' header line")
        self.assertIsNotNone(nccl_log.header_value(parsed, "algorithm"), "no '# algorithm:' header line")
        return parsed

    def test_every_collective_checks_every_element_on_3_ranks(self):
        for coll in COLLECTIVES:
            with self.subTest(coll=coll):
                done = run(3, "--op-name", coll, "-b", "8", "-e", "1M", "-f", "8", "-n", "2", "-w", "1", "-c", "1",
                           "-r", "2")
                # In-place send/recv shares one buffer between a send and a receive: timed, not checked.
                parsed = self.check_table(done.stdout, len(sizes(8, 1 << 20, 8)), coll != "sendrecv")
                root = 2 if coll in ("broadcast", "reduce") else -1
                self.assertTrue(all(r["root"] == root for r in parsed["rows"]))
                want_op = "sum" if coll in ("allreduce", "reduce_scatter", "reduce") else "none"
                self.assertTrue(all(r["redop"] == want_op for r in parsed["rows"]))

    def test_nccl_tests_program_names_pick_the_collective(self):
        done = run(2, "-b", "64K", "-e", "64K", "-n", "1", "-w", "0",
                   prog=os.path.join(BUILD, "bench", "all_gather_perf"))
        self.assertIn("allgather", done.stdout.splitlines()[0])
        self.check_table(done.stdout, 1)

    def test_every_dtype_and_op(self):
        done = run(4, "-d", "all", "-o", "all", "-b", "4K", "-e", "4K", "-n", "1", "-w", "0")
        parsed = self.check_table(done.stdout, 10 * 5)
        self.assertEqual({r["type"] for r in parsed["rows"]},
                         {"float", "double", "half", "bfloat16", "int8", "uint8", "int32", "uint32", "int64", "uint64"})

    def test_blocking_registered_transport_and_algo_options(self):
        done = run(2, "-b", "1M", "-e", "1M", "-n", "2", "-w", "1", "-z", "1", "-R", "1", "--transport", "socket",
                   "--algo", "ring", "-a", "1")
        parsed = self.check_table(done.stdout, 1)
        self.assertIn("socket", nccl_log.header_value(parsed, "transport"))
        self.assertIn("ring", nccl_log.header_value(parsed, "algorithm"))
        self.assertIn("library-allocated", done.stdout)

    def test_unchecked_rows_say_na(self):
        done = run(2, "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "-c", "0")
        row = nccl_log.parse(done.stdout)["rows"][0]
        self.assertEqual((row["oop_wrong"], row["ip_wrong"]), (None, None))

    def test_json_and_csv_results(self):
        with tempfile.TemporaryDirectory() as tmp:
            j, c = os.path.join(tmp, "r.json"), os.path.join(tmp, "r.csv")
            done = run(2, "-b", "1K", "-e", "64K", "-f", "4", "-n", "1", "-w", "0", "--json", j, "--csv", c,
                       "--label", "test run")
            rows = nccl_log.parse(done.stdout)["rows"]
            with open(j) as f:
                data = json.load(f)
            self.assertEqual(data["label"], "test run")
            self.assertEqual(data["nranks"], 2)
            self.assertEqual([r["size"] for r in data["rows"]], [r["size"] for r in rows])
            self.assertEqual([r["out_of_place"]["wrong"] for r in data["rows"]], [0] * len(rows))
            with open(c) as f:
                lines = f.read().splitlines()
            self.assertEqual(len(lines), 1 + len(rows))
            self.assertTrue(lines[0].startswith("library,label,collective"))
            plot = "/usr/bin/python3"
            if subprocess.run([plot, "-c", "import matplotlib"], capture_output=True).returncode == 0:
                subprocess.run([plot, os.path.join(SOURCE, "bench", "plot_busbw.py"), j, j, "--out",
                                os.path.join(tmp, "p")], check=True, capture_output=True)
                for ext in ("png", "svg"):
                    self.assertGreater(os.path.getsize(os.path.join(tmp, "p." + ext)), 1000)

    def test_bad_arguments_fail_clearly(self):
        for bad in (["--op-name", "allfoo"], ["-d", "complex"], ["-b", "2M", "-e", "1M"], ["-z", "2"]):
            with self.subTest(args=bad):
                done = subprocess.run([BENCH, *bad], capture_output=True, text=True, timeout=30)
                self.assertEqual(done.returncode, 2, done.stderr)
                self.assertTrue(done.stderr.startswith("# comm-bench:"), done.stderr)
        done = run(2, "--algo", "no_such_algo", "-b", "1K", "-e", "1K", expect=None)
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("no_such_algo", done.stderr)


VERSION = r"\(libcomm \d+\.\d+\.\d+ \(git ([0-9a-f]{7,}(-dirty)?|unknown)\)\)"


class SpeaksNcclTestsFlags(unittest.TestCase):
    """nccl-tests' flags with nccl-tests' meanings, read back through the nccl-tests log parser."""

    def test_every_nccl_tests_flag_runs_and_shows_in_the_log(self):
        with tempfile.TemporaryDirectory() as tmp:
            j = os.path.join(tmp, "r.json")
            env = dict(ENV, NCCL_DEBUG="WARN", COMM_AUTH_TOKEN="s3cret")
            done = run(2, "-b", "1K", "-e", "4K", "-f", "2", "-n", "2", "-w", "1", "-m", "3", "-N", "2", "-C", "1",
                       "-p", "0", "-y", "0", "-T", "30", "-S", "1", "-M", "1", "-R", "2", "-a", "1", "-G", "0",
                       "-t", "1", "-g", "1", "-J", j, env=env)
            parsed = nccl_log.parse(done.stdout)
            self.assertEqual(parsed["config"]["agg"], 3, done.stdout)      # -m
            self.assertEqual(parsed["config"]["graph"], 0, done.stdout)    # -G: launches, not buffers
            self.assertEqual(parsed["config"]["ngpus"], 0, done.stdout)    # host buffers
            self.assertEqual(len(parsed["rows"]), 3 * 2, done.stdout)      # -N 2: the sweep twice
            self.assertTrue(all(r["timestamp"] for r in parsed["rows"]), done.stdout)  # -S 1
            self.assertTrue(all((r["oop_wrong"], r["ip_wrong"]) == (0, 0) for r in parsed["rows"]))
            self.assertIn("cputime", "\n".join(parsed["header"]))          # -C 1 names the column
            self.assertIn("# Memory: buffers", done.stdout)                # -M 1
            self.assertIn("library-allocated", done.stdout)                # -R 2
            self.assertRegex(nccl_log.header_value(parsed, "version"), r"^libcomm \d+\.\d+\.\d+ \(git ")
            with open(j) as f:  # -J: the --json record
                data = json.load(f)
            self.assertEqual(data["format"], "comm-bench/1")
            self.assertEqual([r["size"] for r in data["rows"]], [r["size"] for r in parsed["rows"]])
            self.assertEqual((data["agg_iters"], data["run_cycles"], data["cputime"], data["timeout_s"]),
                             (3, 2, True, 30))
            self.assertRegex(data["version"], r"^\d+\.\d+\.\d+ \(git ")
            self.assertTrue(data["commit"] and data["commit"] in data["version"])
            self.assertEqual(data["host"], os.uname().nodename)
            self.assertEqual(data["nranks"], 2)
            self.assertEqual(data["environment"]["COMM_TIMEOUT_MS"], "60000")
            self.assertEqual(data["environment"]["NCCL_DEBUG"], "WARN")
            self.assertNotIn("s3cret", json.dumps(data))  # a token is named, never recorded
            self.assertIn("COMM_AUTH_TOKEN", data["environment"])

    def test_cuda_graphs_are_refused_with_the_reason(self):
        for args in (["-G", "1"], ["-G", "5", "--device", "1"], ["--cudagraph", "2"]):
            with self.subTest(args=args):
                done = subprocess.run([BENCH, *args], capture_output=True, text=True, timeout=30)
                self.assertEqual(done.returncode, 2, done.stderr)
                self.assertIn("CUDA graphs are not supported", done.stderr)
                self.assertIn("-G 0", done.stderr)
                self.assertEqual(done.stdout, "")

    def test_more_gpus_or_threads_per_process_point_to_the_launcher(self):
        for flag in ("-g", "-t"):
            with self.subTest(flag=flag):
                done = subprocess.run([BENCH, flag, "4"], capture_output=True, text=True, timeout=30)
                self.assertEqual(done.returncode, 2, done.stderr)
                self.assertIn("one GPU per process: launch 4 ranks with comm-run -n 4 / torchrun", done.stderr)

    def test_output_paths_are_checked_before_the_sweep(self):
        with tempfile.TemporaryDirectory() as tmp:
            for flag, path, why in (("--json", "/nonexistent-dir/r.json", "No such file or directory (errno 2)"),
                                    ("-J", "/nonexistent-dir/r.json", "No such file or directory (errno 2)"),
                                    ("--csv", tmp, "Is a directory (errno 21)")):
                with self.subTest(flag=flag):
                    done = run(2, flag, path, "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", expect=2)
                    self.assertIn(path, done.stderr)
                    self.assertIn(why, done.stderr)
                    self.assertEqual(nccl_log.parse(done.stdout, strict=False)["rows"], [], done.stdout)

    def test_a_bad_flag_is_one_line_pointing_to_help(self):
        for args in (["--no-such-flag"], ["-x"], ["-b"]):
            with self.subTest(args=args):
                done = subprocess.run([BENCH, *args], capture_output=True, text=True, timeout=30)
                self.assertEqual(done.returncode, 2)
                self.assertEqual(len(done.stderr.splitlines()), 1, done.stderr)
                self.assertIn("see --help", done.stderr)

    def test_version_on_every_cli(self):
        tools = {"comm-bench": [BENCH], "comm-run": [COMM_RUN],
                 "comm-topo": [os.path.join(BUILD, "tools", "comm-topo", "comm-topo")],
                 "comm-tune": ["/usr/bin/python3", os.path.join(SOURCE, "tools", "comm-tune", "comm-tune")]}
        for name, cmd in tools.items():
            with self.subTest(tool=name):
                done = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=60)
                self.assertEqual(done.returncode, 0, done.stderr)
                self.assertRegex(done.stdout.strip(), "^" + name + " " + VERSION + "$")
        for name in ("comm-run", "comm-topo"):
            with self.subTest(bad_flag=name):
                done = subprocess.run([*tools[name], "--no-such-flag"], capture_output=True, text=True, timeout=30)
                self.assertEqual(done.returncode, 2)
                self.assertEqual(done.stderr.splitlines(), [f"{name}: unknown option '--no-such-flag'; see --help"])


class PeersPrintTheSameTable(unittest.TestCase):
    """The Gloo and Open MPI programs (built when their packages are present) run the same engine."""

    def check(self, done, nrows, in_place_checked=True):
        parsed = nccl_log.parse(done.stdout)
        self.assertEqual(len(parsed["rows"]), nrows, done.stdout)
        self.assertTrue(parsed["ok"], done.stdout)
        want = (0, 0 if in_place_checked else None)
        self.assertTrue(all((r["oop_wrong"], r["ip_wrong"]) == want for r in parsed["rows"]), done.stdout)

    def test_gloo_algorithms(self):
        prog = os.path.join(BUILD, "bench", "comm-bench-gloo")
        if not os.path.exists(prog):
            self.skipTest("comm-bench-gloo not built (libgloo-dev absent)")
        for algo in ("ring", "ring_chunked", "halving_doubling", "bcube"):
            with self.subTest(algo=algo):
                self.check(run(2, "--algo", algo, "-b", "4K", "-e", "256K", "-f", "8", "-n", "2", "-w", "1",
                               prog=prog), 3)

    def test_mpi_collectives(self):
        prog = os.path.join(BUILD, "bench", "comm-bench-mpi")
        if not os.path.exists(prog):
            self.skipTest("comm-bench-mpi not built (libopenmpi-dev absent)")
        env = dict(ENV, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_rmaps_base_oversubscribe="1")
        for coll in COLLECTIVES:
            with self.subTest(coll=coll):
                cmd = ["mpirun", "--allow-run-as-root", "-np", "2", prog, "--op-name", coll, "-b", "4K", "-e", "64K",
                       "-f", "4", "-n", "2", "-w", "1"]
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
                self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
                self.check(done, 3, coll != "sendrecv")


class CheckCanFail(unittest.TestCase):
    """One element flipped on one rank after the call must be counted in #wrong."""

    def test_one_corrupted_element_is_counted(self):
        for coll, nranks in (("allreduce", 3), ("allgather", 3), ("reduce_scatter", 2), ("alltoall", 4),
                             ("broadcast", 2), ("sendrecv", 3)):
            with self.subTest(coll=coll):
                env = dict(ENV, COMM_BENCH_CORRUPT="1:5")
                done = run(nranks, "--op-name", coll, "-b", "64K", "-e", "256K", "-f", "4", "-n", "1", "-w", "0",
                           env=env, expect=1)
                parsed = nccl_log.parse(done.stdout)
                self.assertEqual(len(parsed["rows"]), 2)
                want = (1, None) if coll == "sendrecv" else (1, 1)
                for row in parsed["rows"]:
                    self.assertEqual((row["oop_wrong"], row["ip_wrong"]), want, done.stdout)
                self.assertEqual(parsed["out_of_bounds"], 2)
                self.assertFalse(parsed["ok"])
                self.assertIn("FAILED", done.stdout)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v", *sys.argv[3:]])
