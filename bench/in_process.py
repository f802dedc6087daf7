"""The admission controller in-process for the benchmarks that time its steps: SQLite
with the daemon's defaults in a folder, a slot clock frozen at slot 0 (a
:class:`~controller.clock.FakeClock` the caller may advance), logs dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog
from sqlalchemy import select

from controller.admission import AdmissionController
from controller.clock import FakeClock, SlotClock
from controller.config import from_dict
from controller.store import AllocationRow, Database

__all__ = ["first_servers", "opened_controller"]


def opened_controller(
    data_dir: Path,
    cluster: dict[str, Any],
    window: int,
    limits: dict[str, Any] | None = None,
    clock: FakeClock | None = None,
) -> AdmissionController:
    """An opened controller of ``cluster`` (``{"resources": [...], "servers": [...]}``)
    over ``window`` slots, its store in ``data_dir``, ``[limits]`` as given, on
    ``clock`` (a fresh one at 1.0 s if None: slot 0)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    config = from_dict({
        "daemon": {"data_dir": str(data_dir), "window": window, "epoch": 0},
        "cluster": {"resources": cluster["resources"], "servers": cluster["servers"]},
        "limits": limits or {},
    })  # fmt: skip
    c = AdmissionController(
        config, Database(config.database_url),
        SlotClock(clock if clock is not None else FakeClock(1.0), config.slot_seconds, 0.0),
        log=structlog.wrap_logger(structlog.ReturnLogger()),
    )  # fmt: skip
    c.open()
    return c


def first_servers(c: AdmissionController, keys: list[str]) -> dict[str, str]:
    """Per job of ``keys``, a worker server of its plan in its first slot (where its
    agent reports from), in one query."""
    with c.db.session() as session:
        rows = session.execute(
            select(AllocationRow.job_id, AllocationRow.server)
            .where(AllocationRow.workers > 0)
            .order_by(AllocationRow.slot.desc())
        ).all()
    out = {r.job_id: r.server for r in rows}  # the first slot's, written last
    return {k: out[k] for k in keys}
