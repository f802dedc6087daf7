"""The paper's evaluation figures (Figs. 3-6) as PNG plots and CSV tables.

What is measured
    - Fig. 3 (``fig3_total_utility``): total utility of each policy against the number of
      jobs (100, 200, 300, 400) on 50 worker + 50 PS servers, T = 300 slots of an hour.
      Policies: OASiS with the daemon's online bound estimate (trace pricing
      ``{"bounds": "estimate"}``, ``controller.replay.replay``), OASiS with SPEC 4's
      oracle bounds (``{"bounds": "oracle"}``), and the baselines fifo, drf, rrh, dorm
      (``pricing.baselines.run``). OASiS earns ``f(jct)`` of every admitted job; a
      baseline earns ``f(jct)`` of every job it completes by the horizon.
    - Fig. 4 (``fig4_completion_minus_target``): per policy, at 300 jobs, the empirical
      CDF of ``jct - target`` over the completed time-sensitive and time-critical jobs
      (one panel each, as the paper's: a time-insensitive job's target means nothing),
      with ``target`` the job's sigmoid utility target (slots) from the raw trace; the
      CSV has every completed job, with its ``decay`` and ``kind``.
    - Fig. 5 (``fig5_offline_ratio``): the ratio offline optimum / online total utility on
      the paper's performance-ratio instances, as ``bench/offline_optimum.py`` defines them
      (10 jobs, T = 10, 3 / 6 / 9 / 12 servers split ``ceil(n/2)`` worker + ``floor(n/2)``
      PS), for both OASiS pricings, with the solver's status. ``--fig5-max-share S``
      draws the same instances with small jobs, as the paper's Theorem 4 assumes
      (``generate_trace``'s ``max_share``; its job sizes were lost with the text).
    - Fig. 6 (``fig6_bound_estimates``): OASiS (estimate pricing) total utility at 300
      jobs when L, or U, is multiplied by a factor from 1e-3 to 1e3
      (``replay(..., l_factor=, u_factor=)``, applied to every bound the estimate gives).
    - Quality (``quality_per_trace``), per Fig. 3 trace: the certified upper bound
      ``sum_i f_i(fastest completion on an empty cluster)`` (no scheduler earns more,
      ``pricing.quality``), the paper's ``sum_i f_i(ceil(W_i / N_i))``, and OASiS as a
      fraction of each, and against RRH and RRH without preemption (``rrh-np``: RRH
      gets to pause and resume every job at every event for free; OASiS does not).

Methodology
    Traces come from ``pricing.workload.generate_trace(numpy.random.default_rng(seed), ...)``
    with seeds ``1 .. --seeds`` (default 3); its docstring lists every parameter range
    (EC2-like servers, utility mix 10/55/35 time-insensitive/-sensitive/-critical,
    arrivals shaped like the Google cluster trace). The cluster is drawn first, so one
    seed gives the same cluster at every job count. The same jobs are replayed under
    every policy; Figs. 3, 4 and 6 plot the mean over seeds with min/max bars (Fig. 4
    pools the seeds). Fig. 5 solves each instance once with
    ``pricing.offline.solve_offline`` (HiGHS, 60 s limit), started from the better of the
    two online allocations (as ``oasis offline`` starts from its online allocation); both
    ratios divide that one optimum. An unproven optimum is reported with status
    ``feasible``; a ratio is empty when the online utility is 0. The runs (one policy on
    one trace, one Fig. 5 instance, one Fig. 6 replay) go to a process pool, one
    process per core (``--workers N``; ``--workers 1`` runs them here, one at a time),
    or to a Dask cluster with ``--dask-scheduler tcp://HOST:PORT`` (``bench/pool.py``);
    the results do not depend on where they ran, only the timings do.
    OASiS with estimated bounds starts from the shipped prior in Figs. 3, 4 and 6; in
    Fig. 5 (10 jobs, far too few to estimate from) from a prior calibrated on an
    independent trace of the same setting (seed + 1000, 100 jobs: an operator's
    ``oasis calibrate`` of their history), or the shipped one with
    ``--fig5-prior default``.

Run with
    .venv/bin/python -m bench.figures                    # full size, into bench/figures/
    .venv/bin/python -m bench.figures --seeds 5 --out /tmp/figs
    .venv/bin/python -m bench.figures --quick            # tiny sizes, under a minute
    .venv/bin/python -m bench.figures --fig5-max-share 0.1   # Fig. 5 with small jobs
    .venv/bin/python -m bench.figures --dask-scheduler tcp://HOST:8786   # on a cluster
    .venv/bin/python -m bench.figures --first-seed 11 --seeds 5   # seeds 11..15
    .venv/bin/python -m bench.figures --fig5-only --fig5-max-share 0.1

    A progress bar runs on stderr; a Markdown summary of the numbers (also written to
    ``summary.md`` in ``--out``) goes to stdout.
"""

from __future__ import annotations

import argparse
import csv
import errno
import math
import os
import sys
import textwrap
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import matplotlib
    from tqdm import tqdm
except ImportError as missing:  # the 'dev' extra's, not the daemon's
    raise SystemExit(
        f"python -m bench.figures needs {missing.name}: pip install -e '.[dev]' "
        "(make does), or pip install matplotlib tqdm"
    ) from missing

matplotlib.use("Agg")  # files only, no display; before pyplot is imported
import matplotlib.pyplot as plt
import numpy as np

from bench.machine import describe
from bench.offline_optimum import HORIZON as FIG5_HORIZON
from bench.offline_optimum import N_JOBS as FIG5_JOBS
from bench.offline_optimum import TOTAL_SERVERS as FIG5_SERVERS
from bench.pool import add_arguments, executor, interruptible, run_all
from controller.commands.common import (
    int_at_least,
    quiet_native_stdout,
)
from controller.commands.gen import parse_share
from controller.replay import ReplayRecord, replay
from pricing import Trace, trace_from_dict
from pricing.baselines import POLICIES
from pricing.baselines import run as run_baseline
from pricing.bound_estimate import calibrate
from pricing.offline import solve_offline, theorem4_bound
from pricing.quality import certified_bound, dmin_bound
from pricing.schedule import Schedule
from pricing.workload import generate_trace

__all__ = ["CSV_COLUMNS", "FULL", "QUICK", "Settings", "main"]

DEFAULT_OUT = Path(__file__).resolve().parent / "figures"

ONLINE = {"oasis": "estimate", "oasis-oracle": "oracle"}
"""OASiS variants: policy name to the trace's ``pricing.bounds``."""
POLICY_NAMES: tuple[str, ...] = (*ONLINE, *POLICIES)
LABELS = {
    "oasis": "OASiS (estimated bounds)",
    "oasis-oracle": "OASiS (oracle bounds)",
    "fifo": "FIFO",
    "drf": "DRF",
    "rrh": "RRH",
    "dorm": "Dorm",
    "rrh-np": "RRH without preemption",
}

FACTORS: tuple[float, ...] = (1e-3, 1e-2, 0.1, 0.5, 1.0, 2.0, 10.0, 100.0, 1000.0)
"""Fig. 6: what L, or U, is multiplied by."""

FIG4_KINDS: tuple[str, ...] = ("sensitive", "critical")
"""Fig. 4's panels: the paper plots time-sensitive and time-critical jobs only."""


def _kind(decay: float) -> str:
    """A job's kind by its sigmoid decay (:func:`pricing.workload.generate_trace`: 0,
    0.01-1, 4-6)."""
    return "insensitive" if decay == 0 else "sensitive" if decay < 2 else "critical"


CSV_COLUMNS: dict[str, tuple[str, ...]] = {
    "fig3_total_utility": (
        "jobs", "seed", "policy", "total_utility", "admitted", "completed", "seconds",
    ),
    "fig4_completion_minus_target": (
        "policy", "seed", "job", "arrival", "target", "jct", "jct_minus_target", "decay",
        "kind",
    ),
    "fig5_offline_ratio": (
        "servers", "worker_servers", "ps_servers", "seed", "status", "gap", "solve_seconds",
        "optimum", "online_estimate", "online_oracle", "ratio_estimate", "ratio_oracle",
        "theorem4_2alpha_oracle", "theorem4_2alpha_estimate",
    ),
    "quality_per_trace": (
        "jobs", "seed", "certified_bound", "dmin_bound", "oasis", "rrh", "rrh_np",
        "oasis_of_bound", "oasis_of_dmin", "oasis_over_rrh", "oasis_over_rrh_np",
        "rrh_of_bound",
    ),
    "fig6_bound_estimates": (
        "scaled", "factor", "seed", "total_utility", "admitted",
    ),
}  # fmt: skip
"""Columns of each figure's CSV file (``<name>.csv``, next to ``<name>.png``)."""


@dataclass(frozen=True)
class Settings:
    """Sizes of one run of every figure.

    Attributes:
        job_counts: Fig. 3's x axis, jobs per trace.
        worker_servers, ps_servers: cluster of Figs. 3, 4, 6.
        horizon: T in slots (of 3600 s) for Figs. 3, 4, 6.
        fig4_jobs: the job count of Figs. 4 and 6 (one of ``job_counts``).
        fig5_servers: total servers of the Fig. 5 instances.
        fig5_time_limit: seconds per offline solve.
        factors: Fig. 6's multipliers of L and of U.
        quick: tiny sizes for a smoke run; every figure and the summary say so.
    """

    job_counts: tuple[int, ...]
    worker_servers: int
    ps_servers: int
    horizon: int
    fig4_jobs: int
    fig5_servers: tuple[int, ...]
    fig5_time_limit: float
    factors: tuple[float, ...]
    quick: bool = False


FULL = Settings((100, 200, 300, 400), 50, 50, 300, 300, FIG5_SERVERS, 60.0, FACTORS)
QUICK = Settings((15, 30), 10, 10, 40, 30, (3, 6), 20.0, (0.01, 1.0, 100.0), quick=True)
QUICK_CAVEAT = (
    "quick run: tiny cluster and traces, one seed unless --seeds says more; the numbers are "
    "noisy and not the paper's setting (run without --quick for bench/RESULTS.md's)"
)


def _seeds(n: int) -> str:
    """``1 seed``, ``3 seeds``."""
    return f"{n} seed" if n == 1 else f"{n} seeds"


def _decorate(fig: Any, ax: Any, settings: Settings, caveat_ax: Any = None) -> None:
    """Legend beside the axes ``ax`` (inside, it hid lines such as RRH's) and, for a
    quick run, the caveat under ``caveat_ax`` (default: ``ax``)."""
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    if settings.quick:  # under the x axis label
        (caveat_ax or ax).annotate(
            textwrap.fill(QUICK_CAVEAT, 110), xy=(0, 0), xycoords="axes fraction",
            xytext=(0, -40), textcoords="offset points", va="top", fontsize=7,
            color="firebrick",
        )  # fmt: skip


def _save(fig: Any, ax: Any, path: Path, settings: Settings, caveat_ax: Any = None) -> None:
    """:func:`_decorate`, then the PNG written (the legend and caveat included)."""
    _decorate(fig, ax, settings, caveat_ax)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _trace(raw: dict[str, Any], bounds: str, prior: Any = "default") -> Trace:
    pricing: dict[str, Any] = {"bounds": bounds}
    if bounds == "estimate":
        pricing["prior"] = prior
    return trace_from_dict({**raw, "pricing": pricing})


def _independent_prior(
    seed: int, workers: int, ps: int, horizon: int, max_share: float | None
) -> dict[str, Any]:
    """A prior from 100 jobs of the same setting drawn with seed + 1000."""
    raw = _raw(seed + 1000, 100, workers, ps, horizon, max_share)
    trace = _trace(raw, "estimate", "none")
    jobs = [j for j in trace.jobs if trace.late(j) is None]
    return calibrate(jobs, trace.cluster, source=f"independent trace, seed {seed + 1000}").to_dict()


def _raw(
    seed: int, n_jobs: int, workers: int, ps: int, horizon: int, max_share: float | None = None
) -> dict[str, Any]:
    return generate_trace(
        np.random.default_rng(seed),
        n_jobs=n_jobs,
        n_worker_servers=workers,
        n_ps_servers=ps,
        horizon=horizon,
        max_share=max_share,
    )


@dataclass(frozen=True)
class Run:
    """One policy on one trace: per job (trace order) its jct (None: not completed) and
    utility earned (0 when not completed), and the wall time of the whole run."""

    jct: tuple[int | None, ...]
    utility: tuple[float, ...]
    admitted: int
    seconds: float

    @property
    def total(self) -> float:
        return math.fsum(self.utility)


def _online(records: list[ReplayRecord]) -> tuple[list[int | None], list[float]]:
    jct: list[int | None] = []
    utility: list[float] = []
    for r in records:
        d = r.decision
        jct.append(d.best.jct if d.admitted else None)
        utility.append(float(d.best.utility or 0.0) if d.admitted else 0.0)
    return jct, utility


def run_policy(raw: dict[str, Any], policy: str) -> Run:
    """Replay ``raw`` (a generated trace dict) under ``policy`` (``POLICY_NAMES``)."""
    started = time.perf_counter()
    if policy in ONLINE:
        records = list(replay(_trace(raw, ONLINE[policy])))
        jct, utility = _online(records)
        admitted = sum(r.decision.admitted for r in records)
    else:
        outcomes = run_baseline(_trace(raw, "oracle"), policy)
        jct = [o.jct for o in outcomes]
        utility = [float(o.utility or 0.0) for o in outcomes]
        admitted = sum(o.admitted for o in outcomes)
    return Run(tuple(jct), tuple(utility), admitted, time.perf_counter() - started)


def _write_csv(path: Path, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if v is None else v for v in row])


def _g(x: float | None, digits: int = 6) -> str:
    if x is None:
        return "-"
    return "inf" if math.isinf(x) else f"{x:.{digits}g}"


# ---------------------------------------------------------------------------------------
# Figs. 3 and 4
# ---------------------------------------------------------------------------------------


def fig3_fig4(
    settings: Settings,
    seeds: Sequence[int],
    out: Path,
    bar: tqdm[Any],
    pool: Executor | None = None,
) -> list[str]:
    """Run every policy on every trace (on ``pool``, else here); write Figs. 3 and 4;
    Markdown summary lines."""
    s = settings
    keys: list[tuple[int, int, str]] = []
    tasks: list[tuple[dict[str, Any], str]] = []
    # seed -> (job, arrival, target, decay)
    targets: dict[int, list[tuple[str, int, int, float]]] = {}
    bounds: dict[tuple[int, int], tuple[float, float]] = {}
    for n in s.job_counts:
        for seed in seeds:
            raw = _raw(seed, n, s.worker_servers, s.ps_servers, s.horizon)
            oracle = _trace(raw, "oracle")
            bounds[n, seed] = (certified_bound(oracle), dmin_bound(oracle))
            if n == s.fig4_jobs:
                targets[seed] = [
                    (j["id"], j["arrival"], j["utility"]["target"], j["utility"]["decay"])
                    for j in raw["jobs"]
                ]
            for policy in POLICY_NAMES:
                keys.append((n, seed, policy))
                tasks.append((raw, policy))

    def done(task: tuple[Any, ...], _run: Run) -> None:
        bar.set_description(f"fig3 {len(task[0]['jobs'])} jobs {task[1]}")
        bar.update()

    runs = dict(zip(keys, run_all(pool, run_policy, tasks, done), strict=True))

    _write_csv(
        out / "fig3_total_utility.csv",
        CSV_COLUMNS["fig3_total_utility"],
        (
            (n, seed, p, repr(r.total), r.admitted, sum(j is not None for j in r.jct),
             f"{r.seconds:.3f}")
            for (n, seed, p), r in runs.items()
        ),
    )  # fmt: skip
    fig, ax = plt.subplots(figsize=(7, 4.5))
    mean: dict[str, list[float]] = {}
    for p in POLICY_NAMES:
        totals = np.array([[runs[n, sd, p].total for sd in seeds] for n in s.job_counts])
        mean[p] = totals.mean(axis=1).tolist()
        err = np.vstack([totals.mean(axis=1) - totals.min(axis=1),
                         totals.max(axis=1) - totals.mean(axis=1)])  # fmt: skip
        ax.errorbar(s.job_counts, mean[p], yerr=err, marker="o", capsize=3, label=LABELS[p])
    ax.set_xlabel("number of jobs")
    ax.set_ylabel("total utility")
    ax.set_title(
        f"Fig. 3: total utility ({s.worker_servers}+{s.ps_servers} servers, T={s.horizon}; "
        f"mean, min-max of {_seeds(len(seeds))})",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    _save(fig, ax, out / "fig3_total_utility.png", s)

    rows4 = []
    for p in POLICY_NAMES:
        for seed in seeds:
            r = runs[s.fig4_jobs, seed, p]
            for (job, arrival, target, decay), jct in zip(targets[seed], r.jct, strict=True):
                if jct is not None:
                    kind = _kind(decay)
                    rows4.append((p, seed, job, arrival, target, jct, jct - target, decay, kind))
    _write_csv(
        out / "fig4_completion_minus_target.csv",
        CSV_COLUMNS["fig4_completion_minus_target"],
        rows4,
    )
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5), sharey=True)
    deltas = {
        (p, kind): [row[6] for row in rows4 if row[0] == p and row[8] == kind]
        for p in POLICY_NAMES
        for kind in FIG4_KINDS
    }
    colors = {p: f"C{i}" for i, p in enumerate(POLICY_NAMES)}  # the same in both panels
    for ax, kind in zip(axes, FIG4_KINDS, strict=True):
        for p in POLICY_NAMES:
            if deltas[p, kind]:
                ax.ecdf(deltas[p, kind], color=colors[p])
        ax.axvline(0, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("completion time - target (slots)")
        ax.set_title(f"time-{kind} jobs", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of completed jobs")
    for p in POLICY_NAMES:  # one legend for both panels, every policy in it
        counts = " + ".join(str(len(deltas[p, kind])) for kind in FIG4_KINDS)
        axes[1].plot([], [], color=colors[p], label=f"{LABELS[p]} ({counts} jobs)")
    fig.suptitle(
        f"Fig. 4: completion minus target of the completed time-sensitive and time-critical "
        f"jobs, {s.fig4_jobs} jobs ({_seeds(len(seeds))} pooled; legend: jobs completed, "
        "left + right)",
        fontsize=9,
    )
    _save(fig, axes[1], out / "fig4_completion_minus_target.png", s, caveat_ax=axes[0])

    lines = [
        f"Fig. 3, mean total utility over {_seeds(len(seeds))} "
        f"({s.worker_servers}+{s.ps_servers} servers, T = {s.horizon}):",
        "",
        "| policy | " + " | ".join(f"{n} jobs" for n in s.job_counts) + " |",
        "|---|" + "---|" * len(s.job_counts),
    ]
    for p in POLICY_NAMES:
        lines.append(f"| {LABELS[p]} | " + " | ".join(f"{v:.1f}" for v in mean[p]) + " |")
    for kind in FIG4_KINDS:
        lines += [
            "",
            f"Fig. 4, jct - target over the completed time-{kind} jobs at {s.fig4_jobs} jobs "
            "(seeds pooled):",
            "",
            "| policy | completed | <= 0 | median | p90 | max |",
            "|---|---|---|---|---|---|",
        ]
        for p in POLICY_NAMES:
            d = np.array(deltas[p, kind])
            if d.size == 0:
                lines.append(f"| {LABELS[p]} | 0 | - | - | - | - |")
                continue
            lines.append(
                f"| {LABELS[p]} | {d.size} | {float((d <= 0).mean()):.0%} | "
                f"{float(np.median(d)):g} | {float(np.percentile(d, 90)):g} | {int(d.max())} |"
            )
    return [*lines, "", *quality(settings, seeds, out, runs, bounds)]


def _over(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def quality(
    settings: Settings,
    seeds: Sequence[int],
    out: Path,
    runs: dict[tuple[int, int, str], Run],
    bounds: dict[tuple[int, int], tuple[float, float]],
) -> list[str]:
    """OASiS against the certified bound and RRH (with and without preemption), per
    Fig. 3 trace; write the quality CSV and plot; Markdown summary lines."""
    rows = []
    for n in settings.job_counts:
        for seed in seeds:
            cert, dmin = bounds[n, seed]
            o, r, r_np = (runs[n, seed, p].total for p in ("oasis", "rrh", "rrh-np"))
            rows.append(
                (n, seed, cert, dmin, o, r, r_np, _over(o, cert), _over(o, dmin), _over(o, r),
                 _over(o, r_np), _over(r, cert))
            )  # fmt: skip
    _write_csv(out / "quality_per_trace.csv", CSV_COLUMNS["quality_per_trace"], rows)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = np.arange(len(rows))
    for offset, col, label in (
        (-0.27, 7, LABELS["oasis"]),
        (0.0, 11, LABELS["rrh"]),
        (0.27, None, LABELS["rrh-np"]),
    ):
        ys = [(row[col] if col is not None else _over(row[6], row[2])) or 0.0 for row in rows]
        ax.bar(xs + offset, ys, width=0.27, label=label)
    ax.set_xticks(xs, [f"{row[0]}/{row[1]}" for row in rows], rotation=90, fontsize=7)
    ax.set_xlabel("trace (jobs / seed)")
    ax.set_ylabel("total utility / certified upper bound")
    ax.set_title("Quality: share of sum f(fastest completion on an empty cluster)", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    _save(fig, ax, out / "quality_per_trace.png", settings)  # legend beside, caveat under

    lines = [
        "Quality per trace: OASiS (estimated bounds) against the certified upper bound "
        "sum f(fastest completion on an empty cluster), the paper's sum f(ceil(W/N)), RRH "
        "and RRH without preemption:",
        "",
        "| jobs | seed | bound | sum f(d_min) | OASiS | RRH | RRH w/o preemption "
        "| OASiS / bound | OASiS / sum f(d_min) | OASiS / RRH | OASiS / RRH w/o pr. "
        "| RRH / bound |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            "| " + " | ".join([str(row[0]), str(row[1])] + [_g(x, 5) for x in row[2:7]]
                             + [_g(x, 4) for x in row[7:]]) + " |"
        )  # fmt: skip
    return lines


# ---------------------------------------------------------------------------------------
# Fig. 5
# ---------------------------------------------------------------------------------------


def _schedules(records: list[ReplayRecord]) -> list[Schedule | None]:
    return [r.decision.best.schedule if r.decision.admitted else None for r in records]


def _ratio(optimum: float | None, online: float) -> float | None:
    """optimum / online; None when either is missing or the online utility is 0."""
    return optimum / online if optimum is not None and online > 0 else None


def fig5_instance(
    total: int, seed: int, max_share: float | None, time_limit: float, prior: str = "independent"
) -> tuple[Any, ...]:
    """One Fig. 5 instance: its CSV row (``CSV_COLUMNS["fig5_offline_ratio"]``).

    ``prior``: ``"independent"`` (calibrated on an independent trace of the same setting)
    or ``"default"`` (the shipped prior) for OASiS with estimated bounds."""
    workers, ps = (total + 1) // 2, total // 2
    raw = _raw(seed, FIG5_JOBS, workers, ps, FIG5_HORIZON, max_share)
    online: dict[str, float] = {}
    starts: dict[str, list[Schedule | None]] = {}
    oracle = _trace(raw, "oracle")
    start: Any = "default"
    if prior == "independent":
        start = _independent_prior(seed, workers, ps, FIG5_HORIZON, max_share)
    estimated = _trace(raw, "estimate", start)
    for bounds, trace in (("estimate", estimated), ("oracle", oracle)):
        records = list(replay(trace))
        online[bounds] = math.fsum(_online(records)[1])
        starts[bounds] = _schedules(records)
    better = max(online, key=lambda b: online[b])
    result = solve_offline(oracle, time_limit=time_limit, start=starts[better])
    opt = result.optimum
    return (
        total, workers, ps, seed, result.status, result.gap, round(result.solve_seconds, 3),
        opt, online["estimate"], online["oracle"], _ratio(opt, online["estimate"]),
        _ratio(opt, online["oracle"]), theorem4_bound(oracle), theorem4_bound(estimated),
    )  # fmt: skip


def fig5(
    settings: Settings,
    seeds: Sequence[int],
    out: Path,
    bar: tqdm[Any],
    max_share: float | None = None,
    pool: Executor | None = None,
    prior: str = "independent",
) -> list[str]:
    """Offline optimum against both OASiS pricings (each instance on ``pool``, else
    here); write Fig. 5; Markdown summary lines. ``max_share``: small jobs
    (``generate_trace``'s), None for the paper's sizes. ``prior``: see
    :func:`fig5_instance`."""
    tasks = [
        (total, seed, max_share, settings.fig5_time_limit, prior)
        for total in settings.fig5_servers
        for seed in seeds
    ]

    def done(task: tuple[Any, ...], _row: tuple[Any, ...]) -> None:
        bar.set_description(f"fig5 {task[0]} servers seed {task[1]}")
        bar.update()

    rows = run_all(pool, fig5_instance, tasks, done)
    cols = CSV_COLUMNS["fig5_offline_ratio"]
    _write_csv(out / "fig5_offline_ratio.csv", cols, rows)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for offset, (bounds, col) in zip(
        (-0.25, 0.25), (("estimate", 10), ("oracle", 11)), strict=True
    ):
        label = LABELS["oasis" if bounds == "estimate" else "oasis-oracle"]
        xs = [r[0] + offset for r in rows if r[col] is not None]
        ys = [r[col] for r in rows if r[col] is not None]
        points = ax.scatter(xs, ys, alpha=0.6, label=label)
        med = [
            (t, float(np.median(v)))
            for t in settings.fig5_servers
            if (v := [r[col] for r in rows if r[0] == t and r[col] is not None])
        ]
        if med:
            ax.plot([m[0] + offset for m in med], [m[1] for m in med], "_", ms=18, mew=2,
                    color=points.get_facecolor()[0])  # fmt: skip
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_yscale("log")
    ax.set_xticks(list(settings.fig5_servers))
    ax.set_xlabel("servers (ceil(n/2) worker + floor(n/2) PS)")
    ax.set_ylabel("offline optimum / online utility")
    jobs = f"{FIG5_JOBS} jobs" + (f" of <= {max_share:g} of the cluster" if max_share else "")
    ax.set_title(
        f"Fig. 5: offline ratio ({jobs}, T={FIG5_HORIZON}, {_seeds(len(seeds))} "
        "per size; bar = median)",
        fontsize=9,
    )
    ax.grid(alpha=0.3, which="both")
    _save(fig, ax, out / "fig5_offline_ratio.png", settings)

    proven = sum(r[4] == "optimal" for r in rows)
    lines = [
        f"Fig. 5, offline optimum / online ({len(rows)} instances"
        + (f" of jobs within {max_share:g} of the cluster" if max_share else "")
        + f"; {proven} proven optimal, "
        f"slowest solve {max(r[6] for r in rows):.2f} s, limit {settings.fig5_time_limit:g} s; "
        f"estimated bounds from the {prior} prior):",
        "",
        "| OASiS bounds | median ratio | max ratio | ratio <= 1.5 | ratio <= 2 "
        "| online utility 0 | above its 2*alpha |",
        "|---|---|---|---|---|---|---|",
    ]
    for bounds, col, alpha_col in (("estimate", 10, 13), ("oracle", 11, 12)):
        vals = [r[col] for r in rows if r[col] is not None]
        zero = len(rows) - len(vals)
        above = sum(r[col] is not None and r[col] > r[alpha_col] for r in rows)
        if vals:
            lines.append(
                f"| {bounds} | {float(np.median(vals)):.4g} | {max(vals):.4g} | "
                f"{sum(v <= 1.5 for v in vals)} of {len(vals)} | "
                f"{sum(v <= 2 for v in vals)} of {len(vals)} | {zero} | {above} |"
            )
        else:
            lines.append(f"| {bounds} | - | - | - | - | {zero} | {above} |")
    lines += [
        "",
        "| servers | seed | ratio (estimate) | 2*alpha (estimate) | ratio (oracle) "
        "| 2*alpha (oracle) |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r[0]} | {r[3]} | {_g(r[10], 4)} | {_g(r[13], 4)} | {_g(r[11], 4)} "
            f"| {_g(r[12], 4)} |"
            for r in rows
        ),
    ]
    return lines


# ---------------------------------------------------------------------------------------
# Fig. 6
# ---------------------------------------------------------------------------------------


def fig6_run(settings: Settings, seed: int, l_factor: float, u_factor: float) -> tuple[float, int]:
    """OASiS (estimate) on one Fig. 6 trace with L and U scaled: total utility, admitted."""
    s = settings
    raw = _raw(seed, s.fig4_jobs, s.worker_servers, s.ps_servers, s.horizon)
    records = list(replay(_trace(raw, "estimate"), l_factor=l_factor, u_factor=u_factor))
    return math.fsum(_online(records)[1]), sum(r.decision.admitted for r in records)


def fig6(
    settings: Settings,
    seeds: Sequence[int],
    out: Path,
    bar: tqdm[Any],
    pool: Executor | None = None,
) -> list[str]:
    """OASiS (estimate) with L or U scaled (each replay on ``pool``, else here); write
    Fig. 6; Markdown summary lines."""
    s = settings
    wanted = [
        (scaled, f, seed, (seed, f, 1.0) if scaled == "L" else (seed, 1.0, f))
        for seed in seeds
        for scaled in ("L", "U")
        for f in s.factors
    ]
    keys = list(dict.fromkeys(key for *_, key in wanted))  # factor 1 once per seed

    def done(task: tuple[Any, ...], _result: tuple[float, int]) -> None:
        bar.set_description(f"fig6 seed {task[1]} L x {task[2]:g} U x {task[3]:g}")
        bar.update()

    results = run_all(pool, fig6_run, [(s, *key) for key in keys], done)
    cache = dict(zip(keys, results, strict=True))
    rows = [
        (scaled, f, seed, repr(cache[key][0]), cache[key][1]) for scaled, f, seed, key in wanted
    ]
    _write_csv(out / "fig6_bound_estimates.csv", CSV_COLUMNS["fig6_bound_estimates"], rows)

    means: dict[str, list[float]] = defaultdict(list)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for scaled in ("L", "U"):
        totals = np.array(
            [[float(r[3]) for r in rows if r[0] == scaled and r[1] == f] for f in s.factors]
        )
        m = totals.mean(axis=1)
        means[scaled] = m.tolist()
        err = np.vstack([m - totals.min(axis=1), totals.max(axis=1) - m])
        ax.errorbar(s.factors, m, yerr=err, marker="o", capsize=3,
                    label=f"{scaled} x factor (other bound as estimated)")  # fmt: skip
    ax.set_xscale("log")
    ax.axvline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("factor applied to the estimated bound")
    ax.set_ylabel("total utility")
    ax.set_title(
        f"Fig. 6: mis-estimated bounds, OASiS, {s.fig4_jobs} jobs "
        f"(mean, min-max of {_seeds(len(seeds))})",
        fontsize=9,
    )
    ax.grid(alpha=0.3, which="both")
    _save(fig, ax, out / "fig6_bound_estimates.png", s)

    lines = [
        f"Fig. 6, OASiS (estimated bounds) mean total utility at {s.fig4_jobs} jobs over "
        f"{_seeds(len(seeds))}, with L or U multiplied by a factor:",
        "",
        "| scaled | " + " | ".join(f"x{f:g}" for f in s.factors) + " |",
        "|---|" + "---|" * len(s.factors),
    ]
    for scaled in ("L", "U"):
        lines.append(f"| {scaled} | " + " | ".join(f"{v:.1f}" for v in means[scaled]) + " |")
    return lines


# ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the figures; Ctrl-C ends them with status 130, SIGTERM (``timeout``, a batch
    scheduler's limit) with 143, a line each and the pool's workers ended
    (:mod:`bench.pool`). Before, Ctrl-C ran every queued trace on, silently (a minute
    later it had not ended), then printed a traceback, and SIGTERM left the workers
    running their traces."""
    return interruptible("python -m bench.figures", _figures, argv)


def _figures(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.figures",
        description="Reproduce the paper's Figs. 3-6 as PNG plots and CSV tables.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes (seconds, for tests); default 1 seed"
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default: {DEFAULT_OUT})"
    )
    parser.add_argument(
        "--seeds",
        type=int_at_least(1),
        default=None,
        help="traces per point, seeds 1..N (default: 3; 1 with --quick)",
    )
    parser.add_argument(
        "--fig5-max-share",
        type=parse_share,
        default=None,
        metavar="S",
        help="Fig. 5 with small jobs, as Theorem 4 assumes (oasis gen --max-share); "
        "default: the paper's job sizes",
    )
    parser.add_argument(
        "--fig5-prior",
        choices=("independent", "default"),
        default="independent",
        help="Fig. 5's estimate starts from a prior calibrated on an independent trace of "
        "the same setting (default) or from the shipped prior",
    )
    parser.add_argument(
        "--first-seed",
        type=int_at_least(0),
        default=1,
        help="seeds FIRST..FIRST+N-1 (default: 1)",
    )
    parser.add_argument("--fig5-only", action="store_true", help="only Fig. 5")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_arguments(parser)
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    count = args.seeds or (1 if args.quick else 3)
    seeds = list(range(args.first_seed, args.first_seed + count))
    out: Path = args.out
    if out.exists() and not out.is_dir():
        parser.error(f"--out {out}: exists and is not a directory")
    try:  # a traceback before; a folder it cannot write failed after the whole run
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "permission denied")
    except OSError as err:
        parser.error(f"--out {out}: cannot write there: {err.strerror or err}")

    total = len(settings.fig5_servers) * len(seeds)
    if not args.fig5_only:
        total += len(settings.job_counts) * len(seeds) * len(POLICY_NAMES)
        total += (2 * len(settings.factors) - (1.0 in settings.factors)) * len(seeds)
    started = time.perf_counter()
    with (
        quiet_native_stdout(),  # HiGHS's banner, in this process and the pool's
        tqdm(total=total, file=sys.stderr, unit="run", disable=args.no_progress) as bar,
        executor(args.workers, args.dask_scheduler) as pool,
    ):
        lines = [] if args.fig5_only else [*fig3_fig4(settings, seeds, out, bar, pool), ""]
        lines += fig5(settings, seeds, out, bar, args.fig5_max_share, pool, args.fig5_prior)
        if not args.fig5_only:
            lines += ["", *fig6(settings, seeds, out, bar, pool)]
    seconds = time.perf_counter() - started

    machine = describe(
        numpy=np.__version__, matplotlib=matplotlib.__version__
    )  # versions of what plots and computes
    command = "python -m bench.figures" + (" --quick" if args.quick else "")
    if args.seeds is not None:
        command += f" --seeds {args.seeds}"
    if args.fig5_max_share is not None:
        command += f" --fig5-max-share {args.fig5_max_share:g}"
    if args.fig5_prior != "independent":
        command += f" --fig5-prior {args.fig5_prior}"
    if args.first_seed != 1:
        command += f" --first-seed {args.first_seed}"
    if args.fig5_only:
        command += " --fig5-only"
    head = [
        *([f"**{QUICK_CAVEAT[0].upper()}{QUICK_CAVEAT[1:]}.**", ""] if settings.quick else []),
        f"Command: `{command}`; seeds {seeds[0]}..{seeds[-1]}; wall time {seconds:.0f} s.",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in machine.items()) + ".",
        "",
    ]
    text = "\n".join(head + lines) + "\n"
    (out / "summary.md").write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
