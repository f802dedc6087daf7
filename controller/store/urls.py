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
        make_url(url).get_dialect().import_dbapi()
    except (NoSuchModuleError, ImportError):
        return (
            f"no SQLAlchemy dialect or driver {scheme!r} here; e.g. postgresql+psycopg://"
            "oasis@db/oasis, or leave it empty for SQLite in daemon.data_dir"
        )
    except (ArgumentError, ValueError) as err:
        return f"not a SQLAlchemy URL ({err}); e.g. postgresql+psycopg://oasis@db/oasis"
    return None
