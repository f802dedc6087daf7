"""Writing a batch of decisions in one transaction: the group-commit writer's statements
(SQLAlchemy Core, a few a batch whatever its size, fenced once), used in the daemon's
writer thread or in its commit process (:mod:`controller.store.commit_process`).

A decision's rows are a :class:`DecisionPayload` of plain data (picklable, so they can
cross to the commit process): its job row without a sequence (the batch gives sequences
in decision order, after the largest stored one), its allocation rows, the bound
estimate after it as ``meta`` rows to write (:func:`estimate_rows`; only a batch's last
one is written) and its ``decided`` event without a sequence. Events get their sequences
from the store, in the same order (``INSERT ... RETURNING``, sorted by parameter order).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from controller.store.models import AllocationRow, EventRow, JobRow, MetaRow
from controller.store.writer_lock import check_epoch

if TYPE_CHECKING:  # the commit process writes dicts; it needs no pricing
    from pricing.shared_estimate import SharedEstimate

__all__ = [
    "ESTIMATE_KEY",
    "SUBMITTER_ESTIMATE_PREFIX",
    "BatchWritten",
    "DecisionPayload",
    "estimate_rows",
    "submitter_estimate_key",
    "write_decisions",
]

ESTIMATE_KEY = "bound_estimate"
"""Meta row with the bound estimate's state: ``SharedEstimate.head()`` (the lone
``BoundEstimate.to_dict()`` before per-submitter estimates)."""
SUBMITTER_ESTIMATE_PREFIX = ESTIMATE_KEY + "/"
"""Meta rows ``bound_estimate/<sha256 of the name, 40 hex>``: one submitter's estimate,
``{"name": name, "state": SharedEstimate.state(name)}`` (a name may be 200 characters;
a key, 64)."""


def submitter_estimate_key(name: str) -> str:
    """The meta row of submitter ``name``'s estimate."""
    return SUBMITTER_ESTIMATE_PREFIX + hashlib.sha256(name.encode()).hexdigest()[:40]


def estimate_rows(estimate: SharedEstimate, names: Iterable[str]) -> dict[str, Any]:
    """The meta rows that store ``estimate`` after its submitters ``names`` changed:
    the head, and the state of each of those (the others are as stored)."""
    rows: dict[str, Any] = {ESTIMATE_KEY: estimate.head()}
    for name in names:
        if name in estimate.submitters:
            rows[submitter_estimate_key(name)] = {"name": name, "state": estimate.state(name)}
    return rows


class DecisionPayload(NamedTuple):
    """One decision's rows (see the module docstring): ``job`` has every column of
    ``jobs`` but ``sequence``, ``event`` every column of ``events`` but ``sequence``."""

    job: dict[str, Any]
    allocations: list[dict[str, Any]]
    estimate: dict[str, Any] | None
    """Meta rows to write, by key (:func:`estimate_rows`); None: none."""
    event: dict[str, Any]


class BatchWritten(NamedTuple):
    """What the store gave a batch: the first job's sequence (the others follow it in
    order) and each decision's event sequence."""

    first_sequence: int
    events: list[int]


MAX_JOB_SEQUENCE = 1 << 62
"""Job sequences are counted on from the largest stored below this: one an edit set to
2**63 - 1 (the largest BIGINT) made the next number overflow, and every tenant's
submission failed. Numbering on from any row below it cannot overflow, and a row at or
above it (or text, which SQLite keeps in an integer column) is left where it is."""


def last_job_sequence(session: Session) -> int:
    """The largest job sequence stored below :data:`MAX_JOB_SEQUENCE` (0: none): the
    number new jobs count on from, the same whether the writer knew it or read it."""
    below = select(func.max(JobRow.sequence)).where(JobRow.sequence < MAX_JOB_SEQUENCE)
    return int(session.connection().scalar(below) or 0)


_JOBS, _ALLOCATIONS, _EVENTS, _META = (
    row.metadata.tables[row.__tablename__] for row in (JobRow, AllocationRow, EventRow, MetaRow)
)
# built once, so each batch reuses their compiled forms (built per batch with the ORM's
# columns, their construction and cache keys were a fifth of the commit process's CPU)
_INSERT_JOBS = insert(_JOBS)
_INSERT_ALLOCATIONS = insert(_ALLOCATIONS)
_UPDATE_META = (
    update(_META)
    .where(_META.c.key == bindparam("meta_key"))
    .values(value=bindparam("meta_value", type_=_META.c.value.type))
)
_INSERT_META = insert(_META)
_INSERT_EVENTS = insert(_EVENTS).returning(_EVENTS.c.sequence, sort_by_parameter_order=True)


def write_decisions(
    session: Session,
    payloads: list[DecisionPayload],
    last_sequence: int | None,
    epoch: int | None,
    lock_pid: int | None,
) -> BatchWritten:
    """Write ``payloads`` (at least one) in ``session``'s transaction, in order.

    Args:
        last_sequence: the largest job sequence stored, if the caller knows it (None:
            it is read).
        epoch, lock_pid: the fence (:func:`~controller.store.writer_lock.check_epoch`),
            checked first; ``epoch`` None: not fenced (no high availability).

    Raises:
        FencedError: the store's epoch is not ``epoch`` any more (nothing is written).
    """
    if epoch is not None:
        check_epoch(session, epoch, lock_pid)
    conn = session.connection()
    sequence = last_sequence
    if sequence is None:  # after another write, or a failure: as stored
        sequence = last_job_sequence(session)
    first = sequence + 1
    jobs = [{**p.job, "sequence": first + i} for i, p in enumerate(payloads)]
    conn.execute(_INSERT_JOBS, jobs)
    allocations = [a for p in payloads for a in p.allocations]
    if allocations:
        conn.execute(_INSERT_ALLOCATIONS, allocations)
    last = next((p.estimate for p in reversed(payloads) if p.estimate is not None), None)
    for key, value in (last or {}).items():  # the last one of the batch: an UPDATE a row
        if conn.execute(_UPDATE_META, {"meta_key": key, "meta_value": value}).rowcount == 0:
            conn.execute(_INSERT_META, {"key": key, "value": value})
    numbers = list(conn.execute(_INSERT_EVENTS, [p.event for p in payloads]).scalars())
    return BatchWritten(first, numbers)
