"""The decision thread (controller/admission/decision_thread.py), deterministically: the
per-client cap, the round-robin order, reads ahead of steps, cancellation, failures and
shutdown, each with the thread held inside a step so the order does not depend on timing
(the e2e flood test, tests/test_fair_decisions.py, depends on how long a search takes)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import pytest

from controller.admission.decision_thread import DecisionThread
from controller.errors import BusyError

WAIT = 10.0


def _held(thread: DecisionThread) -> tuple[threading.Event, Future[None]]:
    """A step of client ``holder`` that runs until the returned event is set."""
    started, go = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        go.wait(WAIT)

    future = thread.submit("holder", hold)
    assert started.wait(WAIT)
    return go, future


def _note(order: list[str], tag: str) -> Callable[[], str]:
    def step() -> str:
        order.append(tag)
        return tag

    return step


def test_a_client_past_its_cap_is_refused_and_the_daemon_never_is() -> None:
    thread = DecisionThread(max_waiting=2)
    try:
        go, held = _held(thread)
        order: list[str] = []
        mine = [thread.submit("alice", _note(order, f"a{i}")) for i in range(2)]
        assert thread.inside("alice") == 2
        with pytest.raises(BusyError, match="max_in_flight = 2"):
            thread.submit("alice", _note(order, "a2"))
        daemon = [thread.submit("", _note(order, f"d{i}")) for i in range(5)]  # uncapped
        go.set()
        held.result(WAIT)
        assert [f.result(WAIT) for f in mine] == ["a0", "a1"]
        assert [f.result(WAIT) for f in daemon] == [f"d{i}" for i in range(5)]
        assert "a2" not in order
        assert thread.inside("alice") == 0 and thread.inside("") == 0
    finally:
        thread.shutdown()


def test_waiting_clients_are_served_in_turn_not_first_come() -> None:
    thread = DecisionThread()
    try:
        go, _ = _held(thread)
        order: list[str] = []
        futures = [thread.submit("alice", _note(order, f"a{i}")) for i in range(4)]
        futures.append(thread.submit("bob", _note(order, "b0")))
        futures.append(thread.submit("alice", _note(order, "a4")))
        futures.append(thread.submit("carol", _note(order, "c0")))
        go.set()
        for f in futures:
            f.result(WAIT)
        # FIFO would run a0 a1 a2 a3 b0 a4 c0: a burst delays others by one step at most
        assert order == ["a0", "b0", "c0", "a1", "a2", "a3", "a4"]
    finally:
        thread.shutdown()


def test_a_read_runs_between_two_steps_ahead_of_the_waiting_ones() -> None:
    thread = DecisionThread()
    try:
        go, _ = _held(thread)
        order: list[str] = []
        steps = [thread.submit("alice", _note(order, f"a{i}")) for i in range(3)]
        read = thread.call(_note(order, "read"))
        go.set()
        assert read.result(WAIT) == "read"
        for f in steps:
            f.result(WAIT)
        assert order == ["read", "a0", "a1", "a2"]
    finally:
        thread.shutdown()


def test_a_step_cancelled_while_it_waits_never_runs_and_frees_its_place() -> None:
    thread = DecisionThread(max_waiting=1)
    try:
        go, _ = _held(thread)
        order: list[str] = []
        first = thread.submit("alice", _note(order, "first"))
        with pytest.raises(BusyError):
            thread.submit("alice", _note(order, "refused"))
        assert first.cancel()
        assert thread.inside("alice") == 0  # at once, not when the thread gets to it
        again = thread.submit("alice", _note(order, "again"))
        go.set()
        assert again.result(WAIT) == "again"
        assert order == ["again"]
    finally:
        thread.shutdown()


def test_a_failing_step_fails_its_caller_only() -> None:
    thread = DecisionThread()
    try:

        def boom() -> None:
            raise ValueError("bad spec")

        failed = thread.submit("alice", boom)
        with pytest.raises(ValueError, match="bad spec"):
            failed.result(WAIT)
        assert thread.submit("alice", lambda: 7).result(WAIT) == 7
        assert thread.inside("alice") == 0
    finally:
        thread.shutdown()


def test_shutdown_runs_what_is_queued_then_refuses_more() -> None:
    thread = DecisionThread()
    go, _ = _held(thread)
    order: list[str] = []
    queued = [thread.submit("alice", _note(order, f"a{i}")) for i in range(3)]
    stopper = threading.Thread(target=thread.shutdown)
    stopper.start()
    go.set()
    stopper.join(WAIT)
    assert not stopper.is_alive()
    assert [f.result(0) for f in queued] == ["a0", "a1", "a2"]
    with pytest.raises(RuntimeError, match="shut down"):
        thread.submit("alice", _note(order, "late"))
    with pytest.raises(RuntimeError, match="shut down"):
        thread.call(_note(order, "late read"))


def test_a_clients_reads_wait_their_turn_and_do_not_count_against_its_cap() -> None:
    """A burst of one client's reads (GetPrices) delays another client's submit by one
    read at most, and takes none of the client's own max_in_flight."""
    thread = DecisionThread(max_waiting=1)
    try:
        go, _ = _held(thread)
        order: list[str] = []
        reads = [thread.submit("alice", _note(order, f"r{i}"), counted=False) for i in range(5)]
        assert thread.inside("alice") == 0
        mine = thread.submit("alice", _note(order, "a0"))  # not refused for the reads
        bob = thread.submit("bob", _note(order, "b0"))
        go.set()
        for f in [*reads, mine, bob]:
            f.result(WAIT)
        assert order.index("b0") <= 1, order
        assert order.index("a0") == len(order) - 1  # behind alice's own reads
    finally:
        thread.shutdown()


def test_an_answer_comes_after_its_call_stops_counting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI, once: a client with limits.max_in_flight = 1 sent its next call the moment it
    had an answer and was refused, "1 calls of this client in flight": the answer was
    given from inside the step, before the thread stopped counting the call. Here the
    thread is slow to stop counting (as when it is descheduled just then); each next
    call must still be taken."""
    import asyncio
    import time

    from controller.clock import FakeClock
    from tests.test_pending import CHEAP, controller

    done = DecisionThread._done

    def slow_done(self: DecisionThread, step: object) -> None:
        time.sleep(0.01)
        done(self, step)  # type: ignore[arg-type]

    monkeypatch.setattr(DecisionThread, "_done", slow_done)
    c = controller(tmp_path, FakeClock(1_700_000_000.0), CHEAP + "\n[limits]\nmax_in_flight = 1\n")

    async def calls() -> list[int]:
        return [await c._run(lambda: 1, "alice") for _ in range(20)]

    try:
        assert asyncio.run(calls()) == [1] * 20
    finally:
        c.close()
