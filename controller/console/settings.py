"""The ``[web]`` table: where the console listens, and the rule that keeps it on loopback.

    [web]
    listen = "127.0.0.1:8080"      # host:port; empty or absent: no console
    allow_insecure_remote = false  # true: plain HTTP off loopback (tokens in the clear)
    session_hours = 8              # how long a login lasts
    max_event_streams_per_user = 32  # live event streams (/api/events) of one user
    max_event_streams = 256        # live event streams in all
    max_connections = 512          # HTTP connections at once; past it 503 at accept
    max_connections_per_host = 64  # of one host off loopback; past it 503 at accept
    public_url = ""                # behind a reverse proxy: "https://head.example/oasis/"

As ``daemon.listen``: plain HTTP stays on a loopback address unless ``[tls]`` is configured
(the console then serves HTTPS with the same certificate, and asks for a client
certificate when ``tls.client_ca`` is set) or ``allow_insecure_remote`` says so.

Each open event stream (a console tab, or a script on ``/api/events``) holds a descriptor,
a task and a queue in the daemon, and each new event costs every stream work (a
submitter's stream looks up the job's owner), so their number is capped: a user (a
token's name; without ``[auth]`` every caller is one user) past
``max_event_streams_per_user`` is refused with 429, anyone past ``max_event_streams``
with 503. A closed stream frees its place at the latest at its next heartbeat (15 s).

Every connection holds a descriptor of the daemon's process, the one its gRPC clients and
the store share, so the console's are capped too: past ``max_connections`` (streams
included) a new one is answered 503 at once and closed; a connection idle 75 s is closed.
The cap stays far below the unit's descriptor limit, so a flood of browser connections
costs the console, never the daemon. One host off loopback may hold at most
``max_connections_per_host`` of them: one client holding every place (connections that
send a byte of their request every 25 s) kept the console down for everyone. Loopback
peers are one host to this cap (every SSH tunnel is 127.0.0.1), so it does not apply to
them; a firewall rule per address does (README, "Security and limits").

Behind a reverse proxy, ``public_url`` is the URL users open: the console serves its
pages under its path and takes its host as theirs (:mod:`.public_url`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller.console import public_url
from controller.tls import TlsConfig, is_loopback
from pricing import fields
from pricing.errors import SpecError

__all__ = ["DEFAULT_WEB_LISTEN", "WebConfig", "web_from_dict"]

DEFAULT_WEB_LISTEN = "127.0.0.1:8080"
"""The embedded defaults' console (``make run``)."""

_MAX_SESSION_HOURS = 24 * 30.0

MAX_CONNECTIONS = 10_000
"""The most ``web.max_connections`` may be: the unit's ``LimitNOFILE=65536`` keeps room
for the gRPC connections (``connections.max_connections``) and the store."""


@dataclass(frozen=True)
class WebConfig:
    """The console's settings.

    Attributes:
        listen: ``host:port`` (port 0: any free one); empty: no console.
        allow_insecure_remote: serve plain HTTP on a non-loopback address.
        session_seconds: lifetime of a login session, seconds.
        max_event_streams_per_user: open event streams of one user at once.
        max_event_streams: open event streams at once, all users together.
        max_connections: open HTTP connections at once, streams included.
        max_connections_per_host: of those, from one host off loopback.
        public_url: the URL users open behind a reverse proxy (its path without a
            ``/`` at the end), or empty.
    """

    listen: str = ""
    allow_insecure_remote: bool = False
    session_seconds: float = 8 * 3600.0
    max_event_streams_per_user: int = 32
    max_event_streams: int = 256
    max_connections: int = 512
    max_connections_per_host: int = 64
    public_url: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The ``[web]`` table these settings read from (:func:`web_from_dict` of it
        gives them back): ``oasisd --web-listen`` replaces ``listen`` in it and reads it
        again, with the address rules, keeping every other key."""
        return {
            "listen": self.listen,
            "allow_insecure_remote": self.allow_insecure_remote,
            "session_hours": self.session_seconds / 3600.0,
            "max_event_streams_per_user": self.max_event_streams_per_user,
            "max_event_streams": self.max_event_streams,
            "max_connections": self.max_connections,
            "max_connections_per_host": self.max_connections_per_host,
            "public_url": self.public_url,
        }


def web_from_dict(raw: Mapping[str, Any], tls: TlsConfig | None) -> WebConfig:
    """Read the ``[web]`` table (empty: no console); SpecError names the key."""
    known = {
        "listen",
        "allow_insecure_remote",
        "session_hours",
        "max_event_streams_per_user",
        "max_event_streams",
        "max_connections",
        "max_connections_per_host",
        "public_url",
    }
    fields.check_known_keys(raw, known, "web")
    listen = raw.get("listen", "")
    if not isinstance(listen, str):
        raise SpecError.one("web.listen", f"must be a string host:port, got {listen!r}")
    host, _, port = listen.rpartition(":")
    if listen and (not host or not (port.isascii() and port.isdigit()) or int(port) > 65535):
        raise SpecError.one("web.listen", f"must be host:port (or empty: off), got {listen!r}")
    remote = raw.get("allow_insecure_remote", False)
    if not isinstance(remote, bool):
        raise SpecError.one("web.allow_insecure_remote", "must be true or false")
    hours = fields.positive(raw.get("session_hours", 8), "web.session_hours")
    if hours > _MAX_SESSION_HOURS:
        raise SpecError.one("web.session_hours", f"must be <= {_MAX_SESSION_HOURS:g}")
    if listen and tls is None and not remote and not is_loopback(host):
        raise SpecError.one(
            "web.listen",
            f"{listen} is not a loopback address and [tls] is not configured: the console "
            "would carry tokens and session cookies in the clear; set [tls] cert and key, or "
            "web.allow_insecure_remote = true to serve plain HTTP to the network",
        )
    d = WebConfig()

    def count(key: str) -> int:
        return fields.positive_int(raw.get(key, getattr(d, key)), f"web.{key}")

    per_user, total = count("max_event_streams_per_user"), count("max_event_streams")
    connections = count("max_connections")
    if connections > MAX_CONNECTIONS:
        raise SpecError.one(
            "web.max_connections",
            f"must be <= {MAX_CONNECTIONS} (each holds a descriptor the daemon needs)",
        )
    per_host = min(d.max_connections_per_host, connections)  # the default within the cap
    if "max_connections_per_host" in raw:
        per_host = count("max_connections_per_host")
    if per_host > connections:
        raise SpecError.one(
            "web.max_connections_per_host",
            f"must be <= web.max_connections ({connections}), got {per_host}",
        )
    public = public_url.parse(raw.get("public_url", ""))
    return WebConfig(
        listen, remote, hours * 3600.0, per_user, total, connections, per_host,
        public.url if public is not None else "",
    )  # fmt: skip
