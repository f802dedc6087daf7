"""The baseline schedulers (FIFO, DRF, RRH, Dorm): shared rules checked from the
``replay --policy`` JSON alone, and tiny traces whose schedules can be worked out by hand."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from controller.cli import main
from pricing import CapacityError, trace_from_dict
from pricing.baselines import POLICIES, run
from pricing.baselines.rrh import _net_rewards
from pricing.baselines.simulator import Outcome, PolicyError, Pool, Simulator, simulate, verify
from pricing.schedule import Schedule
from pricing.workload import generate_trace

BASELINES = sorted(POLICIES)


def _replay_json(tmp_path: Path, trace: dict[str, Any], policy: str, capsys: Any) -> Any:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    assert main(["replay", str(path), "--policy", policy, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _work(job: dict[str, Any], slot_seconds: float) -> int:
    """SPEC 3, written out again: W in worker-slots."""
    b = float(job["worker"]["bandwidth"])
    m = float(job["tau"]) + 2 * float(job["grad_mb"]) * 0.008 / b / slot_seconds
    return math.ceil(int(job["epochs"]) * int(job["chunks"]) * int(job["minibatches"]) * m - 1e-9)


def _sigmoid(u: dict[str, Any], d: int) -> float:
    return float(u["priority"]) / (1.0 + math.exp(float(u["decay"]) * (d - float(u["target"]))))


def _check_rules(trace: dict[str, Any], out: dict[str, Any], policy: str) -> None:
    """Every shared rule, recomputed from the trace dict and the output allocations."""
    horizon = int(trace["horizon"])
    servers = {s["name"]: s for s in trace["servers"]}
    jobs = {j["id"]: j for j in trace["jobs"]}
    used: dict[tuple[int, str, str], float] = defaultdict(float)
    total = 0.0
    assert [j["id"] for j in out["jobs"]] == [j["id"] for j in trace["jobs"]]
    for rec in out["jobs"]:
        job = jobs[rec["id"]]
        assert rec["payoff"] is None and rec["cost"] is None
        workers: dict[int, int] = defaultdict(int)
        ps: dict[int, int] = defaultdict(int)
        for a in rec["allocations"]:
            server = servers[a["server"]]
            assert job["arrival"] <= a["slot"] <= horizon - 1
            if "workers" in a:
                assert server["kind"] == "worker" and a["workers"] > 0
                workers[a["slot"]] += a["workers"]
                demand, n = job["worker"], a["workers"]
            else:
                assert server["kind"] == "ps" and a["ps"] > 0
                ps[a["slot"]] += a["ps"]
                demand, n = job["ps"], a["ps"]
            for r, x in demand.items():
                used[(a["slot"], a["server"], r)] += n * float(x)
        ratio = float(job["worker"]["bandwidth"]) / float(job["ps"]["bandwidth"])
        for t in set(workers) | set(ps):
            y = workers[t]
            assert 1 <= y <= job["chunks"], (rec["id"], t)
            assert ps[t] == math.ceil(y * ratio - 1e-9) <= y, (rec["id"], t)  # (6), (7)
        work = _work(job, float(trace["slot_seconds"]))
        # every rejected job says why (README, "Replay a trace"), as OASiS's records do
        assert (rec["reason"] is None) == rec["admitted"], rec
        assert rec["admitted"] or rec["reason"].strip()
        if not rec["admitted"]:
            assert policy.startswith("rrh") and rec["utility"] is None and not rec["allocations"]
        elif rec["jct"] is None:  # admitted, did not finish by the horizon
            assert rec["utility"] == 0.0 and sum(workers.values()) < work
        else:
            assert sum(workers.values()) == work
            assert rec["jct"] == max(workers) - job["arrival"] + 1
            assert rec["utility"] == pytest.approx(_sigmoid(job["utility"], rec["jct"]))
            total += rec["utility"]
    for (_, name, r), amount in used.items():
        assert amount <= float(servers[name]["capacity"].get(r, 0.0)) + 1e-7, (name, r)
    s = out["summary"]
    assert s["total_utility"] == pytest.approx(total)
    assert s["admitted"] + s["rejected"] == len(trace["jobs"])
    assert s["admitted"] == sum(j["admitted"] for j in out["jobs"])
    # admitted and not done by the horizon; a rejected job (jct null too) is not one
    assert s["unfinished"] == sum(j["admitted"] and j["jct"] is None for j in out["jobs"])
    assert total > 0  # some job did complete


@pytest.mark.parametrize("policy", BASELINES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_generated_traces_obey_the_shared_rules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: str, seed: int
) -> None:
    trace = generate_trace(
        np.random.default_rng(seed), n_jobs=30, n_worker_servers=5, n_ps_servers=5, horizon=40
    )
    out = _replay_json(tmp_path, trace, policy, capsys)
    _check_rules(trace, out, policy)
    if not policy.startswith("rrh"):
        assert all(j["admitted"] for j in out["jobs"])


def test_the_cluster_is_contended_in_those_traces() -> None:
    """Guards the test above: the traces are loaded enough for policies to differ."""
    raw = generate_trace(
        np.random.default_rng(0), n_jobs=30, n_worker_servers=5, n_ps_servers=5, horizon=40
    )
    trace = trace_from_dict(raw)
    # the paper's four (rrh-np happens to match fifo on this small trace)
    outcomes = {p: run(trace, p) for p in BASELINES if p != "rrh-np"}
    totals = {p: sum(o.utility or 0.0 for o in out) for p, out in outcomes.items()}
    assert len({round(u, 6) for u in totals.values()}) == len(totals), totals
    assert any(o.admitted and o.jct is None for out in outcomes.values() for o in out)


# -- hand-made traces ------------------------------------------------------------------

BIG = {"cpu": 1000, "mem": 1000, "disk": 1000, "bandwidth": 1000}


def _job(
    job_id: str,
    arrival: int,
    chunks: int,
    work: int,
    worker: dict[str, Any],
    utility: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A job of exactly ``work`` worker-slots and at most ``chunks`` workers; one PS
    (cpu 1, 10 Gbps) serves up to 10 workers of 1 Gbps."""
    return {
        "id": job_id,
        "arrival": arrival,
        "epochs": 1,
        "chunks": chunks,
        "minibatches": 1,
        "tau": (work - 0.5) / chunks,  # E N M m = work - 0.5 + (transfer ~ 1e-9)
        "grad_mb": 0.001,
        "worker": {"bandwidth": 1, **worker},
        "ps": {"cpu": 1, "bandwidth": 10},
        "utility": utility or {"kind": "sigmoid", "priority": 10, "decay": 0, "target": 1},
    }


def _trace(worker_capacity: dict[str, Any], jobs: list[dict[str, Any]], horizon: int) -> Any:
    return {
        "version": 1,
        "horizon": horizon,
        "resources": ["gpu", "cpu", "mem", "disk", "bandwidth"],
        "servers": [
            {"name": "w0", "kind": "worker", "capacity": {**BIG, **worker_capacity}},
            {"name": "p0", "kind": "ps", "capacity": BIG},
        ],
        "jobs": jobs,
    }


def _outcomes(raw: dict[str, Any], policy: str) -> dict[str, Outcome]:
    trace = trace_from_dict(raw)
    for job, spec in zip(trace.jobs, raw["jobs"], strict=True):
        assert job.work == round(spec["tau"] * spec["chunks"] + 0.5)  # the intended W
    return {o.job.id: o for o in run(trace, policy)}


def _workers(o: Outcome) -> dict[int, int]:
    """Workers per slot that ran."""
    assert o.schedule is not None
    counts = o.schedule.worker_counts()
    return {o.schedule.start + i: int(n) for i, n in enumerate(counts) if n}


def test_fifo_blocks_behind_the_head_of_the_line() -> None:
    gpu1 = {"gpu": 1}
    raw = _trace(
        {"gpu": 4},
        [
            _job("a", 0, chunks=3, work=6, worker=gpu1),  # 3 GPUs, slots 0-1
            _job("b", 0, chunks=2, work=4, worker=gpu1),  # needs 2, 1 free: waits
            _job("c", 1, chunks=1, work=1, worker=gpu1),  # 1 would fit, but b is first
            _job("d", 1, chunks=4, work=12, worker=gpu1),  # 4 GPUs for 3 slots: never
        ],
        horizon=6,
    )
    out = _outcomes(raw, "fifo")
    assert _workers(out["a"]) == {0: 3, 1: 3}
    assert _workers(out["b"]) == {2: 2, 3: 2}
    assert _workers(out["c"]) == {2: 1}
    assert (out["a"].jct, out["b"].jct, out["c"].jct) == (2, 4, 2)
    # d waits for b, then cannot finish by slot 5: admitted, dropped, utility 0
    assert out["d"].admitted and out["d"].schedule is None
    assert out["d"].jct is None and out["d"].utility == 0.0
    assert out["c"].utility == pytest.approx(5.0)  # time-insensitive: priority / 2


def test_a_job_runs_in_its_last_slot_only_the_workers_its_work_needs() -> None:
    """Simulator rule: W = 7 at 3 workers a slot is 3 + 3 + 1; the 2 workers a's last
    slot does not need are released, so b (3 workers, arriving in that slot) fits beside
    it at once on the 4 GPUs. Worked by hand: a runs slots 0-2 (jct 3), b slot 2 (jct 1)."""
    gpu1 = {"gpu": 1}
    raw = _trace(
        {"gpu": 4},
        [_job("a", 0, chunks=3, work=7, worker=gpu1), _job("b", 2, chunks=3, work=3, worker=gpu1)],
        horizon=6,
    )
    out = _outcomes(raw, "fifo")
    assert _workers(out["a"]) == {0: 3, 1: 3, 2: 1}
    assert _workers(out["b"]) == {2: 3}
    assert (out["a"].jct, out["b"].jct) == (3, 1)


def test_a_last_slot_keeps_the_workers_on_the_first_listed_servers() -> None:
    """Round-robin puts a's 3 workers on w0, w1, w0; W = 4 leaves 1 worker-slot for slot
    1, and the 2 workers cut come off the last-listed servers first (w1's, then one of
    w0's), so the one left runs on w0."""
    raw = _trace({"gpu": 4}, [_job("a", 0, chunks=3, work=4, worker={"gpu": 1})], horizon=4)
    raw["servers"].insert(1, {"name": "w1", "kind": "worker", "capacity": {**BIG, "gpu": 4}})
    out = _outcomes(raw, "fifo")["a"]
    assert out.schedule is not None and out.jct == 2
    assert out.schedule.workers.tolist() == [[2, 1], [1, 0]]


@pytest.mark.parametrize("policy", BASELINES)
def test_a_job_that_can_just_finish_in_the_last_slot_is_run_by_every_baseline(
    policy: str,
) -> None:
    """W = 6 at its N = 2 workers takes slots 0, 1, 2 = T - 1 exactly: it can finish, so
    no baseline may drop it as hopeless (W <= y (T - t), not <); it completes with jct 3."""
    raw = _trace({"gpu": 4}, [_job("a", 0, chunks=2, work=6, worker={"gpu": 1})], horizon=3)
    out = _outcomes(raw, policy)
    assert _workers(out["a"]) == {0: 2, 1: 2, 2: 2}
    assert out["a"].jct == 3 and out["a"].utility == pytest.approx(5.0)


def test_an_arrival_that_cannot_finish_is_dropped_before_its_slot_runs() -> None:
    """late needs 20 worker-slots at most 2 a slot: 10 slots, and T = 4. FIFO admits it
    and, first in line, places it on both GPUs; the simulator drops it at once (checked
    right after the plan) and re-plans the same slot, so b, behind it, runs in slot 0
    (jct 1) and late never runs a slot (admitted, no schedule, utility 0)."""
    gpu1 = {"gpu": 1}
    raw = _trace(
        {"gpu": 2},
        [
            _job("late", 0, chunks=2, work=20, worker=gpu1),
            _job("b", 0, chunks=2, work=2, worker=gpu1),
        ],
        horizon=4,
    )
    out = _outcomes(raw, "fifo")
    assert out["late"].admitted and out["late"].schedule is None
    assert out["late"].jct is None and out["late"].utility == 0.0
    assert _workers(out["b"]) == {0: 2} and out["b"].jct == 1


@pytest.mark.parametrize("policy", BASELINES)
def test_a_job_that_fits_on_no_server_is_rejected_by_every_baseline(policy: str) -> None:
    """A trace may hold one (SPEC 6: a rejection); it never reaches the policy, which
    would size it at 0 workers per slot (a PolicyError, or a division by 0 in RRH)."""
    raw = _trace(
        {"gpu": 4},
        [_job("a", 0, chunks=2, work=2, worker={"gpu": 1}),
         _job("huge", 0, chunks=1, work=1, worker={"gpu": 5})],
        horizon=4,
    )  # fmt: skip
    out = _outcomes(raw, policy)
    assert out["a"].admitted and out["a"].jct is not None
    assert not out["huge"].admitted and out["huge"].schedule is None
    assert out["huge"].utility is None
    assert out["huge"].reason is not None and "fits on any server" in out["huge"].reason
    assert out["a"].reason is None


def test_drf_equalises_dominant_shares_and_regrows_on_completion() -> None:
    raw = _trace(
        {"gpu": 4, "cpu": 15},
        [
            _job("a", 0, chunks=10, work=21, worker={"gpu": 1, "cpu": 1}),  # share 1/4 gpu
            _job("b", 0, chunks=10, work=9, worker={"cpu": 4}),  # share 4/15 cpu
        ],
        horizon=20,
    )
    out = _outcomes(raw, "drf")
    # a1 b1 a2 b2 a3 b3 (cpu 3 + 12 = 15 full): neither can grow; b completes at slot 2
    assert _workers(out["b"]) == {0: 3, 1: 3, 2: 3}
    # then a alone takes every GPU: 9 + 4 + 4 + 4 = 21
    assert _workers(out["a"]) == {0: 3, 1: 3, 2: 3, 3: 4, 4: 4, 5: 4}
    assert out["a"].jct == 6


def test_rrh_rejects_by_delay_cost_and_preempts_for_more_reward() -> None:
    gpu2 = {"gpu": 2}  # one job fills the cluster
    critical: dict[str, Any] = {"kind": "sigmoid", "decay": 5, "target": 5, "priority": 100}
    raw = _trace(
        {"gpu": 2},
        [
            _job("a", 0, chunks=1, work=5, worker=gpu2, utility=critical),
            # worth 1 whenever it ends, but delaying a by 5 slots costs a ~50: rejected
            _job("b", 1, 1, 5, gpu2, {"kind": "sigmoid", "decay": 0, "target": 1, "priority": 2}),
            # worth 500 if done in 3 slots; a loses ~50 when delayed: c preempts a
            _job("c", 2, 1, 3, gpu2, {**critical, "target": 3, "priority": 1000}),
        ],
        horizon=20,
    )
    out = _outcomes(raw, "rrh")
    assert not out["b"].admitted and out["b"].schedule is None and out["b"].utility is None
    assert out["b"].reason is not None and out["b"].reason.startswith("RRH: ")
    assert "not above the threshold" in out["b"].reason
    assert _workers(out["c"]) == {2: 1, 3: 1, 4: 1}
    assert out["c"].utility == pytest.approx(500.0)
    assert _workers(out["a"]) == {0: 1, 1: 1, 5: 1, 6: 1, 7: 1}  # paused 2-4
    assert out["a"].jct == 8


def test_a_dropped_job_gives_its_servers_back_to_the_others() -> None:
    """DRF splits the 4 GPUs 2 + 2 (equal dominant shares 2/4). After slots 0-2, b has
    20 - 6 = 14 worker-slots left, more than its N = 4 can do in the 3 slots left (12):
    it is dropped at slot 3, and its 2 GPUs must go to a, which then runs 4 + 4 and
    its last worker-slot: 6 + 4 + 4 + 1 = 15, done in slot 5 = T - 1 (jct 6). Had b kept
    its GPUs, a (7 left after slot 3 at 2 a slot) could not finish either."""
    gpu1 = {"gpu": 1}
    raw = _trace(
        {"gpu": 4},
        [
            _job("a", 0, chunks=4, work=15, worker=gpu1),
            _job("b", 0, chunks=4, work=20, worker=gpu1),
        ],
        horizon=6,
    )
    out = _outcomes(raw, "drf")
    assert _workers(out["b"]) == {0: 2, 1: 2, 2: 2}
    assert out["b"].admitted and out["b"].jct is None and out["b"].utility == 0.0
    assert _workers(out["a"]) == {0: 2, 1: 2, 2: 2, 3: 4, 4: 4, 5: 1}
    assert out["a"].jct == 6


def _one_ps_cpu(raw: dict[str, Any], cpu: int) -> dict[str, Any]:
    """``raw`` with ``cpu`` CPUs on its PS server: room for ``cpu`` PS of 1 CPU."""
    raw["servers"][1]["capacity"] = {**BIG, "cpu": cpu}
    return raw


def test_fifo_keeps_the_workers_of_a_start_whose_ps_did_not_fit() -> None:
    """One PS fits (1 CPU). a takes it with 1 GPU; b's 3 workers fit on the 3 GPUs left
    but its PS does not, so b waits with nothing held: when a completes (slot 1), b
    starts at slot 2 on 3 GPUs (jct 3). Had b's failed start kept its 3 GPUs, a's 1
    would be all that is ever free again."""
    gpu1 = {"gpu": 1}
    raw = _one_ps_cpu(
        _trace(
            {"gpu": 4},
            [
                _job("a", 0, chunks=1, work=2, worker=gpu1),
                _job("b", 0, chunks=3, work=3, worker=gpu1),
            ],
            horizon=8,
        ),
        cpu=1,
    )
    out = _outcomes(raw, "fifo")
    assert _workers(out["a"]) == {0: 1, 1: 1}
    assert _workers(out["b"]) == {2: 3} and out["b"].jct == 3


def test_drf_keeps_the_worker_of_a_growth_whose_ps_did_not_fit() -> None:
    """Two PS fit (2 CPUs). a needs a PS per worker (10 Gbps workers), b one PS for up to
    10. Filling: a 1 (its share 1/2, a PS of 2), b 1 (1/2); a's second worker needs a
    second PS: none is left, so a stops at 1 and that worker's GPU stays free; b grows
    to 3 (GPUs 1 + 3 = 4) and completes W = 3 in slot 0. From slot 1 a alone grows to 2
    (both PS): 1 + 2 + 2 = 5, done in slot 2."""
    raw = _one_ps_cpu(
        _trace(
            {"gpu": 4},
            [
                _job("a", 0, chunks=4, work=5, worker={"gpu": 1, "bandwidth": 10}),
                _job("b", 0, chunks=4, work=3, worker={"gpu": 1}),
            ],
            horizon=8,
        ),
        cpu=2,
    )
    out = _outcomes(raw, "drf")
    assert _workers(out["b"]) == {0: 3} and out["b"].jct == 1
    assert _workers(out["a"]) == {0: 1, 1: 2, 2: 2} and out["a"].jct == 3


def test_drf_counts_the_ps_a_job_holds_not_one_per_worker() -> None:
    """Two like jobs; one PS (1 of the PS server's 2 CPUs) serves up to 10 workers.
    Each one's first worker brings its PS: dominant share 1/2 (the PS CPUs) at once. A
    second worker adds no PS, so a's share stays max(2/4 GPUs, 1/2) = 1/2: tied with b,
    a (the earlier) gets it, and a third (3/4); b's second then finds no GPU. Were a's
    share y PS (2 PS: all the CPUs, share 1), b would get its second first (2 + 2)."""
    gpu1 = {"gpu": 1}
    raw = _one_ps_cpu(
        _trace(
            {"gpu": 4},
            [
                _job("a", 0, chunks=8, work=40, worker=gpu1),
                _job("b", 0, chunks=8, work=40, worker=gpu1),
            ],
            horizon=40,
        ),
        cpu=2,
    )
    out = _outcomes(raw, "drf")
    assert (_workers(out["a"])[0], _workers(out["b"])[0]) == (3, 1)


@pytest.mark.parametrize("policy", ["rrh", "rrh-np"])
def test_rrh_charges_no_delay_cost_when_the_jobs_exactly_fit(policy: str) -> None:
    """a and b each hold 1 of the 2 GPUs (dominant shares 1/2 + 1/2 = 1: no one waits),
    so b's admission costs nothing, though delaying a 3 slots would cost a its ~50."""
    gpu1 = {"gpu": 1}
    critical: dict[str, Any] = {"kind": "sigmoid", "decay": 5, "target": 5, "priority": 100}
    cheap: dict[str, Any] = {"kind": "sigmoid", "decay": 0, "target": 1, "priority": 2}
    raw = _trace(
        {"gpu": 2},
        [_job("a", 0, 1, 5, gpu1, critical), _job("b", 0, 1, 5, gpu1, cheap)],
        horizon=20,
    )
    out = _outcomes(raw, policy)
    assert out["b"].admitted and out["b"].utility == pytest.approx(1.0)
    assert _workers(out["a"]) == _workers(out["b"]) == {t: 1 for t in range(5)}


@pytest.mark.parametrize("policy", ["rrh", "rrh-np"])
def test_rrh_rounds_a_fractional_delay_up(policy: str) -> None:
    """At slot 1, a (both GPUs, share 1) has 6 worker-slots left: done at jct 4, worth
    ~100 up to jct 5 and ~0 from 6 (a step at 5.5). b (1 GPU, share 1/2, 3 slots) would
    delay a by ceil(1/2 * 3) = 2 slots, to jct 6: a cost of ~100 against b's 5, so b is
    rejected (rounded down, the delay of 1 would cost ~0 and admit it)."""
    step: dict[str, Any] = {"kind": "sigmoid", "decay": 50, "target": 5.5, "priority": 100}
    cheap: dict[str, Any] = {"kind": "sigmoid", "decay": 0, "target": 1, "priority": 10}
    raw = _trace(
        {"gpu": 2},
        [_job("a", 0, 2, 8, {"gpu": 1}, step), _job("b", 1, 1, 3, {"gpu": 1}, cheap)],
        horizon=20,
    )
    out = _outcomes(raw, policy)
    assert not out["b"].admitted and out["b"].schedule is None
    assert _workers(out["a"]) == {t: 2 for t in range(4)} and out["a"].jct == 4


def test_a_dominant_share_is_of_the_whole_clusters_capacity() -> None:
    """Two worker servers of 4 GPUs (8 in all), two PS servers of 2 CPUs (4 in all):
    a worker of 1 GPU is 1/8 of the GPUs, a PS of 1 CPU 1/4 of the PS servers' CPUs
    (their 10 Gbps of 2000 are less). 3 workers (1 PS) take 3/8; 1 worker, its PS 1/4."""
    raw = _trace({"gpu": 4}, [_job("a", 0, chunks=8, work=8, worker={"gpu": 1})], horizon=4)
    raw["servers"] = [
        {"name": "w0", "kind": "worker", "capacity": {**BIG, "gpu": 4}},
        {"name": "w1", "kind": "worker", "capacity": {**BIG, "gpu": 4}},
        {"name": "p0", "kind": "ps", "capacity": {**BIG, "cpu": 2}},
        {"name": "p1", "kind": "ps", "capacity": {**BIG, "cpu": 2}},
    ]
    sim = Simulator(trace_from_dict(raw))
    task = sim.tasks[0]
    assert task.worker_share == pytest.approx(1 / 8) and task.ps_share == pytest.approx(1 / 4)
    assert sim.share(task, 3) == pytest.approx(3 / 8)
    assert sim.share(task, 1) == pytest.approx(1 / 4)


def test_dorm_regrows_a_job_when_another_completes() -> None:
    """a and b split the 4 GPUs (the MILP's split is one of several); b, W = 2, is done
    within 2 slots; at the next event a alone is worth all 4 GPUs (utilisation, and
    its N and remaining work allow 4), so it must get them, not keep its old count."""
    gpu1 = {"gpu": 1}
    raw = _trace(
        {"gpu": 4},
        [_job("a", 0, chunks=4, work=20, worker=gpu1), _job("b", 0, chunks=4, work=2, worker=gpu1)],
        horizon=20,
    )
    out = _outcomes(raw, "dorm")
    assert out["b"].jct is not None and out["b"].jct <= 2
    a = _workers(out["a"])
    assert a[out["b"].jct] == 4  # the slot after b's last


@pytest.mark.parametrize("policy", BASELINES)
def test_every_baseline_spreads_a_job_over_several_servers(policy: str) -> None:
    """Two worker servers of 2 GPUs: a's 4 workers fit only across both; W = 8 in 2 slots."""
    raw = _trace({"gpu": 2}, [_job("a", 0, chunks=4, work=8, worker={"gpu": 1})], horizon=6)
    raw["servers"].insert(1, {"name": "w1", "kind": "worker", "capacity": {**BIG, "gpu": 2}})
    out = _outcomes(raw, policy)["a"]
    assert out.schedule is not None and out.schedule.workers.tolist() == [[2, 2], [2, 2]]


def test_dorm_tops_up_what_per_server_placement_leaves_free() -> None:
    """Servers of 4 and 5 GPUs (9 pooled). a and b take 3 GPUs a worker, so one each
    fits per server (3 + 3: 1 GPU left on w0, 2 on w1); c's workers take 2, and w1 has
    room for one. Whatever the pooled MILP gave c, the top-up must place that worker at
    once (nothing else fits: 1 GPU on w0 takes no worker of theirs)."""
    raw = _trace(
        {"gpu": 4},
        [
            _job("a", 0, chunks=2, work=9, worker={"gpu": 3}),
            _job("b", 0, chunks=2, work=6, worker={"gpu": 3}),
            _job("c", 0, chunks=2, work=12, worker={"gpu": 2}),
        ],
        horizon=12,
    )
    raw["servers"].insert(1, {"name": "w1", "kind": "worker", "capacity": {**BIG, "gpu": 5}})
    out = _outcomes(raw, "dorm")
    first = {j: o.schedule.workers[0].tolist() for j, o in out.items() if o.schedule}
    assert out["c"].schedule is not None and out["c"].schedule.start == 0
    assert sorted(first.values()) == [[0, 1], [0, 1], [1, 0]]  # c on w1 beside a or b


@pytest.mark.parametrize("policy", BASELINES)
def test_every_baseline_fills_the_ps_servers_exactly(policy: str) -> None:
    """The PS server has 1 CPU: room for exactly one PS, all a's 4 workers need (one
    serves 10): a runs all 4 from slot 0, W = 8 done in slot 1."""
    raw = _one_ps_cpu(
        _trace({"gpu": 4}, [_job("a", 0, chunks=4, work=8, worker={"gpu": 1})], horizon=6),
        cpu=1,
    )
    out = _outcomes(raw, policy)
    assert _workers(out["a"]) == {0: 4, 1: 4} and out["a"].jct == 2


@pytest.mark.parametrize("policy", ["rrh", "rrh-np"])
def test_rrh_rejects_a_gain_not_above_its_threshold(policy: str) -> None:
    """Alone on the cluster (no delay cost), a job worth 5e-13 at any completion time
    nets 5e-13, not above THRESHOLD = 1e-9: rejected, as OASiS rejects it."""
    tiny: dict[str, Any] = {"kind": "sigmoid", "priority": 1e-12, "decay": 0, "target": 1}
    raw = _trace({"gpu": 4}, [_job("a", 0, 2, 4, {"gpu": 1}, tiny)], horizon=6)
    out = _outcomes(raw, policy)["a"]
    assert not out.admitted and out.schedule is None and out.utility is None
    assert out.reason is not None and "not above the threshold 1e-09" in out.reason


@pytest.mark.parametrize("policy", ["rrh", "rrh-np"])
def test_rrh_starts_waiting_jobs_by_reward_density_when_servers_free(policy: str) -> None:
    """Each job fills both GPUs for one slot and is worth p / 2 whenever it ends (decay
    0), so delays cost nothing and all are admitted; densities are p / 2 per unit of
    share-time: x 50, z 25, y 5. x runs in slot 0; when it completes, the waiting z
    (denser, though it arrived after y) runs in slot 1, then y in slot 2."""
    gpu1 = {"gpu": 1}

    def worth(p: float) -> dict[str, Any]:
        return {"kind": "sigmoid", "priority": p, "decay": 0, "target": 1}

    raw = _trace(
        {"gpu": 2},
        [
            _job("x", 0, 2, 2, gpu1, worth(100)),
            _job("y", 0, 2, 2, gpu1, worth(10)),
            _job("z", 0, 2, 2, gpu1, worth(50)),
        ],
        horizon=6,
    )
    out = _outcomes(raw, policy)
    assert all(o.admitted for o in out.values())
    assert (_workers(out["x"]), _workers(out["z"]), _workers(out["y"])) == (
        {0: 2},
        {1: 2},
        {2: 2},
    )


def test_rrh_moves_a_running_job_whose_servers_a_denser_one_took() -> None:
    """w0 has 2 GPUs, w1 4. x runs 1 + 1 from slot 0. z (4 workers, worth 50 against
    x's 5, no delay cost at decay 0) arrives at slot 1 and ranks first: round-robin
    gives it 2 + 2, so x's w0 worker no longer fits; x is placed again on w1's 2 free
    GPUs rather than paused, and runs 2 a slot from slot 0 to 4 (W = 10, jct 5)."""

    def worth(p: float) -> dict[str, Any]:
        return {"kind": "sigmoid", "priority": p, "decay": 0, "target": 1}

    raw = _trace(
        {"gpu": 2},
        [
            _job("x", 0, 2, 10, {"gpu": 1}, worth(10)),
            _job("z", 1, 4, 4, {"gpu": 1}, worth(100)),
        ],
        horizon=10,
    )
    raw["servers"].insert(1, {"name": "w1", "kind": "worker", "capacity": {**BIG, "gpu": 4}})
    out = _outcomes(raw, "rrh")
    x, z = out["x"].schedule, out["z"].schedule
    assert z is not None and z.start == 1 and z.workers.tolist() == [[2, 2]]
    assert x is not None and x.workers.tolist()[:2] == [[1, 1], [0, 2]]
    assert _workers(out["x"]) == {t: 2 for t in range(5)} and out["x"].jct == 5


def test_rrh_net_reward_and_density_worked_by_hand() -> None:
    """RRH's formulas (rrh.py's docstring) on two arrivals at slot 0 on 2 GPUs, both
    worth f(d) = 10 / (1 + e^(d - 2)):
    - a: 2 workers (share 1), W = 5: RPT = ceil(5/2) = 3, gain f(3);
    - b: N = 2 but W = 1, so 1 worker (share 1/2), RPT 1, gain f(1);
    - shares sum to 1.5 > 1: a delays b by ceil(1 * 3) = 3 slots, costing f(1) - f(4);
      b delays a by ceil(1/2 * 1) = 1, costing f(3) - f(4);
    - density: net / (share * RPT): a's over 3, b's over 1/2."""
    worth: dict[str, Any] = {"kind": "sigmoid", "priority": 10, "decay": 1, "target": 2}
    raw = _trace(
        {"gpu": 2},
        [_job("a", 0, 2, 5, {"gpu": 1}, worth), _job("b", 0, 2, 1, {"gpu": 1}, worth)],
        horizon=10,
    )
    sim = Simulator(trace_from_dict(raw))
    a, b = sim.tasks
    net, density = _net_rewards(sim, [a, b], {0: 2, 1: 2})

    def f(d: int) -> float:
        return 10.0 / (1.0 + math.exp(d - 2))

    assert net[0] == pytest.approx(f(3) - (f(1) - f(4)), rel=1e-12)
    assert net[1] == pytest.approx(f(1) - (f(3) - f(4)), rel=1e-12)
    assert density[0] == pytest.approx(net[0] / 3, rel=1e-12)
    assert density[1] == pytest.approx(net[1] / 0.5, rel=1e-12)


@pytest.mark.parametrize("policy", ["rrh", "rrh-np"])
def test_rrh_takes_utilities_near_the_float_range_without_a_warning(policy: str) -> None:
    """Delay costs of jobs worth 1.7e308 summed past the float range: numpy warned on
    the replay's stderr (an audit; warnings are errors here). Such a cost is inf."""
    gpu2 = {"gpu": 2}  # one job fills the cluster: every arrival delays the others
    huge: dict[str, Any] = {"kind": "sigmoid", "decay": 5, "target": 5, "priority": 1.7e308}
    raw = _trace(
        {"gpu": 2},
        [_job("a", 0, 1, 4, gpu2, huge), _job("b", 0, 1, 4, gpu2, huge),
         _job("c", 1, 1, 4, gpu2, huge)],
        horizon=20,
    )  # fmt: skip
    out = _outcomes(raw, policy)
    assert out["a"].admitted and out["a"].utility is not None
    assert all(o.admitted or o.reason for o in out.values())


@pytest.mark.parametrize(("slack", "expected"), [(0.1, (2, 8)), (0.5, (3, 4)), (1.0, (4, 0))])
def test_dorm_maximises_utilisation_within_its_fairness_bound(
    monkeypatch: pytest.MonkeyPatch, slack: float, expected: tuple[int, int]
) -> None:
    """a uses 1/4 of the GPUs and 1/4 of the CPUs per worker, b 1/16 of the CPUs: DRF
    gives a 2 and b 8; utilisation alone would give a all 4 GPUs and all 16 CPUs; in
    between, fairness floors b at floor(8 (1 - slack)) and a takes the rest of the CPUs."""
    monkeypatch.setattr("pricing.baselines.dorm.FAIRNESS_SLACK", slack)
    raw = _trace(
        {"gpu": 4, "cpu": 16},
        [
            _job("a", 0, chunks=10, work=40, worker={"gpu": 1, "cpu": 4}),
            _job("b", 0, chunks=10, work=80, worker={"cpu": 1}),
        ],
        horizon=40,
    )
    out = _outcomes(raw, "dorm")
    first = tuple(_workers(out[j]).get(0, 0) for j in ("a", "b"))
    assert first == expected


def test_dorm_at_no_fairness_slack_gives_a_job_its_drf_workers_up_to_its_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """8 GPUs, 8 CPUs; a's worker takes a GPU and a CPU, b's a CPU, N_b = 3: equal
    shares 1/8 a worker, so DRF fills a1 b1 a2 b2 a3 b3 (b at its N), then a4 a5 (CPUs
    full): (5, 3). Utilisation alone prefers a's workers (two resources), but at slack 0
    the floors are DRF's exactly, so b keeps all 3, its cap, not 2."""
    monkeypatch.setattr("pricing.baselines.dorm.FAIRNESS_SLACK", 0.0)
    raw = _trace(
        {"gpu": 8, "cpu": 8},
        [
            _job("a", 0, chunks=10, work=80, worker={"gpu": 1, "cpu": 1}),
            _job("b", 0, chunks=3, work=30, worker={"cpu": 1}),
        ],
        horizon=40,
    )
    out = _outcomes(raw, "dorm")
    assert (_workers(out["a"])[0], _workers(out["b"])[0]) == (5, 3)


@pytest.mark.parametrize("fraction", [0.25, 1.0])
def test_dorm_resizes_at_most_its_adjustment_bound(
    monkeypatch: pytest.MonkeyPatch, fraction: float
) -> None:
    """a and b fill the 16 CPUs at 8 workers each; c arrives, and each of its workers
    also uses a GPU, so utilisation wants c at its N = 8. With one resize allowed
    (ceil(0.25 * 2)), a keeps 8 and b drops to its fairness floor 2 (DRF would give
    6, 5, 5); c gets the 6 left. With no bound both shrink and c gets 8."""
    monkeypatch.setattr("pricing.baselines.dorm.FAIRNESS_SLACK", 0.5)
    monkeypatch.setattr("pricing.baselines.dorm.ADJUST_FRACTION", fraction)
    cpu1 = {"cpu": 1}
    raw = _trace(
        {"gpu": 16, "cpu": 16},
        [
            _job("a", 0, chunks=8, work=200, worker=cpu1),
            _job("b", 0, chunks=8, work=200, worker=cpu1),
            _job("c", 1, chunks=8, work=200, worker={"cpu": 1, "gpu": 1}),
        ],
        horizon=40,
    )
    out = _outcomes(raw, "dorm")
    assert _workers(out["a"])[0] == _workers(out["b"])[0] == 8
    a, b, c = (_workers(out[j]).get(1, 0) for j in ("a", "b", "c"))
    if fraction < 1.0:
        assert (a, b, c) == (8, 2, 6)
    else:
        assert c == 8 and a + b == 8 and a < 8 and b < 8


# -- the simulator's own guards -------------------------------------------------------


def test_round_robin_takes_one_per_server_in_turn() -> None:
    cap = np.array([[2.0], [0.0], [3.0]])
    pool = Pool(cap)
    one = np.array([1.0])
    placed = pool.round_robin(one, 4)
    assert placed is not None and placed.tolist() == [2, 0, 2]
    assert pool.pointer == 0  # past w2, the last served
    assert pool.round_robin(one, 2) is None  # only 1 left: nothing taken
    again = pool.round_robin(one, 1)
    assert again is not None and again.tolist() == [0, 0, 1]
    pool.give(np.array([2, 0, 3]), one)
    assert pool.free.tolist() == cap.tolist()


def test_round_robin_resumes_after_the_last_server_used() -> None:
    pool = Pool(np.array([[5.0], [5.0], [5.0]]))
    one = np.array([1.0])
    first = pool.round_robin(one, 2)
    second = pool.round_robin(one, 2)
    assert first is not None and second is not None
    assert first.tolist() == [1, 1, 0] and second.tolist() == [1, 0, 1]


def test_round_robin_takes_every_unit_room_counts_despite_float_sums() -> None:
    """0.1 GPU units: room counts 3 in 0.3 and 7 in 0.7 (SPEC 5 rounds), while 3 * 0.1
    and 7 * 0.1 exceed them by one float ulp; the take must allow that slack, not refuse
    units room() said fit (a PolicyError, or a baseline denied a worker)."""
    pool = Pool(np.array([[0.3], [0.7]]))
    tenth = np.array([0.1])
    assert pool.room(tenth).tolist() == [3, 7]
    placed = pool.round_robin(tenth, 10)
    assert placed is not None and placed.tolist() == [3, 7]
    assert pool.round_robin(tenth, 1) is None


def _tiny() -> Any:
    return trace_from_dict(
        _trace({"gpu": 4}, [_job("a", 0, chunks=4, work=8, worker={"gpu": 1})], 5)
    )


def test_a_policy_must_decide_every_arrival() -> None:
    class Idle:
        def replan(self, sim: Simulator) -> None:
            pass

    with pytest.raises(PolicyError, match="neither admitted nor rejected"):
        simulate(_tiny(), Idle())


def test_a_policy_cannot_exceed_n_or_the_remaining_work() -> None:
    class Greedy:
        def replan(self, sim: Simulator) -> None:
            for task in sim.arrivals:
                sim.admit(task)
                sim.place(task, task.job.chunks + 1)

    with pytest.raises(PolicyError, match="workers outside"):
        simulate(_tiny(), Greedy())


def test_verify_catches_over_allocation() -> None:
    trace = trace_from_dict(
        _trace(
            {"gpu": 4},
            [_job(j, 0, chunks=4, work=4, worker={"gpu": 1}) for j in ("a", "b")],
            5,
        )
    )
    full = Schedule(0, np.array([[3]], dtype=np.int32), np.array([[1]], dtype=np.int32))
    outcomes = [Outcome(job, True, full, None, 0.0, 0.0) for job in trace.jobs]
    with pytest.raises(CapacityError):  # 3 + 3 GPUs on a 4-GPU server
        verify(trace, outcomes)


@pytest.mark.parametrize(
    ("workers", "ps", "start", "jct", "match"),
    [
        ([[2], [2]], [[1], [1]], 4, None, "outside slots"),  # slots 4-5, T = 5
        ([[4], [4]], [[1], [1]], 0, 3, "last slot"),  # ends in slot 1: jct 2
        ([[4], [4], [1]], [[1], [1], [1]], 0, 3, "worker-slots"),  # 9 > W = 8
        ([[4], [4]], [[1], [1]], 0, None, "worker-slots"),  # all of W done, yet no jct
        ([[4], [2]], [[1], [1]], 0, 2, "worker-slots"),  # a jct with 6 < W done
        ([[4], [4]], [[1], [0]], 0, 2, "z\\(y\\)"),
    ],
)
def test_verify_catches_each_broken_rule(
    workers: list[list[int]], ps: list[list[int]], start: int, jct: int | None, match: str
) -> None:
    """a: N = 4, W = 8, T = 5; each schedule breaks one shared rule (SPEC 1, 3)."""
    trace = _tiny()
    sched = Schedule(start, np.array(workers, dtype=np.int32), np.array(ps, dtype=np.int32))
    with pytest.raises(PolicyError, match=match):
        verify(trace, [Outcome(trace.jobs[0], True, sched, jct, 0.0, 0.0)])


def test_verify_catches_more_workers_than_n() -> None:
    trace = trace_from_dict(
        _trace({"gpu": 8}, [_job("a", 0, chunks=4, work=8, worker={"gpu": 1})], 5)
    )
    sched = Schedule(0, np.array([[5], [3]], dtype=np.int32), np.array([[1], [1]], dtype=np.int32))
    with pytest.raises(PolicyError, match="more than N = 4"):
        verify(trace, [Outcome(trace.jobs[0], True, sched, 2, 0.0, 0.0)])


# -- the command line -----------------------------------------------------------------


def test_policy_oasis_is_the_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = generate_trace(
        np.random.default_rng(4), n_jobs=10, n_worker_servers=3, n_ps_servers=3, horizon=20
    )
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    runs = []
    for extra in ([], ["--policy", "oasis"]):
        assert main(["replay", str(path), "--json", *extra]) == 0
        jobs = json.loads(capsys.readouterr().out)["jobs"]
        runs.append([{k: v for k, v in j.items() if k != "decision_ms"} for j in jobs])
    assert runs[0] == runs[1]


def test_baseline_table_and_unknown_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = generate_trace(
        np.random.default_rng(4), n_jobs=10, n_worker_servers=3, n_ps_servers=3, horizon=20
    )
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    assert main(["replay", str(path), "--policy", "drf"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["job", "arrival", "decision"]
    assert "total utility" in out and "unfinished by the horizon" in out
    with pytest.raises(SystemExit) as exc:
        main(["replay", str(path), "--policy", "lottery"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_rrh_without_preemption_never_pauses_or_moves_a_started_job() -> None:
    """``rrh-np``: once a job runs, it keeps the same servers in every slot until its
    last (which may run fewer workers); RRH itself pauses or moves some on these traces."""
    moved = 0
    for seed in (0, 1, 2):
        raw = generate_trace(
            np.random.default_rng(seed), n_jobs=30, n_worker_servers=5, n_ps_servers=5, horizon=40
        )
        trace = trace_from_dict(raw)
        for policy in ("rrh-np", "rrh"):
            for o in run(trace, policy):
                if o.schedule is None:
                    continue
                w, p = o.schedule.workers, o.schedule.ps
                steady = all(
                    np.array_equal(w[k], w[0]) and np.array_equal(p[k], p[0])
                    for k in range(len(w) - 1)
                )
                if policy == "rrh-np":
                    assert steady and w[-1].sum() > 0, o.job.id
                    assert (w[-1] <= w[0]).all() and (p[-1] <= p[0]).all(), o.job.id
                else:
                    moved += not steady
    assert moved > 0


@pytest.mark.parametrize("policy", BASELINES)
def test_utilities_near_the_float_range_say_no_numpy_warning(
    policy: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The replay audit: `oasis replay T --policy rrh` on the demo with priorities of
    1.7e308 printed "rrh.py:115: RuntimeWarning: overflow encountered in divide" on
    stderr (a job's net gain over its share of the cluster, below 1)."""
    raw = json.loads((Path(__file__).parent.parent / "config" / "demo-trace.json").read_text())
    for job in raw["jobs"]:
        job["utility"].update(priority=1.7e308, decay=0)
    out = _replay_json(tmp_path, raw, policy, capsys)  # a warning is an error here
    assert [j["admitted"] for j in out["jobs"]] == [True, True]
    assert capsys.readouterr().err == ""


def _dorm_milp(ps_capacity: dict[str, Any], jobs: list[dict[str, Any]]) -> list[int]:
    """Dorm's MILP (``pricing.baselines.dorm._solve``) at the first event of a trace of
    one worker server (16 CPUs) and one PS server of ``ps_capacity``: workers per job."""
    from pricing.baselines.dorm import _solve

    raw = _trace({"cpu": 16}, jobs, horizon=40)
    raw["servers"][1]["capacity"] = {**BIG, **ps_capacity}
    sim = Simulator(trace_from_dict(raw))
    next(sim.steps())  # the first slot: both arrive
    for task in sim.arrivals:
        sim.admit(task)
    y = _solve(sim, sim.active, {})
    return [y[t.order] for t in sim.tasks]


def test_dorms_milp_holds_the_workers_to_what_the_pooled_ps_capacity_serves() -> None:
    """Two jobs of 1-CPU workers, 16 worker CPUs, but one PS CPU in all: a PS (1 CPU)
    serves 10 workers, so the MILP's pooled PS row (0.1 CPU a worker) allows 10 workers
    in all, not the 16 the worker CPUs would."""
    jobs = [_job(j, 0, chunks=16, work=400, worker={"cpu": 1}) for j in ("a", "b")]
    y = _dorm_milp({"cpu": 1}, jobs)
    assert sum(y) == 10, y


def test_dorms_milp_counts_the_ps_it_uses_in_the_utilisation() -> None:
    """a's PS takes 5 of the PS server's 10 CPUs, b's 1: a worker of a uses more of the
    cluster (its share of a PS), so at equal worker demand the utilisation MILP gives a
    its N = 8 and b the 8 CPUs left."""
    a = _job("a", 0, chunks=8, work=400, worker={"cpu": 1})
    a["ps"] = {"cpu": 5, "bandwidth": 10}
    b = _job("b", 0, chunks=16, work=400, worker={"cpu": 1})
    assert _dorm_milp({"cpu": 10}, [a, b]) == [8, 8]


def test_dorms_milp_lets_a_job_that_ran_grow_to_its_cap_in_one_resize(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A resize's bound ``|y - y_prev| <= M delta`` has ``M`` at least the job's cap: a
    job that ran on 1 worker and is now alone grows to its N = 8 at once, not to 2.
    (No fairness floor here: DRF's 8 would floor it at 4, and an infeasible bound is
    dropped.)"""
    from pricing.baselines.dorm import _solve

    monkeypatch.setattr("pricing.baselines.dorm.FAIRNESS_SLACK", 1.0)

    raw = _trace({"cpu": 16}, [_job("a", 0, chunks=8, work=400, worker={"cpu": 1})], 40)
    sim = Simulator(trace_from_dict(raw))
    next(sim.steps())
    (task,) = sim.arrivals
    sim.admit(task)
    assert _solve(sim, [task], {task.order: 1}) == {task.order: 8}


def test_dorm_places_workers_best_fit() -> None:
    """Best fit: units go to the servers with the least room first, to limit
    fragmentation (rooms 3, 1, 2: two units take the 1 and then the 2)."""
    from pricing.baselines.dorm import _fill

    got = _fill(np.array([3, 1, 2], dtype=np.int64), 2)
    assert got.tolist() == [0, 1, 1]
    assert _fill(np.array([3, 1, 2], dtype=np.int64), 6).tolist() == [3, 1, 2]


def test_dorm_places_the_largest_workers_first() -> None:
    """Two servers of 4 GPUs; a's worker takes 3, b's 1, two of each (all 8 GPUs). a
    placed first gets one worker on each server and b the GPU left on each; b placed
    first took 2 GPUs of one server, which left a room for one worker only."""
    raw = _trace(
        {"gpu": 4},
        [_job("a", 0, chunks=2, work=40, worker={"gpu": 3}),
         _job("b", 0, chunks=2, work=40, worker={"gpu": 1})],
        horizon=40,
    )  # fmt: skip
    raw["servers"].insert(1, {**raw["servers"][0], "name": "w1"})
    out = _outcomes(raw, "dorm")
    assert (_workers(out["a"])[0], _workers(out["b"])[0]) == (2, 2)
