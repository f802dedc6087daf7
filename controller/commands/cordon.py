"""``oasis cordon SERVER`` and ``oasis uncordon SERVER``: take a server out of service
(maintenance, a suspect GPU) and put it back, without a restart (operators only).

A cordon starts at the next slot boundary: no new plans on the server, and the jobs
planned on it from then on move as after a failure (re-placed in the same slots on
other servers, else re-planned, else failed); the current slot runs as planned. It is
recorded in the store and the event log and lasts, across restarts, until ``oasis
uncordon``, which gives the server back from the next boundary, or, for a planned
maintenance, until the end given with ``--for`` or ``--until``: then only the jobs planned
on the server before that end move, new jobs may be planned on it after it at once, and
the cordon ends by itself. ``oasis servers`` shows each server's state.

    oasis cordon gpu3 --for 6h --reason "driver update"
    oasis cordon gpu3 --until 2026-12-01T06:00:00+01:00
"""

from __future__ import annotations

import argparse
from typing import Any

from controller.clock import slots_for
from controller.commands import SUMMARIES
from controller.commands.client import wait_duration
from controller.commands.common import EXIT_OK, InputError
from controller.commands.connection import Stubs, guarded, options, print_json
from controller.commands.records import slot_label
from controller.rpc import oasis_pb2 as pb
from pricing.durations import format_duration, parse_time

__all__ = ["register"]

_HOW = {"replaced": "re-placed", "replanned": "re-planned", "stranded": "failed (no room)"}


def register(sub: Any) -> None:
    """Add ``cordon`` and ``uncordon`` to ``sub`` (an argparse subparsers object)."""
    for name, run in (("cordon", cmd_cordon), ("uncordon", cmd_uncordon)):
        p = sub.add_parser(
            name,
            parents=[options()],
            help=SUMMARIES[name],
            description=__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument(
            "name", metavar="SERVER", help="a server of the daemon's [cluster] (oasis servers)"
        )
        if name == "cordon":
            p.add_argument("--reason", default="", metavar="TEXT", help="recorded in the event log")
            p.add_argument(
                "--dry-run", action="store_true", help="only show what would move; change nothing"
            )
            p.add_argument(
                "--force",
                action="store_true",
                help="cordon even if jobs would fail (room for them nowhere else); without "
                "it such a cordon is refused, naming them",
            )
            end = p.add_mutually_exclusive_group()
            end.add_argument(
                "--for",
                dest="length",
                type=_positive_duration,
                metavar="DURATION",
                help="end the cordon this long after it starts (the next slot boundary), "
                "rounded up to whole slots: 90m, 6h, 2d (default: no end)",
            )
            end.add_argument(
                "--until",
                metavar="WHEN",
                type=_when,
                help="end the cordon at this time (ISO 8601 with a UTC offset, e.g. "
                "2026-12-01T06:00:00Z; rounded up to a slot boundary) or slot number",
            )
        p.set_defaults(func=guarded(run))


def _positive_duration(text: str) -> float:
    """An argparse ``type``: a duration > 0 (see :func:`wait_duration`)."""
    value = wait_duration(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a cordon's length must be > 0, got {text!r}")
    return value


def _when(text: str) -> float | int:
    """An argparse ``type``: a slot number (int) or a time (Unix seconds, float)."""
    if text.strip().isdigit():
        return int(text)
    try:
        unix = parse_time(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if unix is None:
        raise argparse.ArgumentTypeError(
            f"not a time or a slot: {text!r} (e.g. 2026-12-01T06:00:00Z, or 1234)"
        )
    return unix


def _until_slot(args: argparse.Namespace, stubs: Stubs) -> int:
    """The slot a cordon of ``--for`` / ``--until`` ends before (0: no end)."""
    if args.length is None and args.until is None:
        return 0
    if isinstance(args.until, int):
        return args.until
    info = stubs.info()
    if info is None:
        raise InputError("this daemon does not give its slot clock: give --until as a slot")
    first = info.current_slot + 1  # where the cordon starts
    start = info.epoch + first * info.slot_seconds
    end = start + args.length if args.length is not None else float(args.until)
    until = slots_for(end - info.epoch, info.slot_seconds)  # the first slot from ``end``
    if until <= first:
        starts = slot_label(first, stubs.times())
        raise InputError(
            f"--until: the cordon starts at the next slot boundary, slot {starts}, so it "
            "must end after that"
        )
    return until


def cmd_cordon(args: argparse.Namespace) -> int:
    stubs = Stubs(args)
    request = pb.CordonServerRequest(
        server=args.name,
        reason=args.reason,
        dry_run=args.dry_run,
        force=args.force,
        until_slot=_until_slot(args, stubs),
    )
    resp = stubs.cluster.CordonServer(request, timeout=stubs.timeout)
    if args.json:
        print_json({"server": resp.server, "from_slot": resp.from_slot,
                    "until_slot": resp.until_slot or None, "already": resp.already,
                    "dry_run": resp.dry_run,
                    "moved": [{"id": m.id, "how": m.how} for m in resp.moved]})  # fmt: skip
        return EXIT_OK
    times = stubs.times()
    since = slot_label(resp.from_slot, times)
    if resp.until_slot:
        span = resp.until_slot - resp.from_slot
        length = f", {format_duration(span * times.slot_seconds)}" if times else ""
        since += f" until slot {slot_label(resp.until_slot, times)} ({span} slots{length})"
    if resp.already:
        print(f"{resp.server}: cordoned already, from slot {since}; nothing changed")
        if request.until_slot != resp.until_slot:  # the end asked for is not the one it has
            print(f"to give it another end, oasis uncordon {resp.server} first")
        return EXIT_OK
    if resp.dry_run:
        n = len(resp.moved)
        print(f"{resp.server}: a cordon from slot {since} would move {n or 'no'} "
              f"job{'' if n == 1 else 's'}; nothing changed (--dry-run)")  # fmt: skip
    else:
        back = "it is back then by itself; oasis uncordon" if resp.until_slot else "oasis uncordon"
        print(f"{resp.server}: cordoned from slot {since}: no new plans there ({back} "
              f"{resp.server} gives it back)")  # fmt: skip
        if not resp.moved:
            print("no job was planned on it")
    for m in resp.moved:
        print(f"  {m.id}: {_HOW.get(m.how, m.how)}")
    return EXIT_OK


def cmd_uncordon(args: argparse.Namespace) -> int:
    stubs = Stubs(args)
    resp = stubs.cluster.UncordonServer(
        pb.UncordonServerRequest(server=args.name), timeout=stubs.timeout
    )
    if args.json:
        print_json({"server": resp.server, "from_slot": resp.from_slot or None,
                    "already": resp.already, "failed": resp.failed})  # fmt: skip
        return EXIT_OK
    failed = " (its agent is silent: it stays out until heard again)" if resp.failed else ""
    if resp.already:
        print(f"{resp.server}: not cordoned; nothing changed{failed}")
    else:
        since = slot_label(resp.from_slot, stubs.times())
        print(f"{resp.server}: back in service from slot {since}{failed}")
    return EXIT_OK
