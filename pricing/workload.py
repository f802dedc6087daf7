"""Seeded synthetic traces in the setting of the paper's simulations (SPEC section 6 format).

``generate_trace`` is pure: every random number comes from the ``numpy.random.Generator``
it is given (no I/O, no clock), so one seed gives one trace. The result is a plain dict of
Python ints, floats, strings, lists and dicts, ready for ``json.dumps``.

Settings: the paper's section V-A as far as the extracted text allows; where numbers were
lost, our choice and why. Units: time in slots of ``slot_seconds`` seconds, memory and disk
in GB, bandwidth in Gbps, gradients in MB, GPUs and vCPUs as counts.

Scale: the horizon and the numbers of servers and jobs are arguments; the extracted text
lost the paper's numbers for them (``bench/decision_latency.py`` takes 50 + 50 servers,
T = 300 slots and 300 jobs as "paper scale").

Cluster (``paper_cluster_servers``)
    The paper's text, as extracted, says worker servers follow EC2 C4 and PS servers follow
    EC2 P2/G3. We swap them: workers demand GPUs and PS do not, and the paper's own model
    section says "parameter servers are typically placed on machines with high bandwidth but
    without GPU, while workers run on GPU servers"; a C4 worker server could host no worker
    that needs a GPU.

    - Worker servers: one of four EC2 GPU instance types, uniformly at random, with the
      vCPU, GPU and memory of the real instance; disk (the instances are EBS-only) is our
      choice, a few hundred GB scaled with the instance size:

      ============  ====  ====  =========  ==========
      type          gpu   cpu   mem (GB)   disk (GB)
      ============  ====  ====  =========  ==========
      p2.8xlarge       8    32        488         500
      p2.16xlarge     16    64        732        1000
      g3.8xlarge       2    32        244         250
      g3.16xlarge      4    64        488         500
      ============  ====  ====  =========  ==========

      (p2.xlarge / g3.4xlarge are left out: with 4 vCPUs or 1 GPU they host one small
      worker at most.)
    - PS servers: EC2 C4, c4.4xlarge (cpu 16, mem 30 GB) or c4.8xlarge (cpu 36, mem 60 GB)
      uniformly at random, gpu 0, disk 250 / 500 GB (our choice, as above).
    - Bandwidth of every server: uniform in [20, 50] Gbps (the paper's server bandwidth
      range; the digits were lost, [20, 50] is our reading).
    - Names ``w0, w1, ...`` (worker) then ``p0, p1, ...`` (PS), listed in that order.

Per job (``generate_trace``)
    - Worker demand: gpu integer in [0, 4] (0 allowed: CPU-only training), cpu integer in
      [1, 10], mem integer in [2, 32] GB, disk integer in [5, 10] GB, bandwidth ``b``
      uniform in [0.1, 5] Gbps (the text keeps "bandwidth of Mbps to Gbps"; 100 Mbps to
      5 Gbps is our reading).
    - PS demand: cpu integer in [1, 10], mem integer in [2, 32] GB, disk integer in [5, 10]
      GB, bandwidth ``B`` uniform in [5, 20] Gbps; no GPU. Since ``b <= 5 <= B``,
      ``z(y) <= y`` always holds (SPEC 3).
    - Epochs ``E`` integer in [5, 50], chunks ``N`` integer in [5, 100], mini-batches per
      chunk ``M`` integer in [10, 100], mini-batch compute time ``tau`` uniform in
      [0.001, 0.01] slots, gradient size ``grad_mb`` uniform in [30, 575] MB (model sizes
      of common DNNs; the text keeps only "within MB [6]"). Every range here follows the
      text's order of quantities; the bounds are our reading where digits were lost.
    - Utility: sigmoid ``priority / (1 + exp(decay * (d - target)))`` with ``priority``
      uniform in [1, 100], ``target`` an integer uniform in [1, 15] slots, and ``decay`` by
      class, drawn with probabilities ``mix`` (default 10% / 55% / 35%; the text says
      "by default, , and jobs are time-insensitive, -sensitive, and -critical", the
      shares were lost): time-insensitive ``decay = 0``, time-sensitive uniform in [0.01, 1],
      time-critical uniform in [4, 6].
    - Integers where the quantity is a count or the paper gives whole numbers (GB of memory
      and disk, target slots); reals are rounded to 4 significant digits so traces stay
      readable. Rounding never leaves a range (every bound has at most 4 significant
      digits) and never reaches 0. Feasibility below is checked on the rounded values.

Arrivals ("according to the Google cluster data", Reiss et al. 2012)
    That trace shows a diurnal cycle of submissions plus bursts of many jobs submitted
    together. We draw ``n_jobs`` arrival slots independently from a per-slot weight (a
    non-homogeneous Poisson process conditioned on its count has exactly this law):

    - diurnal part ``1 + 0.5 * sin(2*pi*(t + 0.5 - P/4) / P)`` for slot ``t`` (evaluated at
      its middle), with period ``P = 86400 / slot_seconds`` slots (a day; 24 for hourly
      slots): lowest at slot 0 (taken as midnight), highest half a day later (noon);
    - bursts: ``Poisson(horizon / P)`` of them (about one a day), each at a uniform slot
      ``c`` with height uniform in [1, 3] (1 to 3 times the mean diurnal rate), decaying
      by half every slot after ``c``: weight ``height * 0.5 ** (t - c)`` for ``t >= c``.

    Arrivals are sorted; jobs are named ``j0, j1, ...`` in that order.

Feasibility (SPEC 3 and 5: every generated job has a schedule on the empty cluster)
    - A worker demand that fits on no worker server (e.g. 3 GPUs when every worker server
      is a g3.8xlarge), or a PS demand that fits on no PS server (mem 31 GB when every PS
      server is a c4.4xlarge), is drawn again.
    - With ``m = tau + 2 * grad_mb * 0.008 / b / slot_seconds`` and
      ``W = ceil(E*N*M*m - 1e-9)``, let ``Y`` be the most workers the empty cluster can run
      for the job in one slot: at most ``N``, at most the sum over worker servers of their
      room (SPEC 5), and with ``z(Y)`` PS fitting in the sum of the PS servers' room. While
      ``ceil(W / Y) > horizon - arrival``, ``E`` is lowered by 1 (down to 1), then ``M``
      (down to 1), then ``N`` (down to 1). Since ``Y <= N`` this implies the SPEC check
      ``d_min = ceil(W / N) <= horizon - arrival``, and it is stronger: on a small cluster
      ``N`` workers may not fit in a slot, and a job meeting only the ``d_min`` check could
      have no schedule at all. This clips the long jobs of late arrivals, short horizons
      and small clusters; on the paper's scale (tens of servers, hundreds of slots) it
      rarely binds. With ``m >= 1`` (``slot_seconds`` under ~2 minutes) even a job of one
      epoch, chunk and mini-batch may not fit; ``generate_trace`` then raises ValueError.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

__all__ = ["generate_trace", "paper_cluster_servers"]

RESOURCES: tuple[str, ...] = ("gpu", "cpu", "mem", "disk", "bandwidth")
"""Resource names of generated traces: GPUs, vCPUs, GB memory, GB disk, Gbps."""

# (gpu, cpu, mem GB, disk GB) of each instance type; bandwidth is drawn separately.
_WORKER_TYPES: tuple[tuple[str, int, int, int, int], ...] = (
    ("p2.8xlarge", 8, 32, 488, 500),
    ("p2.16xlarge", 16, 64, 732, 1000),
    ("g3.8xlarge", 2, 32, 244, 250),
    ("g3.16xlarge", 4, 64, 488, 500),
)
_PS_TYPES: tuple[tuple[str, int, int, int, int], ...] = (
    ("c4.4xlarge", 0, 16, 30, 250),
    ("c4.8xlarge", 0, 36, 60, 500),
)
_SERVER_BANDWIDTH_GBPS = (20.0, 50.0)

_MAX_REDRAWS = 10_000
"""Draws of one job's worker (or PS) demand before giving up on a cluster that fits none."""

_DAY_SECONDS = 86_400.0


def paper_cluster_servers(
    rng: np.random.Generator, n_worker: int, n_ps: int
) -> list[dict[str, object]]:
    """Worker (EC2 P2/G3-like) and PS (EC2 C4-like) servers in trace format.

    Args:
        rng: source of every random choice (instance type, then bandwidth, per server).
        n_worker: number of worker servers, >= 1.
        n_ps: number of PS servers, >= 1.

    Returns:
        ``[{"name", "kind", "capacity": {resource: amount}}, ...]``: ``w0..`` then ``p0..``;
        capacities in GPUs, vCPUs, GB, GB and Gbps.
    """
    if n_worker < 1 or n_ps < 1:
        raise ValueError(f"need >= 1 worker and >= 1 PS server, got {n_worker} and {n_ps}")
    servers: list[dict[str, object]] = []
    for kind, prefix, count, types in (
        ("worker", "w", n_worker, _WORKER_TYPES),
        ("ps", "p", n_ps, _PS_TYPES),
    ):
        for i in range(count):
            _, gpu, cpu, mem, disk = types[int(rng.integers(len(types)))]
            bandwidth = _sig4(float(rng.uniform(*_SERVER_BANDWIDTH_GBPS)))
            capacity: dict[str, float | int] = {
                "gpu": gpu,
                "cpu": cpu,
                "mem": mem,
                "disk": disk,
                "bandwidth": bandwidth,
            }
            servers.append({"name": f"{prefix}{i}", "kind": kind, "capacity": capacity})
    return servers


def generate_trace(
    rng: np.random.Generator,
    *,
    n_jobs: int,
    n_worker_servers: int,
    n_ps_servers: int,
    horizon: int,
    slot_seconds: float = 3600.0,
    mix: tuple[float, float, float] = (0.10, 0.55, 0.35),
    max_share: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, object]:
    """A SPEC-6 trace (version 1, oracle price bounds) in the paper's simulation setting.

    Args:
        rng: source of every random number; the same generator state gives the same trace.
        n_jobs: number of jobs, >= 0.
        n_worker_servers: number of worker (GPU) servers, >= 1.
        n_ps_servers: number of PS servers, >= 1.
        horizon: number of slots ``T``, >= 1; arrivals are in ``0 .. T-1``.
        slot_seconds: slot length in seconds, > 0 (sets ``m`` and the diurnal period).
        mix: probabilities of time-insensitive, time-sensitive and time-critical jobs
            (non-negative, summing to 1).
        max_share: if given, in (0, 1]: small jobs, as Theorem 4 assumes. Each job's
            chunks ``N`` (its most workers per slot) are lowered, down to 1, until ``N``
            workers and their ``z(N)`` PS take at most this share of the cluster's total
            of every resource. No random number is drawn for it, so every other field
            stays as in the trace without it (same seed).
        progress: if given, called with the number of jobs drawn after each one (the
            caller's clock decides what to show: 10^6 jobs take minutes).

    Returns:
        ``{"version": 1, "horizon", "slot_seconds", "resources", "servers",
        "pricing": {"bounds": "oracle"}, "jobs"}`` with jobs sorted by arrival, each
        feasible on the empty cluster (see the module docstring for every setting).
    """
    if n_jobs < 0:
        raise ValueError(f"n_jobs must be >= 0, got {n_jobs}")
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    if not (slot_seconds > 0 and math.isfinite(slot_seconds)):
        raise ValueError(f"slot_seconds must be a positive number, got {slot_seconds}")
    if len(mix) != 3 or min(mix) < 0 or abs(sum(mix) - 1.0) > 1e-9:
        raise ValueError(f"mix must be 3 non-negative probabilities summing to 1, got {mix}")
    if max_share is not None and not 0 < max_share <= 1:
        raise ValueError(f"max_share must be in (0, 1], got {max_share}")

    servers = paper_cluster_servers(rng, n_worker_servers, n_ps_servers)
    worker_caps = [_capacity(s) for s in servers if s["kind"] == "worker"]
    ps_caps = [_capacity(s) for s in servers if s["kind"] == "ps"]
    arrivals = _arrivals(rng, n_jobs, horizon, slot_seconds)
    mix_p = np.asarray(mix, dtype=np.float64)
    mix_p = mix_p / mix_p.sum()

    jobs: list[dict[str, object]] = []
    for index, arrival in enumerate(arrivals):
        worker = _draw_fitting(rng, _draw_worker, worker_caps, "worker")
        ps = _draw_fitting(rng, _draw_ps, ps_caps, "PS")
        epochs = int(rng.integers(5, 51))
        chunks = int(rng.integers(5, 101))
        minibatches = int(rng.integers(10, 101))
        tau = _sig4(float(rng.uniform(0.001, 0.01)))
        grad_mb = _sig4(float(rng.uniform(30.0, 575.0)))
        cls = int(rng.choice(3, p=mix_p))
        if cls == 0:
            decay = 0.0
        elif cls == 1:
            decay = _sig4(float(rng.uniform(0.01, 1.0)))
        else:
            decay = _sig4(float(rng.uniform(4.0, 6.0)))
        priority = _sig4(float(rng.uniform(1.0, 100.0)))
        target = int(rng.integers(1, 16))

        if max_share is not None:
            chunks = _small_chunks(worker, ps, chunks, worker_caps, ps_caps, max_share)
        # Clip the work so the job can finish by the horizon (module docstring).
        m = _minibatch_slots(tau, grad_mb, float(worker["bandwidth"]), slot_seconds)
        slots_left = horizon - arrival
        while True:
            work = _work(epochs, chunks, minibatches, m)
            per_slot = _max_workers_per_slot(worker, ps, chunks, worker_caps, ps_caps)
            if _ceil_div(work, per_slot) <= slots_left:  # implies d_min <= slots_left
                break
            if epochs > 1:
                epochs -= 1
            elif minibatches > 1:
                minibatches -= 1
            elif chunks > 1:
                chunks -= 1
            else:
                raise ValueError(
                    f"a job of one epoch, chunk and mini-batch takes {work} slots, more than "
                    f"the {slots_left} left after its arrival: slot_seconds={slot_seconds} "
                    "is too short for the paper's job sizes"
                )

        jobs.append(
            {
                "id": f"j{index}",
                "arrival": arrival,
                "epochs": epochs,
                "chunks": chunks,
                "minibatches": minibatches,
                "tau": tau,
                "grad_mb": grad_mb,
                "worker": worker,
                "ps": ps,
                "utility": {
                    "kind": "sigmoid",
                    "priority": priority,
                    "decay": decay,
                    "target": target,
                },
            }
        )
        if progress is not None:
            progress(index + 1)

    return {
        "version": 1,
        "horizon": horizon,
        "slot_seconds": slot_seconds,
        "resources": list(RESOURCES),
        "servers": servers,
        "pricing": {"bounds": "oracle"},
        "jobs": jobs,
    }


def _arrivals(
    rng: np.random.Generator, n_jobs: int, horizon: int, slot_seconds: float
) -> list[int]:
    """Sorted arrival slots in ``0 .. horizon-1``: diurnal rate plus decaying bursts."""
    period = _DAY_SECONDS / slot_seconds
    t = np.arange(horizon, dtype=np.float64)
    weight = 1.0 + 0.5 * np.sin(2.0 * np.pi * (t + 0.5 - period / 4.0) / period)
    for _ in range(int(rng.poisson(horizon / period))):
        centre = int(rng.integers(horizon))
        height = float(rng.uniform(1.0, 3.0))
        after = t[centre:] - centre
        weight[centre:] += height * 0.5**after
    drawn = rng.choice(horizon, size=n_jobs, p=weight / weight.sum())
    return sorted(int(a) for a in drawn)


def _draw_worker(rng: np.random.Generator) -> dict[str, float | int]:
    """One worker's demand: GPUs, vCPUs, GB memory, GB disk, Gbps."""
    return {
        "gpu": int(rng.integers(0, 5)),
        "cpu": int(rng.integers(1, 11)),
        "mem": int(rng.integers(2, 33)),
        "disk": int(rng.integers(5, 11)),
        "bandwidth": _sig4(float(rng.uniform(0.1, 5.0))),
    }


def _draw_ps(rng: np.random.Generator) -> dict[str, float | int]:
    """One parameter server's demand: vCPUs, GB memory, GB disk, Gbps (no GPU)."""
    return {
        "cpu": int(rng.integers(1, 11)),
        "mem": int(rng.integers(2, 33)),
        "disk": int(rng.integers(5, 11)),
        "bandwidth": _sig4(float(rng.uniform(5.0, 20.0))),
    }


def _draw_fitting(
    rng: np.random.Generator,
    draw: Callable[[np.random.Generator], dict[str, float | int]],
    capacities: list[dict[str, float]],
    what: str,
) -> dict[str, float | int]:
    """Draw a demand with ``draw(rng)`` until it fits on at least one of ``capacities``."""
    for _ in range(_MAX_REDRAWS):
        demand = draw(rng)
        if any(all(v <= cap.get(r, 0.0) for r, v in demand.items()) for cap in capacities):
            return demand
    raise ValueError(f"no {what} server can host a {what} of the paper's demand ranges")


def _capacity(server: dict[str, object]) -> dict[str, float]:
    capacity = server["capacity"]
    assert isinstance(capacity, dict)
    return {str(r): float(v) for r, v in capacity.items()}


def _minibatch_slots(tau: float, grad_mb: float, b: float, slot_seconds: float) -> float:
    """SPEC 3: ``m = tau + 2 * e * 0.008 / b / slot_seconds`` slots per mini-batch."""
    return tau + 2 * grad_mb * 0.008 / b / slot_seconds


def _work(epochs: int, chunks: int, minibatches: int, m: float) -> int:
    """SPEC 3: ``W = ceil(E * N * M * m - 1e-9)`` worker-slots."""
    return math.ceil(epochs * chunks * minibatches * m - 1e-9)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _room(demand: dict[str, float | int], capacity: dict[str, float]) -> int:
    """SPEC 5: how many units of ``demand`` fit in ``capacity``."""
    return min(
        math.floor(capacity.get(r, 0.0) / need + 1e-9) for r, need in demand.items() if need > 0
    )


def _small_chunks(
    worker: dict[str, float | int],
    ps: dict[str, float | int],
    chunks: int,
    worker_caps: list[dict[str, float]],
    ps_caps: list[dict[str, float]],
    max_share: float,
) -> int:
    """The largest ``N' <= chunks`` (at least 1) whose ``N'`` workers and ``z(N')`` PS
    take at most ``max_share`` of the cluster's total of every resource."""
    ratio = float(worker["bandwidth"]) / float(ps["bandwidth"])

    def fits(demand: dict[str, float | int], count: int, caps: list[dict[str, float]]) -> bool:
        return all(
            count * float(need) <= max_share * sum(c.get(r, 0.0) for c in caps)
            for r, need in demand.items()
        )

    while chunks > 1 and not (
        fits(worker, chunks, worker_caps) and fits(ps, math.ceil(chunks * ratio - 1e-9), ps_caps)
    ):
        chunks -= 1
    return chunks


def _max_workers_per_slot(
    worker: dict[str, float | int],
    ps: dict[str, float | int],
    chunks: int,
    worker_caps: list[dict[str, float]],
    ps_caps: list[dict[str, float]],
) -> int:
    """Most workers the empty cluster runs in one slot: ``y <= N`` with ``z(y)`` PS fitting."""
    ps_room = sum(_room(ps, cap) for cap in ps_caps)
    y = min(chunks, sum(_room(worker, cap) for cap in worker_caps))
    ratio = float(worker["bandwidth"]) / float(ps["bandwidth"])
    while y > 1 and math.ceil(y * ratio - 1e-9) > ps_room:
        y -= 1
    return y


def _sig4(x: float) -> float:
    """``x`` rounded to 4 significant digits."""
    return float(f"{x:.4g}")
