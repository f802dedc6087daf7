"""Every job the daemon admits gives plan entries its node agents take, and one entry an
agent cannot take costs only its own job.

The audit: a job of ``E = N = 2**53`` epochs and chunks, ``M = 2**20`` and a mini-batch
of 1e-37 slots is 9 worker-slots of work, and was admitted; its plan entries said
``minibatches`` = E*N*M = 8.5e37, over the 2**53 an agent reads, and each agent refused
the whole plan of its server: every other tenant's task there went without its new plan
and ran out. The parser now refuses such a job (it names E*N*M), and an agent leaves a
bad entry out alone.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from controller.config import demo_config
from controller.plane.agent import Agent
from controller.plane.demand import MAX_DEMAND_ENTRIES, carried
from controller.plane.plan_messages import Plan, PlanParts, SlotPlan, Task
from controller.plane.plans import plan_task, task_demand
from controller.plane.settings import MqttConfig
from pricing.errors import SpecError
from pricing.job import job_from_dict

CONFIG = demo_config()
CLUSTER = CONFIG.cluster
RESOURCES = [(i, n) for i, n in enumerate(CLUSTER.resources) if carried(n)][:MAX_DEMAND_ENTRIES]
DEVICE = CLUSTER.resources.index("gpu")

BASE: dict[str, Any] = {
    "id": "j", "epochs": 2, "chunks": 8, "minibatches": 50, "tau": 0.01, "grad_mb": 100,
    "worker": {"gpu": 1, "cpu": 4, "mem": 8, "disk": 5, "bandwidth": 1},
    "ps": {"cpu": 2, "mem": 8, "disk": 5, "bandwidth": 5},
    "utility": {"kind": "sigmoid", "priority": 50, "decay": 0.5, "target": 3},
}  # fmt: skip
NUMBERS = [
    0.0, 5e-324, 1e-320, 1e-300, 1e-37, 1e-12, 0.5, 1.0, 3.0, 7.0, 2.0**53, 1e15, 1e300,
    1.7e308, -1.0, math.inf, math.nan, 1, 2, 2**20, 2**31, 2**53, 2**53 + 1, 2**63 - 1,
]  # fmt: skip
PATHS = [
    ("epochs",), ("chunks",), ("minibatches",), ("tau",), ("grad_mb",),
    *(("worker", r) for r in ("gpu", "cpu", "mem", "disk", "bandwidth")),
    *(("ps", r) for r in ("cpu", "mem", "disk", "bandwidth")),
    ("utility", "priority"), ("utility", "decay"), ("utility", "target"),
]  # fmt: skip


def _parse(spec: dict[str, Any]) -> Any:
    return job_from_dict(
        spec, CLUSTER, slot_seconds=CONFIG.slot_seconds, slots_available=lambda _a: 300,
        arrival=0,
    )  # fmt: skip


def _round_trip(tasks: list[Task]) -> Plan:
    plan = Plan(
        server="w0", kind="worker", epoch=3, slot_seconds=CONFIG.slot_seconds,
        heartbeat_seconds=5.0, down=False, current=SlotPlan(7, 25200.0, tasks),
        next=SlotPlan(8, 28800.0, []),
    )  # fmt: skip
    return Plan.parse(plan.to_bytes())


@settings(max_examples=300, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(st.lists(st.tuples(st.sampled_from(PATHS), st.sampled_from(NUMBERS)), min_size=1,
                max_size=4))  # fmt: skip
def test_every_job_the_parser_takes_gives_plan_entries_an_agent_takes(
    changes: list[tuple[tuple[str, ...], float]],
) -> None:
    """Jobs with numbers from the edges of float64 and int64 in one to four fields: any
    the daemon's parser accepts gives, on a worker and on a PS server, a task that an
    agent parses back the same, none of it left out."""
    spec = copy.deepcopy(BASE)
    for path, value in changes:
        target = spec
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    try:
        job = _parse(spec)
    except SpecError:
        return  # refused, with the field named (tests/test_fuzz_parsers.py)
    tasks = [
        plan_task(
            "tenant/j",
            job,
            kind,
            workers,
            ps,
            "2026-11-30T20:00:00Z",
            DEVICE,
            task_demand(job, kind, RESOURCES),
            CONFIG.slot_seconds,
        )
        for kind, workers, ps in (("worker", 3, 0), ("ps", 0, 2))
    ]
    back = _round_trip(tasks)
    assert back.current.refused == 0, back.current.refused_error
    assert back.current.tasks == tasks


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.integers(1, 2**53), st.integers(1, 2**53), st.integers(1, 2**53),
       st.floats(1.0, 5000.0))  # fmt: skip
def test_any_counts_with_a_feasible_work_give_plan_entries_an_agent_takes(
    epochs: int, chunks: int, minibatches: int, work: float
) -> None:
    """The counts anywhere up to 2**53 each, the mini-batch as short as makes the work
    ``work`` worker-slots (so the job fits in time whatever its counts): a job the
    parser takes gives a task an agent parses back whole."""
    tau = work / (epochs * chunks * minibatches)
    spec = {**BASE, "epochs": epochs, "chunks": chunks, "minibatches": minibatches,
            "tau": tau, "grad_mb": 5e-324}  # fmt: skip
    try:
        job = _parse(spec)
    except SpecError as err:
        assert "E*N*M" in str(err) or "work" in str(err) or "tau" in str(err), err
        return
    task = plan_task("j", job, "worker", 1, 0, "", DEVICE, {}, CONFIG.slot_seconds)
    back = _round_trip([task])
    assert back.current.refused == 0, back.current.refused_error
    assert back.current.tasks == [task]


def test_a_job_of_more_than_2_53_minibatches_in_all_is_refused_naming_them() -> None:
    """The audit's job: each count within 2**53, their product 8.5e37, its work 9
    worker-slots. Refused, saying E*N*M and why; one mini-batch fewer in all is taken."""
    spec = {**BASE, "epochs": 2**53, "chunks": 2**53, "minibatches": 2**20, "tau": 1e-37,
            "grad_mb": 5e-324}  # fmt: skip
    with pytest.raises(SpecError, match=r"E\*N\*M = 8\.50706e\+37 mini-batches in all is too many"):
        _parse(spec)
    taken = _parse({**spec, "epochs": 2**33, "chunks": 2**20, "minibatches": 1, "tau": 1e-15})
    assert taken.total_minibatches == 2**53


def _payload(tasks: list[Any]) -> bytes:
    return json.dumps({
        "version": 1, "server": "w0", "kind": "worker", "epoch": 5, "slot_seconds": 3600,
        "heartbeat_seconds": 5, "down": False,
        "current": {"slot": 1, "starts_at": 0, "tasks": tasks},
        "next": {"slot": 2, "starts_at": 3600, "tasks": []},
    }).encode()  # fmt: skip


GOOD = {"job": "a", "workers": 2, "ps": 0, "minibatch_seconds": 0.5, "minibatches": 400}


def test_an_agent_leaves_a_bad_entry_out_and_follows_the_rest_of_the_plan() -> None:
    """Entries an agent cannot take (a count over 2**53, a negative worker count, not
    an object) are left out alone, counted and said once; the other tenants' tasks of
    the same plan run."""
    bad = [
        {**GOOD, "job": "big", "minibatches": 2**60},
        {**GOOD, "job": "neg", "workers": -1},
        17,
    ]
    plan = Plan.parse(_payload([GOOD, *bad, {**GOOD, "job": "b"}]))
    assert [t.job for t in plan.current.tasks] == ["a", "b"]
    assert plan.current.refused == 3
    assert "minibatches" in plan.current.refused_error
    agent = Agent("w0", MqttConfig("localhost"))
    with capture_logs() as logs:
        assert agent.accept(plan)
        assert agent.accept(plan)  # the same epoch again: said once
    said = [e for e in logs if e["event"].startswith("plan entries left out")]
    assert len(said) == 1 and said[0]["entries"] == 3 and said[0]["log_level"] == "warning"
    assert agent.plan is not None and [t.job for t in agent.plan.current.tasks] == ["a", "b"]


def test_a_plan_in_parts_counts_the_entries_each_part_left_out() -> None:
    """Put back together, the parts' entries left out add up, and the first error is
    kept."""
    whole = Plan.parse(_payload([{**GOOD, "job": f"j{i}"} for i in range(12)]))
    parts = whole.split(len(whole.to_bytes()) // 2 + 200)
    assert len(parts) > 1
    raw = [json.loads(p.to_bytes()) for p in parts]
    raw[-1]["current"]["tasks"].append({**GOOD, "job": "bad", "minibatches": 0})
    joiner = PlanParts()
    joined = [joiner.add(Plan.parse(json.dumps(r).encode())) for r in raw][-1]
    assert joined is not None
    assert [t.job for t in joined.current.tasks] == [t.job for t in whole.current.tasks]
    assert joined.current.refused == 1 and "minibatches" in joined.current.refused_error


def test_a_slot_that_is_bad_as_a_whole_still_refuses_the_plan() -> None:
    """Only entries are left out alone: a plan whose slot or header is bad is refused
    as before (the agent keeps the plan it follows)."""
    obj = json.loads(_payload([GOOD]))
    obj["current"]["tasks"] = {"not": "a list"}
    with pytest.raises(SpecError, match=r"plan\.current\.tasks"):
        Plan.parse(json.dumps(obj).encode())
    obj = json.loads(_payload([GOOD]))
    obj["epoch"] = -1
    with pytest.raises(SpecError, match=r"plan\.epoch"):
        Plan.parse(json.dumps(obj).encode())
