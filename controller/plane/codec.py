"""The JSON envelope every payload of the execution plane shares, and the checks of
fields more than one message has.

Every payload (:mod:`controller.plane.topics`) is a JSON object with ``"version": 1``
(:data:`VERSION`; 2 for a part of a plan in parts, :mod:`controller.plane.plan_messages`),
compact (no spaces). :func:`decode` reads one from untrusted bytes: whatever does not
parse is a :class:`~pricing.errors.SpecError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from pricing import fields
from pricing.errors import SpecError

__all__ = ["MAX_AGENT_PAYLOAD_BYTES", "MAX_RUN_CHARS", "VERSION", "decode"]

VERSION = 1

MAX_AGENT_PAYLOAD_BYTES = 256 * 1024
"""The largest heartbeat or progress payload the daemon parses; larger ones are dropped.
A report of :data:`~controller.plane.agent_messages.MAX_REPORT_JOBS` entries with
128-character ids is ~210 KB."""


def _dump(obj: Any, *omit: str) -> bytes:
    """``obj``'s fields but ``omit`` as a version-1 payload."""
    body = {k: v for k, v in asdict(obj).items() if k not in omit}
    return json.dumps({"version": VERSION, **body}, separators=(",", ":")).encode()


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate: a pair is text, a lone one is not (checked)."""


def decode(
    payload: bytes | bytearray | str,
    what: str,
    max_bytes: int = MAX_AGENT_PAYLOAD_BYTES,
    versions: tuple[int, ...] = (VERSION,),
) -> Mapping[str, Any]:
    """Parse a payload as a JSON object of one of ``versions`` (1); SpecError naming
    ``what`` if not, or if it is over ``max_bytes`` (then not parsed). Every failure of
    the parser on untrusted bytes is a SpecError: bad UTF-8 and bad JSON (ValueError),
    and JSON nested deeper than the parser's recursion limit (RecursionError)."""
    if len(payload) > max_bytes:
        raise SpecError.one(what, f"{len(payload)} bytes, over the limit of {max_bytes}")
    try:
        # strictly: json.loads(bytes) lets UTF-8-encoded surrogates through
        text = payload if isinstance(payload, str) else bytes(payload).decode("utf-8")
        data = json.loads(text)
        if _SURROGATE_ESCAPE.search(text):  # "\ud800" escaped: valid JSON, not text
            json.dumps(data, ensure_ascii=False).encode("utf-8")
    except ValueError as err:  # JSONDecodeError and UnicodeError are ValueErrors
        raise SpecError.one(what, f"not JSON: {str(err)[:200]}") from None
    except RecursionError:
        raise SpecError.one(what, "not JSON the parser can read: nested too deep") from None
    obj = fields.mapping(data, what)
    version = obj.get("version")
    if type(version) is not int or version not in versions:
        shown = " or ".join(map(str, versions))
        raise SpecError.one(f"{what}.version", f"must be {shown}, got {version!r}")
    return obj


MAX_RUN_CHARS = 64
"""The longest ``run`` of a task or a report entry."""


def _run(value: Any, field: str) -> str:
    """A task's or report entry's ``run``: text of at most :data:`MAX_RUN_CHARS`, or ""."""
    if value == "":
        return ""
    run = fields.text(value, field)
    if len(run) > MAX_RUN_CHARS:
        raise SpecError.one(field, f"{len(run)} characters, over {MAX_RUN_CHARS}")
    return run


def _below(value: Any, field: str, least: int, end: int) -> int:
    """An integer ``least .. end - 1``; SpecError naming ``field`` otherwise."""
    number = fields.integer(value, field, minimum=least)
    if number >= end:
        raise SpecError.one(field, f"must be below {end}, got {number}")
    return number
