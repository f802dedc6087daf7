"""Job ids per submitter (controller/job_keys.py, migration 0008).

Before: job ids were one namespace for every tenant. A tenant's ``train-1`` made every
other tenant's ``train-1`` ALREADY_EXISTS ("taken by another submitter"), which also told
them that such a job existed. The gRPC side is in tests/test_security.py
(``test_roles_and_ownership``) and the console's in tests/test_console.py; here: the
rules, and the migration of a store whose jobs were keyed by their ids.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import inspect as sa_inspect
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError

from controller.auth import ANONYMOUS, Caller, Role
from controller.clock import FakeClock
from controller.config import load
from controller.errors import NotFoundError
from controller.job_keys import as_named, key_for, keyed_spec, shown, shown_view
from controller.store import AllocationRow, Database, EventRow, JobRow
from controller.store.database import _alembic_config, migrate
from controller.store.models import ProgressRow
from pricing import SpecError
from tests.servers import write_config
from tests.test_pending import CHEAP, opened, small

ALICE = Caller("alice", Role.SUBMITTER)
OPS = Caller("ops", Role.OPERATOR)


def test_a_submitter_names_and_sees_its_jobs_by_their_ids() -> None:
    assert key_for(ALICE, "train-1") == "alice:train-1"
    assert shown(ALICE, "alice:train-1") == "train-1"
    # an operator names and sees keys; anonymous callers (no tokens) plain ids
    assert key_for(OPS, "alice:train-1") == "alice:train-1" == shown(OPS, "alice:train-1")
    assert key_for(ANONYMOUS, "train-1") == "train-1" == shown(ANONYMOUS, "train-1")
    # a submitter's id has no ':': it cannot name another's key, and its own key (as an
    # operator shows it) is told its id; both were told "must be characters of A-Z ...
    # (it names an MQTT topic), got ':' at position 5", of a name copied from `oasis jobs`
    with pytest.raises(SpecError) as err:
        key_for(ALICE, "bob:train-1")
    assert str(err.value) == (
        "id: a submitter names its own jobs by their ids alone, without NAME: (got 'bob:train-1')"
    )
    with pytest.raises(SpecError) as err:
        key_for(ALICE, "alice:train-1")
    assert str(err.value) == (
        "id: 'alice:train-1' is your job's key as operators see it; you name your jobs by "
        "their ids alone: 'train-1'"
    )
    with pytest.raises(SpecError, match=r"^id: must be characters .* got '/' at position 3"):
        key_for(ALICE, "bob/train-1")
    with pytest.raises(SpecError, match=r"^id: must be NAME:ID .* got ' b' before"):
        key_for(OPS, " b:train-1")
    with pytest.raises(SpecError, match=r"^id: must be 1-128 characters long, got 0"):
        key_for(OPS, "bob:")


def test_a_spec_is_keyed_by_its_submitter() -> None:
    spec = {"id": "train-1", "epochs": 1}
    assert keyed_spec(spec, "alice") == {"id": "alice:train-1", "epochs": 1}
    assert keyed_spec(spec, None) is spec
    for bad, why in ((None, "must be a non-empty"), ("a:b", "must be characters .* at position 1")):
        with pytest.raises(SpecError, match=f"^job.id: {why}"):
            keyed_spec({"id": bad}, "alice")
        with pytest.raises(SpecError, match=f"^job.id: {why}"):
            keyed_spec({"id": bad}, None)  # anonymous: no key of another's either


def test_a_view_and_an_error_name_the_job_as_the_caller_does() -> None:
    @dataclass(frozen=True)
    class View:
        id: str
        spec: dict[str, object]

    view = View("alice:t", {"id": "alice:t", "epochs": 1})
    assert shown_view(ALICE, view) == View("t", {"id": "t", "epochs": 1})
    assert shown_view(OPS, view) is view

    async def missing(key: str) -> None:
        raise NotFoundError(f"no job {key!r}")

    with pytest.raises(NotFoundError, match=r"^no job 't'$"):
        asyncio.run(as_named(ALICE, "alice:t", missing("alice:t")))
    with pytest.raises(
        NotFoundError, match=r"^no job 't'; a job submitted with a token is NAME:ID"
    ):
        asyncio.run(as_named(OPS, "t", missing("t")))
    with pytest.raises(NotFoundError, match=r"^no job 't'$"):  # no tokens: no names
        asyncio.run(as_named(ANONYMOUS, "t", missing("t")))


def _keys(db: Database) -> dict[str, Any]:
    """Every job key of the store with its submitter, its spec's id, and the job ids
    its allocations, progress and events carry."""
    with db.session() as s:
        jobs = {r.id: (r.submitter, json.loads(r.spec)["id"]) for r in s.scalars(select(JobRow))}
        return {
            "jobs": jobs,
            "allocations": sorted(set(s.scalars(select(AllocationRow.job_id)))),
            "progress": sorted(s.scalars(select(ProgressRow.job_id))),
            "events": sorted(set(s.scalars(select(EventRow.job_id)))),
        }


def _to(db: Database, revision: str, down: bool) -> None:
    """Migrate ``db`` to ``revision`` on its own engine (foreign keys enforced, as the
    daemon's migration runs)."""
    cfg = _alembic_config(db.url)
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, revision)


def test_the_migration_keys_every_submitters_job_and_back(store_url: str, tmp_path: Path) -> None:
    clock = FakeClock(1_000_000.0)
    path = write_config(tmp_path / "c.toml", tmp_path / "data", store_url, epoch=clock.now())
    path.write_text(path.read_text() + CHEAP)
    c = opened(load(path), clock)
    try:
        mine = asyncio.run(c.submit(small("a1"), by="alice", owner="alice"))
        assert mine.id == "alice:a1" and mine.decision.admitted
        asyncio.run(c.submit(small("z1")))  # anonymous: keyed by its id
    finally:
        c.close()
    db = Database(store_url)
    try:
        with db.session() as s:
            s.add(ProgressRow(job_id="alice:a1", minibatches=1.0, worker_seconds=2.0,
                              per_server={}, samples={}, updated_at=datetime.now(UTC)))  # fmt: skip
        keyed = _keys(db)
        assert keyed["jobs"] == {"alice:a1": ("alice", "alice:a1"), "z1": (None, "z1")}
        assert keyed["allocations"] == ["alice:a1", "z1"]
        # the layout before 0008: every job under its id
        _to(db, "0007", down=True)
        old = _keys(db)
        assert old == {
            "jobs": {"a1": ("alice", "a1"), "z1": (None, "z1")},
            "allocations": ["a1", "z1"],
            "progress": ["a1"],
            "events": ["a1", "z1"],
        }
        # ... migrated: each submitter's job under its key, children and spec with it
        assert migrate(db) == "0009"
        assert _keys(db) == keyed
        with pytest.raises(IntegrityError), db.session() as s:  # the foreign keys hold
            s.add(AllocationRow(job_id="a1", slot=5, server="w0", workers=1, ps=0))
    finally:
        db.dispose()

    # the daemon rebuilds it, and bob's 'a1' is a job of bob's own
    c = opened(load(path), clock)
    try:
        assert "alice:a1" in c._ledger
        assert asyncio.run(c.get("alice:a1", owner="alice")).decision == mine.decision
        bobs = asyncio.run(c.submit(small("a1", chunks=16), by="bob", owner="bob"))
        assert bobs.id == "bob:a1" and not bobs.duplicate
        again = asyncio.run(c.submit(small("a1"), by="alice", owner="alice"))
        assert again.duplicate and again.decision == mine.decision
    finally:
        c.close()
    # two submitters now hold 'a1': an older oasis could keep only one of them
    db = Database(store_url)
    try:
        with pytest.raises(RuntimeError, match=r"more than one submitter holds the job ids 'a1'"):
            _to(db, "0007", down=True)
        assert _keys(db)["jobs"]["bob:a1"] == ("bob", "bob:a1")  # nothing changed
        with db.session() as s:
            s.execute(text("DELETE FROM allocations WHERE job_id = 'bob:a1'"))
            s.execute(text("DELETE FROM events WHERE job_id = 'bob:a1'"))
            s.execute(text("DELETE FROM jobs WHERE id = 'bob:a1'"))
        _to(db, "0007", down=True)
        assert _keys(db) == old
    finally:
        db.dispose()


def test_an_upgrade_that_fails_leaves_the_store_as_it_was(store_url: str, tmp_path: Path) -> None:
    """Every migration of an upgrade runs in one transaction. On SQLite, Python's driver
    committed each ``ALTER TABLE`` at once: an upgrade from 0006 that failed (or was
    killed) in 0008 left 0007's columns in a store still marked 0006, and every start
    after failed on them ("duplicate column name: cause", the upgrade audit)."""
    clock = FakeClock(1_000_000.0)
    path = write_config(tmp_path / "c.toml", tmp_path / "data", store_url, epoch=clock.now())
    path.write_text(path.read_text() + CHEAP)
    c = opened(load(path), clock)
    try:
        asyncio.run(c.submit(small("x"), by="alice", owner="alice"))
        asyncio.run(c.submit(small("y")))
    finally:
        c.close()
    db = Database(store_url)
    try:
        _to(db, "0006", down=True)
        # an anonymous job already under the key 0008 gives alice's 'x': its rename fails
        with db.session() as s:
            s.execute(text("CREATE TEMP TABLE copied AS SELECT * FROM jobs WHERE id = 'y'"))
            s.execute(text("UPDATE copied SET id = 'alice:x', sequence = sequence + 100"))
            s.execute(text("INSERT INTO jobs SELECT * FROM copied"))
        with pytest.raises(IntegrityError):
            migrate(db)
        with db.session() as s:
            assert s.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0006"
        columns = {c["name"] for c in sa_inspect(db.engine).get_columns("server_outages")}
        assert "cause" not in columns  # 0007's column went with the rest
        with db.session() as s:
            s.execute(text("DELETE FROM jobs WHERE id = 'alice:x'"))
        assert migrate(db) == "0009"  # mended, the same upgrade goes through
        assert set(_keys(db)["jobs"]) == {"alice:x", "y"}
    finally:
        db.dispose()


def test_the_migration_renames_an_edited_spec_too(store_url: str) -> None:
    """Specs as the daemon writes them (canonical JSON) are renamed in SQL; one an edit
    left otherwise (spaces, another order) is read and written back, and one that does
    not read as JSON is left for the daemon to take out, as before."""
    db = Database(store_url)
    try:
        _to(db, "0007", down=False)
        specs = {
            "c1": ("carol", '{"epochs":1,"id":"c1"}'),
            "e1": ("carol", '{"id": "e1", "epochs": 1}'),
            "x1": ("carol", "{not json"),
            "n1": (None, '{"epochs":1,"id":"n1"}'),
        }
        with db.engine.begin() as conn:
            for i, (job_id, (who, spec)) in enumerate(specs.items()):
                conn.execute(
                    text(
                        "INSERT INTO jobs (id, sequence, spec, state, submitted_slot, "
                        "arrival_slot, work, admitted, reason, detail, decision_ms, "
                        "decided_at, submitter) VALUES (:id, :seq, :spec, 'rejected', 0, 1, "
                        "1, false, '', '{}', 0, :at, :who)"
                    ),
                    # as text: sqlite3's default datetime adapter is deprecated (3.12)
                    {"id": job_id, "seq": i + 1, "spec": spec,
                     "at": datetime.now(UTC).isoformat(" "), "who": who},
                )  # fmt: skip
        migrate(db)
        with db.session() as s:
            stored = {job_id: spec for job_id, spec in s.execute(select(JobRow.id, JobRow.spec))}
        assert stored == {
            "carol:c1": '{"epochs":1,"id":"carol:c1"}',
            "carol:e1": '{"epochs":1,"id":"carol:e1"}',
            "carol:x1": "{not json",
            "n1": '{"epochs":1,"id":"n1"}',
        }
    finally:
        db.dispose()


def test_an_operators_record_of_a_tenants_job_reads_back_as_a_job(tmp_path: Path) -> None:
    """The units audit: ``oasis job alice:dabsk --json > f; oasis quote f`` (as the
    README says, "prices it again") failed with "job.id: must be characters of ...,
    got ':'" for an operator. A record's key reads as the id after ``NAME:``; a job
    object given so is the user's own words, and the daemon says what is wrong."""
    import json

    from controller.commands.client import _specs

    spec = {"id": "alice:dabsk", "epochs": 1}
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"id": "alice:dabsk", "state": "admitted", "spec": spec,
                                  "decision": {"admitted": True}}))  # fmt: skip
    assert _specs(str(record)) == [{"id": "dabsk", "epochs": 1}]
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(spec))
    assert _specs(str(plain)) == [spec]


def test_the_longest_job_key_reads_back_whole(tmp_path: Path) -> None:
    """A submitter of the longest name (200 characters) and a job of the longest id (128)
    make a key of exactly ``MAX_JOB_KEY_CHARS``: an operator's listing and read show it
    whole. Only a longer stored id is an edit's, shown cut; with the cut at that length
    too (``>=``), every test passed."""
    from pricing.fields import MAX_JOB_ID_CHARS, MAX_JOB_KEY_CHARS, MAX_OWNER_CHARS
    from tests.test_pending import controller as pending_controller

    owner, job_id = "o" * MAX_OWNER_CHARS, "j" * MAX_JOB_ID_CHARS
    c = pending_controller(tmp_path, FakeClock(0.0))
    try:
        view = asyncio.run(c.submit(small(job_id), by=owner))
        key = f"{owner}:{job_id}"
        assert len(key) == MAX_JOB_KEY_CHARS and view.id == key
        [listed], _ = c._list_sync([], 10)
        assert listed.id == key
        assert shown_view(OPS, c._get_sync(key)).id == key
    finally:
        c.close()
