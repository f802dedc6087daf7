"""The admission controller as the execution plane sees it: the one interface the plane
depends on, so that it never imports :mod:`controller.admission` (which refers back to
the plane's :class:`~controller.plane.execution.Execution`).

:class:`controller.admission.AdmissionController` satisfies :class:`AdmissionPort`
structurally; mypy checks it where the daemon hands the controller to the plane.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol, TypeVar

from sqlalchemy.orm import Session

from controller.clock import SlotClock
from controller.config import Config
from controller.events import Event, EventBus
from controller.store import Database, JobRow
from pricing import Job, Ledger
from pricing.best_schedule import BestSchedule
from pricing.cluster import Cluster
from pricing.schedule import Schedule

__all__ = ["AdmissionPort", "CordonPort"]

_T = TypeVar("_T")


class CordonPort(Protocol):
    """A server's cordon as the plane reads it (:class:`controller.admission.views.Cordon`)."""

    @property
    def until(self) -> int | None:
        """The first slot back in service, if the cordon has an end."""

    def started(self, slot: int) -> bool:
        """Whether the server is out from the slot after ``slot`` on (not only planned)."""


class AdmissionPort(Protocol):
    """What the plane reads and calls of the admission controller.

    Everything but :meth:`_run`, :meth:`stored_events` and :meth:`_publish` is used in
    the decision thread only (inside a function given to :meth:`_run`)."""

    config: Config
    cluster: Cluster
    db: Database
    slots: SlotClock
    bus: EventBus
    window: int
    """Slots a job may be planned over, ``T``."""
    slot: int
    """The window's current slot."""
    ledger: Ledger | None
    """The ledger; replaced (then rebuilt with :meth:`_rebuild`) after a re-plan."""
    prune_hooks: list[Callable[[list[str]], None]]
    """Called (in the decision thread) with the ids of each batch of deleted jobs."""

    @property
    def cordoned(self) -> Mapping[str, CordonPort]:
        """Cordoned servers, planned cordons included (an operator's; heartbeats do not
        end it)."""

    @property
    def _ledger(self) -> Ledger:
        """The ledger of an opened controller."""

    def _write(self) -> AbstractContextManager[Session]:
        """A fenced store transaction that writes (the leader's only)."""

    async def _run(self, fn: Callable[[], _T], client: str = "") -> _T:
        """Run ``fn`` in the decision thread, serialised with the decisions, in
        ``client``'s turn (``""``: the daemon's own)."""

    async def stored_events(
        self, after: int, limit: int | None = None, newest: bool = False
    ) -> list[Event]:
        """Job events after sequence ``after``, from the store (the first ``limit``)."""

    def _publish(self, events: list[Event]) -> None:
        """Hand committed events to the bus."""

    def _advance_window(self) -> None:
        """Move the window to the current slot."""

    def _cordon_sync(
        self, server: str, reason: str = "", by: str | None = None, dry_run: bool = False,
        force: bool = False, until: int | None = None,
    ) -> tuple[dict[str, Any], list[Event]]:  # fmt: skip
        """Cordon ``server`` from the next slot on, up to ``until`` (:mod:`.cordons`)."""

    def _block_cordon(self, server: str) -> None:
        """Block ``server``'s cordon in the ledger again from the next slot, if it has
        one (after a recovery unblocked it)."""

    def _window_end(self, arrival: int) -> int:
        """The last slot a job arriving at ``arrival`` may be planned in (SPEC 1)."""

    def _parse(self, spec: Any, arrival: int) -> Job:
        """A stored spec as a job arriving at slot ``arrival``."""

    def _rebuild(self) -> int:
        """Admit every stored allocation into :attr:`ledger`; returns the jobs rebuilt."""

    def _event(
        self, session: Session, now: datetime, kind: str, job_id: str, state: str,
        detail: dict[str, Any],
    ) -> Event:  # fmt: skip
        """Record a job event in ``session`` (committed with it)."""

    def _write_schedule(
        self, session: Session, job: Job, row: JobRow, schedule: Schedule, from_slot: int
    ) -> None:
        """Store ``schedule``'s slots from ``from_slot`` on as the job's allocations."""

    def _record_move(
        self, session: Session, now: datetime, job: Job, how: str, from_slot: int,
        detail: dict[str, Any], best: BestSchedule | None = None,
    ) -> Event:  # fmt: skip
        """Store a re-placed, re-planned or stranded job's plan and its event."""

    def _allocation_rows(self, job_id: str, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """SPEC 6 allocation entries as store rows, one per (slot, server)."""
