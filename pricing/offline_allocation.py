"""Allocations of the offline comparison: ``(J, T, H)`` workers and ``(J, T, K)`` PS per
job, slot and server, read from the ILP's incumbent (:mod:`pricing.offline_model`) or
from schedules, checked against SPEC 3-5, and their jobs' completion and utility. An
allocation given as schedules is checked as they are (:func:`check_schedules`,
:func:`schedule_jobs`): its arrays take ``J T (H + K)`` integers.

Checks
    The solver's incumbent is rounded to integers and checked against SPEC 3-5 with the
    ledger's capacity slack (:func:`pricing.ledger.capacity_slack`: ``1e-7`` and ``2e-9``
    of the capacity, what SPEC 5's room ``floor(free / w + 1e-9)`` places). The utility
    recomputed from it must not fall below the solver's objective. No known feasible
    allocation may beat the solver's bound. Any failure raises :class:`OfflineError`
    rather than report a number for an allocation that does not exist, or a proof that
    does not hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pricing.job import Job
from pricing.ledger import capacity_slack
from pricing.offline_backends import ABS_GAP
from pricing.offline_model import Held, OfflineError, _Model, _pulp
from pricing.schedule import Schedule
from pricing.trace import Trace

__all__ = [
    "OfflineJob",
    "allocation_from_schedules",
    "allocation_jobs",
    "check_allocation",
    "check_schedules",
    "schedule_jobs",
]

_INTEGRALITY = 1e-5
"""Largest distance from an integer accepted in the solver's integer values."""


@dataclass(frozen=True)
class OfflineJob:
    """One job in the best allocation found.

    Attributes:
        id: the job's identifier.
        admitted: whether the allocation runs it.
        completion_slot: the last slot with a worker; None if not admitted.
        jct: ``completion_slot - a + 1``, slots; None if not admitted.
        utility: ``f(jct)``; 0.0 if not admitted.
    """

    id: str
    admitted: bool
    completion_slot: int | None
    jct: int | None
    utility: float


def _integer(var: Any) -> int:
    value = var.varValue
    if value is None:
        return 0
    n = round(float(value))
    if abs(float(value) - n) > _INTEGRALITY:
        raise OfflineError(f"{var.name} = {value} is not an integer")
    return int(n)


def _allocation(trace: Trace, model: _Model) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``(J, T, H)`` workers and ``(J, T, K)`` PS of the incumbent, as integers."""
    shape = (len(trace.jobs), trace.horizon)
    workers = np.zeros((*shape, len(trace.cluster.worker_names)), dtype=np.int64)
    ps = np.zeros((*shape, len(trace.cluster.ps_names)), dtype=np.int64)
    for (i, h, t), var in model.y.items():
        workers[i, t, h] = _integer(var)
    for (i, k, t), var in model.z.items():
        ps[i, t, k] = _integer(var)
    return workers, ps


def allocation_from_schedules(
    trace: Trace, schedules: Sequence[Schedule | None]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``(J, T, H)`` workers and ``(J, T, K)`` PS from one schedule per job (None: the
    job is not run), e.g. the online algorithm's, in trace order."""
    if len(schedules) != len(trace.jobs):
        raise ValueError(f"{len(schedules)} schedules for {len(trace.jobs)} jobs")
    shape = (len(trace.jobs), trace.horizon)
    workers = np.zeros((*shape, len(trace.cluster.worker_names)), dtype=np.int64)
    ps = np.zeros((*shape, len(trace.cluster.ps_names)), dtype=np.int64)
    for i, s in enumerate(schedules):
        if s is not None and s.slots:
            if s.start < 0 or s.start + s.slots > trace.horizon:
                raise ValueError(f"schedule of {trace.jobs[i].id} leaves slots 0 .. T-1")
            workers[i, s.start : s.start + s.slots] = s.workers
            ps[i, s.start : s.start + s.slots] = s.ps
    return workers, ps


def _set_start(
    trace: Trace,
    held: Held,
    model: _Model,
    workers: NDArray[np.int64],
    ps: NDArray[np.int64],
) -> None:
    """Give every variable the value of the (checked) allocation, as the solver's start."""
    problems = check_allocation(trace, held, workers, ps)
    if problems:
        raise OfflineError("the starting allocation breaks SPEC 3-5: " + "; ".join(problems))
    for var in model.prob.variables():
        var.varValue = 0.0
    try:
        for (i, h, t), var in model.y.items():
            var.setInitialValue(int(workers[i, t, h]))
        for (i, k, t), var in model.z.items():
            var.setInitialValue(int(ps[i, t, k]))
    except ValueError as err:
        raise OfflineError(f"the starting allocation does not fit the model: {err}") from err
    placed = sum(int(v.varValue) for v in model.y.values())
    placed += sum(int(v.varValue) for v in model.z.values())
    if placed != int(workers.sum() + ps.sum()):
        raise OfflineError("the starting allocation puts a unit where none of its job fits")
    for i, job in enumerate(allocation_jobs(trace, workers)):
        if job.completion_slot is not None:
            model.x[i].setInitialValue(1)
            model.u[i, job.completion_slot].setInitialValue(1)
            for t in range(trace.jobs[i].arrival, job.completion_slot + 1):
                if (i, t) in model.v:
                    model.v[i, t].setInitialValue(1)


def check_allocation(
    trace: Trace, held: Held, workers: NDArray[np.int64], ps: NDArray[np.int64]
) -> list[str]:
    """Every way the allocation (``(J, T, H)`` workers, ``(J, T, K)`` PS) breaks SPEC 3-5
    (empty when it is feasible): the check of every allocation reported, online or
    offline."""
    problems = []
    for i, job in enumerate(trace.jobs):
        last = int(held.last_slot[i])
        problems += _job_problems(job, last, workers[i].sum(axis=1), ps[i].sum(axis=1))
    if not trace.jobs:  # nothing allocated (and no (J, R) demand array to build)
        return problems
    used_w = np.einsum("ith,ir->thr", workers, np.array([j.worker for j in trace.jobs]))
    used_p = np.einsum("itk,ir->tkr", ps, np.array([j.ps for j in trace.jobs]))
    return problems + _capacity_problems(trace, held, used_w, used_p)


def check_schedules(trace: Trace, held: Held, schedules: Sequence[Schedule | None]) -> list[str]:
    """:func:`check_allocation` of the allocation ``schedules`` make (one per job, None:
    not run), without its ``(J, T, H)`` arrays: for 1,000 jobs on 500 + 500 servers over
    168 slots they took 1.3 GB and 8 s to build and check, twice per ``oasis offline``
    (the online start and the rounded allocation), past its time limit. The capacity
    used is summed schedule by schedule instead."""
    if len(schedules) != len(trace.jobs):
        raise ValueError(f"{len(schedules)} schedules for {len(trace.jobs)} jobs")
    c, horizon = trace.cluster, trace.horizon
    used_w = np.zeros((horizon, *c.worker_capacity.shape))
    used_p = np.zeros((horizon, *c.ps_capacity.shape))
    problems = []
    for i, (job, s) in enumerate(zip(trace.jobs, schedules, strict=True)):
        if s is None or not s.slots:
            continue
        if s.start < 0 or s.start + s.slots > horizon:
            raise ValueError(f"schedule of {job.id} leaves slots 0 .. T-1")
        rows = slice(s.start, s.start + s.slots)
        per_slot = np.zeros(horizon, dtype=np.int64)
        ps_slot = np.zeros(horizon, dtype=np.int64)
        per_slot[rows] = s.workers.sum(axis=1)
        ps_slot[rows] = s.ps.sum(axis=1)
        problems += _job_problems(job, int(held.last_slot[i]), per_slot, ps_slot)
        used_w[rows] += s.workers[:, :, None] * job.worker
        used_p[rows] += s.ps[:, :, None] * job.ps
    return problems + _capacity_problems(trace, held, used_w, used_p)


def _job_problems(
    job: Job, last: int, per_slot: NDArray[np.int64], ps_slot: NDArray[np.int64]
) -> list[str]:
    """How one job's workers and PS per slot (``(T,)`` each) break SPEC 3-5 alone."""
    problems = []
    if per_slot[: job.arrival].any() or ps_slot[: job.arrival].any():
        problems.append(f"{job.id}: runs before its arrival")
    if per_slot[last + 1 :].any() or ps_slot[last + 1 :].any():
        problems.append(f"{job.id}: runs after its last slot {last}")
    if per_slot.any() and per_slot.sum() < job.work:
        problems.append(f"{job.id}: {per_slot.sum()} worker-slots < W = {job.work}")
    if (per_slot > job.chunks).any():
        problems.append(f"{job.id}: more than N = {job.chunks} workers in a slot")
    if (ps_slot < job.ps_needed(per_slot)).any() or (ps_slot > per_slot).any():
        problems.append(f"{job.id}: PS count outside z(y) .. y")
    return problems


def _capacity_problems(
    trace: Trace, held: Held, used_w: NDArray[np.float64], used_p: NDArray[np.float64]
) -> list[str]:
    """Whether the ``(T, H, R)`` and ``(T, K, R)`` amounts used exceed what is free, by
    more than the ledger lets an admission exceed a capacity (:func:`capacity_slack` of
    the server's whole capacity, as :meth:`pricing.ledger.Ledger.admit` checks held and
    new amounts together). With the absolute ``1e-7`` alone, four workers of 4e9 + 1
    bytes on a server of 16e9, which SPEC 5's room places online, broke "SPEC 3-5"."""
    c = trace.cluster
    problems = []
    free = held.worker_capacity(trace)
    free += capacity_slack(c.worker_capacity)  # in place: no second (T, H, R) array
    if (used_w > free).any():
        problems.append("a worker server's capacity is exceeded")
    del free  # one (T, S, R) array at a time
    free = held.ps_capacity(trace)
    free += capacity_slack(c.ps_capacity)
    if (used_p > free).any():
        problems.append("a PS server's capacity is exceeded")
    return problems


def allocation_jobs(trace: Trace, workers: NDArray[np.int64]) -> tuple[OfflineJob, ...]:
    """Per job: admitted iff it has workers; completion at its last worker slot."""
    out = []
    for i, job in enumerate(trace.jobs):
        used = np.flatnonzero(workers[i].sum(axis=1))
        out.append(_outcome(job, int(used[-1]) if used.size else None))
    return tuple(out)


def schedule_jobs(trace: Trace, schedules: Sequence[Schedule | None]) -> tuple[OfflineJob, ...]:
    """:func:`allocation_jobs` of the allocation ``schedules`` make, without building it."""
    out = []
    for job, s in zip(trace.jobs, schedules, strict=True):
        end = s.end if s is not None else -1
        out.append(_outcome(job, end if s is not None and end >= s.start else None))
    return tuple(out)


def _outcome(job: Job, end: int | None) -> OfflineJob:
    """``job`` run with its last worker in slot ``end`` (None: not run)."""
    if end is None:
        return OfflineJob(job.id, False, None, None, 0.0)
    jct = end - job.arrival + 1
    return OfflineJob(job.id, True, end, jct, float(job.utility.values(jct)))


def _total(jobs: tuple[OfflineJob, ...]) -> float:
    return float(sum(j.utility for j in jobs))


def _incumbent(trace: Trace, held: Held, model: _Model) -> tuple[OfflineJob, ...]:
    """The solver's allocation, checked against SPEC 3-5 and against its objective."""
    workers, ps = _allocation(trace, model)
    problems = check_allocation(trace, held, workers, ps)
    if problems:
        raise OfflineError("the solver's allocation breaks SPEC 3-5: " + "; ".join(problems))
    jobs = allocation_jobs(trace, workers)
    total = _total(jobs)
    # u sits at or after each true last worker slot, so the solver's objective can only
    # fall short of the recomputed utility (pricing/offline_model.py's module docstring),
    # never exceed it
    claimed = float(_pulp().value(model.prob.objective) or 0.0)
    if claimed > total + ABS_GAP * max(1.0, abs(total)):
        raise OfflineError(
            f"the solver's objective {claimed:.9g} exceeds the utility {total:.9g} "
            "its allocation achieves"
        )
    return jobs
