"""What must not grow with the history a store holds (``keep_days = 0`` keeps every job):
a retention step, the start's check of stray allocations, a page of jobs of one state or
of one submitter. Each is measured as the SQLite virtual-machine instructions it takes
in a store of 500 and of 5,000 finished jobs (bench/history_scale.py has the times at
10^6). The controller runs in-process on SQLite with a fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, insert

from controller.admission import AdmissionController
from controller.clock import FakeClock
from controller.store import JobRow
from tests.test_retention import SPEC
from tests.test_retention import _controller as retention_controller

HOUR = 3600.0
SIZES = (500, 5000)


def _controller(tmp: Path, keep_days: float = 0) -> tuple[AdmissionController, FakeClock]:
    tmp.mkdir()
    return retention_controller(tmp, keep_days)


def _history(c: AdmissionController, jobs: int) -> None:
    """``jobs`` rejected jobs decided in slot 0 by two submitters, written straight into
    the store."""
    now = datetime.now(UTC)
    rows = [
        {"id": f"h{i}", "sequence": i + 1, "spec": "{}", "state": "rejected",
         "submitted_slot": 0, "arrival_slot": 1, "work": 1, "admitted": False,
         "decided_at": now, "decided_slot": 0, "submitter": f"team{i % 2}"}
        for i in range(jobs)
    ]  # fmt: skip
    with c.db.session() as session:
        session.execute(insert(JobRow), rows)


def _work(c: AdmissionController, fn: Callable[[], Any]) -> int:
    """The SQLite virtual-machine instructions (thousands) ``fn`` takes."""
    executed = [0]

    def count(conn: Any, *_: Any) -> None:
        def tick() -> int:
            executed[0] += 1
            return 0

        conn.connection.dbapi_connection.set_progress_handler(tick, 1000)

    event.listen(c.db.engine, "before_cursor_execute", count)
    try:
        fn()
    finally:
        event.remove(c.db.engine, "before_cursor_execute", count)
    return executed[0]


def _each_size(tmp: Path, measure: Callable[[AdmissionController, FakeClock], int], keep_days:
               float = 0) -> list[int]:  # fmt: skip
    work = []
    for jobs in SIZES:
        c, clock = _controller(tmp / str(jobs), keep_days)
        try:
            _history(c, jobs)
            work.append(measure(c, clock))
        finally:
            c.close()
    return work


def test_a_retention_step_costs_the_same_whatever_the_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step reads a bounded stretch of the jobs, in decision order: the first pass over
    a long history (keep_days turned on after months) holds each tenant's calls as long
    in a store 10 times larger (one query sorted every ended job at every step)."""
    from controller.admission import retention

    monkeypatch.setattr(retention, "PRUNE_SCAN", 100, raising=False)

    def step(c: AdmissionController, clock: FakeClock) -> int:
        clock.t = 30 * HOUR + 1.0
        c._advance_window()
        c.between_decisions(lambda: c._ids.wait(c._ledger))  # loaded after each rebuild
        return _work(c, lambda: asyncio.run(c._run(c._prune_sync)))

    work = _each_size(tmp_path, step, keep_days=1)
    assert work[1] < 1.5 * work[0], work


def test_the_check_of_stray_allocations_reads_the_window_not_the_history(
    tmp_path: Path,
) -> None:
    """At start and at each rebuild after an outage the daemon deletes the allocations
    ahead of jobs that hold no capacity: found from the window's allocation rows, not by
    going through every rejected or finished job (1.4 s at 10^6 jobs)."""

    def check(c: AdmissionController, _: FakeClock) -> int:
        return _work(c, lambda: c._drop_idle_allocations(c._ledger.origin))

    work = _each_size(tmp_path, check)
    assert work[1] < 1.5 * work[0] + 5, work


@pytest.mark.parametrize(
    ("states", "owner"), [(["rejected"], None), ([], "team0")], ids=["state", "submitter"]
)
def test_a_page_of_one_state_or_submitter_reads_its_own_rows(
    tmp_path: Path, states: list[str], owner: str | None
) -> None:
    """``oasis jobs --state rejected`` and every ListJobs of a submitter's token read a
    page in decision order from an index that holds the sequence (0006): an index on the
    state or submitter alone read and sorted all of its jobs (0.31 s and 0.09 s a page
    at 10^6 jobs)."""

    def page(c: AdmissionController, _: FakeClock) -> int:
        views: list[Any] = []
        work = _work(c, lambda: views.extend(c._list_sync(states, 100, 0, owner)[0]))
        assert len(views) == 100
        return work

    work = _each_size(tmp_path, page)
    assert work[1] < 1.5 * work[0] + 5, work


def test_offline_store_from_to_reads_the_stretch_not_the_history(tmp_path: Path) -> None:
    """``oasis offline --store --from --to`` (controller.history.load_history) read every
    job and allocation of the store before it picked the stretch: one day of a year's
    history (10^6 jobs) took 45 s and 2.6 GB. Now the Python objects it builds are the
    stretch's: the memory it takes does not grow with the jobs before it."""
    import tracemalloc

    from controller.history import load_history

    def load(c: AdmissionController, clock: FakeClock) -> int:
        clock.t = 3 * HOUR + 1.0  # the stretch: one job arriving in slot 4
        c._advance_window()
        view = asyncio.run(c.submit({"id": "late", **SPEC}))
        arrival = view.decision.arrival_slot
        tracemalloc.start()
        try:
            history = load_history(c.db, arrival, arrival)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert [j.id for j in history.trace.jobs] == ["late"]
        return peak

    peaks = _each_size(tmp_path, load)
    assert peaks[1] < 1.5 * peaks[0], peaks
