#!/usr/bin/env python3
"""A real Prometheus server scrapes a 4-rank local job (issue 36).

    tests/observe/test_prometheus.py BUILD_DIR

comm-bench runs on 4 ranks (comm-run) with COMM_METRICS_ADDR=127.0.0.1:0, so each rank's metrics
plugin listens on a port of the kernel's choosing and writes it to COMM_METRICS_FILE in file_sd
format; a Prometheus server (Debian's `prometheus`) discovers those files and scrapes every
second. (First, a port that is taken only warns.) Once comm-bench has printed the calls it made, it holds the communicator idle (--hold_s)
and the test asks Prometheus's HTTP API for libcomm_collective_calls_total and _bytes_total: every
rank's all-reduce and all-gather counts must be the ones comm-bench reports. `promtool check
metrics` must accept one rank's page. Exits 77 (skipped) when prometheus, promtool or the plugin
is missing: a test that cannot run says so, it does not pass.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

from procs import stop_group

BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
RANKS = 4
DEADLINE_S = 45  # the whole test; each wait below is bounded by it


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def bind_failure_only_warns():
    """A port that is taken: the rank warns, names the port, and the job runs as without metrics."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = dict(os.environ, COMM_METRICS_ADDR=f"127.0.0.1:{port}")
        run = subprocess.run([os.path.join(BUILD, "tools/comm-run/comm-run"), "-n", "2", "--bind", "none",
                              "--timeout-s", "60", "--", os.path.join(BUILD, "bench/comm-bench"), "-b", "8", "-e", "8",
                              "-n", "5", "-w", "1"], env=env, capture_output=True, text=True)
    out = run.stdout + run.stderr
    if run.returncode != 0 or f"metrics not served on 127.0.0.1:{port}" not in out:
        print(f"FAIL: with COMM_METRICS_ADDR on a taken port the job must run and rank 0 warn (exit "
              f"{run.returncode}):\n{out[-3000:]}")
        return False
    print("OK: a taken port warns and the job runs:", next(l for l in out.splitlines() if "metrics not served" in l))
    return True


def main():
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            print(f"SKIP: {tool} not installed (apt-get install prometheus)")
            return 77
    if not os.path.exists(os.path.join(BUILD, "libcomm_metrics.so")):
        print("SKIP: the metrics plugin was not built (apt-get install prometheus-cpp-dev, then meson setup --reconfigure)")
        return 77
    if not bind_failure_only_warns():
        return 1
    start = time.monotonic()

    def left():
        return DEADLINE_S - (time.monotonic() - start)

    tmp = tempfile.mkdtemp(prefix="libcomm-prometheus-")
    targets = os.path.join(tmp, "targets")
    os.mkdir(targets)
    env = dict(os.environ, COMM_METRICS_ADDR="127.0.0.1:0", COMM_METRICS_FILE=os.path.join(targets, "rank-%r.json"),
               COMM_TIMEOUT_MS="60000")
    bench = [os.path.join(BUILD, "tools/comm-run/comm-run"), "-n", str(RANKS), "--bind", "none", "--quiet-prefix",
             "--timeout-s", str(DEADLINE_S + 15), "--", os.path.join(BUILD, "bench/comm-bench"),
             "-b", "8", "-e", "1M", "-f", "16", "-n", "20", "-w", "2", "-c", "1", "--hold_s", str(DEADLINE_S)]
    job = subprocess.Popen(bench, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    prom = None
    try:
        port = free_port()
        with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                    "scrape_configs:\n  - job_name: libcomm\n    file_sd_configs:\n"
                    f"      - files: ['{targets}/*.json']\n        refresh_interval: 1s\n")
        prom = subprocess.Popen(["prometheus", f"--config.file={tmp}/prometheus.yml",
                                 f"--storage.tsdb.path={tmp}/data", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "prometheus.log"), "w"),
                                start_new_session=True)
        # comm-bench's report of the calls it made (rank 0, after the sweep; then it holds).
        made, output = None, []
        while made is None and left() > 0:
            line = job.stdout.readline()
            if not line:
                break
            output.append(line)
            m = re.match(r"# Calls made \(this rank, up to here\): (.*)", line.strip())
            if m:
                made = {name: (int(calls), int(nbytes)) for name, calls, nbytes in
                        re.findall(r"(\w+) (\d+) calls (\d+) bytes", m.group(1))}
        if made is None:
            print("FAIL: comm-bench did not report its calls:\n" + "".join(output[-30:]))
            return 1
        print("comm-bench made:", made)
        api = f"http://127.0.0.1:{port}/api/v1/query?query="
        want = {(coll, metric): made[coll][i] for coll in ("allreduce", "allgather") if coll in made
                for i, metric in enumerate(("libcomm_collective_calls_total", "libcomm_collective_bytes_total"))}
        got = {}
        while left() > 0:
            try:
                got = {}
                for (coll, metric) in want:
                    q = urllib.parse.quote(f'{metric}{{comm="0",collective="{coll}"}}')
                    res = json.loads(get(api + q))["data"]["result"]
                    got[(coll, metric)] = sorted((r["metric"]["rank"], float(r["value"][1])) for r in res)
                if all(len(v) == RANKS and all(x == want[k] for _, x in v) for k, v in got.items()):
                    break
            except (OSError, ValueError, KeyError):
                pass  # Prometheus still starting
            time.sleep(0.5)
        else:
            print(f"FAIL: Prometheus's API did not return comm-bench's counts on all {RANKS} ranks within "
                  f"{DEADLINE_S} s: want {want}, got {got}")
            return 1
        for k, v in sorted(got.items()):
            print(f"prometheus: {k[1]}{{collective={k[0]}}} = {v}")
        # One rank's page, as Prometheus read it, through promtool.
        with open(os.path.join(targets, "rank-1.json")) as f:
            target = json.load(f)[0]["targets"][0]
        page = get(f"http://{target}/metrics")
        check = subprocess.run(["promtool", "check", "metrics"], input=page, capture_output=True, text=True)
        if check.returncode != 0:
            print("FAIL: promtool check metrics:\n" + check.stdout + check.stderr)
            return 1
        for needle in ("libcomm_peer_wait_seconds_total", "libcomm_collective_duration_seconds_bucket",
                       "libcomm_straggler_rank", "libcomm_build_info"):
            if needle not in page:
                print(f"FAIL: {needle} not on the page:\n{page}")
                return 1
        print(f"OK in {time.monotonic() - start:.1f} s: Prometheus's counts are comm-bench's on every rank; "
              "promtool accepts the page")
        return 0
    finally:
        for p in (job, prom):
            stop_group(p)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
