"""``oasis calibrate TRACE | --store STORE``: a prior for the price-bound estimate, from the
jobs of a trace or of a daemon's store (:func:`pricing.bound_estimate.calibrate`)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from controller.commands import SUMMARIES
from controller.commands.common import (
    EXIT_OK,
    InputError,
    add_arrival_slots,
    check_store_url,
    counted,
    int_at_least,
    load_trace,
    same_file,
    store_url,
    write_output,
)
from pricing.bound_estimate import BoundEstimate, calibrate
from pricing.bound_prior import DEFAULT_PRIOR_WEIGHT, MAX_POINTS
from pricing.cluster import Cluster
from pricing.errors import SpecError
from pricing.job import Job

__all__ = ["DEFAULT_NEWEST", "register", "run"]

DEFAULT_NEWEST = 10_000
"""Jobs ``calibrate --store`` reads by default, the most recently decided: a prior
summarises each value in at most 32 points and counts as 40 jobs, so ten thousand
describe today's jobs as well as a year's million would, in seconds rather than minutes
and gigabytes (``bench/history_scale.py``, part ``calibrate``)."""


def _weight(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and 0 < value <= 1e6):
        raise argparse.ArgumentTypeError(f"must be in (0, 1e6], got {text}")
    return value


def register(sub: Any) -> None:
    """Add the ``calibrate`` subcommand to ``sub`` (an argparse subparsers object)."""
    p = sub.add_parser(
        "calibrate",
        help=SUMMARIES["calibrate"],
        description=(
            "Summarise the per-job values the price-bound estimate follows over the jobs of "
            "TRACE (those that can finish before its horizon) or of a daemon's store (the "
            "newest decided jobs but the cancelled, --newest of them), in units of the "
            "cluster's mean server capacity, "
            "and write them as a prior (JSON). A trace's pricing.prior, or the daemon's "
            "config, can name the file."
        ),
    )
    p.add_argument(
        "trace", metavar="TRACE", nargs="?", help="trace file (JSON, SPEC 6), or - for stdin"
    )
    p.add_argument(
        "--store",
        metavar="STORE",
        help="the jobs a daemon with this store decided: a SQLAlchemy URL, a SQLite file, "
        "or a daemon's data_dir (its oasis.db)",
    )
    p.add_argument(
        "--newest",
        type=int_at_least(0),
        default=None,
        metavar="N",
        help=f"--store: the N most recently decided jobs (default: {DEFAULT_NEWEST}; 0: all, "
        "which at 10^5 jobs takes about 30 s and 0.5 GB)",
    )
    add_arrival_slots(
        p,
        "--store: only jobs that arrived in this slot or later",
        "--store: only jobs that arrived in this slot or earlier",
    )
    p.add_argument(
        "--weight",
        type=_weight,
        default=DEFAULT_PRIOR_WEIGHT,
        help=f"how many jobs the prior counts as (default: {DEFAULT_PRIOR_WEIGHT:g})",
    )
    p.add_argument(
        "--points",
        type=int_at_least(1),
        default=32,
        help=f"summary points per value, at most {MAX_POINTS} (default: 32)",
    )
    p.add_argument("--source", default=None, help="where it came from (default: the input)")
    p.add_argument(
        "-o", "--output", metavar="FILE", default="-", help="write here (default: stdout)"
    )
    p.set_defaults(func=run)


def _from_store(args: argparse.Namespace, newest: int) -> tuple[list[Job], Cluster]:
    # the store's modules only when a store is read: `oasis calibrate TRACE` stays light
    from sqlalchemy.exc import SQLAlchemyError

    from controller.history import HistoryError, load_jobs
    from controller.store import Database, StoreUnavailableError

    url = store_url(args.store, "--store")
    check_store_url(url)
    try:
        db = Database(url)
    except SQLAlchemyError as err:
        raise InputError(f"--store: not a usable database URL: {err}") from err
    try:
        return load_jobs(db, args.first, args.last, newest or None)
    except (HistoryError, SpecError) as err:  # a row, or what the jobs make of the bounds
        raise InputError(f"--store: {err}") from err
    except (StoreUnavailableError, SQLAlchemyError) as err:
        first_line = str(err).splitlines()[0]
        raise InputError(f"--store: cannot read a daemon's store there: {first_line}") from err
    finally:
        db.dispose()


def run(args: argparse.Namespace) -> int:
    if (args.trace is None) == (args.store is None):
        raise InputError("give either a TRACE or --store STORE")
    if args.points > MAX_POINTS:
        raise InputError(f"--points: at most {MAX_POINTS}, got {args.points}")
    if args.store is None and (args.first, args.last, args.newest) != (None, None, None):
        raise InputError("--newest, --from and --to choose a store's jobs: give --store "
                         "STORE, or cut the trace itself")  # fmt: skip
    newest = DEFAULT_NEWEST if args.newest is None else args.newest
    if args.store is not None:
        jobs, cluster = _from_store(args, newest)
        source = "oasis calibrate --store"
    else:
        trace = load_trace(args.trace)
        jobs = [j for j in trace.jobs if trace.late(j) is None]
        cluster = trace.cluster
        source = f"oasis calibrate {args.trace}"
    if not jobs:
        raise InputError("no job to calibrate from (none can finish before the horizon)")
    prior = calibrate(
        jobs, cluster, weight=args.weight, points=args.points, source=args.source or source
    )
    text = json.dumps(prior.to_dict(), indent=1) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
    elif args.trace is not None and same_file(args.output, args.trace):
        raise InputError(f"-o {args.output}: that is the trace read: it would be overwritten "
                         "with the prior; name another file")  # fmt: skip
    else:
        write_output(args.output, text)
    start = BoundEstimate.start(cluster, prior).bounds()
    assert start is not None
    floors = ", ".join(
        f"{r} {math.exp(x):.3g}" for r, x in zip(cluster.resources, start.floor1, strict=True)
    )
    limited = args.store is not None and len(jobs) == newest
    print(
        f"oasis calibrate: {counted(len(jobs), 'job')}"
        + (" (the newest; --newest sets how many)" if limited else "")
        + " -> a prior worth "
        f"{counted(args.weight, 'job')}; on this "
        f"cluster it starts L1 at {floors}",
        file=sys.stderr,
    )
    if len(jobs) < args.weight:  # a prior of 1 job counted as 40 without a word
        print(
            f"oasis calibrate: note: made from fewer jobs than it counts as: the estimate "
            f"takes its {counted(len(jobs), 'job')} for {counted(args.weight, 'job')} until "
            "it has seen as many; calibrate from more jobs, or give --weight "
            f"{len(jobs)}",
            file=sys.stderr,
        )
    return EXIT_OK
