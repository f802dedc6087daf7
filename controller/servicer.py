"""gRPC servicers: unpack the request, call the controller, build the response.

Domain errors map to precise status codes; anything else is a bug and becomes INTERNAL
(:mod:`controller.statuses`: bounded messages, every bad field). A submitted spec is
prepared at this edge (:mod:`controller.jobspec`): read from JSON, given an id if it has
none, and its times resolved to slots; the decision refuses it if it can be worth nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from controller.admission import (
    AdmissionController,
    ConflictError,
    DrainingError,
    NotFoundError,
    PreconditionError,
    QueueFullError,
)
from controller.admission.price_pages import price_page, too_many_prices
from controller.admission.views import page_after
from controller.auth import REVOKE_CHECK_SECONDS, Caller, Role, current_caller, holds
from controller.convert import (
    SERVER_KINDS,
    STATE_OF,
    bounds_to_proto,
    decision_to_proto,
    event_to_proto,
    job_to_proto,
    progress_to_proto,
    spec_from_proto,
)
from controller.errors import (
    STORE_UNAVAILABLE,
    TENANT_UNAVAILABLE,
    BusyError,
    NotLeaderError,
    StoredBudgetError,
)
from controller.job_keys import as_named as _as_named
from controller.job_keys import key_for, key_of, shown, shown_view
from controller.jobspec import prepare
from controller.limits import RateLimiter
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.statuses import abort
from controller.store import StoreUnavailableError
from controller.store_trouble import store_trouble
from controller.tls import MAX_RESPONSE_BYTES
from pricing.errors import SpecError

__all__ = ["AdmissionServicer", "ClusterServicer", "HighAvailabilityServicer"]

_T = TypeVar("_T")

_WATCH_PAGE = 1000
"""Stored events WatchEvents reads from the store at a time."""

_CODES: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (SpecError, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (ConflictError, grpc.StatusCode.ALREADY_EXISTS),
    (PreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    (StoreUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (DrainingError, grpc.StatusCode.UNAVAILABLE),
    (NotLeaderError, grpc.StatusCode.UNAVAILABLE),  # and the leader in trailing metadata
    (QueueFullError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (StoredBudgetError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (BusyError, grpc.StatusCode.RESOURCE_EXHAUSTED),
)


async def _guard(context: grpc.aio.ServicerContext, call: Awaitable[_T]) -> _T:
    try:
        return await call
    except Exception as err:
        code = next((c for kind, c in _CODES if isinstance(err, kind)), None)
        if isinstance(err, StoreUnavailableError):
            if current_caller().role is not Role.OPERATOR:
                err = StoreUnavailableError(TENANT_UNAVAILABLE)
            elif not str(err).startswith(STORE_UNAVAILABLE):
                # an operator reads the reason, said to be the store's: psycopg's
                # "connection refused" read as the daemon's own to the client, which told
                # the operator to check that oasisd runs (observability audit)
                err = StoreUnavailableError(f"{STORE_UNAVAILABLE}: {err}")
        await abort(context, code, err)


async def _check_after(c: AdmissionController, after: int) -> None:
    """SpecError for a ``WatchEvents`` ``after_sequence`` past the newest stored event:
    every live event, numbered below it, was skipped, so ``oasis watch --from 99999`` (a
    number mistyped, or a store restored from a backup) showed nothing, ever, unsaid."""
    if after <= 0 or await c.stored_events(after - 1, limit=1):
        return  # event ``after`` or a later one is stored (the newest is never deleted)
    newest = await c.stored_events(0, limit=1, newest=True)
    top = newest[0].sequence if newest else 0
    raise SpecError.one("after_sequence", (
        f"event #{after} is past the newest one, #{top}: no event after it would be shown "
        f"until the log reaches it; give at most {top}, or none for new events only"))  # fmt: skip


def _key_of(spec: Any, caller: Caller) -> str:
    """The key a submission of ``spec`` by ``caller`` is stored under (for messages)."""
    job_id = spec.get("id") if isinstance(spec, dict) else None
    return key_of(job_id, caller.submitter) if isinstance(job_id, str) else ""


async def _key(caller: Caller, named: str) -> str:
    """The key of the job ``caller`` names ``named`` (:func:`controller.job_keys.key_for`)."""
    return key_for(caller, named)


async def _after(page_token: str) -> int:
    """The sequence a ``page_token`` continues after (0: from the start)."""
    if not page_token:
        return 0
    if not (page_token.isascii() and page_token.isdigit() and len(page_token) <= 18):
        raise SpecError.one("page_token", "not a token this daemon gave (next_page_token)")
    return int(page_token)


async def _pins(request: pb.SetBoundsRequest) -> dict[str, Any]:
    """A SetBounds request's pins in the form :mod:`controller.admission.bounds` takes:
    to pin, ``{kind: {resource: {"U": x, "L": y}}}``; to unpin, ``{kind: [resource]}``
    (kind ``"both"`` for a pin of either kind)."""
    kinds = {
        pb.SERVER_KIND_UNSPECIFIED: ("worker", "ps"),
        **{v: (k,) for k, v in SERVER_KINDS.items()},
    }
    if request.action == "reset" and request.pins:
        raise SpecError.one("pins", "reset takes no pins (it restarts the estimate)")
    if len(request.pins) > 1000:
        raise SpecError.one("pins", f"at most 1000 pins, got {len(request.pins)}")
    if request.action == "unpin":
        names: dict[str, list[str]] = {}
        for i, pin in enumerate(request.pins):
            if pin.kind not in kinds:
                raise SpecError.one(f"pins[{i}].kind", f"unknown kind {pin.kind}")
            if pin.HasField("upper") or pin.HasField("lower"):
                raise SpecError.one(f"pins[{i}]", "unpin takes resources, not values")
            kind = "both" if pin.kind == pb.SERVER_KIND_UNSPECIFIED else kinds[pin.kind][0]
            names.setdefault(kind, []).append(pin.resource)
        return names
    table: dict[str, dict[str, dict[str, float]]] = {}
    for i, pin in enumerate(request.pins):
        if pin.kind not in kinds:
            raise SpecError.one(f"pins[{i}].kind", f"unknown kind {pin.kind}")
        sides = {"U": pin.upper} if pin.HasField("upper") else {}
        if pin.HasField("lower"):
            sides["L"] = pin.lower
        if not sides:
            raise SpecError.one(f"pins[{i}]", f"{pin.resource!r}: give upper and/or lower")
        for kind in kinds[pin.kind]:
            table.setdefault(kind, {}).setdefault(pin.resource, {}).update(sides)
    return table


class AdmissionServicer(pb_grpc.AdmissionServicer):
    """The Admission service; ``limiter``, the per-client rate limit (None: off), is
    charged each search's cost (:meth:`controller.limits.Limits.search_tokens`)."""

    def __init__(self, controller: AdmissionController, limiter: RateLimiter | None = None) -> None:
        self.c = controller
        self.limiter = limiter

    async def _charge(self, spec: dict[str, Any], client: str) -> None:
        """Charge ``client``'s rate for the search ``spec`` asks for: a spec over a limit
        is refused here (INVALID_ARGUMENT, through :func:`_guard` like the decision's)."""
        if self.limiter is not None and client:
            self.c.config.limits.check_spec(spec)  # bounded before it is parsed
            steps = self.c.search_steps(spec)
            self.limiter.charge(client, self.c.config.limits.search_tokens(steps))

    def _charge_bytes(self, client: str, nbytes: int) -> None:
        """Charge ``client``'s rate for ``nbytes`` past the first
        :data:`~controller.limits.BYTES_PER_TOKEN`, a token each as many more."""
        if self.limiter is not None and client:
            self.limiter.charge_bytes(client, nbytes)

    def _charge_answer(self, caller: Caller, nbytes: int) -> None:
        """Charge a submitter's rate for an answer of ``nbytes`` (:meth:`_charge_bytes`):
        building a page of 60,000 allocations takes 0.6 s of the daemon's CPU, and at one
        token a call, 10 such pages a second took a core from every tenant. Every answer
        that holds a job is charged, whichever call returns it: a retried submission
        (the first answer again), a quote of a stored job (``existing``) and a retried
        cancel (the plan up to the cancel) returned what ``GetJob`` charges for at one
        token a call. Operators (and callers without tokens) read uncharged."""
        if caller.owner is not None:
            self._charge_bytes(caller.client, nbytes)

    async def _spec(self, msg: pb.JobSpec, client: str) -> dict[str, Any]:
        """The spec of a submission or quote, prepared (see the module docstring). Its
        worth is checked by the decision (:func:`controller.jobspec.check_job_worth`, on
        the job it parses anyway), after a retry of a stored job got its first decision:
        at a later arrival a deadline may have passed. Its size is checked first, as sent
        (before its JSON is read), and ``client`` charged for its bytes past the first
        :data:`~controller.limits.BYTES_PER_TOKEN` (one token each as many more)."""
        table = msg.utility.table.values if msg.utility.WhichOneof("kind") == "table" else ()
        sent = msg.ByteSize()
        self.c.config.limits.check_sent(sent, len(table))
        self._charge_bytes(client, sent)
        return prepare(spec_from_proto(msg), self.c.slots.times)

    async def SubmitJob(
        self, request: pb.SubmitJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.SubmitJobResponse:
        caller = current_caller()
        spec = await _guard(context, self._spec(request.job, caller.client))
        await _guard(context, self._charge(spec, caller.client))
        wait = request.wait_seconds if request.HasField("wait_seconds") else None
        submit = self.c.submit(spec, caller.submitter, caller.owner, wait, caller.turn)
        view = await _guard(context, _as_named(caller, _key_of(spec, caller), submit))
        answer = pb.SubmitJobResponse(job=self._job(view, caller), duplicate=view.duplicate)
        self._charge_answer(caller, answer.ByteSize())
        return answer

    async def QuoteJob(
        self, request: pb.QuoteJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.QuoteJobResponse:
        caller = current_caller()
        spec = await _guard(context, self._spec(request.job, caller.client))
        await _guard(context, self._charge(spec, caller.client))
        quote = self.c.quote(spec, caller.turn, caller.submitter, caller.owner)
        view, existing = await _guard(context, _as_named(caller, _key_of(spec, caller), quote))
        out = pb.QuoteJobResponse(decision=decision_to_proto(view))
        if existing is not None:
            out.existing.CopyFrom(self._job(existing, caller))
        self._charge_answer(caller, out.ByteSize())
        return out

    def _job(self, view: Any, caller: Caller) -> pb.Job:
        """A job as ``caller`` sees it (a submitter: by its own id)."""
        return job_to_proto(shown_view(caller, view), self.c.slots.times)

    async def GetJob(
        self, request: pb.GetJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetJobResponse:
        caller = current_caller()
        key = await _guard(context, _key(caller, request.id))
        got = self.c.get(key, caller.owner, caller.turn)
        view = await _guard(context, _as_named(caller, key, got))
        answer = pb.GetJobResponse(job=self._job(view, caller))
        self._charge_answer(caller, answer.ByteSize())
        return answer

    async def ListJobs(
        self, request: pb.ListJobsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListJobsResponse:
        states = []
        # each state once: 70,000 repeats made a query of 70,000 parameters (on
        # PostgreSQL past psycopg's 65,535, which read as the store being down for all)
        for s in dict.fromkeys(request.states):
            if s not in STATE_OF:
                known = ", ".join(f"{n} ({STATE_OF[n]})" for n in sorted(STATE_OF))
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"states: unknown state {s} (known: {known})"
                )
            states.append(STATE_OF[s])
        limits = self.c.config.limits
        page = min(request.page_size or limits.max_page_jobs, limits.max_page_jobs)
        if request.limit > 0:
            page = min(page, request.limit)
        if request.page_size < 0 or request.limit < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "page_size, limit: must be >= 0")
        after = await _guard(context, _after(request.page_token))
        caller = current_caller()
        listed = self.c.list_jobs(
            states, page, after, caller.owner, limits.max_page_bytes, caller.turn
        )
        views, more = await _guard(context, listed)
        jobs: list[pb.Job] = []
        size = 0
        for view in views:  # a page ends at the job that reaches limits.max_page_bytes
            jobs.append(self._job(view, caller))
            size += jobs[-1].ByteSize()
            if size >= limits.max_page_bytes:
                break
        more = more or len(jobs) < len(views)
        resume = page_after(views[len(jobs) - 1]) if more and jobs else None
        token = "" if resume is None else str(resume)
        self._charge_answer(caller, size)
        return pb.ListJobsResponse(jobs=jobs, next_page_token=token)

    async def CancelJob(
        self, request: pb.CancelJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelJobResponse:
        caller = current_caller()  # a submitter cancels its own jobs only
        key = await _guard(context, _key(caller, request.id))
        cancel = self.c.cancel(key, caller.turn, caller.owner, caller.name or None)
        view, released = await _guard(context, _as_named(caller, key, cancel))
        answer = pb.CancelJobResponse(job=self._job(view, caller), released_worker_slots=released)
        self._charge_answer(caller, answer.ByteSize())
        return answer

    async def GetProgress(
        self, request: pb.GetProgressRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetProgressResponse:
        if self.c.execution is None:
            reason = "no execution plane: the daemon has no [mqtt] broker configured"
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, reason)
            raise AssertionError  # unreachable: abort raises
        caller = current_caller()
        key = await _guard(context, _key(caller, request.id))
        if caller.owner is not None:  # a submitter: its own jobs only
            got = self.c.get(key, caller.owner, caller.turn)
            await _guard(context, _as_named(caller, key, got))
        viewed = self.c.execution.view(key, caller.turn)
        view = await _guard(context, _as_named(caller, key, viewed))
        progress = progress_to_proto(view)
        progress.id = shown(caller, view.job_id)
        return pb.GetProgressResponse(progress=progress)

    async def WatchEvents(
        self, request: pb.WatchEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Event]:
        caller = current_caller()
        await _guard(context, _check_after(self.c, request.after_sequence))
        queue = self.c.bus.subscribe()
        try:
            last = request.after_sequence
            while last >= 0:  # the stored ones, a page at a time: the log may be long
                page = await _guard(context, self.c.stored_events(last, limit=_WATCH_PAGE))
                for event in page:
                    last = event.sequence
                    yield event_to_proto(event)
                if len(page) < _WATCH_PAGE or not holds(self.c.config.tokens, caller):
                    break
            # until a reload (SIGHUP) revokes the token the stream was opened with
            while holds(self.c.config.tokens, caller):
                try:  # not wait_for: on 3.11 it drops a cancel that comes with an event
                    async with asyncio.timeout(REVOKE_CHECK_SECONDS):
                        event = await queue.get()
                except TimeoutError:
                    continue
                if event.sequence > last:
                    last = event.sequence
                    yield event_to_proto(event)
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"token of {caller.name} revoked: oasisd read its tokens file again "
                "(a reload) and no longer finds it",
            )
        finally:
            self.c.bus.unsubscribe(queue)


class ClusterServicer(pb_grpc.ClusterServicer):
    def __init__(self, controller: AdmissionController) -> None:
        self.c = controller

    async def ListServers(
        self, request: pb.ListServersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListServersResponse:
        cluster = self.c.cluster
        turn = current_caller().turn
        use, states, cordons = await _guard(
            context,
            self.c.read(
                lambda: (
                    self.c.current_use(request.slot),
                    self.c.server_states(),
                    self.c.cordons(),
                ),
                turn,
            ),
        )
        out = pb.ListServersResponse(current_slot=self.c.slot, resources=cluster.resources)
        execution = self.c.execution  # None: no [mqtt], or not leading (no agents watched)
        ages = execution.agent_ages() if execution is not None else {}
        if execution is not None:
            out.agent_heartbeat_timeout_seconds = execution.mqtt.heartbeat_timeout
        for kind, _, name, caps in cluster.servers():
            server = out.servers.add(
                name=name,
                kind=SERVER_KINDS[kind],
                capacity=dict(zip(cluster.resources, caps.tolist(), strict=True)),
                used=use[name],
                state=states[name],
            )
            cordon = cordons.get(name)
            if cordon is not None:
                server.cordoned_from_slot = cordon.from_slot
                server.cordon_reason = cordon.reason
                server.cordoned_by = cordon.by
                if cordon.until is not None:
                    server.cordoned_until_slot = cordon.until
            if name in ages:
                server.agent_heard_seconds_ago = ages[name]
        return out

    async def GetPrices(
        self, request: pb.GetPricesRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetPricesResponse:
        if request.page_size < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "page_size: must be >= 0")
        start = await _guard(context, _after(request.page_token))
        count = None
        if request.page_size and not request.server:
            count = price_page(
                request.page_size,
                min(request.slots or 12, self.c.window + 1),
                len(self.c.cluster.resources),
                self.c.config.limits.max_page_bytes,
            )
        read = self.c.read(
            lambda: self.c.prices(request.first_slot, request.slots, request.server, start, count),
            current_caller().turn,
        )
        first, blocks = await _guard(context, read)
        size = sum(block.answer_bytes() for block in blocks)
        if count is None and size > MAX_RESPONSE_BYTES:  # gRPC would refuse it, unsaid why
            servers = sum(len(block.names) for block in blocks)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, too_many_prices(servers, size))
        out = pb.GetPricesResponse(first_slot=first)
        rows = (row for block in blocks for row in block.rows(self.c.cluster.resources))
        for server, kind, resource, prices in rows:
            out.prices.add(
                server=server,
                kind=SERVER_KINDS[kind],
                resource=resource,
                prices=prices,
            )
        if request.server and not out.prices:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no server {request.server!r}")
        listed = start + sum(len(block.names) for block in blocks)
        if count is not None and listed < len(self.c.cluster.listing):
            out.next_page_token = str(listed)
        return out

    async def GetUtilisation(
        self, request: pb.GetUtilisationRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetUtilisationResponse:
        read = self.c.read(
            lambda: self.c.utilisation(request.first_slot, request.slots), current_caller().turn
        )
        first, rows = await _guard(context, read)
        out = pb.GetUtilisationResponse(first_slot=first)
        for resource, kind, share in rows:
            out.use.add(
                resource=resource,
                kind=SERVER_KINDS[kind],
                share=share,
            )
        return out

    async def GetBounds(
        self, request: pb.GetBoundsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetBoundsResponse:
        turn = current_caller().turn
        view = await _guard(context, self.c.bounds(turn))
        # a message of every submitter's bounds (820 KB at 2,000 submitters, 26 ms to
        # build): built off the event loop, which every call waits on
        return await self.c.read_store(bounds_to_proto, view, client=turn)

    async def SetBounds(
        self, request: pb.SetBoundsRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetBoundsResponse:
        caller = current_caller()
        pins = await _guard(context, _pins(request))
        submitter = request.submitter if request.HasField("submitter") else None
        change = self.c.set_bounds(request.action, pins, caller.submitter, caller.turn, submitter)
        return pb.SetBoundsResponse(bounds=bounds_to_proto(await _guard(context, change)))

    async def CordonServer(
        self, request: pb.CordonServerRequest, context: grpc.aio.ServicerContext
    ) -> pb.CordonServerResponse:
        caller = current_caller()
        start = request.from_slot if request.from_slot > 0 else None
        change = self.c.cordon(request.server, request.reason, caller.submitter, caller.turn,
                               dry_run=request.dry_run, force=request.force,
                               until=request.until_slot or None, start=start,
                               more=list(request.more_servers))  # fmt: skip
        view = await _guard(context, change)
        return pb.CordonServerResponse(
            server=view["server"],
            from_slot=view["from_slot"],
            until_slot=view["until"] or 0,
            moved=[pb.MovedJob(id=j, how=how) for j, how in view["moved"].items()],
            already=view["already"],
            dry_run=view["dry_run"],
            servers=view["servers"],
            already_servers=view["already_servers"],
        )

    async def UncordonServer(
        self, request: pb.UncordonServerRequest, context: grpc.aio.ServicerContext
    ) -> pb.UncordonServerResponse:
        caller = current_caller()
        view = await _guard(context, self.c.uncordon(request.server, caller.submitter, caller.turn))
        return pb.UncordonServerResponse(
            server=view["server"],
            from_slot=view["from_slot"] or 0,
            already=view["already"],
            failed=view["failed"],
            planned=view["planned"],
        )

    async def GetClusterInfo(
        self, request: pb.GetClusterInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetClusterInfoResponse:
        slots = self.c.slots
        return pb.GetClusterInfoResponse(
            slot_seconds=slots.slot_seconds,
            epoch=slots.epoch,
            window=self.c.window,
            # the daemon's slot never moves back: after the clock was set back, the
            # clock's slot is behind it, and clients counting from that (a cordon's
            # --for) named slots the daemon had passed (the time audit)
            current_slot=max(slots.current_slot(), self.c.slot),
            now=slots.clock.now(),
            resources=self.c.cluster.resources,
        )


class HighAvailabilityServicer(pb_grpc.HighAvailabilityServicer):
    """This node's role, epoch and lease age (``oasis status``; controller/ha)."""

    def __init__(self, controller: AdmissionController) -> None:
        self.c = controller
        # whether the event broker is connected; None: no broker (set once the plane is)
        self.broker: Callable[[], bool | None] = lambda: None

    async def GetLeadership(
        self, request: pb.GetLeadershipRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetLeadershipResponse:
        ha = self.c.ha_status()
        # the store's state as its watch last found it (a probe every second): the call
        # answers from memory, as leader discovery needs while a store hangs (review)
        store_up = not self.c.db.down_reason
        broker = self.broker()
        trouble = store_trouble(self.c.db, current_caller())
        return pb.GetLeadershipResponse(
            store_up=store_up,
            broker="none" if broker is None else ("connected" if broker else "disconnected"),
            draining=self.c.draining,
            enabled=self.c.config.ha is not None,
            role=ha.role,
            epoch=ha.epoch,
            lease_age_seconds=ha.lease_age,
            leader=ha.leader,
            advertise=self.c.advertise,
            applied_sequence=ha.applied,
            # names servers and counts plans: an operator's (ListServers is theirs)
            cannot_lead=self.c.cannot_lead
            if not self.c.leading and current_caller().role is Role.OPERATOR
            else "",
            writes_refused=trouble.refused,
            writes_locked=trouble.locked,
            store_down=trouble.down,
        )
