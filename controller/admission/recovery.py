"""Recovery: migrate the store at start-up and rebuild the ledger from its allocations in
decision order, which reproduces the prices bit for bit (also after a store outage, and
when the execution plane re-plans)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from controller.admission.state import EPOCH_KEY, ESTIMATE_KEY, SETTINGS_KEY, AdmissionState
from controller.store import AllocationRow, JobRow, MetaRow, OutageRow, ServerRow, migrate
from pricing import Ledger, fields
from pricing.best_schedule import warm_up
from pricing.bound_estimate import BoundEstimate
from pricing.prices import PriceBounds
from pricing.schedule import Schedule

__all__ = ["Recovery"]


class Recovery(AdmissionState):
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
        estimate = BoundEstimate.empty(len(self.cluster.resources))
        with self.db.session() as session:
            meta = session.get(MetaRow, ESTIMATE_KEY)
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
