"""The stored jobs' ids as digests (controller/admission/job_ids.py): every id added is
found, every id removed is not, across the merges of the changes into the sorted array;
8 bytes an id. The decision path's use of it (a match read from the store, a new id not)
is covered by every submission and retry test.

Their load after each rebuild of the ledger (controller/admission/id_index.py), with an
in-process controller on SQLite: it runs in its own thread, never in the decision thread
(the first submission after a start or an outage waited 0.75 s for it with 10^6 jobs
stored); while it runs, each submission reads the store for its own id, so a retry is
still a duplicate; ids stored during the load are in the ids it installs; a load that
a rebuild made stale is dropped; a failed one is tried again. The load is held at will
by a statement hook that blocks it once its query has begun (its snapshot taken), and
fails the test if that query runs in the decision thread."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, insert, select

from controller.admission import AdmissionController, ConflictError, id_index, job_ids
from controller.admission.job_ids import JobIds
from controller.clock import FakeClock
from controller.store import JobRow
from tests.servers import Postgres
from tests.test_daemon_e2e import job
from tests.test_group_commit import StoreLock, _db_file, _until
from tests.test_ha_units import Node, _cut_lease
from tests.test_pending import controller, small

ALL_IDS = "SELECT jobs.id \nFROM jobs"
"""The load's statement, as SQLAlchemy compiles it for SQLite."""
STORED = 300


def test_ids_added_are_found_and_removed_ones_are_not_across_merges() -> None:
    rng = random.Random(7)
    stored = {f"job-{i}" for i in range(20_000)}
    ids = JobIds(stored)
    assert ids.nbytes == 8 * len(stored)  # a set of the strings held ~190 bytes an id
    new = [f"new-{i}" for i in range(10_000)]  # past _MERGE_AT: merged along the way
    for job_id in new:
        ids.add(job_id)
    stored |= set(new)
    gone = rng.sample(sorted(stored), 6_000)
    ids.difference_update(gone)
    stored -= set(gone)
    back = gone[:100]  # an id deleted, then submitted again
    for job_id in back:
        ids.add(job_id)
    stored |= set(back)
    assert all(j in ids for j in stored)
    absent = gone[100:] + [f"never-{i}" for i in range(20_000)]
    assert sum(j in ids for j in absent) == 0  # 64-bit digests: no collision here
    assert 1 not in ids and None not in ids  # not ids at all


def test_changes_are_merged_once_there_are_enough() -> None:
    ids = JobIds()
    for i in range(job_ids._MERGE_AT - 1):
        ids.add(f"a{i}")
    assert ids.nbytes == 0  # held apart so far
    ids.add("last")
    assert ids.nbytes == 8 * job_ids._MERGE_AT and "last" in ids and "a0" in ids
    # removals are merged the same way, and a merge starts the count of changes again:
    # the next change is held apart (a merge at every change costs O(n) each)
    ids.difference_update([f"a{i}" for i in range(job_ids._MERGE_AT - 1)] + ["last"])
    assert ids.nbytes == 0 and "a0" not in ids and "last" not in ids
    ids.add("again")
    assert ids.nbytes == 0 and "again" in ids and "a1" not in ids


class _Loads:
    """Every engine's reads of all the ids, by thread name, for the block's duration:
    one in the decision thread fails the test (raised there); the others (the loader's)
    wait, once their query has begun (its snapshot taken), until :attr:`release` is set
    and, while :attr:`fail` is set, fail instead."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        self.engines: list[Engine] = []
        self.held = threading.Event()  # a load's query began: its snapshot is taken
        self.release = threading.Event()
        self.fail = False

    def before(self, conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement != ALL_IDS:
            return
        name = threading.current_thread().name
        self.threads.append(name)
        self.engines.append(conn.engine)
        if name == "decide":
            raise AssertionError("every stored id read in the decision thread")
        if self.fail:
            raise OSError("the store is down (a test's)")

    def after(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement == ALL_IDS:
            self.held.set()
            assert self.release.wait(30), "never released"


@contextmanager
def _loads() -> Iterator[_Loads]:
    loads = _Loads()
    event.listen(Engine, "before_cursor_execute", loads.before)
    event.listen(Engine, "after_cursor_execute", loads.after)
    try:
        yield loads
    finally:
        loads.release.set()
        event.remove(Engine, "before_cursor_execute", loads.before)
        event.remove(Engine, "after_cursor_execute", loads.after)


def _store_rows(c: AdmissionController, ids: list[str]) -> None:
    """Rejected jobs written straight into the store (spec ``{}``: a submission of one of
    these ids conflicts with it)."""
    now = datetime.now(UTC)
    with c.db.session() as session:
        first = int(session.scalar(select(func.max(JobRow.sequence))) or 0) + 1
        rows = [
            {"id": job_id, "sequence": first + i, "spec": "{}", "state": "rejected",
             "submitted_slot": 0, "arrival_slot": 1, "work": 1, "admitted": False,
             "decided_at": now, "decided_slot": 0}
            for i, job_id in enumerate(ids)
        ]  # fmt: skip
        session.execute(insert(JobRow), rows)


def _history(tmp: Path, clock: FakeClock) -> None:
    """A store of :data:`STORED` jobs written straight into it and one submitted, ``s1``."""
    c = controller(tmp, clock)
    try:
        _store_rows(c, [f"h{i}" for i in range(STORED)])
        asyncio.run(c.submit(small("s1")))
    finally:
        c.close()


def _installed(c: AdmissionController) -> JobIds:
    ids = c.between_decisions(lambda: c._ids.wait(c._ledger, 30), timeout=60)
    assert ids is not None
    return ids


def test_the_first_submissions_after_a_start_read_their_own_ids_while_the_ids_load(
    tmp_path: Path,
) -> None:
    """Started on a store with history, the daemon answers while the load of its ids is
    held: a new id is decided, a retry of a stored job is its duplicate, another spec
    under a stored id a conflict, each from a read of that id. Before, the first
    submission read every id in the decision thread (0.75 s at 10^6 jobs)."""
    clock = FakeClock(1_000_000.0)
    _history(tmp_path, clock)
    with _loads() as loads:
        c = controller(tmp_path, clock)  # a start: the load begins, and is held
        try:
            assert asyncio.run(c.submit(small("s1"))).duplicate
            assert loads.held.wait(30)
            first = asyncio.run(c.submit(small("n1")))  # stored after the load's snapshot
            assert not first.duplicate
            assert asyncio.run(c.submit(small("n1"))).duplicate
            with pytest.raises(ConflictError, match="another spec"):
                asyncio.run(c.submit(small("h7")))
            assert asyncio.run(c.quote(small("s1")))[1] is not None  # found by a quote too
            loads.release.set()
            ids = _installed(c)
            # what the load read, and what was stored while it ran (merged in)
            assert all(f"h{i}" in ids for i in range(STORED))
            assert "s1" in ids and "n1" in ids and "n9" not in ids
            assert asyncio.run(c.submit(small("n1"))).duplicate
        finally:
            c.close()
    assert loads.threads and "decide" not in loads.threads


def test_the_first_submission_after_an_outage_does_not_read_every_id(tmp_path: Path) -> None:
    clock = FakeClock(1_000_000.0)
    _history(tmp_path, clock)
    c = controller(tmp_path, clock)
    try:
        _installed(c)
        with _loads() as loads:
            c._stale = True  # as after a store outage: the next step rebuilds the ledger
            assert asyncio.run(c.submit(small("s1"))).duplicate  # read by its id
            assert loads.held.wait(30)
            assert not asyncio.run(c.submit(small("n2"))).duplicate  # after its snapshot
            loads.release.set()
            ids = _installed(c)
        assert "n2" in ids and "s1" in ids and "h0" in ids
        assert len(loads.threads) == 1 and loads.threads[0] != "decide"
    finally:
        c.close()


def test_a_load_a_rebuild_made_stale_is_dropped(tmp_path: Path) -> None:
    """The load started at the start is held; meanwhile a job is stored by another
    writer (as a leader before a takeover) and the ledger is rebuilt: the stale load
    (which cannot have it) is dropped, and the one started by the rebuild finds it.
    Installing the stale one would decide a submission of that id as new."""
    clock = FakeClock(1_000_000.0)
    _history(tmp_path, clock)
    with _loads() as loads:
        c = controller(tmp_path, clock)
        try:
            assert asyncio.run(c.submit(small("s1"))).duplicate  # read by its id
            assert loads.held.wait(30)
            _store_rows(c, ["x1"])  # after the held load's snapshot
            c._stale = True
            assert not asyncio.run(c.submit(small("n3"))).duplicate  # rebuilds, then decides
            loads.release.set()
            ids = _installed(c)
            assert "x1" in ids and "n3" in ids
            with pytest.raises(ConflictError, match="another spec"):
                asyncio.run(c.submit(small("x1")))
        finally:
            c.close()
    assert len(loads.threads) == 2 and "decide" not in loads.threads


def test_a_failed_load_is_logged_and_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store fails the load: submissions read it for their ids meanwhile, and the
    first lookup :data:`~id_index.RETRY_SECONDS` after the failure loads them again."""
    clock = FakeClock(1_000_000.0)
    _history(tmp_path, clock)
    with _loads() as loads:
        loads.fail = True
        loads.release.set()
        c = controller(tmp_path, clock)
        try:
            assert c.between_decisions(lambda: c._ids.wait(c._ledger, 30)) is None
            failed = len(loads.threads)  # the start's load, and wait's own
            assert asyncio.run(c.submit(small("s1"))).duplicate  # read by its id
            assert len(loads.threads) == failed  # none tried again so soon
            loads.fail = False
            monkeypatch.setattr(id_index, "RETRY_SECONDS", 0.0)
            assert not asyncio.run(c.submit(small("n4"))).duplicate  # its lookup retries
            assert loads.held.wait(30)
            ids = _installed(c)
            assert "s1" in ids and "h0" in ids and "n4" in ids
        finally:
            c.close()
    assert len(loads.threads) == failed + 1 and "decide" not in loads.threads


def test_an_id_still_committing_when_a_load_starts_is_in_the_ids_it_installs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load started by a lookup (here: after a failed one) while a decision's commit
    waits for the store's write lock: its query cannot see that job, so the ids still
    committing are taken into the load when it starts. Without them the installed ids
    would miss it, and a retry would be decided as a new job."""
    monkeypatch.setattr(id_index, "RETRY_SECONDS", 0.0)
    clock = FakeClock(1_000_000.0)
    _history(tmp_path, clock)
    with _loads() as loads:
        loads.fail = True
        c = controller(tmp_path, clock)
        try:

            async def scenario() -> None:
                lock = StoreLock(_db_file(c))
                try:
                    task = asyncio.ensure_future(c.submit(small("u1")))
                    await _until(lambda: "u1" in c._uncommitted)
                    await c.quote(small("q1"))  # finds the load that failed
                    loads.fail = False
                    await c.quote(small("q2"))  # starts another
                    assert await asyncio.to_thread(loads.held.wait, 30)  # its query began
                finally:
                    lock.release()
                assert not (await task).duplicate  # committed after the load's snapshot

            asyncio.run(scenario())
            loads.release.set()
            ids = _installed(c)
            assert "u1" in ids and "s1" in ids
            assert asyncio.run(c.submit(small("u1"))).duplicate
        finally:
            c.close()
    assert "decide" not in loads.threads


def test_a_standby_loads_no_ids_and_loads_them_when_it_takes_over(
    tmp_path: Path, postgres: Postgres
) -> None:
    """High availability on PostgreSQL: a standby never decides, so it reads no ids
    while it follows; its takeover starts the load (in the background), which finds the
    jobs the last leader stored. While the load's query holds its transaction open,
    the new leader's decisions commit."""
    url = postgres.new_database()
    a = Node(tmp_path, url, "a")
    b = None
    try:
        a.take_over()
        for i in range(3):
            asyncio.run(a.c.submit(job(f"a{i}")))
        with _loads() as loads:
            b = Node(tmp_path, url, "b")  # a standby
            asyncio.run(b.c.follow())
            assert not b.c.leading and b.db.engine not in loads.engines
            _cut_lease(url, a)
            b.take_over()
            assert loads.held.wait(30)  # b's load began, and is held
            assert asyncio.run(b.c.submit(job("a1"))).duplicate  # read by its id
            assert not asyncio.run(b.c.submit(job("b1"))).duplicate  # committed meanwhile
            loads.release.set()
            ids = _installed(b.c)
        assert all(i in ids for i in ("a0", "a1", "a2", "b1"))
        assert loads.engines == [b.db.engine] and "decide" not in loads.threads
    finally:
        for node in (a, b):
            if node is not None:
                node.close()


def test_a_leader_that_leads_again_drops_the_ids_of_its_last_lead(
    tmp_path: Path, postgres: Postgres
) -> None:
    """A leader that lost its lease stays a standby on its ledger (all of it committed),
    follows the other leader, and may lead again on the same ledger: the ids it had
    loaded missed the other leader's jobs, so they are dropped and loaded again. Kept,
    a retry of the other leader's job read as certainly new and was decided again."""
    url = postgres.new_database()
    a = Node(tmp_path, url, "a")
    b = None
    try:
        a.take_over()
        asyncio.run(a.c.submit(job("a0")))
        assert "a0" in _installed(a.c)  # a's ids, loaded for its ledger
        ledger = a.c._ledger
        b = Node(tmp_path, url, "b")
        asyncio.run(b.c.follow())
        _cut_lease(url, a)
        b.take_over()
        assert not asyncio.run(b.c.submit(job("b1"))).duplicate
        assert a.elect() == "standby"
        asyncio.run(a.c.follow())  # b's decision applied to a's ledger
        _cut_lease(url, b)
        a.take_over()
        assert a.c._ledger is ledger  # led again on the ledger it followed with
        again = asyncio.run(a.c.submit(job("b1")))  # b's job, retried
        assert again.duplicate
        assert all(i in _installed(a.c) for i in ("a0", "b1"))
    finally:
        for node in (a, b):
            if node is not None:
                node.close()
