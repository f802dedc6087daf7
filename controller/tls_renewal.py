"""The daemon's certificate renewed in place is served without a restart, and its expiry
is watched.

Certificates are short-lived where they are renewed by a tool (certbot: 90 days,
renewed at 60; step-ca: 24 hours by default; cert-manager), which writes the new files
over the old paths. Before, ``[tls]``'s files were read once at start: a renewed
certificate was served only after a restart, so each renewal cost every tenant a drain
and a start (or a failover), and a renewal with no restart after it ended in every
client's handshake failing once the old certificate expired.

:class:`CertificateWatch` looks at the files of ``[tls]`` (``cert``, ``key``,
``client_ca``) every :data:`CHECK_SECONDS`: when one has changed (its device, inode,
size or modification time; a symlink is followed, as certbot's ``live/`` links are),
the set is read and checked as at start (:func:`controller.tls.tls_from_dict`: PEM, the
key of the certificate, the CA loads). A set that passes is served from then on, to
every new connection of the gRPC API (:func:`grpc.dynamic_ssl_server_credentials`,
whose fetcher gRPC calls before each handshake) and of the console (its listeners'
``renew``); connections already open keep the certificate they began with. A set that
does not pass (a renewal caught half written, its new certificate beside the old key)
changes nothing: it is logged once as a warning naming the file and why, and looked at
again at the next check. A SIGHUP (``systemctl reload oasisd``, which renewal tools'
deploy hooks run) checks at once.

The served certificate's expiry (its first certificate's ``notAfter``) is exported as
``oasis_tls_certificate_expiry_timestamp_seconds`` (:mod:`controller.metrics`) and
warned of in the log: within :data:`WARN_SECONDS` (14 days) of it, once a day, and as
an error once a day after it.

``[tls]`` turned on or off, or moved to other paths, still waits for a restart
(:mod:`controller.reload`); what is renewed here is the content of the paths the daemon
started with. A replaced ``client_ca`` is the only CA trusted from then on, by both
listeners: client certificates of the old CA are refused on new connections (the
console's handshake takes the newest context's CAs as well as its certificate).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509

from controller.tls import TlsConfig, tls_from_dict
from pricing.errors import SpecError

__all__ = ["CHECK_SECONDS", "WARN_SECONDS", "CertificateWatch", "expiry"]

CHECK_SECONDS = 5.0
"""How often the files are looked at (a ``stat`` each; read only when changed)."""
WARN_SECONDS = 14 * 86400.0
"""How long before the served certificate's expiry the log warns of it (once a day)."""
_DAY = 86400.0

Identity = tuple[tuple[int, int, int, int] | None, ...]
"""Each file's (device, inode, size, modification time in ns); None where it cannot be
looked at."""


def expiry(cert_pem: bytes) -> float:
    """The ``notAfter`` of the first certificate of ``cert_pem``, Unix seconds; NaN if
    it does not parse here (``cryptography`` is stricter than OpenSSL, which loaded it:
    an old certificate with a negative serial number, say), which is then served all
    the same, its expiry unknown."""
    try:
        return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc.timestamp()
    except ValueError:
        return math.nan


@dataclass(frozen=True)
class Served:
    """What new connections get.

    Attributes:
        generation: 0 for the files read at start, one more at each renewal served.
        tls: the files' paths and contents.
        expires: the certificate's ``notAfter``, Unix seconds (NaN: unknown, :func:`expiry`).
    """

    generation: int
    tls: TlsConfig
    expires: float


class CertificateWatch:
    """The ``[tls]`` files served, renewed when they change (module docstring).

    Args:
        tls: ``[tls]`` as read at start.
        log: a structlog logger.
        now: the wall clock, Unix seconds (for the expiry).
    """

    def __init__(self, tls: TlsConfig, log: Any, now: Callable[[], float] = time.time) -> None:
        self.served = Served(0, tls, expiry(tls.cert_pem))
        self.log = log
        self._now = now
        self._files = _identity(tls)
        self._refused: Identity | None = None  # the files last found not to load
        self._warned_at = -float("inf")  # when the expiry was last warned of
        self._soon: set[asyncio.Task[None]] = set()  # check_soon's, held until done
        self._checking = asyncio.Lock()  # the periodic check and a SIGHUP's, in turn
        self.listeners: list[Callable[[TlsConfig], None]] = []
        """Called on the event loop with each renewal before it is served (the console's
        ``renew``); one that raises leaves the renewal unserved, as a set that does not
        load."""

    def credentials(self) -> grpc.ServerCredentials:
        """gRPC server credentials that give each new connection :attr:`served`."""
        tls = self.served.tls
        given = [self.served.generation]

        def fetch() -> Any:  # gRPC's thread, before each handshake: kept to a compare
            served = self.served
            if served.generation == given[0]:
                return None
            given[0] = served.generation
            return _configuration(served.tls)

        return grpc.dynamic_ssl_server_credentials(
            _configuration(tls), fetch, require_client_authentication=tls.mutual
        )

    def check_soon(self) -> None:
        """Run :meth:`check` now, beside the periodic one (on the event loop: a SIGHUP,
        which a renewal tool's deploy hook sends with ``systemctl reload``)."""
        task = asyncio.get_running_loop().create_task(self.check(), name="tls files")
        self._soon.add(task)
        task.add_done_callback(self._soon.discard)

    async def check(self) -> None:
        """Serve the files if they changed and load; warn of the expiry (the module
        docstring). For a :class:`controller.daemon.PeriodicEvent`; one at a time."""
        async with self._checking:
            await self._check()

    async def _check(self) -> None:
        renewed = await asyncio.to_thread(self._read_changed)
        if renewed is not None:
            tls, files = renewed
            try:
                for listener in self.listeners:
                    listener(tls)
            except (OSError, ValueError) as err:  # ssl.SSLError is an OSError
                self._refuse(files, f"the console cannot load them: {err}")
            else:
                self._files = files
                self.served = Served(self.served.generation + 1, tls, expiry(tls.cert_pem))
                self.log.info("tls: renewed certificate served to new connections",
                              cert=str(tls.cert), expires=_iso(self.served.expires))  # fmt: skip
        self._warn_of_expiry()

    def _read_changed(self) -> tuple[TlsConfig, Identity] | None:
        """The files read and checked if they changed since served or last refused;
        None if they did not, or do not load (logged once)."""
        tls = self.served.tls
        files = _identity(tls)
        if files in (self._files, self._refused):
            return None
        raw = {"cert": str(tls.cert), "key": str(tls.key)}
        if tls.client_ca is not None:
            raw["client_ca"] = str(tls.client_ca)
        try:
            renewed = tls_from_dict(raw)
            assert renewed is not None  # raw is not empty
        except (SpecError, ValueError) as err:
            self._refuse(files, str(err))
            return None
        return renewed, files

    def _refuse(self, files: Identity, why: str) -> None:
        self._refused = files
        self.log.warning(
            "tls: the certificate files changed but do not load; new connections still get "
            f"the one served, and the files are read again once they change: {why}",
            expires=_iso(self.served.expires),
        )

    def _warn_of_expiry(self) -> None:
        now = self._now()
        left = self.served.expires - now
        if math.isnan(left) or left > WARN_SECONDS or now - self._warned_at < _DAY:
            return
        self._warned_at = now
        cert, expires = str(self.served.tls.cert), _iso(self.served.expires)
        if left <= 0:
            self.log.error("tls: the certificate served has expired: clients refuse it; "
                           f"renew {cert} (it is served within {CHECK_SECONDS:g} s)",
                           expired=expires)  # fmt: skip
        else:
            self.log.warning(f"tls: the certificate served expires in {left / _DAY:.1f} days; "
                             f"renew {cert} (it is served within {CHECK_SECONDS:g} s)",
                             expires=expires)  # fmt: skip


def _configuration(tls: TlsConfig) -> Any:
    return grpc.ssl_server_certificate_configuration(
        [(tls.key_pem, tls.cert_pem)], root_certificates=tls.client_ca_pem
    )


def _identity(tls: TlsConfig) -> Identity:
    return tuple(_stat(p) for p in (tls.cert, tls.key, tls.client_ca))


def _stat(path: Path | None) -> tuple[int, int, int, int] | None:
    if path is None:
        return None
    try:
        s = os.stat(path)
    except OSError:
        return None
    return (s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns)


def _iso(seconds: float) -> str:
    if math.isnan(seconds):
        return "unknown"
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")
