"""A job's demand on the node: carried in each plan task (``demand``), told to each worker
command (``OASIS_DEMAND``, ``OASIS_DEMAND_<NAME>``), and, with ``oasis agent
--memory-resource``, a worker over its memory demand stopped (controller/plane/demand.py,
memory_guard.py). Before, only a worker's GPUs reached the node: a tenant's worker using
60 GB where its job declared 8 got the OOM killer to kill other tenants' workers."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.commands.agent import _memory_guard
from controller.commands.common import InputError
from controller.plane.demand import MAX_DEMAND_ENTRIES, demand_environment
from controller.plane.memory_guard import MemoryGuard, parse_memory_resource
from controller.plane.topics import Plan, SlotPlan, Task
from tests.servers import ROOT
from tests.test_agent_workers import agent_on, alive, run, steps


def _plan(*tasks: Task) -> Plan:
    return Plan("w0", "worker", 1, 10.0, 0.5, False, SlotPlan(5, 100.0, list(tasks)),
                SlotPlan(6, 110.0, []))  # fmt: skip


def test_a_tasks_demand_round_trips_and_a_plan_without_it_still_reads() -> None:
    with_demand = _plan(Task("a", 2, 0, 0.5, 40, demand={"cpu": 4, "mem": 8, "disk": 0.5}))
    payload = with_demand.to_bytes()
    assert b'"demand":{"cpu":4,"mem":8,"disk":0.5}' in payload  # short: one dict a task
    assert Plan.parse(payload) == with_demand
    # an older daemon's plan (no demand): read as before, and no demand written back
    bare = _plan(Task("a", 2, 0, 0.5, 40))
    assert b"demand" not in bare.to_bytes()
    parsed = Plan.parse(bare.to_bytes())
    assert parsed == bare and parsed.current.tasks[0].demand == {}
    # a zero amount is a demand of none, kept (a memory guard holds the worker to it)
    zero = bare.to_bytes().replace(b'"run":""', b'"run":"","demand":{"gpu":0,"mem":2}', 1)
    assert Plan.parse(zero).current.tasks[0].demand == {"gpu": 0, "mem": 2}


@pytest.mark.parametrize(
    ("demand", "why"),
    [
        (b"[1]", "demand: must be an object"),
        (b'{"mem":-1}', "demand.mem: must be >= 0"),
        (b'{"mem":"8"}', "demand.mem: must be a number"),
        (b'{"mem":1e999}', "demand.mem: must be finite"),
        (b'{"mem":NaN}', "demand.mem: must be finite"),
        (b'{"":1}', "demand: resource names must be 1-64 of"),
        (b'{"m em":1}', "demand: resource names must be 1-64 of"),
        (b'{"m\\u0000":1}', "demand: resource names must be 1-64 of"),
        (b'{"' + b"m" * 65 + b'":1}', "demand: resource names must be 1-64 of"),
        (
            b"{" + b",".join(b'"r%d":1' % i for i in range(MAX_DEMAND_ENTRIES + 1)) + b"}",
            f"demand: must name at most {MAX_DEMAND_ENTRIES} resources",
        ),
    ],
)
def test_a_bad_demand_leaves_its_entry_out_naming_the_field(demand: bytes, why: str) -> None:
    payload = _plan(Task("a", 1, 0, 0.5, 40), Task("b", 1, 0, 0.5, 40)).to_bytes()
    bad = payload.replace(b'"run":""', b'"run":"","demand":' + demand, 1)
    # the entry is left out alone (its job does not run here), its error kept
    plan = Plan.parse(bad)
    assert [t.job for t in plan.current.tasks] == ["b"] and plan.current.refused == 1
    assert plan.current.refused_error.startswith("plan.current.tasks[0]." + why)


def test_the_demand_variables_are_compact_json_and_one_per_resource() -> None:
    env = demand_environment({"cpu": 4.0, "mem": 8, "gpu-mem.x": 0.25})
    assert env["OASIS_DEMAND"] == '{"cpu":4,"mem":8,"gpu-mem.x":0.25}'
    assert json.loads(env["OASIS_DEMAND"]) == {"cpu": 4, "mem": 8, "gpu-mem.x": 0.25}
    assert env["OASIS_DEMAND_CPU"] == "4" and env["OASIS_DEMAND_MEM"] == "8"
    assert env["OASIS_DEMAND_GPU_MEM_X"] == "0.25"
    assert demand_environment({}) == {}  # none said: no variable


def test_each_worker_is_told_its_tasks_demand_and_one_without_it_nothing(
    tmp_path: Path,
) -> None:
    """The launcher (``--command``) can enforce the demand only if it is told it."""
    out = f"{tmp_path}/$OASIS_JOB"
    command = f"env > {out}.tmp; mv {out}.tmp {out}; exec sleep 30"
    plan = _plan(Task("a", 1, 0, 0.5, 40, demand={"cpu": 4, "mem": 8.5}), Task("b", 1, 0, 0.5, 40))
    agent, _ = agent_on(command, plan)

    def seen(job: str) -> dict[str, str]:
        lines = (tmp_path / job).read_text().splitlines()
        return dict(line.split("=", 1) for line in lines if "=" in line)

    async def go() -> None:
        await steps(agent, lambda: (tmp_path / "a").exists() and (tmp_path / "b").exists())
        assert "OASIS_DEMAND" in seen("a")

    run(agent, go)
    a, b = seen("a"), seen("b")
    assert a["OASIS_DEMAND"] == '{"cpu":4,"mem":8.5}'
    assert a["OASIS_DEMAND_CPU"] == "4" and a["OASIS_DEMAND_MEM"] == "8.5"
    assert not any(k.startswith("OASIS_DEMAND") for k in b)  # an older daemon's task


# a worker that notes each start, reports a minibatch, then holds OASIS_JOB's MiB
# resident and sleeps (reported first: a guard that stops it while it fills its memory
# finds its count already told, as on a loaded CI machine)
_HOLDER = """
import os, sys, time
job = os.environ["OASIS_JOB"]
with open(os.path.join(sys.argv[1], job + ".starts"), "a") as f:
    f.write(str(os.getpid()) + "\\n")
print(1, flush=True)
held = bytearray(b"x") * ({"hog": 300, "free": 150}.get(job, 1) << 20)
time.sleep(60)
"""


def test_a_worker_over_its_memory_demand_is_stopped_and_backed_off_and_others_run_on(
    tmp_path: Path,
) -> None:
    """Before: nothing on the node knew the demand; the hog ran on until the OOM killer
    took some tenant's worker. With ``--memory-resource mem=MiB``: its 300 MiB are over
    50 MiB x 1.10 + 64 MiB, it is stopped within about a second's sample, logged, and
    started again after the back-off (1 s, then 2 s); a worker within its demand, and
    one whose task gives no memory demand, run on."""
    from structlog.testing import capture_logs

    script = tmp_path / "holder.py"
    script.write_text(_HOLDER)
    plan = _plan(
        Task("hog", 1, 0, 0.5, 40, demand={"cpu": 1, "mem": 50}),
        Task("ok", 1, 0, 0.5, 40, demand={"cpu": 1, "mem": 50}),
        Task("free", 1, 0, 0.5, 40, demand={"cpu": 1}),
    )
    agent, _ = agent_on(f"exec {sys.executable} {script} {tmp_path}", plan,
                        memory_guard=MemoryGuard("mem", "MiB"), stop_grace=1.0)  # fmt: skip
    stopped: list[float] = []

    def starts(job: str) -> list[int]:
        path = tmp_path / f"{job}.starts"
        return [int(p) for p in path.read_text().split()] if path.exists() else []

    async def go() -> None:
        await steps(agent, lambda: all(starts(j) for j in ("hog", "ok", "free")))
        begun = time.monotonic()
        hog = agent.tasks["hog"].workers
        await steps(agent, lambda: hog.failures.get(0) == 1)
        stopped.append(time.monotonic() - begun)
        await steps(agent, lambda: not alive(starts("hog")[0]))
        # its count kept: the line it printed before filling its memory is read, and the
        # stop takes nothing off it
        await steps(agent, lambda: agent.tasks["hog"].minibatches >= 1)
        assert agent.tasks["hog"].minibatches == 1
        await steps(agent, lambda: hog.failures.get(0) == 2)  # started again, stopped again
        stopped.append(time.monotonic() - begun)
        # 2 s of back-off now (more than the first's 1 s, whatever the machine's load)
        assert hog.retry_at[0] - time.monotonic() > 1.0
        ok, free = (agent.tasks[j].workers for j in ("ok", "free"))
        assert [w.proc.pid for w in ok.running] == starts("ok")  # never stopped
        assert [w.proc.pid for w in free.running] == starts("free")
        assert not ok.failures and not free.failures
        # the guard's stops are the job's failures its tenant hears of, counted once each
        assert hog.failed == 2 and hog.last_failure == "over its memory demand"
        assert ok.failed == free.failed == 0

    with capture_logs() as logs:
        run(agent, go)
    assert stopped[1] - stopped[0] >= 1.0, stopped  # not before its 1 s back-off
    assert len(starts("hog")) == 2
    over = [e for e in logs if e["event"] == "worker over its memory demand: stopped"]
    assert len(over) == 2 and over[0]["log_level"] == "error", over
    assert over[0]["job"] == "hog" and over[0]["worker"] == 0
    assert over[0]["pid"] == starts("hog")[0] and over[0]["demand"] == 50
    assert over[0]["rss_bytes"] > over[0]["limit_bytes"] == int(50 * (1 << 20) * 1.1) + (64 << 20)


def test_a_job_that_declares_no_memory_is_held_to_start_up_by_the_guard(
    tmp_path: Path,
) -> None:
    """Before: a job whose spec left ``mem`` out (so 0, which the daemon accepts and
    packs other tenants' jobs around) got a task without ``mem`` in its demand, which
    the guard read as no limit: its worker held 300 MB on a guarded agent while a job
    that declared 0.1 GB was stopped at 174 MB. Now the daemon's task says ``"mem": 0``,
    and the worker is stopped past the 64 MiB of start-up; the job that declared its
    memory runs on."""
    from controller.plane.plans import task_demand
    from tests.test_plan_tasks import BASE, CLUSTER, RESOURCES, _parse

    careless = {**BASE, "worker": {"gpu": 1, "cpu": 4, "disk": 5, "bandwidth": 1}}
    demands = {
        "hog": task_demand(_parse(careless), "worker", RESOURCES),
        "ok": task_demand(_parse(BASE), "worker", RESOURCES),
    }
    assert demands["hog"]["mem"] == 0 and set(demands["hog"]) == set(CLUSTER.resources)
    sent = _plan(*(Task(job, 1, 0, 0.5, 40, demand=d) for job, d in demands.items()))
    plan = Plan.parse(sent.to_bytes())  # as the agent reads it off the broker
    assert plan.current.tasks[0].demand["mem"] == 0
    script = tmp_path / "holder.py"
    script.write_text(_HOLDER)  # the hog holds 300 MiB, "ok" 1 MiB of its 8 GB
    agent, _ = agent_on(f"exec {sys.executable} {script} {tmp_path}", plan,
                        memory_guard=MemoryGuard("mem", "GB"), stop_grace=1.0)  # fmt: skip

    def starts(job: str) -> list[int]:
        path = tmp_path / f"{job}.starts"
        return [int(p) for p in path.read_text().split()] if path.exists() else []

    async def go() -> None:
        await steps(agent, lambda: bool(starts("hog") and starts("ok")))
        hog, ok = (agent.tasks[j].workers for j in ("hog", "ok"))
        await steps(agent, lambda: hog.failures.get(0) == 1)
        assert hog.last_failure == "over its memory demand"
        assert [w.proc.pid for w in ok.running] == starts("ok") and not ok.failures

    run(agent, go)


def test_without_the_guard_or_a_memory_demand_nothing_is_limited() -> None:
    guard = MemoryGuard("mem", "GB")
    assert guard.limit({"cpu": 4}) is None
    assert guard.limit({"mem": 8}) == int(8e9 * 1.1) + (64 << 20)
    assert guard.limit({"cpu": 4, "mem": 0}) == 64 << 20  # declared none: start-up only
    assert parse_memory_resource("mem=gib") == MemoryGuard("mem", "GiB")


@pytest.mark.parametrize(
    ("flag", "command", "message"),
    [
        ("mem=XB", "sleep 1", "--memory-resource: unknown unit 'XB': one of B, KB, MB, GB"),
        ("m em=GB", "sleep 1", "--memory-resource: 'm em' is no resource a plan carries"),
        ("mem", "sleep 1", "--memory-resource: must be NAME=UNIT"),
        ("mem=", "sleep 1", "--memory-resource: must be NAME=UNIT"),
        (" =GB", "sleep 1", "--memory-resource: must be NAME=UNIT"),
        ("mem=GB", None, "--memory-resource: needs --command"),
    ],
)
def test_a_bad_memory_resource_flag_is_refused(
    flag: str, command: str | None, message: str
) -> None:
    with pytest.raises(InputError, match="^" + re.escape(message)):
        _memory_guard(flag, command)


def test_the_agent_refuses_an_unknown_memory_unit_with_exit_2() -> None:
    out = subprocess.run([sys.executable, "-m", "controller.cli", "agent", "--node", "w0",
                          "--command", "sleep 1", "--memory-resource", "mem=GiGa"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "--memory-resource: unknown unit 'GiGa'" in out.stderr


def test_a_workers_resident_memory_is_the_sum_over_its_process_group() -> None:
    """A worker that forks (a data loader's processes) is measured whole: every process
    of its group counts (``group_rss``), not one of them, or a worker whose children
    hold the memory would never be over its demand."""
    import os
    import signal

    from controller import procfs
    from controller.plane.memory_guard import group_rss

    page = os.sysconf("SC_PAGE_SIZE")
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True)
    try:

        def members() -> list[int]:
            out = []
            for pid in procfs.pids():
                try:
                    if int(procfs.stat_fields(pid)[2]) == leader.pid:
                        out.append(pid)
                except (OSError, IndexError, ValueError):
                    pass
            return out

        def each() -> dict[int, int]:
            return {pid: int(procfs.stat_fields(pid)[21]) * page for pid in members()}

        deadline = time.monotonic() + 30
        while True:  # the shell and its two sleeps, each exec'ed, the same around the read
            before = each()
            got = group_rss({leader.pid})
            if len(before) == 3 and all(before.values()) and each() == before:
                break
            assert time.monotonic() < deadline, before
            time.sleep(0.02)
        assert got == {leader.pid: sum(before.values())}
        assert group_rss({leader.pid + 10**7}) == {} and group_rss(set()) == {}
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
