"""``oasis cordon SERVER...`` and ``oasis uncordon SERVER...``: take servers out of
service (maintenance, a suspect GPU) and put them back, without a restart (operators
only).

A cordon starts at the next slot boundary: no new plans on the server, and the jobs
planned on it from then on move as after a failure (re-placed in the same slots on
other servers, else re-planned, else failed); the current slot runs as planned. It is
recorded in the store and the event log and lasts, across restarts, until ``oasis
uncordon``, which gives the server back from the next boundary, or, for a planned
maintenance, until the end given with ``--for`` or ``--until``: then only the jobs planned
on the server before that end move, new jobs may be planned on it after it at once, and
the cordon ends by itself. With ``--from`` a cordon is planned to start later: the jobs
planned on the server from then move now, no new plan uses it from then, and it stays in
service until then (``oasis uncordon`` cancels it). ``oasis servers`` shows each
server's state and any cordon planned.

Servers named together are cordoned in one step (a rack's maintenance): every one is
out before any job moves, so a job moves once and never onto another of them. One at a
time, a job could move from the first server onto the second, then again.

    oasis cordon gpu3 --for 6h --reason "driver update"
    oasis cordon gpu1 gpu2 gpu3 gpu4 --reason "rack 7 PDU swap" --dry-run
    oasis cordon gpu3 --until 2026-12-01T06:00:00+01:00
    oasis cordon gpu3 --from 2026-12-05T22:00:00Z --for 4h --reason "PSU swap"
"""

from __future__ import annotations

import argparse
from typing import Any

from controller.clock import slots_for
from controller.commands import SUMMARIES
from controller.commands.client import wait_duration
from controller.commands.common import (
    EXIT_OK,
    INT64_MAX,
    InputError,
    counted,
    int_at_least,
    plain_doc,
)
from controller.commands.connection import Stubs, guarded, options, print_json
from controller.commands.records import slot_label
from controller.rpc import oasis_pb2 as pb
from pricing.durations import format_duration, format_time, parse_time

__all__ = ["register"]

_HOW = {"replaced": "re-placed", "replanned": "re-planned", "stranded": "failed (no room)"}


def register(sub: Any) -> None:
    """Add ``cordon`` and ``uncordon`` to ``sub`` (an argparse subparsers object)."""
    for name, run in (("cordon", cmd_cordon), ("uncordon", cmd_uncordon)):
        p = sub.add_parser(
            name,
            parents=[options()],
            help=SUMMARIES[name],
            description=plain_doc(__doc__),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument(
            "names",
            metavar="SERVER",
            nargs="+",
            help="servers of the daemon's [cluster] (oasis servers)"
            + (": cordoned together, in one step" if name == "cordon" else ""),
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
            p.add_argument(
                "--from",
                dest="start",
                metavar="WHEN",
                type=_when,
                help="start the cordon at this time (ISO 8601 with a UTC offset, rounded up "
                "to a slot boundary) or slot number, instead of the next slot boundary",
            )
            end = p.add_mutually_exclusive_group()
            end.add_argument(
                "--for",
                dest="length",
                type=_positive_duration,
                metavar="DURATION",
                help="end the cordon this long after it starts (--from, or the next slot "
                "boundary), rounded up to whole slots: 90m, 6h, 2d; a bare number is seconds, "
                "not slots as --from and --until read it (default: no end)",
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
    """An argparse ``type``: a slot number (int, ASCII digits) or a time (Unix seconds,
    float)."""
    if text.strip().isascii() and text.strip().isdigit():
        return int_at_least(0)(text)
    try:
        unix = parse_time(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if unix is None:
        raise argparse.ArgumentTypeError(
            f"not a time or a slot: {text!r} (e.g. 2026-12-01T06:00:00Z, or 1234)"
        )
    return unix


def _span(args: argparse.Namespace, stubs: Stubs) -> tuple[int, int]:
    """The slots a cordon asked for starts in (0: the next) and ends before (0: no end),
    from ``--from`` and ``--for`` / ``--until``."""
    if args.start is None and args.length is None and args.until is None:
        return 0, 0
    if isinstance(args.start, int) and args.start == 0:
        _check_slot_zero(stubs)
    if all(isinstance(x, int) or x is None for x in (args.start, args.until)) and (
        args.length is None
    ):
        first, until = args.start or 0, args.until or 0  # slots: the daemon checks them
        if args.until == 0:  # 0 is "no end" in the request: an end mistyped, not none
            raise InputError(
                "--until: must be after the slot the cordon starts in (the "
                "next one at the earliest), got slot 0; leave --for and --until "
                "out for a cordon without an end"
            )
        if first and until and until <= first:
            raise InputError(f"--until {until} is not after --from {first}")
        return first, until
    info = stubs.info()
    if info is None:
        raise InputError("this daemon does not give its slot clock: give --from and "
                         "--until as slots")  # fmt: skip
    times = stubs.times()
    first = info.current_slot + 1  # the next slot boundary
    start = args.start
    if isinstance(start, float):  # a time: the first boundary at or after it
        start = slots_for(start - info.epoch, info.slot_seconds)
        if start < info.current_slot:  # a mistyped date: not "at the next boundary"
            raise InputError(
                f"--from: {format_time(args.start)} is before the current slot, "
                f"{slot_label(info.current_slot, times)}: a cordon cannot start in the past; "
                "give a later time, or leave --from out to cordon from the next slot boundary"
            )
    planned = start is not None and start > first
    if planned:
        first = start
    if args.length is not None:
        end: float | int = info.epoch + first * info.slot_seconds + args.length
    else:
        end = args.until if args.until is not None else 0
    until = slots_for(end - info.epoch, info.slot_seconds) if isinstance(end, float) else end
    if until > INT64_MAX:  # a --for no request can carry (a traceback before)
        raise InputError(f"--for: {args.length:.4g} s ends past the last slot there can be "
                         f"(slot {INT64_MAX})")  # fmt: skip
    if (args.length is not None or args.until is not None) and until <= first:
        # an end at slot 0 (the epoch) too: sent as 0, it was a cordon without an end
        starts = slot_label(first, times)
        when = "at --from" if planned else "at the next slot boundary"
        raise InputError(f"--until: the cordon starts {when}, slot {starts}, so it must "
                         "end after that")  # fmt: skip
    return (first if planned else 0), until


def _check_slot_zero(stubs: Stubs) -> None:
    """InputError for ``--from 0`` once slot 0 is past. The request's ``from_slot`` 0
    means "the next boundary" (the field's default), so the daemon cannot refuse it as it
    refuses any other slot before the current one: ``--from 0`` cordoned at once, moving
    every job planned on the server from the next slot, where a later slot before the
    current one is refused."""
    info = stubs.info()
    if info is None or info.current_slot == 0:
        return  # slot 0 is the current one: the next boundary, as a time in it rounds up
    raise InputError(
        f"--from: slot 0 is before the current slot, "
        f"{slot_label(info.current_slot, stubs.times())}: a cordon cannot start in the "
        "past; give a later slot, or leave --from out to cordon from the next slot boundary"
    )


def _check_daemon_reads(stubs: Stubs, request: pb.CordonServerRequest) -> None:
    """InputError, nothing changed, if the daemon does not know a cordon's start or end,
    or several servers at once (an oasisd older than this client: between an upgrade's
    install and its restart). It ignored ``from_slot`` and ``until_slot`` and cordoned at
    once and for good, moving every job off the server (the upgrade audit), and it
    ignores ``more_servers``, cordoning the first server alone. A dry run shows whether
    it reads them."""
    probe = pb.CordonServerRequest()
    probe.CopyFrom(request)
    probe.dry_run = True
    resp = stubs.cluster.CordonServer(probe, timeout=stubs.timeout)
    if request.more_servers and not resp.servers:
        raise InputError(
            "the daemon does not cordon several servers in one call (it runs an older "
            "oasis than this client; restart it on the new version): nothing was changed; "
            "name one server a call meanwhile"
        )
    if resp.already:  # the cordon there answers for itself
        return
    # an older daemon answers with no end and the next slot; a newer one echoes the end,
    # and starts at the next slot a --from that is not after it
    if (request.until_slot and not resp.until_slot) or request.from_slot > resp.from_slot:
        raise InputError(
            "--from / --for / --until: the daemon does not know a cordon's start or end "
            "(it runs an older oasis than this client; restart it on the new version): "
            "nothing was changed; without them the cordon starts at the next slot and "
            "lasts until oasis uncordon"
        )


def cmd_cordon(args: argparse.Namespace) -> int:
    stubs = Stubs(args)
    # the daemon's problems name the request's fields: name the options that set them
    args.api_flags = {"from_slot": "--from", "until_slot": "--for" if args.length else "--until"}
    first, until = _span(args, stubs)
    names = list(dict.fromkeys(args.names))
    request = pb.CordonServerRequest(
        server=names[0],
        reason=args.reason,
        dry_run=args.dry_run,
        force=args.force,
        until_slot=until,
        from_slot=first,
        more_servers=names[1:],
    )
    if (until or first or len(names) > 1) and not args.dry_run:
        _check_daemon_reads(stubs, request)
    resp = stubs.cluster.CordonServer(request, timeout=stubs.timeout)
    if len(names) > 1 and not resp.servers:  # a dry run of an older daemon: the first alone
        raise InputError("the daemon does not cordon several servers in one call (it runs "
                         "an older oasis than this client): its dry run was of "
                         f"{names[0]} alone")  # fmt: skip
    servers = list(resp.servers) or [resp.server]
    already = list(resp.already_servers)
    if args.json:
        print_json({"server": resp.server, "servers": servers, "already_servers": already,
                    "from_slot": resp.from_slot, "until_slot": resp.until_slot or None,
                    "already": resp.already, "dry_run": resp.dry_run,
                    "moved": [{"id": m.id, "how": m.how} for m in resp.moved]})  # fmt: skip
        return EXIT_OK
    times = stubs.times()
    info = stubs.info()
    planned = info is not None and resp.from_slot > info.current_slot + 1
    since = slot_label(resp.from_slot, times)
    if resp.until_slot:
        span = resp.until_slot - resp.from_slot
        length = f", {format_duration(span * times.slot_seconds)}" if times else ""
        since += (
            f" until slot {slot_label(resp.until_slot, times)} ({counted(span, 'slot')}{length})"
        )
    if resp.already:
        which = "a cordon is planned already" if planned else "cordoned already"
        if len(servers) > 1:
            print(f"{', '.join(servers)}: each cordoned already; nothing changed")
            return EXIT_OK
        print(f"{resp.server}: {which}, from slot {since}; nothing changed")
        asked = request.from_slot or (info.current_slot + 1 if info is not None else 0)
        if request.until_slot != resp.until_slot or asked not in (0, resp.from_slot):
            print(f"to change it, oasis uncordon {resp.server} first")
        return EXIT_OK
    for name in already:
        print(f"{name}: cordoned already; left as it was (oasis uncordon {name} first to "
              "change it)")  # fmt: skip
    out = [name for name in servers if name not in already]
    named = ", ".join(out)
    it = "it" if len(out) == 1 else "them"
    if resp.dry_run:
        n = len(resp.moved)
        print(f"{named}: a cordon from slot {since} would move {n or 'no'} "
              f"job{'' if n == 1 else 's'}; nothing changed (--dry-run)")  # fmt: skip
    else:
        back = "it is back then by itself; oasis uncordon" if resp.until_slot else "oasis uncordon"
        if len(out) > 1:
            back = back.replace("it is", "they are")
        if planned:
            print(f"{named}: cordon planned from slot {since}: in service until then, "
                  f"no new plans there from then (oasis uncordon {' '.join(out)} cancels "
                  f"{it})")  # fmt: skip
        else:
            print(f"{named}: cordoned from slot {since}: no new plans there ({back} "
                  f"{' '.join(out)} gives {it} back)")  # fmt: skip
        if not resp.moved:
            print(
                f"no job was planned on {out[0] if len(out) == 1 else 'them'}"
                + (" then" if planned else "")
            )
    for m in resp.moved:
        print(f"  {m.id}: {_HOW.get(m.how, m.how)}")
    return EXIT_OK


def cmd_uncordon(args: argparse.Namespace) -> int:
    """Uncordon each server named, one call each (giving capacity back moves no job)."""
    stubs = Stubs(args)
    answers = []
    for name in dict.fromkeys(args.names):
        resp = stubs.cluster.UncordonServer(
            pb.UncordonServerRequest(server=name), timeout=stubs.timeout
        )
        answers.append({"server": resp.server, "from_slot": resp.from_slot or None,
                        "already": resp.already, "failed": resp.failed,
                        "planned": resp.planned})  # fmt: skip
        if args.json:
            continue
        failed = " (its agent is silent: it stays out until heard again)" if resp.failed else ""
        if resp.already:
            print(f"{resp.server}: not cordoned; nothing changed{failed}")
        elif resp.planned:
            print(f"{resp.server}: the planned cordon is cancelled{failed}")
        else:
            since = slot_label(resp.from_slot, stubs.times())
            print(f"{resp.server}: back in service from slot {since}{failed}")
    if args.json:  # one server: its object, as before; several: a list of them
        print_json(answers[0] if len(answers) == 1 else answers)
    return EXIT_OK
