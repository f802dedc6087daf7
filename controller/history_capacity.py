"""What the servers could give the compared jobs of ``oasis offline --store``: the
capacity left after the held jobs, less the slots each server was out of service.

- **Outages.** A server cordoned by an operator or declared failed by the execution
  plane is out of service in slots ``down_from .. up_from - 1`` (the ``server_outages``
  rows; no ``up_from``: to the end of the horizon). The daemon planned nothing there, so
  the offline optimum may not either: each such slot's whole capacity is held. Before,
  the outages were not read, and the optimum (and its "certified" bound) used servers
  the daemon could not.
- **Held use over capacity.** Allocations of jobs outside the comparison that add up to
  more than a server's capacity (a store edited by hand, plans stored before the
  servers shrank) left the compared jobs a negative capacity, a problem no allocation
  satisfies, not even admitting nothing: the comparison failed with "the starting
  allocation breaks SPEC 3-5", naming no row. The held use is cut to the capacity there
  (nothing is left to the compared jobs in those cells), and a note names the first
  such cell and the jobs in it.

Amounts are per slot, in each resource's unit (the cluster's capacities).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.store import OutageRow
from pricing.cluster import Cluster
from pricing.fields import is_integer
from pricing.ledger import capacity_slack

__all__ = ["block_outages", "clip_over_capacity", "read_outages"]


def read_outages(session: Session, end: int) -> Sequence[Any]:
    """The ``server_outages`` rows that begin before store slot ``end`` (``id``,
    ``server``, ``down_from``, ``up_from``)."""
    return session.execute(
        select(OutageRow.id, OutageRow.server, OutageRow.down_from, OutageRow.up_from)
        .where(OutageRow.down_from < end)
        .order_by(OutageRow.id)
    ).all()


def block_outages(
    rows: Sequence[Any],
    cluster: Cluster,
    first: int,
    worker_used: NDArray[np.float64],
    ps_used: NDArray[np.float64],
) -> list[str]:
    """Hold the whole capacity of every server in the slots of its outages (``rows``,
    :func:`read_outages`) that fall in the problem's slots (store slots ``first ..
    first + T - 1``, ``T`` the arrays' first axis), in place; returns notes for the
    operator (the servers blocked, and each row that does not read back, which is left
    out as the daemon leaves it out)."""
    end = first + worker_used.shape[0]
    where = {name: ("worker", i) for i, name in enumerate(cluster.worker_names)}
    where |= {name: ("ps", i) for i, name in enumerate(cluster.ps_names)}
    notes: list[str] = []
    applied: set[str] = set()
    for row in rows:
        if not is_integer(row.down_from) or not (row.up_from is None or is_integer(row.up_from)):
            notes.append(
                f"the store's server_outages row {row.id} ({str(row.server)[:64]}): its "
                "slots do not read back; left out, as the daemon leaves it out"
            )
            continue
        stop = end if row.up_from is None else min(row.up_from, end)
        start = max(row.down_from, first)
        if row.server not in where or stop <= start:
            continue
        kind, i = where[row.server]
        used, capacity = (
            (worker_used, cluster.worker_capacity[i])
            if kind == "worker"
            else (ps_used, cluster.ps_capacity[i])
        )
        cells = used[start - first : stop - first, i]
        np.maximum(cells, capacity, out=cells)
        applied.add(row.server)
    if applied:
        notes.append(
            f"servers out of service (cordoned or failed) in these slots, held whole as "
            f"they were for the daemon: {', '.join(sorted(applied))}"
        )
    return notes


def clip_over_capacity(
    cluster: Cluster,
    first: int,
    worker_used: NDArray[np.float64],
    ps_used: NDArray[np.float64],
    allocations: Sequence[Any],
    compared: set[str],
) -> list[str]:
    """Cut the held use to the capacity where it is over it, in place (module
    docstring); ``allocations``: the rows read (``job_id``, ``slot``, ``server``), to
    name the jobs of the first such cell. Returns a note, or none.

    Use over the capacity by no more than the ledger's slack (:func:`capacity_slack`)
    is what SPEC 5's room ``floor(free / w + 1e-9)`` places (four workers of 4e9 + 1
    bytes on 16e9): it is cut without a note. Before, it was noted as "a store edited
    by hand" when over by more than ``1e-7``."""
    notes: list[str] = []
    for kind, used, capacity, names in (
        ("worker", worker_used, cluster.worker_capacity, cluster.worker_names),
        ("PS", ps_used, cluster.ps_capacity, cluster.ps_names),
    ):
        over = used > capacity[None] + capacity_slack(capacity)[None]
        if not over.any():
            np.minimum(used, capacity[None], out=used)
            continue
        t, s, r = (int(x) for x in np.argwhere(over)[0])
        slot, server = first + t, names[s]
        jobs = sorted(
            {a.job_id for a in allocations if a.slot == slot and a.server == server} - compared
        )
        notes.append(
            f"the held jobs' allocations exceed the capacity of {kind} server(s) in "
            f"{int(over.any(axis=2).sum())} (slot, server) cell(s), e.g. slot {slot} on "
            f"{server}: {used[t, s, r]:g} of {capacity[s, r]:g} "
            f"{cluster.resources[r]}, by jobs {', '.join(repr(j) for j in jobs[:5])}"
            f"{' ...' if len(jobs) > 5 else ''} (a store edited by hand, or plans made "
            "before the servers shrank); cut to the capacity there"
        )
        np.minimum(used, capacity[None], out=used)
    return notes
