"""One rank of test_fault_tolerant.py: examples/fault_tolerant_train.py, with two test-only faults.

FT_VOTE_FAIL=R:S: on the rank that starts as R, step S's commit vote completes and then raises
RemoteError, as a failure's report can fail on one rank an operation the others completed
(docs/design/core.md, "Which calls a failure fails"): the others commit step S and go on, this rank
must commit it too, not redo it. FT_DDP_KW='{"gradient_as_bucket_view": true, ...}': the wrapper's
options; FT_HOOK=allreduce: with libcomm.comm_hooks.allreduce_hook registered. FT_REFUSE=1: the
refusals of fault_tolerant=True instead. FT_CORRUPT=R:once|always: on the member that starts as R,
when a joiner is admitted, one parameter and one momentum buffer change after the parameters were
sent again as at wrap time (what the sha256 check is for: a replica that diverged); `always`: also
after the repair's broadcast, so the repair cannot fix it. FT_KILL_AT_JOIN=R: the member that starts
as R SIGKILLs itself when a grow admitting a joiner has returned, before the first collective on the
grown communicator (a member lost during the admission at the step boundary). FT_SPLIT_AT_JOIN=R:
the member that starts as R fails its admission after it completed the state exchange (as a member
whose exchange's last message a death overtook, while the others completed theirs: chaos run 5).
FT_STOP_JOINER_ONCE=PATH: the first joiner (the one that finds no PATH, and creates it) SIGSTOPs
itself after its state exchange, before the members' decision (a joiner stopped while its admission
is undone, which never exits: only an exclusion record frees its slot)."""

import json
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import libcomm  # noqa: E402
from libcomm import errors  # noqa: E402
from libcomm.fault_tolerance import FaultTolerance  # noqa: E402


def fail_vote(rank, step):
    original = FaultTolerance.should_commit

    def should_commit(self):
        comm = self.ddp._comm
        if self.step == step and int(os.environ["RANK"]) == rank and comm.size == int(os.environ["WORLD_SIZE"]):
            real = comm.allreduce

            def allreduce(*args, **kwargs):
                real(*args, **kwargs)
                del comm.allreduce
                raise errors.RemoteError(f"rank {comm.rank}: test fault: the vote of step {step} "
                                         "completed, reported as failed", errors.REMOTE)
            comm.allreduce = allreduce
        return original(self)
    FaultTolerance.should_commit = should_commit


def corrupt_at_join(rank, how):
    """FT_CORRUPT: the state of this member diverges just before the hash check of a join."""
    import torch
    if int(os.environ["RANK"]) != rank or os.environ.get("COMM_JOIN") == "1":
        return
    original = FaultTolerance._as_at_wrap

    def perturb(ddp, what):
        with torch.no_grad():
            p = ddp._params[0]
            p.view(-1)[0] += 1.0
        print(f"# [{rank}] test fault: {what} as rank {ddp._user_comm.rank} of {ddp._user_comm.size}", flush=True)

    def as_at_wrap(self):
        original(self)
        ddp = self.ddp
        torch.manual_seed(1000 + rank)  # its own RNG states: the repair must leave them (not shared)
        rng_before.append(torch.get_rng_state().clone())
        perturb(ddp, "parameter 0 changed after the join's broadcast")
        opt = self.registered["optimizer"]
        with torch.no_grad():
            for state in opt.state.values():  # SGD's momentum buffers: not sent to members
                state["momentum_buffer"].view(-1)[0] += 1.0
                break
        if how == "always":
            broadcast = ddp._broadcast_state

            def broadcast_then_perturb():
                broadcast()
                perturb(ddp, "parameter 0 changed after the repair's broadcast")
            ddp._broadcast_state = broadcast_then_perturb
    exchange = FaultTolerance._exchange_state

    def exchange_state(self):
        repaired = exchange(self)
        if rng_before:
            kept = torch.equal(torch.get_rng_state(), rng_before.pop())
            print(f"# [{rank}] test fault: after the repair, {'own RNG state kept' if kept else 'RNG state replaced'}",
                  flush=True)
        return repaired
    rng_before = []
    FaultTolerance._as_at_wrap = as_at_wrap
    FaultTolerance._exchange_state = exchange_state


def kill_at_join(rank):
    """FT_KILL_AT_JOIN: this member dies after the grow decided, before the joiner is wrapped."""
    import signal
    if int(os.environ["RANK"]) != rank or os.environ.get("COMM_JOIN") == "1":
        return
    original = FaultTolerance._as_at_wrap

    def as_at_wrap(self):
        print(f"# [{rank}] test fault: SIGKILL during the admission, as rank {self.ddp._user_comm.rank} "
              f"of {self.ddp._user_comm.size}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        original(self)
    FaultTolerance._as_at_wrap = as_at_wrap


def split_at_join(rank):
    """FT_SPLIT_AT_JOIN: this member's admission fails after its state exchange completed."""
    if int(os.environ["RANK"]) != rank or os.environ.get("COMM_JOIN") == "1":
        return
    original = FaultTolerance._exchange_state

    def exchange_state(self):
        out = original(self)
        if not self.skip_grow and not getattr(self, "_split_done", False):  # a member's, once
            self._split_done = True
            print(f"# [{rank}] test fault: admission failed here after the exchange, as rank "
                  f"{self.ddp._user_comm.rank} of {self.ddp._user_comm.size}", flush=True)
            raise errors.RemoteError("test fault: this member's admission failed after its exchange",
                                     errors.REMOTE)
        return out
    FaultTolerance._exchange_state = exchange_state


def stop_joiner_once(path):
    """FT_STOP_JOINER_ONCE: the first joiner stops itself before the members' decision."""
    if os.environ.get("COMM_JOIN") != "1":
        return
    original = FaultTolerance._exchange_state

    def exchange_state(self):
        out = original(self)
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return out
        print(f"# [{os.environ['RANK']}] test fault: this joiner stops itself (SIGSTOP) before the decision",
              flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        return out
    FaultTolerance._exchange_state = exchange_state


def refusals():
    import torch
    from libcomm.comm_hooks import PowerSGDState, allreduce_hook, powerSGD_hook
    from libcomm.torch_ddp import DistributedDataParallel

    def expect(fn, text):
        try:
            fn()
        except ValueError as e:
            assert text in str(e), f"{e!r} lacks {text!r}"
            return
        raise AssertionError(f"no ValueError with {text!r}")

    comm = libcomm.Communicator(init_method=os.environ.get("FT_INIT_METHOD"))
    model = torch.nn.Linear(8, 8)
    expect(lambda: DistributedDataParallel(model, comm, fault_tolerant=True, overlap_forward=True),
           "cannot keep overlap_forward=True")
    ddp = DistributedDataParallel(model, comm, fault_tolerant=True)
    expect(lambda: ddp.register_comm_hook(PowerSGDState(), powerSGD_hook), "PowerSGD")
    expect(lambda: ddp.join().__enter__(), "fault_tolerant=True")
    ddp.register_comm_hook(None, allreduce_hook)  # stateless: accepted
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        ddp(torch.ones(4, 8)).sum().backward()
        assert ddp.step(opt)
    try:
        ddp(torch.ones(4, 8)).sum().backward()
        ddp(torch.ones(4, 8))  # no commit in between
    except RuntimeError as e:
        assert "should_commit" in str(e), e
    else:
        raise AssertionError("a forward after an uncommitted step was not refused")
    plain = DistributedDataParallel(torch.nn.Linear(8, 8), comm)
    expect(plain.should_commit, "fault_tolerant=True")
    print(f"[{comm.rank}] refusals ok", flush=True)
    return 0


if __name__ == "__main__":
    if os.environ.get("FT_REFUSE") == "1":  # (its --init-method is FT_INIT_METHOD's)
        sys.exit(refusals())
    if os.environ.get("FT_VOTE_FAIL"):
        r, s = os.environ["FT_VOTE_FAIL"].split(":")
        fail_vote(int(r), int(s))
    if os.environ.get("FT_CORRUPT"):
        r, how = os.environ["FT_CORRUPT"].split(":")
        corrupt_at_join(int(r), how)
    if os.environ.get("FT_KILL_AT_JOIN"):
        kill_at_join(int(os.environ["FT_KILL_AT_JOIN"]))
    if os.environ.get("FT_SPLIT_AT_JOIN"):
        split_at_join(int(os.environ["FT_SPLIT_AT_JOIN"]))
    if os.environ.get("FT_STOP_JOINER_ONCE"):
        stop_joiner_once(os.environ["FT_STOP_JOINER_ONCE"])
    if os.environ.get("FT_DDP_KW") or os.environ.get("FT_HOOK"):
        from libcomm import comm_hooks, torch_ddp
        plain, kw = torch_ddp.DistributedDataParallel, json.loads(os.environ.get("FT_DDP_KW") or "{}")

        def wrap(*args, **kwargs):
            ddp = plain(*args, **dict(kwargs, **kw))
            if os.environ.get("FT_HOOK") == "allreduce":
                ddp.register_comm_hook(None, comm_hooks.allreduce_hook)
            return ddp
        torch_ddp.DistributedDataParallel = wrap
    import fault_tolerant_train
    sys.exit(fault_tolerant_train.main())
