"""The daemon's interceptors wrap a method's handler once, not once per call
(:mod:`controller.handler_memo`), and the wrapper kept behaves as a fresh one: a real
``grpc.aio`` server on loopback with the daemon's stop gate, access and decoding
interceptors in its order, around the standard health service."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

import controller.statuses
from controller.auth import AccessInterceptor
from controller.drain import StopGate
from controller.handler_memo import MAX_METHODS, HandlerMemo
from controller.statuses import DecodeInterceptor

CHECK = "/grpc.health.v1.Health/Check"


def test_a_wrapper_is_kept_while_its_inner_handler_is_the_same_object() -> None:
    memo = HandlerMemo()
    built: list[Any] = []

    def wrap(method: str, handler: Any) -> Any:
        built.append((method, handler))
        return ("wrapped", handler)

    first, other = object(), object()
    assert memo.wrapped("/a", first, wrap) is memo.wrapped("/a", first, wrap)
    assert len(built) == 1
    assert memo.wrapped("/a", other, wrap) == ("wrapped", other)  # replaced: built again
    assert memo.wrapped("/a", other, wrap) is memo.wrapped("/a", other, wrap)
    assert memo.wrapped("/b", first, wrap) == ("wrapped", first)
    assert [m for m, _ in built] == ["/a", "/a", "/b"]


def test_a_memo_keeps_at_most_max_methods() -> None:
    memo = HandlerMemo()
    handler = object()
    for i in range(MAX_METHODS + 5):
        memo.wrapped(f"/m{i}", handler, lambda method, h: (method, h))
    assert len(memo._by_method) == MAX_METHODS
    assert memo.wrapped("/late", handler, lambda method, h: (method, h)) == ("/late", handler)


def test_the_daemons_interceptors_wrap_each_method_once_and_still_refuse_bad_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decoded: list[str] = []
    real = controller.statuses._decoded

    def counting(method: str, handler: Any) -> Any:
        decoded.append(method)
        return real(method, handler)

    monkeypatch.setattr(controller.statuses, "_decoded", counting)

    async def go() -> None:
        gate, access, decode = StopGate(), AccessInterceptor(None, None), DecodeInterceptor()
        server = grpc.aio.server(interceptors=[gate, access, decode])
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                for _ in range(20):
                    answer = await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
                    assert answer.status == health_pb2.HealthCheckResponse.SERVING
                raw = channel.unary_unary(CHECK)  # bytes in, bytes out
                for _ in range(3):
                    with pytest.raises(grpc.aio.AioRpcError) as bad:
                        await raw(b"\xff\xff\xff", timeout=10)
                    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert "malformed request" in (bad.value.details() or "")
        finally:
            await server.stop(None)
        assert decoded == [CHECK]  # 23 calls, one wrapper
        for interceptor in (gate, access, decode):
            assert list(interceptor._memo._by_method) == [CHECK]

    asyncio.run(go())
