"""Property tests of the ledger and online admission (SPEC 4-5) over random traces.

Hypothesis draws small traces (1-3 worker servers, 1-2 PS servers, up to 6 slots and 6
jobs, oracle or explicit bounds) and the properties are checked against amounts and
prices recomputed here from the admitted schedules and SPEC 4's formula.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

import pricing
from pricing.prices import price

RESOURCES = ("gpu", "cpu", "bandwidth")
R = len(RESOURCES)

SETTINGS = settings(
    deadline=None,
    max_examples=100,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def tenths(lo: int, hi: int) -> st.SearchStrategy[float]:
    """Multiples of 0.1 in [lo/10, hi/10]: exact multiples of demands are common."""
    return st.integers(lo, hi).map(lambda x: x / 10)


@st.composite
def demands(draw: st.DrawFn, bandwidth: float) -> dict[str, float]:
    out = {r: draw(tenths(1, 30)) for r in RESOURCES[:-1] if draw(st.booleans())}
    out["bandwidth"] = bandwidth
    return out


@st.composite
def jobs(draw: st.DrawFn, index: int, arrival: int) -> dict[str, Any]:
    b = draw(tenths(1, 20))
    return {
        "id": f"j{index}",
        "arrival": arrival,
        "epochs": draw(st.integers(1, 3)),
        "chunks": draw(st.integers(1, 4)),
        "minibatches": draw(st.integers(1, 3)),
        "tau": draw(st.sampled_from([0.5, 1.0, 1.5, 0.1, 0.25])),
        "grad_mb": draw(st.sampled_from([1.0, 50.0, 500.0])),
        "worker": draw(demands(b)),
        "ps": draw(demands(b * draw(st.sampled_from([1.0, 1.5, 2.0, 3.0])))),
        "utility": {
            "kind": "sigmoid",
            "priority": draw(st.integers(1, 100)),
            "decay": draw(st.sampled_from([0.0, 0.1, 0.5, 1.0, 3.0])),
            "target": draw(st.integers(1, 6)),
        },
    }


@st.composite
def raw_traces(draw: st.DrawFn) -> dict[str, Any]:
    horizon = draw(st.integers(1, 8))
    servers = []
    for kind, count in (("worker", draw(st.integers(1, 3))), ("ps", draw(st.integers(1, 2)))):
        for i in range(count):
            cap = {r: draw(tenths(10, 50)) for r in RESOURCES}
            servers.append({"name": f"{kind}{i}", "kind": kind, "capacity": cap})
    arrivals = sorted(draw(st.lists(st.integers(0, horizon - 1), min_size=2, max_size=8)))
    job_list = [draw(jobs(i, a)) for i, a in enumerate(arrivals)]
    if draw(st.booleans()):
        low1, low2 = (
            draw(st.sampled_from([0.01, 0.1, 1.0, 3.0])),
            draw(st.sampled_from([0.01, 0.1, 1.0])),
        )
        pricing_spec: dict[str, Any] = {
            "U1": {r: low1 * draw(st.sampled_from([1, 10, 1000])) for r in RESOURCES},
            "U2": {r: low2 * draw(st.sampled_from([1, 10, 1000])) for r in RESOURCES},
            "L1": low1,
            "L2": low2,
        }
    else:
        pricing_spec = {"bounds": "oracle"}
    return {
        "version": 1,
        "horizon": horizon,
        "slot_seconds": 3600,
        "resources": list(RESOURCES),
        "servers": servers,
        "pricing": pricing_spec,
        "jobs": job_list,
    }


def valid_trace(raw: dict[str, Any]) -> pricing.Trace | None:
    """The trace without the jobs it rejects (too big, too long); None if none is left."""
    while raw["jobs"]:
        try:
            return pricing.trace_from_dict(raw)
        except pricing.SpecError as err:
            bad = {p.field.split(".")[0] for p in err.problems}
            assert all(f.startswith("jobs[") for f in bad), err
            raw = {**raw, "jobs": [j for i, j in enumerate(raw["jobs"]) if f"jobs[{i}]" not in bad]}
    return None


traces = raw_traces().map(valid_trace).filter(lambda t: t is not None)


def snapshot(ledger: pricing.Ledger) -> list[NDArray[Any]]:
    return [
        ledger.worker_side.used.copy(),
        ledger.worker_side.price.copy(),
        ledger.ps_side.used.copy(),
        ledger.ps_side.price.copy(),
        ledger.touched.copy(),
    ]


def same(a: list[NDArray[Any]], b: list[NDArray[Any]]) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def spec_prices(ledger: pricing.Ledger) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """SPEC 4 directly: L * (U / L) ** (used / c) for both sides (capacities are > 0)."""
    out = []
    b = ledger.bounds
    for side, log_l, log_u in (
        (ledger.worker_side, b.log_l1, b.log_u1),
        (ledger.ps_side, b.log_l2, b.log_u2),
    ):
        low, high = math.exp(log_l), np.exp(log_u)
        out.append(low * (high / low) ** (side.used / side.capacity[None]))
    return out[0], out[1]


def run(
    trace: pricing.Trace, ledger: pricing.Ledger | None = None
) -> tuple[pricing.Ledger, list[pricing.Decision]]:
    ledger = ledger or pricing.Ledger(trace.cluster, trace.bounds, trace.horizon)
    decisions = [pricing.decide(j, ledger, j.arrival, trace.horizon - 1) for j in trace.jobs]
    return ledger, decisions


def build(
    trace: pricing.Trace,
    parts: list[tuple[pricing.Job, pricing.Schedule]],
    length: int,
    origin: int = 0,
) -> pricing.Ledger:
    """A fresh ledger holding ``parts`` admitted in order (empty parts skipped)."""
    ledger = pricing.Ledger(trace.cluster, trace.bounds, length, origin)
    for job, sched in parts:
        if sched.slots and sched.workers.any():
            ledger.admit(job.id, job.worker, job.ps, sched)
    return ledger


# -- (a) capacity and bookkeeping ----------------------------------------------------------


@SETTINGS
@given(traces)
def test_decisions_keep_amounts_within_capacity_and_equal_to_the_schedules(trace):
    ledger = pricing.Ledger(trace.cluster, trace.bounds, trace.horizon)
    cap_w, cap_p = trace.cluster.worker_capacity, trace.cluster.ps_capacity
    want_w = np.zeros_like(ledger.worker_side.used)
    want_p = np.zeros_like(ledger.ps_side.used)
    admitted = []
    for job in trace.jobs:
        before = snapshot(ledger)
        d = pricing.decide(job, ledger, job.arrival, trace.horizon - 1)
        assert d.admitted == (d.best.payoff is not None and d.best.payoff > 1e-9)
        if not d.admitted:
            assert same(before, snapshot(ledger)), "a rejected job changed the ledger"
            continue
        admitted.append(job.id)
        sched = d.best.schedule
        assert sched is not None and sched.start == job.arrival
        rows = slice(sched.start, sched.start + sched.slots)
        want_w[rows] += sched.workers[:, :, None] * job.worker
        want_p[rows] += sched.ps[:, :, None] * job.ps
        # (b, second half) admitting never lowers a price
        assert (ledger.worker_side.price >= before[1]).all()
        assert (ledger.ps_side.price >= before[3]).all()
    assert ledger.job_ids() == admitted
    event(f"{len(trace.jobs) - len(admitted) > 0} rejections, {len(admitted) > 1} admissions")
    assert (ledger.worker_side.used <= cap_w[None] + 1e-7).all()
    assert (ledger.ps_side.used <= cap_p[None] + 1e-7).all()
    assert np.allclose(ledger.worker_side.used, want_w, rtol=1e-12, atol=1e-12)
    assert np.allclose(ledger.ps_side.used, want_p, rtol=1e-12, atol=1e-12)
    assert np.array_equal(ledger.touched, want_w.any(axis=(1, 2)) | want_p.any(axis=(1, 2)))
    pw, pp = spec_prices(ledger)
    assert np.allclose(ledger.worker_side.price, pw, rtol=1e-12, atol=0)
    assert np.allclose(ledger.ps_side.price, pp, rtol=1e-12, atol=0)


# -- (b) prices rise with use --------------------------------------------------------------


@SETTINGS
@given(
    log_l=st.floats(-20, 5),
    spread=st.floats(1e-3, 30),
    capacity=st.floats(0.1, 1000),
    frac=st.floats(0, 1),
    step=st.floats(1e-6, 1),
)
def test_price_is_strictly_increasing_in_use(log_l, spread, capacity, frac, step):
    lo = frac * (1.0 - step)
    hi = lo + step
    log_u = np.array([log_l + spread, log_l])  # the second resource is flat (U = L)
    cap = np.array([[capacity, capacity]])
    p_lo = price(log_l, log_u, np.array([[lo * capacity] * 2]), cap)
    p_hi = price(log_l, log_u, np.array([[hi * capacity] * 2]), cap)
    assert p_hi[0, 0] > p_lo[0, 0]
    assert p_hi[0, 1] == p_lo[0, 1]
    assert math.isclose(p_lo[0, 1], math.exp(log_l), rel_tol=1e-12)
    ends = price(log_l, log_u, np.array([[0.0, 0.0], [capacity, capacity]]), cap)
    assert math.isclose(ends[0, 0], math.exp(log_l), rel_tol=1e-12)
    assert math.isclose(ends[1, 0], math.exp(log_l + spread), rel_tol=1e-12)


# -- (c) release ---------------------------------------------------------------------------


@SETTINGS
@given(traces)
def test_release_of_a_fresh_admission_restores_the_ledger_exactly(trace):
    ledger = pricing.Ledger(trace.cluster, trace.bounds, trace.horizon)
    for job in trace.jobs:
        before = snapshot(ledger)
        d = pricing.decide(job, ledger, job.arrival, trace.horizon - 1)
        if not d.admitted:
            continue
        sched = d.best.schedule
        assert sched is not None
        back = ledger.release(job.id, sched.start)
        assert np.array_equal(back.workers, sched.workers) and np.array_equal(back.ps, sched.ps)
        assert job.id not in ledger
        assert same(before, snapshot(ledger)), f"release of {job.id} left traces"
        ledger.admit(job.id, job.worker, job.ps, sched)  # carry on with the job in


@SETTINGS
@given(traces, st.data())
def test_release_matches_a_ledger_that_never_held_the_released_part(trace, data):
    ledger, decisions = run(trace)
    held = [(d.job, d.best.schedule) for d in decisions if d.best.schedule and d.admitted]
    if not held:
        return
    long_ones = [k for k, (_, sch) in enumerate(held) if sch.slots >= 2]
    i = data.draw(st.sampled_from(long_ones or list(range(len(held)))), label="released job")
    job, sched = held[i]
    end = sched.start + sched.slots
    if sched.slots >= 2 and data.draw(st.booleans(), label="from a middle slot"):
        cut = data.draw(st.integers(sched.start + 1, end - 1), label="from slot")
        event("partial release")
    else:
        cut = data.draw(st.sampled_from([sched.start, end]), label="from slot")
    back = ledger.release(job.id, cut)
    assert np.array_equal(back.workers, sched.workers[cut - sched.start :])
    kept = sched.before(cut)
    parts = [(j, s if k != i else kept) for k, (j, s) in enumerate(held)]
    fresh = build(trace, parts, trace.horizon)
    assert same(snapshot(fresh), snapshot(ledger)), f"release of {job.id} from slot {cut}"
    if kept.workers.any():
        assert np.array_equal(ledger.schedule(job.id).workers, kept.workers)
    else:
        assert job.id not in ledger


# -- (d) determinism -----------------------------------------------------------------------


@SETTINGS
@given(raw_traces())
def test_replay_is_deterministic(raw):
    first, second = valid_trace(raw), valid_trace(raw)
    if first is None or second is None:
        assert first is None and second is None
        return
    (l1, d1), (l2, d2) = run(first), run(second)
    for a, b in zip(d1, d2, strict=True):
        assert a.admitted == b.admitted
        assert a.best.payoff == b.best.payoff and a.best.cost == b.best.cost
        assert a.best.jct == b.best.jct
        if a.best.schedule is not None:
            assert b.best.schedule is not None
            assert np.array_equal(a.best.schedule.workers, b.best.schedule.workers)
            assert np.array_equal(a.best.schedule.ps, b.best.schedule.ps)
    assert same(snapshot(l1), snapshot(l2))


# -- (e) moving the window -----------------------------------------------------------------


@SETTINGS
@given(traces, st.data())
def test_advance_keeps_staying_slots_and_opens_empty_ones(trace, data):
    ledger, decisions = run(trace)
    before = snapshot(ledger)
    length = ledger.length
    shift = data.draw(st.integers(0, length + 1), label="shift")
    ledger.advance(shift)
    after = snapshot(ledger)
    keep = max(length - shift, 0)
    for old, new in zip(before, after, strict=True):
        assert np.array_equal(new[:keep], old[shift : shift + keep])
    b = trace.bounds
    assert (after[0][keep:] == 0).all() and (after[2][keep:] == 0).all()
    assert np.allclose(after[1][keep:], math.exp(b.log_l1), rtol=1e-14, atol=0)
    assert np.allclose(after[3][keep:], math.exp(b.log_l2), rtol=1e-14, atol=0)
    assert not after[4][keep:].any()
    assert ledger.origin == shift and ledger.index(shift) == 0
    if shift > 0:
        try:
            ledger.index(shift - 1)
        except pricing.LedgerError:
            pass
        else:
            raise AssertionError("a slot before the window was accepted")
    held = [(d.job, d.best.schedule) for d in decisions if d.best.schedule and d.admitted]
    alive = [j.id for j, s in held if s.end >= shift]
    assert ledger.job_ids() == alive
    # a job decided in the moved window sees what a fresh window holding the same tails shows
    fresh = build(trace, [(j, s.after(shift)) for j, s in held], length, shift)
    assert same(snapshot(fresh), after)
    job = data.draw(st.sampled_from(trace.jobs), label="probe job")
    first = shift + data.draw(st.integers(0, length - 1), label="arrival in window")
    got = pricing.best_schedule(job, ledger, first, shift + length - 1)
    want = pricing.best_schedule(job, fresh, first, shift + length - 1)
    assert got.payoff == want.payoff
    event(f"probe payoff {'none' if got.payoff is None else got.payoff > 0}")


# -- (f) the ledger against a model kept here ------------------------------------------------


def _model_cluster() -> pricing.Cluster:
    """Two worker servers with a GPU, one without; PS servers without any GPU (a resource
    one side lacks), one of them also without CPU."""
    caps = [("worker", {"gpu": 4, "cpu": 8, "bandwidth": 10}),
            ("worker", {"gpu": 2, "cpu": 16, "bandwidth": 10}),
            ("worker", {"cpu": 8, "bandwidth": 10}),
            ("ps", {"cpu": 6, "bandwidth": 10}),
            ("ps", {"bandwidth": 8})]  # fmt: skip
    servers = [{"name": f"s{i}", "kind": k, "capacity": c} for i, (k, c) in enumerate(caps)]
    return pricing.cluster_from_dict(list(RESOURCES), servers)


def _model_bounds(change: str = "") -> pricing.PriceBounds:
    """Explicit bounds, each side and each resource its own (a per-resource floor on PS);
    ``change`` names the one bound to take otherwise (``L1``, ``L2``, ``U1``, ``U2``)."""
    return pricing.PriceBounds(
        log_u1=np.log([50.0, 5.0, 2.0] if change != "U1" else [50.0, 9.0, 2.0]),
        log_u2=np.log([0.5, 7.0, 3.0] if change != "U2" else [0.5, 7.0, 30.0]),
        log_l1=math.log(0.01 if change != "L1" else 0.001),
        log_l2=np.log([0.5, 0.02, 0.1] if change != "L2" else [0.5, 0.2, 0.01]),
        eta1=1.0,
        eta2=1.0,
    )


class _Model:
    """What the ledger should hold, kept in plain Python: each job's demands and the
    counts it holds per absolute slot, in admission order, and each server's down
    intervals ``[first, until)`` (``until`` None: no end)."""

    def __init__(self, cluster: pricing.Cluster, bounds: pricing.PriceBounds, length: int):
        self.cluster, self.bounds, self.length, self.origin = cluster, bounds, length, 0
        self.jobs: dict[str, tuple[NDArray[Any], NDArray[Any], dict[int, tuple[Any, Any]]]] = {}
        self.down: dict[tuple[str, int], list[list[Any]]] = {}

    def caps(self, kind: str) -> NDArray[np.float64]:
        c = self.cluster
        return c.worker_capacity if kind == "worker" else c.ps_capacity

    def is_down(self, kind: str, index: int, slot: int) -> bool:
        return any(
            f <= slot and (u is None or slot < u) for f, u in self.down.get((kind, index), [])
        )

    def job_amounts(self, jobs: dict[str, Any] | None = None) -> dict[str, NDArray[Any]]:
        """Per kind, ``(length, n, R)``: the sum over the jobs of counts times demand."""
        out = {k: np.zeros((self.length, *self.caps(k).shape)) for k in ("worker", "ps")}
        for worker, ps, rows in (self.jobs if jobs is None else jobs).values():
            for slot, (w, p) in rows.items():
                t = slot - self.origin
                if 0 <= t < self.length:
                    out["worker"][t] += w[:, None] * worker
                    out["ps"][t] += p[:, None] * ps
        return out

    def amounts(self) -> dict[str, NDArray[Any]]:
        """Job amounts, with a down server's cells at its capacity."""
        out = self.job_amounts()
        for kind in ("worker", "ps"):
            for h in range(self.caps(kind).shape[0]):
                for t in range(self.length):
                    if self.is_down(kind, h, self.origin + t):
                        out[kind][t, h] = self.caps(kind)[h]
        return out

    def fits(self, jobs: dict[str, Any]) -> bool:
        """No cell over its capacity and no unit on a down server."""
        amounts = self.job_amounts(jobs)
        for kind in ("worker", "ps"):
            cap = self.caps(kind)
            if (amounts[kind] > cap[None] + 1e-7 + 2e-9 * cap[None]).any():
                return False
        for _, _, rows in jobs.values():
            for slot, (w, p) in rows.items():
                for kind, counts in (("worker", w), ("ps", p)):
                    if any(counts[h] and self.is_down(kind, h, slot) for h in range(counts.size)):
                        return False
        return True

    def check(self, ledger: pricing.Ledger) -> None:
        assert ledger.origin == self.origin
        assert ledger.job_ids() == list(self.jobs)
        for job_id, (_, _, rows) in self.jobs.items():
            sched = ledger.schedule(job_id)
            held = {
                sched.start + i: (sched.workers[i], sched.ps[i])
                for i in range(sched.slots)
                if sched.workers[i].any() or sched.ps[i].any()
            }
            assert held.keys() == rows.keys(), job_id
            for slot, (w, p) in rows.items():
                assert np.array_equal(held[slot][0], w) and np.array_equal(held[slot][1], p)
        amounts = self.amounts()
        b = self.bounds
        touched = np.zeros(self.length, np.bool_)
        for kind, side, log_l, log_u in (("worker", ledger.worker_side, b.log_l1, b.log_u1),
                                         ("ps", ledger.ps_side, b.log_l2, b.log_u2)):  # fmt: skip
            want = amounts[kind]
            cap = self.caps(kind)
            assert np.allclose(side.used, want, rtol=1e-12, atol=1e-12), kind
            blocked = [[self.is_down(kind, h, self.origin + t) for h in range(cap.shape[0])]
                       for t in range(self.length)]  # fmt: skip
            assert np.array_equal(
                side.blocked, np.array(blocked, np.bool_).reshape(side.blocked.shape)
            )
            # SPEC 4 per side and resource, a resource the server lacks at U
            low, high = np.exp(np.broadcast_to(log_l, log_u.shape)), np.exp(log_u)
            with np.errstate(divide="ignore", invalid="ignore"):
                share = np.where(cap[None] > 0, want / cap[None], 1.0)
            spec = low * (high / low) ** share
            assert np.allclose(side.price, spec, rtol=1e-9, atol=0), kind
            # the cheapest unit of a demand per slot: the least price of each resource
            demand = np.array([1.0, 2.0, 0.5])
            cheapest = (spec.min(axis=1) * demand).sum(axis=1)
            got = side.min_unit_price(demand, 0, self.length)
            assert np.allclose(got, cheapest, rtol=1e-9, atol=0), kind
            touched |= want.any(axis=(1, 2))
        assert np.array_equal(ledger.touched, touched)


def _random_schedule(
    rng: np.random.Generator, model: _Model, start: int, slots: int
) -> pricing.Schedule:
    h, k = model.caps("worker").shape[0], model.caps("ps").shape[0]
    workers = rng.integers(0, 3, (slots, h)) * (rng.random((slots, h)) < 0.5)
    ps = rng.integers(0, 2, (slots, k)) * (rng.random((slots, k)) < 0.5)
    workers[rng.integers(slots), rng.integers(h)] += 1  # at least one worker, anywhere
    ps[~workers.any(axis=1)] = 0  # as every schedule: no PS in a slot without workers
    return pricing.Schedule(start, workers.astype(np.int32), ps.astype(np.int32))


def _rows(sched: pricing.Schedule, lo: int = -(10**9), hi: int = 10**9) -> dict[int, Any]:
    """The schedule's non-empty slots in ``lo .. hi - 1``, as the model keeps them."""
    return {
        sched.start + i: (sched.workers[i].copy(), sched.ps[i].copy())
        for i in range(sched.slots)
        if lo <= sched.start + i < hi and (sched.workers[i].any() or sched.ps[i].any())
    }


@pytest.mark.parametrize("seed", range(6))
def test_random_changes_keep_the_ledger_equal_to_a_model_of_it(seed: int) -> None:
    """Admits (fitting or not), releases (one job, several, a job twice), replaces (also
    deferred), blocks with and without an end, unblocks, window moves and snapshot
    restores, each checked against amounts, blocks and prices kept here: every cell the
    jobs' counts times their demands (a down server's cell at its capacity), never over
    a capacity, every price SPEC 4's of its own side's bounds, a refused change changing
    nothing."""
    rng = np.random.default_rng(seed)
    cluster, bounds, length = _model_cluster(), _model_bounds(), 8
    ledger = pricing.Ledger(cluster, bounds, length)
    model = _Model(cluster, bounds, length)
    counts = {"admit": 0, "refused": 0, "block": 0, "restore": 0, "deferred": 0}
    for step in range(150):
        op = rng.choice(["admit", "admit", "release", "many", "replace", "block", "unblock",
                         "advance", "restore", "bounds", "reorder"])  # fmt: skip
        ids = list(model.jobs)
        if op == "admit" or (not ids and op in ("release", "many", "replace")):
            start = model.origin + int(rng.integers(0, length))
            slots = int(rng.integers(1, model.origin + length - start + 1))
            sched = _random_schedule(rng, model, start, slots)
            worker = np.array([rng.choice([0, 1, 2]), rng.choice([1, 2.5, 3]), 1.0])
            ps = np.array([0.0, rng.choice([0, 1, 2]), rng.choice([2.0, 3.0])])
            job_id = f"j{step}"
            trial = {**model.jobs, job_id: (worker, ps, _rows(sched))}
            if model.fits(trial):
                ledger.admit(job_id, worker, ps, sched)
                model.jobs = trial
                counts["admit"] += 1
            else:
                with pytest.raises(pricing.CapacityError):
                    ledger.admit(job_id, worker, ps, sched)
                counts["refused"] += 1
        elif op in ("release", "many"):
            chosen = [str(rng.choice(ids)) for _ in range(1 if op == "release" else 3)]
            cut = model.origin + int(rng.integers(0, length))
            ledger.release_many(chosen, cut) if op == "many" else ledger.release(chosen[0], cut)
            for job_id in set(chosen):
                worker, ps, rows = model.jobs[job_id]
                kept = {s: r for s, r in rows.items() if s < cut}
                if any(w.any() for w, _ in kept.values()):
                    model.jobs[job_id] = (worker, ps, kept)
                else:
                    del model.jobs[job_id]
        elif op == "replace":
            job_id = str(rng.choice(ids))
            start = model.origin + int(rng.integers(0, length))
            sched = _random_schedule(rng, model, start, model.origin + length - start)
            worker, ps, _ = model.jobs[job_id]
            trial = {**model.jobs, job_id: (worker, ps, _rows(sched))}
            deferred = rng.random() < 0.5
            with ledger.deferred() if deferred else contextlib.nullcontext():
                if model.fits(trial):
                    ledger.replace(job_id, sched)
                    model.jobs = trial
                else:
                    with pytest.raises(pricing.CapacityError):
                        ledger.replace(job_id, sched)
                if deferred:  # moved by differences: equal to the model up to rounding
                    model.check(ledger)
                    counts["deferred"] += 1
        elif op == "block":
            kind = str(rng.choice(["worker", "ps"]))
            index = int(rng.integers(model.caps(kind).shape[0]))
            first = model.origin + int(rng.integers(0, length))
            ends = [None, first + int(rng.integers(1, 4)), first + int(rng.integers(1, 2 * length))]
            until = ends[int(rng.integers(3))]
            stop = 10**9 if until is None else until
            holds = any(
                (w if kind == "worker" else p)[index] and first <= s < stop
                for _, _, rows in model.jobs.values()
                for s, (w, p) in rows.items()
            )
            if holds:
                with pytest.raises(pricing.LedgerError, match="still holds"):
                    ledger.block(kind, index, first, until)
            else:
                ledger.block(kind, index, first, until)
                model.down.setdefault((kind, index), []).append([first, until])
                counts["block"] += 1
        elif op == "unblock":
            kind = str(rng.choice(["worker", "ps"]))
            index = int(rng.integers(model.caps(kind).shape[0]))
            first = model.origin + int(rng.integers(0, length))
            ledger.unblock(kind, index, first)
            for span in model.down.get((kind, index), []):
                if span[1] is None or span[1] > first:
                    span[1] = max(first, span[0])
        elif op == "advance":
            model.origin += int(rng.integers(1, 3))
            ledger.advance(model.origin)
            for job_id, (_, _, rows) in list(model.jobs.items()):
                if max((s for s, (w, _) in rows.items() if w.any()), default=-1) < model.origin:
                    del model.jobs[job_id]
        elif op == "bounds":
            model.bounds = _model_bounds(str(rng.choice(["", "L1", "L2", "U1", "U2"])))
            ledger.set_bounds(model.bounds)
        elif op == "reorder":
            named = [str(j) for j in rng.permutation(ids)[: int(rng.integers(0, len(ids) + 1))]]
            ledger.reorder(named)
            model.jobs = {j: model.jobs[j] for j in named + [j for j in ids if j not in named]}
        else:  # a trial of changes undone
            saved = ledger.snapshot()
            job_id = f"t{step}"
            sched = _random_schedule(rng, model, model.origin, 2)
            with contextlib.suppress(pricing.CapacityError):
                ledger.admit(job_id, np.array([1.0, 1.0, 1.0]), np.array([0, 1.0, 2.0]), sched)
            for other in list(model.jobs)[:2]:
                ledger.release(other, model.origin)
            ledger.worker_side.price  # noqa: B018  (derives the prices of every slot)
            ledger.ps_side.price  # noqa: B018
            ledger.restore(saved)
            counts["restore"] += 1
        a = int(rng.integers(0, length))
        for side in (ledger.worker_side, ledger.ps_side):  # as a search reads: idle slots once
            side.prices(a, int(rng.integers(a, length + 1)), idle=False)
        model.check(ledger)
    assert min(counts.values()) > 0, counts
