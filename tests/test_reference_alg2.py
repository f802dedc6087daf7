"""The pure-Python reference of Alg. 1 + Alg. 2: hand-checked traces, brute force, invariants."""

from __future__ import annotations

import copy
import itertools
import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.reference_alg2 import Bounds, Cluster, Job, decide, load_trace, main, replay_reference
from pricing.workload import generate_trace

RESOURCES = ["gpu", "cpu", "mem", "disk", "bandwidth"]
# one worker: sum_r w[r] = 9; one PS: sum_r s[r] = 9
WORKER = {"gpu": 1, "cpu": 2, "mem": 4, "disk": 1, "bandwidth": 1}
PS = {"cpu": 1, "mem": 2, "disk": 1, "bandwidth": 5}


def _job(job_id: str, arrival: int, minibatches: int, utility: dict[str, Any]) -> dict[str, Any]:
    # m = 0.1 + 2 * 225 * 0.008 / 1 / 3600 = 0.101 slots; W = ceil(2 * minibatches * 0.101)
    return {
        "id": job_id,
        "arrival": arrival,
        "epochs": 1,
        "chunks": 2,
        "minibatches": minibatches,
        "tau": 0.1,
        "grad_mb": 225,
        "worker": dict(WORKER),
        "ps": dict(PS),
        "utility": utility,
    }


def _flat(priority: float) -> dict[str, Any]:
    """A time-insensitive sigmoid: f(d) = priority / 2 for every d."""
    return {"kind": "sigmoid", "priority": priority, "decay": 0, "target": 1}


def _trace(
    horizon: int,
    jobs: list[dict[str, Any]],
    *,
    gpus: int = 2,
    pricing: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "version": 1,
        "horizon": horizon,
        "slot_seconds": 3600,
        "resources": RESOURCES,
        "servers": [
            {
                "name": "w0",
                "kind": "worker",
                "capacity": {"gpu": gpus, "cpu": 8, "mem": 16, "disk": 100, "bandwidth": 10},
            },
            {
                "name": "p0",
                "kind": "ps",
                "capacity": {"cpu": 8, "mem": 16, "disk": 100, "bandwidth": 10},
            },
        ],
        "pricing": pricing or {"bounds": "oracle"},
        "jobs": jobs,
    }


def test_one_job_by_hand() -> None:
    # W = ceil(2 * 10 * 0.101) = ceil(2.02) = 3, d_min = 2; the server takes 2 workers
    # (2 GPUs), the PS server 2 PS (bandwidth 10 / 5); z(1) = z(2) = ceil(y/5) = 1.
    # Oracle bounds over this one job, T = 5, f = 10/2 = 5 everywhere:
    #   1/eta1 = W * 9 / (T * (2+8+16+100+10)) = 27/680;  L1 = 1/(4 eta1) * 5/(W*9) = 1/544
    #   1/eta2 = W * 9 / (T * (8+16+100+10))   = 27/670;  L2 = 1/536
    # Empty cluster: every price is L, a worker costs 9 L1, a PS 9 L2. Fewest PS: 2 slots,
    # (2, 1) workers (ties: least work in the last slot), 1 PS in each.
    trace = _trace(5, [_job("j0", 0, 10, _flat(10))])
    [result] = replay_reference(trace)
    cost = 3 * 9 / 544 + 2 * 9 / 536
    assert result["admitted"] is True
    assert result["jct"] == 2
    assert result["utility"] == 5.0
    assert result["cost"] == pytest.approx(cost, rel=1e-12)
    assert result["payoff"] == pytest.approx(5.0 - cost, rel=1e-12)
    assert result["allocations"] == [
        {"slot": 0, "server": "w0", "workers": 2},
        {"slot": 0, "server": "p0", "ps": 1},
        {"slot": 1, "server": "w0", "workers": 1},
        {"slot": 1, "server": "p0", "ps": 1},
    ]
    _, [job], _ = load_trace(trace)
    assert (job.work, job.d_min) == (3, 2)
    assert job.m == pytest.approx(0.101, rel=1e-12)


def test_equal_cost_splits_do_the_work_early() -> None:
    # W = ceil(2 * 30 * 0.101) = 7 over 4 slots of at most 2 workers and 1 PS each: every
    # split costs 7 workers + 4 PS; the least work in the latest slots wins the tie
    [result] = replay_reference(_trace(6, [_job("j0", 0, 30, _flat(10))]))
    workers = [row["workers"] for row in result["allocations"] if "workers" in row]
    assert workers == [2, 2, 2, 1] and result["jct"] == 4


def test_second_job_pays_the_raised_prices() -> None:
    # T = 2, a 4-GPU server. j0 (W = 3) must use both slots: 2 workers in slot 0, 1 in slot 1.
    # j1 arrives at 1 with W = ceil(2 * 5 * 0.101) = 2, d_min = 1: 2 workers + 1 PS in slot 1,
    # priced after j0's 1 worker and 1 PS there.
    trace = _trace(2, [_job("j0", 0, 10, _flat(10)), _job("j1", 1, 5, _flat(10))], gpus=4)
    r0, r1 = replay_reference(trace)
    worker_cap = {"gpu": 4, "cpu": 8, "mem": 16, "disk": 100, "bandwidth": 10}
    ps_cap = {"cpu": 8, "mem": 16, "disk": 100, "bandwidth": 10}
    # 1/eta = min_i W_i * 9 / (T * sum c), the smaller W being 2; L = 1/(4 eta) * 5 / (3 * 9)
    l1 = (2 * 9 / (2 * 138)) / 4 * 5 / 27
    l2 = (2 * 9 / (2 * 134)) / 4 * 5 / 27
    u1 = {r: 5 / w for r, w in WORKER.items()}  # f(d_min) / w[r], both jobs alike
    u2 = {r: 5 / s for r, s in PS.items()}
    assert r0["admitted"] and r0["jct"] == 2
    assert r0["cost"] == pytest.approx(3 * 9 * l1 + 2 * 9 * l2, rel=1e-12)
    unit_w = sum(w * l1 * (u1[r] / l1) ** (w / worker_cap[r]) for r, w in WORKER.items())
    unit_p = sum(s * l2 * (u2[r] / l2) ** (s / ps_cap[r]) for r, s in PS.items())
    assert r1["admitted"] and r1["jct"] == 1
    assert r1["cost"] == pytest.approx(2 * unit_w + unit_p, rel=1e-12)
    assert r1["payoff"] == pytest.approx(5 - 2 * unit_w - unit_p, rel=1e-12)
    assert r1["allocations"] == [
        {"slot": 1, "server": "w0", "workers": 2},
        {"slot": 1, "server": "p0", "ps": 1},
    ]


def test_explicit_flat_prices_reject_and_change_nothing() -> None:
    # L1 = L2 = 1 and no U: every price is 1, so 3 workers + 2 PS cost 3*9 + 2*9 = 45.
    jobs = [_job("poor", 0, 10, _flat(10)), _job("rich", 0, 10, _flat(200))]
    poor, rich = replay_reference(_trace(5, jobs, pricing={"L1": 1, "L2": 1}))
    assert poor == {
        "id": "poor",
        "admitted": False,
        "payoff": 5 - 45,
        "cost": None,
        "jct": None,
        "utility": None,
        "allocations": [],
    }
    assert rich["admitted"] and rich["payoff"] == 100 - 45 and rich["jct"] == 2
    assert rich["allocations"][0] == {"slot": 0, "server": "w0", "workers": 2}


def test_no_feasible_schedule() -> None:
    # W = 3 worker-slots, at most N = 2 per slot, one slot: impossible
    [result] = replay_reference(_trace(1, [_job("j0", 0, 10, _flat(10))]))
    assert result["payoff"] is None and result["admitted"] is False


def test_table_utility_and_one_gpu() -> None:
    # a 1-GPU server runs one worker per slot: 3 slots, f(3) = 1
    table = {"kind": "table", "values": [10, 10, 1]}
    [result] = replay_reference(_trace(5, [_job("j0", 0, 10, table)], gpus=1))
    assert result["admitted"] and result["jct"] == 3 and result["utility"] == 1.0
    # 1/eta1 = 27 / (5 * 135), L1 = 1/(4 eta1) * f(5) / 27; 1/eta2 = 27 / 670, L2 alike
    l1 = (27 / 675) / 4 / 27
    l2 = (27 / 670) / 4 / 27
    assert result["cost"] == pytest.approx(27 * l1 + 27 * l2, rel=1e-12)


def test_time_critical_job_with_underflowing_bound() -> None:
    # f(Tmax) = 50 / (1 + e^(6 * 299)) underflows a float; L1 stays usable through logs
    critical = {"kind": "sigmoid", "priority": 100, "decay": 6, "target": 2}
    trace = _trace(300, [_job("j0", 0, 10, critical), _job("j1", 5, 10, critical)])
    _, _, bounds = load_trace(trace)
    assert bounds is not None and bounds.log_l1 < -1000
    r0, r1 = replay_reference(trace)
    assert r0["admitted"] and r0["jct"] == 2
    assert r0["utility"] == pytest.approx(100 / (1 + math.exp(0)))
    assert r1["admitted"] and r1["jct"] == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t["jobs"][0]["ps"].update(bandwidth=0.5), "b = 1.0 > B"),
        (lambda t: t["jobs"][0]["worker"].update(bandwidth=0), "bandwidth must be > 0"),
        (lambda t: t["jobs"][0].update(arrival=7), "outside"),
        (lambda t: t["jobs"][0]["worker"].update(tpu=1), "unknown resources"),
        (lambda t: t.update(version=2), "version"),
        (lambda t: t.update(pricing={"L1": 0, "L2": 1}), "pricing.L1"),
        (lambda t: t.update(pricing={"bounds": "online"}), "oracle"),
        (lambda t: t["jobs"][0].update(utility={"kind": "table", "values": [1, 2]}), "non-inc"),
    ],
)
def test_invalid_input(change: Any, message: str) -> None:
    trace = _trace(5, [_job("j0", 0, 10, _flat(10))])
    change(trace)
    with pytest.raises(ValueError, match=message):
        replay_reference(trace)


# ---------------------------------------------------------------------------------------
# Brute force: every placement of every workload split, on small random traces
# ---------------------------------------------------------------------------------------

SMALL_RESOURCES = ["gpu", "cpu", "bandwidth"]


def _random_trace(rnd: random.Random) -> dict[str, Any]:
    servers = [
        {
            "name": f"w{i}",
            "kind": "worker",
            "capacity": {
                "gpu": rnd.randint(1, 4),
                "cpu": rnd.randint(2, 8),
                "bandwidth": round(rnd.uniform(2, 6), 2),
            },
        }
        for i in range(2)
    ]
    servers += [
        {
            "name": f"p{i}",
            "kind": "ps",
            "capacity": {"cpu": rnd.randint(1, 6), "bandwidth": round(rnd.uniform(3, 10), 2)},
        }
        for i in range(2)
    ]
    rnd.shuffle(servers)  # listing order mixes kinds
    arrivals = sorted(rnd.randint(0, 2) for _ in range(6))
    jobs = [
        {
            "id": f"j{i}",
            "arrival": a,
            "epochs": rnd.randint(1, 2),
            "chunks": rnd.randint(1, 3),
            "minibatches": rnd.randint(1, 5),
            "tau": round(rnd.uniform(0.05, 0.3), 3),
            "grad_mb": round(rnd.uniform(0, 500), 1),
            "worker": {
                "gpu": rnd.randint(0, 2),
                "cpu": rnd.randint(1, 3),
                "bandwidth": round(rnd.uniform(0.5, 2), 2),
            },
            "ps": {"cpu": rnd.randint(1, 2), "bandwidth": round(rnd.uniform(2, 4), 2)},
            "utility": {
                "kind": "sigmoid",
                "priority": round(10 ** rnd.uniform(-1, 1.5), 3),  # 0.1 .. 31.6
                "decay": rnd.choice([0, 0.5, 5]),
                "target": rnd.randint(1, 3),
            },
        }
        for i, a in enumerate(arrivals)
    ]
    pricing: dict[str, Any] = {"bounds": "oracle"}
    if rnd.random() < 0.5:  # steep explicit prices: many jobs priced out; cpu flat for PS
        pricing = {
            "L1": 0.01,
            "L2": 0.02,
            "U1": {"gpu": 50.0, "cpu": 20.0, "bandwidth": 30.0},
            "U2": {"bandwidth": 40.0},
        }
    return {
        "version": 1,
        "horizon": 3,
        "slot_seconds": 3600,
        "resources": SMALL_RESOURCES,
        "servers": servers,
        "pricing": pricing,
        "jobs": jobs,
    }


def _unit_prices(
    servers: Any, used: list[list[list[float]]], t: int, demand: list[float], log_u, log_l
) -> list[float]:
    """``sum_r L (U/L)^(used/c) * demand[r]``, the textbook form of eq. (22)."""
    low = math.exp(log_l)
    prices = []
    for i, server in enumerate(servers):
        total = 0.0
        for r, need in enumerate(demand):
            if need > 0:
                cap = server.capacity[r]
                x = used[i][r][t] / cap if cap > 0 else 1.0
                total += need * low * (math.exp(log_u[r]) / low) ** x
        prices.append(total)
    return prices


def _fits(servers: Any, used: Any, t: int, demand: list[float], counts: tuple[int, ...]) -> bool:
    return all(
        n * need <= server.capacity[r] - used[i][r][t] + 1e-9 * need
        for i, (server, n) in enumerate(zip(servers, counts, strict=True))
        for r, need in enumerate(demand)
        if need > 0
    )


def _brute_slot_cost(cluster: Cluster, job: Job, bounds: Bounds, t: int, y: int) -> float:
    """Cheapest feasible placement of y workers and enough PS in slot t, by enumeration."""
    pw = _unit_prices(cluster.workers, cluster.g, t, job.worker, bounds.log_u1, bounds.log_l1)
    pp = _unit_prices(cluster.pss, cluster.v, t, job.ps, bounds.log_u2, bounds.log_l2)
    best_w = math.inf
    for counts in itertools.product(range(y + 1), repeat=len(cluster.workers)):
        if sum(counts) == y and _fits(cluster.workers, cluster.g, t, job.worker, counts):
            best_w = min(best_w, sum(n * p for n, p in zip(counts, pw, strict=True)))
    best_p = math.inf
    for counts in itertools.product(range(y + 1), repeat=len(cluster.pss)):
        # constraints (6) and (7): enough PS bandwidth, no more PS than workers
        enough = sum(counts) * job.big_b >= y * job.b - 1e-9 * job.big_b
        if enough and sum(counts) <= y and _fits(cluster.pss, cluster.v, t, job.ps, counts):
            best_p = min(best_p, sum(n * p for n, p in zip(counts, pp, strict=True)))
    return best_w + best_p


def _brute_best_payoff(cluster: Cluster, job: Job, bounds: Bounds, raw: dict[str, Any]):
    u = raw["utility"]
    slots = range(job.arrival, cluster.horizon)
    costs = {
        (t, y): _brute_slot_cost(cluster, job, bounds, t, y)
        for t in slots
        for y in range(job.chunks + 1)
    }
    best = None
    for ys in itertools.product(range(job.chunks + 1), repeat=len(slots)):
        if sum(ys) < job.work:
            continue
        t_end = max(t for t, y in zip(slots, ys, strict=True) if y > 0)
        cost = sum(costs[t, y] for t, y in zip(slots, ys, strict=True))
        d = t_end - job.arrival + 1
        payoff = u["priority"] / (1 + math.exp(u["decay"] * (d - u["target"]))) - cost
        if best is None or payoff > best:
            best = payoff
    return best if best is not None and best > -math.inf else None


def _cost_of(cluster: Cluster, job: Job, bounds: Bounds, allocations: list[dict[str, Any]]):
    index = {s.name: ("w", i) for i, s in enumerate(cluster.workers)}
    index |= {s.name: ("p", i) for i, s in enumerate(cluster.pss)}
    cost = 0.0
    for row in allocations:
        side, i = index[row["server"]]
        t = row["slot"]
        if side == "w":
            pw = _unit_prices(
                cluster.workers, cluster.g, t, job.worker, bounds.log_u1, bounds.log_l1
            )
            cost += row["workers"] * pw[i]
        else:
            pp = _unit_prices(cluster.pss, cluster.v, t, job.ps, bounds.log_u2, bounds.log_l2)
            cost += row["ps"] * pp[i]
    return cost


@pytest.mark.parametrize("seed", range(40))
def test_matches_brute_force(seed: int) -> None:
    trace = _random_trace(random.Random(seed))
    cluster, jobs, bounds = load_trace(trace)
    assert bounds is not None
    for job, raw in zip(jobs, trace["jobs"], strict=True):
        expected = _brute_best_payoff(cluster, job, bounds, raw)
        before = copy.deepcopy(cluster)
        result = decide(cluster, job, bounds)
        if expected is None:
            assert result["payoff"] is None
            continue
        assert result["payoff"] == pytest.approx(expected, rel=1e-9, abs=1e-12)
        assert result["admitted"] == (result["payoff"] > 1e-9)
        if result["admitted"]:
            spent = _cost_of(before, job, bounds, result["allocations"])
            assert result["cost"] == pytest.approx(spent, rel=1e-9, abs=1e-12)
        else:
            assert cluster.g == before.g and cluster.v == before.v


# ---------------------------------------------------------------------------------------
# Invariants on generated traces
# ---------------------------------------------------------------------------------------


def _check_invariants(trace: dict[str, Any], results: list[dict[str, Any]]) -> None:
    _, jobs, _ = load_trace(trace)
    horizon = trace["horizon"]
    capacity = {s["name"]: s["capacity"] for s in trace["servers"]}
    order = {s["name"]: i for i, s in enumerate(trace["servers"])}
    kind = {s["name"]: s["kind"] for s in trace["servers"]}
    used: dict[tuple[str, str, int], float] = {}
    for job, raw, result in zip(jobs, trace["jobs"], results, strict=True):
        assert result["id"] == raw["id"]
        if result["payoff"] is not None:
            assert result["admitted"] == (result["payoff"] > 1e-9)
        if not result["admitted"]:
            assert result["allocations"] == [] and result["cost"] is None
            continue
        rows = result["allocations"]
        assert rows == sorted(rows, key=lambda row: (row["slot"], order[row["server"]]))
        workers: dict[int, int] = {}
        ps: dict[int, int] = {}
        for row in rows:
            t, name = row["slot"], row["server"]
            assert job.arrival <= t < horizon
            if "workers" in row:
                assert kind[name] == "worker" and row["workers"] > 0
                workers[t] = workers.get(t, 0) + row["workers"]
                demand, n = raw["worker"], row["workers"]
            else:
                assert kind[name] == "ps" and row["ps"] > 0
                ps[t] = ps.get(t, 0) + row["ps"]
                demand, n = raw["ps"], row["ps"]
            for r, need in demand.items():
                key = (name, r, t)
                used[key] = used.get(key, 0.0) + n * need
                assert used[key] <= capacity[name].get(r, 0) + 1e-6
        assert sum(workers.values()) == job.work  # the DP does exactly W worker-slots
        assert all(y <= job.chunks for y in workers.values())
        assert ps == {t: job.ps_needed(y) for t, y in workers.items()}
        assert result["jct"] == max(workers) - job.arrival + 1
        assert result["utility"] == job.f.value(result["jct"])
        assert result["payoff"] == pytest.approx(result["utility"] - result["cost"], abs=1e-9)


@pytest.mark.parametrize(
    ("seed", "n_jobs", "servers", "horizon"),
    [(0, 10, 3, 10), (1, 10, 3, 10), (2, 12, 4, 12), (3, 30, 8, 16)],
)
def test_generated_trace_invariants(seed: int, n_jobs: int, servers: int, horizon: int) -> None:
    trace = generate_trace(
        np.random.default_rng(seed),
        n_jobs=n_jobs,
        n_worker_servers=servers,
        n_ps_servers=servers,
        horizon=horizon,
    )
    results = replay_reference(trace)
    assert any(r["admitted"] for r in results)
    _check_invariants(trace, results)
    assert replay_reference(json.loads(json.dumps(trace))) == results


def test_cli_prints_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(_trace(5, [_job("j0", 0, 10, _flat(10))])))
    assert main([str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"] == {"total_utility": 5.0, "admitted": 1, "rejected": 0}
    assert out["jobs"][0]["jct"] == 2


def test_max_jobs_keeps_the_full_traces_decisions() -> None:
    trace = generate_trace(
        np.random.default_rng(2), n_jobs=12, n_worker_servers=4, n_ps_servers=4, horizon=12
    )
    assert replay_reference(trace, max_jobs=5) == replay_reference(trace)[:5]


def test_empty_trace() -> None:
    assert replay_reference(_trace(5, [])) == []
