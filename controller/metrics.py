"""Prometheus metrics of the daemon, served at ``http://<[metrics] listen>/metrics``.

Counted as requests pass (a gRPC interceptor on SubmitJob and QuoteJob):

- ``oasis_decisions_total{kind, outcome}``: ``kind`` is ``submit`` or ``quote``;
  ``outcome`` is ``admitted``, ``rejected``, ``pending`` (not admitted yet, waiting: its
  later admission or expiry shows in ``oasis_jobs``), ``duplicate`` (a retried submit answered with
  the first decision), ``invalid``, ``conflict``, ``unavailable`` (store down or
  draining), ``unauthenticated`` (no or an unknown token), ``denied`` (outside the
  caller's role), ``rate_limited`` (over the rate, or a full pending queue),
  ``cancelled`` (the client gave up) or ``error``.
- ``oasis_decision_seconds{kind}``: histogram of the time from the request reaching the
  daemon to its answer (waiting for earlier decisions, the search, the commit).
- ``oasis_decision_search_seconds{kind}``: histogram of the best-schedule search alone
  (the ``decision_ms`` of the answer; as in ``bench/decision_latency.py``).
- ``oasis_admitted_payoff_total``: sum of the payoffs of the jobs this process admitted.

Read at each scrape:

- ``oasis_store_up``: 1 if the store answered ``SELECT 1``, else 0;
  ``oasis_store_writes_refused``: 1 while it refuses the daemon's writes
  (``Database.refusing``: the Admission service's health is NOT_SERVING), else 0;
  ``oasis_store_writes_locked``: 1 while the last commit failed waiting for another
  connection's lock (``Database.writes_locked``: the store answers reads), else 0.
- ``oasis_jobs{state}``: stored jobs per state (``pending``, ``admitted``, ``running``,
  ``completed``, ``cancelled``, ``rejected``, ``expired``, ``failed``);
  ``oasis_payoff{state}``: the sum of their payoffs as decided, for every state of an
  admitted job (not ``pending``, ``rejected`` or ``expired``: never earned; the
  algorithm's objective is the sum over ``admitted``, ``running`` and ``completed``).
  Both are counted in the store at most every ``max(2 s, 50 x the count's duration)``
  and shared with the console (:mod:`controller.admission.job_counts`: a long history
  costs a bounded share of a core, not a full count per scrape);
  ``oasis_jobs_counted_timestamp_seconds`` is the Unix time of their count, and
  ``oasis_jobs_count_seconds`` how long it took.
- ``oasis_slot``, ``oasis_draining``.
- ``oasis_commit_batches_total`` and ``oasis_commit_decisions_total``: the group-commit
  writer's committed batches and the decisions in them (their ratio is the mean batch);
  ``oasis_commit_seconds_total``: its time inside those commits;
  ``oasis_commit_queued``: decisions decided and not yet committed;
  ``oasis_commit_process_up``: 1 while its commit process runs (0: the writer thread
  commits itself, after a child could not be started), and
  ``oasis_commit_process_starts_total``: children started (one at start, one more for
  each that ended or was killed); both absent for an in-memory store.
- ``oasis_utilisation{kind, resource}``: share of the capacity in service of that kind of
  server (``worker``, ``ps``) in use in the current slot, 0..1; ``oasis_utilisation_planned``:
  the mean share over the window ahead (current slot included);
  ``oasis_capacity_out_of_service{kind, resource}``: the share of the capacity on failed
  or cordoned servers in the current slot (not counted as in use).
- ``oasis_unit_price_quantile{kind, resource, quantile}``: quantiles of the unit price in
  the current slot over the servers of a kind; ``oasis_unit_price_peak{kind, resource}``:
  the highest over all servers and the window; ``oasis_unit_price{server, kind,
  resource}``: each server's in the current slot, while the cluster has at most
  ``metrics.per_server_prices_up_to`` servers (:mod:`controller.price_metrics`).
- ``oasis_broker_configured`` and ``oasis_broker_up``: set by whoever owns the broker
  connection through :meth:`Metrics.set_broker`; without a broker both are 0.
- ``oasis_agent_clock_offset_seconds{server}``: its agent's clock minus the daemon's, from
  its latest heartbeat (servers of the cluster's config only; absent without a broker);
  ``oasis_agent_heartbeat_age_seconds{server}``: seconds since its agent was last heard
  (connected seconds, as the failure rule counts them; +Inf: never heard; from
  ``Execution.agent_ages``, which ListServers gives too);
  ``oasis_agents_following_no_plan`` and ``oasis_agents_behind_their_plan``: servers
  whose agent has had no plan, or has not taken its server's newest one, for 10 s
  (``Execution.following_no_plan``, ``Execution.behind_plan``).
- ``process_*``: the daemon process's memory, CPU time and open descriptors.
- ``oasis_decision_step_seconds``: how long the decision thread's running step has run
  (0 between steps); ``oasis_ledger_metrics_age_seconds``: the age of the ledger's
  metrics (slot, servers, utilisation, prices), which are served as last read while a
  step has run for over :data:`BUSY_SECONDS`.

The ledger is read in the decision thread between two decisions
(:meth:`AdmissionController.between_decisions`), so a scrape never sees half a decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler

import grpc
import numpy as np
import structlog
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    make_wsgi_app,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer

from controller.admission import AdmissionController
from controller.admission.job_counts import AGE_PER_COUNT_SECOND, MIN_AGE_SECONDS
from controller.admission.ledger_reads import SidePrices
from controller.handler_memo import HandlerMemo
from controller.price_metrics import price_families
from controller.rpc import oasis_pb2 as pb
from controller.tls import is_loopback, loopback_names

__all__ = ["MAX_CONNECTIONS", "REQUEST_SECONDS", "Metrics"]

log = structlog.get_logger("oasisd")

_ADMISSION = pb.DESCRIPTOR.services_by_name["Admission"].full_name
_DECISION_METHODS = {f"/{_ADMISSION}/SubmitJob": "submit", f"/{_ADMISSION}/QuoteJob": "quote"}
_ERROR_OUTCOMES = {
    grpc.StatusCode.INVALID_ARGUMENT: "invalid",
    grpc.StatusCode.ALREADY_EXISTS: "conflict",
    grpc.StatusCode.UNAVAILABLE: "unavailable",
    # refused by controller.auth's interceptor, which runs inside this one
    grpc.StatusCode.UNAUTHENTICATED: "unauthenticated",
    grpc.StatusCode.PERMISSION_DENIED: "denied",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "rate_limited",
    grpc.StatusCode.CANCELLED: "cancelled",
    grpc.StatusCode.DEADLINE_EXCEEDED: "cancelled",
}
# decisions take milliseconds (bench/RESULTS.md); a queue of them can take seconds
_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_SNAPSHOT_TIMEOUT = 5.0  # seconds a scrape waits for the decision thread
MAX_CONNECTIONS = 32
"""Connections ``/metrics`` holds open at once; past it a new one is answered 503 and
closed at once. The endpoint serves each connection in a thread of its own: without a
cap, connections that never finish their request (a byte a second) took a thread and a
descriptor each, and 240 of them took every descriptor of a daemon with 256, so no
tenant could open a gRPC connection (the stall audit)."""

REQUEST_SECONDS = 30.0
"""A connection of ``/metrics`` is closed this long after it was accepted, its request
read and its answer written or not (Prometheus gives up on a scrape after 10 s by
default): a client that sends its request a byte at a time, or never reads the answer,
frees its place within this."""

BUSY_SECONDS = 1.0
"""A decision-thread step running longer than this when scraped: the ledger's metrics
are the last ones read, not read again (the scrape would wait for the step)."""


class Metrics:
    """The daemon's metrics in their own registry (several daemons may share a process).

    Args:
        controller: the admission controller whose store and ledger are read at scrapes.
    """

    def __init__(self, controller: AdmissionController) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # memory and descriptors, for alerts
        self.decisions = Counter(
            "oasis_decisions",
            "Decisions answered, by kind and outcome.",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.decision_seconds = Histogram(
            "oasis_decision_seconds",
            "Seconds from a decision request reaching the daemon to its answer.",
            ["kind"],
            buckets=_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.search_seconds = Histogram(
            "oasis_decision_search_seconds",
            "Seconds of the best-schedule search of a decision.",
            ["kind"],
            buckets=_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.payoff = Counter(
            "oasis_admitted_payoff",
            "Sum of the payoffs of the jobs admitted by this process.",
            registry=self.registry,
        )
        self.broker_configured = Gauge(
            "oasis_broker_configured",
            "1 if an event broker is configured, else 0.",
            registry=self.registry,
        )
        self.broker_up = Gauge(
            "oasis_broker_up",
            "1 if the event broker is connected, else 0.",
            registry=self.registry,
        )
        self.registry.register(_ControllerCollector(controller))
        self._httpd: Any = None

    def watch_certificate(self, expires: Callable[[], float]) -> None:
        """Export the expiry of the certificate the daemon serves (``[tls]``; its
        ``notAfter``, Unix seconds, as ``expires()`` says at each scrape:
        :mod:`controller.tls_renewal`)."""
        gauge = Gauge(
            "oasis_tls_certificate_expiry_timestamp_seconds",
            "When the TLS certificate served to new connections expires (its notAfter), "
            "Unix seconds; it follows renewals of the [tls] files.",
            registry=self.registry,
        )
        gauge.set_function(expires)

    def set_broker(self, up: bool | None) -> None:
        """Broker health: None when no broker is configured, else whether it is connected."""
        self.broker_configured.set(0 if up is None else 1)
        self.broker_up.set(1 if up else 0)

    def observe(
        self, kind: str, outcome: str, seconds: float, decision: pb.Decision | None
    ) -> None:
        """Count one answered decision request; ``decision`` is the answer's, if any."""
        self.decisions.labels(kind, outcome).inc()
        self.decision_seconds.labels(kind).observe(seconds)
        if decision is not None and outcome != "duplicate":
            self.search_seconds.labels(kind).observe(decision.decision_ms / 1000.0)
            if kind == "submit" and outcome == "admitted":
                self.payoff.inc(decision.payoff)

    def interceptor(self) -> grpc.aio.ServerInterceptor:
        """A server interceptor that feeds :meth:`observe` from SubmitJob and QuoteJob."""
        return _DecisionInterceptor(self)

    def serve(self, listen: str) -> str:
        """Serve ``/metrics`` over HTTP on ``listen`` (``host:port``, port 0: any free one)
        in a background thread; returns the ``host:port`` it listens on."""
        host, _, port = listen.rpartition(":")
        try:
            self._httpd = _serve(host.strip("[]"), int(port), make_wsgi_app(self.registry))
        except OSError as err:
            raise OSError(
                f"metrics.listen: cannot listen on {listen}: {err.strerror or err}"
            ) from err
        bound = self._httpd.server_port
        if is_loopback(host.strip("[]")):
            names = loopback_names(host, bound)
            self._httpd.set_app(_loopback_names_only(self._httpd.get_app(), names))
        return f"{host}:{bound}"

    def close(self) -> None:
        """Stop the HTTP endpoint, if started."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None


class _QuietHandler(WSGIRequestHandler):
    """A request of ``/metrics``, not logged (as prometheus_client's own handler)."""

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing."""


class _MetricsServer(ThreadingWSGIServer):
    """prometheus_client's server (a thread per connection) with at most
    :data:`MAX_CONNECTIONS` connections open, each closed :data:`REQUEST_SECONDS` after it
    was accepted (its socket shut down: the thread serving it ends)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._deadlines: dict[socket.socket, float] = {}  # open connection -> its deadline
        self._lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            full = len(self._deadlines) >= MAX_CONNECTIONS
            if not full:
                self._deadlines[request] = time.monotonic() + REQUEST_SECONDS
        if full:
            _refuse(request)
            super().shutdown_request(request)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            self._deadlines.pop(request, None)
        super().shutdown_request(request)

    def service_actions(self) -> None:
        """Shut down the connections past their deadline (every poll of the server's
        loop, twice a second)."""
        now = time.monotonic()
        with self._lock:
            late = [conn for conn, deadline in self._deadlines.items() if deadline <= now]
        for conn in late:
            with contextlib.suppress(OSError):  # closed meanwhile
                conn.shutdown(socket.SHUT_RDWR)  # its thread's read or write ends


_BUSY = b"too many connections to /metrics (oasisd's metrics.MAX_CONNECTIONS); try again\n"


def _refuse(conn: socket.socket) -> None:
    """Answer 503 on ``conn`` if it can be written at once (never waits for the peer)."""
    try:
        conn.setblocking(False)
        conn.send(
            b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 5"
            b"\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY), _BUSY)
        )
    except OSError:
        pass


def _serve(host: str, port: int, app: Any) -> _MetricsServer:
    """Serve the WSGI ``app`` on ``host:port`` (IPv4 or IPv6) in a daemon thread."""
    family, _, _, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]

    class Server(_MetricsServer):
        address_family = family

    httpd = Server((address[0], port), _QuietHandler)
    httpd.set_app(app)
    threading.Thread(target=httpd.serve_forever, name="metrics", daemon=True).start()
    return httpd


def _shares(
    name: str, doc: str, rows: list[Any], value: Callable[[list[float]], float]
) -> GaugeMetricFamily:
    """A gauge by kind and resource from ``(resource, kind, shares per slot)`` rows
    (:meth:`~controller.admission.reads.ReadViews.utilisation`), ``value`` of each
    non-empty series."""
    family = GaugeMetricFamily(name, doc, labels=["kind", "resource"])
    for resource, kind, share in rows:
        if share:
            family.add_metric([kind, resource], value(share))
    return family


def _per_server(name: str, documentation: str, values: Mapping[str, float]) -> GaugeMetricFamily:
    """A gauge labelled by server, one sample per entry of ``values`` (copied first: the
    event loop changes it meanwhile), in server order."""
    gauge = GaugeMetricFamily(name, documentation, labels=["server"])
    for server, value in sorted(dict(values).items()):
        gauge.add_metric([server], value)
    return gauge


def _loopback_names_only(app: Any, names: set[str]) -> Any:
    """``app`` (WSGI) answering only requests addressed to one of ``names`` (``Host``):
    on loopback, a web page's script that renamed its site to 127.0.0.1 (DNS rebinding)
    could otherwise read the prices and job counts, as the console refuses too (421)."""
    allowed = {n.lower() for n in names}

    def guarded(environ: dict[str, Any], start_response: Any) -> Any:
        if str(environ.get("HTTP_HOST", "")).lower() not in allowed:
            start_response("421 Misdirected Request", [("Content-Type", "text/plain")])
            return [b"metrics answer to loopback names only\n"]
        return app(environ, start_response)

    return guarded


def _outcome(kind: str, response: Any) -> tuple[str, pb.Decision]:
    if kind == "submit":
        decision: pb.Decision = response.job.decision
        if response.duplicate:
            return "duplicate", decision
        if response.job.state == pb.JOB_STATE_PENDING:
            return "pending", decision
    else:
        decision = response.decision
    return ("admitted" if decision.admitted else "rejected"), decision


class _DecisionInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._memo = HandlerMemo()

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: Any
    ) -> Any:
        handler = await continuation(details)
        if handler is None or details.method not in _DECISION_METHODS:
            return handler
        return self._memo.wrapped(details.method, handler, self._observed)

    def _observed(self, method: str, handler: Any) -> Any:
        """``handler`` of a decision ``method`` with its outcome and time counted."""
        kind = _DECISION_METHODS[method]
        # unary, or served as streamed by the access interceptor (REQUEST_SECONDS)
        inner = handler.unary_unary or handler.stream_unary
        if inner is None:
            return handler
        metrics = self.metrics

        async def observed(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started = time.perf_counter()
            try:
                response = await inner(request, context)
            except asyncio.CancelledError:
                metrics.observe(kind, "cancelled", time.perf_counter() - started, None)
                raise
            except BaseException:
                outcome = _ERROR_OUTCOMES.get(context.code(), "error")
                metrics.observe(kind, outcome, time.perf_counter() - started, None)
                raise
            outcome, decision = _outcome(kind, response)
            metrics.observe(kind, outcome, time.perf_counter() - started, decision)
            return response

        if handler.unary_unary is not None:
            return handler._replace(unary_unary=observed)
        return handler._replace(stream_unary=observed)


_AGE = (
    f" Recounted at a scrape at most every max({MIN_AGE_SECONDS:g} s, {AGE_PER_COUNT_SECOND:g}"
    " x oasis_jobs_count_seconds): older by at most that."
)

SCRAPE_INTERVAL = 1.0
"""Seconds a scrape's answer is reused: scrapes closer together (the endpoint takes no
token) share one store query and one ledger snapshot, which the decision thread makes
between decisions; a flood of scrapes cannot slow the decisions by more than that."""


class _ControllerCollector:
    """Reads the store and the ledger at most once per :data:`SCRAPE_INTERVAL`."""

    def __init__(self, controller: AdmissionController) -> None:
        self.c = controller
        self._lock = threading.Lock()
        self._cached: list[Metric] = []
        self._at = -math.inf
        self._ledger_metrics: list[Metric] = []  # the last ledger section read
        self._ledger_at: float | None = None  # monotonic time it was read

    def collect(self) -> Iterable[Metric]:
        with self._lock:  # concurrent scrapes wait for the one reading
            if time.monotonic() - self._at >= SCRAPE_INTERVAL:
                self._cached = list(self._read())
                self._at = time.monotonic()
            return list(self._cached)

    def _read(self) -> Iterator[Metric]:
        yield from self._store()
        yield GaugeMetricFamily(
            "oasis_draining",
            "1 once the daemon is stopping and refuses new decisions.",
            value=float(self.c.draining),
        )
        yield from self._commits()
        if self.c.config.ha is not None:
            yield from self._ha()
        yield from self._ledger()
        yield from self._agents()

    def _agents(self) -> Iterator[Metric]:
        execution = self.c.execution
        if execution is None:  # no broker configured, or not leading
            return
        agents = execution.agents
        yield _per_server(
            "oasis_agent_clock_offset_seconds",
            "A server's agent's clock minus the daemon's, from its latest heartbeat "
            "(seconds; positive: the agent is ahead and follows each slot's plan early).",
            agents.clock_offsets,
        )
        ages = GaugeMetricFamily(
            "oasis_agent_heartbeat_age_seconds",
            "Seconds since a server's agent was last heard, counted while the daemon is "
            "connected to the broker (as the failure rule counts them); +Inf: never heard.",
            labels=["server"],
        )
        yield GaugeMetricFamily(
            "oasis_agents_following_another_store",
            "Servers whose agent's latest heartbeat follows the plans of a daemon on another "
            "store (a store replaced, or a second daemon under the same broker and prefix).",
            value=len(agents.foreign),
        )
        yield GaugeMetricFamily(
            "oasis_servers_with_two_agents",
            "Servers whose heartbeats come from two agent sessions at once (two agents for "
            "one server: both run its workers; only the first one's progress counts).",
            value=len(agents.twins),
        )
        yield GaugeMetricFamily(
            "oasis_servers_with_only_ignored_agents",
            "Servers whose only beating agent is one whose progress is ignored (the second "
            "of two that beat at once): their jobs' progress counts for nothing until it "
            "is restarted.",
            value=len(agents.ignored_alone),
        )
        yield GaugeMetricFamily(
            "oasis_agents_following_no_plan",
            "Servers whose agent beats following no plan (epoch 0) for 10 s or more while "
            "the daemon publishes plans: it received none (can its broker user read its "
            "plan's topic?); jobs planned there do not run.",
            value=len(execution.following_no_plan()),
        )
        yield GaugeMetricFamily(
            "oasis_agents_behind_their_plan",
            "Servers whose agent follows an older plan than one published for its server "
            "10 s before or more: it refused the newer one (an older agent: 'bad plan' in "
            "its log) or cannot read it; the jobs it places there do not run.",
            value=len(execution.behind_plan),
        )
        yield _per_server(
            "oasis_agent_workers_short_of_devices",
            "Workers a server's agent runs on GPUs others hold, or without the GPUs their "
            "task needs (its latest heartbeat; fractional demands that fragmented the GPUs, "
            "fewer ids than the capacity, a worker given up on).",
            agents.devices_short,
        )
        yield _per_server(
            "oasis_agent_plan_entries_left_out",
            "Entries of its plan a server's agent left out as bad (its latest heartbeat): "
            "their jobs do not run there; the agent's log says why.",
            agents.entries_left_out,
        )
        for server, age in sorted(execution.agent_ages().items()):
            ages.add_metric([server], age)
        yield ages

    def _commits(self) -> Iterator[Metric]:
        w = self.c.writer
        for kind, name, what, value in (
            (CounterMetricFamily, "oasis_commit_batches",
             "Batches of decisions the group-commit writer committed.", w.batches),
            (CounterMetricFamily, "oasis_commit_decisions",
             "Decisions committed by the group-commit writer.", w.committed),
            (CounterMetricFamily, "oasis_commit_seconds",
             "Seconds the group-commit writer spent in its commits.", w.commit_seconds),
            (GaugeMetricFamily, "oasis_commit_queued",
             "Decisions decided and applied, their commit not yet done.", w.queued),
        ):  # fmt: skip
            yield kind(name, what, value=float(value))
        process = self.c.commit_process
        if process is not None:
            yield GaugeMetricFamily(
                "oasis_commit_process_up", "1 while the commit process runs.",
                value=float(process.pid is not None),
            )  # fmt: skip
            yield CounterMetricFamily(
                "oasis_commit_process_starts", "Commit processes started.",
                value=float(process.starts),
            )  # fmt: skip

    def _ha(self) -> Iterator[Metric]:
        ha = self.c.ha_status()
        yield GaugeMetricFamily(
            "oasis_ha_leader", "1 if this daemon leads (decides), 0 on a standby.",
            value=float(ha.role == "leader"),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "oasis_ha_epoch", "The leadership epoch: this leader's, or the leader's last seen.",
            value=float(ha.epoch),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "oasis_ha_lease_age_seconds",
            "Seconds since the lease was last confirmed: by this leader's lock probe, or on a "
            "standby since it last read the leader's record.",
            value=ha.lease_age,
        )

    def _store(self) -> Iterator[Metric]:
        up = self.c.db.ping()
        yield GaugeMetricFamily(
            "oasis_store_up",
            "1 if the store answered a trivial query at this scrape, else 0.",
            value=float(up),
        )
        yield GaugeMetricFamily(
            "oasis_store_writes_refused",
            "1 while the store refuses this daemon's writes (a DBA's REVOKE, a read-only "
            "database or hot standby, a moved search_path, a full disk): submissions get "
            "UNAVAILABLE and the health of oasis.v1.Admission is NOT_SERVING; else 0.",
            value=float(bool(self.c.db.refusing)),
        )
        yield GaugeMetricFamily(
            "oasis_store_writes_locked",
            "1 while the last commit failed waiting for another connection's lock on the "
            "store (a sqlite3 shell's open transaction, a LOCK TABLE in psql), until a "
            "commit or the store watch's next probe gets through; else 0.",
            value=float(bool(self.c.db.writes_locked)),
        )
        if not up:
            return
        try:
            counted = self.c.job_counts.read()
        except Exception as err:  # the store failed between the ping and the query
            log.warning("metrics: store query failed", error=str(err))
            return
        jobs = GaugeMetricFamily(
            "oasis_jobs",
            f"Stored jobs by state, as of oasis_jobs_counted_timestamp_seconds.{_AGE}",
            labels=["state"],
        )
        for state, n in counted.jobs.items():
            jobs.add_metric([state], n)
        payoff = GaugeMetricFamily(
            "oasis_payoff",
            "Sum of the payoffs decided for the stored admitted jobs, by their state now, as "
            f"of oasis_jobs_counted_timestamp_seconds.{_AGE}",
            labels=["state"],
        )
        for state, total in counted.payoff.items():  # admitted jobs' states only
            payoff.add_metric([state], total)
        yield jobs
        yield payoff
        yield GaugeMetricFamily(
            "oasis_jobs_counted_timestamp_seconds",
            f"Unix time when oasis_jobs and oasis_payoff were counted in the store.{_AGE}",
            value=counted.counted_at,
        )
        yield GaugeMetricFamily(
            "oasis_jobs_count_seconds",
            "Seconds the last count of oasis_jobs and oasis_payoff took.",
            value=counted.seconds,
        )

    def _snapshot(
        self,
    ) -> tuple[int, tuple[list[Any], list[Any]], list[SidePrices], dict[str, str]]:
        """Runs in the decision thread: the current slot, use over the window and the
        capacity out of service now, prices now and their peak over the window (numpy
        arrays: a list of every cell's price took 1.3 s of the decision thread a scrape
        at 10,000 servers x 300 slots), and each server's state."""
        c = self.c
        _, use = c.utilisation(0, c.window + 1)
        _, out = c.out_of_service(0, 1)
        return c.slot, (use, out), c.price_summary(), c.server_states()

    def _ledger(self) -> Iterator[Metric]:
        """The ledger's metrics, read between two decisions; while a step has run for
        over :data:`BUSY_SECONDS`, or the read fails, the last ones read, with their age.
        Before, a scrape waited 10 s for a decision thread held by a long step, then left
        the ledger's metrics out without a word (the observability audit)."""
        step = self.c.step_seconds()
        yield GaugeMetricFamily(
            "oasis_decision_step_seconds",
            "Seconds the decision thread's running step has run (0: between steps); every "
            "tenant's calls wait for it.",
            value=step,
        )
        if step <= BUSY_SECONDS:
            try:
                self._ledger_metrics = list(self._read_ledger())
                self._ledger_at = time.monotonic()
            except (RuntimeError, FutureTimeoutError) as err:  # not open, shut down, stuck
                log.warning("metrics: ledger not readable", error=str(err) or type(err).__name__)
        if self._ledger_at is None:
            return
        yield GaugeMetricFamily(
            "oasis_ledger_metrics_age_seconds",
            "Seconds since the ledger's metrics (slot, servers, utilisation, prices) were "
            "read: more than a scrape's interval while the decision thread is held.",
            value=time.monotonic() - self._ledger_at,
        )
        yield from self._ledger_metrics

    def _read_ledger(self) -> Iterator[Metric]:
        slot, (use, out), prices, states = self.c.between_decisions(
            self._snapshot, _SNAPSHOT_TIMEOUT
        )
        yield GaugeMetricFamily(
            "oasis_slot",
            "The current slot: slot s begins at daemon.epoch + s * daemon.slot_seconds "
            "(oasis status shows its local time).",
            value=slot,
        )
        servers = GaugeMetricFamily(
            "oasis_servers",
            "Servers by state from the next slot on: up, cordoned (an operator's oasis "
            "cordon), failed (the execution plane: its agent fell silent).",
            labels=["state"],
        )
        for state in ("up", "cordoned", "failed"):
            servers.add_metric([state], sum(1 for v in states.values() if v == state))
        yield servers
        yield _shares("oasis_utilisation",
                      "Share of the capacity in service in use in the current slot, 0..1.",
                      use, lambda share: share[0])  # fmt: skip
        yield _shares("oasis_utilisation_planned",
                      "Mean share of the capacity in service in use over the window ahead, "
                      "0..1.", use, lambda share: float(np.mean(share)))  # fmt: skip
        yield _shares("oasis_capacity_out_of_service",
                      "Share of the capacity on failed or cordoned servers in the current "
                      "slot, 0..1.", out, lambda share: share[0])  # fmt: skip
        yield from price_families(
            prices, self.c.cluster.resources, self.c.config.per_server_prices_up_to
        )
