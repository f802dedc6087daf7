"""Readers of single keys of the daemon's config (:mod:`controller.config`), each
checking one value and raising ConfigError (or SpecError, which
:func:`controller.config.from_dict` turns into one) that names the key: ``[daemon]``'s
window, slot length, retention and listen address, ``[metrics]``, the durations given as
text, unknown keys, and the cluster's idle servers and price-ledger size. Built on the
generic readers of :mod:`pricing.fields`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controller.config_file import ConfigError
from controller.limits import Limits
from controller.tls import is_loopback
from pricing import fields
from pricing.cluster import Cluster
from pricing.durations import format_duration, parse_duration
from pricing.errors import SpecError
from pricing.ledger import ledger_bytes

__all__ = [
    "MAX_KEEP_DAYS",
    "MAX_SLOT_SECONDS",
    "MAX_TICK_SECONDS",
    "MIN_SLOT_SECONDS",
    "MIN_TICK_SECONDS",
    "PER_SERVER_PRICES_UP_TO",
    "check_listen",
]


def _check_keys(table: Mapping[str, Any], known: set[str], where: str) -> None:
    """ConfigError for the first key of ``table`` not in ``known``, with the closest
    known key (``config.metric: unknown key; did you mean 'metrics'?``), else the known
    ones; it listed the 11 tables for ``[metric]``."""
    problems = fields.unknown_keys(table, known, where)
    if problems:
        raise ConfigError(str(problems[0]))


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


PER_SERVER_PRICES_UP_TO = 500
"""``metrics.per_server_prices_up_to``'s default, servers: ``oasis_unit_price{server,
kind, resource}`` is exported for a cluster of at most this many (about 2,250 series at
4.5 priced resources a server). At 10,000 servers it was 45,000 series, a 3.76 MB
scrape (``bench/RESULTS.md``); past it, the per-kind quantiles stand for them."""


def _metrics_listen(raw: Mapping[str, Any]) -> str:
    _check_keys(raw, {"listen", "allow_insecure_remote", "per_server_prices_up_to"}, "metrics")
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


def _per_server_prices_up_to(raw: Mapping[str, Any]) -> int:
    """``metrics.per_server_prices_up_to``: the largest cluster (servers, workers and PS
    together) whose unit prices are exported per server; 0: never."""
    value = raw.get("per_server_prices_up_to", PER_SERVER_PRICES_UP_TO)
    return fields.integer(value, "metrics.per_server_prices_up_to", minimum=0)


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


MIN_TICK_SECONDS = 0.01
MAX_TICK_SECONDS = 10.0
"""``daemon.tick_seconds`` lies in 10 ms .. 10 s, and at most a slot. Each tick reads the
store (is it rewound?) and reviews the agents' heartbeats: ``tick_seconds = 1e-9`` was
taken and held a core at 96% in store reads, beside the tenants' decisions on a shared
head node; ``"1h"`` was taken too, and slot boundaries (jobs started, pending jobs
decided) and silent agents were then seen up to an hour late."""


def _tick_seconds(value: Any, slot_seconds: Any) -> float:
    """``daemon.tick_seconds``: how often the slot clock and the execution plane look."""
    seconds = fields.positive(value, "daemon.tick_seconds")
    top = min(MAX_TICK_SECONDS, _slot_seconds(slot_seconds))
    if not MIN_TICK_SECONDS <= seconds <= top:
        limit = "daemon.slot_seconds" if top < MAX_TICK_SECONDS else "the longest"
        raise SpecError.one(
            "daemon.tick_seconds",
            f"must lie in {MIN_TICK_SECONDS:g} .. {top:g} seconds ({limit}: a longer tick "
            f"sees slot boundaries and silent agents late, a shorter one reads the store "
            f"in a loop), got {seconds:g}",
        )
    return seconds


def check_listen(listen: str, where: str) -> str:
    """``listen`` if it is ``host:port`` with a port 0 .. 65535; ConfigError naming
    ``where`` (``daemon.listen``, ``--listen``) otherwise."""
    host, _, port = listen.rpartition(":")
    if not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ConfigError(f"{where}: must be host:port (a port 0 .. 65535), got {listen!r}")
    return listen
