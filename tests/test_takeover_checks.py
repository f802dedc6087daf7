"""A standby's checks before it takes the lead (controller/admission/follow.py), as
units: its clock against the last leader's, and the stored plans its config would move
(the mutation audit of the admission controller's follow). The same checks on a real
PostgreSQL with nodes in-process: tests/test_ha_units.py."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import func, select

from controller.admission.follow import Follow, max_clock_skew
from controller.clock import FakeClock
from controller.errors import NotLeaderError, ResourcesRemovedError
from controller.store import AllocationRow, EventRow, JobRow
from controller.store.writer_lock import Holder
from tests.servers import Postgres
from tests.test_daemon_e2e import contending_jobs, job
from tests.test_ha_units import Node, _cut_lease
from tests.test_pending import controller


def _leader(offset: float | None, address: str = "a:50051") -> Holder:
    return Holder("a", 1, None, epoch=3, address=address, clock_offset=offset)


def test_a_clock_within_the_skew_allowed_give_or_take_its_uncertainty_may_lead() -> None:
    """The skew counts less the uncertainty of this node's measure of it: 40 s off the
    leader's, measured to within 5 s, may be as little as 35 s (at most 36 s allowed
    with hour-long slots); 42 s to within 5 s may not, and is said as ahead or behind."""
    node: Any = SimpleNamespace(config=SimpleNamespace(slot_seconds=3600.0))
    assert max_clock_skew(3600.0) == 36.0
    assert Follow._clock_problem(node, _leader(10.0), (50.0, 5.0)) == ""
    assert Follow._clock_problem(node, _leader(10.0), (-30.0, 5.0)) == ""
    ahead = Follow._clock_problem(node, _leader(10.0), (52.0, 5.0))
    assert ahead.startswith("this node's clock is 42 s ahead of the clock of the node that")
    assert "(a:50051)" in ahead and "at most 36 s with 3600 s slots" in ahead
    behind = Follow._clock_problem(node, _leader(10.0), (-32.0, 5.0))
    assert behind.startswith("this node's clock is 42 s behind")
    for holder, mine in ((None, (99.0, 0.0)), (_leader(None), (99.0, 0.0)), (_leader(0.0), None)):
        assert Follow._clock_problem(node, holder, mine) == ""  # nothing to compare


def _standby(unfitted: int, advertise: str, counted: float, left: int) -> Any:
    """A standby with ``unfitted`` plans left out, last counted at ``counted``
    (``time.monotonic()``), whose recount leaves ``left``."""
    node: Any = SimpleNamespace(_unfitted=unfitted, advertise=advertise,
                                _unfitted_counted=counted, recounts=0)  # fmt: skip

    def reload() -> None:
        node.recounts += 1
        node._unfitted = left

    def call(fn: Any) -> Future[None]:
        done: Future[None] = Future()
        fn()
        done.set_result(None)
        return done

    node._reload = reload
    node._decisions = SimpleNamespace(call=call)
    return node


def test_plans_a_standbys_config_would_move_stop_it_unless_a_recount_finds_none() -> None:
    """A standby that left plans out under a config other than the last leader's does
    not lead, unless it is that leader (the same address, not an empty one) or its
    recount (at most every ``RECOUNT_SECONDS``) finds that none is left out any more."""
    now = time.monotonic()
    differences = ["window: 24 here, 48 recorded"]
    stuck = _standby(3, "", now, 3)
    said = Follow._moves_problem(stuck, _leader(0.0, address=""), differences)
    assert said.startswith("3 stored plans do not fit this node's servers or window")
    assert "the node that led last, unknown, recorded: window: 24 here" in said
    assert stuck.recounts == 0  # counted just now: not again
    same = _standby(3, "a:50051", now, 3)
    assert Follow._moves_problem(same, _leader(0.0), differences) == ""
    assert Follow._moves_problem(_standby(3, "b:50051", now, 3), _leader(0.0), []) == ""
    ended = _standby(3, "b:50051", now - 3600.0, 0)  # its jobs ended since the last count
    assert Follow._moves_problem(ended, _leader(0.0), differences) == ""
    assert ended.recounts == 1 and ended._unfitted_counted >= now


def test_the_resources_check_is_made_again_once_an_event_was_applied_and_only_then(
    tmp_path: Path,
) -> None:
    """``takeover_problem`` checks the resources the live jobs demand again only once an
    event was applied since its last check (the check reads every live job's spec), and
    then says what it finds now: a resource the config lacks is said until a check
    finds it no longer lacking, and said again if a later check finds it lacking."""
    c = controller(tmp_path, FakeClock(1_000_000.0))
    try:
        lacking = [True]
        checked: list[int] = []

        def check(session: Any) -> None:
            checked.append(c._seen_event)
            if lacking[0]:
                raise ResourcesRemovedError("the jobs demand fpga, which this config lacks")

        c._check_resources = check  # type: ignore[method-assign]
        said = "the jobs demand fpga, which this config lacks"
        assert c.takeover_problem() == said
        assert c.takeover_problem() == said
        assert len(checked) == 1  # no event applied since: not read again
        lacking[0] = False
        assert c.takeover_problem() == said  # nor now: nothing told it otherwise
        c._seen_event += 1  # the standby applied an event
        assert c.takeover_problem() == ""
        assert len(checked) == 2
        lacking[0] = True
        c._seen_event += 1
        assert c.takeover_problem() == said
    finally:
        c.close()


def test_a_leader_whose_commit_failed_takes_the_lead_again_on_a_rebuilt_ledger(
    tmp_path: Path, postgres: Postgres
) -> None:
    """A commit of a leader's decisions failed (its ledger stale, that generation's
    writes refused) and it stepped down: its next takeover starts a new generation and
    rebuilds, rather than failing on the old generation's failure (and leaving the
    node a standby for another round)."""
    url = postgres.new_database()
    a = Node(tmp_path, url, "a")
    try:
        a.take_over()
        assert a.c.leading
        a.c._writer._failed_generation = a.c._generation  # as a failed batch leaves it
        a.c._stale = True
        a.c._step_down("its lease ended")
        a.lock.release()
        a.take_over()
        assert a.c.leading and not a.c._stale
        assert asyncio.run(a.c.submit(job("after"))).state in ("admitted", "rejected")
    finally:
        a.close()


def test_a_standby_lacking_a_server_the_leaders_new_plans_use_counts_them_left_out(
    tmp_path: Path, postgres: Postgres
) -> None:
    """A standby whose config lacks a server (w2) follows the plans admitted after it
    opened, leaving out those that use w2, and counts them: it does not take over on a
    ledger without them as if they had never been admitted."""
    url = postgres.new_database()
    w2 = (
        '  {name="w2", kind="worker", capacity={gpu=8, cpu=64, mem=488, disk=500, bandwidth=40}},\n'
    )
    a = Node(tmp_path, url, "a")
    b = None
    try:
        a.take_over()
        b = Node(tmp_path, url, "b", edit=lambda text: text.replace(w2, ""))
        assert "w2" not in b.c.cluster.worker_names and b.c._unfitted == 0
        for spec in contending_jobs(6):
            asyncio.run(a.c.submit(spec))
        assert "w2" in _planned_servers(a), "no plan uses w2"
        asyncio.run(b.c.follow())
        assert b.c._unfitted > 0
        assert "stored plans do not fit this node's servers" in b.c.takeover_problem()
    finally:
        for node in (a, b):
            if node is not None:
                node.close()


def _planned_servers(node: Node) -> set[str]:
    with node.db.session() as session:
        return set(session.scalars(select(AllocationRow.server)))


def test_a_takeover_applies_and_counts_every_event_over_several_batches(
    tmp_path: Path, postgres: Postgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standby behind by more than a batch of events (``FOLLOW_BATCH``) catches up over
    several reads at its takeover and says how many it applied in all."""
    monkeypatch.setattr("controller.admission.follow.FOLLOW_BATCH", 2)
    url = postgres.new_database()
    a: Node | None = Node(tmp_path, url, "a")
    b = None
    try:
        assert a is not None
        a.take_over()
        b = Node(tmp_path, url, "b")
        for spec in contending_jobs(3):
            asyncio.run(a.c.submit(spec))
        with b.db.session() as session:
            behind = session.scalar(select(func.count()).where(EventRow.sequence > b.c._seen_event))
        assert behind is not None and behind > 2
        gone = a.lock.backend_pid
        a.close()
        a = None
        deadline = time.monotonic() + 10.0
        while not b.lock.try_acquire():
            assert time.monotonic() < deadline, f"the lock of backend {gone} was not let go"
            time.sleep(0.05)
        epoch = b.lock.record(b.db, b.c.advertise)
        assert asyncio.run(b.c.take_over(epoch, b.lock.backend_pid)) == behind
        assert b.c.leading and sorted(b.c._ledger.job_ids())
    finally:
        for node in (a, b):
            if node is not None:
                node.close()


def test_a_leader_another_took_over_from_commits_no_write_of_its_own(
    tmp_path: Path, postgres: Postgres
) -> None:
    """Every write transaction outside the group commit (a cancel here) opens with the
    fence: a leader whose lease was cut and passed to another node, not told yet,
    commits nothing and steps down, naming the new leader."""
    url = postgres.new_database()
    a = Node(tmp_path, url, "a")
    b = None
    try:
        a.take_over()
        assert asyncio.run(a.c.submit(job("j1"))).state == "admitted"
        _cut_lease(url, a)
        b = Node(tmp_path, url, "b")
        b.take_over()
        assert a.c.leading  # not told
        with pytest.raises(NotLeaderError, match="stopped leading"):
            asyncio.run(a.c.cancel("j1"))
        assert not a.c.leading
        with b.db.session() as session:
            assert session.scalar(select(JobRow.state).where(JobRow.id == "j1")) == "admitted"
    finally:
        for node in (a, b):
            if node is not None:
                node.close()
