"""The URL users open the console at, when a reverse proxy serves it (``[web] public_url``,
such as ``https://head.example/oasis/``), and the console's paths under it.

From that URL the console takes:

- its **path prefix** (``/oasis``; empty for a whole host): every link, form, redirect,
  script URL and the session cookie's path begin with it. A request is served with it or
  without it, so the proxy may pass the path on (nginx: ``proxy_pass
  http://127.0.0.1:8080;``) or strip the prefix (``proxy_pass http://127.0.0.1:8080/;``);
  :func:`local` gives the console's own path of either, :func:`public` the URL sent for one;
- its **public host**: a browser's ``Origin`` on a login, cancel or logout is the proxy's
  (``https://head.example``), not the ``Host`` the proxy sends the console (nginx's
  default is the upstream's own ``127.0.0.1:8080``), so a form posted through a proxy was
  refused as cross-origin. The public host is accepted as an ``Origin``, and as a
  ``Host`` on a loopback console (a proxy sending ``Host $host``): it is the operator's
  own name, so DNS rebinding (another site's name pointed at 127.0.0.1) still gets 421;
- whether the browser sees HTTPS: the session cookie is then ``Secure``;
- that a loopback peer is the proxy: a login or a refused token is logged, and a guess
  rated, as the client it names last in ``X-Forwarded-For``
  (:meth:`.login.Login._client`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from pricing.errors import SpecError

__all__ = ["ROUTE_SEGMENTS", "PublicUrl", "cookie_path", "local", "parse", "public"]

ROUTE_SEGMENTS = frozenset({"api", "job", "jobs", "login", "logout", "plans", "prices",
                            "servers", "static"})  # fmt: skip
"""The first path segments of the console's own routes (:meth:`.app.Console.app`): a
prefix beginning with one would make its paths ambiguous."""

_SEGMENTS = re.compile(r"(/[A-Za-z0-9._~-]+)*")
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class PublicUrl:
    """``[web] public_url`` read.

    Attributes:
        url: the URL as the config gives it, its path without a ``/`` at the end.
        prefix: its path (``/oasis``), or empty.
        hosts: the ``Host`` or ``Origin`` host names (``host`` and ``host:port``, the
            port left out where it is the scheme's default) a browser or proxy uses for
            it, lowercased.
        secure: the browser reaches it over HTTPS.
    """

    url: str
    prefix: str
    hosts: frozenset[str]
    secure: bool


def parse(raw: object, key: str = "web.public_url") -> PublicUrl | None:
    """Read a public URL (empty: none); SpecError names ``key`` and what is wrong."""
    if not isinstance(raw, str):
        raise SpecError.one(key, f'must be a string such as "https://head.example/oasis/", '
                                 f"got {raw!r}")  # fmt: skip
    if not raw:
        return None
    example = "such as https://head.example/oasis/"
    if len(raw) > 500 or not raw.isascii() or not raw.isprintable() or " " in raw:
        raise SpecError.one(key, f"must be a URL {example} (printable ASCII, at most 500 "
                                 f"characters), got {raw[:200]!r}")  # fmt: skip
    parts = urlsplit(raw)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise SpecError.one(key, f"must be an http:// or https:// URL {example}, got {raw!r}")
    if parts.username is not None or parts.query or parts.fragment or raw.endswith(("?", "#")):
        raise SpecError.one(key, f"must be a URL {example}, with no user, query or fragment, "
                                 f"got {raw!r}")  # fmt: skip
    try:
        port = parts.port
    except ValueError:
        words = f"has a port that is not a number up to 65535: {raw!r}"
        raise SpecError.one(key, words) from None
    prefix = parts.path.rstrip("/")
    if not _SEGMENTS.fullmatch(prefix) or "//" in parts.path:
        raise SpecError.one(key, f"has a path the console cannot be served under: "
                                 f"{parts.path!r} (segments of letters, digits and -._~, "
                                 "each after one /)")  # fmt: skip
    segments = prefix.split("/")[1:]
    if any(s in (".", "..") for s in segments):
        raise SpecError.one(key, f"may not have . or .. in its path, got {parts.path!r}")
    if segments and segments[0] in ROUTE_SEGMENTS:
        raise SpecError.one(key, f"has a path beginning with /{segments[0]}, a path of the "
                                 "console's own: serve it under another")  # fmt: skip
    host = parts.hostname.lower()
    named = f"[{host}]" if ":" in host else host  # an IPv6 address, as a Host header has it
    hosts = {named}
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        hosts.add(f"{named}:{port}")
    url = f"{scheme}://{parts.netloc}{prefix}"
    return PublicUrl(url, prefix, frozenset(hosts), scheme == "https")


def local(path: str, prefix: str) -> str:
    """The console's own path of a request's ``path`` (``/oasis/jobs`` -> ``/jobs``; the
    prefix alone -> ``/``); a path not under ``prefix`` is returned as it is."""
    if prefix and (path == prefix or path.startswith(prefix + "/")):
        return path[len(prefix) :] or "/"
    return path


def public(path: str, prefix: str) -> str:
    """The URL a browser is sent for the console's own ``path`` (it begins with ``/``):
    ``/jobs`` -> ``/oasis/jobs``, ``/`` -> ``/oasis/``."""
    return prefix + path


def cookie_path(prefix: str) -> str:
    """The session cookie's path: the prefix's pages only (other applications behind the
    same proxy host are not sent it), or ``/``."""
    return prefix + "/" if prefix else "/"
