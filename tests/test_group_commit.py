"""Group commit (controller/admission/writer.py, commit.py): the decision thread decides
and applies, a writer thread commits batches, and an answer leaves only after its own
batch committed. Against a real SQLite store whose write lock another connection holds
for a while (as another process would), so decisions pile up behind one commit."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.admission import AdmissionController
from controller.clock import FakeClock
from controller.config import load
from controller.store import StoreUnavailableError
from controller.store.database import HELD_IDLE_SECONDS
from tests.servers import Postgres, postgres_or_skip, write_config
from tests.test_pending import CHEAP, controller, opened, small


@pytest.fixture(params=["thread", "process"])
def c(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[AdmissionController]:
    """A controller whose writer thread writes each batch itself, or (as in the daemon)
    through its commit process."""
    process = request.param == "process"
    ctl = controller(tmp_path, FakeClock(1_000_000.0), commit_process=process)
    assert (ctl._committer is not None) == process
    try:
        yield ctl
    finally:
        ctl.close()


def _db_file(c: AdmissionController) -> str:
    database = c.db.engine.url.database
    assert database is not None
    return database


class StoreLock:
    """Another connection holding the SQLite write lock until :meth:`release` (as
    another process would: the commit process sees it too)."""

    def __init__(self, path: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        self.conn.execute("ROLLBACK")
        self.conn.close()


async def _until(cond: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_decisions_behind_a_slow_commit_go_in_one_batch_in_decision_order(
    c: AdmissionController,
) -> None:
    ids = [f"j{i}" for i in range(6)]

    async def scenario() -> list[Any]:
        lock = StoreLock(_db_file(c))
        tasks = [asyncio.ensure_future(c.submit(small(i))) for i in ids]
        # every one decided (applied to the ledger) while none can commit
        await _until(lambda: all(i in c._uncommitted for i in ids))
        assert not any(t.done() for t in tasks), "answered before its commit"
        threading.Timer(0.3, lock.release).start()
        return list(await asyncio.gather(*tasks))

    answers = asyncio.run(scenario())
    # the first batch took what was queued when the writer began (and waited for the
    # lock); every other decision went into the one batch after it
    assert c._writer.committed == len(ids) and c._writer.batches <= 2
    sequences = [view.sequence for view in answers]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(ids)
    decided = [e.job_id for e in c._events_sync(0) if e.kind == "decided"]
    assert decided == ids  # the event log in decision order too
    for view in answers:
        stored = c._get_sync(view.id)
        assert stored == view  # the answer is what a read of the store gives
        assert view.state in ("admitted", "rejected")


def test_a_failed_batch_fails_every_caller_and_the_next_decision_prices_the_store(
    c: AdmissionController,
) -> None:
    """The write lock is held past SQLite's busy timeout (5 s): the batch fails, each of
    its callers gets UNAVAILABLE, nothing of it is stored, and the ledger is rebuilt from
    the store before the next decision, so the failed jobs hold no capacity."""

    async def scenario() -> None:
        lock = StoreLock(_db_file(c))
        tasks = [asyncio.ensure_future(c.submit(small(i))) for i in ("f0", "f1")]
        ledger = c.ledger
        assert ledger is not None
        await _until(lambda: "f0" in ledger and "f1" in ledger)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        lock.release()
        assert all(isinstance(r, StoreUnavailableError) for r in results), results
        view = await c.submit(small("after"))
        assert view.state == "admitted" and not view.duplicate
        assert c.ledger is not None and "f0" not in c.ledger and "f1" not in c.ledger
        again = await c.submit(small("f0"))  # decided afresh, not a duplicate
        assert again.state == "admitted" and not again.duplicate

    asyncio.run(scenario())
    assert c._get_sync("f0").state == "admitted"
    with pytest.raises(Exception, match="no job"):
        c._get_sync("f1")


def test_a_retry_while_the_first_commit_is_under_way_gets_the_first_decision(
    c: AdmissionController,
) -> None:
    async def scenario() -> tuple[Any, Any]:
        lock = StoreLock(_db_file(c))
        first = asyncio.ensure_future(c.submit(small("twice")))
        await _until(lambda: "twice" in c._uncommitted)
        second = asyncio.ensure_future(c.submit(small("twice")))
        await asyncio.sleep(0.1)
        assert not first.done() and not second.done()
        lock.release()
        return await first, await second

    first, second = asyncio.run(scenario())
    assert not first.duplicate and second.duplicate
    assert second.sequence == first.sequence and second.decision == first.decision


def test_a_cancel_right_behind_a_decision_finds_it_committed(c: AdmissionController) -> None:
    """Other writes wait for the decisions queued before them: the store takes every
    change in the order the ledger did."""

    async def scenario() -> tuple[Any, Any]:
        lock = StoreLock(_db_file(c))
        submitted = asyncio.ensure_future(c.submit(small("quick")))
        await _until(lambda: "quick" in c._uncommitted)
        cancelled = asyncio.ensure_future(c.cancel("quick"))
        threading.Timer(0.3, lock.release).start()
        return await submitted, await cancelled

    view, (after, _released) = asyncio.run(scenario())
    assert view.state == "admitted"
    assert after.state == "cancelled" and after.sequence == view.sequence


def test_the_writer_answers_every_caller_whatever_fails_and_goes_on() -> None:
    """A commit that raises, a failure callback that raises too, an answer that cannot be
    built and a log call that raises: every future is resolved, and the writer commits
    the next batch (a writer stopped by one of these would hold every later caller)."""
    from concurrent.futures import Future

    from controller.admission.writer import GroupWriter, WriteSet

    plan: list[str] = ["fail", "ok", "ok"]
    failures: list[BaseException] = []

    def commit(batch: list[WriteSet]) -> list[Any]:
        if plan.pop(0) == "fail":
            raise StoreUnavailableError("the store went away")
        return [ws.rows for ws in batch]

    def failed(err: BaseException) -> BaseException:
        failures.append(err)
        raise RuntimeError("the failure callback itself failed")

    def boom() -> None:
        raise OSError("the log is gone")

    writer = GroupWriter(commit, failed)
    try:
        first = writer.submit(WriteSet("a", lambda r: r, generation=0))
        with pytest.raises(StoreUnavailableError):
            first.result(10)  # the commit's own error, though the callback failed
        assert failures and writer.failed_generation == 0
        # the same generation: failed without a commit
        doomed = writer.submit(WriteSet("b", lambda r: r, generation=0))
        with pytest.raises(StoreUnavailableError):
            doomed.result(10)
        bad: Future[Any] = writer.submit(WriteSet("c", lambda r: 1 / 0, generation=1))
        with pytest.raises(ZeroDivisionError):
            bad.result(10)
        fine = writer.submit(WriteSet("d", lambda r: r.upper(), generation=1, after=boom))
        assert fine.result(10) == "D"
        assert writer.drain(10) and writer.queued == 0
        assert writer.committed == 2 and plan == []
    finally:
        writer.close(10)


@pytest.fixture
def own_postgres() -> Iterator[Postgres]:
    """A PostgreSQL of this test's own: it is restarted mid-test."""
    yield from postgres_or_skip()


@pytest.mark.parametrize("process", [False, True], ids=["thread", "process"])
def test_after_a_postgres_restart_while_idle_the_next_decision_commits(
    own_postgres: Postgres, tmp_path: Path, process: bool
) -> None:
    """The writer keeps its connection between batches; one that sat idle across a
    PostgreSQL restart is checked out again (and pinged) first, so the next decision
    commits instead of failing its callers and rebuilding the ledger."""
    path = write_config(tmp_path / "c.toml", tmp_path / "data", own_postgres.new_database(),
                        epoch=1_000_000.0)  # fmt: skip
    path.write_text(path.read_text() + CHEAP)
    ctl = opened(load(path), FakeClock(1_000_000.0), commit_process=process)
    try:
        assert asyncio.run(ctl.submit(small("before"))).state == "admitted"
        own_postgres.stop("fast")
        own_postgres.start()
        time.sleep(HELD_IDLE_SECONDS + 0.5)
        after = asyncio.run(ctl.submit(small("after")))
        assert after.state == "admitted" and not ctl._stale
        assert ctl.writer.committed == 2
    finally:
        ctl.close()
