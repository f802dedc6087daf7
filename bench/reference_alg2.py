"""Reference OASiS: the paper's Alg. 1 (admission) and Alg. 2 (best schedule), plain Python.

A deliberately direct transcription of SPEC.md sections 3-5, kept independent of the
project's engine (no numpy, no numba, no imports from ``pricing``), so that it can serve as
the correctness and speed reference for the optimised engine, and as a readable statement
of the algorithm. It reads a trace in SPEC 6 format and replays the online algorithm:

    for each job i, in list order                                  (Alg. 1)
        prices p, q from the allocated amounts g, v                 (eq. 22-26, SPEC 4)
        best schedule = argmax over t_end of f(t_end - a + 1) - DP_COST(t_end, W)
                                                                    (Alg. 2, SPEC 5)
        admit iff its payoff > 1e-9; then add its workers to g and its PS to v

Units: time in slots, bandwidth in Gbps, ``grad_mb`` in MB, other resources in whatever
unit the trace uses; costs and payoffs are in utility units.

Choices SPEC 5 leaves open, made here the simplest way (an engine that wants identical
allocations, not just identical payoffs, must make the same ones):

- DP ties: in ``DP_COST(t, w)`` the smallest workload ``y`` of slot ``t`` whose cost is
  within a relative ``1e-12`` (``TIE``) of the least wins, so among equal-cost schedules
  the one doing the least work in the latest slots (the most work early) wins. Equal-cost
  splits are common (identical prices in untouched slots); comparing sums exactly would
  let float noise from summation order pick among them, so the tolerance makes the
  choice reproducible. The cost reported is that of the chosen schedule, at most
  ``1e-12`` (relative, per slot) above the exact optimum.
- End-slot ties: ``t_end`` is enumerated from ``a`` up, and only a payoff larger by more
  than ``TIE * max(|best|, 1)`` replaces the best, so the earliest end wins ties.
- ``DP_COST`` counts exactly ``w`` worker-slots; since ``COST_t(t, y)`` never decreases with
  ``y`` (greedy placement adds one more worker and possibly one more PS at a price >= 0,
  and whatever fits for ``y`` fits for ``y - 1``), this equals "at least ``w``".
- Price exponent ``x = g / c`` is clamped to ``[0, 1]`` (``g`` may exceed ``c`` by the
  ``1e-9`` slack of the room rule) and is 1 on a server with ``c[r] = 0``.
- Prices are computed as ``exp((1 - x) * log L + x * log U)``, with ``log L`` and ``log U``
  taken from log-utilities, so a bound far below the float range (a time-critical job's
  utility at ``Tmax``) does not underflow to 0.
- The reported ``utility`` is ``f(jct)`` with ``jct`` from the last slot that has workers,
  which is always the chosen ``t_end`` (an earlier last slot would have the same cost and
  a utility at least as large, and would have been found first).

Usage: ``python -m bench.reference_alg2 TRACE.json [--max-jobs N]`` prints
``{"jobs": [...], "summary": {"total_utility", "admitted", "rejected"}}``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["decide", "load_trace", "main", "replay_reference"]

SLACK = 1e-9
"""Tolerance of SPEC's ceilings and floors, and the least payoff that admits a job."""

INF = math.inf

TIE = 1e-12
"""Relative difference below which two costs (or payoffs) are a tie, i.e. float noise."""

# ---------------------------------------------------------------------------------------
# Reading the trace (SPEC 2, 3, 6)
# ---------------------------------------------------------------------------------------


@dataclass
class Server:
    """A worker or PS server: its capacity per resource, in the trace's resource order."""

    name: str
    kind: str  # "worker" or "ps"
    listing: int  # position in the trace's server list (output order)
    capacity: list[float]


@dataclass
class Job:
    """One job with the derived quantities of SPEC 3."""

    id: str
    arrival: int
    chunks: int  # N: the most workers in one slot
    worker: list[float]  # w[r]
    ps: list[float]  # s[r]
    f: Utility
    m: float  # slots per mini-batch, with push and pull
    work: int  # W, worker-slots
    d_min: int  # ceil(W / N), fewest slots
    b: float  # worker bandwidth, Gbps
    big_b: float  # PS bandwidth B, Gbps

    def ps_needed(self, y: int) -> int:
        """``z(y) = ceil(y * b / B - 1e-9)``: PS needed by ``y`` workers (constraint 6)."""
        return math.ceil(y * self.b / self.big_b - SLACK)


def _softplus(x: float) -> float:
    """``log(1 + e^x)`` without overflow."""
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


@dataclass
class Utility:
    """A utility of the completion time ``d >= 1`` (slots): ``f(d)`` and ``log f(d)``.

    ``log f`` is exact where ``f`` underflows; the price bounds use it.
    """

    kind: str
    priority: float = 0.0  # sigmoid
    decay: float = 0.0  # sigmoid
    target: float = 0.0  # sigmoid
    values: tuple[float, ...] = ()  # table: f(1), f(2), ...; the last holds for later d

    def value(self, d: int) -> float:
        """``f(d)``."""
        if self.kind == "table":
            return self.values[min(max(d, 1), len(self.values)) - 1]
        x = self.decay * (d - self.target)
        if x > 700.0:  # exp(x) would overflow; f is below 1e-300 * priority
            return math.exp(self.log_value(d))
        return self.priority / (1.0 + math.exp(x))

    def log_value(self, d: int) -> float:
        """``log f(d)``, ``-inf`` where ``f`` is 0."""
        if self.kind == "table":
            v = self.value(d)
            return math.log(v) if v > 0 else -INF
        # log(priority) - log(1 + exp(decay * (d - target)))
        return math.log(self.priority) - _softplus(self.decay * (d - self.target))


def read_utility(raw: dict[str, Any], where: str) -> Utility:
    """A SPEC utility object: ``sigmoid`` (SPEC 3) or ``table`` (``{"values": [f(1), ...]}``)."""
    kind = raw.get("kind")
    if kind == "sigmoid":
        utility = Utility(
            "sigmoid",
            priority=float(raw["priority"]),
            decay=float(raw["decay"]),
            target=float(raw["target"]),
        )
        if utility.priority <= 0 or utility.decay < 0:
            raise ValueError(f"{where}: need priority > 0 and decay >= 0")
        return utility
    if kind == "table":
        values = tuple(float(v) for v in raw["values"])
        if not values or values[0] <= 0 or min(values) < 0:
            raise ValueError(f"{where}: table values must be >= 0, the first > 0")
        if any(later > earlier for earlier, later in itertools.pairwise(values)):
            raise ValueError(f"{where}: table utility must be non-increasing")
        return Utility("table", values=values)
    raise ValueError(f"{where}: unknown utility kind {kind!r}")


def _vector(amounts: dict[str, Any], resources: Sequence[str], where: str) -> list[float]:
    """A per-resource amount (missing = 0) as a list in resource order."""
    unknown = set(amounts) - set(resources)
    if unknown:
        raise ValueError(f"{where}: unknown resources {sorted(unknown)}")
    vec = [float(amounts.get(r, 0)) for r in resources]
    if any(not (x >= 0 and math.isfinite(x)) for x in vec):
        raise ValueError(f"{where}: amounts must be finite and >= 0")
    return vec


def read_job(
    raw: dict[str, Any], resources: Sequence[str], slot_seconds: float, horizon: int
) -> Job:
    """A job with ``m``, ``W`` and ``d_min`` computed as SPEC 3 defines them."""
    where = f"job {raw.get('id')!r}"
    bw = resources.index("bandwidth")
    worker = _vector(raw.get("worker", {}), resources, f"{where}.worker")
    ps = _vector(raw.get("ps", {}), resources, f"{where}.ps")
    b, big_b = worker[bw], ps[bw]
    if b <= 0 or big_b <= 0:
        raise ValueError(f"{where}: worker and PS bandwidth must be > 0")
    if b > big_b:
        raise ValueError(f"{where}: b = {b} > B = {big_b}: z(y) <= y cannot hold")
    epochs, chunks, minibatches = int(raw["epochs"]), int(raw["chunks"]), int(raw["minibatches"])
    if min(epochs, chunks, minibatches) < 1:
        raise ValueError(f"{where}: epochs, chunks and minibatches must be >= 1")
    arrival = int(raw["arrival"])
    if not 0 <= arrival < horizon:
        raise ValueError(f"{where}: arrival {arrival} outside 0 .. {horizon - 1}")
    tau, e = float(raw["tau"]), float(raw["grad_mb"])
    if tau < 0 or e < 0:
        raise ValueError(f"{where}: tau and grad_mb must be >= 0")
    # m = tau + 2e/b, with 2e/b converted from MB over Gbps to slots
    m = tau + 2 * e * 0.008 / b / slot_seconds
    work = math.ceil(epochs * chunks * minibatches * m - SLACK)
    if work < 1:
        raise ValueError(f"{where}: the job needs no work (W = {work})")
    return Job(
        id=str(raw["id"]),
        arrival=arrival,
        chunks=chunks,
        worker=worker,
        ps=ps,
        f=read_utility(raw["utility"], f"{where}.utility"),
        m=m,
        work=work,
        d_min=-(-work // chunks),
        b=b,
        big_b=big_b,
    )


# ---------------------------------------------------------------------------------------
# Price bounds (SPEC 4, paper eq. 24-26), in logs
# ---------------------------------------------------------------------------------------


@dataclass
class Bounds:
    """``log U1[r]``, ``log U2[r]`` (resource order), ``log L1``, ``log L2``."""

    log_u1: list[float]
    log_u2: list[float]
    log_l1: float
    log_l2: float


def _log_eta(
    jobs: Sequence[Job], demand: Callable[[Job], list[float]], total_cap: float, horizon: int
) -> float:
    """``log eta``: ``1/eta = min(1, min_i W_i * sum_r d_i[r] / (T * sum capacities))``."""
    inv_eta = 1.0
    for job in jobs:
        if total_cap > 0:
            inv_eta = min(inv_eta, job.work * sum(demand(job)) / (horizon * total_cap))
    return -math.log(inv_eta)


def _oracle_side(
    jobs: Sequence[Job],
    demand: Callable[[Job], list[float]],
    n_resources: int,
    horizon: int,
    log_eta: float,
) -> tuple[list[float], float]:
    """``(log U[r] for each r, log L)`` over all jobs for one side (workers or PS)."""
    # L = 1/(4 eta) * min_i f_i(Tmax_i) / (W_i * sum_r d_i[r]),  Tmax_i = T - a_i
    log_l = min(
        job.f.log_value(horizon - job.arrival) - math.log(job.work * sum(demand(job)))
        for job in jobs
    )
    log_l -= math.log(4.0) + log_eta
    # U[r] = max over jobs using r of f_i(d_min_i) / d_i[r]; L for a resource nobody uses
    log_u = []
    for r in range(n_resources):
        users = [
            job.f.log_value(job.d_min) - math.log(demand(job)[r])
            for job in jobs
            if demand(job)[r] > 0
        ]
        log_u.append(max(users) if users else log_l)
    return log_u, log_l


def _log_positive(value: Any, where: str) -> float:
    x = float(value)
    if not (x > 0 and math.isfinite(x)):
        raise ValueError(f"{where} must be a positive number, got {value!r}")
    return math.log(x)


def price_bounds(
    pricing: dict[str, Any],
    *,
    jobs: Sequence[Job],
    resources: Sequence[str],
    workers: Sequence[Server],
    pss: Sequence[Server],
    horizon: int,
) -> Bounds:
    """Oracle bounds over all jobs of the trace, or the explicit numbers of the trace."""
    if pricing.get("bounds") == "oracle":
        if "eta1" in pricing:
            log_eta1 = _log_positive(pricing["eta1"], "pricing.eta1")
        else:
            cap = sum(sum(s.capacity) for s in workers)
            log_eta1 = _log_eta(jobs, lambda j: j.worker, cap, horizon)
        if "eta2" in pricing:
            log_eta2 = _log_positive(pricing["eta2"], "pricing.eta2")
        else:
            cap = sum(sum(s.capacity) for s in pss)
            log_eta2 = _log_eta(jobs, lambda j: j.ps, cap, horizon)
        log_u1, log_l1 = _oracle_side(jobs, lambda j: j.worker, len(resources), horizon, log_eta1)
        log_u2, log_l2 = _oracle_side(jobs, lambda j: j.ps, len(resources), horizon, log_eta2)
        return Bounds(log_u1, log_u2, log_l1, log_l2)
    if "bounds" in pricing:
        raise ValueError(f"pricing.bounds must be 'oracle', got {pricing['bounds']!r}")
    # Explicit bounds: L1, L2 are used as given (eta1/eta2, if present, only enter the
    # oracle formula for L); a resource missing from U1/U2 gets U = L (a flat price).
    log_l1 = _log_positive(pricing["L1"], "pricing.L1")
    log_l2 = _log_positive(pricing["L2"], "pricing.L2")
    u1, u2 = pricing.get("U1", {}), pricing.get("U2", {})
    return Bounds(
        log_u1=[_log_positive(u1[r], f"pricing.U1.{r}") if r in u1 else log_l1 for r in resources],
        log_u2=[_log_positive(u2[r], f"pricing.U2.{r}") if r in u2 else log_l2 for r in resources],
        log_l1=log_l1,
        log_l2=log_l2,
    )


# ---------------------------------------------------------------------------------------
# Prices and the greedy COST_t (SPEC 4, 5; paper eq. 22-23, Alg. 2 lines 23-46)
# ---------------------------------------------------------------------------------------


def price(log_low: float, log_high: float, used: float, capacity: float) -> float:
    """``L * (U / L) ** (used / capacity)``, as ``exp((1 - x) log L + x log U)``."""
    x = 1.0 if capacity <= 0 else min(max(used / capacity, 0.0), 1.0)
    if x == 0.0:
        return math.exp(log_low)
    if x == 1.0:
        return math.exp(log_high)
    return math.exp((1.0 - x) * log_low + x * log_high)


@dataclass
class SlotMarket:
    """One side (workers or PS) of one slot: servers cheapest first, with room and price."""

    order: list[int]  # server indices, by unit price, ties in listing order
    room: list[int]  # room[i]: how many more of the job's units fit on server i
    unit_price: list[float]  # unit_price[i]: sum_r price[i][r] * demand[r]


def slot_market(
    servers: Sequence[Server],
    *,
    allocated: list[list[list[float]]],
    t: int,
    demand: list[float],
    log_u: list[float],
    log_l: float,
) -> SlotMarket:
    """Room ``n(t)`` and unit price ``pi(t)`` of every server for one worker (or PS)."""
    room, unit_price = [], []
    for i, server in enumerate(servers):
        n = INF
        pi = 0.0
        for r, need in enumerate(demand):
            if need <= 0:
                continue
            free = server.capacity[r] - allocated[i][r][t]
            n = min(n, max(0, math.floor(free / need + SLACK)))
            pi += price(log_l, log_u[r], allocated[i][r][t], server.capacity[r]) * need
        room.append(int(n))  # a demand always has bandwidth > 0, so n is finite
        unit_price.append(pi)
    order = sorted(range(len(servers)), key=lambda i: unit_price[i])  # stable: listing order
    return SlotMarket(order, room, unit_price)


def greedy_fill(market: SlotMarket, count: int) -> list[tuple[int, int]] | None:
    """Place ``count`` units cheapest server first, each as full as it can take.

    Returns ``[(server index, units), ...]`` in fill order, or None if they do not fit.
    """
    placed = []
    left = count
    for i in market.order:
        if left == 0:
            break
        take = min(market.room[i], left)
        if take > 0:
            placed.append((i, take))
            left -= take
    return placed if left == 0 else None


def fill_cost(market: SlotMarket, placed: list[tuple[int, int]]) -> float:
    """Price of a placement: ``sum over servers of units * unit price``."""
    cost = 0.0
    for i, units in placed:
        cost += units * market.unit_price[i]
    return cost


def cost_t(job: Job, workers: SlotMarket, pss: SlotMarket, y: int) -> float:
    """``COST_t(t, y)``: cheapest way to run ``y`` workers and ``z(y)`` PS in the slot."""
    if y > job.chunks:  # constraint (3)
        return INF
    placed_w = greedy_fill(workers, y)
    placed_p = greedy_fill(pss, job.ps_needed(y))
    if placed_w is None or placed_p is None:
        return INF
    return fill_cost(workers, placed_w) + fill_cost(pss, placed_p)


# ---------------------------------------------------------------------------------------
# Best schedule (SPEC 5, paper Alg. 2) and admission (Alg. 1)
# ---------------------------------------------------------------------------------------


@dataclass
class Schedule:
    """A job's best schedule: ``workers[t]`` and ``ps[t]`` as ``[(server index, n), ...]``."""

    payoff: float
    cost: float
    t_end: int
    workers: dict[int, list[tuple[int, int]]]
    ps: dict[int, list[tuple[int, int]]]


class Cluster:
    """The trace's servers and the amounts allocated on them, ``g[h][r][t]``, ``v[k][r][t]``."""

    def __init__(
        self, workers: list[Server], pss: list[Server], horizon: int, n_resources: int
    ) -> None:
        self.workers = workers
        self.pss = pss
        self.horizon = horizon
        self.g = [[[0.0] * horizon for _ in range(n_resources)] for _ in workers]
        self.v = [[[0.0] * horizon for _ in range(n_resources)] for _ in pss]

    def best_schedule(self, job: Job, bounds: Bounds) -> Schedule | None:
        """Alg. 2: the payoff-maximising schedule of ``job`` at current prices, or None."""
        a, big_t, n_max, work = job.arrival, self.horizon, job.chunks, job.work
        slots = list(range(a, big_t))

        # COST_t(t, y) for every slot t >= a and every y = 0 .. N
        markets = []
        costs: list[list[float]] = []
        for t in slots:
            wm = slot_market(
                self.workers,
                allocated=self.g,
                t=t,
                demand=job.worker,
                log_u=bounds.log_u1,
                log_l=bounds.log_l1,
            )
            pm = slot_market(
                self.pss,
                allocated=self.v,
                t=t,
                demand=job.ps,
                log_u=bounds.log_u2,
                log_l=bounds.log_l2,
            )
            markets.append((wm, pm))
            costs.append([cost_t(job, wm, pm, y) for y in range(n_max + 1)])

        # DP_COST(t, w) for w = 0 .. W, slot by slot (Alg. 2 lines 10-22, as a table):
        #   DP_COST(a - 1, 0) = 0,  DP_COST(a - 1, w > 0) = inf
        #   DP_COST(t, w) = min over y = 0 .. min(N, w) of COST_t(t, y) + DP_COST(t - 1, w - y)
        # pick[i][w] remembers the minimising y in slot a + i, for backtracking.
        previous = [0.0] + [INF] * work
        pick: list[list[int]] = []
        dp_w: list[float] = []  # DP_COST(a + i, W)
        for i in range(len(slots)):
            current = [INF] * (work + 1)
            chosen = [0] * (work + 1)
            for w in range(work + 1):
                totals = [costs[i][y] + previous[w - y] for y in range(min(n_max, w) + 1)]
                least = min(totals)
                if least == INF:
                    continue
                # the smallest y within float noise of the least cost wins ties
                y = next(y for y, total in enumerate(totals) if total <= least * (1 + TIE))
                current[w] = totals[y]
                chosen[w] = y
            pick.append(chosen)
            dp_w.append(current[work])
            previous = current

        # Enumerate the end slot (Alg. 2 lines 4-9): payoff f(t_end - a + 1) - DP_COST(t_end, W)
        best: tuple[float, int] | None = None
        for i, t_end in enumerate(slots):
            if dp_w[i] == INF:
                continue
            payoff = job.f.value(t_end - a + 1) - dp_w[i]
            # only a payoff greater beyond float noise replaces: the earliest end wins ties
            if best is None or payoff > best[0] + TIE * max(abs(best[0]), 1.0):
                best = (payoff, i)
        if best is None:
            return None
        payoff, i_end = best

        # Backtrack the workload of each slot, then place it greedily.
        schedule = Schedule(payoff, dp_w[i_end], slots[i_end], {}, {})
        w = work
        for i in range(i_end, -1, -1):
            y = pick[i][w]
            w -= y
            if y == 0:
                continue
            wm, pm = markets[i]
            placed_w = greedy_fill(wm, y)
            placed_p = greedy_fill(pm, job.ps_needed(y))
            assert placed_w is not None and placed_p is not None
            schedule.workers[slots[i]] = placed_w
            schedule.ps[slots[i]] = placed_p
        assert w == 0
        return schedule

    def allocate(self, job: Job, schedule: Schedule) -> None:
        """Alg. 1 lines 9 and 11: add the schedule's demands to ``g`` and ``v``."""
        for t, placed in schedule.workers.items():
            for h, n in placed:
                for r, need in enumerate(job.worker):
                    self.g[h][r][t] += n * need
        for t, placed in schedule.ps.items():
            for k, n in placed:
                for r, need in enumerate(job.ps):
                    self.v[k][r][t] += n * need


def _allocations(cluster: Cluster, schedule: Schedule) -> list[dict[str, Any]]:
    """SPEC 6 allocations, sorted by slot then by the server's position in the trace."""
    rows: list[tuple[int, int, dict[str, Any]]] = []
    for t, placed in schedule.workers.items():
        for h, n in placed:
            server = cluster.workers[h]
            rows.append((t, server.listing, {"slot": t, "server": server.name, "workers": n}))
    for t, placed in schedule.ps.items():
        for k, n in placed:
            server = cluster.pss[k]
            rows.append((t, server.listing, {"slot": t, "server": server.name, "ps": n}))
    rows.sort(key=lambda row: (row[0], row[1]))
    return [row[2] for row in rows]


def load_trace(trace: dict[str, Any]) -> tuple[Cluster, list[Job], Bounds | None]:
    """The empty cluster, the jobs in trace order, and the price bounds (None: no jobs)."""
    if trace.get("version") != 1:
        raise ValueError(f"unsupported trace version {trace.get('version')!r}")
    horizon = int(trace["horizon"])
    slot_seconds = float(trace.get("slot_seconds", 3600))
    resources = [str(r) for r in trace["resources"]]
    if "bandwidth" not in resources:
        raise ValueError("the cluster has no 'bandwidth' resource")

    workers: list[Server] = []
    pss: list[Server] = []
    for listing, raw in enumerate(trace["servers"]):
        capacity = _vector(raw["capacity"], resources, f"server {raw['name']!r}")
        server = Server(str(raw["name"]), str(raw["kind"]), listing, capacity)
        if server.kind == "worker":
            workers.append(server)
        elif server.kind == "ps":
            pss.append(server)
        else:
            raise ValueError(f"server {server.name!r}: unknown kind {server.kind!r}")

    jobs = [read_job(raw, resources, slot_seconds, horizon) for raw in trace["jobs"]]
    if any(later.arrival < earlier.arrival for earlier, later in itertools.pairwise(jobs)):
        raise ValueError("job arrivals must not decrease")
    bounds = None
    if jobs:
        bounds = price_bounds(
            trace.get("pricing", {"bounds": "oracle"}),
            jobs=jobs,
            resources=resources,
            workers=workers,
            pss=pss,
            horizon=horizon,
        )
    return Cluster(workers, pss, horizon, len(resources)), jobs, bounds


def decide(cluster: Cluster, job: Job, bounds: Bounds) -> dict[str, Any]:
    """Alg. 1 for one job: best schedule, admission, and (if admitted) allocation."""
    schedule = cluster.best_schedule(job, bounds)
    result: dict[str, Any] = {
        "id": job.id,
        "admitted": False,
        "payoff": None if schedule is None else schedule.payoff,
        "cost": None,
        "jct": None,
        "utility": None,
        "allocations": [],
    }
    if schedule is not None and schedule.payoff > SLACK:  # admit
        cluster.allocate(job, schedule)
        assert max(schedule.workers) == schedule.t_end  # see the module docstring
        jct = schedule.t_end - job.arrival + 1
        result.update(
            admitted=True,
            cost=schedule.cost,
            jct=jct,
            utility=job.f.value(jct),
            allocations=_allocations(cluster, schedule),
        )
    return result


def replay_reference(trace: dict[str, Any], *, max_jobs: int | None = None) -> list[dict[str, Any]]:
    """Replay a SPEC 6 trace through Alg. 1; one result per job, in trace order.

    Each result is ``{"id", "admitted", "payoff", "cost", "jct", "utility",
    "allocations"}``: ``payoff`` is the best payoff (``None`` when the job has no feasible
    schedule); ``cost``, ``jct`` (slots), ``utility`` and ``allocations`` describe the
    admitted schedule and are ``None`` / ``[]`` for a rejected job.

    ``max_jobs`` stops after that many decisions (for timing); the oracle bounds are
    still taken over every job of the trace, so those decisions are the full replay's.
    """
    cluster, jobs, bounds = load_trace(trace)
    if bounds is None:
        return []
    if max_jobs is not None:
        jobs = jobs[: max(max_jobs, 0)]
    return [decide(cluster, job, bounds) for job in jobs]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.reference_alg2 TRACE.json`` (``-`` reads stdin): print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("trace", help="trace file in SPEC 6 format, or - for stdin")
    parser.add_argument("--max-jobs", type=int, default=None, help="decide only the first N")
    args = parser.parse_args(argv)
    if args.trace == "-":
        trace = json.load(sys.stdin)
    else:
        with open(args.trace, encoding="utf-8") as fh:
            trace = json.load(fh)
    jobs = replay_reference(trace, max_jobs=args.max_jobs)
    admitted = [j for j in jobs if j["admitted"]]
    summary = {
        "total_utility": sum(j["utility"] for j in admitted),
        "admitted": len(admitted),
        "rejected": len(jobs) - len(admitted),
    }
    json.dump({"jobs": jobs, "summary": summary}, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
