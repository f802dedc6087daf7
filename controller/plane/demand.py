"""A job's demand per worker (per PS on a PS server), as a plan's task carries it to the
node, and as a worker command is told it.

A task's ``demand`` (:class:`~controller.plane.plan_messages.Task`) is every resource of
the cluster with its amount in the job's spec, zeros included, ``{"gpu": 0, "cpu": 4,
"mem": 8}`` (an older daemon left zeros out: a resource not named is then not said, a
zero is a demand of none of it, which a memory guard holds a worker to): names of
:data:`NAME_CHARACTERS`, at most :data:`MAX_NAME_LENGTH` long, at most
:data:`MAX_DEMAND_ENTRIES` of them; amounts finite and >= 0, unitless, in the unit of
the capacities the operator wrote in ``[cluster]``. In memory it is a dict in the
cluster's resource order, whole amounts as ints (:func:`plain`: the payload says ``8``,
not ``8.0``); a task's is never changed once built (the daemon shares one per job).

A worker command gets it in its environment (:func:`demand_environment`):
``OASIS_DEMAND`` as compact JSON, and ``OASIS_DEMAND_<NAME>`` per resource (the name
upper-cased, each character but a letter or a digit as ``_``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from pricing import fields
from pricing.errors import SpecError

__all__ = [
    "MAX_DEMAND_ENTRIES",
    "MAX_NAME_LENGTH",
    "NAME_CHARACTERS",
    "Demand",
    "carried",
    "demand_environment",
    "parse_demand",
    "plain",
]

Demand = dict[str, float]
"""``{name: amount}``: one worker's demand, per resource (zeros included)."""

MAX_DEMAND_ENTRIES = 64
"""The most resources one task's demand names (an agent does not know the cluster's
resource count; no cluster has more)."""

MAX_NAME_LENGTH = 64
"""The longest resource name a plan carries, characters."""

NAME_CHARACTERS = "letters, digits, '_', '-' and '.'"
"""What a carried resource name is made of (in words, for messages)."""

_NAME = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_NAME_LENGTH}}}")
_NOT_ALNUM = re.compile(r"[^A-Za-z0-9]")


def carried(name: str) -> bool:
    """Whether a resource of this name can be in a plan's demand (of the alphabet and
    length above); the daemon leaves other resources out, and says so at its start."""
    return _NAME.fullmatch(name) is not None


def parse_demand(value: Any, field: str) -> Demand:
    """A task's ``demand`` from its payload: SpecError naming ``field`` (and the entry)
    for anything but an object of at most :data:`MAX_DEMAND_ENTRIES` carried names to
    finite amounts >= 0. Zero amounts are kept: a job's demand of none of a resource,
    not one unsaid."""
    obj = fields.mapping(value, field)
    if len(obj) > MAX_DEMAND_ENTRIES:
        raise SpecError.one(field, f"must name at most {MAX_DEMAND_ENTRIES} resources, "
                            f"got {len(obj)}")  # fmt: skip
    out: Demand = {}
    for name, amount in obj.items():
        if not isinstance(name, str) or not carried(name):
            shown = fields.show(name[:80] if isinstance(name, str) else name)
            raise SpecError.one(field, f"resource names must be 1-{MAX_NAME_LENGTH} of "
                                f"{NAME_CHARACTERS}, got {shown}")  # fmt: skip
        out[name] = plain(fields.non_negative(amount, f"{field}.{name}"))
    return out


def demand_environment(demand: Demand) -> dict[str, str]:
    """A worker's demand variables: ``{}`` for none; else ``OASIS_DEMAND`` (compact
    JSON, ``{"cpu":4,"mem":8}``) and ``OASIS_DEMAND_CPU=4``, ``OASIS_DEMAND_MEM=8``, ...
    (two names the same once upper-cased and ``_``-ed: the later one's amount)."""
    if not demand:
        return {}
    whole = {name: plain(x) for name, x in demand.items()}
    env = {"OASIS_DEMAND": json.dumps(whole, separators=(",", ":"))}
    for name, x in whole.items():
        env["OASIS_DEMAND_" + _NOT_ALNUM.sub("_", name).upper()] = str(x)
    return env


def plain(x: float) -> float:
    """``x`` as an int when whole (``8``, not ``8.0``), within float's exact integers."""
    return int(x) if float(x).is_integer() and abs(x) < 2**53 else float(x)
