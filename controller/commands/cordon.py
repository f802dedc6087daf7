"""``oasis cordon SERVER`` and ``oasis uncordon SERVER``: take a server out of service
(maintenance, a suspect GPU) and put it back, without a restart (operators only).

A cordon starts at the next slot boundary: no new plans on the server, and the jobs
planned on it from then on move as after a failure (re-placed in the same slots on
other servers, else re-planned, else failed); the current slot runs as planned. It is
recorded in the store and the event log and lasts, across restarts, until ``oasis
uncordon``, which gives the server back from the next boundary. ``oasis servers`` shows
each server's state.
"""

from __future__ import annotations

import argparse
from typing import Any

from controller.commands import SUMMARIES
from controller.commands.common import EXIT_OK
from controller.commands.connection import Stubs, guarded, options, print_json
from controller.commands.records import slot_label
from controller.rpc import oasis_pb2 as pb

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
        p.set_defaults(func=guarded(run))


def cmd_cordon(args: argparse.Namespace) -> int:
    stubs = Stubs(args)
    request = pb.CordonServerRequest(
        server=args.name, reason=args.reason, dry_run=args.dry_run, force=args.force
    )
    resp = stubs.cluster.CordonServer(request, timeout=stubs.timeout)
    if args.json:
        print_json({"server": resp.server, "from_slot": resp.from_slot, "already": resp.already,
                    "dry_run": resp.dry_run,
                    "moved": [{"id": m.id, "how": m.how} for m in resp.moved]})  # fmt: skip
        return EXIT_OK
    since = slot_label(resp.from_slot, stubs.times())
    if resp.already:
        print(f"{resp.server}: cordoned already, from slot {since}; nothing changed")
        return EXIT_OK
    if resp.dry_run:
        n = len(resp.moved)
        print(f"{resp.server}: a cordon from slot {since} would move {n or 'no'} "
              f"job{'' if n == 1 else 's'}; nothing changed (--dry-run)")  # fmt: skip
    else:
        print(f"{resp.server}: cordoned from slot {since}: no new plans there (oasis "
              f"uncordon {resp.server} gives it back)")  # fmt: skip
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
