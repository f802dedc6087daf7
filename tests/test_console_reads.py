"""The console's store reads are a tenant's reads as its gRPC calls are: each takes its
caller's read turns (``READS_PER_CLIENT`` in the shared pool at once), and the job list
reads no allocations (a row shows none; 50 jobs of 60,000 allocations each were read
for a page of summaries). The controller runs in-process on SQLite; the statements are
seen by a SQLAlchemy ``before_cursor_execute`` listener."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from controller.admission import AdmissionController
from controller.auth import Caller, Role
from controller.console.data import ConsoleData
from controller.console.shared_reads import SharedReads
from tests.test_retention import SPEC
from tests.test_retention import _controller as retention_controller

ALICE = Caller("alice", Role.SUBMITTER, client="alice", turn="alice")
OPERATOR = Caller("ops", Role.OPERATOR, client="ops", turn="ops")


def _statements(c: AdmissionController, seen: list[str]) -> Any:
    def statement(conn: Any, cursor: Any, sql: str, *_: Any) -> None:
        seen.append(sql.lower())

    event.listen(c.db.engine, "before_cursor_execute", statement)
    return statement


def test_console_reads_take_the_callers_turns_and_the_list_reads_no_allocations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c, _ = retention_controller(tmp_path, keep_days=0)
    try:
        for job_id, by in (("train-1", "alice"), ("eval-2", "alice"), ("train-3", "bob")):
            view = asyncio.run(c.submit({**SPEC, "id": job_id}, by=by))
            assert view.decision.admitted, view.decision.reason
        clients: list[str] = []
        read_store = c.read_store

        async def recorded(fn: Any, *args: Any, client: str = "") -> Any:
            clients.append(client)
            return await read_store(fn, *args, client=client)

        monkeypatch.setattr(c, "read_store", recorded)
        data = ConsoleData(c)
        seen: list[str] = []
        listener = _statements(c, seen)
        try:
            listed = asyncio.run(data.jobs(ALICE))
            searched = asyncio.run(data.jobs(ALICE, query="tr"))
            everyone = asyncio.run(data.jobs(OPERATOR, query="tr"))
        finally:
            event.remove(c.db.engine, "before_cursor_execute", listener)
        assert [j["id"] for j in listed["jobs"]] == ["train-1", "eval-2"]  # its own only
        assert [j["id"] for j in searched["jobs"]] == ["train-1"]
        assert [j["id"] for j in everyone["jobs"]] == ["alice:train-1", "bob:train-3"]
        assert all(j["completion_slot"] is not None for j in listed["jobs"])
        assert not [sql for sql in seen if "from allocations" in sql], seen
        assert len([sql for sql in seen if "from jobs" in sql]) == 3  # one read a page
        assert clients == ["alice", "alice", "ops"]

        clients.clear()
        job = asyncio.run(data.job(ALICE, "train-1"))
        assert job["plan"], "a job's own page still shows its plan"
        asyncio.run(data.overview(ALICE))
        assert clients and set(clients) == {"alice"}, clients
    finally:
        c.close()


def test_many_tabs_read_the_ledger_once_and_see_each_change(tmp_path: Path) -> None:
    """The operator's scale audit: every tab's overview and heatmap read every server x
    slot of the ledger in the decision thread, ahead of the tenants' decisions (30-60 ms
    a read at 10,000 servers, each tab at every event). Tabs asking at once share one
    read (controller/console/shared_reads.py); a decision after it is seen at the next
    poll past the read's age (20 x its duration; the test moves the clock past it)."""
    c, _ = retention_controller(tmp_path, keep_days=0)
    try:
        data = ConsoleData(c)
        now = [0.0]
        data.shared = SharedReads(clock=lambda: now[0])  # its age, on a clock of the test's
        reads: list[str] = []
        read = c.read

        async def counted(fn: Any, client: str | None = None) -> Any:
            reads.append("read")
            return await read(fn, client)

        c.read = counted  # type: ignore[method-assign]

        async def tabs() -> list[Any]:
            pages = [data.overview(OPERATOR) for _ in range(8)] + [data.prices() for _ in range(8)]
            return list(await asyncio.gather(*pages))

        pages = asyncio.run(tabs())
        # each overview also reads the servers' states (cheap, its own): 8 + one use + one heatmap
        assert len(reads) == 8 + 2, reads
        assert all(p["use"] == pages[0]["use"] for p in pages[:8])
        assert all(p["level"] == pages[8]["level"] for p in pages[8:])
        before = pages[0]["use"]
        view = asyncio.run(c.submit({**SPEC, "id": "later"}, by="alice"))
        assert view.decision.admitted, view.decision.reason
        assert asyncio.run(data.overview(OPERATOR))["use"] == before  # reused meanwhile
        now[0] += 3600.0  # past 20 x the read's duration, whatever it was
        after = asyncio.run(data.overview(OPERATOR))["use"]
        assert after != before  # the new job's use shows
    finally:
        c.close()
