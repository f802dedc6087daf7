"""Why a job was priced out: the parts of its best schedule that cost the most, or why
nothing fits at all. Operators read these in a rejection.

A best schedule worth nothing (it ends after a deadline without a half-life, or where a
table utility has fallen to 0) is no answer to "why": what the user needs to hear is why
no schedule that ends while the job is worth something was taken. :func:`explain`
searches that one (the same search, over the slots up to the last such end): either it
does not fit there, or it costs more than the job is worth, and its parts say where."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
from numpy.typing import NDArray

from pricing.admission import ADMIT_THRESHOLD
from pricing.best_schedule import BestSchedule, best_schedule
from pricing.cluster import Cluster
from pricing.jit import kernel
from pricing.job import Job, fits_nowhere, max_workers_per_slot, room
from pricing.ledger import Ledger

__all__ = ["PriceDriver", "cannot_finish", "explain", "explain_rejection", "price_drivers"]


def cannot_finish(job: Job, cluster: Cluster, slots: int) -> str | None:
    """Why ``job`` cannot finish within ``slots`` slots from its arrival even on the empty
    ``cluster`` (SPEC 6: a rejection, not an input error), or None if it can."""
    if slots < 1:
        return "cannot finish before the horizon: it arrives at or after the horizon's end"
    nowhere = fits_nowhere(job.worker, job.ps, cluster)
    if nowhere:
        return "cannot run: " + "; ".join(why for _kind, why in nowhere)
    per_slot = max_workers_per_slot(job, cluster)
    if per_slot < 1:
        return "cannot run: not one worker with its parameter servers fits on the empty cluster"
    need = -(-job.work // per_slot)
    if need <= slots:
        return None
    return (
        f"cannot finish before the horizon even on an empty cluster: its work of {job.work} "
        f"worker-slots needs at least {_count(need, 'slot')} (at most {per_slot} workers per "
        f"slot), and only {slots} remain"
    )


@dataclass(frozen=True)
class PriceDriver:
    """One resource on one server over a run of consecutive slots.

    Attributes:
        resource, server: what was expensive, where.
        first_slot, last_slot: the run of slots (absolute).
        cost: its part of the schedule's cost, utility units.
        price: the highest unit price of the resource in the run.
    """

    resource: str
    server: str
    first_slot: int
    last_slot: int
    cost: float
    price: float


@kernel
def _runs(
    counts: NDArray[np.int32],
    cells: NDArray[np.float64],
    lo: int,
    used: NDArray[np.intp],
    demand: NDArray[np.float64],
) -> tuple[NDArray[np.intp], NDArray[np.intp], NDArray[np.intp], NDArray[np.intp],
           NDArray[np.float64], NDArray[np.float64]]:  # fmt: skip
    """Every run of consecutive slots with a positive cost ``counts * price * demand`` on
    each of the ``used`` servers and each resource, in (server, resource, slot) order.

    ``counts`` ``(S, n)`` is one side of a schedule, ``cells`` the side's ``(slots, n, R)``
    prices with the schedule's rows at ``lo ..``. Returns ``(server position in used,
    resource, first row, end row (exclusive), cost summed slot by slot, highest unit
    price)`` arrays of one entry per run."""
    slots = counts.shape[0]
    n_res = demand.shape[0]
    nonzero = 0  # each run holds at least one of these cells, per resource
    for i in range(used.shape[0]):
        for t in range(slots):
            if counts[t, used[i]] > 0:
                nonzero += 1
    most = nonzero * n_res
    srv = np.empty(most, np.intp)
    res = np.empty(most, np.intp)
    first = np.empty(most, np.intp)
    end = np.empty(most, np.intp)
    cost = np.empty(most, np.float64)
    peak = np.empty(most, np.float64)
    k = 0
    for i in range(used.shape[0]):
        h = used[i]
        for r in range(n_res):
            open_ = False
            start = 0
            total = 0.0
            top = 0.0
            for t in range(slots + 1):
                c = counts[t, h] * cells[lo + t, h, r] * demand[r] if t < slots else 0.0
                if c > 0:
                    p = cells[lo + t, h, r]
                    if not open_:
                        open_, start, total, top = True, t, 0.0, p
                    total += c
                    top = max(top, p)
                elif open_:
                    srv[k], res[k], first[k], end[k], cost[k], peak[k] = i, r, start, t, total, top
                    k += 1
                    open_ = False
    return srv[:k], res[:k], first[:k], end[:k], cost[:k], peak[:k]


def price_drivers(best: BestSchedule, job: Job, ledger: Ledger, top: int = 3) -> list[PriceDriver]:
    """The ``top`` costliest (server, resource, run of slots) parts of ``best``'s schedule.

    Ties keep the order workers before PS, then server, resource and slot. Only the
    servers the schedule uses are read (a part costs nothing elsewhere), so the work
    grows with the schedule, not with the cluster; each run's cost is summed slot by
    slot (compiled, :func:`_runs`), so equal runs cost exactly the same."""
    sched = best.schedule
    if sched is None:
        return []
    lo = ledger.index(sched.start)
    hi = lo + sched.slots
    cluster = ledger.cluster
    # (cost, order, names, server, resource, first row, end row, peak): a PriceDriver is
    # made only for the top ones of both kinds
    found: list[tuple[float, int, tuple[str, ...], int, int, int, int, float]] = []
    for counts, side, demand, names in (
        (sched.workers, ledger.worker_side, job.worker, cluster.worker_names),
        (sched.ps, ledger.ps_side, job.ps, cluster.ps_names),
    ):
        holds = cast("NDArray[np.bool_]", counts.any(axis=0))  # (n,)
        used = holds.nonzero()[0]  # (m,): servers with a unit in some slot
        if used.size == 0:
            continue
        cells = side.prices(lo, hi)
        srv, res, first, end, run_cost, peak = _runs(
            np.ascontiguousarray(counts, np.int32), cells, lo, used.astype(np.intp, copy=False),
            np.ascontiguousarray(demand, np.float64),
        )  # fmt: skip
        for k in (-run_cost).argsort(kind="stable")[:top].tolist():
            found.append((float(run_cost[k]), len(found), names, int(used[srv[k]]),
                          int(res[k]), int(first[k]), int(end[k]), float(peak[k])))  # fmt: skip
    found.sort(key=lambda x: (-x[0], x[1]))
    return [
        PriceDriver(
            resource=cluster.resources[r],
            server=names[h],
            first_slot=sched.start + a,
            last_slot=sched.start + b - 1,
            cost=cost,
            price=peak_price,
        )
        for cost, _, names, h, r, a, b, peak_price in found[:top]
    ]


def _scarcest(job: Job, ledger: Ledger, lo: int, hi: int) -> tuple[str, int | None, int, int]:
    """Over window slots ``lo .. hi - 1`` of the worker servers: the resource with the
    fewest workers' worth free (its name and that count; ``""`` and None if the job
    demands none), the worker-slots that fit, capped at ``N`` per slot: on all servers
    together, as SPEC constraint 3 caps a job's workers (capped on each server, a job of
    N = 8 short of slots counted 319 where 80 fit, and was told its PS did not fit), and
    the worker-slots that fit without that cap.

    One resource at a time, ``(hi - lo, n)`` each: the room of every resource is the
    least of the rooms of each (:func:`pricing.job.room`), and the counts are the same."""
    side = ledger.worker_side
    worst = ""
    least = None
    fits = None
    for r, name in enumerate(ledger.cluster.resources):
        if job.worker[r] <= 0:
            continue
        free = side.capacity[None, :, r : r + 1] - side.used[lo:hi, :, r : r + 1]
        units = room(free, job.worker[r : r + 1])  # (hi - lo, n) int64
        total = int(units.sum())
        if least is None or total < least:
            least, worst = total, name
        fits = units if fits is None else np.minimum(fits, units)
    if fits is None:  # no worker demand: as the room of every resource at once says
        fits = room(side.capacity[None] - side.used[lo:hi], job.worker)
    per_slot = fits.sum(axis=1)
    return worst, least, int(per_slot.clip(max=job.chunks).sum()), int(per_slot.sum())


def _out_of_service(ledger: Ledger, lo: int, hi: int) -> str:
    """``"; out of service in those slots: w0, p1"``: the servers blocked (cordoned by an
    operator, or failed) in some of window slots ``lo .. hi - 1``, whose room counts as
    none; ``""`` if none is. Without it a job rejected because servers are out read as
    if the cluster were full."""
    cluster = ledger.cluster
    names: list[str] = []
    for side, listed in ((ledger.worker_side, cluster.worker_names),
                         (ledger.ps_side, cluster.ps_names)):  # fmt: skip
        out = np.flatnonzero(side.blocked[lo:hi].any(axis=0))
        names += [listed[int(i)] for i in out]
    if not names:
        return ""
    more = f" and {len(names) - 10} more" if len(names) > 10 else ""
    return f"; out of service in those slots: {', '.join(names[:10])}{more}"


def explain(
    best: BestSchedule,
    job: Job,
    ledger: Ledger,
    first_slot: int,
    last_slot: int,
    arrival: int | None = None,
) -> tuple[str, list[PriceDriver]]:
    """The reason and the price drivers of a rejection: ``best`` is the job's best
    schedule in slots ``first_slot .. last_slot`` with its completion time counted from
    ``arrival`` (None: ``first_slot``), as :func:`pricing.best_schedule.best_schedule`
    was given them. A best schedule worth nothing is explained by the best one that ends
    while the job is worth something (see the module docstring)."""
    start = first_slot if arrival is None else arrival
    span = last_slot - start + 1  # completion times d = 1 .. span
    if best.utility is not None and best.utility <= 0 and span >= 1:
        # in logs: a sigmoid's value underflows to 0 long before it is worth nothing (a
        # job the worth check took, told "too late" at its arrival: the diff review)
        logs = np.asarray(job.utility.log_values(np.arange(1, span + 1)), dtype=np.float64)
        worth = int(np.count_nonzero(logs > -np.inf))  # non-increasing: a prefix
    else:
        worth = span
    if worth < span:  # worth nothing after completion time ``worth``
        end = start + worth - 1
        within = f"by slot {end}, after which it is worth nothing"
        if end < first_slot:
            return f"too late: it is worth nothing after slot {end}", []
        on_time = best_schedule(job, ledger, first_slot, end, start)
        if on_time.payoff is None:
            return "cannot finish " + within + ": " + _cannot_fit(job, ledger, first_slot, end), []
        drivers = price_drivers(on_time, job, ledger)
        return explain_rejection(on_time, job, ledger, first_slot, end, drivers, within), drivers
    drivers = price_drivers(best, job, ledger)
    return explain_rejection(best, job, ledger, first_slot, last_slot, drivers), drivers


def _cannot_fit(job: Job, ledger: Ledger, first_slot: int, last_slot: int) -> str:
    """Why no schedule of ``job`` fits in slots ``first_slot .. last_slot``."""
    late = cannot_finish(job, ledger.cluster, last_slot - first_slot + 1)
    if late is not None:
        return late
    lo, hi = ledger.index(first_slot), ledger.index(last_slot) + 1
    worst, least, fit, together = _scarcest(job, ledger, lo, hi)
    slots = _span(first_slot, last_slot)
    if fit >= job.work:  # the workers alone would fit: "only 384 free" for 9 misled
        said = (
            f"cannot fit: its parameter servers do not fit in {slots} next to its "
            f"workers ({fit} worker-slots are free there, capped at {job.chunks} per "
            f"slot, for the {job.work} it needs)"
        )
    else:
        # each resource's room summed may pass the room of all of them on one server: a
        # GPU free on one server and the CPU on another read as "only 0 free; the
        # scarcest resource is 'gpu' (2 workers' worth free)" (the operator audit)
        split = least is not None and least > together
        apart = ", not all of it where the other resources a worker needs are" if split else ""
        said = (
            f"cannot fit: it needs {job.work} worker-slots in {slots}, and only {fit} "
            f"worker-slots are free there (capped at {job.chunks} per slot); the "
            f"scarcest resource is {worst!r} ({least} workers' worth free{apart}), or its "
            "parameter servers do not fit"
        )
    return said + _out_of_service(ledger, lo, hi)


def explain_rejection(
    best: BestSchedule,
    job: Job,
    ledger: Ledger,
    first_slot: int,
    last_slot: int,
    drivers: list[PriceDriver] | None = None,
    within: str = "",
) -> str:
    """A sentence a person can act on, for a job whose best payoff in slots
    ``first_slot .. last_slot`` is not positive.

    ``drivers`` are :func:`price_drivers` of ``best`` if the caller has them already;
    ``within`` says what bounds the schedule searched (``"by slot 7, after which ..."``)."""
    if best.payoff is None:
        return _cannot_fit(job, ledger, first_slot, last_slot)
    assert best.cost is not None and best.utility is not None and best.payoff is not None
    assert best.jct is not None
    if drivers is None:
        drivers = price_drivers(best, job, ledger)
    # a payoff in (0, 1e-9] is not admitted either, and "<= 0" would be untrue of it
    bar = "0" if best.payoff <= 0 else f"{ADMIT_THRESHOLD:g}, the admission threshold"
    which = f"the best schedule that completes {within}" if within else "the best schedule"
    head = (
        f"priced out: {which} (completion in {_count(best.jct, 'slot')}, utility "
        f"{best.utility:.6g}) costs {best.cost:.6g}, payoff {best.payoff:.6g} <= {bar}"
    )
    if not drivers:
        return head
    parts = ", ".join(
        f"{d.resource} on {d.server} in {_span(d.first_slot, d.last_slot)} "
        f"(cost {d.cost:.4g}, unit price up to {d.price:.4g})"
        for d in drivers
    )
    return f"{head}; the costliest parts: {parts}"


def _count(n: int, word: str) -> str:
    """``"1 slot"``, ``"3 slots"``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _span(first: int, last: int) -> str:
    """``"slot 4"`` or ``"slots 4..7"`` (absolute slots, both included)."""
    return f"slot {first}" if first == last else f"slots {first}..{last}"
