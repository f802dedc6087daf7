"""``oasis offline TRACE``: the offline optimum of a trace against the online algorithm."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, TextIO

from controller.commands.common import EXIT_FAILURE, EXIT_OK, fmt, load_trace
from controller.replay import ReplayRecord, replay, summary
from pricing.offline import OfflineError, OfflineResult, solve_offline, theorem4_bound

__all__ = ["offline_json", "register", "run"]

DEFAULT_TIME_LIMIT = 60.0
"""Seconds the solver may run unless ``--time-limit`` says otherwise."""

_SOLVER_LABEL = {"highs": "HiGHS", "cbc": "CBC"}


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def register(sub: Any) -> None:
    """Add the ``offline`` subcommand to ``sub`` (an argparse subparsers object)."""
    p = sub.add_parser(
        "offline",
        help="solve the offline optimum (ILP) of a trace and compare it with the online replay",
        description=(
            "Solve the offline optimum of TRACE (the paper's problem (1)-(13) under the "
            "online algorithm's feasibility rules), replay the online algorithm on the same "
            "trace, and print both, their ratio, the solver's status and MIP gap, and the "
            "worst-case ratio 2*alpha of the paper's Theorem 4."
        ),
    )
    p.add_argument("trace", metavar="TRACE", help="trace file (JSON, SPEC 6), or - for stdin")
    p.add_argument("--json", action="store_true", help="print JSON (SPEC 6) instead of text")
    p.add_argument(
        "--solver", choices=("highs", "cbc"), default="highs", help="MIP solver (default: highs)"
    )
    p.add_argument(
        "--time-limit",
        type=_positive,
        default=DEFAULT_TIME_LIMIT,
        metavar="SECONDS",
        help=f"stop the solver after this long (default: {DEFAULT_TIME_LIMIT:g}); the "
        "best allocation found is reported with its gap",
    )
    p.add_argument(
        "--threads", type=_positive_int, default=None, help="solver threads (default: solver's)"
    )
    p.add_argument(
        "--cold",
        action="store_true",
        help="do not start from the online allocation (the optimum found may then fall "
        "below the online utility when the time limit cuts the search short)",
    )
    p.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress on stderr"
    )
    p.set_defaults(func=run)


def _finite(x: float | None) -> float | None:
    """JSON has no infinity: an infinite gap (optimum 0, bound > 0) is written as null."""
    return x if x is not None and math.isfinite(x) else None


def offline_json(
    result: OfflineResult, records: list[ReplayRecord], bound_2alpha: float
) -> dict[str, Any]:
    """The ``offline --json`` document (SPEC 6 keys first)."""
    online = float(summary(records)["total_utility"])
    ratio = result.optimum / online if result.optimum is not None and online > 0 else None
    # unproven: the true ratio lies between ratio and bound / online
    ratio_bound = result.bound / online if result.bound is not None and online > 0 else None
    jobs = []
    for rec, off in zip(records, result.jobs or [None] * len(records), strict=True):
        d = rec.decision
        jobs.append(
            {
                "id": d.job.id,
                "offline_admitted": None if off is None else off.admitted,
                "offline_jct": None if off is None else off.jct,
                "offline_utility": None if off is None else off.utility,
                "online_admitted": d.admitted,
                "online_jct": d.best.jct if d.admitted else None,
                "online_utility": d.best.utility if d.admitted else None,
            }
        )
    return {
        "optimum": result.optimum,
        "online": online,
        "ratio": ratio,
        "status": result.status,
        "gap": _finite(result.gap),
        "bound": result.bound,
        "ratio_bound": ratio_bound,
        "solver": result.solver,
        "solve_seconds": round(result.solve_seconds, 4),
        "theorem4_ratio_bound": bound_2alpha,
        "variables": result.variables,
        "constraints": result.constraints,
        "jobs": jobs,
    }


def _text(doc: dict[str, Any], gap: float | None, out: TextIO) -> None:
    admitted_off = sum(bool(j["offline_admitted"]) for j in doc["jobs"])
    admitted_on = sum(bool(j["online_admitted"]) for j in doc["jobs"])
    n = len(doc["jobs"])
    gap_text = "unknown (no bound reported)" if gap is None else f"{gap:.3g}"
    ratio_note = ""
    if doc["status"] != "optimal" and doc["ratio"] is not None:
        ratio_note = "; not proven: the optimum may be higher"
        if doc["ratio_bound"] is not None:
            ratio_note = f"; not proven: the true ratio is at most {fmt(doc['ratio_bound'], 4)}"
    lines = [
        f"offline optimum  {fmt(doc['optimum'], 6)}  ({admitted_off} of {n} jobs admitted)",
        f"online utility   {fmt(doc['online'], 6)}  ({admitted_on} of {n} jobs admitted)",
        f"ratio            {fmt(doc['ratio'], 4)}  (optimum / online{ratio_note})",
        f"solver           {_SOLVER_LABEL[doc['solver']]}: {doc['status']}, gap {gap_text}, "
        f"bound {fmt(doc['bound'], 6)}, {doc['solve_seconds']:.2f} s "
        f"({doc['variables']} variables, {doc['constraints']} constraints)",
        f"Theorem 4        worst-case ratio 2*alpha = {fmt(doc['theorem4_ratio_bound'], 4)}",
    ]
    print("\n".join(lines), file=out)


def run(args: argparse.Namespace) -> int:
    trace = load_trace(args.trace)

    def progress(message: str) -> None:
        if args.progress:
            print(message, file=sys.stderr, flush=True)

    progress(f"replaying {len(trace.jobs)} jobs with the online algorithm...")
    records = list(replay(trace))
    # the online allocation is feasible for the ILP: given as the start (HiGHS begins
    # from it; either solver's result is kept only if better), the reported optimum is
    # at least the online utility even when the time limit cuts the search short
    online = [r.decision.best.schedule if r.decision.admitted else None for r in records]
    progress("building the ILP...")
    try:
        result = solve_offline(
            trace,
            solver=args.solver,
            time_limit=args.time_limit,
            threads=args.threads,
            start=None if args.cold else online,
            progress=progress,
        )
    except OfflineError as err:
        print(f"oasis offline: {err}", file=sys.stderr)
        return EXIT_FAILURE
    progress(f"solver finished in {result.solve_seconds:.2f} s: {result.status}")
    doc = offline_json(result, records, theorem4_bound(trace))
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
    else:
        _text(doc, result.gap, sys.stdout)
    # admitting nothing is always feasible: an infeasible verdict is a solver failure
    return EXIT_FAILURE if result.status == "infeasible" else EXIT_OK
