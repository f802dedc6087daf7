"""The slot-by-slot loop the baseline schedulers share (paper section V-A, (i)-(iv)).

Rules shared with OASiS (SPEC 1, 3): a job runs only in slots ``a .. T-1``, with at most
``N`` workers and exactly ``z(y)`` PS in a slot of ``y`` workers; no server resource is
ever over-allocated; a job completes in the slot its worker-slots reach ``W``, and
``jct = t_end - a + 1``.

The baselines re-plan on events, so they are simulated: at each slot boundary, jobs that
arrive in the slot are handed to the policy, which decides (on an event only) admission
and the allocation of every unfinished job for this slot and those after, until the next
event. An event is a slot in which a job arrives, or one after a job completed or was
dropped. Between events every allocation stays as it is, placement included.

Choices the paper leaves open, each the reading most favourable to the baselines:

- In its last slot a job runs only the workers its remaining work needs (and their
  ``z``), so it never runs more than ``W`` worker-slots; the rest are released.
- A job that can no longer finish by ``T-1``, even at its most workers (``limit``)
  in every slot left, is dropped: its resources are released (an event), and it is
  reported admitted with ``jct`` null and utility 0 -- what it would earn anyway, without
  holding resources other jobs can use. Arrivals the policy admits are checked at once.
- A job of which not one worker with its PS fits on the empty cluster (``y_max = 0``) is
  never handed to the policy: it is rejected, as one arriving at or after ``T`` is
  (SPEC 6; the daemon refuses such a job).
- Pausing and resuming a job, and moving its workers between servers, cost nothing.

Units: time in slots, work in worker-slots, capacities and demands in each resource's
unit; every allocation is a count of workers or PS per server.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from pricing.cluster import Cluster
from pricing.errors import OasisError
from pricing.job import ROUNDING, Job, max_workers_per_slot, room
from pricing.ledger import Ledger, capacity_slack
from pricing.schedule import Schedule
from pricing.trace import Trace

__all__ = [
    "Outcome",
    "Policy",
    "PolicyError",
    "Pool",
    "Simulator",
    "Status",
    "Task",
    "max_parallel",
    "ps_for",
    "simulate",
]

I64 = NDArray[np.int64]
F64 = NDArray[np.float64]


class PolicyError(OasisError):
    """A policy broke a shared rule (a bug in the policy, never bad input)."""


def ps_for(job: Job, y: int) -> int:
    """``z(y)``, as :meth:`Job.ps_needed` computes it, for one count (no array)."""
    return math.ceil(y * job.ps_ratio - ROUNDING)


def max_parallel(job: Job, cluster: Cluster) -> int:
    """The most workers ``job`` can run in one slot on the empty cluster: at most ``N``,
    at most the workers that fit, and with their ``z(y)`` PS fitting (SPEC 3, 5)."""
    return max_workers_per_slot(job, cluster)


class Pool:
    """Free capacity of one kind of server, and where round-robin placement goes next.

    Attributes:
        capacity: ``(n, R)`` float64, per server and resource.
        free: ``(n, R)`` float64, capacity not allocated in the current slot.
        pointer: the server the next round-robin placement starts from.
    """

    def __init__(self, capacity: F64) -> None:
        self.capacity = capacity
        self.free = capacity.copy()
        self.pointer = 0

    def room(self, demand: F64) -> I64:
        """``(n,)`` units of ``demand`` each server can take now."""
        return room(self.free, demand)

    def fits(self, counts: I64, demand: F64) -> bool:
        """Whether ``counts[n]`` units of ``demand`` fit in the free capacity."""
        need = counts[:, None] * demand[None, :]
        return bool((need <= self.free + capacity_slack(self.capacity)).all())

    def take(self, counts: I64, demand: F64) -> None:
        """Allocate ``counts[n]`` units of ``demand``; PolicyError if they do not fit."""
        if not self.fits(counts, demand):
            raise PolicyError("allocation exceeds a server's free capacity")
        self.free -= counts[:, None] * demand[None, :]

    def give(self, counts: I64, demand: F64) -> None:
        """Release ``counts[n]`` units of ``demand``."""
        self.free = np.minimum(self.free + counts[:, None] * demand[None, :], self.capacity)

    def round_robin(self, demand: F64, count: int) -> I64 | None:
        """Place ``count`` units one per server in turn, from ``pointer`` on, skipping
        servers without room (the paper's round-robin). Takes them and moves the pointer
        past the last server used; None (nothing taken) if they do not all fit."""
        rooms = self.room(demand)
        n = rooms.size
        if count <= 0:
            return np.zeros(n, dtype=np.int64)
        if int(rooms.sum()) < count:
            return None
        # pass k (1-based) puts one unit on every server with room >= k, in turn; the
        # count ends within pass k, the first that reaches it (so at least one unit of
        # pass k is placed, and the pointer moves past the server that took the last)
        order = (self.pointer + np.arange(n)) % n
        ordered = rooms[order]
        k = 1
        while int(np.minimum(ordered, k).sum()) < count:
            k += 1
        placed = np.minimum(ordered, k - 1)
        last_pass = np.flatnonzero(ordered >= k)[: count - int(placed.sum())]
        placed[last_pass] += 1
        counts = np.zeros(n, dtype=np.int64)
        counts[order] = placed
        self.pointer = int((order[last_pass[-1]] + 1) % n)
        self.take(counts, demand)
        return counts


class Status(Enum):
    """Where a job stands in the simulation."""

    PENDING = "pending"
    """Not arrived yet, or arrived and not yet decided."""
    ACTIVE = "active"
    """Admitted and unfinished: running (some workers) or waiting/paused (none)."""
    REJECTED = "rejected"
    DONE = "done"
    DROPPED = "dropped"
    """Admitted, but could no longer finish by the horizon."""


@dataclass(eq=False)
class Task:
    """A job as the simulation tracks it.

    Attributes:
        job: the job.
        order: its index in the trace (the tie-breaker of every policy).
        y_max: most workers per slot on the empty cluster (:func:`max_parallel`).
        limit: most workers per slot the policy will ever give it (``<= y_max``);
            sets when it is hopeless.
        remaining: work left, worker-slots.
        status: see :class:`Status`.
        workers: ``(H,)`` int64, workers per worker server from this slot on.
        ps: ``(K,)`` int64, PS per PS server.
        rows: per slot that ran, ``(slot, workers, ps)``.
        end: the slot it completed in.
        worker_share, ps_share: the largest fraction of the cluster's total capacity
            of one resource that one worker (one PS) takes.
        decision_ms: wall time of the re-plan at its arrival, milliseconds.
        reason: why the policy rejected it ("" otherwise).
    """

    job: Job
    order: int
    y_max: int
    limit: int
    remaining: int
    workers: I64
    ps: I64
    worker_share: float
    ps_share: float
    status: Status = Status.PENDING
    rows: list[tuple[int, I64, I64]] = field(default_factory=list)
    end: int | None = None
    decision_ms: float = 0.0
    reason: str = ""

    @property
    def y(self) -> int:
        """Workers it holds now."""
        return int(self.workers.sum())

    @property
    def z(self) -> int:
        """PS it holds now."""
        return int(self.ps.sum())

    @property
    def cap(self) -> int:
        """Most workers worth giving it now: ``min(limit, remaining)``."""
        return min(self.limit, self.remaining)


class Policy(Protocol):
    """A baseline scheduler: decides on every event."""

    def replan(self, sim: Simulator) -> None:
        """Admit or reject each of ``sim.arrivals`` and set the allocation of every
        active task for ``sim.slot`` on (through the simulator's methods)."""
        ...


@dataclass(frozen=True, eq=False)
class Outcome:
    """What happened to one job.

    Attributes:
        job: the job.
        admitted: whether the policy admitted it.
        schedule: the workers and PS it ran, from its first to its last slot with
            workers (None if it never ran).
        jct: completion time in slots; None if it did not complete by ``T-1``.
        utility: ``f(jct)``; 0 for an admitted job that did not complete; None if rejected.
        decision_ms: wall time of the re-plan at its arrival, milliseconds.
        reason: why it was rejected; None if admitted.
    """

    job: Job
    admitted: bool
    schedule: Schedule | None
    jct: int | None
    utility: float | None
    decision_ms: float
    reason: str | None = None


class Simulator:
    """State of one replay and the operations a policy may perform.

    Attributes:
        trace: the trace replayed.
        cluster: its servers.
        slot: the current slot.
        tasks: every job, in trace order.
        arrivals: tasks arriving in the current slot, undecided.
        workers, pss: free capacity of worker and PS servers in the current slot.
        pooled_worker, pooled_ps: ``(R,)`` total capacity of each kind (dominant shares).
    """

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.cluster = trace.cluster
        self.slot = 0
        h, k = len(self.cluster.worker_names), len(self.cluster.ps_names)
        self.pooled_worker: F64 = self.cluster.worker_capacity.sum(axis=0)
        self.pooled_ps: F64 = self.cluster.ps_capacity.sum(axis=0)
        self.tasks: list[Task] = []
        for i, job in enumerate(trace.jobs):
            y_max = max_parallel(job, self.cluster)
            self.tasks.append(
                Task(
                    job=job,
                    order=i,
                    y_max=y_max,
                    limit=y_max,
                    remaining=job.work,
                    workers=np.zeros(h, dtype=np.int64),
                    ps=np.zeros(k, dtype=np.int64),
                    worker_share=_largest_fraction(job.worker, self.pooled_worker),
                    ps_share=_largest_fraction(job.ps, self.pooled_ps),
                )
            )
        self.arrivals: list[Task] = []
        self.workers = Pool(self.cluster.worker_capacity)
        self.pss = Pool(self.cluster.ps_capacity)

    # -- reading -----------------------------------------------------------------------

    @property
    def horizon(self) -> int:
        """T: slots ``0 .. T-1``."""
        return self.trace.horizon

    @property
    def active(self) -> list[Task]:
        """Admitted, unfinished tasks in trace order."""
        return [t for t in self.tasks if t.status is Status.ACTIVE]

    def can_finish(self, task: Task, workers: int | None = None) -> bool:
        """Whether ``task`` can still finish by ``T-1`` at ``workers`` (default its
        ``limit``) workers in every slot from now on."""
        per_slot = task.limit if workers is None else workers
        return task.remaining <= per_slot * (self.horizon - self.slot)

    def share(self, task: Task, y: int) -> float:
        """Dominant share of ``y`` workers and ``z(y)`` PS of ``task``: the largest
        fraction of the cluster's total capacity of one resource, on worker or PS
        servers (DRF, Ghodsi et al. 2011)."""
        return max(y * task.worker_share, ps_for(task.job, y) * task.ps_share)

    # -- deciding ----------------------------------------------------------------------

    def admit(self, task: Task, limit: int | None = None) -> None:
        """Admit an arrival; ``limit`` caps its workers per slot (default ``y_max``)."""
        self._decide(task)
        if limit is not None:
            if not 1 <= limit <= task.y_max:
                raise PolicyError(f"{task.job.id}: limit {limit} outside 1..{task.y_max}")
            task.limit = limit
        task.status = Status.ACTIVE

    def reject(self, task: Task, reason: str) -> None:
        """Reject an arrival, saying why (a job's ``reason``): it never runs."""
        self._decide(task)
        task.status = Status.REJECTED
        task.reason = reason

    def release(self, task: Task) -> None:
        """Take back every worker and PS of ``task`` (it pauses or waits)."""
        self.workers.give(task.workers, task.job.worker)
        self.pss.give(task.ps, task.job.ps)
        task.workers = np.zeros_like(task.workers)
        task.ps = np.zeros_like(task.ps)

    def place(self, task: Task, y: int) -> bool:
        """Give an idle ``task`` ``y`` workers and ``z(y)`` PS round-robin, all or nothing."""
        self._check_idle(task)
        self._check_count(task, y)
        workers = self.workers.round_robin(task.job.worker, y)
        if workers is None:
            return False
        ps = self.pss.round_robin(task.job.ps, ps_for(task.job, y))
        if ps is None:
            self.workers.give(workers, task.job.worker)
            return False
        task.workers, task.ps = workers, ps
        return True

    def grow(self, task: Task) -> bool:
        """One more worker for ``task`` (and one more PS if ``z`` grows), round-robin."""
        if task.status is not Status.ACTIVE:
            raise PolicyError(f"{task.job.id}: only an active task can grow")
        y = task.y + 1
        self._check_count(task, y)
        worker = self.workers.round_robin(task.job.worker, 1)
        if worker is None:
            return False
        extra = ps_for(task.job, y) - task.z
        ps = self.pss.round_robin(task.job.ps, extra)
        if ps is None:
            self.workers.give(worker, task.job.worker)
            return False
        task.workers = task.workers + worker
        task.ps = task.ps + ps
        return True

    def assign(self, task: Task, workers: I64, ps: I64) -> bool:
        """Give an idle ``task`` exactly this placement if it fits; all or nothing."""
        self._check_idle(task)
        y = int(workers.sum())
        self._check_count(task, y)
        if int(ps.sum()) != ps_for(task.job, y):
            raise PolicyError(f"{task.job.id}: {int(ps.sum())} PS for {y} workers")
        if not (self.workers.fits(workers, task.job.worker) and self.pss.fits(ps, task.job.ps)):
            return False
        self.workers.take(workers, task.job.worker)
        self.pss.take(ps, task.job.ps)
        task.workers, task.ps = workers.copy(), ps.copy()
        return True

    # -- internals ---------------------------------------------------------------------

    def _decide(self, task: Task) -> None:
        if task.status is not Status.PENDING or task not in self.arrivals:
            raise PolicyError(f"{task.job.id} is not an undecided arrival")

    def _check_idle(self, task: Task) -> None:
        if task.status is not Status.ACTIVE or task.y or task.z:
            raise PolicyError(f"{task.job.id}: only an idle active task can be placed")

    def _check_count(self, task: Task, y: int) -> None:
        if not 0 <= y <= task.cap:
            raise PolicyError(f"{task.job.id}: {y} workers outside 0..{task.cap}")

    def _drop_hopeless(self) -> bool:
        dropped = False
        for task in self.active:
            if not self.can_finish(task):
                self.release(task)
                task.status = Status.DROPPED
                dropped = True
        return dropped

    def _check_plan(self) -> None:
        for task in self.arrivals:
            if task.status is Status.PENDING:
                raise PolicyError(f"{task.job.id}: arrival neither admitted nor rejected")
        # tasks leave ACTIVE only through release(), so only active ones hold servers
        for task in self.active:
            if task.y > task.cap or task.z != ps_for(task.job, task.y):
                raise PolicyError(f"{task.job.id}: {task.y} workers, {task.z} PS")

    def _run_slot(self) -> bool:
        """Run the current slot; True if a task completed."""
        completed = False
        for task in self.active:
            y = task.y
            if y == 0:
                continue
            task.rows.append((self.slot, task.workers.copy(), task.ps.copy()))
            task.remaining -= y
            if task.remaining == 0:
                task.end = self.slot
                task.status = Status.DONE
                self.release(task)
                completed = True
            elif task.remaining < y:
                self._trim(task, task.remaining)
        return completed

    def _trim(self, task: Task, y: int) -> None:
        """Cut ``task`` to ``y`` workers and ``z(y)`` PS, from the last-listed servers."""
        cut_w = _cut(task.workers, task.y - y)
        cut_p = _cut(task.ps, task.z - ps_for(task.job, y))
        self.workers.give(cut_w, task.job.worker)
        self.pss.give(cut_p, task.job.ps)
        task.workers = task.workers - cut_w
        task.ps = task.ps - cut_p

    def steps(self) -> Iterator[int]:
        """Walk the slots, yielding the slot at each event so the caller re-plans
        before the slot runs (the slot runs when the caller asks for the next value).

        An event yields once more in the same slot if the plan made a task hopeless
        (an arrival admitted with a small ``limit``); ``arrivals`` is empty then.
        """
        event = False
        for t in range(self.horizon):
            self.slot = t
            self.arrivals = [x for x in self.tasks if x.job.arrival == t and x.y_max > 0]
            event = self._drop_hopeless() or event or bool(self.arrivals)
            while event:
                yield t
                self._check_plan()
                self.arrivals = []
                event = self._drop_hopeless()
            self.arrivals = []
            event = self._run_slot()

    def outcomes(self) -> list[Outcome]:
        """Every job's outcome, in trace order."""
        h, k = len(self.cluster.worker_names), len(self.cluster.ps_names)
        out = []
        for task in self.tasks:
            schedule = None
            if task.rows:
                first, last = task.rows[0][0], task.rows[-1][0]
                workers = np.zeros((last - first + 1, h), dtype=np.int32)
                ps = np.zeros((last - first + 1, k), dtype=np.int32)
                for slot, w, p in task.rows:
                    workers[slot - first] = w
                    ps[slot - first] = p
                schedule = Schedule(first, workers, ps)
            admitted = task.status in (Status.ACTIVE, Status.DONE, Status.DROPPED)
            jct = None if task.end is None else task.end - task.job.arrival + 1
            if jct is not None:
                utility: float | None = float(task.job.utility.values(jct))
            else:
                utility = 0.0 if admitted else None
            reason = None if admitted else task.reason or _never_decided(task, self.horizon)
            out.append(
                Outcome(task.job, admitted, schedule, jct, utility, task.decision_ms, reason)
            )
        return out


def _never_decided(task: Task, horizon: int) -> str:
    """Why a job the policy never saw was rejected (module docstring)."""
    if task.y_max == 0:
        return "not one worker with its PS fits on any server, even on the empty cluster"
    if task.job.arrival >= horizon:
        return f"it arrives at slot {task.job.arrival}, at or after the horizon T = {horizon}"
    return "never decided"


def _largest_fraction(demand: F64, total: F64) -> float:
    """``max_r demand[r] / total[r]`` over resources with ``total[r] > 0``."""
    used = total > 0
    return float((demand[used] / total[used]).max()) if used.any() else 0.0


def _cut(counts: I64, n: int) -> I64:
    """``n`` units out of ``counts``, taken from the last servers first."""
    cut = np.zeros_like(counts)
    for i in range(counts.size - 1, -1, -1):
        if n <= 0:
            break
        take = min(int(counts[i]), n)
        cut[i] = take
        n -= take
    return cut


def simulate(
    trace: Trace,
    policy: Policy,
    clock: Callable[[], float] | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Outcome]:
    """Replay ``trace`` under ``policy``; every job's outcome, in trace order.

    ``clock`` (seconds) times each re-plan; an arrival's ``decision_ms`` is the re-plan
    at its arrival slot (0 without a clock). ``progress`` is called with the slot of
    each re-plan after it. The outcomes are checked against a
    :class:`~pricing.ledger.Ledger`, so an over-allocation raises CapacityError.
    """
    sim = Simulator(trace)
    for slot in sim.steps():
        start = clock() if clock else 0.0
        policy.replan(sim)
        elapsed = (clock() - start) * 1000.0 if clock else 0.0
        for task in sim.arrivals:
            task.decision_ms += elapsed
        if progress is not None:
            progress(slot)
    outcomes = sim.outcomes()
    verify(trace, outcomes)
    return outcomes


def verify(trace: Trace, outcomes: Sequence[Outcome]) -> None:
    """Check outcomes against the shared rules: PolicyError, or CapacityError from a
    fresh ledger every schedule is admitted into."""
    ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)
    for o in outcomes:
        job, s = o.job, o.schedule
        if o.jct is not None and (s is None or o.jct != s.end - job.arrival + 1):
            raise PolicyError(f"{job.id}: jct {o.jct} is not its last slot - a + 1")
        if s is None:
            continue
        y = s.worker_counts()
        if s.start < job.arrival or s.start + s.slots > trace.horizon:
            raise PolicyError(f"{job.id}: runs outside slots a..T-1")
        if int(y.max()) > job.chunks:
            raise PolicyError(f"{job.id}: more than N = {job.chunks} workers in a slot")
        if not np.array_equal(s.ps.sum(axis=1), job.ps_needed(y)):
            raise PolicyError(f"{job.id}: PS per slot differ from z(y)")
        if s.work() > job.work or (o.jct is not None) != (s.work() == job.work):
            raise PolicyError(f"{job.id}: {s.work()} worker-slots for work {job.work}")
        ledger.admit(job.id, job.worker, job.ps, s)
