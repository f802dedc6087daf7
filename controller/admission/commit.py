"""The decisions' side of group commit (:mod:`.writer`): what a decision writes, how a
batch of them is committed, and what a failed batch does to the controller.

A submission's write set is a :class:`DecisionRows`: its job row (without a sequence:
the batch gives sequences in decision order, after the largest stored one), its
allocation rows, the bound estimate after it, and its ``decided`` event. A batch is
written by :func:`controller.store.decisions.write_decisions` (a few statements a batch
whatever its size, fenced once), in the writer thread or, in the daemon, in its commit
process (:mod:`controller.store.commit_process`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from controller.admission.state import AdmissionState
from controller.admission.writer import WriteSet
from controller.errors import NotLeaderError
from controller.events import Event
from controller.store import StoreUnavailableError
from controller.store.commit_process import CommitProcessStartError
from controller.store.decisions import DecisionPayload, estimate_rows, write_decisions
from controller.store.writer_lock import FencedError
from pricing.shared_estimate import SharedEstimate, submitter_key

__all__ = ["Committed", "DecisionRows", "Deferred", "GroupCommit"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class DecisionRows:
    """One decision's rows (see the module docstring); ``job`` has every column of
    ``jobs`` but ``sequence``, ``event`` every column of ``events`` but ``sequence``."""

    job: dict[str, Any]
    allocations: list[dict[str, Any]]
    estimate: SharedEstimate | None
    """The estimate after the decision (immutable); only a batch's last is written, and
    turned into JSON there, in the writer thread."""
    event: dict[str, Any]

    def payload(self, changed: Iterable[str] | None = None) -> DecisionPayload:
        """The rows as the store writes them, with the estimate's meta rows for the
        submitters ``changed`` (:func:`~controller.store.decisions.estimate_rows`); None:
        no estimate (a later decision of the batch carries the one written)."""
        estimate = self.estimate if changed is not None else None
        rows = estimate_rows(estimate, changed or ()) if estimate is not None else None
        return DecisionPayload(self.job, self.allocations, rows, self.event)


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
        """Commit ``batch`` in one fenced transaction, in order (the writer thread),
        itself or through the commit process."""
        self._fence_here()
        last = max((i for i, ws in enumerate(batch) if ws.rows.estimate is not None), default=-1)
        changed = {  # whose estimates the batch moved: only theirs are written
            submitter_key(ws.rows.job["submitter"]) for ws in batch if ws.rows.estimate is not None
        }
        payloads = [ws.rows.payload(changed if i == last else None) for i, ws in enumerate(batch)]
        epoch, lock_pid = self.fence_epoch, self.fence_pid
        written = None
        if self._committer is not None:
            with contextlib.suppress(CommitProcessStartError):  # nothing sent: write it here
                written = self._committer.commit(payloads, self._last_sequence, epoch, lock_pid)
        if written is None:
            with self.db.held_session() as session:
                written = write_decisions(session, payloads, self._last_sequence, epoch, lock_pid)
        self.db.note_written()  # the store takes writes: the Admission service serves
        numbers = written.events
        if numbers and min(numbers) <= self._seen_event:  # the store's numbering went back
            self._note_rewound(f"the store numbered new events from {min(numbers)}, at or "
                               f"below event {self._seen_event} this daemon applied")  # fmt: skip
        # committed: these events are this leader's own, reflected in its ledger already
        self._seen_event = max(self._seen_event, *numbers)
        first = written.first_sequence
        self._last_sequence = first + len(batch) - 1
        done = []
        for i, (p, n) in enumerate(zip(payloads, numbers, strict=True)):
            e = p.event
            event = Event(n, e["kind"], e["job_id"], e["slot"], e["state"], e["detail"])
            done.append(Committed(first + i, event))
        return done

    def _commit_failed(self, err: BaseException) -> BaseException:
        """A batch failed (the writer thread): the ledger holds decisions the store may
        not, so it is rebuilt before the next step; returns what the callers get."""
        self._stale = True
        self._last_sequence = None
        self.db.note_failed_write(str(err))
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
