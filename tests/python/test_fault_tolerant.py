"""Issue 35: DDP with fault_tolerant=True keeps training when a rank dies, in real processes.

kill TRANSPORT N: N ranks of examples/fault_tolerant_train.py (started here, each with torchrun's
variables: a launcher that ends the job on the first death would end it), over shared memory
(auto) or sockets, meeting in a file:// store (it outlives any rank, so the victim may be rank 0;
and no TCP port to race other jobs for); once the victim has printed a step, this test SIGKILLs
it, wherever it is. Every survivor must
end with `final step STEPS params H`, the same H on all, and report one recovery that names the
victim. Where the victim died (forward, all-reduce, vote, between steps) is the scheduler's choice.

kill-options TRANSPORT N: kill, with gradient_as_bucket_view, static_graph and
find_unused_parameters, and the allreduce_hook comm hook (the engine and the hook's communicator are
rebuilt on the shrunk communicator).

vote: 4 ranks over shared memory; rank 1's commit vote of step 5 completes and then reports a
failure (ft_rank.py's FT_VOTE_FAIL, as a report can fail one rank's operation that others
completed), and rank 2 dies at the start of step 6. Ranks 0 and 3 committed step 5 and fail in
step 6; rank 1 is one step behind: it must commit step 5 (the others did), they redo step 6, and
all end equal: no step applied twice or lost.

join TRANSPORT: 4 ranks; rank 2 dies at step 6; once a survivor has recovered, this test starts a
replacement (COMM_JOIN=1); the survivors admit it at a step boundary (comm_grow) and send it the
state; all four end with the same step count and parameter hash (each trains until the job has 4
ranks again). Skipped (77) while comm_grow is not implemented.

stop TRANSPORT: 4 ranks; rank 2 is SIGSTOPped after its step 5: the survivors suspect it by its
silence in the agreement (not after a timeout of their own), exclude it and end equal.

kill-during-join: the join over sockets, but member 3 is SIGKILLed during the admission (after the
grow returned, ft_rank.py's FT_KILL_AT_JOIN); ranks 0 and 1 recover, redo the step and end equal.

split-at-join: the join over sockets, but member 0's admission fails after its state exchange
completed, while members 1 and 3 completed theirs (ft_rank.py's FT_SPLIT_AT_JOIN; chaos run 5,
where rank 0 undid the admission and the others went on with it, and neither side held a majority):
the members' agreement on the admission undoes it on all three, which recover on the communicator
of before and end equal; the abandoned replacement stops.

split-comm-run COMM_RUN: the same under comm-run --replace-failed, which replaces the abandoned
replacement on the members' record of it (comm_exclude); the job ends on 4 equal ranks.

split-comm-run-stopped COMM_RUN: the same, but the abandoned replacement is SIGSTOPped before the
decision (ft_rank.py's FT_STOP_JOINER_ONCE): it never exits, so only the record frees its slot;
comm-run SIGKILLs it and starts another.

refuse: 2 ranks; overlap_forward, a comm hook with state (PowerSGD), join() and a forward after
an uncommitted step are refused with fault_tolerant=True (ft_rank.py's FT_REFUSE).

FT_VICTIM=R picks the victim of kill (else a random rank, 0 included).

repair once|always: join over sockets, but rank 1's state diverges just before the join's sha256
check (ft_rank.py's FT_CORRUPT); once: repaired from rank 0, every process warns naming rank 1, all
end bitwise equal; always: the repair cannot fix it, every process stops naming rank 1, no loop.

usage: test_fault_tolerant.py kill|kill-options auto|socket N | vote | stop auto|socket | join auto|socket | kill-during-join |
split-at-join | split-comm-run[-stopped] COMM_RUN | refuse |
repair once|always"""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_SCRIPT = os.path.join(HERE, "ft_rank.py")
PY = "/usr/bin/python3"
FINAL = re.compile(r"^\[(\d+)\] final step (\d+) params ([0-9a-f]{64})$")
STEP = re.compile(r"^\[(\d+)\] step (\d+) ")
RECOVERED = re.compile(r"^# \[(\d+)\] recovered at step (\d+): failed \[([0-9, ]*)\].*, (redone|committed.*)$")
JOINED = re.compile(r"^# \[\d+\] joined at step (\d+), \d+ ranks, slot (\d+), state [0-9.]+ s, (\d+) bytes")
ADMITTED = re.compile(r"^# \[\d+\] admitted at step (\d+): now 4 ranks, grow [0-9.]+ s, state [0-9.]+ s, \d+ bytes")
DEADLINE_S = 150  # a watchdog: a rank that hangs fails the test instead of the meson timeout


STORES = []


def start(n, transport, args, extra_env=None):
    """n ranks of ft_rank.py meeting in a fresh file:// store (no TCP port to race other jobs for)."""
    store = tempfile.mkdtemp(prefix="ft_store_")
    STORES.append(store)
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                   COMM_TRANSPORT=transport, FT_INIT_METHOD="file://" + store,
                   COMM_TIMEOUT_MS=os.environ.get("FT_TIMEOUT_MS", "10000"), **(extra_env or {}))
        procs.append(subprocess.Popen([PY, RANK_SCRIPT] + args + ["--init-method", "file://" + store],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def collect(procs, on_line=None):
    """Every rank's lines (read in threads, so no pipe fills); kills all at DEADLINE_S."""
    lines = [[] for _ in procs]

    def reader(r):
        for line in procs[r].stdout:
            line = line.rstrip("\n")
            lines[r].append(line)
            if on_line:
                on_line(r, line)
    threads = [threading.Thread(target=reader, args=(r,), daemon=True) for r in range(len(procs))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + DEADLINE_S
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            codes.append("hung")
    for t in threads:
        t.join(timeout=10)
    return codes, lines


def check(codes, lines, survivors, steps, victim, outcome=None, joiner=None):
    bad = []
    finals = {}
    for r in survivors:
        if codes[r] != 0:
            bad.append(f"rank {r} ended with {codes[r]}")
        for line in lines[r]:
            m = FINAL.match(line)
            if m:
                finals[r] = (int(m.group(2)), m.group(3))
        recs = [RECOVERED.match(line) for line in lines[r]]
        recs = [m for m in recs if m]
        named = any(victim in [int(x) for x in m.group(3).split(",") if x.strip()] for m in recs)
        if r != joiner and not named:
            bad.append(f"rank {r} reports no recovery from rank {victim}'s failure")
        if outcome and not any(m.group(4).startswith(outcome.get(r, m.group(4))) for m in recs):
            bad.append(f"rank {r}'s recovery is not '{outcome.get(r)}'")
    missing = [r for r in survivors if r not in finals]
    if missing:
        bad.append(f"ranks {missing} printed no final line")
    if any(s != steps for s, _ in finals.values()):
        bad.append(f"committed steps differ from {steps}: {finals}")
    if len({h for _, h in finals.values()}) > 1:
        bad.append(f"the survivors' parameters differ: {finals}")
    if bad:
        for r, ls in enumerate(lines):
            print(f"---- rank {r} (exit {codes[r]}) ----")
            print("\n".join(ls[-int(os.environ.get("FT_SHOW", "60")):]))
        sys.exit("FAIL: " + "; ".join(bad))
    print(f"ok: ranks {survivors} committed {steps} steps, equal parameters {next(iter(finals.values()))[1][:16]}")


def kill_test(transport, n, extra_env=None):
    steps = 40
    victim = int(os.environ.get("FT_VICTIM", random.Random().randint(0, n - 1)))
    after = random.Random().randint(3, 12)  # the victim dies after printing this step
    print(f"# {n} ranks over {transport}: rank {victim} is SIGKILLed after its step {after}")
    procs = start(n, transport, ["--steps", str(steps), "--log-every", "1", "--step-sleep", "0.02"], extra_env)
    killed = []

    def on_line(r, line):
        m = STEP.match(line)
        if r == victim and m and int(m.group(2)) >= after and not killed:
            killed.append(line)
            os.kill(procs[victim].pid, signal.SIGKILL)
    codes, lines = collect(procs, on_line)
    if not killed:
        sys.exit(f"FAIL: rank {victim} never reached step {after}:\n" + "\n".join(lines[victim][-30:]))
    check(codes, lines, [r for r in range(n) if r != victim], steps, victim)


def stop_test(transport):
    """4 ranks; rank 2 is SIGSTOPped after its step 5 (and SIGKILLed once the others ended). The
    survivors agree on it without a timeout of their own: at least one of them suspects it at its
    check-in or while it waits (its transport's silence, on the wrapper's communicator, which carries
    no calls). Over shared memory that silence was not judged: the agreement waited out a whole
    timeout more (twice the timeout per SIGSTOP)."""
    n, victim, steps = 4, 2, 30
    procs = start(n, transport, ["--steps", str(steps), "--log-every", "1", "--step-sleep", "0.02"],
                  {"COMM_DEBUG": "INFO", "COMM_DEBUG_SUBSYS": "INIT"})
    stopped, finals = [], set()

    def on_line(r, line):
        m = STEP.match(line)
        if r == victim and m and int(m.group(2)) >= 5 and not stopped:
            stopped.append(line)
            os.kill(procs[victim].pid, signal.SIGSTOP)
        if FINAL.match(line):
            finals.add(r)
            if finals >= {r for r in range(n) if r != victim}:
                os.kill(procs[victim].pid, signal.SIGKILL)
    codes, lines = collect(procs, on_line)
    codes[victim] = 0  # SIGKILLed by this test
    if not stopped:
        sys.exit(f"FAIL: rank {victim} never reached step 5")
    suspected = [line for r in range(n) if r != victim for line in lines[r]
                 if re.search(r"comm_agree_failed(?: decides round \d+ \(its suspicions:|.*now suspects) \[[\d,]*\b2\b", line)]
    if not suspected:
        sys.exit("FAIL: no survivor suspected the stopped rank in the agreement (it waited out its timeout):\n" +
                 "\n".join(line for r in range(n) for line in lines[r] if "comm_agree_failed" in line))
    check(codes, lines, [r for r in range(n) if r != victim], steps, victim)


def vote_test():
    steps = 12
    procs = start(4, "auto", ["--steps", str(steps), "--kill-rank", "2", "--kill-step", "6"],
                  {"FT_VOTE_FAIL": "1:5"})
    codes, lines = collect(procs)
    check(codes, lines, [0, 1, 3], steps, 2, outcome={0: "redone", 1: "committed", 3: "redone"})


def join_run(transport, extra_env=None, more_args=()):
    """4 ranks, rank 2 dies at step 6, a replacement joins once a survivor recovered. Returns
    (codes, lines) of ranks 0-3 then the joiner (index 4), or exits 77 without comm_grow."""
    store = tempfile.mkdtemp(prefix="ft_store_")
    STORES.append(store)
    args = ["--steps", "20", "--until-size", "4", "--step-sleep", "0.05", "--log-every", "1", "--kill-rank", "2",
            "--kill-step", "6", "--init-method", "file://" + store] + list(more_args)
    env = dict(os.environ, WORLD_SIZE="4", COMM_TRANSPORT=transport,
               COMM_TIMEOUT_MS=os.environ.get("FT_TIMEOUT_MS", "10000"), **(extra_env or {}))
    procs = [subprocess.Popen([PY, RANK_SCRIPT] + args, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(4)]
    started, unavailable, lock = [], [], threading.Lock()

    def on_line(r, line):
        with lock:  # one reader thread per rank
            on_line_locked(r, line)

    def on_line_locked(r, line):
        if "not implemented yet" in line and "comm_grow" in line:  # the stub: nothing can join
            unavailable.append(line)
            for p in procs + started:
                p.kill()
        if RECOVERED.match(line) and not started:
            # The replacement: the job's environment plus COMM_JOIN=1 (its RANK is ignored).
            started.append(subprocess.Popen([PY, RANK_SCRIPT] + args, env=dict(env, RANK="2", COMM_JOIN="1"),
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    codes, lines = collect(procs, on_line)
    if unavailable:
        print("SKIP: comm_grow is not implemented in this build: " + unavailable[0])
        sys.exit(77)
    if not started:
        check(codes, lines, [0, 1, 3], 20, 2)  # fails: names what happened instead
    jcodes, jlines = collect(started)
    return codes + jcodes, lines + jlines


def join_test(transport):
    codes, lines = join_run(transport)
    finals = [FINAL.match(line) for ls in lines for line in ls]
    steps = {int(m.group(2)) for m in finals if m}
    check(codes, lines, [0, 1, 3, 4], steps.pop() if len(steps) == 1 else -1, 2,
          outcome=None, joiner=4)
    joined = lines[4]
    said = [m for m in map(JOINED.match, joined) if m]
    if not said:
        sys.exit("FAIL: the replacement never said it joined\n" + "\n".join(joined[-40:]))
    # What bench/chaos_train.py measures: the state it received (bytes, the slot whose data it
    # takes over) and, on every member, the grow that admitted it at the same step boundary.
    if int(said[0].group(2)) != 2 or int(said[0].group(3)) <= 0:
        sys.exit(f"FAIL: the replacement's join line names slot {said[0].group(2)}, {said[0].group(3)} bytes")
    # Its data position is the members' (on_commit advances it before the boundary): its first
    # step trains the batch of the step it joined at, not the one before.
    first = [int(m.group(2)) for m in map(STEP.match, joined) if m][:1]
    if first != [int(said[0].group(1))]:
        sys.exit(f"FAIL: the replacement joined at step {said[0].group(1)} but trained first at data position {first}")
    if any("hold other parameters or state" in line for ls in lines for line in ls):
        sys.exit("FAIL: a join needed a repair:\n" + "\n".join(line for ls in lines for line in ls if "hold other" in line))
    admitted = [m.group(1) for ls in lines[:4] for m in map(ADMITTED.match, ls) if m]
    if sorted(admitted) != [said[0].group(1)] * 3:
        sys.exit(f"FAIL: the survivors admitted the replacement at steps {admitted}, it joined at step "
                 f"{said[0].group(1)}\n" + "\n".join(line for ls in lines for line in ls if "admitted" in line))
    losses = {line.split()[-1] for ls in lines for line in ls if " final loss " in line}
    if len(losses) != 1:
        sys.exit(f"FAIL: the final held-out losses differ: {losses}")
    # ddp.slots: while slot 2 is empty, its batches go to the first member; then the replacement's.
    slots = [[line.split(" slots ", 1)[1] for line in lines[r] if " slots [" in line] for r in range(5)]
    short, whole = "[0, 1, 3], training on [0, 2]", "[0, 1, 3, 2], training on [0]"
    if short not in slots[0] or not slots[0] or not slots[0][-1].startswith("[0, 1, 3, 2]") or \
            slots[4] != ["[0, 1, 3, 2], training on [2]"] or whole not in slots[0]:
        sys.exit(f"FAIL: the members' slots (ddp.slots) were not followed: {slots}")


def repair_test(how):
    """The sha256 check after a join: rank 1's parameter and momentum buffer diverge just before it
    (ft_rank.py's FT_CORRUPT). once: every process warns naming the rank, rank 1 names what differs,
    the state is taken from rank 0 once (rank 1 keeps its own RNG states: not shared), and all end
    bitwise equal. always (the repair cannot fix
    it): every process stops with FaultToleranceError naming the rank after one repair, no loop."""
    codes, lines = join_run("socket", {"FT_CORRUPT": f"1:{how}"})
    faults = [re.match(r"^# \[1\] test fault: (.*) as rank (\d+) of 4$", line) for line in lines[1]]
    faults = [m for m in faults if m]
    bad = [] if faults else ["rank 1 never corrupted its state at the join"]
    victim = int(faults[0].group(2)) if faults else -1
    said = f"ranks [{victim}] hold other parameters or state than rank 0"
    if how == "once":
        for r in (0, 1, 3, 4):
            warned = [line for line in lines[r] if "after the join, " + said in line]
            if len(warned) != 1:
                bad.append(f"process {r} warned {len(warned)} times of the mismatch of rank {victim}, not once")
            elif r == 1 and "(here: optimizer, parameters)" not in warned[0]:
                bad.append(f"rank 1's warning does not name what differs: {warned[0]}")
        if not any("test fault: after the repair, own RNG state kept" in line for line in lines[1]):
            bad.append("rank 1's own RNG state was not kept through the repair (or never checked)")
        if not bad:
            finals = [FINAL.match(line) for ls in lines for line in ls]
            steps = {int(m.group(2)) for m in finals if m}
            check(codes, lines, [0, 1, 3, 4], steps.pop() if len(steps) == 1 else -1, 2, joiner=4)
    else:
        if len(faults) != 2:  # the join's corruption, then the repair's: one repair, no second
            bad.append(f"rank 1 was corrupted {len(faults)} times, not twice (once, then after one repair)")
        for r in (0, 1, 3, 4):
            stops = [line for line in lines[r] if said + " even after taking rank 0's" in line]
            if codes[r] in (0, "hung") or not stops:
                bad.append(f"process {r} (exit {codes[r]}) did not stop naming rank {victim}")
            if r != 4 and not any(line.startswith(f"# [{r}] stops: ") for line in lines[r]):
                bad.append(f"rank {r} did not stop with FaultToleranceError")
    if bad:
        for r, ls in enumerate(lines):
            print(f"---- process {r} (exit {codes[r]}) ----")
            print("\n".join(ls[-int(os.environ.get("FT_SHOW", "60")):]))
        sys.exit("FAIL: " + "; ".join(bad))
    print(f"ok: repair {how}: rank {victim}'s diverged state " +
          ("was taken from rank 0 once; all ranks end bitwise equal" if how == "once" else
           "still differed after one repair: every process stopped, naming it"))


def kill_during_join_test():
    """The join of join_run, but member 3 is SIGKILLed when the grow admitting the replacement has
    returned, before the first collective on the grown communicator (ft_rank.py's FT_KILL_AT_JOIN;
    chaos run 6: a member killed 0.11 s after a replacement started joining). The failure at the step
    boundary belongs to the next step: ranks 0 and 1 agree on the dead member (and the half-admitted
    replacement), shrink, redo that step and go on to --max-steps (the job never has 4 ranks again),
    with bitwise-equal parameters. The replacement may stop or be excluded: its exit is not checked."""
    codes, lines = join_run("socket", {"FT_KILL_AT_JOIN": "3"}, ["--max-steps", "30"])
    bad = []
    died = [re.match(r"^# \[3\] test fault: SIGKILL during the admission, as rank (\d+) of 4$", line) for line in lines[3]]
    died = [m for m in died if m]
    if not died:
        bad.append("rank 3 never died during an admission")
    for r in (0, 1):
        # Its second recovery, naming the rank it had in the communicator of before the grow (the
        # grown one gave the joiner the last rank, so the members kept theirs).
        recs = [m for m in map(RECOVERED.match, lines[r]) if m][1:]
        if died and not any(int(died[0].group(1)) in [int(x) for x in m.group(3).split(",") if x.strip()]
                            for m in recs):
            bad.append(f"rank {r} reports no recovery from member 3's death during the admission")
    if bad:
        for r, ls in enumerate(lines):
            print(f"---- process {r} (exit {codes[r]}) ----")
            print("\n".join(ls[-int(os.environ.get("FT_SHOW", "60")):]))
        sys.exit("FAIL: " + "; ".join(bad))
    check(codes, lines, [0, 1], 30, 2)


def split_at_join_test():
    """split-at-join (the module docstring): members 0, 1 and 3 end with the same 30 steps and
    parameters; 1 and 3, whose admission completed, say the members undid it; the replacement,
    abandoned, stops (its exit is not 0)."""
    codes, lines = join_run("socket", {"FT_SPLIT_AT_JOIN": "0"}, ["--max-steps", "30"])
    bad = []
    if not any("test fault: admission failed here after the exchange" in line for line in lines[0]):
        bad.append("member 0 never failed an admission")
    for r in (1, 3):
        if not any("the members undid this admission" in line for line in lines[r]):
            bad.append(f"member {r} never said the members undid the admission it completed")
    if len(codes) > 4 and codes[4] == 0:
        bad.append("the abandoned replacement exited 0")
    if bad:
        for r, ls in enumerate(lines):
            print(f"---- process {r} (exit {codes[r]}) ----")
            print("\n".join(ls[-int(os.environ.get("FT_SHOW", "60")):]))
        sys.exit("FAIL: " + "; ".join(bad))
    check(codes, lines, [0, 1, 3], 30, 2)


def split_under_comm_run(comm_run, stop_joiner=False):
    """split-at-join under comm-run --replace-failed: rank 2 dies at step 6, comm-run starts its
    replacement, member 0's admission of it fails after the exchange, and the members undo it and
    record its exclusion (comm_exclude, python/libcomm/fault_tolerance.py, _undo_grow): comm-run
    starts another (SIGKILLing first the abandoned one if it still runs: stop_joiner, stopped
    before the decision, never exits), which joins; the job ends on 4 ranks, equal, and comm-run
    exits 0. Without the record the stopped one held its slot until comm-run's own timeout."""
    args = ["--steps", "20", "--until-size", "4", "--step-sleep", "0.05", "--kill-rank", "2", "--kill-step", "6",
            "--max-steps", "200"]
    env = dict(os.environ, FT_SPLIT_AT_JOIN="0", COMM_TIMEOUT_MS=os.environ.get("FT_TIMEOUT_MS", "10000"))
    if stop_joiner:
        marker = os.path.join(tempfile.mkdtemp(prefix="ft-stop-joiner-"), "stopped")
        env["FT_STOP_JOINER_ONCE"] = marker
    try:
        run = subprocess.run([comm_run, "-n", "4", "--bind", "none", "--replace-failed", "--timeout-s", "150", "--",
                              PY, RANK_SCRIPT] + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=DEADLINE_S + 20)
    except subprocess.TimeoutExpired as e:
        sys.exit(f"FAIL: comm-run hung:\n{e.output}")
    out = run.stdout
    if stop_joiner:
        shutil.rmtree(os.path.dirname(marker), ignore_errors=True)
    finals = re.findall(r"\[\d+\] final step (\d+) params ([0-9a-f]{64})", out)
    bad = []
    if run.returncode != 0:
        bad.append(f"comm-run exited {run.returncode}")
    if "test fault: admission failed here after the exchange" not in out:
        bad.append("member 0 never failed an admission")
    if "rank 2 was excluded by the others" not in out.split("admission failed here after the exchange", 1)[-1]:
        bad.append("comm-run did not replace the abandoned replacement on the members' record")
    if stop_joiner and "this joiner stops itself" not in out:
        bad.append("the joiner never stopped itself")
    if stop_joiner and "rank 2 was excluded by the others but still runs (stopped?): SIGKILL" not in out:
        bad.append("comm-run did not SIGKILL the stopped joiner")
    if len(finals) != 4 or len(set(finals)) != 1:
        bad.append(f"not 4 equal final lines: {finals}")
    if bad:
        print(out[-6000:])
        sys.exit("FAIL: " + "; ".join(bad))
    print(f"ok: the abandoned replacement{' (stopped)' if stop_joiner else ''} was replaced; 4 ranks ended at "
          f"step {finals[0][0]}, equal")


def refuse_test():
    procs = start(2, "auto", [], {"FT_REFUSE": "1"})
    codes, lines = collect(procs)
    if codes != [0, 0] or sum("refusals ok" in line for ls in lines for line in ls) != 2:
        sys.exit(f"FAIL: refusals: exits {codes}\n" + "\n".join(line for ls in lines for line in ls))
    print("ok: refusals")


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "kill":
        kill_test(sys.argv[2], int(sys.argv[3]))
    elif what == "kill-options":
        kill_test(sys.argv[2], int(sys.argv[3]), {"FT_HOOK": "allreduce", "FT_DDP_KW": json.dumps(
            {"gradient_as_bucket_view": True, "static_graph": True, "find_unused_parameters": True})})
    elif what == "vote":
        vote_test()
    elif what == "stop":
        stop_test(sys.argv[2])
    elif what == "join":
        join_test(sys.argv[2])
    elif what == "kill-during-join":
        kill_during_join_test()
    elif what == "split-at-join":
        split_at_join_test()
    elif what == "split-comm-run":
        split_under_comm_run(sys.argv[2])
    elif what == "split-comm-run-stopped":
        split_under_comm_run(sys.argv[2], stop_joiner=True)
    elif what == "refuse":
        refuse_test()
    elif what == "repair":
        repair_test(sys.argv[2] if len(sys.argv) > 2 else "once")
    else:
        sys.exit(__doc__.split("usage: ")[-1])
    for store in STORES:
        shutil.rmtree(store, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
