"""Stopping without cutting calls off: every call the daemon took is answered, and those
it cannot answer get UNAVAILABLE, which clients retry -- never CANCELLED, which they do
not.

gRPC's own stop (``server.stop(grace)``) answers CANCELLED to the calls that reach the
server as it begins to shut down, before any handler took them, and to every call still
running when the grace period ends. With clients submitting in a loop, 13-14 calls per
SIGTERM were cut off that way (measured; ``tests/test_drain.py``). So the daemon stops in
three steps, the last two through :class:`StopGate`, a server interceptor around every
call:

1. drain (``AdmissionController.drain``): new decisions are refused with UNAVAILABLE,
   those in flight are decided, committed and answered; reads are served.
2. :meth:`StopGate.stop` closes the gate: new calls of any kind are held, not answered,
   until ``HOLD_SECONDS`` have passed since the last call ended (at once if that was
   longer ago and no call is running). A client answered a moment ago sends its next
   call now and waits in the gate, instead of arriving while the server shuts down; a
   daemon no client called for a while does not wait for nobody (before, every stop
   held for the whole ``HOLD_SECONDS``).
3. the server stops (its GOAWAY tells clients to send nothing more here), then the held
   calls, and any still running (a decision past the drain's time limit), are answered
   UNAVAILABLE. A decision cut off there may still be committed by the decision thread;
   submitting the same job id again returns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from controller.handler_memo import HandlerMemo
from controller.streams import relay

__all__ = ["GOAWAY_SECONDS", "HOLD_SECONDS", "StopGate"]

HOLD_SECONDS = 0.5
"""Step 2: how long after the last call ended new calls are held before the server
stops."""
GOAWAY_SECONDS = 0.1
"""Step 3: the server's GOAWAY goes out before the held calls are answered."""
_STOPPING = (
    "the daemon is stopping; retry on its successor (a job submitted again under the same "
    "id is answered with its first decision)"
)


class StopGate(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Holds calls while the server stops and answers them UNAVAILABLE after; see the
    module docstring. Every call is gated (the unary-request ones are served as streamed
    by the access interceptor)."""

    def __init__(self) -> None:
        self._closed = False
        self._released = asyncio.Event()
        self._running: set[asyncio.Task[Any]] = set()
        self._cut: set[asyncio.Task[Any]] = set()  # cancelled by release(), not a client
        self._last_ended = -math.inf  # the event loop's time the last call ended
        self._memo = HandlerMemo()

    async def stop(self, server: grpc.aio.Server, grace: float) -> None:
        """Steps 2 and 3: hold new calls, stop ``server`` (cancelling what is left after
        ``grace`` seconds), and answer the held and running calls UNAVAILABLE."""
        self._closed = True
        await asyncio.sleep(self.hold_seconds())
        stopping = asyncio.ensure_future(server.stop(grace))
        await asyncio.sleep(GOAWAY_SECONDS)
        self._released.set()
        for task in self._running:
            self._cut.add(task)
            task.cancel()
        await stopping

    def hold_seconds(self) -> float:
        """Step 2's hold: the rest of ``HOLD_SECONDS`` since the last call ended (all of
        it while a call runs), at least 0."""
        if self._running:
            return HOLD_SECONDS
        since = asyncio.get_running_loop().time() - self._last_ended
        return min(HOLD_SECONDS, max(0.0, HOLD_SECONDS - since))

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: Any
    ) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        return self._memo.wrapped(details.method, handler, self._gate)

    def _gate(self, method: str, handler: Any) -> Any:
        """``handler`` (of any ``method``) with its behaviour gated (:meth:`_gated`)."""
        # the access interceptor serves unary requests as streamed ones
        # (controller.auth.REQUEST_SECONDS): gate those as their unary selves
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=self._unary(handler.unary_unary))
        if handler.stream_unary is not None:
            return handler._replace(stream_unary=self._unary(handler.stream_unary))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=self._streaming(handler.unary_stream))
        if handler.stream_stream is not None:
            return handler._replace(stream_stream=self._streaming(handler.stream_stream))
        return handler

    @contextlib.asynccontextmanager
    async def _gated(self, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        """Around one call: held while the gate is closed; answered UNAVAILABLE if
        :meth:`stop` cancels it (a CancelledError from a client going away passes)."""
        if self._closed:
            await self._released.wait()
            await context.abort(grpc.StatusCode.UNAVAILABLE, _STOPPING)
        task = asyncio.current_task()
        assert task is not None
        self._running.add(task)
        try:
            yield
        except asyncio.CancelledError:
            if task in self._cut:
                task.uncancel()
                await context.abort(grpc.StatusCode.UNAVAILABLE, _STOPPING)
            raise
        finally:
            self._running.discard(task)
            self._last_ended = asyncio.get_running_loop().time()

    def _unary(self, inner: Callable[[Any, Any], Awaitable[Any]]) -> Any:
        async def gated(request: Any, context: grpc.aio.ServicerContext) -> Any:
            async with self._gated(context):
                return await inner(request, context)

        return gated

    def _streaming(self, inner: Callable[[Any, Any], Any]) -> Any:
        """A server-streaming handler gated: an async generator, or a coroutine that
        writes with ``context.write`` (grpc's own aio health service's Watch)."""

        async def gated(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async with self._gated(context):
                async for item in relay(inner(request, context)):
                    yield item

        return gated
