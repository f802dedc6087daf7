"""The ``[mqtt]`` config table: where the broker is and how agents are watched.

Example::

    [mqtt]
    url = "mqtt://127.0.0.1:1883"   # or host/port; mqtts:// for TLS
    username = ""                   # optional; or in the URL: mqtt://user:pass@host
    password = ""
    tls_ca = ""                     # CA file; set (or mqtts://) to use TLS
    topic_prefix = "oasis"          # topics are <prefix>/v1/...
    heartbeat_timeout = 30          # seconds of silence before a server is declared failed
    flap_failures = 3               # failures within flap_seconds that hold a server out
    flap_seconds = 3600             # ... for this long after it is heard again (0 failures: never)
    device_resource = "gpu"         # the resource agents hand out as devices (CUDA_VISIBLE_DEVICES)

No ``[mqtt]`` table: no broker, and the daemon runs exactly as without the plane.

Everything that can be checked without the broker is checked here, at config load
(a missing CA file, a user name given twice and differently), because at connect time
the daemon can only log "broker unavailable" and retry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

from controller.plane.plan_messages import MAX_PLAN_PAYLOAD_BYTES
from controller.plane.topics import topic_name
from pricing import fields
from pricing.errors import SpecError

__all__ = [
    "MIN_HEARTBEAT_SECONDS",
    "MqttConfig",
    "check_server_names",
    "check_tls_ca",
    "check_topic_prefix",
    "mqtt_from_dict",
    "override",
]

_KEYS = {"url", "host", "port", "username", "password", "tls_ca", "topic_prefix",
         "heartbeat_timeout", "heartbeat_seconds", "flap_failures", "flap_seconds",
         "max_plan_bytes", "device_resource"}  # fmt: skip
_OVERRIDABLE = ("username", "password", "tls_ca", "topic_prefix")


@dataclass(frozen=True)
class MqttConfig:
    """How the daemon reaches its broker.

    Attributes:
        host: broker host name or address.
        port: broker TCP port.
        username: MQTT user name; empty: none.
        password: MQTT password; empty: none. Never in ``repr`` (configs get logged).
        tls: connect with TLS.
        tls_ca: CA certificate file for TLS; empty: the system's CAs.
        topic_prefix: first topic level; topics are ``<prefix>/v1/...``.
        heartbeat_timeout: seconds without a heartbeat after which a server that
            reported before is declared failed.
        heartbeat_seconds: how often agents are asked to send heartbeats (in plans).
        flap_failures: a server whose agent is heard again after as many failures within
            ``flap_seconds`` (this one included) is held out of service for
            ``flap_seconds`` more, as a cordon with an end by ``oasisd``: a flapping
            agent would otherwise take new plans and fail them again, moving every
            tenant's jobs it held each time. 0: never.
        flap_seconds: the span failures are counted over, and how long a flapping server
            is held out (rounded up to whole slots).
        max_plan_bytes: the largest plan payload published in one message; a larger
            plan goes in parts (:meth:`~controller.plane.plan_messages.Plan.split`). Keep it
            below the broker's ``max_packet_size``, which drops the connection of a
            client that sends more.
        device_resource: the resource whose units are devices the agents hand to their
            workers (``CUDA_VISIBLE_DEVICES``): plans give each server's capacity of it
            and each task's demand (:mod:`controller.plane.devices`). A cluster without
            such a resource gives none (checked at config load when set explicitly).
    """

    host: str
    port: int = 1883
    username: str = ""
    password: str = field(default="", repr=False)
    tls: bool = False
    tls_ca: str = ""
    topic_prefix: str = "oasis"
    heartbeat_timeout: float = 30.0
    heartbeat_seconds: float = 5.0
    flap_failures: int = 3
    flap_seconds: float = 3600.0
    max_plan_bytes: int = 200_000
    device_resource: str = "gpu"


MIN_PLAN_BYTES = 4096
"""The smallest ``max_plan_bytes``: a plan's header and a task with a long id fit."""

MAX_FLAP_SECONDS = 7 * 86400.0
"""The longest ``flap_seconds``: a week."""

MIN_HEARTBEAT_SECONDS = 0.1
"""The shortest interval between two heartbeats an agent sends, whatever a plan's
``heartbeat_seconds`` says (:meth:`controller.plane.agent.Agent._beat_interval`); so the
shortest ``heartbeat_seconds``, and ``heartbeat_timeout`` is at least two of them (one
late beat fails no server). Before, ``heartbeat_timeout = 0.05`` was taken: every server
whose agent beat as fast as it does (0.1 s) was declared failed over and over, and the
flap rule cordoned each of them for ``flap_seconds``."""


def check_topic_prefix(value: Any, field_name: str = "mqtt.topic_prefix") -> str:
    """A topic prefix without surrounding slashes; SpecError naming ``field_name`` if it
    is empty or holds an MQTT wildcard (it would subscribe to other deployments' topics)."""
    prefix = fields.text(value, field_name).strip("/")
    if not prefix or any(c in prefix for c in "+#\0"):
        raise SpecError.one(
            field_name, f"must be a non-empty topic without wildcards, got {prefix!r}"
        )
    return prefix


def check_server_names(names: Iterable[str], field_name: str = "cluster.servers") -> None:
    """SpecError naming ``field_name`` unless every server name can be one topic level
    (``servers/<name>/plan``, ``agents/<name>/...``): checked with ``[mqtt]`` only."""
    for name in names:
        try:
            topic_name(name, "server name")
        except ValueError as err:
            raise SpecError.one(field_name, str(err)) from None


def check_tls_ca(value: Any, field_name: str = "mqtt.tls_ca") -> str:
    """The path of a readable PEM CA file (``~`` expanded); SpecError naming ``field_name``
    otherwise -- found now rather than as an endless "broker unavailable" later."""
    text = fields.text(value, field_name)
    path = Path(text).expanduser()
    if not path.exists():
        raise SpecError.one(field_name, f"no such file: {text}")
    if not path.is_file():
        raise SpecError.one(field_name, f"not a file: {text}")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise SpecError.one(field_name, f"cannot read {text}: {err.strerror or err}") from None
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise SpecError.one(field_name, f"{text} holds no PEM CERTIFICATE")
    return str(path)


def _redacted(parts: SplitResult) -> str:
    """The URL without its password, for error messages."""
    if parts.password is None:
        return parts.geturl()
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return parts._replace(netloc=f"{user}:***@{netloc}").geturl()


def _credential(raw: Mapping[str, Any], key: str, from_url: str | None) -> str:
    """``username``/``password`` from the table or the URL; SpecError if both give it
    and they differ (which one the operator meant cannot be guessed)."""
    given = fields.text(raw[key], f"mqtt.{key}") if raw.get(key) else ""
    if from_url and given and given != from_url:
        raise SpecError.one(f"mqtt.{key}", f"differs from the {key} in mqtt.url; give it once")
    return given or from_url or ""


def mqtt_from_dict(raw: Mapping[str, Any]) -> MqttConfig | None:
    """Read the ``[mqtt]`` table; None if it is absent or empty."""
    if not raw:
        return None
    fields.check_known_keys(raw, _KEYS, "mqtt")
    tls_ca = check_tls_ca(raw["tls_ca"]) if raw.get("tls_ca") else ""
    tls = bool(tls_ca)
    host = ""
    port = 0
    url_user: str | None = None
    url_password: str | None = None
    if "url" in raw:
        url = fields.text(raw["url"], "mqtt.url")
        parts = urlsplit(url)
        if parts.scheme not in ("mqtt", "mqtts", "tcp", "ssl") or not parts.hostname:
            raise SpecError.one(
                "mqtt.url",
                f"must be mqtt://host[:port] or mqtts://..., got {_redacted(parts)!r}",
            )
        host = parts.hostname
        tls = tls or parts.scheme in ("mqtts", "ssl")
        url_user = unquote(parts.username) if parts.username else None
        url_password = unquote(parts.password) if parts.password else None
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
    prefix = check_topic_prefix(raw.get("topic_prefix", "oasis"))
    timeout = fields.positive(raw.get("heartbeat_timeout", 30.0), "mqtt.heartbeat_timeout")
    beat = fields.positive(
        raw.get("heartbeat_seconds", max(MIN_HEARTBEAT_SECONDS, min(5.0, timeout / 3))),
        "mqtt.heartbeat_seconds",
    )
    if beat < MIN_HEARTBEAT_SECONDS:
        raise SpecError.one(
            "mqtt.heartbeat_seconds",
            f"must be at least {MIN_HEARTBEAT_SECONDS:g} (agents beat no faster), got {beat:g}",
        )
    if "heartbeat_seconds" in raw and beat >= timeout:
        raise SpecError.one(
            "mqtt.heartbeat_seconds", f"must be < heartbeat_timeout ({timeout}), got {beat}"
        )
    if timeout < 2 * beat:
        raise SpecError.one(
            "mqtt.heartbeat_timeout",
            f"must be at least 2 x heartbeat_seconds ({2 * beat:g} s): a server is declared "
            f"failed after this much silence, and one late heartbeat must not fail it; "
            f"got {timeout:g}",
        )
    flaps = fields.integer(raw.get("flap_failures", 3), "mqtt.flap_failures", minimum=0)
    flap_seconds = fields.positive(raw.get("flap_seconds", 3600.0), "mqtt.flap_seconds")
    if flap_seconds > MAX_FLAP_SECONDS:
        raise SpecError.one(
            "mqtt.flap_seconds",
            f"must be at most {MAX_FLAP_SECONDS:g} (7 days), got {flap_seconds}",
        )
    plan_bytes = fields.integer(
        raw.get("max_plan_bytes", MqttConfig.max_plan_bytes), "mqtt.max_plan_bytes",
        minimum=MIN_PLAN_BYTES,
    )  # fmt: skip
    if plan_bytes > MAX_PLAN_PAYLOAD_BYTES:
        raise SpecError.one("mqtt.max_plan_bytes", f"must be at most {MAX_PLAN_PAYLOAD_BYTES} "
                            f"(what an agent reads), got {plan_bytes}")  # fmt: skip
    return MqttConfig(
        host=host,
        port=port,
        username=_credential(raw, "username", url_user),
        password=_credential(raw, "password", url_password),
        tls=tls,
        tls_ca=tls_ca,
        topic_prefix=prefix,
        heartbeat_timeout=timeout,
        heartbeat_seconds=beat,
        flap_failures=flaps,
        flap_seconds=flap_seconds,
        max_plan_bytes=plan_bytes,
        device_resource=_device_resource(raw.get("device_resource", "gpu")),
    )


def _device_resource(value: Any) -> str:
    """``device_resource``: a resource's name, or "" for none."""
    if value == "":
        return ""
    return fields.text(value, "mqtt.device_resource")


def override(mqtt: MqttConfig, raw: Mapping[str, Any]) -> MqttConfig:
    """``mqtt`` with some of ``username``, ``password``, ``tls_ca`` and ``topic_prefix``
    replaced, each checked as in the ``[mqtt]`` table: command-line flags on top of a
    config file. A CA file turns TLS on; the port stays as configured."""
    for key in raw:
        if key not in _OVERRIDABLE:
            raise SpecError.one(f"mqtt.{key}", f"cannot be overridden (only {_OVERRIDABLE})")
    changes: dict[str, Any] = {}
    for key in ("username", "password"):
        if key in raw:
            changes[key] = fields.text(raw[key], f"mqtt.{key}")
    if "tls_ca" in raw:
        changes["tls_ca"] = check_tls_ca(raw["tls_ca"])
        changes["tls"] = True
    if "topic_prefix" in raw:
        changes["topic_prefix"] = check_topic_prefix(raw["topic_prefix"])
    return replace(mqtt, **changes)
