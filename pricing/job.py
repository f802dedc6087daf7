"""A training job (SPEC 3) validated against a cluster, with its derived work and PS ratio."""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from pricing import fields
from pricing.cluster import BANDWIDTH, Cluster, Kind
from pricing.durations import parse_duration, slots_in_time
from pricing.errors import Problem, SpecError
from pricing.utility import UTILITY_KEYS, Utility, utility_from_dict

__all__ = [
    "JOB_KEYS",
    "MAX_ROOM",
    "MB_TO_GBIT",
    "MIN_DEMAND",
    "ROUNDING",
    "Job",
    "fits_nowhere",
    "job_from_dict",
    "max_workers_per_slot",
    "most_on_one_server",
    "room",
    "work_in_words",
]

MB_TO_GBIT = 0.008
"""Megabytes to gigabits."""

ROUNDING = 1e-9
"""Slack in every ceil/floor of SPEC 3-5, so 3.0000000001 workers' worth is still 3."""

MAX_ROOM = 2**40
"""The most units :func:`room` counts on one server: a tiny demand would otherwise fit
more times than an int64 holds (a sum over servers stays exact below 2**63)."""

MIN_DEMAND = 1e-9
"""The smallest non-zero demand of a worker or PS per resource: a subnormal one such as
5e-324 fits more times than anything can count (give 0 for none)."""

JOB_KEYS = frozenset(
    {"id", "arrival", "epochs", "chunks", "minibatches", "tau", "minibatch_seconds",
     "grad_mb", "worker", "ps", "utility"}
)  # fmt: skip
"""Every key a job object may have (``tau`` or ``minibatch_seconds``, not both)."""

_T = TypeVar("_T")


def room(free: NDArray[np.float64], demand: NDArray[np.float64]) -> NDArray[np.int64]:
    """How many units of ``demand`` fit in ``free`` (SPEC 5).

    ``free`` is ``(..., R)``, ``demand`` is ``(R,)``; the result is ``(...)``: the minimum
    over resources with ``demand[r] > 0`` of ``floor(free[r] / demand[r] + 1e-9)``, at least 0
    and at most ``MAX_ROOM``.
    """
    used = demand > 0
    with np.errstate(over="ignore"):  # a subnormal demand: room beyond counting
        per_resource = np.floor(free[..., used] / demand[used] + ROUNDING)
    out: NDArray[np.int64] = np.clip(per_resource.min(axis=-1), 0, MAX_ROOM).astype(np.int64)
    return out


@dataclass(frozen=True, eq=False)
class Job:
    """A validated job. Arrays are indexed by the cluster's resources.

    Attributes:
        id: the job's identifier.
        arrival: the slot ``a`` from which it may run.
        epochs, chunks, minibatches: E, N, M.
        tau: compute time of one mini-batch, slots.
        grad_mb: gradient (= parameter) size exchanged per mini-batch, MB.
        worker: ``(R,)`` float64, demand of one worker.
        ps: ``(R,)`` float64, demand of one PS.
        utility: f, non-increasing in the completion time.
        minibatch_slots: ``m = tau + 2 e 0.008 / b / slot_seconds``, slots.
        work: ``W = ceil(E N M m - 1e-9)``, worker-slots.
        ps_ratio: ``b / B`` in (0, 1]: PS needed per worker.
    """

    id: str
    arrival: int
    epochs: int
    chunks: int
    minibatches: int
    tau: float
    grad_mb: float
    worker: NDArray[np.float64]
    ps: NDArray[np.float64]
    utility: Utility
    minibatch_slots: float
    work: int
    ps_ratio: float

    @property
    def total_minibatches(self) -> int:
        """``E * N * M``: the mini-batches of the whole training (what agents report)."""
        return self.epochs * self.chunks * self.minibatches

    @property
    def min_slots(self) -> int:
        """``d_min = ceil(W / N)``: the fewest slots the job can take."""
        return -(-self.work // self.chunks)

    @property
    def best_utility(self) -> float:
        """``f(d_min)``: the most the job can be worth (finishing as soon as it can), in
        the trace's units of utility; ``inf`` only if ``f`` overflows there."""
        return float(self.utility.values(self.min_slots))

    def ps_needed(self, workers: ArrayLike) -> NDArray[np.int64]:
        """``z(y) = ceil(y b / B - 1e-9)``: PS needed for ``y`` workers (constraint 6)."""
        y = np.asarray(workers, dtype=np.float64)
        return np.ceil(y * self.ps_ratio - ROUNDING).astype(np.int64)

    def ps_table(self) -> NDArray[np.int64]:
        """``(N + 1,)`` int64: ``z(y)`` for ``y = 0 .. N``."""
        return self.ps_needed(np.arange(self.chunks + 1))

    def to_dict(self, cluster: Cluster) -> dict[str, Any]:
        """The job in the trace format (non-zero demands only)."""

        def demand(vec: NDArray[np.float64]) -> dict[str, float]:
            return {r: float(x) for r, x in zip(cluster.resources, vec, strict=True) if x > 0}

        return {
            "id": self.id,
            "arrival": self.arrival,
            "epochs": self.epochs,
            "chunks": self.chunks,
            "minibatches": self.minibatches,
            "tau": self.tau,
            "grad_mb": self.grad_mb,
            "worker": demand(self.worker),
            "ps": demand(self.ps),
            "utility": self.utility.to_dict(),
        }


def _seconds(value: Any, field: str) -> float:
    """Seconds > 0: a number, or a duration such as ``"1.5s"`` or ``"2m"`` (as a
    utility's deadline takes one)."""
    if isinstance(value, str):
        seconds = parse_duration(value)
        if seconds is None:
            raise SpecError.one(field, f"must be a number of seconds or a duration such as "
                                f'"1.5s" or "2m"; got {fields.show(value)}')  # fmt: skip
        value = seconds
    return fields.positive(value, field)


def _megabytes(value: Any, field: str) -> float:
    """MB > 0 (10^6 bytes), a number: ``"100MB"`` is told the unit the field takes."""
    if isinstance(value, str):
        raise SpecError.one(field, "must be a number of megabytes (MB, 10^6 bytes; 1 GiB is "
                            f"1073.741824 MB), got the string {fields.show(value)}")  # fmt: skip
    return fields.positive(value, field)


def job_from_dict(
    raw: Any,
    cluster: Cluster,
    *,
    slot_seconds: float,
    slots_available: Callable[[int], int],
    arrival: int | None = None,
    field: str = "job",
    must_fit: bool = True,
    keyed: bool = False,
) -> Job:
    """Validate a job object (SPEC 3) against ``cluster``; report every problem at once.

    Args:
        raw: the job object.
        cluster: where it would run.
        slot_seconds: length of a slot, to convert transfer time to slots.
        slots_available: slots from the arrival up to the horizon (``T - a`` in a
            trace, ``T`` in the daemon's window), given the arrival.
        arrival: the arrival slot; read from ``raw["arrival"]`` when None.
        field: path of the object, prefixed to every problem's field.
        must_fit: False: a worker or PS that fits on no server even when empty is
            left for the caller to reject (a trace: SPEC 6 decides it, with
            :func:`fits_nowhere`'s reason) instead of refused here.
        keyed: True: ``id`` may be a stored job's key, ``NAME:ID``
            (:func:`pricing.fields.job_key`, the daemon's store); False: a plain id.

    The mini-batch time is ``tau`` in slots or ``minibatch_seconds`` (converted with
    ``slot_seconds``); times in the utility may be durations (:mod:`pricing.utility`).
    No check depends on the arrival, so a stored job parses again at any later slot.

    Raises:
        SpecError: naming each bad field: unknown keys (with the closest known one),
            non-positive or non-finite numbers, unknown resources, ``b > B``, a worker or
            PS that fits on no server even when empty (with ``must_fit``), work that
            cannot finish inside the horizon, a utility that is not non-increasing.
    """
    spec: Mapping[str, Any] = fields.mapping(raw, field)
    problems = [
        _where_it_goes(p, field, cluster) for p in fields.unknown_keys(spec, JOB_KEYS, field)
    ]
    if arrival is not None and "arrival" in spec:
        problems.append(Problem(f"{field}.arrival", "is not taken here: a job submitted "
                                "during slot s arrives at s + 1"))  # fmt: skip

    def read(key: str, parse: Callable[[Any, str], _T]) -> _T | None:
        sub = f"{field}.{key}"
        if key not in spec:
            problems.append(Problem(sub, "is required"))
            return None
        try:
            return parse(spec[key], sub)
        except SpecError as err:
            problems.extend(err.problems)
            return None

    job_id = read("id", fields.job_key if keyed else fields.job_id)
    in_trace = arrival is None  # a trace's job (SPEC 6) gives its arrival; a submission not
    if arrival is None:
        arrival = read("arrival", lambda v, f: fields.integer(v, f, minimum=0))
    epochs = read("epochs", fields.positive_int)
    chunks = read("chunks", fields.positive_int)
    minibatches = read("minibatches", fields.positive_int)
    tau: float | None = None
    if "tau" in spec and "minibatch_seconds" in spec:
        problems.append(Problem(f"{field}.tau", "give tau or minibatch_seconds, not both"))
    elif "minibatch_seconds" in spec:
        seconds = read("minibatch_seconds", _seconds)
        tau = None if seconds is None else seconds / slot_seconds
        if seconds is not None and not tau:  # a subnormal quotient
            problems.append(Problem(f"{field}.minibatch_seconds", "is too small to count"))
    elif "tau" in spec:
        tau = read("tau", fields.positive)
    elif in_trace:  # SPEC 3's field: a trace without it was told of minibatch_seconds
        problems.append(Problem(f"{field}.tau", "is required (or minibatch_seconds, the same "
                                "in seconds)"))  # fmt: skip
    else:
        problems.append(
            Problem(f"{field}.minibatch_seconds", "is required (or tau, the same in slots)")
        )
    grad_mb = read("grad_mb", _megabytes)
    worker = read("worker", lambda v, f: _side(cluster, v, f))
    ps = read("ps", lambda v, f: _side(cluster, v, f))
    utility = read(
        "utility",
        lambda v, f: utility_from_dict(v, f, slot_seconds=slot_seconds, arrival=arrival),
    )
    sides: tuple[tuple[Kind, NDArray[np.float64] | None], ...] = (("worker", worker), ("ps", ps))
    for kind, vec in sides if must_fit else ():
        why = "" if vec is None else _fits_nowhere(cluster, kind, vec)
        if why:
            problems.append(Problem(f"{field}.{kind}", why))
    bw = cluster.bandwidth
    if worker is not None and ps is not None and worker[bw] > ps[bw]:
        b, B = float(worker[bw]), float(ps[bw])
        problems.append(Problem(
            f"{field}.worker.{BANDWIDTH}", f"worker bandwidth b = {b:g} exceeds PS bandwidth "
            f"B = {B:g} (Gbps): the job would need more PS than workers, b / B of a PS per "
            "worker (constraints 6 and 7, z >= y b / B and z <= y, cannot both hold); give "
            "ps.bandwidth at least worker.bandwidth",
        ))  # fmt: skip
    if problems:
        raise SpecError(problems)
    assert job_id is not None and arrival is not None and epochs is not None
    assert chunks is not None and minibatches is not None and tau is not None
    assert grad_mb is not None and worker is not None and ps is not None
    assert utility is not None

    b, B = float(worker[bw]), float(ps[bw])
    nowhere = [] if must_fit else fits_nowhere(worker, ps, cluster)  # else refused above
    total = epochs * chunks * minibatches
    if total > fields.MAX_INTEGER:  # each <= 2**53, their product not: E = N = 2**53
        raise SpecError.one(
            field, f"E*N*M = {total:.6g} mini-batches in all is too many (at most 2**53 = "
            f"{fields.MAX_INTEGER}): node agents count a job's mini-batches exactly",
        )  # fmt: skip
    m = tau + 2.0 * grad_mb * MB_TO_GBIT / b / slot_seconds
    raw_work = epochs * chunks * minibatches * m
    if not raw_work <= fields.MAX_INTEGER:  # also inf and nan
        raise SpecError.one(
            field, f"work E*N*M*m = {raw_work:g} worker-slots is too large (at most 2**53)"
        )
    work = math.ceil(raw_work - ROUNDING)
    if work < 1:
        raise SpecError.one(field, f"work E*N*M*m = {raw_work:g} worker-slots rounds to 0")
    job = Job(
        id=job_id,
        arrival=arrival,
        epochs=epochs,
        chunks=chunks,
        minibatches=minibatches,
        tau=tau,
        grad_mb=grad_mb,
        worker=worker,
        ps=ps,
        utility=utility,
        minibatch_slots=m,
        work=work,
        ps_ratio=b / B,
    )
    if not nowhere:  # else it can never run: no time is enough
        _check_fits_in_time(job, cluster, slots_available(arrival), field, slot_seconds)
    return job


def _where_it_goes(problem: Problem, field: str, cluster: Cluster) -> Problem:
    """An unknown key of the job object that belongs one level down (a resource, a key
    of the utility), said where it goes: ``"gpu": 1`` beside ``epochs`` was told "unknown
    key (known: arrival, chunks, ...)", as if no job took a gpu."""
    key = problem.field.removeprefix(f"{field}.")
    if key in cluster.resources:
        return Problem(problem.field, f'unknown key: a demand goes under worker or ps, as '
                       f'in "worker": {{"{key}": ...}}')  # fmt: skip
    if key in UTILITY_KEYS:
        return Problem(problem.field, f'unknown key: it goes under utility, as in '
                       f'"utility": {{"kind": ..., "{key}": ...}}')  # fmt: skip
    return problem


def fits_nowhere(
    worker: NDArray[np.float64], ps: NDArray[np.float64], cluster: Cluster
) -> list[tuple[str, str]]:
    """``(kind, why)`` for one worker (demand ``worker``, ``(R,)``) or one PS (``ps``)
    that fits on no server of its kind even when empty (SPEC 5's room, its slack
    included), naming each resource that even the largest server lacks; empty if both
    fit somewhere."""
    sides: tuple[tuple[Kind, NDArray[np.float64]], ...] = (("worker", worker), ("ps", ps))
    return [(kind, why) for kind, demand in sides if (why := _fits_nowhere(cluster, kind, demand))]


def _fits_nowhere(cluster: Cluster, kind: Kind, demand: NDArray[np.float64]) -> str:
    """Why one ``kind`` of demand ``demand`` (``(R,)``) fits on no server of its kind even
    when empty, naming each resource that even the largest lacks; "" if it fits."""
    if _empty_room(cluster, kind, demand)[0] >= 1:
        return ""
    capacity = cluster.worker_capacity if kind == "worker" else cluster.ps_capacity
    largest = capacity.max(axis=0)
    resource = np.arange(demand.size)
    lacking = [
        f"{name}: it needs {demand[r]:g}, the largest has {largest[r]:g}"
        for r, name in enumerate(cluster.resources)
        if demand[r] > 0 and room(largest, np.where(resource == r, demand, 0.0)) < 1
    ]
    detail = "; ".join(lacking) or "no one server has enough of every resource it needs"
    return f"one {kind} fits on no {kind} server, even empty ({detail})"


def _side(cluster: Cluster, raw: Any, field: str) -> NDArray[np.float64]:
    """One worker's or PS's demand (``(R,)``, :func:`_demand`), its bandwidth > 0."""
    vec = _demand(cluster, raw, field)
    if vec[cluster.bandwidth] <= 0:
        if BANDWIDTH not in raw:  # every other demand left out is 0; this one is not
            kind = field.rsplit(".", 1)[-1]
            raise SpecError.one(
                f"{field}.{BANDWIDTH}",
                f"is required: the network bandwidth of one {kind}, in Gbps, > 0 (transfer "
                "time divides by it)",
            )
        raise SpecError.one(f"{field}.{BANDWIDTH}", "must be > 0 (transfer time divides by it)")
    return vec


def _demand(cluster: Cluster, raw: Any, field: str) -> NDArray[np.float64]:
    """A worker's or PS's demand per resource (``(R,)``): 0, or at least
    :data:`MIN_DEMAND`; every resource that is not is named at once."""
    given = fields.mapping(raw, field)
    problems: list[Problem] = []
    vec: NDArray[np.float64] | None = None
    try:
        vec = cluster.demand_vector(given, field)
    except SpecError as err:  # the others are still checked for a tiny amount
        problems.extend(err.problems)
    for name, x in given.items():
        if name not in cluster.resources or not isinstance(x, int | float) or isinstance(x, bool):
            continue  # named above, or not a number
        if 0 < x < MIN_DEMAND:
            problems.append(
                Problem(
                    f"{field}.{name}", f"must be 0 or at least {MIN_DEMAND:g}, got {float(x)!r}"
                )
            )
    fields.check_no_problems(problems)
    assert vec is not None
    return vec


def max_workers_per_slot(job: Job, cluster: Cluster) -> int:
    """The most workers ``job`` can run in one slot on the empty cluster: at most ``N``,
    at most the workers that fit, and with their ``z(y)`` PS fitting (SPEC 3, 5).

    ``z(y) = ceil(y b / B - 1e-9)`` rises with ``y``, so the answer is found near
    ``(PS room + 1e-9) B / b`` and settled with a few exact steps, never by counting
    down from ``N`` (which can be 2**53).
    """
    worker_room = _empty_room(cluster, "worker", job.worker)[1]
    ps_room = _empty_room(cluster, "ps", job.ps)[1]
    y = min(job.chunks, worker_room)
    ratio = job.ps_ratio
    limit = (ps_room + ROUNDING) / ratio
    if limit < y:
        y = math.floor(limit)
    # z(y) of :meth:`Job.ps_needed` in float arithmetic (the same floats as numpy's)
    while y > 0 and math.ceil(y * ratio - ROUNDING) > ps_room:
        y -= 1
    while y < min(job.chunks, worker_room) and math.ceil((y + 1) * ratio - ROUNDING) <= ps_room:
        y += 1
    return y


_Rooms = dict[tuple[Kind, tuple[float, ...]], tuple[int, int]]
_EMPTY_ROOMS: weakref.WeakKeyDictionary[Cluster, _Rooms] = weakref.WeakKeyDictionary()
"""Per cluster: :func:`_empty_room` by kind and demand. A job's checks ask for the same
ones several times (fits somewhere, fits in time, the search's size limit)."""
_EMPTY_ROOMS_KEPT = 1024
"""Demands remembered per cluster; past this the memory starts over."""


def _empty_room(cluster: Cluster, kind: Kind, demand: NDArray[np.float64]) -> tuple[int, int]:
    """``(most, total)``: the most units of ``demand`` (``(R,)``) that fit on one empty
    server of ``kind``, and the units that fit on all of them (:func:`room`; 0 and 0
    without such servers). Remembered per cluster and demand (its capacities never
    change)."""
    rooms = _EMPTY_ROOMS.get(cluster)
    if rooms is None:
        rooms = _EMPTY_ROOMS.setdefault(cluster, {})
    key = (kind, tuple(demand.tolist()))
    found = rooms.get(key)
    if found is None:
        capacity = cluster.worker_capacity if kind == "worker" else cluster.ps_capacity
        units = room(capacity, demand)
        found = (int(units.max()) if units.size else 0, int(units.sum()))
        if len(rooms) >= _EMPTY_ROOMS_KEPT:
            rooms.clear()
        rooms[key] = found
    return found


def most_on_one_server(cluster: Cluster, kind: Kind, demand: NDArray[np.float64]) -> int:
    """The most units of ``demand`` (``(R,)``) that fit on one empty server of ``kind``
    (0 without such servers); remembered per cluster and demand."""
    return _empty_room(cluster, kind, demand)[0]


def work_in_words(job: Job, slot_seconds: float) -> str:
    """How the job's work W came to be, in the user's terms: its mini-batches, each
    one's compute and gradient transfer in seconds, and the worker-slots rounded up. A
    transfer of microseconds can tip an hour of compute into a second slot, and a
    ``tau`` of 1.5 meant as seconds shows as 5400 s of compute."""
    raw = job.epochs * job.chunks * job.minibatches * job.minibatch_slots
    each = job.minibatch_slots * slot_seconds
    transfer = (job.minibatch_slots - job.tau) * slot_seconds
    return (
        f"{job.epochs} x {job.chunks} x {job.minibatches} mini-batches of {each:.9g} s "
        f"({job.tau * slot_seconds:.9g} s compute + {transfer:.3g} s gradient transfer) = "
        f"{raw:.10g} worker-slots, rounded up to {job.work}"
    )


def _held_to(job: Job, cluster: Cluster, per_slot: int) -> str:
    """What holds ``job`` to ``per_slot`` workers a slot, in words: its chunks (one worker
    each), the worker servers' room, or its PS' room. "at most 8 workers per slot" alone
    did not say that more chunks would let it run wider."""
    if per_slot == job.chunks:
        return f"one per chunk, chunks = {job.chunks}"
    if per_slot == _empty_room(cluster, "worker", job.worker)[1]:
        return "as many as the worker servers hold"
    return "as many as the PS servers have room to serve"


def _check_fits_in_time(
    job: Job, cluster: Cluster, available: int, field: str, slot_seconds: float
) -> None:
    """Reject work that cannot finish inside the horizon even on an empty cluster,
    saying the slots as time and how the work came to be (:func:`work_in_words`): in
    slots alone, ``"tau": 1.5`` meant as seconds (SPEC 3's slots: 1.5 hours) read as
    "work of 601 worker-slots", with nothing to say where 601 came from."""
    if available < 1:
        raise SpecError.one(f"{field}.arrival", "arrives after the horizon's last slot")
    per_slot = max_workers_per_slot(job, cluster)
    slots = -(-job.work // per_slot)
    if slots > available:
        left = slots_in_time(available, slot_seconds).replace(" slots", "", 1)
        raise SpecError([
            Problem(field, f"work of {job.work} worker-slots needs at least "
                    f"{slots_in_time(slots, slot_seconds)} even on an empty cluster (at most "
                    f"{per_slot} workers per slot: {_held_to(job, cluster, per_slot)}), but only "
                    f"{left} remain from its arrival to its window's end"),
            Problem(f"{field}.work", work_in_words(job, slot_seconds)),
        ])  # fmt: skip
