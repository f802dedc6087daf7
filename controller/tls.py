"""Transport security of the gRPC API: TLS for the daemon (mutual when a client CA is
given), the rule that plaintext stays on loopback, and the client's channel.

``[tls]`` keys, PEM files (relative paths are relative to the working directory):

    cert = "/etc/oasis/tls/server.crt"     # the daemon's certificate chain
    key = "/etc/oasis/tls/server.key"      # its private key
    client_ca = "/etc/oasis/tls/ca.crt"    # optional: require client certificates it signed

Without ``[tls]`` the daemon serves plaintext, and only on a loopback address unless
``daemon.allow_insecure_remote = true`` (tokens and job specs would cross the network
in the clear).
"""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from controller.bearer import TokenInterceptor
from controller.files import read_bounded
from pricing import fields
from pricing.errors import SpecError

__all__ = [
    "MAX_RESPONSE_BYTES",
    "TlsConfig",
    "check_exposure",
    "client_channel",
    "is_loopback",
    "loopback_names",
    "read_pem",
    "tls_from_dict",
]


@dataclass(frozen=True)
class TlsConfig:
    """The ``[tls]`` table with its files read.

    Attributes:
        cert, key: paths of the daemon's certificate chain and private key.
        client_ca: path of the CA whose client certificates are required; None: TLS
            without client certificates.
        cert_pem, key_pem, client_ca_pem: their contents.
    """

    cert: Path
    key: Path
    client_ca: Path | None
    cert_pem: bytes = field(repr=False)
    key_pem: bytes = field(repr=False)
    client_ca_pem: bytes | None = field(repr=False)

    @property
    def mutual(self) -> bool:
        """True if clients must present a certificate."""
        return self.client_ca_pem is not None


def read_pem(path: Path, what: str, field_name: str, pipes: bool = False) -> bytes:
    """The PEM file at ``path``; SpecError naming ``field_name`` if unreadable or not PEM.

    ``what`` is the PEM label expected (``CERTIFICATE``, or ``PRIVATE KEY`` which also
    matches ``RSA PRIVATE KEY`` and ``EC PRIVATE KEY``); ``pipes``: a pipe may be read
    too (the client's flags, not the daemon's files)."""
    try:
        data = read_bounded(path, pipes=pipes)
    except OSError as err:
        raise SpecError.one(field_name, f"cannot read {path}: {err.strerror or err}") from err
    if b"-----BEGIN " not in data or what.encode() + b"-----" not in data:
        raise SpecError.one(field_name, f"{path} holds no PEM {what}")
    return data


def tls_from_dict(raw: Mapping[str, Any]) -> TlsConfig | None:
    """Read the ``[tls]`` table; None if it is absent or empty."""
    known = {"cert", "key", "client_ca"}
    fields.check_known_keys(raw, known, "tls")
    if not raw:
        return None
    if "cert" not in raw or "key" not in raw:
        raise SpecError.one("tls", "needs both cert and key")
    cert = Path(fields.text(raw["cert"], "tls.cert"))
    key = Path(fields.text(raw["key"], "tls.key"))
    ca = Path(fields.text(raw["client_ca"], "tls.client_ca")) if "client_ca" in raw else None
    config = TlsConfig(
        cert=cert,
        key=key,
        client_ca=ca,
        cert_pem=read_pem(cert, "CERTIFICATE", "tls.cert"),
        key_pem=read_pem(key, "PRIVATE KEY", "tls.key"),
        client_ca_pem=read_pem(ca, "CERTIFICATE", "tls.client_ca") if ca else None,
    )
    # gRPC would start with a key that does not match and fail every handshake: check
    # with the standard library's TLS, which reads the same PEM files
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as err:
        raise SpecError.one(
            "tls.key", f"{key} is not the key of {cert}, or is encrypted: {err.reason or err}"
        ) from err
    if ca is not None:
        try:
            context.load_verify_locations(cafile=ca)
        except ssl.SSLError as err:
            raise SpecError.one("tls.client_ca", f"{ca}: {err.reason or err}") from err
    return config


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``, and
    ``127.0.0.0/8`` mapped into IPv6, ``::ffff:127.0.0.1``).

    A socket listening on ``[::]`` (both stacks) sees an IPv4 peer as its mapped IPv6
    address: the console's peers on such a listener read ``::ffff:127.0.0.1`` for every
    SSH tunnel and local browser, which Python before 3.13 does not call loopback, so
    all of them shared one host's ``web.max_connections_per_host`` (64), where loopback
    peers are meant to be held only to the total."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a host name: it may resolve to anything
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def loopback_names(host: str, port: int | str) -> set[str]:
    """The ``Host`` values a server listening on loopback ``host``:``port`` answers to
    (the console, /metrics): the loopback names and ``host`` itself, each with the port.
    A request naming another host came through a name rebound to 127.0.0.1 (DNS
    rebinding) or a proxy that should not reach it."""
    return {f"{h}:{port}" for h in ("127.0.0.1", "localhost", "[::1]", host)}


def check_exposure(listen: str, tls: TlsConfig | None, allow_insecure_remote: bool) -> None:
    """Refuse plaintext on a non-loopback ``listen`` address unless explicitly allowed."""
    host = listen.rpartition(":")[0]
    if tls is None and not allow_insecure_remote and not is_loopback(host):
        raise SpecError.one(
            "daemon.listen",
            f"{listen} is not a loopback address and [tls] is not configured: set [tls] cert "
            "and key (and client_ca for mutual TLS), or daemon.allow_insecure_remote = true "
            "to serve plaintext to the network",
        )


MAX_RESPONSE_BYTES = 16 * 2**20
"""The largest message the daemon sends (its ``grpc.max_send_message_length``) and every
client channel of this package reads (gRPC's default is 4 MiB): an answer the daemon may
send is never refused by the client that asked for it."""


def client_channel(
    address: str,
    *,
    tls: bool = False,
    ca_pem: bytes | None = None,
    cert_pem: bytes | None = None,
    key_pem: bytes | None = None,
    server_name: str = "",
    token: str = "",
    options: list[tuple[str, Any]] | None = None,
) -> grpc.Channel:
    """A blocking channel to the daemon.

    TLS when ``tls`` or any PEM is given: the server is verified against ``ca_pem``
    (None: gRPC's default roots) under its address's host or ``server_name``; with
    ``cert_pem``/``key_pem`` the client presents a certificate (mutual TLS). ``token``
    is sent as ``authorization: Bearer TOKEN`` on every call.
    """
    opts = [("grpc.max_receive_message_length", MAX_RESPONSE_BYTES), *(options or [])]
    if server_name:
        opts.append(("grpc.ssl_target_name_override", server_name))
    if tls or ca_pem or cert_pem:
        creds = grpc.ssl_channel_credentials(ca_pem, key_pem, cert_pem)
        channel = grpc.secure_channel(address, creds, options=opts)
    else:
        channel = grpc.insecure_channel(address, options=opts)
    if token:
        channel = grpc.intercept_channel(channel, TokenInterceptor(token))
    return channel
