"""The admission controller's shared state around its writes
(controller/admission/state.py), in-process on SQLite: a committed write's events count
as applied, and a failed commit of earlier decisions leaves the ledger to be rebuilt
before the next step (the mutation audit of the admission controller's state)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import delete, func, select

from controller.clock import FakeClock
from controller.store import EventRow, StoreUnavailableError
from tests.test_pending import controller, small


def test_a_committed_writes_events_count_as_applied(tmp_path: Path) -> None:
    """After a write of this leader's (a cancel, through ``_write``), the last event it
    applied is the newest stored one (``oasis status``' applied; a standby it becomes
    follows on from there)."""
    c = controller(tmp_path, FakeClock(1_000_000.0))
    try:
        view = asyncio.run(c.submit(small("a")))
        assert view.decision.admitted, view.decision.reason
        asyncio.run(c.cancel("a"))
        with c.db.session() as session:
            newest = session.scalar(select(func.max(EventRow.sequence)))
        assert newest is not None and c.ha_status().applied == newest
    finally:
        c.close()


def test_a_failed_commit_of_earlier_decisions_has_the_ledger_rebuilt_before_the_next_step(
    tmp_path: Path,
) -> None:
    """A write that finds a batch of this generation failed refuses (the store may lack
    decisions the ledger holds) and leaves the ledger stale: the next step rebuilds it
    from the store and goes on, rather than refusing every write from then on."""
    c = controller(tmp_path, FakeClock(1_000_000.0))
    try:
        assert asyncio.run(c.submit(small("a"))).decision.admitted
        c._writer._failed_generation = c._generation  # as a failed batch leaves it
        with pytest.raises(StoreUnavailableError, match="a commit of earlier decisions failed"):
            asyncio.run(c.cancel("a"))
        assert c._stale
        asyncio.run(c.cancel("a"))  # rebuilt first: the write goes through
        assert asyncio.run(c.get("a")).state == "cancelled"
        assert asyncio.run(c.submit(small("b"))).decision.admitted
    finally:
        c.close()


def test_a_new_event_numbered_as_the_last_applied_one_is_a_rewound_store(
    tmp_path: Path,
) -> None:
    """The store numbers a write's event at (not only below) the last event this daemon
    applied: that event is gone from it (a restore), so the store was rewound under the
    ledger, which is rebuilt before the next step."""
    c = controller(tmp_path, FakeClock(1_000_000.0))
    try:
        assert asyncio.run(c.submit(small("a"))).decision.admitted
        with c.db.session() as session:
            newest = session.scalar(select(func.max(EventRow.sequence)))
            assert newest is not None and c.ha_status().applied == newest
            session.execute(delete(EventRow).where(EventRow.sequence == newest))
        asyncio.run(c.cancel("a"))
        assert c._rewound.startswith(f"the store numbered a new event {newest}, at or below")
        assert c._stale
    finally:
        c.close()
