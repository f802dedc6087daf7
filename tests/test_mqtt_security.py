"""The execution plane against a broker that wants a password and speaks only TLS.

One real Mosquitto for the module: ``allow_anonymous false``, a ``mosquitto_passwd``
file, and a TLS listener whose certificate comes from the throwaway CA of
tests/test_security.py. The daemon runs as a subprocess with ``[mqtt]`` holding
``mqtts://``, ``tls_ca``, ``username`` and ``password``; each test uses its own topic
prefix, so what one test leaves retained on the broker cannot satisfy another.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import grpc
import pytest

from controller.plane.topics import Plan, Topics
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.broker import NEEDS_MOSQUITTO, Mosquitto
from tests.servers import ROOT, Daemon, json_log, write_config
from tests.test_security import Pki, make_pki, submit_request

SERVERS = ("w0", "w1", "w2", "p0", "p1")
USER, PASSWORD = "oasisd", "s3cret:with@odd/chars"
AGENT, AGENT_PASSWORD = "agent-w0", "another one"

pytestmark = NEEDS_MOSQUITTO


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def broker(pki: Pki) -> Iterator[Mosquitto]:
    try:
        server = Mosquitto(
            users={USER: PASSWORD, AGENT: AGENT_PASSWORD}, tls=(pki.server_cert, pki.server_key)
        )
    except FileNotFoundError:
        if os.environ.get("OASIS_REQUIRE_MOSQUITTO") == "1":
            raise
        pytest.skip("mosquitto_passwd not installed")
    try:
        yield server
    finally:
        server.close()


def start_daemon(
    tmp: Path, broker: Mosquitto, pki: Pki, prefix: str, password: str, ca: Path | None = None
) -> Daemon:
    """oasisd with ``[mqtt]`` for ``broker`` (TLS trusting ``ca``, by default the test CA;
    user ``USER``), started."""
    mqtt = (
        f'[mqtt]\nurl = "{broker.url}"\ntls_ca = "{ca or pki.ca}"\nusername = "{USER}"\n'
        f"password = {json.dumps(password)}\ntopic_prefix = {json.dumps(prefix)}\n"
    )
    config = write_config(tmp / "oasisd.toml", tmp / "data", extra=mqtt)
    assert broker.url.startswith("mqtts://127.0.0.1:")
    return Daemon(config, tmp / "oasisd.log").start()


def retained_plans(broker: Mosquitto, pki: Pki, prefix: str, wait: float) -> dict[str, Plan]:
    """The retained plans under ``prefix``, as a correctly authenticated TLS subscriber
    sees them within ``wait`` seconds (returns early once every server has one)."""

    async def read() -> dict[str, Plan]:
        plans: dict[str, Plan] = {}
        tls = aiomqtt.TLSParameters(ca_certs=str(pki.ca))
        async with aiomqtt.Client("127.0.0.1", broker.port, username=USER, password=PASSWORD,
                                  tls_params=tls) as client:  # fmt: skip
            await client.subscribe(Topics(prefix).all_plans, qos=1)
            with _no_timeout_error():
                async with asyncio.timeout(wait):
                    async for message in client.messages:
                        assert isinstance(message.payload, bytes)
                        plan = Plan.parse(message.payload)
                        plans[plan.server] = plan
                        if len(plans) == len(SERVERS):
                            break
        return plans

    return asyncio.run(read())


class _no_timeout_error:  # noqa: N801 - used as a statement
    """``asyncio.timeout`` expiring is the end of the wait, not a failure."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is TimeoutError


def anonymous_refused(broker: Mosquitto, pki: Pki) -> str:
    """The error of a TLS client without credentials (the broker must refuse it)."""

    async def attempt() -> str:
        tls = aiomqtt.TLSParameters(ca_certs=str(pki.ca))
        try:
            async with aiomqtt.Client("127.0.0.1", broker.port, tls_params=tls, timeout=5):
                return ""
        except aiomqtt.MqttError as err:
            return str(err)

    return asyncio.run(attempt())


log_events = json_log  # the JSON log lines of a daemon or agent


def wait_for_log(path: Path, event: str, timeout: float = 15.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in log_events(path) if e.get("event") == event]
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no {event!r} in {path}:\n{path.read_text()}")


def test_daemon_and_agent_authenticate_over_tls(
    tmp_path: Path, broker: Mosquitto, pki: Pki
) -> None:
    assert "Not authorized" in anonymous_refused(broker, pki)  # the broker really checks
    daemon = start_daemon(tmp_path, broker, pki, "sec-ok", PASSWORD)
    agent: subprocess.Popen[bytes] | None = None
    try:
        wait_for_log(daemon.log_path, "broker connected")
        plans = retained_plans(broker, pki, "sec-ok", wait=15.0)
        assert set(plans) == set(SERVERS)

        # the agent: user and CA by flags, password from the environment, not argv
        argv = [sys.executable, "-m", "controller.cli", "agent", "--node", "w0",
                "--broker", broker.url, "--topic-prefix", "sec-ok",
                "--mqtt-username", AGENT, "--mqtt-tls-ca", str(pki.ca)]  # fmt: skip
        assert AGENT_PASSWORD not in " ".join(argv)
        (tmp_path / "agent.log").touch()
        with open(tmp_path / "agent.log", "ab") as log:
            agent = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT,
                env={**os.environ, "OASIS_MQTT_PASSWORD": AGENT_PASSWORD},
            )  # fmt: skip
        wait_for_log(tmp_path / "agent.log", "connected")
        plan = wait_for_log(tmp_path / "agent.log", "plan")
        assert plan["epoch"] == plans["w0"].epoch
    finally:
        if agent is not None:
            agent.kill()
            agent.wait(10)
        assert daemon.stop() == 0
    assert PASSWORD not in daemon.log_path.read_text()


def test_wrong_password_daemon_keeps_deciding_and_says_why(
    tmp_path: Path, broker: Mosquitto, pki: Pki
) -> None:
    daemon = start_daemon(tmp_path, broker, pki, "sec-bad", "not-the-password")
    try:
        refused = wait_for_log(daemon.log_path, "broker unavailable")
        assert "Not authorized" in str(refused["error"]), refused
        assert refused["level"] == "warning"  # the first time; retries are info
        # still deciding: gRPC answers and admits a job
        stub = pb_grpc.AdmissionStub(grpc.insecure_channel(daemon.address))
        reply = stub.SubmitJob(submit_request("j1"), timeout=20)
        assert reply.job.decision.admitted
        # ... retried, never connected, and nothing reached the broker
        time.sleep(1.0)
        events = [e.get("event") for e in log_events(daemon.log_path)]
        assert events.count("broker unavailable") >= 2
        assert "broker connected" not in events
        assert retained_plans(broker, pki, "sec-bad", wait=1.5) == {}
        assert daemon.proc is not None and daemon.proc.poll() is None
    finally:
        assert daemon.stop() == 0
    assert "not-the-password" not in daemon.log_path.read_text()


def test_a_broker_certificate_the_ca_file_does_not_vouch_for(
    tmp_path: Path, broker: Mosquitto, pki: Pki
) -> None:
    """tls_ca naming another certificate: the daemon refuses the broker (a warning that
    says why), keeps deciding, and nothing is published."""
    daemon = start_daemon(tmp_path, broker, pki, "sec-ca", PASSWORD, ca=pki.rogue_cert)
    try:
        refused = wait_for_log(daemon.log_path, "broker unavailable")
        assert "certificate verify failed" in str(refused["error"]), refused
        assert refused["level"] == "warning"
        stub = pb_grpc.AdmissionStub(grpc.insecure_channel(daemon.address))
        assert stub.SubmitJob(submit_request("c1"), timeout=20).job.decision.admitted
        assert "broker connected" not in [e.get("event") for e in log_events(daemon.log_path)]
        assert retained_plans(broker, pki, "sec-ca", wait=1.5) == {}
    finally:
        assert daemon.stop() == 0
