"""The console's HTML: one shell per page (navigation, the page's data as embedded JSON,
and the script that draws it), the login form and the error page.

Everything a page shows is drawn by ``static/console.js`` from the page's JSON, the same
document its twin under ``/api/`` returns, so the two cannot disagree. Every URL here
begins with ``prefix`` (the path of ``[web] public_url``, :mod:`.public_url`); the script
reads it from the body's ``data-base``. Text from outside
(job ids, names, messages) is escaped here and set with ``textContent`` by the script.
"""

from __future__ import annotations

import hashlib
import json
from html import escape
from importlib import resources
from typing import Any

from controller.auth import Caller, Role

__all__ = ["STATIC", "error_page", "login_page", "page", "static_version"]

STATIC = {"console.js": "text/javascript", "console.css": "text/css"}
"""The files under ``static/`` and their content types."""

_NAV = (("/", "overview", "Overview", False), ("/servers", "servers", "Servers", True),
        ("/prices", "prices", "Prices", True), ("/plans", "plans", "Plans", True),
        ("/jobs", "jobs", "Jobs", False))  # fmt: skip


def static_version() -> str:
    """A short hash of the static files: their URLs change when they do (cache busting)."""
    digest = hashlib.sha256()
    for name in sorted(STATIC):
        digest.update(resources.files("controller.console").joinpath("static", name).read_bytes())
    return digest.hexdigest()[:12]


def _head(title: str, version: str, prefix: str, csrf: str = "") -> str:
    meta = f'<meta name="csrf" content="{escape(csrf)}">' if csrf else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)} · oasis console</title>"
        f'<link rel="stylesheet" href="{escape(prefix)}/static/console.css?v={version}">{meta}'
        "</head>"
    )


def _header(active: str, caller: Caller | None, auth: bool, csrf: str, prefix: str) -> str:
    links = []
    for href, name, label, operators_only in _NAV if caller is not None else ():
        if operators_only and caller is not None and caller.role is not Role.OPERATOR:
            continue
        current = ' aria-current="page"' if name == active else ""
        links.append(f'<a href="{escape(prefix + href)}"{current}>{label}</a>')
    who = ""
    if caller is not None and auth:
        who = (
            f'<span class="who">{escape(caller.name)} <small>({caller.role.value})</small></span>'
            f'<form method="post" action="{escape(prefix)}/logout" class="logout">'
            f'<input type="hidden" name="csrf" value="{escape(csrf)}">'
            '<button type="submit">Log out</button></form>'
        )
    elif caller is not None:
        who = '<span class="who">no authentication <small>(operator)</small></span>'
    return (
        '<a class="skip" href="#main">Skip to content</a>'
        f'<header class="top"><a class="brand" href="{escape(prefix)}/">oasis</a>'
        f'<nav aria-label="Pages">{"".join(links)}</nav>'
        '<span id="live" class="live" role="status" aria-live="polite"></span>'
        f'<div class="user">{who}</div></header>'
    )


def embed(data: Any) -> str:
    """JSON for a ``<script type="application/json">`` block (no ``</script>`` inside)."""
    text = json.dumps(data, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page(
    name: str,
    title: str,
    api: str,
    data: Any,
    caller: Caller,
    *,
    auth: bool,
    csrf: str,
    version: str,
    prefix: str,
) -> str:
    """The shell of page ``name`` with its ``data``; ``api`` is its JSON twin's URL, the
    prefix included (the script fetches it again on live updates)."""
    return (
        _head(title, version, prefix, csrf)
        + f'<body data-page="{escape(name)}" data-api="{escape(api)}"{_base(prefix)}>'
        + _header(name, caller, auth, csrf, prefix)
        + f'<main id="main" tabindex="-1"><h1 id="title">{escape(title)}</h1>'
        '<div id="app"><p class="muted">Loading…</p></div>'
        '<noscript><p class="error">This console draws its pages with JavaScript (shipped '
        f'with the daemon, nothing from the network). The data is at <a href="{escape(api)}">'
        f"{escape(api)}</a>.</p></noscript></main>"
        f'<script type="application/json" id="data">{embed(data)}</script>'
        f'<script src="{escape(prefix)}/static/console.js?v={version}" defer></script>'
        "</body></html>"
    )


def login_page(version: str, next_path: str, prefix: str, problem: str = "") -> str:
    """The login form: a token (``oasis token``) in, a session cookie out; ``next_path``
    is the console's own path to go to after it (without the prefix)."""
    error = ""
    if problem:
        error = f'<p class="error" role="alert" id="login-error">{escape(problem)}</p>'
    return (
        _head("Log in", version, prefix)
        + f'<body data-page="login"{_base(prefix)}>'
        + _header("", None, True, "", prefix)
        + '<main id="main" tabindex="-1" class="narrow"><h1>Log in</h1>'
        "<p>Give the token an operator gave you (<code>oasis token NAME --role ROLE</code> "
        "makes one). It becomes a session in this browser; the token itself is not kept.</p>"
        f'{error}<form method="post" action="{escape(prefix)}/login" class="login">'
        f'<input type="hidden" name="next" value="{escape(next_path)}">'
        '<label for="token">Token</label>'
        '<input id="token" name="token" type="password" autocomplete="current-password" '
        'required autofocus spellcheck="false">'
        '<button type="submit">Log in</button></form></main></body></html>'
    )


def error_page(
    version: str,
    status: int,
    message: str,
    caller: Caller | None,
    *,
    auth: bool,
    csrf: str,
    prefix: str,
) -> str:
    """A page that says what went wrong, with the navigation to go on."""
    return (
        _head(f"{status}", version, prefix, csrf)
        + f'<body data-page="error"{_base(prefix)}>'
        + _header("", caller, auth, csrf, prefix)
        + f'<main id="main" tabindex="-1" class="narrow"><h1>{status}</h1>'
        f'<p class="error" role="alert">{escape(message)}</p>'
        f'<p><a href="{escape(prefix)}/">Back to the overview</a></p></main></body></html>'
    )


def _base(prefix: str) -> str:
    """The body's ``data-base`` attribute, which the script prefixes its URLs with."""
    return f' data-base="{escape(prefix)}"' if prefix else ""
