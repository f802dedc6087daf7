"""The reference agent against hostile or broken plans on its topic (the audit of what
arrives there: a broker without the shipped ACL, a stale retained message, a bug): one
bad entry costs that entry, never the agent or the other jobs on the server, and
nothing in a plan makes the agent fork without bound or flood the broker."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from controller.plane import workers as workers_module
from controller.plane.agent import MIN_HEARTBEAT_SECONDS, Agent
from controller.plane.settings import MqttConfig
from pricing.errors import SpecError
from tests.test_agent_workers import agent_on, commands, plan_of, run


def test_a_job_id_no_process_can_carry_fails_that_job_alone() -> None:
    """Before: a task whose job id holds a NUL (valid JSON, "\\u0000") made the worker's
    environment unbuildable; the ValueError ended the agent's work loop, the agent
    stopped every worker of the server and exited, and the retained plan did it again
    at each restart. Now it is that job's failure, backed off and logged; the other
    job runs."""
    agent, _ = agent_on("sleep 30", plan_of({"a\0b": 1, "good": 1}, {}))

    async def go() -> None:
        await agent._commands(0.02)
        bad = agent.tasks["a\0b"].workers
        assert not bad.running and bad.failures == {0: 1} and bad.retry_at[0] > 0
        assert len(agent.tasks["good"].workers.running) == 1

    run(agent, go)


def test_absurd_worker_counts_are_not_started_and_the_other_jobs_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: a task of 2**53 workers (the most a plan's integer may be) built
    ``set(range(2**53))`` at each step: the agent's memory grew until it failed (or the
    node's OOM killer came), and a task of 10**6 forked 10**6 processes. A server runs at
    most ``MAX_WORKERS`` worker commands: a task asking for more alone is skipped, and
    the others start in plan order while there is room."""
    monkeypatch.setattr(workers_module, "MAX_WORKERS", 3, raising=False)
    jobs = {"huge": 2**53, "big": 4, "a": 1, "b": 2, "c": 1}
    agent, _ = agent_on("sleep 30", plan_of(jobs, {}))

    async def go() -> None:
        for _ in range(3):
            await agent._commands(0.02)
        running = {job: len(state.workers.running) for job, state in agent.tasks.items()}
        assert running == {"huge": 0, "big": 0, "a": 1, "b": 2, "c": 0}
        assert len(commands(agent).live) == 3

    from structlog.testing import capture_logs

    with capture_logs() as logs:
        run(agent, go)
    # each said once, with why: over what an agent runs at all (one more than the most,
    # too), or over the room the others left
    events = [e for e in logs if e["event"].startswith("a task's workers")]
    said = {e["job"]: e["event"] for e in events}
    assert sorted(e["job"] for e in events) == ["big", "c", "huge"], said  # not each step
    for job in ("huge", "big"):
        assert "over the 3 worker commands an agent runs" in said[job], said
    assert "the server runs as many as it may already" in said["c"], said


def test_a_plans_tiny_heartbeat_interval_does_not_flood_the_broker() -> None:
    """Before: a plan of ``heartbeat_seconds`` 1e-300 (any number > 0 parsed) sent a
    heartbeat at every turn of the event loop, thousands a second: over the daemon's
    rate per agent, which then dropped this server's progress reports too. The agent
    beats no faster than every :data:`MIN_HEARTBEAT_SECONDS`."""
    agent = Agent("w0", MqttConfig("localhost"), wall=lambda: 101.0)
    agent.accept(dataclasses.replace(plan_of({"a": 1}, {}), heartbeat_seconds=1e-300))
    sent: list[float] = []

    class Client:
        async def publish(self, *_args: Any, **_kwargs: Any) -> None:
            sent.append(0.0)
            await asyncio.sleep(0)  # a real client yields to the loop

    async def go() -> None:
        beat = asyncio.create_task(agent._beat(Client()))  # type: ignore[arg-type]
        await asyncio.sleep(0.5)
        beat.cancel()

    asyncio.run(go())
    assert 1 <= len(sent) <= 0.5 / MIN_HEARTBEAT_SECONDS + 2


def test_the_parts_an_agent_holds_are_bounded_in_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: parts of two epochs, up to 256 each of 16 MiB, were held until complete:
    54 MB a part once parsed, 27 GB in all (a broker without the shipped
    ``max_packet_size``). An epoch whose parts hold over ``MAX_PLAN_TASKS`` tasks is
    refused, its parts dropped; a plan within it still goes back together."""
    from controller.plane import plan_messages
    from controller.plane.plan_messages import Plan, PlanParts, SlotPlan, Task

    monkeypatch.setattr(plan_messages, "MAX_PLAN_TASKS", 10, raising=False)

    def part(epoch: int, k: int, tasks: int, parts: int = 256) -> Plan:
        many = [Task(f"j{epoch}-{k}-{i}", 1, 0, 0.5, 40) for i in range(tasks)]
        return Plan("w0", "worker", epoch, 10.0, 0.5, False, SlotPlan(5, 100.0, many),
                    SlotPlan(6, 110.0, []), part=k, parts=parts)  # fmt: skip

    back = PlanParts()
    refused = 0
    for epoch in (1, 2):
        for k in range(5):
            try:
                back.add(part(epoch, k, 4))
            except SpecError:
                refused += 1
    held = sum(len(p.current.tasks) for parts in back._held.values() for p in parts.values())
    assert held <= 2 * 10 and refused >= 2
    whole = [back.add(part(3, k, 5, parts=2)) for k in (1, 0)]  # 10 tasks: within
    assert whole[0] is None and whole[1] is not None and len(whole[1].current.tasks) == 10


def test_a_job_twice_in_a_slot_under_two_admissions_is_one_task_in_the_simulation() -> None:
    """Before: the simulated agent stepped each entry, so one job planned twice in a slot
    under two ``run``s had its counts started afresh twice a step, for good (it never
    progressed), with two log lines a step. The last entry counts, as with commands."""
    from controller.plane.topics import Plan, SlotPlan, Task

    tasks = [Task("j", 1, 0, 0.5, 1000, run="20260101T000000.000000"),
             Task("j", 1, 0, 0.5, 1000, run="20260101T000001.000000")]  # fmt: skip
    agent = Agent("w0", MqttConfig("localhost"), wall=lambda: 101.0)
    agent.accept(Plan("w0", "worker", 1, 10.0, 0.5, False, SlotPlan(5, 100.0, tasks),
                      SlotPlan(6, 110.0, [])))  # fmt: skip
    for _ in range(20):
        agent.step(0.05)
    state = agent.tasks["j"]
    assert state.run == "20260101T000001.000000" and state.minibatches == pytest.approx(2.0)


def _take_one_piece_at_a_time(devices: Any, demand: float) -> tuple[dict[str, float], bool]:
    """:meth:`Devices.take` as it was, a pass of the devices per piece: the reference of
    the choices."""
    import math

    eps = 1e-9
    if not (demand > eps) or not devices.managed:
        return {}, True
    whole = math.floor(demand + eps)
    part = demand - whole if demand - whole > eps else 0.0
    chosen: dict[str, float] = {}
    enough = bool(devices.ids)
    for piece in [1.0] * whole + ([part] if part else []):
        room = [(devices.free(one), pos, one) for pos, one in enumerate(devices.ids)
                if one not in chosen and devices.free(one) >= piece - eps]  # fmt: skip
        if room:
            _, _, one = min(room)
        else:
            enough = False
            rest = [(-devices.free(one), pos, one) for pos, one in enumerate(devices.ids)
                    if one not in chosen]  # fmt: skip
            if not rest:
                break
            _, _, one = min(rest)
        chosen[one] = piece
        devices.used[one] = devices.used.get(one, 0.0) + piece
    order = {one: pos for pos, one in enumerate(devices.ids)}
    return dict(sorted(chosen.items(), key=lambda kv: order[kv[0]])), enough


@pytest.mark.parametrize("seed", range(20))
def test_devices_are_handed_out_as_before_in_one_pass(seed: int) -> None:
    """The one-pass :meth:`Devices.take` makes the choices of the pass-a-piece one, on
    random counts, demands (whole, fractional, over the count) and give-backs."""
    import random

    from controller.plane.devices import Devices

    rng = random.Random(seed)
    count = rng.choice([0, 1, 2, 4, 8])
    given = [f"GPU-{i}" for i in range(rng.randrange(1, 6))] if rng.random() < 0.3 else None
    new, old = Devices(given), Devices(given)
    new.resize(count)
    old.resize(count)
    held: list[dict[str, float]] = []
    for _ in range(30):
        if held and rng.random() < 0.3:
            one = held.pop(rng.randrange(len(held)))
            new.give_back(one)
            old.give_back(one)
            continue
        demand = rng.choice([0, 0.25, 0.5, 1, 1.5, 2, 3, 2.75, 9])
        got = new.take(demand)
        assert got == _take_one_piece_at_a_time(old, demand)
        assert new.used == old.used
        held.append(got[0])


def test_a_plan_of_the_most_devices_and_demand_hands_them_out_quickly() -> None:
    """Before: a plan counting 1024 devices (the most) and a task needing 1024 a worker
    took 0.27 s of the agent's event loop a worker, a pass of the devices per device:
    4.6 minutes without a heartbeat or a stop to start 1024 such workers."""
    import time

    from controller.plane.devices import MAX_DEVICES, Devices

    devices = Devices()
    devices.resize(MAX_DEVICES)
    start = time.process_time()
    for _ in range(20):
        held, _enough = devices.take(MAX_DEVICES - 0.5)
        assert len(held) == MAX_DEVICES
    assert time.process_time() - start < 1.0


def test_the_agents_incoming_messages_are_the_latest_of_each_topic_and_bounded() -> None:
    """Before: the agent's client queued every incoming message: 16 MiB plans published
    on its topic faster than it parsed them (2.6 s each) piled up without bound. Its
    queue holds the latest message of each topic (a retained plan says all an older
    one did), in the order they came, of at most ``MAX_QUEUED_TOPICS`` topics."""
    import aiomqtt

    from controller.plane.client import MAX_QUEUED_TOPICS

    agent = Agent("w0", MqttConfig("localhost"))
    plan, status = agent.topics.plan("w0"), agent.topics.status

    def message(topic: str, payload: bytes) -> aiomqtt.Message:
        return aiomqtt.Message(topic, payload, 1, False, 0, None)

    async def go() -> None:
        queue = agent._client()._queue
        for i in range(1000):
            queue.put_nowait(message(plan, b"%d" % i))
        queue.put_nowait(message(status, b"online"))
        queue.put_nowait(message(plan, b"last"))
        assert queue.qsize() == 2
        assert [(await queue.get()).payload for _ in range(2)] == [b"online", b"last"]
        for i in range(MAX_QUEUED_TOPICS + 50):
            queue.put_nowait(message(f"{plan}/{i}", b"{}"))
        assert queue.qsize() == MAX_QUEUED_TOPICS

    asyncio.run(go())
