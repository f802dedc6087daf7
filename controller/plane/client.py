"""The one place an MQTT client is made: credentials, TLS and timeouts from the config."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

import aiomqtt

from controller.plane.settings import MqttConfig

__all__ = ["IN_FLIGHT", "client_for", "for_each"]

_T = TypeVar("_T")

IN_FLIGHT = 32
"""Calls one client has in flight at most (a QoS 1 publish until its PUBACK, a
subscription): aiomqtt scans its pending calls at every new one, and paho its queued
messages at every PUBACK, so each costs time linear in how many are in flight."""


def client_for(
    mqtt: MqttConfig, identifier: str, will: aiomqtt.Will | None = None
) -> aiomqtt.Client:
    """An ``aiomqtt`` client for the configured broker (TLS and credentials included)."""
    tls = aiomqtt.TLSParameters(ca_certs=mqtt.tls_ca or None) if mqtt.tls else None
    client = aiomqtt.Client(
        mqtt.host,
        mqtt.port,
        username=mqtt.username or None,
        password=mqtt.password or None,
        identifier=identifier,
        will=will,
        tls_params=tls,
        keepalive=max(5, int(mqtt.heartbeat_timeout)),
        max_inflight_messages=200,
        # the rest wait their turn: a slot boundary's plans for 10,000 servers published
        # all at once cost time quadratic in them
        max_concurrent_outgoing_calls=IN_FLIGHT,
        timeout=10.0,
    )
    # a slot boundary publishes every server's plan: up to IN_FLIGHT pending is expected
    client.pending_calls_threshold = 2 * IN_FLIGHT
    return client


async def for_each(items: Iterable[_T], call: Callable[[_T], Awaitable[None]]) -> None:
    """``await call(item)`` for every item, :data:`IN_FLIGHT` at a time: as many workers,
    each taking the next item, rather than a task per item queued on the client's
    semaphore (a slot boundary at 10,000 servers made 10,000 tasks, their timers and
    wake-ups). After an error no further call starts; the first error is raised once
    the calls under way have ended."""
    it = iter(items)
    failed: list[BaseException] = []

    async def worker() -> None:
        for item in it:  # shared: each item is taken by one worker
            if failed:
                return
            try:
                await call(item)
            except BaseException as err:  # raised below, after the calls under way
                failed.append(err)
                return

    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    if failed:
        raise failed[0]
