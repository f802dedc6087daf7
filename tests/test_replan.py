"""Re-planning in the ledger: failed servers, replaced schedules, early release, and a
rebuild (admit the current schedules in admission order, then block) that reproduces
the live ledger's floats exactly."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pricing.cluster import cluster_from_dict
from pricing.errors import CapacityError, LedgerError
from pricing.job import Job, job_from_dict
from pricing.ledger import Ledger
from pricing.prices import oracle_bounds
from pricing.replan import (
    Shifted,
    fail_server,
    fail_servers,
    first_holders,
    release_rest,
    remaining_job,
    replan_remaining,
)
from pricing.schedule import Schedule
from pricing.utility import Sigmoid

RES = ["gpu", "cpu", "bandwidth"]
CLUSTER = cluster_from_dict(
    RES,
    [
        {"name": "w0", "kind": "worker", "capacity": {"gpu": 4, "cpu": 16, "bandwidth": 10}},
        {"name": "w1", "kind": "worker", "capacity": {"gpu": 4, "cpu": 16, "bandwidth": 10}},
        {"name": "w2", "kind": "worker", "capacity": {"gpu": 2, "cpu": 8, "bandwidth": 10}},
        {"name": "p0", "kind": "ps", "capacity": {"cpu": 16, "bandwidth": 20}},
        {"name": "p1", "kind": "ps", "capacity": {"cpu": 16, "bandwidth": 20}},
    ],
)
T = 12


def make_job(job_id: str, chunks: int = 2, epochs: int = 4, decay: float = 0.1) -> Job:
    return job_from_dict(
        {"id": job_id, "arrival": 0, "epochs": epochs, "chunks": chunks, "minibatches": 10,
         "tau": 0.1, "grad_mb": 1, "worker": {"gpu": 1, "cpu": 2, "bandwidth": 1},
         "ps": {"cpu": 1, "bandwidth": 4},
         "utility": {"kind": "sigmoid", "priority": 40, "decay": decay, "target": 6}},
        CLUSTER, slot_seconds=3600.0, slots_available=lambda a: T - a,
    )  # fmt: skip


def admitted(jobs: list[Job]) -> Ledger:
    bounds = oracle_bounds(jobs, CLUSTER, T, {j.id: T for j in jobs})
    ledger = Ledger(CLUSTER, bounds, T)
    from pricing.admission import decide

    for job in jobs:
        assert decide(job, ledger, 0, T - 1).admitted
    return ledger


def rebuilt(live: Ledger, down: list[tuple[str, int, int]]) -> Ledger:
    """What the daemon does at start: admit every current schedule in order, block."""
    fresh = Ledger(CLUSTER, live.bounds, live.length, origin=live.origin)
    for job_id in live.job_ids():
        sched = live.schedule(job_id)
        if sched.slots and sched.workers.any():
            worker, ps = live.demands(job_id)
            fresh.admit(job_id, worker, ps, sched)
    for kind, index, from_slot in down:
        fresh.block(kind, index, from_slot)
    return fresh


def same_state(a: Ledger, b: Ledger) -> None:
    for sa, sb in ((a.worker_side, b.worker_side), (a.ps_side, b.ps_side)):
        assert np.array_equal(sa.used, sb.used)  # bit for bit
        assert np.array_equal(sa.price, sb.price)
        assert np.array_equal(sa.blocked, sb.blocked)
    assert np.array_equal(a.touched, b.touched)


def test_block_takes_capacity_and_refuses_held_servers() -> None:
    ledger = admitted([make_job("a")])
    sched = ledger.schedule("a")
    used_by = int(np.flatnonzero(sched.workers.sum(axis=0))[0])
    with pytest.raises(LedgerError, match="still holds"):
        ledger.block("worker", used_by, 0)
    free = next(i for i in range(3) if not sched.workers[:, i].any())
    ledger.block("worker", free, 3)
    side = ledger.worker_side
    assert np.array_equal(side.used[3:, free], np.broadcast_to(side.capacity[free], (T - 3, 3)))
    assert side.used[:3, free].sum() == 0
    assert np.allclose(side.price[3:, free], np.exp(ledger.bounds.log_u1))  # priced at U
    ledger.advance(5)  # new slots open blocked while the server is down
    assert ledger.worker_side.blocked[-1, free]
    ledger.unblock("worker", free, 8)
    assert not ledger.worker_side.blocked[8 - 5 :, free].any()
    assert ledger.worker_side.blocked[: 8 - 5, free].all()
    assert ledger.worker_side.used[8 - 5 :, free].sum() == 0


def test_a_refused_block_with_an_end_past_the_window_blocks_nothing_later() -> None:
    """A block refused because a job still holds the server changes nothing: not the
    slots the window opens later either (it noted the part past the window before it
    checked, and the next advance blocked the server under the job it refused for)."""
    ledger = admitted([make_job("a")])
    sched = ledger.schedule("a")
    used_by = int(np.flatnonzero(sched.workers.sum(axis=0))[0])
    with pytest.raises(LedgerError, match="still holds"):
        ledger.block("worker", used_by, 0, until=T + 5)
    assert ledger.worker_side.ahead == []
    ledger.advance(3)
    assert not ledger.worker_side.blocked[:, used_by].any()
    assert not ledger.worker_side.used[T - 3 :, used_by].any()


def test_replace_keeps_admission_order_and_refuses_overflow() -> None:
    jobs = [make_job("a"), make_job("b"), make_job("c")]
    ledger = admitted(jobs)
    original = ledger.schedule("b")
    shorter = original.before(original.start + 2)
    ledger.replace("b", shorter)
    assert ledger.job_ids() == ["a", "b", "c"]
    same_state(ledger, rebuilt(ledger, []))
    too_big = Schedule(0, np.full((1, 3), 50, np.int32), np.zeros((1, 2), np.int32))
    before = ledger.worker_side.used.copy()
    with pytest.raises(CapacityError):
        ledger.replace("b", too_big)
    assert np.array_equal(ledger.worker_side.used, before)
    assert ledger.schedule("b") is shorter


def test_release_rest_frees_later_slots_and_restores_prices() -> None:
    empty = admitted([make_job("x")])
    empty.release("x", 0)
    ledger = admitted([make_job("x")])
    end = ledger.schedule("x").end
    released = release_rest(ledger, "x", ledger.schedule("x").start + 1)
    assert released > 0
    assert np.array_equal(ledger.worker_side.price[end], empty.worker_side.price[end])
    assert release_rest(ledger, "nobody", 0) == 0


def test_failed_server_jobs_are_replaced_in_the_same_slots_when_room_allows() -> None:
    jobs = [make_job("a"), make_job("b")]
    ledger = admitted(jobs)
    by_id = {j.id: j for j in jobs}
    sched = ledger.schedule("a")
    victim = int(np.flatnonzero(sched.workers.sum(axis=0))[0])
    from_slot = sched.start + 1
    per_slot = sched.worker_counts().copy()
    out = fail_server(ledger, by_id, "worker", victim, from_slot, {}, {j: T - 1 for j in by_id})
    assert "a" in out.replaced and not out.stranded
    moved = ledger.schedule("a")
    assert np.array_equal(moved.worker_counts(), per_slot)  # same workers in the same slots
    assert not moved.after(from_slot).workers[:, victim].any()
    assert np.array_equal(moved.before(from_slot).workers, sched.before(from_slot).workers)
    same_state(ledger, rebuilt(ledger, [("worker", victim, from_slot)]))


def test_failed_server_without_room_elsewhere_replans_or_strands() -> None:
    # two PS servers; job "big" needs PS; fail both: the second failure strands it
    jobs = [make_job("big", chunks=4, epochs=8, decay=0.0)]
    ledger = admitted(jobs)
    by_id = {j.id: j for j in jobs}
    last = {"big": T - 1}
    sched = ledger.schedule("big")
    ps_used = [k for k in range(2) if sched.ps[:, k].any()]
    from_slot = sched.start + 1
    first = fail_server(ledger, by_id, "ps", ps_used[0], from_slot, {}, last)
    assert "big" in first.replaced or "big" in first.replanned
    other = 1 - ps_used[0]
    second = fail_server(ledger, by_id, "ps", other, from_slot, {}, last)
    assert second.stranded == ["big"]
    assert ledger.schedule("big").end < from_slot  # only its past is kept
    same_state(ledger, rebuilt(ledger, [("ps", ps_used[0], from_slot), ("ps", other, from_slot)]))


def _moved_alone(jobs: list[Job]) -> tuple[Ledger, int, int, int]:
    """``jobs`` admitted, then job ``a``'s first worker server failed alone from the
    slot after its start: the ledger after, that server, the worker server ``a`` was
    moved onto, and the slot the failure is from."""
    by_id = {j.id: j for j in jobs}
    last = {j: T - 1 for j in by_id}
    sched = admitted(jobs).schedule("a")
    first = int(np.flatnonzero(sched.workers.sum(axis=0))[0])
    from_slot = sched.start + 1
    ledger = admitted(jobs)
    fail_server(ledger, by_id, "worker", first, from_slot, {}, last)
    landed = ledger.schedule("a").after(from_slot).workers.sum(axis=0)
    onto = int(np.flatnonzero(landed * (np.arange(3) != first))[0])  # where it went
    return ledger, first, onto, from_slot


@pytest.mark.parametrize("chunks", [1, 2, 3])
def test_servers_failed_together_move_each_job_once_and_never_onto_each_other(
    chunks: int,
) -> None:
    """One at a time, a job on the first server is moved onto the second, then off it
    again (a rack's maintenance moved it from each server to the next); together, every
    job moves once, onto neither, in the same slots where room allows."""
    jobs = [make_job("a", chunks=chunks), make_job("b")]
    by_id = {j.id: j for j in jobs}
    last = {j: T - 1 for j in by_id}
    one_by_one, first, second, from_slot = _moved_alone(jobs)
    again = fail_server(one_by_one, by_id, "worker", second, from_slot, {}, last)
    assert "a" in again.moves()  # the churn: moved twice

    together = admitted(jobs)
    either = set(together.holding("worker", first, from_slot)) | set(
        together.holding("worker", second, from_slot)
    )
    assert together.holding("worker", [first, second], from_slot) == [
        j for j in together.job_ids() if j in either
    ]  # in admission order
    per_slot = together.schedule("a").worker_counts().copy()
    out = fail_servers(together, by_id, [("worker", first), ("worker", second)], from_slot,
                       {}, last)  # fmt: skip
    moves = out.moves()
    assert len(out.replaced) + len(out.replanned) + len(out.stranded) == len(moves)
    assert "a" in moves
    for job_id in together.job_ids():
        after = together.schedule(job_id).after(from_slot)
        assert not after.workers[:, [first, second]].any()  # on neither of them
    if moves["a"] == "replaced":  # the same workers in the same slots, on the third
        assert np.array_equal(together.schedule("a").worker_counts(), per_slot)
    down = [("worker", first, from_slot), ("worker", second, from_slot)]
    same_state(together, rebuilt(together, down))


def test_one_server_failed_as_a_set_is_the_same_failure() -> None:
    jobs = [make_job("a"), make_job("b", chunks=3)]
    by_id = {j.id: j for j in jobs}
    last = {j: T - 1 for j in by_id}
    sched = admitted(jobs).schedule("a")
    victim = int(np.flatnonzero(sched.workers.sum(axis=0))[0])
    alone, as_set = admitted(jobs), admitted(jobs)
    out1 = fail_server(alone, by_id, "worker", victim, sched.start + 1, {}, last)
    out2 = fail_servers(as_set, by_id, [("worker", victim)] * 2, sched.start + 1, {}, last)
    assert out1.moves() == out2.moves()
    same_state(alone, as_set)


def fill(ledger: Ledger, servers: list[int], first: int, slots: int) -> dict[str, Job]:
    """Fill the worker ``servers`` in ``first .. first + slots - 1`` with filler jobs."""
    filler = make_job("fill")
    for i in servers:
        workers = np.zeros((slots, 3), np.int32)
        workers[:, i] = int(CLUSTER.worker_capacity[i, 0])  # every GPU
        ledger.admit(f"fill{i}", filler.worker, filler.ps,
                     Schedule(first, workers, np.zeros((slots, 2), np.int32)))  # fmt: skip
    return {f"fill{i}": filler for i in servers}


def within_capacity(ledger: Ledger, jobs: dict[str, Job]) -> None:
    """Recompute every slot's use from the schedules: it fits every server (a failed one
    holds nothing), and the ledger's amounts are that use."""
    for kind, side in (("worker", ledger.worker_side), ("ps", ledger.ps_side)):
        use = np.zeros_like(side.used)
        for job_id in ledger.job_ids():
            sched = ledger.schedule(job_id)
            counts = sched.workers if kind == "worker" else sched.ps
            demand = jobs[job_id].worker if kind == "worker" else jobs[job_id].ps
            rows = slice(sched.start - ledger.origin, sched.start - ledger.origin + sched.slots)
            use[rows] += counts[:, :, None] * demand[None, None, :]
        capacity = side.capacity[None, :, :]
        assert (use <= capacity + 1e-9).all()
        assert not use[side.blocked].any()
        free = ~side.blocked
        assert np.allclose(use[free], side.used[free])


def test_worker_failure_with_full_cluster_replans_from_remaining_work() -> None:
    # the other worker servers are full in the job's remaining slots but free later:
    # the victim's workers cannot move in place, the remaining work can move later
    job = make_job("a", chunks=4, epochs=6, decay=0.0)
    ledger = admitted([job])
    sched = ledger.schedule("a")
    victim = int(np.flatnonzero(sched.workers.sum(axis=0))[0])
    from_slot = sched.start + 1
    others = [i for i in range(3) if i != victim]
    by_id = {"a": job, **fill(ledger, others, from_slot, 3)}
    remaining = sched.after(from_slot).work()
    out = fail_server(ledger, by_id, "worker", victim, from_slot, {"a": remaining},
                      {j: T - 1 for j in by_id})  # fmt: skip
    assert out.replaced == [] and out.stranded == [] and list(out.replanned) == ["a"]
    best = out.replanned["a"]
    assert best.schedule is not None and best.payoff is not None and best.payoff > 0
    moved = ledger.schedule("a")
    assert moved.after(from_slot).work() == remaining  # the remaining work, all of it
    assert np.array_equal(moved.before(from_slot).workers, sched.before(from_slot).workers)
    assert not moved.after(from_slot).workers[:, victim].any()
    assert not moved.after(from_slot).before(from_slot + 3).workers.any()  # full there
    assert moved.end > sched.end  # later than planned: the only way left
    within_capacity(ledger, by_id)
    same_state(ledger, rebuilt(ledger, [("worker", victim, from_slot)]))


def _others_full() -> tuple[Job, Ledger, Schedule, int, dict[str, Job], int]:
    """Job a admitted alone, then every worker server but the first a runs on (the
    victim) filled for the whole window: ``(a, ledger, a's schedule, victim, the jobs
    by id, the slot after a's first)``."""
    job = make_job("a", chunks=4, epochs=6, decay=0.0)
    ledger = admitted([job])
    sched = ledger.schedule("a")
    victim = int(np.flatnonzero(sched.workers.sum(axis=0))[0])
    by_id = {"a": job, **fill(ledger, [i for i in range(3) if i != victim], 0, T)}
    return job, ledger, sched, victim, by_id, sched.start + 1


def test_worker_failure_with_every_other_worker_full_strands_the_job() -> None:
    job, ledger, sched, victim, by_id, from_slot = _others_full()
    remaining = sched.after(from_slot).work()
    out = fail_server(ledger, by_id, "worker", victim, from_slot, {"a": remaining},
                      {j: T - 1 for j in by_id})  # fmt: skip
    assert out.stranded == ["a"]  # every other worker server is full: nowhere to go
    assert ledger.schedule("a").end < from_slot  # only its past is kept
    within_capacity(ledger, by_id)
    ledger2 = admitted([make_job("a", chunks=4, epochs=6, decay=0.0)])
    out2 = fail_server(ledger2, {"a": job}, "worker", victim, from_slot, {"a": remaining},
                       {"a": T - 1})  # fmt: skip
    assert "a" in out2.replaced  # the same failure on an empty cluster: moved in place


def test_a_failed_servers_job_with_no_work_left_is_not_replanned() -> None:
    """Every other worker server is full, so a's units cannot move in place; but its
    remaining work is 0 (done early): nothing to re-plan, it just loses those units."""
    _, ledger, _, victim, by_id, from_slot = _others_full()
    out = fail_server(ledger, by_id, "worker", victim, from_slot, {"a": 0},
                      {j: T - 1 for j in by_id})  # fmt: skip
    assert out.replaced == ["a"] and not out.replanned and not out.stranded
    assert not ledger.schedule("a").after(from_slot).workers[:, victim].any()
    within_capacity(ledger, by_id)


def test_first_holders_names_the_first_listed_server_a_job_is_on() -> None:
    """x runs 1 worker on w0 and on w1 and its PS on p0 in slots 2-3; y only on w2.
    Each holder is named by the first of the given servers it is on, in their order;
    a job on none of them (or only outside the slots asked) is not listed."""
    job = make_job("x")
    ledger = Ledger(CLUSTER, oracle_bounds([job], CLUSTER, T, {"x": T}), T)
    for job_id, workers, ps in (("x", [1, 1, 0], [1, 0]), ("y", [0, 0, 1], [0, 1])):
        rows = Schedule(2, np.array([workers] * 2, np.int32), np.array([ps] * 2, np.int32))
        ledger.admit(job_id, job.worker, job.ps, rows)
    assert first_holders(ledger, [("worker", 1), ("worker", 0)], 0) == {"x": ("worker", 1)}
    assert first_holders(ledger, [("ps", 0), ("worker", 0)], 0) == {"x": ("ps", 0)}
    assert first_holders(ledger, [("worker", 0), ("worker", 2)], 0) == {
        "x": ("worker", 0), "y": ("worker", 2)}  # fmt: skip
    assert first_holders(ledger, [("worker", 0)], 4) == {}
    assert first_holders(ledger, [("worker", 0)], 0, until=2) == {}


def test_replan_remaining_counts_completion_from_the_arrival() -> None:
    job = make_job("a")
    ledger = admitted([job])
    before = ledger.schedule("a")
    workers, ps = before.workers.copy(), before.ps.copy()
    used, price = ledger.worker_side.used.copy(), ledger.worker_side.price.copy()
    start = before.start
    best, whole = replan_remaining(ledger, job, 3, start + 2, T - 1)
    assert best.schedule is not None and best.schedule.work() >= 3
    assert whole.start == start and whole.before(start + 2).work() > 0
    jct = whole.end - job.arrival + 1
    assert best.utility == pytest.approx(float(job.utility.values(jct)))
    after = ledger.schedule("a")  # nothing in the ledger changed: the caller commits
    assert after.start == start
    assert np.array_equal(after.workers, workers) and np.array_equal(after.ps, ps)
    assert np.array_equal(ledger.worker_side.used, used)
    assert np.array_equal(ledger.worker_side.price, price)
    # a re-plan stays within its last slot: 3 worker-slots at N = 2 need two slots
    late, _ = replan_remaining(ledger, job, 3, start + 2, start + 3)
    assert late.schedule is not None and late.schedule.end <= start + 3
    none, past = replan_remaining(ledger, job, 3, start + 2, start + 2)
    assert none.schedule is None and past.end < start + 2
    shifted = remaining_job(job, 5, 3)
    assert isinstance(shifted.utility, Shifted) and shifted.work == 5
    assert float(shifted.utility.values(1)) == float(Sigmoid(40, 0.1, 6).values(4))
    # its logs too (explanations and bound estimates read them): log f(d + 3)
    d = np.arange(1, 8)
    assert np.array_equal(shifted.utility.log_values(d), Sigmoid(40, 0.1, 6).log_values(d + 3))
    with pytest.raises(LedgerError):
        remaining_job(job, 0, 3)


def random_instance(rng: np.random.Generator) -> tuple[Ledger, dict[str, Job]]:
    """A small random cluster (2-4 worker, 1-3 PS servers) and the jobs of 2-7 random
    ones it admitted (decided in order over ``0 .. T - 1``; ids not in that order)."""
    servers: list[dict[str, Any]] = [
        {"name": f"w{i}", "kind": "worker", "capacity": {
            "gpu": int(rng.integers(1, 5)), "cpu": int(rng.integers(4, 17)), "bandwidth": 10}}
        for i in range(int(rng.integers(2, 5)))
    ] + [
        {"name": f"p{i}", "kind": "ps", "capacity": {
            "cpu": int(rng.integers(2, 17)), "bandwidth": int(rng.integers(5, 21))}}
        for i in range(int(rng.integers(1, 4)))
    ]  # fmt: skip
    cluster = cluster_from_dict(RES, servers)
    jobs = [
        job_from_dict(
            {"id": f"j{name}", "arrival": 0, "epochs": int(rng.integers(1, 6)),
             "chunks": int(rng.integers(1, 4)), "minibatches": 10, "tau": 0.1, "grad_mb": 1,
             "worker": {"gpu": 1, "cpu": int(rng.integers(1, 4)), "bandwidth": 1},
             "ps": {"cpu": 1, "bandwidth": int(rng.integers(1, 5))},
             "utility": {"kind": "sigmoid", "priority": 40, "target": 6,
                         "decay": float(rng.choice([0.0, 0.1, 0.5]))}},
            cluster, slot_seconds=3600.0, slots_available=lambda a: T - a,
        )
        for name in rng.permutation(int(rng.integers(2, 8)))  # admission order is not sorted
    ]  # fmt: skip
    ledger = Ledger(cluster, oracle_bounds(jobs, cluster, T, {j.id: T for j in jobs}), T)
    from pricing.admission import decide

    for job in jobs:
        decide(job, ledger, 0, T - 1)
    return ledger, {j.id: j for j in jobs if j.id in ledger}


def on_any(sched: Schedule, servers: list[tuple[str, int]], from_slot: int, stop: int) -> bool:
    """Whether ``sched`` has units on any of ``servers`` in slots ``from_slot .. stop - 1``."""
    part = sched.before(stop).after(from_slot)
    return any((part.workers if k == "worker" else part.ps)[:, i].any() for k, i in servers)


def test_servers_failed_together_random_clusters_keep_the_ledger_exact() -> None:
    """Random small clusters, jobs and 1-3 servers (either kind, repeats, with an end or
    without): no unit is left on them in the blocked slots, a re-placed job keeps its
    counts per slot, each affected job is listed once, no capacity is exceeded, and a
    rebuild (admit the schedules in order, then block each server) is bit for bit the
    ledger. One server named (even twice) is exactly :func:`fail_server`."""
    seen: set[str] = set()
    for seed in range(60):
        rng = np.random.default_rng(seed)
        ledger, jobs = random_instance(rng)
        cluster = ledger.cluster
        every = [("worker", i) for i in range(cluster.worker_capacity.shape[0])]
        every += [("ps", i) for i in range(cluster.ps_capacity.shape[0])]
        servers = [every[int(i)] for i in rng.integers(0, len(every), int(rng.integers(1, 4)))]
        from_slot = int(rng.integers(1, T - 1))
        until = None if rng.random() < 0.5 else from_slot + int(rng.integers(1, 12))
        last = {j: int(rng.integers(from_slot, T)) for j in jobs}
        before = {j: ledger.schedule(j) for j in ledger.job_ids()}
        stop = T if until is None else min(until, T)

        holders = [j for j, s in before.items() if on_any(s, servers, from_slot, stop)]
        alone = None
        if len(set(servers)) == 1:
            alone = Ledger(cluster, ledger.bounds, T)
            for j, s in before.items():
                alone.admit(j, *ledger.demands(j), s)
        out = fail_servers(ledger, jobs, servers, from_slot, {}, last, until)
        where = f"seed {seed}: {servers} from {from_slot} until {until}"
        listed = [*out.replaced, *out.replanned, *out.stranded]
        assert sorted(listed) == sorted(holders) and len(set(listed)) == len(listed), where
        for how in (out.replaced, list(out.replanned), out.stranded):  # in admission order
            assert how == [j for j in holders if j in how], where
        seen.update(out.moves().values())
        for j, s in before.items():
            now = ledger.schedule(j)
            assert not on_any(now, servers, from_slot, stop), where
            if j not in holders:
                assert now is s, where  # untouched
                continue
            past = now.before(from_slot)
            assert past.start == s.start and np.array_equal(
                past.workers, s.before(from_slot).workers
            )
            if j in out.replaced:
                assert now.start == s.start and now.slots == s.slots, where
                assert np.array_equal(now.worker_counts(), s.worker_counts()), where
                assert np.array_equal(now.ps.sum(axis=1), s.ps.sum(axis=1)), where
            elif j in out.stranded:
                assert now.after(from_slot).work() == 0, where  # only its past
            else:
                assert now.after(from_slot).work() == s.after(from_slot).work(), where
        within_capacity(ledger, jobs)
        fresh = Ledger(cluster, ledger.bounds, T)
        for j in ledger.job_ids():
            if ledger.schedule(j).workers.any():
                fresh.admit(j, *ledger.demands(j), ledger.schedule(j))
        for kind, index in servers:
            fresh.block(kind, index, from_slot, until)
        same_state(ledger, fresh)
        if alone is not None:
            kind, index = servers[0]
            one = fail_server(alone, jobs, kind, index, from_slot, {}, last, until)
            assert (one.replaced, list(one.replanned), one.stranded) == (
                out.replaced, list(out.replanned), out.stranded), where  # fmt: skip
            same_state(alone, ledger)
    assert seen == {"replaced", "replanned", "stranded"}  # every branch was taken


def test_servers_failed_together_copy_each_schedule_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The failed servers' units come off a job in one copy of its schedule, not one a
    server: a cordon of 1,000 of 5,000 servers copied a job of 20 slots 1,000 times
    (0.2 s a job on the decision thread)."""
    from pricing import replan

    servers = [{"name": f"w{i}", "kind": "worker", "capacity": {"gpu": 1, "cpu": 16,
                "bandwidth": 10}} for i in range(40)]  # fmt: skip
    servers.append({"name": "p0", "kind": "ps", "capacity": {"cpu": 16, "bandwidth": 20}})
    cluster = cluster_from_dict(RES, servers)
    job = job_from_dict(
        {"id": "a", "arrival": 0, "epochs": 4, "chunks": 8, "minibatches": 10, "tau": 0.1,
         "grad_mb": 1, "worker": {"gpu": 1, "cpu": 2, "bandwidth": 1},
         "ps": {"cpu": 1, "bandwidth": 1},
         "utility": {"kind": "sigmoid", "priority": 40, "decay": 0.0, "target": 6}},
        cluster, slot_seconds=3600.0, slots_available=lambda a: T - a,
    )  # fmt: skip
    ledger = Ledger(cluster, oracle_bounds([job], cluster, T, {"a": T}), T)
    from pricing.admission import decide

    assert decide(job, ledger, 0, T - 1).admitted
    sched = ledger.schedule("a")
    used = [int(i) for i in np.flatnonzero(sched.workers.any(axis=0))]
    down = [("worker", i) for i in range(40) if i not in used][: 30 - len(used)]
    down += [("worker", i) for i in used]
    made = []

    class Counted(Schedule):
        def __init__(self, *args: object) -> None:
            made.append(1)
            super().__init__(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(replan, "Schedule", Counted)
    out = fail_servers(ledger, {"a": job}, down, sched.start + 1, {}, {"a": T - 1})
    assert out.moves() == {"a": "replaced"}
    assert len(made) <= 2  # without the failed units, then re-placed


def test_a_failed_servers_jobs_go_onto_no_suspect_server() -> None:
    """A server still up but suspected to be failing too (its agent silent past two
    beats: the rest of a rack going dark) takes none of a failed server's jobs; one at
    a time, the job went onto it and moved again when it failed. The suspect's own jobs
    stay, and the ledger is exact after (a rebuild gives it bit for bit)."""
    jobs = [make_job("a"), make_job("b")]
    by_id = {j.id: j for j in jobs}
    last = {j: T - 1 for j in by_id}
    _, first, suspect, from_slot = _moved_alone(jobs)

    ledger = admitted(jobs)
    kept = {j: ledger.schedule(j).after(from_slot).workers[:, suspect].copy() for j in by_id}
    out = fail_servers(ledger, by_id, [("worker", first)], from_slot, {}, last,
                       avoid=[("worker", suspect), ("worker", first)])  # fmt: skip
    assert "a" in out.moves() and not out.stranded
    for job_id in ledger.job_ids():
        after = ledger.schedule(job_id).after(from_slot)
        assert not after.workers[:, first].any()
        assert (after.workers[:, suspect] <= kept[job_id][: after.slots]).all()  # none new
    within_capacity(ledger, by_id)
    same_state(ledger, rebuilt(ledger, [("worker", first, from_slot)]))


def test_a_job_with_room_only_on_a_suspect_goes_there_rather_than_stranded() -> None:
    """Avoiding suspects never strands a job: with every other server full, it is moved
    as if none were avoided (the failure the same as without ``avoid``)."""
    job = make_job("a", chunks=4, epochs=6, decay=0.0)
    ledger = admitted([job])
    sched = ledger.schedule("a")
    victim = int(np.flatnonzero(sched.workers.sum(axis=0))[0])
    suspect, full = (i for i in range(3) if i != victim)
    by_id = {"a": job, **fill(ledger, [full], 0, T)}
    twin = admitted([job])
    fill(twin, [full], 0, T)
    last = {j: T - 1 for j in by_id}
    from_slot = sched.start + 1
    out = fail_servers(ledger, by_id, [("worker", victim)], from_slot, {}, last,
                       avoid=[("worker", suspect)])  # fmt: skip
    plain = fail_servers(twin, by_id, [("worker", victim)], from_slot, {}, last)
    assert out.moves() == plain.moves() and not out.stranded
    assert ledger.schedule("a").after(from_slot).workers[:, suspect].any()
    same_state(ledger, twin)


def test_avoiding_is_only_within_deferred_and_leaves_the_amounts_exact() -> None:
    ledger = admitted([make_job("a"), make_job("b")])
    before = ledger.worker_side.used.copy(), ledger.worker_side.price.copy()
    with pytest.raises(LedgerError, match="deferred"), ledger.avoiding({"worker": [0]}, 2):
        pass
    with ledger.deferred(), ledger.avoiding({"worker": [0, 1]}, 2):
        side = ledger.worker_side
        assert np.array_equal(side.used[2:, 0], np.broadcast_to(side.capacity[0], (T - 2, 3)))
        assert not side.blocked.any()  # full, not blocked: jobs may keep their units
    assert np.array_equal(ledger.worker_side.used, before[0])
    assert np.array_equal(ledger.worker_side.price, before[1])


def test_servers_failed_with_random_suspects_keep_the_ledger_exact() -> None:
    """Random clusters, a failed server and some suspects: every holder moved once, no
    unit left on the failed server, every capacity kept, and a rebuild bit for bit the
    ledger (the suspects' amounts rebuilt from the schedules)."""
    for seed in range(40):
        rng = np.random.default_rng(1000 + seed)
        ledger, jobs = random_instance(rng)
        cluster = ledger.cluster
        every = [("worker", i) for i in range(cluster.worker_capacity.shape[0])]
        every += [("ps", i) for i in range(cluster.ps_capacity.shape[0])]
        picks = [every[int(i)] for i in rng.permutation(len(every))]
        servers, avoid = picks[:1], picks[1 : 1 + int(rng.integers(1, len(picks)))]
        from_slot = int(rng.integers(1, T - 1))
        last = {j: int(rng.integers(from_slot, T)) for j in jobs}
        holders = [j for j in ledger.job_ids() if on_any(ledger.schedule(j), servers, from_slot, T)]
        out = fail_servers(ledger, jobs, servers, from_slot, {}, last, avoid=avoid)
        assert sorted(out.moves()) == sorted(holders), seed
        for j in ledger.job_ids():
            assert not on_any(ledger.schedule(j), servers, from_slot, T), seed
        within_capacity(ledger, jobs)
        fresh = Ledger(cluster, ledger.bounds, T)
        for j in ledger.job_ids():
            if ledger.schedule(j).workers.any():
                fresh.admit(j, *ledger.demands(j), ledger.schedule(j))
        for kind, index in servers:
            fresh.block(kind, index, from_slot)
        same_state(ledger, fresh)
