"""The execution plane while its PostgreSQL store is down.

A round of plans reads the store (and stores its epoch first), so while the store is out
of reach the plans wait; the rest must stay true:

- the broker connection stays up. Before, the round's ``StoreUnavailableError`` ended
  it: ``execution plane failed; reconnecting`` with a traceback, and a new connection,
  five to ten times a minute for as long as the store was out, while ``oasis status``
  and ``oasis_broker_up`` said the broker (which was fine) was disconnected;
- agents that beat are heard. Before, no review ran to apply their beats, and
  ``oasis status`` named every server ``AGENTS NOT HEARD ... (jobs there do not run)``.

Real parts: PostgreSQL stopped with ``pg_ctl``, Mosquitto, oasisd, ``oasis agent``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.broker import NEEDS_MOSQUITTO, Mosquitto
from tests.servers import ROOT, Daemon, Postgres, json_log, oasis, postgres_or_skip, write_config
from tests.test_mqtt_plane import wait_for

pytestmark = NEEDS_MOSQUITTO

SLOT = 2.0
WAITING = "plans wait: the store is unavailable (the broker connection stays up)"


class Outage:
    """Mosquitto, oasisd on ``postgres`` with ``[mqtt]`` (2 s slots, beats every 0.5 s,
    silence after 2 s) and an ``oasis agent`` for w0."""

    def __init__(self, postgres: Postgres, tmp: Path) -> None:
        self.postgres = postgres
        self.broker = Mosquitto()
        mqtt = (f'store_timeout = 1\n[mqtt]\nurl = "{self.broker.url}"\n'
                "heartbeat_seconds = 0.5\nheartbeat_timeout = 2\n")  # fmt: skip
        config = write_config(tmp / "o.toml", tmp / "data", postgres.new_database(), extra=mqtt)
        config.write_text(
            config.read_text().replace("slot_seconds = 3600", f"slot_seconds = {SLOT}")
        )
        self.daemon = Daemon(config, tmp / "o.log").start()
        argv = [sys.executable, "-m", "controller.cli", "agent", "--node", "w0",
                "--broker", self.broker.url, "--report-seconds", "0.2"]  # fmt: skip
        with open(tmp / "agent.log", "ab") as log:
            self.agent = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT)

    def logged(self, event: str) -> list[dict[str, Any]]:
        return [e for e in json_log(self.daemon.log_path) if e.get("event") == event]

    def seen(self, event: str) -> list[dict[str, Any]] | None:
        return self.logged(event) or None  # wait_for takes [] for an answer

    def heard_ago(self) -> float | None:
        """w0's agent's ``agent_heard_seconds_ago`` (``oasis servers``); None: never."""
        servers = json.loads(oasis("servers", "--json", server=self.daemon.address).stdout)
        (w0,) = [s for s in servers["servers"] if s["name"] == "w0"]
        return w0["agent_heard_seconds_ago"]  # type: ignore[no-any-return]

    def ready(self) -> None:
        """Until the plans went out and w0's agent is heard."""
        wait_for("plans published", lambda: self.seen("plans published"))
        wait_for("w0's agent heard", lambda: (self.heard_ago() or 9) < 1)

    def close(self) -> None:
        self.agent.terminate()
        self.agent.wait(30)
        self.daemon.stop()
        self.broker.close()


@pytest.fixture
def outage(tmp_path: Path) -> Iterator[Outage]:
    for postgres in postgres_or_skip():  # its own: stopped and started mid-test
        o = Outage(postgres, tmp_path)
        try:
            o.ready()
            yield o
        finally:
            o.close()


def test_a_store_outage_keeps_the_broker_connection_and_plans_go_out_after_it(
    outage: Outage,
) -> None:
    outage.postgres.stop("fast")
    try:
        time.sleep(3 * SLOT)  # slot boundaries, each a round of plans tried
        status = json.loads(oasis("status", "--json", server=outage.daemon.address).stdout)
        assert [(n["store_up"], n["broker"]) for n in status["nodes"]] == [(False, "connected")]
        assert outage.seen(WAITING)
    finally:
        outage.postgres.start()
    wait_for("plans again", lambda: outage.seen("plans go out again: the store is back"))
    assert outage.logged("execution plane failed; reconnecting") == []
    assert len(outage.logged("broker connected")) == 1  # never dropped, never made again
    assert len(outage.logged(WAITING)) == 1


def test_agents_beating_through_a_store_outage_are_heard(outage: Outage) -> None:
    outage.postgres.stop("fast")
    try:
        time.sleep(3 * SLOT)  # past the heartbeat timeout, no review applying beats
        ago = outage.heard_ago()
        assert ago is not None and ago < 1.5, ago  # it beats every 0.5 s
        status = json.loads(oasis("status", "--json", server=outage.daemon.address).stdout)
        assert "w0" not in [s["server"] for s in status["agents_unheard"]], status
    finally:
        outage.postgres.start()
    wait_for("the store back", lambda: outage.seen("store reachable again"))
    assert outage.logged("server failed") == []
