"""torch's own DistributedDataParallel on the torch.distributed backend "libcomm": the example
(examples/train_transformer.py --backend libcomm-pg) trains 50 steps on 2 ranks under comm-run
with every step's loss within 1e-5 (relative) of the same run on gloo, replicas identical; the
same with torch's comm hooks (allreduce_hook, fp16_compress_hook: they call the process group),
with static_graph + gradient_as_bucket_view, and for a few steps under torchrun.
Exits 77 (meson: SKIP) when the extension is not built.

usage: test_torch_ddp_backend.py COMM_RUN"""

import os
import shutil
import sys

import torch_backend_or_skip  # noqa: F401 - registers "libcomm", or SKIP

from test_example import EXAMPLE, PY, SMALL, check_replicas, run


def compare(ours, ref, steps, what, tol):
    worst = 0.0
    for step in range(steps):
        a, b = ours[step][0][0], ref[step][0][0]
        rel = abs(a - b) / max(abs(b), 1e-12)
        worst = max(worst, rel)
        assert rel <= tol, f"{what}: step {step}: libcomm-pg loss {a} vs gloo {b}: rel {rel:.2e}"
    print(f"ok {what}: {steps} steps, losses within rel {worst:.2e} of torch DDP on gloo, "
          "replicas identical", flush=True)


def main():
    comm_run = sys.argv[1]
    launch = [comm_run, "-n", "2", "--bind", "none", "--", PY, EXAMPLE]
    for steps, extra, tol in ((50, [], 1e-5),
                              (10, ["--comm-hook", "allreduce"], 1e-5),
                              (10, ["--comm-hook", "fp16"], 1e-5),
                              (10, ["--static-graph", "--gradient-as-bucket-view"], 1e-5)):
        what = "torch DDP " + (" ".join(extra) or "(default)")
        args = ["--steps", str(steps)] + SMALL + extra
        ours = run(launch + args + ["--backend", "libcomm-pg"], "libcomm-pg " + what)
        check_replicas(ours, steps, "libcomm-pg " + what)
        ref = run(launch + args + ["--backend", "gloo"], "gloo " + what)
        check_replicas(ref, steps, "gloo " + what)
        compare(ours, ref, steps, what, tol)
        if not extra:
            first = ours

    torchrun = shutil.which("torchrun")
    if torchrun and os.environ.get("TEST_TORCHRUN", "1") == "1":
        # Debian's torchrun (torch 1.13, Python 3.11) needs --redirects 1 --tee 1.
        tr = run([torchrun, "--standalone", "--nproc_per_node", "2", "--redirects", "1", "--tee", "1",
                  EXAMPLE, "--steps", "3", "--backend", "libcomm-pg"] + SMALL, "libcomm-pg under torchrun")
        check_replicas(tr, 3, "torchrun")
        for step in range(3):
            assert tr[step][0] == first[step][0], f"torchrun step {step}: {tr[step][0]} vs {first[step][0]}"
        print("ok: torchrun runs torch DDP on libcomm with the same first steps", flush=True)


if __name__ == "__main__":
    main()
