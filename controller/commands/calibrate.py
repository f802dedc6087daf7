"""``oasis calibrate TRACE | --store STORE``: a prior for the price-bound estimate, from the
jobs of a trace or of a daemon's store (:func:`pricing.bound_estimate.calibrate`)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from typing import Any

from controller.commands import SUMMARIES
from controller.commands.common import (
    EXIT_OK,
    InputError,
    add_arrival_slots,
    check_store_url,
    counted,
    few,
    int_at_least,
    load_trace,
    same_file,
    store_url,
    unreadable_store,
    write_output,
)
from pricing.bound_estimate import BoundEstimate, calibrate
from pricing.bound_prior import DEFAULT_PRIOR_WEIGHT, MAX_POINTS, Prior
from pricing.cluster import Cluster
from pricing.errors import SpecError
from pricing.job import Job
from pricing.prior_median import median_prior

__all__ = ["DEFAULT_NEWEST", "register", "run"]

DEFAULT_NEWEST = 10_000
"""Jobs ``calibrate --store`` reads by default, the most recently decided (of each of
``k`` submitters the newest ``1/k``): a prior summarises each value in at most 32 points
and counts as 40 jobs, so ten thousand describe today's jobs as well as a year's million
would, in seconds rather than minutes and gigabytes (``bench/history_scale.py``, part
``calibrate``). Shared out by submitter, so that one's many jobs push no other's out of
the prior."""


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
            "newest decided jobs but the cancelled, --newest of them shared out by "
            "submitter), in units of the "
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
        help=f"--store: the N most recently decided jobs, of each of K submitters the "
        f"newest N/K (default: {DEFAULT_NEWEST}; 0: all, which at 10^5 jobs takes about "
        "30 s and 0.5 GB)",
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
    p.add_argument(
        "--submitter",
        action="append",
        metavar="NAME",
        default=None,
        help="--store: only this submitter's jobs (its token's name; - for jobs without "
        "one); may be repeated. Without it every submitter's jobs count, each "
        "submitter's calibrated apart and combined by their median, as the daemon "
        "prices them",
    )
    p.add_argument("--source", default=None, help="where it came from (default: the input)")
    p.add_argument(
        "-o", "--output", metavar="FILE", default="-", help="write here (default: stdout)"
    )
    p.set_defaults(func=run)


def _from_store(args: argparse.Namespace, newest: int) -> tuple[list[Job], Cluster, list[str]]:
    # the store's modules only when a store is read: `oasis calibrate TRACE` stays light
    from sqlalchemy.exc import SQLAlchemyError

    from controller.history import HistoryError, load_jobs, span_words
    from controller.store import Database, StoreUnavailableError

    url = store_url(args.store, "--store")
    check_store_url(url)
    try:
        db = Database(url)
    except SQLAlchemyError as err:
        raise InputError(f"--store: not a usable database URL: {err}") from err
    try:
        whose = None if args.submitter is None else [_name(n) for n in args.submitter]
        jobs, cluster, whom = load_jobs(db, args.first, args.last, newest or None, whose)
        missing = sorted(set(whose or ()) - set(whom))
        if missing:  # a slip of a name calibrated without it, silently
            print(
                "oasis calibrate: note: --submitter: no decided job of "
                + ", ".join(repr(n) if n else "- (no token's)" for n in missing)
                + f"{span_words(args.first, args.last)}; calibrated from the others'",
                file=sys.stderr,
            )
        return jobs, cluster, whom
    except (HistoryError, SpecError) as err:  # a row, or what the jobs make of the bounds
        raise InputError(f"--store: {err}") from err
    except (StoreUnavailableError, SQLAlchemyError) as err:
        raise unreadable_store(err) from err
    finally:
        db.dispose()


def _name(text: str) -> str:
    """A ``--submitter`` as stored: ``-`` is the jobs of no token's (``""``)."""
    return "" if text == "-" else text


def _by_submitter(
    jobs: list[Job], whom: list[str], cluster: Cluster, args: argparse.Namespace, source: str
) -> Prior:
    """One prior per submitter's jobs, combined by their median
    (:func:`pricing.prior_median.median_prior`); said on stderr when there are several."""
    groups: dict[str, list[Job]] = {}
    for job, name in zip(jobs, whom, strict=True):
        groups.setdefault(name, []).append(job)
    priors = [
        calibrate(group, cluster, weight=args.weight, points=args.points, source=source)
        for group in groups.values()
    ]
    if len(groups) > 1:
        listed = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
        shown = few([f"{name or '-'} {len(group):,}" for name, group in listed], 8)
        print(
            f"oasis calibrate: {len(groups)} submitters' jobs ({shown}), each "
            "submitter's calibrated apart and combined by their median, as the daemon "
            "prices them: no one submitter's jobs make the prior",
            file=sys.stderr,
        )
        if len(groups) % 2 == 0:
            print(
                f"oasis calibrate: note: {len(groups)} submitters, an even number: at each "
                "level the lower of the two middle values is taken, which a median of two "
                "cannot decide; --submitter NAME (repeated) chooses whose jobs count",
                file=sys.stderr,
            )
    return median_prior(priors, args.points, args.weight, source)


def _newest_words(whom: list[str], newest: int) -> str:
    """`` (the newest; ...)`` when ``--newest`` cut what a store's submitters (``whom``,
    one name a job; none for a trace) had, else ""."""
    if not whom or newest == 0:  # a trace: the store's modules stay unimported
        return ""
    from controller.history import newest_each

    counts = Counter(whom)
    per = newest_each(newest, len(counts))
    if per not in counts.values():
        return ""
    if len(counts) == 1:
        return " (the newest; --newest sets how many)"
    return f" (the newest {per:,} of each submitter; --newest sets how many in all)"


def run(args: argparse.Namespace) -> int:
    if (args.trace is None) == (args.store is None):
        raise InputError("give either a TRACE or --store STORE")
    if args.points > MAX_POINTS:
        raise InputError(f"--points: at most {MAX_POINTS}, got {args.points}")
    chosen = (args.first, args.last, args.newest, args.submitter)
    if args.store is None and chosen != (None, None, None, None):
        raise InputError("--newest, --from, --to and --submitter choose a store's jobs: "
                         "give --store STORE, or cut the trace itself")  # fmt: skip
    newest = DEFAULT_NEWEST if args.newest is None else args.newest
    if args.store is not None:
        jobs, cluster, whom = _from_store(args, newest)
        prior = _by_submitter(jobs, whom, cluster, args, args.source or "oasis calibrate --store")
    else:
        trace = load_trace(args.trace)
        jobs, whom = [j for j in trace.jobs if trace.late(j) is None], []
        cluster = trace.cluster
        if not jobs:
            raise InputError("no job to calibrate from (none can finish before the horizon)")
        prior = calibrate(
            jobs,
            cluster,
            weight=args.weight,
            points=args.points,
            source=args.source or f"oasis calibrate {args.trace}",
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
    print(
        f"oasis calibrate: {counted(len(jobs), 'job')}{_newest_words(whom, newest)} -> "
        "a prior worth "
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
