"""The console's shared reads of the ledger (controller/console/shared_reads.py): one read
for every tab asking at once, reused for 20 times its duration, and no further."""

from __future__ import annotations

import asyncio

import pytest

from controller.console.shared_reads import SharedReads, timed


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_read_serves_every_reader_asking_at_once_and_is_reused_for_its_cost() -> None:
    clock = _Clock()
    shared = SharedReads(age_per_second=20.0, clock=clock)
    calls: list[int] = []
    gate = asyncio.Event()

    async def read() -> tuple[int, float]:
        calls.append(1)
        await gate.wait()
        return len(calls), 0.05  # took 50 ms: reused for 1 s

    async def scenario() -> None:
        tabs = [asyncio.ensure_future(shared.get("use", read)) for _ in range(10)]
        await asyncio.sleep(0)
        gate.set()
        assert await asyncio.gather(*tabs) == [1] * 10  # ten tabs, one read
        clock.now += 0.99
        assert await shared.get("use", read) == 1  # still fresh
        assert await shared.get("other", read) == 2  # another key reads for itself
        clock.now += 0.02  # past 20 x 50 ms
        assert await shared.get("use", read) == 3

    asyncio.run(scenario())
    assert shared.reads == 3


def test_a_reader_that_goes_away_leaves_the_read_to_the_others() -> None:
    shared = SharedReads()
    gate = asyncio.Event()

    async def read() -> tuple[str, float]:
        await gate.wait()
        return "prices", 0.0

    async def scenario() -> None:
        first = asyncio.ensure_future(shared.get("k", read))
        second = asyncio.ensure_future(shared.get("k", read))
        await asyncio.sleep(0)
        first.cancel()  # its tab closed
        await asyncio.sleep(0)
        gate.set()
        assert await second == "prices"
        with pytest.raises(asyncio.CancelledError):
            await first

    asyncio.run(scenario())


def test_a_failed_read_fails_its_readers_and_is_not_kept() -> None:
    shared = SharedReads()
    outcomes = iter([RuntimeError("the ledger is not open"), None])

    async def read() -> tuple[str, float]:
        await asyncio.sleep(0)
        err = next(outcomes)
        if err is not None:
            raise err
        return "use", 1.0

    async def scenario() -> None:
        both = [asyncio.ensure_future(shared.get("k", read)) for _ in range(2)]
        results = await asyncio.gather(*both, return_exceptions=True)
        assert [str(r) for r in results] == ["the ledger is not open"] * 2
        assert await shared.get("k", read) == "use"  # read again, not the failure

    asyncio.run(scenario())


def test_timed_returns_the_value_and_its_duration() -> None:
    value, seconds = timed(lambda: 7)()
    assert value == 7 and 0 <= seconds < 1
