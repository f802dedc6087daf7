"""``oasis gen``: a seeded synthetic trace in the paper's simulation setting (SPEC 6).

A thin wrapper over :func:`pricing.workload.generate_trace`, whose docstring lists every
parameter range (EC2-like servers, job sizes, the utility mix, Google-trace-shaped
arrivals). The same flags and seed give the same bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

import numpy as np

from controller.commands import SUMMARIES
from controller.commands.common import (
    EXIT_OK,
    InputError,
    counted,
    int_at_least,
    positive_seconds,
    write_output,
)
from pricing.ledger import ledger_bytes_of, ledger_need
from pricing.trace import MAX_LEDGER_BYTES
from pricing.workload import RESOURCES, generate_trace

__all__ = ["parse_mix", "parse_share", "register", "run"]

DEFAULT_SEED = 1
PROGRESS_SECONDS = 10.0
"""Seconds between two progress lines on stderr: 10^6 jobs drew for 3-4 minutes in
silence (100,000 took 21 s on a shared 2-core machine)."""

PRICING_MODES = ("oracle", "estimate")
"""``oracle``: SPEC 4 bounds over every job of the trace; ``estimate``: the daemon's
online estimate over the jobs seen so far (``pricing/bound_estimate.py``)."""


def parse_mix(text: str) -> tuple[float, float, float]:
    """``"A,B,C"``: shares of time-insensitive, -sensitive and -critical jobs.

    Three finite non-negative numbers summing to 1 (within 1e-6); ArgumentTypeError
    otherwise.
    """
    parts = text.split(",")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"must be three numbers A,B,C, got {text!r}")
    try:
        a, b, c = (float(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not three numbers: {text!r}") from None
    shares = (a, b, c)
    if not all(math.isfinite(x) and x >= 0 for x in shares):
        raise argparse.ArgumentTypeError(f"shares must be non-negative, got {text!r}")
    if abs(sum(shares) - 1.0) > 1e-6:
        raise argparse.ArgumentTypeError(f"shares must sum to 1, got {sum(shares):g}")
    total = sum(shares)
    if abs(total - 1.0) <= 1e-9:
        return shares
    # generate_trace checks the sum to 1e-9: absorb rounding of the given digits
    return (a / total, b / total, c / total)


def parse_share(text: str) -> float:
    """A share of the cluster in (0, 1]; ArgumentTypeError otherwise."""
    try:
        share = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < share <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    return share


def register(sub: Any) -> None:
    """Add the ``gen`` subcommand to ``sub`` (an argparse subparsers object)."""
    p = sub.add_parser(
        "gen",
        help=SUMMARIES["gen"],
        description=(
            "Write a SPEC 6 trace drawn with pricing.workload.generate_trace: EC2-like GPU "
            "worker servers and C4 parameter-server servers, the paper's job parameter "
            "ranges, sigmoid utilities, and arrivals with a daily cycle and bursts as in "
            "the Google cluster trace. The same flags and seed give the same bytes. "
            "Defaults are the paper's scale."
        ),
    )
    p.add_argument("--jobs", type=int_at_least(1), default=300, help="jobs (default: 300)")
    p.add_argument(
        "--worker-servers",
        type=int_at_least(1),
        default=50,
        metavar="N",
        help="GPU worker servers (default: 50)",
    )
    p.add_argument(
        "--ps-servers",
        type=int_at_least(1),
        default=50,
        metavar="N",
        help="parameter-server servers (default: 50)",
    )
    p.add_argument("--horizon", type=int_at_least(1), default=300, help="slots T (default: 300)")
    p.add_argument(
        "--slot-seconds",
        type=positive_seconds,
        default=3600.0,
        metavar="SECONDS",
        help="slot length (default: 3600)",
    )
    p.add_argument(
        "--mix",
        type=parse_mix,
        default=(0.10, 0.55, 0.35),
        metavar="A,B,C",
        help="shares of time-insensitive, -sensitive and -critical jobs, summing to 1 "
        "(default: 0.1,0.55,0.35)",
    )
    p.add_argument(
        "--max-share",
        type=parse_share,
        default=None,
        metavar="S",
        help="small jobs, as the paper's Theorem 4 assumes: lower each job's chunks until "
        "its most workers per slot and their PS take at most this share of the cluster's "
        "total of every resource (default: the paper's job sizes)",
    )
    p.add_argument(
        "--seed",
        type=int_at_least(0),
        default=DEFAULT_SEED,
        help=f"seed of numpy.random.default_rng (default: {DEFAULT_SEED})",
    )
    p.add_argument(
        "--pricing",
        choices=PRICING_MODES,
        default="oracle",
        help="price bounds the trace asks for: oracle (SPEC 4 over all jobs, the "
        "default) or estimate (the daemon's estimate over the jobs seen so far)",
    )
    p.add_argument(
        "-o", "--output", metavar="FILE", default="-", help="write here (default: stdout)"
    )
    p.add_argument("--compact", action="store_true", help="one line of JSON, no indent")
    p.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help=f"no progress on stderr (a line every {PROGRESS_SECONDS:g} s of drawing)",
    )
    p.set_defaults(func=run)


MAX_GEN_JOBS = 10**6
"""The most jobs ``oasis gen`` draws (the longest history measured, bench/RESULTS.md)."""


def run(args: argparse.Namespace) -> int:
    # the daemon's longest slot (longer ones made the burst arrivals' draw run for hours)
    from controller.config import MAX_SLOT_SECONDS

    if args.slot_seconds > MAX_SLOT_SECONDS:
        raise InputError(f"--slot-seconds: at most {MAX_SLOT_SECONDS:.0f} (366 days), as "
                         f"daemon.slot_seconds; got {args.slot_seconds:g}")  # fmt: skip
    # what a replay can take, checked before drawing: --jobs 100000000 or 10^6 servers
    # drew for minutes into gigabytes a trace no replay reads (the offline tools' audit)
    if args.jobs > MAX_GEN_JOBS:
        raise InputError(f"--jobs: at most {MAX_GEN_JOBS:,}, got {args.jobs:,}")
    resources = len(RESOURCES)  # the paper's five
    need = ledger_bytes_of(args.worker_servers, args.ps_servers, resources, args.horizon)
    servers = args.worker_servers + args.ps_servers
    if need > MAX_LEDGER_BYTES:
        raise InputError(
            "--horizon / --worker-servers / --ps-servers: "
            f"{ledger_need(args.horizon, servers, need)} to replay, over the "
            f"{MAX_LEDGER_BYTES / 2**30:g} GiB a trace may take"
        )
    shown = time.monotonic()

    def drawn(count: int) -> None:
        nonlocal shown
        if args.progress and time.monotonic() - shown >= PROGRESS_SECONDS:
            shown = time.monotonic()
            print(f"oasis gen: drew {count:,} of {args.jobs:,} jobs", file=sys.stderr,
                  flush=True)  # fmt: skip

    try:
        trace = generate_trace(
            np.random.default_rng(args.seed),
            n_jobs=args.jobs,
            n_worker_servers=args.worker_servers,
            n_ps_servers=args.ps_servers,
            horizon=args.horizon,
            slot_seconds=args.slot_seconds,
            mix=args.mix,
            max_share=args.max_share,
            progress=drawn,
        )
    except ValueError as err:
        # the only flag-dependent failure left: slots too short for the paper's jobs
        raise InputError(f"--slot-seconds / --horizon: {err}") from err
    trace["pricing"] = {"bounds": args.pricing}
    text = json.dumps(trace, indent=None if args.compact else 1) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
        where = "stdout"
    else:
        write_output(args.output, text)
        where = args.output
    print(
        f"oasis gen: {counted(args.jobs, 'job')}, {args.worker_servers} worker + "
        f"{args.ps_servers} PS servers, horizon {counted(args.horizon, 'slot')} of "
        f"{args.slot_seconds:g} s, seed {args.seed}, "
        f"{args.pricing} bounds -> {where}",
        file=sys.stderr,
    )
    return EXIT_OK
