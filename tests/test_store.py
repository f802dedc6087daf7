"""The store's schema: one migration head, and a full downgrade/upgrade with data present,
on SQLite and on PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import structlog
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import func, inspect, select, text

from controller.store import AllocationRow, Database, JobRow, migrate
from controller.store.database import _alembic_config
from controller.store.models import Base, MetaRow


def test_single_head() -> None:
    heads = ScriptDirectory.from_config(_alembic_config("sqlite://")).get_heads()
    assert len(heads) == 1


def test_models_match_the_migrations(store_url: str) -> None:
    db = Database(store_url)
    migrate(db)
    insp = inspect(db.engine)
    for table in Base.metadata.sorted_tables:
        migrated = {c["name"] for c in insp.get_columns(table.name)}
        assert migrated == {c.name for c in table.columns}, table.name
    db.dispose()


def test_downgrade_and_upgrade_with_data(store_url: str) -> None:
    db = Database(store_url)
    assert migrate(db) == migrate(db)  # the second is a no-op
    with db.session() as s:
        s.add(JobRow(id="x", sequence=1, spec="{}", state="admitted", submitted_slot=0,
                     arrival_slot=1, work=3, admitted=True, reason="", detail={},
                     decision_ms=0.1, decided_at=datetime.now(UTC)))  # fmt: skip
        s.flush()
        s.add(AllocationRow(job_id="x", slot=1, server="w0", workers=3, ps=0))
    cfg = _alembic_config(store_url)
    command.downgrade(cfg, "base")
    assert "jobs" not in inspect(db.engine).get_table_names()
    command.upgrade(cfg, "head")
    with db.session() as s:
        assert s.scalars(select(JobRow)).all() == []
        s.add(JobRow(id="y", sequence=1, spec="{}", state="rejected", submitted_slot=0,
                     arrival_slot=1, work=3, admitted=False, reason="r", detail={},
                     decision_ms=0.1, decided_at=datetime.now(UTC)))  # fmt: skip
    with db.session() as s:
        assert [j.id for j in s.scalars(select(JobRow))] == ["y"]
    db.dispose()


def test_a_store_an_early_0007_migrated_gets_its_cordon_columns(store_url: str) -> None:
    """Revision 0007 was first released without ``server_outages.reason`` and ``by``
    (they were added to it later): such a store reached 0008 and then failed every
    start on the missing column. 0009 adds them where they are missing, keeping the
    outages it has."""
    db = Database(store_url)
    try:
        cfg = _alembic_config(store_url)
        command.upgrade(cfg, "0008")
        with db.session() as s:  # the store as the first 0007 left it, with an outage
            s.execute(text("ALTER TABLE server_outages DROP COLUMN reason"))
            s.execute(text('ALTER TABLE server_outages DROP COLUMN "by"'))
            s.execute(text("INSERT INTO server_outages (server, down_from, detected_at, cause) "
                           "VALUES ('w0', 3, '2026-11-27 10:00:00', 'cordoned')"))  # fmt: skip
        assert migrate(db) == "0009"
        columns = {c["name"] for c in inspect(db.engine).get_columns("server_outages")}
        assert {"reason", "by", "cause"} <= columns
        with db.session() as s:
            rows = s.execute(text('SELECT server, cause, reason, "by" FROM server_outages'))
            assert [tuple(r) for r in rows] == [("w0", "cordoned", None, None)]
        command.downgrade(cfg, "0008")  # and back: nothing of 0007's is dropped by 0009
        command.upgrade(cfg, "head")
        assert {"reason", "by"} <= {
            c["name"] for c in inspect(db.engine).get_columns("server_outages")
        }
    finally:
        db.dispose()


def test_sqlite_commits_are_synced_to_disk(tmp_path: Path) -> None:
    """WAL with synchronous=FULL: a commit survives power loss, not only a crash."""
    db = Database(f"sqlite:///{tmp_path / 'o.db'}")
    try:
        with db.engine.connect() as conn:
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(text("PRAGMA synchronous")).scalar() == 2  # FULL
    finally:
        db.dispose()


def test_sqlite_synchronous_normal_is_a_choice(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'o.db'}", sqlite_synchronous="normal")
    try:
        with db.engine.connect() as conn:
            assert conn.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
    finally:
        db.dispose()


def test_sqlite_values_not_of_their_column_type_read_as_null() -> None:
    """What the daemon writes reads back as it was; what an edit left that is not of
    the column's type (text in a number, flag or time column) reads as None, not as the
    text (nor raising while the row is fetched)."""
    import sqlalchemy as sa

    from controller.store.lenient import (
        LenientBigInteger,
        LenientBoolean,
        LenientFloat,
        LenientInteger,
        LenientTime,
    )

    engine = sa.create_engine("sqlite://")
    table = sa.Table(
        "t", sa.MetaData(), sa.Column("i", LenientInteger), sa.Column("b", LenientBigInteger),
        sa.Column("f", LenientFloat), sa.Column("flag", LenientBoolean),
        sa.Column("at", LenientTime),
    )  # fmt: skip
    at = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    try:
        table.metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(table.insert(), [{"i": 7, "b": 2**40, "f": 1.5, "flag": True, "at": at}])
            conn.execute(text("INSERT INTO t VALUES ('x', 'lots', 'abc', 'maybe', 'yesterday')"))
            conn.execute(text("INSERT INTO t VALUES (1.5, NULL, 3, 2, 17)"))
            good, edited, odd = conn.execute(select(table)).all()
    finally:
        engine.dispose()  # its one in-memory connection (Python 3.13 warns of it unclosed)
    assert tuple(good)[:4] == (7, 2**40, 1.5, True)
    assert good.at.replace(tzinfo=UTC) == at  # SQLite keeps no zone: written in UTC
    assert tuple(edited) == (None, None, None, None, None)
    assert tuple(odd) == (None, None, 3.0, None, None)


def test_a_single_oasis_table_without_a_revision_is_refused() -> None:
    """One table of the store is enough (a restore of a single table, say): migrating
    over it would fail on it, exit 1, restarted every 2 s."""
    import sqlalchemy as sa

    from controller.store.search_path import StoreUnversionedError, check_unversioned

    engine = sa.create_engine("sqlite://")
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE servers (name TEXT)"))
            with pytest.raises(StoreUnversionedError, match=r"^holds oasis tables \(servers\) "):
                check_unversioned(conn, {"servers", "jobs"})
            check_unversioned(conn, {"jobs", "events"})  # none of them there: a new store
    finally:
        engine.dispose()


def test_an_upgrade_is_logged_once_with_its_revisions(store_url: str) -> None:
    """The journal says that a start migrated the store, from which revision to which,
    through which migrations and how long it took; before, only ``store ready`` named
    the new revision, so an operator could not tell from it that an upgrade had run."""
    from structlog.testing import capture_logs

    db = Database(store_url)
    try:
        command.upgrade(_alembic_config(store_url), "0004")  # a store of an older oasis
        with capture_logs() as logs:
            log = structlog.get_logger("oasisd")
            assert migrate(db, log) == "0009"
            assert migrate(db, log) == "0009"  # the second start migrates nothing
        said = [(e["event"], e.get("from_revision"), e.get("migrations")) for e in logs]
        steps = ["0005", "0006", "0007", "0008", "0009"]
        assert said == [
            ("migrating the store", "0004", steps),
            ("store migrated", "0004", steps),
        ]
        assert logs[1]["to_revision"] == "0009" and logs[1]["seconds"] >= 0
    finally:
        db.dispose()


def test_a_new_store_is_logged_as_created(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In the daemon's log; a tool's or a library's migrate (no log given) prints nothing:
    structlog's default wrote the line to standard output, into ``oasis offline --json``
    (a test's in-process store, in CI)."""
    from structlog.testing import capture_logs

    quiet = Database(f"sqlite:///{tmp_path / 'quiet.db'}")
    try:
        migrate(quiet)
    finally:
        quiet.dispose()
    assert capsys.readouterr() == ("", "")
    db = Database(store_url)
    try:
        with capture_logs() as logs:
            migrate(db, structlog.get_logger("oasisd"))
        assert [(e["event"], e["from_revision"], e["to_revision"]) for e in logs] == [
            ("store created", None, "0009")
        ]
        assert logs[0]["migrations"][0] == "0001"
    finally:
        db.dispose()


def test_a_snapshot_reads_the_store_as_at_its_first_read(store_url: str) -> None:
    """``Database.snapshot``: rows committed (or deleted) by another session after the
    snapshot's first read are not seen by its later reads; it writes nothing."""
    db = Database(store_url)
    migrate(db)
    with db.session() as s:
        s.add(MetaRow(key="gone", value={"n": 1}))
    counted = select(func.count()).select_from(MetaRow)
    with db.snapshot() as snap:
        before = snap.scalar(counted)
        with db.session() as s:
            s.add(MetaRow(key="new", value={"n": 2}))
            s.delete(s.get(MetaRow, "gone"))
        assert snap.scalar(counted) == before
        assert snap.get(MetaRow, "gone") is not None
        assert snap.get(MetaRow, "new") is None
    with db.session() as s:
        assert s.get(MetaRow, "new") is not None and s.get(MetaRow, "gone") is None
        assert s.scalar(counted) == before
    db.dispose()


@pytest.mark.parametrize("how", ["dropped", "emptied"])
def test_oasis_tables_without_a_revision_are_refused_untouched(store_url: str, how: str) -> None:
    """A backup restored in part (alembic_version left out) or a hand edit: the first
    migration ran over the tables and failed, "table servers already exists", and oasisd
    exited 1 (restarted by the unit every 2 s). Now StoreUnversionedError names them,
    and nothing is changed."""
    from controller.store.search_path import StoreUnversionedError

    db = Database(store_url)
    try:
        migrate(db)
        with db.session() as s:
            s.add(JobRow(id="x", sequence=1, spec="{}", state="rejected", submitted_slot=0,
                         arrival_slot=1, work=3, admitted=False, reason="r", detail={},
                         decision_ms=0.1, decided_at=datetime.now(UTC)))  # fmt: skip
        with db.engine.begin() as conn:
            verb = "DROP TABLE" if how == "dropped" else "DELETE FROM"
            conn.execute(text(f"{verb} alembic_version"))
        with pytest.raises(StoreUnversionedError) as err:
            migrate(db)
        assert str(err.value).startswith(
            "holds oasis tables (allocations, events, job_progress, jobs, meta and 2 more) "
            "but no schema revision (its alembic_version table is missing or empty)"
        ), str(err.value)
        with db.session() as s:
            assert [j.id for j in s.scalars(select(JobRow))] == ["x"]
    finally:
        db.dispose()
