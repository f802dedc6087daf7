"""The execution plane's pieces without a broker: the [mqtt] table, payloads, and the
reference agent's plan following and simulation."""

from __future__ import annotations

import re
from typing import Any

import pytest

from controller.config import ConfigError, from_dict
from controller.plane.agent import Agent
from controller.plane.settings import MqttConfig
from controller.plane.topics import Heartbeat, Plan, Progress, SlotPlan, Task, TaskProgress, Topics
from pricing.errors import SpecError

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


def test_mqtt_table_is_optional_and_validated() -> None:
    assert config(None).mqtt is None
    c = config({"url": "mqtt://broker:1999", "topic_prefix": "lab/", "heartbeat_timeout": 9})
    assert (c.mqtt.host, c.mqtt.port, c.mqtt.tls, c.mqtt.topic_prefix) == ("broker", 1999,
                                                                          False, "lab")  # fmt: skip
    assert c.mqtt.heartbeat_seconds == 3.0
    assert config({"host": "b", "tls_ca": "/ca.pem"}).mqtt.port == 8883
    cases: list[tuple[dict[str, Any], str]] = [
        ({"url": "http://b"}, "mqtt.url: must be mqtt://"),
        ({"port": 1883}, "mqtt: needs url or host"),
        ({"host": "b", "port": 70000}, "mqtt.port: must be <= 65535"),
        ({"host": "b", "topic_prefix": "a/#"}, "mqtt.topic_prefix"),
        ({"host": "b", "heartbeat_timeout": 2, "heartbeat_seconds": 3}, "mqtt.heartbeat_seconds"),
        ({"host": "b", "colour": 1}, "mqtt.colour: unknown key"),
    ]
    for bad, message in cases:
        with pytest.raises(ConfigError, match=re.escape(message)):
            config(bad)


def plan(epoch: int, slot: int = 5, starts: float = 100.0, workers: int = 2) -> Plan:
    task = Task("j1", workers, 0, minibatch_seconds=0.5, minibatches=40)
    return Plan("w0", "worker", epoch, 10.0, 0.5, False,
                SlotPlan(slot, starts, [task]), SlotPlan(slot + 1, starts + 10.0, []))  # fmt: skip


def test_payloads_round_trip_and_bad_ones_name_the_field() -> None:
    p = plan(7)
    assert Plan.parse(p.to_bytes()) == p
    beat = Heartbeat("w0", "s1", 7)
    assert Heartbeat.parse(beat.to_bytes()) == beat
    prog = Progress("w0", "s1", [TaskProgress("j1", 3.5, 2.0)])
    assert Progress.parse(prog.to_bytes()) == prog
    with pytest.raises(SpecError, match=re.escape("plan.version")):
        Plan.parse(b'{"version": 2}')
    with pytest.raises(SpecError, match=re.escape("progress.jobs[0].minibatches")):
        bad = b'"jobs": [{"job": "j", "minibatches": -1, "worker_seconds": 0}]}'
        Progress.parse(b'{"version": 1, "server": "w0", "session": "s", ' + bad)
    with pytest.raises(SpecError, match="heartbeat: not JSON"):
        Heartbeat.parse(b"{")
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
    command = 'echo 1; echo 2; echo "$OASIS_JOB"; echo 3; sleep 30'
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
        procs = [p for p, _c in agent.tasks["j1"].processes]
        await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), 10)

    asyncio.run(go())
    state = agent.tasks["j1"]
    assert state.minibatches == 6  # 3 from each of the 2 workers; "j1" is not a count
    assert all(p.returncode is not None for p, _c in state.processes)
