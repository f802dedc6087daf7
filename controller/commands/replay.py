"""``oasis replay TRACE``: decide every job of a trace with the online algorithm, or
simulate it under one of the paper's baselines (``--policy``)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

from controller.commands import SUMMARIES
from controller.commands.common import (
    EXIT_OK,
    add_search_limit,
    counted,
    fmt,
    json_document,
    load_trace,
    quiet_native_stdout,
    search_limits,
)
from controller.replay import (
    ReplayRecord,
    baseline_json,
    baseline_summary,
    replay,
    replay_baseline,
    replay_json,
    summary,
)
from controller.table import render_table
from controller.terminal import unfiltered
from pricing.baselines import POLICIES, Outcome

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``replay`` subcommand to ``sub`` (an argparse subparsers object)."""
    p = sub.add_parser(
        "replay",
        help=SUMMARIES["replay"],
        description="Decide every job of TRACE in order (SPEC 6) and print the decisions.",
    )
    p.add_argument("trace", metavar="TRACE", help="trace file (JSON, SPEC 6), or - for stdin")
    p.add_argument(
        "--policy",
        choices=["oasis", *POLICIES],
        default="oasis",
        help="oasis (default), or a baseline of the paper's section V-A simulated slot by "
        "slot: fifo, drf, rrh, dorm, or rrh-np (RRH without its free pause and resume); "
        "payoff and cost are then null",
    )
    p.add_argument("--json", action="store_true", help="print SPEC 6 JSON instead of a table")
    p.add_argument("--compact", action="store_true", help="with --json: one line, no indent")
    p.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress on stderr"
    )
    add_search_limit(p)
    p.set_defaults(func=run)


_HEADERS = ["job", "arrival", "decision", "payoff", "cost", "jct", "utility", "peak_w", "ms"]
_RIGHT = {1, 3, 4, 5, 6, 7, 8}

UNSCHEDULABLE_SHOWN = 10
"""Jobs rejected with no schedule found (none feasible, or not searched) whose reasons
the table lists at most."""


def _unschedulable(records: list[ReplayRecord], out: TextIO) -> None:
    """Why the jobs with no schedule found (payoff ``-``: none is feasible, or the job
    was not searched, over ``--max-search-steps`` or ``--max-search-mb``) were rejected: the
    table said only ``reject``, and a job whose work could never fit the horizon (a
    ``tau`` in seconds, not slots) looked like one priced out."""
    none = [r for r in records if not r.decision.admitted and r.decision.best.payoff is None]
    if not none:
        return
    # "without any feasible schedule" was said of a job refused unsearched too (over
    # --max-search-steps), which the offline optimum then ran
    print(f"\n{counted(len(none), 'job')} rejected with no schedule found (payoff -):", file=out)
    for r in none[:UNSCHEDULABLE_SHOWN]:
        print(f"  {r.decision.job.id}: {r.reason}", file=out)
    if len(none) > UNSCHEDULABLE_SHOWN:
        more = len(none) - UNSCHEDULABLE_SHOWN
        print(f"  ... and {more:,} more (--json gives every rejection's reason)", file=out)


def _replay_table(records: list[ReplayRecord], out: TextIO) -> None:
    rows = []
    for r in records:
        d = r.decision
        b = d.best
        peak = int(b.schedule.worker_counts().max()) if d.admitted and b.schedule else 0
        rows.append(
            [
                d.job.id,
                str(d.job.arrival),
                "admit" if d.admitted else "reject",
                fmt(b.payoff),
                fmt(b.cost if d.admitted else None),
                str(b.jct) if d.admitted else "-",
                fmt(b.utility if d.admitted else None),
                str(peak) if d.admitted else "-",
                f"{r.decision_ms:.2f}",
            ]
        )
    print(render_table(_HEADERS, rows, right=_RIGHT), file=out)
    s = summary(records)
    print(
        f"\n{s['admitted']} admitted, {s['rejected']} rejected; total utility "
        f"{s['total_utility']:.6g}; decision time p50 {s['decision_ms_p50']:.2f} ms, "
        f"p99 {s['decision_ms_p99']:.2f} ms",
        file=out,
    )
    _unschedulable(records, out)


def _baseline_table(outcomes: list[Outcome], out: TextIO) -> None:
    rows = []
    for o in outcomes:
        peak = int(o.schedule.worker_counts().max()) if o.schedule else 0
        if not o.admitted:
            decision = "reject"
        elif o.jct is None:
            decision = "unfinished"
        else:
            decision = "done"
        rows.append(
            [
                o.job.id,
                str(o.job.arrival),
                decision,
                "-",
                "-",
                str(o.jct) if o.jct is not None else "-",
                fmt(o.utility),
                str(peak) if o.schedule else "-",
                f"{o.decision_ms:.2f}",
            ]
        )
    print(render_table(_HEADERS, rows, right=_RIGHT), file=out)
    s = baseline_summary(outcomes)
    print(
        f"\n{s['admitted']} admitted ({s['unfinished']} unfinished by the horizon), "
        f"{s['rejected']} rejected; total utility {s['total_utility']:.6g}; re-plan time "
        f"at arrival p50 {s['decision_ms_p50']:.2f} ms, p99 {s['decision_ms_p99']:.2f} ms",
        file=out,
    )


def _run_baseline(args: argparse.Namespace) -> int:
    trace = load_trace(args.trace)
    # as run()'s: Dorm re-plans with a MILP at every event, and 2,000 jobs over 168
    # slots took 207 s without a word on stderr
    in_place = args.progress and not args.json and sys.stderr.isatty()
    lines = args.progress and not in_place
    shown = time.monotonic()

    def replanned(slot: int) -> None:
        nonlocal shown
        if in_place:
            print(f"\r{args.policy}: slot {slot}/{trace.horizon - 1}", end="",
                  file=unfiltered(sys.stderr), flush=True)  # fmt: skip
        elif lines and time.monotonic() - shown >= PROGRESS_SECONDS:
            shown = time.monotonic()
            print(f"oasis replay: {args.policy} at slot {slot:,} of 0..{trace.horizon - 1:,}",
                  file=sys.stderr, flush=True)  # fmt: skip

    try:
        with quiet_native_stdout():  # Dorm's MILP solver prints its banner there
            outcomes = replay_baseline(trace, args.policy, progress=replanned)
    finally:  # ended by Ctrl-C too: its "interrupted" on a line of its own
        if in_place:
            print(file=sys.stderr)
    if args.json:
        print(json_document(baseline_json(trace, outcomes), args.compact))
    else:
        _baseline_table(outcomes, sys.stdout)
    return EXIT_OK


PROGRESS_SECONDS = 10.0
"""Seconds between two progress lines of a replay whose stderr is no terminal."""


def run(args: argparse.Namespace) -> int:
    if args.policy != "oasis":
        return _run_baseline(args)
    trace = load_trace(args.trace)
    records: list[ReplayRecord] = []
    total = len(trace.jobs)
    # on a terminal a count updated in place; else (a log, or --json on a terminal) a line
    # every PROGRESS_SECONDS, so long work is never silent (150,000 jobs took a minute)
    in_place = args.progress and not args.json and sys.stderr.isatty()
    lines = args.progress and not in_place
    shown = time.monotonic()
    steps, mb = search_limits(args)
    decided = replay(trace, max_search_steps=steps, max_search_mb=mb)
    try:
        for i, record in enumerate(decided, 1):
            records.append(record)
            if in_place:
                print(f"\rdecided {i}/{total}", end="", file=unfiltered(sys.stderr), flush=True)
            elif lines and time.monotonic() - shown >= PROGRESS_SECONDS:
                shown = time.monotonic()
                print(f"oasis replay: decided {i:,} of {total:,} jobs", file=sys.stderr,
                      flush=True)  # fmt: skip
    finally:  # ended by Ctrl-C too: its "interrupted" on a line of its own, not after the count
        if in_place:
            print(file=sys.stderr)
    if args.json:
        # one write: the output filter (controller/terminal.py) costs a call per write
        print(json_document(replay_json(trace, records), args.compact))
    else:
        _replay_table(records, sys.stdout)
    return EXIT_OK
