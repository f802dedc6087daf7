"""Turns at the decision thread (controller/admission/turns.py), deterministically: the
per-client cap and the round-robin order, without timing (the e2e flood test depends on
how long a search takes on the machine)."""

from __future__ import annotations

import asyncio

import pytest

from controller.admission.turns import Turns
from controller.errors import BusyError


async def _call(turns: Turns, order: list[str], client: str, tag: str) -> None:
    """Take a turn, note ``tag``, and pass the turn on."""
    await turns.acquire(client)
    order.append(tag)
    await asyncio.sleep(0)
    turns.release(client)


def test_a_client_past_its_cap_is_refused_and_the_daemon_never_is() -> None:
    async def scenario() -> None:
        turns = Turns(max_waiting=2)
        await turns.acquire("alice")  # holds the turn
        second = asyncio.ensure_future(turns.acquire("alice"))  # waits
        await asyncio.sleep(0)
        assert turns.inside("alice") == 2
        with pytest.raises(BusyError, match="max_in_flight = 2"):
            await turns.acquire("alice")
        daemon = [asyncio.ensure_future(turns.acquire("")) for _ in range(5)]  # uncapped
        await asyncio.sleep(0)
        turns.release("alice")
        await second
        turns.release("alice")
        for d in daemon:
            await d
            turns.release("")
        assert turns.inside("alice") == 0

    asyncio.run(scenario())


def test_waiting_clients_are_served_in_turn_not_first_come() -> None:
    async def scenario() -> None:
        turns = Turns()
        order: list[str] = []
        await turns.acquire("holder")
        tasks = [asyncio.ensure_future(_call(turns, order, "alice", f"a{i}")) for i in range(4)]
        await asyncio.sleep(0)
        tasks.append(asyncio.ensure_future(_call(turns, order, "bob", "b0")))
        await asyncio.sleep(0)
        turns.release("holder")
        await asyncio.gather(*tasks)
        # FIFO would answer a0 a1 a2 a3 b0: bob waits for one of alice's calls at most
        assert order.index("b0") <= 1, order
        assert [t for t in order if t.startswith("a")] == ["a0", "a1", "a2", "a3"]

    asyncio.run(scenario())


def test_two_holders_keep_the_turns_round_robin() -> None:
    """With a second holder (the controller's: a step queued behind the running one), a
    third call waits, and a burst still delays another client by one turn at most."""

    async def scenario() -> None:
        turns = Turns(holders=2)
        await turns.acquire("first")
        await turns.acquire("second")  # granted at once: a second holder
        third = asyncio.ensure_future(turns.acquire("third"))
        await asyncio.sleep(0)
        assert not third.done()
        turns.release("first")
        await third
        order: list[str] = []
        tasks = [asyncio.ensure_future(_call(turns, order, "alice", f"a{i}")) for i in range(4)]
        await asyncio.sleep(0)
        tasks.append(asyncio.ensure_future(_call(turns, order, "bob", "b0")))
        await asyncio.sleep(0)
        turns.release("second")
        turns.release("third")
        await asyncio.gather(*tasks)
        assert order.index("b0") <= 2, order
        assert [t for t in order if t.startswith("a")] == ["a0", "a1", "a2", "a3"]
        assert turns.inside("alice") == 0 and turns.inside("bob") == 0

    asyncio.run(scenario())
