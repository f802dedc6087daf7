"""Running under systemd: the sd_notify protocol against a real datagram socket, the daemon's
notifications (READY after start-up, WATCHDOG, STOPPING), the drain on SIGTERM, and the
unit file."""

from __future__ import annotations

import configparser
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from google.protobuf.json_format import MessageToDict

from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.systemd import Notifier
from tests.servers import ROOT, Daemon, Postgres, write_config
from tests.test_daemon_e2e import contending_jobs, job

UNIT = ROOT / "config" / "oasisd.service"


class NotifySocket:
    """The service manager's end: a bound datagram socket that collects notifications."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(60)  # a hang guard, not an assertion on speed
        self.messages: list[dict[str, str]] = []

    def next(self) -> dict[str, str]:
        data = self.sock.recv(4096).decode()
        msg = dict(line.split("=", 1) for line in data.split("\n"))
        self.messages.append(msg)
        return msg

    def until(self, key: str) -> dict[str, str]:
        while True:
            msg = self.next()
            if key in msg:
                return msg

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def abstract_socket() -> Iterator[tuple[str, NotifySocket]]:
    name = f"oasis-test-{uuid.uuid4().hex}"
    listener = NotifySocket("\0" + name)
    yield "@" + name, listener
    listener.close()


# -- the protocol -----------------------------------------------------------------------


def test_without_notify_socket_every_call_is_a_no_op() -> None:
    n = Notifier({})
    assert not n.enabled
    assert n.watchdog_interval is None
    assert not n.ready("up") and not n.watchdog() and not n.stopping()


def test_notifications_reach_a_path_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    listener = NotifySocket(path)
    try:
        n = Notifier({"NOTIFY_SOCKET": path})
        assert n.ready("listening on\n127.0.0.1:1")
        assert listener.next() == {
            "READY": "1",
            "MAINPID": str(os.getpid()),
            "STATUS": "listening on 127.0.0.1:1",
        }
        assert n.watchdog()
        assert listener.next() == {"WATCHDOG": "1"}
        assert n.stopping()
        assert listener.next() == {"STOPPING": "1"}
        with pytest.raises(ValueError, match="KEY=VALUE"):
            n.notify("READY")
        # a field of two lines would say more than asked: READY=1 at the wrong time
        with pytest.raises(ValueError, match="one KEY=VALUE line"):
            n.notify("STATUS=migrating\nREADY=1")
    finally:
        listener.close()


def test_notifications_reach_an_abstract_socket(abstract_socket: tuple[str, NotifySocket]) -> None:
    address, listener = abstract_socket
    assert Notifier({"NOTIFY_SOCKET": address}).status("migrating")
    assert listener.next() == {"STATUS": "migrating"}


def test_a_manager_that_went_away_is_not_an_error(tmp_path: Path) -> None:
    assert not Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")}).ready()


def test_watchdog_interval_is_half_of_watchdog_usec_for_this_process_only() -> None:
    env = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "30000000"}
    assert Notifier(env).watchdog_interval == 15.0
    assert Notifier({**env, "WATCHDOG_PID": str(os.getpid())}).watchdog_interval == 15.0
    assert Notifier({**env, "WATCHDOG_PID": str(os.getpid() + 1)}).watchdog_interval is None
    assert Notifier({**env, "WATCHDOG_USEC": "0"}).watchdog_interval is None
    assert Notifier({"WATCHDOG_USEC": "30000000"}).watchdog_interval is None  # no socket


# -- the daemon -------------------------------------------------------------------------


def test_daemon_notifies_ready_after_start_up_then_watchdog_then_stopping(
    tmp_path: Path, abstract_socket: tuple[str, NotifySocket]
) -> None:
    address, listener = abstract_socket
    config = write_config(tmp_path / "n.toml", tmp_path / "data")
    log = tmp_path / "n.log"
    env = {"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "200000"}  # a ping every 0.1 s
    daemon = Daemon(config, log, env=env).start()
    try:
        assert daemon.proc is not None
        ready = listener.until("READY")
        assert ready["MAINPID"] == str(daemon.proc.pid)
        assert ready["STATUS"] == f"listening on {daemon.address}"
        assert "migrating" in listener.messages[0]["STATUS"]  # start-up said what it did
        # the daemon logs "store ready" (migrated, ledger rebuilt) before it sends READY
        assert '"event": "store ready"' in log.read_text()
        pings = [listener.next() for _ in range(3)]
        assert pings == [{"WATCHDOG": "1"}] * 3
        daemon.proc.send_signal(signal.SIGTERM)
        stopping = listener.until("STOPPING")
        assert "draining" in stopping["STATUS"]
    finally:
        assert daemon.stop() == 0, log.read_text()


def test_a_sigterm_while_starting_stops_the_daemon_never_said_ready(
    tmp_path: Path, abstract_socket: tuple[str, NotifySocket]
) -> None:
    """A SIGTERM while the daemon starts (its store migrated, its ledger rebuilt) stops
    it once started, without READY=1 to systemd nor "listening on" to a script: neither
    may take a daemon already stopping for one that serves. The mutation audit: READY
    sent all the same passed every test."""
    address, listener = abstract_socket
    config = write_config(tmp_path / "s.toml", tmp_path / "data")
    log = tmp_path / "s.log"
    cmd = [sys.executable, "-m", "controller.oasisd", "--config", str(config)]
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True,
                                env={**os.environ, "NOTIFY_SOCKET": address})  # fmt: skip
    try:
        # said before the store is opened, once SIGTERM stops the daemon (not the process)
        assert "migrating" in listener.next()["STATUS"]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert "listening on" not in out, out
    assert '"event": "stopped during start-up: not announced as ready"' in log.read_text()
    listener.sock.settimeout(0)
    with contextlib.suppress(BlockingIOError):
        while True:
            listener.next()
    assert not [m for m in listener.messages if "READY" in m], listener.messages
    assert [m for m in listener.messages if "STOPPING" in m], listener.messages


def _submit(spec: dict[str, Any]) -> pb.SubmitJobRequest:
    return pb.SubmitJobRequest(job=spec_to_proto(spec))


def _waiting_on_locks(pg: Postgres, database: str) -> int:
    with psycopg.connect(
        f"host=127.0.0.1 port={pg.port} user=oasis dbname={database}", autocommit=True
    ) as conn:
        row = conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()
        return int(row[0]) if row else 0


def test_sigterm_drains_decisions_in_flight_and_refuses_new_ones(
    tmp_path: Path, postgres: Postgres, abstract_socket: tuple[str, NotifySocket]
) -> None:
    """A decision held in flight (its store query waits on a table lock the test holds)
    is finished and stored after SIGTERM; requests arriving meanwhile are refused with
    UNAVAILABLE "draining"; after a restart the store holds exactly the answered jobs."""
    address, listener = abstract_socket
    url = postgres.new_database()
    database = url.rsplit("/", 1)[1]
    # the test holds a table lock for as long as it needs: no store timeout cuts it short
    config = write_config(tmp_path / "d.toml", tmp_path / "data", url, extra="store_timeout = 120")
    log = tmp_path / "d.log"
    daemon = Daemon(config, log, env={"NOTIFY_SOCKET": address}).start()
    jobs = contending_jobs(6)
    answered: dict[str, Any] = {}
    try:
        listener.until("READY")
        with grpc.insecure_channel(daemon.address) as channel:
            stub = pb_grpc.AdmissionStub(channel)
            blocker = psycopg.connect(
                f"host=127.0.0.1 port={postgres.port} user=oasis dbname={database}"
            )
            try:
                blocker.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
                first = stub.SubmitJob.future(_submit(jobs[0]), timeout=120)
                deadline = time.monotonic() + 60  # a hang guard
                while _waiting_on_locks(postgres, database) == 0:
                    assert time.monotonic() < deadline, "the submission never reached the store"
                    time.sleep(0.05)
                more = [stub.SubmitJob.future(_submit(j), timeout=120) for j in jobs[1:]]
                assert daemon.proc is not None
                daemon.proc.send_signal(signal.SIGTERM)
                listener.until("STOPPING")
                late: list[tuple[Any, Any]] = [
                    (stub.QuoteJob, pb.QuoteJobRequest(job=spec_to_proto(job("q")))),
                    (stub.SubmitJob, _submit(job("late"))),
                    (stub.CancelJob, pb.CancelJobRequest(id=jobs[0]["id"])),
                ]
                for method, request in late:
                    with pytest.raises(grpc.RpcError) as refused:
                        method(request, timeout=30)
                    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
                    assert "draining" in str(refused.value.details())
            finally:
                blocker.rollback()  # releases the lock: the decisions in flight go on
                blocker.close()
            answered[jobs[0]["id"]] = MessageToDict(first.result().job.decision)
            for spec, future in zip(jobs[1:], more, strict=True):
                try:
                    answered[spec["id"]] = MessageToDict(future.result().job.decision)
                except grpc.RpcError as err:  # arrived after the drain began
                    assert err.code() == grpc.StatusCode.UNAVAILABLE, err
    finally:
        assert daemon.stop() == 0, log.read_text()
    assert '"event": "drained"' in log.read_text()

    restarted = Daemon(config, log).start()
    try:
        with grpc.insecure_channel(restarted.address) as channel:
            stub = pb_grpc.AdmissionStub(channel)
            stored = stub.ListJobs(pb.ListJobsRequest(), timeout=30).jobs
            assert {j.spec.id: MessageToDict(j.decision) for j in stored} == answered
    finally:
        assert restarted.stop() == 0, log.read_text()


# -- the unit file ----------------------------------------------------------------------


def _unit() -> configparser.RawConfigParser:
    unit = configparser.RawConfigParser(strict=False)  # systemd allows repeated keys
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(UNIT)
    return unit


def test_unit_file_is_a_notify_service_with_a_watchdog_and_a_state_directory() -> None:
    service = _unit()["Service"]
    assert service["Type"] == "notify"
    assert int(service["WatchdogSec"]) > 0
    assert service["User"] == "oasis" and service["StateDirectory"] == "oasis"
    assert service["ExecStart"] == "/opt/oasis/.venv/bin/oasisd --config /etc/oasis/oasisd.toml"
    assert service["NoNewPrivileges"] == "yes" and service["ProtectSystem"] == "strict"
    # the drain fits in the stop timeout
    from controller.daemon import DRAIN_SECONDS

    assert int(service["TimeoutStopSec"]) > DRAIN_SECONDS
    # descriptors for every allowed connection and the daemon's own files
    from controller.connections import RESERVED_FDS, Connections

    assert int(service["LimitNOFILE"]) >= Connections().max_connections + RESERVED_FDS
    # systemctl reload waits for the daemon's verdict (oasisd reload), through the
    # runtime directory, within the reload's timeout (TimeoutStartSec) and systemd's default
    from controller.reload import READ_SECONDS, RESTART_CHECK_SECONDS
    from controller.reload_wait import WAIT_SECONDS

    assert service["ExecReload"] == "/opt/oasis/.venv/bin/oasisd reload --pid $MAINPID"
    assert service["RuntimeDirectory"] == "oasis"
    assert READ_SECONDS + RESTART_CHECK_SECONDS < WAIT_SECONDS < 90
    assert int(service["TimeoutStartSec"]) > WAIT_SECONDS
    # the example config keeps its SQLite store in the unit's state directory
    example = tomllib.loads((ROOT / "config" / "oasisd.example.toml").read_text())
    assert example["daemon"]["data_dir"] == "/var/lib/oasis"


def test_unit_file_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    # verify checks that ExecStart exists; point it at this interpreter
    unit = tmp_path / "oasisd.service"
    unit.write_text(UNIT.read_text().replace("/opt/oasis/.venv/bin/oasisd", sys.executable))
    out = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    problems = [line for line in (out.stdout + out.stderr).splitlines() if str(unit) in line]
    assert out.returncode == 0 and not problems, out.stdout + out.stderr


AGENT_UNIT = ROOT / "config" / "oasis-agent@.service"


def test_the_agents_unit_lets_it_stop_its_workers_and_passes_verify(tmp_path: Path) -> None:
    """The reference agent as a service: SIGTERM to the agent alone (it stops its
    workers itself, within its grace), SIGKILL to whatever is left in the unit's control
    group after the stop timeout, escaped processes included; not restarted on exit 2."""
    from controller.plane.workers import GIVE_UP_SECONDS, STOP_GRACE

    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.read_string(AGENT_UNIT.read_text())
    service = parser["Service"]
    assert service["KillMode"] == "mixed" and service["RestartPreventExitStatus"] == "2"
    assert int(service["TimeoutStopSec"]) > STOP_GRACE + GIVE_UP_SECONDS
    assert service["ExecStart"].startswith("/opt/oasis/.venv/bin/oasis agent --node %i ")
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    oasis = Path(sys.executable).parent / "oasis"
    assert oasis.exists(), oasis
    unit = tmp_path / "oasis-agent@gpu0.service"  # an instance: verify wants one
    unit.write_text(AGENT_UNIT.read_text().replace("/opt/oasis/.venv/bin/oasis", str(oasis)))
    out = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    problems = [line for line in (out.stdout + out.stderr).splitlines() if str(unit) in line]
    assert out.returncode == 0 and not problems, out.stdout + out.stderr
