"""Lazily derived prices and the tighter early stop decide exactly as eager prices and the
floor-price stop did (issue 16): the same trace replayed both ways gives bit-identical
decisions, and a change of bounds derives nothing until a search reads the slots."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from pricing import Ledger
from pricing.admission import ADMIT_THRESHOLD
from pricing.best_schedule import BestSchedule, _cost_lower_bound, best_schedule, search
from pricing.job import Job
from pricing.prices import price
from pricing.trace import Trace
from tests.test_offline_colgen import _small


def estimated(trace: Trace, ledger: Ledger) -> Iterator[Job]:
    """The trace's jobs that can finish in time, each with ``ledger``'s bounds set to the
    estimate after it (as replay and the daemon do)."""
    estimate = trace.estimate()
    for job in trace.jobs:
        if trace.late(job) is not None:
            continue
        estimate = estimate.observe(job)
        bounds = estimate.bounds()
        assert bounds is not None
        ledger.set_bounds(bounds)
        yield job


def _trace(seed: int, servers: int = 8, horizon: int = 60, jobs: int = 60) -> Trace:
    return _small(seed, jobs, servers, horizon, bounds="estimate")


def _eager(job: Job, ledger: Ledger, first: int, last: int) -> BestSchedule:
    """The search as it was: every price of the window derived from the amounts here,
    one pass over the slots with the floor-price stop."""
    views = []
    for side, demand in ((ledger.worker_side, job.worker), (ledger.ps_side, job.ps)):
        cells = price(side.log_l, side.log_u, side.used, side.capacity)
        views.append((cells, side.used, side.capacity, np.ascontiguousarray(demand)))
    t0 = ledger.index(first)
    lb = _cost_lower_bound(job, ledger)
    best, _ = search(job, views[0], views[1], ledger.touched, t0, last - first + 1, first, lb)
    return best


def _same(a: BestSchedule, b: BestSchedule) -> bool:
    if (a.payoff, a.cost, a.jct, a.utility) != (b.payoff, b.cost, b.jct, b.utility):
        return False
    if a.schedule is None or b.schedule is None:
        return a.schedule is b.schedule
    return (
        a.schedule.start == b.schedule.start
        and np.array_equal(a.schedule.workers, b.schedule.workers)
        and np.array_equal(a.schedule.ps, b.schedule.ps)
    )


@pytest.mark.parametrize("seed", [3, 4])
def test_lazy_decisions_are_bit_identical_to_eager(seed: int) -> None:
    trace = _trace(seed)
    last = trace.horizon - 1
    ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)
    scanned_now = scanned_then = rejected = 0
    for job in estimated(trace, ledger):
        then = _eager(job, ledger, job.arrival, last)
        now = best_schedule(job, ledger, job.arrival, last)
        assert _same(now, then), job.id
        assert now.slots_scanned <= then.slots_scanned
        scanned_now += now.slots_scanned
        scanned_then += then.slots_scanned
        if now.payoff is not None and now.payoff > ADMIT_THRESHOLD:
            assert now.schedule is not None
            ledger.admit(job.id, job.worker, job.ps, now.schedule)
        else:
            rejected += 1
    assert rejected > 0
    # the lazy cells, once derived, are the eager ones
    for side in (ledger.worker_side, ledger.ps_side):
        assert np.array_equal(side.price, price(side.log_l, side.log_u, side.used, side.capacity))
    assert scanned_now < scanned_then  # the tighter stop fires on this trace


def test_a_bounds_change_derives_only_what_a_search_reads() -> None:
    trace = _trace(5, horizon=200, jobs=30)
    ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)
    estimate = trace.estimate()
    for job in trace.jobs[:20]:
        estimate = estimate.observe(job)
        bounds = estimate.bounds()
        assert bounds is not None
        ledger.set_bounds(bounds)
        best = best_schedule(job, ledger, job.arrival, trace.horizon - 1)
        if best.payoff is not None and best.payoff > ADMIT_THRESHOLD:
            assert best.schedule is not None
            ledger.admit(job.id, job.worker, job.ps, best.schedule)
    side = ledger.worker_side
    side.prices(0, ledger.length)
    derived, before = side.derived, ledger.bounds
    ledger.set_bounds(before.scaled(2.0, 3.0))
    assert side.derived == derived  # the change itself derives nothing
    assert (side.priced != side.version).all()
    cheap = 0
    for job in trace.jobs[20:]:
        ledger.set_bounds(before.scaled(2.0, 3.0))
        best = best_schedule(job, ledger, job.arrival, trace.horizon - 1)
        # at most the slots it scanned (and the run they were derived in), both sides
        assert best.slots_priced <= 2 * (best.slots_scanned + 32)
        cheap += best.slots_priced < 2 * (ledger.length - job.arrival)
        ledger.set_bounds(before)
        side.prices(0, ledger.length)
    assert cheap > 0
    ledger.set_bounds(before.scaled(2.0, 3.0))
    best_schedule(trace.jobs[20], ledger, trace.jobs[20].arrival, trace.horizon - 1)
    read = side.priced == side.version
    ledger.set_bounds(before)  # back: every slot derived under these, not since, is valid
    assert read.any() and not read.all()
    assert np.array_equal(side.priced == side.version, ~read)
    assert np.array_equal(side.price, price(side.log_l, side.log_u, side.used, side.capacity))


@pytest.mark.parametrize("seed", range(3))
def test_on_an_idle_cluster_work_goes_as_early_as_it_can(seed: int) -> None:
    """Where every slot prices alike (an idle cluster), splits of the work of equal cost
    are many; the search's backtrack takes the one that puts work as early as it can
    (:func:`pricing.best_schedule._backtrack`), so no slot of a schedule holds more
    workers than the slot before. A backtrack that took the largest count first put the
    work late (4 then 5 workers where 5 then 4 cost the same): the same cost and end, but
    another plan than the documented rule gives."""
    trace = _trace(seed)
    checked = 0
    for job in trace.jobs:
        ledger = Ledger(trace.cluster, trace.bounds, trace.horizon, 0)
        best = best_schedule(job, ledger, job.arrival, trace.horizon - 1)
        if best.schedule is None:
            continue
        counts = best.schedule.worker_counts()
        assert np.all(np.diff(counts) <= 0), (job.id, counts)
        checked += 1
    assert checked >= 30


def test_a_resource_a_server_lacks_prices_at_its_top() -> None:
    """SPEC 4 as documented (:func:`pricing.prices.price`): capacity 0 prices at ``U``,
    what ``oasis prices`` shows for it, and what the least shares assume (a share of 1)."""
    log_l, log_u = np.log(0.01), np.log([3.0, 5.0])
    got = price(log_l, log_u, np.zeros((1, 2)), np.array([[4.0, 0.0]]))
    assert got[0, 0] == pytest.approx(0.01) and got[0, 1] == pytest.approx(5.0)
