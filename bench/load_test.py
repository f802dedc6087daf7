"""Load and fault test of ``oasisd``: many clients, retries, optionally PostgreSQL
restarted mid-load; then every decision, allocation and capacity is checked.

What is measured
    ``oasisd`` runs as a subprocess on 127.0.0.1 at the paper's scale, as in
    ``bench/daemon_throughput.py``: 50 worker + 50 PS servers, T = 300 slots of 3600 s,
    every job submitted in slot 0 (so most are rejected once the cluster fills). The jobs
    are ``pricing.workload.generate_trace``'s (seeded), with ids unique to the run.

    ``--clients`` threads, each with its own channel, take the next job and submit it
    until it is answered: UNAVAILABLE, RESOURCE_EXHAUSTED and DEADLINE_EXCEEDED are
    retried with the same job id (the daemon answers a retried id with its first
    decision), after the ``grpc-retry-pushback-ms`` hint if the daemon gave one, else an
    exponential back-off from 50 ms to 1 s with jitter. A monitor thread reads
    ``GetUtilisation`` over the whole window every ``--monitor-interval`` seconds.
    With ``--pg-restart``, once a third of the jobs are answered PostgreSQL is stopped
    (``pg_ctl stop -m fast``), kept down until the clients have seen UNAVAILABLE for
    ``--pg-down-seconds``, and started again.

    Reported: submissions per second (answered jobs over the wall time from the first
    call to the last answer), submission latency (first attempt to answer, retries
    included) and call latency (the answered call alone), p50 / p99 / max; attempts and
    failed calls by status code.

Checks, after the load (each failure is listed; the run fails if any is)
    - Lost or duplicated decisions: every job id has exactly one row in ``jobs`` and
      exactly one ``decided`` event, and the decision its client was given (sequence,
      admitted) is the stored one. No job was given up on.
    - Nothing half-written: an admitted job has allocations whose workers sum to at
      least its work and whose PS per slot are ``z(y) = ceil(y b / B - 1e-9)`` of its
      workers ``y``; a rejected job has none.
    - Store and ledger agree: the share of every resource of each kind of server in each
      slot of the window, recomputed from the stored allocations and the stored specs,
      equals the daemon's ``GetUtilisation`` (relative 1e-9), and so does every server's
      use in the current slot (``ListServers``).
    - Capacity never exceeded: per server, slot and resource in the store at the end,
      and every ``GetUtilisation`` share the monitor read during the run is <= 1.

Methodology
    Each backend gets a fresh store (a SQLite file in WAL mode; a database on a
    throwaway PostgreSQL with ``fsync=off``). The daemon logs at ``info`` to a file.
    Latencies are ``time.perf_counter`` around blocking calls. Loops are bounded: no job
    is started after ``--max-seconds``, and a job is given up after ``--job-seconds``
    of retries. The client threads, the daemon and PostgreSQL share the machine's cores.

Run with
    .venv/bin/python -m bench.load_test                        # 10,000 jobs, 32 clients
    .venv/bin/python -m bench.load_test --backends postgresql --pg-restart
    .venv/bin/python -m bench.load_test --jobs 300 --clients 8 --json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import grpc
from sqlalchemy import create_engine, text

from bench.daemon_throughput import WINDOW, percentiles, workload, write_config
from bench.machine import describe
from controller.commands.connection import retry_pushback
from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.servers import Daemon, Postgres

BACKENDS = ("sqlite", "postgresql")
RETRIED = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)
ROUNDING = 1e-9
CAPACITY_SLACK = 1e-7
SHARE_TOLERANCE = 1e-9


@dataclass
class Answer:
    """What a client was finally told about one job."""

    sequence: int
    admitted: bool
    duplicate: bool
    attempts: int
    seconds: float  # first attempt to answer
    call_seconds: float  # the answered call alone
    answered_at: float  # perf_counter
    decision_ms: float = 0.0  # the daemon's search time for it


@dataclass
class LoadReport:
    """One run against one store; ``problems`` empty means every check passed."""

    backend: str
    jobs: int
    clients: int
    answered: int = 0
    admitted: int = 0
    rejected: int = 0
    duplicates: int = 0
    given_up: int = 0
    not_started: int = 0
    attempts: int = 0
    failed_calls: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    per_second: float = 0.0
    latency_p50_ms: float = 0.0
    latency_p99_ms: float = 0.0
    latency_max_ms: float = 0.0
    call_p50_ms: float = 0.0
    call_p99_ms: float = 0.0
    decision_p50_ms: float = 0.0
    decision_p99_ms: float = 0.0
    utilisation_samples: int = 0
    utilisation_max: float = 0.0
    pg_down_seconds: float = 0.0
    answered_while_down: int = 0
    answered_after_restart: int = 0
    allocation_rows: int = 0
    store_url: str = ""
    problems: list[str] = field(default_factory=list)


# -- load ------------------------------------------------------------------------------


class Fault(Protocol):
    """Something that happens to the system under load, in a thread of its own."""

    def run(self, load: Load) -> None: ...


class PgRestart:
    """Stop PostgreSQL once ``after`` jobs are answered; start it again once the clients
    have seen UNAVAILABLE and ``down_seconds`` have passed."""

    def __init__(self, postgres: Postgres, after: int, down_seconds: float) -> None:
        self.postgres = postgres
        self.after = after
        self.down_seconds = down_seconds
        self.stopped_at = 0.0
        self.started_at = 0.0

    def run(self, load: Load) -> None:
        while load.answered_count() < self.after and not load.finished.is_set():
            time.sleep(0.01)
        if load.finished.is_set():
            return
        self.postgres.stop("fast")
        self.stopped_at = time.perf_counter()
        seen = load.unavailable_count()
        limit = self.stopped_at + max(self.down_seconds, 30.0)
        while time.perf_counter() < limit and (
            load.unavailable_count() == seen
            or time.perf_counter() - self.stopped_at < self.down_seconds
        ):
            time.sleep(0.05)
        self.postgres.start()
        self.started_at = time.perf_counter()


class Load:
    """Client threads submitting every job until answered, and a utilisation monitor."""

    def __init__(
        self,
        address: str,
        requests: list[pb.SubmitJobRequest],
        clients: int,
        *,
        max_seconds: float,
        job_seconds: float,
        monitor_interval: float,
        call_timeout: float = 30.0,
        rate: float = 0.0,
    ) -> None:
        self.address = address
        self.requests = requests
        self.clients = clients
        self.max_seconds = max_seconds
        self.job_seconds = job_seconds
        self.monitor_interval = monitor_interval
        self.call_timeout = call_timeout
        self.rate = rate  # jobs started per second over all clients; 0: as fast as they can
        self.answers: dict[str, Answer] = {}
        self.given_up: dict[str, str] = {}
        self.failed_calls: Counter[str] = Counter()
        self.utilisation_max = 0.0
        self.utilisation_samples = 0
        self.finished = threading.Event()
        self._next = 0
        self._lock = threading.Lock()
        self._deadline = 0.0
        self._started = 0.0

    def answered_count(self) -> int:
        with self._lock:
            return len(self.answers)

    def unavailable_count(self) -> int:
        with self._lock:
            return self.failed_calls[grpc.StatusCode.UNAVAILABLE.name]

    def _take(self) -> pb.SubmitJobRequest | None:
        with self._lock:
            if self._next >= len(self.requests) or time.perf_counter() > self._deadline:
                return None
            index = self._next
            self._next += 1
        if self.rate > 0:  # paced: the n-th job starts n / rate seconds after the first
            time.sleep(max(0.0, self._started + index / self.rate - time.perf_counter()))
        return self.requests[index]

    def _submit(self, stub: Any, request: pb.SubmitJobRequest) -> None:
        rng = random.Random(request.job.id)
        started = time.perf_counter()
        delay = 0.05
        attempts = 0
        while True:
            attempts += 1
            t0 = time.perf_counter()
            try:
                reply = stub.SubmitJob(request, timeout=self.call_timeout)
            except grpc.RpcError as err:
                code = err.code()
                with self._lock:
                    self.failed_calls[code.name] += 1
                if code not in RETRIED or time.perf_counter() - started > self.job_seconds:
                    with self._lock:
                        self.given_up[request.job.id] = f"{code.name}: {err.details()}"
                    return
                hint = retry_pushback(err)
                time.sleep(hint if hint is not None else delay * rng.uniform(0.5, 1.5))
                delay = min(1.0, delay * 2)
                continue
            now = time.perf_counter()
            answer = Answer(
                sequence=reply.job.sequence,
                admitted=reply.job.decision.admitted,
                duplicate=reply.duplicate,
                attempts=attempts,
                seconds=now - started,
                call_seconds=now - t0,
                answered_at=now,
                decision_ms=reply.job.decision.decision_ms,
            )
            with self._lock:
                self.answers[request.job.id] = answer
            return

    def _client(self, channel: grpc.Channel, start: threading.Barrier) -> None:
        stub = pb_grpc.AdmissionStub(channel)
        start.wait()
        while (request := self._take()) is not None:
            self._submit(stub, request)

    def _monitor(self, channel: grpc.Channel, start: threading.Barrier) -> None:
        """Read the utilisation every ``monitor_interval`` s, and once more at the end."""
        stub = pb_grpc.ClusterStub(channel)
        request = pb.GetUtilisationRequest(slots=WINDOW + 1)
        start.wait()
        done = False
        while not done:
            done = self.finished.wait(self.monitor_interval)
            try:
                reply = stub.GetUtilisation(request, timeout=10)
            except grpc.RpcError:
                continue
            top = max((max(u.share, default=0.0) for u in reply.use), default=0.0)
            with self._lock:
                self.utilisation_samples += 1
                self.utilisation_max = max(self.utilisation_max, top)

    def run(self, fault: Fault | None = None) -> float:
        """Submit every job; the wall time from the first call to the last answer."""
        channels = [grpc.insecure_channel(self.address) for _ in range(self.clients + 1)]
        try:
            for channel in channels:
                grpc.channel_ready_future(channel).result(timeout=30)
            start = threading.Barrier(self.clients + 2)
            threads = [
                threading.Thread(target=self._client, args=(ch, start), name=f"client-{i}")
                for i, ch in enumerate(channels[: self.clients])
            ]
            monitor = threading.Thread(target=self._monitor, args=(channels[-1], start))
            faults = threading.Thread(target=fault.run, args=(self,)) if fault else None
            for t in (*threads, monitor):
                t.start()
            self._deadline = time.perf_counter() + self.max_seconds
            self._started = time.perf_counter()
            start.wait()
            t0 = time.perf_counter()
            if faults is not None:
                faults.start()
            for t in threads:
                t.join()
            seconds = time.perf_counter() - t0
            self.finished.set()
            monitor.join()
            if faults is not None:
                faults.join()
            return seconds
        finally:
            self.finished.set()
            for channel in channels:
                channel.close()


# -- checks ----------------------------------------------------------------------------


Use = dict[tuple[int, str], dict[str, float]]
"""Amounts in use per (slot, server), per resource."""


@dataclass
class StoreCheck:
    """What :func:`check_store` found: problems, and the amounts in use it summed."""

    problems: list[str]
    use: Use
    allocation_rows: int


@dataclass
class StoreRows:
    """What the checks read from a store."""

    jobs: dict[str, Any]  # id -> row (id, sequence, admitted, work, spec, state)
    decided: dict[str, int]  # id -> its 'decided' events
    allocations: list[Any]  # (job_id, slot, server, workers, ps)


def read_store(url: str) -> StoreRows:
    """Jobs, 'decided' event counts and allocations of the store at ``url``."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            jobs = {
                r.id: r
                for r in conn.execute(
                    text("SELECT id, sequence, admitted, work, spec, state FROM jobs")
                )
            }
            decided: dict[str, int] = dict(
                conn.execute(
                    text(
                        "SELECT job_id, count(*) FROM events WHERE kind = 'decided' GROUP BY job_id"
                    )
                ).all()
            )
            allocations = conn.execute(
                text("SELECT job_id, slot, server, workers, ps FROM allocations")
            ).all()
    finally:
        engine.dispose()
    return StoreRows(jobs, decided, list(allocations))


def decision_problems(rows: StoreRows, ids: list[str], answers: dict[str, Answer]) -> list[str]:
    """Lost or duplicated decisions: one row and one 'decided' event per job id, each
    client's answer the stored decision, no job nobody submitted."""
    problems: list[str] = []
    jobs, decided = rows.jobs, rows.decided
    for job_id in ids:
        row = jobs.get(job_id)
        if row is None:
            if job_id in answers:
                problems.append(
                    f"{job_id}: answered (sequence {answers[job_id].sequence}) but not in the store"
                )
            continue
        if decided.get(job_id, 0) != 1:
            problems.append(f"{job_id}: {decided.get(job_id, 0)} 'decided' events, not 1")
        answer = answers.get(job_id)
        if answer is not None and (answer.sequence, answer.admitted) != (
            row.sequence,
            bool(row.admitted),
        ):
            problems.append(
                f"{job_id}: answered (seq {answer.sequence}, admitted "
                f"{answer.admitted}) but stored (seq {row.sequence}, admitted "
                f"{bool(row.admitted)})"
            )
    unknown = set(jobs) - set(ids)
    if unknown:
        problems.append(f"{len(unknown)} stored jobs nobody submitted, e.g. {sorted(unknown)[:3]}")
    if len({r.sequence for r in jobs.values()}) != len(jobs):
        problems.append("two jobs share a decision sequence")
    return problems


def store_use(rows: StoreRows) -> Use:
    """Amounts in use per (slot, server) and resource, from the stored allocations."""
    use: Use = defaultdict(lambda: defaultdict(float))
    specs = {job_id: json.loads(row.spec) for job_id, row in rows.jobs.items()}
    for job_id, slot, server, workers, ps in rows.allocations:
        spec = specs[job_id]
        for count, demand in ((workers, spec["worker"]), (ps, spec["ps"])):
            for resource, amount in demand.items():
                use[(slot, server)][resource] += count * float(amount)
    return use


def capacity_problems(use: Use, servers: list[dict[str, Any]]) -> list[str]:
    """Every (slot, server, resource) in use over the server's capacity."""
    problems: list[str] = []
    by_name = {s["name"]: s for s in servers}
    for (slot, server), amounts in use.items():
        for resource, amount in amounts.items():
            capacity = float(by_name[server]["capacity"].get(resource, 0.0))
            if amount > capacity + CAPACITY_SLACK:
                problems.append(
                    f"slot {slot}, {server}: {resource} {amount:g} > capacity {capacity:g}"
                )
    return problems


def check_store(
    url: str, ids: list[str], answers: dict[str, Answer], servers: list[dict[str, Any]]
) -> StoreCheck:
    """The checks of the module docstring on the store alone: lost or duplicated
    decisions, half-written ones, capacity."""
    rows = read_store(url)
    jobs = rows.jobs
    problems = decision_problems(rows, ids, answers)

    # nothing half-written
    by_job: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    specs = {job_id: json.loads(row.spec) for job_id, row in jobs.items()}
    for job_id, slot, _server, workers, ps in rows.allocations:
        by_job[job_id][slot][0] += workers
        by_job[job_id][slot][1] += ps
    for job_id, row in jobs.items():
        slots = by_job.get(job_id, {})
        if not row.admitted:
            if slots:
                problems.append(f"{job_id}: rejected but has allocations")
            continue
        spec = specs[job_id]
        ratio = float(spec["worker"]["bandwidth"]) / float(spec["ps"]["bandwidth"])
        if sum(w for w, _ in slots.values()) < row.work:
            problems.append(
                f"{job_id}: admitted with work {row.work} but its allocations "
                f"hold {sum(w for w, _ in slots.values())} worker-slots"
            )
        for slot, (workers, ps) in slots.items():
            if ps != math.ceil(workers * ratio - ROUNDING):
                problems.append(f"{job_id}: slot {slot}: {workers} workers with {ps} PS")
    use = store_use(rows)
    problems += capacity_problems(use, servers)
    return StoreCheck(problems, use, len(rows.allocations))


def check_ledger(address: str, use: Use, servers: list[dict[str, Any]]) -> list[str]:
    """The daemon's utilisation and per-server use against the store's allocations."""
    problems: list[str] = []
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.ClusterStub(channel)
        util = stub.GetUtilisation(pb.GetUtilisationRequest(slots=WINDOW + 1), timeout=30)
        listed = stub.ListServers(pb.ListServersRequest(), timeout=30)
    kinds = {pb.SERVER_KIND_WORKER: "worker", pb.SERVER_KIND_PS: "ps"}
    total: dict[tuple[str, str], float] = defaultdict(float)
    for s in servers:
        for resource, amount in s["capacity"].items():
            total[(s["kind"], resource)] += float(amount)
    kind_of = {s["name"]: s["kind"] for s in servers}
    used: dict[tuple[str, str, int], float] = defaultdict(float)
    for (slot, server), amounts in use.items():
        for resource, amount in amounts.items():
            used[(kind_of[server], resource, slot)] += amount
    for row in util.use:
        kind = kinds[row.kind]
        for i, share in enumerate(row.share):
            slot = util.first_slot + i
            expected = used.get((kind, row.resource, slot), 0.0) / total[(kind, row.resource)]
            if not math.isclose(share, expected, rel_tol=SHARE_TOLERANCE, abs_tol=1e-12):
                problems.append(
                    f"slot {slot}, {kind} {row.resource}: the daemon's share "
                    f"{share!r} != the store's {expected!r}"
                )
    for s in listed.servers:
        for resource, amount in s.used.items():
            expected = use.get((listed.current_slot, s.name), {}).get(resource, 0.0)
            if not math.isclose(amount, expected, rel_tol=SHARE_TOLERANCE, abs_tol=1e-9):
                problems.append(
                    f"{s.name} {resource} now: the daemon's {amount!r} != the store's {expected!r}"
                )
    return problems


# -- one backend -----------------------------------------------------------------------


def requests_for(
    prefix: str, seed: int, jobs: int
) -> tuple[list[dict[str, Any]], list[str], list[pb.SubmitJobRequest]]:
    """The paper-scale servers, and ``jobs`` submissions with ids unique to the run
    (``PREFIX-RUN-i``)."""
    servers, specs = workload(seed, jobs)
    run_id = uuid.uuid4().hex[:8]
    ids = [f"{prefix}-{run_id}-{i}" for i in range(len(specs))]
    requests = [
        pb.SubmitJobRequest(job=spec_to_proto({**spec, "id": job_id}))
        for spec, job_id in zip(specs, ids, strict=True)
    ]
    return servers, ids, requests


def run_load(
    backend: str,
    store_url: str,
    workdir: Path,
    *,
    jobs: int,
    clients: int,
    seed: int = 1,
    max_seconds: float = 600.0,
    job_seconds: float = 120.0,
    monitor_interval: float = 0.5,
    fault: Callable[[], PgRestart] | None = None,
) -> LoadReport:
    """Start a daemon on ``store_url`` ("" : SQLite in ``workdir``), run the load, check.

    ``fault`` makes the PostgreSQL restart (given the load has started)."""
    servers, ids, requests = requests_for(backend, seed, jobs)
    run_id = uuid.uuid4().hex[:8]  # names this run's files
    data_dir = workdir / f"{backend}-{run_id}-data"
    config = write_config(
        workdir / f"{backend}-{run_id}.toml", data_dir, store_url, servers, epoch=time.time()
    )
    log_path = workdir / f"{backend}-{run_id}.log"
    daemon = Daemon(config, log_path).start(timeout=120)
    report = LoadReport(backend=backend, jobs=len(ids), clients=clients)
    load = Load(
        daemon.address,
        requests,
        clients,
        max_seconds=max_seconds,
        job_seconds=job_seconds,
        monitor_interval=monitor_interval,
    )
    restart = fault() if fault else None
    try:
        report.seconds = load.run(restart)
        url = store_url or f"sqlite:///{(data_dir / 'oasis.db').resolve()}"
        report.store_url = url
        found = check_store(url, ids, load.answers, servers)
        report.problems = found.problems + check_ledger(daemon.address, found.use, servers)
        report.allocation_rows = found.allocation_rows
    finally:
        code = daemon.stop()
    if code != 0:
        report.problems.append(f"oasisd exited with {code}; log: {log_path}")

    answers = list(load.answers.values())
    report.answered = len(answers)
    report.admitted = sum(a.admitted for a in answers)
    report.rejected = report.answered - report.admitted
    report.duplicates = sum(a.duplicate for a in answers)
    report.given_up = len(load.given_up)
    report.not_started = len(ids) - report.answered - report.given_up
    report.attempts = len(answers) + sum(load.failed_calls.values())  # calls made
    report.failed_calls = dict(load.failed_calls)
    report.per_second = report.answered / report.seconds if report.seconds > 0 else 0.0
    report.latency_p50_ms, report.latency_p99_ms, report.latency_max_ms = percentiles(
        [a.seconds * 1000.0 for a in answers]
    )
    report.call_p50_ms, report.call_p99_ms, _ = percentiles(
        [a.call_seconds * 1000.0 for a in answers]
    )
    report.decision_p50_ms, report.decision_p99_ms, _ = percentiles(
        [a.decision_ms for a in answers]
    )
    report.utilisation_samples = load.utilisation_samples
    report.utilisation_max = load.utilisation_max
    if load.utilisation_max > 1.0 + SHARE_TOLERANCE:
        report.problems.append(f"the monitor read a share of {load.utilisation_max!r} > 1")
    for job_id, why in list(load.given_up.items())[:5]:
        report.problems.append(f"{job_id}: given up: {why}")
    if report.not_started:
        report.problems.append(f"{report.not_started} jobs not submitted within --max-seconds")
    if restart is not None and restart.stopped_at:
        report.pg_down_seconds = restart.started_at - restart.stopped_at
        report.answered_while_down = sum(
            restart.stopped_at < a.answered_at < restart.started_at for a in answers
        )
        report.answered_after_restart = sum(a.answered_at > restart.started_at for a in answers)
    return report


# -- report ----------------------------------------------------------------------------


def print_table(reports: list[LoadReport], settings: dict[str, Any]) -> None:
    m = describe(grpcio=grpc.__version__)
    print(f"machine: {m['cpu']}, {m['cores']} cores; Python {m['python']}, grpcio {m['grpcio']}")
    print(
        f"servers: 50 worker + 50 PS, T = {WINDOW}; seed {settings['seed']}; "
        f"{settings['clients']} clients\n"
    )
    print(
        "| store | jobs | answered | admitted | per second | seconds | latency p50 / p99 / "
        "max ms | call p50 / p99 ms | attempts | failed calls | PG down s | checks |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in reports:
        failed = ", ".join(f"{k} {v}" for k, v in sorted(r.failed_calls.items())) or "0"
        down = f"{r.pg_down_seconds:.1f}" if r.pg_down_seconds else "-"
        checks = "pass" if not r.problems else f"{len(r.problems)} problems"
        print(
            f"| {r.backend} | {r.jobs} | {r.answered} | {r.admitted} | {r.per_second:.1f} "
            f"| {r.seconds:.1f} | {r.latency_p50_ms:.1f} / {r.latency_p99_ms:.1f} / "
            f"{r.latency_max_ms:.1f} | {r.call_p50_ms:.1f} / {r.call_p99_ms:.1f} "
            f"| {r.attempts} | {failed} | {down} | {checks} |"
        )
    for r in reports:
        print(
            f"\n{r.backend}: {r.allocation_rows} allocation rows; {r.duplicates} answers "
            f"were a retried id's first decision; monitor: {r.utilisation_samples} reads, "
            f"highest share {r.utilisation_max:.4f}; the daemon's search (decision_ms) p50 "
            f"{r.decision_p50_ms:.2f} / p99 {r.decision_p99_ms:.2f} ms"
        )
        if r.pg_down_seconds:
            print(
                f"{r.backend}: answered while PostgreSQL was down: {r.answered_while_down}; "
                f"after it restarted: {r.answered_after_restart}"
            )
        for p in r.problems[:20]:
            print(f"  problem: {p}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs per backend (10000)")
    parser.add_argument("--clients", type=int, default=32, help="client threads (32)")
    parser.add_argument("--backends", default="sqlite,postgresql", help="sqlite,postgresql")
    parser.add_argument("--seed", type=int, default=1, help="workload seed (1)")
    parser.add_argument(
        "--pg-restart",
        action="store_true",
        help="restart PostgreSQL once a third of the jobs are answered",
    )
    parser.add_argument(
        "--pg-down-seconds", type=float, default=3.0, help="keep it down at least this long (3)"
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=900.0,
        help="start no job after this long per backend (900)",
    )
    parser.add_argument(
        "--job-seconds",
        type=float,
        default=120.0,
        help="give a job up after retrying this long (120)",
    )
    parser.add_argument("--monitor-interval", type=float, default=0.5, help="seconds (0.5)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or any(b not in BACKENDS for b in backends):
        parser.error(f"--backends: choose from {', '.join(BACKENDS)}")
    if args.pg_restart and "postgresql" not in backends:
        parser.error("--pg-restart needs the postgresql backend")
    if min(args.jobs, args.clients) < 1 or min(args.max_seconds, args.job_seconds) <= 0:
        parser.error("--jobs, --clients, --max-seconds and --job-seconds must be > 0")

    workdir = Path(tempfile.mkdtemp(prefix="oasis-load-"))
    reports: list[LoadReport] = []
    postgres: Postgres | None = None
    try:
        for backend in backends:
            print(f"running {backend} ...", file=sys.stderr, flush=True)
            fault = None
            store_url = ""
            if backend == "postgresql":
                postgres = Postgres()
                store_url = postgres.new_database()
                if args.pg_restart:
                    fault = partial(PgRestart, postgres, args.jobs // 3, args.pg_down_seconds)
            reports.append(
                run_load(
                    backend,
                    store_url,
                    workdir,
                    jobs=args.jobs,
                    clients=args.clients,
                    seed=args.seed,
                    max_seconds=args.max_seconds,
                    job_seconds=args.job_seconds,
                    monitor_interval=args.monitor_interval,
                    fault=fault,
                )
            )
    finally:
        if postgres is not None:
            postgres.close()
        shutil.rmtree(workdir, ignore_errors=True)
    settings = {"seed": args.seed, "clients": args.clients, "pg_restart": args.pg_restart}
    if args.json:
        out = {
            "machine": describe(grpcio=grpc.__version__),
            "settings": settings,
            "results": [asdict(r) for r in reports],
        }
        print(json.dumps(out, indent=1))
    else:
        print_table(reports, settings)
    return 1 if any(r.problems for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
