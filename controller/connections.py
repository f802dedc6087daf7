"""What clients' connections may hold of the daemon: a cap on connections, calls and
streams, and timeouts that close the connections nobody uses.

Each TCP connection is a file descriptor; without a cap 1,100 idle connections exhausted
the unit's default 1,024 descriptors and the daemon could open nothing else (the store
included). ``[connections]`` keys, every one optional:

    max_connections = 1000      # accepted at once; past it a new one is closed at accept
    max_calls = 1000            # calls in flight at once; past it RESOURCE_EXHAUSTED
    max_calls_per_client = 100  # of those, one client's (token name, or host without one)
    max_streams = 100           # calls in flight on one connection (HTTP/2 streams)
    handshake_seconds = 10      # a connection must finish its TLS/HTTP/2 start within this
    idle_seconds = 300          # a connection without a call for this long is closed
    keepalive_seconds = 60      # ping a connection silent this long (a vanished client) ...
    keepalive_timeout_seconds = 20  # ... and close it if the ping is not answered in this

A client may ping a connection once a second while its calls are in flight
(:data:`CLIENT_PING_MS`): the clients of several head nodes find a stopped leader so.

At start the daemon raises its soft descriptor limit (``RLIMIT_NOFILE``) to the hard one
and warns if that still leaves less than ``max_connections`` + :data:`RESERVED_FDS`
(the unit sets ``LimitNOFILE=65536``).
"""

from __future__ import annotations

import resource
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pricing import fields
from pricing.errors import SpecError

__all__ = [
    "CLIENT_PING_MS",
    "RESERVED_FDS",
    "Connections",
    "connections_from_dict",
    "raise_fd_limit",
]

CLIENT_PING_MS = 1000
"""The daemon permits a client's pings this often while its calls are in flight (gRPC's
default, 5 min, answered pings more frequent than that with GOAWAY ``too_many_pings``
after two): half the interval of the clients of several head nodes
(``controller/commands/failover.py``'s ``PING_SECONDS``), which find a paused leader by
its silence."""

RESERVED_FDS = 256
"""Descriptors kept for the store, the broker, the metrics endpoint, logs and numba."""


@dataclass(frozen=True)
class Connections:
    """The ``[connections]`` table (module docstring); times in seconds."""

    max_connections: int = 1000
    max_calls: int = 1000
    max_calls_per_client: int = 100
    max_streams: int = 100
    handshake_seconds: float = 10.0
    idle_seconds: float = 300.0
    keepalive_seconds: float = 60.0
    keepalive_timeout_seconds: float = 20.0

    def server_options(self) -> list[tuple[str, Any]]:
        """gRPC server channel arguments (``maximum_concurrent_rpcs`` is separate:
        ``max_calls``)."""
        return [
            ("grpc.max_allowed_incoming_connections", self.max_connections),
            ("grpc.max_concurrent_streams", self.max_streams),
            ("grpc.server_handshake_timeout_ms", _ms(self.handshake_seconds)),
            ("grpc.max_connection_idle_ms", _ms(self.idle_seconds)),
            ("grpc.keepalive_time_ms", _ms(self.keepalive_seconds)),
            ("grpc.keepalive_timeout_ms", _ms(self.keepalive_timeout_seconds)),
            ("grpc.http2.min_ping_interval_without_data_ms", CLIENT_PING_MS),
        ]


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


_INTS = ("max_connections", "max_calls", "max_calls_per_client", "max_streams")
_SECONDS = ("handshake_seconds", "idle_seconds", "keepalive_seconds", "keepalive_timeout_seconds")
_MAX_SECONDS = 86_400  # seconds, a day: larger values are mistakes (and overflow gRPC's int ms)
_MAX_COUNT = 1_000_000


def connections_from_dict(raw: Mapping[str, Any]) -> Connections:
    """Read ``[connections]``; SpecError naming the key."""
    known = {*_INTS, *_SECONDS}
    fields.check_known_keys(raw, known, "connections")
    values: dict[str, Any] = {}
    checks = ((_INTS, fields.positive_int, _MAX_COUNT), (_SECONDS, fields.positive, _MAX_SECONDS))
    for keys, read, most in checks:
        for key in keys:
            if key in raw:
                value = read(raw[key], f"connections.{key}")
                if value > most:
                    raise SpecError.one(f"connections.{key}", f"must be <= {most}")
                values[key] = value
    if "max_calls_per_client" not in values:  # the default, within a smaller max_calls
        values["max_calls_per_client"] = min(
            Connections.max_calls_per_client, values.get("max_calls", Connections.max_calls)
        )
    made = Connections(**values)
    if made.max_calls_per_client > made.max_calls:
        raise SpecError.one(
            "connections.max_calls_per_client",
            f"must be <= connections.max_calls ({made.max_calls}), got {made.max_calls_per_client}",
        )
    return made


def raise_fd_limit(needed: int) -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` towards ``needed`` (up to the hard limit);
    returns the (soft, hard) limits now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft, hard
