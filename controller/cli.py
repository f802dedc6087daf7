"""``oasis``: the command-line client and tools.

Exit status: 0 on success, 2 on bad input (the message names the field), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from controller.replay import ReplayRecord, replay, replay_json, summary
from controller.table import render_table
from pricing import SpecError, Trace, trace_from_dict

__all__ = ["main"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2


class InputError(Exception):
    """Input the command cannot use; the message is shown as is."""


def load_trace(path: str) -> Trace:
    """Read and validate a trace file (``-`` reads standard input)."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror or err}") from err
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(
            f"{path}: not JSON: {err.msg} at line {err.lineno} column {err.colno}"
        ) from err
    try:
        return trace_from_dict(data)
    except SpecError as err:
        lines = "\n".join(f"  {p}" for p in err.problems)
        raise InputError(f"{path}: invalid trace:\n{lines}") from err


def _fmt(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


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
                _fmt(b.payoff),
                _fmt(b.cost if d.admitted else None),
                str(b.jct) if d.admitted else "-",
                _fmt(b.utility if d.admitted else None),
                str(peak) if d.admitted else "-",
                f"{r.decision_ms:.2f}",
            ]
        )
    headers = ["job", "arrival", "decision", "payoff", "cost", "jct", "utility", "peak_w", "ms"]
    print(render_table(headers, rows, right={1, 3, 4, 5, 6, 7, 8}), file=out)
    s = summary(records)
    print(
        f"\n{s['admitted']} admitted, {s['rejected']} rejected; total utility "
        f"{s['total_utility']:.6g}; decision time p50 {s['decision_ms_p50']:.2f} ms, "
        f"p99 {s['decision_ms_p99']:.2f} ms",
        file=out,
    )


def cmd_replay(args: argparse.Namespace) -> int:
    trace = load_trace(args.trace)
    records: list[ReplayRecord] = []
    total = len(trace.jobs)
    progress = args.progress and not args.json and sys.stderr.isatty()
    for i, record in enumerate(replay(trace), 1):
        records.append(record)
        if progress:
            print(f"\rdecided {i}/{total}", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    if args.json:
        json.dump(replay_json(trace, records), sys.stdout, indent=None if args.compact else 1)
        print()
    else:
        _replay_table(records, sys.stdout)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oasis", description="Online admission control for shared ML clusters (OASiS)."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser(
        "replay",
        help="decide every job of a trace with the online algorithm",
        description="Decide every job of TRACE in order (SPEC 6) and print the decisions.",
    )
    p.add_argument("trace", metavar="TRACE", help="trace file (JSON, SPEC 6), or - for stdin")
    p.add_argument("--json", action="store_true", help="print SPEC 6 JSON instead of a table")
    p.add_argument("--compact", action="store_true", help="with --json: one line, no indent")
    p.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress on stderr"
    )
    p.set_defaults(func=cmd_replay)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except InputError as err:
        print(f"oasis {args.command}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return EXIT_FAILURE
    return code


def _run() -> None:  # pragma: no cover - console entry
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    _run()
