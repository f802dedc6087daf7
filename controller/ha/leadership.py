"""Leader election on PostgreSQL, and what changes when this daemon's role does.

**The lease** is the store's writer lock (``controller/store/writer_lock.py``), a session
advisory lock, held on a session with ``idle_session_timeout`` and ``tcp_user_timeout``
set to ``[ha] lease_seconds``. The leader confirms it every ``lease / 4`` (at most 1 s)
with a round trip on that session. A leader that stops doing so -- killed (the session
ends at once), stopped with SIGSTOP, hung, or cut off from PostgreSQL -- has its session
ended by PostgreSQL once the lease has passed, and the lock is free for a standby.
Nothing to clean up, no clock shared between machines: PostgreSQL's own timers decide.

**Taking over.** A standby tries the lock every ``retry_seconds``. Once it has it, it
records ``epoch + 1`` in the store's ``meta`` row ``writer`` (one transaction, the row
locked ``FOR UPDATE``), catches its ledger up with what it has not applied yet
(:meth:`AdmissionController.take_over`), and leads: the slot clock, pending jobs and the
execution plane run only on the leader.

**Fencing.** Every write transaction first reads the ``writer`` row ``FOR SHARE`` and
checks that its epoch is still this leader's and that its lock session still holds the
lock (:func:`controller.store.writer_lock.check_epoch`); a leader also refuses to write
once it has not confirmed its lease for ``lease_seconds`` (it was paused). A leader
fenced out, or whose lock session ended, **steps down**: it answers writes UNAVAILABLE
naming the new leader and follows the store as a standby.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from sqlalchemy.exc import DBAPIError

from controller.admission import AdmissionController
from controller.ha.settings import HaConfig
from controller.store import StoreUnavailableError
from controller.store.writer_lock import PostgresWriterLock

__all__ = ["Leadership"]

_REFUSAL_LOG_SECONDS = 60.0
"""A takeover refused for the same reason is logged again at most this often."""


class Leadership:
    """The election loop of one daemon (:meth:`check`, every ``retry_seconds``).

    Args:
        controller: the admission controller, whose ``role`` this keeps.
        lock: the store's writer lock (a lease; see the module docstring).
        ha: ``[ha]``.
        on_role: awaited with ``"leader"`` or ``"standby"`` after each change (health,
            the execution plane).
    """

    def __init__(
        self,
        controller: AdmissionController,
        lock: PostgresWriterLock,
        ha: HaConfig,
        on_role: Callable[[str], Awaitable[None]],
        log: Any = None,
    ) -> None:
        self.c = controller
        self.lock = lock
        self.ha = ha
        self.on_role = on_role
        self.log = log or structlog.get_logger("oasisd")
        self.role = controller.role  # the role last announced to on_role
        self.took_over_at = 0.0  # time.monotonic() of the last takeover
        self._probed = 0.0
        self._refused, self._refused_at = "", 0.0  # the last takeover refused, when logged

    async def check(self) -> None:
        """One round: a leader confirms its lease, a standby tries to take it."""
        if self.c.draining:
            return
        if self.c.role != self.role:  # fenced out in the decision thread
            await self._stepped_down("fenced out: another daemon leads")
            return
        if self.c.leading:
            if time.monotonic() - self._probed >= self.ha.probe_seconds:
                await self._confirm()
            return
        await self._try_take_over()

    async def _confirm(self) -> None:
        started = time.monotonic()
        held = await asyncio.to_thread(self.lock.held)
        self._probed = time.monotonic()
        if held:
            self.c.lease_seen = started  # confirmed as of the probe's start
            return
        self.c.step_down("the lease ended: its PostgreSQL session is gone")
        await self._stepped_down("the lease ended")

    async def _stepped_down(self, why: str) -> None:
        await asyncio.to_thread(self.lock.release)
        self.role = "standby"
        self.log.warning("standby now", reason=why)
        await self.on_role("standby")

    async def _try_take_over(self) -> None:
        problem = await asyncio.to_thread(self.c.takeover_problem)
        self.c.cannot_lead = problem  # told to clients and in oasis status
        if problem:  # no lock taken, no epoch recorded: asked again at the next check
            now = time.monotonic()
            if problem != self._refused or now - self._refused_at >= _REFUSAL_LOG_SECONDS:
                self.log.error("cannot take over: this node cannot lead the store as it is",
                               why=problem)  # fmt: skip
                self._refused, self._refused_at = problem, now
            return
        try:
            epoch = await asyncio.to_thread(self._acquire)
        except (DBAPIError, StoreUnavailableError, OSError) as err:
            self.log.info("lease not taken", error=str(err).splitlines()[0] if str(err) else "")
            await asyncio.to_thread(self.lock.release)
            return
        if epoch is None:
            return
        started = time.monotonic()
        # the lease is kept while the new leader catches up: a refit or a rebuild longer
        # than the lease otherwise lost it (PostgreSQL ended the idle lock session) and
        # the takeover failed, to start again from scratch under the next epoch
        keep = asyncio.create_task(self._keep_lease())
        try:
            applied = await self.c.take_over(epoch, self.lock.backend_pid)
        except Exception:
            self.log.exception("takeover failed; still a standby", epoch=epoch)
            await asyncio.to_thread(self.lock.release)
            return
        finally:
            keep.cancel()
        self.took_over_at = time.monotonic()
        self._probed = self.took_over_at
        self.role = "leader"
        self.log.warning("leading", epoch=epoch, caught_up_events=applied,
                         catch_up_ms=round((self.took_over_at - started) * 1000, 1))  # fmt: skip
        await self.on_role("leader")

    async def _keep_lease(self) -> None:
        """Confirm the lease every ``probe_seconds`` until cancelled (during a takeover)."""
        while True:
            await asyncio.sleep(self.ha.probe_seconds)
            probed = time.monotonic()
            if not await asyncio.to_thread(self.lock.held):
                return  # the takeover's writes are fenced out, and it fails
            self.c.lease_seen = probed

    def _acquire(self) -> int | None:
        """Take the lock and record the next epoch (blocking); None if another holds it."""
        if not self.lock.try_acquire():
            return None
        # above every epoch this node saw: a restored store's writer row may be older
        return self.lock.record(self.c.db, self.c.advertise, now=self.c.slots.clock.now,
                                at_least=self.c.epoch_seen)  # fmt: skip
