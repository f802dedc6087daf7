"""Hand-computed cases of SPEC 3-5 (one worker server, one PS server) and the SpecErrors
that bad traces must raise, each naming its field.

The numbers in the comments are worked out by hand from the SPEC's formulas; the test
asserts the library reaches the same ones.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest

import pricing
from pricing.utility import Sigmoid

GPU, CPU, BW = 0, 1, 2


def base_trace(**job_changes: Any) -> dict[str, Any]:
    """One worker server w0 (gpu 2, cpu 8, bandwidth 10: sum c = 20), one PS server p0
    (cpu 8, bandwidth 20: sum c = 28), T = 5 slots of 3600 s, oracle bounds, one job:

    - E = 1, N = 3, M = 4, tau = 0.495, e = 225 MB, w = (gpu 1, cpu 2, bw 1) so b = 1,
      s = (cpu 1, bw 2) so B = 2;
    - m = 0.495 + 2 * 225 * 0.008 / 1 / 3600 = 0.495 + 0.001 = 0.496 slots;
    - W = ceil(1 * 3 * 4 * 0.496 - 1e-9) = ceil(5.952) = 6 worker-slots;
    - d_min = ceil(6 / 3) = 2;
    - b / B = 1/2: z(1) = 1, z(2) = ceil(1 - 1e-9) = 1, z(3) = ceil(1.5) = 2;
    - room on w0: min(2/1, 8/2, 10/1) = 2 workers; on p0: min(8/1, 20/2) = 8 PS.
    """
    job: dict[str, Any] = {
        "id": "j0",
        "arrival": 0,
        "epochs": 1,
        "chunks": 3,
        "minibatches": 4,
        "tau": 0.495,
        "grad_mb": 225,
        "worker": {"gpu": 1, "cpu": 2, "bandwidth": 1},
        "ps": {"cpu": 1, "bandwidth": 2},
        "utility": {"kind": "sigmoid", "priority": 100, "decay": 1, "target": 3},
    }
    job.update(job_changes)
    return {
        "version": 1,
        "horizon": 5,
        "slot_seconds": 3600,
        "resources": ["gpu", "cpu", "bandwidth"],
        "servers": [
            {"name": "w0", "kind": "worker", "capacity": {"gpu": 2, "cpu": 8, "bandwidth": 10}},
            {"name": "p0", "kind": "ps", "capacity": {"cpu": 8, "bandwidth": 20}},
        ],
        "pricing": {"bounds": "oracle"},
        "jobs": [job],
    }


def rel(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


def decide_first(raw: dict[str, Any]) -> tuple[pricing.Trace, pricing.Ledger, pricing.Decision]:
    trace = pricing.trace_from_dict(raw)
    ledger = pricing.Ledger(trace.cluster, trace.bounds, trace.horizon)
    job = trace.jobs[0]
    return trace, ledger, pricing.decide(job, ledger, job.arrival, trace.horizon - 1)


def test_derived_job_quantities() -> None:
    trace = pricing.trace_from_dict(base_trace())
    job = trace.jobs[0]
    assert rel(job.minibatch_slots, 0.496)
    assert job.work == 6
    assert job.min_slots == 2
    assert rel(job.ps_ratio, 0.5)
    assert job.ps_table().tolist() == [0, 1, 1, 2]


def test_oracle_bounds_for_one_job() -> None:
    """f(d) = 100 / (1 + e^(d - 3)): f(2) = 73.10585786300048, f(5) = 11.920292202211755.

    U1 = f(d_min) / w = (f(2) / 1, f(2) / 2, f(2) / 1); U2 = (L2: gpu unused, f(2) / 1,
    f(2) / 2).
    1/eta1 = min(1, W sum w / (T sum c)) = 6 * 4 / (5 * 20) = 0.24, eta1 = 1 / 0.24;
    L1 = 1 / (4 eta1) * f(Tmax = 5) / (W sum w) = 0.06 * f(5) / 24 = f(5) / 400.
    1/eta2 = 6 * 3 / (5 * 28) = 9/70, L2 = (9/70) / 4 * f(5) / 18 = f(5) / 560.
    """
    f2, f5 = 73.10585786300048, 11.920292202211755
    b = pricing.trace_from_dict(base_trace()).bounds
    assert rel(b.eta1, 1 / 0.24) and rel(b.eta2, 70 / 9)
    assert rel(math.exp(b.log_l1), f5 / 400)
    assert rel(math.exp(b.log_l2), f5 / 560)
    assert np.allclose(np.exp(b.log_u1), [f2, f2 / 2, f2], rtol=1e-12)
    assert np.allclose(np.exp(b.log_u2), [f5 / 560, f2, f2 / 2], rtol=1e-12)


def test_time_sensitive_job_on_an_empty_cluster() -> None:
    """Prices are all L: one worker costs L1 (1 + 2 + 1) = 4 L1, one PS L2 (1 + 2) = 3 L2.
    At most 2 workers per slot, so W = 6 takes 3 slots: 2 + 2 + 2 workers, z(2) = 1 PS
    each (any other split uses more slots, so more PS, and ends later).
    cost = 6 * 4 L1 + 3 * 3 L2 = 24 f(5) / 400 + 9 f(5) / 560 = 0.9067936568111086,
    jct = 3, utility f(3) = 50, payoff = 50 - 0.9067936568111086 = 49.09320634318889.
    After admission slot 0 of w0 holds gpu 2 / 2, cpu 4 / 8: p[gpu] = U1[gpu] = f(2), and
    p[cpu] = L1 (U1[cpu] / L1) ** (1/2) = sqrt(L1 f(2) / 2)."""
    f2, f5 = 73.10585786300048, 11.920292202211755
    _, ledger, d = decide_first(base_trace())
    best = d.best
    assert d.admitted
    assert best.jct == 3 and rel(best.utility, 50.0)
    assert rel(best.cost, 0.9067936568111086)
    assert rel(best.payoff, 49.09320634318889)
    assert best.schedule is not None
    assert best.schedule.start == 0
    assert best.schedule.workers.tolist() == [[2], [2], [2]]
    assert best.schedule.ps.tolist() == [[1], [1], [1]]
    assert ledger.worker_side.used[:, 0].tolist() == [[2, 4, 2]] * 3 + [[0, 0, 0]] * 2
    assert ledger.ps_side.used[:, 0].tolist() == [[0, 1, 2]] * 3 + [[0, 0, 0]] * 2
    assert rel(ledger.worker_side.price[0, 0, GPU], f2)
    assert rel(ledger.worker_side.price[0, 0, CPU], math.sqrt(f5 / 400 * f2 / 2))
    assert rel(ledger.worker_side.price[3, 0, GPU], f5 / 400)


def test_time_insensitive_job() -> None:
    """decay = 0: f(d) = 100 / (1 + e^0) = 50 for every d, so L1 = 50 / 400 = 0.125 and
    L2 = 50 / 560. The cheapest schedule is still 2 + 2 + 2 workers with 3 PS:
    cost = 24 * 0.125 + 9 * 50 / 560 = 3 + 0.8035714285714286 = 3.8035714285714284,
    payoff = 50 - cost = 46.19642857142857, whatever the completion time."""
    utility = {"kind": "sigmoid", "priority": 100, "decay": 0, "target": 3}
    _, _, d = decide_first(base_trace(utility=utility))
    assert d.admitted
    assert rel(d.best.cost, 3.8035714285714284)
    assert rel(d.best.payoff, 46.19642857142857)
    assert rel(d.best.utility, 50.0)
    assert d.best.jct is not None and 3 <= d.best.jct <= 5
    assert d.best.schedule is not None
    assert d.best.schedule.work() == 6 and d.best.schedule.ps.sum() == 3


def test_utility_falling_fast_is_rejected() -> None:
    """Explicit flat prices L1 = L2 = 0.01: cost of the 2 + 2 + 2 schedule = 24 * 0.01 +
    9 * 0.01 = 0.33 wherever it runs. f(d) = 100 / (1 + e^(5 (d - 1))): f(3) =
    0.0045397868702434395 (d >= 3 is forced by the room), payoff = f(3) - 0.33 =
    -0.3254602131297566 < 0: rejected, nothing changes. With decay 0, f = 50 and the same
    prices give 50 - 0.33 = 49.67: admitted."""
    flat = {"U1": {}, "U2": {}, "L1": 0.01, "L2": 0.01}
    fast = {"kind": "sigmoid", "priority": 100, "decay": 5, "target": 1}
    raw = base_trace(utility=fast)
    raw["pricing"] = flat
    _, ledger, d = decide_first(raw)
    assert not d.admitted
    assert rel(d.best.payoff, -0.3254602131297566)
    assert not ledger.touched.any() and ledger.job_ids() == []

    raw = base_trace(utility={"kind": "sigmoid", "priority": 100, "decay": 0, "target": 1})
    raw["pricing"] = flat
    _, _, d = decide_first(raw)
    assert d.admitted and rel(d.best.payoff, 49.67) and rel(d.best.cost, 0.33)


def test_table_utility_and_prices_raised_by_an_earlier_job() -> None:
    """One slot (T = 1), explicit L1 = 1, U1[gpu] = 16 (cpu, bandwidth flat at 1), L2 =
    0.5 flat. Three identical jobs: one worker (gpu 1, bw 1), one PS (bw 1), W = 1
    (tau = 1, e = 1e-6 MB: m = 1 + 4.4e-12, W = ceil(1 + 4.4e-12 - 1e-9) = 1), f = 100.
    - job 0, empty: worker 1 + 1 = 2, PS 0.5: payoff 97.5; gpu then 1/2 used, so
      p[gpu] = 1 * 16 ** (1/2) = 4.
    - job 1: worker 4 + 1 = 5, PS 0.5: payoff 94.5; gpu then 2/2 used: p[gpu] = 16.
    - job 2: no room left (gpu 2/2): no schedule, payoff None."""
    job = {
        "arrival": 0,
        "epochs": 1,
        "chunks": 1,
        "minibatches": 1,
        "tau": 1.0,
        "grad_mb": 1e-6,
        "worker": {"gpu": 1, "bandwidth": 1},
        "ps": {"bandwidth": 1},
        "utility": {"kind": "table", "values": [100]},
    }
    raw = base_trace()
    raw.update(horizon=1, jobs=[{**copy.deepcopy(job), "id": f"j{i}"} for i in range(3)])
    raw["pricing"] = {"U1": {"gpu": 16}, "U2": {}, "L1": 1, "L2": 0.5}
    trace = pricing.trace_from_dict(raw)
    assert [j.work for j in trace.jobs] == [1, 1, 1]
    ledger = pricing.Ledger(trace.cluster, trace.bounds, 1)
    d0, d1, d2 = (pricing.decide(j, ledger, 0, 0) for j in trace.jobs)
    assert d0.admitted and rel(d0.best.payoff, 97.5) and rel(d0.best.cost, 2.5)
    assert d1.admitted and rel(d1.best.payoff, 94.5) and rel(d1.best.cost, 5.5)
    assert rel(ledger.worker_side.price[0, 0, GPU], 16.0)
    assert not d2.admitted and d2.best.payoff is None and d2.best.schedule is None


def _two_workers_by_table(values: list[float], u1: dict[str, float]) -> pricing.Trace:
    """T = 3; a job of W = 2, N = 2, worker (gpu 1, bw 1), PS (bw 1), table utility
    ``values``; explicit bounds L1 = 1 with ``u1``, PS flat at L2 = 0.01."""
    raw = base_trace(
        chunks=2,
        minibatches=1,
        tau=1.0,
        grad_mb=1e-6,
        worker={"gpu": 1, "bandwidth": 1},
        ps={"bandwidth": 1},
        utility={"kind": "table", "values": values},
    )
    raw.update(horizon=3)
    raw["pricing"] = {"U1": u1, "U2": {}, "L1": 1, "L2": 0.01}
    return pricing.trace_from_dict(raw)


def test_decreasing_table_utility_trades_time_for_cost() -> None:
    """Table f = (10, 9.9, 0), T = 3. Explicit L1 = 1 with U1[gpu] = 100 (cpu and
    bandwidth flat at 1); PS flat at L2 = 0.01. N = 2, W = 2 (E = M = 1, tau = 1, e tiny),
    worker (gpu 1, bw 1): 2 per slot fit on w0 (gpu 2); PS (bw 1), b / B = 1: z(y) = y.

    Empty cluster: a worker costs 1 + 1 = 2 and a PS 0.01 in every slot, so both workers
    in slot 0 (a job's own placement does not move its prices) cost 4.02 with f(1) = 10:
    payoff 5.98, jct 1.

    Pre-load slot 0 with another job's worker using gpu 1: p[gpu] = 100 ** (1/2) = 10 and
    room 1 there, so jct 1 is infeasible. jct 2: (0, 2) costs 2 + 2 + 0.02 = 4.02, payoff
    9.9 - 4.02 = 5.88; (1, 1) costs 11 + 2 + 0.02 = 13.02 (payoff < 0). jct 3 has f = 0.
    Best: no worker in slot 0, two in slot 1."""
    trace = _two_workers_by_table([10, 9.9, 0], {"gpu": 100})
    job = trace.jobs[0]
    assert job.work == 2
    ledger = pricing.Ledger(trace.cluster, trace.bounds, 3)
    best = pricing.best_schedule(job, ledger, 0, 2)
    assert best.jct == 1 and rel(best.cost, 4.02) and rel(best.payoff, 5.98)

    sched = pricing.Schedule(0, np.array([[1]], np.int32), np.array([[0]], np.int32))
    ledger.admit("other", np.array([1.0, 0.0, 0.0]), np.zeros(3), sched)
    assert rel(ledger.worker_side.price[0, 0, GPU], 10.0)
    best = pricing.best_schedule(job, ledger, 0, 2)
    assert best.jct == 2 and rel(best.cost, 4.02) and rel(best.payoff, 5.88)
    assert best.schedule is not None
    assert best.schedule.workers.tolist() == [[0], [2]]


def test_a_waiting_job_counts_its_utility_from_its_arrival() -> None:
    """A job that arrived in slot 0 and is decided again from slot 1 (the pending queue):
    ending in slot ``t`` is worth ``f(t - 0 + 1)``, not ``f(t - 1 + 1)``.

    Table f = (10, 9), T = 3, W = 2, N = 2, worker (gpu 1, bw 1), PS (bw 1), z(y) = y.
    L1 = 1, U1 = (gpu 100, bandwidth 2), PS flat at 0.01. Another job uses bandwidth 1 of
    w0's 10 in slot 1: p[bw] = 2 ** 0.1 = 1.0718 there, room still 2.
    - both workers in slot 1: cost 2 * 2.0718 + 0.02 = 4.1636, jct 2, f = 9: payoff 4.8364;
    - both in slot 2: cost 4.02, jct 3, f = 9: payoff 4.98 (the best);
    - one in each: cost 4.0918, jct 3: payoff 4.9082.
    Counted from slot 1 instead, ending in slot 1 would look worth f(1) = 10 (payoff 5.84)."""
    trace = _two_workers_by_table([10, 9], {"gpu": 100, "bandwidth": 2})
    job = trace.jobs[0]
    ledger = pricing.Ledger(trace.cluster, trace.bounds, 3)
    sched = pricing.Schedule(1, np.array([[1]], np.int32), np.array([[0]], np.int32))
    ledger.admit("other", np.array([0.0, 0.0, 1.0]), np.zeros(3), sched)
    best = pricing.best_schedule(job, ledger, 1, 2, arrival=0)
    assert best.schedule is not None and best.schedule.workers.tolist() == [[0], [2]]
    assert best.jct == 3 and rel(best.utility or 0.0, 9.0)
    assert rel(best.cost or 0.0, 4.02) and rel(best.payoff or 0.0, 4.98)
    assert pricing.best_schedule(job, ledger, 1, 2).jct == 1  # from slot 1: ends there


def test_a_later_end_that_is_slightly_cheaper_wins() -> None:
    """Exact optimality, not "close enough": f = 50 whatever the jct (decay 0), W = 1,
    N = 1. Explicit L1 = 1 with U1[cpu] = 1e6, the rest flat; PS flat at L2 = 0.01.
    Another job holds cpu 1e-6 (of 8) in slot 0, so there p[cpu] = 1e6 ** (1e-6 / 8) =
    exp(1.7269388197455342e-06) = 1.000001726940311.
    - slot 1 (empty): worker 1 (gpu) + 2 (cpu) + 1 (bw) = 4, PS 0.01 (1 + 2) = 0.03:
      cost 4.03, payoff 45.97, jct 2;
    - slot 0: cost 4.03 + 2 * 1.726940311e-06, payoff lower by 3.45e-6 (7.5e-8 of it).
    The best schedule ends in slot 1."""
    raw = base_trace(
        chunks=1,
        minibatches=1,
        tau=1.0,
        grad_mb=1e-6,
        utility={"kind": "sigmoid", "priority": 100, "decay": 0, "target": 1},
    )
    raw["pricing"] = {"U1": {"cpu": 1e6}, "U2": {}, "L1": 1, "L2": 0.01}
    trace = pricing.trace_from_dict(raw)
    ledger = pricing.Ledger(trace.cluster, trace.bounds, trace.horizon)
    other = pricing.Schedule(0, np.array([[1]], np.int32), np.array([[0]], np.int32))
    ledger.admit("other", np.array([0.0, 1e-6, 0.0]), np.zeros(3), other)
    assert rel(ledger.worker_side.price[0, 0, CPU], 1.000001726940311)
    best = pricing.best_schedule(trace.jobs[0], ledger, 0, trace.horizon - 1)
    assert best.jct == 2 and rel(best.cost, 4.03) and rel(best.payoff, 45.97)
    assert best.schedule is not None and best.schedule.workers.tolist() == [[0], [1]]


def test_rounding_slack_in_work() -> None:
    """E N M tau = 2 * 5 * 1.1 = 11.000000000000002 in floats, plus a transfer term of
    10 * 2 * 1e-6 * 0.008 / 1 / 3600 = 4.4e-11: W = ceil(11.00000000004 - 1e-9) = 11, not
    12. With e = 0.05 MB the transfer adds 10 * 2.2e-7 = 2.2e-6 > 1e-9: W = 12."""
    raw = base_trace(chunks=2, minibatches=5, tau=1.1, grad_mb=1e-6, epochs=1)
    raw["horizon"] = 10
    assert pricing.trace_from_dict(raw).jobs[0].work == 11
    raw["jobs"][0]["grad_mb"] = 0.05
    assert pricing.trace_from_dict(raw).jobs[0].work == 12


def test_rounding_slack_in_room() -> None:
    """Worker server cpu 0.3, worker cpu 0.1: 0.3 / 0.1 = 2.9999999999999996 and
    floor(2.9999999999999996 + 1e-9) = 3 workers. N = 3, W = 3 (tau = 1, e tiny), b = B so
    z(y) = y, f = (10, 5): all 3 workers in slot 0 (jct 1) beats any 2-slot split, which
    costs the same (3 workers, 3 PS at flat prices) for utility 5."""
    raw = base_trace(
        chunks=3,
        minibatches=1,
        tau=1.0,
        grad_mb=1e-6,
        worker={"cpu": 0.1, "bandwidth": 1},
        ps={"cpu": 1, "bandwidth": 1},
        utility={"kind": "table", "values": [10, 5]},
    )
    raw["servers"][0]["capacity"] = {"cpu": 0.3, "bandwidth": 10}
    trace, _, d = decide_first(raw)
    assert trace.jobs[0].work == 3
    assert d.admitted and d.best.jct == 1
    assert d.best.schedule is not None
    assert d.best.schedule.workers.tolist() == [[3]]
    assert d.best.schedule.ps.tolist() == [[3]]


def test_rounding_slack_in_ps_count() -> None:
    """b = 0.27, B = 0.36: b / B = 0.75 and 4 * 0.75 evaluates to 3.0000000000000004, so
    z(4) = ceil(3.0000000000000004 - 1e-9) = 3 (z(1..3) = 1, 2, 3). The PS server has cpu
    3 and a PS needs cpu 1: room for exactly 3 PS. N = 4, W = 4, f = (10, 5): 4 workers with
    3 PS in slot 0 (jct 1); without the slack z(4) would be 4 and jct 1 impossible."""
    raw = base_trace(
        chunks=4,
        minibatches=1,
        tau=1.0,
        grad_mb=1e-6,
        worker={"cpu": 1, "bandwidth": 0.27},
        ps={"cpu": 1, "bandwidth": 0.36},
        utility={"kind": "table", "values": [10, 5]},
    )
    raw["servers"][1]["capacity"] = {"cpu": 3, "bandwidth": 20}
    trace, _, d = decide_first(raw)
    assert trace.jobs[0].work == 4
    assert trace.jobs[0].ps_table().tolist() == [0, 1, 2, 3, 3]
    assert d.admitted and d.best.jct == 1
    assert d.best.schedule is not None
    assert d.best.schedule.workers.tolist() == [[4]]
    assert d.best.schedule.ps.tolist() == [[3]]


def test_work_that_just_fits_before_the_horizon() -> None:
    """W = 6 at 2 workers per slot needs 3 slots: arriving at 2 of T = 5 leaves slots 2, 3,
    4: it fits and completes in jct 3 (slot 4)."""
    _, _, d = decide_first(base_trace(arrival=2))
    assert d.admitted and d.best.jct == 3
    assert d.best.schedule is not None and d.best.schedule.start == 2


# -- invalid input: each SpecError names the field -----------------------------------------


def _with(raw: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``raw`` with the dotted ``path`` set to ``value``."""
    out = copy.deepcopy(raw)
    node: Any = out
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(keys[-1]) if isinstance(node, list) else keys[-1]] = value
    return out


BAD_INPUTS = [
    # b = 3 > B = 2: constraints 6 and 7 cannot both hold
    ("jobs.0.worker", {"gpu": 1, "cpu": 2, "bandwidth": 3}, "jobs[0].worker.bandwidth"),
    ("jobs.0.worker", {"tpu": 1, "bandwidth": 1}, "jobs[0].worker.tpu"),
    ("jobs.0.ps", {"cpu": 1, "bandwidth": 2, "ram": 4}, "jobs[0].ps.ram"),
    ("jobs.0.worker", {"gpu": 1, "cpu": 2}, "jobs[0].worker.bandwidth"),
    ("jobs.0.tau", -0.5, "jobs[0].tau"),
    ("jobs.0.tau", 0, "jobs[0].tau"),
    ("jobs.0.chunks", 0, "jobs[0].chunks"),
    ("jobs.0.epochs", 1.5, "jobs[0].epochs"),
    ("jobs.0.grad_mb", float("nan"), "jobs[0].grad_mb"),
    ("jobs.0.worker", {"gpu": -1, "bandwidth": 1}, "jobs[0].worker.gpu"),
    ("jobs.0.utility.decay", -0.1, "jobs[0].utility.decay"),
    ("jobs.0.utility", {"kind": "table", "values": [5, 6]}, "jobs[0].utility.values[1]"),
    ("jobs.0.utility", {"kind": "table", "values": [0]}, "jobs[0].utility.values[0]"),
    ("jobs.0.utility", {"kind": "step"}, "jobs[0].utility.kind"),
    # a job too late for the horizon, or that fits on no server, is a rejection since
    # SPEC 6 says so, not a bad field: test_a_job_too_late_for_the_horizon_is_a_rejection,
    # test_a_job_that_fits_on_no_server_is_a_rejection
    ("pricing", {"U1": {"gpu": 0.5}, "U2": {}, "L1": 1, "L2": 1}, "pricing.U1.gpu"),
    ("pricing", {"U1": {"tpu": 2}, "U2": {}, "L1": 1, "L2": 1}, "pricing.U1.tpu"),
    ("pricing", {"U1": {}, "U2": {}, "L1": 0, "L2": 1}, "pricing.L1"),
    # told only "U1, U2, L1, L2: is required", not that {"bounds": ...} is the other form
    ("pricing", {}, "pricing"),
    ("horizon", 0, "horizon"),
    ("version", 2, "version"),
    # JSON's true and 1.0 are no version 1 (mutation audit: the type check dropped survived)
    ("version", True, "version"),
    ("version", 1.0, "version"),
    ("horizon", True, "horizon"),
    ("horizon", 1.5, "horizon"),
    # a horizon whose price ledger would take 20.4 GiB (past the 16 GiB bound) is refused
    # before it is allocated
    ("horizon", 2**27, "horizon"),
    ("slot_seconds", 0, "slot_seconds"),
    ("slot_seconds", -3600, "slot_seconds"),
    ("slot_seconds", float("inf"), "slot_seconds"),
    ("slot_seconds", "1h", "slot_seconds"),
    ("pricing", {"bounds": "estimate", "trim": 1}, "pricing.trim"),
    ("pricing", {"bounds": "estimate", "trim": -0.1}, "pricing.trim"),
    ("pricing", {"bounds": "estimate", "trim": True}, "pricing.trim"),
    ("pricing", {"bounds": "estimate", "prior": "prior.json"}, "pricing.prior"),
]


@pytest.mark.parametrize(("path", "value", "field"), BAD_INPUTS)
def test_bad_input_names_the_field(path: str, value: Any, field: str) -> None:
    raw = _with(base_trace(), path, value)
    with pytest.raises(pricing.SpecError) as caught:
        pricing.trace_from_dict(raw)
    assert caught.value.field == field, str(caught.value)


@pytest.mark.parametrize(
    "key",
    ["id", "arrival", "epochs", "chunks", "minibatches", "tau", "grad_mb", "worker", "ps",
     "utility"],
)  # fmt: skip
def test_a_missing_job_field_is_named_as_the_trace_format_names_it(key: str) -> None:
    """Every field of SPEC 6's job object, left out, is named: a trace without ``tau``
    was told ``jobs[0].minibatch_seconds: is required``, a key SPEC 6 has not."""
    raw = base_trace()
    del raw["jobs"][0][key]
    with pytest.raises(pricing.SpecError) as caught:
        pricing.trace_from_dict(raw)
    assert [p.field for p in caught.value.problems] == [f"jobs[0].{key}"]
    assert str(caught.value.problems[0]).startswith(f"jobs[0].{key}: is required")


EXPLICIT = {"U1": {"gpu": 2}, "U2": {}, "L1": 1, "L2": 1}

UNKNOWN_KEYS = [
    ("slot_second", 60, ["slot_second: unknown key; did you mean 'slot_seconds'?"]),
    ("pricng", EXPLICIT, ["pricng: unknown key; did you mean 'pricing'?"]),
    ("servers.0.capacty", {"gpu": 2}, ["servers[0].capacty: unknown key; did you mean "
                                       "'capacity'?"]),
    ("pricing", {**EXPLICIT, "eta": 3}, ["pricing.eta: unknown key; did you mean 'eta2'?"]),
    ("pricing", {"bounds": "oracle", "eta": 3},
     ["pricing.eta: unknown key; did you mean 'eta2'?"]),
    ("pricing", {"bound": "oracle"}, ["pricing.bound: unknown key; did you mean 'bounds'?",
                                      "pricing.L1: is required", "pricing.L2: is required",
                                      "pricing.U1: is required", "pricing.U2: is required"]),
    # U's own problems beside a missing L (before: only the L's, until the next run)
    ("pricing", {"U1": 1}, ["pricing.L1: is required", "pricing.L2: is required",
                            "pricing.U1: must be an object, got 1", "pricing.U2: is required"]),
    ("pricing", {"U1": {"gpu": -1, "gpux": 2}, "U2": {}, "L1": 0},
     ["pricing.L1: must be > 0, got 0", "pricing.L2: is required",
      "pricing.U1.gpu: must be > 0, got -1", "pricing.U1.gpux: unknown resource"]),
    # listed with the other problems of the same object
    ("pricing", {**EXPLICIT, "U1": {"gpu": 0.5}, "eta": 3},
     ["pricing.eta: unknown key; did you mean 'eta2'?", "pricing.U1.gpu: must be >= L1 = 1"]),
    ("servers.1", {"nmae": "p0", "kind": "ps", "capacity": {"cpu": 8, "bandwidth": 20}},
     ["servers[1].nmae: unknown key; did you mean 'name'?", "servers[1].name: is required"]),
]  # fmt: skip


@pytest.mark.parametrize(("path", "value", "problems"), UNKNOWN_KEYS)
def test_an_unknown_key_is_refused_naming_the_closest_known_one(
    path: str, value: Any, problems: list[str]
) -> None:
    """As in a job: a mistyped key read as absent would silently take its default (an
    hour's slot, oracle bounds)."""
    with pytest.raises(pricing.SpecError) as caught:
        pricing.trace_from_dict(_with(base_trace(), path, value))
    assert [str(p) for p in caught.value.problems] == problems


LATE = [
    # W = 6 at 2 workers per slot needs 3 slots; arriving at 3 of T = 5 leaves 2
    ("jobs.0.arrival", 3, "needs at least 3 slots (at most 2 workers per slot), and only 2"),
    ("jobs.0.arrival", 5, "arrives at or after the horizon"),
    # with s = (cpu 1, bw 1) (set in the test) B = b = 1, so z(y) = y, and a PS server of
    # bandwidth 1 holds one PS: 1 worker per slot, W = 6 needs 6 slots > T = 5
    ("servers.1.capacity", {"cpu": 8, "bandwidth": 1}, "needs at least 6 slots"),
]


@pytest.mark.parametrize(("path", "value", "why"), LATE)
@pytest.mark.parametrize("bounds", ["oracle", "estimate"])
def test_a_job_too_late_for_the_horizon_is_a_rejection(
    path: str, value: Any, why: str, bounds: str
) -> None:
    """SPEC 6: decided like any other job, rejected with payoff null and the reason. It
    takes no part in an estimate, so the other jobs are then decided as if it were not
    there (SPEC 4's oracle bounds are over every job of the trace, so it is in those)."""
    from controller.replay import record_json, replay

    raw = _with(base_trace(), path, value)
    if path == "servers.1.capacity":
        raw["jobs"][0]["ps"] = {"cpu": 1, "bandwidth": 1}
    fine = copy.deepcopy(raw["jobs"][0])
    fine.update(id="fine", arrival=0, minibatches=2)  # W = 3: fits in 3 slots or fewer
    raw["jobs"].insert(0, fine)
    raw["pricing"] = {"bounds": bounds}
    trace = pricing.trace_from_dict(raw)
    assert [j.id for j in trace.jobs] == ["fine", "j0"]
    assert trace.late(trace.jobs[1]) is not None and trace.late(trace.jobs[0]) is None
    records = list(replay(trace))
    out = record_json(records[1], trace.cluster)
    assert out["admitted"] is False and out["payoff"] is None and why in out["reason"]
    assert out["allocations"] == [] and out["utility"] is None
    assert records[0].decision.admitted
    if bounds == "estimate":
        alone = dict(raw, jobs=raw["jobs"][:1])
        (expected,) = replay(pricing.trace_from_dict(alone))
        assert records[0].decision.best.payoff == expected.decision.best.payoff


NOWHERE = [
    # a worker needs 3 gpu, the only worker server has 2
    ({"worker": {"gpu": 3, "cpu": 2, "bandwidth": 1}},
     "cannot run: one worker fits on no worker server, even empty (gpu: it needs 3, the "
     "largest has 2)"),
    # a PS needs 9 cpu, the only PS server has 8
    ({"ps": {"cpu": 9, "bandwidth": 2}},
     "cannot run: one ps fits on no ps server, even empty (cpu: it needs 9, the largest "
     "has 8)"),
    # each resource fits alone on some worker server, never both on one
    ({"worker": {"gpu": 1, "cpu": 9, "bandwidth": 1}},
     "cannot run: one worker fits on no worker server, even empty (no one server has "
     "enough of every resource it needs)"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "why"), NOWHERE)
@pytest.mark.parametrize("bounds", ["oracle", "estimate"])
def test_a_job_that_fits_on_no_server_is_a_rejection(
    change: dict[str, Any], why: str, bounds: str
) -> None:
    """SPEC 6: it cannot finish before the horizon even on an empty cluster, so replay
    rejects it with payoff null and the reason, as a late one (the daemon refuses it as
    a bad field: tests/test_jobspec.py)."""
    from controller.replay import record_json, replay

    raw = base_trace()
    raw["servers"].insert(1, {"name": "w1", "kind": "worker",
                              "capacity": {"cpu": 16, "bandwidth": 10}})  # fmt: skip
    raw["jobs"].append({**copy.deepcopy(raw["jobs"][0]), "id": "nowhere", **change})
    raw["pricing"] = {"bounds": bounds}
    trace = pricing.trace_from_dict(raw)
    records = list(replay(trace))
    out = record_json(records[1], trace.cluster)
    assert out["admitted"] is False and out["payoff"] is None and out["reason"] == why
    assert out["cost"] is None and out["jct"] is None and out["utility"] is None
    assert out["allocations"] == []
    assert records[0].decision.admitted
    if bounds == "estimate":  # the daemon never sees it: the other job decides the same
        (alone,) = replay(pricing.trace_from_dict(dict(raw, jobs=raw["jobs"][:1])))
        assert records[0].decision.best.payoff == alone.decision.best.payoff


def test_the_same_bad_inputs_are_fine_when_corrected() -> None:
    """Controls for the cases above: the base trace, the PS-bound one with T = 6, and the
    late arrival at 2 all validate."""
    pricing.trace_from_dict(base_trace())
    raw = _with(base_trace(), "servers.1.capacity", {"cpu": 8, "bandwidth": 1})
    raw["jobs"][0]["ps"] = {"cpu": 1, "bandwidth": 1}
    raw["horizon"] = 6
    trace = pricing.trace_from_dict(raw)
    ledger = pricing.Ledger(trace.cluster, trace.bounds, 6)
    best = pricing.best_schedule(trace.jobs[0], ledger, 0, 5)
    assert best.jct == 6  # one worker per slot: the PS server holds a single PS
    pricing.trace_from_dict(_with(base_trace(), "jobs.0.arrival", 2))


def test_error_in_a_later_job_names_its_index() -> None:
    raw = base_trace()
    second = {**copy.deepcopy(raw["jobs"][0]), "id": "j1", "tau": -1}
    raw["jobs"].append(second)
    with pytest.raises(pricing.SpecError) as caught:
        pricing.trace_from_dict(raw)
    assert caught.value.field == "jobs[1].tau"
    assert [p.field for p in caught.value.problems] == ["jobs[1].tau"]


def test_every_problem_of_a_job_is_reported() -> None:
    raw = _with(base_trace(), "jobs.0.tau", -1)
    raw["jobs"][0]["chunks"] = 0
    raw["jobs"][0]["worker"] = {"tpu": 1, "bandwidth": 1}
    with pytest.raises(pricing.SpecError) as caught:
        pricing.trace_from_dict(raw)
    fields = {p.field for p in caught.value.problems}
    assert {"jobs[0].tau", "jobs[0].chunks", "jobs[0].worker.tpu"} <= fields


@pytest.mark.parametrize("decay", [0.0, 0.3, 7.0, 2.0**40])
def test_a_sigmoid_far_past_its_target_keeps_a_finite_log(decay: float) -> None:
    """``log f(d) = log p - log(1 + e^x)``, ``x = decay (d - target)``: far past the target
    ``e^x`` overflows a float while the log is ``log p - x`` (the oracle's floor ``L`` of a
    time-critical job is drawn from it), checked against the plain formula each way."""
    f = Sigmoid(3.0, decay, 4.0)
    d = np.array([1, 3, 4, 5, 40, 400, 10**6])
    got = f.log_values(d)
    for di, g in zip(d.tolist(), got.tolist(), strict=True):
        x = decay * (di - 4.0)
        softplus = x + math.log1p(math.exp(-x)) if x > 0 else math.log1p(math.exp(x))
        want = math.log(3.0) - softplus
        assert math.isfinite(g) and g == pytest.approx(want, rel=1e-12, abs=1e-12), (di, g)
    assert np.array_equal(f.values(d), np.exp(got))


def test_a_schedule_ends_at_its_last_slot_with_a_worker() -> None:
    """``end`` is the last slot with a worker, ``start - 1`` for a schedule with none (a
    job with nothing left to run); a PS alone is no worker."""
    workers = np.zeros((4, 2), np.int32)
    ps = np.zeros((4, 1), np.int32)
    assert pricing.Schedule(5, workers, ps).end == 4
    ps[3] = 1
    assert pricing.Schedule(5, workers, ps).end == 4
    workers[0, 1] = workers[2, 0] = 1
    sched = pricing.Schedule(5, workers, ps)
    assert sched.end == 7
    assert sched.after(8).end == 7 and sched.before(7).end == 5 and sched.before(5).end == 4
    # before a slot it does not reach yet: nothing; after one: all of it
    for slot in (2, 4, 5):
        assert sched.before(slot).slots == 0 and sched.after(slot).start == 5
        assert np.array_equal(sched.after(slot).workers, workers)
    assert sched.before(12).slots == sched.after(3).slots == 4 and sched.after(12).slots == 0


def test_a_trace_error_lists_every_bad_field_of_every_job() -> None:
    """Each job's problems, a repeated id and a decreasing arrival are all listed, each
    under its own field, beside the pricing's (mutation audit: stopping at the first bad
    job, dropping the id or arrival check, or naming the job rather than its field
    survived)."""
    raw = base_trace()
    job = raw["jobs"][0]
    raw["jobs"] = [
        {**job, "id": "a", "arrival": 2},
        {**job, "id": "b", "tau": -1},
        {**job, "id": "a", "arrival": 1},  # the id of jobs[0], and earlier than it
        {**job, "id": "c", "chunks": 0},
    ]
    raw["pricing"] = {"bounds": "estimate", "trim": 2}
    with pytest.raises(pricing.SpecError) as caught:
        pricing.trace_from_dict(raw)
    shown = [str(p) for p in caught.value.problems]
    assert [p.field for p in caught.value.problems] == [
        "pricing.trim",
        "jobs[1].tau",
        "jobs[2].id",
        "jobs[2].arrival",
        "jobs[3].chunks",
    ], shown
    assert "duplicate job id 'a'" in shown[2]
    assert "arrivals must not decrease: 1 after 2 (jobs[0].arrival" in shown[3]


@pytest.mark.parametrize("jobs", [None, "absent", {"id": "j0"}])
def test_a_missing_or_bad_job_list_is_reported_with_the_pricing_problems(jobs: Any) -> None:
    raw = base_trace()
    raw["pricing"] = {"bounds": "estimate", "trim": 2}
    if jobs == "absent":
        del raw["jobs"]
    else:
        raw["jobs"] = jobs
    with pytest.raises(pricing.SpecError) as caught:
        pricing.trace_from_dict(raw)
    assert [p.field for p in caught.value.problems] == ["pricing.trim", "jobs"]


def test_a_trace_with_more_than_50_bad_fields_shows_50_and_counts_the_rest() -> None:
    raw = base_trace()
    raw["jobs"] = [{**raw["jobs"][0], "id": f"j{i}", "tau": -1} for i in range(60)]
    with pytest.raises(pricing.SpecError) as caught:
        pricing.trace_from_dict(raw)
    assert len(caught.value.problems) == pricing.trace.MAX_REPORTED_PROBLEMS == 50
    assert caught.value.problems[-1].field == "jobs[49].tau"
    assert caught.value.more == 10


def test_an_estimate_trim_of_0_is_taken_and_a_prior_file_name_is_told_where_it_is_read() -> None:
    """``trim`` is in [0, 1): 0 is L over every job; a prior named by a file is read by
    ``oasis replay``, not here, and the message says so, its name bounded (mutation
    audit: trim 0 refused, the string check dropped, and the name shown whole survived)."""
    raw = _with(base_trace(), "pricing", {"bounds": "estimate", "trim": 0})
    assert pricing.trace_from_dict(raw).trim == 0
    for name in ["prior.json", "p" * 10_000]:
        raw = _with(base_trace(), "pricing", {"bounds": "estimate", "prior": name})
        with pytest.raises(pricing.SpecError) as caught:
            pricing.trace_from_dict(raw)
        assert [p.field for p in caught.value.problems] == ["pricing.prior"]
        message = str(caught.value)
        assert "must be 'default', 'none' or a prior object" in message, message
        assert "oasis replay reads a file named here" in message and len(message) < 300
