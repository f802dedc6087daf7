"""A long run of ``oasisd`` under steady multi-tenant load: what grows or drifts with time.

What is measured
    ``oasisd`` runs as a subprocess on 127.0.0.1 (``tests.servers.Daemon``; SQLite store,
    slots of ``--slot-seconds`` (2 s), T = 24, ``bench/chaos.py``'s 8 worker + 4 PS
    servers, estimated price bounds, ``[metrics]``) with ``[mqtt]`` on a real Mosquitto
    (password file and the shipped ACL, ``bench/chaos.py``'s ``mqtt_table``) and a
    reference agent per server in this process (``bench/chaos.Agents``). For
    ``--seconds`` (1,200), ``--tenants`` (4) client threads, each its own gRPC channel and
    job-id prefix, submit at ``--rate`` jobs per second in all (3), paced:

    - 75 % jobs admitted or not on their merits (``bench/chaos.job_specs``' small jobs);
    - 10 % priced out (priority 0.001: rejected);
    - 15 % three-worker jobs of low priority (0.5-4) with ``wait_seconds`` 5-30: when
      not admitted at once, pending, decided again at each slot boundary until admitted
      or expired;

    and after each submission, at random: a cancel of one of the tenant's admitted jobs
    (8 %), a ``GetProgress`` (20 %), a ``GetJob`` (15 %), a page of ``ListJobs`` (10 %),
    ``ListServers`` and ``GetClusterInfo`` (status, 5 %). Hundreds of slot boundaries
    pass: plans, progress reviews, completions, pending re-decisions. No retention:
    ``keep_days`` is unset, so the store keeps every job and grows with them
    (``bench/soak.py`` deletes jobs all along; it is the careless, faulty counterpart of
    this steady run, with a census of the daemon's objects).

    Every ``--sample-seconds`` (30): the daemon's RSS, threads and open descriptors
    (``/proc``), its commit process's RSS, the store file with its WAL, the submit
    latency p50/p99 of the window (first call to answer, as ``bench/load_test.Load``
    measures it), the decisions answered in the window, and ``/metrics``
    (``oasis_decisions_total`` and the exposition's size and series).

Checks and figures
    At the end, with the broker stopped so nothing moves: every job answered at once
    (not pending) has one row and one ``decided`` event and its answer is the stored
    decision; no server over capacity in the store; the daemon's ledger
    (``GetUtilisation``, ``ListServers``) equals the stored allocations
    (``bench/load_test.py``'s checks, as ``bench/chaos.py`` runs them). Growth per hour of
    RSS, descriptors, threads, the store and the p99 latency: a least-squares line over
    the samples of the second half of the run (the first half is warm-up).

Methodology
    One machine; its cores shared by the daemon, its commit process, Mosquitto, the
    twelve agents and the clients. Wall-clock seconds from ``time.monotonic``; RSS from
    ``/proc/PID/status`` (``VmRSS``). Seeded (``--seed``), but the interleavings are not.

Run with
    .venv/bin/python -m bench.long_run                        # 20 minutes
    .venv/bin/python -m bench.long_run --seconds 120 --json   # a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import grpc
import structlog

from bench.chaos import (
    DAEMON_USER,
    WINDOW,
    Agents,
    job_specs,
    mqtt_table,
    servers,
)
from bench.daemon_throughput import percentiles, write_config
from bench.load_test import (
    RETRIED,
    Answer,
    capacity_problems,
    check_ledger,
    decision_problems,
    read_store,
    store_use,
)
from bench.machine import describe
from bench.soak import _children, _proc_status
from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.broker import Mosquitto
from tests.servers import ROOT, Daemon, commit_processes, free_port

KINDS = (("plain", 75), ("priced_out", 10), ("waiting", 15))


@dataclass
class Submitted:
    """One submission's answer, for the window's figures."""

    at: float  # monotonic
    ms: float
    kind: str
    state: int


@dataclass
class Traffic:
    """What the tenants did, shared under a lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    answers: dict[str, Answer] = field(default_factory=dict)  # decided at once
    pending: set[str] = field(default_factory=set)
    ids: list[str] = field(default_factory=list)
    submitted: list[Submitted] = field(default_factory=list)
    ops: dict[str, int] = field(default_factory=dict)

    def count(self, op: str) -> None:
        with self.lock:
            self.ops[op] = self.ops.get(op, 0) + 1


class Tenant(threading.Thread):
    """One tenant's client: paced submissions, cancels and reads (module docstring)."""

    def __init__(
        self, index: int, address: str, traffic: Traffic, rate: float, until: float, seed: int
    ) -> None:
        super().__init__(name=f"tenant-{index}", daemon=True)
        self.prefix = f"t{index}-{uuid.uuid4().hex[:6]}"
        self.traffic = traffic
        self.rate = rate
        self.until = until
        self.rng = random.Random(seed)
        self.channel = grpc.insecure_channel(address)
        self.admission = pb_grpc.AdmissionStub(self.channel)
        self.cluster = pb_grpc.ClusterStub(self.channel)
        self.admitted: list[str] = []
        self.n = 0

    def _spec(self, kind: str) -> dict[str, Any]:
        spec = job_specs(1, self.rng.randrange(1 << 30), "x")[0]
        spec["id"] = f"{self.prefix}-{self.n}"
        self.n += 1
        if kind == "priced_out":
            spec["utility"]["priority"] = 0.001
        elif kind == "waiting":  # marginal: often not admitted at once, so pending
            spec["chunks"] = 3
            spec["utility"]["priority"] = self.rng.uniform(0.5, 4.0)
        return spec

    def submit(self) -> None:
        kind = self.rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
        spec = self._spec(kind)
        wait = self.rng.uniform(5, 30) if kind == "waiting" else None
        request = pb.SubmitJobRequest(job=spec_to_proto(spec), wait_seconds=wait)
        t0 = time.perf_counter()
        attempts = 0
        while True:  # retried with the same id, as bench/load_test.Load does
            attempts += 1
            try:
                reply = self.admission.SubmitJob(request, timeout=30)
                break
            except grpc.RpcError as err:
                self.traffic.count(f"submit:{err.code().name}")
                if (
                    err.code() not in RETRIED
                    or time.perf_counter() - t0 > 60
                    or time.time() > self.until + 30
                ):
                    with self.traffic.lock:
                        self.traffic.ids.append(str(spec["id"]))
                    return
                time.sleep(0.2)
        now = time.perf_counter()
        job = reply.job
        with self.traffic.lock:
            self.traffic.ids.append(str(spec["id"]))
            self.traffic.submitted.append(
                Submitted(time.monotonic(), (now - t0) * 1000.0, kind, job.state)
            )
            if job.state == pb.JOB_STATE_PENDING:
                self.traffic.ops["answered_pending"] = (
                    self.traffic.ops.get("answered_pending", 0) + 1
                )
            if job.state == pb.JOB_STATE_PENDING or wait is not None:
                self.traffic.pending.add(str(spec["id"]))
            else:
                self.traffic.answers[str(spec["id"])] = Answer(
                    sequence=job.sequence, admitted=job.decision.admitted,
                    duplicate=reply.duplicate, attempts=attempts, seconds=now - t0,
                    call_seconds=now - t0, answered_at=now,
                )  # fmt: skip
        if job.decision.admitted and wait is None:
            self.admitted.append(str(spec["id"]))
            del self.admitted[:-50]
        self.traffic.count(f"submit:{kind}")

    def others(self) -> None:
        roll = self.rng.random()
        some = self.rng.choice(self.admitted) if self.admitted else "nope"
        if roll < 0.08 and self.admitted:
            self.admitted.remove(some)
            self.admission.CancelJob(pb.CancelJobRequest(id=some), timeout=20)
            self.traffic.count("cancel")  # its answer stays the stored decision
        elif roll < 0.28:
            self.admission.GetProgress(pb.GetProgressRequest(id=some), timeout=20)
            self.traffic.count("progress")
        elif roll < 0.43:
            self.admission.GetJob(pb.GetJobRequest(id=some), timeout=20)
            self.traffic.count("get_job")
        elif roll < 0.53:
            self.admission.ListJobs(pb.ListJobsRequest(page_size=50), timeout=20)
            self.traffic.count("list_jobs")
        elif roll < 0.58:
            self.cluster.ListServers(pb.ListServersRequest(), timeout=20)
            self.cluster.GetClusterInfo(pb.GetClusterInfoRequest(), timeout=20)
            self.traffic.count("status")

    def run(self) -> None:
        start = time.monotonic()
        i = 0
        while time.time() < self.until:
            time.sleep(max(0.0, start + i / self.rate - time.monotonic()))
            i += 1
            try:
                self.submit()
                self.others()
            except grpc.RpcError as err:
                self.traffic.count(f"other:{err.code().name}")
        self.channel.close()


# -- sampling --------------------------------------------------------------------------


def _metrics(port: int) -> dict[str, float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            body = r.read().decode()
    except OSError:
        return {}
    lines = [ln for ln in body.splitlines() if ln and not ln.startswith("#")]
    decisions = sum(
        float(ln.rsplit(" ", 1)[1]) for ln in lines if ln.startswith("oasis_decisions_total")
    )
    return {"metrics_bytes": len(body), "metrics_series": len(lines), "decisions_total": decisions}


def sample(
    daemon_pid: int, db: Path, traffic: Traffic, since: float, started: float, port: int
) -> dict[str, Any]:
    status = _proc_status(daemon_pid)
    commit = commit_processes(daemon_pid) or [k for k in _children(daemon_pid) if k != daemon_pid]
    commit_rss = sum(_proc_status(k).get("VmRSS", 0) for k in commit)
    try:
        fds = len(os.listdir(f"/proc/{daemon_pid}/fd"))
    except OSError:
        fds = -1
    store = sum(p.stat().st_size for p in db.parent.glob(db.name + "*") if p.is_file())
    now = time.monotonic()
    with traffic.lock:
        window = [s.ms for s in traffic.submitted if s.at >= since]
        total = len(traffic.submitted)
    p50, p99, _ = percentiles(window) if window else (0.0, 0.0, 0.0)
    return {
        "t": round(now - started, 1),
        "rss_mb": round(status.get("VmRSS", 0) / 1024, 1),
        "commit_rss_mb": round(commit_rss / 1024, 1),
        "fds": fds,
        "threads": status.get("Threads", 0),
        "store_mb": round(store / 1e6, 2),
        "p50_ms": round(p50, 1),
        "p99_ms": round(p99, 1),
        "decisions": len(window),
        "submitted": total,
        **_metrics(port),
    }


def slope_per_hour(samples: list[dict[str, Any]], key: str) -> float:
    """Least-squares slope of ``key`` over the second half of the run, per hour."""
    half = samples[len(samples) // 2 :]
    if len(half) < 2:
        return 0.0
    xs = [float(s["t"]) for s in half]
    ys = [float(s.get(key, 0.0)) for s in half]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return (
        0.0
        if den == 0
        else sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den * 3600
    )


# -- one run ---------------------------------------------------------------------------


@dataclass
class Report:
    seconds: float
    rate: float
    tenants: int
    slot_seconds: float
    machine: dict[str, Any] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    growth_per_hour: dict[str, float] = field(default_factory=dict)
    ops: dict[str, int] = field(default_factory=dict)
    jobs: int = 0
    pending: int = 0
    states: dict[str, int] = field(default_factory=dict)
    ledger_equals_store: bool = False
    problems: list[str] = field(default_factory=list)


GROWN = ("rss_mb", "commit_rss_mb", "fds", "threads", "store_mb", "p50_ms", "p99_ms",
         "metrics_series")  # fmt: skip


def _states(db: Path) -> dict[str, int]:
    import sqlite3

    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        return {
            str(s): int(n)
            for s, n in conn.execute("SELECT state, count(*) FROM jobs GROUP BY state")
        }


def _check(report: Report, address: str, db: Path, traffic: Traffic) -> None:
    """bench/chaos.py's checks, on the jobs answered at once (a pending job's answer is
    not its final decision); a few tries: a slot boundary between two reads is not a
    disagreement."""
    url = f"sqlite:///{db.resolve()}"
    problems: list[str] = ["not checked"]
    for _attempt in range(5):
        rows = read_store(url)
        found = decision_problems(rows, traffic.ids, traffic.answers)
        problems = [p for p in found if p.split(":", 1)[0] not in traffic.pending]
        use = store_use(rows)
        problems += capacity_problems(use, servers())
        ledger = check_ledger(address, use, servers())
        report.ledger_equals_store = not ledger
        problems += ledger
        if not problems:
            break
        time.sleep(1.0)
    report.problems += problems[:20]


def run(
    workdir: Path, seconds: float, rate: float, tenants: int, slot_seconds: float,
    sample_seconds: float, seed: int, progress: bool,
) -> Report:  # fmt: skip
    passwords = {DAEMON_USER: uuid.uuid4().hex, **{s["name"]: uuid.uuid4().hex for s in servers()}}
    acl = workdir / "mosquitto.acl"
    acl.write_text((ROOT / "config" / "mosquitto.acl").read_text())
    broker = Mosquitto(users=passwords, acl=acl)
    data_dir = workdir / "data"
    db = data_dir / "oasis.db"
    port = free_port()
    extra = (
        mqtt_table(broker, passwords[DAEMON_USER]) + f'\n[metrics]\nlisten = "127.0.0.1:{port}"\n'
    )
    config = write_config(workdir / "oasisd.toml", data_dir, "", servers(), time.time(),
                          slot_seconds=slot_seconds, window=WINDOW, extra=extra)  # fmt: skip
    daemon = Daemon(config, workdir / "oasisd.log").start(timeout=180)
    assert daemon.proc is not None
    agents = Agents(broker, passwords)
    report = Report(seconds, rate, tenants, slot_seconds, machine=dict(describe()))
    traffic = Traffic()
    try:
        for s in servers():
            agents.start(str(s["name"]))
        started = time.monotonic()
        until = time.time() + seconds
        threads = [Tenant(i, daemon.address, traffic, rate / tenants, until, seed + i)
                   for i in range(tenants)]  # fmt: skip
        for t in threads:
            t.start()
        since = started
        while time.monotonic() - started < seconds:
            time.sleep(max(0.0, min(sample_seconds, seconds - (time.monotonic() - started))))
            row = sample(daemon.proc.pid, db, traffic, since, started, port)
            since = time.monotonic()
            report.samples.append(row)
            if progress:
                print(" ".join(f"{k}={v}" for k, v in row.items()), file=sys.stderr, flush=True)
        for t in threads:
            t.join(120)
        broker.kill()  # quiet: nothing reported or failed; then compare
        time.sleep(1.0)
        _check(report, daemon.address, db, traffic)
        code = daemon.stop()
        if code != 0:
            report.problems.append(f"oasisd exited with {code}")
    finally:
        agents.close()
        if daemon.proc.poll() is None:
            daemon.stop()
        broker.close()
    report.ops = dict(sorted(traffic.ops.items()))
    report.jobs = len(traffic.ids)
    report.pending = len(traffic.pending)
    with contextlib.suppress(Exception):
        report.states = _states(db)
    report.growth_per_hour = {k: round(slope_per_hour(report.samples, k), 2) for k in GROWN}
    return report


def print_report(r: Report, command: str) -> None:
    print(f"{command}\nmachine: {r.machine}")
    print(f"{r.seconds:.0f} s, {r.rate} jobs/s from {r.tenants} tenants, slots of "
          f"{r.slot_seconds} s; {r.jobs} jobs ({r.pending} with wait_seconds)")  # fmt: skip
    cols = ("t", "rss_mb", "commit_rss_mb", "fds", "threads", "store_mb", "p50_ms", "p99_ms",
            "decisions", "metrics_series")  # fmt: skip
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for s in r.samples:
        print("| " + " | ".join(str(s.get(c, "")) for c in cols) + " |")
    print("growth per hour (least squares over the second half):")
    for k, v in r.growth_per_hour.items():
        print(f"  {k}: {v:+.2f}")
    print(f"operations: {r.ops}")
    print(f"stored jobs by state: {r.states}")
    print(f"ledger == store: {r.ledger_equals_store}; problems: {r.problems or 'none'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1200.0)
    parser.add_argument("--rate", type=float, default=3.0, help="jobs per second, all tenants")
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--slot-seconds", type=float, default=2.0)
    parser.add_argument("--sample-seconds", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", type=Path, help="keep the run's directory here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="oasis-long-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        agent_log: TextIO = open(workdir / "agents.log", "w")  # noqa: SIM115
        structlog.configure(  # the agents' warnings and errors, to a file
            processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(),
                        structlog.processors.JSONRenderer()],
            logger_factory=structlog.PrintLoggerFactory(agent_log),
            wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        )  # fmt: skip
        report = run(workdir, args.seconds, args.rate, args.tenants, args.slot_seconds,
                     args.sample_seconds, args.seed, progress=not args.json)  # fmt: skip
        agent_log.close()
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        print_report(report, " ".join(["python -m bench.long_run", *(argv or sys.argv[1:])]))
    return 1 if report.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
