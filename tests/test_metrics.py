"""Prometheus metrics: scraped over HTTP from a real daemon subprocess after real
submissions, and read against a store that does not answer."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import re
import socket
import threading
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controller.admission import AdmissionController
from controller.admission.job_counts import MIN_AGE_SECONDS
from controller.clock import SlotClock, SystemClock
from controller.config import ConfigError, demo_config, from_dict, load
from controller.convert import spec_to_proto
from controller.metrics import MAX_CONNECTIONS, REQUEST_SECONDS, SCRAPE_INTERVAL, Metrics
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.store import Database
from tests.servers import CLUSTER_TOML, Daemon, free_port, write_config
from tests.test_daemon_e2e import contending_jobs, job

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
METRICS_ON = '\n[metrics]\nlisten = "127.0.0.1:0"\n'


def parse(text: str) -> Samples:
    """``{(sample name, sorted labels): value}`` of a text exposition."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


class Scraped:
    """A daemon with metrics on, its gRPC stubs and its /metrics URL."""

    def __init__(self, daemon: Daemon, url: str) -> None:
        self.daemon = daemon
        self.url = url
        self.channel = grpc.insecure_channel(daemon.address)
        self.admission = pb_grpc.AdmissionStub(self.channel)
        self.cluster = pb_grpc.ClusterStub(self.channel)

    def scrape(self) -> Samples:
        with urllib.request.urlopen(self.url, timeout=30) as resp:
            assert resp.status == 200
            return parse(resp.read().decode())

    def scrape_counted_after(self, since: float, timeout: float = 60.0) -> Samples:
        """The first scrape whose jobs per state were counted after Unix time ``since``
        (or the last one, at the timeout): the counts are shared and recounted at most
        every ``max(MIN_AGE_SECONDS, ...)`` (controller/admission/job_counts.py), and a
        scrape's answer is reused for ``SCRAPE_INTERVAL``."""
        deadline = time.monotonic() + timeout
        while True:
            samples = self.scrape()
            counted = value(samples, "oasis_jobs_counted_timestamp_seconds")
            if counted > since or time.monotonic() > deadline:
                return samples
            time.sleep(min(MIN_AGE_SECONDS, SCRAPE_INTERVAL) / 4)

    def submit(self, spec: dict[str, Any]) -> pb.SubmitJobResponse:
        req = pb.SubmitJobRequest(job=spec_to_proto(spec))
        resp: pb.SubmitJobResponse = self.admission.SubmitJob(req, timeout=60)
        return resp


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    """One daemon for the module: the loopback test only reads /metrics with odd Host
    headers (no call, no decision), so the counts the other test checks start at 0
    whichever runs first."""
    tmp_path = tmp_path_factory.mktemp("scraped")
    config = write_config(tmp_path / "m.toml", tmp_path / "data", extra=METRICS_ON)
    log = tmp_path / "m.log"
    daemon = Daemon(config, log).start()
    try:
        # logged before the daemon reports that it listens
        line = next(x for x in log.read_text().splitlines() if "metrics listening" in x)
        s = Scraped(daemon, f"http://{json.loads(line)['address']}/metrics")
        yield s
        s.channel.close()
    finally:
        assert daemon.stop() == 0, log.read_text()


def test_metrics_follow_decisions_jobs_utilisation_and_prices(scraped: Scraped) -> None:
    before = scraped.scrape()
    assert value(before, "oasis_store_up") == 1
    assert value(before, "oasis_draining") == 0
    assert value(before, "oasis_jobs", state="admitted") == 0
    assert value(before, "oasis_broker_configured") == 0
    assert value(before, "oasis_broker_up") == 0
    assert not [k for k in before if k[0] == "oasis_decisions_total"]
    servers = {s: value(before, "oasis_servers", state=s) for s in ("up", "cordoned", "failed")}
    assert servers == {"up": 5, "cordoned": 0, "failed": 0}  # tests.servers.CLUSTER_TOML

    specs = contending_jobs(6)
    answers = [scraped.submit(spec) for spec in specs]
    admitted = [a for a in answers if a.job.decision.admitted]
    assert admitted and len(admitted) < len(answers), "jobs should contend"
    assert scraped.submit(specs[0]).duplicate
    with pytest.raises(grpc.RpcError):
        scraped.submit(job("bad", tau=-1))
    quote = scraped.admission.QuoteJob(pb.QuoteJobRequest(job=spec_to_proto(job("q"))), timeout=60)
    scraped.admission.CancelJob(pb.CancelJobRequest(id=admitted[0].job.spec.id), timeout=60)

    changed = time.time()
    after = scraped.scrape_counted_after(changed)
    assert value(after, "oasis_jobs_counted_timestamp_seconds") > changed
    assert value(after, "oasis_jobs_count_seconds") >= 0
    n_admitted, n_rejected = len(admitted), len(answers) - len(admitted)
    assert value(after, "oasis_decisions_total", kind="submit", outcome="admitted") == n_admitted
    assert value(after, "oasis_decisions_total", kind="submit", outcome="rejected") == n_rejected
    assert value(after, "oasis_decisions_total", kind="submit", outcome="duplicate") == 1
    assert value(after, "oasis_decisions_total", kind="submit", outcome="invalid") == 1
    outcome = "admitted" if quote.decision.admitted else "rejected"
    assert value(after, "oasis_decisions_total", kind="quote", outcome=outcome) == 1
    assert value(after, "oasis_decision_seconds_count", kind="submit") == len(answers) + 2
    assert value(after, "oasis_decision_search_seconds_count", kind="submit") == len(answers)
    assert value(after, "oasis_decision_search_seconds_sum", kind="submit") == pytest.approx(
        sum(a.job.decision.decision_ms for a in answers) / 1000
    )
    payoffs = [a.job.decision.payoff for a in admitted]
    assert value(after, "oasis_admitted_payoff_total") == pytest.approx(sum(payoffs))
    # each decision committed by the group-commit writer, in at most as many batches
    assert value(after, "oasis_commit_decisions_total") == len(answers)
    assert 1 <= value(after, "oasis_commit_batches_total") <= len(answers)
    assert value(after, "oasis_commit_seconds_total") > 0
    assert value(after, "oasis_commit_queued") == 0
    assert value(after, "oasis_commit_process_up") == 1  # the daemon's own child
    assert value(after, "oasis_commit_process_starts_total") == 1

    assert value(after, "oasis_jobs", state="admitted") == n_admitted - 1
    assert value(after, "oasis_jobs", state="cancelled") == 1
    assert value(after, "oasis_jobs", state="rejected") == n_rejected
    assert value(after, "oasis_payoff", state="admitted") == pytest.approx(sum(payoffs[1:]))
    assert value(after, "oasis_payoff", state="cancelled") == pytest.approx(payoffs[0])
    assert ("oasis_payoff", (("state", "rejected"),)) not in after

    # the ledger's view, as the gRPC API reports it
    use = scraped.cluster.GetUtilisation(pb.GetUtilisationRequest(slots=1000), timeout=30)
    slot = int(value(after, "oasis_slot"))
    assert use.first_slot == slot
    kinds = {pb.SERVER_KIND_WORKER: "worker", pb.SERVER_KIND_PS: "ps"}
    for u in use.use:
        labels = {"kind": kinds[u.kind], "resource": u.resource}
        assert value(after, "oasis_utilisation", **labels) == u.share[0]
        assert value(after, "oasis_utilisation_planned", **labels) == pytest.approx(
            sum(u.share) / len(u.share)
        )
    assert value(after, "oasis_utilisation_planned", kind="worker", resource="gpu") > 0
    prices = scraped.cluster.GetPrices(pb.GetPricesRequest(slots=1000), timeout=30)
    peaks: dict[tuple[str, str], float] = {}
    for p in prices.prices:
        kind = kinds[p.kind]
        assert value(
            after, "oasis_unit_price", server=p.server, kind=kind, resource=p.resource
        ) == pytest.approx(p.prices[0])
        peaks[(kind, p.resource)] = max(peaks.get((kind, p.resource), 0.0), *p.prices)
    for (kind, resource), peak in peaks.items():
        assert value(after, "oasis_unit_price_peak", kind=kind, resource=resource) == peak
    gpu_now = value(after, "oasis_unit_price", server="w0", kind="worker", resource="gpu")
    assert peaks[("worker", "gpu")] > gpu_now  # the plans ahead made the GPUs dearer


def _unreachable_controller(tmp_path: Path) -> AdmissionController:
    config = load(write_config(tmp_path / "u.toml", tmp_path / "data"))
    store = Database(f"postgresql+psycopg://oasis@127.0.0.1:{free_port()}/oasis")
    return AdmissionController(config, store, SlotClock(SystemClock(), 3600, 0))


def test_a_store_that_does_not_answer_reads_as_down_and_the_broker_as_set(
    tmp_path: Path,
) -> None:
    controller = _unreachable_controller(tmp_path)  # never opened: no ledger either
    try:
        metrics = Metrics(controller)
        samples = parse(generate_latest(metrics.registry).decode())
        assert value(samples, "oasis_store_up") == 0
        assert not [k for k in samples if k[0] in ("oasis_jobs", "oasis_slot")]
        assert value(samples, "oasis_broker_configured") == 0
        metrics.set_broker(False)
        samples = parse(generate_latest(metrics.registry).decode())
        assert value(samples, "oasis_broker_configured") == 1
        assert value(samples, "oasis_broker_up") == 0
        metrics.set_broker(True)
        assert value(parse(generate_latest(metrics.registry).decode()), "oasis_broker_up") == 1
    finally:
        controller.close()


def test_a_cordoned_server_and_a_refusing_store_show_on_their_gauges(tmp_path: Path) -> None:
    """The mutation audit: ``oasis_capacity_out_of_service`` could read the capacity in
    use, ``oasis_servers`` could leave ``failed`` out, and ``oasis_store_writes_refused``
    could stay 0, with every test passing. In process: a cordon reaches the current slot
    by the clock, not by waiting an hour."""
    from tests.test_ledger_reads import busy_controller

    c = busy_controller(tmp_path, 3, 1, 4, 0)  # w0..w2 with 8 GPUs each, and p0
    try:
        asyncio.run(c.cordon("w0", "disk swap", "ops", force=True))
        c.slots.clock.advance(3600.0)  # type: ignore[attr-defined]
        asyncio.run(c.tick())  # the cordon's first slot is the current one
        samples = parse(generate_latest(Metrics(c).registry).decode())
        servers = {
            s: value(samples, "oasis_servers", state=s) for s in ("up", "cordoned", "failed")
        }
        assert servers == {"up": 3, "cordoned": 1, "failed": 0}
        out = value(samples, "oasis_capacity_out_of_service", kind="worker", resource="gpu")
        assert out == pytest.approx(1 / 3)  # one of three equal workers
        assert value(samples, "oasis_capacity_out_of_service", kind="ps", resource="cpu") == 0
        assert value(samples, "oasis_utilisation", kind="worker", resource="gpu") != out
        assert value(samples, "oasis_store_writes_refused") == 0
        assert value(samples, "oasis_store_writes_locked") == 0
        c.db._refusing = "permission denied for table jobs"  # as a commit refused sets it
        samples = parse(generate_latest(Metrics(c).registry).decode())  # a fresh reading
        assert value(samples, "oasis_store_writes_refused") == 1
        assert value(samples, "oasis_store_writes_locked") == 0
    finally:
        c.close()


def test_the_interceptor_counts_each_outcome_by_its_own_name(tmp_path: Path) -> None:
    """``oasis_decisions_total`` of answers the daemon test does not meet (the mutation
    audit: a submit left pending counted as rejected, a deadline or a denial as ``error``,
    a cancelled call not counted at all, each went unnoticed). Driven through the
    interceptor with real gRPC method handlers; only the call's context is a stand-in."""
    controller = _unreachable_controller(tmp_path)
    try:
        metrics = Metrics(controller)
        interceptor = metrics.interceptor()

        class Context:
            def __init__(self, code: grpc.StatusCode | None) -> None:
                self._code = code

            def code(self) -> grpc.StatusCode | None:
                return self._code

        async def call(method: str, behaviour: Any, code: grpc.StatusCode | None = None) -> None:
            handler = grpc.unary_unary_rpc_method_handler(behaviour)

            async def continuation(details: Any) -> Any:
                return handler

            details = SimpleNamespace(method=f"/oasis.v1.Admission/{method}")
            wrapped = await interceptor.intercept_service(continuation, details)
            with contextlib.suppress(BaseException):
                await wrapped.unary_unary(None, Context(code))

        async def pending(request: Any, context: Any) -> pb.SubmitJobResponse:
            decision = pb.Decision(admitted=False, decision_ms=2.0)
            return pb.SubmitJobResponse(job=pb.Job(state=pb.JOB_STATE_PENDING, decision=decision))

        async def admitted_quote(request: Any, context: Any) -> pb.QuoteJobResponse:
            return pb.QuoteJobResponse(decision=pb.Decision(admitted=True, payoff=7.0))

        async def fails(request: Any, context: Any) -> None:
            raise RuntimeError("refused")

        async def cancelled(request: Any, context: Any) -> None:
            raise asyncio.CancelledError

        async def calls() -> None:
            await call("SubmitJob", pending)
            await call("QuoteJob", admitted_quote)
            await call("SubmitJob", fails, grpc.StatusCode.DEADLINE_EXCEEDED)
            await call("SubmitJob", fails, grpc.StatusCode.PERMISSION_DENIED)
            await call("SubmitJob", fails, grpc.StatusCode.UNAVAILABLE)
            await call("SubmitJob", fails, grpc.StatusCode.ALREADY_EXISTS)
            await call("SubmitJob", fails, grpc.StatusCode.INTERNAL)
            await call("QuoteJob", cancelled)

        asyncio.run(calls())
        samples = parse(generate_latest(metrics.registry).decode())
        counted = {
            (dict(labels)["kind"], dict(labels)["outcome"]): v
            for (name, labels), v in samples.items()
            if name == "oasis_decisions_total"
        }
        assert counted == {
            ("submit", "pending"): 1, ("quote", "admitted"): 1, ("submit", "cancelled"): 1,
            ("submit", "denied"): 1, ("submit", "error"): 1, ("quote", "cancelled"): 1,
            ("submit", "unavailable"): 1, ("submit", "conflict"): 1,
        }  # fmt: skip
        # a pending submit's search is timed; a quote earns no payoff
        assert value(samples, "oasis_decision_search_seconds_sum", kind="submit") == 0.002
        assert value(samples, "oasis_admitted_payoff_total") == 0
    finally:
        controller.close()


def test_scrapes_closer_than_the_interval_share_one_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/metrics takes no token: a flood of scrapes reads the store and the ledger (in the
    decision thread) at most once per SCRAPE_INTERVAL, not once per scrape."""
    controller = _unreachable_controller(tmp_path)
    pings = 0
    ping = controller.db.ping

    def counted() -> bool:
        nonlocal pings
        pings += 1
        return ping()

    now = [1000.0]
    monkeypatch.setattr(controller.db, "ping", counted)
    monkeypatch.setattr("controller.metrics.time.monotonic", lambda: now[0])
    try:
        metrics = Metrics(controller)

        def ours() -> list[bytes]:  # the process collector's (CPU time, ...) move on
            lines = generate_latest(metrics.registry).splitlines()
            return [line for line in lines if b"process_" not in line]

        first = ours()
        for _ in range(20):
            assert ours() == first
        assert pings == 1
        now[0] += SCRAPE_INTERVAL
        generate_latest(metrics.registry)
        assert pings == 2
    finally:
        controller.close()


def test_metrics_on_loopback_answer_loopback_names_only(scraped: Scraped) -> None:
    """A web page whose name was rebound to 127.0.0.1 (DNS rebinding) read the prices
    and job counts the console shows operators only (200 before)."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(scraped.url)
    for host, status in (("evil.example", 421), (f"evil.example:{where.port}", 421),
                         (where.netloc, 200), (f"localhost:{where.port}", 200),
                         (f"LocalHost:{where.port}", 200)):  # fmt: skip
        conn = http.client.HTTPConnection(where.hostname or "", where.port, timeout=30)
        try:
            conn.request("GET", "/metrics", headers={"Host": host})
            assert conn.getresponse().status == status, host
        finally:
            conn.close()


def test_metrics_listen_is_off_by_default_and_checked(tmp_path: Path) -> None:
    assert demo_config().metrics_listen == ""
    base: dict[str, Any] = tomllib.loads(CLUSTER_TOML)
    # off loopback only when explicitly allowed, as daemon.listen (issue 12, item 14)
    remote = {"listen": "0.0.0.0:9464", "allow_insecure_remote": True}
    assert from_dict({**base, "metrics": remote}).metrics_listen == "0.0.0.0:9464"
    assert from_dict({**base, "metrics": {"listen": "[::1]:9464"}}).metrics_listen == "[::1]:9464"
    for bad, message in [
        ({"listen": "9464"}, "metrics.listen: must be host:port"),
        ({"listen": 9464}, "metrics.listen: must be a string"),
        ({"port": 1}, "metrics.port: unknown key"),
        ({"listen": "0.0.0.0:9464"}, "metrics.listen: 0.0.0.0:9464 is not a loopback address"),
        ({"listen": "10.1.2.3:9464"}, "set metrics.allow_insecure_remote = true"),
        ({"listen": "0.0.0.0:1", "allow_insecure_remote": 1}, "must be true or false"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            from_dict({**base, "metrics": bad})


def test_refused_calls_are_counted(tmp_path: Path) -> None:
    """Calls the access check refuses (no or a bad token, over the rate) reach
    ``oasis_decisions_total`` with their own outcomes."""
    from controller.auth import hash_token
    from controller.tls import client_channel

    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice submitter {hash_token('a-token')}\n")
    extra = f'{METRICS_ON}[auth]\ntokens_file = "{tokens}"\n[limits]\nrate = 0.01\nburst = 1\n'
    config = write_config(tmp_path / "m.toml", tmp_path / "data", extra=extra)
    log = tmp_path / "m.log"
    daemon = Daemon(config, log).start()
    try:
        line = next(x for x in log.read_text().splitlines() if "metrics listening" in x)
        url = f"http://{json.loads(line)['address']}/metrics"
        request = pb.QuoteJobRequest(job=spec_to_proto(job("q1")))
        codes = []
        for token in ("a-token", "a-token", "a-guess"):
            with client_channel(daemon.address, token=token) as channel:
                try:
                    pb_grpc.AdmissionStub(channel).QuoteJob(request, timeout=30)
                    codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as err:
                    codes.append(err.code())
        assert codes == [grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED,
                         grpc.StatusCode.UNAUTHENTICATED]  # fmt: skip
        wanted = {("oasis_decisions_total", (("kind", "quote"), ("outcome", o))): 1.0
                  for o in ("rate_limited", "unauthenticated")}  # fmt: skip
        deadline = time.monotonic() + 10  # the count follows the answer by a moment
        while True:
            with urllib.request.urlopen(url, timeout=30) as resp:
                samples = parse(resp.read().decode())
            got = {k: samples.get(k) for k in wanted}
            if got == wanted or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert got == wanted
    finally:
        assert daemon.stop() == 0, log.read_text()


def test_metrics_serve_max_connections_at_once_and_refuse_the_next(tmp_path: Path) -> None:
    """Exactly ``MAX_CONNECTIONS`` idle connections hold their places and the next one
    is answered 503 at once (the mutation audit: a cap of 33 passed the descriptor test,
    whose bound has room for a few more). Connections are accepted in order, one thread
    accepting, so the last one opened is the one past the cap."""
    controller = _unreachable_controller(tmp_path)
    metrics = Metrics(controller)
    held: list[socket.socket] = []
    try:
        address = metrics.serve("127.0.0.1:0")
        host, port = address.rsplit(":", 1)
        for _ in range(MAX_CONNECTIONS + 1):
            held.append(socket.create_connection((host, int(port)), timeout=REQUEST_SECONDS / 2))
        assert held[-1].recv(100).startswith(b"HTTP/1.0 503"), "no 503 past the cap"
        last = held[MAX_CONNECTIONS - 1]  # the last one within the cap is served
        last.sendall(f"GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n".encode())
        assert last.recv(100).startswith(b"HTTP/1.0 200"), "the last place was not served"
    finally:
        for conn in held:
            conn.close()
        metrics.close()
        controller.close()


def test_slow_metrics_clients_cannot_take_the_daemons_descriptors(tmp_path: Path) -> None:
    """The stall audit: connections to /metrics that send their request a byte a second
    (slowloris) took a thread and a descriptor each, for good; 240 of them took every
    descriptor of a daemon limited to 256, and no tenant could connect over gRPC. Now at
    most ``MAX_CONNECTIONS`` are served (the rest answered 503 at once), each closed
    ``REQUEST_SECONDS`` after it was accepted, and a tenant's call goes through."""
    config = write_config(tmp_path / "m.toml", tmp_path / "data", extra=METRICS_ON)
    log = tmp_path / "m.log"
    daemon = Daemon(config, log, nofile=256).start()
    slow: list[socket.socket] = []
    dripping = threading.Event()
    try:
        assert daemon.proc is not None
        line = next(x for x in log.read_text().splitlines() if "metrics listening" in x)
        host, port = json.loads(line)["address"].rsplit(":", 1)
        baseline = len(os.listdir(f"/proc/{daemon.proc.pid}/fd"))
        request = f"GET /metrics HTTP/1.1\r\nHost: {host}:{port}\r\nX-Slow: {'a' * 200}\r\n"

        def connect(_: int) -> socket.socket | None:
            try:
                conn = socket.create_connection((host, int(port)), timeout=2)
            except OSError:
                return None  # its backlog is full: the daemon no longer accepts
            conn.send(request[:1].encode())
            return conn

        # more than the daemon has descriptors; a few at a time (one by one, each connect
        # waiting on the backlog took 22 s)
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            slow.extend(c for c in pool.map(connect, range(300)) if c is not None)

        def drip() -> None:
            for i in range(1, len(request)):
                if dripping.wait(1.0):
                    return
                for conn in slow:
                    with contextlib.suppress(OSError):
                        conn.send(request[i : i + 1].encode())

        dripper = threading.Thread(target=drip, daemon=True)
        dripper.start()
        time.sleep(1.0)
        fds = len(os.listdir(f"/proc/{daemon.proc.pid}/fd"))
        assert fds <= baseline + MAX_CONNECTIONS + 16, f"{fds} open, {len(slow)} slow clients"
        # another tenant connects and is answered meanwhile
        with grpc.insecure_channel(daemon.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = health.Check(health_pb2.HealthCheckRequest(), timeout=20)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        # the slow ones past the cap were answered 503 at once (or reset: closed with the
        # bytes dripped since unread), the others are closed within REQUEST_SECONDS,
        # their requests never finished: none is left open
        for conn in slow:
            conn.settimeout(REQUEST_SECONDS + 30)
            try:
                answer = conn.recv(100)
            except ConnectionResetError:
                continue
            assert answer == b"" or answer.startswith(b"HTTP/1.0 503"), answer
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=30) as resp:
            assert resp.status == 200  # and /metrics answers again
    finally:
        dripping.set()
        for conn in slow:
            conn.close()
        assert daemon.stop() == 0, log.read_text()


def test_a_cordoned_servers_price_is_no_peak_or_quantile(scraped: Scraped) -> None:
    """Before: a cordon of one idle server raised ``oasis_unit_price_peak`` of every
    resource of its kind (cpu 0.115 -> 3.48, mem 0.00033 -> 1.0 on the example cluster):
    a server out of service is priced as full, which the peak took for demand; an alert
    on it fired at every maintenance. Now the peak and the quantiles are over the servers
    in service in each slot, as ``oasis_utilisation`` is; ``oasis_unit_price`` keeps each
    server's own."""
    cordoned = scraped.cluster.CordonServer(
        pb.CordonServerRequest(server="w2", reason="test", force=True), timeout=30
    )
    try:
        time.sleep(SCRAPE_INTERVAL * 1.5)  # past the reading a scrape before shared
        after = scraped.scrape()
        prices = scraped.cluster.GetPrices(pb.GetPricesRequest(slots=1000), timeout=30)
        first = prices.first_slot
        peaks: dict[str, float] = {}
        out: dict[str, float] = {}
        for p in prices.prices:
            if p.kind != pb.SERVER_KIND_WORKER:
                continue
            serving = p.prices[: cordoned.from_slot - first] if p.server == "w2" else p.prices
            peaks[p.resource] = max(peaks.get(p.resource, 0.0), *serving)
            if p.server == "w2":
                out[p.resource] = max(p.prices)
        # the cordoned server's price is over the peak in service (else nothing is tested)
        assert any(out[r] > peak for r, peak in peaks.items()), (out, peaks)
        for resource, peak in peaks.items():
            assert value(after, "oasis_unit_price_peak", kind="worker", resource=resource) == (
                pytest.approx(peak)
            )
    finally:
        scraped.cluster.UncordonServer(pb.UncordonServerRequest(server="w2"), timeout=30)
