"""The ``[mqtt]`` config table: where the broker is and how agents are watched.

Example::

    [mqtt]
    url = "mqtt://127.0.0.1:1883"   # or host/port; mqtts:// for TLS
    username = ""                   # optional
    password = ""
    tls_ca = ""                     # CA file; set (or mqtts://) to use TLS
    topic_prefix = "oasis"          # topics are <prefix>/v1/...
    heartbeat_timeout = 30          # seconds of silence before a server is declared failed

No ``[mqtt]`` table: no broker, and the daemon runs exactly as without the plane.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pricing import fields
from pricing.errors import SpecError

__all__ = ["MqttConfig", "mqtt_from_dict"]

_KEYS = {"url", "host", "port", "username", "password", "tls_ca", "topic_prefix",
         "heartbeat_timeout", "heartbeat_seconds"}  # fmt: skip


@dataclass(frozen=True)
class MqttConfig:
    """How the daemon reaches its broker.

    Attributes:
        host: broker host name or address.
        port: broker TCP port.
        username: MQTT user name; empty: none.
        password: MQTT password; empty: none.
        tls: connect with TLS.
        tls_ca: CA certificate file for TLS; empty: the system's CAs.
        topic_prefix: first topic level; topics are ``<prefix>/v1/...``.
        heartbeat_timeout: seconds without a heartbeat after which a server that
            reported before is declared failed.
        heartbeat_seconds: how often agents are asked to send heartbeats (in plans).
    """

    host: str
    port: int = 1883
    username: str = ""
    password: str = ""
    tls: bool = False
    tls_ca: str = ""
    topic_prefix: str = "oasis"
    heartbeat_timeout: float = 30.0
    heartbeat_seconds: float = 5.0


def mqtt_from_dict(raw: Mapping[str, Any]) -> MqttConfig | None:
    """Read the ``[mqtt]`` table; None if it is absent or empty."""
    if not raw:
        return None
    for key in raw:
        if key not in _KEYS:
            raise SpecError.one(f"mqtt.{key}", f"unknown key (known: {', '.join(sorted(_KEYS))})")
    tls_ca = fields.text(raw.get("tls_ca", ""), "mqtt.tls_ca") if "tls_ca" in raw else ""
    tls = bool(tls_ca)
    host = ""
    port = 0
    if "url" in raw:
        url = fields.text(raw["url"], "mqtt.url")
        parts = urlsplit(url)
        if parts.scheme not in ("mqtt", "mqtts", "tcp", "ssl") or not parts.hostname:
            raise SpecError.one(
                "mqtt.url", f"must be mqtt://host[:port] or mqtts://..., got {url!r}"
            )
        host = parts.hostname
        tls = tls or parts.scheme in ("mqtts", "ssl")
        try:
            port = parts.port or 0
        except ValueError as err:
            raise SpecError.one("mqtt.url", f"bad port: {err}") from None
    if "host" in raw:
        host = fields.text(raw["host"], "mqtt.host")
    if not host:
        raise SpecError.one(
            "mqtt", "needs url or host (leave the table out to run without a broker)"
        )
    if "port" in raw:
        port = fields.integer(raw["port"], "mqtt.port", minimum=1)
    port = port or (8883 if tls else 1883)
    if port > 65535:
        raise SpecError.one("mqtt.port", f"must be <= 65535, got {port}")
    prefix = fields.text(raw.get("topic_prefix", "oasis"), "mqtt.topic_prefix").strip("/")
    if not prefix or any(c in prefix for c in "+#\0"):
        raise SpecError.one(
            "mqtt.topic_prefix", f"must be a non-empty topic without wildcards, got {prefix!r}"
        )
    timeout = fields.positive(raw.get("heartbeat_timeout", 30.0), "mqtt.heartbeat_timeout")
    beat = fields.positive(
        raw.get("heartbeat_seconds", min(5.0, timeout / 3)), "mqtt.heartbeat_seconds"
    )
    if beat >= timeout:
        raise SpecError.one(
            "mqtt.heartbeat_seconds", f"must be < heartbeat_timeout ({timeout}), got {beat}"
        )
    return MqttConfig(
        host=host,
        port=port,
        username=fields.text(raw["username"], "mqtt.username") if raw.get("username") else "",
        password=fields.text(raw["password"], "mqtt.password") if raw.get("password") else "",
        tls=tls,
        tls_ca=tls_ca,
        topic_prefix=prefix,
        heartbeat_timeout=timeout,
        heartbeat_seconds=beat,
    )
