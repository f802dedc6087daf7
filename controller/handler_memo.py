"""An interceptor's wrapped handler built once per method, not once per call.

grpc.aio runs every server interceptor's ``intercept_service`` for every call, and each
of the daemon's four (metrics, the stop gate, access, decoding) wrapped the handler anew
each time: new closures and a ``namedtuple._replace`` per layer and call, about a tenth
of the event loop's time under a flood of submissions (py-spy, issue 16). The handler
a continuation returns is the same object for every call of one method (the servicer's
registered handler, or the inner interceptor's memoised wrapper), and none of these
wrappers holds anything of one call (a call's state lives in the closures' frames when
they run, and in the interceptors themselves), so the wrapper is kept per method and
given again while its inner handler is the same object.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["MAX_METHODS", "HandlerMemo"]

MAX_METHODS = 1024
"""Methods whose wrappers one memo keeps; past it a wrapper is built per call as before.
Only methods the server has a handler for are kept (an unknown name has none), so the
daemon's own services (about 40 methods) never reach it."""


class HandlerMemo:
    """``{method: (inner handler, wrapped handler)}`` of one interceptor."""

    def __init__(self) -> None:
        self._by_method: dict[str, tuple[Any, Any]] = {}

    def wrapped(self, method: str, handler: Any, wrap: Callable[[str, Any], Any]) -> Any:
        """``wrap(method, handler)``, built once while ``method``'s inner ``handler`` is the same
        object (identity: a handler replaced, by a server's generic handler that builds
        one per call, is wrapped again)."""
        kept = self._by_method.get(method)
        if kept is not None and kept[0] is handler:
            return kept[1]
        result = wrap(method, handler)
        if kept is not None or len(self._by_method) < MAX_METHODS:
            self._by_method[method] = (handler, result)
        return result
