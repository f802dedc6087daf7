"""Servers whose agents fell silent, and came back: the plane's reactions, in the
admission controller's decision thread, committing to the store before the ledger
changes hands.

- **server failed** (its agent silent for ``heartbeat_timeout`` seconds; when that is,
  :meth:`controller.plane.execution.Execution.review_sync` decides): the server is down
  from the next slot on; its jobs are re-placed or re-planned
  (:func:`pricing.replan.fail_servers`; the servers found silent at one review fail
  together, so no job is moved onto another of them, and the review waits, at most one
  heartbeat interval, for a server about to be silent as long; a server up whose
  agent missed two beats, likely the rest of a rack falling silent over a few seconds,
  takes no moved job where room allows); a job that can no longer finish becomes
  ``failed``. A cordoned server's failure is recorded, and nothing moves.
- **server back** (a heartbeat): it is back from the next slot on, unless cordoned, or
  flapping (``[mqtt] flap_failures`` failures within ``flap_seconds``): then it is held
  out for ``flap_seconds`` more by a cordon with an end.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update

from controller.clock import slots_for
from controller.events import Event, taken_with
from controller.plane.jobs import Jobs
from controller.plane.part import PlanePart
from controller.plane.port import AdmissionPort
from controller.plane.settings import MqttConfig
from controller.store import CORDONED, OutageRow
from pricing.durations import format_duration
from pricing.replan import fail_servers, first_holders

__all__ = ["Outages"]


class Outages(PlanePart):
    """Server failures and recoveries; see the module docstring.

    Args:
        controller: the opened admission controller.
        mqtt: the broker settings (``flap_failures``, ``flap_seconds``).
        server_index: server name -> ``(kind, index)`` (``"worker"`` or ``"ps"``).
        jobs: the plane's job specs and guarded ledger changes.
    """

    def __init__(
        self,
        controller: AdmissionPort,
        mqtt: MqttConfig,
        server_index: dict[str, tuple[str, int]],
        jobs: Jobs,
    ) -> None:
        super().__init__(controller, mqtt, jobs)
        self.server_index = server_index

    def fail_sync(self, server: str) -> list[Event]:
        """``server`` failed: down from the next slot on, its jobs moved off it."""
        return self.fail_together_sync([server])

    def fail_together_sync(self, servers: Sequence[str], avoid: Sequence[str] = ()) -> list[Event]:
        """``servers`` failed together (their agents found silent at one review: a rack
        that lost power, or every dead server at once after the broker came back): all
        down from the next slot on before any job moves, so a job moves once and never
        onto another of them (:func:`pricing.replan.fail_servers`). Each gets its outage
        row and ``server_failed`` event; a job's move names the first it was on.

        ``avoid``: servers up whose agents missed their beats too (suspects, likely the
        rest of the rack): no moved job is put on them unless it has no room elsewhere,
        so it is not moved again when they fail a review later."""
        s = self.c.slot
        from_slot = s + 1
        ledger = self.c._ledger
        cordoned: list[str] = []
        down: dict[tuple[str, int], str] = {}
        for server in dict.fromkeys(servers):
            kind, index = self.server_index[server]
            if not ledger.is_down(kind, index):
                down[(kind, index)] = server
            elif self._out(server):
                # cordoned: its jobs moved off already; the failure is recorded, so the
                # server stays out after an uncordon until its agent is heard again
                cordoned.append(server)
        # the moves first: if their commit fails, nothing of this review's failures is
        # written, and the next review records each once (a cordoned server's row
        # written before a failed move was written again, and counted as a flap)
        suspects = [self.server_index[s] for s in avoid if s in self.server_index]
        events = self._move_off_sync(down, from_slot, suspects) if down else []
        if cordoned:
            events += self._fail_cordoned_sync(cordoned, from_slot)
        return events

    def _move_off_sync(
        self,
        down: dict[tuple[str, int], str],
        from_slot: int,
        suspects: Sequence[tuple[str, int]] = (),
    ) -> list[Event]:
        """The servers ``down`` (``{(kind, index): name}``, none down in the ledger yet)
        failed from ``from_slot``: their jobs moved off (not onto ``suspects``, each
        ``(kind, index)``, where room allows), their rows and events written."""
        s = from_slot - 1
        ledger = self.c._ledger
        firsts = first_holders(ledger, list(down), from_slot)
        with self.c.db.session() as session:  # only the jobs the failure moves
            jobs = {j: self.jobs.get(j, session) for j in firsts}
        gone = [index for kind, index in down if kind == "worker"]  # work lost with them
        names = list(down.values())
        remaining: dict[str, int] = {}
        for j in jobs:
            sched = ledger.schedule(j)
            lost = sched.after(s).before(from_slot)  # the current slot, on the failed servers
            lost_work = int(lost.workers[:, gone].sum()) if gone and lost.slots else 0
            remaining[j] = sched.after(from_slot).work() + lost_work

        def change() -> list[Event]:
            last_slots = {j: self.jobs.last_slot(job) for j, job in jobs.items()}
            outcome = fail_servers(
                ledger, jobs, list(down), from_slot, remaining, last_slots, avoid=suspects
            )
            now = datetime.now(UTC)
            changed: list[Event] = []
            moved = outcome.moves()
            with self.c._write() as session:
                for server in down.values():
                    session.add(OutageRow(server=server, down_from=from_slot, up_from=None,
                                          detected_at=now))  # fmt: skip
                for j, how in moved.items():
                    detail: dict[str, Any] = {"reason": "server_failed",
                                              "server": down[firsts[j]]}  # fmt: skip
                    best = outcome.replanned.get(j)
                    changed.append(
                        self.c._record_move(session, now, jobs[j], how, from_slot, detail, best)
                    )
                for key, server in down.items():
                    its = [j for j in moved if firsts[j] == key]
                    changed.append(self.c._event(session, now, "server_failed", "", "", {
                        "server": server, "from_slot": from_slot, "jobs": its,
                        **taken_with(names, server),
                    }))  # fmt: skip
            for key, server in down.items():
                mine = {j for j in moved if firsts[j] == key}
                self.log.warning("server failed", server=server, from_slot=from_slot,
                                 replaced=[j for j in outcome.replaced if j in mine],
                                 replanned=[j for j in outcome.replanned if j in mine],
                                 stranded=[j for j in outcome.stranded if j in mine],
                                 **taken_with(names, server))  # fmt: skip
            return changed

        return self.jobs.guarded(change)

    def _fail_cordoned_sync(self, servers: list[str], from_slot: int) -> list[Event]:
        """Cordoned servers' agents fell silent: recorded (one transaction), nothing
        moves."""
        now = datetime.now(UTC)
        events: list[Event] = []
        with self.c._write() as session:
            for server in servers:
                session.add(OutageRow(server=server, down_from=from_slot, up_from=None,
                                      detected_at=now))  # fmt: skip
                events.append(self.c._event(session, now, "server_failed", "", "",
                                            {"server": server, "from_slot": from_slot,
                                             "jobs": [], "cordoned": True}))  # fmt: skip
        for server in servers:
            self.log.warning("server failed", server=server, from_slot=from_slot, cordoned=True)
        return events

    def recover_sync(self, server: str) -> list[Event]:
        """The agent of failed ``server`` is heard again: it is back from the next slot,
        unless cordoned, or flapping (``[mqtt] flap_failures`` failures within
        ``flap_seconds``): then it is held out for ``flap_seconds`` more by a cordon with an
        end (:mod:`controller.admission.cordons`, by ``oasisd``), which an operator's
        ``oasis uncordon`` ends sooner."""
        kind, index = self.server_index[server]
        from_slot = self.c.slot + 1
        now = datetime.now(UTC)
        cordon = self.c.cordoned.get(server)
        cordoned = cordon is not None and cordon.started(self.c.slot)  # out: its cordon
        planned = cordon is not None and not cordoned  # a cordon ahead: kept
        with self.c._write() as session:
            session.execute(update(OutageRow).where(
                OutageRow.server == server, OutageRow.up_from.is_(None),
                OutageRow.cause != CORDONED,
            ).values(up_from=from_slot))  # fmt: skip
            flaps = 0 if cordoned else self._recent_failures(session, server, now)
            detail: dict[str, Any] = {"server": server, "from_slot": from_slot}
            if cordoned:
                detail["cordoned"] = True
            event = self.c._event(session, now, "server_recovered", "", "", detail)
        events = [event]
        if flaps and not planned:
            events += self._hold_out(server, flaps)
            # the failure's block has no end: the hold-out's own slots take its place
            # (the interleaving audit: blocked for good, where a rebuild held the
            # hold-out's slots alone)
            self.c._ledger.unblock(kind, index, from_slot)
            self.c._block_cordon(server)
        elif not cordoned or (cordon is not None and cordon.until is not None):
            # the failure's block goes; a cordon keeps its own slots (one planned, or in
            # force up to its end; one without an end keeps the server out as it is).
            # One cordon per server: a flapping server with one planned is not held out
            # as well (logged)
            self.c._ledger.unblock(kind, index, from_slot)
            self.c._block_cordon(server)
        self.log.info("server back", server=server, from_slot=from_slot, cordoned=cordoned,
                      held_out=bool(flaps) and not planned, planned_cordon=planned,
                      flapping=bool(flaps))  # fmt: skip
        return events

    def _out(self, server: str) -> bool:
        """Whether ``server`` is cordoned from the next slot on (not only planned)."""
        cordon = self.c.cordoned.get(server)
        return cordon is not None and cordon.started(self.c.slot)

    def _recent_failures(self, session: Any, server: str, now: datetime) -> int:
        """The failures of ``server`` detected within ``flap_seconds`` before ``now`` if
        they are at least ``flap_failures`` (0 if not, or if that rule is off)."""
        least = self.mqtt.flap_failures
        if least <= 0:
            return 0
        since = now - timedelta(seconds=self.mqtt.flap_seconds)
        count = session.scalar(select(func.count(OutageRow.id)).where(
            OutageRow.server == server, OutageRow.cause != CORDONED,
            OutageRow.detected_at >= since))  # fmt: skip
        return int(count or 0) if (count or 0) >= least else 0

    def _hold_out(self, server: str, flaps: int) -> list[Event]:
        """Keep flapping ``server`` out for ``flap_seconds``, as a cordon with an end (its
        jobs moved off at its failure, so nothing moves); returns the cordon's events."""
        until = self.c.slot + 1 + max(slots_for(self.mqtt.flap_seconds, self.slot_seconds), 1)
        span = format_duration(self.mqtt.flap_seconds)
        reason = f"flapping: its agent fell silent {flaps} times within {span}"
        _view, events = self.c._cordon_sync(server, reason, "oasisd", force=True, until=until)
        self.log.warning("flapping server held out", server=server, failures=flaps,
                         until_slot=until)  # fmt: skip
        return events
