"""The client's side of ``[auth]``: a bearer token on every call of a channel.

Kept apart from :mod:`controller.auth` (the daemon's side), so the ``oasis`` client
loads no logging or rate-limit code.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import grpc

__all__ = ["TokenInterceptor"]


@dataclass(frozen=True)
class _CallDetails(grpc.ClientCallDetails):  # type: ignore[misc]
    method: str
    timeout: float | None
    metadata: Iterable[tuple[str, str]] | None
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


class TokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
):
    """Adds ``authorization: Bearer TOKEN`` to every call of a channel (plaintext or TLS;
    gRPC's own call credentials refuse plaintext channels)."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, d: Any) -> _CallDetails:
        metadata = [*(d.metadata or ()), self._header]
        return _CallDetails(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready,
                            d.compression)  # fmt: skip

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)
