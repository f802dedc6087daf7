"""The ledger's compiled least shares and the admission that touches only the servers a
schedule uses keep the same floats as the dense numpy they replace (issue 16)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from pricing import Ledger, decide
from pricing.errors import CapacityError
from pricing.ledger import Side
from pricing.schedule import Schedule
from tests.test_offline_colgen import _small


def _dense_least(side: Side) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(side.capacity > 0, side.used / side.capacity, 1.0)
    out: np.ndarray = share.min(axis=1)
    return out


def _check(ledger: Ledger) -> None:
    rebuilt = copy.deepcopy(ledger)
    rebuilt._recompute(0, ledger.length)  # every amount again, densely, in admission order
    for side, again in ((ledger.worker_side, rebuilt.worker_side),
                        (ledger.ps_side, rebuilt.ps_side)):  # fmt: skip
        assert np.array_equal(side.used, again.used)
        assert np.array_equal(side.min_share, _dense_least(side))
    busy = ledger.worker_side.used.any(axis=(1, 2)) | ledger.ps_side.used.any(axis=(1, 2))
    assert np.array_equal(ledger.touched, busy)


@pytest.mark.parametrize("seed", [1, 2])
def test_admissions_keep_the_dense_amounts_shares_and_touched_slots(seed: int) -> None:
    trace = _small(seed, jobs=40, servers=6, horizon=50)
    ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)
    _check(ledger)
    admitted = 0
    for job in trace.jobs:
        if trace.late(job) is None and decide(job, ledger, job.arrival, trace.horizon - 1).admitted:
            admitted += 1
            _check(ledger)
    assert admitted > 3
    ledger.release(ledger.job_ids()[0], 10)
    _check(ledger)


def test_an_admission_over_capacity_names_the_first_cell_and_changes_nothing() -> None:
    trace = _small(3, jobs=4, servers=3, horizon=6)
    ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)
    job = trace.jobs[0]
    side = ledger.worker_side
    fits = int(np.floor((side.capacity[1] / np.where(job.worker > 0, job.worker, 1)).min()))
    workers = np.zeros((2, side.capacity.shape[0]), np.int32)
    workers[0, 0] = 1
    workers[1, 1] = fits + 1  # over in the second slot, on server 1
    schedule = Schedule(2, workers, np.zeros((2, ledger.ps_side.capacity.shape[0]), np.int32))
    before = copy.deepcopy(ledger)
    with pytest.raises(CapacityError, match=r"worker server 'w1' resource .* in slot 3"):
        ledger.admit("over", job.worker, job.ps, schedule)
    assert np.array_equal(ledger.worker_side.used, before.worker_side.used)


@pytest.mark.parametrize("seed", range(5))
def test_least_shares_on_random_amounts(seed: int) -> None:
    from pricing.shares import least_shares

    rng = np.random.default_rng(seed)
    slots, n, r = 7, int(rng.integers(0, 6)), 3
    capacity = rng.choice([0.0, 0.5, 2.0, 64.0], (n, r))
    used = rng.uniform(0.0, 1.0, (slots, n, r)) * capacity * (rng.random((slots, n, r)) < 0.3)
    used[3] = 0.0  # an empty slot
    if n:
        used[4] = 0.0
        used[4, 0, 0] = 1e-9  # busy with a tiny amount
    least = np.full((slots, r), -1.0)
    busy = np.zeros(slots, np.bool_)
    least_shares(used, capacity, 1, slots, least, busy)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(capacity > 0, used / capacity, 1.0)
    want = share.min(axis=1) if n else np.ones((slots, r))
    assert np.array_equal(least[1:], want[1:]) and (least[0] == -1.0).all()
    assert np.array_equal(busy[1:], used[1:].any(axis=(1, 2))) and not busy[0]
