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

import copy
import hashlib
import json
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from controller.auth import Caller, tokens_from_dict
from controller.clock import epoch as slot_zero
from controller.config_file import ConfigError, load_mqtt, read_toml, rebased
from controller.connections import Connections, connections_from_dict
from controller.console.settings import DEFAULT_WEB_LISTEN, WebConfig, web_from_dict
from controller.files import read_bounded
from controller.ha.settings import HaConfig, ha_from_dict
from controller.limits import Limits, limits_from_dict
from controller.plane.settings import MqttConfig, check_server_names, mqtt_from_dict
from controller.store.database import DEFAULT_TIMEOUT, SQLITE_SYNCHRONOUS
from controller.store.urls import has_password, unusable
from controller.tls import TlsConfig, check_exposure, is_loopback, tls_from_dict
from pricing import fields
from pricing.bound_estimate import DEFAULT_TRIM
from pricing.bound_prior import MAX_PRIOR_BYTES, Prior, prior_from_dict
from pricing.cluster import Cluster, cluster_from_dict
from pricing.default_prior import default_prior
from pricing.durations import format_duration, parse_duration
from pricing.errors import SpecError
from pricing.ledger import ledger_bytes
from pricing.prices import PriceBounds, bounds_from_dict

__all__ = [
    "DEFAULT_LISTEN",
    "Config",
    "ConfigError",
    "PricingConfig",
    "demo_config",
    "load",
    "load_mqtt",
    "table_digests",
]

DEFAULT_LISTEN = "127.0.0.1:50051"


@dataclass(frozen=True)
class PricingConfig:
    """How the daemon gets its price bounds.

    Attributes:
        mode: ``"explicit"`` (``bounds`` given) or ``"estimate"`` (from the jobs seen).
        bounds: explicit bounds, for ``mode == "explicit"``.
        trim: estimate: L ignores the jobs of lowest unit value that carry this share of
            the utility seen, in [0, 1) (pricing/bound_estimate.py).
        l_margin: estimate: the estimated L is multiplied by this, in (0, 1].
        u_margin: estimate: the estimated U is multiplied by this, >= 1.
        prior: estimate: the prior it starts from (pricing/bound_prior.py); None: none,
            the first job sets it. The config's ``prior`` is ``"default"`` (the shipped
            :func:`pricing.default_prior.default_prior`, also when absent), ``"none"``,
            or the path of a JSON prior ``oasis calibrate`` wrote.
    """

    mode: str
    bounds: PriceBounds | None = None
    l_margin: float = 1.0
    u_margin: float = 1.0
    trim: float = DEFAULT_TRIM
    prior: Prior | None = field(default_factory=default_prior)


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


def _check_keys(table: Mapping[str, Any], known: set[str], where: str) -> None:
    for key in table:
        if key not in known:
            raise ConfigError(f"{where}.{key}: unknown key (known: {', '.join(sorted(known))})")


_MAX_STORE_TIMEOUT = 3600.0


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
    data = _durations(data)
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
        tls_raw = rebased(
            fields.optional_mapping(data, "tls", ""), ("cert", "key", "client_ca"), base
        )
        tls = tls_from_dict(tls_raw)
        check_exposure(listen, tls, insecure_remote)
        cluster_raw = fields.mapping(fields.require(data, "cluster", ""), "cluster")
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
        mqtt = mqtt_from_dict(rebased(fields.optional_mapping(data, "mqtt", ""), ("tls_ca",), base))
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
            tick_seconds=fields.positive(daemon.get("tick_seconds", 1.0), "daemon.tick_seconds"),
            metrics_listen=_metrics_listen(fields.optional_mapping(data, "metrics", "")),
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


def _idle_servers(cluster: Cluster) -> list[str]:
    """Warnings for servers no worker or PS can ever use: every one needs bandwidth
    (SPEC 3), so a server without it takes nothing (a typo, or a missing key, in
    ``[cluster]``). Not an error: a server may be listed ahead of its hardware."""
    out = []
    for kind, _index, name, caps in cluster.servers():
        if caps[cluster.bandwidth] <= 0:
            out.append(f"cluster.servers: {kind} server {name!r} has no bandwidth capacity: "
                       f"no {'worker' if kind == 'worker' else 'PS'} can run there "
                       "(every one needs bandwidth)")  # fmt: skip
    return out


MAX_KEEP_DAYS = 36525
"""The longest ``daemon.keep_days``: a century (past it, use 0: keep every job)."""


def _keep_days(value: Any) -> float:
    """``daemon.keep_days``: 0 (keep every job) or a number of days up to a century."""
    days = fields.non_negative(value, "daemon.keep_days")
    if days > MAX_KEEP_DAYS:
        raise SpecError.one(
            "daemon.keep_days", f"must be at most {MAX_KEEP_DAYS} (a century; 0 keeps every "
            f"job), got {fields.show(value)}"
        )  # fmt: skip
    return days


def _check_ledger_size(cluster: Cluster, window: int, limits: Limits) -> None:
    """ConfigError if the price ledger over ``window + 1`` slots of ``cluster`` would
    take more than ``limits.max_ledger_mb``."""
    need = ledger_bytes(cluster, window + 1) / 2**20
    if need > limits.max_ledger_mb:
        servers = len(cluster.worker_names) + len(cluster.ps_names)
        raise ConfigError(
            f"daemon.window: {window} slots x {servers} servers x {len(cluster.resources)} "
            f"resources need a price ledger of {need:,.0f} MiB, over limits.max_ledger_mb = "
            f"{limits.max_ledger_mb:g}; use a smaller window (or raise the limit if the "
            f"head node has the memory, twice that while the ledger is rebuilt)"
        )


def _metrics_listen(raw: Mapping[str, Any]) -> str:
    _check_keys(raw, {"listen", "allow_insecure_remote"}, "metrics")
    listen = raw.get("listen", "")
    if not isinstance(listen, str):
        raise ConfigError(f"metrics.listen: must be a string host:port, got {listen!r}")
    host, _, port = listen.rpartition(":")
    if listen and (not host or not (port.isascii() and port.isdigit()) or int(port) > 65535):
        raise ConfigError(f"metrics.listen: must be host:port (or empty: off), got {listen!r}")
    remote = raw.get("allow_insecure_remote", False)
    if not isinstance(remote, bool):
        raise ConfigError("metrics.allow_insecure_remote: must be true or false")
    # as daemon.listen: /metrics is plain HTTP without authentication, and it names
    # servers, prices and job counts
    if listen and not remote and not is_loopback(host):
        raise ConfigError(
            f"metrics.listen: {listen} is not a loopback address: the metrics endpoint is "
            "plain HTTP without authentication; set metrics.allow_insecure_remote = true to "
            "serve it to the network"
        )
    return listen


def _window(value: Any, slot_seconds: Any) -> int:
    """``daemon.window``: a count of slots, or a duration that is a whole number of them
    (``"48h"`` with slots of an hour; the units audit: "must be an integer" did not say
    it counts slots)."""
    seconds = parse_duration(value) if isinstance(value, str) else None
    if seconds is None:
        if isinstance(value, str):
            raise ConfigError(f"daemon.window: must be a number of slots or a duration such "
                              f'as "48h", got {fields.show(value)}')  # fmt: skip
        return fields.positive_int(value, "daemon.window")
    slot = _slot_seconds(slot_seconds)
    slots = seconds / slot
    if abs(slots - round(slots)) > 1e-9 * max(1.0, slots) or round(slots) < 1:
        raise ConfigError(f"daemon.window: {value!r} is not a whole number of slots of "
                          f"{format_duration(slot)} (daemon.slot_seconds)")  # fmt: skip
    return round(slots)


def _durations(table: Mapping[str, Any]) -> dict[str, Any]:
    """``table`` (and the tables in it) with each key ending in ``_seconds`` or
    ``_timeout`` given as a duration (``"2h"``, ``"90m"``) in seconds: ``--wait 2h``
    worked on the command line, ``wait_seconds = "2h"`` was "must be a number". Any
    other text is left for the key's reader to refuse."""
    out: dict[str, Any] = dict(table)
    for key, value in table.items():
        if isinstance(value, Mapping):
            out[key] = _durations(value)
        elif isinstance(value, str) and key.endswith(("_seconds", "_timeout")):
            seconds = parse_duration(value)
            out[key] = value if seconds is None else seconds
    return out


def _prior(raw: Any, base: Path | None) -> Prior | None:
    """``pricing.prior``: ``"default"``, ``"none"`` or the path of a JSON prior, relative
    to ``base`` (the config file's folder) if given, else to the working directory."""
    name = fields.text(raw, "pricing.prior")
    if name == "default":
        return default_prior()
    if name == "none":
        return None
    path = Path(name)
    if base is not None and not path.is_absolute():
        path = base / path
    try:
        data = read_bounded(path, MAX_PRIOR_BYTES)
    except OSError as err:
        raise ConfigError(f"pricing.prior: cannot read {path}: {err.strerror or err}") from err
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as err:
        raise ConfigError(f"pricing.prior: {path} is not JSON: {err}") from err
    try:
        prior = prior_from_dict(doc, "prior")
    except SpecError as err:
        raise ConfigError(
            f"pricing.prior: {path} is not a prior of oasis calibrate: {err}"
        ) from err
    return prior if prior.source else replace(prior, source=str(path))


def _pricing(raw: Mapping[str, Any], cluster: Cluster, base: Path | None = None) -> PricingConfig:
    mode = raw.get("bounds", "estimate")
    if mode == "estimate":
        _check_keys(raw, {"bounds", "l_margin", "u_margin", "trim", "prior"}, "pricing")
        l_margin = fields.positive(raw.get("l_margin", 1.0), "pricing.l_margin")
        u_margin = fields.positive(raw.get("u_margin", 1.0), "pricing.u_margin")
        if l_margin > 1:
            raise ConfigError("pricing.l_margin: must be in (0, 1]")
        if u_margin < 1:
            raise ConfigError("pricing.u_margin: must be >= 1")
        trim = fields.number(raw.get("trim", DEFAULT_TRIM), "pricing.trim")
        if not 0 <= trim < 1:
            raise ConfigError(f"pricing.trim: must be in [0, 1), got {trim}")
        prior = _prior(raw.get("prior", "default"), base)
        return PricingConfig("estimate", None, l_margin, u_margin, trim, prior)
    if mode == "explicit":
        for key in ("trim", "l_margin", "u_margin", "prior"):  # the estimate's keys
            if key in raw:
                raise ConfigError(
                    f'pricing.{key}: only with bounds = "estimate"; with "explicit" '
                    "bounds remove it (the keys are U1, U2, L1, L2)"
                )
        _check_keys(raw, {"bounds", "U1", "U2", "L1", "L2"}, "pricing")
        explicit = {k: v for k, v in raw.items() if k != "bounds"}
        bounds = bounds_from_dict(explicit, cluster, "pricing")
        assert bounds is not None
        return PricingConfig("explicit", bounds, prior=None)
    raise ConfigError(f"pricing.bounds: must be 'estimate' or 'explicit', got {mode!r}")


MIN_SLOT_SECONDS = 1.0
MAX_SLOT_SECONDS = 366 * 86400.0
"""``daemon.slot_seconds`` lies in 1 s .. a year: the slot clock counts slots since the
epoch in 64-bit integers (a slot of 1e-12 s overflows them, and the store's), and slot
times are dates (a slot of 1e300 s has none)."""


def _slot_seconds(value: Any) -> float:
    seconds = fields.positive(value, "daemon.slot_seconds")
    if not MIN_SLOT_SECONDS <= seconds <= MAX_SLOT_SECONDS:
        raise SpecError.one(
            "daemon.slot_seconds",
            f"must lie in {MIN_SLOT_SECONDS:g} .. {MAX_SLOT_SECONDS:.0f} seconds (366 days), "
            f"got {seconds:g}",
        )
    return seconds


def check_listen(listen: str, where: str) -> str:
    """``listen`` if it is ``host:port`` with a port 0 .. 65535; ConfigError naming
    ``where`` (``daemon.listen``, ``--listen``) otherwise."""
    host, _, port = listen.rpartition(":")
    if not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ConfigError(f"{where}: must be host:port (a port 0 .. 65535), got {listen!r}")
    return listen


def load(path: str | Path, former: Collection[str] = ()) -> Config:
    """Read and validate a TOML config file (``former``: as for :func:`from_dict`)."""
    p = Path(path)
    data, mode, group = read_toml(p)
    try:
        parsed = from_dict(data, str(p), base=p.parent, former=former)
    except ConfigError as first:
        found = _problems(data, str(p), p.parent, former)
        if len(found) > 1:
            raise ConfigError("\n".join(found)) from first
        raise
    config = replace(parsed, tables=table_digests(data))
    found = [_exposed_secrets(p, config, mode, group), *_exposed_files(p, data),
             _clear_broker_password(config)]  # fmt: skip
    warnings = tuple(w for w in found if w)
    return replace(config, warnings=(*config.warnings, *warnings)) if warnings else config


MAX_PROBLEMS = 20
"""Problems of a config file said at once, at most."""


def _problems(
    data: Mapping[str, Any], source: str, base: Path, former: Collection[str]
) -> list[str]:
    """Every problem of ``data`` :func:`from_dict` finds one at a time (at most
    :data:`MAX_PROBLEMS`): after each, the key it names is taken out (its default then
    applies) and the document read again. The parser stops at its first problem, so a
    file with three mistakes took three starts to mend (the CLI audit). A key its table
    requires takes its table with it. A problem that names no key a table holds (a
    list's item, a rule between two keys) ends the list."""
    trial = copy.deepcopy(dict(data))
    out: list[str] = []
    dropped = ""
    while len(out) < MAX_PROBLEMS:
        try:
            from_dict(trial, source, base=base, former=former)
        except ConfigError as err:
            path = str(err).split(":", 1)[0].strip()
            if path == dropped:  # a key its table requires: its removal's problem, not
                # the file's; the table goes instead (its defaults, or none), if it is one
                table = path.rpartition(".")[0]
                if not table or not _drop(trial, table):
                    break
                dropped = table
                continue
            out.append(str(err))
            if not _drop(trial, path):
                break
            dropped = path
        else:
            break
    return out


def _drop(doc: dict[str, Any], path: str) -> bool:
    """Take the key at dotted ``path`` out of ``doc``'s tables; False if there is none."""
    *tables, key = path.split(".")
    for name in tables:
        inner = doc.get(name)
        if not isinstance(inner, dict):
            return False
        doc = inner
    if key not in doc:
        return False
    del doc[key]
    return True


def _clear_broker_password(config: Config) -> str:
    """A warning if the broker's password would cross the network in the clear: TLS off
    and a broker off loopback (gRPC, the console and /metrics refuse plaintext there)."""
    mqtt = config.mqtt
    if mqtt is None or not mqtt.password or mqtt.tls or is_loopback(mqtt.host):
        return ""
    return (f"mqtt: the broker {mqtt.host}:{mqtt.port} is not on loopback and TLS is off: "
            "the broker password, and every plan, cross the network in the clear; use "
            "mqtts:// (or tls_ca)")  # fmt: skip


def _exposed_files(config_path: Path, data: Mapping[str, Any]) -> list[str]:
    """Warnings for the files that decide who may do what, when others may change them:
    the config and the tokens file writable by another user (a line added to the
    tokens file makes its writer an operator at the next reload), and the TLS private
    key readable by others (they could pose as this daemon)."""
    base = config_path.parent
    auth, tls = (t if isinstance(t := data.get(k), Mapping) else {} for k in ("auth", "tls"))
    checks: list[tuple[str, Any, bool]] = [
        ("the config", str(config_path), False),
        ("auth.tokens_file", rebased(auth, ("tokens_file",), base).get("tokens_file"), False),
        ("tls.key", rebased(tls, ("key",), base).get("key"), True),
    ]
    out = []
    for what, value, secret in checks:
        if not isinstance(value, str) or not value:
            continue
        try:
            st = Path(value).stat()
        except OSError:
            continue  # its own reader names it
        mode = st.st_mode & 0o777
        others_write = _others_may(mode, st.st_gid, write=True)
        stranger = st.st_uid not in (0, os.geteuid())
        if others_write or stranger:
            owner = f"owned by uid {st.st_uid}, " if stranger else ""
            out.append(f"{what} {value}: {owner}mode {mode:04o}: another user may change it "
                       f"and so who may do what here; chown it to root or the daemon's "
                       f"user, chmod go-w")  # fmt: skip
        elif secret and _others_may(mode, st.st_gid):
            out.append(f"{what} {value}: mode {mode:04o}: others may read this private key "
                       f"(and pose as this daemon); chmod 600 it, or 640 with the "
                       f"daemon's group")  # fmt: skip
    return out


def _others_may(mode: int, group: int, write: bool = False) -> bool:
    """Whether users other than the daemon's may read (or ``write``) a file of ``mode``
    and ``group``: anyone, or a group that is not the daemon's own (the install steps'
    ``0640 root:oasis`` is fine)."""
    bit = 0o002 if write else 0o004
    return bool(mode & bit or (mode & (bit << 3) and group != os.getegid()))


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


def _exposed_secrets(path: Path, config: Config, mode: int, group: int) -> str:
    """A warning if the file holds secrets and users other than the daemon's may read
    it: anyone (``o+r``), or a group that is not the daemon's own (``g+r``; the install
    steps' ``0640 root:oasis`` is fine)."""
    secrets = []
    if config.store_url and has_password(config.store_url):
        secrets.append("daemon.store_url's password")
    if config.mqtt is not None and config.mqtt.password:
        secrets.append("the mqtt password")
    if not secrets or not _others_may(mode, group):
        return ""
    return (
        f"{path} holds {' and '.join(secrets)} and others may read it (mode "
        f"{mode & 0o777:04o}): chmod 600 it, or 640 with the daemon's group"
    )


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
