"""The reference agent's worker commands (``oasis agent --command``,
controller/plane/workers.py) with real processes: what runs on a server is what its plan
says, and nothing of a job outlasts its place in the plan (the audit of jobs that do not
follow their plan)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from controller.plane.agent import Agent
from controller.plane.settings import MqttConfig
from controller.plane.topics import Plan, SlotPlan, Task
from controller.plane.workers import Commands


def two_jobs(first: str, second: str, workers: int = 1) -> Plan:
    """``first`` in slot 5 (100-110 s), ``second`` in slot 6 (110-120 s), on w0."""
    return Plan(
        "w0", "worker", 1, 10.0, 0.5, False,
        SlotPlan(5, 100.0, [Task(first, workers, 0, 0.5, 40)]),
        SlotPlan(6, 110.0, [Task(second, workers, 0, 0.5, 40)]),
    )  # fmt: skip


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def steps(agent: Agent, until: Callable[[], bool], seconds: float = 10.0) -> None:
    """Run the agent's command steps until ``until()`` holds (AssertionError if not
    within ``seconds``)."""
    deadline = time.monotonic() + seconds
    while not until():
        assert time.monotonic() < deadline, "not within the time"
        await asyncio.sleep(0.02)
        await agent._commands(0.02)


def commands(agent: Agent) -> Commands:
    assert agent.commands is not None
    return agent.commands


# a worker that writes its pid, counts the SIGTERMs it gets in a file and ignores them
_STUBBORN = """
import os, signal, sys, time
out = sys.argv[1] + "/" + os.environ["OASIS_JOB"] + "-" + os.environ["OASIS_WORKER"]
terms = [0]
def term(*_):
    terms[0] += 1
    open(out + ".terms", "w").write(str(terms[0]))
signal.signal(signal.SIGTERM, term)
open(out + ".pid", "w").write(str(os.getpid()))
print(1, flush=True)
while True:
    time.sleep(0.05)
"""


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace_before_the_next_job_starts(
    tmp_path: Path,
) -> None:
    """Before: SIGTERM every 50 ms, never SIGKILL, and the next tenant's worker started
    beside the departing one on the same GPUs, for good."""
    script = tmp_path / "stubborn.py"
    script.write_text(_STUBBORN)
    now = [101.0]
    agent = Agent("w0", MqttConfig("localhost"), command=f"{sys.executable} {script} {tmp_path}",
                  wall=lambda: now[0], stop_grace=1.0)  # fmt: skip
    agent.accept(two_jobs("a", "b"))

    async def go() -> None:
        await agent._commands(0.0)
        await steps(agent, lambda: (tmp_path / "a-0.pid").exists() and
                    agent.tasks["a"].minibatches == 1)  # fmt: skip
        first = int((tmp_path / "a-0.pid").read_text())
        now[0] = 111.0  # slot 6: a leaves the plan, b comes in
        stopped = time.monotonic()
        await steps(agent, lambda: not alive(first))
        waited = time.monotonic() - stopped
        assert 0.9 <= waited < 5.0, waited  # SIGKILL after the 1 s grace
        assert "b" not in agent.tasks or not (tmp_path / "b-0.pid").exists()
        assert (tmp_path / "a-0.terms").read_text() == "1"  # one SIGTERM, not one a step
        await steps(agent, (tmp_path / "b-0.pid").exists)  # b once a is gone
        assert agent.tasks["a"].minibatches == 1  # its count kept
        await commands(agent).stop_all()
        assert not alive(int((tmp_path / "b-0.pid").read_text()))

    asyncio.run(go())


def test_a_failing_worker_is_started_again_after_a_back_off_and_one_done_is_not(
    tmp_path: Path,
) -> None:
    """Before: any exit was restarted within 50 ms (30 forks a second), and each
    restart's count was added again: a worker printing 3 then failing completed its job
    in one slot. Now an exit 0 is a worker done, a failure waits 1 s, 2 s, 4 s, ..."""
    log = tmp_path / "starts"
    command = (f'echo "$OASIS_WORKER" >> {log}; echo 3; '
               '[ "$OASIS_WORKER" = 0 ] && exit 0; exit 1')  # fmt: skip
    now = [101.0]
    agent = Agent("w0", MqttConfig("localhost"), command=command, wall=lambda: now[0])
    agent.accept(two_jobs("a", "b", workers=2))

    async def go() -> None:
        await agent._commands(0.0)
        started = time.monotonic()
        job = agent.tasks["a"].workers
        await steps(agent, lambda: job.failures.get(1) == 3, seconds=15)
        took = time.monotonic() - started
        assert 2.5 <= took < 10, took  # 1 s, then 2 s of back-off between the 3 starts
        assert log.read_text().split().count("1") == 3
        assert log.read_text().split().count("0") == 1  # done: never started again
        assert job.finished == {0} and not job.running
        await steps(agent, lambda: agent.tasks["a"].minibatches == 12)  # 4 runs x 3
        assert len(log.read_text().split()) == 4

    asyncio.run(go())


def test_a_restarted_worker_takes_the_free_index(tmp_path: Path) -> None:
    """Before: worker 0 exiting came back as index 1, beside the live worker 1."""
    log = tmp_path / "indices"
    marker = tmp_path / "once"
    command = (f'echo "$OASIS_WORKER" >> {log}; '
               f'if [ "$OASIS_WORKER" = 0 ] && [ ! -e {marker} ]; then touch {marker}; exit 1; fi; '
               'sleep 30')  # fmt: skip
    now = [101.0]
    agent = Agent("w0", MqttConfig("localhost"), command=command, wall=lambda: now[0])
    agent.accept(two_jobs("a", "b", workers=2))

    async def go() -> None:
        await agent._commands(0.0)
        await steps(agent, lambda: log.exists() and len(log.read_text().split()) == 3)
        assert sorted(log.read_text().split()) == ["0", "0", "1"]
        assert sorted(w.index for w in agent.tasks["a"].workers.running) == [0, 1]
        await commands(agent).stop_all()

    asyncio.run(go())


def test_a_process_that_leaves_its_workers_session_is_stopped_with_its_job(
    tmp_path: Path,
) -> None:
    """Before: a worker's child that called setsid (a daemon) outlived the job's stop
    and the agent's, holding the server for good. The agent is its subreaper now."""
    pid_file = tmp_path / "escaped"
    escape = (f"import os, time\nif os.fork() == 0:\n    os.setsid()\n"
              f"    open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
              "    time.sleep(60)\n")  # fmt: skip
    script = tmp_path / "escape.py"
    script.write_text(escape)
    now = [101.0]
    agent = Agent("w0", MqttConfig("localhost"), command=f"{sys.executable} {script}; sleep 30",
                  wall=lambda: now[0], stop_grace=1.0)  # fmt: skip
    agent.accept(two_jobs("a", "b"))
    assert commands(agent).subreaper

    async def go() -> None:
        await agent._commands(0.0)
        await steps(agent, lambda: pid_file.exists() and pid_file.read_text() != "")
        escaped = int(pid_file.read_text())
        assert os.getsid(escaped) == escaped  # its own session: killpg misses it
        await asyncio.sleep(1.2)  # a scan while its job runs leaves it be
        await agent._commands(0.02)
        assert alive(escaped)
        now[0] = 121.0  # the plan ran out: a's worker stops, and so does the escape
        await steps(agent, lambda: not alive(escaped))
        await commands(agent).stop_all()

    asyncio.run(go())
