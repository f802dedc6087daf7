"""Re-planning admitted jobs when what happens departs from the plan.

Three reactions, each a pure change to a :class:`~pricing.ledger.Ledger`:

- :func:`release_rest`: a job finished early; its slots from a given one on are freed.
- :func:`fail_server`: a server is down from a slot on (:func:`fail_servers`: several
  at once). Its capacity there becomes zero; every job with units on it is first
  *re-placed*: the same units in the same slots on
  other servers, cheapest first (:mod:`pricing.placement`), where room allows. A job
  that does not fit is *re-planned*: its future slots are released and the best-schedule
  search (:mod:`pricing.best_schedule`) plans its remaining work against current prices.
  A job for which no schedule exists any more is *stranded*: it keeps only its past.
- :func:`refit`: a stored plan no longer fits the ledger (the operator shrank a server,
  removed one or shortened the window): the job is re-placed in the same slots,
  re-planned, or stranded, as after a failure.
- :func:`replan_remaining`: the best schedule of a job's remaining work from a slot on,
  used by the above and to extend a job that runs slower than planned.

Completion times stay measured from the job's original arrival: the search runs on the
job with its utility shifted (:class:`Shifted`), so ``f(t_end - a + 1)`` is what it
maximises, whatever slot the re-plan starts in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from pricing.best_schedule import BestSchedule, best_schedule
from pricing.errors import LedgerError
from pricing.job import Job
from pricing.ledger import Ledger
from pricing.placement import offers, place
from pricing.schedule import Schedule
from pricing.utility import Utility

__all__ = [
    "FailureOutcome",
    "Shifted",
    "fail_server",
    "fail_servers",
    "first_holders",
    "refit",
    "release_rest",
    "release_rest_of",
    "remaining_job",
    "replan_remaining",
]


@dataclass(frozen=True)
class Shifted:
    """``f(d + offset)``: the utility of a job re-planned ``offset`` slots after its
    arrival, as a function of the completion time counted from the re-plan's first slot.

    Attributes:
        base: the job's utility of the completion time from its arrival.
        offset: slots between the arrival and the re-plan's first slot, >= 0.
    """

    base: Utility
    offset: int

    def values(self, d: ArrayLike) -> NDArray[np.float64]:
        return self.base.values(np.asarray(d) + self.offset)

    def log_values(self, d: ArrayLike) -> NDArray[np.float64]:
        return self.base.log_values(np.asarray(d) + self.offset)

    def to_dict(self) -> dict[str, Any]:
        return self.base.to_dict()


def remaining_job(job: Job, work: int, first_slot: int) -> Job:
    """``job`` with ``work`` worker-slots left, planned from ``first_slot`` (>= its
    arrival): its utility shifted so completion times still count from the arrival."""
    if first_slot < job.arrival:
        raise LedgerError(f"job {job.id!r}: re-plan from slot {first_slot} before its arrival")
    if work < 1:
        raise LedgerError(f"job {job.id!r}: nothing left to plan ({work} worker-slots)")
    return dataclasses.replace(
        job, work=work, arrival=first_slot, utility=Shifted(job.utility, first_slot - job.arrival)
    )


def release_rest(ledger: Ledger, job_id: str, from_slot: int) -> int:
    """Free ``job_id``'s slots from ``from_slot`` on (early completion, cancellation);
    returns the worker-slots released (0 if the job holds nothing there)."""
    return release_rest_of(ledger, [job_id], from_slot)[job_id]


def release_rest_of(ledger: Ledger, job_ids: list[str], from_slot: int) -> dict[str, int]:
    """:func:`release_rest` of each of ``job_ids`` at once (:meth:`Ledger.release_many`):
    ``{job: worker-slots released}``, 0 for a job the ledger does not hold."""
    released = ledger.release_many(job_ids, from_slot)
    return {job_id: released[job_id].work() if job_id in released else 0 for job_id in job_ids}


def replan_remaining(
    ledger: Ledger, job: Job, work: int, first_slot: int, last_slot: int
) -> tuple[BestSchedule, Schedule]:
    """The best schedule of ``work`` worker-slots of admitted ``job`` in ``first_slot ..
    last_slot``, priced without the job's own slots from ``first_slot`` on.

    The job keeps its slots before ``first_slot``. Nothing in the ledger changes: the
    caller commits with :meth:`Ledger.replace` and the returned whole schedule.

    Returns:
        ``(best, whole)``: the search's outcome for the remaining part, and the job's
        whole schedule if it is taken (its past followed by the new part; just the past
        when ``best.schedule`` is None).
    """
    current = ledger.schedule(job.id)
    past = current.before(first_slot)
    ledger.replace(job.id, past)  # price the rest without the job's own future slots
    try:
        last = min(last_slot, ledger.end - 1)
        best = best_schedule(remaining_job(job, work, first_slot), ledger, first_slot, last)
    finally:
        ledger.replace(job.id, current)
    if best.schedule is None:
        return best, past
    return best, _join(past, best.schedule, ledger)


@dataclass(frozen=True)
class FailureOutcome:
    """What :func:`fail_server` did.

    Attributes:
        replaced: jobs whose units moved to other servers in the same slots.
        replanned: jobs re-planned from their remaining work, with the search's outcome.
        stranded: jobs left with no feasible schedule: they keep only their past slots.
    """

    replaced: list[str]
    replanned: dict[str, BestSchedule]
    stranded: list[str]

    def moves(self, order: Iterable[str] | None = None) -> dict[str, str]:
        """``{job id: how}``, how each moved job moved: ``"replaced"``, ``"replanned"`` or
        ``"stranded"``; in ``order`` (the jobs to list, e.g. the ledger's), else the
        replaced ones first, then the re-planned, then the stranded."""
        how = {
            **dict.fromkeys(self.replaced, "replaced"),
            **dict.fromkeys(self.replanned, "replanned"),
            **dict.fromkeys(self.stranded, "stranded"),
        }
        return how if order is None else {j: how[j] for j in order if j in how}


def fail_server(
    ledger: Ledger,
    jobs: dict[str, Job],
    kind: str,
    index: int,
    from_slot: int,
    remaining_work: dict[str, int],
    last_slot: dict[str, int],
    until: int | None = None,
) -> FailureOutcome:
    """Take server ``index`` of ``kind`` down from ``from_slot`` on (up to ``until``,
    exclusive, if given: an operator's cordon with an end) and move its jobs.

    Args:
        ledger: the allocations; changed in place.
        jobs: every admitted job in the ledger by id (the affected ones are looked up).
        kind: ``"worker"`` or ``"ps"``.
        index: the server's position among servers of its kind.
        from_slot: first absolute slot the server is down in.
        remaining_work: per job, the worker-slots it still needs from ``from_slot`` on
            if it has to be re-planned (jobs not listed: the work its plan holds from
            ``from_slot`` on).
        last_slot: per job, the latest absolute slot it may be planned in.
    """
    return fail_servers(ledger, jobs, [(kind, index)], from_slot, remaining_work, last_slot, until)


def fail_servers(
    ledger: Ledger,
    jobs: dict[str, Job],
    servers: Sequence[tuple[str, int]],
    from_slot: int,
    remaining_work: dict[str, int],
    last_slot: dict[str, int],
    until: int | None = None,
    avoid: Sequence[tuple[str, int]] = (),
) -> FailureOutcome:
    """:func:`fail_server` for several servers at once, each ``(kind, index)``: every one
    is down before any job moves, so no job is moved onto another of them (one at a
    time, a rack's maintenance moved a job from each server to the next in turn). A job
    on several of them is re-placed (all its lost units in the same slots, together) or
    re-planned once. With one server this is :func:`fail_server`.

    ``avoid`` (each ``(kind, index)``, none of ``servers``): servers that are up but
    suspected to be failing too (their agents silent past two heartbeats while these
    servers failed: the rest of a rack going dark). No moved job is put on them
    (:meth:`Ledger.avoiding`), so it is not moved again when they fail seconds later;
    a job that finds no schedule without them is moved as if none were avoided (a
    move onto a suspect beats a job given up). Jobs already on them stay."""
    with ledger.deferred():  # one exact rebuild of the cells changed, not one per move
        down = list(dict.fromkeys(servers))
        by_kind = _by_kind(down)
        held = _held(ledger, by_kind, from_slot, until)
        affected = [j for j in ledger.job_ids() if j in held]  # in admission order
        # the failed servers' units come off every affected job before they are blocked
        wanting: dict[str, Schedule] = {}
        for job_id in affected:
            sched = ledger.schedule(job_id)
            wanting[job_id] = sched
            ledger.replace(job_id, _without(sched, by_kind, from_slot, until))
        for kind, indices in by_kind.items():
            ledger.block(kind, indices, from_slot, until)

        replaced: list[str] = []
        replanned: dict[str, BestSchedule] = {}
        stranded: list[str] = []
        avoided = _by_kind([key for key in dict.fromkeys(avoid) if key not in down])
        for job_id in affected:
            job = jobs[job_id]
            wanted = wanting[job_id]
            work = remaining_work.get(job_id, wanted.after(from_slot).work())
            last = last_slot.get(job_id)  # read only for a re-plan, as before
            if avoided:
                kept = ledger.schedule(job_id)  # without the failed servers' units
                with ledger.avoiding(avoided, from_slot):
                    how, best = _move(ledger, job, wanted, down, from_slot, until, work, last)
                if how == "stranded":  # no room off the suspects: moved as without them
                    ledger.replace(job_id, kept)
                    how, best = _move(ledger, job, wanted, down, from_slot, until, work, last)
            else:
                how, best = _move(ledger, job, wanted, down, from_slot, until, work, last)
            if how == "replaced":
                replaced.append(job_id)
            elif how == "stranded":
                stranded.append(job_id)
            else:
                assert best is not None
                replanned[job_id] = best
        return FailureOutcome(replaced, replanned, stranded)


def _move(
    ledger: Ledger,
    job: Job,
    wanted: Schedule,
    down: Sequence[tuple[str, int]],
    from_slot: int,
    until: int | None,
    work: int,
    last_slot: int | None,
) -> tuple[str, BestSchedule | None]:
    """Move ``job`` (its ledger schedule ``wanted`` less the units on ``down``) off the
    failed servers ``down``: re-placed in the same slots, else re-planned from its
    ``work`` (worker-slots) up to ``last_slot``, else stranded (its past kept). Returns
    ``("replaced", None)``, ``("replanned", best)`` or ``("stranded", best)``; the
    ledger holds the job's new schedule."""
    moved = _replace(ledger, job, wanted, down, from_slot, until)
    if moved is not None:
        ledger.replace(job.id, moved)
        return "replaced", None
    if work < 1:  # its remaining work is done: nothing to move
        return "replaced", None
    if last_slot is None:
        raise KeyError(f"no last slot for job {job.id!r}, which must be re-planned")
    best, whole = replan_remaining(ledger, job, work, from_slot, last_slot)
    ledger.replace(job.id, whole)
    return ("stranded" if best.schedule is None else "replanned"), best


def first_holders(
    ledger: Ledger,
    servers: Sequence[tuple[str, int]],
    from_slot: int,
    until: int | None = None,
) -> dict[str, tuple[str, int]]:
    """The jobs with units on any of ``servers`` (each ``(kind, index)``) in absolute
    slots ``from_slot .. until - 1`` (None: from then on), in admission order, each with
    the first of ``servers`` it is on: who a failure or cordon of them all moves, and
    which of them to name for it. One walk of the jobs a kind."""
    rank = {key: i for i, key in enumerate(dict.fromkeys(servers))}
    held = _held(ledger, _by_kind(list(rank)), from_slot, until)
    out: dict[str, tuple[str, int]] = {}
    for job_id in ledger.job_ids():
        if job_id not in held:
            continue
        schedule = ledger.schedule(job_id)
        part = (schedule if until is None else schedule.before(until)).after(from_slot)
        on = [("worker", int(i)) for i in np.flatnonzero(part.workers.any(axis=0))]
        on += [("ps", int(i)) for i in np.flatnonzero(part.ps.any(axis=0))]
        out[job_id] = min((key for key in on if key in rank), key=rank.__getitem__)
    return out


def _by_kind(servers: Sequence[tuple[str, int]]) -> dict[str, list[int]]:
    """The indices of ``servers`` (each ``(kind, index)``) by kind, in their order."""
    out: dict[str, list[int]] = {}
    for kind, index in servers:
        out.setdefault(kind, []).append(index)
    return out


def _held(
    ledger: Ledger, by_kind: dict[str, list[int]], from_slot: int, until: int | None
) -> set[str]:
    """The jobs with units on any of the servers ``by_kind`` in absolute slots
    ``from_slot .. until - 1`` (None: on): one walk of the jobs a kind."""
    held: set[str] = set()
    for kind, indices in by_kind.items():
        held.update(ledger.holding(kind, indices, from_slot, until))
    return held


def refit(
    ledger: Ledger,
    job: Job,
    start: int,
    workers: ArrayLike,
    ps: ArrayLike,
    work: int,
    last_slot: int,
) -> tuple[str, BestSchedule | None]:
    """Admit ``job`` (not in ``ledger``), whose stored plan no longer fits it.

    The plan is what the job wanted from ``start`` on, as counts per slot (its servers
    may be gone). First the same counts in the same slots on servers with room, cheapest
    first (*re-placed*); else the best schedule of ``work`` worker-slots from the
    window's first slot to ``last_slot`` at current prices (*re-planned*); else nothing
    (*stranded*: the job is left out of the ledger). A re-plan starts at the window's
    first slot or the job's arrival, whichever is later.

    Args:
        ledger: the allocations; changed in place.
        job: the job; its ``arrival`` is the original one (completion times count from it).
        start: absolute slot of ``workers[0]``, ``ps[0]``.
        workers: ``(S,)`` int, workers wanted per slot from ``start``.
        ps: ``(S,)`` int, parameter servers wanted per slot from ``start``.
        work: worker-slots still to do.
        last_slot: the latest absolute slot the job may be planned in.

    Returns:
        ``("replaced", None)``, ``("replanned", best)`` or ``("stranded", None)``.
    """
    placed = _place_counts(ledger, job, start, np.asarray(workers), np.asarray(ps))
    if placed is not None:
        ledger.admit(job.id, job.worker, job.ps, placed)
        return "replaced", None
    first = max(ledger.origin, job.arrival)
    last = min(last_slot, ledger.end - 1)
    if work < 1 or last < first:
        return "stranded", None
    n_w, n_p = ledger.cluster.worker_capacity.shape[0], ledger.cluster.ps_capacity.shape[0]
    idle = Schedule(first, np.zeros((1, n_w), np.int32), np.zeros((1, n_p), np.int32))
    ledger.admit(job.id, job.worker, job.ps, idle)  # replan_remaining prices around it
    best, whole = replan_remaining(ledger, job, work, first, last)
    if best.schedule is None:
        ledger.release(job.id, first)
        return "stranded", None
    ledger.replace(job.id, whole)
    return "replanned", best


def _place_counts(
    ledger: Ledger, job: Job, start: int, workers: NDArray[np.int64], ps: NDArray[np.int64]
) -> Schedule | None:
    """``workers[t]`` and ``ps[t]`` units of ``job`` in slot ``start + t`` on the servers
    with room, cheapest first; None if some slot has no room or is outside the window."""
    used = np.flatnonzero(workers + ps)
    if not used.size:
        return None
    lo, hi = int(used[0]), int(used[-1]) + 1
    start, workers, ps = start + lo, workers[lo:hi], ps[lo:hi]
    sides = [(ledger.side("worker"), job.worker, workers), (ledger.side("ps"), job.ps, ps)]
    out = [np.zeros((len(workers), s.capacity.shape[0]), np.int32) for s, _, _ in sides]
    for (side, demand, counts), target in zip(sides, out, strict=True):
        for t, count in enumerate(counts.tolist()):
            if count == 0:
                continue
            if not ledger.origin <= start + t < ledger.end:
                return None
            unit, room = offers(side.kernel_view(demand), start + t - ledger.origin)
            if place(unit, room, int(count), target[t]) != count:
                return None
    return Schedule(start, out[0], out[1])


def _rows(schedule: Schedule, from_slot: int, until: int | None) -> tuple[int, int]:
    """The rows of ``schedule`` in slots ``from_slot .. until - 1`` (no end: to its end)."""
    cut = min(max(from_slot - schedule.start, 0), schedule.slots)
    stop = (
        schedule.slots if until is None else min(max(until - schedule.start, cut), schedule.slots)
    )
    return cut, stop


def _without(
    schedule: Schedule, down: dict[str, list[int]], from_slot: int, until: int | None = None
) -> Schedule:
    """``schedule`` with no units on the servers ``down`` (their indices by kind) from
    ``from_slot`` on (up to ``until``, exclusive, if given). One copy of the schedule
    for all of them (one a server cost 0.2 s a job of 20 slots at 5,000 servers for a
    cordon of 1,000)."""
    workers, ps = schedule.workers.copy(), schedule.ps.copy()
    cut, stop = _rows(schedule, from_slot, until)
    for kind, indices in down.items():
        (workers if kind == "worker" else ps)[cut:stop, indices] = 0
    return Schedule(schedule.start, workers, ps)


def _replace(
    ledger: Ledger,
    job: Job,
    wanted: Schedule,
    down: Sequence[tuple[str, int]],
    from_slot: int,
    until: int | None = None,
) -> Schedule | None:
    """``wanted`` with its units on the failed servers ``down`` (each ``(kind, index)``;
    from ``from_slot``, up to ``until`` if given) moved to other servers of the same kind
    in the same slots, cheapest first, each slot's units of a kind placed together; None
    if some slot has no room for them."""
    current = ledger.schedule(job.id)  # ``wanted`` without the failed servers' units
    placed = {"worker": current.workers.copy(), "ps": current.ps.copy()}
    for kind, counts, demand in (("worker", wanted.workers, job.worker),
                                 ("ps", wanted.ps, job.ps)):  # fmt: skip
        gone = [index for k, index in down if k == kind]
        if not gone:
            continue
        side = ledger.side(kind)
        target = placed[kind]
        for row in range(*_rows(wanted, from_slot, until)):
            missing = int(counts[row, gone].sum())
            if missing == 0:
                continue
            slot = wanted.start + row
            if not ledger.origin <= slot < ledger.end:
                return None
            unit, room = offers(side.kernel_view(demand), slot - ledger.origin)
            out = np.zeros(unit.shape[0], np.int32)
            if place(unit, room, missing, out) != missing:
                return None
            target[row] += out
    return Schedule(wanted.start, placed["worker"], placed["ps"])


def _join(past: Schedule, future: Schedule, ledger: Ledger) -> Schedule:
    """``past`` followed by ``future`` (which starts at or after its end) as one schedule."""
    if not past.slots:
        return future
    start = past.start
    rows = future.start + future.slots - start
    workers = np.zeros((rows, ledger.cluster.worker_capacity.shape[0]), np.int32)
    ps = np.zeros((rows, ledger.cluster.ps_capacity.shape[0]), np.int32)
    workers[: past.slots], ps[: past.slots] = past.workers, past.ps
    off = future.start - start
    workers[off:], ps[off:] = future.workers, future.ps
    return Schedule(start, workers, ps)
