"""Rejection explanations: the price drivers are the costliest parts of the schedule."""

from __future__ import annotations

import numpy as np

from pricing import Ledger, decide, trace_from_dict
from pricing.explain import explain_rejection, price_drivers
from pricing.job import Job
from pricing.trace import Trace
from pricing.workload import generate_trace


def naive_parts(best, job, ledger):
    """Every (resource, server, run of slots) part, by plain loops over every cell."""
    sched = best.schedule
    lo = ledger.index(sched.start)
    out = []
    for counts, side, demand, names in (
        (sched.workers, ledger.worker_side, job.worker, ledger.cluster.worker_names),
        (sched.ps, ledger.ps_side, job.ps, ledger.cluster.ps_names),
    ):
        for srv in range(counts.shape[1]):
            for r in range(len(demand)):
                run = []
                for k in range(sched.slots + 1):
                    c = (
                        counts[k, srv] * side.price[lo + k, srv, r] * demand[r]
                        if k < sched.slots
                        else 0.0
                    )
                    if c > 0:
                        run.append((k, c))
                    elif run:
                        out.append((ledger.cluster.resources[r], names[srv], run[0][0], run[-1][0],
                                    sum(x for _, x in run)))  # fmt: skip
                        run = []
    return sorted(out, key=lambda p: -p[4])


def test_drivers_are_the_costliest_parts_and_the_reason_names_them() -> None:
    raw = generate_trace(
        np.random.default_rng(7), n_jobs=60, n_worker_servers=4, n_ps_servers=4, horizon=40
    )
    # steep explicit prices, so some jobs are priced out rather than not fitting
    high = dict.fromkeys(["gpu", "cpu", "mem", "disk", "bandwidth"], 50.0)
    raw["pricing"] = {"U1": high, "U2": high, "L1": 0.05, "L2": 0.05}
    trace = trace_from_dict(raw)
    ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)
    checked = 0
    for job in trace.jobs:
        d = decide(job, ledger, job.arrival, trace.horizon - 1)
        best = d.best
        if d.admitted or best.schedule is None:
            continue
        drivers = price_drivers(best, job, ledger, top=3)
        expected = naive_parts(best, job, ledger)[:3]
        got = [(p.resource, p.server, p.first_slot - best.schedule.start,
                p.last_slot - best.schedule.start, p.cost) for p in drivers]  # fmt: skip
        assert [g[:4] for g in got] == [e[:4] for e in expected]
        assert np.allclose([g[4] for g in got], [e[4] for e in expected], rtol=1e-12)
        cluster = trace.cluster
        for p in drivers:  # the highest unit price over the run, as the reason says
            worker = p.server in cluster.worker_names
            side = ledger.worker_side if worker else ledger.ps_side
            names = cluster.worker_names if worker else cluster.ps_names
            h, r = names.index(p.server), cluster.resources.index(p.resource)
            lo, hi = ledger.index(p.first_slot), ledger.index(p.last_slot) + 1
            assert p.price == side.price[lo:hi, h, r].max()
        reason = explain_rejection(best, job, ledger, job.arrival, trace.horizon - 1, drivers)
        assert reason.startswith("priced out") and drivers[0].server in reason
        checked += 1
    assert checked >= 3


def dense_scarcest(job, ledger, lo, hi):
    """The scarcest resource and the worker-slots that fit, from every resource's free
    amounts at once (as the explanation first computed them)."""
    from pricing.job import room

    free_w = ledger.worker_side.capacity[None] - ledger.worker_side.used[lo:hi]
    worst, least = "", None
    for r, name in enumerate(ledger.cluster.resources):
        if job.worker[r] <= 0:
            continue
        units = int(room(free_w[:, :, r : r + 1], job.worker[r : r + 1]).sum())
        if least is None or units < least:
            least, worst = units, name
    fits = room(free_w, job.worker).sum(axis=1)  # N caps a slot's workers on all servers
    return worst, least, int(fits.clip(max=job.chunks).sum()), int(fits.sum())


def test_the_scarcest_resource_is_found_one_resource_at_a_time() -> None:
    from pricing.explain import _scarcest

    raw = generate_trace(
        np.random.default_rng(11), n_jobs=80, n_worker_servers=3, n_ps_servers=3, horizon=30
    )
    raw["pricing"] = {"bounds": "oracle"}
    trace = trace_from_dict(raw)
    ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)
    rng = np.random.default_rng(0)
    for job in trace.jobs:
        decide(job, ledger, job.arrival, trace.horizon - 1)  # admits what pays
        lo = int(rng.integers(0, trace.horizon))
        hi = int(rng.integers(lo + 1, trace.horizon + 1))
        assert _scarcest(job, ledger, lo, hi) == dense_scarcest(job, ledger, lo, hi)


def _one_job_worth(priority: float) -> dict[str, object]:
    """One job of W = 1 worker-slot costing exactly 1 at flat prices 0.25 (gpu and
    bandwidth of its worker, cpu and bandwidth of its PS), worth ``priority / 2``."""
    return {
        "version": 1, "horizon": 4, "slot_seconds": 3600,
        "resources": ["gpu", "cpu", "bandwidth"],
        "servers": [
            {"name": "w0", "kind": "worker", "capacity": {"gpu": 2, "cpu": 8, "bandwidth": 10}},
            {"name": "p0", "kind": "ps", "capacity": {"cpu": 4, "bandwidth": 10}},
        ],
        "pricing": {"U1": dict.fromkeys(["gpu", "cpu", "bandwidth"], 0.25),
                    "U2": dict.fromkeys(["cpu", "bandwidth"], 0.25), "L1": 0.25, "L2": 0.25},
        "jobs": [{
            "id": "j1", "arrival": 0, "epochs": 1, "chunks": 1, "minibatches": 1, "tau": 0.5,
            "grad_mb": 0.001, "worker": {"gpu": 1, "bandwidth": 1},
            "ps": {"cpu": 1, "bandwidth": 1},
            "utility": {"kind": "sigmoid", "priority": priority, "decay": 0, "target": 1},
        }],
    }  # fmt: skip


def test_a_payoff_under_the_threshold_is_said_to_be_under_it_not_under_0() -> None:
    """A payoff in (0, 1e-9] is rejected too (SPEC 5); "5e-10 <= 0" was untrue."""
    for priority, says in ((2.000000001, "payoff 5e-10 <= 1e-09, the admission threshold"),
                           (1.5, "payoff -0.25 <= 0;")):  # fmt: skip
        trace = trace_from_dict(_one_job_worth(priority))
        ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)
        (job,) = trace.jobs
        d = decide(job, ledger, 0, trace.horizon - 1)
        assert not d.admitted
        reason = explain_rejection(d.best, job, ledger, 0, trace.horizon - 1)
        assert says in reason
        # one slot is said as one ("in 1 slots" and "slots 0..0" read as a slip)
        assert "(completion in 1 slot, " in reason and " on w0 in slot 0 (" in reason


def _deadline_job_w0_out(deadline: int) -> tuple[Trace, Ledger, Job]:
    """The one job of ``_one_job_worth(2.0)`` worth 1000 if it completes by ``deadline``
    (a slot count, no half-life), with w0 out of service in the slots before it: the
    trace, its ledger and the job."""
    raw = _one_job_worth(2.0)
    jobs = raw["jobs"]
    assert isinstance(jobs, list)
    jobs[0]["utility"] = {"kind": "deadline", "value": 1000.0, "deadline": deadline}
    trace = trace_from_dict(raw)
    ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)
    ledger.block("worker", 0, 0, deadline)
    (job,) = trace.jobs
    return trace, ledger, job


def test_a_job_worth_nothing_by_its_best_end_hears_why_it_cannot_end_in_time() -> None:
    """A deadline without a half-life, its slots up to it taken: the best schedule ends
    after it (utility 0), and "priced out" with that schedule's prices explained
    nothing (the audit's `fill3`). The reason now says what keeps it from its deadline;
    a job whose deadline passed while it waited is told so."""
    from pricing.explain import explain

    trace, ledger, job = _deadline_job_w0_out(2)  # w0 out in slots 0 and 1: not in time
    d = decide(job, ledger, 0, trace.horizon - 1)
    assert not d.admitted and d.best.utility == 0.0 and d.best.completion_slot == 2
    reason, drivers = explain(d.best, job, ledger, 0, trace.horizon - 1)
    assert reason.startswith(
        "cannot finish by slot 1, after which it is worth nothing: cannot fit: it needs 1 "
        "worker-slots in slots 0..1, and only 0 worker-slots are free there"
    ), reason
    assert reason.endswith("out of service in those slots: w0") and drivers == []

    waited = explain(d.best, job, ledger, 2, trace.horizon - 1, arrival=0)
    assert waited == ("too late: it is worth nothing after slot 1", [])

    ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)  # nothing taken: admitted
    assert decide(job, ledger, 0, trace.horizon - 1).admitted


def test_a_utility_that_underflows_is_not_said_to_be_worth_nothing() -> None:
    """The diff review: a sigmoid whose value underflows to 0 (finite in logs, so the
    worth check takes it) was told "too late: it is worth nothing after slot -1" at
    its arrival. It is priced out as any job whose utility rounds to 0."""
    from pricing.explain import explain

    raw = _one_job_worth(2.0)
    jobs = raw["jobs"]
    assert isinstance(jobs, list)
    jobs[0]["utility"] = {"kind": "sigmoid", "priority": 1000, "decay": 1, "target": -2000}
    trace = trace_from_dict(raw)
    ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)
    (job,) = trace.jobs
    d = decide(job, ledger, 0, trace.horizon - 1)
    assert not d.admitted and d.best.utility == 0.0
    reason, _ = explain(d.best, job, ledger, 0, trace.horizon - 1)
    assert reason.startswith("priced out: the best schedule (completion in "), reason


def test_a_job_short_of_slots_is_not_told_its_parameter_servers_do_not_fit() -> None:
    """N caps a job's workers in a slot on all servers together (SPEC constraint 3),
    not on each server. The count of worker-slots that fit capped each server's at N,
    so a job of N = 4 and W = 9 with two free slots on two roomy servers counted 16
    and was told "its parameter servers do not fit" (the audit's pending `bw`): 4 a
    slot over the two slots left is 8, and the workers are what fall short."""
    from pricing.explain import explain

    raw = _one_job_worth(2.0)
    raw["horizon"] = 3
    raw["servers"] = [
        {"name": "w0", "kind": "worker", "capacity": {"gpu": 8, "cpu": 64, "bandwidth": 100}},
        {"name": "w1", "kind": "worker", "capacity": {"gpu": 8, "cpu": 64, "bandwidth": 100}},
        {"name": "p0", "kind": "ps", "capacity": {"cpu": 64, "bandwidth": 100}},
    ]
    jobs = raw["jobs"]
    assert isinstance(jobs, list)
    first = jobs[0]
    assert isinstance(first, dict)
    # W = 16 in one slot: every GPU of slot 0; then W = 9 at most 4 a slot in slots 0..2
    jobs[:] = [
        {**first, "id": "fill", "chunks": 16, "tau": 1.0, "grad_mb": 1e-6,
         "utility": {"kind": "deadline", "value": 1e6, "deadline": 1}},
        {**first, "id": "short", "chunks": 4, "minibatches": 1, "tau": 2.2, "grad_mb": 1e-6,
         "utility": {"kind": "deadline", "value": 1e6, "deadline": 3}},
    ]  # fmt: skip
    trace = trace_from_dict(raw)
    ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)
    fill, short = trace.jobs
    assert decide(fill, ledger, 0, 0).admitted and short.work == 9
    d = decide(short, ledger, 0, trace.horizon - 1)
    assert not d.admitted
    reason, _ = explain(d.best, short, ledger, 0, trace.horizon - 1)
    assert "parameter servers do not fit in" not in reason, reason
    assert "it needs 9 worker-slots in slots 0..2, and only 8 worker-slots are free" in reason


def test_free_room_split_across_servers_is_said_to_be_split() -> None:
    """w0 has a GPU free but no CPU, w1 CPU but no GPU: no worker fits, though each
    resource alone has two workers' worth. Before, the reason read "only 0 worker-slots
    are free ... the scarcest resource is 'gpu' (2 workers' worth free)" (the operator
    audit); now it says that room is not all where the other resources are."""
    from pricing.explain import _cannot_fit

    raw = _one_job_worth(100.0)
    raw["servers"] = [
        {"name": "w0", "kind": "worker", "capacity": {"gpu": 2, "cpu": 8, "bandwidth": 10}},
        {"name": "w1", "kind": "worker", "capacity": {"gpu": 2, "cpu": 8, "bandwidth": 10}},
        {"name": "p0", "kind": "ps", "capacity": {"cpu": 4, "bandwidth": 10}},
    ]
    raw["jobs"][0]["worker"] = {"gpu": 1, "cpu": 4, "bandwidth": 1}  # type: ignore[index]
    trace = trace_from_dict(raw)
    ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)
    (job,) = trace.jobs
    gpu, cpu = trace.cluster.resources.index("gpu"), trace.cluster.resources.index("cpu")
    ledger.worker_side.used[:, 0, cpu] = 8.0  # w0: its GPUs free, no CPU
    ledger.worker_side.used[:, 1, gpu] = 2.0  # w1: its CPU free, no GPU
    said = _cannot_fit(job, ledger, 0, 0)
    assert "only 0 worker-slots are free" in said
    assert "the scarcest resource is 'gpu' (2 workers' worth free, not all of it where" in said
    ledger.worker_side.used[:, 1, gpu] = 1.5  # w1: half a GPU, so no room for one worker
    ledger.worker_side.used[:, 0, gpu] = 2.0  # nowhere a GPU: the scarcest, as before
    said = _cannot_fit(job, ledger, 0, 0)
    assert "the scarcest resource is 'gpu' (0 workers' worth free), or its" in said


def test_a_job_that_needs_one_slot_more_than_remain_cannot_finish() -> None:
    """``cannot_finish`` rounds the slots a job needs up: W = 9 worker-slots at most 8
    a slot take 2 slots, so with 1 left it cannot finish, and with 2 it can."""
    from pricing.explain import cannot_finish
    from pricing.job import max_workers_per_slot
    from tests.test_replan import CLUSTER, make_job

    job = make_job("j", chunks=2)
    per_slot = max_workers_per_slot(job, CLUSTER)
    need = -(-job.work // per_slot)
    assert job.work % per_slot  # not a whole number of slots
    reason = cannot_finish(job, CLUSTER, need - 1)
    assert reason is not None and f"needs at least {need} slots" in reason
    assert cannot_finish(job, CLUSTER, need) is None


def test_workers_that_exactly_fit_leave_the_parameter_servers_to_blame() -> None:
    """With exactly as many worker-slots free as the job needs (here 1 of 1) and no room
    for its parameter server, the reason blames the parameter servers; read as "only 1
    worker-slots are free" for the 1 it needs, it contradicted itself (a boundary no test
    held: ``fit > work`` in place of ``fit >= work`` passed every test)."""
    from pricing.explain import _cannot_fit

    trace = trace_from_dict(_one_job_worth(100.0))
    ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)
    (job,) = trace.jobs
    cpu = trace.cluster.resources.index("cpu")
    ledger.ps_side.used[:, 0, cpu] = 4.0  # p0: no CPU left for the PS
    ledger.worker_side.used[:, 0, 0] = 1.0  # w0: one GPU left, for the one worker
    assert job.work == 1
    said = _cannot_fit(job, ledger, 0, 0)
    assert said.startswith("cannot fit: its parameter servers do not fit in slot 0 "), said
    assert "(1 worker-slots are free there, capped at 1 per slot, for the 1 it needs)" in said


def test_a_job_with_no_slot_left_is_told_it_arrives_too_late() -> None:
    """No slot left (0, or fewer: it arrives at or after the horizon's end) is said as
    such, not as work that needs more slots than the 0 that remain."""
    from pricing.explain import cannot_finish
    from tests.test_replan import CLUSTER, make_job

    job = make_job("j", chunks=2)
    for slots in (0, -1):
        assert cannot_finish(job, CLUSTER, slots) == (
            "cannot finish before the horizon: it arrives at or after the horizon's end"
        )
    assert cannot_finish(job, CLUSTER, 1000) is None


def test_drivers_on_servers_after_the_first_name_those_servers() -> None:
    """The schedule uses only w1 and p1 (w0 and p0 out of service): the drivers are
    its parts there, as the plain loops find them, not none and not w0's or p0's."""
    raw = _one_job_worth(1.5)  # costs 1, worth 0.75: priced out
    raw["servers"] = [
        {"name": "w0", "kind": "worker", "capacity": {"gpu": 2, "cpu": 8, "bandwidth": 10}},
        {"name": "w1", "kind": "worker", "capacity": {"gpu": 2, "cpu": 8, "bandwidth": 10}},
        {"name": "p0", "kind": "ps", "capacity": {"cpu": 4, "bandwidth": 10}},
        {"name": "p1", "kind": "ps", "capacity": {"cpu": 4, "bandwidth": 10}},
    ]
    trace = trace_from_dict(raw)
    ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)
    ledger.block("worker", 0, 0, trace.horizon)
    ledger.block("ps", 0, 0, trace.horizon)
    (job,) = trace.jobs
    d = decide(job, ledger, 0, trace.horizon - 1)
    assert not d.admitted and d.best.schedule is not None
    drivers = price_drivers(d.best, job, ledger, top=4)
    expected = naive_parts(d.best, job, ledger)
    assert len(expected) == 4  # gpu and bandwidth of the worker, cpu and bandwidth of the PS
    start = d.best.schedule.start
    got = [(p.resource, p.server, p.first_slot - start, p.last_slot - start) for p in drivers]
    assert sorted(got) == sorted(e[:4] for e in expected)
    assert {p.server for p in drivers} == {"w1", "p1"}
    assert [p.cost for p in drivers] == [0.25] * 4  # flat unit prices of 0.25, one unit each
    reason = explain_rejection(d.best, job, ledger, 0, trace.horizon - 1, drivers)
    assert " on w1 in slot " in reason and " on p1 in slot " in reason


def test_a_server_out_in_some_of_the_slots_is_named_and_many_are_counted() -> None:
    """A server out of service in any slot of the window is named, not only one out in
    all of them; past ten names the rest are counted."""
    from pricing.explain import _out_of_service

    raw = _one_job_worth(100.0)
    raw["servers"] = [
        {"name": f"w{i}", "kind": "worker", "capacity": {"gpu": 2, "cpu": 8, "bandwidth": 10}}
        for i in range(12)
    ] + [{"name": "p0", "kind": "ps", "capacity": {"cpu": 4, "bandwidth": 10}}]
    trace = trace_from_dict(raw)
    ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)
    ledger.block("worker", 3, 0, 1)  # w3 out in slot 0 only
    assert _out_of_service(ledger, 0, 2) == "; out of service in those slots: w3"
    assert _out_of_service(ledger, 1, 2) == ""
    ledger.block("worker", list(range(12)), 1, 2)  # every worker server out in slot 1
    ledger.block("ps", 0, 1, 2)
    names = ", ".join(f"w{i}" for i in range(10))
    assert _out_of_service(ledger, 1, 2) == f"; out of service in those slots: {names} and 3 more"


def test_a_job_worth_something_only_in_its_first_slot_is_told_why_not_there() -> None:
    """Worth something only if it completes in its arrival slot (a deadline of 1), and
    no worker fits there: the reason is what keeps it from that slot, not "too late"."""
    from pricing.explain import explain

    trace, ledger, job = _deadline_job_w0_out(1)  # w0 out in slot 0
    d = decide(job, ledger, 0, trace.horizon - 1)
    assert not d.admitted and d.best.utility == 0.0
    reason, drivers = explain(d.best, job, ledger, 0, trace.horizon - 1)
    assert reason.startswith("cannot finish by slot 0, after which it is worth nothing: "), reason
    assert reason.endswith("out of service in those slots: w0") and drivers == []


def test_a_payoff_of_exactly_0_is_said_to_be_at_most_0() -> None:
    trace = trace_from_dict(_one_job_worth(2.0))  # costs 1, worth 1
    ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)
    (job,) = trace.jobs
    d = decide(job, ledger, 0, trace.horizon - 1)
    assert not d.admitted and d.best.payoff == 0.0
    reason = explain_rejection(d.best, job, ledger, 0, trace.horizon - 1)
    assert "costs 1, payoff 0 <= 0;" in reason, reason
