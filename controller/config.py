"""Daemon configuration: a TOML file, validated at start with messages naming the key.

Example (``config/oasisd.example.toml`` is a complete one)::

    [daemon]
    listen = "127.0.0.1:50051"   # host:port; port 0 picks a free port
    data_dir = "/var/lib/oasis"  # the SQLite store lives here unless store_url is set;
                                 # a relative path is relative to this file's folder
    store_url = ""               # e.g. "postgresql+psycopg://oasis@/oasis"
    store_timeout = 3            # seconds one store operation may take (store/database.py)
    sqlite_synchronous = "full"  # SQLite: "full" survives power loss; "normal" only a crash
    slot_seconds = 3600          # length of a slot
    window = 300                 # T: a job may be planned up to T slots from its arrival
    epoch = 0                    # Unix time at which slot 0 began; absent: the first start,
                                 # floored to a whole slot
    wait_seconds = 0             # how long a job not admitted at once stays pending (--wait)
    log_level = "info"

    [pricing]
    bounds = "estimate"          # or "explicit" with U1, U2, L1, L2 as in the trace format
    trim = 0.3                   # estimate: L ignores the lowest-value jobs carrying this share
    prior = "default"            # estimate: where it starts: "default", "none" or a JSON file
                                 # of `oasis calibrate` (relative to this file's folder)
    l_margin = 1.0               # estimate: L is scaled by this (<= 1)
    u_margin = 1.0               # estimate: U is scaled by this (>= 1)

    [metrics]
    listen = "127.0.0.1:9464"    # Prometheus /metrics over HTTP; empty or absent: off
    allow_insecure_remote = false  # true: serve it off loopback too (plain HTTP, no auth)
    per_server_prices_up_to = 500  # oasis_unit_price{server,...} up to this many servers

    [tls]                        # absent: plaintext, on loopback only (controller/tls.py)
    cert = "server.crt"          # PEM chain; key = "server.key"; client_ca = "ca.crt": mTLS

    [auth]                       # absent: no tokens, every caller an operator
    tokens_file = "tokens"       # NAME ROLE SHA256 per line (controller/auth.py)

    [limits]                     # message, job and search sizes, rate (controller/limits.py)
    rate = 0                     # requests/s per client; 0: unlimited

    [connections]                # connections, calls, idle timeouts (controller/connections.py)
    max_connections = 1000

    [ha]                         # high availability on a PostgreSQL store (controller/ha);
    lease_seconds = 5            # absent: one daemon per store

    [web]                        # the operator's console (controller/console/settings.py)
    listen = "127.0.0.1:8080"    # empty or absent: off

    [mqtt]                       # the execution plane's broker; absent: no broker
    url = "mqtt://127.0.0.1:1883"  # controller/plane/settings.py lists every key

    [cluster]                    # the trace format's resources and servers
    resources = ["gpu", "cpu", "mem", "disk", "bandwidth"]
    servers = [{name = "w0", kind = "worker", capacity = {gpu = 4, ...}}, ...]
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from controller.auth import Caller, tokens_from_dict
from controller.clock import epoch as slot_zero
from controller.config_exposure import _clear_broker_password, _exposed_files, _exposed_secrets
from controller.config_file import ConfigError, durations, load_mqtt, read_toml, rebased
from controller.config_keys import (
    MAX_SLOT_SECONDS,
    PER_SERVER_PRICES_UP_TO,
    _check_keys,
    _check_ledger_size,
    _idle_servers,
    _keep_days,
    _metrics_listen,
    _per_server_prices_up_to,
    _slot_seconds,
    _tick_seconds,
    _window,
    check_listen,
)
from controller.config_pricing import PricingConfig, _pricing
from controller.config_problems import _problems
from controller.connections import Connections, connections_from_dict
from controller.console.settings import DEFAULT_WEB_LISTEN, WebConfig, web_from_dict
from controller.ha.settings import HaConfig, ha_from_dict
from controller.limits import Limits, limits_from_dict
from controller.plane.settings import MqttConfig, check_server_names, mqtt_from_dict
from controller.store.database import DEFAULT_TIMEOUT, SQLITE_SYNCHRONOUS
from controller.store.urls import unusable
from controller.tls import TlsConfig, check_exposure, tls_from_dict
from pricing import fields
from pricing.cluster import Cluster, cluster_from_dict
from pricing.errors import SpecError

__all__ = [
    "DEFAULT_LISTEN",
    "MAX_SLOT_SECONDS",
    "Config",
    "ConfigError",
    "PricingConfig",
    "as_meant",
    "check_listen",
    "demo_config",
    "key_digests",
    "load",
    "load_mqtt",
    "table_digests",
]

DEFAULT_LISTEN = "127.0.0.1:50051"


@dataclass(frozen=True)
class Config:
    """The daemon's settings.

    Attributes:
        listen: gRPC address, ``host:port``.
        data_dir: directory of the embedded SQLite store.
        store_url: SQLAlchemy URL of the store; empty means SQLite in ``data_dir``.
        store_timeout: seconds one store operation may take (connect, statement, lock
            wait, round trip; ``controller/store/database.py``).
        sqlite_synchronous: SQLite's ``synchronous`` (:data:`SQLITE_SYNCHRONOUS`).
        slot_seconds: seconds per slot.
        window: T, slots a job may be planned over from its arrival.
        epoch: Unix time of the start of slot 0, as the config gives it.
        epoch_from_store: the config gives no epoch: slot 0 begins at the daemon's first
            start floored to a whole slot (:func:`controller.clock.first_epoch`),
            recorded in the store (:mod:`controller.admission.recovery`), and ``epoch``
            is a placeholder 0.
        log_level: structlog level name.
        cluster: the servers.
        pricing: price-bound settings.
        tick_seconds: how often the slot clock is checked, seconds.
        metrics_listen: ``host:port`` of the Prometheus endpoint; empty: no endpoint.
        per_server_prices_up_to: ``oasis_unit_price{server, kind, resource}`` is exported
            while the cluster has at most this many servers (workers and PS); past it,
            only the per-kind quantiles (``controller/metrics.py``); 0: never.
        mqtt: the broker of the execution plane (``[mqtt]``); None: no broker.
        allow_insecure_remote: serve plaintext on a non-loopback address.
        tls: ``[tls]``; None: plaintext.
        tokens: ``[auth]``: ``{sha256 of a token: Caller}``; None: no authentication.
        limits: ``[limits]``.
        wait_seconds: the wait of a submission that states none, seconds: a job not
            admitted at once stays ``pending`` that long (at most
            ``limits.max_wait_seconds``); 0: it is rejected at once.
        connections: ``[connections]``.
        keep_days: finished jobs are deleted from the store this many days after they
            ended (:mod:`controller.admission.retention`); 0: every job is kept.
        ha: ``[ha]``, high availability on PostgreSQL (:mod:`controller.ha`); None: one
            daemon per store.
        web: ``[web]``, the operator's console; its ``listen`` empty: no console.
        warnings: problems worth a warning at start (a config with secrets that others
            may read).
        tables: ``{table: digest}`` of the file's top-level TOML tables as read
            (:func:`table_digests`), so a reload (SIGHUP, :mod:`controller.reload`) can
            name the tables edited since; empty for a config not read from a file.
        keys: ``{"table.key": digest}`` of each key of those tables (:func:`key_digests`),
            so a reload names the keys edited in a table that waits for a restart.
    """

    listen: str
    data_dir: Path
    store_url: str
    slot_seconds: float
    window: int
    epoch: float
    log_level: str
    cluster: Cluster
    pricing: PricingConfig
    tick_seconds: float = 1.0
    metrics_listen: str = ""
    per_server_prices_up_to: int = PER_SERVER_PRICES_UP_TO
    mqtt: MqttConfig | None = None
    allow_insecure_remote: bool = False
    tls: TlsConfig | None = None
    tokens: Mapping[str, Caller] | None = field(default=None, repr=False)
    limits: Limits = field(default_factory=Limits)
    wait_seconds: float = 0.0
    keep_days: float = 0.0
    epoch_from_store: bool = False
    source: str = field(default="<embedded defaults>")
    store_timeout: float = DEFAULT_TIMEOUT
    sqlite_synchronous: str = "full"
    connections: Connections = field(default_factory=Connections)
    ha: HaConfig | None = None
    web: WebConfig = field(default_factory=WebConfig)
    warnings: tuple[str, ...] = ()
    tables: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    keys: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def database_url(self) -> str:
        """The store's URL: ``store_url``, or the SQLite file in ``data_dir``."""
        return self.store_url or f"sqlite:///{(self.data_dir / 'oasis.db').resolve()}"


_DAEMON_KEYS = {
    "listen",
    "data_dir",
    "store_url",
    "store_timeout",
    "sqlite_synchronous",
    "slot_seconds",
    "window",
    "epoch",
    "log_level",
    "tick_seconds",
    "allow_insecure_remote",
    "wait_seconds",
    "keep_days",
}
_LEVELS = {"debug", "info", "warning", "error"}


_MAX_STORE_TIMEOUT = 3600.0


def _optional_table(data: Mapping[str, Any], key: str, hint: str) -> Mapping[str, Any]:
    """The table ``[key]`` of ``data`` ({} if absent); ConfigError if it is there but
    empty, saying ``hint``: its header uncommented and its keys not (the example config's
    ``# [tls]``) read as no table, and the daemon went on without it and said nothing."""
    given = fields.optional_mapping(data, key, "")
    if key in data and not given:
        raise ConfigError(f"{key}: the table is empty: {hint}")
    return given


def from_dict(
    data: Mapping[str, Any],
    source: str = "<dict>",
    base: Path | None = None,
    former: Collection[str] = (),
) -> Config:
    """Validate a parsed TOML document; a relative ``daemon.data_dir`` is relative to
    ``base`` (the config file's folder) if given, else to the working directory.
    ``former``: the token names of the config running (a reload's): a
    ``limits.max_utility_by_submitter`` cap naming one of them that has no token now is
    a warning (:attr:`Config.warnings`), not an error, so removing a tenant revokes its
    token whether or not its cap was removed in the same edit."""
    _check_keys(
        data,
        {
            "daemon",
            "pricing",
            "cluster",
            "metrics",
            "mqtt",
            "tls",
            "auth",
            "limits",
            "connections",
            "ha",
            "web",
        },
        "config",
    )
    data = durations(data)
    try:
        daemon = fields.optional_mapping(data, "daemon", "")
        _check_keys(daemon, _DAEMON_KEYS, "daemon")
        listen = check_listen(
            fields.text(daemon.get("listen", DEFAULT_LISTEN), "daemon.listen"), "daemon.listen"
        )
        level = fields.text(daemon.get("log_level", "info"), "daemon.log_level").lower()
        if level not in _LEVELS:
            raise ConfigError(f"daemon.log_level: must be one of {sorted(_LEVELS)}")
        store_url = daemon.get("store_url", "")
        if not isinstance(store_url, str):
            raise ConfigError("daemon.store_url: must be a string")
        why = unusable(store_url) if store_url else None
        if why is not None:
            raise ConfigError(f"daemon.store_url: {why}")
        store_timeout = fields.positive(
            daemon.get("store_timeout", DEFAULT_TIMEOUT), "daemon.store_timeout"
        )
        if store_timeout > _MAX_STORE_TIMEOUT:
            raise ConfigError(f"daemon.store_timeout: must be <= {_MAX_STORE_TIMEOUT:g} seconds")
        synchronous = daemon.get("sqlite_synchronous", "full")
        if synchronous not in SQLITE_SYNCHRONOUS:
            raise ConfigError(
                f"daemon.sqlite_synchronous: must be one of {list(SQLITE_SYNCHRONOUS)}, "
                f"got {synchronous!r}"
            )
        data_dir = Path(fields.text(daemon.get("data_dir", "./data"), "daemon.data_dir"))
        if base is not None and not data_dir.is_absolute():
            data_dir = base / data_dir
        epoch = slot_zero(daemon.get("epoch", 0), "daemon.epoch")
        insecure_remote = daemon.get("allow_insecure_remote", False)
        if not isinstance(insecure_remote, bool):
            raise ConfigError("daemon.allow_insecure_remote: must be true or false")
        tls_given = _optional_table(
            data, "tls", "give cert and key (and client_ca for mutual TLS), or leave [tls] "
            "out to serve plaintext on loopback",
        )  # fmt: skip
        tls_raw = rebased(tls_given, ("cert", "key", "client_ca"), base)
        tls = tls_from_dict(tls_raw)
        check_exposure(listen, tls, insecure_remote)
        if "cluster" not in data:  # the embedded demo's cluster is not a default of a file
            raise ConfigError(
                "cluster: is required: a config file gives its own [cluster] (resources and "
                "servers, as config/oasisd.example.toml does); only oasisd without --config "
                "runs the embedded demo cluster"
            )
        cluster_raw = fields.mapping(data["cluster"], "cluster")
        _check_keys(cluster_raw, {"resources", "servers"}, "cluster")
        cluster = cluster_from_dict(
            cluster_raw.get("resources"), cluster_raw.get("servers"), prefix="cluster."
        )
        limits = limits_from_dict(fields.optional_mapping(data, "limits", ""))
        wait_seconds = fields.non_negative(daemon.get("wait_seconds", 0), "daemon.wait_seconds")
        if wait_seconds > limits.max_wait_seconds:
            raise ConfigError(
                f"daemon.wait_seconds: {wait_seconds:g} exceeds limits.max_wait_seconds = "
                f"{limits.max_wait_seconds:g}"
            )
        window = _window(daemon.get("window", 300), daemon.get("slot_seconds", 3600))
        _check_ledger_size(cluster, window, limits)
        tokens = (
            tokens_from_dict(rebased(fields.mapping(data["auth"], "auth"), ("tokens_file",), base))
            if "auth" in data
            else None
        )
        named = {caller.name for caller in (tokens or {}).values()}
        stale: list[str] = []
        for name in limits.max_utility_by_submitter:
            if name in named:
                continue
            where = f"limits.max_utility_by_submitter.{name[:200]}"
            if name in former and tokens is not None:
                # a tenant a reload removes: its token must stop calling even if its cap
                # is left behind (the cap applies to no one; a start refuses it)
                stale.append(f"{where}: {name} has no token any more, so its cap "
                             "applies to no one: remove it (a start refuses a cap naming no "
                             "token)")  # fmt: skip
                continue
            raise SpecError.one(
                where,
                "names no submitter of [auth]'s tokens file"
                + (" (if its tenant was removed, remove its cap too)" if tokens is not None
                   else " (there is no [auth])"),
            )  # fmt: skip
        mqtt_given = _optional_table(
            data, "mqtt", 'give the broker\'s url (e.g. "mqtt://127.0.0.1:1883"), or leave '
            "[mqtt] out to run without a broker",
        )  # fmt: skip
        mqtt = mqtt_from_dict(rebased(mqtt_given, ("tls_ca",), base))
        if mqtt is not None:
            check_server_names(name for _kind, _i, name, _cap in cluster.servers())
            given = fields.optional_mapping(data, "mqtt", "").get("device_resource")
            if given and mqtt.device_resource not in cluster.resources:
                raise SpecError.one(
                    "mqtt.device_resource",
                    f"{mqtt.device_resource!r} is not a resource of the cluster (its "
                    f'resources: {", ".join(cluster.resources)}); "" gives agents no devices',
                )
        return Config(
            listen=listen,
            data_dir=data_dir,
            store_url=store_url,
            store_timeout=store_timeout,
            sqlite_synchronous=synchronous,
            slot_seconds=_slot_seconds(daemon.get("slot_seconds", 3600)),
            window=window,
            epoch=epoch,
            log_level=level,
            cluster=cluster,
            pricing=_pricing(fields.optional_mapping(data, "pricing", ""), cluster, base),
            tick_seconds=_tick_seconds(
                daemon.get("tick_seconds", 1.0), daemon.get("slot_seconds", 3600)
            ),
            metrics_listen=_metrics_listen(fields.optional_mapping(data, "metrics", "")),
            per_server_prices_up_to=_per_server_prices_up_to(
                fields.optional_mapping(data, "metrics", "")
            ),
            mqtt=mqtt,
            allow_insecure_remote=insecure_remote,
            tls=tls,
            tokens=tokens,
            limits=limits,
            wait_seconds=wait_seconds,
            keep_days=_keep_days(daemon.get("keep_days", 0)),
            epoch_from_store="epoch" not in daemon,
            connections=connections_from_dict(fields.optional_mapping(data, "connections", "")),
            ha=ha_from_dict(fields.mapping(data["ha"], "ha") if "ha" in data else None),
            web=web_from_dict(fields.optional_mapping(data, "web", ""), tls),
            source=source,
            warnings=(*stale, *_idle_servers(cluster)),
        )
    except SpecError as err:
        raise ConfigError(str(err)) from err


def load(path: str | Path, former: Collection[str] = ()) -> Config:
    """Read and validate a TOML config file (``former``: as for :func:`from_dict`)."""
    p = Path(path)
    data, mode, group = read_toml(p)
    try:
        parsed = from_dict(data, str(p), base=p.parent, former=former)
    except ConfigError as first:
        found = _problems(from_dict, data, str(p), p.parent, former)
        if len(found) > 1:
            raise ConfigError("\n".join(found)) from first
        raise
    meant = as_meant(durations(data))
    config = replace(parsed, tables=table_digests(meant), keys=key_digests(meant))
    found = [_exposed_secrets(p, config, mode, group), *_exposed_files(p, data),
             _clear_broker_password(config)]  # fmt: skip
    warnings = tuple(w for w in found if w)
    return replace(config, warnings=(*config.warnings, *warnings)) if warnings else config


def as_meant(value: Any) -> Any:
    """``value`` (a TOML document with its durations in seconds, :func:`durations`) with
    each integer a float, for :func:`table_digests`: a reload took ``tick_seconds = 1`` or
    ``"1s"`` in place of ``1.0`` (``slot_seconds = "1h"`` for ``3600``) for an edit that
    waits for a restart, and told the operator to restart for nothing."""
    if isinstance(value, Mapping):
        return {key: as_meant(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_meant(item) for item in value]
    if fields.is_integer(value):
        return float(value)
    return value


def table_digests(data: Mapping[str, Any]) -> dict[str, str]:
    """``{table: SHA-256 hex}`` of each top-level table of a TOML document as read (keys
    sorted, so only a changed value or key changes a digest; comments and layout do not).
    """
    return {
        name: hashlib.sha256(
            json.dumps(value, sort_keys=True, default=str).encode("utf-8")
        ).hexdigest()
        for name, value in data.items()
    }


def key_digests(data: Mapping[str, Any]) -> dict[str, str]:
    """``{"table.key": SHA-256 hex}`` of each key of each top-level table of a TOML
    document (as :func:`table_digests` does for tables)."""
    return {
        f"{table}.{key}": digest
        for table, value in data.items()
        if isinstance(value, Mapping)
        for key, digest in table_digests(value).items()
    }


def demo_config(data_dir: Path = Path("./data")) -> Config:
    """The embedded defaults: SQLite under ``data_dir`` and a small demo cluster
    (4 GPU worker servers, 2 PS servers, EC2-like) on loopback, with the console on
    :data:`~controller.console.settings.DEFAULT_WEB_LISTEN`."""
    gpu = {"gpu": 8, "cpu": 32, "mem": 488, "disk": 500, "bandwidth": 25}
    ps = {"cpu": 36, "mem": 60, "disk": 500, "bandwidth": 25}
    return from_dict(
        {
            "daemon": {"data_dir": str(data_dir), "window": 48},
            "web": {"listen": DEFAULT_WEB_LISTEN},
            "cluster": {
                "resources": ["gpu", "cpu", "mem", "disk", "bandwidth"],
                "servers": [
                    *({"name": f"gpu{i}", "kind": "worker", "capacity": gpu} for i in range(4)),
                    *({"name": f"ps{i}", "kind": "ps", "capacity": ps} for i in range(2)),
                ],
            },
        },
        "<embedded defaults>",
    )
