"""Issue 15, "Carry on": the two ways past a dead rank, in real processes.

restart: examples/elastic_train.py under torchrun --max_restarts 1 on 2 ranks; rank 1 SIGKILLs
itself at step 5, torchrun restarts the group, training resumes from rank 0's last checkpoint
(after step 2), and every step printed after the restart equals the uninterrupted run's, bit
for bit, on both ranks.

shrink: examples/elastic_shrink.py on 4 ranks, over shared memory and over sockets; rank 3 dies at
step 4; the survivors learn it from the library (comm_agree_failed: issue 35), shrink and finish on
3 ranks with identical replicas. Over shared memory it
failed before the engine fix of the same commit series: one survivor's comm_engine_end returned
OK with unreduced gradients (its last partition had failed, and end() saw the step idle before the
failure was recorded), so it went on alone and the others' shrink timed out.

usage: test_elastic.py restart|shrink"""

import os
import re
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples")
PY = "/usr/bin/python3"
LINE = re.compile(r"^\[(?:default)?(\d+)\]:? ?step (\d+) loss (\S+) params (\S+)$")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, what, expect_ok=True):
    print("$ " + " ".join(cmd), flush=True)
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    if expect_ok and out.returncode != 0:
        sys.exit(f"FAIL {what}: exit {out.returncode}\n{out.stdout}")
    return out.stdout


def torchrun(args, ckpt):
    return [PY, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
            "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{free_port()}", "--rdzv_id", "elastic",
            "--max_restarts", "1", "--redirects", "1", "--tee", "1",
            os.path.join(EXAMPLES, "elastic_train.py"), "--ckpt", ckpt, "--steps", "8"] + args


def steps_by_attempt(text):
    """[(attempt, step, rank, loss, params)] in print order; the attempt counts '# attempt' lines."""
    out, resumed = [], False
    for line in text.splitlines():
        line = line.strip()
        if "resumed from" in line:
            resumed = True
        m = LINE.match(line)
        if m:
            out.append((1 if resumed else 0, int(m.group(2)), int(m.group(1)), m.group(3), m.group(4)))
    return out


def restart():
    with tempfile.TemporaryDirectory() as d:
        ref_text = run(torchrun([], os.path.join(d, "ref.pt")), "uninterrupted run")
        ref = {(step, rank): (loss, params) for _, step, rank, loss, params in steps_by_attempt(ref_text)}
        assert len(ref) == 16, f"uninterrupted run printed {sorted(ref)}\n{ref_text}"
        text = run(torchrun(["--kill-rank", "1", "--kill-step", "5"], os.path.join(d, "killed.pt")), "killed run")
        assert "SIGKILL at step 5" in text, text
        assert text.count("resumed from") == 2, f"both ranks resume once:\n{text}"
        after = [(step, rank, loss, params) for attempt, step, rank, loss, params in steps_by_attempt(text)
                 if attempt == 1]
        steps = sorted({step for step, *_ in after})
        assert steps == list(range(3, 8)), f"resumed steps {steps} (checkpoint after step 2):\n{text}"
        for step, rank, loss, params in after:
            assert (loss, params) == ref[(step, rank)], (
                f"step {step} rank {rank} after the restart: loss {loss} params {params}, uninterrupted "
                f"{ref[(step, rank)]}")
        print(f"ok: restarted after a SIGKILL at step 5, resumed after step 2, steps 3-7 equal the "
              f"uninterrupted run's bit for bit on both ranks ({len(after)} lines)")


def shrink():
    for transport in ("shm", "socket"):
        shrink_over(transport)


def shrink_over(transport):
    text = run([PY, os.path.join(EXAMPLES, "elastic_shrink.py"), "--nprocs", "4", "--kill-rank", "3",
                "--kill-step", "4", "--steps", "10", "--transport", transport, "--timeout-ms", "20000"],
                f"shrink example over {transport}")
    last = {}
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if m:
            last.setdefault(int(m.group(2)), {})[int(m.group(1))] = (m.group(3), m.group(4))
    assert sorted(last) == list(range(10)), f"steps {sorted(last)}\n{text}"
    for step in range(4, 10):
        assert sorted(last[step]) == [0, 1, 2], f"step {step} printed by {sorted(last[step])}\n{text}"
        params = {rank: p for rank, (_, p) in last[step].items()}  # losses are each rank's own batch's
        assert len(set(params.values())) == 1, f"step {step}: replicas differ {params}"
    assert "shrank to 3 ranks" in text, text
    agreed = [line for line in text.splitlines() if "the survivors agreed that ranks" in line]
    assert len(agreed) == 3 and all(line.endswith("ranks [3] failed") for line in agreed), \
        f"every survivor learns from the library that rank 3 failed\n{text}"
    print(f"ok ({transport}): rank 3 died at step 4; the 3 survivors agreed on it, shrank and trained to step 9 "
          "with identical replicas")


if __name__ == "__main__":
    {"restart": restart, "shrink": shrink}[sys.argv[1]]()
