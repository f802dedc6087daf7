"""The warnings :func:`controller.config.load` adds for a config file that exposes
what it guards: secrets in a file others may read, the config, tokens file or TLS key
that others may change or read, and a broker password sent in the clear. (A listen
address served off loopback without TLS is an error, not a warning:
:func:`controller.tls.check_exposure`.) Each returns ``""`` (or no item) when there is
nothing to say."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controller.config_file import rebased
from controller.store.urls import has_password
from controller.tls import is_loopback

if TYPE_CHECKING:  # controller.config imports this module
    from controller.config import Config


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
