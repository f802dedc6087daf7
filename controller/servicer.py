"""gRPC servicers: unpack the request, call the controller, build the response.

Domain errors map to precise status codes; anything else is a bug and becomes INTERNAL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import grpc
import structlog

from controller.admission import (
    STATES,
    AdmissionController,
    ConflictError,
    NotFoundError,
    PreconditionError,
)
from controller.convert import (
    SERVER_KINDS,
    STATE_OF,
    decision_to_proto,
    event_to_proto,
    job_to_proto,
    spec_from_proto,
)
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.store import StoreUnavailableError
from pricing import SpecError

__all__ = ["AdmissionServicer", "ClusterServicer"]

_T = TypeVar("_T")
log = structlog.get_logger("oasisd")

_CODES: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (SpecError, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (ConflictError, grpc.StatusCode.ALREADY_EXISTS),
    (PreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    (StoreUnavailableError, grpc.StatusCode.UNAVAILABLE),
)


async def _guard(context: grpc.aio.ServicerContext, call: Awaitable[_T]) -> _T:
    try:
        return await call
    except Exception as err:
        for kind, code in _CODES:
            if isinstance(err, kind):
                await context.abort(code, str(err))
        log.exception("internal error")
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(err).__name__}")
        raise  # unreachable: abort raises


class AdmissionServicer(pb_grpc.AdmissionServicer):
    def __init__(self, controller: AdmissionController) -> None:
        self.c = controller

    async def SubmitJob(
        self, request: pb.SubmitJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.SubmitJobResponse:
        view = await _guard(context, self.c.submit(spec_from_proto(request.job)))
        return pb.SubmitJobResponse(job=job_to_proto(view), duplicate=view.duplicate)

    async def QuoteJob(
        self, request: pb.QuoteJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.QuoteJobResponse:
        view = await _guard(context, self.c.quote(spec_from_proto(request.job)))
        return pb.QuoteJobResponse(decision=decision_to_proto(view))

    async def GetJob(
        self, request: pb.GetJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetJobResponse:
        view = await _guard(context, self.c.get(request.id))
        return pb.GetJobResponse(job=job_to_proto(view))

    async def ListJobs(
        self, request: pb.ListJobsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListJobsResponse:
        states = []
        for s in request.states:
            if s not in STATE_OF:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"states: unknown state {s} ({STATES})"
                )
            states.append(STATE_OF[s])
        views = await _guard(context, self.c.list_jobs(states, request.limit))
        return pb.ListJobsResponse(jobs=[job_to_proto(v) for v in views])

    async def CancelJob(
        self, request: pb.CancelJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelJobResponse:
        view, released = await _guard(context, self.c.cancel(request.id))
        return pb.CancelJobResponse(job=job_to_proto(view), released_worker_slots=released)

    async def WatchEvents(
        self, request: pb.WatchEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Event]:
        queue = self.c.bus.subscribe()
        try:
            last = request.after_sequence
            if last >= 0:
                for event in await _guard(context, self.c.stored_events(last)):
                    last = event.sequence
                    yield event_to_proto(event)
            while True:
                event = await queue.get()
                if event.sequence > last:
                    last = event.sequence
                    yield event_to_proto(event)
        finally:
            self.c.bus.unsubscribe(queue)


class ClusterServicer(pb_grpc.ClusterServicer):
    def __init__(self, controller: AdmissionController) -> None:
        self.c = controller

    async def ListServers(
        self, request: pb.ListServersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListServersResponse:
        cluster = self.c.cluster
        use = self.c.current_use()
        out = pb.ListServersResponse(current_slot=self.c.slot)
        for kind, _, name, caps in cluster.servers():
            out.servers.add(
                name=name,
                kind=SERVER_KINDS[kind],
                capacity=dict(zip(cluster.resources, caps.tolist(), strict=True)),
                used=use[name],
            )
        return out

    async def GetPrices(
        self, request: pb.GetPricesRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetPricesResponse:
        first, rows = self.c.prices(request.first_slot, request.slots)
        out = pb.GetPricesResponse(first_slot=first)
        for server, kind, resource, prices in rows:
            if request.server and server != request.server:
                continue
            out.prices.add(
                server=server,
                kind=SERVER_KINDS[kind],
                resource=resource,
                prices=prices,
            )
        if request.server and not out.prices:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no server {request.server!r}")
        return out

    async def GetUtilisation(
        self, request: pb.GetUtilisationRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetUtilisationResponse:
        first, rows = self.c.utilisation(request.first_slot, request.slots)
        out = pb.GetUtilisationResponse(first_slot=first)
        for resource, kind, share in rows:
            out.use.add(
                resource=resource,
                kind=SERVER_KINDS[kind],
                share=share,
            )
        return out
