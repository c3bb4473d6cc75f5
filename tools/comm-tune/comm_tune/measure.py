"""One measurement: a job of fresh ranks through the launcher, running comm-bench over the sizes
(or engine-bench once per model, --engine); an alternating run pairs a setting with the default,
job after job, and is cached per setting."""
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from . import grid


class Unavailable(RuntimeError):
    """The backend or transport a setting needs is not usable here."""


class Progress:
    """done/total jobs, elapsed, and an estimate of what is left (from the jobs so far)."""

    def __init__(self, total, seconds_per_job, quiet=False):
        self.total, self.done, self.start, self.per_job, self.quiet = total, 0, time.monotonic(), seconds_per_job, quiet
        self.measured = []

    def add_jobs(self, n):
        self.total += n

    def job_done(self, seconds, what):
        self.done += 1
        self.measured.append(seconds)
        per = statistics.mean(self.measured) if self.measured else self.per_job
        left = max(0, self.total - self.done) * per
        if not self.quiet:
            print(f"# progress: {self.done}/{self.total} jobs, elapsed {self.elapsed():.1f} s, about {left:.0f} s left"
                  f"  ({what})", file=sys.stderr, flush=True)

    def elapsed(self):
        return time.monotonic() - self.start


class Runner:
    def __init__(self, args, progress=None):
        self.args = args
        self.progress = progress
        self.env = dict(os.environ)
        # The sweep measures against libcomm's defaults, not against a profile already in use.
        self.env.pop("COMM_TUNING_FILE", None)
        self.env.setdefault("COMM_TIMEOUT_MS", "30000")
        self.last_engine_rows = {}  # per model: engine-bench's last row (the calibration's compute time)

    def command(self, out_json):
        a = self.args
        launcher = [part.replace("{ranks}", str(a.ranks_now)) for part in a.launcher]
        cmd = launcher + [a.bench, "--op-name", a.collective, "-b", str(a.sizes[0]), "-e", str(a.sizes[-1]),
                          "-f", str(a.factor), "-n", str(a.iters), "-w", str(a.warmup), "-c", "0", "--json", out_json]
        if a.transport != "auto":
            cmd += ["--transport", a.transport]
        if a.nccl:
            cmd += ["--device", "1"]  # device buffers and a stream: the NCCL path
        return cmd

    def engine_command(self, model):
        a = self.args
        launcher = [part.replace("{ranks}", str(a.ranks_now)) for part in a.launcher]
        layers, d_model, vocab = model
        cmd = launcher + [a.bench, "--layers", str(layers), "--d-model", str(d_model), "--vocab", str(vocab),
                          "--iters", str(a.iters), "--warmup", str(a.warmup)]
        compute = a.compute_ms.get(model_key(model)) if isinstance(a.compute_ms, dict) else None
        if compute is not None:
            cmd += ["--compute-ms", f"{compute:.3f}"]
        return cmd

    def engine_job(self, setting, what, env):
        """Steps per second (1000 / engine-bench's median step_ms) per model, keyed by the model's
        gradient bytes; one engine-bench run per model, each in fresh ranks."""
        t0 = time.monotonic()
        out = {}
        for model in self.args.models:
            try:
                proc = subprocess.run(self.engine_command(model), env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, timeout=self.args.job_timeout)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"{what}: the job ran past --job-timeout {self.args.job_timeout} s")
            row = engine_row(proc.stdout)
            if proc.returncode != 0 or row is None:
                tail = "\n".join(proc.stdout.strip().splitlines()[-6:])
                if "UNAVAILABLE" in proc.stdout:
                    raise Unavailable(tail)
                raise RuntimeError(f"{what}: the job failed (exit {proc.returncode}):\n{tail}")
            out[str(model_bytes(model))] = 1000.0 / row["step_ms"] if row["step_ms"] > 0 else 0.0
            self.last_engine_rows[model_key(model)] = row
        if self.progress:
            self.progress.job_done(time.monotonic() - t0, what)
        return out

    def job(self, setting, what, extra_env=None):
        """busbw (GB/s) per size for one job of fresh ranks with `setting` in their environment
        (--engine: steps per second per model)."""
        env = dict(self.env)
        env.update(grid.environment(setting, self.args.nccl))
        env.update(extra_env or {})
        if getattr(self.args, "engine", False):
            return self.engine_job(setting, what, env)
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "bench.json")
            t0 = time.monotonic()
            try:
                proc = subprocess.run(self.command(out), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, timeout=self.args.job_timeout)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"{what}: the job ran past --job-timeout {self.args.job_timeout} s")
            if proc.returncode != 0 or not os.path.exists(out):
                tail = "\n".join(proc.stdout.strip().splitlines()[-6:])
                if "UNAVAILABLE" in proc.stdout or "not available" in proc.stdout:
                    raise Unavailable(tail)
                raise RuntimeError(f"{what}: the job failed (exit {proc.returncode}):\n{tail}")
            with open(out) as f:
                result = json.load(f)
        if self.progress:
            self.progress.job_done(time.monotonic() - t0, what)
        return busbw_by_size(result)

    def fingerprint(self, phase, repeats):
        a = self.args
        key = [a.bench, a.launcher, a.ranks_now, a.transport, a.collective, a.sizes, a.iters, a.warmup, phase, repeats]
        if getattr(a, "engine", False):
            key.append(sorted(a.compute_ms.items()) if isinstance(a.compute_ms, dict) else a.compute_ms)
        return hashlib.sha1(json.dumps(key).encode()).hexdigest()[:16]

    def alternating(self, setting, repeats, phase):
        """`repeats` pairs of (default, setting) jobs, in ABBA order so that drift cancels;
        read from the cache when this exact run was done before (an interrupted sweep resumes)."""
        fp = self.fingerprint(phase, repeats)
        path = os.path.join(self.args.out, "cache", f"r{self.args.ranks_now}-{phase}-{grid.slug(setting)}.json")
        if os.path.exists(path):
            with open(path) as f:
                cached = json.load(f)
            if cached.get("fingerprint") == fp:
                return cached, True
        if self.progress and phase == "confirm":
            self.progress.add_jobs(2 * repeats)  # confirmations are known only once the sweep has winners
        pairs = []
        for r in range(repeats):
            order = ("default", "setting") if r % 2 == 0 else ("setting", "default")
            pair = {}
            for role in order:
                s = {} if role == "default" else setting
                pair[role] = self.job(s, f"{phase} {grid.name(setting)} repeat {r + 1}/{repeats}, {role}")
            pairs.append(pair)
        run = {"fingerprint": fp, "setting": setting, "phase": phase, "ranks": self.args.ranks_now, "pairs": pairs}
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(run, f, indent=1)
        os.replace(path + ".tmp", path)  # a run is cached whole or not at all
        return run, False


def model_key(model):
    return "x".join(str(v) for v in model)


def model_bytes(model):
    """Gradient bytes of engine-bench's layer list (float32): the embedding, per block
    12 d^2 + 13 d (attention, MLP, norms, biases), and the final norm."""
    layers, d, vocab = model
    return 4 * (vocab * d + layers * (12 * d * d + 13 * d) + 2 * d)


def engine_row(text):
    """engine-bench's result row (after the header that starts with 'ranks'), as numbers."""
    lines = text.splitlines()
    for i, line in enumerate(lines[:-1]):
        cols = line.split()
        if cols[:3] == ["ranks", "compute_ms", "comm_ms"]:
            values = lines[i + 1].split()
            if len(values) == len(cols) and re.match(r"^\d+$", values[0]):
                return {c: float(v) for c, v in zip(cols, values)}
    return None


def busbw_by_size(result):
    """busbw of the faster placement (out-of-place or in-place) per size: a one-time cost inside
    a job (a first use, a descheduled rank) then does not decide a comparison between jobs.
    At 1 rank (gpu-check's NCCL sweep on one GPU) algbw, since busbw is 0 there."""
    rows = {}
    for row in result["rows"]:
        # busbw is 0 at 1 rank (2(n-1)/n): the ratio of two zeros says nothing, algbw does.
        key = "busbw" if row["out_of_place"]["busbw"] > 0 or row["in_place"]["busbw"] > 0 else "algbw"
        rows[str(row["size"])] = max(row["out_of_place"][key], row["in_place"][key])
    return rows


def compare(run):
    """Per size: the gain (median of the paired ratios setting/default), the spread (noise: half
    the range of those ratios, or half the default's own relative range between its repeats,
    whichever is larger), and whether the gain counts (above the spread, every pair agreeing)."""
    out = {}
    for size in run["pairs"][0]["default"]:
        d = [p["default"][size] for p in run["pairs"]]
        s = [p["setting"][size] for p in run["pairs"]]
        ratios = [x / y if y > 0 else 0.0 for x, y in zip(s, d)]
        gain = statistics.median(ratios)
        spread = (max(ratios) - min(ratios)) / 2
        if len(d) > 1 and statistics.median(d) > 0:
            spread = max(spread, (max(d) - min(d)) / statistics.median(d) / 2)
        out[int(size)] = {
            "gain": gain, "spread": spread, "ratios": ratios,
            "default_busbw": statistics.median(d), "busbw": statistics.median(s),
            "significant": len(ratios) > 1 and gain - 1 > spread and min(ratios) > 1,
            "worse": len(ratios) > 1 and 1 - gain > spread and max(ratios) < 1,
        }
    return out
