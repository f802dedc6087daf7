"""Soak of ``oasisd``: a long stretch of mixed, careless traffic, watching for anything
that grows with the operations done rather than with the state that is live.

What is measured
    ``oasisd`` runs as a subprocess on 127.0.0.1 (``bench/soak_hook.py``: the daemon
    unchanged, plus a sampler of its event loop) with a SQLite store, or a database on a
    throwaway PostgreSQL (``--store postgresql``), slots of ``--slot-seconds`` (3 s), a
    window of 24 slots, ``keep_days`` of 0.001 (86 s: finished jobs are deleted often),
    ``[auth]`` (an operator and two submitters), ``[metrics]``, the console (``[web]``)
    and ``[mqtt]`` on a real Mosquitto with a reference agent (``oasis agent``,
    simulated) per server of a 3 worker + 2 PS cluster. For ``--minutes``:

    - three tenants (threads, one gRPC channel each) submit jobs that are admitted, that
      are priced out, that wait (pending), duplicates, conflicting specs, invalid specs;
      quote, cancel (their own, others', unknown ids), read jobs, progress, pages of
      ``ListJobs``, prices, servers, bounds; open ``WatchEvents`` streams and drop them
      after a few events; start calls on a channel of their own and close it at once (a
      client gone mid-call); call with an unknown token;
    - a console user reads every page and its JSON twin, logs in and out, opens event
      streams (``/api/events``) and drops them, sends half a request and hangs up;
    - chaos: an agent killed (SIGKILL) every 40 s and started again 3-10 s later (after
      the heartbeat timeout, half the time: its server fails and comes back), a SIGHUP
      every 4 minutes, a cordon and an uncordon now and then.

    Every ``--sample-seconds`` (20) the daemon is sampled: resident memory, open
    descriptors by kind, threads, asyncio tasks (and their commonest names), the
    commit process's memory, the rows of every store table, the store's connections
    (PostgreSQL), the broker's retained messages and its clients, the log's size, and
    the operations done so far. Every sixth sample also counts the objects the garbage
    collector tracks, by type (in the daemon's event loop: it holds the loop for a
    fraction of a second).

Reading it
    After a warm-up (the first quarter), each figure's value at the quarters of the run
    is printed next to the operations done by then. Live state (admitted and pending
    jobs, agents' sessions, open streams) comes and goes; what rises in step with the
    operations, quarter after quarter, and is not bounded by the config (``keep_days``,
    caps), is a leak.

Methodology
    One machine; its cores shared by the daemon, its commit process, Mosquitto, five
    agents, the traffic threads and the sampler (and PostgreSQL). Everything is seeded
    (``--seed``) but the interleavings are not: two runs do the same kinds of thing, not
    the same calls in the same order.

Run with
    .venv/bin/python -m bench.soak --minutes 20                   # SQLite
    .venv/bin/python -m bench.soak --minutes 15 --store postgresql
    .venv/bin/python -m bench.soak --minutes 2 --json             # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiomqtt
import grpc

from bench.daemon_throughput import _toml_value
from bench.machine import describe
from controller import procfs
from controller.auth import hash_token
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.broker import Mosquitto
from tests.servers import ROOT, Postgres, free_port

WINDOW = 24
HEARTBEAT_TIMEOUT = 4.0
KEEP_DAYS = 0.001
CAPACITY = {
    "w0": {"gpu": 4, "cpu": 32, "mem": 244, "disk": 250, "bandwidth": 25},
    "w1": {"gpu": 4, "cpu": 32, "mem": 244, "disk": 250, "bandwidth": 25},
    "w2": {"gpu": 8, "cpu": 64, "mem": 488, "disk": 500, "bandwidth": 40},
    "p0": {"cpu": 36, "mem": 60, "disk": 500, "bandwidth": 25},
    "p1": {"cpu": 16, "mem": 30, "disk": 250, "bandwidth": 20},
}
KINDS = {"w0": "worker", "w1": "worker", "w2": "worker", "p0": "ps", "p1": "ps"}
TOKENS = {"ops": ("operator", "ops-token"), "alice": ("submitter", "alice-token"),
          "bob": ("submitter", "bob-token")}  # fmt: skip
WORKER = {"gpu": 1, "cpu": 4, "mem": 8, "disk": 5, "bandwidth": 1}
PS = {"cpu": 2, "mem": 8, "disk": 5, "bandwidth": 5}


def job_spec(job_id: str, rng: random.Random, priority: float | None = None) -> dict[str, Any]:
    """A small training job: 1-3 workers, 20-150 mini-batches of 0.05 slots."""
    return {
        "id": job_id, "epochs": 1, "chunks": rng.randint(1, 3),
        "minibatches": rng.randint(20, 150), "tau": 0.05, "grad_mb": 1,
        "worker": WORKER, "ps": PS,
        "utility": {"kind": "sigmoid", "decay": 0.5, "target": rng.randint(3, 8),
                    "priority": rng.uniform(20, 100) if priority is None else priority},
    }  # fmt: skip


INVALID_SPECS: list[Any] = [
    {"id": "bad-1", "epoch": 1},
    {"epochs": -1, "chunks": "8"},
    {
        "id": "bad/slash",
        "epochs": 1,
        "chunks": 1,
        "minibatches": 1,
        "tau": 0.1,
        "grad_mb": 1,
        "worker": WORKER,
        "ps": PS,
        "utility": {"kind": "sigmoid", "priority": 1, "decay": 0, "target": 1},
    },
    "not an object",
    {
        "epochs": 10**9,
        "chunks": 10**6,
        "minibatches": 10**6,
        "tau": 1,
        "grad_mb": 1,
        "worker": WORKER,
        "ps": PS,
        "utility": {"kind": "sigmoid", "priority": 1, "decay": 0, "target": 1},
    },
]


@dataclass
class Counts:
    """Operations done, by kind and outcome (thread-safe)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    by: Counter[str] = field(default_factory=Counter)

    def add(self, kind: str) -> None:
        with self.lock:
            self.by[kind] += 1

    def total(self) -> int:
        with self.lock:
            return sum(self.by.values())


# -- the set-up ------------------------------------------------------------------------


class Rig:
    """Broker, (PostgreSQL,) daemon and agents in a temporary directory."""

    def __init__(self, tmp: Path, store: str, slot_seconds: float, port_base: int) -> None:
        self.tmp = tmp
        self.slot_seconds = slot_seconds
        self.broker = Mosquitto(port=port_base + 4 if port_base else 0)
        self.pg: Postgres | None = None
        store_url = ""
        if store == "postgresql":
            self.pg = Postgres()
            store_url = self.pg.new_database()
        self.store_url = store_url
        self.ports = {k: (port_base + i if port_base else free_port())
                      for i, k in enumerate(("grpc", "metrics", "web"), start=1)}  # fmt: skip
        (tmp / "tokens").write_text(
            "".join(f"{n} {role} {hash_token(t)}\n" for n, (role, t) in TOKENS.items())
        )
        rows = ",\n".join(
            f"  {_toml_value({'name': n, 'kind': KINDS[n], 'capacity': c})}"
            for n, c in CAPACITY.items()
        )
        self.config = tmp / "oasisd.toml"
        self.config.write_text(
            f"""[daemon]
listen = "127.0.0.1:{self.ports["grpc"]}"
data_dir = {_toml_value(str(tmp / "data"))}
store_url = {_toml_value(store_url)}
slot_seconds = {slot_seconds}
window = {WINDOW}
epoch = {time.time()!r}
tick_seconds = 0.2
keep_days = {KEEP_DAYS}
log_level = "info"

[pricing]
bounds = "estimate"

[auth]
tokens_file = "tokens"

[limits]
rate = 500
burst = 1000

[metrics]
listen = "127.0.0.1:{self.ports["metrics"]}"

[web]
listen = "127.0.0.1:{self.ports["web"]}"

[mqtt]
url = "{self.broker.url}"
heartbeat_timeout = {HEARTBEAT_TIMEOUT}
heartbeat_seconds = 0.5

[cluster]
resources = ["gpu", "cpu", "mem", "disk", "bandwidth"]
servers = [
{rows},
]
""",
            encoding="utf-8",
        )
        self.log_path = tmp / "oasisd.log"
        self.hook_path = tmp / "hook.jsonl"
        self.proc: subprocess.Popen[str] | None = None
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.address = f"127.0.0.1:{self.ports['grpc']}"
        self.broker_stats = BrokerStats(self.broker.port)

    def start_daemon(self) -> None:
        log = open(self.log_path, "a")  # noqa: SIM115
        env = {**os.environ, "OASIS_SOAK_HOOK": str(self.hook_path),
               "OASIS_SOAK_HOOK_SECONDS": "10", "OASIS_SOAK_CENSUS": "6"}  # fmt: skip
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.soak_hook", "--config", str(self.config)],
            stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT, env=env,
        )  # fmt: skip
        log.close()
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"oasisd exited early:\n{self.log_path.read_text()[-3000:]}")
            if "listening on" in line:
                return
        raise TimeoutError("oasisd did not start")

    def start_agent(self, server: str) -> None:
        log = open(self.tmp / f"agent-{server}.log", "ab")  # noqa: SIM115
        self.agents[server] = subprocess.Popen(
            [sys.executable, "-m", "controller.cli", "agent", "--node", server,
             "--broker", self.broker.url, "--speed", "1.5", "--report-seconds", "0.5"],
            stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT,
        )  # fmt: skip
        log.close()

    def kill_agent(self, server: str) -> None:
        proc = self.agents.pop(server)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def close(self) -> None:
        for server in list(self.agents):
            self.kill_agent(server)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        self.broker.close()
        if self.pg is not None:
            self.pg.close()


# -- traffic ---------------------------------------------------------------------------


def _meta(name: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {TOKENS[name][1]}"),)


class Tenant(threading.Thread):
    """One token's careless client: see the module docstring for what it does."""

    def __init__(self, name: str, rig: Rig, counts: Counts, until: float, seed: int) -> None:
        super().__init__(name=f"tenant-{name}", daemon=True)
        self.user = name
        self.rig = rig
        self.counts = counts
        self.until = until
        self.rng = random.Random(seed)
        self.channel = grpc.insecure_channel(rig.address)
        self.admission = pb_grpc.AdmissionStub(self.channel)
        self.cluster = pb_grpc.ClusterStub(self.channel)
        self.mine: list[dict[str, Any]] = []
        self.ops = [
            (self.submit, 30), (self.submit_priced_out, 8), (self.submit_waiting, 6),
            (self.duplicate, 5), (self.conflict, 2), (self.invalid, 6), (self.quote, 8),
            (self.cancel, 8), (self.read_job, 5), (self.progress, 8), (self.list_jobs, 4),
            (self.watch, 4), (self.gone_mid_call, 5), (self.cluster_reads, 5),
            (self.unknown_token, 2),
        ]  # fmt: skip

    def run(self) -> None:
        funcs = [f for f, _ in self.ops]
        weights = [w for _, w in self.ops]
        while time.time() < self.until:
            op = self.rng.choices(funcs, weights)[0]
            try:
                op()
                self.counts.add(op.__name__)
            except grpc.RpcError as err:
                self.counts.add(f"{op.__name__}:{err.code().name}")
            except Exception as err:  # counted, the soak goes on
                self.counts.add(f"{op.__name__}:{type(err).__name__}")
            time.sleep(self.rng.uniform(0.02, 0.12))
        self.channel.close()

    def _submit(self, spec: Any, wait: float | None = None) -> Any:
        body = spec if isinstance(spec, str) else json.dumps(spec)
        request = pb.SubmitJobRequest(job=pb.JobSpec(json=body), wait_seconds=wait)
        return self.admission.SubmitJob(request, metadata=_meta(self.user), timeout=20)

    def _new_id(self) -> str:
        return f"{self.user}-{uuid.uuid4().hex[:10]}"

    def submit(self) -> None:
        spec = job_spec(self._new_id(), self.rng)
        self._submit(spec)
        self.mine.append(spec)
        del self.mine[:-200]

    def submit_priced_out(self) -> None:
        self._submit(job_spec(self._new_id(), self.rng, priority=0.001))

    def submit_waiting(self) -> None:
        spec = job_spec(self._new_id(), self.rng)
        spec["chunks"] = 3
        spec["minibatches"] = 300
        self._submit(spec, wait=self.rng.uniform(5, 40))
        self.mine.append(spec)

    def duplicate(self) -> None:
        if self.mine:
            self._submit(self.rng.choice(self.mine))

    def conflict(self) -> None:
        if self.mine:
            spec = dict(self.rng.choice(self.mine), epochs=2)
            self._submit(spec)

    def invalid(self) -> None:
        spec = self.rng.choice(INVALID_SPECS)
        self._submit(spec)

    def quote(self) -> None:
        spec = job_spec(self._new_id(), self.rng)
        self.admission.QuoteJob(pb.QuoteJobRequest(job=pb.JobSpec(json=json.dumps(spec))),
                                metadata=_meta(self.user), timeout=20)  # fmt: skip

    def _some_id(self) -> str:
        roll = self.rng.random()
        if roll < 0.1 or not self.mine:
            return f"nope-{uuid.uuid4().hex[:6]}"
        if roll < 0.2:
            return f"{'bob' if self.user != 'bob' else 'alice'}-x"
        return str(self.rng.choice(self.mine)["id"])

    def cancel(self) -> None:
        self.admission.CancelJob(pb.CancelJobRequest(id=self._some_id()),
                                 metadata=_meta(self.user), timeout=20)  # fmt: skip

    def read_job(self) -> None:
        self.admission.GetJob(pb.GetJobRequest(id=self._some_id()), metadata=_meta(self.user),
                              timeout=20)  # fmt: skip

    def progress(self) -> None:
        self.admission.GetProgress(pb.GetProgressRequest(id=self._some_id()),
                                   metadata=_meta(self.user), timeout=20)  # fmt: skip

    def list_jobs(self) -> None:
        token = ""
        for _ in range(self.rng.randint(1, 5)):
            page = self.admission.ListJobs(
                pb.ListJobsRequest(page_size=self.rng.choice([0, 5, 50]), page_token=token),
                metadata=_meta(self.user), timeout=20)  # fmt: skip
            token = page.next_page_token
            if not token:
                break

    def watch(self) -> None:
        if self.user != "ops":
            return self.list_jobs()  # watching is an operator's
        after = self.rng.choice([-1, 0, 10**6])
        stream = self.admission.WatchEvents(pb.WatchEventsRequest(after_sequence=after),
                                            metadata=_meta(self.user), timeout=30)  # fmt: skip
        want = self.rng.randint(1, 30)
        deadline = time.monotonic() + self.rng.uniform(0.2, 4)
        try:
            for n, _event in enumerate(stream):
                if n >= want or time.monotonic() > deadline:
                    break
        finally:
            stream.cancel()
        return None

    def gone_mid_call(self) -> None:
        """A client that starts calls on a connection of its own and drops it."""
        channel = grpc.insecure_channel(self.rig.address)
        admission = pb_grpc.AdmissionStub(channel)
        spec = job_spec(self._new_id(), self.rng)
        calls = [
            admission.SubmitJob.future(pb.SubmitJobRequest(job=pb.JobSpec(json=json.dumps(spec))),
                                       metadata=_meta(self.user), timeout=20),
            admission.ListJobs.future(pb.ListJobsRequest(), metadata=_meta(self.user), timeout=20),
        ]  # fmt: skip
        if self.user == "ops":
            stream = admission.WatchEvents(pb.WatchEventsRequest(after_sequence=0),
                                           metadata=_meta(self.user), timeout=20)  # fmt: skip
            with contextlib.suppress(grpc.RpcError, StopIteration):
                next(stream)
        time.sleep(self.rng.uniform(0, 0.05))
        channel.close()
        for call in calls:
            with contextlib.suppress(grpc.RpcError, grpc.FutureCancelledError):
                call.result()
        self.mine.append(spec)  # it may have been admitted

    def cluster_reads(self) -> None:
        m = _meta(self.user)
        c = self.cluster
        c.GetClusterInfo(pb.GetClusterInfoRequest(), metadata=m, timeout=20)
        if self.user == "ops":
            c.ListServers(pb.ListServersRequest(), metadata=m, timeout=20)
            c.GetPrices(pb.GetPricesRequest(slots=24), metadata=m, timeout=20)
            c.GetUtilisation(pb.GetUtilisationRequest(slots=24), metadata=m, timeout=20)
            c.GetBounds(pb.GetBoundsRequest(), metadata=m, timeout=20)

    def unknown_token(self) -> None:
        stranger = (("authorization", f"Bearer {uuid.uuid4().hex}"),)
        self.admission.ListJobs(pb.ListJobsRequest(), timeout=20, metadata=stranger)


class ConsoleUser(threading.Thread):
    """The operator's console, read by a script and a careless browser."""

    PAGES = ("/", "/api/overview", "/prices", "/api/prices", "/api/prices?resource=cpu",
             "/plans", "/api/plans", "/jobs", "/api/jobs", "/api/jobs?state=admitted",
             "/jobs?q=alice", "/static/app.js", "/nowhere")  # fmt: skip

    def __init__(self, rig: Rig, counts: Counts, until: float, seed: int, ids: Tenant) -> None:
        super().__init__(name="console", daemon=True)
        self.rig = rig
        self.port = rig.ports["web"]
        self.counts = counts
        self.until = until
        self.rng = random.Random(seed)
        self.ids = ids
        self.cookie = ""

    def run(self) -> None:
        ops = [(self.page, 40), (self.job_page, 15), (self.login, 5), (self.logout, 3),
               (self.events, 8), (self.half_request, 4)]  # fmt: skip
        funcs = [f for f, _ in ops]
        weights = [w for _, w in ops]
        while time.time() < self.until:
            op = self.rng.choices(funcs, weights)[0]
            try:
                op()
                self.counts.add(f"console.{op.__name__}")
            except (OSError, http.client.HTTPException) as err:
                self.counts.add(f"console.{op.__name__}:{type(err).__name__}")
            time.sleep(self.rng.uniform(0.05, 0.25))

    def _headers(self) -> dict[str, str]:
        roll = self.rng.random()
        if self.cookie and roll < 0.4:
            return {"Cookie": self.cookie}
        user = "alice" if roll > 0.8 else "ops"  # a submitter sees its own jobs only
        return {"Authorization": f"Bearer {TOKENS[user][1]}"}

    def _get(self, path: str) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        try:
            conn.request("GET", path, headers=self._headers())
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()

    def page(self) -> None:
        self._get(self.rng.choice(self.PAGES))

    def job_page(self) -> None:
        mine = self.ids.mine
        job = mine[-1]["id"] if mine else "nope"
        self._get(self.rng.choice(("/jobs/", "/api/jobs/")) + f"alice:{job}")

    def login(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        try:
            body = f"token={TOKENS['ops'][1]}&next=/"
            conn.request("POST", "/login", body=body, headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "Origin": f"http://127.0.0.1:{self.port}"})  # fmt: skip
            response = conn.getresponse()
            response.read()
            m = re.search(r"(oasis[^=;]*=[^;]+)", response.getheader("Set-Cookie") or "")
            if m:
                self.cookie = m.group(1)
        finally:
            conn.close()

    def logout(self) -> None:
        self.cookie = ""  # the session is left to lapse, as a closed browser leaves it

    def events(self) -> None:
        """An event stream read for a while, then the tab closed without a word."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request("GET", "/api/events", headers=self._headers())
            response = conn.getresponse()
            deadline = time.monotonic() + self.rng.uniform(0.2, 5)
            while time.monotonic() < deadline:
                if not response.fp or not response.fp.read1(4096):
                    break
        except TimeoutError:
            pass
        finally:
            conn.close()

    def half_request(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\n")


class OpenTab(threading.Thread):
    """A submitter's console tab left open for the whole run: its event stream, read
    as it comes (opened again if it ends)."""

    def __init__(self, rig: Rig, counts: Counts, until: float) -> None:
        super().__init__(name="open-tab", daemon=True)
        self.port = rig.ports["web"]
        self.counts = counts
        self.until = until

    def run(self) -> None:
        while time.time() < self.until:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
            try:
                conn.request("GET", "/api/events",
                             headers={"Authorization": f"Bearer {TOKENS['bob'][1]}"})  # fmt: skip
                response = conn.getresponse()
                self.counts.add("console.tab_opened")
                while time.time() < self.until and response.fp and response.fp.read1(4096):
                    pass
            except (OSError, http.client.HTTPException):
                time.sleep(1)
            finally:
                conn.close()


class Chaos(threading.Thread):
    """Agents killed and started again, reloads, cordons."""

    def __init__(self, rig: Rig, counts: Counts, until: float, seed: int) -> None:
        super().__init__(name="chaos", daemon=True)
        self.rig = rig
        self.counts = counts
        self.until = until
        self.rng = random.Random(seed)
        self.channel = grpc.insecure_channel(rig.address)
        self.cluster = pb_grpc.ClusterStub(self.channel)

    def run(self) -> None:
        next_kill = time.time() + 40
        next_hup = time.time() + 240
        next_cordon = time.time() + 90
        while time.time() < self.until - 15:
            now = time.time()
            if now >= next_kill:
                server = self.rng.choice(sorted(self.rig.agents))
                self.rig.kill_agent(server)
                self.counts.add("chaos.agent_killed")
                time.sleep(self.rng.choice([3, HEARTBEAT_TIMEOUT + 6]))
                self.rig.start_agent(server)
                next_kill = time.time() + 40
            if now >= next_hup:
                assert self.rig.proc is not None
                self.rig.proc.send_signal(signal.SIGHUP)
                self.counts.add("chaos.sighup")
                next_hup = now + 240
            if now >= next_cordon:
                self.cordon()
                next_cordon = now + 90
            time.sleep(0.5)
        self.channel.close()

    def cordon(self) -> None:
        m = _meta("ops")
        try:
            cordon = pb.CordonServerRequest(server="w1", reason="soak", force=True)
            self.cluster.CordonServer(cordon, metadata=m, timeout=20)
            time.sleep(self.rng.uniform(3, 10))
            self.cluster.UncordonServer(pb.UncordonServerRequest(server="w1"), metadata=m,
                                        timeout=20)  # fmt: skip
            self.counts.add("chaos.cordon")
        except grpc.RpcError as err:
            self.counts.add(f"chaos.cordon:{err.code().name}")


# -- sampling --------------------------------------------------------------------------


def _proc_status(pid: int) -> dict[str, int]:
    return procfs.status(pid, ("VmRSS", "VmHWM", "Threads"))


def _fds(pid: int) -> Counter[str]:
    kinds: Counter[str] = Counter()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            kind = target.split(":", 1)[0] if ":" in target else "file"
            kinds[kind] += 1
    return kinds


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                kids += [
                    int(x) for x in Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                ]
    return kids


def store_rows(rig: Rig) -> dict[str, int]:
    """Rows of every table of the store (and, on PostgreSQL, its connections)."""
    if rig.pg is None:
        db = rig.tmp / "data" / "oasis.db"
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)) as c:
            tables = [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            return {t: int(c.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]) for t in tables}
    import psycopg

    dbname = rig.store_url.rsplit("/", 1)[1]
    dsn = f"host=127.0.0.1 port={rig.pg.port} user=oasis dbname={dbname}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname='public'")]  # fmt: skip
        rows = {t: int(conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0])  # type: ignore[index]
                for t in tables}  # fmt: skip
        rows["pg_connections"] = int(conn.execute(  # type: ignore[index]
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (dbname,)).fetchone()[0])  # fmt: skip
        return rows


def retained(port: int, seconds: float = 1.5) -> dict[str, int]:
    """Retained messages a new subscriber gets (count and bytes), by topic family, and the
    broker's connected clients (``$SYS``)."""

    async def read() -> dict[str, int]:
        out: Counter[str] = Counter()
        async with aiomqtt.Client("127.0.0.1", port) as client:
            await client.subscribe("#", qos=0)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    async for message in client.messages:
                        topic = str(message.topic)
                        if not message.retain:
                            continue
                        parts = topic.split("/")
                        family = parts[2] + "/" + parts[-1] if len(parts) > 3 else topic
                        family = re.sub(r"/\d+$", "/part", family)
                        out[f"retained:{family}"] += 1
                        out["retained"] += 1
                        out["retained_bytes"] += len(bytes(message.payload))
        return dict(out)

    try:
        return asyncio.run(read())
    except Exception as err:  # a sample without it
        return {"retained_error": 1, "retained_error_kind": hash(type(err).__name__) % 1000}


class BrokerStats(threading.Thread):
    """The broker's own figures (``$SYS/broker/...``, published every 10 s): the latest
    of each, held for the sampler."""

    TOPICS = ("heap/current", "retained messages/count", "clients/connected",
              "subscriptions/count", "store/messages/bytes")  # fmt: skip

    def __init__(self, port: int) -> None:
        super().__init__(name="broker-stats", daemon=True)
        self.port = port
        self.latest: dict[str, int] = {}

    def run(self) -> None:
        async def follow() -> None:
            while True:
                with contextlib.suppress(aiomqtt.MqttError):
                    async with aiomqtt.Client("127.0.0.1", self.port) as client:
                        for topic in self.TOPICS:
                            await client.subscribe(f"$SYS/broker/{topic}", qos=0)
                        async for message in client.messages:
                            name = str(message.topic).removeprefix("$SYS/broker/")
                            with contextlib.suppress(ValueError, TypeError):
                                self.latest[name] = int(bytes(message.payload))
                await asyncio.sleep(1)

        asyncio.run(follow())


def sample(rig: Rig, counts: Counts, started: float) -> dict[str, Any]:
    assert rig.proc is not None
    pid = rig.proc.pid
    broker_pid = rig.broker.proc.pid if rig.broker.proc is not None else 0
    status = _proc_status(pid)
    row: dict[str, Any] = {
        "seconds": round(time.time() - started, 1),
        "ops": counts.total(),
        "rss_mb": round(status.get("VmRSS", 0) / 1024, 1),
        "hwm_mb": round(status.get("VmHWM", 0) / 1024, 1),
        "threads": status.get("Threads", 0),
        "fds": dict(_fds(pid)),
        "children_rss_mb": [
            round(_proc_status(k).get("VmRSS", 0) / 1024, 1) for k in _children(pid)
        ],
        "log_mb": round(rig.log_path.stat().st_size / 2**20, 2),
        "broker_rss_mb": round(_proc_status(broker_pid).get("VmRSS", 0) / 1024, 1),
    }
    data = rig.tmp / "data"
    if data.exists():
        row["data_mb"] = round(
            sum(p.stat().st_size for p in data.iterdir() if p.is_file()) / 2**20, 2
        )
    try:
        row["rows"] = store_rows(rig)
    except Exception as err:
        row["rows"] = {"error": str(err)[:100]}
    row["mqtt"] = retained(rig.broker.port)
    row["broker"] = dict(rig.broker_stats.latest)
    with contextlib.suppress(OSError, ValueError, IndexError):
        lines = rig.hook_path.read_text().splitlines()
        hook = json.loads(lines[-1])
        row["tasks"] = hook["tasks"]
        row["task_names"] = hook["task_names"][:6]
        census = next((json.loads(line) for line in reversed(lines) if '"census"' in line), None)
        if census:
            row["objects"] = census["objects"]
    return row


def _flat(row: dict[str, Any]) -> dict[str, float]:
    """The numbers of a sample, one level deep (``fds.socket``, ``rows.jobs``, ...)."""
    out: dict[str, float] = {}
    for k, v in row.items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[k] = float(v)
        elif isinstance(v, dict):
            for k2, v2 in v.items():
                if isinstance(v2, int | float):
                    out[f"{k}.{k2}"] = float(v2)
        elif k == "children_rss_mb" and v:
            out["commit_rss_mb"] = float(max(v))
    return out


def summarise(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each figure at the quarters of the run (after the first quarter's warm-up)."""
    flat = [_flat(s) for s in samples]
    n = len(flat)
    picks = [flat[min(n - 1, (n * q) // 4)] for q in (1, 2, 3)] + [flat[-1]]
    keys = sorted({k for f in flat for k in f})
    return [{"figure": k, "values": [p.get(k) for p in picks],
             "max": max((f.get(k, 0.0) for f in flat), default=0.0)} for k in keys]  # fmt: skip


def census_growth(hook_path: Path) -> list[tuple[str, int, int]]:
    """Types whose tracked objects grew most between the second census and the last."""
    censuses = [
        json.loads(line) for line in hook_path.read_text().splitlines() if '"census"' in line
    ]
    if len(censuses) < 3:
        return []
    first, last = dict(censuses[1]["census"]), dict(censuses[-1]["census"])
    grown = [(t, first.get(t, 0), last[t]) for t in last if last[t] > first.get(t, 0)]
    return sorted(grown, key=lambda g: g[2] - g[1], reverse=True)[:15]


def container_growth(hook_path: Path) -> list[tuple[str, int, int]]:
    """The largest containers of the daemon (where held) whose length grew between the
    second census and the last: (where, length then, length at the end)."""
    censuses = [json.loads(line) for line in hook_path.read_text().splitlines()
                if '"containers"' in line]  # fmt: skip
    if len(censuses) < 3:
        return []

    def lengths(census: dict[str, Any]) -> dict[str, int]:
        out: dict[str, int] = {}
        for where, kind, n in census["containers"]:
            key = f"{where} ({kind})"
            out[key] = max(out.get(key, 0), n)
        return out

    def lengths_of_project(census: dict[str, Any]) -> dict[str, int]:
        return {f"{where} (attribute)": n for where, n in census.get("project_containers", [])}

    first = lengths(censuses[1]) | lengths_of_project(censuses[1])
    last = lengths(censuses[-1]) | lengths_of_project(censuses[-1])
    grown = [(k, first.get(k, 0), n) for k, n in last.items() if n > first.get(k, 0)]
    return sorted(grown, key=lambda g: g[2] - g[1], reverse=True)[:15]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--slot-seconds", type=float, default=3.0)
    parser.add_argument("--sample-seconds", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--port-base",
        type=int,
        default=0,
        help="ports base+1 .. base+4 (gRPC, metrics, console, broker); 0: free ones",
    )
    parser.add_argument("--keep", metavar="DIR", help="copy the logs and samples here")
    parser.add_argument("--json", action="store_true", help="print the samples as JSON")
    args = parser.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="oasis-soak-"))
    rig = Rig(tmp, args.store, args.slot_seconds, args.port_base)
    counts = Counts()
    samples: list[dict[str, Any]] = []
    try:
        rig.start_daemon()
        rig.broker_stats.start()
        for server in CAPACITY:
            rig.start_agent(server)
        started = time.time()
        until = started + args.minutes * 60
        tenants = [Tenant(n, rig, counts, until, args.seed * 10 + i) for i, n in enumerate(TOKENS)]
        threads: list[threading.Thread] = [
            *tenants, ConsoleUser(rig, counts, until, args.seed * 10 + 7, tenants[1]),
            Chaos(rig, counts, until, args.seed * 10 + 8), OpenTab(rig, counts, until),
        ]  # fmt: skip
        for t in threads:
            t.start()
        samples_path = tmp / "samples.jsonl"
        while time.time() < until:
            time.sleep(min(args.sample_seconds, max(0.0, until - time.time())))
            row = sample(rig, counts, started)
            samples.append(row)
            with samples_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{row['seconds']:7.0f} s ops {row['ops']:6d} rss {row['rss_mb']:6.1f} MB "
                  f"fds {sum(row['fds'].values()):4d} threads {row['threads']:3d} "
                  f"tasks {row.get('tasks', '-')!s:>4} jobs {row['rows'].get('jobs', '-')!s:>5} "
                  f"events {row['rows'].get('events', '-')!s:>6} "
                  f"retained {row['mqtt'].get('retained', '-')!s:>4} "
                  f"broker heap {row['broker'].get('heap/current', 0) / 2**20:5.1f} MB",
                  file=sys.stderr, flush=True)  # fmt: skip
        for t in threads:
            t.join(60)
        report: dict[str, Any] = {
            "machine": describe(),
            "args": vars(args),
            "ops": dict(sorted(counts.by.items())),
            "quarters": summarise(samples),
            "census_growth": census_growth(rig.hook_path),
            "container_growth": container_growth(rig.hook_path),
        }
        if args.json:
            print(json.dumps({**report, "samples": samples}, indent=1))
        else:
            print(json.dumps(report["machine"]))
            print("operations:", json.dumps(report["ops"]))
            print(f"{'figure':40s} {'q1':>10s} {'q2':>10s} {'q3':>10s} {'end':>10s} {'max':>10s}")
            for q in report["quarters"]:
                vals = " ".join(
                    f"{v:10.1f}" if v is not None else f"{'-':>10s}" for v in q["values"]
                )
                print(f"{q['figure']:40s} {vals} {q['max']:10.1f}")
            print("objects grown most (type, second census, last):")
            for t, a, b in report["census_growth"]:
                print(f"  {t:40s} {a:8d} {b:8d}")
            print("largest containers grown (where held, second census, last):")
            for t, a, b in report["container_growth"]:
                print(f"  {t:60s} {a:8d} {b:8d}")
        return 0
    finally:
        rig.close()
        if args.keep:
            keep = Path(args.keep)
            keep.mkdir(parents=True, exist_ok=True)
            for p in tmp.iterdir():
                if p.is_file():
                    shutil.copy(p, keep / p.name)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
