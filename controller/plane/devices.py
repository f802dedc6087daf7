"""The devices (GPUs) of one server, handed out to its worker commands.

The daemon's plan says how many devices the server has (its capacity of the
``device_resource``, ``gpu`` by default) and what one worker of each task needs. The
reference agent gives each worker it starts devices of its own in
``CUDA_VISIBLE_DEVICES`` (and ``OASIS_DEVICES``, for other frameworks), and takes them
back once the worker is gone; a worker that needs none gets them empty, and sees no
device. Before, no worker was told which devices are its own:
every framework starts on device 0, so two tenants' jobs planned on one 4-GPU server
both ran on GPU 0 (one slowed, or out of memory), and the other three idled.

A demand is whole devices, or a fraction of one (``gpu = 0.5``: two such workers share
a device; fractions that divide 1 pack without waste). Whole devices go first to wholly
free ones, lowest position first; a fraction goes to the device with the least room
that still holds it (best fit), so whole devices stay free for whole demands. What a
worker holds is held until its process group is gone, a worker the agent gave up on
included (it may still run there), whatever the plan's count does meanwhile. The plan
never places more than a server's capacity, but fractions can fragment, a worker given
up on keeps its devices, and the ids given (``--devices``, the agent's own
``CUDA_VISIBLE_DEVICES``) may be fewer than the plan counts: then the worker still gets
as many devices as it asked for, those with the most room, and the agent says so (an
oversubscribed device, not a worker left without any, which would run on every device).
A plan that counts no devices (an older daemon's, ``device_resource = ""``) leaves the
workers' environments as they are.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

__all__ = [
    "DEVICE_VARIABLES",
    "MAX_DEVICES",
    "Devices",
    "parse_device_ids",
    "visible_devices",
]

MAX_DEVICES = 1024
"""The most devices one server's plan may count, and ``--devices`` may list."""

DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "OASIS_DEVICES")
"""The variables a worker's devices are given in, comma-separated."""

_EPS = 1e-9

_DEVICE_ID = re.compile(r"\d+|(GPU|MIG)-[0-9A-Za-z/_.:-]+")
"""A device id as CUDA reads it: an index, or a GPU's or MIG instance's UUID."""


def parse_device_ids(text: str) -> list[str]:
    """The ids of ``--devices``: comma-separated, each an index (``0``) or a GPU's or MIG
    instance's UUID (``GPU-8f1c...``, ``MIG-...``), none twice.

    Raises:
        ValueError: an empty or unreadable id, an id given twice, or more than
            :data:`MAX_DEVICES`.
    """
    ids = [part.strip() for part in text.split(",", MAX_DEVICES + 1)]
    if ids == [""]:
        return []
    if len(ids) > MAX_DEVICES:
        raise ValueError(f"over {MAX_DEVICES} ids")
    for i, one in enumerate(ids):
        if not one:
            raise ValueError(f"id {i + 1} is empty (ids are comma-separated: 0,1,2,3)")
        if not _DEVICE_ID.fullmatch(one):
            raise ValueError(f"id {one[:80]!r} is not a device index (0, 1, ...) or a GPU-... "
                             "or MIG-... UUID")  # fmt: skip
    twice = sorted(one for one, n in Counter(ids).items() if n > 1)
    if twice:
        raise ValueError(f"{', '.join(twice)} listed twice")
    return ids


def visible_devices(text: str) -> list[str]:
    """The devices a ``CUDA_VISIBLE_DEVICES`` of ``text`` lets a process use, read as
    CUDA reads it: the ids up to the first that is not one (``-1``, ``NoDevFiles``) or
    is there twice; ``[]`` for none."""
    ids: list[str] = []
    for part in text.split(","):
        one = part.strip()
        if not _DEVICE_ID.fullmatch(one) or one in ids or len(ids) >= MAX_DEVICES:
            break
        ids.append(one)
    return ids


class Devices:
    """Which of a server's devices each running worker holds, as shares of a device.

    Args:
        given: the device ids to hand out (``--devices``, or the agent's own
            ``CUDA_VISIBLE_DEVICES``); None: ``0 .. count - 1`` of the plan's count.
        source: where ``given`` came from, for the agent's warnings.
    """

    def __init__(self, given: Sequence[str] | None = None, source: str = "--devices") -> None:
        self.given = list(given) if given is not None else None
        self.source = source
        self.count: int | None = None  # the plan's; None: it says nothing of devices
        self.ids: list[str] = []
        # id -> the shares running workers hold (kept whatever the plan's count does:
        # a device counted again must not look free while a worker still holds it)
        self.used: dict[str, float] = {}

    @property
    def managed(self) -> bool:
        """Whether the plan counts devices (else workers' environments are left alone)."""
        return self.count is not None

    def resize(self, count: int | None) -> None:
        """The plan counts ``count`` devices (None: it says nothing of them, an older
        daemon's): hand out the given ids, or ``0 .. count - 1``."""
        self.count = count
        if self.given is not None:
            self.ids = self.given if count is not None else []
        else:
            self.ids = [str(i) for i in range(min(count or 0, MAX_DEVICES))]

    def free(self, one: str) -> float:
        """The room left on device ``one``, a share of it (below 0: oversubscribed)."""
        return 1.0 - self.used.get(one, 0.0)

    def take(self, demand: float) -> tuple[dict[str, float], bool]:
        """Devices for one worker needing ``demand`` devices: ``({id: share}, enough)``,
        in position order. ``enough`` is False when the worker had to be given devices
        others hold too, or none could be (see the module docstring); ``{}`` with no
        demand, or while the plan counts no devices."""
        if not (demand > _EPS) or not self.managed:
            return {}, True
        whole = math.floor(demand + _EPS)
        part = demand - whole if demand - whole > _EPS else 0.0
        # in one pass each, not one pass of the devices a piece: a plan of 1024 devices
        # and a demand of 1024 took 0.27 s a worker, 4.6 minutes of the agent's event
        # loop (no heartbeat, no stop) to start 1024 (the audit of what arrives on the
        # plan topic). The same choices: the devices a worker takes are out of the others'
        # reach, so the room of those left does not change while it takes them.
        free = {one: self.free(one) for one in self.ids}
        pos = {one: i for i, one in enumerate(self.ids)}
        # whole pieces: wholly free devices, lowest position first; past them, the most
        # room (oversubscribed); fewer devices than pieces: all of them
        wholly = [one for one in self.ids if free[one] >= 1.0 - _EPS][:whole]
        chosen = dict.fromkeys(wholly, 1.0)
        enough = bool(self.ids) and len(wholly) == whole
        if len(wholly) < whole:
            rest = sorted((one for one in self.ids if one not in chosen),
                          key=lambda one: (-free[one], pos[one]))  # fmt: skip
            chosen |= dict.fromkeys(rest[: whole - len(wholly)], 1.0)
        if part:  # best fit: the least room that holds it; else the most room
            left = [(free[one], pos[one], one) for one in self.ids if one not in chosen]
            room = [item for item in left if item[0] >= part - _EPS]
            if room:
                chosen[min(room)[2]] = part
            elif left:
                enough = False
                chosen[min((-f, p, one) for f, p, one in left)[2]] = part
            else:  # more pieces than devices
                enough = False
        for one, piece in chosen.items():
            self.used[one] = self.used.get(one, 0.0) + piece
        return dict(sorted(chosen.items(), key=lambda kv: pos[kv[0]])), enough

    def short(self, held: dict[str, float], demand: float) -> bool:
        """Whether a worker needing ``demand`` and holding ``held`` (from :meth:`take`)
        is short of devices now: on one that others' shares take past a whole device,
        or holding none while it needs some."""
        if demand > _EPS and not held:
            return True
        return any(self.free(one) < -_EPS for one in held)

    def give_back(self, held: dict[str, float]) -> None:
        """A worker holding ``held`` (from :meth:`take`) is gone."""
        for one, share in held.items():
            left = self.used.get(one, 0.0) - share
            if left > _EPS:
                self.used[one] = left
            else:
                self.used.pop(one, None)

    def environment(self, held: dict[str, float]) -> dict[str, str]:
        """The variables that tell a worker its devices ``held``: set empty for a worker
        that needs none (it sees no device, rather than every one); none at all while
        the plan counts no devices (an older daemon's plan, or ``device_resource = ""``)."""
        if not self.managed:
            return {}
        return dict.fromkeys(DEVICE_VARIABLES, ",".join(held))
