#!/usr/bin/python3
"""COMM_TUNING_FILE through comm_init in real processes (refusals naming the entry, the line for
entries of another rank count, the environment beating the profile; the engine's entries through
engine-bench; NCCL's entries through the fake NCCL, which prints the environment it saw at init)
and comm-tune end to end: a 2-setting grid, its report and profile, a resumed run from the cache,
an engine sweep, NCCL's grid refused as unavailable. Seconds, on 1-2 ranks.
Usage: test_tuning.py BUILD_DIR SOURCE_DIR [FAKE_CUDART FAKE_NCCL]"""
import json
import os
import subprocess
import sys
import tempfile

BUILD, SRC = sys.argv[1], sys.argv[2]
RUN = os.path.join(BUILD, "tools", "comm-run", "comm-run")
BENCH = os.path.join(BUILD, "bench", "comm-bench")
ENGINE_BENCH = os.path.join(BUILD, "bench", "engine-bench")
FAKES = sys.argv[3:5] if len(sys.argv) >= 5 else None  # the fake CUDA runtime and NCCL (tests/device)
TUNE = os.path.join(SRC, "tools", "comm-tune", "comm-tune")
sys.path.insert(0, os.path.join(SRC, "tools", "comm-tune"))
from comm_tune import measure, profile as tune_profile  # noqa: E402

failures = []
TMP = tempfile.mkdtemp(prefix="comm-tune-test-")


def check(cond, what, detail=""):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)
        if detail:
            print("     " + detail.strip().replace("\n", "\n     ")[-3000:])


def bench(profile_text, extra_env=None, ranks=2):
    path = os.path.join(TMP, "profile.json")
    with open(path, "w") as f:
        f.write(profile_text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMM_")}
    env.update({"COMM_TUNING_FILE": path, "COMM_TIMEOUT_MS": "20000"}, **(extra_env or {}))
    p = subprocess.run([RUN, "-n", str(ranks), "--bind", "none", "--", BENCH, "-b", "1M", "-e", "1M", "-n", "2",
                        "-w", "1", "-c", "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120)
    return p.returncode, p.stdout


def profile(entries):
    return json.dumps({"format": "libcomm-tuning-profile", "version": 1, "entries": entries})


E_OK = {"collective": "allreduce", "ranks": 2, "transport": "shm", "min_bytes": 4096, "max_bytes": 2 << 20,
        "settings": {"chunk_bytes": 65536}, "measured": {"gain": 1.1}}
E_FOUR = {"collective": "allreduce", "ranks": 4, "transport": "shm", "settings": {"algo": "ring"}}

# Refused at init, on every rank, naming the entry.
rc, out = bench('{"format": "libcomm-tuning-profile", "entries": [')
check(rc != 0 and "not valid JSON" in out and "line 1, column 50" in out and "COMM_ERR_INVALID_ARGUMENT" in out,
      "an unparsable profile fails comm_init, saying where", out)
rc, out = bench(profile([E_OK, dict(E_FOUR, settings={"chunk_size": 1})]))
check(rc != 0 and "entry #1 (allreduce, 4 ranks, shm) sets the unknown knob 'chunk_size'" in out,
      "an unknown knob fails comm_init, naming the entry", out)
rc, out = bench(profile([dict(E_OK, settings={"chunk_bytes": 1 << 31})]))
check(rc != 0 and "entry #0 (allreduce, 2 ranks, shm, 4096..2097152 bytes) chunk_bytes=2147483648 is out of range"
      in out, "a value out of range fails comm_init, naming the entry", out)

# Entries for another rank count: ignored, with a line (INFO), and a warning when none applies.
rc, out = bench(profile([E_FOUR]))
check(rc == 0 and "has no entry for 2 ranks over shm; defaults apply" in out,
      "a profile for 4 ranks run on 2 warns that defaults apply", out)
rc, out = bench(profile([E_OK, E_FOUR]), {"COMM_DEBUG": "INFO", "COMM_DEBUG_SUBSYS": "INIT,ALG"})
check(rc == 0 and "entry #1 (allreduce, 4 ranks, shm) ignored: written for 4 ranks over shm, this communicator "
      "has 2 ranks over shm" in out, "the entry for another rank count is ignored with a line that says so", out)
check("allreduce of 1048576 bytes applies tuning profile entry #0" in out and "chunk_bytes=65536" in out and
      "1.100x" in out, "COMM_DEBUG=INFO says which entry a call applied, and why", out)

# Ranks that load different profiles fail at init, naming the difference (the hash is agreed).
def two_ranks_two_profiles():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank, entries in ((0, [E_OK]), (1, [E_FOUR])):
        path = os.path.join(TMP, f"rank{rank}.json")
        with open(path, "w") as f:
            f.write(profile(entries))
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMM_")}
        env.update(COMM_TUNING_FILE=path, COMM_TIMEOUT_MS="20000", RANK=str(rank), WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([BENCH, "-b", "1K", "-e", "1K", "-n", "1", "-w", "0"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=60)[0] for p in procs]
    return [p.returncode for p in procs], "".join(outs)


rcs, out = two_ranks_two_profiles()
check(all(rc != 0 for rc in rcs) and out.count("tuning profile hash (COMM_TUNING_FILE): rank") >= 2,
      "ranks that load different profiles both fail at init, naming the tuning profile hash", out)

# A profile's algorithm that cannot run a call falls back, the warning naming the entry.
rc, out = bench(profile([dict(E_OK, settings={"algo": "hierarchical"})]))
check(rc == 0 and "tuning profile entry #0 (allreduce, 2 ranks, shm, 4096..2097152 bytes): algo=hierarchical "
      "cannot run allreduce" in out, "an algorithm that cannot run falls back, naming the entry", out)

# The environment beats the profile.
rc, out = bench(profile([E_OK]), {"COMM_DEBUG": "INFO", "COMM_DEBUG_SUBSYS": "INIT,ALG",
                                  "COMM_CHUNK_BYTES": "262144"})
check(rc == 0 and "chunk_bytes=65536 not applied: COMM_CHUNK_BYTES=262144 is set in the environment" in out and
      "applies tuning profile" not in out, "COMM_CHUNK_BYTES in the environment beats the profile", out)

# The statistics: a gain smaller than the spread is not reported.
noisy = {"pairs": [{"default": {"1": 10.0}, "setting": {"1": 12.0}}, {"default": {"1": 10.0}, "setting": {"1": 9.0}},
                   {"default": {"1": 10.0}, "setting": {"1": 11.0}}]}
steady = {"pairs": [{"default": {"1": 10.0}, "setting": {"1": 12.0}}, {"default": {"1": 10.2}, "setting": {"1": 12.1}},
                    {"default": {"1": 9.9}, "setting": {"1": 11.8}}]}
c_noisy, c_steady = measure.compare(noisy)[1], measure.compare(steady)[1]
check(not c_noisy["significant"] and c_steady["significant"] and abs(c_steady["gain"] - 1.2) < 0.02,
      "a 10% gain within a 15% spread does not count; a steady 20% gain does", f"{c_noisy} {c_steady}")

# comm-tune: a 2-setting grid, then a resumed run that reads one setting from the cache.
out_dir = os.path.join(TMP, "sweep")
cmd = ["/usr/bin/python3", TUNE, "--grid", "chunk_bytes=32K,128K", "-b", "64K", "-e", "256K", "-n", "3", "-w", "1",
       "--repeats", "2", "--out", out_dir, "--launcher", f"{RUN} -n {{ranks}} --bind none --quiet-prefix --",
       "--bench", BENCH]
env = {k: v for k, v in os.environ.items() if not k.startswith("COMM_")}
p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
check(p.returncode == 0 and "# expected duration:" in p.stdout and "# progress: 8/8 jobs" in p.stdout and
      "| 256K |" in p.stdout, "comm-tune sweeps a 2-setting grid, announcing its duration and progress", p.stdout)
files = set(os.listdir(out_dir)) if os.path.isdir(out_dir) else set()
check({"profile.json", "report.md", "results.json"} <= files and
      {"heatmap-allreduce-r2.png", "heatmap-allreduce-r2.svg"} <= files, "it writes profile, report and heat maps",
      str(files))
rc, out = bench(open(os.path.join(out_dir, "profile.json")).read())
check(rc == 0, "libcomm loads the profile comm-tune wrote", out)
os.remove(os.path.join(out_dir, "cache", "r2-sweep-chunk_bytes-131072.json"))
p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
check(p.returncode == 0 and "# cached: chunk_bytes=32768" in p.stdout and "# progress: 4/4 jobs" in p.stdout and
      "sweep chunk_bytes=32768" not in p.stdout, "a resumed sweep runs only the setting missing from the cache",
      p.stdout)

# NCCL's knobs: the grid is built and validated, then every setting is refused as unavailable.
p = subprocess.run(["/usr/bin/python3", TUNE, "--nccl", "--grid", "NCCL_SOCKET_NTHREADS=8,16", "--grid",
                    "NCCL_NSOCKS_PERTHREAD=4,8", "--out", os.path.join(TMP, "nccl"), "-b", "1K", "-e", "1K",
                    "--launcher", f"{RUN} -n {{ranks}} --bind none --quiet-prefix --", "--bench", BENCH],
                   env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
check(p.returncode == 3 and "dropped from the product grid: NCCL_SOCKET_NTHREADS=16 NCCL_NSOCKS_PERTHREAD=8" in p.stdout
      and p.stdout.count("# unavailable: NCCL_") == 3, "NCCL settings: validated, then refused as unavailable",
      p.stdout)
p = subprocess.run(["/usr/bin/python3", TUNE, "--grid", "chunk_bytes=100", "--dry-run"], stdout=subprocess.PIPE,
                   stderr=subprocess.STDOUT, text=True)
check(p.returncode == 2 and "chunk_bytes=100 is out of range" in p.stdout, "a bad grid is refused before any run",
      p.stdout)

# The engine's entries: keyed by rank count, transport and the model's gradient bytes.
SMALL_MODEL = ["--layers", "1", "--d-model", "128", "--vocab", "1000"]  # 1306112 gradient bytes
SMALL_BYTES = measure.model_bytes((1, 128, 1000))
check(SMALL_BYTES == 1306112, "comm-tune counts engine-bench's gradient bytes", str(SMALL_BYTES))


def engine_bench(profile_text, extra_env=None):
    path = os.path.join(TMP, "engine-profile.json")
    with open(path, "w") as f:
        f.write(profile_text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMM_")}
    env.update({"COMM_TUNING_FILE": path, "COMM_TIMEOUT_MS": "20000", "COMM_DEBUG": "INFO",
                "COMM_DEBUG_SUBSYS": "INIT"}, **(extra_env or {}))
    p = subprocess.run([RUN, "-n", "2", "--bind", "none", "--", ENGINE_BENCH] + SMALL_MODEL +
                       ["--iters", "1", "--warmup", "1", "--compute-ms", "1"], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    return p.returncode, p.stdout


E_ENGINE = {"collective": "engine", "ranks": 2, "transport": "shm", "min_bytes": 1 << 20, "max_bytes": 2 << 20,
            "settings": {"bucket_cap_bytes": 65536, "first_bucket_bytes": 65536}, "measured": {"gain": 1.25}}
rc, out = engine_bench(profile([dict(E_ENGINE, ranks=4), E_ENGINE]))
check(rc == 0 and "comm_engine_finalize: 1306112 gradient bytes at 2 ranks over shm: tuning profile" in out and
      "entry #1 (engine, 2 ranks, shm, 1048576..2097152 gradient bytes): bucket_cap_bytes=65536 "
      "first_bucket_bytes=65536; why:" in out and
      "1.250x" in out, "comm_engine_finalize applies the engine entry for the model's bytes and says why", out)
check(" 10 buckets," in out, "the engine's buckets follow the profile (10 buckets of <= 64 KiB or one tensor; default 2)",
      out)
check("entry #0 (engine, 4 ranks, shm, 1048576..2097152 gradient bytes) ignored: written for 4 ranks" in out,
      "the engine entry for another rank count is ignored with a line", out)
rc, out = engine_bench(profile([dict(E_ENGINE, min_bytes=4 << 20, max_bytes=8 << 20)]))
check(rc == 0 and "no tuning profile engine entry covers 1306112 gradient bytes" in out and " 2 buckets," in out,
      "a model outside every engine entry's range keeps the defaults, saying so", out)
rc, out = engine_bench(profile([E_ENGINE]), {"COMM_ENGINE_BUCKET_CAP_BYTES": "524288"})
check(rc == 0 and "bucket_cap_bytes=65536 not applied: COMM_ENGINE_BUCKET_CAP_BYTES=524288 is set" in out and
      "first_bucket_bytes=65536; why" in out, "COMM_ENGINE_BUCKET_CAP_BYTES in the environment beats the profile "
      "(the entry's other knob still applies)", out)
rc, out = engine_bench(profile([dict(E_ENGINE, settings={"bucket_cap_bytes": 0})]))
check(rc != 0 and "entry #0 (engine, 2 ranks, shm, 1048576..2097152 gradient bytes) bucket_cap_bytes=0 is out of "
      "range" in out, "an engine entry out of range fails comm_init, naming the entry", out)
rc, out = engine_bench(profile([dict(E_ENGINE, settings={"bucket_cap": 65536})]))
check(rc != 0 and "sets the unknown knob 'bucket_cap'" in out, "an unknown engine knob fails comm_init", out)
# What comm-tune writes for an engine winner, loaded and applied.
winner = {SMALL_BYTES: ({"bucket_cap_bytes": 65536, "first_bucket_bytes": 65536}, {"gain": 1.3, "spread": 0.05},
                        {"gain": 1.2, "spread": 0.04, "default_busbw": 10.0, "busbw": 12.0})}
entries = tune_profile.call_entries("engine", 2, "shm", [SMALL_BYTES], winner, metric="steps_per_s")
rc, out = engine_bench(json.dumps(tune_profile.document(entries, {"tool": "test"})))
check(rc == 0 and "bucket_cap_bytes=65536 first_bucket_bytes=65536; why" in out and " 10 buckets," in out,
      "libcomm applies the engine entry comm-tune writes", json.dumps(entries) + "\n" + out)

# comm-tune --engine: a 1-setting sweep through engine-bench, with its announced time.
p = subprocess.run(["/usr/bin/python3", TUNE, "--engine", "--models", "1x128x1000", "--grid", "bucket_cap_bytes=64K",
                    "-n", "2", "-w", "1", "--repeats", "2", "--out", os.path.join(TMP, "engine"), "--launcher",
                    f"{RUN} -n {{ranks}} --bind none --quiet-prefix --", "--bench", ENGINE_BENCH],
                   env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
check(p.returncode == 0 and "# expected duration:" in p.stdout and "# progress: 4/" in p.stdout and
      "| 1306112 |" in p.stdout and "# engine: backward compute per step" in p.stdout,
      "comm-tune --engine sweeps the bucket cap through engine-bench, announcing its duration", p.stdout)

# NCCL's entries: applied before NCCL's first init, never over the user's environment (the fake
# NCCL prints the NCCL_* environment its init sees).
E_NCCL = {"collective": "*", "ranks": 1, "transport": "nccl", "settings": {"NCCL_PROTO": "Simple",
                                                                         "NCCL_BUFFSIZE": 8388608},
          "measured": {"gain": 1.08}}
rc, out = bench(profile([dict(E_NCCL, settings={"NCCL_SOCKET_NTHREADS": 16, "NCCL_NSOCKS_PERTHREAD": 8})]))
check(rc != 0 and "entry #0 (*, 1 ranks, nccl) NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD = 128 is above 64" in out,
      "an NCCL entry NCCL refuses fails comm_init, naming the entry", out)
if FAKES:
    def fake_nccl_bench(entries, extra_env=None):
        path = os.path.join(TMP, "nccl-profile.json")
        with open(path, "w") as f:
            f.write(profile(entries))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("COMM_", "NCCL_"))}
        env.update({"COMM_TUNING_FILE": path, "COMM_TIMEOUT_MS": "20000", "COMM_DEBUG": "INFO",
                    "COMM_DEBUG_SUBSYS": "ENV", "COMM_CUDA_LIBRARY": FAKES[0], "COMM_NCCL_LIBRARY": FAKES[1],
                    "FAKE_NCCL_REPORT_ENV": "1"}, **(extra_env or {}))
        p = subprocess.run([RUN, "-n", "1", "--bind", "none", "--", BENCH, "--transport", "nccl", "--device", "1", "-b", "8",
                            "-e", "8", "-n", "1", "-w", "0"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=120)
        return p.returncode, p.stdout

    rc, out = fake_nccl_bench([dict(E_NCCL, ranks=2, settings={"NCCL_ALGO": "Tree"}), E_NCCL],
                              {"NCCL_BUFFSIZE": "4194304"})
    check(rc == 0 and "fake NCCL init (rank 0): env NCCL_PROTO=Simple" in out and
          "NCCL_PROTO=Simple set by libcomm: tuning profile" in out and "entry #1 (*, 1 ranks, nccl)" in out and
          "1.080x" in out, "the NCCL entry's settings are in NCCL's environment at its first init, logged", out)
    check("fake NCCL init (rank 0): env NCCL_BUFFSIZE=4194304" in out and
          "NCCL_BUFFSIZE=4194304 left as the user set it (libcomm would set 8388608: tuning profile" in out,
          "the user's NCCL_BUFFSIZE beats the profile's", out)
    check("entry #0 (*, 2 ranks, nccl) ignored: NCCL settings written for 2 ranks, this communicator has 1" in out
          and "NCCL_ALGO" not in out.replace("(*, 2 ranks, nccl)", ""),
          "the NCCL entry for another rank count is ignored with a line", out)
    # What comm-tune writes for an NCCL winner (a communicator-wide entry), applied the same way.
    sweep = {8: {"gain": 1.1, "spread": 0.02}}
    entry = tune_profile.communicator_entry(1, tune_profile.transport_name("nccl", 1, 1), {"NCCL_PROTO": "LL"},
                                            sweep, sweep)
    rc, out = fake_nccl_bench([entry])
    check(rc == 0 and "fake NCCL init (rank 0): env NCCL_PROTO=LL" in out,
          "libcomm applies the NCCL entry comm-tune writes", json.dumps(entry) + "\n" + out)
    # comm-tune --nccl where the NCCL backend runs (the fake): measured alternating, end to end.
    nenv = dict(env, COMM_CUDA_LIBRARY=FAKES[0], COMM_NCCL_LIBRARY=FAKES[1])
    p = subprocess.run(["/usr/bin/python3", TUNE, "--nccl", "--ranks", "1", "--grid", "NCCL_PROTO=Simple",
                        "--out", os.path.join(TMP, "nccl-fake"), "-b", "1K", "-e", "1K", "-n", "2", "-w", "1",
                        "--repeats", "2", "--launcher", f"{RUN} -n {{ranks}} --bind none --quiet-prefix --",
                        "--bench", BENCH], env=nenv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120)
    check(p.returncode == 0 and "NCCL backend usable" in p.stdout and "# progress: 4/" in p.stdout,
          "comm-tune --nccl sweeps over a usable NCCL backend (the fake)", p.stdout)
else:
    print("skip the fake NCCL checks: built without the CUDA/NCCL headers")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
