"""Fault-tolerant steps for torch_ddp.DistributedDataParallel(..., fault_tolerant=True) (issue 35).

Each step ends with a commit vote (torchft's should_commit): a rank applies the optimizer only when
every member reduced the step. A step has three phases, each with its collectives:
F (forward: the step boundary, where replacements join, and the buffer broadcast), R (backward:
the engine's gradient all-reduce, the used-map) and V (the vote, one small all-reduce). A failed
collective does not raise into the user's forward or backward: it is recorded, the step's later
collectives are skipped (backward still runs, locally), and should_commit() recovers:

1. The survivors agree on the failed ranks (Communicator.agree_failed, comm_agree_failed: the same
   set on every survivor, learned, not told) and shrink without them; the wrapper's communicator,
   the engine (which runs on its own duplicate) and a comm hook's communicator are rebuilt on the
   shrunk one.
2. They exchange (committed steps, phase of the failure, whether this rank's reduction completed).
   A failure can fail an operation on one rank that another completed (docs/design/core.md, "Which
   calls a failure fails"), so one rank may have seen the vote pass and applied step s while
   another's vote failed. A vote passes only when every rank voted, and a rank votes only after its
   own reduction completed; so a survivor that is one step ahead proves every survivor holds step
   s's fully reduced gradients: the survivors behind commit those (no step lost), and those ahead
   redo step s+1 from the local gradients they kept (no step applied twice).
3. The others (no survivor ahead) redo the reduction from the local gradients kept since backward,
   averaged over the survivors (first the forward's collectives too, when a survivor failed there
   or one behind will run them), then vote again. A failure during the recovery starts it over on
   the communicator of that moment.

A rank the others agreed had failed (SIGSTOPped, cut off) gets FaultToleranceError and must exit:
it cannot rejoin (a launcher may start a replacement). What cannot be redone from local gradients
is refused at wrap time (torch_ddp.py): overlap_forward (the optimizer runs during the next
forward), join(), and comm hooks with state (PowerSGD's error feedback is per rank and was already
updated by the failed attempt).
"""

import os
import time
import warnings

import numpy as np
import torch

from . import errors, ft_state

F, R, V = 0, 1, 2  # the phase of a step a failure happened in
PHASE = {F: "forward", R: "gradient all-reduce", V: "commit vote"}


class FaultToleranceError(RuntimeError):
    """This rank cannot go on: the others excluded it, no majority survived, or the job store is
    gone. Exit; a launcher that replaces failed ranks (comm-run --replace-failed) starts another."""


def recoverable(error):
    """A failure of a peer or of the communicator, not a local mistake (bad arguments)."""
    return isinstance(error, errors.CommError) and not isinstance(error, errors.InvalidArgumentError)


class FaultTolerance:
    """The commit vote and the recovery of one DistributedDataParallel (see the module docstring)."""

    def __init__(self, ddp):
        self.ddp = ddp
        self.step = 0              # committed steps
        self.phase = F
        self.failure = None        # the first CommError of this step, or None
        self.failed_phase = None
        self.reduced_ok = False    # this step's reduction completed on this rank (p.grad holds it)
        self.pending_vote = False  # a synced backward ran: should_commit() comes next
        self.kept = [None] * len(ddp._params)  # this step's local gradients, until the commit
        self.steps_redone = 0
        self.recoveries = []       # one dict per recovery: step, failed, size, seconds, outcome
        self.joins = []            # one dict per grow that admitted ranks: step, size, seconds
        self.registered = {}       # name -> object with state_dict() (register_state)
        self.can_grow = True       # False once comm_grow said it cannot work here
        self.joining = False       # this process joined (COMM_JOIN=1): state still to receive
        self.skip_grow = False     # a joiner's first boundary: the members' grow admitted it
        self.at_boundary = True    # no forward since the last commit (no_sync ones included)
        # The launcher slot of this process (RANK, which a replacement inherits), and every
        # member's in rank order (`slots`, the same on every member): a training loop can give
        # the batches of the slots missing now to the members, so that the global batch stays
        # whole while the job is short-handed (examples/fault_tolerant_train.py).
        self.slot = int(os.environ.get("RANK", ddp._user_comm.rank))
        self.slots = [self.slot]
        self.connect_all()

    def connect_all(self):
        """The agreement runs on the wrapper's base communicator, which carries no data, and a
        rank learns a SIGKILLed peer's death fastest from its own connection to it closing
        (docs/design/core.md, "Agreeing on the failed ranks"); the socket transport connects a pair on
        first use (transports/socket/mesh.h), so one tiny all-to-all connects every pair now.
        Without it the decider waits COMM_TIMEOUT_MS for a dead rank on another host. It carries
        each member's slot: every membership change (wrap, recovery, admission) runs it."""
        comm = self.ddp._user_comm
        if comm.size > 1:
            got = comm.alltoall(np.full(comm.size, self.slot, np.int32))
            self.slots = [int(x) for x in got]
        else:
            self.slots = [self.slot]

    # ---- the normal step: collectives guarded, local gradients kept ----
    def guard(self, fn, *args):
        """fn(*args) unless this step already failed; a failure is recorded, not raised."""
        if self.failure is not None:
            return None
        try:
            return fn(*args)
        except errors.CommError as e:
            if not recoverable(e):
                raise
            self._fail(e)
            return None

    def _fail(self, error):
        if self.failure is None:
            self.failure, self.failed_phase = error, self.phase

    def keep(self, i, grad):
        """Before grad_ready: the engine writes the reduced value over grad."""
        k = self.kept[i]
        if k is None or k.shape != grad.shape or k.dtype != grad.dtype:
            self.kept[i] = k = torch.empty_like(grad, memory_format=torch.contiguous_format)
        with torch.no_grad():
            k.copy_(grad)

    def before_forward(self):
        if self.pending_vote:
            raise RuntimeError(self._where() + "a synced backward ran and this step was not "
                               "committed: call ddp.should_commit() (then optimizer.step()) or "
                               "ddp.step(optimizer) after each synced backward")
        if self.joining:
            self.receive_state()
        self.phase = F
        at_boundary, self.at_boundary = self.at_boundary, False
        self.guard(self.forward_collectives, at_boundary)

    def begin_backward(self, sync):
        if self.pending_vote:
            raise RuntimeError(self._where() + "backward again before this step was committed: "
                               "call ddp.should_commit() or ddp.step(optimizer) after each synced "
                               "backward (gradient accumulation: no_sync())")
        if sync:
            self.phase, self.reduced_ok = R, False
        self.guard(lambda: self.ddp.engine.begin(sync))

    def end_backward(self, sync):
        if sync:
            self.pending_vote = True
            if self.failure is None:
                self.reduced_ok = True

    # ---- the vote ----
    def should_commit(self):
        """True once this step's averaged gradients are in every p.grad, on every survivor alike
        (after a recovery if a rank failed); then apply the optimizer. Raises FaultToleranceError
        when this rank must stop."""
        if not self.pending_vote:
            raise RuntimeError(self._where() + "should_commit() without a synced backward since "
                               "the last commit")
        self.phase = V
        if self.failure is None:
            vote = np.array([self.step, -self.step], np.int32)
            self.guard(self.ddp._comm.allreduce, vote, None, "min")
            if self.failure is None:
                if vote[0] != self.step or -vote[1] != self.step:
                    raise FaultToleranceError(
                        self._where() + f"the ranks vote on different steps ({vote[0]} to "
                        f"{-vote[1]}): every rank must call should_commit() once per synced step")
                return self._commit()
        return self._recover()

    def _commit(self):
        self.step += 1
        self.pending_vote = False
        self.failure = self.failed_phase = None
        self.phase = F
        self.at_boundary = True
        return True

    # ---- recovery ----
    def _recover(self):
        start = time.monotonic()
        # "started": the monotonic clock (one per machine) at the first look at the failure, so
        # that a driver that knows when it killed a rank can tell the detection time.
        record = {"step": self.step, "failed": [], "phase": PHASE[self.failed_phase], "started": start,
                  "error": str(self.failure).splitlines()[0][:300]}
        self.recoveries.append(record)
        idle_rounds = 0  # rounds in a row in which the agreement found no failed rank
        while True:
            failed = self._agree_and_shrink(record)
            record["failed"] += [f for f in failed if f not in record["failed"]]
            idle_rounds = 0 if failed else idle_rounds + 1
            if idle_rounds > 3:
                # Not a lost rank: the step itself fails on every communicator (a bug, a peer
                # that reports a mismatch): going round again would never end.
                raise FaultToleranceError(self._where() + "the step failed 4 times in a row with no "
                                          f"rank failed; the last error: {self.failure}")
            try:
                return self._realign(record, start)
            except errors.CommError as e:
                if not recoverable(e):
                    raise
                self.failure = e  # another failure during the recovery: agree again
                if self.failed_phase is None or self.phase < self.failed_phase:
                    self.failed_phase = self.phase

    def _agree_and_shrink(self, record):
        """Adds each part's seconds to record["parts"] (agree, teardown, shrink)."""
        ddp = self.ddp
        old = ddp._user_comm
        parts = record.setdefault("parts", {})
        t = time.monotonic()

        def lap(name):
            nonlocal t
            now = time.monotonic()
            parts[name] = parts.get(name, 0.0) + now - t
            t = now
        # First the wrapper's communicator goes (aborted, then destroyed: its sockets close, with
        # no goodbye): a peer that completed what failed here (docs/design/core.md, "Which calls a
        # failure fails") may wait in the vote for this rank, which will not come; the close fails
        # it now instead of at its timeout, and the agreement needs it. The engine stays until
        # after the agreement: its graceful destroy would say goodbye to peers still in its step.
        if ddp._comm is not None:
            for end in (ddp._comm.abort, ddp._comm.destroy):
                try:
                    end()
                except errors.CommError:
                    pass
            ddp._comm = None
        for attempt in range(3):
            failed = self._agree(old)
            lap("agree")
            self._teardown()
            lap("teardown")
            try:
                new = old.shrink(failed)
                break
            except errors.CommError as e:
                # Another rank failed during the shrink (it did not join it): the survivors all
                # fail it alike and agree again on this communicator, which a failed shrink
                # leaves as it was (libcomm/src/shrink.cc marks it shrunk only on success).
                lap("shrink")
                if attempt == 2:
                    raise FaultToleranceError(
                        self._where() + f"shrinking without ranks {failed} failed 3 times (ranks "
                        f"failing during each shrink, or survivors that disagree): {e}") from e
        try:
            old.abort()  # it failed: its destroy must not wait for goodbyes from the dead
            old.destroy()
        except errors.CommError:
            pass  # it can only be destroyed; a failed goodbye changes nothing
        ddp._user_comm, ddp._owns_comm = new, True
        lap("shrink")
        return failed

    def _agree(self, old, flag=None):
        """old.agree_failed(); with a flag, old.agree(flag): (the AND of the flags, the failed)."""
        try:
            return old.agree_failed() if flag is None else old.agree(flag)
        except errors.RemoteError as e:
            if "not a majority" in str(e):  # agree.cc's NOQUORUM verdict
                raise FaultToleranceError(
                    self._where() + "fewer than a majority of the ranks joined the agreement, so this "
                    f"side stops (two sides of a split job never both go on). {e}") from e
            raise FaultToleranceError(
                self._where() + "the other ranks agreed that this rank failed (it was stopped, cut "
                "off or too slow) and went on without it; it cannot rejoin: exit (comm-run "
                f"--replace-failed starts a replacement). {e}") from e
        except errors.UnavailableError as e:
            raise FaultToleranceError(
                self._where() + "the job store does not answer, so the survivors cannot agree (it "
                "dies with world rank 0 unless the launcher serves it: comm-run --replace-failed, "
                f"or init_method file://). {e}") from e
        except errors.CommError as e:
            raise FaultToleranceError(self._where() + f"agreeing on the failed ranks failed: {e}") from e

    def _teardown(self, abort=True):
        """The engine and the wrapper's duplicates of the communicator go (abort: it failed);
        the gradients stay (bucket views are copied out first)."""
        ddp = self.ddp
        if ddp.gradient_as_bucket_view:
            for i, p in enumerate(ddp._params):
                if p.grad is not None:
                    p.grad = p.grad.detach().clone()
            ddp._views = [None] * len(ddp._params)
        engine, ddp.engine = ddp.engine, None
        for comm in (ddp._comm, ddp._hook_comm) if abort else ():
            if comm is not None:
                try:
                    comm.abort()  # so its destroy does not wait for peers that are gone
                except errors.CommError:
                    pass
        if engine is not None:
            try:
                engine.destroy()
            except errors.CommError:
                pass  # a broken engine reports its failure again; it is gone either way
        for comm in (ddp._comm, ddp._hook_comm):
            if comm is not None:
                try:
                    comm.destroy()
                except errors.CommError:
                    pass
        ddp._comm = ddp._hook_comm = None

    def _realign(self, record, start):
        """Steps 2 and 3 of the module docstring, on the shrunk communicator."""
        ddp = self.ddp
        mine = np.array([self.step, self.failed_phase, int(self.reduced_ok)], np.int32)
        table = ddp._user_comm.allgather(mine).reshape(-1, 3)
        self.connect_all()
        ddp._comm = ddp._user_comm.dup()
        if ddp._comm_hook is not None:
            ddp._hook_comm = ddp._user_comm.dup()
        ddp._make_engine(ddp._reduce_hook)
        record["size"] = ddp._user_comm.size
        rebuilt = time.monotonic()
        steps = table[:, 0]
        ahead = int(steps.max())
        if ahead - int(steps.min()) > 1 or self.step < ahead - 1:
            raise FaultToleranceError(self._where() + f"the survivors are at steps {steps.tolist()}, "
                                      "more than one apart: they did not commit alike")
        if self.step < ahead:
            # A survivor committed this step, so every survivor's reduction completed: commit it.
            if not (self.failed_phase == V and self.reduced_ok):
                raise FaultToleranceError(self._where() + "a survivor committed this step but this "
                                          "rank's reduction of it did not complete")
            record.update(seconds=time.monotonic() - start, outcome="committed (a survivor had)")
            return self._commit()
        at_front = table[steps == ahead]
        if (steps < ahead).any() or (at_front[:, 1] == F).any():
            self.phase = F
            self.forward_collectives()
        self._redo_reduction()
        self.phase = V
        vote = np.array([self.step, -self.step], np.int32)
        ddp._comm.allreduce(vote, op="min")
        record["parts"]["redo"] = time.monotonic() - rebuilt
        record.update(seconds=time.monotonic() - start, outcome="redone")
        return self._commit()

    def _redo_reduction(self):
        """The step's engine sequence again, from the kept local gradients."""
        ddp = self.ddp
        self.phase, self.reduced_ok = R, False
        engine = ddp.engine
        engine.begin(True)
        for i, p in enumerate(ddp._params):
            kept = self.kept[i]
            if kept is None:
                raise FaultToleranceError(self._where() + f"parameter {i} has no gradient kept from "
                                          "this step's backward (was it reported?)")
            with torch.no_grad():
                if p.grad is None:
                    p.grad = kept.clone()
                else:
                    p.grad.copy_(kept)
            engine.grad_ready(i, p.grad.data_ptr() if p.numel() else None)
        if ddp.find_unused_parameters:
            used = ddp._ready.copy()
            ddp._comm.allreduce(used, op="max")
            ddp.unused_parameters = [int(i) for i in np.flatnonzero(used == 0)]
        engine.end()
        if ddp.gradient_as_bucket_view and ddp.static_graph:
            ddp._refresh_views()
        self.reduced_ok = True
        self.steps_redone += 1

    # ---- joining (comm_grow) ----
    def forward_collectives(self, at_boundary=True):
        """Phase F: at the step boundary (the first forward after a commit) the ranks waiting to
        join are admitted, then the buffer broadcast. Also redone in a recovery (at_boundary: the
        survivors behind, who just committed, run it at theirs)."""
        if self.skip_grow:
            self.skip_grow = False
        elif self.can_grow and at_boundary:
            self._grow()
        self.ddp._forward_collectives()

    def _grow(self):
        ddp = self.ddp
        asked = time.monotonic()
        try:
            new = ddp._user_comm.grow(None)  # COMM_GROW_WAITING: the same answer on every member
        except errors.UnavailableError as e:
            self.can_grow = False
            warnings.warn(self._where() + f"no rank can join this job (comm_grow: {e}); it goes on "
                          "with the ranks it has", RuntimeWarning)
            return
        except errors.CommError as e:
            if not recoverable(e):
                raise
            # A failed comm_grow changes nothing (a joiner that died during its admission:
            # libcomm/src/setup_watch.h); the members all fail it alike. It is no failure of the
            # step: taken for one, four in a row (a launcher's replacements dying one after
            # another) stopped the job. A member lost meanwhile fails the next step instead.
            warnings.warn(self._where() + f"admitting a joiner failed; the job goes on with the ranks "
                          f"it has and admits at a later step (comm_grow: {str(e).splitlines()[0]})",
                          RuntimeWarning)
            return
        if new is None:
            return
        start = time.monotonic()
        self._teardown(abort=False)
        old, owned, old_slots = ddp._user_comm, ddp._owns_comm, self.slots
        ddp._user_comm, ddp._owns_comm = new, True
        failure = None
        try:
            self._as_at_wrap()
            repaired, sent = self._exchange_state()
        except errors.CommError as e:
            if not recoverable(e):
                raise
            failure = e
        # A failure during the admission (a member or a joiner died) can fail it on some members
        # and not on others (docs/design/core.md, "Which calls a failure fails"): in chaos run 5 a
        # member died during the exchange, rank 0 undid the admission, ranks 1 and 3 went on with
        # the grown communicator, and neither side held a majority. So the members take one
        # decision, on the communicator of before (members only: a joiner's death cannot take the
        # majority away): the admission stands only when every live member completed it and no
        # member failed. Else every member undoes it, and the failure, the next step's, is
        # recovered from on the communicator of before. A joiner whose admission is undone fails
        # its next collective and stops (it could not hold a majority alone); the members record
        # its exclusion (_undo_grow), so the launcher kills it if it still runs (stopped meanwhile,
        # it would hold its slot forever) and starts another (tools/comm-run/launcher.cc).
        completed, failed = self._agree(old, flag=int(failure is None))
        if completed != 1 or failed:
            self._undo_grow(old, owned, new)
            self.slots = old_slots
            if failure is None:
                failure = errors.RemoteError(
                    self._where() + "the members undid this admission: " +
                    (f"members {failed} of the communicator before it failed" if failed else
                     "another member's failed") + " (it completed here)", errors.REMOTE)
            raise failure
        try:
            old.destroy()
        except errors.CommError:
            pass
        # seconds: from the grow's return (the state transfer); grow: the comm_grow call itself.
        self.joins.append({"step": self.step, "size": new.size, "seconds": time.monotonic() - start,
                           "grow": start - asked, "bytes": sent, "repaired": repaired})
        # The decision, to the joiners (receive_state waits for it): an undone admission aborts
        # what was made on the grown communicator instead, which ends their wait at once. A
        # failure here is the next step's, recovered from on the grown communicator.
        ddp._comm.broadcast(np.ones(1, np.int32), root=0)

    def _undo_grow(self, old, owned, new):
        """Back to the communicator of before a grow whose admission failed; the grown one and
        what was made on it go (aborted: its peers may be dead). A grow in the recovery's redone
        forward may admit a replacement again."""
        ddp = self.ddp
        self._teardown()  # the engine and duplicates made on the grown communicator, if any
        try:
            new.exclude(range(old.size, new.size))  # the joiners (comm_exclude): every member names them
        except errors.CommError as e:  # the launcher's wait (restart_unadmitted) is then the fallback
            warnings.warn(self._where() + f"could not record the undone joiners for the launcher: {e}",
                          RuntimeWarning)
        for end in (new.abort, new.destroy):
            try:
                end()
            except errors.CommError:
                pass
        ddp._user_comm, ddp._owns_comm = old, owned

    def _as_at_wrap(self):
        """The collectives a joiner's DistributedDataParallel(...) and register_comm_hook make."""
        ddp = self.ddp
        ddp._comm = ddp._user_comm.dup()
        ddp._broadcast_state()
        ddp._make_engine(None)
        self.connect_all()  # where the joiner's FaultTolerance() does it
        if ddp._comm_hook is not None:
            ddp._hook_comm = ddp._user_comm.dup()
            if ddp.gradient_as_bucket_view:
                for p in ddp._params:
                    if p.grad is not None:
                        p.grad = p.grad.detach().clone()
                ddp._views = [None] * len(ddp._params)
            engine, ddp.engine = ddp.engine, None
            engine.destroy()
            ddp._make_engine(ddp._reduce_hook)

    def register(self, objects):
        for name, obj in objects.items():
            if obj is not None:
                ft_state._state_of(obj)  # refuses what has no state now, not at the first join
                self.registered[name] = obj
        if self.joining:
            self.receive_state()

    def receive_state(self):
        """A joiner's side of _grow, after its wrap (and register_comm_hook): the shared state."""
        self.joining = False
        self.skip_grow = True
        start = time.monotonic()
        try:
            repaired, got = self._exchange_state()
            # The members' decision on this admission (_grow): 1 when it stands; when they undo it
            # they abort the communicators made for it, and this wait fails (without it this
            # process trained on alone until its timeout, and its slot stayed empty meanwhile).
            decided = np.zeros(1, np.int32)
            self.ddp._comm.broadcast(decided, root=0)
        except errors.CommError as e:
            raise FaultToleranceError(self._where() + f"joining failed while receiving the state: {e}") from e
        self.joins.append({"step": self.step, "size": self.ddp._user_comm.size,
                           "seconds": time.monotonic() - start, "joined": True, "bytes": got,
                           "repaired": repaired})

    def boundary(self):
        """ddp.step()'s end, after the optimizer: the step boundary, where joiners are admitted (so
        that a loop's condition after it sees the grown job on every rank alike, the joiner's too).
        Without ddp.step() it comes at the next training forward. A failure is the next step's."""
        if self.at_boundary:
            self.at_boundary = False
            if self.skip_grow:
                self.skip_grow = False
            elif self.can_grow:
                self.guard(self._grow)

    def _exchange_state(self):
        """Rank 0's step, registered state and RNG states to every rank (a joiner takes them),
        then every rank's sha256 of the shared part: a rank that differs from rank 0 is repaired
        from it once (a warning on every rank names it, and what differs); one that still differs
        stops every rank (FaultToleranceError). Returns the ranks repaired and the bytes of rank 0's
        blob."""
        comm = self.ddp._comm
        joined = self.skip_grow  # set by receive_state on the joiner
        raw = ft_state.broadcast_blob(comm, ft_state.pack(self.step, self.registered) if comm.rank == 0 else None)
        if joined:
            self.step = ft_state.unpack(raw, self.registered, self._where())
        repaired = []
        for attempt in (0, 1):
            mine, parts = ft_state.digest(self.ddp, self.step, self.registered)
            table = ft_state.gather_digests(comm, mine)
            differ = [r for r in range(comm.size) if not np.array_equal(table[r], table[0])]
            if not differ:
                return repaired, len(raw)
            # Every rank saw the same table, so all take this branch: rank 0's part digests to all,
            # and each rank that differs says which of its parts do.
            theirs = ft_state.broadcast_parts(comm, parts)
            mine_differ = sorted(name for name in parts if parts[name] != theirs.get(name))
            here = f" (here: {', '.join(mine_differ)})" if mine_differ else ""
            if attempt == 1:
                raise FaultToleranceError(
                    self._where() + f"ranks {differ} hold other parameters or state than rank 0 even "
                    f"after taking rank 0's{here}: do all ranks register_state() the same objects, "
                    "with the same model and optimizer?")
            warnings.warn(self._where() + f"after the join, ranks {differ} hold other parameters or "
                          f"state than rank 0{here}: every rank takes rank 0's again", RuntimeWarning)
            repaired = differ
            self.ddp._broadcast_state()  # the repair: everything from rank 0 again
            if comm.rank in differ and comm.rank != 0:
                # A member keeps its own RNG states: they are not shared state (not hashed), and
                # rank 0's would make it draw what rank 0 draws (dropout masks, sampled batches).
                self.step = ft_state.unpack(raw, self.registered, self._where(), rng=joined)

    def _where(self):
        comm = self.ddp._user_comm
        rank = "?" if comm is None or comm._handle is None else comm.rank
        return f"libcomm DDP (fault_tolerant), rank {rank}, step {self.step}: "
