"""``oasis progress ID``: a job's reported progress and its runtime estimate.

The node agents report mini-batches done and worker-seconds spent; the daemon regresses
time on work (pricing/runtime_estimate.py, a Bayesian linear regression) and keeps the
estimate of one mini-batch's time and of the whole job's worker-seconds, each with a
credible interval. Needs a daemon with an execution plane (an ``[mqtt]`` broker).

A job whose worker commands fail on a server (exit not 0, killed, could not start,
stopped by the agent's memory guard) gets a line per such server, as its agent last
said: ``workers failing on w0: 6 times, last: exit status 1 (12s ago)``; none when
none failed (or the daemon has not heard of it since it started).
"""

from __future__ import annotations

import argparse
from typing import Any

from controller.commands import SUMMARIES
from controller.commands.common import EXIT_OK
from controller.commands.connection import Stubs, guarded, options, print_json
from controller.commands.records import plain, state_name
from controller.rpc import oasis_pb2 as pb

__all__ = ["register", "render"]


def register(sub: Any) -> None:
    """Add the ``progress`` subcommand to ``sub`` (an argparse subparsers object)."""
    help_ = SUMMARIES["progress"]
    p = sub.add_parser("progress", parents=[options()], help=help_, description=help_)
    p.add_argument("id", help="job id (with tokens, an operator's NAME:ID)")
    p.set_defaults(func=guarded(run))


def _interval(e: pb.Estimate, unit: str) -> str:
    return f"{e.mean:.4g} {unit} ({e.level:.0%} interval {e.low:.4g} .. {e.high:.4g})"


def render(p: pb.JobProgress) -> str:
    """The progress of one job as lines for people."""
    state = state_name(p.state)
    share = p.minibatches_done / p.minibatches_total if p.minibatches_total else 0.0
    lines = [
        f"{p.id}: {state}",
        f"  done            {p.minibatches_done:.6g} of {p.minibatches_total} mini-batches "
        f"({share:.1%}), {p.worker_seconds:.6g} worker-seconds reported in {p.reports} reports",
        f"  one mini-batch  planned {p.planned_minibatch_seconds:.4g} s; estimated "
        + _interval(p.minibatch_seconds, "s"),
        f"  whole job       planned {p.planned_worker_seconds:.6g} worker-seconds; estimated "
        + _interval(p.total_worker_seconds, "worker-seconds"),
    ]
    if p.HasField("completion_slot"):
        lines.append(f"  completes in    slot {p.completion_slot} (as planned now)")
    lines += [_failing(f) for f in p.worker_failures]
    return "\n".join(lines)


def _failing(f: pb.WorkerFailures) -> str:
    """One server's failing workers as a line (its text escaped by the daemon)."""
    times = "once" if f.failures == 1 else f"{f.failures} times"
    last = f", last: {f.last_failure}" if f.last_failure else ""
    return f"  workers failing on {f.server}: {times}{last} ({f.seconds_ago:.0f}s ago)"


def run(args: argparse.Namespace) -> int:
    stubs = Stubs(args)
    reply = stubs.admission.GetProgress(pb.GetProgressRequest(id=args.id), timeout=stubs.timeout)
    if args.json:
        print_json(plain(reply.progress))
    else:
        print(render(reply.progress))
    return EXIT_OK
