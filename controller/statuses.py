"""How failures reach gRPC clients: precise codes, bounded messages, every bad field.

- :func:`abort` ends a call for an exception with the code the servicer chose for it
  (None: a bug, logged, and INTERNAL). A SpecError also carries each problem as a
  ``google.rpc.BadRequest`` field violation (the standard rich error model, in the
  ``grpc-status-details-bin`` trailer), so a client can list them or name the field
  without parsing the message.
- Messages are bounded: problems with a field of at most :data:`MAX_TEXT` characters and
  a reason of at most :data:`MAX_REASON` (and :data:`MAX_BYTES` bytes), as many as fit
  in :data:`MAX_BYTES`, then how many more (a job naming 40,000 unknown resources made a
  3.4 MB message). The message and the details travel in trailers, and gRPC
  clients refuse trailers over 8 KiB by default (RESOURCE_EXHAUSTED instead of the
  error): the message percent-encoded (up to 3x for non-ASCII) plus the details in
  base64 stay under that.
- :class:`DecodeInterceptor`: a request whose bytes are not the method's message is
  INVALID_ARGUMENT, where gRPC itself answers UNKNOWN.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NoReturn

import grpc
import structlog
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from controller.handler_memo import HandlerMemo
from controller.streams import relay
from pricing.errors import Problem, SpecError
from pricing.text import escape

__all__ = ["MAX_BYTES", "MAX_REASON", "MAX_TEXT", "DecodeInterceptor", "abort", "bounded"]

MAX_BYTES = 1500
"""UTF-8 bytes of the problems listed in one error (the first is always listed)."""
MAX_TEXT = 200
"""Characters of one problem's field (and of its reason, if that is too many bytes)."""
MAX_REASON = 600
"""Characters of one problem's reason. The daemon's own run past 200 (a worker too large
in four resources; a deadline before the arrival and its remedy), and were cut at 200,
the user told of three resources and not the fourth; text a user sent is shortened in
them already (:func:`pricing.fields.show`), so this bounds only what has no other bound."""

log = structlog.get_logger("oasisd")


def _cut(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` escaped (no control characters or lone surrogates reach a client's
    terminal, or fail the UTF-8 of the status) and cut to ``limit`` characters."""
    text = escape(text)
    return text if len(text) <= limit else f"{text[: limit - 30]}...({len(text)} characters)"


def bounded(problems: Sequence[Problem]) -> list[Problem]:
    """The problems that fit in :data:`MAX_BYTES` (the first always), each field cut to
    :data:`MAX_TEXT` characters and each reason to :data:`MAX_REASON` (to :data:`MAX_TEXT`
    if the problem would still be over :data:`MAX_BYTES` bytes), and one more saying how
    many were left out."""
    out: list[Problem] = []
    used = 0
    for i, p in enumerate(problems):
        cut = Problem(_cut(p.field), _cut(p.reason, MAX_REASON))
        if len(str(cut).encode()) > MAX_BYTES:  # wide characters: as cut before
            cut = Problem(cut.field, _cut(p.reason))
        size = len(str(cut).encode()) + 2  # and "; "
        if out and used + size > MAX_BYTES:
            out.append(Problem("", f"and {len(problems) - i} more problems"))
            break
        out.append(cut)
        used += size
    return out


def _status(code: grpc.StatusCode, err: BaseException) -> status_pb2.Status:
    if not (isinstance(err, SpecError) and code == grpc.StatusCode.INVALID_ARGUMENT):
        return status_pb2.Status(code=code.value[0], message=_cut(str(err), 4 * MAX_TEXT))
    problems = bounded(err.problems)
    status = status_pb2.Status(
        code=code_pb2.INVALID_ARGUMENT, message="; ".join(str(p) for p in problems)
    )
    detail = error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=p.field, description=p.reason)
            for p in problems
        ]
    )
    status.details.add().Pack(detail)
    return status


async def abort(
    context: grpc.aio.ServicerContext, code: grpc.StatusCode | None, err: BaseException
) -> NoReturn:
    """End the call for ``err`` with ``code`` (see the module docstring); never returns."""
    if code is not None:
        status = rpc_status.to_status(_status(code, err))
        extra = getattr(err, "trailing", ())  # NotLeaderError: the leader's address
        if extra:
            status = status._replace(trailing_metadata=(*status.trailing_metadata, *extra))
        await context.abort_with_status(status)
    log.exception("internal error", exc_info=err)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(err).__name__}")
    raise AssertionError  # unreachable: abort raises


class _Undecodable:
    """What a request that does not decode becomes, so the call can answer for it."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _tolerant(decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def run(data: bytes) -> Any:
        try:
            return decode(data)
        except Exception as err:  # DecodeError, and whatever else bad bytes raise
            return _Undecodable(err)

    return run


async def _refuse(context: grpc.aio.ServicerContext, request: _Undecodable) -> NoReturn:
    reason = _cut(str(request.error) or type(request.error).__name__)
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {reason}")
    raise AssertionError  # unreachable: abort raises


class DecodeInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Requests that do not decode are INVALID_ARGUMENT (unary-request methods: every
    oasis RPC; health's too). Put it last, so authentication is checked first."""

    def __init__(self) -> None:
        self._memo = HandlerMemo()

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: Any
    ) -> Any:
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        return self._memo.wrapped(details.method, handler, _decoded)


def _decoded(method: str, handler: Any) -> Any:
    """``handler`` (of any ``method``) whose request, if it does not decode, is answered
    INVALID_ARGUMENT."""
    decode = _tolerant(handler.request_deserializer)
    if handler.unary_unary is not None:
        unary_unary = handler.unary_unary

        async def uu(request: Any, context: Any) -> Any:
            if isinstance(request, _Undecodable):
                await _refuse(context, request)
            return await unary_unary(request, context)

        return handler._replace(unary_unary=uu, request_deserializer=decode)
    if handler.unary_stream is not None:
        unary_stream = handler.unary_stream

        async def us(request: Any, context: Any) -> AsyncIterator[Any]:
            if isinstance(request, _Undecodable):
                await _refuse(context, request)
            async for item in relay(unary_stream(request, context)):
                yield item

        return handler._replace(unary_stream=us, request_deserializer=decode)
    return handler  # streamed requests (reflection): gRPC's own handling
