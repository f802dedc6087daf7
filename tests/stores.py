"""A SQLite store holding a daemon's decisions of given jobs, made in process (the
admission controller on a fake clock): what ``--store`` tools read in tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog
from sqlalchemy.orm import Session

from controller.admission import AdmissionController
from controller.clock import FakeClock, SlotClock
from controller.config import Config, from_dict
from controller.store import Database


def in_process(config: Config, clock: FakeClock | None = None) -> AdmissionController:
    """An admission controller of ``config`` in this process, on ``clock`` (by default a
    fake one at 10 s past the epoch), logging nowhere; not opened yet
    (:meth:`AdmissionController.open`)."""
    return AdmissionController(
        config,
        Database(config.database_url),
        SlotClock(clock or FakeClock(10.0), config.slot_seconds, config.epoch),
        log=structlog.wrap_logger(structlog.ReturnLogger()),
    )


def decided_store(
    directory: Path, trace: Mapping[str, Any], window: int, jobs: Mapping[str, Sequence[Any]]
) -> Config:
    """A daemon's config with its SQLite store in ``directory``, on ``trace``'s servers
    with ``window`` slots, having decided ``jobs``: per submitter (``""``: none), trace
    job objects (their ``arrival`` dropped), in turns, one of each in order. The config's
    ``database_url`` names the store."""
    config = from_dict(
        {
            "daemon": {"data_dir": str(directory), "window": window, "epoch": 0},
            "cluster": {"resources": trace["resources"], "servers": trace["servers"]},
        }
    )
    daemon = in_process(config)
    daemon.open()
    queues = {name: list(entries) for name, entries in jobs.items()}
    try:
        while any(queues.values()):
            for name, queue in queues.items():
                if queue:
                    spec = {k: v for k, v in queue.pop(0).items() if k != "arrival"}
                    asyncio.run(daemon.submit(spec, by=name or None))
    finally:
        daemon.close()
    return config


@contextlib.contextmanager
def store_session(url: str) -> Iterator[Session]:
    """A session of the store at ``url`` on an engine of its own, committed at the
    block's end and the engine disposed after (Python 3.13 warns of a SQLite
    connection left to the collector, in whichever test it runs)."""
    db = Database(url)
    try:
        with db.session() as session:
            yield session
    finally:
        db.dispose()
