"""The execution plane's pieces without a broker: the [mqtt] table, payloads, and the
reference agent's plan following and simulation."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from controller.cli import build_parser
from controller.commands.agent import broker_settings
from controller.commands.common import InputError
from controller.config import ConfigError, from_dict
from controller.plane import topics
from controller.plane.agent import Agent, TaskState
from controller.plane.plan_messages import MAX_PLAN_PAYLOAD_BYTES
from controller.plane.settings import MqttConfig, mqtt_from_dict, override
from controller.plane.topics import (
    Heartbeat,
    Plan,
    Progress,
    SlotPlan,
    Status,
    Task,
    TaskProgress,
    Topics,
)
from pricing.errors import SpecError
from pricing.fields import MAX_JOB_KEY_CHARS
from tests.broker import NEEDS_MOSQUITTO
from tests.fake_mqtt import FakeMqtt
from tests.servers import ROOT, free_port

CLUSTER: dict[str, Any] = {
    "resources": ["gpu", "bandwidth"],
    "servers": [
        {"name": "w0", "kind": "worker", "capacity": {"gpu": 4, "bandwidth": 10}},
        {"name": "p0", "kind": "ps", "capacity": {"bandwidth": 10}},
    ],
}


def config(mqtt: dict[str, Any] | None) -> Any:
    data: dict[str, Any] = {"cluster": CLUSTER}
    if mqtt is not None:
        data["mqtt"] = mqtt
    return from_dict(data)


def ca_file(directory: Path) -> str:
    """A file that passes the [mqtt] tls_ca check (a PEM certificate, by its armour)."""
    path = directory / "ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    return str(path)


def test_mqtt_table_is_optional_and_validated(tmp_path: Path) -> None:
    assert config(None).mqtt is None
    c = config({"url": "mqtt://broker:1999", "topic_prefix": "lab/", "heartbeat_timeout": 9})
    assert (c.mqtt.host, c.mqtt.port, c.mqtt.tls, c.mqtt.topic_prefix) == ("broker", 1999,
                                                                          False, "lab")  # fmt: skip
    assert c.mqtt.heartbeat_seconds == 3.0
    assert config({"host": "b", "heartbeat_timeout": 0.3}).mqtt.heartbeat_seconds == 0.1
    assert config({"host": "b", "tls_ca": ca_file(tmp_path)}).mqtt.port == 8883
    assert c.mqtt.device_resource == "gpu"  # the default; "" gives agents no devices
    assert config({"host": "b", "device_resource": ""}).mqtt.device_resource == ""
    cases: list[tuple[dict[str, Any], str]] = [
        ({"url": "http://b"}, "mqtt.url: must be mqtt://"),
        ({"port": 1883}, "mqtt: needs url or host"),
        ({"host": "b", "port": 70000}, "mqtt.port: must be <= 65535"),
        ({"host": "b", "topic_prefix": "a/#"}, "mqtt.topic_prefix"),
        ({"host": "b", "heartbeat_timeout": 2, "heartbeat_seconds": 3}, "mqtt.heartbeat_seconds"),
        # agents beat at most every 0.1 s: a shorter timeout failed every server over and
        # over (the flap rule then cordoned them all), a shorter beat was never sent
        ({"host": "b", "heartbeat_timeout": 0.05}, "mqtt.heartbeat_timeout: must be at "
         "least 2 x heartbeat_seconds (0.2 s): a server is declared failed after"),
        ({"host": "b", "heartbeat_timeout": 1, "heartbeat_seconds": 0.01},
         "mqtt.heartbeat_seconds: must be at least 0.1 (agents beat no faster), got 0.01"),
        ({"host": "b", "heartbeat_timeout": 1, "heartbeat_seconds": 0.6},
         "mqtt.heartbeat_timeout: must be at least 2 x heartbeat_seconds (1.2 s)"),
        ({"host": "b", "colour": 1}, "mqtt.colour: unknown key"),
        ({"host": "b", "device_resource": "gpus"}, "mqtt.device_resource: 'gpus' is not a "
         "resource of the cluster (its resources: gpu, bandwidth); \"\" gives agents no "),
        ({"host": "b", "device_resource": 1}, "mqtt.device_resource: must be"),
    ]  # fmt: skip
    for bad, message in cases:
        with pytest.raises(ConfigError, match=re.escape(message)):
            config(bad)


def test_credentials_in_the_url_are_decoded_and_must_agree_with_the_keys() -> None:
    c = mqtt_from_dict({"url": "mqtts://al%40ice:p%3Ass%2Fw@broker:8884"})
    assert c is not None
    assert (c.username, c.password, c.tls, c.port) == ("al@ice", "p:ss/w", True, 8884)
    same = mqtt_from_dict({"url": "mqtt://u:pw@b", "username": "u", "password": "pw"})
    assert same is not None and (same.username, same.password) == ("u", "pw")
    only_keys = mqtt_from_dict({"url": "mqtt://b", "username": "u", "password": "pw"})
    assert only_keys is not None and (only_keys.username, only_keys.password) == ("u", "pw")
    with pytest.raises(SpecError, match=r"^mqtt\.username: differs from the username in mqtt\.url"):
        mqtt_from_dict({"url": "mqtt://u:pw@b", "username": "v"})
    with pytest.raises(SpecError, match=r"^mqtt\.password: differs") as err:
        mqtt_from_dict({"url": "mqtt://u:pw@b", "password": "other"})
    assert "pw" not in str(err.value).replace("password", "")
    with pytest.raises(SpecError, match=r"mqtt\.url: must be") as err:
        mqtt_from_dict({"url": "http://u:hunter2@b"})
    assert "hunter2" not in str(err.value) and "u:***@b" in str(err.value)


def test_tls_ca_is_checked_at_load(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(SpecError, match=re.escape(f"mqtt.tls_ca: no such file: {missing}")):
        mqtt_from_dict({"host": "b", "tls_ca": str(missing)})
    with pytest.raises(SpecError, match=re.escape(f"mqtt.tls_ca: not a file: {tmp_path}")):
        mqtt_from_dict({"host": "b", "tls_ca": str(tmp_path)})
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(SpecError, match=r"mqtt\.tls_ca: .*holds no PEM CERTIFICATE"):
        mqtt_from_dict({"host": "b", "tls_ca": str(tmp_path / "junk.pem")})
    good = mqtt_from_dict({"host": "b", "tls_ca": ca_file(tmp_path)})
    assert good is not None and good.tls and good.tls_ca == ca_file(tmp_path)


def test_mqtt_settings_at_their_bounds_are_taken_and_past_them_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mutation audit of the [mqtt] table: each default, bound and scheme below could
    be changed (a bound moved by one, a default doubled, ``ssl://`` taken as plain) with
    every test passing."""

    def read(**raw: Any) -> MqttConfig:
        c = mqtt_from_dict({"host": "b", **raw})
        assert c is not None
        return c

    def refused(message: str, **raw: Any) -> None:
        with pytest.raises(SpecError, match="^" + re.escape(message)):
            mqtt_from_dict({"host": "b", **raw})

    # the defaults the module docstring gives
    d = read()
    assert (d.port, d.tls, d.topic_prefix, d.heartbeat_timeout, d.heartbeat_seconds) == (
        1883, False, "oasis", 30.0, 5.0)  # fmt: skip
    assert (d.flap_failures, d.flap_seconds, d.max_plan_bytes) == (3, 3600.0, 200_000)
    # both TLS schemes mean TLS (and its port), both plain ones plain: ssl:// taken as
    # plain would send the password and every plan in the clear
    for url, tls, port in (("mqtts://b", True, 8883), ("ssl://b", True, 8883),
                           ("mqtt://b", False, 1883), ("tcp://b", False, 1883)):  # fmt: skip
        c = mqtt_from_dict({"url": url})
        assert c is not None and (c.tls, c.port) == (tls, port), url
    # a URL without a host names mqtt.url, not the table
    with pytest.raises(SpecError, match=r"^mqtt\.url: must be mqtt://host"):
        mqtt_from_dict({"url": "mqtt://:1883"})
    # the bounds are in the range, one past them is not
    assert read(port=65535).port == 65535
    refused("mqtt.port: must be >= 1, got 0", port=0)
    assert read(flap_seconds=7 * 86400).flap_seconds == 7 * 86400
    refused("mqtt.flap_seconds: must be at most 604800", flap_seconds=7 * 86400 + 1)
    assert read(flap_failures=0).flap_failures == 0  # 0: never held out
    assert read(max_plan_bytes=MAX_PLAN_PAYLOAD_BYTES).max_plan_bytes == MAX_PLAN_PAYLOAD_BYTES
    refused("mqtt.max_plan_bytes: must be at most", max_plan_bytes=MAX_PLAN_PAYLOAD_BYTES + 1)
    assert read(max_plan_bytes=4096).max_plan_bytes == 4096
    # a timeout of exactly two beats is taken; a beat as long as the timeout is refused
    # naming the beat (the key given), not the timeout
    assert read(heartbeat_timeout=0.2).heartbeat_seconds == 0.1
    assert read(heartbeat_timeout=2, heartbeat_seconds=1).heartbeat_timeout == 2
    refused("mqtt.heartbeat_seconds: must be < heartbeat_timeout",
            heartbeat_timeout=2, heartbeat_seconds=2)  # fmt: skip
    assert read(heartbeat_timeout=1, heartbeat_seconds=0.1).heartbeat_seconds == 0.1
    refused("mqtt.heartbeat_seconds: must be at least 0.1", heartbeat_timeout=1,
            heartbeat_seconds=0.09)  # fmt: skip
    # a NUL in a topic is refused by brokers, which drop the connection
    refused("mqtt.topic_prefix: must be a non-empty topic without wildcards", topic_prefix="a\0b")
    # a CA file under ~ is the file the TLS context is given, not the literal "~"
    monkeypatch.setenv("HOME", str(tmp_path))
    ca_file(tmp_path)
    assert read(tls_ca="~/ca.pem").tls_ca == str(tmp_path / "ca.pem")


def test_an_override_is_checked_as_the_table_and_its_ca_turns_tls_on(tmp_path: Path) -> None:
    """``oasis agent``'s flags on top of a config's [mqtt] (:func:`override`): a CA file
    turns TLS on at the configured port, a password replaces the table's, and a key no
    flag gives is refused by name (the mutation audit: each could go unnoticed)."""
    base = mqtt_from_dict({"url": "mqtt://u:pw@b:1999"})
    assert base is not None and not base.tls
    ca = ca_file(tmp_path)
    m = override(base, {"tls_ca": ca, "password": "new"})
    assert (m.tls, m.port, m.tls_ca, m.username, m.password) == (True, 1999, ca, "u", "new")
    assert override(base, {"username": "n"}).username == "n"
    with pytest.raises(SpecError, match=r"^mqtt\.heartbeat_timeout: cannot be overridden"):
        override(base, {"heartbeat_timeout": 1})
    with pytest.raises(SpecError, match=r"^mqtt\.password: must be"):
        override(base, {"password": 5})


def test_password_is_not_in_repr() -> None:
    c = MqttConfig("b", username="u", password="hunter2")
    assert "hunter2" not in repr(c) and "hunter2" not in str(c)
    assert "u" in repr(c) and c.password == "hunter2"


def agent_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["agent", "--node", "w0", *argv])


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("OASIS_BROKER", "OASIS_MQTT_USERNAME", "OASIS_MQTT_PASSWORD", "OASIS_MQTT_TLS_CA"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_agent_flags_keep_tls_and_credentials(
    tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = ca_file(tmp_path)
    url = "mqtts://u:pw@broker:8884"
    m = broker_settings(agent_args("--broker", url, "--mqtt-tls-ca", ca, "--topic-prefix", "/lab/"))
    assert (m.host, m.port, m.tls, m.tls_ca) == ("broker", 8884, True, ca)
    assert (m.username, m.password, m.topic_prefix) == ("u", "pw", "lab")

    # the CA from the environment (the agent unit's EnvironmentFile): before, only the
    # flag, which the unit's ExecStart does not give, so a site CA meant editing the unit
    clean_env.setenv("OASIS_BROKER", "mqtts://broker:8883")
    clean_env.setenv("OASIS_MQTT_TLS_CA", ca)
    m = broker_settings(agent_args())
    assert (m.host, m.port, m.tls, m.tls_ca) == ("broker", 8883, True, ca)
    clean_env.delenv("OASIS_BROKER")
    clean_env.delenv("OASIS_MQTT_TLS_CA")

    # the password from the environment or a file, the user from a flag
    clean_env.setenv("OASIS_MQTT_PASSWORD", "from-env")
    m = broker_settings(agent_args("--broker", "mqtt://b", "--mqtt-username", "n"))
    assert (m.username, m.password, m.tls) == ("n", "from-env", False)
    (tmp_path / "pw").write_text("from-file\n")
    m = broker_settings(agent_args("--mqtt-password-file", str(tmp_path / "pw")))
    assert (m.host, m.port, m.password) == ("127.0.0.1", 1883, "from-file")

    # on top of a config file: the flags win, the rest of [mqtt] stays
    cfg = tmp_path / "oasisd.toml"
    cfg.write_text(
        '[mqtt]\nurl = "mqtts://cfg:9000"\nusername = "x"\npassword = "y"\n'
        'topic_prefix = "site"\nheartbeat_timeout = 9\n'
        '[cluster]\nresources = ["gpu", "bandwidth"]\n'
        'servers = [{name = "w0", kind = "worker", capacity = {gpu = 1, bandwidth = 1}},\n'
        '  {name = "p0", kind = "ps", capacity = {bandwidth = 1}}]\n'
    )
    clean_env.delenv("OASIS_MQTT_PASSWORD")
    m = broker_settings(agent_args("--config", str(cfg), "--topic-prefix", "other"))
    assert (m.host, m.port, m.tls, m.username, m.password) == ("cfg", 9000, True, "x", "y")
    # the config's user is the daemon's: warned of, with the flag that gives the node's
    assert "as 'x', the user of" in capsys.readouterr().err
    assert (m.topic_prefix, m.heartbeat_timeout) == ("other", 9.0)
    m = broker_settings(agent_args("--config", str(cfg), "--mqtt-username", "z",
                                   "--mqtt-tls-ca", ca))  # fmt: skip
    assert (m.username, m.password, m.tls_ca, m.topic_prefix) == ("z", "y", ca, "site")
    # only [mqtt] is read: the daemon's tokens file (the example turns [auth] on) is not
    # on a worker node, or not readable by the agent's user (it failed the agent before)
    cfg.write_text(cfg.read_text() + '[auth]\ntokens_file = "/no/such/tokens"\n')
    assert broker_settings(agent_args("--config", str(cfg))).host == "cfg"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--topic-prefix", "a/+"], "--topic-prefix: must be a non-empty topic"),
        (["--mqtt-tls-ca", "/no/such.pem"], "--mqtt-tls-ca: no such file: /no/such.pem"),
        (["--broker", "mqtt://u:a@b", "--mqtt-username", "v"], "--mqtt-username: differs"),
        (["--mqtt-password-file", "/no/such"], "--mqtt-password-file: No such file"),
        (["--broker", "ftp://b"], "--broker: must be mqtt://"),
    ],
)
def test_agent_flag_errors_name_the_flag(
    argv: list[str], message: str, clean_env: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InputError, match="^" + re.escape(message)):
        broker_settings(agent_args(*argv))


def plan(
    epoch: int,
    slot: int = 5,
    starts: float = 100.0,
    workers: int = 2,
    devices: int | None = None,
    demand: dict[str, float] | None = None,
) -> Plan:
    task = Task("j1", workers, 0, 0.5, 40, devices=(devices or 0) / 4, demand=demand or {})
    return Plan("w0", "worker", epoch, 10.0, 0.5, False,
                SlotPlan(slot, starts, [task]), SlotPlan(slot + 1, starts + 10.0, []),
                devices=devices)  # fmt: skip


def _asdict_payload(p: Plan, *omit: str) -> bytes:
    """``p`` as asdict gives it, but ``omit`` and what a slot plan never encodes (the
    count of entries an agent left out, and its error)."""
    body = {k: v for k, v in dataclasses.asdict(p).items() if k not in omit}
    for slot in ("current", "next"):
        del body[slot]["refused"], body[slot]["refused_error"]
    return json.dumps({"version": 1, **body}, separators=(",", ":")).encode()


def test_payloads_round_trip_and_bad_ones_name_the_field() -> None:
    p = plan(7, devices=4, demand={"gpu": 1, "cpu": 4, "mem": 8.5})
    assert Plan.parse(p.to_bytes()) == p
    # the hand-built payload is asdict's, byte for byte (a whole plan's without its part;
    # a window not said is left out as well; every task field given)
    assert p.to_bytes() == _asdict_payload(p, "part", "parts", "window")
    windowed = dataclasses.replace(p, window=24)
    assert windowed.to_bytes() == _asdict_payload(windowed, "part", "parts")
    # without devices, as an older daemon's: none of the two fields in the payload
    bare = plan(7)
    assert b"devices" not in bare.to_bytes() and Plan.parse(bare.to_bytes()) == bare
    none = plan(7, devices=0)  # a server without GPUs: said (its workers see none)
    assert b'"devices":0}' in none.to_bytes() and Plan.parse(none.to_bytes()) == none
    for bad, why in ((b'"devices":-1', "plan.devices: must be >= 0"),
                     (b'"devices":1025', "plan.devices: must be below 1025"),
                     (b'"devices":1.5', "plan.devices: must be an integer")):  # fmt: skip
        with pytest.raises(SpecError, match=re.escape(why)):
            Plan.parse(bare.to_bytes()[:-1] + b"," + bad + b"}")
    for bad, why in ((b'"devices":-0.5', "must be >= 0"), (b'"devices":"1"', "must be a number"),
                     (b'"devices":2000', "must be at most 1024")):  # fmt: skip
        # the entry is left out alone, its error kept (tests/test_plan_tasks.py)
        left = Plan.parse(bare.to_bytes().replace(b'"run":""', b'"run":"",' + bad, 1))
        assert left.current.tasks == [] and left.current.refused == 1
        assert left.current.refused_error.startswith("plan.current.tasks[0].devices: " + why)
    beat = Heartbeat("w0", "s1", 7)
    assert Heartbeat.parse(beat.to_bytes()) == beat
    assert b"sent_at" not in beat.to_bytes()  # as an older agent sends it
    timed = Heartbeat("w0", "s1", 7, sent_at=1.7e9 + 0.25)
    assert Heartbeat.parse(timed.to_bytes()) == timed
    for bad in (b'"x"', b"1e999", b"true"):
        with pytest.raises(SpecError, match=re.escape("heartbeat.sent_at")):
            Heartbeat.parse(
                b'{"version": 1, "server": "w0", "session": "s", "sent_at": ' + bad + b"}"
            )
    prog = Progress("w0", "s1", [TaskProgress("j1", 3.5, 2.0)])
    assert Progress.parse(prog.to_bytes()) == prog
    with pytest.raises(SpecError, match=re.escape("plan.version")):
        Plan.parse(b'{"version": 3}')  # 2: a part of a plan in parts
    # a bad entry is left out, named; the report's other entries stand
    bad = (b'"jobs": [{"job": "j", "minibatches": -1, "worker_seconds": 0}, {"job": "k", '
           b'"minibatches": 1e309, "worker_seconds": 0}, {"job": "ok", "minibatches": 2, '
           b'"worker_seconds": 3}, 7, {"job": "m", "minibatches": 1, '
           b'"worker_seconds": 1e300}]}')  # fmt: skip
    mixed = Progress.parse(b'{"version": 1, "server": "w0", "session": "s", ' + bad)
    assert mixed.jobs == [TaskProgress("ok", 2.0, 3.0)]
    assert [r.split(":")[0] for r in mixed.refused] == [
        "progress.jobs[0].minibatches",
        "progress.jobs[1].minibatches",
        "progress.jobs[3]",
        "progress.jobs[4].worker_seconds",  # finite, over 2**53: sums of them overflowed
    ]
    assert b"refused" not in mixed.to_bytes()
    with pytest.raises(SpecError, match=re.escape("progress.session")):
        Progress.parse(b'{"version": 1, "server": "w0", "session": 5, "jobs": []}')
    # strings the daemon keeps after the message (a job it does not know, a session it
    # ignores) are bounded, not only the payload: as long as a job's key, and a session
    long_job = {"job": "j" * (MAX_JOB_KEY_CHARS + 1), "minibatches": 1, "worker_seconds": 1}
    report = {"version": 1, "server": "w0", "session": "s", "jobs": [long_job]}
    assert Progress.parse(json.dumps(report)).refused == [
        "progress.jobs[0].job: 330 characters, longer than any job's (329)"
    ]
    report["jobs"] = [{**long_job, "job": "j" * MAX_JOB_KEY_CHARS}]
    assert Progress.parse(json.dumps(report)).jobs[0].job == "j" * MAX_JOB_KEY_CHARS
    for parse, what in ((Heartbeat.parse, "heartbeat"), (Progress.parse, "progress")):
        long_session = {"version": 1, "server": "w0", "session": "s" * 129, "jobs": []}
        with pytest.raises(SpecError, match=re.escape(f"{what}.session: 129 characters, over 128")):
            parse(json.dumps(long_session))
    with pytest.raises(SpecError, match="heartbeat: not JSON"):
        Heartbeat.parse(b"{")
    # not text: a UTF-8-encoded surrogate (json.loads(bytes) took it), a lone escaped
    # one; an escaped pair is text (an emoji)
    for session in (b"sur\xed\xa0\x80", b"sur\\ud800"):
        with pytest.raises(SpecError, match="heartbeat: not JSON"):
            Heartbeat.parse(b'{"version": 1, "server": "w0", "session": "' + session + b'"}')
    smile = Heartbeat.parse(b'{"version": 1, "server": "w0", "session": "\\ud83d\\ude00"}')
    assert smile.session == "\U0001f600"
    t = Topics("oasis")
    assert t.plan("w0") == "oasis/v1/servers/w0/plan"
    assert t.all_progress == "oasis/v1/agents/+/progress"


def test_agent_ignores_stale_plans_and_simulates_at_its_speed() -> None:
    now = [100.0]
    agent = Agent("w0", MqttConfig("localhost"), speed=2.0, wall=lambda: now[0])
    assert agent.accept(plan(3))
    assert not agent.accept(plan(2))  # stale: an older epoch
    assert agent.plan is not None and agent.plan.epoch == 3
    agent.step(1.0)  # 2 workers, 0.5 s per mini-batch, twice as fast: 8 per second
    state = agent.tasks["j1"]
    assert state.minibatches == pytest.approx(8.0) and state.worker_seconds == pytest.approx(2)
    agent.step(100.0)
    assert state.minibatches == 40  # never more than the job has
    now[0] = 111.0  # the next slot began: its plan (nothing for j1) is followed
    agent.step(1.0)
    assert state.worker_seconds == pytest.approx(202.0)
    report = agent.progress()
    assert report is not None and report.jobs == [TaskProgress("j1", 40.0, 202.0)]
    assert not agent.accept(Plan("w9", "worker", 9, 10.0, 0.5, False, SlotPlan(1, 0.0),
                                 SlotPlan(2, 10.0)))  # another server's plan  # fmt: skip


def test_agent_command_mode_counts_what_each_worker_prints() -> None:
    import asyncio

    now = [100.0]
    # a count that is not finite, or past 2**53, is no count: the daemon would drop the
    # server's whole report for it, every other tenant's progress on the server with it;
    # a line over the pipe's 64 KiB limit is skipped (it ended the reading before)
    long_line = 'head -c 100000 /dev/zero | tr "\\000" x; echo'
    command = (f'echo 1; {long_line}; echo 2; echo "$OASIS_JOB"; echo inf; echo nan; '
               'echo 1e300; echo 3; sleep 30')  # fmt: skip
    agent = Agent("w0", MqttConfig("localhost"), command=command, wall=lambda: now[0])
    agent.accept(plan(1, workers=2))

    async def go() -> None:
        await agent._commands(0.0)  # starts one command per worker
        for _ in range(200):
            await asyncio.sleep(0.02)
            await agent._commands(0.02)
            if agent.tasks["j1"].minibatches >= 6:
                break
        now[0] = 111.0  # the next slot has no task: the commands are stopped
        await agent._commands(0.02)
        assert agent.commands is not None and not agent.tasks["j1"].workers.running
        procs = [w.proc for w in agent.commands.departing]
        assert len(procs) == 2
        await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), 10)
        for _ in range(200):  # reaped once their output is read to its end
            await agent._commands(0.02)
            if not agent.commands.departing:
                break
            await asyncio.sleep(0.02)

    asyncio.run(go())
    state = agent.tasks["j1"]
    assert state.minibatches == 6  # 3 from each of the 2 workers; "j1", inf, ... no count
    assert state.workers.done_before == 6 and agent.commands is not None
    assert not agent.commands.departing and not agent.commands.live


# -- the agent when its plan runs out; the daemon side of progress (no broker) ------------


def test_agent_stops_when_its_last_planned_slot_ends_and_resumes_with_a_new_plan() -> None:
    now = [100.0]
    agent = Agent("w0", MqttConfig("localhost"), wall=lambda: now[0])
    task = Task("j1", 1, 0, minibatch_seconds=1.0, minibatches=1000)
    first = Plan("w0", "worker", 1, 10.0, 0.5, False,
                 SlotPlan(5, 100.0, [task]), SlotPlan(6, 110.0, [task]))  # fmt: skip
    agent.accept(first)
    now[0] = 119.0  # in slot 6, the last one planned: runs
    agent.step(1.0)
    assert agent.tasks["j1"].worker_seconds == pytest.approx(1.0)
    now[0] = 120.0  # slot 6 has ended and no newer plan came (a broker outage): idle
    assert agent.active() is None
    agent.step(1.0)
    now[0] = 500.0
    agent.step(1.0)
    assert agent.tasks["j1"].worker_seconds == pytest.approx(1.0)
    # a new plan (its own slot length: 20 s) sets it going again, until its end
    second = Plan("w0", "worker", 2, 20.0, 0.5, False,
                  SlotPlan(25, 500.0, [task]), SlotPlan(26, 520.0, []))  # fmt: skip
    assert agent.accept(second)
    agent.step(1.0)
    assert agent.tasks["j1"].worker_seconds == pytest.approx(2.0)
    now[0] = 539.9  # slot 26 runs until 540 by the plan's slot length, not the old one's
    assert agent.active() == second.next
    now[0] = 540.0
    assert agent.active() is None


class PlaneDaemon:
    """The admission controller in-process (SQLite, a fake clock at slot 0) with the
    execution plane's daemon side on a fake monotonic clock; nothing on the event loop."""

    SPEC: dict[str, Any] = {  # noqa: RUF012
        "epochs": 1, "chunks": 2, "minibatches": 10, "tau": 0.05, "grad_mb": 1,
        "worker": {"gpu": 1, "bandwidth": 1}, "ps": {"bandwidth": 1},
        "utility": {"kind": "sigmoid", "priority": 50, "decay": 0.5, "target": 3},
    }  # fmt: skip
    TOTAL = 20  # mini-batches: epochs * chunks * minibatches

    def __init__(
        self, tmp: Path, cluster: dict[str, Any] | None = None, limits: dict[str, Any] | None = None
    ) -> None:
        import structlog

        from controller.admission import AdmissionController
        from controller.clock import FakeClock, SlotClock
        from controller.plane.execution import Execution
        from controller.store import Database

        data = {"daemon": {"data_dir": str(tmp), "window": 6, "epoch": 0},
                "cluster": cluster or CLUSTER, "limits": limits or {}}  # fmt: skip
        self.config = from_dict(data)
        self.clock = FakeClock(1.0)
        self.c = AdmissionController(
            self.config,
            Database(self.config.database_url),
            SlotClock(self.clock, self.config.slot_seconds, 0.0),
            log=structlog.wrap_logger(structlog.ReturnLogger()),
        )
        self.c.open()
        self.mono = [0.0]
        self.ex = Execution(self.c, MqttConfig("localhost"), monotonic=lambda: self.mono[0])
        self.ex.load()

    def submit(self, job_id: str) -> Any:
        import asyncio

        view = asyncio.run(self.c.submit({"id": job_id, **self.SPEC}))
        assert view.decision.admitted
        return view

    def stored(self, job_id: str) -> Any:
        from controller.store import ProgressRow

        with self.c.db.session() as session:
            row = session.get(ProgressRow, job_id)
            return None if row is None else (row.minibatches, dict(row.per_server))

    def state(self, job_id: str) -> str:
        from controller.store import JobRow

        with self.c.db.session() as session:
            row = session.get(JobRow, job_id)
            assert row is not None
            return row.state


def every_agent_heard(plane: PlaneDaemon) -> None:
    """A heartbeat from every server's agent, taken in: each is heard (kept in the store
    at the review), so a job nobody reports on completes with its plan."""
    for server in plane.ex.server_index:
        plane.ex.heartbeat(Heartbeat(server, "a"))
    plane.ex.review_sync()
    assert plane.ex.heard == set(plane.ex.server_index)


@pytest.fixture
def plane(tmp_path: Path) -> Any:
    daemon = PlaneDaemon(tmp_path)
    try:
        yield daemon
    finally:
        daemon.c.close()


def test_an_agents_clock_off_the_daemons_is_said_once_and_so_is_its_return(
    plane: PlaneDaemon,
) -> None:
    """Left from the time audit: an agent follows the next slot's plan from its start by
    its own clock, so one whose clock is off the head node's ran every slot's plan that
    much early or late, and nothing said so. Its heartbeats now carry its clock."""
    from structlog.testing import capture_logs

    ex, now = plane.ex, plane.clock.now()
    with capture_logs() as logs:
        ex.heartbeat(Heartbeat("w0", "a", sent_at=now + 3.0))  # within 10 s: nothing
        ex.heartbeat(Heartbeat("w0", "a", sent_at=now + 30.0))  # ahead: said
        ex.heartbeat(Heartbeat("w0", "a", sent_at=now + 31.0))  # still: not again
        ex.heartbeat(Heartbeat("p0", "a", sent_at=now - 12.0))  # behind
        ex.heartbeat(Heartbeat("w0", "a", sent_at=now + 7.0))  # not back yet (5 s)
        ex.heartbeat(Heartbeat("w0", "a", sent_at=now + 1.0))  # back
        ex.heartbeat(Heartbeat("p0", "a"))  # an older agent says nothing of its clock
    said = [
        (e["log_level"], e["server"], e["offset_seconds"]) for e in logs if "clock" in e["event"]
    ]
    assert said == [("warning", "w0", 30.0), ("warning", "p0", -12.0), ("info", "w0", 1.0)]
    assert "30.0 s early" in logs[0]["event"] and "12.0 s late" in logs[1]["event"]
    assert ex.agents.clock_offsets == {"w0": 1.0, "p0": -12.0}
    with capture_logs() as logs:  # a forged sent_at: not its 301 digits in the line
        ex.heartbeat(Heartbeat("w0", "a", sent_at=1e300))
        ex.heartbeat(Heartbeat("p0", "a", sent_at=now - 0.04))  # back, then a long way off
        ex.heartbeat(Heartbeat("p0", "a", sent_at=now - 3 * 86400 - 4 * 3600))
    [back] = [e["offset_seconds"] for e in logs if e["log_level"] == "info"]
    assert str(back) == "0.0", back  # -0.04 s was said as "-0.0" (the plane audit)
    far = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert "plan 1.157e+295d early;" in far[0] and len(far[0]) < 200, far
    assert "plan 3d4h late;" in far[1], far
    ex.heartbeat(Heartbeat("w0", "a", sent_at=now + 1.0))
    ex.heartbeat(Heartbeat("p0", "a", sent_at=now - 12.0))
    assert ex.store_id and all(plan.store == ex.store_id for plan in ex.plans_sync({}))
    # and /metrics gives each server's offset, for an alert
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from controller.metrics import Metrics

    plane.c.execution = ex
    text = generate_latest(Metrics(plane.c).registry).decode()
    (family,) = [f for f in text_string_to_metric_families(text)
                 if f.name == "oasis_agent_clock_offset_seconds"]  # fmt: skip
    assert {s.labels["server"]: s.value for s in family.samples} == {"w0": 1.0, "p0": -12.0}


def test_an_agents_clock_flapping_across_the_bound_is_not_a_line_a_beat(
    plane: PlaneDaemon,
) -> None:
    """Every crossing of the clock bounds was said: an agent whose beats alternated
    between 30 s ahead and in step (a clock stepped back and forth, or a forger on its
    own topic) wrote a line with every beat, 20 a second at its rate, where every other
    complaint about an agent is said at most every 10 s. Now a server's clock lines are
    at most CLOCK_LINES a minute; the state they hold back is said once the minute is
    over, with how many crossings there were."""
    from structlog.testing import capture_logs

    from controller.plane.agent_sessions import CLOCK_LINES, CLOCK_LINES_SECONDS

    ex, now = plane.ex, plane.clock.now()
    with capture_logs() as logs:
        for i in range(400):  # 20 s at 20 beats a second
            plane.mono[0] = i * 0.05
            ex.heartbeat(Heartbeat("w0", "a", sent_at=now + (30.0 if i % 2 == 0 else 1.0)))
        ex.heartbeat(Heartbeat("p0", "a", sent_at=now + 40.0))  # another server: said
    said = [(e["server"], e["offset_seconds"]) for e in logs if "clock" in e["event"]]
    assert said == [("w0", 30.0), ("w0", 1.0), ("w0", 30.0), ("p0", 40.0)], said
    assert CLOCK_LINES == 3
    with capture_logs() as logs:
        plane.mono[0] = CLOCK_LINES_SECONDS + 1.0  # the minute over, w0 in step now
        ex.heartbeat(Heartbeat("w0", "a", sent_at=now + 1.0))
        ex.heartbeat(Heartbeat("w0", "a", sent_at=now + 1.0))
    back = [e for e in logs if "clock" in e["event"]]
    assert [(e["log_level"], e["offset_seconds"]) for e in back] == [("info", 1.0)], back
    assert back[0]["crossings"] == 397  # since the line before it
    assert ex.agents.clock_offsets["w0"] == 1.0


def test_metrics_give_each_agents_heartbeat_age_and_the_process(plane: PlaneDaemon) -> None:
    """The observability audit: a server whose agent never connected read as "up", and
    nothing gave a heartbeat's age, the daemon's memory or its descriptors."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from controller.metrics import Metrics

    ex = plane.ex
    plane.c.execution = ex
    metrics = Metrics(plane.c)

    def scrape() -> dict[str, dict[str, float]]:
        text = generate_latest(metrics.registry).decode()
        return {f.name: {s.labels.get("server", s.name): s.value for s in f.samples}
                for f in text_string_to_metric_families(text)}  # fmt: skip

    assert scrape()["oasis_agent_heartbeat_age_seconds"] == {"w0": math.inf, "p0": math.inf}
    ex.connected()
    plane.mono[0] = 5.0
    ex.heartbeat(Heartbeat("w0", "a"))
    ex._drain()
    plane.mono[0] = 12.0
    metrics = Metrics(plane.c)  # a fresh one: scrapes within SCRAPE_INTERVAL share a reading
    got = scrape()
    assert got["oasis_agent_heartbeat_age_seconds"] == {"w0": 7.0, "p0": math.inf}
    assert got["process_resident_memory_bytes"]["process_resident_memory_bytes"] > 0
    assert got["process_open_fds"]["process_open_fds"] > 0


def test_list_servers_says_when_each_agent_was_last_heard(plane: PlaneDaemon) -> None:
    """The operator audit: a server whose agent was never heard read "up" and got plans
    (the jobs there never ran), and only /metrics said so. ListServers now gives each
    agent's age as the metric does (the one source: Execution.agent_ages), +Inf never
    heard, unset with no agents watched; and the client says it in words."""
    import asyncio

    from controller import auth
    from controller.commands.records import agent_heard, agent_record, agents_unheard
    from controller.commands.records import unheard_line as _unheard_line
    from controller.commands.status import _unheard
    from controller.rpc import oasis_pb2 as pb
    from controller.servicer import ClusterServicer

    async def listed() -> Any:
        auth._caller.set(auth.ANONYMOUS)  # as the access interceptor does
        return await ClusterServicer(plane.c).ListServers(pb.ListServersRequest(), None)

    answer = asyncio.run(listed())  # no execution plane: nothing said of agents
    assert not any(s.HasField("agent_heard_seconds_ago") for s in answer.servers)
    assert not answer.HasField("agent_heartbeat_timeout_seconds")
    assert [agent_heard(s) for s in answer.servers] == ["-", "-"]
    assert agent_record(answer.servers[0]) == {"agent_heard": None, "agent_heard_seconds_ago": None}
    assert agents_unheard(answer) is None and _unheard_line(_unheard(answer)) == []

    ex = plane.ex
    plane.c.execution = ex
    ex.connected()
    plane.mono[0] = 5.0
    ex.heartbeat(Heartbeat("w0", "a"))
    ex._drain()
    ex.disconnected()  # the broker away for a while: it does not count
    plane.mono[0] = 500.0
    ex.connected()
    plane.mono[0] = 507.0
    answer = asyncio.run(listed())
    by_name = {s.name: s for s in answer.servers}
    assert by_name["w0"].agent_heard_seconds_ago == 7.0 == ex.agent_ages()["w0"]
    assert by_name["p0"].agent_heard_seconds_ago == math.inf == ex.agent_ages()["p0"]
    assert answer.agent_heartbeat_timeout_seconds == ex.mqtt.heartbeat_timeout == 30.0
    assert [agent_heard(s) for s in answer.servers] == ["7s ago", "never"]
    assert agent_record(by_name["w0"]) == {"agent_heard": True, "agent_heard_seconds_ago": 7.0}
    assert agent_record(by_name["p0"]) == {"agent_heard": False, "agent_heard_seconds_ago": None}
    # oasis status names p0 (never heard), not w0 (heard within the timeout)
    assert [s.name for s in agents_unheard(answer) or []] == ["p0"]
    (line,) = _unheard_line(_unheard(answer))
    assert line == ("AGENTS NOT HEARD on 1 server up, still planned on (jobs there do not "
                    "run): p0 (never)")  # fmt: skip
    plane.mono[0] = 538.0  # w0 silent past the timeout (38 connected s), not yet failed
    answer = asyncio.run(listed())
    assert [s.name for s in agents_unheard(answer) or []] == ["w0", "p0"]
    assert ": w0 (38s ago), p0 (never)" in _unheard_line(_unheard(answer))[0]
    answer.servers[0].state = "failed"  # one out of service is no surprise: not named
    answer.servers[1].state = "cordoned"
    assert agents_unheard(answer) == []
    # at most UNHEARD_NAMED names, then a count; a long silence in its two largest units
    many = pb.ListServersResponse(agent_heartbeat_timeout_seconds=30.0)
    for i in range(13):
        many.servers.add(name=f"n{i}", state="up", agent_heard_seconds_ago=math.inf)
    many.servers[0].agent_heard_seconds_ago = 2 * 86400 + 3 * 3600 + 59 * 60 + 59
    many.servers[1].agent_heard_seconds_ago = 2 * 3600 + 5 * 60 + 29
    (line,) = _unheard_line(_unheard(many))
    assert line.startswith("AGENTS NOT HEARD on 13 servers up, still planned on ")
    assert ": n0 (2d4h ago), n1 (2h5m ago), n2 (never), " in line
    assert line.endswith(", n9 (never) and 3 more")


def test_agents_following_another_stores_daemon_are_said_and_counted(
    plane: PlaneDaemon,
) -> None:
    """The restore audit: a second daemon on another store under the same broker (a
    move to PostgreSQL with the old one still up) and the first took turns driving the
    agents, with a warning that did not tell it from a restored backup. Plans and
    heartbeats now name the store, and a heartbeat of another store's plans is said with
    both stores and counted on /metrics. The daemon still moves above them (the store
    may have been replaced, its daemon gone: tests/test_mqtt_plane.py)."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from structlog.testing import capture_logs

    from controller.metrics import Metrics

    ex = plane.ex
    mine = ex.store_id
    assert len(mine) == 16
    with capture_logs() as logs:
        assert not ex.heartbeat(Heartbeat("w0", "a", 40, store="0123456789abcdef"))
    assert ex.agents.foreign == {"w0": "0123456789abcdef"}
    said = [e for e in logs if "another store" in e["event"]]
    assert said and said[0]["store"] == "0123456789abcdef" and said[0]["this_store"] == mine
    plane.c.execution = ex
    text = generate_latest(Metrics(plane.c).registry).decode()
    (family,) = [f for f in text_string_to_metric_families(text)
                 if f.name == "oasis_agents_following_another_store"]  # fmt: skip
    assert family.samples[0].value == 1
    plane.mono[0] += ex.mqtt.heartbeat_seconds
    assert ex.heartbeat(Heartbeat("w0", "a", 40, store="0123456789abcdef"))  # a round, as before
    ex.heartbeat(Heartbeat("w0", "a", ex.epoch, store=mine))  # its own plans again
    assert ex.agents.foreign == {}
    assert Heartbeat.parse(Heartbeat("w0", "a", 7, store=mine).to_bytes()).store == mine
    assert b"store" not in Heartbeat("w0", "a", 7).to_bytes()
    # an agent of another store that falls silent: failed, and no longer counted
    ex.connected()
    ex.heartbeat(Heartbeat("p0", "a", 0, store="0123456789abcdef"))
    assert ex.agents.foreign == {"p0": "0123456789abcdef"}
    ex.review_sync()
    plane.mono[0] += 10 * ex.mqtt.heartbeat_timeout
    ex.review_sync()
    assert "p0" in ex.failed and ex.agents.foreign == {}


def test_a_long_step_shows_on_metrics_and_the_ledgers_are_served_as_last_read(
    plane: PlaneDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The observability audit: while one step held the decision thread (a cordon of a
    tenant's 2,440 jobs: four minutes), each scrape waited 10 s for it, then left the
    slot, servers, utilisation and prices out without a word."""
    import threading

    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    import controller.metrics as metrics_module
    from controller.metrics import Metrics

    def scrape() -> dict[str, float]:
        text = generate_latest(Metrics(plane.c).registry).decode()
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}

    monkeypatch.setattr(metrics_module, "SCRAPE_INTERVAL", 0.0)
    metrics = Metrics(plane.c)
    first = {s.name: s.value for f in text_string_to_metric_families(
        generate_latest(metrics.registry).decode()) for s in f.samples}  # fmt: skip
    assert first["oasis_decision_step_seconds"] == 0.0 and "oasis_slot" in first
    assert first["oasis_ledger_metrics_age_seconds"] >= 0.0
    release, entered = threading.Event(), threading.Event()

    def long_step() -> None:
        entered.set()
        release.wait(30)

    held = plane.c._decisions.submit("ops", long_step)
    try:
        assert entered.wait(10)
        monkeypatch.setattr(metrics_module, "BUSY_SECONDS", 0.0)
        calls: list[object] = []
        monkeypatch.setattr(plane.c, "between_decisions", lambda *a: calls.append(a))
        got = {s.name: s.value for f in text_string_to_metric_families(
            generate_latest(metrics.registry).decode()) for s in f.samples}  # fmt: skip
        assert calls == []  # not waited for
        assert got["oasis_decision_step_seconds"] > 0.0
        assert got["oasis_slot"] == first["oasis_slot"]  # as last read
        assert got["oasis_ledger_metrics_age_seconds"] >= 0.0
        assert "oasis_slot" not in scrape()  # a collector that never read it: none to give
    finally:
        release.set()
        held.result(30)


def test_reports_are_only_queued_on_the_event_loop_and_applied_in_the_decision_thread(
    plane: PlaneDaemon,
) -> None:
    plane.submit("j")
    ex = plane.ex
    ex.connected()
    plane.mono[0] = 5.0  # received at 5 s ...
    ex.heartbeat(Heartbeat("p0", "a"))
    ex.report(Progress("w0", "a", [TaskProgress("j", 3.0, 40.0)]))
    ex.report(Progress("w9", "a", [TaskProgress("j", 1.0, 1.0)]))  # not a server of ours
    # nothing the decision thread reads has changed: it iterates these between decisions
    assert ex.last_seen == {} and ex.progress == {} and ex.review.pending == set()
    plane.mono[0] = 7.0  # ... applied at 7 s, as received at 5 s
    assert ex.review_sync() == []
    assert ex.last_seen == {"p0": 5.0, "w0": 5.0}
    assert ex.progress["j"].sessions == {"w0/a": [3.0, 40.0]}
    assert plane.stored("j") == (3.0, {"w0/a": [3.0, 40.0]})
    # the API's view: its estimate is of the whole job's worker-seconds
    from controller.plane.progress import LEVEL
    from pricing.runtime_estimate import RuntimePrior, fit

    view = ex.view_sync("j")
    post = fit(np.array([3.0]), np.array([40.0]), RuntimePrior(view.planned_minibatch_seconds))
    assert view.total_worker_seconds == post.seconds_at(PlaneDaemon.TOTAL, LEVEL)
    assert (view.minibatches_done, view.minibatches_total, view.reports) == (3.0, 20, 1)


def test_counts_of_another_admission_of_the_same_id_count_for_nothing(
    plane: PlaneDaemon,
) -> None:
    """The restore audit: a job submitted again under the id of one lost with a restored
    store took the lost one's counts (46.6% done before its first slot), and completed
    with about half its work. Plans carry each admission's run, and the daemon drops
    report entries of another run; entries without one (older agents) count as before."""
    from controller.plane.execution import run_of

    plane.submit("j")
    ex = plane.ex
    plans = ex.plans_sync({})
    (run,) = {t.run for p in plans for sl in (p.current, p.next) for t in sl.tasks}
    with plane.c.db.session() as session:
        from controller.store import JobRow

        row = session.get(JobRow, "j")
        assert row is not None and run == run_of(row.decided_at) and run
    # PostgreSQL gives the time in its session's zone (PGTZ): the same run (the review)
    from datetime import UTC, datetime, timedelta, timezone

    at = datetime(2026, 11, 29, 13, 8, 26, 638598)
    tokyo = at.replace(tzinfo=UTC).astimezone(timezone(timedelta(hours=9)))
    assert run_of(at) == run_of(tokyo) == run_of(at.replace(tzinfo=UTC)) == "20261129T130826.638598"
    ex.connected()
    plane.mono[0] = 5.0
    ex.report(Progress("w0", "a", [TaskProgress("j", 9.0, 90.0, run="20200101T000000.000000")]))
    assert ex.review_sync() == []
    assert "j" not in ex.progress  # another admission's: nothing counted
    ex.report(Progress("w0", "a", [TaskProgress("j", 3.0, 40.0, run=run)]))
    ex.report(Progress("w0", "b", [TaskProgress("j", 1.0, 10.0)]))  # an older agent
    assert ex.review_sync() == []
    assert ex.progress["j"].sessions == {"w0/a": [3.0, 40.0], "w0/b": [1.0, 10.0]}


def test_an_agents_counts_of_an_id_start_afresh_for_another_admission() -> None:
    """The agent's side: a plan bringing a job id back with another run drops the
    counts it kept for the id (set aside idle, or still followed), and reports the new
    run's own."""
    now = [100.0]
    agent = Agent("w0", MqttConfig("localhost"), wall=lambda: now[0])

    def plan_of(epoch: int, run: str) -> Plan:
        task = Task("j1", 2, 0, minibatch_seconds=0.5, minibatches=1000, run=run)
        return Plan("w0", "worker", epoch, 10.0, 0.5, False, SlotPlan(10, 100.0, [task]),
                    SlotPlan(11, 110.0, [task]))  # fmt: skip

    agent.accept(plan_of(1, "r1"))
    agent.step(1.0)
    assert agent.tasks["j1"].minibatches == pytest.approx(4.0)
    report = agent.progress()
    assert report is not None and report.jobs == [TaskProgress("j1", 4.0, 2.0, "r1")]
    agent.accept(plan_of(2, "r1"))  # the same admission: carried on
    agent.step(1.0)
    assert agent.tasks["j1"].minibatches == pytest.approx(8.0)
    agent.accept(plan_of(3, "r2"))  # the id admitted again: afresh
    agent.step(1.0)
    assert agent.tasks["j1"].minibatches == pytest.approx(4.0)
    assert agent.tasks["j1"].run == "r2"
    # set aside idle, then brought back by a plan of yet another run: afresh too
    agent._idle.put("j1", agent.tasks.pop("j1").minibatches, 2.0, "r2")
    agent.accept(plan_of(4, "r3"))
    agent.step(1.0)
    assert agent.tasks["j1"].minibatches == pytest.approx(4.0)
    # ... but of the same run, carried on
    agent._idle.put("j1", agent.tasks.pop("j1").minibatches, 2.0, "r3")
    agent.accept(plan_of(5, "r3"))
    agent.step(1.0)
    assert agent.tasks["j1"].minibatches == pytest.approx(8.0)


def test_progress_stays_dirty_until_a_commit_and_ended_jobs_are_forgotten_then_merged(
    plane: PlaneDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    import contextlib
    from collections.abc import Iterator

    from sqlalchemy import event as sqlalchemy_event
    from sqlalchemy.orm import Session

    from controller.store import ProgressRow, StoreUnavailableError

    plane.submit("j")
    ex = plane.ex
    real = plane.c.db.session
    wrote: list[str] = []  # statements writing progress, in the session below

    def progress_written(_c: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith(("INSERT", "UPDATE")) and (
            ProgressRow.__tablename__ in statement
        ):
            wrote.append(statement)

    sqlalchemy_event.listen(plane.c.db.engine, "before_cursor_execute", progress_written)

    @contextlib.contextmanager
    def progress_commit_fails() -> Iterator[Session]:
        wrote.clear()
        with real() as session:
            yield session
            if wrote:  # written, not committed
                raise StoreUnavailableError("store down")  # rolls the transaction back

    ex.report(Progress("w0", "a", [TaskProgress("j", 3.0, 40.0)]))
    monkeypatch.setattr(plane.c.db, "session", progress_commit_fails)
    with pytest.raises(StoreUnavailableError):
        ex.review_sync()
    monkeypatch.setattr(plane.c.db, "session", real)
    assert plane.stored("j") is None and ex.progress["j"].dirty
    ex.review_sync()  # no new report: what failed to commit is written now
    assert plane.stored("j") == (3.0, {"w0/a": [3.0, 40.0]}) and not ex.progress["j"].dirty

    # in its first slot, two sessions (an agent restarted) finish the job: done early,
    # progress stored
    plane.clock.advance(plane.config.slot_seconds)
    ex.report(Progress("w0", "a", [TaskProgress("j", 15.0, 200.0)]))
    ex.report(Progress("w0", "b", [TaskProgress("j", 5.0, 60.0)]))
    assert [e.kind for e in ex.review_sync()] == ["completed"]
    final = (20.0, {"w0/a": [15.0, 200.0], "w0/b": [5.0, 60.0]})
    assert plane.state("j") == "completed" and plane.stored("j") == final
    plane.clock.advance(plane.config.slot_seconds)  # a new slot: ended jobs are forgotten
    ex.review_sync()
    assert "j" not in ex.progress and "j" not in ex.jobs.cache and "j" not in ex.review.reviewed
    view = ex.view_sync("j")  # read from the store now
    assert (view.minibatches_done, view.worker_seconds, view.reports) == (20.0, 260.0, 3)

    # an agent reconnects and resends one session, and a stale report of the other says
    # less than the store holds: merged with the store, neither overwriting nor lowering it
    ex.report(Progress("w0", "a", [TaskProgress("j", 15.0, 200.0)]))
    ex.report(Progress("w0", "b", [TaskProgress("j", 2.0, 30.0)]))
    assert ex.view_sync("j").minibatches_done == 20.0
    assert ex.review_sync() == []
    assert plane.stored("j") == final
    # a restart loads the progress of active jobs only: an ended one's stays in the store
    from controller.plane.execution import Execution

    restarted = Execution(plane.c, MqttConfig("localhost"), monotonic=lambda: plane.mono[0])
    restarted.load()
    assert "j" not in restarted.progress and restarted.view_sync("j").minibatches_done == 20.0


def test_progress_of_a_job_the_store_no_longer_holds_is_dropped_and_the_rest_written(
    plane: PlaneDaemon,
) -> None:
    """A job's entry whose row is gone from the store (retention deleted it while its
    counts waited for the review) is dropped, not inserted: its row would refer to no
    job, and the store refusing it would fail every review's write of every other job's
    counts too."""
    from controller.plane.progress import JobProgress, flush

    plane.submit("j")
    ex = plane.ex
    ex.report(Progress("w0", "a", [TaskProgress("j", 3.0, 40.0)]))
    ex.progress["gone"] = JobProgress({"w0/a": [5.0, 50.0]}, [(5.0, 50.0)], dirty=True)
    assert ex.review_sync() == []
    assert plane.stored("j") == (3.0, {"w0/a": [3.0, 40.0]}) and plane.stored("gone") is None
    assert "gone" not in ex.progress and not ex.progress["j"].dirty
    flush(ex.progress, plane.c._write)  # nothing dirty: nothing written, nothing dropped
    assert list(ex.progress) == ["j"]


def test_a_job_completes_only_once_its_agents_report_all_of_its_work(plane: PlaneDaemon) -> None:
    """Reports short of ``E * N * M`` mini-batches, by one or by half, leave the job
    running with its plan; the report of the last one completes it, its slots from the
    next one on released in the store (the mutation audit: a completion at half the
    work, or one that kept the next slot's rows, passed every test of this file)."""
    import asyncio

    from sqlalchemy import select

    from controller.store import AllocationRow

    spec = {**PlaneDaemon.SPEC, "id": "j", "minibatches": 40}  # 80: planned in slots 1-3
    assert asyncio.run(plane.c.submit(spec)).decision.admitted
    total = 80
    ex = plane.ex
    plane.clock.advance(plane.config.slot_seconds)  # its first slot
    for minibatches in (total / 2, float(total - 1)):
        ex.report(Progress("w0", "a", [TaskProgress("j", minibatches, 10.0 * minibatches)]))
        assert [e.kind for e in ex.review_sync()] == []
        assert plane.state("j") in ("admitted", "running")
    ledger, s = plane.c._ledger, plane.c.slot
    rest = ledger.schedule("j").after(s + 1).work()  # planned from the next slot on
    assert rest > 0 and ledger.schedule("j").after(s).before(s + 1).work() > 0
    ex.report(Progress("w0", "b", [TaskProgress("j", 1.0, 10.0)]))  # the last one
    [done] = ex.review_sync()
    assert done.kind == "completed" and done.detail["released_worker_slots"] == rest
    assert plane.state("j") == "completed"
    with plane.c.db.session() as session:
        kept = set(session.scalars(select(AllocationRow.slot).where(AllocationRow.job_id == "j")))
    assert kept == {plane.c.slot}
    # the ledger as the store: the current slot kept, every later one free for others
    assert ledger.schedule("j").after(s + 1).work() == 0
    assert ledger.schedule("j").after(s).before(s + 1).work() > 0


def test_a_job_behind_its_plan_is_reported_in_its_real_state(plane: PlaneDaemon) -> None:
    from controller.plane.progress import LEVEL, MIN_SAMPLES
    from pricing.runtime_estimate import RuntimePrior, fit

    plane.submit("slow")  # admitted; its first slot has not begun
    ex = plane.ex
    # two hours per mini-batch, 40 times the plan: the 12 left on its 2 workers take 12
    # slots, past the window of 6, hopeless at any prices
    for i in range(1, MIN_SAMPLES):  # too few reports to judge its pace by
        ex.report(Progress("w0", "a", [TaskProgress("slow", float(i), i * 7200.0)]))
    assert ex.review_sync() == []
    i = MIN_SAMPLES  # the report that makes enough
    ex.report(Progress("w0", "a", [TaskProgress("slow", float(i), i * 7200.0)]))
    events = ex.review_sync()
    assert [(e.kind, e.state) for e in events] == [("behind", "admitted")]
    assert plane.state("slow") == "admitted"
    # the work its re-plan asks for: the estimate's worker-seconds past those spent, in
    # whole slots, rounded up (slot 0 holds none of its workers)
    job = ex.review.jobs.get("slow")
    xs = np.arange(1.0, MIN_SAMPLES + 1)
    prior = RuntimePrior(job.minibatch_slots * plane.config.slot_seconds)
    need = fit(xs, xs * 7200.0, prior).seconds_at(job.total_minibatches, LEVEL)
    slots = (need.mean - MIN_SAMPLES * 7200.0) / plane.config.slot_seconds
    assert events[0].detail["work"] == math.ceil(slots) > slots, (events[0].detail, slots)


def test_a_job_whose_optimistic_estimate_fits_its_plan_is_left_alone(plane: PlaneDaemon) -> None:
    """A job three times slower than planned whose predictive interval's optimistic end
    still fits in what it spent and what its plan holds: no re-plan, no ``behind`` (a
    re-plan on the mean alone would move a job that may well finish in its plan, and
    take slots other tenants' jobs could have)."""
    from controller.plane.progress import LEVEL
    from pricing.runtime_estimate import RuntimePrior, fit

    plane.submit("j")  # arrives in slot 1; slot 0 holds none of its workers
    ex, s = plane.ex, plane.c.slot
    job = ex.review.jobs.get("j")
    planned_mb = job.minibatch_slots * plane.config.slot_seconds
    pace = 3.0 * planned_mb
    xs = np.arange(1.0, 5.0)  # MIN_SAMPLES reports
    need = fit(xs, xs * pace, RuntimePrior(planned_mb)).seconds_at(job.total_minibatches, LEVEL)
    held = plane.c._ledger.schedule("j").after(s + 1).work() * plane.config.slot_seconds
    spent = xs[-1] * pace
    assert need.low <= spent + held < need.mean  # the mean says short, the interval not
    for i in xs:
        ex.report(Progress("w0", "a", [TaskProgress("j", float(i), float(i * pace))]))
    assert ex.review_sync() == []
    assert "j" not in ex.review.reviewed and plane.state("j") == "admitted"


def test_a_running_jobs_current_slot_counts_once_in_what_its_plan_holds(
    plane: PlaneDaemon,
) -> None:
    """In its slot, a job's plan holds the rest of the current slot on its workers and
    its later slots: five times slower than planned, the optimistic estimate needs more
    than that, and the job is reviewed (counting the current slot whole as well as what
    is left of it hid that)."""
    import asyncio

    from controller.plane.progress import LEVEL, MIN_SAMPLES
    from pricing.runtime_estimate import RuntimePrior, fit

    plane.submit("j")
    plane.clock.advance(plane.config.slot_seconds)
    asyncio.run(plane.c.tick())
    ex, s, length = plane.ex, plane.c.slot, plane.config.slot_seconds
    job = ex.review.jobs.get("j")
    sched = plane.c._ledger.schedule("j")
    now_workers = int(sched.after(s).before(s + 1).workers.sum())
    assert s == job.arrival and now_workers > 0  # in its first slot
    held = sched.after(s + 1).work() * length + now_workers * plane.c.slots.seconds_to_next_slot()
    planned_mb = job.minibatch_slots * length
    pace = 5.0 * planned_mb
    xs = np.arange(1.0, MIN_SAMPLES + 1)
    need = fit(xs, xs * pace, RuntimePrior(planned_mb)).seconds_at(job.total_minibatches, LEVEL)
    spent = xs[-1] * pace
    assert spent + held < need.low <= spent + held + now_workers * length
    for i in xs:
        ex.report(Progress("w0", "a", [TaskProgress("j", float(i), float(i * pace))]))
    events = ex.review_sync()
    assert [e.kind for e in events] in (["behind"], ["replanned"]), events
    assert ex.review.reviewed == {"j": s}
    # the work asked for: what the estimate needs past what was spent and what is left of
    # the current slot on its workers, in whole slots rounded up
    in_slot = now_workers * plane.c.slots.seconds_to_next_slot()
    slots = (need.mean - spent - in_slot) / length
    assert events[0].detail["work"] == max(1, math.ceil(slots)), (events[0].detail, slots)


def test_a_restarted_daemon_watches_the_servers_that_reported(plane: PlaneDaemon) -> None:
    """An agent that dies while the daemon is down is still declared failed: silence
    counts from the restart for every server whose reports the store holds."""
    from controller.plane.execution import Execution

    view = plane.submit("j")
    held = {a["server"] for a in view.decision.allocations if a.get("workers")}
    reporter = sorted(held)[0]
    plane.ex.report(Progress(reporter, "a", [TaskProgress("j", 3.0, 40.0)]))
    plane.ex.review_sync()

    restarted = Execution(plane.c, MqttConfig("localhost"), monotonic=lambda: plane.mono[0])
    restarted.load()
    restarted.connected()
    assert restarted.review_sync() == []
    plane.mono[0] += restarted.mqtt.heartbeat_timeout + 1.0
    failed = [e.detail["server"] for e in restarted.review_sync() if e.kind == "server_failed"]
    assert failed == [reporter]  # and no server that never reported

    # The on-call audit: restarted again, the failed server's agent read "never" heard
    # (oasis_agent_heartbeat_age_seconds +Inf, `oasis servers`: agent never), as for an
    # agent never installed; it counts from the start, as the others heard before do.
    again = Execution(plane.c, MqttConfig("localhost"), monotonic=lambda: plane.mono[0])
    again.load()
    again.connected()
    plane.mono[0] += 5.0
    ages = again.agent_ages()
    assert ages[reporter] == 5.0, ages
    assert all(math.isinf(a) for s, a in ages.items() if s != reporter), ages
    again.heartbeat(Heartbeat(reporter, "b"))  # back: recovers as before
    assert [e.kind for e in again.review_sync()] == ["server_recovered"]


def _both_heard(ex: Any) -> None:
    """The broker link up, and p0 and w0 heard from now on (reviewed)."""
    ex.connected()
    ex.heartbeat(Heartbeat("p0", "a"))
    ex.heartbeat(Heartbeat("w0", "a"))
    ex.review_sync()


def _seconds_until_a_failure(
    plane: PlaneDaemon, each_second: Callable[[float], None], until: float
) -> float | None:
    """Seconds, one review a second, until a server is declared failed (None: not within
    ``until``); ``each_second(t)`` runs before the review of second ``t``."""
    for second in range(1, int(until) + 1):
        plane.mono[0] += 1.0
        each_second(float(second))
        if any(e.kind == "server_failed" for e in plane.ex.review_sync()):
            return float(second)
    return None


RACK: dict[str, Any] = {
    "resources": ["gpu", "bandwidth"],
    "servers": [
        *({"name": f"w{i}", "kind": "worker", "capacity": {"gpu": 4, "bandwidth": 10}}
          for i in range(3)),
        {"name": "p0", "kind": "ps", "capacity": {"bandwidth": 10}},
    ],
}  # fmt: skip


@pytest.mark.parametrize(
    ("w1_last_beat", "w1_back_at", "expected"),
    [
        (3.0, None, {34.0: ["w0", "w1"]}),  # a rack: waited for, failed together
        (3.0, 32.0, {32.0: ["w0"]}),  # w1 heard again: w0 fails alone, then
        (10.0, None, {31.0: ["w0"], 41.0: ["w1"]}),  # too far apart: one by one
        (4.0, None, {35.0: ["w0", "w1"]}),  # 5 s apart: waited for, just
        (5.0, None, {35.0: ["w0"], 36.0: ["w1"]}),  # past one heartbeat interval: not
    ],
)
def test_servers_falling_silent_seconds_apart_fail_together(
    tmp_path: Path, w1_last_beat: float, w1_back_at: float | None, expected: dict[float, Any]
) -> None:
    """Agents of one rack that lost power beat last some seconds apart: the first past
    the timeout waits, at most one heartbeat interval (5 s), for the others that missed
    their beats as long, so they fail in one step and no job is moved onto one of them
    to be moved again. A server heard meanwhile, or silent far later, changes nothing
    of the timing."""
    plane = PlaneDaemon(tmp_path, RACK)
    try:
        ex = plane.ex
        assert (ex.mqtt.heartbeat_timeout, ex.mqtt.heartbeat_seconds) == (30.0, 5.0)
        ex.connected()
        failed: dict[float, Any] = {}
        for second in range(0, 50):
            t = float(second)
            plane.mono[0] = t
            beating = ["w2", "p0"]  # beat on throughout
            if t <= w1_last_beat or (w1_back_at is not None and t >= w1_back_at):
                beating.append("w1")
            if t == 0.0:
                beating.append("w0")
            for server in beating:
                ex.heartbeat(Heartbeat(server, "a"))
            now = [e for e in ex.review_sync() if e.kind == "server_failed"]
            if now:
                failed[t] = sorted(e.detail["server"] for e in now)
        assert failed == expected
    finally:
        plane.c.close()


def test_the_time_the_daemon_did_not_run_is_no_agents_silence(tmp_path: Path) -> None:
    """The on-call audit: a daemon stopped past the timeout (SIGSTOP, a paused host, a
    process starved under load) read every agent as silent when it woke, their beats
    unread in its socket, and failed every server at once (bench.chaos under load: 7
    false failures, 24 jobs failed). Its event loop's watch takes that time off the link
    clock, and a review before the loop has ticked since it woke judges no one silent;
    an agent that is truly gone still fails, on time as counted while the loop ran."""
    plane = PlaneDaemon(tmp_path, RACK)
    try:
        ex = plane.ex
        ex.connected()
        t = 0.0

        def second(beating: list[str], tick: bool = True) -> list[str]:
            nonlocal t
            for _ in range(4):  # the loop watch's ticks, a quarter second apart
                t += 0.25
                plane.mono[0] = t
                if tick:
                    ex.loop_tick()
            for server in beating:
                ex.heartbeat(Heartbeat(server, "a"))
            return sorted(e.detail["server"] for e in ex.review_sync()
                          if e.kind == "server_failed")  # fmt: skip

        every = ["w0", "w1", "w2", "p0"]
        assert not any(second(every) for _ in range(10))
        t += 100.0  # stopped for 100 s (> heartbeat_timeout, 30 s): no tick, no beat
        plane.mono[0] = t
        # a review first, before the loop has ticked since it woke
        assert not [e for e in ex.review_sync() if e.kind == "server_failed"]
        assert second(every) == []  # the loop ticks: the 100 s taken off; beats read
        # w0 silent from now: failed once 30 s of the loop running have passed
        failed = {i: f for i in range(40) if (f := second(["w1", "w2", "p0"]))}
        assert list(failed.values()) == [["w0"]] and 29 <= next(iter(failed)) <= 31, failed
    finally:
        plane.c.close()


RACK4: dict[str, Any] = {
    "resources": ["gpu", "bandwidth"],
    "servers": [
        *({"name": f"w{i}", "kind": "worker", "capacity": {"gpu": 4, "bandwidth": 10}}
          for i in range(4)),
        {"name": "p0", "kind": "ps", "capacity": {"bandwidth": 10}},
    ],
}  # fmt: skip


@pytest.mark.parametrize("doomed", [0, 1, 2])
def test_a_job_moved_off_a_failed_server_goes_onto_none_silent_too(
    tmp_path: Path, doomed: int
) -> None:
    """A rack going dark over more than one heartbeat interval: its servers fail at
    different reviews (past the wait for each other). The jobs of the first to fail go
    onto no server whose agent has missed two beats (a suspect), so none moves twice;
    the suspect still fails when its own timeout comes, no later, and a healthy server
    takes the moves. ``doomed``: which of the servers the job is not on falls silent
    10 s after the first (without the rule, the job moved onto it when it was the
    cheapest, and moved again 10 s later)."""
    plane = PlaneDaemon(tmp_path, RACK4)
    try:
        ex = plane.ex
        plane.submit("a")
        ledger = plane.c._ledger
        on = np.flatnonzero(ledger.schedule("a").after(plane.c.slot + 1).workers.any(axis=0))
        first = f"w{int(on[0])}"
        others = [f"w{i}" for i in range(4) if i not in set(on.tolist())]
        second = others[doomed % len(others)]
        ex.connected()
        failed: dict[float, Any] = {}
        moves: list[str] = []
        for second_ in range(0, 60):
            t = float(second_)
            plane.mono[0] = t
            for server in ex.server_index:
                if (server == first and t > 0.0) or (server == second and t > 10.0):
                    continue
                if int(t) % 5 == 0:
                    ex.heartbeat(Heartbeat(server, "a"))
            events = ex.review_sync()
            moves += [e.job_id for e in events if e.job_id == "a"]
            now = [e.detail["server"] for e in events if e.kind == "server_failed"]
            if now:
                failed[t] = sorted(now)
                after = ledger.schedule("a").after(plane.c.slot + 1)
                assert not after.workers[:, int(second[1:])].any() or second in now
        # the timing is the wait's: nothing later, nothing sooner
        assert failed == {31.0: [first], 41.0: [second]}
        assert moves == ["a"]  # once, onto a server that stays up
        after = ledger.schedule("a").after(plane.c.slot + 1)
        assert not after.workers[:, [int(first[1:]), int(second[1:])]].any()
        assert after.work() > 0
    finally:
        plane.c.close()


def test_silence_is_timed_on_the_link_a_flap_does_not_restart_it(plane: PlaneDaemon) -> None:
    """A server's silence counts only while the broker connection is up, summed over
    connections: a link that drops every 20 s (under the 30 s timeout) still lets a dead
    agent be declared failed, and an hour of broker outage fails nobody."""
    ex, timeout = plane.ex, plane.ex.mqtt.heartbeat_timeout

    def fails_at(up: float, down: float, until: float) -> float | None:
        """Seconds after the last beats (both servers at 0 s, then only w0's) at which
        p0 is declared failed, the link up ``up`` s and down ``down`` s in turn."""
        link_up = True

        def flap(t: float) -> None:
            nonlocal link_up
            if (t % (up + down) < up) != link_up:
                link_up = not link_up
                ex.connected() if link_up else ex.disconnected()
            if link_up:
                ex.heartbeat(Heartbeat("w0", "a"))  # a live agent beats on

        return _seconds_until_a_failure(plane, flap, until)

    _both_heard(ex)
    # up 20 s, down 1 s: p0 fails once 30 s of connection time have passed, in the
    # second connection (on the old clock, restarted at each connection, never)
    at = fails_at(up=20.0, down=1.0, until=200.0)
    assert at is not None and timeout + 1 <= at <= 21.0 + timeout
    assert "p0" in ex.failed and "w0" not in ex.failed

    # a broker outage of an hour counts nothing; w0, heard just before, stays up
    ex.heartbeat(Heartbeat("w0", "a"))
    ex.review_sync()
    ex.disconnected()
    plane.mono[0] += 3600.0
    assert ex.review_sync() == []
    ex.connected()
    plane.mono[0] += 2 * ex.mqtt.heartbeat_seconds + 1.0  # settled, w0 not heard yet
    assert ex.review_sync() == [] and "w0" not in ex.failed


def test_one_agents_flood_is_not_the_others_silence(plane: PlaneDaemon) -> None:
    """While an agent floods (its messages dropped over its rate, FLOOD_DROPS or more
    between two reviews), the broker may be dropping the other agents' heartbeats on
    the way to the daemon (the audit: a flood on w0's own topic failed p0 and w1, and
    another tenant's jobs with them). The flood's time counts half as silence: a dead
    server is still failed, later (the diff review: counting none, one agent 1 message
    a second over its rate stopped failure detection for every server). A trickle over
    one agent's rate changes nothing."""
    from controller.plane.execution import FLOOD_DROPS

    ex, timeout = plane.ex, plane.ex.mqtt.heartbeat_timeout

    def fails_after(drops: int) -> float | None:
        """Seconds until p0, silent from now, is failed while w0 has ``drops`` messages
        dropped a second (each second a review)."""

        def flood(_t: float) -> None:
            ex.heartbeat(Heartbeat("w0", "a"))
            for _ in range(drops):
                ex.crowded()

        return _seconds_until_a_failure(plane, flood, 3 * timeout)

    _both_heard(ex)
    trickle = fails_after(1)  # one over the rate: as without it
    assert trickle is not None and timeout < trickle <= timeout + 2
    plane.mono[0] += 1.0
    ex.heartbeat(Heartbeat("p0", "a"))  # back
    assert [e.kind for e in ex.review_sync()] == ["server_recovered"]
    flood = fails_after(FLOOD_DROPS)  # a flood: half speed, twice as long, not never
    assert flood is not None and 2 * timeout - 2 <= flood <= 2 * timeout + 3, flood
    assert "p0" in ex.failed and "w0" not in ex.failed


def test_agents_that_follow_another_stores_plans_get_this_daemons_above_them(
    plane: PlaneDaemon,
) -> None:
    """A daemon on a new (or restored) store starts its epochs again, and agents ignore
    plans below the one they follow: the audit saw them ignore a new daemon's plans for
    40 rounds while it completed their jobs with their plans. A heartbeat names the epoch
    its agent follows; one above the daemon's sends every plan again above it. A claim
    past MAX_FOLLOWED_EPOCH (a hostile agent's) moves nothing."""
    from controller.plane.execution import BUMP_SECONDS, MAX_FOLLOWED_EPOCH

    plane.submit("j")
    ex = plane.ex
    first = ex.plans_sync({})
    assert first and {p.epoch for p in first} == {1}
    published = {p.server: p for p in first}
    assert ex.plans_sync(published) == []  # nothing changed
    assert not ex.heartbeat(Heartbeat("w0", "a", 1))  # follows this daemon's
    assert not ex.heartbeat(Heartbeat("w0", "a", MAX_FOLLOWED_EPOCH + 1))
    # another store's epochs: a lagging agent's 40 first, then 41; the move waits an
    # agent's beat, so that every agent has said which it follows
    assert not ex.heartbeat(Heartbeat("w0", "a", 40))
    assert ex.plans_sync(published) == [] and ex.epoch == 1  # not yet
    assert not ex.heartbeat(Heartbeat("p0", "a", 41))
    plane.mono[0] += ex.mqtt.heartbeat_seconds
    assert ex.heartbeat(Heartbeat("w0", "a", 40))  # a beat later: a round
    again = ex.plans_sync(published)
    assert {p.server for p in again} == set(ex.server_index)
    assert {p.epoch for p in again} == {42} and ex.epoch == 42
    assert [p.current.tasks for p in again] == [published[p.server].current.tasks for p in again]
    assert not ex.heartbeat(Heartbeat("w0", "a", 41))  # behind now: the next plan fixes it
    # another daemon under the same prefix, moving on: at most one move a minute, not a
    # republication of every plan at each of its rounds
    published = {p.server: p for p in again}
    assert not ex.heartbeat(Heartbeat("p0", "a", 50))  # within the pause: no round asked
    plane.mono[0] += ex.mqtt.heartbeat_seconds
    assert ex.plans_sync(published) == [] and ex.epoch == 42  # a round of its own: held
    plane.mono[0] += BUMP_SECONDS
    assert ex.heartbeat(Heartbeat("p0", "a", 50))  # after it: a round
    assert {p.epoch for p in ex.plans_sync(published)} == {51}
    assert not ex.heartbeat(Heartbeat("p0", "a", 50))  # behind now
    # a claim further above than any restored store could be moves nothing
    assert not ex.heartbeat(Heartbeat("p0", "a", 51 + (1 << 40) + 1))


# -- untrusted messages: names, sizes, parse failures, identity (issue 12, items 5-8) -------


def test_a_report_entrys_worker_failures_round_trip_and_bad_ones_are_ignored_alone() -> None:
    """An entry says its job's worker failures on the agent (count, latest in words),
    left out when none (as older agents send it); a bad value of either costs that
    field, never the entry's counts; the text, read by the tenant, is escaped."""
    plain = Progress("w0", "s1", [TaskProgress("j1", 3.5, 2.0, "r1")])
    assert b"failure" not in plain.to_bytes() and Progress.parse(plain.to_bytes()) == plain
    failing = Progress("w0", "s1", [TaskProgress("j1", 0.0, 0.5, "", 6, "exit status 1")])
    assert b'"failures":6,"last_failure":"exit status 1"' in failing.to_bytes()
    assert Progress.parse(failing.to_bytes()) == failing
    entry = {"job": "j", "minibatches": 2, "worker_seconds": 3}
    bad: list[tuple[dict[str, Any], str]] = [({"failures": -1}, "failures: must be >= 0"),
           ({"failures": 1.5}, "failures: must be an integer"),
           ({"failures": True}, "failures: must be an integer"),
           ({"failures": 2**53 + 1}, "failures: must be <= 2**53"),
           ({"last_failure": 7}, "last_failure: must be a non-empty string"),
           ({"last_failure": "x" * 201}, "last_failure: 201 characters, over 200")]  # fmt: skip
    for extra, why in bad:
        report = {"version": 1, "server": "w0", "session": "s", "jobs": [{**entry, **extra}]}
        got = Progress.parse(json.dumps(report))
        assert got.jobs == [TaskProgress("j", 2.0, 3.0)] and not got.refused, extra
        assert len(got.ignored) == 1 and why in got.ignored[0], (got.ignored, why)
    both = {**entry, "failures": "6", "last_failure": "over its memory demand"}
    got = Progress.parse(json.dumps({"version": 1, "server": "w0", "session": "s",
                                     "jobs": [both]}))  # fmt: skip
    assert got.jobs == [TaskProgress("j", 2.0, 3.0, "", 0, "over its memory demand")]
    assert got.ignored[0].startswith("progress.jobs[0].failures")
    assert b"ignored" not in got.to_bytes()
    raw = {**entry, "failures": 1, "last_failure": "exit \x1b[2J\u202e1"}
    got = Progress.parse(json.dumps({"version": 1, "server": "w0", "session": "s",
                                     "jobs": [raw]}))  # fmt: skip
    assert got.jobs[0].last_failure == "exit \\x1b[2J\\u202e1"


def test_an_agent_reports_a_new_worker_failure_even_when_its_counts_stand_still() -> None:
    agent = Agent("w0", MqttConfig("localhost"))
    agent.tasks["j1"] = TaskState(minibatches=0.0, worker_seconds=1.0)
    agent._reported["j1"] = (0.0, 1.0)
    assert agent.reports() == []
    agent.tasks["j1"].workers.failed = 2
    agent.tasks["j1"].workers.last_failure = "exit status 1"
    (report,) = agent.reports()
    assert report.jobs == [TaskProgress("j1", 0.0, 1.0, "", 2, "exit status 1")]


def test_the_daemon_keeps_the_latest_failures_per_job_and_server_and_forgets_ended_jobs() -> None:
    from controller.plane.worker_failures import FailuresHeard, WorkerFailures

    heard = FailuresHeard()
    heard.heard("j1", "w1", 1, "exit status 1", at=10.0)
    heard.heard("j1", "w0", 2, "exit status 1", at=10.0)
    heard.heard("j1", "w0", 6, "over its memory demand", at=20.0)  # replaces w0's
    heard.heard("j2", "w0", 0, "", at=20.0)  # none: nothing kept
    assert heard.of("j1", now=32.0) == [
        WorkerFailures("w0", 6, "over its memory demand", 12.0),
        WorkerFailures("w1", 1, "exit status 1", 22.0),
    ]
    assert heard.of("j2", now=32.0) == [] and len(heard) == 1
    heard.heard("j1", "w1", 0, "", at=30.0)  # a new agent session without failures
    assert [f.server for f in heard.of("j1", now=32.0)] == ["w0"]
    heard.forget({"j3"})
    assert heard.of("j1", now=32.0) == [] and len(heard) == 0
    # a job whose every server's failures were cleared is kept no more (while it runs)
    heard.heard("j4", "w0", 1, "exit status 1", at=40.0)
    heard.heard("j4", "w0", 0, "", at=41.0)
    assert heard.of("j4", now=42.0) == [] and len(heard) == 0


def test_names_in_topics_and_the_agent_topics_identity() -> None:
    from controller.plane.topics import topic_name

    assert topic_name("job-1.a_B", "job id") == "job-1.a_B"
    for bad in ("a/b", "a+b", "#", "", "x" * 129, "nul\x00", "caf\u00e9"):
        with pytest.raises(ValueError, match="cannot name an MQTT topic"):
            topic_name(bad, "job id")
    # a job's key: its id, or NAME:ID with tokens (controller/job_keys.py)
    from controller.plane.topics import job_level

    assert job_level("alice@x:job-1") == "alice@x:job-1" and job_level("job-1") == "job-1"
    for bad in ("a/b", "a:b/c", "a+b:c", "#", "", ":x", "a:", "x" * 129, "a:b:c", "nul\x00"):
        with pytest.raises(ValueError, match="cannot name an MQTT topic"):
            job_level(bad)
    t = Topics("oasis")
    assert t.agent_of("oasis/v1/agents/w0/progress") == ("w0", "progress")
    assert t.agent_of("oasis/v1/agents/p1/heartbeat") == ("p1", "heartbeat")
    for other in ("oasis/v1/agents/w0/plan", "oasis/v1/agents/w0/x/progress",
                  "lab/v1/agents/w0/progress", "oasis/v1/agents/a b/progress"):  # fmt: skip
        assert t.agent_of(other) is None
    # a server name that cannot be a topic level is refused with [mqtt] only
    odd = {**CLUSTER, "servers": [{**CLUSTER["servers"][0], "name": "w/0"}, CLUSTER["servers"][1]]}
    assert from_dict({"cluster": odd}).mqtt is None
    with pytest.raises(ConfigError, match=r"cluster\.servers: server name 'w/0' cannot name"):
        from_dict({"cluster": odd, "mqtt": {"host": "b"}})


def test_poison_payloads_are_spec_errors_and_cost_little() -> None:
    """Everything the parser can fail with on untrusted bytes is a SpecError: before the
    fix, JSON nested 50,000 deep raised RecursionError, which the link did not catch."""
    from controller.plane.topics import MAX_AGENT_PAYLOAD_BYTES, MAX_REPORT_JOBS

    deep = b"[" * 50_000
    for parse in (Heartbeat.parse, Progress.parse, Plan.parse):
        with pytest.raises(SpecError, match="nested too deep"):
            parse(deep)
    with pytest.raises(SpecError, match="not JSON"):
        Progress.parse(b"\xff\xfe{")
    huge = b'{"version": 1, "jobs": [' + b'{"job": "x"},' * 600_000 + b"{}]}"
    assert len(huge) > MAX_AGENT_PAYLOAD_BYTES
    with pytest.raises(SpecError, match=r"progress: \d+ bytes, over the limit of 262144"):
        Progress.parse(huge)
    entries = [{"job": f"u{i}", "minibatches": 1, "worker_seconds": 1} for i in range(1001)]
    many = {"version": 1, "server": "w0", "session": "s", "jobs": entries}
    with pytest.raises(SpecError, match=f"progress.jobs: 1001 entries, over the limit of "
                       f"{MAX_REPORT_JOBS}"):  # fmt: skip
        Progress.parse(json.dumps(many))
    many["jobs"] = entries[:1000]
    assert len(Progress.parse(json.dumps(many)).jobs) == 1000


def test_agent_splits_large_reports_and_stops_for_a_server_the_daemon_does_not_know() -> None:
    from controller.plane.agent import UnknownServerError
    from controller.plane.topics import MAX_REPORT_JOBS, Status

    agent = Agent("w0", MqttConfig("localhost"))
    for i in range(2 * MAX_REPORT_JOBS + 5):
        agent.tasks[f"j{i}"] = TaskState(minibatches=1.0, worker_seconds=2.0)
    reports = agent.reports()
    assert [len(r.jobs) for r in reports] == [MAX_REPORT_JOBS, MAX_REPORT_JOBS, 5]
    assert all(len(r.to_bytes()) < 256 * 1024 for r in reports)
    agent.status(Status(online=False))  # no list while offline: keep waiting
    agent.status(Status(online=True, servers=["w0", "p0"]))
    typo = Agent("p2-8x-O", MqttConfig("localhost"))
    message = r"'p2-8x-O' is not in the daemon's cluster \(known: p0, p2-8x-0, w0\); did you mean"
    online = Status(online=True, servers=["w0", "p2-8x-0", "p0"])
    with pytest.raises(UnknownServerError, match=message + r" 'p2-8x-0'\?"):
        typo.status(Status.parse(online.to_bytes()))
    assert Status.parse(Status(online=False).to_bytes()) == Status(online=False)
    with pytest.raises(ValueError, match="cannot name an MQTT topic"):
        Agent("w0/#", MqttConfig("localhost"))


def test_the_inbox_is_bounded_per_server_and_keeps_each_jobs_latest_count() -> None:
    from controller.plane.intake import Received, ReportInbox

    inbox = ReportInbox(max_entries=4)

    def put(at: float, server: str, *jobs: tuple[str, float]) -> None:
        entries = [TaskProgress(j, mb, mb) for j, mb in jobs]
        inbox.put(Received(at, 0, Progress(server, "s", entries)))

    put(1.0, "w0", ("done", 20.0))  # the last report of a finished job
    put(2.0, "p0", ("x", 1.0))
    for i in range(10):  # a flood from w0 about other jobs
        put(3.0 + i, "w0", ("a", float(i)), ("b", float(i)))
    taken = inbox.take()
    by_server: dict[str, list[tuple[str, float]]] = {}
    for r in taken:
        by_server.setdefault(r.progress.server, []).extend(
            (t.job, t.minibatches) for t in r.progress.jobs
        )
    assert by_server["p0"] == [("x", 1.0)]  # another server's report is untouched
    w0 = by_server["w0"]
    assert ("done", 20.0) in w0  # carried, not lost to the flood
    assert sum(n for _j, n in w0 if _j == "a") >= 0 and w0[-1] == ("b", 9.0)
    assert len(w0) <= 4 + 3  # the queue's 4 entries and the carry's 3 keys
    assert [r.at for r in taken] == sorted(r.at for r in taken)
    assert inbox.take() == []
    inbox.put_back(taken)  # a store outage: nothing applied, all of it back
    assert inbox.take() == taken
    tiny = ReportInbox(max_entries=1)
    for i in range(3):
        tiny.put(Received(float(i), 0, Progress("w0", "s", [TaskProgress(f"j{i}", 1, 1)])))
    assert [r.progress.jobs[0].job for r in tiny.take()] == ["j0", "j2"] and tiny.dropped == 1


def test_report_entries_the_inbox_drops_are_said_naming_their_server(
    plane: PlaneDaemon,
) -> None:
    """The agents audit: entries dropped with a server's inbox and carry full were
    counted (``ReportInbox.dropped``) and said nowhere; now the review says them per
    server, and no other server's count is lost."""
    from structlog.testing import capture_logs

    from controller.plane.intake import ReportInbox

    plane.submit("j")  # w0 runs its workers
    ex = plane.ex
    ex._reports = ReportInbox(max_entries=2)
    for i in range(6):  # ever new made-up ids from p0: its queue, then its carry, fill
        ex.report(Progress("p0", "s", [TaskProgress(f"ghost-{i}", 1.0, 1.0)]))
    ex.report(Progress("w0", "a", [TaskProgress("j", 3.0, 40.0)]))
    with capture_logs() as logs:
        ex.review_sync()
    said = [e for e in logs if e["event"].startswith("report entries dropped: this server's")]
    assert [(e["server"], e["entries"]) for e in said] == [("p0", 2)]
    assert ex.progress["j"].sessions == {"w0/a": [3.0, 40.0]}  # w0's count is untouched
    with capture_logs() as logs:
        ex.review_sync()  # said once: the count starts again
    assert not [e for e in logs if e["event"].startswith("report entries dropped")]


def test_a_sessions_counts_never_go_back_and_a_repeat_is_no_sample() -> None:
    """The agents audit: a report below the session's earlier counts replaced them (100
    mini-batches back to 10, a negative mini-batch time in the estimate), and every
    report repeated was a sample of the estimate."""
    from controller.plane.progress import MAX_SAMPLES, JobProgress

    prog = JobProgress()
    assert prog.take("w0/a", 100.0, 50.0) and prog.dirty
    assert not prog.take("w0/a", 10.0, 60.0)  # mini-batches back: the higher kept
    assert prog.sessions == {"w0/a": [100.0, 60.0]}
    assert not prog.take("w0/a", 120.0, 40.0)  # worker-seconds back
    assert prog.sessions == {"w0/a": [120.0, 60.0]}
    prog.dirty = False
    assert prog.take("w0/a", 120.0, 60.0) and not prog.dirty  # a repeat: nothing new
    assert prog.take("w0/b", 0.0, 0.0)  # a new session at 0: the totals stand
    assert prog.samples == [(100.0, 50.0), (100.0, 60.0), (120.0, 60.0)]
    for i in range(MAX_SAMPLES):  # the newest MAX_SAMPLES kept
        prog.take("w0/a", 121.0 + i, 60.0 + i)
    assert len(prog.samples) == MAX_SAMPLES and prog.samples[0] == (121.0, 60.0)


def test_a_servers_sessions_are_its_own_and_a_stored_row_keeps_what_reads_as_counts() -> None:
    """A job's sessions of server ``w1`` are not ``w10``'s (the bound on sessions per
    server is per server: another server's agent churning sessions must not use up
    ``w1``'s); a stored row keeps the entries that read as two finite counts >= 0 and
    the newest :data:`MAX_SAMPLES` samples (and the first :data:`MAX_STORED_SESSIONS`
    sessions), and says how many it left out; merged with a late report, it keeps as
    many samples."""
    from controller.plane.progress import (
        MAX_SAMPLES,
        MAX_STORED_SESSIONS,
        JobProgress,
        merged,
        sessions_of,
        stored,
    )
    from controller.store import ProgressRow

    prog = JobProgress({"w1/a": [1.0, 1.0], "w10/a": [1.0, 1.0], "w10/b": [2.0, 2.0]})
    assert (sessions_of(prog, "w1"), sessions_of(prog, "w10"), sessions_of(prog, "w")) == (1, 2, 0)

    points = [[float(i), float(i)] for i in range(MAX_SAMPLES + 10)]
    points[-1] = [-1.0, 5.0]  # the newest, edited below zero
    per_server = {"w0/a": [3, 40], "w0/b": [-1, 5], "w0/c": [1, float("inf")], "w0/d": [1]}
    row = ProgressRow(job_id="j", minibatches=0.0, worker_seconds=0.0,
                      per_server=per_server, samples={"points": points})  # fmt: skip
    kept, bad = stored(row)
    assert kept.sessions == {"w0/a": [3.0, 40.0]}
    assert kept.samples == [(float(i), float(i)) for i in range(10, MAX_SAMPLES + 9)]
    assert bad == 3 + 1
    many = {f"w0/{i}": [1, 1] for i in range(MAX_STORED_SESSIONS + 2)}  # an edit: the first kept
    kept, bad = stored(ProgressRow(job_id="j", per_server=many, samples={}))
    assert len(kept.sessions) == MAX_STORED_SESSIONS and "w0/0" in kept.sessions and bad == 2
    # a late report merged with a full row: the new totals are the newest sample, and
    # the row keeps MAX_SAMPLES of them
    full = [[float(i), float(i)] for i in range(MAX_SAMPLES)]
    row = ProgressRow(job_id="j", per_server={"w0/a": [399, 399]}, samples={"points": full})
    sessions, samples = merged(JobProgress({"w0/b": [1.0, 2.0]}, partial=True), row)
    assert sessions == {"w0/a": [399.0, 399.0], "w0/b": [1.0, 2.0]}
    assert len(samples) == MAX_SAMPLES and samples[-1] == (400.0, 401.0)
    assert samples[0] == (1.0, 1.0)


def test_a_report_counts_only_for_jobs_planned_on_its_server_around_its_slot(
    plane: PlaneDaemon,
) -> None:
    """Before the fix any report counted for any job: a PS server's agent completed a job
    it never ran, and 100,000 unknown job ids cost a store query each."""
    view = plane.submit("j")  # arrives in slot 1: w0 has its workers, p0 its PS
    assert {a["server"] for a in view.decision.allocations if a.get("workers")} == {"w0"}
    ex = plane.ex
    ex.report(Progress("p0", "a", [TaskProgress("j", 20.0, 1.0)]))  # all of it, from p0
    unknown = [TaskProgress(f"ghost-{i}", 5.0, 5.0) for i in range(1000)]
    ex.report(Progress("w0", "b", unknown))
    assert ex.review_sync() == []
    assert plane.state("j") == "admitted" and ex.progress == {} and ex.review.pending == set()
    assert plane.stored("j") is None
    ex.report(Progress("w0", "b", [TaskProgress("j", 3.0, 40.0), *unknown[:5]]))
    ex.review_sync()
    assert plane.stored("j") == (3.0, {"w0/b": [3.0, 40.0]})
    # long after the job's slots: a report naming it no longer counts
    last = max(int(a["slot"]) for a in view.decision.allocations)
    plane.clock.advance((last + 3) * plane.config.slot_seconds)
    ex.review_sync()
    ex.report(Progress("w0", "b", [TaskProgress("j", 20.0, 300.0)]))
    ex.review_sync()
    assert plane.stored("j") == (3.0, {"w0/b": [3.0, 40.0]})


def test_the_link_takes_the_sender_from_the_topic_and_survives_poison(
    plane: PlaneDaemon,
) -> None:
    from controller.plane.link import Plane

    plane.submit("j")
    link = Plane(plane.c, plane.ex, MqttConfig("localhost"))
    t = link.topics
    forged = Progress("w0", "a", [TaskProgress("j", 20.0, 1.0)]).to_bytes()
    assert not link.take(t.progress("p0"), forged)  # p0's topic, w0 in the payload
    assert not link.take(t.heartbeat("p0"), Heartbeat("w0", "a").to_bytes())
    assert not link.take(t.progress("w9"), forged)  # no such server
    assert not link.take(t.heartbeat("w9"), Heartbeat("w9", "a").to_bytes())  # ... itself
    w9 = Progress("w9", "a", [TaskProgress("j", 20.0, 1.0)]).to_bytes()
    assert not link.take(t.progress("w9"), w9)
    assert not link.take(t.progress("w0"), b"[" * 50_000)
    assert not link.take(t.progress("w0"), b"{" + b" " * 7_000_000 + b"}")
    plane.ex.connected()
    assert plane.ex.review_sync() == []
    assert plane.ex.last_seen == {} and plane.state("j") == "admitted"
    assert link.take(t.heartbeat("p0"), Heartbeat("p0", "a").to_bytes())
    assert link.take(t.progress("w0"), Progress("w0", "a", [TaskProgress("j", 2.0, 9.0)])
                     .to_bytes())  # fmt: skip
    plane.ex.review_sync()
    assert set(plane.ex.last_seen) == {"p0", "w0"}
    assert plane.stored("j") == (2.0, {"w0/a": [2.0, 9.0]})


def test_an_agent_behind_its_servers_plan_is_counted_on_metrics(plane: PlaneDaemon) -> None:
    """The agents audit: an agent following an older plan than one published for its
    server 10 s before (it refused it, or cannot read it) is said and counted; one that
    takes the plan, or a server with none published, is not."""
    import time as real_time

    from controller.plane.link import Plane

    link = Plane(plane.c, plane.ex, MqttConfig("localhost"))
    t = link.topics
    link._lag.published("w0", 5, real_time.monotonic() - 20.0)
    assert link.take(t.heartbeat("w0"), Heartbeat("w0", "a", 1).to_bytes())
    assert link.take(t.heartbeat("p0"), Heartbeat("p0", "a", 1).to_bytes())  # none for p0
    assert _metric(plane, "oasis_agents_behind_their_plan") == [({}, 1.0)]
    assert plane.ex.behind_plan == {"w0"}
    assert link.take(t.heartbeat("w0"), Heartbeat("w0", "a", 5).to_bytes())  # taken now
    assert _metric(plane, "oasis_agents_behind_their_plan") == [({}, 0.0)]
    # an agent following no plan yet (epoch 0), or not saying (None), is not behind one:
    # the execution says it follows none
    for epoch in (0, None):
        assert link.take(t.heartbeat("w0"), Heartbeat("w0", "b", epoch).to_bytes())
        assert plane.ex.behind_plan == set(), epoch


def test_an_agent_flooding_its_topic_is_dropped_before_parsing_and_others_are_not(
    plane: PlaneDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One server's messages past AGENT_MESSAGE_BURST (then its rate) are dropped before
    they are parsed: a flood of reports slowed every tenant's calls. Another server's
    messages still go through."""
    from controller.plane.link import AGENT_MESSAGE_BURST, Plane

    parsed = 0
    parse = Progress.parse

    def counted(payload: Any) -> Progress:
        nonlocal parsed
        parsed += 1
        return parse(payload)

    monkeypatch.setattr(Progress, "parse", counted)
    plane.submit("j")
    link = Plane(plane.c, plane.ex, MqttConfig("localhost"))
    t = link.topics
    report = Progress("w0", "a", [TaskProgress("j", 2.0, 9.0)]).to_bytes()
    taken = sum(link.take(t.progress("w0"), report) for _ in range(int(AGENT_MESSAGE_BURST) * 3))
    assert AGENT_MESSAGE_BURST <= taken < 2 * AGENT_MESSAGE_BURST  # it refills at the rate
    assert parsed == taken
    assert link.take(t.heartbeat("p0"), Heartbeat("p0", "a").to_bytes())


def test_the_latest_event_of_every_job_is_found_for_a_broker_that_lost_it(
    plane: PlaneDaemon,
) -> None:
    import asyncio

    for job_id in ("a", "b", "c"):
        plane.submit(job_id)
    asyncio.run(plane.c.cancel("b"))
    sequences, last = plane.ex.latest_job_events_sync(10**9)
    events = plane.ex.events_sync(sequences)
    assert [(e.job_id, e.kind) for e in events] == [("a", "decided"), ("c", "decided"),
                                                    ("b", "cancelled")]  # fmt: skip
    assert last is None  # one page holds them all
    # b's cancellation was not published yet: the new events publish it, not the
    # restore (its decision restored after the cancellation would be the retained one)
    upto = events[1].sequence
    sequences, _ = plane.ex.latest_job_events_sync(upto)
    restored = plane.ex.events_sync(sequences)
    assert [(e.job_id, e.kind) for e in restored] == [("a", "decided"), ("c", "decided")]
    # pages in id order: two jobs, then the last one
    first, after = plane.ex.latest_job_events_sync(10**9, limit=2)
    assert [e.job_id for e in plane.ex.events_sync(first)] == ["a", "b"] and after == "b"
    rest, after = plane.ex.latest_job_events_sync(10**9, after="b", limit=2)
    assert [e.job_id for e in plane.ex.events_sync(rest)] == ["c"] and after is None


def test_plans_and_new_events_go_first_while_a_broker_gets_its_job_events_back(
    plane: PlaneDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a broker that lost its state, the restore published every job's latest
    event before any plan or new event: with 20,000 jobs in the store, a job admitted
    as the broker came back had its plan 5.5 s later (``bench/plane_restore.py``). Now
    it goes a page at a time and yields to waiting plans and events; a job whose newer
    event went out meanwhile is not restored to its older one."""
    import asyncio

    from controller.plane import execution
    from controller.plane.link import Plane, _Restore

    for job_id in ("a", "b", "c", "d", "e"):
        plane.submit(job_id)
    published = max(plane.ex.latest_job_events_sync(10**9)[0])
    monkeypatch.setattr(execution, "RESTORE_PAGE", 2)
    link = Plane(plane.c, plane.ex, MqttConfig("localhost"))
    cancelled: list[str] = []

    async def first_event(topic: str, _payload: bytes, qos: int, retain: bool) -> None:
        assert qos == 1 and retain
        if topic.endswith("/events") and not cancelled:
            cancelled.append(topic)
            await plane.c.cancel("c")  # while the restore's first page goes out
            link.dirty.set()  # (the bus would set it)

    client = FakeMqtt(first_event)  # records what the link publishes, in order
    sent = client.sent

    async def rounds() -> None:
        first = await link.publish_round(client)  # type: ignore[arg-type]
        # one page out, then stopped for the waiting work (a page at least: a daemon
        # always busy still restores)
        assert first > 0 and link._restore is not None and link._restore.after == "b"
        mark = len(sent)
        link.dirty.clear()
        await link.publish_round(client)  # type: ignore[arg-type]
        assert link._restore is None
        later = [t.removeprefix("oasis/v1/") for t, _ in sent[mark:]]
        restored = later.index("jobs/d/events")  # the restore's next page
        assert "jobs/c/events" in later[:restored], later  # the new event went first
        assert all(t.endswith("/plan") or t == "jobs/c/events" for t in later[:restored])

    plane.ex.events_published = published  # before the broker lost them
    link._restore = _Restore(plane.ex.events_published)
    asyncio.run(rounds())
    events = [json.loads(p) for t, p in sent if t.endswith("/events")]
    assert [(e["job"], e["kind"]) for e in events] == [
        ("a", "admitted"), ("b", "admitted"), ("c", "cancelled"), ("d", "admitted"),
        ("e", "admitted")]  # fmt: skip


def test_publish_rounds_are_paced_by_what_their_plans_cost(
    plane: PlaneDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rebuilding every server's plan costs in proportion to all active jobs, and rounds
    ran back to back while jobs kept coming: one tenant's 3,000 tiny admitted jobs kept
    the decision thread 83% busy with plans, and another tenant's quote took 20 times as
    long (the cardinality audit). A round now waits ``PUBLISH_PACE`` times what the last
    one's plans cost before it starts."""
    import asyncio

    from controller.plane import link as link_module
    from controller.plane.link import PUBLISH_PACE, Plane

    plane.submit("a")
    link = Plane(plane.c, plane.ex, MqttConfig("localhost"))
    builds: list[tuple[float, float]] = []  # (start, end) of each plans_build
    plans_build = plane.ex.plans_build

    def costly(begun: Any) -> Any:  # as 3,000 active jobs cost
        start = time.perf_counter()
        time.sleep(0.04)
        try:
            return plans_build(begun)
        finally:
            builds.append((start, time.perf_counter()))

    monkeypatch.setattr(plane.ex, "plans_build", costly)

    async def busy() -> float:  # a job decided every 5 ms, each waking the publisher
        loop = asyncio.create_task(link._publish_loop(FakeMqtt()))  # type: ignore[arg-type]
        start = time.perf_counter()
        # 1.2 s, and at least three rounds (a loaded machine builds slower), at most 20 s
        while time.perf_counter() - start < (1.2 if len(builds) >= 3 else 20.0):
            link.changed()
            await asyncio.sleep(0.005)
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
        return time.perf_counter() - start

    elapsed = asyncio.run(busy())
    assert PUBLISH_PACE == link_module.PUBLISH_PACE >= 1
    assert 3 <= len(builds) <= elapsed / (0.04 * (1 + PUBLISH_PACE)) + 1, (len(builds), elapsed)
    for (start, end), (after, _) in itertools.pairwise(builds):
        assert after - end >= PUBLISH_PACE * (end - start), (after - end, end - start)
    # a slow round (10,000 servers' plans, a store slowed down) holds the next, with its
    # cancels, re-plans and job events, at most MAX_PUBLISH_PAUSE (the review)
    assert link_module.publish_pause(0.01) == pytest.approx(0.01 * PUBLISH_PACE)
    assert link_module.publish_pause(1.5) == link_module.MAX_PUBLISH_PAUSE <= 2.0
    assert link_module.publish_pause(-1.0) == 0.0  # never a negative pause


def test_other_calls_are_decided_while_a_round_builds_its_plans(
    plane: PlaneDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plans are built in a thread of their own, not in the decision thread: a rebuild
    of 3,000 active jobs' plans held every tenant's calls for 0.2-0.45 s (the cardinality
    audit). Here a build is held until another job has been decided."""
    import asyncio
    import threading

    from controller.plane.link import Plane

    plane.submit("a")
    link = Plane(plane.c, plane.ex, MqttConfig("localhost"))
    building, release = threading.Event(), threading.Event()
    plans_build = plane.ex.plans_build

    def held(begun: Any) -> Any:
        building.set()
        release.wait(15)
        return plans_build(begun)

    monkeypatch.setattr(plane.ex, "plans_build", held)
    client = FakeMqtt()

    async def run() -> tuple[Any, int]:
        round_ = asyncio.create_task(link.publish_round(client))  # type: ignore[arg-type]
        await asyncio.to_thread(building.wait, 15)
        try:  # decided while the round's plans are being built
            view = await asyncio.wait_for(plane.c.submit({"id": "b", **plane.SPEC}), 10)
        finally:
            release.set()
        return view, await round_

    view, published = asyncio.run(run())
    assert view.decision.admitted
    assert published == len(CLUSTER["servers"])
    assert any(t.endswith("/plan") for t, _ in client.sent)
    assert plane.ex.epoch == 1  # taken once the plans were built


def test_a_daemon_that_stops_leading_while_plans_are_built_publishes_nothing(
    plane: PlaneDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plans are built outside the decision thread, for as long as that takes: a
    daemon that lost its lease meanwhile must publish neither the plans nor the round's
    job events (a standby's older event would replace the leader's newer one, retained).
    The build also runs in a daemon thread: one no longer wanted does not hold a
    stopping daemon's exit, as ``asyncio.to_thread``'s threads do (the review)."""
    import asyncio
    import threading

    from controller.errors import NotLeaderError
    from controller.plane.link import Plane

    plane.submit("a")
    link = Plane(plane.c, plane.ex, MqttConfig("localhost"))
    client = FakeMqtt()
    sent = client.sent
    asyncio.run(link.publish_round(client))  # type: ignore[arg-type]
    assert sent and plane.ex.epoch == 1
    low = {"kind": "sigmoid", "priority": 0.0001, "decay": 0.5, "target": 3}
    view = asyncio.run(plane.c.submit({"id": "r", **plane.SPEC, "utility": low}))
    assert not view.decision.admitted  # an event to publish, no plan changed
    plans_build = plane.ex.plans_build
    daemonic: list[bool] = []

    def stepping_down(begun: Any) -> Any:
        daemonic.append(threading.current_thread().daemon)
        plane.c.step_down("lease lost while the plans were built")
        return plans_build(begun)

    monkeypatch.setattr(plane.ex, "plans_build", stepping_down)
    sent.clear()
    with pytest.raises(NotLeaderError):
        asyncio.run(link.publish_round(client))  # type: ignore[arg-type]
    assert sent == [] and plane.ex.epoch == 1 and daemonic == [True]


def test_agent_resends_only_recent_jobs_after_a_reconnection() -> None:
    import time

    from controller.plane.topics import Status

    agent = Agent("w0", MqttConfig("localhost"))
    agent.accept(plan(1))  # 10 s slots
    for job in ("old", "recent"):
        agent.tasks[job] = TaskState(minibatches=5.0, worker_seconds=5.0)
        agent._reported[job] = (5.0, 5.0)
    agent._sent_at = {"old": 0.0, "recent": 100.0}
    assert agent.reports() == []  # nothing changed
    agent.resend_recent(now=105.0)  # within two slots of "recent" only
    assert [t.job for r in agent.reports() for t in r.jobs] == ["recent"]
    # a daemon that (re)connected missed what was sent meanwhile: recent counts again
    agent._reported["recent"] = (5.0, 5.0)
    agent._sent_at["recent"] = time.monotonic()
    assert agent.reports() == []
    agent.status(Status(online=True, servers=["w0"]))
    assert [t.job for r in agent.reports() for t in r.jobs] == ["recent"]
    # ... and a new plan (a restarted daemon issues one) has its jobs' counts resent
    agent.tasks["j1"] = TaskState(minibatches=7.0, worker_seconds=7.0)
    agent._reported = {j: (s.minibatches, s.worker_seconds) for j, s in agent.tasks.items()}
    agent.accept(plan(1))  # the same epoch: nothing new
    assert agent.reports() == []
    agent.accept(plan(2))  # plans j1
    assert [t.job for r in agent.reports() for t in r.jobs] == ["j1"]


def test_one_jobs_bad_count_costs_no_other_job_its_progress_and_retained_messages_are_ignored(
    plane: PlaneDaemon,
) -> None:
    """Before: one entry with a count the daemon refuses (a tenant's worker printed inf)
    dropped the server's whole report, so every other job on the server stopped
    progressing and one that had reported part of its work failed at its plan's end.
    And a retained heartbeat of a dead agent, handed out again at every subscription,
    brought its server back after each reconnection of the daemon."""
    from controller.plane.link import Plane

    plane.submit("j")
    link = Plane(plane.c, plane.ex, MqttConfig("localhost"))
    t = link.topics
    entries = [{"job": "evil", "minibatches": 1e309, "worker_seconds": 1.0},
               {"job": "j", "minibatches": 2.0, "worker_seconds": 9.0}]  # fmt: skip
    report = {"version": 1, "server": "w0", "session": "a", "jobs": entries}
    assert link.take(t.progress("w0"), json.dumps(report).replace("Infinity", "1e309"))
    assert not link.take(t.heartbeat("p0"), Heartbeat("p0", "a").to_bytes(), retained=True)
    plane.ex.connected()
    plane.ex.review_sync()
    assert plane.stored("j") == (2.0, {"w0/a": [2.0, 9.0]})
    assert set(plane.ex.last_seen) == {"w0"}  # p0's retained heartbeat did not count


def test_a_job_reported_done_before_it_arrives_completes_only_once_it_has(
    plane: PlaneDaemon,
) -> None:
    """A report for the slot ahead counts (an agent's clock a boundary ahead). Before: a
    job reported done in the slot before its arrival completed there, stored with a
    completion slot before its arrival, a jct of 0 and the utility of a jct no schedule
    earns."""
    plane.submit("j")  # submitted in slot 0, arrives in slot 1
    ex = plane.ex
    ex.report(Progress("w0", "a", [TaskProgress("j", float(plane.TOTAL), 1.0)]))
    assert ex.review_sync() == []
    assert plane.state("j") == "admitted" and "j" in ex.review.pending  # reviewed again later
    plane.clock.advance(plane.config.slot_seconds)  # slot 1: it has arrived
    [done] = [e for e in ex.review_sync() if e.kind == "completed"]
    assert done.job_id == "j" and plane.state("j") == "completed"
    import asyncio

    view = asyncio.run(plane.c.get("j"))
    assert view.decision.jct == 1 and view.decision.completion_slot == 1


def test_a_large_plan_splits_into_parts_that_fit_and_go_back_together() -> None:
    """:meth:`Plan.split` gives parts of at most ``max_bytes`` that
    :class:`PlanParts` puts back together in any order, whatever else arrives between;
    a whole plan stays one message with the same bytes as before."""
    import random

    from controller.plane.topics import MAX_PLAN_PARTS, Plan, PlanParts, SlotPlan, Task

    rng = random.Random(7)

    def plan(epoch: int, n: int) -> Plan:
        tasks = [Task(f"job-{i:04d}-" + "x" * rng.randrange(0, 100), rng.randrange(1, 3), 0,
                      0.5, 100) for i in range(n)]  # fmt: skip
        cut = rng.randrange(0, n + 1)
        return Plan("w0", "worker", epoch, 60.0, 5.0, False,
                    SlotPlan(7, 420.0, tasks[:cut]), SlotPlan(8, 480.0, tasks[cut:]))  # fmt: skip

    small = plan(1, 3)
    assert small.split(4096) == [small] and b'"part"' not in small.to_bytes()
    for n in (0, 1, 40, 300):
        whole = plan(2, n)
        parts = whole.split(4096)
        assert all(len(p.to_bytes()) <= 4096 for p in parts)
        assert len(parts) == 1 or len(whole.to_bytes()) > 4096
        assert [p.part for p in parts] == list(range(len(parts)))
        back = PlanParts()
        other = plan(3, 300).split(4096)  # a newer epoch's parts, interleaved, incomplete
        got = None
        shuffled = [Plan.parse(p.to_bytes()) for p in parts]
        rng.shuffle(shuffled)
        for i, part in enumerate(shuffled):
            if i < len(other) - 1:
                assert back.add(Plan.parse(other[i].to_bytes())) is None
            result = back.add(part)
            assert (result is None) == (i < len(shuffled) - 1)
            got = result or got
        assert got is not None and got == whole  # tasks in order, header as sent

    # a part is version 2: an agent that predates parts (a reader of version 1) refuses
    # it rather than follow the first part as the whole plan; a whole plan stays 1
    part = plan(6, 300).split(4096)[0]
    assert json.loads(part.to_bytes())["version"] == 2
    assert json.loads(small.to_bytes())["version"] == 1
    with pytest.raises(SpecError, match=r"plan\.version: must be 1, got 2"):
        topics.decode(part.to_bytes(), "plan")  # what an older agent's parse does
    claimed = {**json.loads(part.to_bytes()), "version": 1}
    with pytest.raises(SpecError, match=r"plan\.version: 2 for a part"):
        Plan.parse(json.dumps(claimed))
    with pytest.raises(SpecError, match=r"plan\.parts: must be below"):
        Plan.parse(json.dumps({**json.loads(small.to_bytes()), "parts": MAX_PLAN_PARTS + 1}))
    first = plan(4, 300).split(4096)
    back = PlanParts()
    back.add(first[0])
    with pytest.raises(SpecError, match="does not match the epoch's other parts"):
        back.add(dataclasses.replace(first[1], slot_seconds=30.0))
    # the mutation audit: a part of another daemon's store (two under one prefix) of the
    # same epoch was taken into the plan, and a part numbered its plan's count (one no
    # daemon sends) was held as one of its parts (counted to complete it, one missing)
    with pytest.raises(SpecError, match="does not match the epoch's other parts"):
        back.add(dataclasses.replace(first[1], store="another-store"))
    with pytest.raises(SpecError, match=r"plan\.part: must be below plan\.parts"):
        back.add(dataclasses.replace(first[1], part=len(first)))
    same = [Task(f"j{i:03d}", 1, 0, 0.5, 100) for i in range(300)]
    many = Plan("w0", "worker", 5, 60.0, 5.0, False, SlotPlan(7, 420.0, same),
                SlotPlan(8, 480.0, []))  # fmt: skip
    header = dataclasses.replace(many, current=SlotPlan(7, 420.0, []), part=255, parts=256)
    with pytest.raises(ValueError, match="needs 300 parts"):  # one task a part
        many.split(len(header.to_bytes()) + 100)
    with pytest.raises(ValueError, match="one task of job 'j000' is over"):
        many.split(len(header.to_bytes()) + 10)
    assert mqtt_from_dict({"host": "h"}).max_plan_bytes == 200_000  # type: ignore[union-attr]
    with pytest.raises(SpecError, match=r"mqtt\.max_plan_bytes: must be >= 4096"):
        mqtt_from_dict({"host": "h", "max_plan_bytes": 1000})
    with pytest.raises(SpecError, match=r"mqtt\.max_plan_bytes: must be at most 16777216"):
        mqtt_from_dict({"host": "h", "max_plan_bytes": 1 << 30})


def test_part_topics_a_smaller_plan_leaves_are_cleared_once() -> None:
    """A plan in parts, then whole plans: the first whole one clears the part topics
    (empty retained messages), the next ones publish the plan alone (before: every later
    publish cleared them again, for good)."""
    from typing import cast

    from controller.plane.link import Plane as Link

    controller = cast(Any, argparse.Namespace(prune_hooks=[]))  # what the link reads of it
    execution = cast(Any, argparse.Namespace(unknown_hooks=[]))  # likewise
    link = Link(controller, execution, MqttConfig(host="h", max_plan_bytes=4096))
    tasks = [Task(f"job-{i:04d}-" + "x" * 60, 1, 0, 0.5, 100) for i in range(150)]
    big = Plan("w0", "worker", 1, 60.0, 5.0, False, SlotPlan(7, 420.0, tasks),
               SlotPlan(8, 480.0, []))  # fmt: skip
    small = dataclasses.replace(big, epoch=2, current=SlotPlan(7, 420.0, tasks[:2]))
    messages, parts = link._plan_messages(big)
    assert parts == len(messages) > 1
    assert [t for t, _ in messages] == [TOPICS_W0] + [f"{TOPICS_W0}/{k}" for k in range(1, parts)]
    link._parts["w0"] = parts  # as publish_round does once they are published
    for clears in (parts - 1, 0):
        messages, count = link._plan_messages(dataclasses.replace(small, epoch=small.epoch + 1))
        assert count == 1 and len(messages) == 1 + clears
        assert all(payload == b"" for _, payload in messages[1:])
        link._parts["w0"] = count


def test_a_plan_of_exactly_the_bound_goes_whole_and_deleted_jobs_wait_within_theirs() -> None:
    """A plan of exactly ``max_plan_bytes`` is published whole (one over it, in parts);
    the retained events of deleted jobs wait for a connection up to ``_MAX_TO_CLEAR``,
    the rest left retained (said), however many retention deletes."""
    from typing import cast

    from controller.plane import link as link_module
    from controller.plane.link import Plane as Link

    controller = cast(Any, argparse.Namespace(prune_hooks=[]))
    execution = cast(Any, argparse.Namespace(unknown_hooks=[]))
    tasks = [Task(f"job-{i:04d}-" + "x" * 60, 1, 0, 0.5, 100) for i in range(150)]
    plan = Plan("w0", "worker", 1, 60.0, 5.0, False, SlotPlan(7, 420.0, tasks),
                SlotPlan(8, 480.0, []))  # fmt: skip
    size = len(plan.to_bytes())
    exact = Link(controller, execution, MqttConfig(host="h", max_plan_bytes=size))
    assert exact._plan_messages(plan) == ([(TOPICS_W0, plan.to_bytes())], 1)
    under = Link(controller, execution, MqttConfig(host="h", max_plan_bytes=size - 1))
    assert under._plan_messages(plan)[1] > 1

    bound = link_module._MAX_TO_CLEAR
    exact.deleted([f"d{i}" for i in range(bound - 1)])
    exact.deleted(["last", "over", "over-too"])
    assert len(exact._to_clear) == bound and exact._to_clear[-1] == "last"
    exact.deleted(["more"])
    assert len(exact._to_clear) == bound


def test_a_rejection_is_published_unretained_and_every_other_job_event_retained() -> None:
    """A job event is retained on its topic (the latest of each job, for a subscriber
    that comes later), but a rejection: its submitter has its answer, and retained,
    one tenant's stream of priced-out submissions grew the broker every agent shares
    by a message each (:mod:`controller.plane.event_messages`)."""
    import asyncio
    from typing import cast

    from controller.events import Event
    from controller.plane.link import Plane as Link

    controller = cast(Any, argparse.Namespace(prune_hooks=[]))
    execution = cast(Any, argparse.Namespace(unknown_hooks=[]))
    link = Link(controller, execution, MqttConfig(host="h"))
    retained: dict[str, bool] = {}

    async def seen(topic: str, _payload: bytes, _qos: int, retain: bool) -> None:
        retained[topic.rsplit("/", 2)[-2]] = retain

    events = [Event(1, "decided", "no", 0, "rejected"), Event(2, "decided", "yes", 0, "admitted"),
              Event(3, "completed", "done", 4, "completed")]  # fmt: skip
    asyncio.run(link._publish_events(cast(Any, FakeMqtt(seen)), events))
    assert retained == {"no": False, "yes": True, "done": True}, retained


TOPICS_W0 = "oasis/v1/servers/w0/plan"


def _failed_once_agents_resent(plane: PlaneDaemon, ex: Any) -> list[Any]:
    """The ``failed`` events of ``ex``'s review once the broker is back and its agents
    had ``heartbeat_timeout`` to resend their counts."""
    ex.connected()
    wait = ex.mqtt.heartbeat_timeout + 1.0
    plane.mono[0] += wait
    plane.clock.advance(wait)
    return [e for e in ex.review_sync() if e.kind == "failed"]


def test_a_job_planned_while_the_daemon_was_down_fails_rather_than_completes(
    plane: PlaneDaemon,
) -> None:
    """The time audit: the daemon down from slot 1 to slot 5, a job planned in slots
    1-3 (agents hold a plan for the current and next slot only, so slots 2-3 never
    reached them) completed at the restart's first tick with its whole utility, and the
    agents' counts came too late. Now it waits for its agents' reports like a job
    short of its work, and fails naming the slots whose plans never went out; a job
    planned only in slots whose plans went out completes as before."""
    import asyncio

    every_agent_heard(plane)  # a job nobody reports on completes unless unsent

    from controller.plane.execution import Execution

    long = asyncio.run(plane.c.submit({**plane.SPEC, "id": "long", "epochs": 6}))
    short = plane.submit("short")
    slots = lambda view: {a["slot"] for a in view.decision.allocations if a.get("workers")}  # noqa: E731
    assert slots(short) == {1} and max(slots(long)) >= 2, (slots(short), slots(long))
    assert plane.ex.plans_sync({})  # slot 0's round: plans of slots 0 and 1 go out
    plane.clock.advance(5 * plane.config.slot_seconds)  # down until slot 5
    plane.c._advance_window()

    restarted = Execution(plane.c, MqttConfig("localhost"), monotonic=lambda: plane.mono[0])
    restarted.load()
    assert restarted.review.unsent == [(2, 4)]
    plane.c.execution = restarted
    asyncio.run(plane.c.tick())
    assert plane.state("short") == "completed"
    assert plane.state("long") == "running" and "long" in restarted.review.overdue
    assert restarted.plans_sync({})  # slot 5's plans go out; then a second restart
    restarted = Execution(plane.c, MqttConfig("localhost"), monotonic=lambda: plane.mono[0])
    restarted.load()
    assert restarted.review.unsent == [(2, 4)]  # kept: "long" still waits for its agents
    plane.c.execution = restarted
    plane.c._ticked_slot = -1  # a new process ticks its first slot again
    asyncio.run(plane.c.tick())
    assert plane.state("long") == "running" and "long" in restarted.review.overdue
    failed = _failed_once_agents_resent(plane, restarted)
    assert [(e.job_id, e.detail["reason"]) for e in failed] == [("long", "plan_not_sent")]
    assert failed[0].detail["not_sent_slots"] == [[2, 4]]
    reason = plane.c._get_sync("long").decision.reason
    assert "; the plans of slots 2-4 never reached its agents (oasisd, its broker" in reason
    assert plane.state("long") == "failed"


def test_a_job_planned_while_the_broker_was_out_fails_rather_than_completes(
    plane: PlaneDaemon,
) -> None:
    """The plane audit: the daemon up, the broker down from slot 1 to slot 5, a job
    planned in slots 1-3 (slot 0's round sent the plans of slots 0 and 1 only) completed
    at its plan's end with its whole utility, no agent having run it (0 of its
    mini-batches reported; seen with a real broker stopped). Now the slots begun since
    the latest round's next one count as unsent, as the slots of a daemon down do, and
    the next round notes them for good."""
    import asyncio

    long = asyncio.run(plane.c.submit({**plane.SPEC, "id": "long", "epochs": 6}))
    slots = lambda view: {a["slot"] for a in view.decision.allocations if a.get("workers")}  # noqa: E731
    assert min(slots(long)) == 1 and max(slots(long)) >= 2, slots(long)
    assert plane.ex.plans_sync({})  # slot 0's round: plans of slots 0 and 1 go out
    plane.ex.disconnected()  # no round until slot 5
    plane.c.execution = plane.ex  # the slot clock asks it of jobs whose plan ended
    plane.clock.advance(5 * plane.config.slot_seconds)
    asyncio.run(plane.c.tick())
    assert plane.state("long") == "running" and "long" in plane.ex.review.overdue
    assert plane.ex.plans_sync({})  # back: slot 5's plans go out
    assert plane.ex.review.unsent == [(2, 4)]
    plane.ex.connected()
    wait = plane.ex.mqtt.heartbeat_timeout + 1.0  # for its agents to resend their counts
    plane.mono[0] += wait
    plane.clock.advance(wait)
    failed = [e for e in plane.ex.review_sync() if e.kind == "failed"]
    assert [(e.job_id, e.detail["reason"]) for e in failed] == [("long", "plan_not_sent")]
    assert failed[0].detail["not_sent_slots"] == [[2, 4]]


def test_a_job_admitted_after_the_last_round_with_the_broker_out_fails_rather_than_completes(
    plane: PlaneDaemon,
) -> None:
    """The plane audit, by job: slot 0's round sent the plans of slots 0 and 1; then the
    broker went out and a job was admitted, planned in slot 1 only. Slot 1 was that
    round's, so the slot-wide rule counted it sent, and the job completed at its plan's
    end with its whole utility, no agent having been sent its plan (with a real broker
    killed: 0 mini-batches reported). Now a plan written after the latest round that
    went out counts as unsent for its slots before the next round's, across restarts
    (before that round: read from its stored event; after: kept with the plane's state),
    while a job whose plan went out before the broker did completes as before."""
    import asyncio

    every_agent_heard(plane)  # a job nobody reports on completes unless unsent

    from controller.plane.execution import Execution

    sent = plane.submit("sent")
    assert plane.ex.plans_sync({})  # slot 0's round: "sent"'s plan goes out
    plane.ex.disconnected()  # the broker is out from here until slot 3
    late = plane.submit("late")
    slots = lambda view: {a["slot"] for a in view.decision.allocations if a.get("workers")}  # noqa: E731
    assert slots(sent) == slots(late) == {1}, (slots(sent), slots(late))
    plane.clock.advance(3 * plane.config.slot_seconds)
    plane.c._advance_window()

    def restart() -> Execution:
        ex = Execution(plane.c, MqttConfig("localhost"), monotonic=lambda: plane.mono[0])
        ex.load()
        plane.c.execution = ex
        plane.c._ticked_slot = -1  # a new process ticks its first slot again
        return ex

    ex = restart()  # oasisd restarted too, before plans went out again
    asyncio.run(plane.c.tick())
    assert plane.state("sent") == "completed"
    assert plane.state("late") == "running" and "late" in ex.review.overdue  # was: completed
    assert ex.plans_sync({})  # slot 3's round: the broker is back
    assert ex.review.sent.runs == {"late": [(0, 2)]}
    ex = restart()  # kept in the store
    assert ex.review.sent.runs == {"late": [(0, 2)]}
    asyncio.run(plane.c.tick())
    assert "late" in ex.review.overdue
    failed = _failed_once_agents_resent(plane, ex)
    assert [(e.job_id, e.detail["reason"]) for e in failed] == [("late", "plan_not_sent")]
    assert failed[0].detail["not_sent_slots"] == [[1, 1]]  # its slot, not the round's
    reason = plane.c._get_sync("late").decision.reason  # was: "the plans of slots 1 ..."
    assert "; the plan of slot 1 never reached its agents (oasisd, its broker" in reason
    assert plane.state("late") == "failed"
    ex._prune()
    assert ex.review.sent.runs == {}  # kept for active jobs only


def test_a_job_moved_by_a_cordon_after_the_last_round_with_the_broker_out_fails(
    tmp_path: Path,
) -> None:
    """As a job admitted after the latest round, with the broker out: one re-placed
    (its server cordoned) after it, in the slot that round held, was in no round that
    went out, its agents holding its old plan on the cordoned server only."""
    import asyncio

    workers = [{"name": f"w{i}", "kind": "worker", "capacity": {"gpu": 4, "bandwidth": 10}}
               for i in range(2)]  # fmt: skip
    cluster = {**CLUSTER, "servers": [*workers, CLUSTER["servers"][1]]}
    plane = PlaneDaemon(tmp_path, cluster)
    try:
        view = plane.submit("moved")
        placed = {(a["slot"], a["server"]) for a in view.decision.allocations if a.get("workers")}
        assert len(placed) == 1 and min(placed)[0] == 1, placed
        assert plane.ex.plans_sync({})  # slot 0's round: its plan of slot 1 goes out
        plane.ex.disconnected()  # the broker is out until slot 3
        _, events = plane.c._cordon_sync(min(placed)[1])  # from slot 1 on
        assert [(e.job_id, e.kind) for e in events if e.job_id] == [("moved", "replanned")]
        plane.clock.advance(3 * plane.config.slot_seconds)
        plane.c._advance_window()
        plane.c.execution = plane.ex
        asyncio.run(plane.c.tick())
        assert plane.state("moved") == "running" and "moved" in plane.ex.review.overdue
        assert plane.ex.plans_sync({})  # slot 3's round
        assert plane.ex.review.sent.runs == {"moved": [(1, 2)]}
    finally:
        plane.c.close()


def test_a_round_the_broker_was_lost_in_does_not_count_as_sent(plane: PlaneDaemon) -> None:
    """The plane audit: a round counted as sent once its epoch was stored, before its
    plans were published. The broker lost in the middle of slot 0's round (no PUBACK)
    and out until slot 3, a job admitted just before that round, planned in slot 1, was
    counted sent and completed at its plan's end with its whole utility, no agent having
    had its plan. Now a round counts once the broker acknowledged its plans."""
    import asyncio

    import aiomqtt

    from controller.plane.link import Plane

    late = plane.submit("late")
    assert {a["slot"] for a in late.decision.allocations if a.get("workers")} == {1}
    link = Plane(plane.c, plane.ex, MqttConfig("localhost"))

    async def lost(topic: str, _payload: bytes, _qos: int, _retain: bool) -> None:
        raise aiomqtt.MqttError("the connection was lost")  # no PUBACK ever

    client = FakeMqtt(lost)
    client.timeout = 0.2
    with pytest.raises(aiomqtt.MqttError):
        asyncio.run(link.publish_round(client))  # type: ignore[arg-type]
    assert plane.ex.epoch == 1  # taken: agents must never see it again below
    assert plane.ex.planned_slot is None and plane.ex.review.sent_through is None  # was 0, 1
    plane.ex.disconnected()
    plane.clock.advance(3 * plane.config.slot_seconds)
    plane.c._advance_window()
    plane.c.execution = plane.ex
    asyncio.run(plane.c.tick())
    assert plane.state("late") == "running" and "late" in plane.ex.review.overdue  # was: completed
    assert asyncio.run(link.publish_round(FakeMqtt()))  # type: ignore[arg-type]
    assert plane.ex.planned_slot == 3 and plane.ex.review.sent.runs == {"late": [(0, 2)]}


def test_a_job_decided_while_a_round_begins_counts_as_sent_with_it(plane: PlaneDaemon) -> None:
    """A round's newest event is read with its plans, in one snapshot. Read when the
    round began, a job decided between that and the build was in the round's plans but
    counted as written after it: at the next round that went out, a slot later, its
    slots before it were noted as never sent, and the job failed ``plan_not_sent``
    though its agents had its plan (a review of the plane audit's fix)."""
    plane.submit("first")
    begun = plane.ex.plans_begin({})
    decided = plane.submit("between")  # committed after the round began, before its build
    begun, plans = plane.ex.plans_build(begun)
    planned = {a["slot"] for a in decided.decision.allocations if a.get("workers")}
    assert 1 in planned, planned
    assert any(t.job == "between" for p in plans for t in p.current.tasks + p.next.tasks)
    plane.ex.plans_end(begun, plans)
    plane.ex.plans_out(begun)  # acknowledged: slot 0's round went out with its plan
    plane.clock.advance(2 * plane.config.slot_seconds)
    plane.c._advance_window()
    assert plane.ex.plans_sync({})  # slot 2's round
    assert plane.ex.review.sent.runs == {}  # was: {"between": [(0, 1)]}


def test_an_agent_sets_aside_the_jobs_it_no_longer_runs_and_carries_their_counts_on() -> None:
    """Every job an agent ever ran was looked at every 50 ms step and in every report
    (31% of a core after 20,000 jobs, the resource audit). A job out of its plan, its
    counts sent two slots ago, is set aside; a plan that brings it back carries its
    counts on (the daemon keeps one count per agent session: a count from 0 again would
    lose what it did)."""
    now = [100.0]
    agent = Agent("w0", MqttConfig("localhost"), wall=lambda: now[0])
    agent.accept(plan(1, workers=2))  # j1 in slot 5 (100-110 s), nothing in slot 6
    agent.step(5.0)
    done = agent.tasks["j1"].minibatches
    assert done == pytest.approx(20.0)
    assert agent.forget_idle(now=1000.0) == 0  # planned, and never reported
    now[0] = 111.0  # slot 6: j1 is no longer planned here
    [report] = agent.reports()
    agent._reported["j1"] = (report.jobs[0].minibatches, report.jobs[0].worker_seconds)
    agent._sent_at["j1"] = 1000.0
    assert agent.forget_idle(now=1000.0 + 19.0) == 0  # sent within two slots (20 s)
    assert agent.forget_idle(now=1000.0 + 20.0) == 1
    assert agent.tasks == {} and agent.reports() == []
    # a later plan brings j1 back: it goes on from its count
    agent.accept(plan(2, slot=9, starts=140.0))
    now[0] = 141.0
    agent.step(1.0)
    assert agent.tasks["j1"].minibatches == pytest.approx(done + 4.0)
    [again] = agent.reports()
    assert again.jobs[0].minibatches == pytest.approx(done + 4.0)


def test_an_agent_drops_the_counts_of_jobs_no_plan_can_bring_back() -> None:
    """A job set aside kept its counts for the agent's whole life: one entry for every
    job the server ever ran (the soak audit). A plan that says the daemon's window ``T``
    lets the agent drop them once no plan can name the job again, ``T + 1`` slots after
    its run and a margin; a plan of an older daemon, which does not say it, keeps them."""
    from datetime import UTC, datetime

    from controller.plane.plans import run_of
    from controller.plane.set_aside import MARGIN_SLOTS

    run = run_of(datetime.fromtimestamp(99.0, UTC).replace(tzinfo=None))  # admitted at 99 s
    jobs = [f"j{i}" for i in range(50)]

    def plan_of(epoch: int, slot: int, window: int | None, names: list[str]) -> Plan:
        tasks = [Task(j, 1, 0, 0.5, 40, run) for j in names]
        return Plan("w0", "worker", epoch, 10.0, 0.5, False,
                    SlotPlan(slot, slot * 10.0 + 50.0, tasks),
                    SlotPlan(slot + 1, slot * 10.0 + 60.0, []), window=window)  # fmt: skip

    def set_aside(window: int | None) -> tuple[Agent, list[float]]:
        now = [100.0]
        agent = Agent("w0", MqttConfig("localhost"), wall=lambda: now[0])
        agent.accept(plan_of(1, 5, window, jobs))  # slot 5: 100-110 s
        agent.step(5.0)
        now[0] = 111.0  # slot 6: none of them is planned here any more
        for report in agent.reports():
            for entry in report.jobs:
                agent._reported[entry.job] = (entry.minibatches, entry.worker_seconds)
                agent._sent_at[entry.job] = 1000.0
        assert agent.forget_idle(now=1020.0) == len(jobs)
        assert len(agent._idle) == len(jobs)
        return agent, now

    window = 4
    last = 99.0 + (window + 1 + MARGIN_SLOTS) * 10.0  # the run's last slot, and the margin
    agent, now = set_aside(window)
    agent.accept(plan_of(2, 9, window, []))
    now[0] = last - 1.0
    agent.forget_idle(now=1030.0)
    assert len(agent._idle) == len(jobs)  # a plan may still bring them back
    now[0] = last + 1.0
    agent.forget_idle(now=1040.0)
    assert len(agent._idle) == 0
    # an older daemon's plans say no window: every job's counts are kept, as before
    old, now = set_aside(None)
    old.accept(plan_of(2, 30, None, []))
    now[0] = 10_000.0
    old.forget_idle(now=1040.0)
    assert len(old._idle) == len(jobs)
    # the field round-trips, and is left out of the payload when not said
    said = plan_of(3, 5, window, jobs[:2])
    assert Plan.parse(said.to_bytes()) == said and b'"window":4' in said.to_bytes()
    assert b"window" not in plan_of(3, 5, None, []).to_bytes()


def test_runs_of_unsent_slots_that_overlap_or_meet_are_one() -> None:
    from controller.plane.sent_plans import joined_runs

    assert joined_runs([(2, 4), (3, 6), (8, 9), (7, 7), (12, 12)]) == [(2, 9), (12, 12)]
    assert joined_runs([]) == []


def test_the_newest_runs_of_unsent_slots_are_kept(plane: PlaneDaemon) -> None:
    """Rounds of plans with slots between them that none went out in (the broker out
    again and again): the newest :data:`MAX_UNSENT_RUNS` runs are kept, the jobs planned
    in them still running; the oldest go."""
    from controller.plane.job_review import MAX_UNSENT_RUNS

    review = plane.ex.review
    review.plans_sent(0)
    for k in range(1, MAX_UNSENT_RUNS + 4):
        review.plans_sent(3 * k)  # slot 3k - 1 had no round
    assert review.unsent == [(3 * k - 1, 3 * k - 1) for k in range(4, MAX_UNSENT_RUNS + 4)]


def test_a_slot_begun_without_a_round_of_its_own_counts_as_unsent(plane: PlaneDaemon) -> None:
    """The broker out now: the slots since the latest round's next one that have begun
    without a round count as unsent, from the first such slot on."""
    import asyncio

    review = plane.ex.review
    review.plans_sent(0)  # for slots 0 and 1
    for slot, unsent in ((1, []), (2, []), (3, [(2, 2)]), (4, [(2, 3)])):
        plane.clock.advance(plane.config.slot_seconds)
        asyncio.run(plane.c.tick())
        assert plane.c.slot == slot and review._unsent_runs() == unsent, slot


def test_a_sent_event_stored_past_the_stores_newest_is_taken_down_to_it() -> None:
    """The mutation audit: with the stored ``sent_event`` taken as it was, past the
    store's newest event (a store rewound, or edited), every test passed; the plans
    written after, numbered up to it again, counted as sent, and a job no agent was
    sent completed with its whole utility rather than failing ``plan_not_sent``."""
    from controller.plane.sent_plans import SentPlans

    sent = SentPlans()
    sent.load(500, {"j": [[3, 4], [9, 2], [1, 1], "x"]}, newest=40, oldest=2)
    assert sent.sent_event == 40
    assert sent.runs == {"j": [(3, 4)]}  # runs ended before ``oldest``, or not runs: dropped
    fresh = SentPlans()
    fresh.load(None, None, newest=40, oldest=0)  # kept before these were: all sent
    assert (fresh.sent_event, fresh.runs) == (40, {})


def test_a_worker_line_over_the_limit_is_skipped_and_the_next_counts() -> None:
    """A line over the pipe's 64 KiB, in one write with the count after it: the count
    was skipped as if it were the long line's tail; a long line of digits is no count."""
    import asyncio

    agent = Agent("w0", MqttConfig("localhost"))

    async def counted(script: str) -> float:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE
        )
        count = [0.0]
        assert proc.stdout is not None
        await asyncio.wait_for(agent._read_counts(proc.stdout, count), 30)
        await proc.wait()
        return count[0]

    write = "import sys; sys.stdout.write"
    assert asyncio.run(counted(f"{write}('x' * 70000 + '\\n42\\n')")) == 42
    assert asyncio.run(counted(f"{write}('1' * 70000 + '7\\n5\\n')")) == 5
    assert asyncio.run(counted(f"{write}('3\\n4')")) == 4  # the last line, no newline


_AGENT_SCRIPT = """
import sys, time
from controller.commands.agent import run_agent
from controller.plane.agent import Agent
from controller.plane.settings import MqttConfig
from controller.plane.topics import Plan, SlotPlan, Task

now = time.time()
task = Task("j1", 2, 0, minibatch_seconds=0.5, minibatches=40)
plan = Plan("w0", "worker", 1, 3600.0, 0.5, False, SlotPlan(5, now - 10, [task]),
            SlotPlan(6, now + 3590, [task]))
# no broker there: the agent retries it, and runs its plan's workers meanwhile
agent = Agent("w0", MqttConfig("127.0.0.1", int(sys.argv[1])),
              command=f"echo $$ >> {sys.argv[2]}; sleep 60")
agent.accept(plan)
run_agent(agent)
print("stopped")
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_agent_stops_its_workers_on_sigterm_as_on_sigint(tmp_path: Path, sig: int) -> None:
    """The CLI audit: SIGTERM (kill, a service manager's stop) ended the agent at once
    and left its worker commands running (each in its own session), holding the server
    while the daemon planned other tenants' jobs on it."""
    pids = tmp_path / "pids"
    agent = subprocess.Popen([sys.executable, "-c", _AGENT_SCRIPT, str(free_port()), str(pids)],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (pids.exists() and len(pids.read_text().split()) == 2):
            assert time.monotonic() < deadline and agent.poll() is None
            time.sleep(0.1)
        workers = [int(p) for p in pids.read_text().split()]
        agent.send_signal(sig)
        out, _ = agent.communicate(timeout=30)
        assert agent.returncode == 0 and "stopped" in out
    finally:
        if agent.poll() is None:  # reaped, its pipe closed: no warning in the next test
            agent.kill()
            agent.communicate()

    from tests.test_agent_workers import alive

    deadline = time.monotonic() + 10
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in workers if alive(p)]


def test_a_slow_jobs_re_plan_over_its_work_survives_a_rebuild(plane: PlaneDaemon) -> None:
    """A job at a quarter of its planned pace is re-planned with more worker-slots than
    its spec's work. Before, the next rebuild (a restart, a store outage, a takeover)
    read that plan as a hand edit and failed the job (the audits of jobs off their plan
    and of interleavings); the re-plan now records what it holds."""
    from controller.store import JobRow

    view = plane.submit("slow")
    ex = plane.ex
    planned = 3600.0 * plane.c._ledger.schedule("slow").work() / PlaneDaemon.TOTAL
    for i in range(1, 9):  # a quarter of the planned pace
        ex.report(Progress("w0", "a", [TaskProgress("slow", float(i), i * 4 * planned)]))
    events = ex.review_sync()
    assert [(e.kind, e.detail["reason"]) for e in events] == [("replanned", "slow")], events
    held = plane.c._ledger.schedule("slow").work()
    assert held > view.decision.work, (held, view.decision.work)
    with plane.c.db.session() as session:
        row = session.get(JobRow, "slow")
        assert row is not None and row.detail["planned_work"] == held
    before = plane.c._ledger.schedule("slow")
    plane.c.between_decisions(plane.c._reload)  # what a restart or an outage rebuild does
    assert plane.state("slow") == "admitted"
    after = plane.c._ledger.schedule("slow")
    assert after.start == before.start and (after.workers == before.workers).all()
    assert (after.ps == before.ps).all()


def test_a_slow_jobs_re_plan_without_a_positive_payoff_is_not_taken(
    plane: PlaneDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-plan is taken only if its payoff is over the admission threshold: one that
    found a schedule worth no more than its cost reports the job ``behind`` and leaves
    its plan as it was (the mutation audit: taking any schedule found, its payoff
    unread, passed every test; the job's extension would have cost the other tenants
    capacity priced above what it is worth)."""
    import dataclasses

    from pricing import ADMIT_THRESHOLD
    from pricing.replan import replan_remaining as real

    def worth_nothing(*args: Any, **kwargs: Any) -> Any:
        best, whole = real(*args, **kwargs)
        assert best.schedule is not None  # a schedule found, at a payoff of nothing
        return dataclasses.replace(best, payoff=ADMIT_THRESHOLD), whole

    monkeypatch.setattr("controller.plane.job_review.replan_remaining", worth_nothing)
    plane.submit("slow")
    ex = plane.ex
    before = plane.c._ledger.schedule("slow")
    planned = 3600.0 * before.work() / PlaneDaemon.TOTAL
    for i in range(1, 9):  # a quarter of the planned pace
        ex.report(Progress("w0", "a", [TaskProgress("slow", float(i), i * 4 * planned)]))
    events = ex.review_sync()
    assert [(e.kind, e.detail["reason"]) for e in events] == [("behind", "slow")], events
    after = plane.c._ledger.schedule("slow")
    assert after.start == before.start and (after.workers == before.workers).all()


def test_slow_jobs_re_plans_take_turns_by_submitter_and_by_review(tmp_path: Path) -> None:
    """Each slow job's re-plan is a search in the decision thread; before, every job
    with new counts was searched in one turn, and the first counts of a slot come for
    every running job at once: one tenant's many slow jobs held every other tenant's
    calls for all their searches, at every slot. Now one submitter's re-plans take at
    most ``replan_steps_per_submitter`` steps a slot, all of one review's at most
    ``replan_steps_per_review`` (the first always runs: 1 here lets exactly one)."""
    import asyncio

    wide = {**CLUSTER, "servers": [{"name": "w0", "kind": "worker",
                                    "capacity": {"gpu": 8, "bandwidth": 10}},
                                   CLUSTER["servers"][1]]}  # fmt: skip
    plane = PlaneDaemon(tmp_path, wide, limits={"replan_steps_per_submitter": 1,
                                                "replan_steps_per_review": 1})  # fmt: skip
    try:
        for by, job_id in (("alice", "a1"), ("alice", "a2"), ("bob", "b1")):  # all in slot 1
            view = asyncio.run(plane.c.submit({**PlaneDaemon.SPEC, "id": job_id}, by=by))
            assert view.decision.admitted and view.decision.allocations[0]["slot"] == 1
        ex = plane.ex

        def slow(*keys: str) -> None:  # a quarter of the planned pace, as above
            for key in keys:
                planned = 3600.0 * plane.c._ledger.schedule(key).work() / PlaneDaemon.TOTAL
                for i in range(1, 9):
                    ex.report(Progress("w0", "a", [TaskProgress(key, float(i), i * 4 * planned)]))

        def replanned() -> list[str]:
            events = ex.review_sync()
            return [e.job_id for e in events if e.kind == "replanned"]

        slow("alice:a1", "alice:a2", "bob:b1")
        assert replanned() == ["alice:a1"]  # the review's budget: the rest at the next
        assert replanned() == ["bob:b1"]  # alice's budget of the slot is spent: a2 waits
        assert replanned() == []
        slow("alice:a2")
        assert replanned() == []  # still alice's slot
        plane.clock.advance(plane.config.slot_seconds)
        slow("alice:a1", "alice:a2")  # both alice's, and slow: a2, not tried yet, first
        assert replanned() == ["alice:a2"]
    finally:
        plane.c.close()


def test_jobs_reported_done_together_complete_in_one_transaction_a_review_at_most_so_many(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, each job reported done was completed in a transaction of its own, all in
    one turn of the decision thread: 1,000 of one tenant's jobs done at once held every
    other tenant's calls for 7.7 s. They now complete together, at most
    ``COMPLETIONS_PER_REVIEW`` a review (the rest at the next, a second later), and a
    store outage at that commit leaves every one of them to complete later, though no
    agent reports them again."""
    import asyncio

    from controller.plane import job_review
    from controller.store import StoreUnavailableError

    monkeypatch.setattr(job_review, "COMPLETIONS_PER_REVIEW", 2)
    wide = {**CLUSTER, "servers": [{"name": "w0", "kind": "worker",
                                    "capacity": {"gpu": 8, "bandwidth": 10}},
                                   CLUSTER["servers"][1]]}  # fmt: skip
    plane = PlaneDaemon(tmp_path, wide)
    try:
        keys = []
        for job_id in ("d1", "d2", "d3"):  # all in slot 1
            view = asyncio.run(plane.c.submit({**PlaneDaemon.SPEC, "id": job_id}, by="alice"))
            assert view.decision.admitted and view.decision.allocations[0]["slot"] == 1
            keys.append(view.id)
        ex = plane.ex
        plane.clock.advance(plane.config.slot_seconds)
        for key in keys:
            ex.report(Progress("w0", "a", [TaskProgress(key, float(PlaneDaemon.TOTAL), 60.0)]))
        write = plane.c._write

        def down() -> Any:
            raise StoreUnavailableError("store down")

        monkeypatch.setattr(plane.c, "_write", down)
        with pytest.raises(StoreUnavailableError):
            ex.review_sync()
        monkeypatch.setattr(plane.c, "_write", write)
        assert [plane.state(k) for k in keys] == ["admitted"] * 3
        first = ex.review_sync()  # no new report: kept to complete all the same
        assert [(e.kind, e.job_id) for e in first] == [("completed", k) for k in keys[:2]]
        assert [(e.kind, e.job_id) for e in ex.review_sync()] == [("completed", keys[2])]
        assert [plane.state(k) for k in keys] == ["completed"] * 3
        assert ex.review_sync() == []
    finally:
        plane.c.close()


def test_a_job_whose_workers_report_no_mini_batch_is_reported_behind_once(
    plane: PlaneDaemon,
) -> None:
    """The pace fit reads worker-seconds without a mini-batch as start-up time: a job
    whose workers did nothing (hung, or printing no counts) showed as running on plan
    until its plan ended (the audit of jobs that do not follow their plan)."""
    view = plane.submit("stuck")
    planned = view.decision.work * 3600.0
    kinds = []
    for i in range(1, 9):
        spent = i * planned / 4  # half its plan's worker-seconds at the second report
        plane.ex.report(Progress("w0", "a", [TaskProgress("stuck", 0.0, spent)]))
        kinds.append([(e.kind, e.detail.get("reason")) for e in plane.ex.review_sync()])
    assert kinds == [[], [("behind", "no_progress")], [], [], [], [], [], []], kinds
    assert plane.state("stuck") == "admitted"


def test_a_no_progress_report_survives_a_store_outage_and_is_said_once_across_restarts(
    plane: PlaneDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second review: the job was marked as reported before the event's commit, so
    a store outage at that moment lost it for good; and a restarted daemon said it
    again."""
    from controller.plane.execution import Execution
    from controller.store import StoreUnavailableError

    view = plane.submit("stuck")
    spent = view.decision.work * 3600.0  # its whole plan, no mini-batch
    plane.ex.report(Progress("w0", "a", [TaskProgress("stuck", 0.0, spent)]))
    write = plane.c._write

    def down() -> Any:
        monkeypatch.setattr(plane.c, "_write", write)  # back for the next review
        raise StoreUnavailableError("the store is unavailable: a test")

    monkeypatch.setattr(plane.c, "_write", down)
    try:
        lost = plane.ex.review_sync()
    except StoreUnavailableError:
        lost = []
    assert not [e for e in lost if e.kind == "behind"]
    assert plane.c._write == write  # the outage happened
    again = plane.ex.review_sync()
    assert [(e.kind, e.detail["reason"]) for e in again] == [("behind", "no_progress")]
    restarted = Execution(plane.c, MqttConfig("localhost"), monotonic=lambda: plane.mono[0])
    restarted.load()
    restarted.report(Progress("w0", "b", [TaskProgress("stuck", 0.0, spent + 1.0)]))
    assert [e for e in restarted.review_sync() if e.kind == "behind"] == []


def test_two_agents_beating_for_one_server_at_once_are_said_and_a_restart_is_not(
    plane: PlaneDaemon,
) -> None:
    """Two agents for one server (a unit copied to another machine, a typo in --node)
    both run its workers and its jobs' progress counts from both: nothing said so. An
    agent restarted (its old session silent before the new one beats) is not that."""
    from structlog.testing import capture_logs

    ex, beat = plane.ex, plane.ex.mqtt.heartbeat_seconds

    def at(offset: float, server: str, session: str) -> None:
        plane.mono[0] = offset
        ex.heartbeat(Heartbeat(server, session))

    with capture_logs() as logs:
        for i in range(4):  # w0: a restart; session b takes over from a
            at(i * beat, "w0", "a")
        for i in range(4, 8):
            at(i * beat, "w0", "b")
        assert ex.agents.twins == {}
        for i in range(8, 12):  # p0: two at once, in turn
            at(i * beat, "p0", "c")
            at(i * beat + 0.5, "p0", "d")
    said = [e for e in logs if e["event"].startswith("two agents beat for one server")]
    assert [e["server"] for e in said] == ["p0"], said
    assert (said[0]["counted"], said[0]["ignored"]) == ("c", "d")
    assert ex.agents.twins == {"p0": ("c", "d")}
    assert _metric(plane, "oasis_servers_with_two_agents") == [({}, 1.0)]
    # only the first one's progress counts while both beat (the audit: counted from
    # both, two jobs completed a slot or two early)
    ex._reports.take()
    for session in ("c", "d"):
        ex.report(Progress("p0", session, [TaskProgress("j", 1.0, 1.0)]))
    assert [r.progress.session for r in ex._reports.take()] == ["c"]
    # one of them stopped: the other alone past the heartbeat timeout, no longer two
    for i in range(12, 12 + int(ex.mqtt.heartbeat_timeout / beat) + 2):
        at(i * beat, "p0", "d")
    assert ex.agents.twins == {}
    assert _metric(plane, "oasis_servers_with_two_agents") == [({}, 0.0)]
    # the ignored one alone: said, and shown (its jobs' progress counts for nothing)
    assert ex.agents.ignored_alone == {"p0": "d"}
    assert _metric(plane, "oasis_servers_with_only_ignored_agents") == [({}, 1.0)]
    # a new agent beside the ignored one (the re-audit: a real agent restarted there was
    # paired with the ignored twin as the second, and ignored for good): it counts
    start = (12 + int(ex.mqtt.heartbeat_timeout / beat) + 2) * beat
    for i in range(4):
        at(start + i * beat, "p0", "d")
        at(start + i * beat + 0.5, "p0", "e")
    assert ex.agents.twins == {"p0": ("e", "d")} and ex.agents.ignored_alone == {}
    ex._reports.take()
    for session in ("d", "e"):
        ex.report(Progress("p0", session, [TaskProgress("j", 1.0, 1.0)]))
    assert [r.progress.session for r in ex._reports.take()] == ["e"]
    # ... but the second's counts never count: cumulative over the time both ran, they
    # were added in full once the first stopped (the review), and after a restart
    ex.report(Progress("p0", "d", [TaskProgress("j", 2.0, 2.0)]))
    assert ex._reports.take() == []
    ex.review_sync()  # the ignored session is stored
    from controller.plane.execution import Execution

    restarted = Execution(plane.c, MqttConfig("localhost"), monotonic=lambda: plane.mono[0])
    restarted.load()
    restarted.report(Progress("p0", "d", [TaskProgress("j", 3.0, 3.0)]))
    restarted.report(Progress("p0", "e", [TaskProgress("j", 1.0, 1.0)]))  # a new session
    assert [r.progress.session for r in restarted._reports.take()] == ["e"]


def test_one_agent_churning_sessions_does_not_unignore_another_servers_twin(
    plane: PlaneDaemon,
) -> None:
    """The sessions whose progress never counts (the second of two agents that beat for
    one server at once) were bounded over all servers, the oldest going first: one
    agent beating with ever new sessions beside its own (a bug, or a forger on its own
    topic; 3 new ones a beat interval) pushed another server's ignored twin out within
    minutes, and that twin's whole cumulative count then counted for the other tenants'
    jobs there. Each server's ignored sessions are bounded on their own now."""
    from controller.plane.agent_sessions import MAX_IGNORED_PER_SERVER, MAX_IGNORED_SESSIONS

    ex, beat = plane.ex, plane.ex.mqtt.heartbeat_seconds
    t = 0.0

    def beats(server: str, *sessions: str, times: int = 3) -> None:
        nonlocal t
        for _ in range(times):
            t += beat
            plane.mono[0] = t
            for session in sessions:
                ex.heartbeat(Heartbeat(server, session))

    beats("p0", "c", "d")  # p0's twin: d never counts
    assert ex.agents.twins == {"p0": ("c", "d")}
    for i in range(0, 2 * MAX_IGNORED_SESSIONS, 3):  # w0 churns sessions beside its own
        beats("w0", "own", *(f"x{i + k}" for k in range(3)))
    ex._reports.take()
    ex.report(Progress("p0", "d", [TaskProgress("j", 5.0, 5.0)]))
    assert ex._reports.take() == []  # still ignored
    ours = [k for k in ex.agents.ignored_sessions if k.startswith("w0/")]
    assert len(ours) == MAX_IGNORED_PER_SERVER
    # stored and restored with the same bounds
    ex.review_sync()
    from controller.plane.execution import Execution

    restarted = Execution(plane.c, MqttConfig("localhost"), monotonic=lambda: plane.mono[0])
    restarted.load()
    assert "p0/d" in restarted.agents.ignored_sessions


def test_past_the_bound_over_all_servers_the_busiest_servers_ignored_sessions_go() -> None:
    """Past :data:`MAX_IGNORED_SESSIONS` over all servers (a large cluster), the oldest
    ignored session of the server that has the most goes, never another server's lone
    one (its twin's whole count would then count for that server's jobs), however old;
    a stored list is taken newest last, the oldest left out. An agent's plans are of
    another store only against this daemon's own store, when that is known."""
    from controller.logs import Complaints
    from controller.plane.agent_sessions import (
        MAX_IGNORED_PER_SERVER,
        MAX_IGNORED_SESSIONS,
        AgentSessions,
    )

    def sessions() -> AgentSessions:
        return AgentSessions(MqttConfig("localhost"), lambda: 0.0, Complaints(10.0))

    busy = [f"s{i}/{j}" for i in range(40) for j in range(MAX_IGNORED_PER_SERVER - 1)]
    assert len(busy) + 1 > MAX_IGNORED_SESSIONS
    agents = sessions()
    for key in ["lone/x", *busy]:  # ignored one after the other, as twins are found
        agents._ignore(key)
    kept = agents.ignored_sessions
    assert len(kept) == MAX_IGNORED_SESSIONS and "lone/x" in kept
    assert busy[-1] in kept  # the newest of a busy server stays
    # a session id may hold "/" (an agent names its own): its server is still w0's
    slashed = sessions()
    for i in range(3 * MAX_IGNORED_PER_SERVER):
        slashed._ignore(f"w0/{i}/x")
    assert list(slashed.ignored_sessions) == [
        f"w0/{i}/x" for i in range(2 * MAX_IGNORED_PER_SERVER, 3 * MAX_IGNORED_PER_SERVER)
    ]
    # an agent's store is foreign only against this daemon's own, when that is known
    beat = Heartbeat("s0", "a", store="another")
    agents.heard(beat, None, "")
    assert agents.foreign == {}
    agents.heard(beat, None, "mine")
    assert agents.foreign == {"s0": "another"}
    agents.heard(Heartbeat("s0", "a", store="mine"), None, "mine")
    assert agents.foreign == {}
    # a stored list longer than the bound: its newest are taken
    again = sessions()
    again.restore_ignored([f"w{i}/a" for i in range(MAX_IGNORED_SESSIONS + 5)])
    assert next(iter(again.ignored_sessions)) == "w5/a"


def test_clock_lines_free_up_after_exactly_their_window_and_few_sessions_are_watched() -> None:
    """A server's clock lines held back past :data:`CLOCK_LINES` in
    :data:`CLOCK_LINES_SECONDS` are said once the oldest is that many seconds old, not
    later; and of one server's agent sessions at most a few are remembered (an agent
    with a new session in every beat costs no memory)."""
    from structlog.testing import capture_logs

    from controller.logs import Complaints
    from controller.plane.agent_sessions import CLOCK_LINES, CLOCK_LINES_SECONDS, AgentSessions

    now = [0.0]
    agents = AgentSessions(MqttConfig("localhost"), lambda: now[0], Complaints(10.0))
    with capture_logs() as logs:
        for i in range(CLOCK_LINES + 1):  # off, back, off, back: the last held back
            now[0] = float(i)
            agents._check_clock("w0", 30.0 if i % 2 == 0 else 0.0)
        assert len(logs) == CLOCK_LINES
        now[0] = CLOCK_LINES_SECONDS  # the first line is a window old: room
        agents._check_clock("w0", 0.0)
    assert len(logs) == CLOCK_LINES + 1 and "back in step" in logs[-1]["event"], logs
    assert not [e for e in logs if "crossings" in e], logs  # one crossing a line: not said

    for i in range(20):
        now[0] = 100.0 + i
        agents.heard(Heartbeat("w0", f"s{i}"), None, "")
    assert 0 < len(agents._sessions["w0"]) <= 4 and "s19" in agents._sessions["w0"]


def test_a_device_capacity_that_is_not_whole_is_said_at_load(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    odd = {**CLUSTER, "servers": [{"name": "w0", "kind": "worker",
                                   "capacity": {"gpu": 3.5, "bandwidth": 10}},
                                  CLUSTER["servers"][1]]}  # fmt: skip
    (tmp_path / "odd").mkdir()
    (tmp_path / "upper").mkdir()
    with capture_logs() as logs:
        daemon = PlaneDaemon(tmp_path / "odd", odd)
    try:
        said = [e for e in logs if e["event"].startswith("servers whose capacity of the device")]
        assert [(e["resource"], e["servers"]) for e in said] == [("gpu", ["w0"])], logs
        # the fraction is a device of its own (the audit: half a GPU gave its worker none)
        plans = {p.server: p for p in daemon.ex.plans_sync({})}
        assert (plans["w0"].devices, plans["p0"].devices) == (4, 0)
    finally:
        daemon.c.close()
    upper = {"resources": ["GPU", "bandwidth"],
             "servers": [{"name": "w0", "kind": "worker", "capacity": {"GPU": 4, "bandwidth": 10}},
                         {"name": "p0", "kind": "ps", "capacity": {"bandwidth": 10}}]}  # fmt: skip
    with capture_logs() as logs:
        daemon = PlaneDaemon(tmp_path / "upper", upper)
    daemon.c.close()
    hints = [e["event"] for e in logs if "device_resource" in e["event"]]
    assert hints == ["[mqtt] device_resource 'gpu' is not a resource of the cluster: agents give "
                    "workers no devices of their own, and each sees every GPU; set "
                    "device_resource = 'GPU'"], logs  # fmt: skip


_LAST_REPORT_SCRIPT = """
import sys, time
from controller.commands.agent import run_agent
from controller.plane.agent import Agent
from controller.plane.settings import MqttConfig
from controller.plane.topics import Plan, SlotPlan, Task

now = time.time()
task = Task("j1", 1, 0, minibatch_seconds=0.5, minibatches=40)
plan = Plan("w0", "worker", 1, 3600.0, 0.5, False, SlotPlan(5, now - 10, [task]),
            SlotPlan(6, now + 3590, [task]))
# a worker that prints 3, then 30 when told to stop, and is killed after the grace
worker = ("import signal, sys, time\\n"
          "def stop(*_):\\n    print(30, flush=True)\\n"
          "signal.signal(signal.SIGTERM, stop)\\nprint(3, flush=True)\\n"
          "open(sys.argv[1], 'w').write('up')\\n"
          "while True:\\n    time.sleep(0.05)\\n")
agent = Agent("w0", MqttConfig("127.0.0.1", int(sys.argv[1])), report_seconds=0.2,
              command=f"{sys.executable} -c \\"{worker}\\" {sys.argv[2]}", stop_grace=1.0)
agent.accept(plan)
run_agent(agent)
print("stopped")
"""


@NEEDS_MOSQUITTO
def test_the_agents_stop_sends_the_counts_its_workers_printed_during_the_grace(
    tmp_path: Path,
) -> None:
    """The GPU audit: the agent's stop sent no last report, and the counts its workers
    printed during their stop grace were lost (24 mini-batches short)."""
    import json

    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    from tests.broker import Mosquitto

    broker = Mosquitto()
    seen: list[float] = []
    client = paho.Client(CallbackAPIVersion.VERSION2)
    client.on_message = lambda _c, _u, m: seen.extend(
        j["minibatches"] for j in json.loads(m.payload)["jobs"]
    )
    up = tmp_path / "up"
    agent: subprocess.Popen[str] | None = None
    try:
        client.connect("127.0.0.1", broker.port)
        client.subscribe(Topics("oasis").progress("w0"), qos=1)
        client.loop_start()
        argv = [sys.executable, "-c", _LAST_REPORT_SCRIPT, str(broker.port), str(up)]
        agent = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not (up.exists() and 3.0 in seen):
            assert time.monotonic() < deadline and agent.poll() is None, seen
            time.sleep(0.1)
        agent.send_signal(signal.SIGTERM)
        out, _ = agent.communicate(timeout=30)
        assert agent.returncode == 0 and "stopped" in out
        deadline = time.monotonic() + 10
        while 30.0 not in seen and time.monotonic() < deadline:
            time.sleep(0.1)
        assert seen[-1] == 30.0, seen  # printed during the grace: sent at the stop
    finally:
        client.loop_stop()
        client.disconnect()
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.communicate(timeout=30)
        broker.close()


def test_a_jobs_progress_never_reads_over_its_whole(plane: PlaneDaemon) -> None:
    """The GPU audit: ``436 of 432 mini-batches (100.9%)``: each server's count is capped
    at the whole, but their sum was not (workers run on until completion is heard)."""
    plane.submit("j")
    ex = plane.ex
    plane.clock.advance(plane.config.slot_seconds)
    ex.report(Progress("w0", "a", [TaskProgress("j", 15.0, 200.0)]))
    ex.report(Progress("w0", "b", [TaskProgress("j", 9.0, 60.0)]))
    assert [e.kind for e in ex.review_sync()] == ["completed"]
    view = ex.view_sync("j")
    assert (view.minibatches_done, view.minibatches_total) == (20.0, PlaneDaemon.TOTAL)


def test_an_agents_workers_short_of_devices_reach_the_daemon(plane: PlaneDaemon) -> None:
    """The GPU audit: a shortage of devices (two tenants on one GPU) was only in the
    agent's own log. Heartbeats now say how many workers are short, and the daemon
    warns and shows it on /metrics."""
    from structlog.testing import capture_logs

    beat = Heartbeat("w0", "a", 3, devices_short=2)
    assert Heartbeat.parse(beat.to_bytes()) == beat
    _a_heartbeat_count_is_bounded("devices_short", 100_000)
    ex = plane.ex
    with capture_logs() as logs:
        ex.heartbeat(beat)
    assert ex.agents.devices_short == {"w0": 2}
    assert [e["workers"] for e in logs if e["event"].startswith("workers share GPUs")] == [2]
    assert _metric(plane, "oasis_agent_workers_short_of_devices") == [({"server": "w0"}, 2.0)]
    ex.heartbeat(Heartbeat("w0", "a", 3))
    assert ex.agents.devices_short == {"w0": 0}  # the series reads 0 (the re-audit: it vanished)
    assert _metric(plane, "oasis_agent_workers_short_of_devices") == [({"server": "w0"}, 0.0)]


def _a_heartbeat_count_is_bounded(name: str, most: int) -> None:
    """Heartbeat field ``name``, a count: left out of the payload at 0 (as older agents
    send it), and a negative, fractional, textual or over-``most`` one refused."""
    assert name.encode() not in Heartbeat("w0", "a").to_bytes()
    for bad in (b"-1", b"1.5", b'"2"', str(most + 1).encode()):
        with pytest.raises(SpecError, match=re.escape(f"heartbeat.{name}")):
            Heartbeat.parse(b'{"version": 1, "server": "w0", "session": "s", "'
                            + name.encode() + b'": ' + bad + b"}")  # fmt: skip


def test_an_agents_heartbeat_says_the_entries_it_left_out_and_the_daemon_warns(
    plane: PlaneDaemon,
) -> None:
    """The daemon learns from the heartbeats how many entries an agent left out (its
    log is on the server, not the head node): a warning and a series on /metrics, back
    to 0 once a plan has none."""
    import asyncio

    from structlog.testing import capture_logs

    from controller.plane.agent_messages import MAX_ENTRIES_LEFT_OUT
    from tests.test_plan_tasks import GOOD, _payload

    agent = Agent("w0", MqttConfig("localhost"))
    agent.accept(Plan.parse(_payload([GOOD, {**GOOD, "job": "big", "minibatches": 2**60}])))
    beat = asyncio.run(_one_beat(agent))
    assert beat.entries_left_out == 1
    assert Heartbeat.parse(beat.to_bytes()) == beat
    _a_heartbeat_count_is_bounded("entries_left_out", MAX_ENTRIES_LEFT_OUT)
    ex = plane.ex
    with capture_logs() as logs:
        ex.heartbeat(beat)
    assert ex.agents.entries_left_out == {"w0": 1}
    said = [e for e in logs if e["event"].startswith("the agent left entries of its plan out")]
    assert [e["entries"] for e in said] == [1] and said[0]["log_level"] == "warning"
    assert _metric(plane, "oasis_agent_plan_entries_left_out") == [({"server": "w0"}, 1.0)]
    ex.heartbeat(Heartbeat("w0", beat.session, beat.epoch))
    assert _metric(plane, "oasis_agent_plan_entries_left_out") == [({"server": "w0"}, 0.0)]


async def _one_beat(agent: Agent) -> Any:
    """The first heartbeat ``agent`` publishes (its beat loop stopped after it)."""
    import asyncio

    sent: list[bytes] = []

    class Client:
        async def publish(self, _topic: str, payload: bytes, qos: int = 0) -> None:
            sent.append(payload)
            raise asyncio.CancelledError  # one is enough

    with contextlib.suppress(asyncio.CancelledError):
        await agent._beat(Client())  # type: ignore[arg-type]
    return Heartbeat.parse(sent[0])


def _metric(plane: PlaneDaemon, name: str) -> list[tuple[dict[str, str], float]]:
    """``name``'s samples as the daemon's /metrics would give them: (labels, value)."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from controller.metrics import Metrics

    plane.c.execution = plane.ex
    text = generate_latest(Metrics(plane.c).registry).decode()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == name]
    return [(dict(sample.labels), sample.value) for sample in family.samples]


def test_unknown_jobs_retained_events_are_cleared_once_and_only_if_still_unknown() -> None:
    """The queue of unknown jobs whose retained events the plane clears: each once, a
    bounded number waiting, and none the store has come to know by the clear (a job of
    the same id submitted again keeps its new event)."""
    from controller.plane.unknown_events import MAX_QUEUED, UnknownJobEvents

    queue = UnknownJobEvents()
    assert not queue and queue.add({"w0": ["a", "b", "a"], "p0": ["a"]}) and queue
    assert queue.take(lambda ids: [j for j in ids if j != "b"]) == ["a"]  # b came back
    assert not queue and not queue.add({"p0": ["a"]})  # cleared already: not again
    assert queue.add({"w0": ["b"]})  # not cleared: queued again at its next report
    assert queue.add({"w0": [f"j{i}" for i in range(2 * MAX_QUEUED)]})
    # full of w0's: p0's take the places of w0's newest, up to an even share
    assert queue.add({"p0": [f"p{i}" for i in range(MAX_QUEUED)]})
    taken = queue.take(lambda ids: ids)
    assert len(taken) == MAX_QUEUED
    assert sum(j.startswith("p") for j in taken) == MAX_QUEUED // 2
    assert "b" in taken and "j0" in taken  # w0's oldest stay


def test_unknown_ids_are_looked_up_in_turn_per_server() -> None:
    """The ids waiting to be looked up: each server's in its own bounded queue, taken in
    turn (resumed where the last review stopped), so one server's many ids delay no
    other's past its turn; past the bound in all, the server that holds the most loses
    its newest."""
    from controller.plane import unknown_jobs as uj

    lookups = uj.UnknownLookups()
    lookups.add("w0", [f"w{i:03d}" for i in range(2 * uj.MAX_LOOKED_UP)])
    assert len(lookups) == uj.MAX_WAITING_PER_SERVER  # its own bound
    lookups.add("p0", ["p0-lost"])
    lookups.add("p1", ["p1-a", "p1-b"])
    assert lookups.take(4) == [("p0", "p0-lost"), ("p1", "p1-a"), ("w0", "w000"), ("p1", "p1-b")]
    assert lookups.take(1) == [("w0", "w001")]
    lookups.add("p1", ["p1-c"])
    assert lookups.take(2) == [("p1", "p1-c"), ("w0", "w002")]  # p1 after w0 stopped
    full = uj.UnknownLookups()
    servers = uj.MAX_WAITING // uj.MAX_WAITING_PER_SERVER
    for k in range(servers):
        full.add(f"s{k:03d}", [f"s{k:03d}-{i}" for i in range(uj.MAX_WAITING_PER_SERVER)])
    assert len(full) == uj.MAX_WAITING
    full.add("t", ["t-1", "t-2"])  # room made: s000's newest went, then s001's
    assert len(full) == uj.MAX_WAITING
    taken = full.take(uj.MAX_WAITING)
    assert ("t", "t-1") in taken and ("t", "t-2") in taken
    assert ("s000", f"s000-{uj.MAX_WAITING_PER_SERVER - 1}") not in taken


def test_one_agents_made_up_ids_keep_no_other_servers_lost_job_unnamed_or_uncleared(
    plane: PlaneDaemon,
) -> None:
    """One agent (buggy or hostile) reporting a full review's worth of made-up ids that
    sort first, new ones at every review, beside another server's agent running a job
    the store lost (a restore). Before, the ids looked up at a review were the first 200
    in sorted order over all servers, so the lost job was never named nor its retained
    event cleared; and the made-up ids, once cleared, filled the ids remembered in all,
    whose overflow forgot the lost job's too (the fairness audit). Now each server's ids
    wait in their own queue, looked up in turn, and one server's overflow forgets only
    its own."""
    from structlog.testing import capture_logs

    from controller.plane.link import Plane as Link
    from controller.plane.unknown_events import MAX_QUEUED, MAX_REMEMBERED
    from controller.plane.unknown_jobs import MAX_LOOKED_UP

    ex = plane.ex
    link = Link(plane.c, ex, MqttConfig("localhost"))  # its queue of events to clear
    made_up = iter(f"a-{i:06d}" for i in range(10**6))
    warning = "agents ran jobs this store does not know"

    def review(lost: bool = True) -> list[tuple[str, list[str]]]:
        """One review of w0's made-up ids, and p0's lost job (``lost``): what it named,
        per server."""
        ex.report(Progress("w0", "a", [TaskProgress(next(made_up), 1.0, 1.0)
                                       for _ in range(MAX_LOOKED_UP)]))  # fmt: skip
        if lost:
            ex.report(Progress("p0", "a", [TaskProgress("zz-lost", 1.0, 1.0)]))
        plane.mono[0] += 11.0  # past the warnings' throttle
        with capture_logs() as logs:
            ex.review_sync()
        return [(e["server"], e["jobs"]) for e in logs if e["event"].startswith(warning)]

    # the broker down: nothing cleared, more made-up ids queued than the queue holds,
    # then the lost job's reports too
    for _ in range(MAX_QUEUED // MAX_LOOKED_UP + 1):
        assert [server for server, _ in review(lost=False)] == ["w0"]
    said = review() + review()
    assert ("p0", ["zz-lost"]) in said, said  # named at its first review
    cleared = link._unknown.take(lambda ids: ids)  # the next round: its event is cleared
    assert "zz-lost" in cleared and len(cleared) <= MAX_QUEUED
    # the made-up ids go on, more than are remembered in all: the lost job's event, still
    # reported, is not cleared again
    for _ in range(MAX_REMEMBERED // MAX_LOOKED_UP + 5):
        review()
        assert "zz-lost" not in link._unknown.take(lambda ids: ids)


def test_the_agent_warns_of_a_broker_refusing_it_once_per_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A refused password: the agent's first ``broker unavailable`` is a warning, the same
    reason on each retry info, as the daemon's (an agent run with ``--log-level warning``
    said nothing of it before: every retry was info)."""
    import asyncio

    import aiomqtt
    from structlog.testing import capture_logs

    agent = Agent("w0", MqttConfig("localhost"))

    class Refused:
        async def __aenter__(self) -> None:
            raise aiomqtt.MqttError("[code:135] Not authorized")

        async def __aexit__(self, *_: object) -> None:
            return None

    async def idle() -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(agent, "_client", Refused)
    monkeypatch.setattr(agent, "_work", idle)
    with capture_logs() as logs, contextlib.suppress(TimeoutError):
        asyncio.run(asyncio.wait_for(agent.run(), 0.7))
    said = [(e["log_level"], e["error"]) for e in logs if e["event"] == "broker unavailable"]
    assert len(said) >= 2, said
    assert said[0] == ("warning", "[code:135] Not authorized")
    assert {level for level, _ in said[1:]} == {"info"}


class _AckWithCancel:
    """An aiomqtt client stand-in whose first subscription waits for its SUBACK as
    aiomqtt does, in ``asyncio.wait_for``; :meth:`ack_and_stop` gives the SUBACK and
    stops the task in one turn of the loop, which Python 3.11's ``wait_for`` answers
    with the SUBACK, the cancel lost. Everything it is sent is noted in ``published``."""

    def __init__(self) -> None:
        import asyncio

        self.ack: asyncio.Future[None] | None = None
        self.waiting = asyncio.Event()
        self.published: list[tuple[str, bytes]] = []

    async def __aenter__(self) -> _AckWithCancel:
        return self

    async def __aexit__(self, *_: object) -> None:
        return None

    async def subscribe(self, *_: object, **__: object) -> None:
        import asyncio

        if self.ack is None:  # the first: held until the test acknowledges it
            self.ack = asyncio.get_running_loop().create_future()
            self.waiting.set()
            await asyncio.wait_for(self.ack, 10)

    async def publish(self, topic: str, payload: bytes = b"", **_: object) -> None:
        self.published.append((topic, payload))

    @property
    def messages(self) -> Any:
        import asyncio

        async def none() -> Any:
            await asyncio.Event().wait()
            yield  # pragma: no cover

        return none()

    async def ack_and_stop(self, task: Any, stopping: Any) -> bool:
        """Acknowledge the held subscription and stop ``task`` at once, as its owner does
        (``stopping.ask()``, then a cancel); True if the task then ends within 3 s."""
        import asyncio

        await self.waiting.wait()
        assert self.ack is not None
        self.ack.set_result(None)
        stopping.ask()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=3)
        return bool(done)


def test_a_cancel_lost_in_a_brokers_acknowledgement_still_stops_the_daemons_link(
    plane: PlaneDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a daemon stopped as its broker link subscribed waited out 5 s for the link
    (2 to 5 of 8 such stops, measured), which ran on: Python 3.11's ``wait_for``, in which
    aiomqtt waits for the broker's acknowledgements, drops a cancel that comes in the
    same turn as the acknowledgement. The link now sees the lost cancel, says "offline"
    and ends."""
    import asyncio

    from controller.plane import link as link_module
    from controller.plane.link import Plane

    fake = _AckWithCancel()
    monkeypatch.setattr(link_module, "client_for", lambda *_a, **_k: fake)
    link = Plane(plane.c, plane.ex, MqttConfig("localhost"))

    async def go() -> bool:
        return await fake.ack_and_stop(asyncio.create_task(link.run()), link.stopping)

    assert asyncio.run(go()), "the link ran on after its cancel"
    status = [Status.parse(p) for t, p in fake.published if t == link.topics.status]
    assert [s.online for s in status][-1:] == [False]  # its goodbye, retained


def test_a_cancel_lost_in_a_brokers_acknowledgement_still_stops_the_agent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The agent's side of the test above: before, a SIGTERM that came as the agent
    subscribed was lost, and the agent ran on (until the service manager killed it,
    leaving its workers running)."""
    import asyncio

    agent = Agent("w0", MqttConfig("localhost"))
    fake = _AckWithCancel()

    async def idle() -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(agent, "_client", lambda: fake)
    monkeypatch.setattr(agent, "_work", idle)

    async def go() -> bool:
        return await fake.ack_and_stop(asyncio.create_task(agent.run()), agent.stopping)

    assert asyncio.run(go()), "the agent ran on after its cancel"


@NEEDS_MOSQUITTO
def test_an_agent_connected_with_no_plan_says_what_to_check(tmp_path: Path) -> None:
    """The shipped ACL lets a node's broker user read its own server's plan only. An
    agent for w0 run by hand with user w1 (another --mqtt-username) beat on with no plan,
    its jobs never run, and said nothing; now it warns once, naming the topic and user.
    With its own user it has the retained plan at once and says nothing."""
    import asyncio

    import aiomqtt
    from structlog.testing import capture_logs

    from tests.broker import Mosquitto

    acl = ROOT / "config" / "mosquitto.acl"
    users = {"oasisd": "daemon pw", "w0": "w0 pw", "w1": "w1 pw"}
    broker = Mosquitto(users=users, acl=acl)
    try:

        async def publish_plan() -> None:
            async with aiomqtt.Client("127.0.0.1", broker.port, username="oasisd",
                                      password=users["oasisd"]) as client:  # fmt: skip
                await client.publish(topics.Topics("oasis").plan("w0"), plan(1).to_bytes(),
                                     qos=1, retain=True)  # fmt: skip

        asyncio.run(publish_plan())

        def run_as(user: str) -> tuple[Agent, list[dict[str, Any]]]:
            mqtt = MqttConfig("127.0.0.1", broker.port, username=user, password=users[user],
                              heartbeat_seconds=0.2)  # fmt: skip

            async def for_a_while() -> None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(4.0):
                        await agent.run()

            with capture_logs() as logs:  # the agent's logger is bound as it is made
                agent = Agent("w0", mqtt, no_plan_seconds=1.0)
                asyncio.run(for_a_while())
            return agent, [dict(e) for e in logs if e["event"].startswith("no plan received")]

        agent, said = run_as("w1")
        assert agent.plan is None
        assert len(said) == 1, said  # once, not at every beat
        assert said[0]["topic"] == "oasis/v1/servers/w0/plan" and said[0]["username"] == "w1"
        assert "--mqtt-username is the node's name" in said[0]["event"]
        agent, said = run_as("w0")
        assert agent.plan is not None and agent.plan.epoch == 1
        assert said == []
    finally:
        broker.close()
