"""One tenant's history does not make another tenant's reads cost more (the tenant
isolation audit).

A submitter's ``ListJobs`` of one state (``oasis jobs --state rejected``, the console's
state tabs) read the jobs of that state, every tenant's, in decision order, and kept its
own: SQLite's planner took the index on (state, sequence) over the one on (submitter,
sequence) for ``state = ? AND submitter = ?``. With a store where bob holds 180,000
rejected jobs of 200,000 and alice 50, her page of 50 took 88 ms over gRPC (her page of
every state 15 ms), and grew with bob's history, not hers: work another tenant's jobs
decide, in the read pool every tenant shares. Now a submitter's page reads its own jobs
only (:func:`controller.admission.reads._own_states`).

Measured here in SQLite's virtual-machine steps (deterministic, not wall time).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import event, insert

from controller.admission import AdmissionController
from controller.clock import FakeClock
from controller.store import JobRow
from tests.test_pending import controller

_STEP = 10
"""SQLite virtual-machine instructions per progress callback."""


def _rows(submitter: str, first_sequence: int, count: int, state: str) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    return [
        {"id": f"{submitter}:job-{i}", "sequence": first_sequence + i, "spec": "{}",
         "state": state, "submitted_slot": 0, "arrival_slot": 1, "work": 9,
         "admitted": False, "reason": "priced out", "detail": {}, "decided_at": now,
         "submitter": submitter}
        for i in range(count)
    ]  # fmt: skip


class _Steps:
    """Counts the SQLite instructions of the statements run while :meth:`counting`."""

    def __init__(self, c: AdmissionController) -> None:
        self.steps = 0
        self._on = False
        event.listen(c.db.engine, "before_cursor_execute", self._attach)

    def _attach(self, conn: Any, *_args: Any) -> None:
        def tick() -> int:
            if self._on:
                self.steps += _STEP
            return 0

        conn.connection.driver_connection.set_progress_handler(tick, _STEP)

    def counting(self) -> Iterator[None]:
        self._on, self.steps = True, 0
        yield
        self._on = False


def _alices_page(c: AdmissionController, steps: _Steps, states: list[str]) -> tuple[int, int]:
    """Alice's first page of ``states`` as a submitter reads it: (jobs, steps)."""
    for _ in steps.counting():
        views, _more = asyncio.run(c.list_jobs(states, 100, owner="alice", client="alice"))
    return len(views), steps.steps


def test_a_submitters_page_of_one_state_does_not_read_the_other_tenants_jobs(
    tmp_path: Path,
) -> None:
    c = controller(tmp_path, FakeClock(1_000_000.0))
    steps = _Steps(c)
    try:
        with c.db.session() as session:
            session.execute(insert(JobRow), _rows("alice", 1, 5, "rejected"))
        alone = {s: _alices_page(c, steps, [s]) for s in ("rejected", "completed")}
        assert alone["rejected"][0] == 5 and alone["completed"][0] == 0
        with c.db.session() as session:  # bob's long history, after hers in decision order
            session.execute(insert(JobRow), _rows("bob", 100, 20_000, "rejected"))
            session.execute(insert(JobRow), _rows("carol", 30_000, 20_000, "completed"))
        for state, (jobs, before) in alone.items():
            after = _alices_page(c, steps, [state])
            # the same page, at about the same cost: nothing of bob's or carol's read
            # (before: 40 to 100 times as many steps, one row of theirs at least each)
            assert after[0] == jobs, state
            assert after[1] < 2 * before + 1000, (state, before, after[1])
        # an operator's page of one state still reads that state's jobs in order
        views, more = c._list_sync(["rejected"], 100)
        assert [v.id for v in views[:6]] == [f"alice:job-{i}" for i in range(5)] + ["bob:job-0"]
        assert more
    finally:
        c.close()
