"""The decisions' side of group commit (:mod:`.writer`): what a decision writes, how a
batch of them is committed (SQLAlchemy Core, a few statements a batch whatever its
size, fenced once), and what a failed batch does to the controller.

A submission's write set is a :class:`DecisionRows`: its job row (without a sequence:
the batch gives sequences in decision order, after the largest stored one), its
allocation rows, the bound estimate after it, and its ``decided`` event. Events get
their sequences from the store, in the same order (``INSERT ... RETURNING``, sorted by
parameter order).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import func, insert, select, update

from controller.admission.state import ESTIMATE_KEY, AdmissionState
from controller.admission.writer import WriteSet
from controller.errors import NotLeaderError
from controller.events import Event
from controller.store import AllocationRow, EventRow, JobRow, MetaRow, StoreUnavailableError
from controller.store.writer_lock import FencedError
from pricing.bound_estimate import BoundEstimate

__all__ = ["Committed", "DecisionRows", "Deferred", "GroupCommit"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class DecisionRows:
    """One decision's rows (see the module docstring); ``job`` has every column of
    ``jobs`` but ``sequence``, ``event`` every column of ``events`` but ``sequence``."""

    job: dict[str, Any]
    allocations: list[dict[str, Any]]
    estimate: BoundEstimate | None
    """The estimate after the decision (immutable); only a batch's last is written, and
    turned into JSON there, in the writer thread."""
    event: dict[str, Any]


@dataclass(frozen=True)
class Committed:
    """What the store gave a committed decision: its job's sequence and its event."""

    sequence: int
    event: Event


@dataclass(frozen=True)
class Deferred(Generic[_T]):
    """A step's result that is ready once a commit resolves: the controller awaits
    ``future`` (off the decision thread) and returns ``then(its result)``."""

    future: Future[Any]
    then: Callable[[Any], _T]


class GroupCommit(AdmissionState):
    """Commit batches of decisions; see the module docstring."""

    def _commit_batch(self, batch: list[WriteSet]) -> list[Committed]:
        """Commit ``batch`` in one fenced transaction, in order (the writer thread)."""
        rows: list[DecisionRows] = [ws.rows for ws in batch]
        with self.db.held_session() as session:
            self._fence(session)
            conn = session.connection()
            sequence = self._last_sequence
            if sequence is None:  # after another write, or a failure: as stored
                sequence = int(conn.scalar(select(func.max(JobRow.sequence))) or 0)
            jobs = []
            for r in rows:
                sequence += 1
                jobs.append({**r.job, "sequence": sequence})
            conn.execute(insert(JobRow), jobs)
            allocations = [a for r in rows for a in r.allocations]
            if allocations:
                conn.execute(insert(AllocationRow), allocations)
            last = next((r.estimate for r in reversed(rows) if r.estimate is not None), None)
            if last is not None:  # the last one of the batch: one UPDATE
                value = last.to_dict()
                stmt = update(MetaRow).where(MetaRow.key == ESTIMATE_KEY).values(value=value)
                if conn.execute(stmt).rowcount == 0:
                    conn.execute(insert(MetaRow).values(key=ESTIMATE_KEY, value=value))
            stmt_events = insert(EventRow).returning(
                EventRow.sequence, sort_by_parameter_order=True
            )
            numbers = list(conn.execute(stmt_events, [r.event for r in rows]).scalars())
        # committed: these events are this leader's own, reflected in its ledger already
        self._seen_event = max(self._seen_event, *numbers)
        self._last_sequence = sequence
        first = jobs[0]["sequence"]
        done = []
        for i, (r, n) in enumerate(zip(rows, numbers, strict=True)):
            e = r.event
            event = Event(n, e["kind"], e["job_id"], e["slot"], e["state"], e["detail"])
            done.append(Committed(first + i, event))
        return done

    def _commit_failed(self, err: BaseException) -> BaseException:
        """A batch failed (the writer thread): the ledger holds decisions the store may
        not, so it is rebuilt before the next step; returns what the callers get."""
        self._stale = True
        self._last_sequence = None
        if isinstance(err, FencedError):  # another daemon leads now: nothing was committed
            self.leader = err.holder
            self._step_down(str(err))
            return self._not_leader("this oasisd has just stopped leading")
        if isinstance(err, StoreUnavailableError | NotLeaderError):
            self.log.warning("commit failed; the ledger is rebuilt from the store",
                             error=str(err))  # fmt: skip
            return err
        self.log.error("commit failed; the ledger is rebuilt from the store", exc_info=err)
        return err

    def _queue_write(
        self, rows: DecisionRows, finish: Callable[[Committed], Any], after: Callable[[], None]
    ) -> Future[Any]:
        """Hand ``rows`` to the writer; ``finish(Committed)`` builds the answer, ``after()``
        runs once it is out (the writer thread)."""
        return self._writer.submit(WriteSet(rows, finish, self._generation, after))
