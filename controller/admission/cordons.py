"""Cordoned servers: an operator takes a server out of service, and puts it back,
without a restart (``oasis cordon SERVER``, ``oasis uncordon SERVER``).

A cordon takes effect at the next slot boundary: the server's capacity is zero from slot
``s + 1`` on (``s`` the current slot), in this window and every slot it opens later,
until an uncordon, which gives it back from the next boundary, or until the end the
operator gave (``until``, a planned maintenance): then only the slots before it are
blocked, jobs may be planned on the server after it at once, and the cordon ends by
itself at that boundary. The jobs planned on it
then move as after a failure (:func:`pricing.replan.fail_servers`), in decision order:
re-placed in the same slots on other servers where room allows, else re-planned from
their remaining work with the best-schedule search, else failed; each with a
``replanned`` or ``failed`` event whose reason is ``server_cordoned``. The current slot
is left as it is: the server works on to its end (a failure takes the current slot's
work too, since nothing ran). New jobs are planned around it at once.

A cordon may be planned to start later (``oasis cordon --from``, ``start``): the jobs
planned on the server from its first slot move at once, as above, and no new plan uses
the server from then on, but the server is in service until then (state ``up``; a
failure and recovery meanwhile keep the planned slots blocked). At most one cordon per
server: to change one, uncordon it (which cancels a planned one) and cordon again.

The store keeps a cordon as an outage row of cause ``cordoned`` (migration 0007): a
restart, an outage rebuild and a standby block it again, and the execution plane's
heartbeats never end it, as they end a failure. A server both failed and cordoned stays
out until both have ended.

Several servers may be cordoned in one step (``oasis cordon gpu1 gpu2 gpu3``, a rack's
maintenance): every one is out before any job moves, so a job moves once and never onto
another of them. Each gets its own cordon (the same start, end and reason), outage row
and ``server_cordoned`` event; a job's move names the first of them it was on.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import case, select, update

from controller.admission.moves import Moves
from controller.admission.views import Cordon
from controller.errors import NotFoundError, PreconditionError
from controller.events import Event, taken_with
from controller.store import CORDONED, JobRow, OutageRow
from controller.store.stored import stored_spec
from pricing import Job, SpecError
from pricing.fields import closest
from pricing.replan import fail_servers, first_holders
from pricing.text import printable_problem

__all__ = ["FOREVER", "MAX_REASON", "MAX_SERVERS", "Cordons", "ledger_until"]

MAX_REASON = 500
"""The longest reason a cordon records, characters."""

MAX_SERVERS = 1000
"""The most servers one cordon takes out together (a rack, a row: ``more_servers``)."""

MAX_CORDON_SLOTS = 1_000_000
"""The furthest end a cordon may be given, in slots after its first (a century of hourly
slots; without an end it lasts until an uncordon), and the furthest start, in slots
after the next one."""

FOREVER = 1 << 62
"""The end, in the ledger, of a planned cordon without one: a block with an end keeps
the slots the window opens blocked up to it (:meth:`pricing.Ledger.block`), while a
block without one also marks the server down now, which it is not yet."""


def ledger_until(cordon: Cordon, slot: int) -> int | None:
    """The end ``cordon`` is blocked to in the ledger when the current slot is ``slot``:
    its own, or :data:`FOREVER` for a planned one without an end."""
    if cordon.until is None and not cordon.started(slot):
        return FOREVER
    return cordon.until


class Cordons(Moves):
    """Cordon and uncordon servers; see the module docstring."""

    def _server_of(self, server: str) -> tuple[str, int]:
        """``(kind, index)`` of a configured server; NotFoundError naming the servers
        otherwise."""
        cluster = self.cluster
        if server in cluster.worker_names:
            return "worker", cluster.worker_names.index(server)
        if server in cluster.ps_names:
            return "ps", cluster.ps_names.index(server)
        names = [*cluster.worker_names, *cluster.ps_names]
        meant = closest(server, names)
        if meant is not None:
            raise NotFoundError(f"no server {server[:200]!r} in [cluster]; did you mean {meant!r}?")
        shown = ", ".join(names[:20]) + (f", and {len(names) - 20} more" if len(names) > 20 else "")
        raise NotFoundError(f"no server {server[:200]!r} in [cluster] (servers: {shown})")

    def _cordon_sync(
        self,
        server: str,
        reason: str = "",
        by: str | None = None,
        dry_run: bool = False,
        force: bool = False,
        until: int | None = None,
        start: int | None = None,
        more: Sequence[str] = (),
    ) -> tuple[dict[str, Any], list[Event]]:
        """Cordon ``server`` and the servers ``more`` together from the next slot on, or
        from slot ``start`` if that is later (a planned cordon), up to slot ``until``
        (exclusive) if given; returns what was done (``server``, ``servers``: every one
        named, ``server`` first, ``already_servers``: those of them cordoned before, left
        as they were, ``from_slot``, ``until``, ``moved``: ``{job id: how}`` in the
        ledger's order, ``already``: True if every one was cordoned before, when nothing
        changes; ``dry_run``) and the events.

        Every server is out before any job moves: a job on several moves once, and
        none is moved onto another of them (one call a server moved a rack's jobs from
        each server to the next, and again). The moves are made on the ledger, which a
        snapshot taken first puts back for a ``dry_run`` (nothing changes) and for a
        cordon that would fail jobs (no room anywhere else), refused unless ``force``: a
        mistyped server name must not fail tenants' jobs.

        Raises:
            NotFoundError: no such server. SpecError: a reason too long, too many
                servers, a start before the current slot (taken as the next one, it moved
                the jobs at once for a maintenance's mistyped date), a start or an end
                further out than :data:`MAX_CORDON_SLOTS`, an end not after the start.
            PreconditionError: jobs would fail and ``force`` is not set.
        """
        names = list(dict.fromkeys([server, *more]))
        if len(names) > MAX_SERVERS:
            raise SpecError.one("more_servers", f"at most {MAX_SERVERS} servers in one "
                                f"cordon, got {len(names)}")  # fmt: skip
        places = {name: self._server_of(name) for name in names}
        if len(reason) > MAX_REASON:
            raise SpecError.one("reason", f"at most {MAX_REASON} characters, got {len(reason)}")
        why = printable_problem(reason)  # it is shown to every operator and in the log
        if why is not None:
            raise SpecError.one("reason", why)
        self._advance_window()
        before = [name for name in names if name in self.cordoned]
        new = [name for name in names if name not in self.cordoned]
        if not new:
            held = self.cordoned[server]
            return {"server": server, "servers": names, "already_servers": before,
                    "from_slot": held.from_slot, "until": held.until,
                    "moved": {}, "already": True, "dry_run": dry_run}, []  # fmt: skip
        from_slot = self.slot + 1
        if start is not None and start < self.slot:  # a date mistyped: not "from now"
            raise SpecError.one("from_slot", (
                f"slot {start} is before the current slot ({self.slot}): a cordon cannot "
                f"start in the past; give a later one, or none to cordon from the next "
                f"slot ({from_slot})"))  # fmt: skip
        if start is not None and start > from_slot + MAX_CORDON_SLOTS:
            raise SpecError.one("from_slot", (
                f"at most {MAX_CORDON_SLOTS} slots after the next one ({from_slot}), "
                f"got {start}"))  # fmt: skip
        planned = start is not None and start > from_slot
        if planned:
            assert start is not None
            from_slot = start
        if until is not None and not from_slot < until <= from_slot + MAX_CORDON_SLOTS:
            first = f"{from_slot}, " + ("its --from" if planned else "the next one")
            past = f", {until - from_slot} slots after it" if until > from_slot else ""
            raise SpecError.one("until_slot", (
                f"must be after the slot the cordon starts in ({first}) and "
                f"at most {MAX_CORDON_SLOTS} slots after it, got slot {until}{past}"))  # fmt: skip
        cordon = Cordon(from_slot, reason, by or "", until)
        blocked_to = ledger_until(cordon, self.slot)
        ledger = self._ledger
        jobs: dict[str, Job] = {}
        moved: dict[str, str] = {}
        off: dict[str, str] = {}  # each moved job: the first of the servers it was on
        outcome = None
        saved = ledger.snapshot()  # to undo the moves: a dry run, a refusal, a failure
        try:
            # a failed server's jobs have moved already
            down = [(name, *places[name]) for name in new if not ledger.is_down(*places[name])]
            name_of = {(kind, index): name for name, kind, index in down}
            firsts = first_holders(ledger, list(name_of), from_slot, blocked_to)
            off = {job_id: name_of[key] for job_id, key in firsts.items()}
            if off:
                # only the jobs planned on them from then on move, in admission order
                # (read: 0.4 s for all 600 jobs of a ledger at 2,000 + 2,000 servers)
                with self.db.session() as session:
                    jobs = {j: self._stored_job(j, session) for j in off}
            last = {j: self._window_end(job.arrival) for j, job in jobs.items()}
            if down:
                # the current slot stays as planned: the servers run it to its end
                servers = [(kind, index) for _name, kind, index in down]
                outcome = fail_servers(ledger, jobs, servers, from_slot, {}, last, blocked_to)
                moved = outcome.moves(jobs)
                if planned:  # a job a cordon ahead strands fails now, holding nothing on
                    for job_id, how in moved.items():  # (the interleaving audit)
                        if how == "stranded" and job_id in ledger:
                            ledger.release(job_id, self.slot + 1)
            view = {"server": server, "servers": names, "already_servers": before,
                    "from_slot": from_slot, "until": until, "moved": moved,
                    "already": False, "dry_run": dry_run}  # fmt: skip
            stranded = [j for j, how in moved.items() if how == "stranded"]
            if dry_run or (stranded and not force):
                ledger.restore(saved)
                if dry_run:
                    return view, []
                raise PreconditionError(_refusal(new, from_slot, stranded))
            now = datetime.now(UTC)
            events: list[Event] = []
            with self._write() as session:  # fenced (high availability)
                for name in new:
                    session.add(OutageRow(server=name, down_from=from_slot, up_from=until,
                                          detected_at=now, cause=CORDONED, reason=reason,
                                          by=by or ""))  # fmt: skip
                for job_id, how in moved.items():  # the ledger's order
                    detail: dict[str, Any] = {"reason": "server_cordoned", "server": off[job_id]}
                    best = outcome.replanned.get(job_id) if outcome is not None else None
                    since = self.slot + 1 if how == "stranded" else from_slot
                    events.append(
                        self._record_move(session, now, jobs[job_id], how, since, detail, best)
                    )
                for name in new:
                    its = [j for j in moved if off[j] == name]
                    events.append(self._event(session, now, "server_cordoned", "", "", {
                        "server": name, "from_slot": from_slot, "until": until,
                        "jobs": its, "reason": reason, "by": by or "", **taken_with(new, name),
                    }))  # fmt: skip
        except PreconditionError:
            raise  # restored: nothing changed
        except BaseException:
            # the ledger may hold moves the store does not: rebuilt before the next step
            self._stale = True
            raise
        for name in new:
            self.cordoned[name] = cordon
            its_moves = {j: how for j, how in moved.items() if off[j] == name}
            self.log.warning("server cordoned", server=name, from_slot=from_slot, until=until,
                             planned=planned, moved=its_moves, reason=reason, by=by or "",
                             **taken_with(new, name))  # fmt: skip
        return view, events

    def _uncordon_sync(
        self, server: str, by: str | None = None
    ) -> tuple[dict[str, Any], list[Event]]:
        """End ``server``'s cordon from the next slot on; returns ``server``,
        ``from_slot``, ``already`` (True if it was not cordoned: nothing changes) and
        ``failed`` (True if it stays out, failed by the execution plane), and the events.

        Without an execution plane (no ``[mqtt]``) a failure it recorded before it was
        turned off would never end (no agent can be heard): the uncordon ends it too,
        cordoned or not, and its event says ``failure_ended``."""
        kind, index = self._server_of(server)
        self._advance_window()
        failed_now = self._failed_now(server)
        orphaned = self.config.mqtt is None and failed_now
        if server not in self.cordoned and not orphaned:
            return {"server": server, "from_slot": None, "already": True,
                    "failed": failed_now, "planned": False}, []  # fmt: skip
        held = self.cordoned.get(server)
        planned = held is not None and not held.started(self.slot)  # cancelled, unstarted
        from_slot = self.slot + 1
        now = datetime.now(UTC)
        still_open = update(OutageRow).where(
            OutageRow.server == server,
            OutageRow.up_from.is_(None) | (OutageRow.up_from > from_slot),  # an end ahead
        )
        if not orphaned:  # a failure is the execution plane's to end, at its agent's beat
            still_open = still_open.where(OutageRow.cause == CORDONED)
        # a cordon cancelled before it began keeps an empty span (up_from = down_from)
        end = case((OutageRow.down_from > from_slot, OutageRow.down_from), else_=from_slot)
        with self._write() as session:
            session.execute(still_open.values(up_from=end))
            failed = _failed(session, server)
            detail = {"server": server, "from_slot": from_slot, "by": by or "", "failed": failed}
            if planned:
                detail["planned"] = True
            if orphaned:
                detail["failure_ended"] = True
            event = self._event(session, now, "server_uncordoned", "", "", detail)
        self.cordoned.pop(server, None)
        if not failed:
            self._ledger.unblock(kind, index, from_slot)
        self.log.info("server uncordoned", server=server, from_slot=from_slot, failed=failed,
                      failure_ended=orphaned, planned=planned, by=by or "")  # fmt: skip
        view = {"server": server, "from_slot": from_slot, "already": False, "failed": failed,
                "planned": planned}  # fmt: skip
        return view, [event]

    def _window_moved(self) -> None:
        """End the cordons with an end whose end is the next slot or before: the server
        is planned on from then (its slots past the end were never blocked). One the
        execution plane declared failed during the cordon, and heard again since, was
        kept out for the cordon: it is given back now."""
        for server in [name for name, c in self.cordoned.items() if c.ended(self.slot)]:
            cordon = self.cordoned[server]
            assert cordon.until is not None
            kind, index = self._server_of(server)
            if self._ledger.is_down(kind, index) and not self._failed_now(server):
                self._ledger.unblock(kind, index, cordon.until)
            del self.cordoned[server]
            self.log.info("cordon ended", server=server, from_slot=cordon.from_slot,
                          until=cordon.until, reason=cordon.reason, by=cordon.by)  # fmt: skip
        for server, cordon in self.cordoned.items():  # a planned one without an end begins
            if cordon.until is not None or not cordon.started(self.slot):
                continue
            kind, index = self._server_of(server)
            if not self._ledger.is_down(kind, index):
                self._ledger.block(kind, index, cordon.from_slot)  # down from now on
                self.log.info("planned cordon begins", server=server, from_slot=cordon.from_slot,
                              reason=cordon.reason, by=cordon.by)  # fmt: skip

    def _block_cordon(self, server: str) -> None:
        """Block ``server``'s cordon, if it has one, in the ledger again from the next
        slot on, after its recovery from a failure unblocked every slot ahead: a planned
        one from its start, one in force up to its end (without one, for good). The
        ledger then holds what a rebuild from the store would (before, a failure
        recovered within a cordon with an end kept the server blocked past the end)."""
        cordon = self.cordoned.get(server)
        if cordon is None:
            return
        kind, index = self._server_of(server)
        first = max(cordon.from_slot, self.slot + 1)
        self._ledger.block(kind, index, first, ledger_until(cordon, self.slot))

    def cordons(self) -> dict[str, Cordon]:
        """The cordons in force or planned, by server (read in the decision thread)."""
        return dict(self.cordoned)

    def server_states(self) -> dict[str, str]:
        """Each server's state from the next slot on: ``"cordoned"``, ``"failed"`` (down
        by the execution plane) or ``"up"`` (a planned cordon included: :meth:`cordons`;
        read in the decision thread)."""
        ledger = self._ledger
        out: dict[str, str] = {}
        for kind, index, name, _caps in self.cluster.servers():
            cordon = self.cordoned.get(name)
            if cordon is not None and cordon.started(self.slot):
                out[name] = "cordoned"
            else:
                out[name] = "failed" if ledger.is_down(kind, index) else "up"
        return out

    def _failed_now(self, server: str) -> bool:
        """Whether the store holds an open failure of ``server`` (the execution plane's)."""
        with self.db.session() as session:
            return _failed(session, server)

    def _stored_job(self, job_id: str, session: Any) -> Job:
        """A job of the ledger, from its stored spec."""
        row = session.get(JobRow, job_id)
        if row is None:
            raise NotFoundError(f"no job {job_id!r}")
        return self._parse(stored_spec(row.spec, job_id), arrival=row.arrival_slot, fits=False)


def _failed(session: Any, server: str) -> bool:
    """Whether the store holds an open failure of ``server`` (the execution plane's, not
    an operator's cordon)."""
    open_failure = select(OutageRow.id).where(
        OutageRow.server == server, OutageRow.up_from.is_(None), OutageRow.cause != CORDONED
    )
    return session.scalar(open_failure.limit(1)) is not None


def _refusal(servers: list[str], from_slot: int, stranded: list[str]) -> str:
    """Why a cordon of ``servers`` that would fail ``stranded`` jobs is refused, in words."""
    n = len(stranded)
    shown = ", ".join(stranded[:10]) + (f" and {n - 10} more" if n > 10 else "")
    named = ", ".join(servers[:10]) + (
        f" and {len(servers) - 10} more" if len(servers) > 10 else ""
    )
    it = "it" if len(servers) == 1 else "them"
    return (
        f"cordoning {named} from slot {from_slot} would fail {n} job{'s' if n > 1 else ''} "
        f"that fit{'' if n > 1 else 's'} nowhere else ({shown}); nothing changed. --force "
        f"cordons {it} anyway, --dry-run shows every move"
    )
