"""``oasis bounds``: the price bounds U and L per resource, how they were set (from the
prior, observed jobs, pinned, or the config), from how many jobs; and an operator's
control over them (operators only, each change recorded in the store and the event log):

- ``oasis bounds reset``: the estimate starts again from its prior;
- ``oasis bounds pin --upper R=X --lower R=Y ...`` (or ``--file PINS.json``): pin U or L
  of resource R, on both kinds of server (``R``) or one (``worker.R``, ``ps.R``); U is
  utility per unit of R, L utility per unit of R per slot, in the config's units;
- ``oasis bounds unpin [R ...]``: unpin those resources (none given: all).
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from controller.commands import SUMMARIES
from controller.commands.common import (
    EXIT_OK,
    InputError,
    ascii_number,
    few,
    plain_doc,
    read_json,
)
from controller.commands.connection import Stubs, guarded, options, print_json
from controller.rpc import oasis_pb2 as pb
from controller.table import render_table
from pricing import fields
from pricing.errors import Problem, SpecError

__all__ = ["register"]

_KIND = {pb.SERVER_KIND_WORKER: "worker", pb.SERVER_KIND_PS: "ps"}
_KIND_OF = {"worker": pb.SERVER_KIND_WORKER, "ps": pb.SERVER_KIND_PS}
_SIDES = {"U": "upper", "L": "lower"}


def register(sub: Any) -> None:
    """Add the ``bounds`` subcommand to ``sub`` (an argparse subparsers object)."""
    help_ = SUMMARIES["bounds"]
    p = sub.add_parser(
        "bounds",
        parents=[options()],
        help=help_,
        description=plain_doc(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "action",
        nargs="?",
        default="show",
        choices=("show", "reset", "pin", "unpin"),
        help="show (default), reset to the prior, pin or unpin",
    )
    p.add_argument("resources", nargs="*", metavar="R", help="unpin: the resources (default all)")
    p.add_argument("--upper", action="append", default=[], metavar="R=X", help="pin: U of R")
    p.add_argument("--lower", action="append", default=[], metavar="R=Y", help="pin: L of R")
    p.add_argument(
        "--file",
        metavar="PINS.json",
        help='pin: {"worker": {"gpu": {"U": x, "L": y}}, "ps": {...}} (R=X options add to it)',
    )
    p.add_argument(
        "--submitter",
        metavar="NAME",
        action="append",
        help="reset: drop this submitter's estimate alone (- : callers without a token); "
        "repeat it to drop several (tokens retired: every name is checked first)",
    )
    p.set_defaults(func=guarded(run))


def _target(name: str, option: str) -> tuple[pb.ServerKind, str]:
    """``R``, ``worker.R`` or ``ps.R`` as (proto kind, resource)."""
    kind, dot, resource = name.partition(".")
    if not dot:
        return pb.SERVER_KIND_UNSPECIFIED, name
    if kind not in _KIND_OF or not resource:
        raise InputError(f"{option}: {name!r} must be R, worker.R or ps.R")
    return _KIND_OF[kind], resource


def pins_of(args: argparse.Namespace) -> list[pb.BoundPin]:
    """The pins the options and the file give, one per (kind, resource)."""
    found: dict[tuple[pb.ServerKind, str], dict[str, float]] = {}
    if args.file:
        for (kind, resource), sides in _file_pins(args.file).items():
            found.setdefault((_KIND_OF[kind], resource), {}).update(sides)
    for option, side in (("--upper", "upper"), ("--lower", "lower")):
        for item in getattr(args, side):
            name, eq, text = item.partition("=")
            try:
                if not ascii_number(text):  # float() reads "١٠٠" as 100 and "1_0" as 10
                    raise ValueError(text)
                value = float(text)
            except ValueError:
                eq = ""
            if not eq:
                raise InputError(f"{option}: {item!r} must be R=NUMBER (ASCII, e.g. gpu=50)")
            if not (math.isfinite(value) and value > 0):  # named by the flag, not the RPC's
                raise InputError(f"{option}: {item!r}: a bound must be a finite number > 0")
            found.setdefault(_target(name, option), {})[side] = value
    return [pb.BoundPin(kind=k, resource=r, **sides) for (k, r), sides in found.items()]


def _file_pins(path: str) -> dict[tuple[str, str], dict[str, float]]:
    """The pins of ``--file``, ``{(kind, resource): {"upper" | "lower": value}}``;
    InputError listing every problem, each with its field (``worker.gpu.X: unknown key``).
    The resources are the daemon's to check. An unknown key was reported as ``need "U"
    and/or "L"`` of an object that gave both, and ``{}`` was dropped without a word."""
    where = f"--file {path}"
    raw = read_json(path, where, limit=1 << 20)
    if not isinstance(raw, dict):
        raise InputError(f'{where}: must be an object of kinds, e.g. {{"worker": {{"gpu": '
                         '{"U": 50, "L": 0.01}}}')  # fmt: skip
    problems = fields.unknown_keys(raw, _KIND_OF, "")
    found: dict[tuple[str, str], dict[str, float]] = {}
    for kind in (k for k in _KIND_OF if k in raw):
        per = raw[kind]
        if not isinstance(per, dict):
            problems.append(Problem(kind, 'must be an object of resources, {"gpu": {"U": x}}'))
            continue
        for resource, sides in per.items():
            at = f"{kind}.{str(resource)[:64]}"
            if not isinstance(sides, dict) or not sides:
                problems.append(Problem(at, 'must be an object with "U" and/or "L", e.g. '
                                        '{"U": 50}'))  # fmt: skip
                continue
            problems += fields.unknown_keys(sides, _SIDES, at)
            for side in (s for s in _SIDES if s in sides):
                try:
                    value = fields.positive(sides[side], f"{at}.{side}")
                except SpecError as err:
                    problems += err.problems
                    continue
                found.setdefault((kind, resource), {})[_SIDES[side]] = value
    if problems:
        lines = "".join(f"\n  {p}" for p in problems)
        raise InputError(f"{where}: invalid pins:{lines}", problems)
    return found


def as_dict(reply: pb.GetBoundsResponse) -> dict[str, Any]:
    """What ``--json`` prints."""
    return {
        "mode": reply.mode,
        "method": reply.method,
        "jobs": reply.jobs,
        "prior": reply.prior,
        "prior_share": reply.prior_share,
        "units": reply.units,
        "bounds": [
            {
                "kind": _KIND.get(b.kind, "?"),
                "resource": b.resource,
                "U": b.upper,
                "L": b.lower,
                "how": b.how,
            }
            for b in reply.bounds
        ],
        "pins": json.loads(reply.pins or "{}"),
        "submitters": [
            {
                "name": v.name,
                "jobs": v.jobs,
                "prior_share": v.prior_share,
                "bounds": [
                    {
                        "kind": _KIND.get(b.kind, "?"),
                        "resource": b.resource,
                        "U": b.upper,
                        "L": b.lower,
                    }
                    for b in v.bounds
                ],
            }
            for v in reply.submitters
        ],
    }


SHOWN_SUBMITTERS = 20
"""Submitters :func:`render` lists, those whose own bounds lie farthest from the bounds
in use first: with 2,000 tenants the table was 2,000 lines in name order, and the one
whose estimate went astray was somewhere in it (``--json`` lists every one)."""


def _apart(voter: dict[str, Any], used: list[dict[str, Any]]) -> tuple[float, str] | None:
    """How far ``voter``'s own bounds lie from the ``used`` ones (those not pinned), at
    the farthest: ``(log of the factor, signed: above > 0, "worker gpu U")``; None: no
    bounds to compare."""
    in_use = {(b["kind"], b["resource"]): b for b in used if not str(b["how"]).startswith("pinned")}
    worst: tuple[float, str] | None = None
    for mine in voter.get("bounds", ()):
        theirs = in_use.get((mine["kind"], mine["resource"]))
        if theirs is None:
            continue
        for side in ("U", "L"):
            if mine[side] > 0 and theirs[side] > 0:
                apart = math.log(mine[side] / theirs[side])
                if worst is None or abs(apart) > abs(worst[0]):
                    worst = (apart, f"{mine['kind']} {mine['resource']} {side}")
    return worst


def farthest(voter: dict[str, Any], used: list[dict[str, Any]]) -> str:
    """Where ``voter``'s own bounds lie farthest from the ``used`` ones (those not
    pinned), as a factor: ``worker gpu U x1.2e+04`` (above), ``ps mem L /310`` (below),
    ``within 2x`` or ``-`` (no bounds to compare)."""
    worst = _apart(voter, used)
    if worst is None:
        return "-"
    apart, where = worst
    if abs(apart) < math.log(2.0):
        return "within 2x"
    factor = math.exp(min(abs(apart), 700.0))
    return f"{where} {'x' if apart > 0 else '/'}{factor:.2g}"


def render(view: dict[str, Any]) -> str:
    """The bounds as text: one line on the estimate, then a table."""
    if view["mode"] == "explicit":
        head = "price bounds: explicit, from the config ([pricing] U1, U2, L1, L2)"
    else:
        head = (
            f"price bounds: estimated from {view['jobs']} job{'' if view['jobs'] == 1 else 's'}, "
            f"prior {view['prior']!r} "
            f"({100 * view['prior_share']:.0f}% of the weight behind it)\n  {view['method']}"
        )
    rows = [
        [b["kind"], b["resource"], f"{b['U']:.4g}", f"{b['L']:.4g}", b["how"]]
        for b in view["bounds"]
    ]
    table = render_table(["kind", "resource", "U", "L", "how"], rows, right={2, 3})
    out = f"{head}\n\n{table}\nU: utility per unit of the resource; L: per unit per slot"
    voters = view.get("submitters") or []
    if len(voters) > 1:  # the bounds are their median: who stands behind them

        def distance(v: dict[str, Any]) -> float:
            worst = _apart(v, view["bounds"])
            return -1.0 if worst is None else abs(worst[0])

        ranked = sorted(voters, key=distance, reverse=True)  # stable: by name among equals
        shown = ranked[:SHOWN_SUBMITTERS]
        per = [
            [
                v["name"],
                str(v["jobs"]),
                f"{100 * v['prior_share']:.0f}%",
                farthest(v, view["bounds"]),
            ]
            for v in shown
        ]
        out += (
            "\n\nper submitter (the bounds are the median of their estimates"
            + (", farthest from them first" if len(voters) > len(shown) else "")
            + "):\n"
        )
        out += render_table(
            ["submitter", "jobs", "prior's weight", "own bounds, farthest from those in use"],
            per,
            right={1, 2},
        )
        if len(voters) > len(shown):
            out += (
                f"\n... and {len(voters) - len(shown):,} more submitters, their own bounds "
                f"nearer those in use (oasis bounds --json lists every one)"
            )
    return out


def run(args: argparse.Namespace) -> int:
    stubs = Stubs(args)
    if args.action != "unpin" and args.resources:
        raise InputError(f"{args.action}: takes no resources (unpin does)")
    if args.action != "pin" and (args.upper or args.lower or args.file):
        raise InputError("--upper, --lower and --file go with pin")
    if args.action != "reset" and args.submitter is not None:
        raise InputError("--submitter goes with reset")
    if args.action == "show":
        reply = stubs.cluster.GetBounds(pb.GetBoundsRequest(), timeout=stubs.timeout)
    else:
        if args.action == "pin":
            pins = pins_of(args)
            if not pins:
                raise InputError("pin: give --upper R=X, --lower R=Y or --file")
        else:
            pins = [pb.BoundPin(kind=k, resource=r) for k, r in
                    (_target(name, "unpin") for name in args.resources)]  # fmt: skip
        if args.action == "unpin":
            now = stubs.cluster.GetBounds(pb.GetBoundsRequest(), timeout=stubs.timeout)
            known = {b.resource for b in now.bounds}  # an unknown one: the daemon's to refuse
            unpinned = (
                _not_pinned(json.loads(now.pins or "{}"), pins)
                if all(p.resource in known for p in pins)
                else None
            )
            if unpinned is not None:  # nothing to unpin: no change, and no event logged
                return _show(args, as_dict(now), unpinned)
        if args.action == "reset" and args.submitter:
            return _reset_submitters(args, stubs, args.submitter)
        request = pb.SetBoundsRequest(action=args.action, pins=pins)
        reply = stubs.cluster.SetBounds(request, timeout=stubs.timeout).bounds
    return _show(args, as_dict(reply))


def _reset_submitters(args: argparse.Namespace, stubs: Stubs, names: list[str]) -> int:
    """``reset --submitter NAME ...``: drop each named submitter's estimate, one call each,
    once every name is found among the submitters with an estimate (a name that is not
    is refused before any is dropped: a typo in a list of retired tokens)."""
    now = stubs.cluster.GetBounds(pb.GetBoundsRequest(), timeout=stubs.timeout)
    known = {v.name for v in now.submitters}
    names = list(dict.fromkeys(names))  # each once
    missing = [repr(n) for n in names if n not in known]
    if missing:
        raise InputError(
            f"--submitter: no estimate of {few(missing, 5)} ({len(known)} submitters have one: "
            "oasis bounds --json lists them); nothing was reset"
        )
    reply = now
    for name in names:
        request = pb.SetBoundsRequest(action="reset", submitter=name)
        reply = stubs.cluster.SetBounds(request, timeout=stubs.timeout).bounds
    return _show(args, as_dict(reply))


def _not_pinned(pinned: dict[str, Any], pins: list[pb.BoundPin]) -> str | None:
    """``"cpu: not pinned; nothing changed"`` if none of ``pins`` (none: all) names a
    pinned bound, else None. ``oasis bounds unpin cpu`` of a cpu never pinned answered
    as if it had been, and logged an "unpin" event of nothing."""
    kinds = {k: [r for r, sides in per.items() if sides] for k, per in pinned.items()}
    if not pins:
        return None if any(kinds.values()) else "nothing is pinned; nothing changed"
    for pin in pins:
        named = _KIND.values() if pin.kind == pb.SERVER_KIND_UNSPECIFIED else [_KIND[pin.kind]]
        if any(pin.resource in kinds.get(kind, []) for kind in named):
            return None
    names = ", ".join(dict.fromkeys(
        (f"{_KIND[p.kind]}." if p.kind in _KIND else "") + p.resource for p in pins))  # fmt: skip
    return f"{names}: not pinned; nothing changed"


def _show(args: argparse.Namespace, view: dict[str, Any], note: str | None = None) -> int:
    if args.json:
        print_json(view)
    else:
        print(render(view) if note is None else f"{note}\n\n{render(view)}")
    return EXIT_OK
