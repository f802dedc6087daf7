"""A job's demand on the node: carried in each plan task (``demand``), told to each worker
command (``OASIS_DEMAND``, ``OASIS_DEMAND_<NAME>``), and, with ``oasis agent
--memory-resource``, a worker over its memory demand stopped (controller/plane/demand.py,
memory_guard.py). Before, only a worker's GPUs reached the node: a tenant's worker using
60 GB where its job declared 8 got the OOM killer to kill other tenants' workers."""

from __future__ import annotations

import json
import re

import pytest

from controller.plane.demand import MAX_DEMAND_ENTRIES, demand_environment
from controller.plane.topics import Plan, SlotPlan, Task
from pricing.errors import SpecError


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
    # a zero amount is no demand (as the daemon leaves it out)
    zero = bare.to_bytes().replace(b'"run":""', b'"run":"","demand":{"gpu":0,"mem":2}', 1)
    assert Plan.parse(zero).current.tasks[0].demand == {"mem": 2}


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
def test_a_bad_demand_is_refused_naming_the_field(demand: bytes, why: str) -> None:
    payload = _plan(Task("a", 1, 0, 0.5, 40)).to_bytes()
    bad = payload.replace(b'"run":""', b'"run":"","demand":' + demand, 1)
    with pytest.raises(SpecError, match=re.escape("plan.current.tasks[0]." + why)):
        Plan.parse(bad)


def test_the_demand_variables_are_compact_json_and_one_per_resource() -> None:
    env = demand_environment({"cpu": 4.0, "mem": 8, "gpu-mem.x": 0.25})
    assert env["OASIS_DEMAND"] == '{"cpu":4,"mem":8,"gpu-mem.x":0.25}'
    assert json.loads(env["OASIS_DEMAND"]) == {"cpu": 4, "mem": 8, "gpu-mem.x": 0.25}
    assert env["OASIS_DEMAND_CPU"] == "4" and env["OASIS_DEMAND_MEM"] == "8"
    assert env["OASIS_DEMAND_GPU_MEM_X"] == "0.25"
    assert demand_environment({}) == {}  # none said: no variable
