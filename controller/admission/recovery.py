"""Recovery: migrate the store at start-up and rebuild the ledger from its allocations in
decision order, which reproduces the prices bit for bit (also after a store outage, and
when the execution plane re-plans)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from controller.admission.bounds import BoundControl
from controller.admission.moves import Moves
from controller.admission.state import EPOCH_KEY, SETTINGS_KEY
from controller.store import AllocationRow, JobRow, MetaRow, OutageRow, ServerRow, migrate
from pricing import Job, Ledger, OasisError, SpecError, fields
from pricing.best_schedule import warm_up
from pricing.errors import CapacityError
from pricing.replan import refit
from pricing.schedule import Schedule

__all__ = ["Recovery"]


@dataclass(frozen=True)
class _Misfit:
    """A stored plan that no longer fits: what it wanted from ``start`` on, and why.

    Attributes:
        job_id: the job.
        job: the job parsed against the configured cluster; None if it no longer parses.
        start: absolute slot of ``workers[0]``.
        workers: ``(S,)`` int64, workers per slot as stored (on any server).
        ps: ``(S,)`` int64, parameter servers per slot as stored.
        why: the reason, for the log and the event.
    """

    job_id: str
    job: Job | None
    start: int
    workers: NDArray[np.int64]
    ps: NDArray[np.int64]
    why: str


class Recovery(Moves, BoundControl):
    """Start-up and ledger rebuilds; see the module docstring."""

    def open(self) -> None:
        """Migrate the store, record the servers and rebuild the ledger (blocking)."""
        revision = migrate(self.db)
        warm_up()
        with self.db.session() as session:
            self.slots.epoch = self._epoch(session)
            self._sync_servers(session)
            settings = {
                "window": self.window,
                "slot_seconds": self.config.slot_seconds,
                "epoch": self.slots.epoch,
            }
            session.merge(MetaRow(key=SETTINGS_KEY, value=settings))
        self.slot = self.slots.current_slot()
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

    def _epoch(self, session: Session) -> float:
        """The Unix time of slot 0: the config's ``epoch`` if it sets one, else the one
        recorded in the store at the first start (recorded now if there is none). A store
        that holds jobs but no recorded epoch was started with slot 0 at the Unix epoch
        (the old default), so that is what it records then."""
        if not self.config.epoch_from_store:
            return self.config.epoch
        meta = session.get(MetaRow, EPOCH_KEY)
        if meta is not None:
            value = meta.value.get("epoch") if isinstance(meta.value, dict) else None
            return fields.number(value, f"the store's meta row {EPOCH_KEY!r}: epoch")
        if session.scalar(select(JobRow.id).limit(1)) is not None:
            epoch, why = 0.0, "jobs stored before slot 0 was recorded: the Unix epoch"
        else:
            epoch, why = self.slots.clock.now(), "the daemon's first start"
        session.add(MetaRow(key=EPOCH_KEY, value={"epoch": epoch, "source": why}))
        self.log.info("slot 0 recorded", epoch=epoch, source=why)
        return epoch

    def _reload(self) -> int:
        """Read the bound estimate and rebuild the ledger from the store (blocking);
        returns the jobs rebuilt. Nothing changes if the store fails meanwhile."""
        with self.db.session() as session:
            estimate = self._stored_estimate(session)
            pins = self._stored_pins(session)
        previous, previous_pins = self.ledger, self._pins
        self._pins = pins
        bounds = self._bounds(estimate)
        self.ledger = Ledger(self.cluster, bounds, self.window + 1, origin=self.slot)
        try:
            rebuilt = self._rebuild()
        except BaseException:
            self.ledger, self._pins = previous, previous_pins
            raise
        self._estimate = estimate
        return rebuilt

    def _sync_servers(self, session: Session) -> None:
        session.execute(delete(ServerRow))
        for pos, (kind, _, name, caps) in enumerate(self.cluster.servers()):
            capacity = dict(zip(self.cluster.resources, caps.tolist(), strict=True))
            session.add(ServerRow(name=name, kind=kind, position=pos, capacity=capacity))

    def _rebuild(self) -> int:
        """Admit every stored allocation from the window's first slot on, in decision order.

        A plan that no longer fits (the configuration shrank under it: a server smaller or
        gone, a shorter window, a spec the cluster can no longer run) is refitted after
        the others, so jobs whose plans still fit keep them unchanged (:meth:`_refit`)."""
        ledger = self._ledger
        with self.db.session() as session:
            rows = session.execute(
                select(JobRow.id, JobRow.spec, JobRow.arrival_slot, AllocationRow.slot,
                       AllocationRow.server, AllocationRow.workers, AllocationRow.ps)
                .join(AllocationRow, AllocationRow.job_id == JobRow.id)
                .where(AllocationRow.slot >= ledger.origin)
                .order_by(JobRow.sequence, AllocationRow.slot)
            ).all()  # fmt: skip
        by_job: dict[str, list[Any]] = {}
        for row in rows:
            by_job.setdefault(row.id, []).append(row)
        w_index = {n: i for i, n in enumerate(self.cluster.worker_names)}
        p_index = {n: i for i, n in enumerate(self.cluster.ps_names)}
        misfits: list[_Misfit] = []
        for job_id, allocs in by_job.items():
            start, stop = allocs[0].slot, allocs[-1].slot + 1
            wanted_w = np.zeros(stop - start, np.int64)
            wanted_p = np.zeros(stop - start, np.int64)
            for a in allocs:
                wanted_w[a.slot - start] += a.workers
                wanted_p[a.slot - start] += a.ps
            try:
                job = self._parse(json.loads(allocs[0].spec), allocs[0].arrival_slot, fits=False)
            except SpecError as err:
                misfits.append(_Misfit(job_id, None, start, wanted_w, wanted_p, str(err)))
                continue
            gone = sorted({a.server for a in allocs} - w_index.keys() - p_index.keys())
            why = f"server {', '.join(gone)} no longer configured" if gone else ""
            if stop > ledger.end:
                why = why or f"planned past the window's last slot {ledger.end - 1}"
            if not why:
                workers = np.zeros((stop - start, len(w_index)), np.int32)
                ps = np.zeros((stop - start, len(p_index)), np.int32)
                for a in allocs:
                    if a.server in w_index:
                        workers[a.slot - start, w_index[a.server]] = a.workers
                    else:
                        ps[a.slot - start, p_index[a.server]] = a.ps
                try:
                    ledger.admit(job_id, job.worker, job.ps, Schedule(start, workers, ps))
                    continue
                except CapacityError as err:
                    why = f"over the configured capacity: {err}"
            misfits.append(_Misfit(job_id, job, start, wanted_w, wanted_p, why))
        self._block_failed_servers(ledger)
        if misfits:
            self._refit(misfits)
        return len(by_job)

    def _refit(self, misfits: list[_Misfit]) -> None:
        """Re-place, re-plan or fail (in decision order) the jobs whose stored plans no
        longer fit, as after a server failure: each with a logged reason and an event."""
        ledger = self._ledger
        first = ledger.origin
        now = datetime.now(UTC)
        with self.db.session() as session:
            for m in misfits:
                detail: dict[str, Any] = {"reason": "config_changed", "why": m.why[:500]}
                if m.job is None:  # the spec no longer fits the cluster at all
                    row = session.get(JobRow, m.job_id)
                    assert row is not None
                    session.execute(delete(AllocationRow).where(
                        AllocationRow.job_id == m.job_id, AllocationRow.slot >= first))  # fmt: skip
                    row.state = "failed"
                    detail.update(how="stranded", from_slot=first)
                    self._event(session, now, "failed", m.job_id, "failed", detail)
                    how = "stranded"
                else:
                    work = int(m.workers.sum())
                    last = m.job.arrival + self.window - 1
                    try:
                        how, best = refit(ledger, m.job, m.start, m.workers, m.ps, work, last)
                    except OasisError as err:  # a bug here must not stop the daemon starting
                        self.log.exception("refit failed; the job fails", job=m.job_id)
                        if m.job_id in ledger:
                            ledger.release(m.job_id, first)
                        how, best = "stranded", None
                        detail["why"] = f"{m.why[:400]}; refit failed: {err}"[:500]
                    self._record_move(session, now, m.job, how, first, detail, best)
                self.log.warning("plan refitted to the configuration", job=m.job_id, how=how,
                                 why=m.why, from_slot=first)  # fmt: skip

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
