"""The reference agent's worker commands (``oasis agent --command``,
controller/plane/workers.py) with real processes: what runs on a server is what its plan
says, and nothing of a job outlasts its place in the plan (the audit of jobs that do not
follow their plan)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import pytest

from controller import procfs
from controller.plane.agent import Agent
from controller.plane.settings import MqttConfig
from controller.plane.topics import Plan, SlotPlan, Task
from controller.plane.workers import Commands, _environment_of
from tests.servers import ROOT


def plan_of(slot_5: dict[str, int], slot_6: dict[str, int], server: str = "w0") -> Plan:
    """A plan of ``server`` with ``{job: workers}`` in slot 5 (100-110 s) and in slot 6
    (110-120 s), each job of 40 mini-batches."""

    def tasks(workers: dict[str, int]) -> list[Task]:
        return [Task(job, n, 0, 0.5, 40) for job, n in workers.items()]

    return Plan(server, "worker", 1, 10.0, 0.5, False,
                SlotPlan(5, 100.0, tasks(slot_5)), SlotPlan(6, 110.0, tasks(slot_6)))  # fmt: skip


def two_jobs(first: str, second: str, workers: int = 1, server: str = "w0") -> Plan:
    """``first`` in slot 5 (100-110 s), ``second`` in slot 6 (110-120 s), on ``server``."""
    return plan_of({first: workers}, {second: workers}, server)


def agent_on(
    command: str, plan: Plan, mqtt: MqttConfig | None = None, **options: Any
) -> tuple[Agent, list[float]]:
    """An agent of ``plan``'s server running ``command`` per worker and following
    ``plan``, its wall clock ``now[0]`` at 101 s (slot 5; the test moves it):
    ``(agent, now)``."""
    now = [101.0]
    agent = Agent(plan.server, mqtt or MqttConfig("localhost"), command=command,
                  wall=lambda: now[0], **options)  # fmt: skip
    agent.accept(plan)
    return agent, now


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def kill_worker(pid: int, *, group: bool = False) -> None:
    """SIGKILL worker process ``pid`` (``group``: every process of the group it led), if
    it is still a worker's: one with ``OASIS_JOB`` in its environment, as the agent starts
    them and their children inherit. A test's clean-up runs when its workers may be long
    gone, and with pid_max 32768 and a suite that starts thousands of processes and
    threads, a pid read back may be another test's daemon by then (CI: one exited at
    start with an empty log, killed by a clean-up like this)."""
    targets = [p for p in procfs.pids() if _group_of(p) == pid] if group else [pid]
    for target in targets:
        if "OASIS_JOB" in _environment_of(target):
            with contextlib.suppress(ProcessLookupError):
                os.kill(target, signal.SIGKILL)


def _group_of(pid: int) -> int | None:
    """``pid``'s process group (``stat``'s pgrp), None if it cannot be read."""
    try:
        return int(procfs.stat_fields(pid)[2])
    except (OSError, IndexError, ValueError):
        return None


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


async def end_given_up(pid: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL the group of worker ``pid``, which the agent gave up on (a test's patch
    keeps it from signalling), wait until asyncio's child watcher reaped it and told its
    transport, then lift the test's patches: the agent may stop its workers again."""
    os.killpg(pid, signal.SIGKILL)
    while os.path.exists(f"/proc/{pid}"):
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)
    monkeypatch.undo()


def run(agent: Agent, body: Callable[[], Awaitable[None]]) -> None:
    """``body()`` on an event loop, then every worker of ``agent`` stopped, whatever
    happened (a failed test leaves no process behind)."""

    async def go() -> None:
        try:
            await body()
        finally:
            agent_commands = commands(agent)
            agent_commands.stop_grace = min(agent_commands.stop_grace, 0.5)
            await agent_commands.stop_all()

    asyncio.run(go())


def kill(pid_file: Path) -> None:
    """SIGKILL the process whose pid ``pid_file`` holds, if any."""
    with contextlib.suppress(FileNotFoundError, ValueError):
        kill_worker(int(pid_file.read_text()))


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
    agent, now = agent_on(
        f"{sys.executable} {script} {tmp_path}", two_jobs("a", "b"), stop_grace=1.0
    )

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

    run(agent, go)


def test_a_worker_started_as_the_agent_stops_is_not_left_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGTERM cancels the agent's work loop. A worker whose process had started, but
    whose output the agent was still connecting (not counted yet), was out of the stop's
    reach: in a session of its own, it ran on after the agent, holding the server (a
    fresh-clone CI run). The cancellation now kills it."""
    real = asyncio.create_subprocess_shell
    started: list[int] = []

    async def spawned_then_stopped(*args: Any, **kwargs: Any) -> Any:
        proc = await real(*args, **kwargs)
        started.append(proc.pid)
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # as Agent.run's stop does, at the next await of the start
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_shell", spawned_then_stopped)
    agent, _now = agent_on("sleep 60", plan_of({"a": 1}, {}))

    async def go() -> None:
        with pytest.raises(asyncio.CancelledError):
            await agent._commands(0.0)

    try:
        run(agent, go)
        assert len(started) == 1
        deadline = time.monotonic() + 5
        while alive(started[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(started[0])
        assert not commands(agent).live
    finally:
        for pid in started:
            kill_worker(pid, group=True)


def test_a_failing_worker_is_started_again_after_a_back_off_and_one_done_is_not(
    tmp_path: Path,
) -> None:
    """Before: any exit was restarted within 50 ms (30 forks a second), and each
    restart's count was added again: a worker printing 3 then failing completed its job
    in one slot. Now an exit 0 is a worker done, a failure waits 1 s, 2 s, 4 s, ..."""
    log = tmp_path / "starts"
    command = (f'echo "$OASIS_WORKER" >> {log}; echo 3; '
               '[ "$OASIS_WORKER" = 0 ] && exit 0; exit 1')  # fmt: skip
    agent, _ = agent_on(command, two_jobs("a", "b", workers=2))

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
        # counted for the job's tenant (the daemon hears them): exits not 0 only
        assert job.failed == 3 and job.last_failure == "exit status 1"
        (entry,) = [t for r in agent.reports() for t in r.jobs if t.job == "a"]
        assert (entry.failures, entry.last_failure) == (3, "exit status 1")
        await steps(agent, lambda: agent.tasks["a"].minibatches == 12)  # 4 runs x 3
        assert len(log.read_text().split()) == 4

    run(agent, go)


def test_a_restarted_worker_takes_the_free_index(tmp_path: Path) -> None:
    """Before: worker 0 exiting came back as index 1, beside the live worker 1."""
    log = tmp_path / "indices"
    marker = tmp_path / "once"
    command = (f'echo "$OASIS_WORKER" >> {log}; '
               f'if [ "$OASIS_WORKER" = 0 ] && [ ! -e {marker} ]; then touch {marker}; exit 1; fi; '
               'sleep 30')  # fmt: skip
    agent, _ = agent_on(command, two_jobs("a", "b", workers=2))

    async def go() -> None:
        await agent._commands(0.0)
        await steps(agent, lambda: log.exists() and len(log.read_text().split()) == 3)
        assert sorted(log.read_text().split()) == ["0", "0", "1"]
        assert sorted(w.index for w in agent.tasks["a"].workers.running) == [0, 1]

    run(agent, go)


def test_fewer_workers_stop_the_highest_indices_and_a_finished_one_is_not_replaced(
    tmp_path: Path,
) -> None:
    """Before: the workers past the new count in order of their indices were stopped, so
    with index 0 done, a 2-worker task ran indices 1 and 2 (``OASIS_WORKER`` past the
    task's workers), or 3 workers for a while."""
    log = tmp_path / "indices"
    command = f'echo "$OASIS_WORKER" >> {log}; [ "$OASIS_WORKER" = 0 ] && exit 0; sleep 30'
    agent, now = agent_on(command, plan_of({"a": 3}, {"a": 2}))
    job = agent.tasks

    async def go() -> None:
        await agent._commands(0.0)
        await steps(agent, lambda: job["a"].workers.finished == {0} and
                    len(job["a"].workers.running) == 2)  # fmt: skip
        now[0] = 111.0  # 2 workers: index 2 goes, index 0 is done
        await agent._commands(0.02)
        assert [w.index for w in commands(agent).departing] == [2]
        await steps(agent, lambda: not commands(agent).departing)
        assert [w.index for w in job["a"].workers.running] == [1]
        await asyncio.sleep(0.3)
        await agent._commands(0.02)
        assert [w.index for w in job["a"].workers.running] == [1]
        assert sorted(log.read_text().split()) == ["0", "1", "2"]

    run(agent, go)


def test_a_worker_whose_output_an_escaped_process_holds_is_gone_with_its_group(
    tmp_path: Path,
) -> None:
    """The review: a worker's child in a session of its own kept the worker's output
    open, so the stopped worker never counted as gone, and no worker of any job
    started on the server again. A worker is gone once its process group is empty."""
    escaped = tmp_path / "escaped"
    command = (f'if [ "$OASIS_JOB" = a ] && [ "$OASIS_WORKER" = 1 ]; then '
               f'setsid sh -c \'echo $$ > {escaped}; exec sleep 60\' & fi; '
               f'echo "$OASIS_JOB" >> {tmp_path / "started"}; sleep 30')  # fmt: skip
    agent, now = agent_on(command, plan_of({"a": 2}, {"a": 1, "b": 1}), stop_grace=0.5)

    async def go() -> None:
        await agent._commands(0.0)
        await steps(agent, lambda: escaped.exists() and escaped.read_text().strip() != "")
        now[0] = 111.0  # a's worker 1 departs; b may start once it is gone
        await steps(agent, lambda: "b" in (tmp_path / "started").read_text())
        assert alive(int(escaped.read_text()))  # a's: a still runs here

    try:
        run(agent, go)
    finally:
        kill(escaped)


def test_a_worker_that_cannot_be_stopped_is_given_up_on_and_holds_the_server_no_longer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker the agent may not signal (run as another user) stayed departing for
    good, and no worker of any job started on the server again (the review)."""
    from controller.plane import workers

    monkeypatch.setattr(workers, "GIVE_UP_SECONDS", 0.5)
    monkeypatch.setattr(workers, "_kill_group", lambda group, sig: None)  # EPERM, as it were
    pids = tmp_path / "pids"
    agent, now = agent_on(f"echo $$ >> {pids}; sleep 30", two_jobs("a", "b"), stop_grace=0.5)

    async def go() -> None:
        await agent._commands(0.0)
        await steps(agent, pids.exists)
        now[0] = 111.0
        started = time.monotonic()
        await steps(agent, lambda: len(pids.read_text().split()) == 2)  # b, after 1 s
        assert time.monotonic() - started >= 0.9
        first = int(pids.read_text().split()[0])
        assert alive(first)  # given up on, not stopped
        await end_given_up(first, monkeypatch)  # b's worker may be stopped again

    try:
        run(agent, go)
    finally:
        for pid in pids.read_text().split() if pids.exists() else []:
            kill_worker(int(pid), group=True)


_ORPHANS_SCRIPT = """
import asyncio, os, subprocess, sys, time
from tests.test_agent_workers import agent_on, alive, plan_of, steps

folder = sys.argv[1]
escape = (
    "import os, time\\n"
    "if os.fork() == 0:\\n"
    "    os.setsid()\\n"
    "    open(os.environ['ESCAPED'], 'w').write(str(os.getpid()))\\n"
    "    time.sleep(60)\\n"
)
os.environ["ESCAPED"] = folder + "/escaped"
command = f"{sys.executable} -c \\"{escape}\\"; sleep 30"
# a server of its own: at its start, an agent that adopts orphans stops every other
# agent's workers of its server on this machine (those of tests running beside it)
server = os.path.basename(folder)
agent, now = agent_on(command, plan_of({"a": 1}, {}, server), stop_grace=1.0,
                      adopt_orphans=True)
# a child of the agent's process that is no worker's: never signalled
bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)

async def main():
    assert agent.commands is not None and agent.commands.subreaper
    path = folder + "/escaped"
    await agent._commands(0.0)
    await steps(agent, lambda: os.path.exists(path) and open(path).read() != "", 20)
    escaped = int(open(path).read())
    assert os.getsid(escaped) == escaped
    for _ in range(30):  # 1.5 s: a scan while its job runs leaves it be
        await asyncio.sleep(0.05)
        await agent._commands(0.05)
    assert alive(escaped)
    now[0] = 121.0  # the plan ran out: a's worker stops, and so does the escape
    await steps(agent, lambda: not alive(escaped), 20)
    await agent.commands.stop_all()
    print("escaped stopped; bystander", "alive" if bystander.poll() is None else "killed")

try:
    asyncio.run(main())
finally:
    bystander.kill()
"""


def test_a_process_that_leaves_its_workers_session_is_stopped_with_its_job(
    tmp_path: Path,
) -> None:
    """Before: a worker's child that called setsid (a daemon) outlived the job's stop
    and the agent's, holding the server for good. ``oasis agent`` is its workers'
    subreaper now, and stops such a process, marked as its own, once its job no longer
    runs there; a child of its process without the mark is left alone (run in a
    process of its own: a subreaper's orphans are the whole process's)."""
    out = subprocess.run([sys.executable, "-c", _ORPHANS_SCRIPT, str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    try:
        assert out.returncode == 0, out.stderr[-3000:]
        assert "escaped stopped; bystander alive" in out.stdout, out.stdout[-2000:]
    finally:
        kill(tmp_path / "escaped")


def test_an_agent_whose_work_loop_fails_stops_with_the_error(tmp_path: Path) -> None:
    """Before: a worker that could not be started (out of processes) ended the work
    loop silently; the agent heartbeat on and ran nothing. A start's OSError is now a
    failure with a back-off, and any other error of the loop stops the agent."""
    from tests.servers import free_port

    agent, _ = agent_on("sleep 30", two_jobs("a", "b"), MqttConfig("127.0.0.1", free_port()))

    async def broken(dt: float) -> None:
        raise ValueError("a bug")

    agent._commands = broken  # type: ignore[method-assign]

    async def go() -> None:
        await asyncio.wait_for(agent.run(), 10)

    with pytest.raises(RuntimeError, match="the agent's work loop failed: ValueError"):
        asyncio.run(go())


def test_a_worker_that_cannot_be_started_is_a_failure_with_a_back_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def no_fork(*args: object, **kwargs: object) -> None:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(asyncio, "create_subprocess_shell", no_fork)
    agent, _ = agent_on("sleep 30", two_jobs("a", "b"))

    descriptors = len(os.listdir("/proc/self/fd"))

    async def go() -> None:
        await agent._commands(0.0)
        job = agent.tasks["a"].workers
        assert job.failures == {0: 1} and not job.running and job.retry_at[0] > 0
        assert job.failed == 1
        assert job.last_failure == "could not start: BlockingIOError: [Errno 11] Resource " \
            "temporarily unavailable"  # fmt: skip
        await agent._commands(0.02)  # within its back-off: not tried again
        assert job.failures == {0: 1}
        for _ in range(20):  # every failed start closes its pipe (each leaked one)
            job.retry_at.clear()
            await agent._commands(0.02)

    run(agent, go)
    assert len(os.listdir("/proc/self/fd")) <= descriptors + 2


def test_a_worker_that_exits_while_an_escaped_process_holds_its_output_is_reaped(
    tmp_path: Path,
) -> None:
    """The second review: a worker whose process group emptied was reaped only once its
    output ended, so a failed worker was never started again (nor a finished one marked
    done) while a process outside its group held the output open, and it counted as
    running, its worker-seconds with it."""
    escaped = tmp_path / "escaped"
    command = f"setsid sh -c 'echo $$ > {escaped}; exec sleep 60' & echo 5; exit 1"
    agent, _ = agent_on(command, two_jobs("a", "b"))

    async def go() -> None:
        await agent._commands(0.0)
        job = agent.tasks["a"].workers
        await steps(agent, lambda: job.failures.get(0) == 1)
        assert not job.running and agent.tasks["a"].minibatches == 5  # its count kept

    try:
        run(agent, go)
    finally:
        kill(escaped)


def test_a_process_given_up_on_is_not_taken_back_as_an_orphan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second review: a worker given up on (it could not be stopped) stayed a child
    of the agent, marked as its own; the orphan scan took it back at once, and held
    every other job off the server again, for good."""
    from controller.plane import workers

    agent = Agent("w0", MqttConfig("localhost"), command="true")
    pool = commands(agent)
    pool.subreaper = True  # as with adopt_orphans, without making this process one
    stuck = 999_999  # a pid the agent cannot stop
    monkeypatch.setattr(workers, "_children", lambda: [stuck])
    monkeypatch.setattr(workers, "_ended", lambda pid: False)
    monkeypatch.setattr(workers, "_environment_of", lambda pid: {"OASIS_AGENT": agent.session})
    monkeypatch.setattr(os, "getpgid", lambda pid: pid)
    monkeypatch.setattr(workers, "_signal_group", lambda pid, sig: None)
    pool._scan_orphans(set(), 0.0)
    assert stuck in pool._orphans
    pool._escalate(pool.stop_grace)  # SIGKILL, to no effect
    pool._escalate(pool.stop_grace + workers.GIVE_UP_SECONDS)  # given up on
    assert stuck not in pool._orphans
    pool._scan_orphans(set(), 100.0)
    assert stuck not in pool._orphans  # taken back before
    monkeypatch.setattr(workers, "_children", lambda: [])
    pool._scan_orphans(set(), 101.0)  # gone: its pid may be another's later
    assert not pool._given_up


def test_counts_past_the_jobs_whole_are_capped_and_all_workers_done_is_said(
    tmp_path: Path,
) -> None:
    """The re-audit: one line of 9e15 showed as 9e15 of 60 mini-batches, and a job whose
    workers all exited 0 early said nothing until its plan ended."""
    from structlog.testing import capture_logs

    agent, _ = agent_on("echo 9e15; exit 0", two_jobs("a", "b", workers=2))

    async def go() -> None:
        await agent._commands(0.0)
        await steps(agent, lambda: agent.tasks["a"].workers.finished == {0, 1})
        for _ in range(3):
            await agent._commands(0.02)

    with capture_logs() as logs:
        run(agent, go)
    assert agent.tasks["a"].minibatches == 40  # the task's whole
    said = [e for e in logs if e["event"].startswith("every worker of the job exited 0")]
    assert len(said) == 1 and said[0]["job"] == "a", said


def test_an_empty_worker_command_is_refused() -> None:
    """The re-audit: the agent's unit with OASIS_WORKER_COMMAND unset passed --command ''
    and the agent simulated its jobs, completing them with no work done."""
    out = subprocess.run([sys.executable, "-m", "controller.cli", "agent", "--node", "w0",
                          "--command", ""], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=False)  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "--command: is empty (is OASIS_WORKER_COMMAND set" in out.stderr


_SUCCESSION_SCRIPT = """
import asyncio, os, sys
from controller.plane.settings import MqttConfig
from tests.test_agent_workers import agent_on, alive, steps, two_jobs

mode, folder = sys.argv[1], sys.argv[2]
if mode == "race":  # a's worker leaves a process that ignores SIGTERM in its own session
    command = ('if [ "$OASIS_JOB" = a ]; then setsid sh -c '
               f'\\'trap "" TERM; echo $$ > {folder}/escaped; exec sleep 60\\' & fi; '
               f'echo $$ > {folder}/$OASIS_JOB; exec sleep 60')
else:
    command = f"echo $$ > {folder}/{mode}; exec sleep 60"
# a server of its own: at its start, an agent that adopts orphans stops every other
# agent's workers of its server on this machine (those of tests running beside it)
server = os.path.basename(folder)
# "other": an agent of the same server under another topic prefix (another deployment)
mqtt = MqttConfig("localhost", topic_prefix="lab") if mode == "other" else None
agent, now = agent_on(command, two_jobs("a", "b", server=server), mqtt, stop_grace=1.0,
                      adopt_orphans=True)

def read(name):
    path = os.path.join(folder, name)
    return int(open(path).read()) if os.path.exists(path) and open(path).read().strip() else 0

async def main():
    await agent._commands(0.0)
    if mode == "first":  # then killed with -9 by the test
        await steps(agent, lambda: read("first"), 20)
        print("ready", flush=True)
        await asyncio.sleep(120)
    elif mode in ("second", "other"):  # the first agent's worker is stopped first
        old = read("first")
        await steps(agent, lambda: read(mode), 20)
        print("old worker", "alive" if alive(old) else "gone", flush=True)
    else:
        await steps(agent, lambda: read("escaped") and read("a"), 20)
        escaped = read("escaped")
        now[0] = 111.0  # a leaves, b comes in
        await steps(agent, lambda: read("b"), 20)
        print("escaped", "alive" if alive(escaped) else "gone", "when b started", flush=True)
    await agent.commands.stop_all()

asyncio.run(main())
"""


def _succession(mode: str, folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _SUCCESSION_SCRIPT, mode, str(folder)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip


def test_workers_an_agent_killed_with_9_left_are_stopped_by_the_next_agent(
    tmp_path: Path,
) -> None:
    """The re-audit: after kill -9 of an agent (or the OOM killer), its workers ran on,
    reparented to init, and the restarted agent started a second set beside them."""
    first = subprocess.Popen([sys.executable, "-c", _SUCCESSION_SCRIPT, "first", str(tmp_path)],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert first.stdout is not None
        for line in first.stdout:  # after the agent's log lines
            if line.strip() == "ready":
                break
        first.kill()
        first.wait(10)
        old = int((tmp_path / "first").read_text())
        assert alive(old)  # left behind
        # an agent of another prefix leaves it be (the audit: it stopped a running
        # agent's workers as leftovers)
        out = _succession("other", tmp_path)
        assert "old worker alive" in out.stdout, out.stdout + out.stderr[-2000:]
        out = _succession("second", tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "old worker gone" in out.stdout, out.stdout + out.stderr[-2000:]
    finally:
        if first.poll() is None:
            first.kill()
        first.wait(10)
        if first.stdout is not None:
            first.stdout.close()
        for name in ("first", "second", "other"):
            with contextlib.suppress(FileNotFoundError, ValueError):
                kill_worker(int((tmp_path / name).read_text()), group=True)


def test_a_departed_workers_escaped_process_is_gone_before_the_next_job_starts(
    tmp_path: Path,
) -> None:
    """The re-audit: the orphan scan ran once a second, so the next job's worker started
    beside a departed worker's escaped process for up to a second and the grace."""
    try:
        out = _succession("race", tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "escaped gone when b started" in out.stdout, out.stdout + out.stderr[-2000:]
    finally:
        kill(tmp_path / "escaped")


def test_the_agent_runs_without_the_daemons_libraries(tmp_path: Path) -> None:
    """Reading [mqtt] from --config imported the daemon's config module, and with it the
    store, the pricing core, numba and SQLAlchemy: 153 MB resident on every GPU server
    (the re-audit), 31 MB without them."""
    config = tmp_path / "agent.toml"
    config.write_text('[mqtt]\nurl = "mqtt://127.0.0.1:1"\n')
    agent = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "controller.cli", "agent", "--node", "w0",
         "--config", str(config), "--command", "sleep 1"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(3)  # running: connecting to a broker that is not there, again and again
    agent.terminate()
    _, imports = agent.communicate(timeout=30)
    names = {line.rsplit("|", 1)[-1].strip() for line in imports.splitlines() if "|" in line}
    assert "controller.plane.agent" in names, imports[-2000:]
    assert not names & {"sqlalchemy", "numba", "controller.config", "grpc"}, sorted(names)


def _device_plan(slot_5: list[Task], slot_6: list[Task], devices: int | None = 4) -> Plan:
    return Plan("w0", "worker", 1, 10.0, 0.5, False, SlotPlan(5, 100.0, slot_5),
                SlotPlan(6, 110.0, slot_6), devices=devices)  # fmt: skip


def test_each_worker_gets_devices_of_its_own_and_a_job_without_gpus_sees_none(
    tmp_path: Path,
) -> None:
    """Before: no worker was told its devices, so two tenants' jobs on one 4-GPU server
    both ran on device 0 (the framework's default) and the other three idled."""
    command = f'echo "$CUDA_VISIBLE_DEVICES" > {tmp_path}/$OASIS_JOB-$OASIS_WORKER; exec sleep 30'
    a, b, c = (
        Task("a", 2, 0, 0.5, 40, devices=1),
        Task("b", 1, 0, 0.5, 40, devices=2),
        Task("c", 1, 0, 0.5, 40),
    )
    d = Task("d", 1, 0, 0.5, 40, devices=2)
    agent, now = agent_on(command, _device_plan([a, b, c], [b, d]))

    def seen(name: str) -> list[str] | None:
        """The worker's devices; None until its line is written (the shell creates the
        file before echo writes to it: an empty file read then failed a CI run)."""
        path = tmp_path / name
        text = path.read_text() if path.exists() else ""
        return [x for x in text.strip().split(",") if x] if text.endswith("\n") else None

    async def go() -> None:
        await steps(agent, lambda: all(seen(n) is not None for n in ("a-0", "a-1", "b-0", "c-0")))
        held = [seen("a-0"), seen("a-1"), seen("b-0")]
        assert [len(h or []) for h in held] == [1, 1, 2]
        flat = [x for h in held for x in h or []]
        assert sorted(flat) == ["0", "1", "2", "3"], held  # four GPUs, none twice
        assert seen("c-0") == []  # no GPU in its demand: it sees none, not every one
        now[0] = 111.0  # slot 6: a and c leave, d (2 GPUs) comes in beside b
        await steps(agent, lambda: seen("d-0") is not None)
        assert sorted((seen("d-0") or []) + (seen("b-0") or [])) == ["0", "1", "2", "3"]

    run(agent, go)


@pytest.mark.parametrize("given", [None, ["0", "1", "2", "3"]])
def test_a_plan_without_devices_leaves_the_workers_environment_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: list[str] | None
) -> None:
    """A plan of an older daemon (or with ``device_resource = ""``) counts none: the
    workers get the agent's own CUDA_VISIBLE_DEVICES, as before, ids given or not (the
    review: with --devices every worker got it empty, a GPU job no GPU)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")
    out = tmp_path / "seen"
    task = Task("a", 1, 0, 0.5, 40)
    agent, _ = agent_on(f'echo "$CUDA_VISIBLE_DEVICES" > {out}; exec sleep 30',
                        _device_plan([task], [], devices=None), devices=given)  # fmt: skip

    async def go() -> None:
        await steps(agent, out.exists)
        await steps(agent, lambda: out.read_text().strip() != "")
        assert out.read_text().strip() == "5,6"

    run(agent, go)


def test_a_given_up_workers_devices_are_not_handed_to_the_next_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review: a worker given up on (one the agent may not signal) may still run on
    its GPU; the next tenant's worker was put on that GPU while three idled."""
    from controller.plane import workers

    monkeypatch.setattr(workers, "GIVE_UP_SECONDS", 0.3)
    monkeypatch.setattr(workers, "_kill_group", lambda group, sig: None)  # EPERM, as it were
    pids = tmp_path / "pids"
    command = f'echo "$$ $OASIS_JOB $CUDA_VISIBLE_DEVICES" >> {pids}; exec sleep 30'
    a, b = Task("a", 1, 0, 0.5, 40, devices=1), Task("b", 1, 0, 0.5, 40, devices=1)
    agent, now = agent_on(command, _device_plan([a], [b]), stop_grace=0.3)
    started: list[list[str]] = []

    async def go() -> None:
        await steps(agent, pids.exists)
        now[0] = 111.0  # a leaves (and cannot be stopped), b comes in
        await steps(agent, lambda: len(pids.read_text().splitlines()) == 2)
        started.extend(line.split() for line in pids.read_text().splitlines())
        assert alive(int(started[0][0]))
        assert started[0][1:] == ["a", "0"] and started[1][1:] == ["b", "1"], started
        await end_given_up(int(started[0][0]), monkeypatch)  # a is gone at last
        await steps(agent, lambda: commands(agent).devices.used == {"1": 1.0})  # GPU 0 free

    try:
        run(agent, go)
    finally:
        for line in started:
            kill_worker(int(line[0]), group=True)


def test_a_second_agent_for_the_server_on_this_machine_is_refused_until_the_first_is_gone(
    tmp_path: Path,
) -> None:
    """Before: two agents for one server (a unit started twice, a copy run by hand) ran
    every worker twice, and each stopped the other's workers at its start as an earlier
    agent's leftovers. The second now exits 2 naming the first's pid; once the first is
    killed (-9: no lock to clean up), an agent starts again."""
    from tests.servers import free_port

    broker = f"mqtt://127.0.0.1:{free_port()}"  # nothing listens: the agents keep retrying
    node = tmp_path.name  # a server of its own (tests beside this one run agents too)

    started: list[subprocess.Popen[str]] = []

    def agent(*extra: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-m", "controller.cli", "agent", "--node",
                                 node, "--broker", broker, *extra], cwd=ROOT, text=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
        started.append(proc)
        return proc

    from controller.plane import one_agent

    port = int(broker.rsplit(":", 1)[1])

    def holder(prefix: str = "oasis") -> int:
        key = one_agent.agent_key("127.0.0.1", port, prefix, node)
        return one_agent._holder(one_agent._address(key))[0]

    def held_by(proc: subprocess.Popen[str], prefix: str = "oasis") -> None:
        deadline = time.monotonic() + 60  # its imports take a while on a loaded machine
        while holder(prefix) != proc.pid:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the agent does not hold its server"
            time.sleep(0.1)

    first = agent()
    try:
        held_by(first)
        # the same broker by another name (the audit: not refused, and both ran)
        second = agent("--broker", broker.replace("127.0.0.1", "localhost"))
        _, err = second.communicate(timeout=60)
        assert second.returncode == 2, err
        assert f"another oasis agent for server {node!r} on broker localhost:" in err, err
        assert f"runs on this machine (pid {first.pid})" in err, err
        other = agent("--topic-prefix", "lab")  # another deployment's agent: not the same
        held_by(other, "lab")
        other.kill()
        other.communicate(timeout=30)
        first.kill()
        first.communicate(timeout=30)
        third = agent()
        held_by(third)
    finally:
        for proc in started:  # every agent it started, whatever failed (none left running)
            proc.kill()
            proc.communicate(timeout=30)


def test_the_output_budget_slows_a_flooding_worker_to_its_rate_and_not_a_drained_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: a worker printing as fast as it could (``yes``) took a whole core of the
    server from the other tenants' workers (bench/agent_output.py: 1.0 CPU s/s)."""
    from controller.plane import workers

    clock, slept, ended = [0.0], [], [False]

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(asyncio, "sleep", sleep)
    budget = workers.OutputBudget(lambda: ended[0], lambda: clock[0])

    async def lines(n: int, size: int = 2) -> None:
        for _ in range(n):
            await budget.spend(size)

    asyncio.run(lines(int(workers.OUTPUT_LINES_PER_SECOND)))  # a second's worth at once
    assert slept == []
    asyncio.run(lines(4000))  # then at the rate: 4000 more lines take 2 s
    assert sum(slept) == pytest.approx(2.0, rel=1e-3)
    slept.clear()
    asyncio.run(lines(10, size=1 << 20))  # 10 MiB in long lines: 1 MiB a second, past
    # the first (the bucket of bytes is still about full)
    assert sum(slept) == pytest.approx(9.0, rel=1e-2)
    slept.clear()
    ended[0] = True  # its processes are gone: what is left in the pipe is read at once
    asyncio.run(lines(100_000))
    assert slept == []


def test_a_flooding_workers_last_count_is_read_once_it_exits(tmp_path: Path) -> None:
    """The budget holds a flooding worker back on its pipe; once it exits, the rest of
    its output is read at once, its last count included."""
    script = tmp_path / "flood.py"
    script.write_text("import sys\nfor i in range(1, 30001):\n    print(i)\n")
    agent, _ = agent_on(f"{sys.executable} {script}", plan_of({"a": 1}, {}))
    agent.tasks.clear()

    async def go() -> None:
        await steps(agent, lambda: "a" in agent.tasks and 0 in agent.tasks["a"].workers.finished,
                    seconds=60)  # fmt: skip
        assert agent.tasks["a"].workers.done_before == 30000

    run(agent, go)


def test_workers_on_a_device_others_hold_are_counted_for_the_heartbeat(tmp_path: Path) -> None:
    """Two jobs of one GPU each on a plan that counts one (fewer ids than needed): both
    run on GPU 0, and the agent's heartbeat says 2 workers are short; none once one
    leaves."""
    a, b = Task("a", 1, 0, 0.5, 40, devices=1), Task("b", 1, 0, 0.5, 40, devices=1)
    agent, now = agent_on("exec sleep 30", _device_plan([a, b], [a], devices=1))

    async def go() -> None:
        await steps(agent, lambda: len(commands(agent).live) == 2)
        assert commands(agent).devices_short() == 2
        now[0] = 111.0  # b leaves
        await steps(agent, lambda: len(commands(agent).live) == 1 and not commands(agent).departing)
        assert commands(agent).devices_short() == 0

    run(agent, go)


def test_a_process_that_left_its_workers_group_keeps_the_workers_devices(
    tmp_path: Path,
) -> None:
    """The review: a worker that exited 0 leaving a ``setsid`` child behind (a
    launcher's) gave its GPU back while the child still ran on it, and the next tenant's
    worker was put on that GPU."""
    escaped = tmp_path / "escaped"
    command = (
        'if [ "$OASIS_JOB" = a ]; then setsid sh -c '
        f"'echo $$ $CUDA_VISIBLE_DEVICES > {escaped}; exec sleep 60' & "
        f"while [ ! -s {escaped} ]; do sleep 0.05; done; exit 0; fi; "
        f'echo "$CUDA_VISIBLE_DEVICES" > {tmp_path}/$OASIS_JOB; exec sleep 60'
    )
    a, b, c = (Task(j, 1, 0, 0.5, 40, devices=1) for j in "abc")
    agent, now = agent_on(command, _device_plan([a, b], [a, c], devices=2))

    async def go() -> None:
        await steps(agent, lambda: "a" in agent.tasks and 0 in agent.tasks["a"].workers.finished
                    and (tmp_path / "b").exists())  # fmt: skip
        pid, held = escaped.read_text().split()
        assert alive(int(pid))
        now[0] = 111.0  # b leaves, c comes in: not on the GPU a's process still uses
        c_seen = tmp_path / "c"
        await steps(agent, lambda: c_seen.exists() and c_seen.read_text().endswith("\n"))
        assert c_seen.read_text().strip() != held
        os.kill(int(pid), signal.SIGKILL)  # gone at last: its GPU is free again
        await steps(agent, lambda: commands(agent).devices.used == {"1": 1.0})

    try:
        run(agent, go)
    finally:
        if escaped.exists() and escaped.read_text().split():
            kill_worker(int(escaped.read_text().split()[0]))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
def test_another_users_process_holding_the_guards_name_does_not_keep_the_agent_from_starting(
    tmp_path: Path,
) -> None:
    """The review: abstract socket names have no permissions, so a tenant's worker run
    as its own user could take the name and the server's agent exited 2 (and stayed
    down under its unit). An agent now goes on without the guard, and says so."""
    from controller.plane import one_agent

    key = one_agent.agent_key("127.0.0.1", 1, "oasis", tmp_path.name)
    squat = ("import socket, sys, time\n"
             "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
             f"s.bind({one_agent._address(key)!r}); s.listen(1)\n"
             "print('up', flush=True); time.sleep(60)\n")  # fmt: skip
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is None:
        pytest.skip("no system python3 for a process of another user")
    squatter = subprocess.Popen([system, "-c", squat], stdout=subprocess.PIPE, text=True,
                                user=65534, cwd="/")  # fmt: skip
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "up"
        held, why = one_agent.hold_server(key, "127.0.0.1", 1, "oasis", tmp_path.name)
        assert held is None
        assert f"held by pid {squatter.pid} of user 65534" in why
        mine = subprocess.Popen([sys.executable, "-c", squat],
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
        squatter.kill()
        squatter.communicate(timeout=30)
        try:
            assert mine.stdout is not None and mine.stdout.readline().strip() == "up"
            with pytest.raises(one_agent.AgentRunningError, match=f"pid {mine.pid}"):
                one_agent.hold_server(key, "127.0.0.1", 1, "oasis", tmp_path.name)
        finally:
            mine.kill()
            mine.communicate(timeout=30)
    finally:
        squatter.kill()
        squatter.communicate(timeout=30)


def test_a_departed_jobs_escaped_process_is_stopped_before_the_next_job_starts(
    tmp_path: Path,
) -> None:
    """The re-audit: once the job of a worker that left a ``setsid`` child behind left
    the plan, the next tenant's worker started on the GPU the child still used, until
    the orphan scan found it a second later (and its grace after that)."""
    escaped = tmp_path / "escaped"
    command = (
        'if [ "$OASIS_JOB" = a ]; then setsid sh -c '
        f"'echo $$ > {escaped}; exec sleep 60' & "
        f"while [ ! -s {escaped} ]; do sleep 0.05; done; exit 0; fi; "
        f'echo "$CUDA_VISIBLE_DEVICES" > {tmp_path}/$OASIS_JOB; exec sleep 60'
    )
    a, c = Task("a", 1, 0, 0.5, 40, devices=1), Task("c", 1, 0, 0.5, 40, devices=1)
    agent, now = agent_on(command, _device_plan([a], [c], devices=1), stop_grace=1.0)
    seen_alive: list[bool] = []

    async def go() -> None:
        await steps(agent, lambda: "a" in agent.tasks and 0 in agent.tasks["a"].workers.finished)
        pid = int(escaped.read_text())
        now[0] = 111.0  # a leaves the plan, c comes in on the one GPU
        await steps(agent, (tmp_path / "c").exists)
        seen_alive.append(alive(pid))

    try:
        run(agent, go)
    finally:
        if escaped.exists() and escaped.read_text().strip():
            kill_worker(int(escaped.read_text()))
    assert seen_alive == [False]


def test_one_broker_under_any_of_its_names_is_one_place_for_an_agent() -> None:
    """The re-audit: ``[::ffff:127.0.0.1]`` (and ``::1`` beside ``localhost``) let a
    second agent of the same broker run every worker of the server again."""
    from controller.plane.one_agent import agent_key

    names = ["localhost", "127.0.0.1", "::1", "[::1]", "::ffff:127.0.0.1", "LOCALHOST"]
    assert len({agent_key(name, 1883, "oasis", "w0") for name in names}) == 1
    assert agent_key("10.1.2.3", 1883, "oasis", "w0") == agent_key("::ffff:10.1.2.3", 1883,
                                                                     "oasis", "w0")  # fmt: skip
    others = [("10.1.2.3", 1884, "oasis", "w0"), ("10.1.2.3", 1883, "lab", "w0"),
              ("10.1.2.3", 1883, "oasis", "w1"), ("10.1.2.4", 1883, "oasis", "w0")]  # fmt: skip
    assert len({agent_key(*other) for other in others}) == 4


def test_a_workers_stderr_is_logged_with_its_job_at_a_bounded_rate_not_written_raw(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The agent audit: a worker's standard error was the agent's own. A worker writing
    it as fast as it could filled the agent's log (a file on the server's disk, or the
    journal, whose rate limit then dropped the agent's own warnings) with lines that
    named no job and were not JSON."""
    from structlog.testing import capture_logs

    from controller.plane import worker_errors

    script = tmp_path / "noisy.py"
    script.write_text(
        "import sys\n"
        "print('Traceback: CUDA out of memory', file=sys.stderr, flush=True)\n"
        "sys.stderr.write('x' * 200000 + '\\n')\n"  # one line past the reader's limit
        "for i in range(5000):\n"
        "    sys.stderr.write(f'noise {i}\\n')\n"
        "print(7, flush=True)\n"
        "sys.exit(3)\n"
    )  # fmt: skip
    agent, _ = agent_on(f"{sys.executable} {script}", plan_of({"a": 1}, {}))

    async def go() -> None:
        await steps(agent, lambda: "a" in agent.tasks and 0 in agent.tasks["a"].workers.retry_at,
                    seconds=60)  # fmt: skip

    with capture_logs() as logs:
        started = time.monotonic()
        run(agent, go)
        took = time.monotonic() - started
    raw = capfd.readouterr()
    assert "noise" not in raw.err and "CUDA" not in raw.err  # nothing raw on the agent's
    lines = [e for e in logs if e["event"] == "worker stderr"]
    assert lines[0]["line"] == "Traceback: CUDA out of memory"
    assert lines[0]["job"] == "a" and lines[0]["worker"] == 0 and lines[0]["pid"] > 0
    assert lines[1]["line"].endswith(" [cut]")
    assert len(lines[1]["line"]) <= worker_errors.MAX_LINE_CHARS + 6
    assert not any(e["line"].startswith("x") for e in lines[2:])  # the long line's rest
    most = worker_errors.STDERR_BURST + worker_errors.STDERR_LINES_PER_SECOND * took
    assert len(lines) <= most, (len(lines), took)
    dropped = [e for e in logs if e["event"].startswith("worker stderr lines not logged")]
    assert sum(e["lines"] for e in dropped) + len(lines) == 5002
    assert agent.tasks["a"].workers.done_before == 7  # its counts still read


def test_a_plan_that_came_run_out_points_at_this_servers_clock() -> None:
    """An agent whose clock is ahead by more than a slot said only "plan ran out; idle
    until a new plan" (the agent audit): each plan came already run out by its clock.
    The line now says why it likely ran out: the clock, the daemon offline, or no newer
    plan reaching it."""
    from structlog.testing import capture_logs

    def ran_out(at_arrival: float, later: float, away: bool = False) -> str:
        agent = Agent("w0", MqttConfig("localhost"), wall=lambda: now[0])
        now = [at_arrival]
        if away:
            agent._away_since = 0.0
        agent.accept(plan_of({"a": 1}, {}))  # slots 5-6: 100-120 s
        now[0] = later
        with capture_logs() as logs:
            assert agent.active() is None
        (line,) = [e for e in logs if e["event"].startswith("plan ran out")]
        return str(line["why"])

    ahead = ran_out(at_arrival=190.0, later=191.0)  # came 70 s past its last slot
    assert "70 s past its last slot" in ahead and "clock may be ahead" in ahead
    assert "no newer plan has come" in ran_out(at_arrival=101.0, later=125.0)
    assert "daemon is offline" in ran_out(at_arrival=190.0, later=191.0, away=True)


def test_a_stopped_workers_escaped_process_keeps_its_devices_while_its_job_runs(
    tmp_path: Path,
) -> None:
    """The isolation audit: a worker the plan stopped (its job went from 2 workers to 1)
    whose ``setsid`` child ran on gave its GPU back at once, while the child, its job
    still planned here, still ran on it; the next tenant's worker was put on that GPU.
    A worker that exited by itself kept them (``_release``); one stopped did not."""
    escaped = tmp_path / "escaped"
    command = (
        'if [ "$OASIS_JOB" = a ] && [ "$OASIS_WORKER" = 1 ]; then setsid sh -c '
        f"'echo $$ $CUDA_VISIBLE_DEVICES > {escaped}; exec sleep 60' > /dev/null 2>&1 & "
        "fi; "
        f'echo "$CUDA_VISIBLE_DEVICES" > {tmp_path}/$OASIS_JOB-$OASIS_WORKER; exec sleep 60'
    )
    a2, a1, b = (Task("a", 2, 0, 0.5, 40, devices=1), Task("a", 1, 0, 0.5, 40, devices=1),
                 Task("b", 1, 0, 0.5, 40, devices=1))  # fmt: skip
    agent, now = agent_on(command, _device_plan([a2], [a1, b], devices=3), stop_grace=1.0)

    def line(name: str) -> str | None:
        path = tmp_path / name
        text = path.read_text() if path.exists() else ""
        return text.strip() if text.endswith("\n") else None

    async def go() -> None:
        def written() -> list[str]:
            return escaped.read_text().split() if escaped.exists() else []

        await steps(agent, lambda: line("a-1") is not None and len(written()) == 2)
        pid, held = written()
        assert held == "1"
        now[0] = 111.0  # a goes down to one worker, b comes in: on the GPU no one uses
        await steps(agent, lambda: line("b-0") is not None)
        assert alive(int(pid))
        assert line("b-0") == "2", "b was put on the GPU a's escaped process runs on"
        os.kill(int(pid), signal.SIGKILL)  # gone at last: its GPU is free again
        await steps(agent, lambda: commands(agent).devices.used == {"0": 1.0, "2": 1.0})

    try:
        run(agent, go)
    finally:
        if escaped.exists() and escaped.read_text().split():
            kill_worker(int(escaped.read_text().split()[0]))


def test_a_pid_an_escaped_process_had_is_not_signalled_once_another_process_has_it(
    tmp_path: Path,
) -> None:
    """The isolation audit: the processes that left a worker's group are remembered by
    pid until their job leaves the plan, hours later maybe, and were then signalled by
    that pid whatever held it by then: one that had exited and whose pid the kernel gave
    to another tenant's process (pid_max 32768) got SIGTERM, then SIGKILL. A pid is
    signalled only while its process still carries the worker's mark (this agent's
    session and the job). The reuse is stood for by putting another process's pid in
    the agent's record, as the kernel's reuse would."""
    escaped = tmp_path / "escaped"
    command = (
        'if [ "$OASIS_JOB" = a ]; then setsid sh -c '
        f"'echo $$ > {escaped}; exec sleep 60' > /dev/null 2>&1 & "
        f"while [ ! -s {escaped} ]; do sleep 0.05; done; exit 0; fi; exec sleep 60"
    )
    a, c = Task("a", 1, 0, 0.5, 40, devices=1), Task("c", 1, 0, 0.5, 40, devices=1)
    agent, now = agent_on(command, _device_plan([a], [c], devices=2), stop_grace=0.5)
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)  # another tenant's

    async def go() -> None:
        await steps(agent, lambda: "a" in agent.tasks and 0 in agent.tasks["a"].workers.finished)
        (held,) = commands(agent)._held_on
        assert held.escaped and held.pids == [int(escaped.read_text())]
        held.pids = [other.pid]  # the escaped process exited; its pid is another's now
        os.kill(int(escaped.read_text()), signal.SIGKILL)
        now[0] = 111.0  # a leaves the plan: its escaped processes are stopped
        await steps(agent, lambda: bool(commands(agent).live))
        await asyncio.sleep(1.0)
        await agent._commands(0.02)
        # not its process any more: its GPU is free again (c runs on the other)
        await steps(agent, lambda: commands(agent).devices.used == {"1": 1.0})

    try:
        run(agent, go)
        assert other.poll() is None, "another tenant's process was signalled"
    finally:
        other.kill()
        other.wait()
        if escaped.exists() and escaped.read_text().strip():
            kill_worker(int(escaped.read_text()))


def test_a_process_environment_is_read_once_and_only_its_start() -> None:
    """The isolation audit: the agent read up to 1 MiB of every process's environment at
    each worker's exit (every process of the machine) and each second (its children), in
    its event loop: one tenant's worker that forked 1,000 children with a 1 MiB
    environment stalled it 0.9-2.7 s at each scan, heartbeats and every tenant's workers
    with it. Now it reads the first 64 KiB of a process's environment, once."""
    from controller.plane import worker_marks

    big = {f"BIG{i}": "x" * 120_000 for i in range(8)}  # ~1 MiB, after the marks
    env = {"OASIS_AGENT": "s1", "OASIS_JOB": "a", "OASIS_WORKER": "0", **big}
    proc = subprocess.Popen(["sleep", "60"], env=env)
    try:
        while "OASIS_JOB" not in worker_marks.environment_of(proc.pid):  # exec'ed
            time.sleep(0.01)
        reads: list[int] = []
        real = worker_marks.environment_of

        def counted(pid: int, limit: int = worker_marks.ENVIRON_BYTES) -> dict[str, str]:
            reads.append(pid)
            return real(pid, limit)

        marks = worker_marks.Marks(counted)
        for _ in range(3):
            assert marks.of(proc.pid) == {"OASIS_AGENT": "s1", "OASIS_JOB": "a",
                                          "OASIS_WORKER": "0"}  # fmt: skip
        assert reads == [proc.pid]
        seen = real(proc.pid)
        assert "BIG0" not in seen or len(seen.get("BIG0", "")) == 120_000  # none cut
        assert sum(len(k) + len(v) + 2 for k, v in seen.items()) <= worker_marks.ENVIRON_BYTES
    finally:
        proc.kill()
        proc.wait()


def test_marks_are_read_again_for_a_pid_another_process_has_and_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What :class:`~controller.plane.worker_marks.Marks` remembers is a process's, not a
    pid's: a pid the kernel gave to another tenant's process (another start time) is
    read again, or that process would carry the exited worker's marks and be stopped
    as its job's; one whose start cannot be read is read each time; what a scan no
    longer sees is forgotten; and past ``MAX_KNOWN`` processes it starts afresh."""
    from controller.plane import worker_marks

    start: list[bytes | None] = [b"100"]

    def stat(pid: int) -> list[bytes]:
        if start[0] is None:
            raise FileNotFoundError(pid)
        return [b"S"] * 19 + [start[0]]

    monkeypatch.setattr(worker_marks, "stat_fields", stat)
    env = {7: {"OASIS_AGENT": "s1", "OASIS_JOB": "a", "PATH": "/bin"}, 8: {}, 9: {}}
    reads: list[int] = []

    def read(pid: int) -> dict[str, str]:
        reads.append(pid)
        return dict(env[pid])

    marks = worker_marks.Marks(read)
    mine = {"OASIS_AGENT": "s1", "OASIS_JOB": "a"}
    assert marks.of(7) == mine
    env[7] = {"OASIS_JOB": "b"}  # read once: not read again while it is that process
    assert marks.of(7) == mine and reads == [7]
    start[0] = b"200"  # pid 7 exited; the kernel gave it to another process
    assert marks.of(7) == {"OASIS_JOB": "b"} and reads == [7, 7]
    start[0] = None  # its start cannot be read: read each time, never remembered
    env[7] = {}
    assert marks.of(7) == {} and marks.of(7) == {} and reads == [7, 7, 7, 7]
    start[0] = b"300"
    marks.of(7), marks.of(8)
    marks.keep({8})  # 7 is gone from /proc: forgotten, 8 kept
    del reads[:]
    marks.of(7), marks.of(8)
    assert reads == [7]
    monkeypatch.setattr(worker_marks, "MAX_KNOWN", 2)
    marks.of(9)  # a third: it starts afresh
    del reads[:]
    marks.of(7), marks.of(9)
    assert reads == [7]


def test_a_workers_stderr_rate_refills_with_time_and_says_what_it_dropped_as_it_goes() -> None:
    """:func:`~controller.plane.worker_errors.log_errors` on its own clock: a burst of
    ``STDERR_BURST`` lines, then ``STDERR_LINES_PER_SECOND`` a second as time passes
    (not the burst once and nothing after: a worker's later traceback was lost), and
    the lines over the rate said every ``DROPPED_EVERY`` seconds while the worker runs,
    not only at its end (a worker that runs for days)."""
    from controller.plane import worker_errors

    now = [0.0]
    said: list[tuple[str, dict[str, Any]]] = []

    class Log:
        def info(self, event: str, **kw: Any) -> None:
            said.append((event, kw))

        def warning(self, event: str, **kw: Any) -> None:
            said.append((event, kw))

    read = [0]

    async def spend(size: int) -> None:
        read[0] += 1

    def logged() -> int:
        return sum(1 for event, _ in said if event == "worker stderr")

    def dropped() -> list[int]:
        return [kw["lines"] for event, kw in said if event.startswith("worker stderr lines")]

    async def go() -> None:
        stream = asyncio.StreamReader()
        task = asyncio.create_task(
            worker_errors.log_errors(stream, Log(), spend, lambda: now[0], job="a")
        )

        async def lines(n: int) -> None:
            until = read[0] + n
            stream.feed_data(b"line\n" * n)
            for _ in range(100 * n):  # each line read is paced (``spend``): all of them
                if read[0] >= until:
                    break
                await asyncio.sleep(0)
            assert read[0] == until

        await lines(150)  # the burst, the rest over the rate
        assert (logged(), dropped()) == (100, [])
        now[0] = 5.0  # 50 lines' worth of the rate
        await lines(60)
        assert (logged(), dropped()) == (150, [])
        now[0] = 15.0  # DROPPED_EVERY since the start: the 60 dropped are said now
        await lines(1)
        assert (logged(), dropped()) == (151, [60])
        stream.feed_eof()
        await task
        assert dropped() == [60]  # nothing more to say at the end

    asyncio.run(go())


def test_the_back_off_doubles_to_a_minute_starts_afresh_after_a_long_run_and_says_little() -> None:
    """The restart back-off on its own clock: 1 s doubling, held at ``RESTART_MAX`` (a
    worker that always fails is tried once a minute, not once in hours), from 1 s again
    once a run lasted ``RESTART_MAX``; each failure counted for its tenant, said in at
    most ``MAX_FAILURE_CHARS`` (a longer one made the agent's report entry one the
    daemon refuses, and the tenant heard nothing)."""
    from controller.plane.agent_messages import MAX_FAILURE_CHARS
    from controller.plane.workers import RESTART_MAX, JobWorkers

    class Log:
        def warning(self, event: str, **kw: Any) -> None:
            pass

    pool = Commands("true", "w0", "s1", None, Log())
    job = JobWorkers()
    delays = []
    for _ in range(9):
        pool._failed("a", job, 0, "exit 1", 0.5, 1000.0, said="exit status 1")
        delays.append(job.retry_at[0] - 1000.0)
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    pool._failed("a", job, 0, "exit 1", RESTART_MAX, 2000.0)  # a run of a minute
    assert (job.failures, job.retry_at[0], job.last_failure) == ({0: 1}, 2001.0, "exit 1")
    why = "could not start: OSError: " + "x" * 500
    pool._failed("a", job, 1, why, 0.0, 3000.0, started=False, said=why)
    assert job.last_failure == why[:MAX_FAILURE_CHARS] and job.failed == 11
    assert job.failures == {0: 1, 1: 1} and job.retry_at[1] == 3001.0


def test_a_worker_killed_by_a_signal_not_the_agents_is_a_failure_said_by_its_signal(
    tmp_path: Path,
) -> None:
    """A worker ended by a SIGTERM the agent did not send (the OOM killer's SIGKILL, a
    tenant's own ``kill``) has not done its part: it is started again after its
    back-off, and its tenant hears ``killed by SIGTERM``, not an exit status."""
    log = tmp_path / "starts"
    agent, _ = agent_on(f"echo $$ >> {log}; kill -TERM $$; sleep 30", plan_of({"a": 1}, {}))

    async def go() -> None:
        await steps(agent, lambda: "a" in agent.tasks and agent.tasks["a"].workers.failed == 1)
        job = agent.tasks["a"].workers
        assert not job.finished and job.failures == {0: 1}
        assert job.last_failure == "killed by SIGTERM"

    run(agent, go)


def test_a_worker_sees_its_own_devices_not_the_agents_and_gives_them_back_however_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's ``CUDA_VISIBLE_DEVICES`` is its own share of the agent's devices, not
    the agent's own list (every worker would see every GPU: two tenants on GPU 0), and
    its devices come back when it fails (its restart, or the next tenant, gets them)
    and when it could not be started at all (they leaked, and the server's GPUs ran out
    one failed start at a time)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")
    seen = tmp_path / "seen"
    command = f'echo "$CUDA_VISIBLE_DEVICES" >> {seen}; exit 1'
    task = Task("a", 1, 0, 0.5, 40, devices=1)
    agent, _ = agent_on(command, _device_plan([task], [], devices=2), devices=["5", "6"])

    async def go() -> None:
        await steps(agent, lambda: "a" in agent.tasks and agent.tasks["a"].workers.failed == 1)
        assert seen.read_text().split() == ["5"]
        assert commands(agent).devices.used == {}  # failed: given back

        async def no_fork(*args: object, **kwargs: object) -> None:
            raise BlockingIOError(11, "Resource temporarily unavailable")

        monkeypatch.setattr(asyncio, "create_subprocess_shell", no_fork)
        agent.tasks["a"].workers.retry_at.clear()
        await agent._commands(0.02)
        assert agent.tasks["a"].workers.failed == 2
        assert commands(agent).devices.used == {}  # not started: given back

    run(agent, go)


def test_a_second_signal_during_the_agents_stop_kills_its_workers_at_once(
    tmp_path: Path,
) -> None:
    """The agent's exit waits up to the grace for its workers after their SIGTERM; a
    second signal (its cancellation) then kills what is left at once, rather than
    leaving a worker that ignores SIGTERM running after the agent (a unit stopped by
    its manager, which does not wait)."""
    script = tmp_path / "stubborn.py"
    script.write_text(_STUBBORN)
    agent, _ = agent_on(f"{sys.executable} {script} {tmp_path}", plan_of({"a": 1}, {}),
                        stop_grace=60.0)  # fmt: skip
    terms = tmp_path / "a-0.terms"

    async def go() -> None:
        await steps(agent, lambda: (tmp_path / "a-0.pid").exists() and
                    agent.tasks["a"].minibatches == 1)  # fmt: skip
        pid = int((tmp_path / "a-0.pid").read_text())
        stop = asyncio.create_task(commands(agent).stop_all())
        while not (terms.exists() and terms.read_text() == "1"):  # it ignores it
            await asyncio.sleep(0.02)
        assert alive(pid) and not stop.done()
        stop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stop
        for _ in range(250):  # SIGKILL'ed: gone at once, not after the minute's grace
            if not alive(pid):
                break
            await asyncio.sleep(0.02)
        assert not alive(pid)

    try:
        run(agent, go)
    finally:
        kill(tmp_path / "a-0.pid")


def test_a_failed_workers_devices_are_not_held_for_another_workers_processes(
    tmp_path: Path,
) -> None:
    """An exited worker keeps its devices only while a process of its own (its index)
    that left its group runs on: a child of another worker of its job (a ``sleep`` its
    shell runs, in that worker's group) is not one, or every failed worker of a job with
    a data loader would hold its GPU until the job ended, and its restart share one."""
    ready = tmp_path / "ready"
    command = (
        f'if [ "$OASIS_WORKER" = 0 ]; then while [ ! -s {ready} ]; do sleep 0.02; done; '
        f"exit 1; fi; sleep 30 & echo $! > {ready}; wait"
    )
    task = Task("a", 2, 0, 0.5, 40, devices=1)
    agent, _ = agent_on(command, _device_plan([task], [], devices=2))

    async def go() -> None:
        await steps(agent, lambda: "a" in agent.tasks and agent.tasks["a"].workers.failed == 1)
        assert alive(int(ready.read_text()))  # worker 1's child runs, marked as job a's
        assert not commands(agent)._held_on
        (one,) = agent.tasks["a"].workers.running
        assert commands(agent).devices.used == {d: 1.0 for d in one.devices}

    run(agent, go)


def test_an_exited_workers_devices_stay_held_until_every_process_that_escaped_it_is_gone(
    tmp_path: Path,
) -> None:
    """A worker that left two processes outside its group (a launcher's daemons) keeps
    its GPU while any of them runs on it, not only until the first is gone: the next
    worker was put on the GPU the second still used."""
    escaped, marker = tmp_path / "escaped", tmp_path / "once"
    command = (
        f"if [ ! -e {marker} ]; then touch {marker}; "
        f"setsid sh -c 'echo $$ >> {escaped}; exec sleep 60' > /dev/null 2>&1 & "
        f"setsid sh -c 'echo $$ >> {escaped}; exec sleep 60' > /dev/null 2>&1 & "
        f'while [ "$(cat {escaped} 2>/dev/null | wc -l)" -lt 2 ]; do sleep 0.02; done; '
        "exit 1; fi; exec sleep 60"
    )
    task = Task("a", 1, 0, 0.5, 40, devices=1)
    agent, _ = agent_on(command, _device_plan([task], [], devices=2))
    pids: list[int] = []

    async def gone(pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        for _ in range(500):  # reaped by whichever process it was reparented to
            if not os.path.exists(f"/proc/{pid}"):
                break
            await asyncio.sleep(0.02)
        for _ in range(3):
            await agent._commands(0.02)

    async def go() -> None:
        await steps(agent, lambda: "a" in agent.tasks and agent.tasks["a"].workers.failed == 1)
        pids.extend(int(p) for p in escaped.read_text().split())
        (held,) = commands(agent)._held_on
        assert sorted(held.pids) == sorted(pids) and held.devices == {"0": 1.0}
        await gone(pids[0])
        assert commands(agent)._held_on == [held]  # the second still runs on it
        assert commands(agent).devices.used.get("0") == 1.0
        await gone(pids[1])
        await steps(agent, lambda: "0" not in commands(agent).devices.used)

    try:
        run(agent, go)
    finally:
        for pid in pids:
            kill_worker(pid)


def test_an_escaped_process_given_up_on_is_not_stopped_again_with_its_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process that escaped a departed job's worker and could not be stopped (another
    user's, as it were) is given up on after its SIGKILL's ``GIVE_UP_SECONDS``; it is not
    taken back as one to stop at the next step, which held every other job off the
    server again, a grace and a give-up at a time, for good."""
    import structlog

    from controller.plane import workers

    pool = Commands("true", "w0", "s1", None, structlog.get_logger())
    stuck = 999_999
    monkeypatch.setattr(workers, "_still_there", lambda pid: True)
    monkeypatch.setattr(workers, "_signal_group", lambda pid, sig: None)
    monkeypatch.setattr(pool, "_marked", lambda pid, job: True)
    pool._held_on.append(workers.HeldDevices("a", [stuck], {"0": 1.0}, escaped=True))
    pool._stop_escaped({"a"}, 0.0)  # its job runs here: left be
    assert not pool._orphans
    pool._stop_escaped(set(), 0.0)  # its job is gone: stopped
    assert stuck in pool._orphans
    pool._escalate(pool.stop_grace)  # SIGKILL, to no effect
    pool._escalate(pool.stop_grace + workers.GIVE_UP_SECONDS)  # given up on
    assert stuck not in pool._orphans
    pool._stop_escaped(set(), 100.0)
    assert stuck not in pool._orphans  # taken back before


def test_a_worker_gone_from_its_group_has_its_output_drained_and_a_departing_one_counts() -> None:
    """Two of the counts' rules on the agent's clock. A worker whose processes are all
    gone but whose output a process outside its group holds open is counted gone only
    ``DRAIN_SECONDS`` later: meanwhile its reader takes what is left in the pipe, its
    last count included (reaped at once, the count its tenant is paid by lost the
    lines still in the pipe). And a departing worker's count is its job's until it is
    reaped (dropped meanwhile, the job's count went down for the grace, then up)."""
    import structlog

    from controller.plane.workers import DRAIN_SECONDS, JobWorkers, Worker

    clock = [0.0]
    pool = Commands("true", "w0", "s1", None, structlog.get_logger(), monotonic=lambda: clock[0])

    async def go() -> None:
        reader = asyncio.get_running_loop().create_future()  # its output never ends

        class Exited:  # a leader that exited, its group empty (a pid over pid_max)
            returncode, pid = 1, 2**22 + 12345

        job = JobWorkers(done_before=2.0)
        worker = Worker(cast(Any, Exited()), 0, [5.0], cast(Any, reader), 0.0, job)
        job.running.append(worker)
        assert pool.count(job) == 7.0
        assert not pool._gone(worker)  # found empty now: its pipe is drained first
        clock[0] = DRAIN_SECONDS * 0.9
        assert not pool._gone(worker)
        clock[0] = DRAIN_SECONDS
        assert pool._gone(worker)
        pool.stop(worker, clock[0])  # departing: still its job's count
        assert pool.departing == [worker] and not job.running
        assert pool.count(job) == 7.0
        reader.cancel()

    asyncio.run(go())


def test_only_processes_with_this_agents_marks_are_stopped_as_orphans_or_leftovers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the orphan scan and the leftovers' stop may signal, by the marks alone: a
    child carrying another agent's session (an agent embedded beside this one, its
    workers' processes) is not this agent's to stop, and an agent without a key of its
    place (embedded: a test's, a tool's) stops no other agent's processes as its
    leftovers, those of other keyless agents included."""
    import structlog

    from controller.plane import workers

    marks = {101: {"OASIS_AGENT": "other", "OASIS_JOB": "x"},
             102: {"OASIS_AGENT": "earlier", "OASIS_AGENT_KEY": "", "OASIS_JOB": "y"},
             103: {"OASIS_AGENT": "s1", "OASIS_JOB": "z"}}  # fmt: skip
    signalled: list[int] = []
    monkeypatch.setattr(workers, "_children", lambda: [101, 103])
    monkeypatch.setattr(workers, "_other_pids", lambda: [101, 102, 103])
    monkeypatch.setattr(workers, "_ended", lambda pid: False)
    monkeypatch.setattr(workers, "_environment_of", lambda pid: marks[pid])
    monkeypatch.setattr(os, "getpgid", lambda pid: pid)
    monkeypatch.setattr(workers, "_signal_group", lambda pid, sig: signalled.append(pid))
    pool = Commands("true", "w0", "s1", None, structlog.get_logger())  # no key
    pool._stop_leftovers(0.0)
    assert signalled == []
    pool._scan_orphans(set(), 0.0)
    assert signalled == [103]  # its own, whose job does not run here
