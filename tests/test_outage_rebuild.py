"""A restart after a server failed and recovered: the ledger rebuild blocks the outage
only, so allocations that the recovered server took since do not stop the daemon.

The admission controller runs in-process on a SQLite file with a fake clock; outages
are written to the store as the execution plane writes them (``server_outages``).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy
import structlog
from sqlalchemy import select

from controller.admission import AdmissionController
from controller.admission.recovery import REBUILD_RETRY_SECONDS
from controller.clock import FakeClock, SlotClock
from controller.config import from_dict
from controller.store import Database, StoreUnavailableError
from controller.store.models import AllocationRow, OutageRow
from controller.store.sqlite_file import StoreFile
from pricing.errors import LedgerError
from pricing.ledger import Ledger
from tests.servers import Postgres
from tests.test_replan import T, admitted, make_job

SLOT = 3600.0
WORKER = {"gpu": 2, "cpu": 16, "mem": 64, "disk": 100, "bandwidth": 10}
PS = {"cpu": 16, "mem": 64, "disk": 100, "bandwidth": 50}
JOB = {
    "epochs": 1, "chunks": 4, "minibatches": 100, "tau": 0.05, "grad_mb": 1,
    "worker": {"gpu": 1, "cpu": 2, "mem": 4, "disk": 5, "bandwidth": 1},
    "ps": {"cpu": 1, "mem": 2, "disk": 5, "bandwidth": 5},
    "utility": {"kind": "sigmoid", "priority": 100, "decay": 2, "target": 4},
}  # fmt: skip


def _open(
    tmp_path: Path,
    store_url: str = "",
    store_timeout: float = 3.0,
    servers: list[dict[str, Any]] | None = None,
) -> AdmissionController:
    """A controller on a SQLite file in ``tmp_path`` (or ``store_url``), window 12, a fake
    clock at slot 0; ``servers``: the cluster's (default: w0, w1, p0)."""
    config = from_dict(
        {
            "daemon": {
                "data_dir": str(tmp_path),
                "window": 12,
                "epoch": 0,
                "store_url": store_url,
                "store_timeout": store_timeout,
            },
            "cluster": {
                "resources": ["gpu", "cpu", "mem", "disk", "bandwidth"],
                "servers": servers
                or [
                    {"name": "w0", "kind": "worker", "capacity": WORKER},
                    {"name": "w1", "kind": "worker", "capacity": WORKER},
                    {"name": "p0", "kind": "ps", "capacity": PS},
                ],
            },
        }
    )
    controller = AdmissionController(
        config,
        Database(config.database_url, config.store_timeout),
        SlotClock(FakeClock(1.0), SLOT, 0.0),
        log=structlog.wrap_logger(structlog.ReturnLogger()),
    )
    controller.open()
    return controller


def _state(ledger: Ledger) -> list[np.ndarray]:
    return [
        a.copy()
        for side in (ledger.worker_side, ledger.ps_side)
        for a in (side.used, side.price, side.blocked)
    ]


def test_block_until_blocks_only_the_outage() -> None:
    ledger = admitted([make_job("a")])
    used = np.flatnonzero(ledger.schedule("a").workers.sum(axis=0))
    server = int(used[0])
    first = ledger.schedule("a").start
    # the job holds the server from its start: an outage ending there is fine ...
    ledger.block("worker", server, 0, until=first)
    assert ledger.worker_side.blocked[:first, server].all()
    assert not ledger.worker_side.blocked[first:, server].any()
    assert not ledger.is_down("worker", server)
    # ... one that reaches into its slots is not
    with pytest.raises(LedgerError, match=f"in slots 0 to {first}"):
        ledger.block("worker", server, 0, until=first + 1)
    assert ledger.worker_side.used.shape[0] == T


def test_restart_after_a_recovered_outage(tmp_path: Path) -> None:
    c = _open(tmp_path)
    with c.db.session() as s:  # w0 failed from slot 1, back from slot 2
        s.add(OutageRow(server="w0", down_from=1, up_from=2, detected_at=datetime.now(UTC)))
        s.commit()
    c.close()

    c = _open(tmp_path)  # the ledger now has w0 blocked in slot 1 only
    ledger = c._ledger
    w0 = c.cluster.worker_names.index("w0")
    assert ledger.worker_side.blocked[1, w0].all() and not ledger.worker_side.blocked[2:, w0].any()
    decided = [asyncio.run(c.submit({**JOB, "id": f"j{i}"})).decision for i in range(4)]
    assert any(d.admitted for d in decided)
    with c.db.session() as s:
        on_w0 = s.scalars(select(AllocationRow.slot).where(AllocationRow.server == "w0")).all()
    assert on_w0 and min(on_w0) >= 2  # the recovered server took work after its outage
    live = _state(ledger)
    c.close()

    c = _open(tmp_path)  # before the fix: LedgerError, w0 "still holds jobs" from slot 1
    try:
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)  # the same ledger, bit for bit
    finally:
        c.close()


def _lock_table(url: str, table: str, seconds: float) -> threading.Thread:
    """Another session holding ``table`` in ACCESS EXCLUSIVE mode for ``seconds`` (as
    ``VACUUM FULL`` or a ``LOCK TABLE`` in psql does), from the moment this returns; join
    the thread returned to wait for its end."""
    locked = threading.Event()

    def hold() -> None:
        engine = sqlalchemy.create_engine(url)
        try:
            with engine.connect() as conn:
                conn.execute(sqlalchemy.text(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
                locked.set()
                time.sleep(seconds)
                conn.rollback()
        finally:
            engine.dispose()

    holder = threading.Thread(target=hold)
    holder.start()
    assert locked.wait(10)
    return holder


def test_patient_statements_may_take_longer_but_lock_waits_may_not(postgres: Postgres) -> None:
    """Under ``patient`` a statement may run past ``store_timeout`` (a rebuild reads the
    whole store), but a wait for another session's lock still ends at it, unless the
    block says ``locks`` (a migration waits for another daemon's)."""
    url = postgres.new_database()
    db = Database(url, 1.0)
    try:
        with db.session() as session:
            session.execute(sqlalchemy.text("CREATE TABLE held (x int)"))
        with db.patient(10), db.session() as session:
            assert session.execute(sqlalchemy.text("SELECT 1 FROM pg_sleep(2)")).scalar() == 1
        holder = _lock_table(url, "held", 4)
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError), db.patient(10), db.session() as session:
            session.execute(sqlalchemy.text("SELECT count(*) FROM held"))
        assert time.monotonic() - started < 3.0
        with db.patient(10, locks=True), db.session() as session:  # waits for the lock
            assert session.execute(sqlalchemy.text("SELECT count(*) FROM held")).scalar() == 0
        holder.join(20)
    finally:
        db.dispose()


def test_a_rebuild_behind_a_locked_table_fails_fast_then_retries(
    tmp_path: Path, postgres: Postgres
) -> None:
    """A table locked by another session (a ``VACUUM FULL``) while the ledger is stale:
    each tenant's call waited for the rebuild's lock for two minutes (a rebuild raised
    the lock timeout with the statement timeout), one call after another. Now the
    rebuild's lock wait ends after ``store_timeout``, the calls of the next second fail
    at once, and once the lock is gone the rebuild gives the ledger it had."""
    url = postgres.new_database()
    c = _open(tmp_path, url, store_timeout=1.0)
    try:
        assert asyncio.run(c.submit({**JOB, "id": "a"})).decision.admitted
        live = _state(c._ledger)
        c._stale = True  # as after a call that found the store out of reach
        holder = _lock_table(url, "allocations", 6)
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError):
                c._in_step(lambda: 42)
            assert time.monotonic() - started < 4.0  # 120 s before
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError, match="tried again in"):
                c._in_step(lambda: 42)
            assert time.monotonic() - started < 0.5
            assert c._stale
        finally:
            holder.join(20)
        time.sleep(REBUILD_RETRY_SECONDS)
        assert c._in_step(lambda: 42) == 42
        assert not c._stale
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)
    finally:
        c.close()
        c.db.dispose()


@pytest.mark.parametrize("linked", [False, True])
def test_a_store_file_deleted_under_the_daemon_refuses_calls_and_is_copied_back(
    tmp_path: Path, linked: bool
) -> None:
    """``rm -rf`` of a running daemon's data directory: it went on admitting jobs into a
    file no name led to, which the next start did not find. Now the store's watch finds
    the file gone, every call is refused, and the copy the message gives (from the files
    the process still holds open) brings every committed job back, a data directory
    reached through a symbolic link included."""
    data = tmp_path / "data"
    if linked:
        (tmp_path / "real").mkdir()
        data.symlink_to(tmp_path / "real")
    else:
        data.mkdir()
    c = _open(data)
    try:
        assert asyncio.run(c.submit({**JOB, "id": "a"})).decision.admitted
        assert c.db.ping()  # the watch's probe, every second in the daemon
        shutil.rmtree(tmp_path / "real" if linked else data)
        assert not c.db.ping()
        why = c.db.down_reason
        assert "was deleted under the running oasisd" in why, why
        assert "oasis.db-wal" in why and "/proc/" in why, why
        with pytest.raises(StoreUnavailableError, match="was deleted"):
            asyncio.run(c.submit({**JOB, "id": "b"}))
        rescue = why.split("while oasisd runs, ", 1)[1].split("; then restart", 1)[0]
        subprocess.run(rescue, shell=True, check=True)
    finally:
        c.close()
        c.db.dispose()
    again = _open(data)
    try:
        assert again._get_sync("a").state == "admitted"
        assert again.db.ping()
    finally:
        again.close()
        again.db.dispose()


def test_a_store_file_replaced_under_the_daemon_is_found(tmp_path: Path) -> None:
    path = tmp_path / "oasis.db"
    path.write_bytes(b"first")
    watched = StoreFile(path)
    assert watched.check() == ""
    assert watched.check() == ""
    other = tmp_path / "backup.db"
    other.write_bytes(b"second")
    other.rename(path)  # a backup moved over it
    assert watched.check() == "was replaced by another file"
    path.unlink()
    assert watched.check() == "was deleted"


def test_a_rebuild_in_the_slot_of_a_failure_keeps_the_job_it_re_planned(tmp_path: Path) -> None:
    """A server fails in a running job's slot: the re-plan adds back that slot's work on
    it, so the stored plan from this slot on holds more worker-slots than the job's work.
    Before, the next rebuild in the slot (a restart, a store outage, a takeover) read it
    as a hand edit and failed the job (the interleaving audit)."""
    from dataclasses import replace

    from controller.plane.execution import Execution
    from controller.plane.settings import mqtt_from_dict
    from controller.store.models import JobRow
    from tests.test_cordon import _later

    c = _open(tmp_path)
    try:
        view = asyncio.run(c.submit({**JOB, "id": "victim"}))
        assert view.state == "admitted"
        _later(c, 1)  # slot 1: it runs
        mqtt = mqtt_from_dict({"host": "127.0.0.1"})
        assert mqtt is not None
        c.config = replace(c.config, mqtt=mqtt)
        plane = Execution(c, mqtt)
        plane.load()
        server = next(a["server"] for a in view.decision.allocations
                      if a.get("workers") and a["slot"] == c.slot)  # fmt: skip
        events = c.between_decisions(lambda: plane.outages.fail_sync(server))
        assert [e.kind for e in events][:1] == ["replanned"], events
        live = _state(c._ledger)
        assert c._ledger.schedule("victim").after(c.slot).work() > view.decision.work
        c.between_decisions(c._reload)
        with c.db.session() as s:
            row = s.get(JobRow, "victim")
            assert row is not None
            assert row.state == "running", row.state
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)
    finally:
        c.close()


def test_a_refit_at_start_leaves_the_ledger_a_later_rebuild_gives_bit_for_bit(
    tmp_path: Path,
) -> None:
    """A start on a shrunk server refits the plans that no longer fit, admitting them
    after the others; the next rebuild admits every job in decision order, and with
    fractional demands its sums differed in the last bits (the interleaving audit). The
    refitted jobs are now put back in decision order."""

    def opened(w1_gpus: int) -> AdmissionController:
        config = from_dict({
            "daemon": {"data_dir": str(tmp_path), "window": 12, "epoch": 0},
            "cluster": {"resources": ["gpu", "cpu", "bandwidth"], "servers": [
                {"name": "w0", "kind": "worker",
                 "capacity": {"gpu": 8, "cpu": 10, "bandwidth": 10}},
                {"name": "w1", "kind": "worker",
                 "capacity": {"gpu": w1_gpus, "cpu": 10, "bandwidth": 10}},
                {"name": "p0", "kind": "ps", "capacity": {"cpu": 10, "bandwidth": 10}},
            ]},
        })  # fmt: skip
        c = AdmissionController(config, Database(config.database_url),
                                SlotClock(FakeClock(1.0), SLOT, 0.0),
                                log=structlog.wrap_logger(structlog.ReturnLogger()))  # fmt: skip
        c.open()
        return c

    c = opened(8)
    try:
        for i in range(30):
            spec = {"id": f"j{i}", "epochs": 1, "chunks": 1 + i % 3, "minibatches": 60,
                    "tau": 0.05, "grad_mb": 1,
                    "worker": {"gpu": 1, "cpu": 0.1 + 0.07 * (i % 5), "bandwidth": 0.1},
                    "ps": {"cpu": 0.3 + 0.01 * i, "bandwidth": 0.3},
                    "utility": {"kind": "sigmoid", "priority": 100, "decay": 0.1,
                                "target": 12}}  # fmt: skip
            asyncio.run(c.submit(spec))
        before = c._ledger.job_ids()
    finally:
        c.close()
    c = opened(3)  # w1 shrunk: its plans are refitted
    try:
        live = _state(c._ledger)
        assert c._ledger.job_ids() == [j for j in before if j in c._ledger]  # decision order
    finally:
        c.close()
    c = opened(3)  # nothing to refit now: every plan placed in decision order
    try:
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)
    finally:
        c.close()
