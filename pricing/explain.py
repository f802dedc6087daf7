"""Why a job was priced out: the parts of its best schedule that cost the most, or why
nothing fits at all. Operators read these in a rejection."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pricing.best_schedule import BestSchedule
from pricing.cluster import Cluster
from pricing.job import Job, max_workers_per_slot, room
from pricing.ledger import Ledger

__all__ = ["PriceDriver", "cannot_finish", "explain_rejection", "price_drivers"]


def cannot_finish(job: Job, cluster: Cluster, slots: int) -> str | None:
    """Why ``job`` cannot finish within ``slots`` slots from its arrival even on the empty
    ``cluster`` (SPEC 6: a rejection, not an input error), or None if it can."""
    if slots < 1:
        return "cannot finish before the horizon: it arrives at or after the horizon's end"
    per_slot = max_workers_per_slot(job, cluster)
    if per_slot < 1:
        return "cannot run: not one worker with its parameter servers fits on the empty cluster"
    need = -(-job.work // per_slot)
    if need <= slots:
        return None
    return (
        f"cannot finish before the horizon even on an empty cluster: its work of {job.work} "
        f"worker-slots needs at least {need} slots (at most {per_slot} workers per slot), "
        f"and only {slots} remain"
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


def price_drivers(best: BestSchedule, job: Job, ledger: Ledger, top: int = 3) -> list[PriceDriver]:
    """The ``top`` costliest (server, resource, run of slots) parts of ``best``'s schedule.

    Ties keep the order workers before PS, then server, resource and slot. Only the
    servers the schedule uses are read (a part costs nothing elsewhere), so the work
    grows with the schedule, not with the cluster."""
    sched = best.schedule
    if sched is None:
        return []
    lo = ledger.index(sched.start)
    hi = lo + sched.slots
    cluster = ledger.cluster
    found: list[tuple[float, int, PriceDriver]] = []
    for counts, side, demand, names in (
        (sched.workers, ledger.worker_side, job.worker, cluster.worker_names),
        (sched.ps, ledger.ps_side, job.ps, cluster.ps_names),
    ):
        used = np.flatnonzero(counts.any(axis=0))  # (m,): servers with a unit in some slot
        if used.size == 0:
            continue
        # (m, R, n): cost of each resource on each used server in each slot
        prices = side.prices(lo, hi)[lo:hi, used].transpose(1, 2, 0)
        cost = np.ascontiguousarray(counts[:, used].T[:, None, :] * prices * demand[None, :, None])
        # runs of positive cost along the slots, every (server, resource) column at once;
        # starts and ends come out in (server, resource, slot) order, so they pair up
        edges = np.diff((cost > 0).view(np.int8), axis=2, prepend=0, append=0)
        srv, res, first = np.nonzero(edges == 1)
        end = np.nonzero(edges == -1)[2]
        if srv.size == 0:
            continue
        base = (srv * cost.shape[1] + res) * cost.shape[2]
        bounds = np.empty(2 * srv.size, np.intp)
        bounds[0::2], bounds[1::2] = base + first, base + end
        # each run summed slot by slot, so equal runs cost exactly the same
        run_cost = np.add.reduceat(np.append(cost.ravel(), 0.0), bounds)[0::2]
        for k in np.argsort(-run_cost, kind="stable")[:top].tolist():
            s_, r, a, b = int(srv[k]), int(res[k]), int(first[k]), int(end[k])
            driver = PriceDriver(
                resource=cluster.resources[r],
                server=names[int(used[s_])],
                first_slot=sched.start + a,
                last_slot=sched.start + b - 1,
                cost=float(run_cost[k]),
                price=float(prices[s_, r, a:b].max()),
            )
            found.append((driver.cost, len(found), driver))
    found.sort(key=lambda x: (-x[0], x[1]))
    return [d for _, _, d in found[:top]]


def _scarcest(job: Job, ledger: Ledger, lo: int, hi: int) -> tuple[str, int | None, int]:
    """Over window slots ``lo .. hi - 1`` of the worker servers: the resource with the
    fewest workers' worth free (its name and that count; ``""`` and None if the job
    demands none) and the worker-slots that fit, capped at ``N`` per slot and server.

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
    return worst, least, int(fits.clip(max=job.chunks).sum())


def explain_rejection(
    best: BestSchedule,
    job: Job,
    ledger: Ledger,
    first_slot: int,
    last_slot: int,
    drivers: list[PriceDriver] | None = None,
) -> str:
    """A sentence a person can act on, for a job whose best payoff is not positive.

    ``drivers`` are :func:`price_drivers` of ``best`` if the caller has them already."""
    if best.payoff is None:
        late = cannot_finish(job, ledger.cluster, last_slot - first_slot + 1)
        if late is not None:
            return late
        lo, hi = ledger.index(first_slot), ledger.index(last_slot) + 1
        worst, least, fit = _scarcest(job, ledger, lo, hi)
        return (
            f"cannot fit: it needs {job.work} worker-slots in slots {first_slot}..{last_slot}, "
            f"and only {fit} worker-slots are free there (capped at {job.chunks} per slot); "
            f"the scarcest resource is {worst!r} ({least} workers' worth free), or its "
            "parameter servers do not fit"
        )
    assert best.cost is not None and best.utility is not None
    if drivers is None:
        drivers = price_drivers(best, job, ledger)
    head = (
        f"priced out: the best schedule (completion in {best.jct} slots, utility "
        f"{best.utility:.6g}) costs {best.cost:.6g}, payoff {best.payoff:.6g} <= 0"
    )
    if not drivers:
        return head
    parts = ", ".join(
        f"{d.resource} on {d.server} in slots {d.first_slot}..{d.last_slot} "
        f"(cost {d.cost:.4g}, unit price up to {d.price:.4g})"
        for d in drivers
    )
    return f"{head}; the costliest parts: {parts}"
