"""What the server interceptors share about server-streaming calls."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["relay"]


async def relay(answer: Any) -> AsyncIterator[Any]:
    """The items of a server-streaming handler's ``answer``, for a wrapper to yield: an
    async generator's items, or none from a coroutine that writes its stream itself with
    ``context.write`` (grpc's aio health service's ``Watch``), which is awaited."""
    if inspect.isawaitable(answer):
        await answer
        return
    async for item in answer:
        yield item
