"""PostgreSQL restarted under load: while it is down submissions fail with UNAVAILABLE
(and nothing else), after it is back they succeed, and nothing is half-written.

8 clients submit 400 jobs with retries (``bench/load_test.py``); once 100 are answered a
dedicated PostgreSQL is stopped with ``pg_ctl stop -m fast`` (sessions and transactions
in flight are cut), kept down until the clients have seen UNAVAILABLE for a second, and
started again. The daemon is never restarted. Afterwards the load test's checks must all
pass: every job decided exactly once, each answer the stored decision, admitted jobs
with complete allocations, the ledger equal to the store (a commit cut off by the stop
must not leave the daemon's prices out of step), capacity never exceeded.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from bench.load_test import PgRestart, run_load
from tests.servers import Postgres, postgres_or_skip

JOBS = 400


@pytest.fixture
def own_postgres() -> Iterator[Postgres]:
    """A PostgreSQL of this test's own: it is stopped and started mid-test."""
    yield from postgres_or_skip()


def test_postgres_restart_mid_load(own_postgres: Postgres, tmp_path: Path) -> None:
    restart = partial(PgRestart, own_postgres, after=100, down_seconds=1.0)
    report = run_load(
        "postgresql", own_postgres.new_database(), tmp_path, jobs=JOBS, clients=8, fault=restart
    )
    assert report.problems == []
    assert report.pg_down_seconds > 0, "PostgreSQL was not stopped mid-load"
    assert set(report.failed_calls) == {"UNAVAILABLE"}  # the only failure while it was down
    assert report.failed_calls["UNAVAILABLE"] > 0
    assert (report.answered, report.given_up) == (JOBS, 0)
    assert report.answered_while_down == 0  # nothing decided without the store
    assert report.answered_after_restart > 0
    logs = "".join(p.read_text() for p in tmp_path.glob("*.log"))
    assert "ledger rebuilt from the store after an outage" in logs
