"""The decision thread: one thread that runs every step that reads or changes the ledger,
one at a time, taking the next waiting step itself as soon as one ends.

Steps wait in one queue per client and are taken a client at a time, in turn (round
robin), with a cap on each client's calls inside: one client's burst of quotes delays
another's submit by at most one of its decisions (the one running), not by the whole
burst, as a FIFO would. Reads between two steps (:meth:`DecisionThread.call`) go ahead of
the waiting steps.

Why a thread of its own rather than turns granted on the event loop and an executor: the
thread takes the next step the moment one ends, without waiting for the event loop to
run, grant the next turn and hand the step over. Under load the event loop is busy with
gRPC's own work, and each hand-off left the decision thread idle for part of a step
(22% of the time with 8 clients, bench/RESULTS.md "Daemon throughput").
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from controller.errors import BusyError

__all__ = ["DecisionThread"]

_T = TypeVar("_T")


class _Step:
    __slots__ = ("client", "counted", "fn", "future")

    def __init__(self, client: str | None, fn: Callable[[], Any], counted: bool = False) -> None:
        self.client = client  # None: a read between steps (ahead of the waiting steps)
        self.counted = counted  # against the client's cap
        self.fn = fn
        self.future: Future[Any] = Future()


class DecisionThread:
    """Runs steps one at a time in one thread; see the module docstring. Thread-safe.

    Args:
        max_waiting: the most calls of one client inside (waiting or running); one more
            raises :class:`~controller.errors.BusyError` at once. 0: no cap. The daemon's
            own steps (client ``""``: slot ticks, the execution plane) are never capped.
        name: the thread's name.
    """

    def __init__(self, max_waiting: int = 0, name: str = "decide") -> None:
        self.max_waiting = max_waiting
        self.name = name
        self._cv = threading.Condition()
        self._reads: deque[_Step] = deque()
        self._queues: OrderedDict[str, deque[_Step]] = OrderedDict()
        self._inside: dict[str, int] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        self.step_started: float | None = None  # monotonic start of the running step

    def inside(self, client: str) -> int:
        """Calls of ``client`` waiting or running."""
        with self._cv:
            return self._inside.get(client, 0)

    def submit(self, client: str, fn: Callable[[], _T], counted: bool = True) -> Future[_T]:
        """Queue ``fn`` as ``client``'s step; its future resolves with what it returns or
        raises. Cancelling the future before the step starts takes it out of the queue.
        A step not ``counted`` (a read) waits its turn like the others but is neither
        capped nor counted against the client's cap.

        Raises:
            BusyError: ``client`` already has ``max_waiting`` calls inside.
            RuntimeError: the thread is shut down.
        """
        step = _Step(client, fn, counted)
        with self._cv:
            self._check_open()
            if counted:
                count = self._inside.get(client, 0)
                if self.max_waiting and client and count >= self.max_waiting:
                    raise BusyError(
                        f"{count} calls of this client in flight; at most "
                        f"limits.max_in_flight = {self.max_waiting} (wait for their answers)"
                    )
                self._inside[client] = count + 1
            self._queues.setdefault(client, deque()).append(step)
            self._wake()
        step.future.add_done_callback(lambda _f: self._done(step))
        return step.future

    def call(self, fn: Callable[[], _T]) -> Future[_T]:
        """Run ``fn`` between two steps, ahead of the steps waiting (a read of the
        ledger, which never sees half a step).

        Raises:
            RuntimeError: the thread is shut down.
        """
        step = _Step(None, fn)
        with self._cv:
            self._check_open()
            self._reads.append(step)
            self._wake()
        return step.future

    def shutdown(self) -> None:
        """Run what is queued, then end the thread (and wait for it, unless called from
        it). Later calls raise RuntimeError."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    # -- inside ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the decision thread is shut down")

    def _wake(self) -> None:
        """(Lock held.) Start the thread at the first step, else wake it."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()
        else:
            self._cv.notify()

    def _done(self, step: _Step) -> None:
        """A step ended, failed or was cancelled: it no longer counts for its client (and
        a cancelled one leaves its queue at once)."""
        client = step.client
        assert client is not None
        with self._cv:
            if step.future.cancelled():
                queue = self._queues.get(client)
                if queue is not None and step in queue:
                    queue.remove(step)
                    if not queue:
                        del self._queues[client]
            if not step.counted:
                return
            left = self._inside.get(client, 0) - 1
            if left > 0:
                self._inside[client] = left
            else:
                self._inside.pop(client, None)

    def _next(self) -> _Step | None:
        """(Lock held.) The next step to run: a read, else the head of the next client's
        queue, that client then going to the back; None when nothing waits."""
        if self._reads:
            return self._reads.popleft()
        if not self._queues:
            return None
        client, queue = next(iter(self._queues.items()))
        step = queue.popleft()
        if queue:
            self._queues.move_to_end(client)  # its next call waits for the others'
        else:
            del self._queues[client]
        return step

    def _loop(self) -> None:
        while True:
            with self._cv:
                step = self._next()
                while step is None:
                    if self._closed:
                        return
                    self._cv.wait()
                    step = self._next()
            if not step.future.set_running_or_notify_cancel():
                continue  # cancelled while it waited
            self.step_started = time.monotonic()
            try:
                result = step.fn()
            except BaseException as err:  # the caller's to handle, not this thread's
                step.future.set_exception(err)
            else:
                step.future.set_result(result)
            finally:
                self.step_started = None
            del step

    def step_seconds(self) -> float:
        """How long the step running now has run, seconds (0: none runs). Any thread: a
        step that runs for minutes holds every tenant's calls (the observability audit:
        a cordon of 2,440 small jobs, for four minutes), and is seen from outside."""
        started = self.step_started
        return 0.0 if started is None else max(time.monotonic() - started, 0.0)
