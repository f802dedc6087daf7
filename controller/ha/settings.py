"""The ``[ha]`` section: high availability on a shared PostgreSQL store.

::

    [ha]
    lease_seconds = 5        # a leader silent this long loses its lease (1 .. 300)
    retry_seconds = 0.5      # how often a standby tries to take the lease (<= lease / 2)
    follow_seconds = 0.5     # how often a standby reads what the leader committed
    advertise = "head-a:50051"  # the address clients are sent to while this node leads

Absent: one daemon per store (a second one exits naming the first).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pricing import fields
from pricing.errors import SpecError

__all__ = ["HaConfig", "ha_from_dict"]

_KEYS = {"lease_seconds", "retry_seconds", "follow_seconds", "advertise"}
_MAX_LEASE = 300.0
MIN_INTERVAL = 0.01
"""The shortest ``retry_seconds`` and ``follow_seconds``: each is how often a node queries
PostgreSQL (the lock, the newest decisions); ``1e-9`` was taken, and a standby then
queried the store every node and tenant shares in a loop (as ``daemon.tick_seconds``
did, :data:`controller.config_keys.MIN_TICK_SECONDS`)."""


@dataclass(frozen=True)
class HaConfig:
    """``[ha]``: see the module docstring.

    Attributes:
        lease_seconds: seconds a leader's lock session may stay silent before PostgreSQL
            ends it (and the lock with it); a standby takes over within this plus
            ``retry_seconds`` of a leader that stopped answering.
        retry_seconds: a standby's interval between attempts at the lock, seconds.
        follow_seconds: a standby's interval between reads of the store, seconds.
        advertise: ``host:port`` clients are redirected to while this node leads; empty:
            ``daemon.listen``.
    """

    lease_seconds: float = 5.0
    retry_seconds: float = 0.5
    follow_seconds: float = 0.5
    advertise: str = ""

    @property
    def probe_seconds(self) -> float:
        """How often a leader checks its lock: well inside the lease."""
        return min(1.0, self.lease_seconds / 4)


def ha_from_dict(raw: Mapping[str, Any] | None) -> HaConfig | None:
    """``[ha]`` validated (SpecError naming the key); None if absent."""
    if raw is None:
        return None
    fields.check_known_keys(raw, _KEYS, "ha")
    lease = fields.positive(raw.get("lease_seconds", 5.0), "ha.lease_seconds")
    if not 1.0 <= lease <= _MAX_LEASE:
        raise SpecError.one("ha.lease_seconds", f"must be within 1 .. {_MAX_LEASE:g} seconds")
    retry = fields.positive(raw.get("retry_seconds", min(0.5, lease / 2)), "ha.retry_seconds")
    follow = fields.positive(raw.get("follow_seconds", 0.5), "ha.follow_seconds")
    for key, value in (("retry_seconds", retry), ("follow_seconds", follow)):
        if value < MIN_INTERVAL:
            raise SpecError.one(
                f"ha.{key}", f"must be at least {MIN_INTERVAL:g} seconds (each is a query of "
                f"the shared store), got {value:g}"
            )  # fmt: skip
    if retry > lease / 2:
        raise SpecError.one("ha.retry_seconds", f"must be <= lease_seconds / 2 = {lease / 2:g}")
    if follow > lease:
        raise SpecError.one("ha.follow_seconds", f"must be <= lease_seconds = {lease:g}")
    advertise = fields.text(raw["advertise"], "ha.advertise") if "advertise" in raw else ""
    if advertise:
        host, _, port = advertise.rpartition(":")
        if (
            not host
            or not (port.isascii() and port.isdigit())
            or int(port) > 65535
            or len(advertise) > 255
        ):
            raise SpecError.one("ha.advertise", f"must be host:port, got {advertise[:100]!r}")
    return HaConfig(lease, retry, follow, advertise)
