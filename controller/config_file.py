"""Reading a config file, without the daemon's parts: its TOML whole, bounded, and the
``[mqtt]`` table alone for ``oasis agent --config``.

Kept apart from :mod:`controller.config`, which imports the store, the pricing core and
their libraries (147 MB resident): an agent on each GPU server needs the broker's
settings only (27 MB).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from controller.files import read_bounded
from controller.plane.settings import MqttConfig, mqtt_from_dict
from pricing import fields
from pricing.durations import parse_duration
from pricing.errors import SpecError

__all__ = ["ConfigError", "durations", "load_mqtt", "read_toml", "rebased"]


class ConfigError(Exception):
    """The configuration is invalid; the message names the key."""


def read_toml(p: Path) -> tuple[dict[str, Any], int, int]:
    """The TOML document at ``p``, its mode and group; ConfigError if unreadable."""
    try:
        # utf-8-sig: a byte-order mark, as some editors write, is no error (tomllib
        # read it as "Invalid statement (at line 1, column 1)", a character not shown)
        data = tomllib.loads(read_bounded(p).decode("utf-8-sig"))
        mode, group = p.stat().st_mode, p.stat().st_gid
    except OSError as err:
        raise ConfigError(f"{p}: cannot read: {err.strerror or err}") from err
    except UnicodeDecodeError as err:
        raise ConfigError(f"{p}: not UTF-8 text: {err.reason} at byte {err.start}") from err
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{p}: not TOML: {err}") from err
    except RecursionError as err:
        raise ConfigError(f"{p}: not TOML that can be read: nested too deeply") from err
    return data, mode, group


def rebased(raw: Mapping[str, Any], keys: tuple[str, ...], base: Path | None) -> dict[str, Any]:
    """``raw`` with each of its ``keys`` that is a relative path made relative to ``base``
    (the config file's folder), as ``data_dir`` and ``pricing.prior`` are: read from the
    working directory, ``tokens_file = "tokens"`` next to the config was not found under
    systemd (whose working directory is /). Values that are no text are left for the
    table's own reader to name."""
    out = dict(raw)
    for key in keys:
        value = out.get(key)
        if base is not None and isinstance(value, str) and value:
            path = Path(value).expanduser()
            out[key] = str(path if path.is_absolute() else base / path)
    return out


def load_mqtt(path: str | Path) -> MqttConfig | None:
    """Only the ``[mqtt]`` table of a config file (``oasis agent --config``): an agent on
    a worker node has no use for the daemon's tokens file, store or cluster, and may
    not be able to read them."""
    p = Path(path)
    data, _mode, _group = read_toml(p)
    try:
        table = durations(fields.optional_mapping(data, "mqtt", ""), "mqtt")
        return mqtt_from_dict(rebased(table, ("tls_ca",), p.parent))
    except SpecError as err:
        raise ConfigError(str(err)) from err


def durations(table: Mapping[str, Any], within: str = "") -> dict[str, Any]:
    """``table`` (and the tables in it) with each key ending in ``_seconds`` or
    ``_timeout`` given as a duration (``"2h"``, ``"90m"``) in seconds: ``--wait 2h``
    worked on the command line, ``wait_seconds = "2h"`` was "must be a number". The
    daemon's whole config and ``oasis agent --config``'s ``[mqtt]`` both go through it
    (before, ``heartbeat_timeout = "30s"`` started the daemon, and the agent given the
    same file exited 2: "must be a number").

    Raises:
        ConfigError: such a key's text is not a duration, naming the key (``within``:
            the dotted path of ``table``). Left to the key's reader, ``slot_seconds =
            "90 minutes"`` was refused as "must be a number, got the string", where
            ``"90m"`` is taken.
    """
    out: dict[str, Any] = dict(table)
    for key, value in table.items():
        name = f"{within}.{key}" if within else str(key)
        if isinstance(value, Mapping):
            out[key] = durations(value, name)
        elif isinstance(value, str) and key.endswith(("_seconds", "_timeout")):
            seconds = parse_duration(value)
            if seconds is None:
                raise ConfigError(
                    f'{name}: must be seconds or a duration such as "90m", "2h" or "1h30m" '
                    f"(units s, m, h, d), got {fields.show(value)}"
                )
            out[key] = seconds
    return out
