"""Offline optimum against the online algorithm on the paper's performance-ratio instances.

What is measured
    For the paper's performance-ratio experiment (Fig. 5 in our numbering; the extracted
    text calls it Fig. 6): 10 jobs, T = 10 slots, 3, 6, 9 or 12 servers in total, split
    into ``ceil(n/2)`` worker and ``floor(n/2)`` PS servers. Per instance:

    - the offline optimum of problem (1)-(13) (``pricing.offline.solve_offline``), its
      solver status, relative MIP gap and wall time to a proven optimum (limit 60 s);
    - the online total utility of ``controller.replay.replay`` on the same trace;
    - the ratio optimum / online, and the Theorem 4 worst case ``2 alpha``;
    - with ``--cross-check``, the optimum from the other solver, which must agree;
    - with ``--bound``, the configuration LP's certified bound
      (``pricing.column_generation.configuration_bound``, run to convergence) and the
      plain LP relaxation of the ILP (``pricing.offline.lp_relaxation``), and how far
      each lies above a proven optimum: the tightness of the bound ``oasis offline``
      reports when it cannot prove the optimum.

Methodology
    Traces come from ``pricing.workload.generate_trace(numpy.random.default_rng(seed),
    n_jobs=10, n_worker_servers=ceil(n/2), n_ps_servers=floor(n/2), horizon=10)`` with
    seeds 1..``--seeds``: the same instances on every run. As ``oasis offline`` does, the
    solver starts from the online allocation (HiGHS takes it as its first incumbent;
    ``--cold`` turns this off). The solve time is the wall time of the solver call alone
    (model building, ~0.05 s here, is not in it). Instances are solved one at a time;
    nothing else should run on the machine. ``--max-share S`` draws the same traces with
    small jobs, as the paper's Theorem 4 assumes: each job's chunks are lowered until its
    most workers per slot and their PS take at most ``S`` of the cluster's total of every
    resource (``generate_trace``'s ``max_share``). ``--jobs``, ``--horizon`` and
    ``--servers`` change the instance sizes. Instances run in parallel on a process pool
    (``--workers``, default one per core; ``--workers 1`` for the sequential timings of
    earlier runs) or on a Dask cluster (``--dask-scheduler``, ``bench/pool.py``);
    parallel solve times share the cores.

Run with
    .venv/bin/python -m bench.offline_optimum                  # HiGHS, seeds 1-3
    .venv/bin/python -m bench.offline_optimum --cross-check    # and CBC on each instance
    .venv/bin/python -m bench.offline_optimum --seeds 1 --cold --json
    .venv/bin/python -m bench.offline_optimum --seeds 5 --pricing estimate --max-share 0.1
    .venv/bin/python -m bench.offline_optimum --seeds 5 --bound          # bound tightness
    .venv/bin/python -m bench.offline_optimum --dask-scheduler tcp://HOST:8786
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

from bench.pool import add_arguments, executor, interruptible, run_all
from controller.commands.gen import parse_share
from controller.replay import replay, summary
from pricing import trace_from_dict
from pricing.column_generation import configuration_bound
from pricing.offline import Held, SolverName, lp_relaxation, solve_offline, theorem4_bound
from pricing.workload import generate_trace

TOTAL_SERVERS = (3, 6, 9, 12)
N_JOBS = 10
HORIZON = 10


@dataclass
class Row:
    servers: int
    workers: int
    ps: int
    seed: int
    variables: int
    constraints: int
    status: str
    gap: float | None
    solve_s: float
    build_s: float
    optimum: float | None
    online: float
    ratio: float | None
    bound_2alpha: float
    admitted_offline: int
    admitted_online: int
    cross_check: float | None = None
    config_bound: float | None = None
    config_seconds: float | None = None
    lp_relaxation: float | None = None


def run_instance(
    total: int,
    seed: int,
    solver: SolverName,
    time_limit: float,
    cross: SolverName | None,
    cold: bool = False,
    pricing: str = "oracle",
    max_share: float | None = None,
    bound: bool = False,
    n_jobs: int = N_JOBS,
    horizon: int = HORIZON,
) -> Row:
    workers, ps = (total + 1) // 2, total // 2
    raw = generate_trace(
        np.random.default_rng(seed),
        n_jobs=n_jobs,
        n_worker_servers=workers,
        n_ps_servers=ps,
        horizon=horizon,
        max_share=max_share,
    )
    trace = trace_from_dict({**raw, "pricing": {"bounds": pricing}})
    records = list(replay(trace))
    online = float(summary(records)["total_utility"])
    start = (
        None
        if cold
        else [r.decision.best.schedule if r.decision.admitted else None for r in records]
    )
    result = solve_offline(trace, solver=solver, time_limit=time_limit, start=start)
    other = None
    if cross is not None:
        checked = solve_offline(trace, solver=cross, time_limit=time_limit, start=start)
        other = checked.optimum
    config = relaxed = seconds = None
    if bound:
        started = time.perf_counter()
        config = configuration_bound(trace, Held.nothing(trace), start=start).bound
        seconds = time.perf_counter() - started
        relaxed = lp_relaxation(trace)
    opt = result.optimum
    return Row(
        servers=total,
        workers=workers,
        ps=ps,
        seed=seed,
        variables=result.variables,
        constraints=result.constraints,
        status=result.status,
        gap=result.gap,
        solve_s=result.solve_seconds,
        build_s=result.build_seconds,
        optimum=opt,
        online=online,
        ratio=opt / online if opt is not None and online > 0 else None,
        bound_2alpha=theorem4_bound(trace),
        admitted_offline=sum(j.admitted for j in result.jobs),
        admitted_online=sum(r.decision.admitted for r in records),
        cross_check=other,
        config_bound=config,
        config_seconds=seconds,
        lp_relaxation=relaxed,
    )


def _above(bound: float | None, row: Row) -> float | None:
    """``(bound - optimum) / optimum`` of a proven optimum; None otherwise."""
    if bound is None or row.status != "optimal" or not row.optimum:
        return None
    return (bound - row.optimum) / row.optimum


def _num(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.{digits}g}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.3g}%"


def table(rows: list[Row], cross: SolverName | None) -> str:
    head = [
        "servers (w+ps)", "seed", "vars", "rows", "status", "gap", "solve s", "optimum",
        "online", "ratio", "2*alpha", "admitted off/on",
    ]  # fmt: skip
    if cross:
        head.append(f"{cross} optimum")
    bounds = any(r.config_bound is not None for r in rows)
    if bounds:
        head += ["config. LP bound", "above opt.", "LP relaxation", "above opt."]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            f"{r.servers} ({r.workers}+{r.ps})", str(r.seed), str(r.variables),
            str(r.constraints), r.status, _num(r.gap), f"{r.solve_s:.2f}", _num(r.optimum, 6),
            _num(r.online, 6), _num(r.ratio), _num(r.bound_2alpha),
            f"{r.admitted_offline}/{r.admitted_online}",
        ]  # fmt: skip
        if cross:
            cells.append(_num(r.cross_check, 6))
        if bounds:
            cells += [
                _num(r.config_bound, 6), _pct(_above(r.config_bound, r)),
                _num(r.lp_relaxation, 6), _pct(_above(r.lp_relaxation, r)),
            ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run it; Ctrl-C ends it with status 130, SIGTERM with 143, a line each and the
    pool's workers ended (:func:`bench.pool.interruptible`; before, a traceback)."""
    return interruptible("python -m bench.offline_optimum", _offline_optimum, argv)


def _offline_optimum(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--seeds", type=int, default=3, help="instances per size (seeds 1..n)")
    parser.add_argument("--solver", choices=("highs", "cbc"), default="highs")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per solve")
    parser.add_argument(
        "--cross-check", action="store_true", help="also solve with the other solver"
    )
    parser.add_argument(
        "--cold", action="store_true", help="do not start from the online allocation"
    )
    parser.add_argument(
        "--pricing",
        choices=("oracle", "estimate"),
        default="oracle",
        help="price bounds of the online replay: SPEC 4's oracle or the daemon's estimate",
    )
    parser.add_argument(
        "--max-share",
        type=parse_share,
        default=None,
        metavar="S",
        help="small jobs as Theorem 4 assumes (generate_trace's max_share), e.g. 0.1",
    )
    parser.add_argument(
        "--bound",
        action="store_true",
        help="also the configuration LP's certified bound and the plain LP relaxation",
    )
    parser.add_argument("--jobs", type=int, default=N_JOBS, help=f"jobs (default {N_JOBS})")
    parser.add_argument("--horizon", type=int, default=HORIZON, help=f"T (default {HORIZON})")
    parser.add_argument(
        "--servers",
        default=",".join(map(str, TOTAL_SERVERS)),
        help="total servers per instance size, comma-separated (default 3,6,9,12)",
    )
    add_arguments(parser)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    solver: SolverName = args.solver
    cross: SolverName | None = None
    if args.cross_check:
        cross = "cbc" if solver == "highs" else "highs"

    tasks = [
        (total, seed, solver, args.time_limit, cross, args.cold, args.pricing, args.max_share,
         args.bound, args.jobs, args.horizon)
        for total in (int(x) for x in args.servers.split(","))
        for seed in range(1, args.seeds + 1)
    ]  # fmt: skip

    def done(task: tuple[object, ...], _row: Row) -> None:
        print(f"{task[0]} servers, seed {task[1]}: done", file=sys.stderr, flush=True)

    started = time.perf_counter()
    with executor(args.workers, args.dask_scheduler) as pool:
        rows = run_all(pool, run_instance, tasks, done)
    elapsed = time.perf_counter() - started

    if args.json:
        print(json.dumps({"rows": [asdict(r) for r in rows], "seconds": elapsed}, indent=1))
        return 0
    print(table(rows, cross))
    proven = sum(r.status == "optimal" for r in rows)
    ratios = [r.ratio for r in rows if r.ratio is not None]
    over = sum(r.ratio is not None and r.ratio > r.bound_2alpha for r in rows)
    print(
        f"\n{proven} of {len(rows)} instances proven optimal by {solver}; slowest solve "
        f"{max(r.solve_s for r in rows):.2f} s (limit {args.time_limit:g} s); "
        f"ratio optimum/online {min(ratios):.4g} .. {max(ratios):.4g} "
        f"(median {float(np.median(ratios)):.4g}; {sum(r <= 1.5 for r in ratios)} at or "
        f"below 1.5); {over} above 2*alpha; "
        f"online utility 0 in {len(rows) - len(ratios)}"
    )
    above = [
        (x, y)
        for r in rows
        if (x := _above(r.config_bound, r)) is not None
        and (y := _above(r.lp_relaxation, r)) is not None
    ]
    if above:
        config = np.array([a for a, _ in above])
        plain = np.array([b for _, b in above])
        print(
            f"bound above the proven optimum, {len(above)} instances: configuration LP "
            f"median {100 * float(np.median(config)):.3g}%, max {100 * float(config.max()):.3g}%"
            f" (slowest {max(r.config_seconds or 0.0 for r in rows):.2f} s); plain LP "
            f"relaxation median {100 * float(np.median(plain)):.3g}%, max "
            f"{100 * float(plain.max()):.3g}%"
        )
    if cross:
        agree = sum(
            r.optimum is not None
            and r.cross_check is not None
            and abs(r.optimum - r.cross_check) <= 1e-6 * max(1.0, abs(r.optimum))
            for r in rows
        )
        print(f"{cross} agrees with {solver} on {agree} of {len(rows)} optima")
    return 0


if __name__ == "__main__":
    sys.exit(main())
