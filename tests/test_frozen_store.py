"""A PostgreSQL that stops answering (SIGSTOP of the postmaster and every backend: TCP
connections still open, nothing answers): calls get UNAVAILABLE within a few seconds,
health turns NOT_SERVING and back to SERVING once it answers again, SIGTERM still stops
the daemon within the unit's TimeoutStopSec, and a store frozen at start is a one-line
error. Before the store's timeouts (controller/store/database.py) every one of these hung.
"""

from __future__ import annotations

import configparser
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.servers import ROOT, Daemon, Postgres, oasis, postgres_or_skip, write_config
from tests.test_daemon_e2e import job

STORE_TIMEOUT = 2  # seconds (daemon.store_timeout)
# A call may wait out one round trip (timeout + 1 s), then a reconnect (timeout), queued
# behind one such call: a bound that holds with room, and far below "hangs".
ANSWER_WITHIN = 6 * STORE_TIMEOUT + 5
HUNG = 60.0  # what the calls wait before the test calls them hung


def _stop_timeout() -> float:
    unit = configparser.RawConfigParser(strict=False)
    unit.read(ROOT / "config" / "oasisd.service")
    return float(unit["Service"]["TimeoutStopSec"])


@pytest.fixture
def own_postgres() -> Iterator[Postgres]:
    """A PostgreSQL of this test's own: it is frozen mid-test."""
    yield from postgres_or_skip()


def _submit(stub: pb_grpc.AdmissionStub, job_id: str) -> tuple[grpc.StatusCode, float]:
    started = time.monotonic()
    try:
        stub.SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(job(job_id))), timeout=HUNG)
        code = grpc.StatusCode.OK
    except grpc.RpcError as err:
        code = err.code()
    return code, time.monotonic() - started


def _health_becomes(channel: grpc.Channel, status: int, within: float) -> float:
    """Seconds until the daemon's overall health reads ``status``; fails after ``within``."""
    health = health_pb2_grpc.HealthStub(channel)
    started = time.monotonic()
    while True:
        now = health.Check(health_pb2.HealthCheckRequest(), timeout=10).status
        if now == status:
            return time.monotonic() - started
        assert time.monotonic() - started < within, f"health stayed {now}"
        time.sleep(0.2)


def test_frozen_postgres(own_postgres: Postgres, tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "f.toml",
        tmp_path / "data",
        own_postgres.new_database(),
        extra=f"store_timeout = {STORE_TIMEOUT}",
    )
    log = tmp_path / "f.log"
    daemon = Daemon(config, log).start()
    frozen = False
    try:
        with grpc.insecure_channel(daemon.address) as channel:
            stub = pb_grpc.AdmissionStub(channel)
            assert _submit(stub, "before")[0] == grpc.StatusCode.OK
            _health_becomes(channel, health_pb2.HealthCheckResponse.SERVING, 10)

            own_postgres.freeze()
            frozen = True
            answered_in = []
            for job_id in ("during-1", "during-2", "during-3"):
                code, took = _submit(stub, job_id)
                assert code == grpc.StatusCode.UNAVAILABLE, (code, took)
                assert took < ANSWER_WITHIN, took
                answered_in.append(round(took, 2))
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as read:
                stub.GetJob(pb.GetJobRequest(id="before"), timeout=HUNG)
            assert read.value.code() == grpc.StatusCode.UNAVAILABLE
            assert time.monotonic() - started < ANSWER_WITHIN
            _health_becomes(channel, health_pb2.HealthCheckResponse.NOT_SERVING, ANSWER_WITHIN)
            # the operator's screen says why, as the journal does (the on-call audit:
            # it read THE STORE IS UNAVAILABLE and no more)
            out = oasis("status", "--json", "--timeout", "30", server=daemon.address)
            [node] = json.loads(out.stdout)["nodes"]
            assert node["store_up"] is False and node["store_down"], node
            screen = oasis("status", "--timeout", "30", server=daemon.address).stdout
            assert "THE STORE IS UNAVAILABLE (no decision can be stored): " in screen, screen

            own_postgres.thaw()
            frozen = False
            _health_becomes(channel, health_pb2.HealthCheckResponse.SERVING, ANSWER_WITHIN)
            assert _submit(stub, "after")[0] == grpc.StatusCode.OK
            got = stub.GetJob(pb.GetJobRequest(id="before"), timeout=30)
            assert got.job.spec.id == "before"

            # frozen again, with a submission in flight: SIGTERM stops it in time
            own_postgres.freeze()
            frozen = True
            pending = stub.SubmitJob.future(
                pb.SubmitJobRequest(job=spec_to_proto(job("at-stop"))), timeout=HUNG
            )
            time.sleep(0.5)
            assert daemon.proc is not None
            started = time.monotonic()
            daemon.proc.send_signal(signal.SIGTERM)
            daemon.proc.wait(_stop_timeout())  # raises TimeoutExpired if it hangs
            stopped_in = time.monotonic() - started
            assert daemon.proc.returncode == 0, log.read_text()
            with pytest.raises(grpc.RpcError) as cut:
                pending.result()
            assert cut.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        if frozen:
            own_postgres.thaw()
        daemon.stop()
    text = log.read_text()
    assert '"event": "store unreachable"' in text and '"event": "store reachable again"' in text
    print(f"frozen: submissions answered UNAVAILABLE in {answered_in} s; stopped "
          f"{stopped_in:.1f} s after SIGTERM")  # fmt: skip


def test_a_store_frozen_at_start_is_a_one_line_error(
    own_postgres: Postgres, tmp_path: Path
) -> None:
    url = own_postgres.new_database()
    config = write_config(
        tmp_path / "s.toml", tmp_path / "data", url, extra=f"store_timeout = {STORE_TIMEOUT}"
    )
    own_postgres.freeze()
    try:
        out = subprocess.run(
            [sys.executable, "-m", "controller.daemon", "--config", str(config)],
            capture_output=True, text=True, timeout=HUNG, check=False, cwd=ROOT,
        )  # fmt: skip
    finally:
        own_postgres.thaw()
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith("oasisd: cannot open the store postgresql+psycopg://"), out.stderr
    assert "timeout" in out.stderr and out.stderr.count("\n") == 1, out.stderr
