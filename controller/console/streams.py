"""The console's live events (``GET /api/events``): server-sent events from the
controller's event bus, replayed from the store when a stream resumes, a submitter's
filtered to its own jobs (their owners read once, shared by every stream), and the caps
on open streams (``web.max_event_streams_per_user``, ``web.max_event_streams``).

Every write to a stream is bounded (:data:`WRITE_SECONDS`): a client that stops reading
has its stream ended and its connection aborted once the socket's buffers are full,
rather than holding its place under the caps (and a descriptor) for good.
"""

from __future__ import annotations

import asyncio

import structlog
from aiohttp import web

from controller.auth import Caller, holds
from controller.console.sessions import Session
from controller.console.state import ConsoleState, _RefusedError
from controller.console.views import _INTEGER, _dumps, _int
from controller.events import Event
from controller.job_keys import shown

log = structlog.get_logger("oasisd")

_HEARTBEAT_SECONDS = 15.0
WRITE_SECONDS = 30.0
"""A write to an event stream (an event, a heartbeat, its end) must be taken by the client
within this, or the stream ends and its connection is aborted. A write waits only once
the socket's buffers (the kernel's, up to megabytes, and aiohttp's 64 KiB) are full: a
client that stopped reading. Such a stream waited there for good, never reaching its
next check (:meth:`EventStreams._still_allowed`), and held its place under the caps: 8
users' scripts of 32 unread streams took all 256, and every other console was refused,
even after a reload revoked their tokens. A slow but live page so cut is not left with a
gap unsaid: its EventSource reconnects with the last event it got whole
(``Last-Event-ID``) and is sent those stored since, as after any cut (at most the newest
:data:`_BACKFILL_MAX`)."""
_BACKFILL_MAX = 1000  # events replayed to a stream that reconnects (Last-Event-ID)
_OWNER_CACHE = 10_000  # job owners remembered, for every submitter's stream together


class _StalledError(Exception):
    """A stream's client did not take a write within :data:`WRITE_SECONDS`."""


async def _send(request: web.Request, response: web.StreamResponse, data: bytes | None) -> None:
    """Write ``data`` to ``response`` (None: its end) within :data:`WRITE_SECONDS`, or
    abort the connection and raise :class:`_StalledError`. Aborted, not closed: the
    write cancelled has left its bytes in the transport's buffer, and a close would wait
    to flush them (and aiohttp's end of the answer would wait on the drain again)."""
    try:
        async with asyncio.timeout(WRITE_SECONDS):
            if data is None:
                await response.write_eof()
            else:
                await response.write(data)
    except TimeoutError:
        if request.transport is not None:
            request.transport.abort()
        raise _StalledError from None


class EventStreams(ConsoleState):
    """Server-sent event streams and the job owners they filter by (a part of
    :class:`.app.Console`)."""

    async def events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: every event of the bus (a submitter: its own jobs'), after
        those stored since ``Last-Event-ID`` (or ``?after=``) when the stream resumes."""
        caller: Caller = request["caller"]
        self._open_stream(caller)
        try:
            return await self._stream(request, caller)
        finally:
            self._close_stream(caller)

    def _open_stream(self, caller: Caller) -> None:
        """Count a new event stream of ``caller``'s, or refuse it: 429 past the user's
        cap, 503 past everyone's (``[web]``)."""
        web_config = self.config.web
        mine = self.streams.get(caller.name, 0)
        if mine >= web_config.max_event_streams_per_user:
            who = caller.name or "this console's user (without [auth], everyone)"
            raise _RefusedError(
                429,
                f"too many event streams: {who} has {mine} open (web.max_event_streams_per_"
                f"user = {web_config.max_event_streams_per_user}); close another console tab "
                f"or stream first (a closed one frees its place within {_HEARTBEAT_SECONDS:g} s)",
            )
        total = sum(self.streams.values())
        if total >= web_config.max_event_streams:
            raise _RefusedError(
                503,
                f"too many event streams: {total} open in all (web.max_event_streams = "
                f"{web_config.max_event_streams}); try again later",
            )
        self.streams[caller.name] = mine + 1

    def _close_stream(self, caller: Caller) -> None:
        left = self.streams.get(caller.name, 0) - 1
        if left > 0:
            self.streams[caller.name] = left
        else:
            self.streams.pop(caller.name, None)

    async def _stream(self, request: web.Request, caller: Caller) -> web.StreamResponse:
        """The stream of ``caller`` (a submitter sees only its own jobs' events), until
        the browser goes, the console closes, its session or token ends
        (:meth:`_still_allowed`), or its client leaves a write untaken for
        :data:`WRITE_SECONDS` (its connection then aborted)."""
        owner = caller.owner
        session: Session | None = request.get("session")  # None: a bearer token's
        queue = self.c.bus.subscribe()  # first, so nothing falls between backfill and live
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                     "X-Accel-Buffering": "no", "X-Content-Type-Options": "nosniff"}
        )  # fmt: skip
        try:
            last = _int(request.query, "after", -1)  # before the answer starts: a 400
            resume = request.headers.get("Last-Event-ID", "")
            if _INTEGER.fullmatch(resume) and not resume.startswith("-"):
                last = int(resume)
            await response.prepare(request)
            await _send(request, response, b"retry: 2000\n\n")
            if last > 0:
                # a page resumed past the store's newest event: the store was restored from
                # a backup (or is another one), and reuses those numbers; its events after
                # its newest are new to the page (before, the page skipped them unseen)
                newest = await self.c.stored_events(-1, limit=1, newest=True)
                last = min(last, newest[-1].sequence if newest else 0)
            backlog: list[Event] = []
            if last >= 0 and owner is None:
                backlog = await self.c.stored_events(last, limit=_BACKFILL_MAX, newest=True)
            elif last >= 0 and owner is not None:  # its own jobs': no burst of others' crowds them
                backlog = await self.c.own_events(owner, last, _BACKFILL_MAX, caller.turn)
                if backlog:  # the backlog's owners in one query
                    upto = max(e.sequence for e in backlog)
                    await self._learn_owners({e.job_id for e in backlog if e.job_id}, upto)
            replayed = 0
            try:
                for stored in backlog:
                    last = max(last, stored.sequence)
                    if await self._visible(stored, owner):
                        data = _sse(stored, caller)
                        replayed += len(data)  # charged if the client leaves mid-way too
                        await _send(request, response, data)
            finally:
                self._charge_replay(caller, replayed)
            while not self.closing.is_set():
                event = await self._next(queue)
                if event is not None and event.sequence <= last:
                    continue
                shown = event is not None and await self._visible(event, owner)
                if not self._still_allowed(caller, session):
                    break  # checked after every wait, before anything more is written
                if event is None:
                    await _send(request, response, b": ping\n\n")
                    continue
                last = event.sequence
                if shown:
                    await _send(request, response, _sse(event, caller))
            await _send(request, response, None)  # the end, bounded too (aiohttp's is not)
        except _StalledError:
            log.info("console event stream ended: its client stopped reading",
                     user=caller.name, write_seconds=WRITE_SECONDS)  # fmt: skip
        except (ConnectionResetError, ConnectionError):
            pass  # the browser went away
        finally:
            self.c.bus.unsubscribe(queue)
        return response

    def _charge_replay(self, caller: Caller, nbytes: int) -> None:
        """Charge a submitter's rate for the ``nbytes`` of events replayed to a stream it
        opened, as any answer of its past 16 KiB (:meth:`~controller.limits.RateLimiter.
        charge_bytes`; ``.middleware`` charges the pages). Before, a replay of its newest
        1,000 events (some 150 KB) cost the one token of the request: opening streams
        with ``?after=0`` in 4 loops, about 10 a second within the rate, took another
        tenant's ``GetClusterInfo`` from a p90 of 2.4 ms to 97 ms (max 233 ms), as every
        replay is encoded and written on the event loop all calls share. Operators read
        uncharged, as over gRPC."""
        if self.limiter is not None and caller.owner is not None:
            self.limiter.charge_bytes(caller.name, nbytes)

    def _still_allowed(self, caller: Caller, session: Session | None) -> bool:
        """Whether a stream ``caller`` opened (with ``session``, or None: with a bearer
        token) may go on: its token still holds (a reload may have revoked it or changed
        its role) and its session is still live (not logged out, expired, or ended by
        newer logins of the user's past :data:`~.sessions.MAX_SESSIONS_PER_CALLER`).

        Checked after each wait for an event, before anything is written: checked before
        the wait only, a revoked token's stream was sent the next event, and a session's
        stream went on after its logout, for good (the token still held)."""
        if not holds(self.tokens, caller):
            return False
        return session is None or self.sessions.get(session.id) is session

    async def _next(self, queue: asyncio.Queue[Event]) -> Event | None:
        """The next event, or None after a heartbeat's interval or at close."""
        getter = asyncio.ensure_future(queue.get())
        closing = asyncio.ensure_future(self.closing.wait())
        try:
            done, _ = await asyncio.wait(
                {getter, closing}, timeout=_HEARTBEAT_SECONDS, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            closing.cancel()
            if not getter.done():
                getter.cancel()
        if getter in done:
            return getter.result()
        return None

    async def _visible(self, event: Event, owner: str | None) -> bool:
        """Whether a stream of ``owner`` (None: an operator's, every event) shows
        ``event``: a submitter sees its own jobs' events."""
        if owner is None:
            return True
        if not event.job_id:
            return False
        # a job's first event is a decision: one after the owner was read may be that of
        # a new job under a deleted job's id (retention), another submitter's: read again
        learned = self._learned_at.get(event.job_id, event.sequence)
        if event.kind == "decided" and event.sequence > learned:
            self.owners.pop(event.job_id, None)
        if event.job_id in self.owners:
            return self.owners[event.job_id] == owner
        # what the read found, not the cache after it: another read may have started the
        # cache over meanwhile (the review: an event of the stream's own job was lost)
        found = await self._learn_owners({event.job_id}, event.sequence)
        return found.get(event.job_id) == owner

    def _forget_owners(self, job_ids: list[str]) -> None:
        """Forget the owners of deleted jobs, and the sequence each was read at (called in
        the decision thread). Both: with ``keep_days`` set the owners left as their jobs
        were deleted and never filled :data:`_OWNER_CACHE`, and the sequences kept grew
        by one for every job a submitter's stream had met, for good."""
        for job_id in job_ids:
            self.owners.pop(job_id, None)
            self._learned_at.pop(job_id, None)

    async def _learn_owners(self, job_ids: set[str], upto: int) -> dict[str, str | None]:
        """The submitters of ``job_ids``: those known, and those not read in one query
        (or read by a query under way that reads at ``upto`` or later) into
        :attr:`owners` (at most ``_OWNER_CACHE``: past it, it starts over); ``upto``: the
        latest event already stored when they are read."""
        known = {j: self.owners[j] for j in job_ids if j in self.owners}
        unknown = [j for j in job_ids if j not in known]
        waits = {
            self._reading[j][0]
            for j in unknown
            if j in self._reading and self._reading[j][1] >= upto
        }
        mine = [j for j in unknown if j not in self._reading or self._reading[j][1] < upto]
        if mine:
            read = asyncio.ensure_future(self._read_owners(mine, upto))
            for job_id in mine:
                self._reading[job_id] = (read, upto)
            waits.add(read)
        for shared in waits:  # shielded: a stream that goes away ends no other's wait
            found = await asyncio.shield(shared)
            known.update((j, found[j]) for j in unknown if j in found)
        return known

    async def _read_owners(self, job_ids: list[str], upto: int) -> dict[str, str | None]:
        """Read the submitters of ``job_ids`` (one query; None: not stored) into
        :attr:`owners`, where no later read has put them, and return them."""
        try:
            stored = await self.data.owner_of(job_ids)
        finally:
            for job_id in job_ids:
                if self._reading.get(job_id, (None, 0))[1] == upto:
                    del self._reading[job_id]
        found = {job_id: stored.get(job_id) for job_id in job_ids}
        # _learned_at holds every job in owners and those a new decision took out of it
        if len(self._learned_at) + len(job_ids) > _OWNER_CACHE:
            self.owners.clear()
            self._learned_at.clear()
        for job_id, who in found.items():
            if self._learned_at.get(job_id, -1) <= upto:  # not over a later read's
                self.owners[job_id] = who
                self._learned_at[job_id] = upto
        return found


def _sse(event: Event, caller: Caller) -> bytes:
    """``event`` as a server-sent event for ``caller`` (its job as the caller names it)."""
    job_id = shown(caller, event.job_id) if event.job_id else event.job_id
    body = {"sequence": event.sequence, "kind": event.kind, "job_id": job_id,
            "slot": event.slot, "state": event.state, "detail": event.detail}  # fmt: skip
    return f"id: {event.sequence}\nevent: oasis\ndata: {_dumps(body)}\n\n".encode()
