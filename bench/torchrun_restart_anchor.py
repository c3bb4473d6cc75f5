#!/usr/bin/python3
"""The anchor for issue 35's chaos runs: torchrun restarting every rank from a checkpoint.

The job of bench/chaos_train.py (examples/fault_tolerant_train.py's MLP of
bench/engine_bench_mlp.py: width 256, depth 3, batch 32, SGD with momentum, StepLR; 300 steps,
0.1 s of sleep per step), trained with plain torch DDP (gloo) under

    torchrun --nnodes 1 --nproc-per-node 4 --max-restarts K  (c10d rendezvous on 127.0.0.1)

on this host (default monitor interval, 5 s), rank 0 writing a checkpoint (model, optimizer, scheduler, step) atomically every
--ckpt-every steps, every rank loading it when torchrun restarts the group. This driver SIGKILLs a
random worker (rank 0 included) ~--kill-every s (x U(0.7, 1.3), as chaos_train.py) after the
start of training and then after training is back where the last kill found it (a restart takes
about as long as chaos_train.py's interval here: kills timed from the last kill would land on
groups still starting and the run would not end), at most --max-kills times. Per failure: the
time from the kill until training is back at the step it had reached (time lost), the steps
redone since the checkpoint (steps lost),
and where the time went (restart: until the new rank 0 process runs; import: its `import torch`;
init: the process group, the checkpoint, DDP's wrap; redo: the steps since the checkpoint again);
per run, the wall time against runs without kills.

    /usr/bin/python3 bench/torchrun_restart_anchor.py --runs 3 --free-runs 2

With --hosts H, the same job on H netsim hosts (tools/netsim/netsim: network namespaces joined by a
bridge, --rate links; chaos_train.py's setting), one torchrun agent per host, --ranks-per-host
workers each (c10d rendezvous on host 0's address, which hosts the rendezvous store; the workers'
gloo on eth0). Torch 1.13's agents publish their host name as the workers' MASTER_ADDR, which
every namespace resolves to itself, so rank 0 writes its host's address in the run's directory
under the round's MASTER_PORT, and the other workers take it from there (meet_rank0).
Needs root (netsim).

    sudo /usr/bin/python3 bench/torchrun_restart_anchor.py --hosts 4 --runs 3 --free-runs 1

Rank 0 logs its progress to a file (one line a step, with CLOCK_MONOTONIC, which every process
of the host shares, and every netsim host too), so torchrun's own output is not parsed. Run with
/usr/bin/python3 (torch).
"""

import time

T_PROCESS = time.monotonic()  # before the imports: a restarted worker's start, for the breakdown

import argparse  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"
NETSIM = os.path.join(HERE, "..", "tools", "netsim", "netsim")


def log(rundir, line):
    """One O_APPEND write per line: whole lines, whoever writes."""
    fd = os.open(os.path.join(rundir, "progress"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def save_atomically(path, state):
    import torch
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(state, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)  # a rank killed while writing leaves the last checkpoint whole


def mlp(width, depth, inputs, outputs):
    """bench/engine_bench_mlp.py's model, here so that the anchor imports torch only (no libcomm)."""
    import torch
    layers = [torch.nn.Linear(inputs, width), torch.nn.ReLU()]
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, outputs))
    return torch.nn.Sequential(*layers)


def meet_rank0(rundir, rank):
    """netsim hosts (the module docstring): rank 0 writes its host's address under this round's key,
    the MASTER_PORT its agent picked at the rendezvous, and the others take it for MASTER_ADDR.
    Returns the round's number, the same on every rank (an agent that restarts because another
    host's worker failed does not count a restart: TORCHELASTIC_RESTART_COUNT differs by host)."""
    import glob
    import json
    key = os.path.join(rundir, "master." + os.environ["MASTER_PORT"])
    if rank == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # the address that reaches host 0
            s.connect((os.environ["ANCHOR_MASTER_ADDR"], 9))
            addr = s.getsockname()[0]
        round_no = len(glob.glob(os.path.join(rundir, "master.*")))
        with open(key + ".tmp", "w") as f:
            json.dump({"addr": addr, "round": round_no}, f)
        os.replace(key + ".tmp", key)
    deadline = time.monotonic() + 60
    while not os.path.exists(key):
        if time.monotonic() > deadline:
            raise SystemExit(f"anchor: rank {rank}: rank 0 wrote no address under {key} within 60 s")
        time.sleep(0.05)
    with open(key) as f:
        met = json.load(f)
    os.environ["MASTER_ADDR"] = met["addr"]
    return met["round"]


def worker(args):
    """One rank under torchrun: plain torch DDP over gloo, resumed from the checkpoint if any."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    t_imported = time.monotonic()

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank = int(os.environ["RANK"])
    if os.environ.get("ANCHOR_MASTER_ADDR"):
        attempt = meet_rank0(args.rundir, rank)
    with open(os.path.join(args.rundir, f"pid.{attempt}.{rank}"), "w") as f:
        f.write(str(os.getpid()))
    torch.set_num_threads(1)
    # A deadline on every collective: a peer that hangs fails the step instead of waiting 30 min.
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    torch.manual_seed(args.seed)
    model = mlp(args.width, args.depth, args.width, 16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=max(1, args.steps // 3), gamma=0.5)
    ckpt = os.path.join(args.rundir, "ckpt.pt")
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        start = state["step"]
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    if rank == 0:
        log(args.rundir, f"start {attempt} {start} {T_PROCESS:.4f} {t_imported:.4f} {time.monotonic():.4f}")
    for step in range(start, args.steps):
        # The batch is a function of (seed, step, rank), as in examples/fault_tolerant_train.py.
        g = torch.Generator().manual_seed(args.seed * 1000003 + step * 1009 + rank)
        x = torch.randn(args.batch, args.width, generator=g)
        y = torch.randn(args.batch, 16, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        sched.step()
        if rank == 0:
            log(args.rundir, f"step {attempt} {step + 1} {time.monotonic():.4f}")  # steps done
            if (step + 1) % args.ckpt_every == 0:
                save_atomically(ckpt, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                                       "scheduler": sched.state_dict(), "step": step + 1})
        time.sleep(args.step_sleep)
    dist.destroy_process_group()
    return 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_progress(rundir):
    """[(kind, attempt, steps, times...)] from rank 0's log."""
    try:
        with open(os.path.join(rundir, "progress")) as f:
            rows = [line.split() for line in f if line.endswith("\n")]
    except OSError:
        return []
    return [(r[0], int(r[1]), int(r[2])) + tuple(float(x) for x in r[3:]) for r in rows]


def one_run(args, index, kills):
    rundir = tempfile.mkdtemp(prefix=f"anchor_{index}_")
    worker_args = ["--worker", "--rundir", rundir, "--steps", str(args.steps), "--step-sleep",
                   str(args.step_sleep), "--ckpt-every", str(args.ckpt_every), "--seed", str(index),
                   "--width", str(args.width), "--depth", str(args.depth), "--batch", str(args.batch)]
    # Debian's torchrun (torch 1.13, Python 3.11) needs --redirects 1 --tee 1 (tests/python/meson.build).
    def torchrun(nnodes, nproc, endpoint, logs, conf=()):
        return [PY, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc_per_node", str(nproc),
                "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint, *conf, "--rdzv_id", f"anchor{index}",
                "--max_restarts", str(args.max_restarts), "--redirects", "1", "--tee", "1", "--log_dir", logs,
                os.path.abspath(__file__)] + worker_args
    if args.hosts:
        # One agent per netsim host: these words are shell, expanding netsim's MASTER_ADDR, MASTER_PORT
        # and GROUP_RANK in each host; every other word is quoted.
        endpoint, logs = '"$MASTER_ADDR:$MASTER_PORT"', shlex.quote(rundir) + '/logs-"$GROUP_RANK"'
        is_host = 'is_host="$([ "$GROUP_RANK" = 0 ] && echo 1 || echo 0)"'
        argv = torchrun(args.hosts, args.ranks_per_host, endpoint, logs, conf=("--rdzv_conf", is_host))
        agent = " ".join(a if a in (endpoint, logs, is_host) else shlex.quote(a) for a in argv)
        script = 'ANCHOR_MASTER_ADDR="$MASTER_ADDR" GLOO_SOCKET_IFNAME=eth0 exec ' + agent
        cmd = [NETSIM, "--hosts", str(args.hosts), "--rate", args.rate, "--port", str(29500 + index % 500), "--",
               "/bin/sh", "-c", script]
    else:
        cmd = torchrun(1, args.ranks, f"127.0.0.1:{free_port()}", os.path.join(rundir, "logs"))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    t_launch = time.monotonic()
    with open(os.path.join(rundir, "torchrun.log"), "w") as out:
        tr = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        events, hung = drive(args, kills, index, rundir, tr, t_launch)
    finally:
        if tr.poll() is None:  # the driver failed or was interrupted: no torchrun left behind
            stop(tr, args.hosts)
    code = tr.wait()
    return summarize(args, index, rundir, events, code, hung, t_launch)


def stop(tr, hosts):
    """torchrun's session (the agent and its workers), or netsim, which on SIGINT stops the agents
    and removes its namespaces (SIGKILL would leave them)."""
    if hosts:
        tr.send_signal(signal.SIGINT)
        try:
            tr.wait(timeout=60)
            return
        except subprocess.TimeoutExpired:
            pass
    os.killpg(tr.pid, signal.SIGKILL)
    tr.wait(timeout=60)


def drive(args, kills, index, rundir, tr, t_launch):
    """The kills, until torchrun exits or the deadline; returns ([{t, rank, attempt}], hung)."""
    rng = random.Random(1000 + index)
    events, next_at, hung, back_to = [], None, False, None
    while tr.poll() is None:
        now = time.monotonic()
        if now - t_launch > args.deadline_s:
            hung = True
            stop(tr, args.hosts)
            break
        steps = [r for r in read_progress(rundir) if r[0] == "step"]
        if back_to is not None and steps and steps[-1][1] > events[-1]["attempt"] and steps[-1][2] >= back_to:
            back_to, next_at = None, steps[-1][3] + args.kill_every * rng.uniform(0.7, 1.3)
        if kills and steps and next_at is None and not events:
            next_at = steps[0][3] + args.kill_every * rng.uniform(0.7, 1.3)
        if next_at is not None and now >= next_at and len(events) < args.max_kills and steps[-1][2] < args.steps:
            attempt = steps[-1][1]
            victim = rng.randrange(args.hosts * args.ranks_per_host if args.hosts else args.ranks)
            try:
                with open(os.path.join(rundir, f"pid.{attempt}.{victim}")) as f:
                    os.kill(int(f.read()), signal.SIGKILL)
            except (OSError, ValueError):
                time.sleep(0.05)
                continue
            events.append({"t": time.monotonic(), "rank": victim, "attempt": attempt})
            # The next kill comes ~kill_every s after training is back at this step.
            back_to, next_at = steps[-1][2], None
        time.sleep(0.05)
    return events, hung


def summarize(args, index, rundir, events, code, hung, t_launch):
    rows = read_progress(rundir)
    steps = [r for r in rows if r[0] == "step"]
    starts = {r[1]: r for r in rows if r[0] == "start"}
    t_first = steps[0][3] if steps else float("nan")
    t_last = steps[-1][3] if steps else float("nan")
    per = []
    for e in events:
        reached = max([r[2] for r in steps if r[3] <= e["t"]] or [0])
        later = [r for r in steps if r[1] > e["attempt"]]
        attempt = later[0][1] if later else None
        st = starts.get(attempt)
        back = next((r[3] for r in later if r[2] >= reached), None)
        f = {"rank": e["rank"], "at": e["t"] - t_first, "reached": reached,
             "resumed": st[2] if st else None, "lost_s": back - e["t"] if back else None}
        if st:
            f["steps_lost"] = reached - st[2]
            f["restart_s"] = st[3] - e["t"]                    # kill -> the new rank 0 process runs
            f["import_s"] = st[4] - st[3]                      # import torch
            f["init_s"] = st[5] - st[4]                        # process group, checkpoint, DDP
            f["redo_s"] = back - st[5] if back else None       # the steps since the checkpoint again
        per.append(f)
    done = steps[-1][2] if steps else 0
    return {"run": index, "code": code, "hung": hung, "steps": done, "failures": per,
            "attempts": len(starts), "train_s": t_last - t_first, "wall_s": time.monotonic() - t_launch,
            "rundir": rundir}


def fmt(xs, digits=1):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return f"{min(xs):.{digits}f}-{max(xs):.{digits}f} (median {statistics.median(xs):.{digits}f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rundir", help=argparse.SUPPRESS)
    ap.add_argument("--runs", type=int, default=3, help="runs with kills")
    ap.add_argument("--free-runs", type=int, default=1, help="runs without kills (the baseline)")
    ap.add_argument("--ranks", type=int, default=4, help="ranks on this host (without --hosts)")
    ap.add_argument("--hosts", type=int, default=0, help="netsim hosts, one torchrun agent each (root)")
    ap.add_argument("--ranks-per-host", type=int, default=1, help="workers per netsim host")
    ap.add_argument("--rate", default="none", help="netsim's link rate (chaos_train.py's default: unshaped)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--step-sleep", type=float, default=0.1)
    ap.add_argument("--ckpt-every", type=int, default=25)
    ap.add_argument("--kill-every", type=float, default=15.0)
    ap.add_argument("--max-kills", type=int, default=3, help="kills per run (chaos_train.py's 4 x 1 "
                    "ranks make at most 2 events, 4 x 2 at most 6)")
    ap.add_argument("--max-restarts", type=int, default=5)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep each run's directory (logs, checkpoint)")
    ap.add_argument("--deadline-s", type=float, default=900)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    where = (f"{args.hosts} netsim hosts x {args.ranks_per_host} ranks ({args.rate} links)" if args.hosts else
             f"{args.ranks} ranks on this host")
    print(f"# torchrun anchor: {where}, torch DDP (gloo), {args.steps} steps, "
          f"--step-sleep {args.step_sleep}, checkpoint every {args.ckpt_every} steps, a SIGKILL every "
          f"~{args.kill_every:.0f} s of training (at most {args.max_kills}), --max-restarts {args.max_restarts}; load {os.getloadavg()[0]:.1f}", flush=True)
    print("| run | kills | steps | exit | per failure: rank@s reached->resumed, lost s (restart/import/init/redo) "
          "| time lost per failure (s) | steps lost per failure | train s | wall s |", flush=True)
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    bad = 0
    for i in range(args.free_runs + args.runs):
        kills = i >= args.free_runs
        row = one_run(args, args.seed + i, kills)
        if not args.keep:
            shutil.rmtree(row["rundir"], ignore_errors=True)
        fs = row["failures"]
        detail = "; ".join(
            f"{f['rank']}@{f['at']:.0f} {f['reached']}->{f['resumed']}, "
            + (f"{f['lost_s']:.1f} ({f.get('restart_s', 0):.1f}/{f.get('import_s', 0):.1f}/{f.get('init_s', 0):.1f}/{f.get('redo_s') or 0:.1f})"
               if f["lost_s"] is not None else "never back")
            for f in fs) or "-"
        print(f"| {row['run']}{'' if kills else ' (no kills)'} | {len(fs)} | {row['steps']}/{args.steps} "
              f"| {'HUNG' if row['hung'] else row['code']} | {detail} | {fmt([f['lost_s'] for f in fs])} "
              f"| {fmt([f.get('steps_lost') for f in fs], 0)} | {row['train_s']:.1f} | {row['wall_s']:.1f} |", flush=True)
        bad += row["hung"] or row["code"] != 0 or row["steps"] != args.steps
    print(f"# load at the end {os.getloadavg()[0]:.1f}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
