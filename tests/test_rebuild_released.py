"""A job cancelled (or finished early) during a slot keeps what it held in that slot: the
cancel releases from the next slot on, in the ledger and in the store. A rebuild in the
same slot (a restart, a store outage, a takeover) must read those rows back as held, as
the live daemon holds them, not delete them as an edit's leftovers.

Before: the rebuild deleted the cancelled job's rows of the current slot from the store
(the record of what it held in its last slot), logged "allocations of jobs that hold no
capacity deleted (an edit?)" after every ordinary cancel, and the rebuilt ledger sold that
slot's capacity a second time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import func, select, update

from controller.admission import AdmissionController
from controller.clock import FakeClock
from controller.config import load
from controller.store import AllocationRow, EventRow, JobRow
from tests.test_pending import SLOT, blocker, controller, opened


def _rows(c: AdmissionController, job_id: str) -> list[tuple[int, str, int, int]]:
    with c.db.session() as session:
        found = session.execute(
            select(AllocationRow.slot, AllocationRow.server, AllocationRow.workers,
                   AllocationRow.ps)
            .where(AllocationRow.job_id == job_id)
            .order_by(AllocationRow.slot, AllocationRow.server)
        ).all()  # fmt: skip
    return [(r.slot, r.server, r.workers, r.ps) for r in found]


def _held(c: AdmissionController) -> tuple[Any, Any]:
    ledger = c._ledger
    return ledger.worker_side.used.copy(), ledger.ps_side.used.copy()


def _same_ledger(a: tuple[Any, Any], b: tuple[Any, Any]) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_cancel_mid_slot_survives_a_restart_and_a_rebuild(tmp_path: Path) -> None:
    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    try:
        assert asyncio.run(c.submit(blocker())).state == "admitted"  # from the next slot
        clock.advance(SLOT * 1.5)  # in the middle of its first slot
        asyncio.run(c.tick())
        now = c.slot
        assert any(slot == now for slot, *_ in _rows(c, "blocker")), "must hold this slot"
        asyncio.run(c.cancel("blocker"))
        live_rows, live_ledger = _rows(c, "blocker"), _held(c)
        assert live_rows and {slot for slot, *_ in live_rows} == {now}
        assert c._ledger.origin == now
        assert live_ledger[0][0].any(), "the live ledger holds the slot"

        c._reload()  # as after a store outage
        assert _rows(c, "blocker") == live_rows
        assert _same_ledger(_held(c), live_ledger)
    finally:
        c.close()

    again = opened(load(tmp_path / "c.toml"), clock)  # a restart in the same slot
    try:
        assert again.slot == now
        assert _rows(again, "blocker") == live_rows
        assert _same_ledger(_held(again), live_ledger)
    finally:
        again.close()

    clock.advance(SLOT)  # the slot passed: nothing of the job is held any more
    later = opened(load(tmp_path / "c.toml"), clock)
    try:
        assert not later._ledger.worker_side.used.any()
        assert _rows(later, "blocker") == live_rows  # its history stays
    finally:
        later.close()


def _reopened_in_the_blockers_first_slot(
    tmp_path: Path,
) -> tuple[int, list[Any], AdmissionController]:
    """The blocker admitted, the clock in the middle of its first slot: that slot, the
    blocker's stored rows, and the controller reopened on the store (the caller closes
    it)."""
    clock, c = _in_the_blockers_first_slot(tmp_path)
    try:
        now, planned = c.slot, _rows(c, "blocker")
    finally:
        c.close()
    return now, planned, opened(load(tmp_path / "c.toml"), clock)


def _in_the_blockers_first_slot(tmp_path: Path) -> tuple[FakeClock, AdmissionController]:
    """The clock and the controller (open; the caller closes it), the blocker admitted
    and the clock in the middle of its first slot."""
    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    assert asyncio.run(c.submit(blocker())).state == "admitted"
    clock.advance(SLOT * 1.5)
    asyncio.run(c.tick())
    return clock, c


def test_an_edit_cannot_make_a_cancelled_job_hold_past_the_current_slot(tmp_path: Path) -> None:
    """The slot a cancel released from is read from the store, which an edit can change:
    only the current slot is ever held for a job that holds nothing, so a cancelled job
    whose rows and release slot an edit moved into the future takes nothing from anyone
    there."""
    now, planned, c = _reopened_in_the_blockers_first_slot(tmp_path)
    try:
        with c.db.session() as session:
            session.execute(update(JobRow).where(JobRow.id == "blocker").values(
                state="cancelled", cancelled_slot=now + 10_000))  # fmt: skip
        c._reload()
        used = c._ledger.worker_side.used
        assert used[0].any() and not used[1:].any(), "the current slot only"
        assert _rows(c, "blocker") == [r for r in planned if r[0] == now]
    finally:
        c.close()


def test_a_job_that_ended_in_the_current_slot_holds_that_slot_through_a_rebuild(
    tmp_path: Path,
) -> None:
    """A job that completed (or failed) during the current slot -- its
    ``completion_slot`` -- keeps what it held in that slot, as a cancel does, and nothing
    after it; one cancelled with ``cancelled_slot`` the current slot holds none of it.
    The mutation audit: with the slot after ``completion_slot`` read as the one it holds
    nothing from, every test passed, and a rebuild sold that slot again."""
    now, planned, c = _reopened_in_the_blockers_first_slot(tmp_path)
    try:
        for state in ("completed", "failed"):
            with c.db.session() as session:
                session.execute(update(JobRow).where(JobRow.id == "blocker").values(
                    state=state, completion_slot=now))  # fmt: skip
            c._reload()
            used = c._ledger.worker_side.used
            assert used[0].any() and not used[1:].any(), state
            assert _rows(c, "blocker") == [r for r in planned if r[0] == now], state
        # cancelled in the slot before: released from this one, which it holds nothing of
        with c.db.session() as session:
            session.execute(update(JobRow).where(JobRow.id == "blocker").values(
                state="cancelled", cancelled_slot=now))  # fmt: skip
        c._reload()
        assert not c._ledger.worker_side.used.any()
        assert _rows(c, "blocker") == [r for r in planned if r[0] < now]
    finally:
        c.close()


def test_a_job_that_ended_in_the_current_slot_is_not_refitted_by_a_shrunk_config(
    tmp_path: Path,
) -> None:
    """A restart whose config no longer fits what a job that ended in the current slot
    held in it leaves that slot out and the job as it ended: nothing of it is moved, no
    event written. The mutation audit: with such a job refitted like a live one, every
    test passed (a completed job re-planned or failed at a restart)."""
    clock, c = _in_the_blockers_first_slot(tmp_path)
    try:
        now = c.slot
        with c.db.session() as session:
            session.execute(update(JobRow).where(JobRow.id == "blocker").values(
                state="completed", completion_slot=now))  # fmt: skip
            events = session.scalar(select(func.count()).select_from(EventRow))
    finally:
        c.close()
    path = tmp_path / "c.toml"
    text = path.read_text()
    shrunk = text.replace(
        'name="w2", kind="worker", capacity={gpu=8', 'name="w2", kind="worker", capacity={gpu=4'
    )
    assert shrunk != text
    path.write_text(shrunk)
    c = opened(load(path), clock)
    try:
        assert c.slot == now
        with c.db.session() as session:
            assert session.scalar(select(JobRow.state).where(JobRow.id == "blocker")) == "completed"
            assert session.scalar(select(func.count()).select_from(EventRow)) == events
    finally:
        c.close()
