"""High availability in one process, on a real PostgreSQL: the fence, the standby's
incremental apply, the ``[ha]`` settings, and clients that follow the leader (over real
gRPC servers standing in for head nodes). (Two daemons as subprocesses under load,
killed and stopped: ``tests/test_ha.py``.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psycopg
import pytest
import structlog
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select, text

from controller.admission import AdmissionController
from controller.auth import Caller, Role
from controller.clock import Clock, SlotClock, SystemClock
from controller.commands.failover import Backoff, FollowingStub, LeaderPool, followed_events
from controller.config import ConfigError, load
from controller.console.data import ConsoleData
from controller.errors import NotLeaderError, SlotGridChangedError
from controller.ha.leadership import Leadership
from controller.ha.settings import HaConfig, ha_from_dict
from controller.metrics import Metrics
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.startup import StartupError, open_store
from controller.store import AllocationRow, Database, EventRow, JobRow, MetaRow
from controller.store.writer_lock import RECORD_KEY, FencedError, PostgresWriterLock, check_epoch
from pricing import Ledger
from pricing.errors import SpecError
from pricing.replan import refit
from tests.servers import Postgres, free_port, write_config
from tests.test_daemon_e2e import contending_jobs, job

HA = '[ha]\nlease_seconds = 5\nadvertise = "{address}"\n'


class Node:
    """An in-process controller with ``[ha]`` on ``url``, opened as oasisd opens it."""

    def __init__(
        self,
        tmp_path: Path,
        url: str,
        name: str,
        edit: Callable[[str], str] = str,
        clock: Clock | None = None,
    ) -> None:
        path = write_config(tmp_path / f"{name}.toml", tmp_path / name, url, epoch=0.0,
                            extra=HA.format(address=f"{name}:50051"))  # fmt: skip
        path.write_text(edit(path.read_text()))
        config = load(path)
        assert config.ha is not None
        self.db = Database(url, idle_transaction=config.ha.lease_seconds)
        slots = SlotClock(clock or SystemClock(), config.slot_seconds, config.epoch)
        quiet = structlog.wrap_logger(structlog.ReturnLogger())
        self.c = AdmissionController(config, self.db, slots, log=quiet)
        self.c.advertise = f"{name}:50051"
        self.lock = PostgresWriterLock(self.db, lease=config.ha.lease_seconds)
        open_store(config, self.c, self.lock)

    def elect(self) -> str:
        """One round of oasisd's election (``controller/ha/leadership.py``): the role after."""

        async def announced(role: str) -> None:
            pass

        assert self.c.config.ha is not None
        election = Leadership(self.c, self.lock, self.c.config.ha, announced, log=self.c.log)
        asyncio.run(election.check())
        return self.c.role

    def take_over(self) -> int:
        # a leader's release closes its lock session without a round trip: PostgreSQL
        # lets the lock go once that backend has ended, a moment later (an election
        # retries; so does this, for as long as a backend takes to end)
        deadline = time.monotonic() + 10.0
        while not self.lock.try_acquire():
            assert time.monotonic() < deadline, "the lock was not let go"
            time.sleep(0.05)
        epoch = self.lock.record(self.db, self.c.advertise)
        asyncio.run(self.c.take_over(epoch, self.lock.backend_pid))
        return epoch

    def close(self) -> None:
        self.lock.release()
        self.c.close()


def _same_prices(a: Ledger | None, b: Ledger | None) -> None:
    assert a is not None and b is not None
    assert a.origin == b.origin
    for side in ("worker_side", "ps_side"):
        x, y = getattr(a, side), getattr(b, side)
        assert np.array_equal(x.used, y.used), side
        assert np.array_equal(x.price, y.price), side  # bit for bit
    assert sorted(a.job_ids()) == sorted(b.job_ids())
    assert a.bounds.same_as(b.bounds)  # the same bound estimate: the next decision is the same


def _ha_metrics(c: AdmissionController) -> tuple[float, float]:
    """(oasis_ha_leader, oasis_ha_epoch) as scraped; the lease age must be a sample."""
    text = generate_latest(Metrics(c).registry).decode()
    found = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert 0 <= found["oasis_ha_lease_age_seconds"] < 60
    return found["oasis_ha_leader"], found["oasis_ha_epoch"]


def _stored(db: Database) -> dict[str, int]:
    with db.session() as session:
        return {r.id: r.sequence for r in session.execute(select(JobRow.id, JobRow.sequence))}


def test_fence_standby_follow_and_takeover(tmp_path: Path, postgres: Postgres) -> None:
    url = postgres.new_database()
    jobs = contending_jobs(8)
    a = Node(tmp_path, url, "a")
    b = c = None
    try:
        assert not a.c.leading  # oasisd opens as a standby; its election then leads
        assert a.take_over() == 1 and a.c.leading and a.c.fence_epoch == 1
        b = Node(tmp_path, url, "b")  # the lock is taken: a standby
        assert not b.c.leading
        for spec in jobs[:6]:
            asyncio.run(a.c.submit(spec))
        asyncio.run(a.c.cancel("j1"))
        asyncio.run(b.c.follow())
        asyncio.run(a.c.set_bounds("pin", {"worker": {"gpu": {"U": 60.0}}}))  # an admin write
        # a standby refuses writes, naming the leader
        with pytest.raises(NotLeaderError) as refused:
            asyncio.run(b.c.submit(jobs[6]))
        asyncio.run(b.c.follow())
        assert refused.value.leader in ("", "a:50051")
        with pytest.raises(NotLeaderError, match="the leader is at a:50051"):
            asyncio.run(b.c.quote(jobs[6]))
        _same_prices(a.c.ledger, b.c.ledger)  # followed incrementally, bit for bit
        # the console's overview names each node's role (it said "standalone" before)
        operator = Caller("", Role.OPERATOR)
        nodes = [asyncio.run(ConsoleData(n.c).overview(operator))["node"] for n in (a, b)]
        assert [(n["role"], n["epoch"], n["serving"]) for n in nodes] == [
            ("leader", 1, True),
            ("standby", 1, False),
        ]
        assert nodes[1]["leader"] == "a:50051"

        # a's lease ends (its session is cut, as PostgreSQL does past the lease) and b
        # takes over; a, not told, still believes it leads: its next commit is fenced
        _cut_lease(url, a)
        assert b.take_over() == 2 and b.c.leading
        assert a.c.leading
        before = _stored(a.db)
        with pytest.raises(NotLeaderError, match="stopped leading"):
            asyncio.run(a.c.submit(jobs[7]))
        assert not a.c.leading and _stored(a.db) == before  # nothing committed
        with pytest.raises(NotLeaderError, match="b:50051"):
            asyncio.run(a.c.submit(jobs[7]))

        late = [job(f"b{i}") for i in range(4)]
        jobs += late
        admitted = [
            spec["id"] for spec in jobs[6:] if asyncio.run(b.c.submit(spec)).state == "admitted"
        ]
        assert admitted, "the new leader admitted nothing to cancel"
        asyncio.run(b.c.cancel(admitted[-1]))
        asyncio.run(a.c.follow())  # the old leader follows the new one
        _same_prices(a.c.ledger, b.c.ledger)
        c = Node(tmp_path, url, "c")  # a ledger rebuilt from the store in full
        _same_prices(b.c.ledger, c.c.ledger)
        with b.db.session() as session:
            epochs = [
                e.detail.get("epoch")
                for e in session.scalars(select(EventRow).order_by(EventRow.sequence))
            ]
        assert set(epochs) == {1, 2} and epochs == sorted(epochs)  # one leader per epoch
        assert set(_stored(b.db)) == {j["id"] for j in jobs}
        assert (_ha_metrics(a.c), _ha_metrics(b.c)) == ((0.0, 2.0), (1.0, 2.0))
    finally:
        for node in (a, b, c):
            if node is not None:
                node.close()


def test_a_leader_that_steps_down_names_no_leader_rather_than_itself(
    tmp_path: Path, postgres: Postgres
) -> None:
    """The HA audit: with PostgreSQL stopped, the leader lost its lease and refused
    writes with `this oasisd is a standby: the leader is at` its own address (`oasis
    status` listed it as its own leader), also after following the store again."""
    a = Node(tmp_path, postgres.new_database(), "a")
    try:
        a.take_over()
        a.c.step_down("the lease ended")
        with pytest.raises(NotLeaderError) as refused:
            asyncio.run(a.c.submit(job("late")))
        assert refused.value.leader == "" and "a:50051" not in str(refused.value)
        assert (a.c.ha_status().leader, a.c.ha_status().epoch) == ("", 1)  # epoch: not 0
        asyncio.run(a.c.follow())  # the store still records a: no one else led since
        assert (a.c.ha_status().leader, a.c.ha_status().role) == ("", "standby")
    finally:
        a.close()


def _cut_lease(url: str, node: Node) -> None:
    """End ``node``'s lease as PostgreSQL does past it: its session is terminated. Its
    lock is free once the backend has exited, not when the signal is sent: without the
    wait (PostgreSQL >= 14) a takeover right after found it still held under load."""
    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as admin:
        ended = admin.execute("SELECT pg_terminate_backend(%s, 30000)",
                              (node.lock.backend_pid,)).fetchone()  # fmt: skip
        assert ended == (True,), ended


def _backend_ended(url: str, pid: int) -> None:
    """Wait until PostgreSQL's backend ``pid`` has exited: a closed session's advisory
    lock is free only then, which a loaded machine delays past the close."""
    deadline = time.monotonic() + 30
    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as admin:
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                            (pid,)).fetchone() is not None:  # fmt: skip
            assert time.monotonic() < deadline, f"backend {pid} still there after 30 s"
            time.sleep(0.05)


def _writer_epoch(db: Database, epoch: int) -> None:
    """Set the epoch of the store's ``writer`` row (a newer leader's record, or a restore)."""
    with db.session() as session:
        row = session.get(MetaRow, RECORD_KEY)
        assert row is not None
        row.value = {**row.value, "epoch": epoch}


def test_the_fence_refuses_any_other_epoch_and_a_lock_session_gone(
    tmp_path: Path, postgres: Postgres
) -> None:
    """The fence a leader's every write transaction runs first (``check_epoch``): the
    store's epoch must be the leader's own -- a higher one (another node recorded itself)
    and a lower one (a restore rewound the row) both fence it -- and its lock session
    must still hold the writer lock. Before, with ``<`` in place of ``!=`` on the lock
    session's path, every test passed."""
    url = postgres.new_database()
    a = Node(tmp_path, url, "a")
    try:
        epoch = a.take_over()
        pid = a.lock.backend_pid
        assert pid is not None
        with a.db.session() as session:
            check_epoch(session, epoch, pid)  # its own epoch and lock: it writes
        for stored in (epoch + 1, epoch - 1):
            _writer_epoch(a.db, stored)
            for lock_pid in (pid, None):  # PostgreSQL's path, and the one without a lease
                with a.db.session() as session, pytest.raises(FencedError) as fenced:
                    check_epoch(session, epoch, lock_pid)
                assert f"the store is in epoch {stored}" in str(fenced.value)
        _writer_epoch(a.db, epoch)
        _cut_lease(url, a)  # PostgreSQL ended its lock session: the epoch alone is not enough
        with a.db.session() as session, pytest.raises(FencedError, match=r"lease .* ended"):
            check_epoch(session, epoch, pid)
    finally:
        a.close()


def _election(node: Node) -> tuple[Leadership, list[str]]:
    """One election kept across rounds, as oasisd keeps it, and the roles it announced."""
    announced: list[str] = []

    async def on_role(role: str) -> None:
        announced.append(role)

    assert node.c.config.ha is not None
    return Leadership(node.c, node.lock, node.c.config.ha, on_role, log=node.c.log), announced


def test_a_fenced_leader_steps_down_in_its_election_and_lets_its_lock_go(
    tmp_path: Path, postgres: Postgres
) -> None:
    """A leader fenced out in its decision thread (another node took over) announces
    ``standby`` at its election's next round -- its execution plane stops, its health
    says so -- and lets its lock session go. Before (the mutation audit), with that step
    left out every test passed: the node went on as a leader in all but its decisions,
    its lock kept, and never tried to lead again."""
    url = postgres.new_database()
    a = Node(tmp_path, url, "a")
    b = None
    try:
        election, announced = _election(a)
        asyncio.run(election.check())
        assert announced == ["leader"] and a.c.leading and a.lock.backend_pid is not None
        _cut_lease(url, a)
        b = Node(tmp_path, url, "b")
        assert b.take_over() == 2
        with pytest.raises(NotLeaderError):
            asyncio.run(a.c.submit(job("late")))  # fenced: the decision thread steps down
        assert a.c.role == "standby" and election.role == "leader"
        asyncio.run(election.check())
        assert announced == ["leader", "standby"] and election.role == "standby"
        assert a.lock.backend_pid is None and not a.lock.held()
    finally:
        for node in (a, b):
            if node is not None:
                node.close()


def test_a_leader_whose_lock_session_ended_steps_down_at_its_next_probe(
    tmp_path: Path, postgres: Postgres
) -> None:
    """The lease probe: a leader whose lock session PostgreSQL ended (past the lease)
    stops deciding at once and announces ``standby``, before any write of its own is
    fenced; a leader whose session is alive confirms its lease."""
    url = postgres.new_database()
    a = Node(tmp_path, url, "a")
    try:
        election, announced = _election(a)
        asyncio.run(election.check())
        assert announced == ["leader"]
        election._probed = 0.0  # a probe is due (every probe_seconds)
        a.c.lease_seen = 0.0
        asyncio.run(election.check())
        assert a.c.leading and a.c.lease_seen > 0.0  # confirmed
        _cut_lease(url, a)
        election._probed = 0.0
        asyncio.run(election.check())
        assert not a.c.leading and a.c.role == "standby"
        assert announced == ["leader", "standby"] and a.lock.backend_pid is None
        with pytest.raises(NotLeaderError):
            asyncio.run(a.c.submit(job("late")))
    finally:
        a.close()


def test_a_writer_row_rewound_by_a_restore_never_hands_out_an_epoch_again(
    tmp_path: Path, postgres: Postgres
) -> None:
    """A restore rewinds the store's ``writer`` row to the epoch of its copy; the next
    leader takes an epoch above every one it has seen, not the row's next (which another
    leadership had: two leaders in one epoch). Before (the mutation audit), with the
    epoch seen left out of the election's record, every unit test passed."""
    url = postgres.new_database()
    a = Node(tmp_path, url, "a")
    try:
        assert a.take_over() == 1
        a.c.step_down("a test")
        a.lock.release()
        assert a.take_over() == 2 and a.c.epoch_seen == 2
        a.c.step_down("a test")
        a.lock.release()
        _writer_epoch(a.db, 1)  # the copy was taken in epoch 1
        asyncio.run(a.c.follow())  # a standby reads the rewound row: seen, not forgotten
        assert a.c.epoch_seen == 2
        deadline = time.monotonic() + 10.0  # the released lock session ends a moment later
        while a.elect() != "leader":
            assert time.monotonic() < deadline, a.c.cannot_lead
            time.sleep(0.05)
        assert a.c.fence_epoch == 3
    finally:
        a.close()


def test_a_failed_takeover_leaves_a_standby_naming_the_last_leader_that_rebuilds_its_ledger(
    tmp_path: Path, postgres: Postgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A takeover that fails after its catch-up leaves a standby that names the node
    that led (not itself) and rebuilds its ledger from the store at its next follow: the
    failed takeover may have moved plans the store never took. A takeover that succeeds
    names the new leader itself. The mutation audit: with the ledger not marked stale,
    the lock kept, or a leader naming none, every test passed."""
    url = postgres.new_database()
    a = Node(tmp_path, url, "a")
    b = None
    try:
        a.take_over()
        for spec in contending_jobs(3):
            asyncio.run(a.c.submit(spec))
        b = Node(tmp_path, url, "b")
        _cut_lease(url, a)

        def broken() -> None:
            raise RuntimeError("the stored budget did not read")

        monkeypatch.setattr(b.c, "_restore_stored_budget", broken)
        assert b.elect() == "standby"  # the takeover failed
        assert b.c.ha_status().leader == "a:50051"
        assert b.lock.backend_pid is None  # its lock let go, for another node to try
        before = b.c.ledger
        asyncio.run(b.c.follow())
        assert b.c.ledger is not before  # rebuilt from the store, not followed on
        monkeypatch.undo()
        deadline = time.monotonic() + 10.0  # the released lock session ends a moment later
        while b.elect() != "leader":
            assert time.monotonic() < deadline, b.c.cannot_lead
            time.sleep(0.05)
        assert b.c.ha_status().leader == "b:50051"
        _same_prices(a.c.ledger, b.c.ledger)
    finally:
        for node in (a, b):
            if node is not None:
                node.close()


def test_a_standby_with_smaller_servers_follows_but_leaves_the_lead_to_the_last_leader(
    tmp_path: Path, postgres: Postgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a standby whose config gave a server less capacity than the leader's (a
    config forgotten on one node) took over at the leader's death and re-planned the
    other tenants' admitted jobs to fit it (3 of 4 in a run; a shorter window failed
    one). It now follows, leaving such plans out, and refuses to take over, saying why;
    the node that led last, restarted with the new config (a rolling change), takes
    over and refits them. Its refit, slower than the lease, commits: before, it ran in
    one write transaction, which PostgreSQL ended once idle past the lease, and the
    takeover failed (tried again under the next epoch, the same way if still slow)."""
    url = postgres.new_database()
    short = lambda text: text.replace("lease_seconds = 5", "lease_seconds = 1")  # noqa: E731
    half = lambda text: text.replace("gpu=8,", "gpu=4,")  # noqa: E731  (w2's 8 GPUs)
    # the first leader's lease is the default 5 s: with 1 s, its lock session ended while
    # b opened and followed on a loaded machine (a CI run), and 'late' was fenced
    a = Node(tmp_path, url, "a")
    b = a2 = None
    try:
        a.take_over()
        for spec in contending_jobs(6):
            asyncio.run(a.c.submit(spec))
        b = Node(tmp_path, url, "b", edit=half)
        asyncio.run(b.c.follow())
        assert b.c._unfitted > 0, "some plan must use more of w2 than b has"
        asyncio.run(a.c.submit(job("late")))
        asyncio.run(b.c.follow())  # past the plans that do not fit: no exception
        gone = a.lock.backend_pid
        assert gone is not None
        a.close()  # the leader is gone
        _backend_ended(url, gone)  # its lock with it (a CI run: a2 found it still held)
        problem = b.c.takeover_problem()
        assert "stored plans do not fit this node's servers or window" in problem, problem
        assert "server w2" in problem and "a:50051" in problem
        # told to the clients it redirects (the HA audit: it named the dead leader only)
        # and in oasis status, not only in its own log
        assert b.elect() == "standby" and b.c.cannot_lead == problem
        refusal = str(b.c._not_leader())
        assert refusal.startswith("this oasisd is a standby that cannot take over (")
        from controller.commands.status import _leadership_warnings

        said = _leadership_warnings([{"address": "b:50051", "role": "standby",
                                      "leader": "a:50051", "cannot_lead": problem}])  # fmt: skip
        assert said == ["no node named in --server leads: the standbys name a:50051",
                        f"b:50051 cannot take over: {problem}"]  # fmt: skip
        plans = _plans(b.db)
        # the node that led last comes back with the new config: it applies it
        a2 = Node(tmp_path, url, "a", edit=lambda text: short(half(text)))
        assert a2.c.takeover_problem() == ""

        def slower(*args: Any) -> Any:
            time.sleep(1.5)  # past the 1 s lease, as a long refit is
            return refit(*args)

        monkeypatch.setattr("controller.admission.recovery.refit", slower)
        assert a2.elect() == "leader" and a2.c.fence_epoch == 2
        assert _plans(a2.db) != plans
        ledger = a2.c.ledger
        assert ledger is not None
        w2 = a2.c.cluster.worker_names.index("w2")
        gpu = a2.c.cluster.resources.index("gpu")
        assert (ledger.worker_side.used[:, w2, gpu] <= 4 + 1e-9).all()
        asyncio.run(b.c.follow())
        assert b.c.takeover_problem() == ""  # counted again: its config is the leader's now
    finally:
        for node in (b, a2):
            if node is not None:
                node.close()


def _plans(db: Database) -> list[tuple[Any, ...]]:
    with db.session() as session:
        rows = session.execute(
            select(AllocationRow.job_id, AllocationRow.slot, AllocationRow.server,
                   AllocationRow.workers, AllocationRow.ps).order_by(
                AllocationRow.job_id, AllocationRow.slot, AllocationRow.server)
        ).all()  # fmt: skip
    return [tuple(r) for r in rows]


def test_a_takeover_names_the_differences_of_pricing_limits_and_auth(
    tmp_path: Path, postgres: Postgres
) -> None:
    """Before: a standby with other price bounds, limits or tokens took over without a
    word: after a failover, decisions were priced otherwise, or clients refused, and no
    log said why."""
    url = postgres.new_database()
    a = Node(tmp_path, url, "a")
    b = None
    try:
        a.take_over()
        other = lambda text: text.replace(  # noqa: E731
            "[ha]", "[pricing]\ntrim = 0.2\n\n[limits]\nmax_job_chunks = 500\n\n[ha]"
        )
        b = Node(tmp_path, url, "b", edit=other)
        with b.db.session() as session:
            found = b.c._setup_differences(session)
        assert any(d.startswith("pricing.trim: 0.2 here, 0.3 recorded") for d in found), found
        assert any(d.startswith("limits.max_job_chunks: 500 here") for d in found), found
        assert b.c.takeover_problem() == ""  # allowed: no stored plan moves
        # a recorded window edited past float64 (JSON keeps the integer): before,
        # OverflowError out of every takeover, so this standby could never lead
        with b.db.session() as session:
            session.execute(text(
                "UPDATE meta SET value = jsonb_set(value::jsonb, '{window}', "
                "('1' || repeat('0', 400))::jsonb)::json WHERE key = 'settings'"
            ))  # fmt: skip
        with b.db.session() as session:
            found = b.c._setup_differences(session)
        assert not any(d.startswith("window:") for d in found), found
        a.lock.release()  # the leader gone
        assert b.take_over() > 0 and b.c.role == "leader"
    finally:
        for node in (a, b):
            if node is not None:
                node.close()


def test_a_standby_on_another_slot_grid_never_takes_the_lead(
    tmp_path: Path, postgres: Postgres
) -> None:
    """Before: a standby with 60 s slots, started on the empty store of a leader with
    3600 s slots, took over after the leader died, rewrote the slot grid and moved every
    plan (admitted jobs completed at once, never having run). It now refuses to lead,
    without taking the lock or recording an epoch, and says why; clients are not sent to
    it as a leader."""
    url = postgres.new_database()
    a = Node(tmp_path, url, "a")
    b = None
    try:
        a.take_over()
        b = Node(tmp_path, url, "b", edit=lambda t: t.replace("slot_seconds = 3600",
                                                             "slot_seconds = 60"))  # fmt: skip
        assert not b.c.leading  # the store held no job yet: it started
        for spec in contending_jobs(3):
            asyncio.run(a.c.submit(spec))
        problem = b.c.takeover_problem()
        assert "daemon.slot_seconds is 60 s, but the store's jobs were planned in slots of " \
               "3600 s" in problem, problem  # fmt: skip
        _cut_lease(url, a)
        with pytest.raises(SlotGridChangedError):
            b.take_over()
        assert not b.c.leading and b.c.leader is not None
        assert b.c.leader.address == "a:50051"
    finally:
        for node in (a, b):
            if node is not None:
                node.close()


def test_a_standby_missing_a_resource_the_jobs_demand_says_so_and_never_takes_the_lock(
    tmp_path: Path, postgres: Postgres
) -> None:
    """The second review: a standby whose [cluster] resources lack one that stored jobs
    demand said it could lead, took the lock, failed its takeover (the resources check),
    let the lock go and did it again every retry, a traceback and an epoch each time."""
    import re

    from tests.servers import SMALL_JOB

    url = postgres.new_database()
    a = Node(tmp_path, url, "a")
    b = None
    try:
        a.take_over()
        b = Node(tmp_path, url, "b", edit=lambda t: re.sub(r'"disk", |disk=\d+, ', "", t))
        assert not b.c.leading  # the store held no job yet: it started
        asyncio.run(a.c.submit({**SMALL_JOB, "id": "on-disk"}))
        problem = b.c.takeover_problem()
        assert "[cluster] resources lacks 'disk'" in problem and "on-disk" in problem, problem
        assert b.c.takeover_problem() == problem  # said again, from the check made once
    finally:
        for node in (a, b):
            if node is not None:
                node.close()


class _Skewed:
    """The system clock, ``skew`` seconds off."""

    def __init__(self, skew: float) -> None:
        self.skew = skew

    def now(self) -> float:
        return time.time() + self.skew


def test_a_standby_whose_clock_is_off_the_leaders_never_takes_the_lead(
    tmp_path: Path, postgres: Postgres
) -> None:
    """Each node numbers slots by its own clock, and nothing compared them (the HA
    audit): a standby 90 s behind would have led, letting jobs arrive and cancelled
    jobs' slots go early. The leader records its clock's offset from PostgreSQL's when it
    takes the lock; a standby whose own offset differs by more than ``max_clock_skew``
    (36 s with hour-long slots) refuses to lead, naming the skew. 10 s off is allowed."""
    from controller.admission.follow import max_clock_skew
    from controller.store.writer_lock import recorded_holder

    assert max_clock_skew(3600.0) == 36.0 and max_clock_skew(60.0) == 1.0
    url = postgres.new_database()
    a = Node(tmp_path, url, "a")
    nodes = [a]
    try:
        assert a.lock.try_acquire()
        epoch = a.lock.record(a.db, a.c.advertise, now=a.c.slots.clock.now)
        asyncio.run(a.c.take_over(epoch, a.lock.backend_pid))
        with a.db.session() as session:
            holder = recorded_holder(session)
        assert holder is not None and holder.clock_offset is not None
        assert abs(holder.clock_offset) < 5.0  # one machine, one PostgreSQL
        behind = Node(tmp_path, url, "b", clock=_Skewed(-90.0))
        ahead = Node(tmp_path, url, "c", clock=_Skewed(+3600.0))
        close = Node(tmp_path, url, "d", clock=_Skewed(-10.0))
        nodes += [behind, ahead, close]
        problem = behind.c.takeover_problem()
        assert problem.startswith("this node's clock is 90 s behind the clock of the node "
                                  "that led last (a:50051)"), problem  # fmt: skip
        assert "at most 36 s with 3600 s slots" in problem and "NTP" in problem
        assert "3.6e+03 s ahead of" in ahead.c.takeover_problem()
        assert close.c.takeover_problem() == ""
        assert behind.elect() == "standby"  # refused: no lock taken, no epoch recorded
        with a.db.session() as session:
            assert (h := recorded_holder(session)) is not None and h.epoch == epoch
    finally:
        for node in nodes:
            node.close()


def test_a_standby_without_an_epoch_takes_the_leaders(tmp_path: Path, postgres: Postgres) -> None:
    """Before: a leader whose config sets the epoch never records it apart from its
    settings, and a standby whose config sets none exited 1 at every start ("slot 0 is
    not recorded in the store yet"): under systemd, a restart loop and no standby."""
    url = postgres.new_database()
    epochless = lambda text: "\n".join(  # noqa: E731
        line for line in text.splitlines() if not line.startswith("epoch =")
    )
    a = Node(tmp_path, url, "a", edit=lambda t: t.replace("epoch = 0.0", "epoch = 3600.0"))
    b = None
    try:
        a.take_over()
        b = Node(tmp_path, url, "b", edit=epochless)
        assert not b.c.leading and b.c.slots.epoch == 3600.0
    finally:
        for node in (a, b):
            if node is not None:
                node.close()


def test_ha_settings_are_checked(tmp_path: Path) -> None:
    def config(extra: str) -> None:
        load(write_config(tmp_path / "x.toml", tmp_path / "x", extra=extra))

    with pytest.raises(ConfigError, match=r"ha\.lease: unknown key"):
        config("[ha]\nlease = 5\n")
    with pytest.raises(ConfigError, match=r"ha\.lease_seconds: must be within"):
        config("[ha]\nlease_seconds = 0.5\n")
    with pytest.raises(ConfigError, match=r"ha\.retry_seconds: must be <= lease_seconds / 2"):
        config("[ha]\nlease_seconds = 2\nretry_seconds = 1.5\n")
    # before: taken, and a node then queried the shared PostgreSQL in a loop
    with pytest.raises(ConfigError, match=r"ha\.retry_seconds: must be at least 0\.01 seconds"):
        config("[ha]\nretry_seconds = 1e-9\n")
    with pytest.raises(ConfigError, match=r"ha\.follow_seconds: must be at least 0\.01 seconds"):
        config("[ha]\nfollow_seconds = 0.001\n")
    with pytest.raises(ConfigError, match=r"ha\.advertise: must be host:port"):
        config('[ha]\nadvertise = "nohost"\n')


@pytest.mark.parametrize(
    ("raw", "taken"),
    [
        ({"lease_seconds": 1}, (1.0, 0.5, 0.5)),  # the bounds given are in the range
        ({"lease_seconds": 300}, (300.0, 0.5, 0.5)),
        ({"lease_seconds": 2, "retry_seconds": 1.0, "follow_seconds": 2.0}, (2.0, 1.0, 2.0)),
        ({"retry_seconds": 0.01, "follow_seconds": 0.01}, (5.0, 0.01, 0.01)),
    ],
)
def test_ha_settings_at_their_bounds_are_taken(
    raw: dict[str, float], taken: tuple[float, float, float]
) -> None:
    ha = ha_from_dict(raw)
    assert ha is not None
    assert (ha.lease_seconds, ha.retry_seconds, ha.follow_seconds) == taken


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ({"lease_seconds": 0.99}, r"ha\.lease_seconds: must be within 1 \.\. 300"),
        ({"lease_seconds": 300.5}, r"ha\.lease_seconds: must be within 1 \.\. 300"),
        ({"lease_seconds": 2, "retry_seconds": 1.01}, r"ha\.retry_seconds: must be <= "),
        ({"lease_seconds": 2, "follow_seconds": 2.01}, r"ha\.follow_seconds: must be <= "),
        ({"advertise": "head-a:65536"}, r"ha\.advertise: must be host:port"),
        ({"advertise": ":50051"}, r"ha\.advertise: must be host:port"),
        # digits of another script: int() reads them, a client's resolver does not
        (
            {"advertise": "head-a:\u0665\u0660\u0660\u0665\u0661"},
            r"ha\.advertise: must be host:port",
        ),
        ({"advertise": "h" * 251 + ":5005"}, r"ha\.advertise: must be host:port"),
    ],
)
def test_ha_settings_past_their_bounds_are_refused(raw: dict[str, Any], error: str) -> None:
    with pytest.raises(SpecError, match=error):
        ha_from_dict(raw)


def test_ha_addresses_at_their_bounds_are_taken() -> None:
    for advertise in ("head-a:65535", "h" * 250 + ":5005"):  # the largest port; 255 bytes
        ha = ha_from_dict({"advertise": advertise})
        assert ha is not None and ha.advertise == advertise


def test_a_leader_confirms_its_lease_every_quarter_of_it_at_most_each_second() -> None:
    """A leader probes well inside its lease: a 2 s lease every 0.5 s, and any lease of
    4 s or more every second (the mutation audit: with max in place of min, every test
    passed, and a 300 s lease was confirmed every 75 s)."""
    assert HaConfig(lease_seconds=2.0).probe_seconds == 0.5
    assert HaConfig(lease_seconds=8.0).probe_seconds == 1.0
    assert HaConfig(lease_seconds=300.0).probe_seconds == 1.0


def test_ha_on_sqlite_refuses_to_start(tmp_path: Path) -> None:
    path = write_config(tmp_path / "s.toml", tmp_path / "s", extra="[ha]\n")
    config = load(path)
    db = Database(config.database_url)
    controller = AdmissionController(config, db, SlotClock(SystemClock(), 3600, 0))
    from controller.store.writer_lock import writer_lock

    with pytest.raises(StartupError, match="high availability needs a PostgreSQL store") as err:
        open_store(config, controller, writer_lock(db))
    controller.close()
    # exit 2, as for any config only an operator can mend: the unit does not restart it
    # (exit 1 restarted it every RestartSec, each start failing the same way)
    assert err.value.status == 2


def test_ha_without_an_address_for_clients_is_refused_with_exit_2(tmp_path: Path) -> None:
    from controller.daemon import _advertise

    # daemon.listen on port 0 (write_config's) and no ha.advertise: a config to mend
    config = load(write_config(tmp_path / "a.toml", tmp_path / "a", extra="[ha]\n"))
    with pytest.raises(StartupError, match=r"ha\.advertise: needed when daemon\.listen") as err:
        _advertise(config)
    assert err.value.status == 2


class _Node(pb_grpc.ClusterServicer):
    """A fake head node: a leader answers GetClusterInfo, a standby refuses naming
    ``leader`` (or no one)."""

    def __init__(self, leader: str | None) -> None:
        self.leader = leader
        self.calls = 0

    def GetClusterInfo(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self.calls += 1
        if self.leader is None:
            return pb.GetClusterInfoResponse(window=7)
        if self.leader:
            context.set_trailing_metadata((("oasis-leader", self.leader),))
        context.abort(grpc.StatusCode.UNAVAILABLE, "standby")


def _serve(node: pb_grpc.ClusterServicer) -> tuple[grpc.Server, str]:
    """``node`` served on a loopback port: the server and its address."""
    server = grpc.server(ThreadPoolExecutor(2))
    pb_grpc.add_ClusterServicer_to_server(node, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def test_clients_follow_the_redirect_and_retry_over_the_nodes() -> None:
    leader = _Node(None)
    lead_server, lead_address = _serve(leader)
    standby = _Node(lead_address)
    standby_server, standby_address = _serve(standby)
    dead = f"127.0.0.1:{free_port()}"
    try:
        # the standby first: one redirect, then the leader answers
        pool = LeaderPool([standby_address, lead_address], grpc.insecure_channel, budget=5)
        stub = FollowingStub(pool, pb_grpc.ClusterStub)
        assert stub.GetClusterInfo(pb.GetClusterInfoRequest(), timeout=5).window == 7
        assert (pool.redirects, pool.address, standby.calls) == (1, lead_address, 1)
        pool.close()
        # a dead node first: retried on the next one, no redirect needed
        pool = LeaderPool([dead, lead_address], grpc.insecure_channel, budget=5)
        stub = FollowingStub(pool, pb_grpc.ClusterStub)
        assert stub.GetClusterInfo(pb.GetClusterInfoRequest(), timeout=5).window == 7
        pool.close()
        # one address that is down: fails at once, as before
        pool = LeaderPool([dead], grpc.insecure_channel, budget=5)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as down:
            FollowingStub(pool, pb_grpc.ClusterStub).GetClusterInfo(
                pb.GetClusterInfoRequest(), timeout=5
            )
        assert down.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < 3
        pool.close()
        # only standbys naming no one: retried with back-off until the budget is spent
        lost = _Node("")
        lost_server, lost_address = _serve(lost)
        pool = LeaderPool([lost_address, standby_address], grpc.insecure_channel, budget=1)
        standby.leader = ""
        with pytest.raises(grpc.RpcError):
            FollowingStub(pool, pb_grpc.ClusterStub).GetClusterInfo(
                pb.GetClusterInfoRequest(), timeout=5
            )
        assert lost.calls + standby.calls >= 4  # several rounds, bounded by the budget
        pool.close()
        lost_server.stop(0)
    finally:
        lead_server.stop(0)
        standby_server.stop(0)


class _Refusing(_Node):
    """A leader that refuses the call (bad input, no permission): an answer, not a
    node gone."""

    def __init__(self) -> None:
        super().__init__(None)

    def GetClusterInfo(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self.calls += 1
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "operators only")


def test_a_call_a_node_refuses_is_not_tried_on_the_other_nodes() -> None:
    """Only a node that could not answer (UNAVAILABLE, or a deadline with several) moves
    the call on; a refusal is the leader's answer, raised at once and asked once (a
    submission refused for its input was not to go round the nodes for the budget)."""
    refusing, other = _Refusing(), _Node(None)
    servers = [_serve(refusing), _serve(other)]
    try:
        pool = LeaderPool([servers[0][1], servers[1][1]], grpc.insecure_channel, budget=5)
        pool._located = True  # no GetLeadership on these fakes: start at the first
        with pytest.raises(grpc.RpcError) as err:
            FollowingStub(pool, pb_grpc.ClusterStub).GetClusterInfo(
                pb.GetClusterInfoRequest(), timeout=5
            )
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert (refusing.calls, other.calls, pool.address) == (1, 0, servers[0][1])
        pool.close()
    finally:
        for server, _ in servers:
            server.stop(0)


class _Leadership(pb_grpc.HighAvailabilityServicer):
    """A fake node's answer to "who leads"; ``hang`` seconds first (a stopped process
    answers nothing)."""

    def __init__(self, role: str, hang: float = 0.0) -> None:
        self.role, self.hang = role, hang
        self.refuse: grpc.StatusCode | None = None

    def GetLeadership(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        time.sleep(self.hang)
        if self.refuse is not None:
            context.abort(self.refuse, "refused")
        return pb.GetLeadershipResponse(enabled=True, role=self.role)


class _HungNode(_Node):
    def __init__(self, hang: float) -> None:
        super().__init__(None)
        self.hang = hang

    def GetClusterInfo(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        time.sleep(self.hang)
        return super().GetClusterInfo(request, context)


def test_a_hung_node_named_first_costs_a_command_seconds_not_its_whole_timeout() -> None:
    """The HA audit: with the leader stopped (SIGSTOP) and named first, every command
    gave its whole --timeout to it before trying the standby that had taken over
    (``--timeout 10`` failed after 10.7 s; 30 took 20.6 s). Asked who leads, all at
    once, the nodes that answer say; the first call goes to the new leader."""
    from controller.commands.failover import LOCATE_SECONDS

    def first_call(addresses: list[str]) -> tuple[int, str]:
        """The first call over ``addresses``: its answer's window and where it went, in
        under LOCATE_SECONDS + 2 s."""
        pool = LeaderPool(addresses, grpc.insecure_channel, budget=10)
        started = time.monotonic()
        info = FollowingStub(pool, pb_grpc.ClusterStub).GetClusterInfo(
            pb.GetClusterInfoRequest(), timeout=10
        )
        assert time.monotonic() - started < LOCATE_SECONDS + 2.0
        pool.close()
        return info.window, pool.address

    servers = []
    try:
        addresses = []
        leadership = [_Leadership("leader", hang=8.0), _Leadership("leader")]
        for node, role in ((_HungNode(8.0), leadership[0]), (_Node(None), leadership[1])):
            server = grpc.server(ThreadPoolExecutor(4))
            pb_grpc.add_ClusterServicer_to_server(node, server)
            pb_grpc.add_HighAvailabilityServicer_to_server(role, server)
            addresses.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
            server.start()
            servers.append(server)
        assert first_call(addresses) == (7, addresses[1])
        # a node that refuses the question (an older daemon, or a token it refuses) is
        # alive: a call starts there, not at the hung one (the diff review: a tenant's
        # token was refused GetLeadership, and its calls waited on the hung node)
        leadership[1].refuse = grpc.StatusCode.PERMISSION_DENIED
        assert first_call(addresses) == (7, addresses[1])
    finally:
        for server in servers:
            server.stop(0)


class _TakingOver(_Node):
    """A standby naming ``leader`` until ``at`` (monotonic), then leading."""

    def __init__(self, leader: str, at: float) -> None:
        super().__init__(leader)
        self.at = at

    def GetClusterInfo(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        if time.monotonic() >= self.at:
            self.leader = None
        return super().GetClusterInfo(request, context)


def test_a_standby_naming_a_stopped_leader_is_retried_until_it_leads() -> None:
    """The HA audit: `oasis submit --server a,b` 1 s after the leader a was stopped
    (SIGSTOP) asked b, which named a (not taken over yet), and was sent on to a, where it
    waited 18 s for the connection to time out though b led after 5 s (with --timeout 10
    it failed). A node that failed within FAILED_MEMORY is passed over: b is asked again
    until it leads."""
    from controller.commands.failover import LOCATE_SECONDS

    servers = []
    try:
        hung = grpc.server(ThreadPoolExecutor(4))
        pb_grpc.add_ClusterServicer_to_server(_HungNode(8.0), hung)
        pb_grpc.add_HighAvailabilityServicer_to_server(_Leadership("leader", hang=8.0), hung)
        hung_address = f"127.0.0.1:{hung.add_insecure_port('127.0.0.1:0')}"
        hung.start()
        servers.append(hung)
        standby = _TakingOver(hung_address, time.monotonic() + LOCATE_SECONDS + 1.5)
        server = grpc.server(ThreadPoolExecutor(4))
        pb_grpc.add_ClusterServicer_to_server(standby, server)
        pb_grpc.add_HighAvailabilityServicer_to_server(_Leadership("standby"), server)
        address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        server.start()
        servers.append(server)
        pool = LeaderPool([hung_address, address], grpc.insecure_channel, budget=10)
        started = time.monotonic()
        info = FollowingStub(pool, pb_grpc.ClusterStub).GetClusterInfo(
            pb.GetClusterInfoRequest(), timeout=10
        )
        assert info.window == 7
        assert time.monotonic() - started < LOCATE_SECONDS + 1.5 + 2.0
        assert (pool.address, standby.calls > 1) == (address, True)
        pool.close()
    finally:
        for server in servers:
            server.stop(0)


class _Events(pb_grpc.AdmissionServicer):
    """A fake node's event log, 1..``last``: streamed after the request's sequence,
    then the stream ends UNAVAILABLE after ``die_after`` (the node killed) or is held."""

    def __init__(self, last: int, die_after: int | None = None) -> None:
        self.last, self.die_after = last, die_after
        self.asked: list[int] = []

    def WatchEvents(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self.asked.append(request.after_sequence)
        for sequence in range(max(request.after_sequence, 0) + 1, self.last + 1):
            if self.die_after is not None and sequence > self.die_after:
                context.abort(grpc.StatusCode.UNAVAILABLE, "the node went away")
            yield pb.Event(sequence=sequence, kind="decided")


def test_the_back_off_between_tries_doubles_to_its_most_and_stops_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One back-off for calls and watches (it was written twice in failover.py): 50 ms
    doubling to 0.5 s, jittered by half either way, never past the deadline."""
    slept: list[float] = []
    monkeypatch.setattr("controller.commands.failover.time.sleep", slept.append)
    jitter = iter([1.0] * 6 + [1.5, 0.5, 1.0])
    monkeypatch.setattr("controller.commands.failover.random.uniform", lambda a, b: next(jitter))
    backoff, later = Backoff(), time.monotonic() + 60
    for _ in range(6):
        backoff.pause(later)
    backoff.reset()
    backoff.pause(later)
    backoff.pause(later)
    backoff.pause(time.monotonic() - 1)  # past its deadline: no pause
    assert [round(s, 3) for s in slept] == [0.05, 0.1, 0.2, 0.4, 0.5, 0.5, 0.075, 0.05, 0.0]


def test_watch_over_several_nodes_goes_on_from_the_last_event_on_another() -> None:
    """The HA audit: `oasis watch --server a,b` ended UNAVAILABLE at the leader's kill -9
    while the standby took over and served the same events."""
    servers, addresses = [], []
    dying, standby = _Events(4, die_after=2), _Events(4)
    try:
        for node in (dying, standby):
            server = grpc.server(ThreadPoolExecutor(4))
            pb_grpc.add_AdmissionServicer_to_server(node, server)
            addresses.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
            server.start()
            servers.append(server)
        pool = LeaderPool(addresses, grpc.insecure_channel, budget=5)
        seen = [e.sequence for e in followed_events(pool, 0)]
        assert (seen, standby.asked, pool.address) == ([1, 2, 3, 4], [2], addresses[1])
        pool.close()
        # one node: its error, as before
        pool = LeaderPool(addresses[:1], grpc.insecure_channel, budget=5)
        with pytest.raises(grpc.RpcError) as ended:
            list(followed_events(pool, 0))
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        pool.close()
    finally:
        for server in servers:
            server.stop(0)


def test_a_failed_call_names_the_node_it_went_to_not_the_list() -> None:
    """The HA audit: a standby naming a dead leader read "cannot reach the daemon at
    <the standby>" (it is up), and two nodes read as one address "[a,b]:50051"."""
    import argparse

    from controller.commands.connection import _explain
    from controller.commands.failover import redirected_by, tried_address

    dead = f"127.0.0.1:{free_port()}"
    standby = _Node(dead)
    server, address = _serve(standby)
    try:
        pool = LeaderPool([address], grpc.insecure_channel, budget=2)
        with pytest.raises(grpc.RpcError) as failed:
            FollowingStub(pool, pb_grpc.ClusterStub).GetClusterInfo(
                pb.GetClusterInfoRequest(), timeout=2
            )
        pool.close()
        assert tried_address(failed.value) == dead
        assert redirected_by(failed.value) == f"{address} said: standby"  # its message
        # only on a call that found no leader: the next call, answered NOT_FOUND by a
        # live leader after the same redirect, carries no word of the standby's
        lead = _Node(None)
        lead_server, lead_address = _serve(lead)
        standby.leader = lead_address
        pool = LeaderPool([address], grpc.insecure_channel, budget=2)
        stub = FollowingStub(pool, pb_grpc.ClusterStub)
        assert stub.GetClusterInfo(pb.GetClusterInfoRequest(), timeout=2).window == 7
        lead.leader = ""  # it refuses now: UNAVAILABLE naming no one (not the standby)
        with pytest.raises(grpc.RpcError) as refused:
            stub.GetClusterInfo(pb.GetClusterInfoRequest(), timeout=2)
        assert redirected_by(refused.value) is None
        pool.close()
        lead_server.stop(0)
        args = argparse.Namespace(server=address, timeout=2.0, tls=False, tls_ca="")
        said = _explain(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses",
                        args, tried_address(failed.value))  # fmt: skip
        assert said.startswith(f"cannot reach the daemon at {dead} (the leader a node of "
                               "--server named): ")  # fmt: skip
        args.server = f"{address},{dead}"
        said = _explain(grpc.StatusCode.UNAVAILABLE, "connection refused", args, dead)
        assert said.startswith(f"cannot reach the daemon at {dead} (tried last of {address}, "
                               f"{dead}): connection refused")  # fmt: skip
    finally:
        server.stop(0)


def test_a_deleted_writer_row_does_not_take_the_epoch_back(
    postgres: Postgres, tmp_path: Path
) -> None:
    """The HA audit: ``delete from meta where key = 'writer'`` made the next leader take
    epoch 1 again, below the epochs its events carried (nothing was double-written,
    but "one leader per epoch, epochs never go down" no longer held). The epoch counts
    on from the newest event's."""
    from sqlalchemy import delete

    from controller.store import MetaRow
    from controller.store.writer_lock import RECORD_KEY

    url = postgres.new_database()
    a = Node(tmp_path, url, "a")
    try:
        assert a.take_over() == 1
        asyncio.run(a.c.submit(job("e1")))
        assert a.take_over() == 2  # (taken again: epoch 2, as a restart would)
        asyncio.run(a.c.submit(job("e2")))
    finally:
        a.close()
    db = Database(url)
    with db.session() as session:
        session.execute(delete(MetaRow).where(MetaRow.key == RECORD_KEY))
    db.dispose()
    b = Node(tmp_path, url, "b")
    try:
        assert b.take_over() == 3
    finally:
        b.close()


def test_an_upgrade_that_rewrites_the_jobs_waits_until_no_other_node_leads(
    tmp_path: Path, postgres: Postgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One node at a time does not do for migration 0008, which keys each submitter's
    jobs ``NAME:ID``: a node of the older version that led again after it failed every
    tenant's job (the upgrade audit). An upgraded node refuses to start while another
    leads (exit 2, naming the leader), and starts once it is stopped."""
    import controller.startup
    from tests.test_job_keys import _to

    monkeypatch.setattr(controller.startup, "REWRITE_WAIT_SECONDS", 1.0)
    url = postgres.new_database()
    old = Node(tmp_path, url, "old")
    try:
        old.take_over()
        _to(old.db, "0007", down=True)  # the store as the older version keeps it
        with pytest.raises(StartupError, match=r"migration 0008 rewrites the stored jobs") as err:
            Node(tmp_path, url, "new")
        assert err.value.status == 2
        assert "another node has led for 1 s (" in str(err.value)
        assert "stop every oasisd on this store" in str(err.value)
    finally:
        old.close()
    new = Node(tmp_path, url, "new")  # the older node stopped: the upgrade goes through
    try:
        with new.db.session() as s:
            assert s.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0009"
    finally:
        new.close()


def test_a_cordon_before_a_standbys_first_follow_is_in_its_ledger(
    tmp_path: Path, postgres: Postgres
) -> None:
    """The HA audit: a cordon (or a failure) committed between a standby's start and
    its first follow was never applied: the first follow took the outage mark as it
    found it, and after a takeover the new leader planned tenants' jobs on the
    cordoned server. The mark is now read with each rebuild."""
    url = postgres.new_database()
    a = Node(tmp_path, url, "a")
    b = None
    try:
        a.take_over()
        b = Node(tmp_path, url, "b")  # a standby, its ledger rebuilt at its start
        now = a.c.slot
        asyncio.run(a.c.cordon("w0", "maintenance", "ops", force=True))  # from the next slot
        a.close()  # the leader stops before b followed once
        b.take_over()
        assert b.c.leading
        w0 = b.c.cluster.worker_names.index("w0")
        assert b.c._ledger.worker_side.blocked[1 + now - b.c._ledger.origin :, w0].all()
        for i in range(8):
            view = asyncio.run(b.c.submit(job(f"late{i}")))
            if view.state == "admitted":
                sched = b.c._ledger.schedule(view.id).after(now + 1)
                assert not (sched.slots and sched.workers[:, w0].any()), view.id
    finally:
        for node in (a, b):
            if node is not None:
                node.close()


def test_a_standby_never_leads_a_store_a_newer_oasis_migrated(
    tmp_path: Path, postgres: Postgres
) -> None:
    """In the upgrade audit a standby of the older version (0008), left running while an
    upgraded node migrated the store to 0009, took the lead when the old leader stopped:
    it refuses such a store at start, but never looked again. It now says why and
    leaves the lock alone, and leads again once the store is at a revision it knows."""
    url = postgres.new_database()
    a = Node(tmp_path, url, "a")
    b = None
    try:
        a.take_over()
        b = Node(tmp_path, url, "b")
        assert not b.c.leading
        with a.db.session() as s:  # what a newer oasis's migration leaves
            s.execute(text("UPDATE alembic_version SET version_num = '0099'"))
        problem = b.c.takeover_problem()
        assert "the store is at schema revision '0099', which this oasis does not know" in (
            problem
        ), problem
        assert "upgrade it and restart it" in problem
        _cut_lease(url, a)
        assert b.elect() == "standby"
        assert b.c.cannot_lead == problem
        with a.db.session() as s:
            s.execute(text("UPDATE alembic_version SET version_num = '0009'"))
        assert b.c.takeover_problem() == ""
        assert b.elect() == "leader"
    finally:
        for node in (a, b):
            if node is not None:
                node.close()


def test_a_standby_reads_again_only_the_estimates_its_events_moved(
    tmp_path: Path, postgres: Postgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At every follow (each 0.5 s) a standby read and parsed every submitter's bound
    estimate, whether or not anything had happened: with 2,000 submitters an idle
    standby spent 0.6 s of CPU a second on it. Now a follow with no decision reads
    none, one after a decision reads its submitter's, a new submitter's is read, and
    an operator's reset of one is read in full; the standby's prices and bounds stay
    the leader's, bit for bit, throughout."""
    from pricing.bound_estimate import BoundEstimate

    url = postgres.new_database()
    a = Node(tmp_path, url, "a")
    b = None
    parsed = 0
    real = BoundEstimate.from_dict.__func__  # type: ignore[attr-defined]

    def counted(cls: type[BoundEstimate], data: Any) -> Any:
        nonlocal parsed
        parsed += 1
        return real(cls, data)

    priced = 0
    bounds = BoundEstimate.bounds

    def counted_bounds(self: BoundEstimate, *args: Any) -> Any:
        nonlocal priced
        priced += 1
        return bounds(self, *args)

    def follow() -> int:
        """Parses of submitters' states in one follow of b, its prices then a's."""
        nonlocal parsed, priced
        assert b is not None
        parsed = priced = 0
        asyncio.run(b.c.follow())
        assert priced <= 3 * parsed + 3, (priced, parsed)  # the others' bounds kept
        _same_prices(a.c.ledger, b.c.ledger)
        assert b.c._estimate.head() == a.c._estimate.head()
        return parsed

    try:
        assert a.take_over() == 1
        names = [f"t{i}" for i in range(12)]
        for i, name in enumerate(names):
            asyncio.run(a.c.submit(job(f"x{i}"), by=name))
        b = Node(tmp_path, url, "b")
        monkeypatch.setattr(BoundEstimate, "from_dict", classmethod(counted))
        monkeypatch.setattr(BoundEstimate, "bounds", counted_bounds)
        assert follow() == 0  # nothing happened
        asyncio.run(a.c.submit(job("y1"), by="t3"))
        assert follow() == 1  # t3's alone
        asyncio.run(a.c.submit(job("y2"), by="newcomer"))
        asyncio.run(a.c.submit(job("y3"), by="t5"))
        assert follow() == 2
        assert follow() == 0
        asyncio.run(a.c.set_bounds("reset", None, submitter="t7"))
        assert follow() == len(names)  # an operator's change: read in full
        asyncio.run(a.c.submit(job("y4"), by="t7"))  # back, from the prior
        assert follow() == 1
    finally:
        for node in (a, b):
            if node is not None:
                node.close()
