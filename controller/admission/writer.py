"""Group commit: the decision thread decides and applies, a writer thread commits.

The decision thread decides a submission, applies it to the ledger and hands its rows
to :class:`GroupWriter` as a :class:`WriteSet`; it goes on to the next decision at once.
The writer takes every write set queued (up to :data:`MAX_BATCH`), commits them in one
transaction, in decision order, and only then resolves each one's future: an answer
leaves only after its own batch committed. One commit (one fsync on SQLite with
``synchronous=FULL``, one round trip on PostgreSQL) is shared by the whole batch.

A failed batch fails every write set decided on the ledger it left behind: the write
sets of that batch, and every later one of the same *generation* (the decision thread
starts a new generation each time it rebuilds the ledger from the store). The failure
callback marks the ledger stale, so the decision thread rebuilds it from the store before
its next step. Writes of other kinds (ticks, cancels, the plane's) are not queued here:
they first wait for the writer to be idle (:meth:`GroupWriter.drain`), so the store
records every change in the order the ledger took it.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_BATCH", "GroupWriter", "WriteSet"]

MAX_BATCH = 256
"""Write sets committed in one transaction at most."""


@dataclass(eq=False)
class WriteSet:
    """One decision's rows, committed by the writer (see the module docstring).

    ``rows`` is whatever the commit function reads (the controller's job, allocation,
    estimate and event rows); ``finish(committed)`` turns the commit function's result
    for this write set into its answer, in the writer thread, once the batch committed.
    """

    rows: Any
    finish: Callable[[Any], Any]
    generation: int
    after: Callable[[], None] | None = None
    """Called once the answer is out (logging: it does not delay the batch's answers)."""
    future: Future[Any] = field(default_factory=Future)


class GroupWriter:
    """A thread committing queued write sets in batches.

    Args:
        commit: commits a batch in one transaction, in order; returns one result per
            write set (passed to its ``finish``). Raises on failure: nothing of the
            batch is committed (or, after a lost connection, its fate is unknown).
        failed: called in the writer thread with the exception after a batch failed
            (before any future of it is resolved); returns the exception the write
            sets' futures get.
        name: the thread's name.
        log: a structlog logger for errors of the writer itself (None: not logged).
        on_stop: called in the writer thread before it ends.
    """

    def __init__(
        self,
        commit: Callable[[list[WriteSet]], list[Any]],
        failed: Callable[[BaseException], BaseException],
        name: str = "commit",
        log: Any = None,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        self._commit = commit
        self._failed = failed
        self._log = log
        self._on_stop = on_stop
        self._queue: queue.SimpleQueue[WriteSet | _Call | None] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._queued = 0  # write sets submitted and not yet resolved
        self._failed_generation = -1  # write sets of this generation or older fail
        self._error: BaseException | None = None  # what the last failed batch's callers got
        self._closed = False
        self.batches = 0  # batches committed
        self.committed = 0  # write sets committed
        self.largest = 0  # write sets in the largest batch
        self.commit_seconds = 0.0  # time in the commit function, successful batches
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, ws: WriteSet) -> Future[Any]:
        """Queue ``ws``; its future resolves once its batch committed (or failed)."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the writer is closed")
            self._queued += 1
        self._queue.put(ws)
        return ws.future

    @property
    def failed_generation(self) -> int:
        """The newest generation a batch of which failed (-1: none)."""
        return self._failed_generation

    @property
    def queued(self) -> int:
        """Write sets submitted and not yet committed or failed."""
        return self._queued

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every write set submitted so far is committed or failed; False if
        ``timeout`` seconds passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._queued == 0, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Commit what is queued, then stop the thread."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
        self._queue.put(None)
        self._thread.join(timeout)

    def call(self, fn: Callable[[], None]) -> Future[None]:
        """Run ``fn`` in the writer thread, between batches (a failure is logged); the
        future resolves once it ran."""
        call = _Call(fn)
        with self._cond:
            if self._closed:  # queued after the stop, it would never run
                raise RuntimeError("the writer is closed")
        self._queue.put(call)
        return call.done

    def _loop(self) -> None:
        try:
            self._batches()
        finally:
            if self._on_stop is not None:
                self._on_stop()

    def _batches(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            if isinstance(first, _Call):
                first.run(self._log)
                continue
            batch = [first]
            stop = False
            call: _Call | None = None
            while len(batch) < MAX_BATCH:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                if isinstance(more, _Call):
                    call = more  # after this batch: the write sets before it go first
                    break
                batch.append(more)
            try:
                self._run(batch)
            except Exception as err:  # its futures are resolved; the writer goes on
                if self._log is not None:
                    self._log.error("group commit: a batch ended in error", exc_info=err)
            if call is not None:
                call.run(self._log)
            if stop:
                return

    def _run(self, batch: list[WriteSet]) -> None:
        """Commit ``batch`` and resolve every future of it, whatever fails: a future left
        unresolved would hold its caller for ever."""
        try:
            self._commit_live(batch)
        finally:
            for ws in batch:
                if not ws.future.done():  # a bug above: the caller still gets an answer
                    ws.future.set_exception(RuntimeError("the commit was not completed"))
            with self._cond:
                self._queued -= len(batch)
                self._cond.notify_all()

    def _commit_live(self, batch: list[WriteSet]) -> None:
        doomed = [ws for ws in batch if ws.generation <= self._failed_generation]
        live = [ws for ws in batch if ws.generation > self._failed_generation]
        for ws in doomed:
            assert self._error is not None
            ws.future.set_exception(self._error)
        if not live:
            return
        started = time.perf_counter()
        try:
            results = self._commit(live)
        except BaseException as exc:  # every caller of the batch gets the error
            self._failed_generation = max(ws.generation for ws in live)
            try:
                err = self._failed(exc)
            except BaseException as also:  # the callback's own failure: the first error
                err = exc
                err.__context__ = also
            self._error = err
            for ws in live:
                ws.future.set_exception(err)
            return
        self.commit_seconds += time.perf_counter() - started
        self.batches += 1
        self.committed += len(live)
        self.largest = max(self.largest, len(live))
        for ws, result in zip(live, results, strict=True):
            try:
                ws.future.set_result(ws.finish(result))
            except BaseException as exc:  # an answer that cannot be built
                ws.future.set_exception(exc)
        for ws in live:
            if ws.after is not None:
                with contextlib.suppress(Exception):  # logging: never the writer's end
                    ws.after()


@dataclass(frozen=True)
class _Call:
    """A function queued to run in the writer thread (:meth:`GroupWriter.call`)."""

    fn: Callable[[], None]
    done: Future[None] = field(default_factory=Future)

    def run(self, log: Any) -> None:
        try:
            self.fn()
        except Exception as err:
            if log is not None:
                log.warning("group commit: a call failed", error=str(err))
        finally:
            self.done.set_result(None)
