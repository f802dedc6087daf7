"""The daemon's admission controller: Alg. 1 over a rolling window, backed by the store.

Every decision is serialised (each one changes prices), computed off the event loop in
one worker thread (the compiled search releases the GIL), committed to the store, and
only then applied to the in-memory ledger and answered. After a crash, :meth:`open`
rebuilds the ledger from the store's allocations in decision order, which reproduces the
prices bit for bit, so the next decision equals that of a daemon that never stopped.

The window: at slot ``s`` the ledger covers ``s .. s + T``; a job submitted during ``s``
arrives at ``a = s + 1`` and may be planned over ``a .. a + T - 1`` (SPEC 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import structlog
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session

from controller.clock import SlotClock
from controller.config import Config
from controller.events import Event, EventBus
from controller.limits import check_job_id
from controller.replay import allocations as allocation_entries
from controller.store import (
    AllocationRow,
    Database,
    EventRow,
    JobRow,
    MetaRow,
    OutageRow,
    ServerRow,
    StoreUnavailableError,
    migrate,
)
from pricing import ADMIT_THRESHOLD, Job, Ledger, OasisError, SpecError, job_from_dict
from pricing.best_schedule import BestSchedule, best_schedule, warm_up
from pricing.bound_estimate import BoundEstimate
from pricing.explain import explain_rejection, price_drivers
from pricing.fields import text
from pricing.prices import PriceBounds
from pricing.schedule import Schedule

if TYPE_CHECKING:
    from controller.plane.execution import Execution

__all__ = [
    "STATES",
    "AdmissionController",
    "ConflictError",
    "DecisionView",
    "DrainingError",
    "JobView",
    "NotFoundError",
    "PreconditionError",
]

STATES = ("admitted", "running", "completed", "cancelled", "rejected", "failed")
_ESTIMATE_KEY = "bound_estimate"
SETTINGS_KEY = "settings"
"""Meta row with the settings that give stored slots their meaning (``oasis offline
--store`` reads them): ``{"window": T, "slot_seconds": s}``."""
_T = TypeVar("_T")


class NotFoundError(OasisError):
    """No job with that id."""


class ConflictError(OasisError):
    """The job id exists with another spec."""


class PreconditionError(OasisError):
    """The job is in a state that does not allow the request."""


class DrainingError(OasisError):
    """The daemon is stopping: it finishes the decisions in flight and takes no new ones."""


@dataclass(frozen=True)
class DecisionView:
    """A decision as the API reports it (allocations as in SPEC 6)."""

    admitted: bool
    payoff: float | None
    cost: float | None
    completion_slot: int | None
    jct: int | None
    utility: float | None
    arrival_slot: int
    work: int
    allocations: list[dict[str, Any]]
    reason: str = ""
    drivers: list[dict[str, Any]] = field(default_factory=list)
    decision_ms: float = 0.0


@dataclass(frozen=True)
class JobView:
    """A stored job: spec, state and decision."""

    id: str
    spec: dict[str, Any]
    state: str
    decision: DecisionView
    submitted_slot: int
    sequence: int
    duplicate: bool = False


def canonical_spec(spec: dict[str, Any]) -> str:
    """The spec as canonical JSON: equal specs give equal strings."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))


class AdmissionController:
    """Owns the ledger, the price bounds and the store; see the module docstring."""

    def __init__(
        self,
        config: Config,
        db: Database,
        slots: SlotClock,
        bus: EventBus | None = None,
        log: Any = None,
    ) -> None:
        self.config = config
        self.cluster = config.cluster
        self.db = db
        self.slots = slots
        self.bus = bus or EventBus()
        self.log = log or structlog.get_logger("oasisd")
        self.window = config.window
        self._lock = asyncio.Lock()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="decide")
        self._draining = False
        self._in_flight = 0  # requests inside _run: queued on the lock or deciding
        self._idle = asyncio.Event()
        self._estimate = BoundEstimate.empty(len(self.cluster.resources))
        # a store outage during a write may have cut off a commit that happened: rebuild
        # the ledger from the store before the next decision (_run)
        self._stale = False
        self.ledger: Ledger | None = None
        self.slot = 0
        # the slot whose job-state changes are done: the window (self.slot) may move on
        # first, in a decision or the plane's review, and the tick must still run then
        self._ticked_slot = -1
        self.execution: Execution | None = None  # the execution plane, with a broker

    # -- start-up ----------------------------------------------------------------------

    def open(self) -> None:
        """Migrate the store, record the servers and rebuild the ledger (blocking)."""
        revision = migrate(self.db)
        warm_up()
        self.slot = self.slots.current_slot()
        with self.db.session() as session:
            self._sync_servers(session)
            settings = {"window": self.window, "slot_seconds": self.config.slot_seconds}
            session.merge(MetaRow(key=SETTINGS_KEY, value=settings))
        rebuilt = self._reload()
        if self.config.mqtt is None:
            self._tick_sync()
        # else the first tick() runs once the execution plane is attached and has loaded
        # the progress it needs to tell which ended plans left their work unfinished
        self.log.info(
            "store ready",
            revision=revision,
            store=self.db.engine.url.render_as_string(hide_password=True),
            slot=self.slot,
            jobs_in_window=rebuilt,
        )

    def _reload(self) -> int:
        """Read the bound estimate and rebuild the ledger from the store (blocking);
        returns the jobs rebuilt. Nothing changes if the store fails meanwhile."""
        estimate = BoundEstimate.empty(len(self.cluster.resources))
        with self.db.session() as session:
            meta = session.get(MetaRow, _ESTIMATE_KEY)
            if meta is not None and self.config.pricing.mode == "estimate":
                # None: a state of an older format; the estimate starts afresh
                estimate = BoundEstimate.from_dict(meta.value) or estimate
        previous = self.ledger
        bounds = self._bounds(estimate)
        self.ledger = Ledger(self.cluster, bounds, self.window + 1, origin=self.slot)
        try:
            rebuilt = self._rebuild()
        except BaseException:
            self.ledger = previous
            raise
        self._estimate = estimate
        return rebuilt

    def _sync_servers(self, session: Session) -> None:
        session.execute(delete(ServerRow))
        for pos, (kind, _, name, caps) in enumerate(self.cluster.servers()):
            capacity = dict(zip(self.cluster.resources, caps.tolist(), strict=True))
            session.add(ServerRow(name=name, kind=kind, position=pos, capacity=capacity))

    def _bounds(self, estimate: BoundEstimate) -> PriceBounds:
        pricing = self.config.pricing
        if pricing.mode == "explicit":
            assert pricing.bounds is not None
            return pricing.bounds
        bounds = estimate.bounds(pricing.l_margin, pricing.u_margin, pricing.trim)
        if bounds is None:  # before any job: flat unit prices, replaced at the first job
            zeros = np.zeros(len(self.cluster.resources))
            return PriceBounds(zeros, zeros, 0.0, 0.0, 1.0, 1.0)
        return bounds

    def _rebuild(self) -> int:
        """Admit every stored allocation from the window's first slot on, in decision order."""
        ledger = self._ledger
        with self.db.session() as session:
            rows = session.execute(
                select(JobRow.id, JobRow.spec, AllocationRow.slot, AllocationRow.server,
                       AllocationRow.workers, AllocationRow.ps)
                .join(AllocationRow, AllocationRow.job_id == JobRow.id)
                .where(AllocationRow.slot >= ledger.origin)
                .order_by(JobRow.sequence, AllocationRow.slot)
            ).all()  # fmt: skip
        by_job: dict[str, list[Any]] = {}
        specs: dict[str, str] = {}
        for row in rows:
            by_job.setdefault(row.id, []).append(row)
            specs[row.id] = row.spec
        w_index = {n: i for i, n in enumerate(self.cluster.worker_names)}
        p_index = {n: i for i, n in enumerate(self.cluster.ps_names)}
        for job_id, allocs in by_job.items():
            job = self._parse(json.loads(specs[job_id]), arrival=ledger.origin)
            start = allocs[0].slot
            end = min(allocs[-1].slot, ledger.end - 1)
            workers = np.zeros((end - start + 1, len(w_index)), np.int32)
            ps = np.zeros((end - start + 1, len(p_index)), np.int32)
            for a in allocs:
                if a.slot > end:
                    continue
                if a.server in w_index:
                    workers[a.slot - start, w_index[a.server]] = a.workers
                elif a.server in p_index:
                    ps[a.slot - start, p_index[a.server]] = a.ps
                else:
                    self.log.warning("allocation on a server no longer configured",
                                     job=job_id, server=a.server)  # fmt: skip
            ledger.admit(job_id, job.worker, job.ps, Schedule(start, workers, ps))
        self._block_failed_servers(ledger)
        return len(by_job)

    def _block_failed_servers(self, ledger: Ledger) -> None:
        """Take servers declared failed (the execution plane) out of their slots again."""
        with self.db.session() as session:
            outages = session.scalars(select(OutageRow).order_by(OutageRow.id)).all()
        for o in outages:
            if o.up_from is not None and o.up_from <= ledger.origin:
                continue
            if o.server in self.cluster.worker_names:
                kind, index = "worker", self.cluster.worker_names.index(o.server)
            elif o.server in self.cluster.ps_names:
                kind, index = "ps", self.cluster.ps_names.index(o.server)
            else:
                continue
            # A recovered server may hold new jobs from up_from on: block only the outage.
            ledger.block(kind, index, o.down_from, o.up_from)

    @property
    def _ledger(self) -> Ledger:
        if self.ledger is None:
            raise RuntimeError("the controller is not open")
        return self.ledger

    def _parse(self, spec: Any, arrival: int) -> Job:
        return job_from_dict(
            spec,
            self.cluster,
            slot_seconds=self.config.slot_seconds,
            slots_available=lambda _a: self.window,
            arrival=arrival,
            field="job",
        )

    # -- async API (serialised, off the event loop) ---------------------------------------

    async def _run(self, fn: Callable[[], _T]) -> _T:
        if self._draining:
            raise DrainingError("the daemon is stopping (draining); retry on its successor")
        self._in_flight += 1
        self._idle.clear()
        try:
            async with self._lock:
                return await asyncio.get_running_loop().run_in_executor(
                    self._executor, lambda: self._in_step(fn)
                )
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    @property
    def draining(self) -> bool:
        """True once :meth:`drain` began: new submissions, quotes and cancels are refused."""
        return self._draining

    async def drain(self, timeout: float) -> int:
        """Refuse new requests and wait up to ``timeout`` seconds for those in flight to be
        decided and committed. Returns how many were still in flight at the timeout."""
        self._draining = True
        if self._in_flight:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout)
        return self._in_flight

    async def read(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` in the decision thread between two ledger changes and return its
        result (from the event loop): a read of the ledger never sees half a decision."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def between_decisions(self, fn: Callable[[], _T], timeout: float = 10.0) -> _T:
        """Run ``fn`` in the decision thread between two decisions and return its result
        (blocking; from any thread but the event loop's). The ledger is only changed in that
        thread, so ``fn`` reads it whole, never half-updated."""
        return self._executor.submit(fn).result(timeout)

    def _in_step(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` in the decision thread on a ledger that matches the store."""
        if self._stale:
            rebuilt = self._reload()  # StoreUnavailableError: still stale, try next time
            self._stale = False
            self.log.info("ledger rebuilt from the store after an outage", jobs=rebuilt)
        try:
            return fn()
        except StoreUnavailableError:
            self._stale = True
            raise

    async def submit(
        self, spec: dict[str, Any], by: str | None = None, owner: str | None = None
    ) -> JobView:
        """Decide ``spec`` and commit; idempotent by job id.

        ``by`` is recorded as the job's submitter; with ``owner`` set, a job id of another
        submitter is a conflict rather than a duplicate."""
        view, events = await self._run(lambda: self._submit_sync(spec, by, owner))
        self._publish(events)
        return view

    async def quote(self, spec: dict[str, Any]) -> DecisionView:
        """Decide ``spec`` without committing anything."""
        return await self._run(lambda: self._quote_sync(spec))

    async def cancel(self, job_id: str) -> tuple[JobView, int]:
        """Cancel a job: its slots from the next one on are released."""
        view, released, events = await self._run(lambda: self._cancel_sync(job_id))
        self._publish(events)
        return view, released

    async def tick(self) -> None:
        """Advance to the current slot, if it changed: window and job states."""
        if self._draining or self.slots.current_slot() == self._ticked_slot:
            return
        events = await self._run(self._tick_sync)
        self._publish(events)

    async def get(self, job_id: str, owner: str | None = None) -> JobView:
        """One job; with ``owner`` set, only if that submitter submitted it."""
        return await asyncio.to_thread(self._get_sync, job_id, owner)

    async def list_jobs(
        self, states: Sequence[str], limit: int, owner: str | None = None
    ) -> list[JobView]:
        """Jobs in decision order; with ``owner`` set, only that submitter's."""
        return await asyncio.to_thread(self._list_sync, list(states), limit, owner)

    async def stored_events(self, after: int) -> list[Event]:
        return await asyncio.to_thread(self._events_sync, after)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.db.dispose()

    def _publish(self, events: list[Event]) -> None:
        for event in events:
            self.bus.publish(event)

    # -- decisions ---------------------------------------------------------------------

    def _decide(
        self, spec: dict[str, Any]
    ) -> tuple[Job, BestSchedule, DecisionView, BoundEstimate]:
        """Compute a decision at the current slot; the ledger's bounds include the job.

        The caller restores the previous bounds if it does not commit."""
        self._advance_window()
        ledger = self._ledger
        arrival = self.slot + 1
        job = self._parse(spec, arrival)
        self.config.limits.check_job(job, self.cluster, self.window)
        estimate = self._estimate
        if self.config.pricing.mode == "estimate":
            estimate = self._estimate.observe(job)
            bounds = self._bounds(estimate)
            ledger.set_bounds(bounds)
        started = time.perf_counter()
        last = arrival + self.window - 1
        best = best_schedule(job, ledger, arrival, last)
        admitted = best.payoff is not None and best.payoff > ADMIT_THRESHOLD
        reason = ""
        drivers: list[dict[str, Any]] = []
        if not admitted:
            found = price_drivers(best, job, ledger)
            reason = explain_rejection(best, job, ledger, arrival, last, found)
            drivers = [d.__dict__ for d in found]
        ms = (time.perf_counter() - started) * 1000.0
        view = DecisionView(
            admitted=admitted,
            payoff=best.payoff,
            cost=best.cost if admitted else None,
            completion_slot=best.completion_slot if admitted else None,
            jct=best.jct if admitted else None,
            utility=best.utility if admitted else None,
            arrival_slot=arrival,
            work=job.work,
            allocations=allocation_entries(best.schedule, self.cluster) if admitted else [],
            reason=reason,
            drivers=drivers,
            decision_ms=ms,
        )
        return job, best, view, estimate

    def _restore_bounds(self, previous: PriceBounds) -> None:
        """Undo the bound change of a decision that is not committed."""
        if self._ledger.bounds is not previous:
            self._ledger.set_bounds(previous)

    def _quote_sync(self, spec: dict[str, Any]) -> DecisionView:
        previous = self._ledger.bounds
        try:
            return self._decide(spec)[2]
        finally:
            self._restore_bounds(previous)

    def _submit_sync(
        self, spec: dict[str, Any], by: str | None, owner: str | None
    ) -> tuple[JobView, list[Event]]:
        job_id = text(spec.get("id") if isinstance(spec, dict) else None, "job.id")
        check_job_id(job_id)
        canonical = canonical_spec(spec)
        with self.db.session() as session:
            existing = session.get(JobRow, job_id)
            if existing is not None:
                if owner is not None and existing.submitter != owner:
                    raise ConflictError(f"job id {job_id!r} is taken by another submitter")
                if existing.spec != canonical:
                    raise ConflictError(f"job {job_id!r} exists with another spec")
                return self._view(session, existing, duplicate=True), []
        previous = self._ledger.bounds
        try:
            job, best, view, estimate = self._decide(spec)
            events = self._commit(job, best, view, canonical, estimate, by)
        except BaseException:
            self._restore_bounds(previous)
            raise
        self._estimate = estimate
        if view.admitted:
            assert best.schedule is not None
            self._ledger.admit(job.id, job.worker, job.ps, best.schedule)
        self.log.info(
            "decided", job=job.id, admitted=view.admitted, payoff=view.payoff, cost=view.cost,
            jct=view.jct, arrival=view.arrival_slot, ms=round(view.decision_ms, 3),
        )  # fmt: skip
        with self.db.session() as session:
            row = session.get(JobRow, job.id)
            assert row is not None
            return self._view(session, row), events

    def _commit(
        self,
        job: Job,
        best: BestSchedule,
        view: DecisionView,
        canonical: str,
        estimate: BoundEstimate,
        submitter: str | None = None,
    ) -> list[Event]:
        now = datetime.now(UTC)
        state = "admitted" if view.admitted else "rejected"
        with self.db.session() as session:
            seq = (session.scalar(select(func.max(JobRow.sequence))) or 0) + 1
            start = None
            if view.admitted and best.schedule is not None:
                start = int(best.schedule.start + np.flatnonzero(best.schedule.worker_counts())[0])
            session.add(
                JobRow(
                    id=job.id,
                    sequence=seq,
                    spec=canonical,
                    state=state,
                    submitted_slot=self.slot,
                    arrival_slot=view.arrival_slot,
                    work=view.work,
                    admitted=view.admitted,
                    payoff=view.payoff,
                    cost=view.cost,
                    start_slot=start,
                    completion_slot=view.completion_slot,
                    jct=view.jct,
                    utility=view.utility,
                    reason=view.reason,
                    detail={"drivers": view.drivers},
                    decision_ms=view.decision_ms,
                    decided_at=now,
                    submitter=submitter,
                )
            )
            session.flush()
            if view.admitted:  # one executemany, not an ORM object per row
                session.execute(
                    insert(AllocationRow), self._allocation_rows(job.id, view.allocations)
                )
            if self.config.pricing.mode == "estimate":  # one UPDATE, not merge's SELECT + UPDATE
                value = estimate.to_dict()
                stmt = update(MetaRow).where(MetaRow.key == _ESTIMATE_KEY).values(value=value)
                if session.connection().execute(stmt).rowcount == 0:
                    session.add(MetaRow(key=_ESTIMATE_KEY, value=value))
            detail = {"admitted": view.admitted, "payoff": view.payoff}
            return [self._event(session, now, "decided", job.id, state, detail)]

    @staticmethod
    def _allocation_rows(job_id: str, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        merged: dict[tuple[int, str], dict[str, Any]] = {}
        for e in entries:
            key = (e["slot"], e["server"])
            row = merged.setdefault(
                key, {"job_id": job_id, "slot": e["slot"], "server": e["server"],
                      "workers": 0, "ps": 0}
            )  # fmt: skip
            row["workers"] += e.get("workers", 0)
            row["ps"] += e.get("ps", 0)
        return list(merged.values())

    def _event(
        self, session: Session, now: datetime, kind: str, job_id: str, state: str,
        detail: dict[str, Any],
    ) -> Event:  # fmt: skip
        row = EventRow(at=now, kind=kind, job_id=job_id, slot=self.slot, state=state,
                       detail=detail)  # fmt: skip
        session.add(row)
        session.flush()
        return Event(row.sequence, kind, job_id, self.slot, state, detail)

    # -- cancellation and time ---------------------------------------------------------

    def _cancel_sync(self, job_id: str) -> tuple[JobView, int, list[Event]]:
        check_job_id(job_id, "id")
        self._advance_window()
        release_from = self.slot + 1
        now = datetime.now(UTC)
        with self.db.session() as session:
            row = session.get(JobRow, job_id)
            if row is None:
                raise NotFoundError(f"no job {job_id!r}")
            if row.state not in ("admitted", "running"):
                raise PreconditionError(f"job {job_id!r} is {row.state}; only admitted or running "
                                   "jobs can be cancelled")  # fmt: skip
            release_from = max(release_from, row.arrival_slot)
            released = int(session.scalar(
                select(func.coalesce(func.sum(AllocationRow.workers), 0)).where(
                    AllocationRow.job_id == job_id, AllocationRow.slot >= release_from)
            ) or 0)  # fmt: skip
            session.execute(delete(AllocationRow).where(
                AllocationRow.job_id == job_id, AllocationRow.slot >= release_from))  # fmt: skip
            last = session.scalar(select(func.max(AllocationRow.slot)).where(
                AllocationRow.job_id == job_id, AllocationRow.workers > 0))  # fmt: skip
            row.state = "cancelled"
            row.cancelled_slot = release_from
            row.completion_slot = last
            event = self._event(
                session,
                now,
                "cancelled",
                job_id,
                "cancelled",
                {"released_worker_slots": released, "from_slot": release_from},
            )
            view = self._view(session, row)
        if job_id in self._ledger:
            self._ledger.release(job_id, release_from)
        self.log.info("cancelled", job=job_id, from_slot=release_from, released=released)
        return view, released, [event]

    def _advance_window(self) -> None:
        slot = self.slots.current_slot()
        if slot > self.slot:
            self.slot = slot
            self._ledger.advance(slot)

    def _tick_sync(self) -> list[Event]:
        """Move the window to the current slot and jobs through their states."""
        self._advance_window()
        s = self.slot
        now = datetime.now(UTC)
        events: list[Event] = []
        with self.db.session() as session:
            starting = session.scalars(
                select(JobRow).where(JobRow.state == "admitted", JobRow.start_slot <= s)
            ).all()
            for row in starting:
                row.state = "running"
                events.append(self._event(session, now, "running", row.id, "running", {}))
            ended = session.scalars(
                select(JobRow).where(JobRow.state == "running", JobRow.completion_slot < s)
            ).all()
            # With the execution plane, a job whose agents reported less than its work
            # stays running past its plan: it completes when they report the rest, or
            # fails if they do not (Execution.review_sync).
            unfinished = self.execution.unfinished if self.execution is not None else None
            done = [r for r in ended if unfinished is None or not unfinished(r.id, session)]
            for row in done:
                row.state = "completed"
                events.append(self._event(session, now, "completed", row.id, "completed", {}))
        self._ticked_slot = s
        if events:
            self.log.info("slot", slot=s, started=len(starting), completed=len(done))
        return events

    # -- reads -------------------------------------------------------------------------

    def _view(self, session: Session, row: JobRow, duplicate: bool = False) -> JobView:
        allocs = session.scalars(
            select(AllocationRow).where(AllocationRow.job_id == row.id)
            .order_by(AllocationRow.slot)
        ).all()  # fmt: skip
        order = {name: pos for pos, name in enumerate(self._server_order())}
        entries: list[dict[str, Any]] = []
        for a in sorted(allocs, key=lambda a: (a.slot, order.get(a.server, 1 << 30))):
            if a.workers:
                entries.append({"slot": a.slot, "server": a.server, "workers": a.workers})
            if a.ps:
                entries.append({"slot": a.slot, "server": a.server, "ps": a.ps})
        decision = DecisionView(
            admitted=row.admitted,
            payoff=row.payoff,
            cost=row.cost,
            completion_slot=row.completion_slot,
            jct=row.jct,
            utility=row.utility,
            arrival_slot=row.arrival_slot,
            work=row.work,
            allocations=entries,
            reason=row.reason,
            drivers=list(row.detail.get("drivers", [])),
            decision_ms=row.decision_ms,
        )
        return JobView(
            id=row.id,
            spec=json.loads(row.spec),
            state=row.state,
            decision=decision,
            submitted_slot=row.submitted_slot,
            sequence=row.sequence,
            duplicate=duplicate,
        )

    def _server_order(self) -> list[str]:
        return [name for _, _, name, _ in self.cluster.servers()]

    def _get_sync(self, job_id: str, owner: str | None = None) -> JobView:
        check_job_id(job_id, "id")
        with self.db.session() as session:
            row = session.get(JobRow, job_id)
            if row is None or (owner is not None and row.submitter != owner):
                raise NotFoundError(f"no job {job_id!r}")
            return self._view(session, row)

    def _list_sync(self, states: list[str], limit: int, owner: str | None = None) -> list[JobView]:
        for state in states:
            if state not in STATES:
                raise SpecError.one("states", f"unknown state {state!r} (known: {STATES})")
        with self.db.session() as session:
            query = select(JobRow).order_by(JobRow.sequence)
            if states:
                query = query.where(JobRow.state.in_(states))
            if owner is not None:
                query = query.where(JobRow.submitter == owner)
            if limit > 0:
                query = query.limit(limit)
            return [self._view(session, row) for row in session.scalars(query).all()]

    def _events_sync(self, after: int) -> list[Event]:
        with self.db.session() as session:
            rows = session.scalars(
                select(EventRow).where(EventRow.sequence > after).order_by(EventRow.sequence)
            ).all()
            return [Event(r.sequence, r.kind, r.job_id, r.slot, r.state, r.detail) for r in rows]

    # -- cluster views (read the ledger; monitoring only) --------------------------------

    def _view_window(self, first_slot: int, slots: int) -> tuple[int, int, int]:
        """``(first slot, lo, hi)``: ``slots`` (0: 12) window indices from ``first_slot``
        (0: the current slot), clipped to the ledger's window."""
        ledger = self._ledger
        first = max(first_slot or self.slot, ledger.origin)
        lo = first - ledger.origin
        return first, lo, min(lo + (slots or 12), ledger.length)

    def prices(
        self, first_slot: int, slots: int
    ) -> tuple[int, list[tuple[str, str, str, list[float]]]]:
        """Unit prices per (server, kind, resource) over ``slots`` slots from ``first_slot``."""
        ledger = self._ledger
        first, lo, hi = self._view_window(first_slot, slots)
        out: list[tuple[str, str, str, list[float]]] = []
        for kind, side, names in (
            ("worker", ledger.worker_side, self.cluster.worker_names),
            ("ps", ledger.ps_side, self.cluster.ps_names),
        ):
            for i, name in enumerate(names):
                for r, res in enumerate(self.cluster.resources):
                    if side.capacity[i, r] > 0:
                        out.append((name, kind, res, side.price[lo:hi, i, r].tolist()))
        return first, out

    def utilisation(
        self, first_slot: int, slots: int
    ) -> tuple[int, list[tuple[str, str, list[float]]]]:
        """Cluster-wide used/capacity per resource and kind, per slot."""
        ledger = self._ledger
        first, lo, hi = self._view_window(first_slot, slots)
        out: list[tuple[str, str, list[float]]] = []
        for kind, side in (("worker", ledger.worker_side), ("ps", ledger.ps_side)):
            total = side.capacity.sum(axis=0)
            used = side.used[lo:hi].sum(axis=1)
            for r, res in enumerate(self.cluster.resources):
                if total[r] > 0:
                    out.append((res, kind, (used[:, r] / total[r]).tolist()))
        return first, out

    def current_use(self, slot: int = 0) -> dict[str, dict[str, float]]:
        """Amounts used per server in ``slot`` (0: the current slot); a failed server's
        slots count as full."""
        ledger = self._ledger
        idx = (slot or self.slot) - ledger.origin
        if not 0 <= idx < ledger.length:
            raise SpecError.one("slot", f"must be in the window {ledger.origin}..{ledger.end - 1}")
        out: dict[str, dict[str, float]] = {}
        for side, names in ((ledger.worker_side, self.cluster.worker_names),
                            (ledger.ps_side, self.cluster.ps_names)):  # fmt: skip
            for i, name in enumerate(names):
                out[name] = dict(zip(self.cluster.resources, side.used[idx, i].tolist(),
                                     strict=True))  # fmt: skip
        return out
