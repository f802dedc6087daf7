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
a device). Whole devices go first to wholly free ones, lowest position first; a fraction
goes to the device with the least room that still holds it (best fit), so whole devices
stay free for whole demands. The plan never places more than a server's capacity, but
fractions can fragment, a worker the agent gave up on may still hold its devices, and an
operator's ``--devices`` may list fewer than the plan counts: then the worker still gets
as many devices as it asked for, those with the most room, and the agent says so once
(an oversubscribed device, not a worker left without any, which would run on every
device).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["DEVICE_VARIABLES", "MAX_DEVICES", "Devices", "parse_device_ids"]

MAX_DEVICES = 1024
"""The most devices one server's plan may count, and ``--devices`` may list."""

DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "OASIS_DEVICES")
"""The variables a worker's devices are given in, comma-separated."""

_EPS = 1e-9


def parse_device_ids(text: str) -> list[str]:
    """The ids of ``--devices`` (or the agent's own ``CUDA_VISIBLE_DEVICES``): comma-
    separated, each an index or a name such as ``GPU-8f1c...``, none twice.

    Raises:
        ValueError: an empty id, an id given twice, or more than :data:`MAX_DEVICES`.
    """
    ids = [part.strip() for part in text.split(",")]
    if ids == [""]:
        return []
    for i, one in enumerate(ids):
        if not one:
            raise ValueError(f"id {i + 1} is empty (ids are comma-separated: 0,1,2,3)")
        if not one.isprintable() or any(c.isspace() for c in one):
            raise ValueError(f"id {one!r} has a space or an unprintable character")
    twice = sorted({one for one in ids if ids.count(one) > 1})
    if twice:
        raise ValueError(f"{', '.join(twice)} listed twice")
    if len(ids) > MAX_DEVICES:
        raise ValueError(f"{len(ids)} ids, over {MAX_DEVICES}")
    return ids


class Devices:
    """Which of a server's devices each running worker holds, as shares of a device.

    Args:
        given: the device ids to hand out (``--devices``); None: ``0 .. count - 1`` of
            the plan's count (:meth:`resize`).
    """

    def __init__(self, given: Sequence[str] | None = None) -> None:
        self.given = list(given) if given is not None else None
        self.ids: list[str] = list(self.given or [])
        self.free: dict[str, float] = dict.fromkeys(self.ids, 1.0)  # id -> room, 0 .. 1

    def resize(self, count: int) -> None:
        """The plan counts ``count`` devices: without ``given`` ids, hand out ``0 ..
        count - 1``. What workers hold is kept (a device no longer counted is handed out
        no more; its holders keep it until they leave)."""
        if self.given is not None:
            return
        ids = [str(i) for i in range(min(count, MAX_DEVICES))]
        if ids == self.ids:
            return
        self.ids = ids
        self.free = {one: self.free.get(one, 1.0) for one in ids}

    def take(self, demand: float) -> tuple[dict[str, float], bool]:
        """Devices for one worker needing ``demand`` devices: ``({id: share}, enough)``,
        in position order. ``enough`` is False when the worker had to be given devices
        others hold too (see the module docstring); ``{}`` with no demand or no devices
        known."""
        if not (demand > _EPS) or not self.ids:
            return {}, True
        whole = math.floor(demand + _EPS)
        part = demand - whole if demand - whole > _EPS else 0.0
        pieces = [1.0] * whole + ([part] if part else [])
        chosen: dict[str, float] = {}
        enough = True
        for piece in pieces:
            room = [(self.free[one], pos, one) for pos, one in enumerate(self.ids)
                    if one not in chosen and self.free[one] >= piece - _EPS]  # fmt: skip
            if room:  # best fit: the least room that holds the piece, then the lowest
                _, _, one = min(room)
            else:  # oversubscribed: the most room left
                rest = [(-self.free[one], pos, one) for pos, one in enumerate(self.ids)
                        if one not in chosen]  # fmt: skip
                if not rest:  # more pieces than devices: the worker gets them all
                    enough = False
                    break
                _, _, one = min(rest)
                enough = False
            chosen[one] = piece
            self.free[one] -= piece
        order = {one: pos for pos, one in enumerate(self.ids)}
        return dict(sorted(chosen.items(), key=lambda kv: order[kv[0]])), enough

    def give_back(self, held: dict[str, float]) -> None:
        """A worker holding ``held`` (from :meth:`take`) is gone."""
        for one, share in held.items():
            if one in self.free:
                self.free[one] = min(1.0, self.free[one] + share)

    def environment(self, held: dict[str, float]) -> dict[str, str]:
        """The variables that tell a worker its devices ``held``: set empty for a worker
        that needs none (it sees no device, rather than every one); none at all while
        no devices are known (a plan of an older daemon, a cluster without devices)."""
        if not self.ids:
            return {}
        return dict.fromkeys(DEVICE_VARIABLES, ",".join(held))
