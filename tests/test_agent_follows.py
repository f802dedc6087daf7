"""The reference agent following its plans, pinned where the mutation audit of
controller/plane/agent.py found nothing that would fail: the slot boundary, the jobs
of a new plan's next slot, tasks of no worker (a parameter server's)."""

from __future__ import annotations

import asyncio
import math

import pytest

from controller.plane.agent import Agent, TaskState
from controller.plane.settings import MqttConfig
from controller.plane.topics import Plan, SlotPlan, Task
from tests.test_agent_workers import run


def _plan(epoch: int, now_jobs: dict[str, int], next_jobs: dict[str, int]) -> Plan:
    """A plan of w0, ``{job: workers}`` in slot 5 (100-110 s) and in slot 6 (110-120 s)."""

    def tasks(jobs: dict[str, int]) -> list[Task]:
        return [Task(job, n, 0, 0.5, 40) for job, n in jobs.items()]

    current, following = SlotPlan(5, 100.0, tasks(now_jobs)), SlotPlan(6, 110.0, tasks(next_jobs))
    return Plan("w0", "worker", epoch, 10.0, 0.5, False, current, following)


def test_the_next_slots_plan_is_followed_from_the_first_instant_of_its_slot() -> None:
    """At the boundary the slot begun is the next one: the tasks of the slot that ended
    there no longer run (their capacity is another job's from that instant)."""
    now = [109.999]
    agent = Agent("w0", MqttConfig("localhost"), wall=lambda: now[0])
    assert agent.accept(_plan(1, {"ending": 1}, {"beginning": 1}))
    assert agent.plan is not None
    assert agent.active() == agent.plan.current
    now[0] = 110.0
    assert agent.active() == agent.plan.next
    agent.step(1.0)
    assert list(agent.tasks) == ["beginning"]
    now[0] = 120.0  # the next slot's end: nothing planned past it
    assert agent.active() is None


def test_a_new_plans_jobs_in_either_slot_have_their_counts_sent_again() -> None:
    """The daemon that issued a new plan may have missed the counts of its jobs, those
    planned in its next slot only too."""
    agent = Agent("w0", MqttConfig("localhost"))
    agent.accept(_plan(1, {}, {}))
    for job in ("now", "later", "elsewhere"):
        agent.tasks[job] = TaskState(minibatches=5.0, worker_seconds=5.0)
        agent._reported[job] = (5.0, 5.0)
    assert agent.reports() == []
    agent.accept(_plan(2, {"now": 1}, {"later": 1}))
    assert sorted(t.job for r in agent.reports() for t in r.jobs) == ["later", "now"]


def test_a_task_of_no_worker_is_no_job_of_this_agent() -> None:
    """A task planning no worker here (a parameter server's share) gets no counts,
    simulated or from worker commands, and so no progress report of zeros."""
    now = [101.0]
    plan = _plan(1, {"ps_only": 0, "worked": 1}, {})
    simulated = Agent("w0", MqttConfig("localhost"), wall=lambda: now[0])
    simulated.accept(plan)
    simulated.step(1.0)
    assert list(simulated.tasks) == ["worked"]
    assert [t.job for r in simulated.reports() for t in r.jobs] == ["worked"]

    agent = Agent("w0", MqttConfig("localhost"), command="sleep 30", wall=lambda: now[0])
    agent.accept(plan)

    async def go() -> None:
        await agent._commands(0.02)
        assert list(agent.tasks) == ["worked"]
        assert len(agent.tasks["worked"].workers.running) == 1
        await asyncio.sleep(0)

    run(agent, go)


def test_a_job_id_admitted_again_stops_the_earlier_admissions_workers() -> None:
    """A plan bringing a job id back under another admission starts its counts afresh
    and stops the earlier admission's workers: they must not run on beside the new
    one's, on capacity the daemon planned once."""
    now = [101.0]

    def plan_of(epoch: int, run_id: str) -> Plan:
        task = Task("j1", 1, 0, 0.5, 40, run=run_id)
        return Plan("w0", "worker", epoch, 10.0, 0.5, False,
                    SlotPlan(5, 100.0, [task]), SlotPlan(6, 110.0, [task]))  # fmt: skip

    agent = Agent("w0", MqttConfig("localhost"), command="sleep 30", wall=lambda: now[0])
    agent.accept(plan_of(1, "r1"))

    async def go() -> None:
        await agent._commands(0.02)
        (old,) = agent.tasks["j1"].workers.running
        agent.accept(plan_of(2, "r2"))
        await agent._commands(0.02)
        assert old.stop_sent is not None
        assert agent.commands is not None and old.proc.pid not in agent.commands.live
        assert agent.tasks["j1"].run == "r2"

    run(agent, go)


def _sent_long_ago(agent: Agent, job: str) -> None:
    state = agent.tasks[job]
    agent._reported[job] = (state.minibatches, state.worker_seconds)
    agent._failures_sent[job] = 0
    agent._sent_at[job] = 0.0


def test_jobs_are_not_set_aside_while_planned_in_the_slot_running_or_the_daemon_away() -> None:
    """forget_idle sets aside a job only once its plan has none of it in a slot not
    ended, and the daemon is online (one away may ask for its counts again)."""
    from controller.plane.topics import Status

    now = [101.0]
    agent = Agent("w0", MqttConfig("localhost"), wall=lambda: now[0])
    agent.accept(_plan(1, {"now": 1}, {}))
    agent.tasks["now"] = TaskState(minibatches=5.0, worker_seconds=5.0)
    _sent_long_ago(agent, "now")
    assert agent.forget_idle(now=1e6) == 0  # planned in the slot in progress
    agent.status(Status(online=False))
    now[0] = 111.0  # its slot ended: no plan has it any more, but the daemon is away
    assert agent.forget_idle(now=1e6) == 0 and "now" in agent.tasks
    agent.status(Status(online=True, servers=["w0"]))
    _sent_long_ago(agent, "now")
    assert agent.forget_idle(now=1e6) == 1 and "now" not in agent.tasks


def test_a_job_whose_workers_still_run_is_not_set_aside() -> None:
    now = [101.0]
    agent = Agent("w0", MqttConfig("localhost"), command="sleep 30", wall=lambda: now[0])
    agent.accept(_plan(1, {"j1": 1}, {}))

    async def go() -> None:
        await agent._commands(0.02)
        assert len(agent.tasks["j1"].workers.running) == 1
        agent.accept(_plan(2, {}, {}))  # no longer planned; its worker not stopped yet
        _sent_long_ago(agent, "j1")
        assert agent.forget_idle(now=1e6) == 0 and "j1" in agent.tasks

    run(agent, go)


def test_counts_sent_while_the_daemon_was_away_go_again_when_it_is_back() -> None:
    """Those reported since the daemon went offline (first said; a repeat of it moves
    nothing) are all sent again once it is back, however long it was away: it heard
    none of them. Older ones, past two slots, are not."""
    from controller.plane.topics import Status

    agent = Agent("w0", MqttConfig("localhost"))
    agent.accept(_plan(1, {}, {}))  # 10 s slots: two are 20 s
    agent.status(Status(online=False))
    away = agent._away_since
    assert away is not None
    agent.status(Status(online=False))  # said again (the retained will, a reconnection)
    assert agent._away_since == away
    for job, sent in (("before", away - 30.0), ("meanwhile", away + 1.0)):
        agent.tasks[job] = TaskState(minibatches=5.0, worker_seconds=5.0)
        agent._reported[job] = (5.0, 5.0)
        agent._sent_at[job] = sent
    agent.resend_recent(now=away + 100.0)
    assert [t.job for r in agent.reports() for t in r.jobs] == ["meanwhile"]


def test_counts_past_what_the_daemon_takes_are_reported_at_its_bound() -> None:
    """A report entry over MAX_COUNT is dropped by the daemon: the agent sends its
    bound instead (workers' sums can pass it)."""
    from controller.plane.agent_messages import MAX_COUNT

    agent = Agent("w0", MqttConfig("localhost"))
    agent.tasks["j1"] = TaskState(minibatches=3 * MAX_COUNT, worker_seconds=2 * MAX_COUNT)
    (report,) = agent.reports()
    assert [(t.minibatches, t.worker_seconds) for t in report.jobs] == [(MAX_COUNT, MAX_COUNT)]


def test_a_workers_count_never_goes_back_and_a_long_lines_tail_is_no_count() -> None:
    """A command's count is the highest it printed (a lower line later takes nothing
    back); the tail of a line over the stream's limit is skipped, digits or not."""
    agent = Agent("w0", MqttConfig("localhost"))

    async def read(data: bytes) -> float:
        stream = asyncio.StreamReader(limit=8)
        stream.feed_data(data)
        stream.feed_eof()
        count = [0.0]
        await agent._read_counts(stream, count)
        return count[0]

    async def read_long(head: bytes, tail: bytes) -> float:
        """``head`` (past the limit, no newline) read before ``tail`` arrives."""
        stream = asyncio.StreamReader(limit=8)
        stream.feed_data(head)
        count = [0.0]
        reading = asyncio.create_task(agent._read_counts(stream, count))
        for _ in range(10):  # the head read and dropped
            await asyncio.sleep(0)
        stream.feed_data(tail)
        stream.feed_eof()
        await reading
        return count[0]

    assert asyncio.run(read(b"5\n3\n")) == 5.0
    assert asyncio.run(read(b"1\n" + b"9" * 40 + b"\n2\n")) == 2.0
    assert asyncio.run(read_long(b"9" * 20, b"77\n2\n")) == 2.0


def test_a_jobs_count_from_its_workers_is_capped_at_its_whole() -> None:
    from controller.plane.workers import JobWorkers

    agent = Agent("w0", MqttConfig("localhost"), command="true")
    agent.tasks["planned"] = TaskState(workers=JobWorkers(done_before=100.0), total=40)
    agent.tasks["unknown"] = TaskState(workers=JobWorkers(done_before=100.0))
    agent._fold_counts()
    assert agent.tasks["planned"].minibatches == 40.0
    assert agent.tasks["unknown"].minibatches == 100.0  # its whole not known yet


def test_counts_published_are_noted_as_sent_and_go_again_after_a_reconnection() -> None:
    from tests.fake_mqtt import FakeMqtt

    agent = Agent("w0", MqttConfig("localhost"))
    agent.accept(_plan(1, {}, {}))
    agent.tasks["j1"] = TaskState(minibatches=5.0, worker_seconds=5.0)
    client = FakeMqtt()
    asyncio.run(agent._publish(client, agent.reports()))  # type: ignore[arg-type]
    assert [topic for topic, _ in client.sent] == [agent.topics.progress("w0")]
    assert agent.reports() == []
    agent.resend_recent()  # sent just now: within two slots
    assert [t.job for r in agent.reports() for t in r.jobs] == ["j1"]


def test_a_plan_of_more_bad_entries_than_a_heartbeat_says_is_said_at_the_bound() -> None:
    """A plan may leave out more bad entries than a heartbeat says: it says the most
    it may, and stays one the daemon takes (over it, the daemon drops the heartbeat,
    and the server falls silent)."""
    import dataclasses

    from controller.plane.agent_messages import MAX_ENTRIES_LEFT_OUT, Heartbeat
    from tests.fake_mqtt import FakeMqtt

    agent = Agent("w0", MqttConfig("localhost"))
    bad = _plan(1, {"j1": 1}, {})
    bad = dataclasses.replace(
        bad, current=dataclasses.replace(bad.current, refused=3 * MAX_ENTRIES_LEFT_OUT)
    )
    agent.accept(bad)
    client = FakeMqtt()

    async def go() -> None:
        beating = asyncio.create_task(agent._beat(client))  # type: ignore[arg-type]
        while not client.sent:
            await asyncio.sleep(0.01)
        beating.cancel()

    asyncio.run(go())
    (topic, payload), *_ = client.sent
    assert topic == agent.topics.heartbeat("w0")
    assert Heartbeat.parse(payload).entries_left_out == MAX_ENTRIES_LEFT_OUT


def test_a_guard_whose_resource_some_task_carries_is_not_said_unused() -> None:
    from structlog.testing import capture_logs

    from controller.plane.memory_guard import parse_memory_resource

    def tasks(demands: list[dict[str, float]]) -> Plan:
        jobs = [Task(f"j{i}", 1, 0, 0.5, 40, demand=d) for i, d in enumerate(demands)]
        return Plan("w0", "worker", 1, 10.0, 0.5, False, SlotPlan(5, 100.0, jobs),
                    SlotPlan(6, 110.0, []))  # fmt: skip

    said = "no task of the plan has a demand of the memory resource"
    for demands, warned in (([{"mem": 1.0}, {"gpu": 1.0}], False), ([{"gpu": 1.0}], True)):
        agent = Agent("w0", MqttConfig("localhost"), command="true",
                      memory_guard=parse_memory_resource("mem=GB"))  # fmt: skip
        with capture_logs() as logs:
            agent.accept(tasks(demands))
        assert any(said in e["event"] for e in logs) == warned, demands


def test_the_last_report_at_the_agents_stop_sends_every_jobs_counts() -> None:
    """More jobs than one message holds: all of them go, in as many messages."""
    from controller.plane.agent_messages import MAX_REPORT_JOBS, Progress
    from tests.fake_mqtt import FakeMqtt

    agent = Agent("w0", MqttConfig("localhost"))
    jobs = [f"j{i}" for i in range(MAX_REPORT_JOBS + 1)]
    for job in jobs:
        agent.tasks[job] = TaskState(minibatches=5.0, worker_seconds=5.0)
    client = FakeMqtt()

    class Connection:
        async def __aenter__(self) -> FakeMqtt:
            return client

        async def __aexit__(self, *_: object) -> None:
            return None

    agent._client = Connection  # type: ignore[assignment,method-assign]
    asyncio.run(agent._last_report())
    sent = [t.job for _, payload in client.sent for t in Progress.parse(payload).jobs]
    assert sorted(sent) == sorted(jobs) and len(client.sent) == 2


@pytest.mark.parametrize("speed", [0.0, -1.0, math.inf, math.nan])
def test_an_agent_of_a_speed_not_a_finite_positive_number_is_refused(speed: float) -> None:
    """Whoever builds one (not only ``oasis agent``): inf or nan reported every
    planned job done at once."""
    with pytest.raises(ValueError, match="speed: must be a number > 0"):
        Agent("w0", MqttConfig("localhost"), speed=speed)


def test_an_empty_status_is_said_bad_and_an_empty_plan_part_is_skipped() -> None:
    """An empty payload on a plan part's topic is a part cleared: nothing there. On the
    status topic it is no status: said, as any bad one."""
    from collections.abc import AsyncIterator
    from dataclasses import dataclass

    from structlog.testing import capture_logs

    agent = Agent("w0", MqttConfig("localhost"))

    @dataclass
    class Message:
        topic: str
        payload: bytes

    async def messages() -> AsyncIterator[Message]:
        yield Message(agent.topics.plan_parts("w0").replace("+", "1"), b"")
        yield Message(agent.topics.status, b"")

    @dataclass
    class Client:
        messages: AsyncIterator[Message]

    client = Client(messages())
    with capture_logs() as logs:
        asyncio.run(agent._receive(client))  # type: ignore[arg-type]
    assert [e["event"] for e in logs] == ["bad status"]
