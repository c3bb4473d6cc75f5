#!/usr/bin/env python3
"""README's two commands, run for real with dpkg, apt-get, meson, ninja and the build's programs
replaced by stubs on PATH that record how they were called: bench.sh installs what the benchmark
needs (no torch, no Catch2), test.sh what the tests need; both lists are docs/building.md's; a build
directory is configured again when packages were installed.

  test_scripts.py SOURCE_DIR [unittest args]
"""
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.path.abspath(sys.argv[1])
TEST_ONLY = {"catch2", "python3-numpy", "python3-torch", "python3-matplotlib", "libtorch-dev", "pybind11-dev",
             "python3-dev", "python3-venv", "python3-setuptools", "python3-wheel", "prometheus", "iproute2",
             "iptables"}


def stub(path, body):
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


class Scripts(unittest.TestCase):
    def run_script(self, script, installed=(), configured=False, failing_test=None):
        tmp = tempfile.mkdtemp(prefix="scripts-test-")
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        bin_dir, build = os.path.join(tmp, "bin"), os.path.join(tmp, "build")
        log = os.path.join(tmp, "calls.log")
        os.makedirs(bin_dir)
        os.makedirs(os.path.join(build, "tools", "comm-run"))
        if configured:
            os.makedirs(os.path.join(build, "meson-private"))
            open(os.path.join(build, "meson-private", "coredata.dat"), "w").close()
        # dpkg -s PKG: installed only when listed; everything else records its arguments.
        ok = " ".join(installed)
        stub(os.path.join(bin_dir, "dpkg"),
             f'for p in {ok}; do [ "$2" = "$p" ] && echo "Status: install ok installed" && exit 0; done; exit 1\n')
        for tool in ("apt-get", "meson", "ninja"):
            stub(os.path.join(bin_dir, tool), f'echo "{tool} $*" >> {log}\n')
        if failing_test:  # `meson test` writes a log with one failed test and fails
            os.makedirs(os.path.join(build, "meson-logs"))
            rows = [{"name": "passes", "result": "OK", "duration": 1.0, "stdout": "fine", "returncode": 0},
                    {"name": failing_test, "result": "FAIL", "duration": 2.0, "returncode": 1,
                     "stdout": "\n".join(f"line {i}" for i in range(100)) + "\nthe failed check"}]
            with open(os.path.join(build, "meson-logs", "testlog.json"), "w") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))
            stub(os.path.join(bin_dir, "meson"), f'echo "meson $*" >> {log}\n[ "$1" = test ] && exit 1\nexit 0\n')
        stub(os.path.join(build, "tools", "comm-run", "comm-run"), f'echo "comm-run $*" >> {log}\n')
        env = dict(os.environ, PATH=bin_dir + ":" + os.environ["PATH"], BUILD_DIR=build, SKIP_ASAN="1")
        done = subprocess.run(["bash", os.path.join(SOURCE, "scripts", script)], env=env, capture_output=True,
                              text=True, timeout=60)
        self.assertEqual(done.returncode, 1 if failing_test else 0, done.stdout + done.stderr)
        self.output = done.stdout
        with open(log) as f:
            return [shlex.split(line) for line in f]

    @staticmethod
    def installed_by(calls):
        out = set()
        for c in calls:
            if c[:2] == ["apt-get", "install"]:
                out |= {a for a in c[2:] if not a.startswith("-")}
        return out

    def test_bench_installs_what_the_benchmark_needs_and_runs_it(self):
        calls = self.run_script("bench.sh")
        pkgs = self.installed_by(calls)
        self.assertIn("nlohmann-json3-dev", pkgs)
        self.assertIn("meson", pkgs)
        self.assertEqual(pkgs & TEST_ONLY, set(), "bench.sh must not install the tests' packages (torch)")
        self.assertNotIn("libcli11-dev", pkgs)  # nothing uses CLI11
        [run] = [c for c in calls if c[0] == "comm-run"]
        self.assertEqual(run[1:4], ["-n", "4", "--quiet-prefix"])
        self.assertIn("-b", run)

    def test_test_installs_what_the_tests_need_and_runs_them(self):
        calls = self.run_script("test.sh")
        pkgs = self.installed_by(calls)
        self.assertTrue(TEST_ONLY <= pkgs, TEST_ONLY - pkgs)
        self.assertTrue(any(c[:2] == ["meson", "test"] for c in calls), calls)

    def test_nothing_missing_installs_nothing(self):
        everything = TEST_ONLY | {"meson", "ninja-build", "pkg-config", "g++", "libhwloc-dev", "libucx-dev",
                                  "libibverbs-dev", "nlohmann-json3-dev", "libssl-dev", "libipsec-mb-dev",
                                  "libipsec-mb1", "prometheus-cpp-dev"}
        calls = self.run_script("test.sh", installed=everything, configured=True)
        self.assertFalse(any(c[0] == "apt-get" for c in calls), calls)
        self.assertFalse(any("--reconfigure" in c for c in calls), calls)

    def test_a_build_configured_before_packages_arrived_is_configured_again(self):
        calls = self.run_script("test.sh", configured=True)
        self.assertTrue(any(c[:3] == ["meson", "setup", "--reconfigure"] for c in calls), calls)

    def test_a_failed_test_is_named_with_the_end_of_its_output_last(self):
        # CI logs are often read from the tail: the names and the failed check come after the sanitizer tier.
        self.run_script("test.sh", failing_test="abi-flaky")
        tail = self.output.strip().splitlines()[-40:]
        self.assertIn("failed in", " ".join(tail))
        self.assertTrue(any("abi-flaky (FAIL" in line for line in tail), tail)
        self.assertIn("the failed check", tail)
        self.assertNotIn("passes (OK", self.output)
        self.assertTrue(tail[-1].startswith("==> FAILED: tests in"), tail[-1])

    def test_building_md_lists_the_packages_lib_sh_installs(self):
        lists = subprocess.run(["bash", "-c", 'source scripts/lib.sh; echo "${BENCH_PACKAGES[*]}"; '
                                'echo "${TEST_PACKAGES[*]}"'], cwd=SOURCE, capture_output=True, text=True,
                               check=True).stdout.splitlines()
        bench, test = lists[0].split(), lists[1].split()
        with open(os.path.join(SOURCE, "docs", "building.md")) as f:
            page = " ".join(f.read().split())
        self.assertIn("`" + " ".join(bench) + "`", page)
        self.assertIn("`" + " ".join(p for p in test if p not in bench) + "`", page)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v", *sys.argv[2:]])
