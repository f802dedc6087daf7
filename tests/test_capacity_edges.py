"""Capacities and demands at the far ends of float range: what SPEC 5's room rule places,
the ledger takes (audit of 2026-11-27)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pricing
from pricing.job import room
from pricing.ledger import capacity_slack
from pricing.placement import offers


def _trace(worker_capacity: dict[str, float], worker: dict[str, float]) -> Any:
    resources = sorted({*worker_capacity, "bandwidth"})
    return pricing.trace_from_dict({
        "version": 1, "horizon": 3, "slot_seconds": 3600, "resources": resources,
        "servers": [
            {"name": "w0", "kind": "worker", "capacity": worker_capacity},
            {"name": "p0", "kind": "ps", "capacity": {r: 64e9 for r in resources}},
        ],
        "pricing": {"U1": dict.fromkeys(resources, 1e-9), "U2": dict.fromkeys(resources, 1e-9),
                    "L1": 1e-12, "L2": 1e-12},
        "jobs": [{"id": "j", "arrival": 0, "epochs": 1, "chunks": 2, "minibatches": 1,
                  "tau": 1.0, "grad_mb": 1e-9, "worker": worker,
                  "ps": {"bandwidth": 1}, "utility":
                  {"kind": "sigmoid", "priority": 100, "decay": 0, "target": 1}}],
    })  # fmt: skip


def test_what_the_room_rule_places_the_ledger_takes() -> None:
    """Memory in bytes: 16e9 - 1 holds two workers of 8e9 by SPEC 5's room
    ``floor(free / w + 1e-9)``. Before: the search placed them and the ledger's absolute
    slack (1e-7) refused them, so the daemon answered INTERNAL (CapacityError)."""
    tr = _trace({"mem": 16e9 - 1, "bandwidth": 10}, {"mem": 8e9, "bandwidth": 1})
    job = tr.jobs[0]
    assert int(room(tr.cluster.worker_capacity, job.worker)[0]) == 2
    ledger = pricing.Ledger(tr.cluster, tr.bounds, tr.horizon)
    decision = pricing.decide(job, ledger, 0, 2)
    assert decision.admitted
    assert decision.best.schedule is not None
    assert int(decision.best.schedule.workers.max()) == 2
    mem = tr.cluster.resources.index("mem")
    used = ledger.worker_side.used[:, 0, mem]
    cap = tr.cluster.worker_capacity[0, mem]
    assert used.max() > cap  # by SPEC 5's slack, as the room rule allows
    assert used.max() <= cap + capacity_slack(cap)


def test_the_slack_is_no_more_than_the_room_rule_needs() -> None:
    """The slack of a 16e9 server is 32 bytes and 1e-7; of a 1.0 one, 1e-7 as before."""
    assert capacity_slack(np.array([16e9]))[0] == 1e-7 + 32.0
    assert capacity_slack(np.array([1.0]))[0] < 1.1e-7


def test_a_tiny_demand_on_a_huge_capacity_fits() -> None:
    """A worker needing 1e-9 CPU on a server of 1e12: room 2**40 (SPEC 5 counts up to
    ``MAX_ROOM``). Before: the compiled room overflowed int64 to 0, and the job was
    rejected as 'cannot fit'."""
    tr = _trace({"cpu": 1e12, "bandwidth": 100}, {"cpu": 1e-9, "bandwidth": 1})
    job = tr.jobs[0]
    ledger = pricing.Ledger(tr.cluster, tr.bounds, tr.horizon)
    _, got = offers(ledger.worker_side.kernel_view(job.worker), 0)
    assert got.tolist() == room(tr.cluster.worker_capacity, job.worker).tolist() == [100]
    huge = (np.zeros((1, 1, 1)), np.zeros((1, 1, 1)), np.array([[1e12]]), np.array([1e-9]))
    assert offers(huge, 0)[1].tolist() == [2**40]
    best = pricing.best_schedule(job, ledger, 0, 2)
    assert best.payoff is not None and best.payoff > 49  # f = 100 / (1 + e^0)


def _bytes_trace() -> Any:
    """Memory in bytes: one job of four workers of 4e9 + 1 bytes (W = 4, N = 4, T = 1) on
    a server of 16e9. SPEC 5's room ``floor(16e9 / (4e9 + 1) + 1e-9)`` is 4: the online
    algorithm runs it in its one slot, 4 bytes past the capacity."""
    return pricing.trace_from_dict({
        "version": 1, "horizon": 1, "slot_seconds": 3600,
        "resources": ["gpu", "mem", "bandwidth"],
        "servers": [
            {"name": "w0", "kind": "worker", "capacity": {"gpu": 8, "mem": 16e9, "bandwidth": 100}},
            {"name": "p0", "kind": "ps", "capacity": {"mem": 16e9, "bandwidth": 100}},
        ],
        "pricing": {"bounds": "oracle"},
        "jobs": [{"id": "j", "arrival": 0, "epochs": 1, "chunks": 4, "minibatches": 1,
                  "tau": 0.9, "grad_mb": 1e-4, "worker": {"gpu": 1, "mem": 4e9 + 1, "bandwidth": 1},
                  "ps": {"mem": 1e9, "bandwidth": 1},
                  "utility": {"kind": "sigmoid", "priority": 10, "decay": 0, "target": 1}}],
    })  # fmt: skip


@pytest.mark.parametrize(
    ("method", "cold"), [("ilp", False), ("ilp", True), ("auto", False), ("colgen", True)]
)
def test_the_offline_optimum_runs_what_the_room_rule_placed_online(method: Any, cold: bool) -> None:
    """SPEC 6: the offline optimum is under the same feasibility rules as the online
    algorithm. Before: its check and its ILP held the capacity to 1e-7, so `oasis
    offline` failed ("the starting allocation breaks SPEC 3-5: a worker server's
    capacity is exceeded"), and cold, the ILP's optimum was 0 against an online 5."""
    from controller.replay import replay
    from pricing.offline_allocation import check_schedules
    from pricing.offline_model import Held
    from pricing.offline_solve import solve

    tr = _bytes_trace()
    (record,) = replay(tr)
    assert record.decision.admitted and record.decision.best.schedule is not None
    online = record.decision.best.schedule
    assert online.workers.tolist() == [[4]]
    assert check_schedules(tr, Held.nothing(tr), [online]) == []
    result = solve(tr, method=method, time_limit=20, start=None if cold else [online])
    assert result.status == "optimal"
    assert result.optimum == pytest.approx(record.decision.best.utility)


def test_held_use_the_room_rule_placed_is_no_hand_edit() -> None:
    """``offline --store``: held use past a capacity by no more than the ledger's slack is
    what the daemon placed by SPEC 5's room: cut to the capacity without a note (before:
    noted as "a store edited by hand"). Past the slack it is still noted."""
    from types import SimpleNamespace

    from controller.history_capacity import clip_over_capacity

    tr = _bytes_trace()
    mem = tr.cluster.resources.index("mem")
    rows = [SimpleNamespace(job_id="held", slot=0, server="w0")]
    for over, noted in ((4.0, False), (1000.0, True)):
        worker = np.zeros((1, *tr.cluster.worker_capacity.shape))
        worker[0, 0, mem] = 16e9 + over
        ps = np.zeros((1, *tr.cluster.ps_capacity.shape))
        notes = clip_over_capacity(tr.cluster, 0, worker, ps, rows, set())
        assert bool(notes) == noted, notes
        assert worker[0, 0, mem] == 16e9
