"""Throughput of the daemon ``oasisd`` through its real gRPC API, on SQLite and PostgreSQL.

What is measured
    ``oasisd`` runs as a subprocess on a loopback port at the paper's scale: 50 worker +
    50 PS servers from ``pricing.workload.paper_cluster_servers`` (seeded), a window of
    T = 300 slots of 3600 s, and the epoch set to the start of the run, so every job is
    submitted in slot 0 and arrives at slot 1. The jobs are those of
    ``pricing.workload.generate_trace`` with the same seed and cluster (horizon 300),
    without their ``arrival`` (the daemon sets it) and with ids unique to the run.

    ``--clients`` threads, each with its own gRPC channel, call ``SubmitJob`` back to back
    until every job is submitted (decisions are serialised inside the daemon; the
    concurrency only keeps it busy). Meanwhile one more thread, on its own channel, calls
    the standard health check (``grpc.health.v1.Health/Check``) every ``--health-interval``
    seconds. Per backend:

    - sustained throughput: decisions over the wall time from the first submission to
      the last answer;
    - submit latency (client side, call to answer) p50 / p99 / max;
    - health-check latency p50 / p99 / max while the submissions run;
    - admitted and rejected jobs, failed calls;
    - the daemon's own ``decision.decision_ms`` (the best-schedule search and, for a
      rejection, its explanation; no SQL, no gRPC) p50 / p99;
    - the allocation rows the store holds at the end (one per job, slot and server).

    - CPU milliseconds per decision (``bench.cpu_use``) of the daemon's process, its
      commit process, PostgreSQL's server, this process (the clients), and the whole
      machine; with the machine's cores they give the rate its CPU allows:
      ``cores / machine CPU per decision``, whichever process spends it.

    Goals (issue 16): >= 500 decisions/s on SQLite and >= 300/s on PostgreSQL with 8
    clients, p99 submit latency <= 50 ms, p99 health-check latency <= 20 ms while
    submissions run.

Methodology
    Each backend gets a fresh store: a SQLite file in a temporary directory, or a new
    database on a throwaway PostgreSQL server (``tests.servers.Postgres``: loopback,
    ``fsync=off``). The daemon logs at ``info`` (one JSON line per decision) to a file.
    Before timing, every channel is connected and the daemon quotes one job (which
    commits nothing), so connection set-up and first-call costs are not in the numbers.
    Latencies are ``time.perf_counter`` around each blocking call. Jobs come from fixed
    seeds, so every run submits the same jobs in the same order (which client submits
    which job, and so the decision order, depends on thread scheduling). Loops are
    bounded: ``--max-seconds`` per backend, after which no more jobs are submitted.
    Nothing else should run on the machine: client threads, the daemon and PostgreSQL
    share its cores.

Run with
    .venv/bin/python -m bench.daemon_throughput
    .venv/bin/python -m bench.daemon_throughput --jobs 500 --backends sqlite   # quicker
    .venv/bin/python -m bench.daemon_throughput --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import create_engine, text

from bench.cpu_use import CpuUse
from bench.machine import describe
from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from pricing.workload import generate_trace, paper_cluster_servers
from tests.servers import Daemon, Postgres

N_SERVERS = 50  # worker servers, and as many PS servers
WINDOW = 300
SLOT_SECONDS = 3600
BACKENDS = ("sqlite", "postgresql")
GOALS = {  # issue 16 (8 clients, the daemon's defaults: durable commits)
    "sqlite_decisions_per_s": 500.0,
    "postgresql_decisions_per_s": 300.0,
    "submit_p99_ms": 50.0,
    "health_p99_ms": 20.0,
}


@dataclass
class BackendResult:
    backend: str
    jobs: int
    clients: int
    submitted: int = 0
    decisions: int = 0
    admitted: int = 0
    rejected: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    seconds: float = 0.0
    decisions_per_s: float = 0.0
    submit_p50_ms: float = 0.0
    submit_p99_ms: float = 0.0
    submit_max_ms: float = 0.0
    decision_p50_ms: float = 0.0
    decision_p99_ms: float = 0.0
    health_checks: int = 0
    health_failures: int = 0
    health_p50_ms: float = 0.0
    health_p99_ms: float = 0.0
    health_max_ms: float = 0.0
    allocation_rows: int = 0
    timed_out: bool = False
    # group commit, from the daemon's "group commit" log line at its stop
    batches: int = 0
    mean_batch: float = 0.0
    commit_ms_mean: float = 0.0
    # --ceilings: the same machine and run, without the daemon around them
    grpc_ceiling_per_s: float | None = None
    grpc_front_ceiling_per_s: float | None = None
    """The gRPC ceiling behind the daemon's interceptors (bench.throughput_ceilings)."""
    commit_ceiling_k1_per_s: float | None = None
    commit_ceiling_k32_per_s: float | None = None
    # CPU milliseconds per decision over the submissions (bench.cpu_use): the daemon's
    # process, its commit process, the store's server (PostgreSQL), this process (the
    # clients and the health checker), and the whole machine; its cores
    cpu_ms: dict[str, float] = field(default_factory=dict)
    cores: int = 0


# -- workload and config ---------------------------------------------------------------


def workload(
    seed: int,
    n_jobs: int,
    n_worker: int = N_SERVERS,
    n_ps: int = N_SERVERS,
    window: int = WINDOW,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The cluster's servers (``n_worker`` + ``n_ps``) and ``n_jobs`` job specs over a
    horizon of ``window`` slots (no arrival, ids ``j0..``)."""
    servers = paper_cluster_servers(np.random.default_rng(seed), n_worker, n_ps)
    trace = generate_trace(
        np.random.default_rng(seed),
        n_jobs=n_jobs,
        n_worker_servers=n_worker,
        n_ps_servers=n_ps,
        horizon=window,
        slot_seconds=SLOT_SECONDS,
    )
    # generate_trace draws its cluster first, from the same generator: the jobs fit it
    assert trace["servers"] == servers
    raw_jobs = trace["jobs"]
    assert isinstance(raw_jobs, list)
    jobs = [{k: v for k, v in job.items() if k != "arrival"} for job in raw_jobs]
    return servers, jobs


def _toml_value(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        inner = ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items())
        return "{" + inner + "}"
    raise TypeError(f"cannot write {value!r} as TOML")


def write_config(
    path: Path,
    data_dir: Path,
    store_url: str,
    servers: list[dict[str, Any]],
    epoch: float,
    *,
    slot_seconds: float = SLOT_SECONDS,
    window: int = WINDOW,
    extra: str = "",
    sqlite_synchronous: str = "full",
) -> Path:
    """An oasisd TOML config: loopback on a free port, T = 300 (``window``), the given
    servers; ``extra`` (TOML tables, e.g. ``[mqtt]``) goes before ``[cluster]``;
    ``sqlite_synchronous`` other than the default is written as ``daemon.sqlite_synchronous``."""
    synchronous = (
        "" if sqlite_synchronous == "full" else f'sqlite_synchronous = "{sqlite_synchronous}"\n'
    )
    rows = ",\n".join(f"  {_toml_value(s)}" for s in servers)
    path.write_text(
        f"""[daemon]
listen = "127.0.0.1:0"
data_dir = {_toml_value(str(data_dir))}
store_url = {_toml_value(store_url)}
slot_seconds = {slot_seconds}
window = {window}
epoch = {epoch!r}
log_level = "info"
{synchronous}
[pricing]
bounds = "estimate"
{extra}
[cluster]
resources = ["gpu", "cpu", "mem", "disk", "bandwidth"]
servers = [
{rows},
]
""",
        encoding="utf-8",
    )
    return path


# -- load ------------------------------------------------------------------------------


def percentiles(values: list[float]) -> tuple[float, float, float]:
    """``(p50, p99, max)`` of ``values`` in their own unit; zeros when empty."""
    if not values:
        return 0.0, 0.0, 0.0
    arr = np.asarray(values)
    return (
        float(np.percentile(arr, 50)),
        float(np.percentile(arr, 99)),
        float(arr.max()),
    )


class Load:
    """Client threads submitting a shared list of requests, and a health-check thread."""

    def __init__(
        self,
        address: str,
        requests: list[pb.SubmitJobRequest],
        clients: int,
        health_interval: float,
        max_seconds: float,
    ) -> None:
        self.address = address
        self.requests = requests
        self.clients = clients
        self.health_interval = health_interval
        self.max_seconds = max_seconds
        self._next = 0
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.deadline = 0.0
        self.submit_ms: list[float] = []
        self.decision_ms: list[float] = []
        self.admitted = 0
        self.rejected = 0
        self.errors: list[str] = []
        self.health_ms: list[float] = []
        self.health_failures = 0
        self.timed_out = False

    def _take(self) -> pb.SubmitJobRequest | None:
        with self._lock:
            if self._next >= len(self.requests):
                return None
            if time.perf_counter() > self.deadline:
                self.timed_out = True
                return None
            request = self.requests[self._next]
            self._next += 1
            return request

    def _client(self, channel: grpc.Channel, start: threading.Barrier) -> None:
        stub = pb_grpc.AdmissionStub(channel)
        latencies: list[float] = []
        decisions: list[float] = []
        admitted = rejected = 0
        errors: list[str] = []
        start.wait()
        while (request := self._take()) is not None:
            t0 = time.perf_counter()
            try:
                response = stub.SubmitJob(request, timeout=60)
            except grpc.RpcError as err:
                errors.append(f"{request.job.id}: {err.code()} {err.details()}")
                continue
            latencies.append((time.perf_counter() - t0) * 1000.0)
            decision = response.job.decision
            decisions.append(decision.decision_ms)
            if decision.admitted:
                admitted += 1
            else:
                rejected += 1
        with self._lock:
            self.submit_ms.extend(latencies)
            self.decision_ms.extend(decisions)
            self.admitted += admitted
            self.rejected += rejected
            self.errors.extend(errors)

    def _health(self, channel: grpc.Channel, start: threading.Barrier) -> None:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="")
        start.wait()
        next_at = time.perf_counter()
        while not self._done.is_set() and time.perf_counter() < self.deadline:
            t0 = time.perf_counter()
            try:
                status = stub.Check(request, timeout=10).status
                ok = status == health_pb2.HealthCheckResponse.SERVING
            except grpc.RpcError:
                ok = False
            elapsed = (time.perf_counter() - t0) * 1000.0
            if ok:
                self.health_ms.append(elapsed)
            else:
                self.health_failures += 1
            next_at += self.health_interval
            self._done.wait(max(0.0, next_at - time.perf_counter()))

    def run(self) -> float:
        """Submit every request; the wall time from the first call to the last answer."""
        channels = [grpc.insecure_channel(self.address) for _ in range(self.clients + 1)]
        try:
            for channel in channels:
                grpc.channel_ready_future(channel).result(timeout=30)
                health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=30
                )
            # a first decision through the whole path; commits nothing
            pb_grpc.AdmissionStub(channels[0]).QuoteJob(
                pb.QuoteJobRequest(job=self.requests[0].job), timeout=60
            )
            start = threading.Barrier(self.clients + 2)
            threads = [
                threading.Thread(target=self._client, args=(ch, start), name=f"client-{i}")
                for i, ch in enumerate(channels[: self.clients])
            ]
            health = threading.Thread(
                target=self._health, args=(channels[-1], start), name="health"
            )
            for t in (*threads, health):
                t.start()
            self.deadline = time.perf_counter() + self.max_seconds
            start.wait()
            t0 = time.perf_counter()
            for t in threads:
                t.join()
            seconds = time.perf_counter() - t0
            self._done.set()
            health.join()
            return seconds
        finally:
            for channel in channels:
                channel.close()


# -- one backend -----------------------------------------------------------------------


def count_allocations(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM allocations")).scalar_one())
    finally:
        engine.dispose()


def group_commit_stats(log_path: Path) -> dict[str, Any]:
    """The daemon's "group commit" summary line (logged at its stop), or {}."""
    found: dict[str, Any] = {}
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        if '"group commit"' in line:
            try:
                found = json.loads(line)
            except ValueError:
                continue
    return found


def ceilings(
    result: BackendResult,
    new_store: Any,
    servers: list[dict[str, Any]],
    jobs: list[dict[str, Any]],
    requests: list[pb.SubmitJobRequest],
    args: argparse.Namespace,
    workdir: Path,
) -> None:
    """Measure the gRPC and commit ceilings (bench.throughput_ceilings) into ``result``;
    ``new_store()`` gives a fresh store URL ("" for SQLite in a new data directory)."""
    from bench import throughput_ceilings as tc

    def config(name: str) -> Path:
        return write_config(
            workdir / f"{name}.toml", workdir / f"{name}-data", new_store(), servers,
            epoch=time.time(), sqlite_synchronous=args.sqlite_synchronous,
        )  # fmt: skip

    tag = f"{result.backend}-ceiling"
    sets = tc.write_sets(config(f"{tag}-decide"), jobs[: args.ceiling_jobs], uuid.uuid4().hex[:8])
    result.commit_ceiling_k1_per_s = tc.commit_ceiling(config(f"{tag}-k1"), sets, 1)
    result.commit_ceiling_k32_per_s = tc.commit_ceiling(config(f"{tag}-k32"), sets, 32)
    rejected = next((j for j in reversed(jobs) if j), jobs[0])
    response = tc.canned_response(config(f"{tag}-answer"), {**rejected, "id": "canned"})
    calls = requests[: max(args.ceiling_jobs, 8 * args.clients)]
    result.grpc_ceiling_per_s = tc.grpc_ceiling(response, args.clients, calls, args.max_seconds)
    result.grpc_front_ceiling_per_s = tc.grpc_ceiling(
        response, args.clients, calls, args.max_seconds, front=True
    )


def run_backend(
    backend: str,
    store_url: str,
    servers: list[dict[str, Any]],
    jobs: list[dict[str, Any]],
    args: argparse.Namespace,
    workdir: Path,
    store_pids: list[int] | None = None,
) -> BackendResult:
    """One backend's run; ``store_pids``: the store server's processes (PostgreSQL's
    postmaster), whose CPU is counted with the run's."""
    run_id = uuid.uuid4().hex[:8]
    requests = [
        pb.SubmitJobRequest(job=spec_to_proto({**job, "id": f"{backend}-{run_id}-{i}"}))
        for i, job in enumerate(jobs)
    ]
    data_dir = workdir / f"{backend}-data"
    limits = f"[limits]\nrate = {args.rate!r}\nburst = {args.rate!r}\n" if args.rate else ""
    config = write_config(
        workdir / f"{backend}.toml", data_dir, store_url, servers, epoch=time.time(),
        sqlite_synchronous=args.sqlite_synchronous, extra=limits,
    )  # fmt: skip
    log_path = workdir / f"{backend}.log"
    daemon = Daemon(config, log_path).start(timeout=120)
    load = Load(daemon.address, requests, args.clients, args.health_interval, args.max_seconds)
    assert daemon.proc is not None
    trees = {"daemon": [daemon.proc.pid], "daemon and commit": [daemon.proc.pid],
             "store server": store_pids or []}  # fmt: skip
    cpu = CpuUse.take(trees, alone=["daemon"])
    try:
        seconds = load.run()
        spent = cpu.since()
    finally:
        code = daemon.stop()
    if code != 0:
        raise RuntimeError(f"oasisd exited with {code}; log: {log_path}")
    if args.keep_logs:
        shutil.copy(log_path, Path(args.keep_logs) / f"oasisd-{backend}.log")
    url = store_url or f"sqlite:///{(data_dir / 'oasis.db').resolve()}"
    decisions = load.admitted + load.rejected
    per = 1000.0 / max(decisions, 1)
    cpu_ms = {
        "daemon": spent["daemon"] * per,
        "commit process": (spent["daemon and commit"] - spent["daemon"]) * per,
        "store server": spent["store server"] * per,
        "clients": spent["this process"] * per,
        "machine": spent["machine"] * per,
    }
    stats = group_commit_stats(log_path)
    s50, s99, smax = percentiles(load.submit_ms)
    d50, d99, _ = percentiles(load.decision_ms)
    h50, h99, hmax = percentiles(load.health_ms)
    return BackendResult(
        backend=backend,
        jobs=len(jobs),
        clients=args.clients,
        submitted=decisions + len(load.errors),
        decisions=decisions,
        admitted=load.admitted,
        rejected=load.rejected,
        errors=len(load.errors),
        error_samples=load.errors[:5],
        seconds=seconds,
        decisions_per_s=decisions / seconds if seconds > 0 else 0.0,
        submit_p50_ms=s50,
        submit_p99_ms=s99,
        submit_max_ms=smax,
        decision_p50_ms=d50,
        decision_p99_ms=d99,
        health_checks=len(load.health_ms) + load.health_failures,
        health_failures=load.health_failures,
        health_p50_ms=h50,
        health_p99_ms=h99,
        health_max_ms=hmax,
        allocation_rows=count_allocations(url),
        timed_out=load.timed_out,
        batches=int(stats.get("batches", 0)),
        mean_batch=float(stats.get("mean_batch", 0.0)),
        commit_ms_mean=float(stats.get("commit_ms_mean", 0.0)),
        cpu_ms=cpu_ms,
        cores=os.cpu_count() or 1,
    )


# -- report ----------------------------------------------------------------------------


def goals(results: list[BackendResult]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for r in results:
        target = GOALS[f"{r.backend}_decisions_per_s"]
        out.append({"backend": r.backend, "goal": f"sustained >= {target:.0f} decisions/s",
                    "measured": r.decisions_per_s, "met": r.decisions_per_s >= target})  # fmt: skip
        out.append({"backend": r.backend, "goal": f"p99 submit <= {GOALS['submit_p99_ms']:.0f} ms",
                    "measured": r.submit_p99_ms,
                    "met": r.submit_p99_ms <= GOALS["submit_p99_ms"]})  # fmt: skip
        out.append({"backend": r.backend, "goal": f"p99 health <= {GOALS['health_p99_ms']:.0f} ms",
                    "measured": r.health_p99_ms,
                    "met": r.health_p99_ms <= GOALS["health_p99_ms"]})  # fmt: skip
    for g in out:
        if any(r.backend == g["backend"] and (r.errors or r.timed_out) for r in results):
            g["met"] = False  # an incomplete run meets nothing
    return out


def machine() -> dict[str, str]:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return describe(grpcio=grpc.__version__, load_average=load)


def print_table(results: list[BackendResult], settings: dict[str, Any]) -> None:
    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores; Python {m['python']}, grpcio "
          f"{m['grpcio']}; load average at the end {m['load_average']}")  # fmt: skip
    print(
        f"servers: {N_SERVERS} worker + {N_SERVERS} PS, T = {WINDOW}; seed {settings['seed']}; "
        f"{settings['clients']} client threads; health check every "
        f"{settings['health_interval'] * 1000:.0f} ms; limits.rate "
        f"{settings['rate']:g}{' (off)' if not settings['rate'] else ''}\n"
    )
    print(
        "| store | jobs | decisions/s | seconds | admitted | rejected | errors "
        "| submit p50 / p99 / max ms | decision_ms p50 / p99 | health checks "
        "| health p50 / p99 / max ms | allocation rows |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r.backend} | {r.decisions} | {r.decisions_per_s:.1f} | {r.seconds:.1f} "
            f"| {r.admitted} | {r.rejected} | {r.errors} "
            f"| {r.submit_p50_ms:.1f} / {r.submit_p99_ms:.1f} / {r.submit_max_ms:.1f} "
            f"| {r.decision_p50_ms:.2f} / {r.decision_p99_ms:.2f} | {r.health_checks} "
            f"| {r.health_p50_ms:.1f} / {r.health_p99_ms:.1f} / {r.health_max_ms:.1f} "
            f"| {r.allocation_rows} |"
        )
    print(
        "\n| store | batches | mean batch | commit ms per batch | gRPC ceiling /s "
        "| behind the daemon's interceptors /s "
        "| commit ceiling k=1 / k=32 /s | share of gRPC / k=1 / k=32 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        gc, k1, k32 = r.grpc_ceiling_per_s, r.commit_ceiling_k1_per_s, r.commit_ceiling_k32_per_s
        front = r.grpc_front_ceiling_per_s

        def share(ceiling: float | None, rate: float = r.decisions_per_s) -> str:
            return "-" if not ceiling else f"{rate / ceiling:.0%}"

        print(
            f"| {r.backend} | {r.batches} | {r.mean_batch:.2f} | {r.commit_ms_mean:.2f} "
            f"| {'-' if gc is None else f'{gc:.0f}'} "
            f"| {'-' if front is None else f'{front:.0f}'} "
            f"| {'-' if k1 is None else f'{k1:.0f}'} / {'-' if k32 is None else f'{k32:.0f}'} "
            f"| {share(gc)} / {share(k1)} / {share(k32)} |"
        )
    print(
        "\n| store | CPU ms per decision: daemon / commit process / store server / clients "
        "| machine (all processes) | cores busy | the cores' cap at this CPU /s |"
    )
    print("|---|---|---|---|---|")
    for r in results:
        c = r.cpu_ms
        if not c:
            continue
        busy = c["machine"] * r.decisions_per_s / 1000.0
        cap = 1000.0 * r.cores / c["machine"] if c["machine"] > 0 else float("inf")
        print(
            f"| {r.backend} | {c['daemon']:.2f} / {c['commit process']:.2f} / "
            f"{c['store server']:.2f} / {c['clients']:.2f} | {c['machine']:.2f} "
            f"| {busy:.2f} of {r.cores} | {cap:.0f} |"
        )
    print("\n| store | goal | measured | met |\n|---|---|---|---|")
    for g in goals(results):
        print(f"| {g['backend']} | {g['goal']} | {g['measured']:.1f} | "
              f"{'yes' if g['met'] else 'no'} |")  # fmt: skip
    for r in results:
        if r.errors:
            print(f"\n{r.backend}: {r.errors} failed submissions, e.g. {r.error_samples}")
        if r.timed_out:
            print(f"\n{r.backend}: stopped after --max-seconds; not every job was submitted")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--jobs", type=int, default=2500, help="jobs per backend (2500)")
    parser.add_argument("--clients", type=int, default=8, help="client threads (8)")
    parser.add_argument("--backends", default="sqlite,postgresql", help="sqlite,postgresql")
    parser.add_argument("--seed", type=int, default=1, help="workload seed (1)")
    parser.add_argument("--health-interval", type=float, default=0.02, help="seconds (0.02)")
    parser.add_argument("--max-seconds", type=float, default=300.0,
                        help="stop submitting after this long per backend (300)")  # fmt: skip
    parser.add_argument("--keep-logs", metavar="DIR", help="copy the daemon logs here")
    parser.add_argument(
        "--sqlite-synchronous", choices=("full", "normal"), default="full",
        help="daemon.sqlite_synchronous of the SQLite run (full: the daemon's default)",
    )  # fmt: skip
    parser.add_argument(
        "--ceilings", action="store_true",
        help="also measure the gRPC and commit ceilings (bench/throughput_ceilings.py)",
    )  # fmt: skip
    parser.add_argument("--ceiling-jobs", type=int, default=600,
                        help="decisions committed and calls made per ceiling (600)")  # fmt: skip
    parser.add_argument(
        "--rate", type=float, default=0.0,
        help="limits.rate (and burst) per client, as config/oasisd.example.toml turns it "
        "on; high enough not to refuse the clients (0: off, the daemon's default)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown or not backends:
        parser.error(f"--backends: unknown {unknown} (known: {', '.join(BACKENDS)})")
    if args.rate < 0:
        parser.error("--rate must be >= 0")
    if args.jobs < 1 or args.clients < 1 or args.health_interval <= 0 or args.max_seconds <= 0:
        parser.error("--jobs, --clients, --health-interval and --max-seconds must be > 0")

    servers, jobs = workload(args.seed, args.jobs)
    results: list[BackendResult] = []
    workdir = Path(tempfile.mkdtemp(prefix="oasis-throughput-"))
    postgres: Postgres | None = None
    try:
        for backend in backends:
            print(f"running {backend} ...", file=sys.stderr, flush=True)
            if backend == "postgresql":
                postgres = Postgres()
                store_url = postgres.new_database()
            else:
                store_url = ""  # SQLite in the data directory
            pids = [postgres.processes()[0]] if backend == "postgresql" and postgres else None
            result = run_backend(backend, store_url, servers, jobs, args, workdir, pids)
            if args.ceilings:
                print(f"measuring {backend}'s ceilings ...", file=sys.stderr, flush=True)
                pg = postgres
                new_store = pg.new_database if pg is not None else (lambda: "")
                requests = [
                    pb.SubmitJobRequest(job=spec_to_proto({**job, "id": f"ceiling-{i}"}))
                    for i, job in enumerate(jobs)
                ]
                ceilings(result, new_store, servers, jobs, requests, args, workdir)
            results.append(result)
    finally:
        if postgres is not None:
            postgres.close()
        shutil.rmtree(workdir, ignore_errors=True)

    settings = {
        "rate": args.rate,
        "seed": args.seed,
        "clients": args.clients,
        "health_interval": args.health_interval,
        "servers": f"{N_SERVERS} worker + {N_SERVERS} PS",
        "window": WINDOW,
    }
    if args.json:
        out = {
            "machine": machine(),
            "settings": settings,
            "results": [asdict(r) for r in results],
            "goals": goals(results),
        }
        print(json.dumps(out, indent=1))
    else:
        print_table(results, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
