"""The reference agent following its plans, pinned where the mutation audit of
controller/plane/agent.py found nothing that would fail: the slot boundary, the jobs
of a new plan's next slot, tasks of no worker (a parameter server's)."""

from __future__ import annotations

import asyncio

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
