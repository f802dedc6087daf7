"""The admission controller: its parts composed, and its async API, which serialises
every decision (each one changes prices) and runs it off the event loop in one worker
thread (the compiled search releases the GIL)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, func, select

from controller.admission.commit import Deferred
from controller.admission.cordons import Cordons
from controller.admission.follow import Follow
from controller.admission.lifecycle import Lifecycle
from controller.admission.limit_checks import pending_refused
from controller.admission.pending import PendingQueue
from controller.admission.reads import ReadViews
from controller.admission.restart_checks import (
    resources_problem,
    slot_grid_problem,
    stored_epoch,
)
from controller.admission.restart_moves import restart_moves, store_left_behind
from controller.admission.retention import PRUNE_BATCH, PRUNE_SERVER_STEPS, Retention
from controller.admission.rewind import rewound
from controller.admission.state import ReadTurns, parse_job
from controller.admission.views import LIVE_STATES, DecisionView, JobView
from controller.admission.writer import GroupWriter
from controller.config import Config
from controller.errors import DrainingError, NotLeaderError
from controller.events import Event
from controller.limits import search_size
from controller.store import JobRow, StoreUnavailableError
from controller.store.commit_process import CommitProcess
from controller.store.writer_lock import FencedError
from pricing import Job, SpecError

__all__ = ["AdmissionController"]


def _parsed(config: Config, spec: Any, arrival: int) -> Job:
    """A pending job's ``spec`` (arriving at ``arrival``) as a restart with ``config``
    would read it: against its servers and window."""
    return parse_job(spec, config.cluster, config.slot_seconds, config.window, arrival)


_T = TypeVar("_T")

STALE_REBUILD_SECONDS = 5.0
"""Seconds between the slot clock's tries at rebuilding a stale ledger while no call
does (:meth:`AdmissionController._rebuild_if_stale`): each try reads the whole store."""


def _no_step() -> None:
    """A step that does nothing: what runs before it (a stale ledger's rebuild) is the
    point."""


READS_PER_CLIENT = 2
"""Store reads one named client has in the read pool at once (:meth:`read_store`)."""


def _settle(answer: Future[_T], outcome: Callable[[], _T] | BaseException) -> None:
    """Resolve ``answer`` with ``outcome()`` (or what it raises), or with the exception
    given; nothing if its caller gave up (cancelled) meanwhile."""
    try:
        if isinstance(outcome, BaseException):
            answer.set_exception(outcome)
            return
        try:
            value = outcome()
        except BaseException as err:
            answer.set_exception(err)
        else:
            answer.set_result(value)
    except InvalidStateError:  # cancelled: nobody waits for it
        pass


class AdmissionController(PendingQueue, Retention, Follow, Lifecycle, ReadViews, Cordons):
    """Owns the ledger, the price bounds and the store; see the package docstring."""

    # -- async API (serialised, off the event loop) ---------------------------------------

    async def _run(
        self, fn: Callable[[], _T | Deferred[_T]], client: str = "", writes: bool = True
    ) -> _T:
        """Run ``fn`` in the decision thread in ``client``'s turn (round-robin over
        clients, :class:`~controller.admission.decision_thread.DecisionThread`; ``""``:
        the daemon itself).
        A :class:`~controller.admission.commit.Deferred` result (a decision whose commit
        is queued) is awaited here, after the turn passed on: the next decision does not
        wait for this one's commit, its caller does. The event loop is woken once, when
        the answer is ready (the commit's), not also when the step ends. ``writes``:
        ``fn`` may write to the store (all but a quote), refused at once while a SQLite
        store is full (:attr:`~controller.store.database.Database.writes_refused`).

        Raises:
            DrainingError: the daemon is stopping.
            BusyError: ``client`` has ``limits.max_in_flight`` calls in already.
        """
        if self._draining:
            raise DrainingError("the daemon is stopping (draining); retry on its successor")
        if not self.leading:
            raise self._not_leader()
        self._in_flight += 1
        self._idle.clear()
        try:
            answer: Future[_T] = Future()
            outcome: list[Callable[[], _T] | BaseException] = []  # the step's, once it ends

            def step() -> None:
                try:
                    result = self._in_step(fn, writes)
                except BaseException as err:  # the caller's, through the answer
                    outcome.append(err)
                    return
                if isinstance(result, Deferred):
                    deferred = result
                    deferred.future.add_done_callback(
                        lambda done: _settle(answer, lambda: deferred.then(done.result()))
                    )
                else:
                    outcome.append(lambda: result)

            queued = self._decisions.submit(client, step)
            # answered once the step has ended, after the thread stopped counting it
            # against the client's limits.max_in_flight (a callback registered before
            # this one): answered from inside the step, a client that sent its next call
            # the moment it had the answer was refused, "1 calls in flight"
            queued.add_done_callback(lambda _f: _settle(answer, outcome[0]) if outcome else None)
            # a caller that gives up before its step started takes it out of the queue
            answer.add_done_callback(lambda f: queued.cancel() if f.cancelled() else None)
            return await asyncio.wrap_future(answer)
        finally:
            held, self._held_events = self._held_events, []
            self._publish(held)
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    @property
    def writer(self) -> GroupWriter:
        """The group-commit writer (its counters: batches, decisions, seconds)."""
        return self._writer

    @property
    def commit_process(self) -> CommitProcess | None:
        """The writer's commit process (None: the writer thread commits itself)."""
        return self._committer

    @property
    def draining(self) -> bool:
        """True once :meth:`drain` began: new submissions, quotes and cancels are refused."""
        return self._draining

    def refuse_new(self) -> None:
        """From now on refuse new submissions, quotes and cancels (:attr:`draining`). The
        daemon's stop calls this before it tells systemd and the health service it is
        stopping: a call sent on that word is refused "draining", never taken in to wait
        behind the decisions in flight (and cut off at the drain's time limit)."""
        self._draining = True

    async def drain(self, timeout: float) -> int:
        """Refuse new requests (:meth:`refuse_new`) and wait up to ``timeout`` seconds for
        those in flight to be decided and committed. Returns how many were still in flight
        at the timeout."""
        self.refuse_new()
        if self._in_flight:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._idle.wait()
        return self._in_flight

    async def read(self, fn: Callable[[], _T], client: str | None = None) -> _T:
        """Run ``fn`` in the decision thread between two ledger changes and return its
        result (from the event loop): a read of the ledger never sees half a decision.

        A client's read (``client``: its turn key, ``""`` when anonymous) waits its turn
        among the clients' steps, round robin (not counted against
        ``limits.max_in_flight``), so a flood of price reads delays another client's
        submit by one read at most. The daemon's own reads (``client`` None) go ahead of
        the waiting steps.
        """
        if client is None:
            return await asyncio.wrap_future(self._decisions.call(fn))
        return await asyncio.wrap_future(self._decisions.submit(client, fn, counted=False))

    def step_seconds(self) -> float:
        """How long the decision thread's running step has run, seconds (0: none runs)."""
        return self._decisions.step_seconds()

    def between_decisions(self, fn: Callable[[], _T], timeout: float = 10.0) -> _T:
        """Run ``fn`` in the decision thread between two decisions and return its result
        (blocking; from any thread but the event loop's). The ledger is only changed in that
        thread, so ``fn`` reads it whole, never half-updated."""
        return self._decisions.call(fn).result(timeout)

    def _in_step(self, fn: Callable[[], _T], writes: bool = True) -> _T:
        """Run ``fn`` in the decision thread on a ledger that matches the store (or is
        ahead of it by decisions the writer is committing)."""
        if self.db.severed:  # the store's file is gone: nothing decided now would be kept
            raise StoreUnavailableError(self.db.severed)
        if writes and self.db.writes_refused:  # its disk is full: the commit would fail
            raise StoreUnavailableError(self.db.writes_refused)
        try:
            if self._stale:  # StoreUnavailableError: still stale, try next time
                # a rebuild writes too (idle allocations dropped), fenced: a leader the
                # store's epoch passed (another took over, or a restore rewound the
                # writer row) steps down here, as for any write (before: INTERNAL errors
                # on every call and tick, the daemon still taking itself for the leader)
                self._rebuild_stale()
            return fn()
        except StoreUnavailableError:
            self._stale = True
            raise
        except FencedError as err:  # another daemon leads now: nothing was committed
            self.leader = err.holder
            self._step_down(str(err))
            raise self._not_leader("this oasisd has just stopped leading") from err

    # -- high availability (controller/ha) ------------------------------------------------

    async def follow(self) -> None:
        """On a standby: apply what the leader committed since the last call, and hand
        its events to the bus (WatchEvents on a standby)."""
        if not self.leading:
            self._publish(await self.read(self._follow_sync))

    async def take_over(self, epoch: int, lock_pid: int | None) -> int:
        """Lead in ``epoch``: catch up with the store (only what is not applied yet);
        returns the events applied. Raises if that fails (still a standby then)."""
        return await self.read(lambda: self._take_over_sync(epoch, lock_pid))

    def step_down(self, why: str) -> None:
        """Stop deciding now; writes already queued are refused (:meth:`_write`)."""
        self._step_down(why)

    async def submit(
        self,
        spec: dict[str, Any],
        by: str | None = None,
        owner: str | None = None,
        wait_seconds: float | None = None,
        client: str = "",
    ) -> JobView:
        """Decide ``spec`` and commit; idempotent by job id. A spec over the size limits
        is refused before it is queued.

        ``by`` is recorded as the job's submitter; with ``owner`` set, a job id of another
        submitter is a conflict rather than a duplicate. A job not admitted now stays
        ``pending`` for ``wait_seconds`` (None: the configured default; :mod:`.pending`)."""
        self.config.limits.check_spec(spec)
        view, events = await self._run(
            lambda: self._submit_sync(spec, by, owner, wait_seconds), client
        )
        self._publish(events)
        return view

    async def quote(
        self,
        spec: dict[str, Any],
        client: str = "",
        by: str | None = None,
        owner: str | None = None,
    ) -> tuple[DecisionView, JobView | None]:
        """Decide ``spec`` without committing anything, as a submission of ``by`` would
        be decided (its job taken into ``by``'s bound estimate); with it, the stored job
        a submission would return instead (its id and spec), or ConflictError where a
        submission would conflict (``owner`` as for :meth:`submit`)."""
        self.config.limits.check_spec(spec)
        return await self._run(lambda: self._quote_sync(spec, by, owner), client, writes=False)

    async def cancel(
        self, job_id: str, client: str = "", owner: str | None = None, by: str | None = None
    ) -> tuple[JobView, int]:
        """Cancel a job: its slots from the next one on are released. With ``owner`` set,
        only a job that submitter submitted (NotFoundError for another's); ``by``, who
        asked, goes into the ``cancelled`` event."""
        view, released, events = await self._run(
            lambda: self._cancel_sync(job_id, owner, by), client
        )
        self._publish(events)
        return view, released

    def search_steps(self, spec: dict[str, Any]) -> int:
        """The bound on ``spec``'s search steps now (:func:`controller.limits.search_size`);
        0 if it does not parse (its decision will say why). From any thread: it reads only
        the configuration and the slot."""
        try:
            job = self._parse(spec, self.slot + 1)
        except SpecError:
            return 0
        return search_size(job, self.cluster, self.window).steps

    async def bounds(self, client: str | None = None) -> dict[str, Any]:
        """The price bounds in use and how they were set (:mod:`.bounds`); ``client`` as
        for :meth:`read`."""
        view_of = await self.read(self._bounds_snapshot, client)  # the state as it is now
        return await self.read_store(view_of, client=client or "")  # the view, off the thread

    async def set_bounds(
        self,
        action: str,
        pins: Any,
        by: str | None = None,
        client: str = "",
        submitter: str | None = None,
    ) -> dict[str, Any]:
        """Reset, pin or unpin the price bounds (:mod:`.bounds`); returns them after. A
        reset with ``submitter`` drops that submitter's estimate alone."""
        view, events = await self._run(
            lambda: self._set_bounds_sync(action, pins, by, submitter), client
        )
        self._publish(events)
        return view

    async def reconfigure(self, config: Config) -> None:
        """Run with ``config`` from now on (a reload, :mod:`controller.reload`: its tokens
        and limits; the rest is the running config's). Each decision reads the config
        once it begins; the cap on a client's calls inside takes the new
        ``limits.max_in_flight``. A leader records its config marks again, for its
        standbys (a failure to is logged: the next takeover records them anyway)."""
        self.config = config
        self._decisions.max_waiting = config.limits.max_in_flight
        if not self.leading:
            return
        try:
            await self._run(self._record_config_sync)
        except Exception as err:  # the store out of reach, a lease lost meanwhile
            self.log.warning("reload: the config's marks for a standby are not recorded",
                             error=str(err)[:300])  # fmt: skip

    async def jobs_left(self, names: Sequence[str]) -> dict[str, dict[str, int]]:
        """The jobs of each submitter of ``names`` that may still run: ``{name:
        {"pending": n, "admitted": n, "running": n}}``, the states without any left
        out, and the names without any too (a reload's removed tenants,
        :mod:`controller.reload`). Counted now, in the store-read pool: not the shared
        counts of :mod:`.job_counts`, which may be seconds old.

        Raises:
            StoreUnavailableError: the store could not be read.
        """
        return await self.read_store(self._jobs_left_sync, list(names))

    def _jobs_left_sync(self, names: list[str]) -> dict[str, dict[str, int]]:
        query = (
            select(JobRow.submitter, JobRow.state, func.count())
            .where(JobRow.submitter.in_(names), JobRow.state.in_(LIVE_STATES))
            .group_by(JobRow.submitter, JobRow.state)
        )
        out: dict[str, dict[str, int]] = {}
        with self.db.session() as session:
            for name, state, n in session.execute(query):
                out.setdefault(str(name), {})[state] = int(n)
        return out

    async def pending_refused(self, config: Config) -> list[str]:
        """Which pending jobs ``config``'s limits (a reload's, applied) refuse, so the next
        slot boundary expires them: one line per submitter (:mod:`.limit_checks`); []
        if none. Read in the store-read pool, off the decision thread.

        Raises:
            StoreUnavailableError: the store could not be read.
        """
        return await self.read_store(self._pending_refused_sync, config)

    def _pending_refused_sync(self, config: Config) -> list[str]:
        with self.db.session() as session:
            return pending_refused(session, self._parse, config.limits, self.cluster, self.window)

    async def restart_problems(self, config: Config) -> list[str]:
        """Why a restart with ``config`` (a reload's file, whole) would be refused by
        this store's jobs: another slot grid, or a resource they demand gone
        (:mod:`.restart_checks`, the checks of start-up); [] if it would not. Read in
        the store-read pool, off the decision thread.

        Raises:
            StoreUnavailableError: the store could not be read.
        """
        return await self.read_store(self._restart_problems_sync, config)

    def _restart_problems_sync(self, config: Config) -> list[str]:
        if config.database_url != self.config.database_url:
            return []  # another store: its own start checks it (_restart_moves_sync warns)
        with self.db.session() as session:
            # a config without an epoch takes the store's at start, which may not be the
            # one running now (a config that set it does not rewrite the epoch row)
            epoch = config.epoch
            if config.epoch_from_store:
                stored = stored_epoch(session)
                epoch = self.slots.epoch if stored is None else stored
            found = (
                slot_grid_problem(session, config.slot_seconds, epoch),
                resources_problem(session, config.cluster.resources),
            )
        return [problem for problem in found if problem is not None]

    async def restart_moves(self, config: Config) -> list[str]:
        """Which admitted plans a restart with ``config`` (a reload's file, whole) would
        re-place, re-plan or fail, one line per reason (:mod:`.restart_moves`); [] if
        none. Read in the store-read pool, off the decision thread.

        Raises:
            StoreUnavailableError: the store could not be read.
        """
        return await self.read_store(self._restart_moves_sync, config)

    def _restart_moves_sync(self, config: Config) -> list[str]:
        first = self.slots.current_slot()
        with self.db.session() as session:
            if config.database_url != self.config.database_url:
                return store_left_behind(session, self.config.database_url, config.database_url)
            moves = restart_moves(
                session, self.cluster, config.cluster, first, first + config.window
            )
            same = config.cluster.capacities() == self.cluster.capacities()
            if config.window == self.window and same:
                return moves
            # the queue against the new servers and window (the limits' own change is
            # said at the reload that applies it, Reloader._check_pending)
            parse = functools.partial(_parsed, config)
            expiring = pending_refused(
                session, parse, config.limits, config.cluster, config.window, first + 1
            )
        return moves + [f"pending jobs it would expire: {line}" for line in expiring]

    async def cordon(
        self,
        server: str,
        reason: str = "",
        by: str | None = None,
        client: str = "",
        dry_run: bool = False,
        force: bool = False,
        until: int | None = None,
        start: int | None = None,
        more: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Take ``server`` (and the servers ``more``, together) out of service from the
        next slot on, or from slot ``start`` if later, up to slot ``until`` (exclusive) if
        given (:mod:`.cordons`); with ``dry_run``, only say what would move."""
        view, events = await self._run(
            lambda: self._cordon_sync(server, reason, by, dry_run, force, until, start, more),
            client,
        )
        self._publish(events)
        return view

    async def uncordon(
        self, server: str, by: str | None = None, client: str = ""
    ) -> dict[str, Any]:
        """Put a cordoned ``server`` back in service from the next slot on."""
        view, events = await self._run(lambda: self._uncordon_sync(server, by), client)
        self._publish(events)
        return view

    async def tick(self) -> None:
        """Advance to the current slot, if it changed: window and job states. First, a
        ledger a failed commit left stale, or one the store was rewound under
        (:mod:`.rewind`), is rebuilt (:meth:`_rebuild_if_stale`)."""
        if not self.leading or self._draining:
            return
        if not self._stale:
            await asyncio.to_thread(self._check_rewound)
        await self._rebuild_if_stale()
        if self.slots.current_slot() == self._ticked_slot:
            return
        await self._move_jobs()
        if self.config.keep_days > 0:
            await self.prune()

    def _check_rewound(self) -> None:
        """A leader's look for a store rewound under its ledger (:mod:`.rewind`): its
        newest event older than the last this daemon committed or applied."""
        seen = self._seen_event  # read first: a commit meanwhile only adds newer events
        with self.db.session() as session:
            self._note_rewound(rewound(session, seen))

    async def _rebuild_if_stale(self) -> None:
        """Rebuild the ledger if a failed commit left it holding decisions the store may
        not, once the store's last answer was fine, at most every
        :data:`STALE_REBUILD_SECONDS`. Reads (utilisation, prices, the servers' use) are
        served from the ledger: in the PostgreSQL audit they showed the decisions a
        revoked privilege or a read-only database refused, as if admitted, until the
        next submission or slot boundary rebuilt it (StoreUnavailableError if the store
        fails meanwhile: the periodic event says so once)."""
        now = time.monotonic()
        if not self._stale or self.db.down_reason or now < self._stale_rebuild_at:
            return
        self._stale_rebuild_at = now + STALE_REBUILD_SECONDS
        with contextlib.suppress(NotLeaderError):  # fenced out meanwhile: said by the step
            await self._run(_no_step)  # the step rebuilds a stale ledger first (_in_step)

    async def _move_jobs(self) -> None:
        """The slot tick's steps (:meth:`~.lifecycle.Lifecycle._tick_sync`), a batch of
        jobs each, other calls going in between, their events published as they go."""
        cursor: tuple[int, int] | None = (-1, 0)
        while cursor is not None:
            events, cursor = await self._run(functools.partial(self._tick_sync, cursor))
            self._publish(events)

    async def prune(self) -> int:
        """Delete the finished jobs past ``daemon.keep_days`` (:mod:`.retention`), a
        bounded step at a time in the decision thread; returns how many."""
        deleted = 0
        after: int | None = 0
        while after is not None:
            batch, after = await self._run(functools.partial(self._prune_sync, after=after))
            deleted += len(batch)
        for _step in range(PRUNE_SERVER_STEPS):  # the rest at the next boundary
            if await self._run(self._prune_servers_sync) < PRUNE_BATCH:
                break
        return deleted

    async def read_store(self, fn: Callable[..., _T], *args: Any, client: str = "") -> _T:
        """``fn(*args)`` in the store-read pool (``READ_THREADS`` threads, the caller's
        context with it): the API's and the console's reads share it. A named ``client``
        has at most :data:`READS_PER_CLIENT` reads in the pool at once; its others wait
        their turn here, so one client's backlog of costly reads (pages of 60,000
        allocations, 0.6 s each) delays its own reads, not every tenant's."""
        run = functools.partial(contextvars.copy_context().run, fn, *args)
        loop = asyncio.get_running_loop()
        if not client:
            return await loop.run_in_executor(self._reads, run)
        turn = self._read_turns.get(client)
        if turn is None:
            turn = self._read_turns[client] = ReadTurns(READS_PER_CLIENT)
        turn.users += 1
        try:
            async with turn.semaphore:
                return await loop.run_in_executor(self._reads, run)
        finally:
            turn.users -= 1
            if not turn.users:
                del self._read_turns[client]

    async def get(self, job_id: str, owner: str | None = None, client: str = "") -> JobView:
        """One job; with ``owner`` set, only if that submitter submitted it (``client``:
        whose read turn it takes, :meth:`read_store`)."""
        return await self.read_store(self._get_sync, job_id, owner, client=client)

    async def list_jobs(
        self,
        states: Sequence[str],
        page: int,
        after: int = 0,
        owner: str | None = None,
        budget: int | None = None,
        client: str = "",
        match: ColumnElement[bool] | None = None,
        allocations: bool = True,
    ) -> tuple[list[JobView], bool]:
        """Up to ``page`` jobs after sequence ``after``, in decision order, and whether
        more follow; with ``owner`` set, only that submitter's; with ``budget`` (bytes),
        ending at the job whose allocations reach it; ``match`` and ``allocations``: see
        :meth:`~.reads.ReadViews._list_sync`."""
        args = (list(states), page, after, owner, budget, match, allocations)
        return await self.read_store(self._list_sync, *args, client=client)

    async def stored_events(
        self, after: int, limit: int | None = None, newest: bool = False
    ) -> list[Event]:
        """Stored events after sequence ``after``: all, the first ``limit``, or with
        ``newest`` the last ``limit`` (:meth:`~.reads.ReadViews._events_sync`)."""
        return await self.read_store(self._events_sync, after, limit, newest)

    async def own_events(self, owner: str, after: int, limit: int, client: str = "") -> list[Event]:
        """The newest ``limit`` stored events after sequence ``after`` of submitter
        ``owner``'s jobs, in ``client``'s read turns
        (:meth:`~.reads.ReadViews._own_events_sync`)."""
        return await self.read_store(self._own_events_sync, owner, after, limit, client=client)

    def close(self) -> None:
        self._decisions.shutdown()
        self._reads.shutdown(wait=False, cancel_futures=True)
        self._writer.close()
        self._ids.close()
        w = self._writer
        if w.batches:
            self.log.info("group commit", batches=w.batches, decisions=w.committed,
                          mean_batch=round(w.committed / w.batches, 2), largest=w.largest,
                          commit_ms_mean=round(1000 * w.commit_seconds / w.batches, 3))  # fmt: skip
        self.db.dispose()

    def _publish(self, events: list[Event]) -> None:
        for event in events:
            self.bus.publish(event)
