"""examples/train_transformer.py on 2 ranks: with libcomm under comm-run for 50 steps it prints
the loss curve of torch's DDP over gloo (relative difference <= 1e-5 per step, same seed), and
every step's loss and parameter checksum are identical on both ranks; under torchrun it runs too.

usage: test_example.py COMM_RUN [extra example flags...]"""

import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "train_transformer.py")
PY = "/usr/bin/python3"
LINE = re.compile(r"^\[(?:default)?(\d+)\]:? ?step (\d+) loss (\S+) params (\S+)$")
# Small enough for a few seconds on 2 shared cores, big enough for several buckets.
SMALL = ["--d-model", "16", "--batch", "4", "--seq-len", "8", "--bucket-cap-mb", "0.01"]
OURS = ["--first-bucket-mb", "0.005"]  # several buckets (torch's DDP has no such flag)


def run(cmd, what):
    print("$ " + " ".join(cmd), flush=True)
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=240)
    if out.returncode != 0:
        sys.exit(f"FAIL {what}: exit {out.returncode}\n{out.stdout}")
    curve = {}
    for line in out.stdout.splitlines():
        m = LINE.match(line.strip())
        if m:
            rank, step = int(m.group(1)), int(m.group(2))
            curve.setdefault(step, {})[rank] = (float(m.group(3)), m.group(4))
        elif line.strip() and "step" not in line:
            print(line)
    return curve


def check_replicas(curve, steps, what):
    assert sorted(curve) == list(range(steps)), f"{what}: steps printed {sorted(curve)}"
    for step, ranks in curve.items():
        assert sorted(ranks) == [0, 1], f"{what}: step {step} printed by ranks {sorted(ranks)}"
        assert ranks[0] == ranks[1], f"{what}: step {step}: rank 0 {ranks[0]} != rank 1 {ranks[1]}"


def main():
    comm_run, extra = sys.argv[1], sys.argv[2:]
    steps = 50
    base = [comm_run, "-n", "2", "--bind", "none", "--", PY, EXAMPLE, "--steps", str(steps)]
    ours = run(base + SMALL + OURS + extra, "libcomm under comm-run")
    check_replicas(ours, steps, "libcomm")
    ref = run(base + SMALL + extra + ["--backend", "gloo"], "torch DDP (gloo) under comm-run")
    check_replicas(ref, steps, "gloo")
    worst = 0.0
    for step in range(steps):
        a, b = ours[step][0][0], ref[step][0][0]
        rel = abs(a - b) / max(abs(b), 1e-12)
        worst = max(worst, rel)
        assert rel <= 1e-5, f"step {step}: libcomm loss {a} vs torch DDP (gloo) {b}: rel {rel:.2e}"
    print(f"ok: {steps} steps, loss curves of libcomm and torch DDP (gloo) within rel {worst:.2e}, "
          "replicas identical")

    torchrun = shutil.which("torchrun")
    if torchrun and os.environ.get("TEST_TORCHRUN", "1") == "1":
        # Debian's torchrun (torch 1.13, Python 3.11) needs --redirects 1 --tee 1.
        tr = run([torchrun, "--standalone", "--nproc_per_node", "2", "--redirects", "1",
                  "--tee", "1", EXAMPLE, "--steps", "3"] + SMALL + OURS + extra, "libcomm under torchrun")
        check_replicas(tr, 3, "torchrun")
        for step in range(3):
            assert tr[step][0] == ours[step][0], f"torchrun step {step}: {tr[step][0]} vs {ours[step][0]}"
        print("ok: torchrun runs the example with the same first steps")


if __name__ == "__main__":
    main()
