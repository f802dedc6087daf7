"""Why a job was priced out: the parts of its best schedule that cost the most, or why
nothing fits at all. Operators read these in a rejection."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pricing.best_schedule import BestSchedule
from pricing.job import Job, room
from pricing.ledger import Ledger

__all__ = ["PriceDriver", "explain_rejection", "price_drivers"]


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
    """The ``top`` costliest (server, resource, run of slots) parts of ``best``'s schedule."""
    sched = best.schedule
    if sched is None:
        return []
    lo = ledger.index(sched.start)
    hi = lo + sched.slots
    parts: list[PriceDriver] = []
    cluster = ledger.cluster
    for counts, side, demand, names in (
        (sched.workers, ledger.worker_side, job.worker, cluster.worker_names),
        (sched.ps, ledger.ps_side, job.ps, cluster.ps_names),
    ):
        # (n, servers, R): cost of each resource on each server in each slot
        cost = counts[:, :, None] * side.price[lo:hi] * demand[None, None, :]
        positive = cost > 0
        # only the (server, resource) columns the schedule uses; runs found by edges
        for srv, r in np.argwhere(positive.any(axis=0)).tolist():
            col = cost[:, srv, r]
            edges = np.diff(np.concatenate(([0], positive[:, srv, r].view(np.int8), [0])))
            starts = np.flatnonzero(edges == 1).tolist()
            ends = np.flatnonzero(edges == -1).tolist()
            for start, k in zip(starts, ends, strict=True):
                parts.append(
                    PriceDriver(
                        resource=cluster.resources[r],
                        server=names[srv],
                        first_slot=sched.start + start,
                        last_slot=sched.start + k - 1,
                        cost=float(col[start:k].sum()),
                        price=float(side.price[lo + start : lo + k, srv, r].max()),
                    )
                )
    parts.sort(key=lambda p: -p.cost)
    return parts[:top]


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
        lo, hi = ledger.index(first_slot), ledger.index(last_slot) + 1
        free_w = ledger.worker_side.capacity[None] - ledger.worker_side.used[lo:hi]
        worst = ""
        least = None
        for r, name in enumerate(ledger.cluster.resources):
            if job.worker[r] <= 0:
                continue
            units = int(room(free_w[:, :, r : r + 1], job.worker[r : r + 1]).sum())
            if least is None or units < least:
                least, worst = units, name
        fit = int(room(free_w, job.worker).clip(max=job.chunks).sum())
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
