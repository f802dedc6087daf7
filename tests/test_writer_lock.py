"""One daemon per store and per port: a second ``oasisd`` on the same store (SQLite or
PostgreSQL) exits 1 with one line naming the first (host, pid, since); a second on the
same port fails to listen; a lock whose PostgreSQL session ended is taken again, and a
daemon whose lock another process took over stops (exit 1)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from unittest.mock import ANY

import grpc
import psycopg
import pytest
import sqlalchemy.exc
import structlog
from sqlalchemy import create_engine, text

from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.store import Database, migrate
from controller.store.watch import StoreWatch
from controller.store.writer_lock import (
    LOCK_KEY,
    MAX_EPOCH,
    FileWriterLock,
    Holder,
    StoreLockedError,
    is_epoch,
    recorded_holder,
    this_process,
)
from tests.servers import ROOT, Daemon, Postgres, write_config
from tests.test_daemon_e2e import job, submit_rpc


def _oasisd(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller.daemon", "--config", str(config), *args],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip


def _writer_record(url: str) -> dict[str, object]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            raw = conn.execute(text("SELECT value FROM meta WHERE key = 'writer'")).scalar_one()
    finally:
        engine.dispose()
    return json.loads(raw) if isinstance(raw, str) else dict(raw)


def test_a_second_daemon_on_the_same_store_exits_naming_the_first(
    tmp_path: Path, store_url: str
) -> None:
    config = write_config(tmp_path / "a.toml", tmp_path / "data", store_url)
    log = tmp_path / "a.log"
    first = Daemon(config, log).start()
    try:
        assert submit_rpc(first.address, job("j0")).job.state
        second = _oasisd(config)
        assert first.proc is not None
        assert second.returncode == 1, second.stderr
        line = second.stderr.strip()
        assert "\n" not in line and "Traceback" not in line, second.stderr
        assert line.startswith("oasisd: the store ") and "is in use by another oasisd" in line
        assert f"(host {socket.gethostname()}, pid {first.proc.pid}, since 20" in line, line
        # the first one was not disturbed
        assert submit_rpc(first.address, job("j1")).job.state
    finally:
        assert first.stop() == 0, log.read_text()
    assert _writer_record(store_url)["epoch"] == 1
    again = Daemon(config, log).start()  # the lock went with the first process
    try:
        assert submit_rpc(again.address, job("j2")).job.state
    finally:
        assert again.stop() == 0, log.read_text()
    record = _writer_record(store_url)
    assert record["epoch"] == 2 and record["pid"] == (again.proc.pid if again.proc else 0)


def test_a_second_daemon_on_the_same_port_fails_to_listen(tmp_path: Path) -> None:
    first = Daemon(write_config(tmp_path / "a.toml", tmp_path / "a"), tmp_path / "a.log").start()
    try:
        second = _oasisd(write_config(tmp_path / "b.toml", tmp_path / "b"), "--listen",
                         first.address)  # fmt: skip
        assert second.returncode == 1, second.stderr
        assert f"oasisd: daemon.listen: cannot listen on {first.address}" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        assert first.stop() == 0


def test_file_lock_counts_epochs_and_reads_garbage_as_unknown(tmp_path: Path) -> None:
    path = tmp_path / "store.db.lock"
    path.write_text("[" * 50_000)  # not a record: no crash, epoch starts afresh
    first = FileWriterLock(path)
    assert first.holder() is None
    first.acquire()
    holder = first.holder()
    assert holder is not None and holder.epoch == 1 and holder.pid is not None
    other = FileWriterLock(path)  # another open file description: flock conflicts
    assert not other.try_acquire()
    with pytest.raises(StoreLockedError, match="is in use by another oasisd") as held:
        other.acquire()
    assert held.value.holder == holder
    first.release()
    assert other.try_acquire()
    again = other.holder()
    assert again is not None and again.epoch == 2
    other.release()
    garbage: list[object] = [
        None,
        [],
        {"host": 1, "epoch": 1},
        {"host": "h", "epoch": True},
        {"host": "h", "epoch": 3, "pid": "x", "since": "not a time"},
    ]
    for raw in garbage:
        parsed = Holder.from_dict(raw)
        assert parsed is None or (parsed.pid is None and parsed.since is None)


def _lock_session(pg: Postgres, database: str) -> int:
    with psycopg.connect(
        f"host=127.0.0.1 port={pg.port} user=oasis dbname={database}", autocommit=True
    ) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'oasisd %'"
        ).fetchone()
        assert row is not None, "no session named oasisd"
        return int(row[0])


def _daemon_on_postgres(tmp_path: Path, pg: Postgres) -> tuple[str, str, Path, Daemon, str]:
    """A daemon on a fresh database: (store URL, database, log, daemon, admin DSN)."""
    url = pg.new_database()
    database = url.rsplit("/", 1)[1]
    log = tmp_path / "p.log"
    daemon = Daemon(write_config(tmp_path / "p.toml", tmp_path / "data", url), log).start()
    return url, database, log, daemon, f"host=127.0.0.1 port={pg.port} user=oasis dbname={database}"


def test_a_lock_lost_with_its_session_is_taken_again_or_the_daemon_stops(
    tmp_path: Path, postgres: Postgres
) -> None:
    url, database, log, daemon, dsn = _daemon_on_postgres(tmp_path, postgres)
    try:
        # the session ends (as in a PostgreSQL restart): the daemon takes the lock again
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (_lock_session(postgres, database),))
        deadline = time.monotonic() + 30
        while '"writer lock taken again' not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        # the store still records this daemon's epoch: it keeps it (its writes are fenced
        # with it; before the epoch fence without [ha] it recorded epoch 2 here)
        assert _writer_record(url)["epoch"] == 1
        assert submit_rpc(daemon.address, job("still")).job.state

        # the session ends and another process takes the lock first: the daemon stops
        with psycopg.connect(dsn, autocommit=True) as rival:
            rival.execute("SELECT pg_terminate_backend(%s)", (_lock_session(postgres, database),))
            while not rival.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,)).fetchone()[0]:  # type: ignore[index]
                time.sleep(0.01)
            assert daemon.proc is not None
            assert daemon.proc.wait(60) == 1
        assert "was taken over by another oasisd" in log.read_text()
    finally:
        daemon.stop()


def test_a_daemon_that_held_the_store_meanwhile_fences_and_stops_this_one(
    tmp_path: Path, postgres: Postgres
) -> None:
    """The gap after a PostgreSQL restart: this daemon's lock session is gone, and another
    oasisd takes the lock and records its epoch before this one's watch takes it again.
    This one's writes are fenced with its epoch from then on (UNAVAILABLE, nothing
    stored), and when it finds the lock free again but the store recording another
    holder, it stops (its ledger may miss that one's decisions) instead of deciding on.
    Before the fence without [ha] it took the lock again, recorded epoch 3 and went on."""
    url, database, log, daemon, dsn = _daemon_on_postgres(tmp_path, postgres)
    rival_record = {"host": "rival", "pid": 1, "since": None, "epoch": 2}
    try:
        assert submit_rpc(daemon.address, job("before")).job.state
        with psycopg.connect(dsn, autocommit=True) as rival:
            rival.execute("SELECT pg_terminate_backend(%s)", (_lock_session(postgres, database),))
            while not rival.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,)).fetchone()[0]:  # type: ignore[index]
                time.sleep(0.01)
            rival.execute(
                "UPDATE meta SET value = %s WHERE key = 'writer'", (json.dumps(rival_record),)
            )
            with grpc.insecure_channel(daemon.address) as channel:
                stub = pb_grpc.AdmissionStub(channel)
                request = pb.SubmitJobRequest(job=spec_to_proto(job("gap")))
                with pytest.raises(grpc.RpcError) as fenced:
                    stub.SubmitJob(request, timeout=30)
            assert fenced.value.code() == grpc.StatusCode.UNAVAILABLE, fenced.value.details()
            rival.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))  # the rival is gone
        assert daemon.proc is not None
        assert daemon.proc.wait(60) == 1
        assert "was held by another oasisd (host rival, pid 1" in log.read_text()
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                ids = set(conn.execute(text("SELECT id FROM jobs")).scalars())
        finally:
            engine.dispose()
        assert ids == {"before"}
        assert _writer_record(url)["host"] == "rival"  # this daemon recorded nothing more
    finally:
        daemon.stop()


class _Answering:
    """A store whose probe answers (a pooled connection's SELECT 1)."""

    down_reason = ""
    refusing = ""  # and takes writes

    def ping(self) -> bool:
        return True

    def check_writes(self) -> None:
        return None


class _Refused(FileWriterLock):
    """A lock whose session ended and whose new one PostgreSQL refuses (the database's
    CONNECTION LIMIT reached)."""

    def held(self) -> bool:
        return False

    def try_acquire(self) -> bool:
        raise sqlalchemy.exc.OperationalError(
            "SELECT pg_try_advisory_lock(%(k)s)",
            {},
            psycopg.OperationalError(
                'connection failed: connection to server at "db", port 5432 failed: '
                'FATAL:  too many connections for database "oasis"'
            ),
        )


def test_a_lock_not_taken_again_says_why_once_and_the_store_unreachable_names_it(
    tmp_path: Path,
) -> None:
    """The probe's SELECT 1 went through on a pooled connection while the lock's new
    session was refused: before, "store unreachable" gave an empty reason, and "writer
    lock not taken again yet" came every second with SQLAlchemy's statement and link."""
    from structlog.testing import capture_logs

    async def changed(_up: bool) -> None:
        return None

    with capture_logs() as logs:
        watch = StoreWatch(
            _Answering(),  # type: ignore[arg-type]
            _Refused(tmp_path / "lock"),
            changed,
            lambda: None,
            log=structlog.get_logger(),
        )
        for _ in range(3):
            asyncio.run(watch.check())
    unreachable = [e for e in logs if e["event"] == "store unreachable"]
    assert len(unreachable) == 1
    assert "too many connections" in unreachable[0]["reason"], unreachable
    not_yet = [e for e in logs if e["event"] == "writer lock not taken again yet"]
    assert [e["error"] for e in not_yet] == [
        'connection failed: connection to server at "db", port 5432 failed: FATAL:  '
        'too many connections for database "oasis"'
    ]


class _Store:
    """A store the test sets: whether its probe answers, and whether it refuses writes."""

    def __init__(self) -> None:
        self.up, self.refusing, self.down_reason = True, "", ""

    def ping(self) -> bool:
        return self.up

    def check_writes(self) -> None:
        return None


def test_the_watch_follows_a_refusal_of_writes_and_keeps_it_while_out_of_reach() -> None:
    """A DBA's REVOKE changes nothing of the store's reachability: the watch still
    passes it on (the Admission service NOT_SERVING), and while the store is out of
    reach (nothing known of its writes) the refusal stands: admission is not said to
    serve again until the store answers and takes writes."""
    from structlog.testing import capture_logs

    store = _Store()
    told: list[bool] = []

    async def changed(up: bool) -> None:
        told.append(up)

    watch = StoreWatch(store, None, changed, lambda: None, log=structlog.get_logger())  # type: ignore[arg-type]
    with capture_logs() as logs:
        asyncio.run(watch.check())
        assert told == []
        store.refusing = "the store's role oasis lacks a privilege"
        asyncio.run(watch.check())
        assert (told, watch.up, watch.writes_refused) == ([True], True, store.refusing)
        store.up, store.refusing = False, ""
        asyncio.run(watch.check())
        assert told == [True, False]
        assert watch.writes_refused == "the store's role oasis lacks a privilege"
        store.up = True
        asyncio.run(watch.check())
        assert (told, watch.writes_refused) == ([True, False, True], "")
    events = [e["event"] for e in logs]
    assert events == [
        "the store refuses writes: admission not serving",
        "store unreachable",
        "store reachable again",
        "the store takes writes again: admission serving",
    ], events


def _sqlite_store(tmp_path: Path) -> Database:
    db = Database(f"sqlite:///{tmp_path / 'oasis.db'}")
    migrate(db)
    return db


def test_the_watch_records_this_daemon_again_only_when_the_store_was_rewound(
    tmp_path: Path,
) -> None:
    """A writer row in this daemon's own epoch is left as it is (recording again each
    second would move the epoch on and on); one rewound below it (a backup restored) is
    recorded again above it, and the controller told the new epoch."""
    db = _sqlite_store(tmp_path)
    lock = FileWriterLock(tmp_path / "oasis.lock")
    lock.acquire()
    epochs: list[int] = []

    async def changed(_up: bool) -> None:
        return None

    try:
        watch = StoreWatch(db, lock, changed, lambda: None, log=structlog.get_logger(),
                           on_epoch=epochs.append)  # fmt: skip
        asyncio.run(watch.check())  # not recorded yet (epoch 0): nothing to record again
        with db.session() as session:
            assert recorded_holder(session) is None and epochs == []
        assert lock.record(db) == 1
        for _ in range(2):
            asyncio.run(watch.check())
        assert (epochs, lock.epoch, watch.lost) == ([], 1, "")
        with db.session() as session:
            session.execute(text("DELETE FROM meta WHERE key = 'writer'"))
        asyncio.run(watch.check())
        assert (epochs, lock.epoch) == ([2], 2)
        with db.session() as session:
            assert recorded_holder(session) == replace(this_process(), epoch=2, since=ANY)
    finally:
        lock.release()
        db.dispose()


class _Lapsed(FileWriterLock):
    """A lock whose session ended (a PostgreSQL restart) and is free to take again."""

    released = 0

    def held(self) -> bool:
        return False

    def try_acquire(self) -> bool:
        return True

    def release(self) -> None:
        self.released += 1


def test_a_lock_taken_again_while_the_store_records_another_holder_is_let_go() -> None:
    """Another oasisd held the lock and recorded itself meanwhile: this one does not
    decide on (its ledger may miss that one's decisions), and lets the lock it just took
    go again, for the other (or a restart of this one) to take."""
    from tempfile import TemporaryDirectory

    lost: list[bool] = []

    async def changed(_up: bool) -> None:
        return None

    with TemporaryDirectory() as tmp:
        db = _sqlite_store(Path(tmp))
        try:
            lock = _Lapsed(Path(tmp) / "oasis.lock")
            lock.epoch = 1
            rival = {"host": "rival", "pid": 1, "since": None, "epoch": 2}
            with db.session() as session:
                session.execute(text("INSERT INTO meta (key, value) VALUES ('writer', :v)"),
                                {"v": json.dumps(rival)})  # fmt: skip
            watch = StoreWatch(db, lock, changed, lambda: lost.append(True),
                               log=structlog.get_logger())  # fmt: skip
            asyncio.run(watch.check())
            asyncio.run(watch.check())  # stopping: once
            assert lost == [True] and lock.released == 1
            assert watch.lost.startswith(
                f"{lock.what} was held by another oasisd (host rival, pid 1"
            ), watch.lost
        finally:
            db.dispose()


def test_an_epoch_reads_as_one_from_0_up_to_max_epoch_exclusive() -> None:
    """A stored epoch is trusted from 0 up to MAX_EPOCH, exclusive: at MAX_EPOCH the next
    leader's epoch would pass what a reply carries. The mutation audit: with MAX_EPOCH
    itself taken as one, every test passed."""
    assert is_epoch(0) and is_epoch(MAX_EPOCH - 1)
    assert not is_epoch(MAX_EPOCH) and not is_epoch(-1) and not is_epoch(1.0)
    assert Holder.from_dict({"host": "h", "epoch": MAX_EPOCH - 1}) is not None
    assert Holder.from_dict({"host": "h", "epoch": MAX_EPOCH}) is None
