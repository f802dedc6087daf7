"""``controller.plane.client.publish_all``: many QoS 1 publishes through one window,
against a real Mosquitto on a loopback port."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import aiomqtt
import pytest

from controller.plane import client as plane_client
from controller.plane.client import PUBLISH_WINDOW, publish_all
from tests.broker import NEEDS_MOSQUITTO, Mosquitto

pytestmark = NEEDS_MOSQUITTO


@pytest.fixture(scope="module")
def broker() -> Iterator[Mosquitto]:
    started = Mosquitto()
    try:
        yield started
    finally:
        started.close()


async def _retained(port: int, prefix: str, count: int) -> dict[str, bytes]:
    """What the broker holds retained under ``prefix/#``, once ``count`` topics came."""
    got: dict[str, bytes] = {}
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"check-{prefix}") as sub:
        await sub.subscribe(f"{prefix}/#", qos=1)
        async with asyncio.timeout(30):
            async for message in sub.messages:
                assert isinstance(message.payload, bytes)
                got[str(message.topic)] = message.payload
                if len(got) == count:
                    break
    return got


def test_every_message_is_acknowledged_in_order_of_topics_and_none_left_pending(
    broker: Mosquitto,
) -> None:
    """Ten windows' worth, retained: each topic's payload is the last one sent, the
    call returns only once every PUBACK came (aiomqtt's pending publishes empty), and
    the window was never exceeded."""
    count = 10 * PUBLISH_WINDOW + 3
    most = 0

    async def run() -> dict[str, bytes]:
        nonlocal most
        async with aiomqtt.Client("127.0.0.1", broker.port, identifier="pub-all") as client:
            pending = client._pending_publishes

            def messages() -> Iterator[tuple[str, bytes, bool]]:
                nonlocal most
                for i in range(count):
                    most = max(most, len(pending))
                    yield f"many/{i % (count - 7)}", f"payload {i}".encode(), True

            await publish_all(client, messages())
            assert not pending
        return await _retained(broker.port, "many", count - 7)

    got = asyncio.run(run())
    assert len(got) == count - 7
    for i in range(count - 7):  # the first 7 topics were published twice: the later wins
        last = i + (count - 7) if i < 7 else i
        assert got[f"many/{i}"] == f"payload {last}".encode()
    assert 0 < most <= PUBLISH_WINDOW


def test_a_message_paho_refuses_is_skipped_alone_or_raised_without_a_skip(
    broker: Mosquitto,
) -> None:
    """A topic paho cannot send (a wildcard in it) goes to ``skip`` with its index; the
    messages around it are published. Without ``skip`` it raises."""
    skipped: list[tuple[int, str]] = []

    async def run() -> dict[str, bytes]:
        async with aiomqtt.Client("127.0.0.1", broker.port, identifier="pub-skip") as client:
            messages = [("skip/a", b"a", True), ("skip/#", b"bad", True), ("skip/b", b"b", True)]
            await publish_all(client, messages, lambda i, err: skipped.append((i, str(err))))
            with pytest.raises(ValueError, match="wildcard"):
                await publish_all(client, [("skip/+", b"bad", True)])
            assert not client._pending_publishes
        return await _retained(broker.port, "skip", 2)

    assert asyncio.run(run()) == {"skip/a": b"a", "skip/b": b"b"}
    assert [i for i, _ in skipped] == [1] and "wildcard" in skipped[0][1]


def test_a_broker_that_stops_acknowledging_times_out_and_leaves_nothing_pending(
    broker: Mosquitto,
) -> None:
    """A broker frozen (SIGSTOP) mid-window: MqttError after ``client.timeout`` seconds
    without a PUBACK, as aiomqtt's own publish says, and none of the window's entries
    left in aiomqtt's pending publishes (a later message id would meet them)."""
    proc = broker.proc
    assert proc is not None

    async def run() -> None:
        async with aiomqtt.Client(
            "127.0.0.1", broker.port, identifier="pub-frozen", timeout=1.0
        ) as client:
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                started = asyncio.get_running_loop().time()
                with pytest.raises(aiomqtt.MqttError, match="timed out"):
                    await publish_all(client, [(f"frozen/{i}", b"x", False) for i in range(200)])
                assert asyncio.get_running_loop().time() - started < 10
                assert not client._pending_publishes
            finally:
                os.kill(proc.pid, signal.SIGCONT)

    asyncio.run(run())


def test_the_window_wakes_the_publisher_once_a_puback_makes_room() -> None:
    """The window is refilled at each PUBACK, not once half of it drained: waiting for
    half stalled at each half (10,000 publishes to a loopback broker took 7.7 s instead
    of 1.2 s: :data:`~controller.plane.client.PUBLISH_WINDOW`)."""

    async def run() -> list[int]:
        window = plane_client._Window()
        window.open = PUBLISH_WINDOW
        woken: list[int] = []

        async def publisher() -> None:
            await window.until(PUBLISH_WINDOW - 1, timeout=5)
            woken.append(window.open)

        task = asyncio.create_task(publisher())
        await asyncio.sleep(0)
        window.set()  # one PUBACK
        await asyncio.wait_for(task, 5)
        return woken

    assert asyncio.run(run()) == [PUBLISH_WINDOW - 1]
