"""A store URL as it may be shown: in logs, errors and the daemon's first line.

SQLAlchemy's ``render_as_string(hide_password=True)`` masks the password of the URL's
user part only. libpq (and so psycopg) also takes one as a query parameter
(``...?password=...``, and ``sslpassword`` for a client key), which was printed as
written. :func:`shown` masks both; :func:`has_password` tells whether a URL carries one
(the config's "others may read it" warning, the client's "visible in ps" warning).
"""

from __future__ import annotations

import urllib.parse

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from pricing.fields import closest

__all__ = ["SECRET_PARAMETERS", "has_password", "shown", "unusable"]

SECRET_PARAMETERS = ("password", "sslpassword")
"""Query parameters of a URL that hold a secret."""

_MASK = "***"


def _parsed(url: str | URL) -> URL | None:
    if isinstance(url, URL):
        return url
    try:
        return make_url(url)
    except (ArgumentError, ValueError):  # not a URL (or a port that is not a number)
        return None


def has_password(url: str | URL) -> bool:
    """Whether ``url`` carries a password, in its user part or as a query parameter
    (one SQLAlchemy cannot parse is read as a plain URL: a bad port hides no password)."""
    parsed = _parsed(url)
    if parsed is None:
        plain = urllib.parse.urlsplit(str(url))
        query = urllib.parse.parse_qs(plain.query)
        return ":" in plain.netloc.rpartition("@")[0] or any(k in query for k in SECRET_PARAMETERS)
    return bool(parsed.password) or any(k in parsed.query for k in SECRET_PARAMETERS)


def shown(url: str | URL) -> str:
    """``url`` with every password masked (``***``); a string that does not parse as a
    URL is shown as ``<unreadable URL>`` (it may hold one where it cannot be found)."""
    parsed = _parsed(url)
    if parsed is None:
        return "<unreadable URL>"
    secret = {k: _MASK for k in SECRET_PARAMETERS if k in parsed.query}
    if secret:
        parsed = parsed.update_query_dict(secret)
    return parsed.render_as_string(hide_password=True).replace("%2A%2A%2A", _MASK)


def unusable(url: str) -> str | None:
    """Why SQLAlchemy cannot open a store at ``url`` (it does not parse, its port is not
    a number, no such dialect or driver), without the URL itself (it may hold a
    password), or None if it can try."""
    scheme = url.split(":", 1)[0][:40]
    try:
        parsed = make_url(url)
        parsed.get_dialect().import_dbapi()
    except (NoSuchModuleError, ImportError):
        return (
            f"no SQLAlchemy dialect or driver {scheme!r} here; e.g. postgresql+psycopg://"
            "oasis@db/oasis, or leave it empty for SQLite in daemon.data_dir"
        )
    except (ArgumentError, ValueError) as err:
        return f"not a SQLAlchemy URL ({err}); e.g. postgresql+psycopg://oasis@db/oasis"
    return _unknown_option(parsed)


_PSYCOPG_OWN = frozenset({"autocommit", "prepare_threshold", "context", "row_factory",
                          "cursor_factory"})  # fmt: skip
"""Keyword arguments psycopg's ``connect`` takes besides libpq's."""


def _unknown_option(url: URL) -> str | None:
    """Why a psycopg URL's query names a parameter libpq does not know (``?sslmod=
    require``), with the closest known one; None if every one is known. Found at the
    config's check (exit 2), not at each connect: as psycopg's "invalid connection
    option" there, systemd started the daemon again every 2 s for ever."""
    if url.get_backend_name() != "postgresql" or url.get_driver_name() != "psycopg":
        return None
    from psycopg import pq

    known = {o.keyword.decode() for o in pq.Conninfo.get_defaults()} | _PSYCOPG_OWN
    for key in url.query:
        if key not in known:
            near = closest(key, known)  # the rule every "did you mean" of the project has
            hint = f"; did you mean {near!r}?" if near else ""
            return (f"?{key[:40]}=...: not a connection parameter libpq knows{hint} (the "
                    "URL's query holds libpq's: sslmode, sslrootcert, options, ...)")  # fmt: skip
    return None
