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

import contextlib
import time
from collections.abc import Iterator, MutableMapping, Sized
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest

from bench.load_test import PgRestart, run_load
from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.servers import (
    SMALL_JOB,
    Daemon,
    Postgres,
    json_log,
    oasis,
    postgres_or_skip,
    write_config,
)

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


def test_the_slot_clock_keeps_ticking_after_a_store_outage_at_a_boundary(
    own_postgres: Postgres, tmp_path: Path
) -> None:
    """PostgreSQL down across a slot boundary: that slot's tick fails (the store is out of
    reach), and the next ticks must move the jobs on once it is back. Before the fix the
    failure's own log line raised (``log.exception(..., event=...)``: structlog's first
    argument is ``event``), which ended the slot clock's task for good, silently: admitted
    jobs never started, pending jobs were never decided again, until a restart."""
    slot = 4.0
    config = write_config(tmp_path / "o.toml", tmp_path / "data", own_postgres.new_database(),
                          extra="store_timeout = 1")  # fmt: skip
    config.write_text(config.read_text().replace("slot_seconds = 3600", f"slot_seconds = {slot}"))
    log = tmp_path / "o.log"
    daemon = Daemon(config, log).start()
    try:
        with grpc.insecure_channel(daemon.address) as channel:
            stub = pb_grpc.AdmissionStub(channel)
            info = pb_grpc.ClusterStub(channel).GetClusterInfo(
                pb.GetClusterInfoRequest(), timeout=10
            )
            if info.now - (info.epoch + info.current_slot * slot) > slot - 1.5:
                time.sleep(1.5)  # not at the end of a slot: the job must be admitted first
            spec = {**SMALL_JOB, "id": "waits-for-the-clock", "epochs": 1, "grad_mb": 1}
            answer = stub.SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(spec)), timeout=30)
            assert answer.job.state == pb.JOB_STATE_ADMITTED
            arrival = answer.job.decision.arrival_slot
            own_postgres.stop()
            try:  # down until the tick of the job's first slot has failed
                # an operator is told the store is out, not to check that oasisd runs
                # (psycopg's "connection refused" read as the daemon's: observability audit)
                out = oasis("jobs", server=daemon.address, check=False)
                assert out.returncode == 1, out.stderr
                assert "UNAVAILABLE: the store is unavailable: " in out.stderr, out.stderr
                assert "Check that oasisd runs" not in out.stderr, out.stderr
                # the operator's screen says so, and shows what the ledger still can
                out = oasis("status", server=daemon.address, check=False)
                assert out.returncode == 0, out.stderr
                assert "THE STORE IS UNAVAILABLE" in out.stdout, out.stdout
                assert "jobs in flight: not read (the store is unavailable)" in out.stdout
                boundary = info.epoch + arrival * slot
                time.sleep(max(0.0, boundary - time.time()) + 2.0)
            finally:
                own_postgres.start()
            deadline = time.monotonic() + 4 * slot + 10
            state = answer.job.state
            while time.monotonic() < deadline and state == pb.JOB_STATE_ADMITTED:
                time.sleep(0.3)
                with contextlib.suppress(grpc.RpcError):  # UNAVAILABLE until it reconnects
                    state = stub.GetJob(pb.GetJobRequest(id=spec["id"]), timeout=10).job.state
            assert state in (pb.JOB_STATE_RUNNING, pb.JOB_STATE_COMPLETED), log.read_text()[-3000:]
        # the outage said once (a warning, not a traceback), and the task ran on
        said = "periodic event waits: the store is unavailable"
        waited = [e for e in json_log(log) if e.get("event") == said]
        assert waited and waited[0]["task"] == "slot clock"
    finally:
        daemon.stop()


def _logs_of(event: Any, outcomes: Sized) -> list[MutableMapping[str, Any]]:
    """What ``event`` (a PeriodicEvent whose run takes ``outcomes`` one by one) logs
    until its runs have taken them all, and a few more runs."""
    import asyncio

    from structlog.testing import capture_logs

    async def main() -> None:
        task = asyncio.create_task(event.loop())
        while outcomes:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.02)
        task.cancel()

    with capture_logs() as logs:
        asyncio.run(main())
    return logs


def test_a_periodic_task_says_once_that_the_store_is_away_not_a_traceback_each_run() -> None:
    """The HA audit: a PostgreSQL restart made the standby log "periodic event failed"
    with a full traceback of StoreUnavailableError at every run of each task, as if it
    were a bug. An outage is said once per task (a warning), and its end once."""

    from controller.daemon import PeriodicEvent
    from controller.store.database import StoreUnavailableError

    outcomes = [StoreUnavailableError("terminating connection"), StoreUnavailableError("again"),
                None, ValueError("a bug")]  # fmt: skip

    async def run() -> None:
        outcome = outcomes.pop(0) if outcomes else None
        if outcome is not None:
            raise outcome

    logs = _logs_of(PeriodicEvent("follow", 0.001, run), outcomes)
    said = [(e["event"], e["log_level"], "exc_info" in e) for e in logs]
    assert said == [
        ("periodic event waits: the store is unavailable", "warning", False),
        ("periodic event runs again: the store is back", "info", False),
        ("periodic event failed", "error", True),  # a bug still says where
    ]
    assert logs[0]["error"] == "terminating connection" and logs[0]["task"] == "follow"


def test_a_run_with_nothing_to_write_does_not_say_a_refusing_store_is_back() -> None:
    """A full disk (SQLite) or a read-only PostgreSQL: the slot clock's runs fail only
    when they write (a stale ledger's rebuild, every 5 s), and the runs between go
    through. Each one that did said "runs again: the store is back", and the next
    failure "waits" again: two false lines every 5 s for as long as the store refused
    writes. Now the store's own state says when it is back."""

    from controller.daemon import PeriodicEvent
    from controller.store.database import StoreUnavailableError

    full = "no space left on device: 0 bytes free"
    outcomes: list[Exception | None] = [StoreUnavailableError(full), None, None,
                                        StoreUnavailableError(full), None, None]  # fmt: skip
    trouble = [full]

    async def run() -> None:
        outcome = outcomes.pop(0) if outcomes else None
        if not outcomes:
            trouble[0] = ""  # room again: the next run goes through, the store is back
        if outcome is not None:
            raise outcome

    logs = _logs_of(PeriodicEvent("slot clock", 0.001, run, lambda: trouble[0]), outcomes)
    assert [e["event"] for e in logs] == [
        "periodic event waits: the store is unavailable",
        "periodic event runs again: the store is back",
    ]
