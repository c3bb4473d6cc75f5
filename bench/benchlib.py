"""What the comparison scripts (compare.py, compare_allreduce.py, ucx_vs_socket.py) share: where
the build and the results go, how comm-bench and its peers are launched (comm-run, netsim), one run
of a variant with its log and JSON kept, the samples of every round and their medians.

Each script keeps its own variants, tables and summary; this module only runs and collects.
"""
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def add_build_arg(ap):
    ap.add_argument("--build", default=os.environ.get("BUILD_DIR", os.path.join(ROOT, "build")))


def results_dir(out, kind):
    """--out, or bench/results/<kind>-<time>; created."""
    out_dir = out or os.path.join(HERE, "results", time.strftime(f"{kind}-%Y%m%d-%H%M%S"))
    os.makedirs(out_dir, exist_ok=True)
    return out_dir


def require_built(script, name, prog, packages):
    if not os.path.exists(prog):
        sys.exit(f"{script}: {prog} is not built ({name}); apt-get install {packages}, then meson setup --reconfigure "
                 "and ninja")


def comm_run(build, np, bench):
    """bench (a command line) on np local ranks under comm-run."""
    return [os.path.join(build, "tools", "comm-run", "comm-run"), "-n", str(np), "--quiet-prefix", "--", *bench]


def netsim(netsim_args, bench):
    """bench with one rank per simulated host (tools/netsim, needs root)."""
    return [os.path.join(ROOT, "tools", "netsim", "netsim"), *netsim_args, "--", *bench]


def stem(out_dir, *parts):
    """The path (without .log/.json) of one run's files: parts such as the variant's name, made
    file names, joined by dots."""
    return os.path.join(out_dir, ".".join(p.replace(" ", "_").replace("/", "_") for p in parts))


def run(script, what, cmd, file_stem, env=None):
    """Runs one variant (its command line ends with --json file_stem.json); keeps its output in
    file_stem.log and stops the script when it fails. Returns (output, the JSON's rows)."""
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(file_stem + ".log", "w") as f:
        f.write(done.stdout)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-3000:])
        sys.exit(f"{script}: {what} failed (status {done.returncode}); log in {file_stem}.log")
    # The table has two decimals; its JSON twin has them all.
    with open(file_stem + ".json") as f:
        return done.stdout, json.load(f)["rows"]


def announce(line):
    """What is about to run, on stderr (stdout is the summary)."""
    print(line, file=sys.stderr, flush=True)


def add_samples(samples, name, rows, place, fields):
    """Appends every row's values of one placement ("in_place", "out_of_place") to
    samples[name][size][field]; fields maps the script's names to comm-bench's JSON keys."""
    for row in rows:
        per_size = samples.setdefault(name, {}).setdefault(row["size"], {f: [] for f in fields})
        for field, key in fields.items():
            per_size[field].append(row[place][key])


def medians(samples):
    """The same nesting with every list of samples replaced by its median."""
    if isinstance(samples, list):
        return statistics.median(samples)
    return {k: medians(v) for k, v in samples.items()}


def write_summary(out_dir, summary):
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"# logs, JSON and summary.json in {out_dir}")


def init_gloo_beside(rank, size):
    """torch.distributed over gloo next to a libcomm job on the same ranks: gloo's store listens on
    MASTER_PORT + 1 (libcomm's uses MASTER_PORT); inside a netsim host gloo must use eth0."""
    import torch.distributed as dist
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        os.environ["GLOO_SOCKET_IFNAME"] = "eth0" if os.path.exists("/sys/class/net/eth0") else "lo"
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "29500")) + 1
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=size)
