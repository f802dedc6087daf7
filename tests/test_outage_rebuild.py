"""A restart after a server failed and recovered: the ledger rebuild blocks the outage
only, so allocations that the recovered server took since do not stop the daemon.

The admission controller runs in-process on a SQLite file with a fake clock; outages
are written to the store as the execution plane writes them (``server_outages``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy
import structlog
from sqlalchemy import select

from controller.admission import AdmissionController
from controller.clock import FakeClock, SlotClock
from controller.config import from_dict
from controller.store import Database
from controller.store.models import AllocationRow, OutageRow
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


def _open(tmp_path: Path, store_url: str = "", store_timeout: float = 3.0) -> AdmissionController:
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
                "servers": [
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


def test_rebuild_after_an_outage_may_take_longer_than_store_timeout(
    tmp_path: Path, postgres: Postgres
) -> None:
    """The rebuild after an outage reads the whole store: one statement slower than
    ``store_timeout`` (here a table locked for twice that) must not keep the ledger stale
    for ever; before the fix it raised StoreUnavailableError on every try."""
    url = postgres.new_database()
    c = _open(tmp_path, url, store_timeout=1.0)
    try:
        assert asyncio.run(c.submit({**JOB, "id": "a"})).decision.admitted
        live = _state(c._ledger)
        c._stale = True  # as after a call that found the store out of reach
        locked, release = threading.Event(), threading.Event()

        engine = sqlalchemy.create_engine(url)

        def hold_lock() -> None:
            with engine.connect() as conn:
                conn.execute(sqlalchemy.text("LOCK TABLE allocations IN ACCESS EXCLUSIVE MODE"))
                locked.set()
                release.wait(10)
                time.sleep(2.5)  # 2.5 x store_timeout after the rebuild started waiting
                conn.rollback()

        holder = threading.Thread(target=hold_lock)
        holder.start()
        try:
            assert locked.wait(10)
            release.set()
            assert c._in_step(lambda: 42) == 42
        finally:
            release.set()
            holder.join(20)
            engine.dispose()
        assert not c._stale
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)
    finally:
        c.close()
        c.db.dispose()
