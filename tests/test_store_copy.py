"""``oasis store copy``: a whole store moved from SQLite to PostgreSQL with the daemon
stopped (controller/store/copy.py), against a real PostgreSQL, the daemon as a real
subprocess over gRPC, and the command as a subprocess.

The source store is made once per module by a daemon on SQLite: jobs admitted (running
once their first slot began), one rejected, one cancelled, their events. Each test works
on its own snapshot of it (SQLite's online backup) and its own PostgreSQL database.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest

from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.servers import SMALL_JOB, Daemon, Postgres, oasis, write_config

SLOT = 3600
LEAD = 15.0
"""Seconds from the module's start to the end of slot 0: the jobs are decided in slot 0
and start running at slot 1, which lasts an hour (every later decision falls in it)."""

CHEAP = {"kind": "sigmoid", "priority": 0.05, "decay": 0.5, "target": 3}
"""A utility worth too little for its work: priced out (rejected)."""


@dataclass
class Source:
    """The module's SQLite store made by a daemon, stopped; its config's epoch."""

    data_dir: Path
    epoch: float
    jobs: list[Any]  # pb.Job as the daemon listed them before it stopped


def _job(name: str, **more: Any) -> dict[str, Any]:
    return {**SMALL_JOB, "id": name, **more}


def _submit(address: str, spec: dict[str, Any]) -> Any:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.AdmissionStub(channel)
        return stub.SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(spec)), timeout=60).job


def _listed(address: str) -> list[Any]:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.AdmissionStub(channel)
        jobs = list(stub.ListJobs(pb.ListJobsRequest(limit=1000), timeout=30).jobs)
    return sorted(jobs, key=lambda j: j.sequence)


def _events(address: str, after: int, until: Any) -> list[tuple[int, str, str]]:
    """The daemon's events after sequence ``after``, (sequence, kind, job id), up to the
    first for which ``until`` is true."""
    out = []
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.AdmissionStub(channel)
        stream = stub.WatchEvents(pb.WatchEventsRequest(after_sequence=after), timeout=60)
        for e in stream:
            out.append((e.sequence, e.kind, e.job_id))
            if until(out):
                stream.cancel()
                break
    return out


def _stored_events(db_file: Path) -> list[tuple[int, str, str]]:
    with sqlite3.connect(db_file) as db:
        rows = db.execute("SELECT sequence, kind, job_id FROM events ORDER BY sequence")
        out = [(int(n), str(kind), str(job)) for n, kind, job in rows]
    db.close()
    return out


def _config(directory: Path, data_dir: Path, epoch: float, store_url: str = "") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = write_config(directory / "oasisd.toml", data_dir, store_url, epoch=epoch)
    path.write_text(path.read_text().replace("slot_seconds = 3600", f"slot_seconds = {SLOT}"))
    return path


def _answer(job: Any) -> tuple[Any, ...]:
    """What a decision says: admitted, cost, payoff, allocations, state."""
    d = job.decision
    allocations = sorted((a.slot, a.server, a.workers, a.ps) for a in d.allocations)
    return (job.spec.id, job.state, d.admitted, d.cost, d.payoff, d.arrival_slot,
            d.completion_slot, allocations)  # fmt: skip


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Source:
    root = tmp_path_factory.mktemp("source")
    epoch = time.time() - SLOT + LEAD  # slot 0 ends LEAD seconds from now
    data_dir = root / "data"
    daemon = Daemon(_config(root, data_dir, epoch), root / "oasisd.log").start()
    try:
        first = [_submit(daemon.address, _job(f"train-{i}")) for i in range(3)]
        assert all(j.state == pb.JOB_STATE_ADMITTED for j in first), first
        cheap = _submit(daemon.address, _job("cheap", epochs=20, utility=CHEAP))
        assert cheap.state == pb.JOB_STATE_REJECTED, cheap
        _submit(daemon.address, _job("dropped"))
        with grpc.insecure_channel(daemon.address) as channel:
            pb_grpc.AdmissionStub(channel).CancelJob(pb.CancelJobRequest(id="dropped"),
                                                     timeout=30)  # fmt: skip
        # past the boundary: jobs of arrival slot 1 start (the slot clock's tick)
        time.sleep(max(0.0, epoch + SLOT + 1.0 - time.time()))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            jobs = _listed(daemon.address)
            if not any(j.state == pb.JOB_STATE_ADMITTED and j.decision.arrival_slot == 1
                       for j in jobs):  # fmt: skip
                break
            time.sleep(0.2)
    finally:
        assert daemon.stop() == 0
    return Source(data_dir, epoch, jobs)


def _snapshot(source: Source, data_dir: Path) -> Path:
    """A copy of the source store in ``data_dir`` (SQLite's online backup)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    target = data_dir / "oasis.db"
    with sqlite3.connect(source.data_dir / "oasis.db") as s, sqlite3.connect(target) as d:
        s.backup(d)
    s.close()
    d.close()
    return target


def _copy(*args: str) -> Any:
    return oasis("store", "copy", *args, check=False)


def _pg_rows(url: str) -> dict[str, int]:
    """Rows per oasis table of the PostgreSQL database at ``url`` (0 for a table that
    does not exist)."""
    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    tables = ["allocations", "events", "job_progress", "jobs", "meta", "server_outages",
              "servers"]  # fmt: skip
    out = {}
    with psycopg.connect(conninfo) as conn:
        for t in tables:
            found = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (t,)).fetchone()
            row = (
                conn.execute(f"SELECT count(*) FROM {t}").fetchone() if found and found[0] else None
            )
            out[t] = int(row[0]) if row else 0
    return out


def test_a_daemon_on_the_copy_lists_the_same_jobs_and_decides_as_on_the_source(
    source: Source, postgres: Postgres, tmp_path: Path
) -> None:
    states = {j.spec.id: j.state for j in source.jobs}
    assert states["cheap"] == pb.JOB_STATE_REJECTED
    assert states["dropped"] == pb.JOB_STATE_CANCELLED
    if source.jobs[0].decision.arrival_slot == 1:  # decided in slot 0, as planned
        assert states["train-0"] == pb.JOB_STATE_RUNNING, states
    data_dir = tmp_path / "data"
    db_file = _snapshot(source, data_dir)
    stored = _stored_events(db_file)
    url = postgres.new_database()
    out = _copy("--from", str(db_file), "--to", url)
    assert out.returncode == 0, out.stderr
    assert "jobs" in out.stdout and "total" in out.stdout
    # one line per table and the total of their rows
    *tables, total = [line.split() for line in out.stdout.splitlines()[1:]]
    assert int(total[1].replace(",", "")) == sum(int(n.replace(",", "")) for _, n in tables)
    assert int(total[1].replace(",", "")) == sum(_pg_rows(url).values())

    # the daemon's config, store_url set: the same jobs, ids, states and plans
    on_pg = Daemon(_config(tmp_path / "pg", data_dir, source.epoch, url),
                   tmp_path / "pg.log").start()  # fmt: skip
    try:
        listed = _listed(on_pg.address)
        assert [_answer(j) for j in listed] == [_answer(j) for j in source.jobs]
        assert [j.sequence for j in listed] == [j.sequence for j in source.jobs]
        served = _events(on_pg.address, 0, lambda got: len(got) == len(stored))
        new = _submit(on_pg.address, _job("after-the-move"))
        last = stored[-1][0]
        added = _events(on_pg.address, last, lambda got: got[-1][2] == "after-the-move")
    finally:
        assert on_pg.stop() == 0
    assert served == stored  # the event log, sequences kept
    assert len(stored) > len(source.jobs)  # each decided, some started or cancelled
    # the new job's decision took a sequence past the copied ones (the events' sequence
    # was set past them: without it, its insert collided and the submission failed)
    assert added[-1][1] == "decided" and all(s > last for s, *_ in added)
    assert len({s for s, *_ in added}) == len(added)
    assert new.sequence > max(j.sequence for j in source.jobs)

    # the same submission on the original store, restarted: the same answer
    on_sqlite = Daemon(_config(tmp_path / "sqlite", data_dir, source.epoch),
                       tmp_path / "sqlite.log").start()  # fmt: skip
    try:
        again = _submit(on_sqlite.address, _job("after-the-move"))
    finally:
        assert on_sqlite.stop() == 0
    assert new.decision.admitted
    assert _answer(new) == _answer(again)
    assert new.sequence == again.sequence


def test_refused_while_a_daemon_runs_on_either_store(
    source: Source, postgres: Postgres, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    db_file = _snapshot(source, data_dir)
    url = postgres.new_database()
    daemon = Daemon(_config(tmp_path / "s", data_dir, source.epoch), tmp_path / "s.log").start()
    try:
        out = _copy("--from", str(data_dir), "--to", url)
    finally:
        assert daemon.stop() == 0
    assert out.returncode == 1, out.stderr
    assert "source: the store" in out.stderr and str(db_file) in out.stderr
    assert f"pid {daemon.proc.pid}" in out.stderr, out.stderr  # type: ignore[union-attr]
    assert sum(_pg_rows(url).values()) == 0

    # a daemon on the destination (here an empty PostgreSQL store of its own)
    daemon = Daemon(_config(tmp_path / "d", tmp_path / "other", source.epoch, url),
                    tmp_path / "d.log").start()  # fmt: skip
    try:
        before = _pg_rows(url)
        out = _copy("--from", str(db_file), "--to", url)
        assert _pg_rows(url) == before and before["jobs"] == 0
    finally:
        assert daemon.stop() == 0
    assert out.returncode == 1, out.stderr
    assert f"destination: the store {url} is in use by an oasisd" in out.stderr, out.stderr
    assert f"pid {daemon.proc.pid}" in out.stderr  # type: ignore[union-attr]


def test_refuses_a_destination_with_rows(
    source: Source, postgres: Postgres, tmp_path: Path
) -> None:
    db_file = _snapshot(source, tmp_path / "data")
    url = postgres.new_database()
    assert _copy("--from", str(db_file), "--to", url).returncode == 0
    before = _pg_rows(url)
    out = _copy("--from", str(db_file), "--to", url)
    assert out.returncode == 1, out.stderr
    assert f"destination {url} is not empty" in out.stderr, out.stderr
    assert f"jobs {before['jobs']}" in out.stderr
    assert _pg_rows(url) == before


def test_a_row_the_destination_refuses_midway_leaves_it_empty(
    source: Source, postgres: Postgres, tmp_path: Path
) -> None:
    """A server's kind longer than PostgreSQL's varchar(16) (SQLite keeps any length),
    in the fifth table copied, after a few thousand rows went in, one per batch."""
    db_file = _snapshot(source, tmp_path / "data")
    with sqlite3.connect(db_file) as db:
        db.execute("UPDATE servers SET kind = ? WHERE name = 'p1'", ("p" * 40,))
    db.close()
    url = postgres.new_database()
    out = _copy("--from", str(db_file), "--to", url, "--batch", "1")
    assert out.returncode == 1, out.stderr
    assert (
        "copying servers: the row of name 'p1': its kind is 40 characters, over the "
        "column's 16" in out.stderr
    ), out.stderr
    assert "the destination" in out.stderr and "holds no row" in out.stderr
    assert "events: " in out.stderr  # the earlier tables went in before it failed
    assert sum(_pg_rows(url).values()) == 0


def test_a_value_sqlite_kept_of_another_type_is_named_by_its_row(
    source: Source, postgres: Postgres, tmp_path: Path
) -> None:
    """Before: "copying jobs: null value in column "decided_at" of relation "jobs"
    violates not-null constraint", of a source whose rows hold no NULL (SQLite keeps
    'yesterday' in a time column; it reads as NULL), and no row named: an operator's
    ``WHERE decided_at IS NULL`` found nothing to mend."""
    db_file = _snapshot(source, tmp_path / "data")
    with sqlite3.connect(db_file) as db:
        [(job,)] = db.execute("SELECT id FROM jobs ORDER BY id LIMIT 1 OFFSET 2").fetchall()
        db.execute("UPDATE jobs SET decided_at = 'yesterday' WHERE id = ?", (job,))
    db.close()
    url = postgres.new_database()
    out = _copy("--from", str(db_file), "--to", url)
    assert out.returncode == 1, out.stderr
    assert (
        f"copying jobs: the row of id {job!r}: its decided_at does not read as DATETIME"
        in out.stderr
    ), out.stderr
    assert "holds no row" in out.stderr and "Traceback" not in out.stderr
    assert sum(_pg_rows(url).values()) == 0


def test_json_output(source: Source, postgres: Postgres, tmp_path: Path) -> None:
    db_file = _snapshot(source, tmp_path / "data")
    url = postgres.new_database()
    out = _copy("--from", f"sqlite:///{db_file}", "--to", url, "--json", "--no-progress")
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    doc = json.loads(out.stdout)
    assert set(doc) == {"from", "to", "revision", "tables", "rows", "sequences", "seconds"}
    assert doc["from"] == f"sqlite:///{db_file}" and doc["to"] == url
    rows = {t["table"]: t["rows"] for t in doc["tables"]}
    assert rows == _pg_rows(url)
    assert rows["jobs"] == len(source.jobs) and doc["rows"] == sum(rows.values())
    assert list(rows)[:2] == ["events", "jobs"] and list(rows)[-1] == "job_progress"
    assert doc["sequences"]["events.sequence"] == rows["events"] + 1
    assert doc["sequences"]["server_outages.id"] == 1
    assert doc["revision"] and doc["seconds"] >= 0

    # an error is one JSON object too: 1 for the stores' refusal, 2 for a bad flag
    out = _copy("--from", str(db_file), "--to", url, "--json")
    assert out.returncode == 1
    error = json.loads(out.stdout)["error"]
    assert error["code"] == "FAILED_PRECONDITION" and "is not empty" in error["message"]
    out = _copy("--from", str(tmp_path / "none.db"), "--to", url, "--json")
    assert out.returncode == 2
    assert json.loads(out.stdout)["error"]["code"] == "INVALID_ARGUMENT"
    out = _copy("--from", str(db_file), "--to", str(db_file), "--json")
    assert out.returncode == 2 and "the same store" in out.stdout
    (tmp_path / "link.db").symlink_to(db_file)  # the same store under another name
    out = _copy("--from", str(db_file), "--to", str(tmp_path / "link.db"), "--json")
    assert out.returncode == 1 and "the same store" in out.stdout


def test_refuses_a_source_a_newer_oasis_migrated(
    source: Source, postgres: Postgres, tmp_path: Path
) -> None:
    db_file = _snapshot(source, tmp_path / "data")
    with sqlite3.connect(db_file) as db:
        db.execute("UPDATE alembic_version SET version_num = '0042'")
    db.close()
    url = postgres.new_database()
    out = _copy("--from", str(db_file), "--to", url)
    assert out.returncode == 1, out.stderr
    assert f"source sqlite:///{db_file} is at schema revision '0042'" in out.stderr
    assert "a newer oasis migrated it" in out.stderr
    assert sum(_pg_rows(url).values()) == 0


def _sqlite_rows(db_file: Path) -> dict[str, int]:
    """Rows per oasis table of the SQLite store ``db_file``."""
    with sqlite3.connect(db_file) as db:
        names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        out = {t: int(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in names
               if t != "alembic_version"}  # fmt: skip
    db.close()
    return out


def test_small_batches_copy_every_row_once_times_in_utc_and_edge_values(
    source: Source, postgres: Postgres, tmp_path: Path
) -> None:
    """Two rows a batch (every table spans several): each row once, the report's counts
    the stores' own; a string of exactly its column's length and a JSON document that
    does not read (JSON null, which the column allows) go in; a time SQLite kept without
    a zone is written as UTC although the destination's session is in another zone; the
    sequences give the next ids past the copied ones (1 for an empty table)."""
    db_file = _snapshot(source, tmp_path / "data")
    with sqlite3.connect(db_file) as db:
        db.execute("UPDATE servers SET kind = ? WHERE name = 'p1'", ("k" * 16,))
        [(event,)] = db.execute("SELECT min(sequence) FROM events").fetchall()
        db.execute("UPDATE events SET detail = 'not json' WHERE sequence = ?", (event,))
        times = dict(db.execute("SELECT id, decided_at FROM jobs").fetchall())
    db.close()
    expected = _sqlite_rows(db_file)
    assert expected["events"] > 2 and expected["jobs"] > 2 and expected["allocations"] > 2
    url = postgres.new_database()
    tokyo = f"{url}?options=-ctimezone%3DAsia/Tokyo"  # UTC+9: a naive time would shift
    out = _copy("--from", str(db_file), "--to", tokyo, "--batch", "2", "--json",
                "--no-progress")  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    rows = {t["table"]: t["rows"] for t in doc["tables"]}
    assert rows == expected == _pg_rows(url)
    assert doc["rows"] == sum(expected.values())
    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo) as conn:
        assert conn.execute("SELECT kind FROM servers WHERE name = 'p1'").fetchone() == ("k" * 16,)
        detail = conn.execute("SELECT detail::text FROM events WHERE sequence = %s", (event,))
        assert detail.fetchone() == ("null",)
        got: dict[str, datetime] = dict(
            conn.execute("SELECT id, decided_at AT TIME ZONE 'UTC' FROM jobs").fetchall()
        )
        assert {k: v.isoformat(sep=" ") for k, v in got.items()} == {
            k: datetime.fromisoformat(v).isoformat(sep=" ") for k, v in times.items()
        }
        # the next ids are the ones the report says, past the copied ones
        [(outage,)] = conn.execute(
            "INSERT INTO server_outages (server, down_from, detected_at) "
            "VALUES ('p1', 0, now()) RETURNING id"
        ).fetchall()
        [(sequence,)] = conn.execute(
            "INSERT INTO events (at, kind, job_id, slot, state, detail) "
            "VALUES (now(), 'x', '', 0, '', '{}') RETURNING sequence"
        ).fetchall()
    assert outage == doc["sequences"]["server_outages.id"] == 1
    assert sequence == doc["sequences"]["events.sequence"] == event + expected["events"]


def test_refuses_a_destination_with_one_row_and_a_source_with_no_store(
    source: Source, postgres: Postgres, tmp_path: Path
) -> None:
    """One row is enough to refuse a destination (a copy there would mix two stores);
    a SQLite file holding no oasis store is refused, and left as it was (not migrated
    into an empty store, then copied)."""
    db_file = _snapshot(source, tmp_path / "data")
    url = postgres.new_database()
    assert _copy("--from", str(db_file), "--to", url).returncode == 0
    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo) as conn:
        conn.execute("TRUNCATE allocations, events, job_progress, jobs, meta, server_outages, "
                     "servers")  # fmt: skip
        conn.execute("""INSERT INTO meta (key, value) VALUES ('left', '{}')""")
    out = _copy("--from", str(db_file), "--to", url)
    assert out.returncode == 1, out.stderr
    assert f"destination {url} is not empty (meta 1 rows)" in out.stderr, out.stderr
    assert _pg_rows(url) == {**{t: 0 for t in _pg_rows(url)}, "meta": 1}

    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE notes (x TEXT)")
    db.close()
    empty = postgres.new_database()
    out = _copy("--from", str(other), "--to", empty)
    assert out.returncode == 1, out.stderr
    assert f"source sqlite:///{other} holds no oasis store" in out.stderr, out.stderr
    assert set(_sqlite_rows(other)) == {"notes"}
    assert sum(_pg_rows(empty).values()) == 0


def test_a_destination_a_newer_oasis_migrated_is_refused_before_the_source_is_migrated(
    postgres: Postgres, tmp_path: Path
) -> None:
    """Both refusals come before either store is migrated: a source of an older
    revision is left at it (an older oasisd can still run on it)."""
    from alembic import command

    from controller.store.database import _alembic_config

    db_file = tmp_path / "old.db"
    command.upgrade(_alembic_config(f"sqlite:///{db_file}"), "0008")
    url = postgres.new_database()
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
        conn.execute("INSERT INTO alembic_version VALUES ('0042')")
    out = _copy("--from", str(db_file), "--to", url)
    assert out.returncode == 1, out.stderr
    assert f"destination {url} is at schema revision '0042'" in out.stderr, out.stderr
    assert "migrating the source" not in out.stderr + out.stdout
    with sqlite3.connect(db_file) as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [("0008",)]
    db.close()
