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
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controller.admission import AdmissionController
from controller.clock import FakeClock
from controller.config import load
from controller.metrics import Metrics
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
    # as scraped: decisions and batches each counted as such (the mutation audit: the
    # decisions' counter reading the batches passed the daemon test, one per batch there)
    text = generate_latest(Metrics(c).registry).decode()
    found = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert found["oasis_commit_decisions_total"] == len(ids)
    assert found["oasis_commit_batches_total"] == c._writer.batches
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


class _Held:
    """A commit function for a bare :class:`GroupWriter`: the first batch waits until
    :meth:`release` (so write sets pile up behind it), a batch listed in ``fail`` (by
    its number, from 0) raises; records every batch's rows in order, and ``log``, what
    the write sets and the calls did, in order."""

    def __init__(self, fail: tuple[int, ...] = ()) -> None:
        self.gate = threading.Event()
        self.fail = fail
        self.batches: list[list[Any]] = []
        self.log: list[str] = []

    def __call__(self, batch: list[Any]) -> list[Any]:
        if not self.batches:
            assert self.gate.wait(30), "never released"
        number = len(self.batches)
        self.batches.append([ws.rows for ws in batch])
        if number in self.fail:
            raise StoreUnavailableError("the store went away")
        self.log.extend(f"committed {ws.rows}" for ws in batch)
        return [ws.rows for ws in batch]

    def release(self) -> None:
        self.gate.set()


def _writer(held: _Held, **kwargs: Any) -> Any:
    from controller.admission.writer import GroupWriter

    return GroupWriter(held, lambda err: err, **kwargs)


def _ws(rows: Any, generation: int = 0) -> Any:
    from controller.admission.writer import WriteSet

    return WriteSet(rows, lambda r: r, generation=generation)


def _until_queued(writer: Any, n: int) -> None:
    """Until the writer's thread has taken the first write set (it waits in the
    commit) and ``n`` write sets are submitted in all."""
    deadline = time.monotonic() + 30
    while writer.queued < n or writer._queue.qsize() != n - 1:
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_failed_batch_of_two_generations_fails_the_later_ones_of_the_newer() -> None:
    """A batch holding write sets of two generations (the ledger rebuilt between two
    decisions of it) fails: every write set decided on either ledger fails after it,
    without a commit, until the decision thread starts a newer generation."""
    held = _Held(fail=(1,))
    writer = _writer(held)
    try:
        first = writer.submit(_ws("a", 0))
        _until_queued(writer, 1)
        batch = [writer.submit(_ws("b", 0)), writer.submit(_ws("c", 1))]
        held.release()
        assert first.result(10) == "a"
        for future in batch:
            with pytest.raises(StoreUnavailableError):
                future.result(10)
        assert held.batches == [["a"], ["b", "c"]] and writer.failed_generation == 1
        later = writer.submit(_ws("d", 1))  # decided on the ledger the batch left behind
        with pytest.raises(StoreUnavailableError):
            later.result(10)
        assert writer.submit(_ws("e", 2)).result(10) == "e"  # a rebuilt ledger's
        assert held.batches == [["a"], ["b", "c"], ["e"]]
    finally:
        writer.close(10)


def test_a_batch_holds_max_batch_write_sets_at_most() -> None:
    from controller.admission.writer import MAX_BATCH

    held = _Held()
    writer = _writer(held)
    try:
        futures = [writer.submit(_ws(i)) for i in range(1)]
        _until_queued(writer, 1)
        futures += [writer.submit(_ws(i)) for i in range(1, MAX_BATCH + 44)]
        held.release()
        assert [f.result(10) for f in futures] == list(range(MAX_BATCH + 44))
        assert [len(b) for b in held.batches] == [1, MAX_BATCH, 43]
        assert writer.largest == MAX_BATCH
    finally:
        writer.close(10)


def test_a_call_runs_after_the_write_sets_before_it_and_before_those_after() -> None:
    """:meth:`GroupWriter.call` runs between batches, in the order it was queued: the
    write sets queued before it are committed first, those after it are not yet."""
    held = _Held()
    writer = _writer(held)
    try:
        futures = [writer.submit(_ws("a"))]
        _until_queued(writer, 1)
        futures.append(writer.submit(_ws("b")))
        called = writer.call(lambda: held.log.append("called"))
        futures.append(writer.submit(_ws("c")))
        held.release()
        assert [f.result(10) for f in futures] == ["a", "b", "c"]
        called.result(10)
        assert held.log == ["committed a", "committed b", "called", "committed c"]
    finally:
        writer.close(10)


def test_close_commits_what_is_queued_and_ends_the_thread() -> None:
    held = _Held()
    stopped = threading.Event()
    writer = _writer(held, on_stop=stopped.set)
    first = writer.submit(_ws("a"))
    _until_queued(writer, 1)
    second = writer.submit(_ws("b"))
    closing = threading.Thread(target=writer.close, args=(10,))
    closing.start()
    deadline = time.monotonic() + 30
    while writer._queue.qsize() != 2:  # "b", then the stop
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)
    held.release()
    closing.join(30)
    assert (first.result(10), second.result(10)) == ("a", "b")
    assert not writer._thread.is_alive() and stopped.is_set()
    with pytest.raises(RuntimeError, match="closed"):
        writer.submit(_ws("c"))


def test_a_batch_of_several_submitters_stores_each_ones_estimate_as_decided(
    tmp_path: Path,
) -> None:
    """The price-bound estimate after a batch is written once, from its last decision,
    with the rows of every submitter the batch moved (one new to the store among them):
    what the store then reads back is the estimate the decisions left, each tenant's
    own included, not the one before the batch's first decision or one tenant's alone."""
    from tests.test_pending import controller

    c = controller(tmp_path, FakeClock(1_000_000.0), extra="")  # the estimated bounds
    try:

        async def scenario() -> None:
            assert (await c.submit(small("a0"), by="alice")).state == "admitted"
            lock = StoreLock(_db_file(c))
            order = [("b1", "bob"), ("a2", "alice"), ("c3", "carol"), ("b4", "bob")]
            tasks = []
            for job_id, by in order:
                tasks.append(asyncio.ensure_future(c.submit(small(job_id), by=by)))
                await _until(lambda job_id=job_id: any(job_id in k for k in c._uncommitted))
            threading.Timer(0.3, lock.release).start()
            await asyncio.gather(*tasks)

        asyncio.run(scenario())
        assert c._writer.largest >= 3  # alice's, carol's and bob's in one batch at least
        assert sorted(c._estimate.submitters) == ["alice", "bob", "carol"]
        with c.db.session() as session:
            stored = c._stored_estimate(session)
        assert stored.to_dict() == c._estimate.to_dict()
    finally:
        c.close()


def test_a_commit_numbered_at_the_last_event_seen_finds_the_store_rewound(
    tmp_path: Path,
) -> None:
    """The store lost its newest event behind the leader (a restore, an edit): SQLite
    numbers the next one past the highest kept, the very number the leader applied
    last. The commit that gets it sees the store rewound, and the ledger is rebuilt
    before the next step, as for any number below it."""
    from sqlalchemy import text

    from tests.test_pending import controller

    c = controller(tmp_path, FakeClock(1_000_000.0))
    try:
        assert asyncio.run(c.submit(small("first"))).state == "admitted"
        seen = c._seen_event
        with c.db.session() as session:
            session.execute(text("DELETE FROM events WHERE sequence = :n"), {"n": seen})
        view = asyncio.run(c.submit(small("second")))
        assert c._events_sync(seen - 1)[-1].sequence == seen  # the number given again
        assert c._rewound and f"at or below event {seen}" in c._rewound, c._rewound
        assert c._stale  # rebuilt before the next step
        assert view.state == "admitted"
    finally:
        c.close()


def test_after_a_batch_committed_but_unanswered_the_next_counts_on_from_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch that the store committed but whose answer was lost (a connection cut
    after the commit) fails its callers; the next batch numbers its jobs on from the
    store's largest sequence, not from the one the writer knew before: counted on from
    that, every later batch reused the lost batch's numbers and failed too."""
    from controller.admission import commit
    from controller.store.decisions import write_decisions as real
    from tests.test_pending import controller

    c = controller(tmp_path, FakeClock(1_000_000.0))

    def lost(session: Any, *args: Any) -> Any:
        with c.db.session() as own:  # committed in a transaction of its own
            real(own, *args)
        raise StoreUnavailableError("the connection was cut after the commit")

    try:
        assert asyncio.run(c.submit(small("before"))).sequence == 1
        monkeypatch.setattr(commit, "write_decisions", lost)
        with pytest.raises(StoreUnavailableError):
            asyncio.run(c.submit(small("lost")))
        monkeypatch.setattr(commit, "write_decisions", real)
        after = asyncio.run(c.submit(small("after")))
        assert after.state == "admitted" and after.sequence == 3
        assert c._get_sync("lost").sequence == 2  # stored, though its caller was not told
        again = asyncio.run(c.submit(small("lost")))  # its retry: the stored decision
        assert again.duplicate and again.sequence == 2
    finally:
        c.close()
