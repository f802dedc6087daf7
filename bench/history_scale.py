"""What a long history in the store costs the daemon: start-up, memory and the calls that
should not grow with it.

What is measured
    A store that holds ``--jobs`` jobs of history (10^4, 10^5, 10^6: a busy shared
    cluster after days, weeks, a year with ``keep_days = 0``), written straight into the
    schema of ``controller/store/models.py`` with SQLAlchemy Core bulk inserts
    (:func:`write_history`): the submissions are spread evenly over a year of hourly slots
    before the current one; 90 % rejected (one ``decided`` event), 3 % expired after a
    wait (two events), 4 % completed, 2 % cancelled and 1 % failed (admitted: three events
    each, allocation rows on a worker and a PS server in past slots); 20 submitters. The
    cluster: 64 worker servers of 8 GPUs and 16 PS servers (room for the history's
    admitted jobs), window 24, ``[auth]`` with an operator's and a submitter's token.

    ``startup``: ``oasisd`` as a subprocess; seconds from its start to the line it prints
    once it is READY and serving, and its resident memory then (``VmRSS``) and at peak
    (``VmHWM``), from ``/proc``.

    ``calls``: with that daemon, the median (and max) wall time of ``--repeat`` calls
    each, over gRPC on loopback: a new job's SubmitJob, ListJobs' first page (all
    states; one state: ``running``; the states of ``oasis status``: running and
    admitted, every page), GetJob of an old job; over HTTP: the console's
    ``/api/overview`` and ``/api/jobs`` (first page, and ``?q=`` an id prefix), and the
    Prometheus ``/metrics`` scrape.

    ``tick``: in-process (``AdmissionController``, a fake clock), the slot tick at the
    next boundary (``_move_jobs``), and the store reads the daemon opens with.

    ``offline`` / ``calibrate``: ``oasis offline --store URL --from S --to S`` over the
    last day, and ``oasis calibrate --store URL``, as subprocesses: wall time and peak
    memory (``ru_maxrss`` of the child).

    ``retention``: ``keep_days = 30`` turned on in-process over a copy of the store: the
    first pass's steps (``Retention._prune_sync``: count, p50 / max ms a step, total),
    each a decision-thread step every tenant's calls wait for once.

    ``migration``: the upgrade to migration 0008 (job ids per submitter) over a copy of
    the store taken back to 0007 first: seconds of ``migrate`` (the daemon runs it at
    its first start after the upgrade), and the jobs it renamed.

    ``copy``: ``oasis store copy --from URL --to PG`` into a new database of a
    throwaway PostgreSQL (a SQLite store moving to PostgreSQL, for two head nodes), as a
    subprocess: wall time, peak memory, rows copied.

    PostgreSQL is a throwaway server (``tests.servers.Postgres``: loopback, ``fsync=off``),
    SQLite a file with the daemon's defaults. Stores are cached in ``--cache`` between runs.

Run with
    ``python -m bench.history_scale --jobs 10000,100000 --backends sqlite[,postgresql]
    [--parts startup,calls,tick,offline,calibrate,retention,migration,copy] [--cache DIR] [--json]``
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import structlog
from sqlalchemy import func, insert, select

from bench.machine import describe
from bench.retention import timed_pass
from controller.admission import AdmissionController
from controller.admission.state import SETTINGS_KEY
from controller.admission.views import canonical_spec
from controller.clock import FakeClock, SlotClock
from controller.config import load
from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.store import AllocationRow, Database, EventRow, JobRow, MetaRow, migrate
from controller.store.models import ServerRow
from tests.servers import ROOT, SMALL_JOB, Daemon, Postgres

SLOT = 3600.0
SPAN = 8760
"""Slots of history: a year of hourly slots before the current one."""
WINDOW = 24
SUBMITTERS = 20
CHUNK = 20_000
TOKENS = {"ops": ("operator", "ops-token"), "team01": ("submitter", "team01-token")}
"""The daemon's tokens: an operator, and one of the 20 submitters (1/20 of the history)."""
PORTS = range(47300, 47400)
"""Loopback ports the daemons of this benchmark may listen on."""

WORKERS, PS = 64, 16
_WORKER = "{gpu=8, cpu=64, mem=488, disk=500, bandwidth=40}"
_PS = "{cpu=36, mem=60, disk=500, bandwidth=25}"
CLUSTER_TOML = "\n".join([
    "[cluster]", 'resources = ["gpu", "cpu", "mem", "disk", "bandwidth"]', "servers = [",
    *(f'  {{name="w{i}", kind="worker", capacity={_WORKER}}},' for i in range(WORKERS)),
    *(f'  {{name="p{i}", kind="ps", capacity={_PS}}},' for i in range(PS)),
    "]",
])  # fmt: skip
"""64 worker servers of 8 GPUs and 16 PS servers: room for the history's admitted jobs."""

# share of jobs per outcome, in hundredths (the rest, 90, rejected)
_OUTCOMES = ["rejected"] * 90 + ["expired"] * 3 + ["completed"] * 4 + ["cancelled"] * 2 + ["failed"]
_ADMITTED = ("completed", "cancelled", "failed")
_BEFORE = [sum(_OUTCOMES[(k * 37) % 100] in _ADMITTED for k in range(j)) for j in range(101)]
"""Admitted jobs among the first ``j`` of each hundred."""


def _epoch() -> float:
    """Slot 0 such that the current slot is :data:`SPAN` (and its first half-hour)."""
    return time.time() - SPAN * SLOT - 60.0


LAYOUT = 2
"""The rows' layout, in the cached stores' names: 2 since jobs are keyed NAME:ID (0008)."""


def job_id(i: int) -> str:
    """Job ``i``'s key: its submitter's name and its id (:mod:`controller.job_keys`)."""
    return f"team{i % SUBMITTERS:02d}:job-{i:08d}"


def _job_rows(i: int, jobs: int, now: datetime) -> tuple[dict[str, Any], list[Any], list[Any]]:
    """Job ``i``'s row, events and allocation rows (module docstring)."""
    s = i * (SPAN - 2) // jobs  # every job over before the current slot
    outcome = _OUTCOMES[(i * 37) % 100]
    jid = job_id(i)
    spec = {**SMALL_JOB, "id": jid, "utility": {**SMALL_JOB["utility"], "priority": 10 + i % 90}}
    admitted = outcome in _ADMITTED
    row = {
        "id": jid, "sequence": i + 1, "spec": canonical_spec(spec), "state": outcome,
        "submitted_slot": s, "arrival_slot": s + 1, "work": 9, "admitted": admitted,
        "payoff": 3.5 if admitted else -1.25, "cost": 1.5 if admitted else None,
        "start_slot": s + 1 if admitted else None,
        "completion_slot": s + 2 if admitted else None, "jct": 2 if admitted else None,
        "utility": 5.0 if admitted else None,
        "reason": "" if admitted else "its best payoff -1.25 is not positive at these prices",
        "detail": {"drivers": []}, "decision_ms": 1.5, "decided_at": now,
        "cancelled_slot": s + 2 if outcome == "cancelled" else None,
        "submitter": jid.partition(":")[0],
        "wait_until_slot": s + 2 if outcome == "expired" else None,
        "decided_slot": s + 2 if outcome == "expired" else s,
    }  # fmt: skip
    first = "pending" if outcome == "expired" else ("admitted" if admitted else "rejected")

    def event(kind: str, state: str, slot: int) -> dict[str, Any]:
        return {"at": now, "kind": kind, "job_id": jid, "slot": slot, "state": state,
                "detail": {"admitted": admitted} if kind == "decided" else {}}  # fmt: skip

    events = [event("decided", first, s)]
    allocs: list[dict[str, Any]] = []
    if outcome == "expired":
        events.append(event("expired", "expired", s + 2))
    if admitted:
        events += [event("running", "running", s + 1), event(outcome, outcome, s + 2)]
        # its work is 9 worker-slots; a PS serves up to 5 workers
        # on the next server in turn: two jobs share one only slots apart
        k = (i // 100) * _BEFORE[100] + _BEFORE[i % 100]
        w, p = f"w{k % WORKERS}", f"p{k % PS}"
        # (a failed job ran its plan: its agents reported less than its work)
        plan = [(s + 1, 4)] if outcome == "cancelled" else [(s + 1, 5), (s + 2, 4)]
        for slot, workers in plan:
            allocs.append({"job_id": jid, "slot": slot, "server": w, "workers": workers, "ps": 0})
            allocs.append({"job_id": jid, "slot": slot, "server": p, "workers": 0, "ps": 1})
    return row, events, allocs


def write_history(db: Database, jobs: int, config_epoch: float) -> dict[str, int]:
    """``jobs`` jobs of history into the (migrated, empty) store; the rows written."""
    now = datetime.now(UTC)
    counts = {"jobs": 0, "events": 0, "allocations": 0}
    for lo in range(0, jobs, CHUNK):
        rows, events, allocs = [], [], []
        for i in range(lo, min(jobs, lo + CHUNK)):
            r, e, a = _job_rows(i, jobs, now)
            rows.append(r)
            events += e
            allocs += a
        with db.session() as session:
            session.execute(insert(JobRow), rows)
            session.execute(insert(EventRow), events)
            if allocs:
                session.execute(insert(AllocationRow), allocs)
        counts["jobs"] += len(rows)
        counts["events"] += len(events)
        counts["allocations"] += len(allocs)
    with db.session() as session:  # as the daemon's first start records them
        session.merge(MetaRow(key="epoch", value={"epoch": config_epoch, "source": "bench"}))
        session.merge(MetaRow(key=SETTINGS_KEY, value={
            "window": WINDOW, "slot_seconds": SLOT, "epoch": config_epoch}))  # fmt: skip
        servers = tomllib.loads(CLUSTER_TOML)["cluster"]["servers"]
        for pos, server in enumerate(servers):  # workers first, as the cluster lists them
            session.merge(ServerRow(name=server["name"], kind=server["kind"], position=pos,
                                    capacity=server["capacity"]))  # fmt: skip
    return counts


# -- stores --------------------------------------------------------------------------


class Store:
    """A store of ``jobs`` jobs of history on ``backend``, built once into ``cache``."""

    def __init__(self, backend: str, jobs: int, cache: Path, pg: Postgres | None) -> None:
        self.backend, self.jobs = backend, jobs
        self.dir = cache / f"{backend}-{jobs}-v{LAYOUT}"
        self.meta = self.dir / "meta.json"
        self.pg = pg
        if pg is not None or not self.meta.exists():  # a PostgreSQL store lives as long as it
            self._build()
        self.info = json.loads(self.meta.read_text())
        self.epoch = float(self.info["epoch"])
        self.url = self.info["url"]

    def _build(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        if self.backend == "sqlite":
            url = f"sqlite:///{self.dir / 'oasis.db'}"
        else:
            assert self.pg is not None
            url = self.pg.new_database()
        epoch = _epoch()
        db = Database(url)
        try:
            migrate(db)
            t0 = time.perf_counter()
            counts = write_history(db, self.jobs, epoch)
            took = time.perf_counter() - t0
        finally:
            db.dispose()
        info = {"url": url, "epoch": epoch, "rows": counts, "build_s": round(took, 1)}
        self.meta.write_text(json.dumps(info))

    def copy(self, into: Path) -> str:
        """A copy of the store to change (retention): its URL."""
        if self.backend == "sqlite":
            shutil.copy(self.dir / "oasis.db", into / "oasis.db")
            return f"sqlite:///{into / 'oasis.db'}"
        import psycopg

        assert self.pg is not None
        name = f"copy_{os.getpid()}_{int(time.time())}"
        source = self.url.rsplit("/", 1)[1]
        with psycopg.connect(f"host=127.0.0.1 port={self.pg.port} user=oasis dbname=postgres",
                             autocommit=True) as conn:  # fmt: skip
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{source}"')
        return self.pg.url(name)

    def config(self, path: Path, data_dir: Path, url: str = "", extra: str = "") -> Path:
        epoch = self.epoch
        store_url = url or self.url
        listen, web, metrics = _ports()
        tokens = path.parent / "tokens"
        tokens.write_text("".join(f"{name} {role} {hashlib.sha256(token.encode()).hexdigest()}\n"
                                  for name, (role, token) in TOKENS.items()))  # fmt: skip
        tokens.chmod(0o600)
        path.write_text(f"""
[daemon]
listen = "127.0.0.1:{listen}"
data_dir = "{data_dir}"
store_url = "{store_url}"
slot_seconds = {SLOT:g}
window = {WINDOW}
epoch = {epoch}
tick_seconds = 1.0
log_level = "info"
{extra}
[auth]
tokens_file = "{tokens}"
[metrics]
listen = "127.0.0.1:{metrics}"
[web]
listen = "127.0.0.1:{web}"
{CLUSTER_TOML}
""")  # fmt: skip
        return path


def _ports() -> tuple[int, int, int]:
    import socket

    free = []
    for port in PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        free.append(port)
        if len(free) == 3:
            return free[0], free[1], free[2]
    raise RuntimeError("no free loopback ports in 47300-47399")


# -- measurements --------------------------------------------------------------------


def _proc_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _timed(fn: Callable[[], Any], repeat: int) -> dict[str, float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return {"p50_ms": round(statistics.median(times), 2), "max_ms": round(max(times), 2)}


def _get(url: str, token: str = "ops-token") -> bytes:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return bytes(r.read())


def startup_and_calls(store: Store, work: Path, repeat: int, calls: bool) -> dict[str, Any]:
    """Start ``oasisd`` on the store; time it and, with ``calls``, the calls."""
    cfg = store.config(work / "oasisd.toml", work)
    text = cfg.read_text()
    web = text.split("[web]\nlisten = ")[1].split("\n")[0].strip('"')
    metrics = text.split("[metrics]\nlisten = ")[1].split("\n")[0].strip('"')
    daemon = Daemon(cfg, work / "oasisd.log")
    t0 = time.perf_counter()
    daemon.start(timeout=600)
    out: dict[str, Any] = {"startup_s": round(time.perf_counter() - t0, 2)}
    assert daemon.proc is not None
    pid = daemon.proc.pid
    out["rss_mb"] = round(_proc_kb(pid, "VmRSS") / 1024, 1)
    out["rss_peak_mb"] = round(_proc_kb(pid, "VmHWM") / 1024, 1)
    try:
        if calls:
            out["calls"] = _calls(daemon.address, f"http://{web}", f"http://{metrics}", repeat)
            out["rss_after_calls_mb"] = round(_proc_kb(pid, "VmRSS") / 1024, 1)
    finally:
        daemon.stop()
    return out


def _calls(address: str, web: str, metrics: str, repeat: int) -> dict[str, Any]:
    channel = grpc.insecure_channel(address)
    admission = pb_grpc.AdmissionStub(channel)
    n = [0]
    ops = [("authorization", "Bearer ops-token")]
    team = [("authorization", "Bearer team01-token")]

    def submit() -> None:
        n[0] += 1
        spec = {**SMALL_JOB, "id": f"new-{os.getpid()}-{n[0]}"}
        req = pb.SubmitJobRequest(job=spec_to_proto(spec))
        admission.SubmitJob(req, timeout=120, metadata=team)

    def listing(states: list[Any], every: bool = False, who: Any = ops) -> Callable[[], None]:
        def call() -> None:
            token = ""
            while True:
                req = pb.ListJobsRequest(states=states, page_token=token)
                resp = admission.ListJobs(req, timeout=120, metadata=who)
                token = resp.next_page_token
                if not (every and token):
                    return

        return call

    old = job_id(3)
    out = {
        "submit": _timed(submit, repeat),
        "list_first_page": _timed(listing([]), repeat),
        "list_running": _timed(listing([pb.JOB_STATE_RUNNING]), repeat),
        "list_rejected": _timed(listing([pb.JOB_STATE_REJECTED]), repeat),
        "list_own_first_page": _timed(listing([], who=team), repeat),
        "list_status_in_flight": _timed(
            listing([pb.JOB_STATE_RUNNING, pb.JOB_STATE_ADMITTED], every=True), repeat
        ),
        "get_job": _timed(
            lambda: admission.GetJob(pb.GetJobRequest(id=old), timeout=60, metadata=ops), repeat
        ),
        "console_overview": _timed(lambda: _get(f"{web}/api/overview"), repeat),
        "console_jobs": _timed(lambda: _get(f"{web}/api/jobs"), repeat),
        "console_jobs_running": _timed(lambda: _get(f"{web}/api/jobs?state=running"), repeat),
        "console_own_overview": _timed(lambda: _get(f"{web}/api/overview", "team01-token"), repeat),
        "console_search": _timed(lambda: _get(f"{web}/api/jobs?q=new-"), repeat),
        "metrics_scrape": _timed(lambda: _get(f"{metrics}/metrics"), repeat),
    }
    channel.close()
    return out


def _child(args: list[str]) -> dict[str, Any]:
    """Run ``oasis ARGS`` as a subprocess: wall seconds, peak MB, exit code."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "controller.cli", *args], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=err)  # fmt: skip
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak, not the largest's
        took = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    out: dict[str, Any] = {"seconds": round(took, 1), "rc": proc.returncode,
                           "peak_mb": round(usage.ru_maxrss / 1024, 1)}  # fmt: skip
    if proc.returncode:
        out["stderr"] = stderr[-500:]
    return out


def offline(store: Store) -> dict[str, Any]:
    last = SPAN - 1
    return _child(["offline", "--store", store.url, "--from", str(last - 23), "--to",
                   str(last), "--json", "--no-progress", "--time-limit", "10"])  # fmt: skip


def calibrate(store: Store, work: Path) -> dict[str, Any]:
    return _child(["calibrate", "--store", store.url, "-o", str(work / "prior.json")])


def _controller(store: Store, work: Path, url: str = "", extra: str = "") -> AdmissionController:
    config = load(store.config(work / "inproc.toml", work, url, extra))
    clock = FakeClock(time.time())
    return AdmissionController(
        config, Database(config.database_url), SlotClock(clock, SLOT, config.epoch),
        log=structlog.wrap_logger(structlog.ReturnLogger()),
    )  # fmt: skip


def tick(store: Store, work: Path) -> dict[str, Any]:
    """Open in-process, then the next slot's tick."""
    c = _controller(store, work)
    t0 = time.perf_counter()
    c.open()
    opened = time.perf_counter() - t0
    try:
        clock = c.slots.clock
        assert isinstance(clock, FakeClock)
        times = []
        for _ in range(3):
            clock.t += SLOT
            t0 = time.perf_counter()
            asyncio.run(c.tick())
            times.append((time.perf_counter() - t0) * 1000.0)
    finally:
        c.close()
    return {"open_s": round(opened, 2), "tick_ms": [round(t, 1) for t in times]}


def retention(store: Store, work: Path) -> dict[str, Any]:
    """``keep_days = 30`` on a copy: the first pass, a batch at a time."""
    url = store.copy(work)
    c = _controller(store, work, url, "keep_days = 30")
    c.open()
    try:
        batches, deleted = timed_pass(c)
        with c.db.session() as session:
            left = int(session.scalar(select(func.count()).select_from(JobRow)) or 0)
    finally:
        c.close()
    return {
        "deleted": deleted, "left": left, "batches": len(batches),
        "batch_p50_ms": round(statistics.median(batches), 1),
        "batch_max_ms": round(max(batches), 1), "total_s": round(sum(batches) / 1000, 1),
    }  # fmt: skip


def migration(store: Store, work: Path) -> dict[str, Any]:
    """Migration 0008 over a copy taken back to 0007 (every job with a submitter)."""
    from alembic import command

    from controller.store.database import _alembic_config

    url = store.copy(work)
    db = Database(url)
    try:
        cfg = _alembic_config(url)
        # the daemon's engine (foreign keys enforced), as patient as its migrations
        with db.patient(300.0), db.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0007")
        t0 = time.perf_counter()
        migrate(db)
        took = time.perf_counter() - t0
        with db.session() as session:
            keyed = session.scalar(select(func.count()).where(JobRow.id.contains(":")))
    finally:
        db.dispose()
    return {"upgrade_s": round(took, 1), "jobs_renamed": int(keyed or 0)}


PARTS = ("startup", "calls", "tick", "offline", "calibrate", "retention", "migration", "copy")


def copy(store: Store) -> dict[str, Any]:
    """The whole store copied into a new database of a throwaway PostgreSQL."""
    target = store.pg if store.pg is not None else _Postgres()
    try:
        out = _child(["store", "copy", "--from", store.url, "--to", target.new_database(),
                      "--no-progress"])  # fmt: skip
    finally:
        if target is not store.pg:
            target.close()
    rows = sum(store.info["rows"].values())
    out["rows_per_s"] = round(rows / out["seconds"]) if out["seconds"] else None
    return out


def run(backend: str, jobs: int, cache: Path, parts: list[str], repeat: int,
        pg: Postgres | None) -> dict[str, Any]:  # fmt: skip
    store = Store(backend, jobs, cache, pg)
    out: dict[str, Any] = {"rows": store.info["rows"], "build_s": store.info["build_s"]}
    for part in parts:
        with tempfile.TemporaryDirectory(prefix="oasis-history-") as tmp:
            work = Path(tmp)
            if part == "startup" or (part == "calls" and "startup" not in parts):
                out.update(startup_and_calls(store, work, repeat, "calls" in parts))
            elif part == "tick":
                out["tick"] = tick(store, work)
            elif part == "offline":
                out["offline"] = offline(store)
            elif part == "calibrate":
                out["calibrate"] = calibrate(store, work)
            elif part == "retention":
                out["retention"] = retention(store, work)
            elif part == "migration":
                out["migration"] = migration(store, work)
            elif part == "copy":
                out["copy"] = copy(store)
        print(f"# {backend} {jobs}: {part} done", file=sys.stderr, flush=True)
    return out


class _Postgres(Postgres):
    """A throwaway PostgreSQL on one of this benchmark's ports."""

    def start(self) -> None:
        self.port = _ports()[0]
        super().start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.history_scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", default="10000,100000")
    parser.add_argument("--backends", default="sqlite")
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "oasis-history")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    for p in parts:
        if p not in PARTS:
            parser.error(f"--parts: unknown part {p!r} (known: {', '.join(PARTS)})")
    results: dict[str, Any] = {"machine": describe(), "date": time.strftime("%Y-%m-%d"),
                               "command": " ".join(sys.argv)}  # fmt: skip
    args.cache.mkdir(parents=True, exist_ok=True)
    for backend in args.backends.split(","):
        pg = _Postgres() if backend == "postgresql" else None
        try:
            for n in (int(x) for x in args.jobs.split(",")):
                r = run(backend, n, args.cache, parts, args.repeat, pg)
                results.setdefault(backend, {})[str(n)] = r
                if not args.json:
                    print(f"{backend} {n}: {json.dumps(r)}", flush=True)
        finally:
            if pg is not None:
                pg.close()
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
