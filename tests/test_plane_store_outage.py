"""The execution plane while its PostgreSQL store is down: the broker connection stays up.

A round of plans reads the store (and stores its epoch first), so while the store is out
of reach the plans wait. Before, the round's ``StoreUnavailableError`` ended the plane's
broker connection: ``execution plane failed; reconnecting`` with a traceback, and a new
connection, five to ten times a minute for as long as the store was out, while
``oasis status`` and ``oasis_broker_up`` said the broker (which was fine) was
disconnected. Real parts: PostgreSQL stopped with ``pg_ctl``, Mosquitto, oasisd.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.broker import NEEDS_MOSQUITTO, Mosquitto
from tests.servers import Daemon, Postgres, json_log, oasis, postgres_or_skip, write_config
from tests.test_mqtt_plane import wait_for

pytestmark = NEEDS_MOSQUITTO

SLOT = 2.0


@pytest.fixture
def own_postgres() -> Iterator[Postgres]:
    """A PostgreSQL of this test's own: it is stopped and started mid-test."""
    yield from postgres_or_skip()


def test_a_store_outage_keeps_the_broker_connection_and_plans_go_out_after_it(
    own_postgres: Postgres, tmp_path: Path
) -> None:
    broker = Mosquitto()
    mqtt = f'store_timeout = 1\n[mqtt]\nurl = "{broker.url}"\nheartbeat_seconds = 0.5\n'
    config = write_config(tmp_path / "o.toml", tmp_path / "data", own_postgres.new_database(),
                          extra=mqtt)  # fmt: skip
    config.write_text(config.read_text().replace("slot_seconds = 3600", f"slot_seconds = {SLOT}"))
    daemon = Daemon(config, tmp_path / "o.log").start()

    def logged(event: str) -> list[dict[str, Any]]:
        return [e for e in json_log(daemon.log_path) if e.get("event") == event]

    def seen(event: str) -> list[dict[str, Any]] | None:
        return logged(event) or None  # wait_for takes [] for an answer

    try:
        wait_for("plans published", lambda: seen("plans published"))
        own_postgres.stop("fast")
        try:
            time.sleep(3 * SLOT)  # slot boundaries, each a round of plans tried
            status = json.loads(oasis("status", "--json", server=daemon.address).stdout)
            assert [(n["store_up"], n["broker"]) for n in status["nodes"]] == [(False, "connected")]
            assert seen("plans wait: the store is unavailable (the broker connection stays up)")
        finally:
            own_postgres.start()
        wait_for("plans again", lambda: seen("plans go out again: the store is back"))
        assert logged("execution plane failed; reconnecting") == []
        assert len(logged("broker connected")) == 1  # never dropped, never made again
        assert len(logged("plans wait: the store is unavailable (the broker connection "
                          "stays up)")) == 1  # fmt: skip
    finally:
        daemon.stop()
        broker.close()
