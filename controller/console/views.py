"""The console's pages and their JSON twins under ``/api/`` (each reads the same
:class:`~controller.console.data.ConsoleData` view), the cancel form, the static files,
and how a query's integers are read and an answer is written as JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import structlog
from aiohttp import web

from controller.auth import Caller, Role
from controller.commands.records import job_record
from controller.console import pages
from controller.console.login import Login
from controller.console.public_url import public
from controller.console.state import _Handler, _RefusedError
from controller.convert import job_to_proto
from controller.job_keys import as_named, key_for, shown_view
from pricing import fields
from pricing.errors import SpecError

log = structlog.get_logger("oasisd")


class Views(Login):
    """The page and API handlers (a part of :class:`.app.Console`)."""

    def page(
        self, name: str, title: str, read: Callable[[web.Request], Awaitable[Any]]
    ) -> _Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            data = await read(request)
            caller: Caller = request["caller"]
            heading = f"Job {_job_id(request)}" if name == "job" else title
            path = self._local(request)
            api = public("/api" + (path if path != "/" else "/overview"), self.prefix)
            if request.query_string:
                api += "?" + request.query_string
            html = pages.page(
                name, heading, api, data, caller, auth=self.tokens is not None,
                csrf=self._csrf_of(request), version=self.version, prefix=self.prefix,
            )  # fmt: skip
            return web.Response(text=html, content_type="text/html")

        return handler

    @staticmethod
    def api(read: Callable[[web.Request], Awaitable[Any]]) -> _Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            return web.json_response(await read(request), dumps=_dumps)

        return handler

    @staticmethod
    def _operators_only(request: web.Request, what: str) -> None:
        caller: Caller = request["caller"]
        if caller.role is not Role.OPERATOR:
            raise _RefusedError(403, f"{caller.name} ({caller.role.value}) may not see {what}: "
                           "operators only")  # fmt: skip

    async def overview(self, request: web.Request) -> Any:
        return await self.data.overview(request["caller"])

    async def servers(self, request: web.Request) -> Any:
        self._operators_only(request, "the servers")
        return await self.data.servers(_int(request.query, "page", 1))

    async def prices(self, request: web.Request) -> Any:
        self._operators_only(request, "the prices")
        return await self.data.prices(request.query.get("resource", ""))

    async def price_cell(self, request: web.Request) -> Any:
        self._operators_only(request, "the prices")
        q = request.query
        rows = (_int(q, "r0"), _int(q, "r1"))
        slots = (_int(q, "s0"), _int(q, "s1"))
        return await self.data.price_cell(q.get("resource", ""), rows, slots)

    async def plans(self, request: web.Request) -> Any:
        self._operators_only(request, "the plans")
        job = request.query.get("job", "")
        if job:
            fields.job_key(job, "job")  # its id, or NAME:ID with tokens
        return await self.data.plans(_int(request.query, "page", 1), job, request["caller"])

    async def jobs(self, request: web.Request) -> Any:
        q = request.query
        return await self.data.jobs(
            request["caller"], q.get("state", ""), q.get("q", "").strip(), _int(q, "after", 0)
        )

    async def job(self, request: web.Request) -> Any:
        return await self.data.job(request["caller"], _job_id(request))

    async def cancel(self, request: web.Request) -> web.StreamResponse:
        caller: Caller = request["caller"]
        bearer = bool(request.headers.get("Authorization"))
        if not bearer:  # a browser: its cookie (or nothing) is ambient; the form is not
            await self._check_csrf(request)
        job_id = _job_id(request)  # a submitter's own jobs only, as CancelJob
        key = key_for(caller, job_id)
        cancel = self.c.cancel(key, caller.turn, caller.owner, caller.name or None)
        view, released = await as_named(caller, key, cancel)
        log.info("console cancel", job=key, caller=caller.name or None, released=released)
        if self._local(request).startswith("/api/"):
            times = self.c.slots.times
            record = job_record(job_to_proto(shown_view(caller, view), times), times)
            return web.json_response({"job": record, "released_worker_slots": released})
        raise web.HTTPSeeOther(public(job_path(job_id), self.prefix))

    async def static_file(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in self.static:
            raise _RefusedError(404, f"no file {name[:100]!r}")
        headers = {"Cache-Control": "public, max-age=86400, immutable", "Vary": "Accept-Encoding"}
        body = self.static[name]
        if "gzip" in request.headers.get("Accept-Encoding", "")[:200]:
            body, headers["Content-Encoding"] = self.static_gzip[name], "gzip"
        return web.Response(body=body, content_type=pages.STATIC[name], headers=headers)


def _job_id(request: web.Request) -> str:
    """The job a request names: in its path (``/jobs/ID``) or, for ``/job?id=ID``, its query."""
    return request.match_info.get("id") or request.query.get("id", "")


def job_path(job_id: str) -> str:
    """A job's page: ``/jobs/ID``, but ``/job?id=ID`` for the ids ``.`` and ``..``, which a
    browser (and curl) takes out of a path as dot segments: ``/jobs/..`` is ``/``."""
    if job_id in (".", ".."):
        return f"/job?id={job_id}"
    return f"/jobs/{quote(job_id)}"


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


_INTEGER = re.compile(r"-?[0-9]{1,18}")
"""An integer a query or header may give: ASCII digits only (``str.isdigit`` takes
``²``, which ``int`` refuses)."""


def _int(query: Any, name: str, default: int | None = None) -> int:
    raw = query.get(name)
    if raw is None or raw == "":
        if default is None:
            raise SpecError.one(name, "is required")
        return default
    text = str(raw)
    if not _INTEGER.fullmatch(text):
        raise SpecError.one(name, f"must be an integer of at most 18 digits, got {text[:40]!r}")
    return int(text)
