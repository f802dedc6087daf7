"""Chaos benchmark of the execution plane: broker restarts, poison messages, forged
reports and dying agents under submit load; then every decision, the ledger and the
broker's retained state are checked.

What is measured
    ``oasisd`` runs as a subprocess on 127.0.0.1 (SQLite store, 5 s slots, T = 24,
    8 worker + 4 PS servers, estimated price bounds) with ``[mqtt]`` pointing at a real
    Mosquitto that has a password file and the shipped ``config/mosquitto.acl``: the
    daemon is user ``oasisd``, each agent the user named as its server. Reference agents
    (:class:`controller.plane.agent.Agent`, simulated at the planned pace) run for every
    server in this process. Client threads submit jobs at ``--rate`` per second for
    ``--seconds`` (``bench/load_test.py``'s clients: retried with the same id on
    UNAVAILABLE and RESOURCE_EXHAUSTED). Meanwhile, on a schedule:

    - **broker restarts:** Mosquitto is killed (SIGKILL; in memory, so every retained
      plan, event and status is gone) and started again 1 s later, 4 times;
    - **poison:** user ``p3`` (a real agent's account) publishes on its own topics a
      retained 50,000-deep JSON array, a 6.5 MB report naming 100,000 unknown jobs, a
      1,000-entry report of unknown jobs and a heartbeat that is not UTF-8, 4 times;
    - **forged reports:** user ``p2`` reports, every second, every running job done
      (all its mini-batches) on its own topic, once naming ``w0`` and once naming itself,
      tries the same on ``w0``'s topic (the ACL drops it), and sends heartbeats that name
      the servers whose agents were killed;
    - **failures:** the agents of 4 servers are killed at set times and started again
      once the daemon has declared the server failed (or after 30 s of the daemon's
      uptime);
    - **daemon crashes:** ``oasisd`` itself is killed (SIGKILL) twice and started again
      at once on the same port (the second kill of an agent and a broker restart fall
      in the first one's downtime); the clients retry with the same ids meanwhile;
    - **commit process kills:** the daemon's commit process
      (``controller.store.commit_process``) is killed (SIGKILL) 3 times under load; the
      daemon starts another for its next batch.

Checks and figures
    - lost / duplicated: every job has one row and one ``decided`` event, and its
      client's answer is the stored decision (``bench/load_test.py``);
    - ledger == store: after the run, with the broker stopped so nothing moves, the
      daemon's ``GetUtilisation`` and ``ListServers`` equal the stored allocations, and
      no server is over capacity in the store;
    - failures detected N of N: a ``server_failed`` event for each killed server after
      its kill, with the seconds it took; and no ``server_failed`` for any other server;
    - forged entries counted: reports stored under the forger's session (must be 0);
    - reconnects per minute: the daemon's broker connections after the first, over the
      run, against the broker restarts and daemon crashes (at most one each); the link's
      own failures (must be 0);
    - back after a crash: seconds from the SIGKILL until the daemon listens again;
    - orphaned commit processes: a killed daemon's commit process still running 5 s
      after the kill (must be 0);
    - jobs failed, by reason: a killed agent's jobs may fail (``server_failed``); a job
      whose agents worked while the daemon or broker was away should not
      (``plan_ended``);
    - restored: after a last broker restart, the jobs whose retained event is older than
      the store's latest (stale; must be 0) and the seconds until none is; at the end a
      clean stop leaves the retained status ``online: false``.

Methodology
    One machine (the 2 cores are shared by the daemon, Mosquitto, the agents and the
    clients). Wall-clock seconds from ``time.monotonic``; detection latency from the
    stored event's time. Every loop is bounded in time; the run takes ``--seconds`` plus
    about a minute of set-up and checks.

Run with
    .venv/bin/python -m bench.chaos                    # 120 s of load at 3 jobs/s
    .venv/bin/python -m bench.chaos --seconds 60 --json
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import logging
import math
import os
import random
import signal
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import aiomqtt
import grpc
import structlog

from bench.daemon_throughput import _toml_value, percentiles, write_config
from bench.load_test import (
    Load,
    capacity_problems,
    check_ledger,
    decision_problems,
    read_store,
    store_use,
)
from bench.machine import describe
from controller.convert import spec_to_proto
from controller.plane.agent import Agent
from controller.plane.event_messages import UNRETAINED, event_kind
from controller.plane.settings import MqttConfig
from controller.plane.topics import Heartbeat, Progress, TaskProgress, Topics
from controller.rpc import oasis_pb2 as pb
from tests.broker import Mosquitto
from tests.servers import ROOT, Daemon, commit_processes, ended, json_log

SLOT_SECONDS = 5.0
WINDOW = 24
HEARTBEAT_TIMEOUT = 6.0
WORKERS = [f"w{i}" for i in range(8)]
PS = [f"p{i}" for i in range(4)]
WORKER_CAPACITY = {"gpu": 8, "cpu": 64, "mem": 488, "disk": 500, "bandwidth": 40}
PS_CAPACITY = {"cpu": 36, "mem": 244, "disk": 500, "bandwidth": 25}
DAEMON_USER = "oasisd"
FORGER, POISONER = "p2", "p3"
FORGED_SESSION = "forger"
KILLED = ("w1", "w4", "w6", "p1")
TOPICS = Topics("oasis")
JOB_EVENT_KINDS = "('decided','running','completed','cancelled','replanned','failed')"


def servers() -> list[dict[str, Any]]:
    return [
        *({"name": n, "kind": "worker", "capacity": WORKER_CAPACITY} for n in WORKERS),
        *({"name": n, "kind": "ps", "capacity": PS_CAPACITY} for n in PS),
    ]


def job_specs(count: int, seed: int, run_id: str) -> list[dict[str, Any]]:
    """Small training jobs of 1-3 workers and 2-12 slots at the planned pace."""
    rng = random.Random(seed)
    return [
        {
            "id": f"chaos-{run_id}-{i}",
            "epochs": 1,
            "chunks": rng.randint(1, 3),
            "minibatches": rng.randint(40, 200),
            "tau": 0.05,
            "grad_mb": 1,
            "worker": {"gpu": 1, "cpu": 4, "mem": 8, "disk": 5, "bandwidth": 1},
            "ps": {"cpu": 2, "mem": 8, "disk": 5, "bandwidth": 5},
            "utility": {
                "kind": "sigmoid",
                "priority": rng.uniform(10, 100),
                "decay": 0.5,
                "target": rng.randint(3, 8),
            },
        }
        for i in range(count)
    ]


def mqtt_table(broker: Mosquitto, password: str) -> str:
    """The daemon's ``[mqtt]`` table: user ``oasisd`` on ``broker``."""
    return f"""
[mqtt]
url = "{broker.url}"
username = "{DAEMON_USER}"
password = {_toml_value(password)}
heartbeat_timeout = {HEARTBEAT_TIMEOUT}
heartbeat_seconds = 0.5
"""


# -- the agents, in one event loop of this process ------------------------------------


class Agents:
    """A reference agent per server (each its own MQTT user), in a thread's event loop."""

    def __init__(self, broker: Mosquitto, passwords: dict[str, str]) -> None:
        self.broker = broker
        self.passwords = passwords
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.tasks: dict[str, concurrent.futures.Future[None]] = {}

    def mqtt(self, user: str) -> MqttConfig:
        return MqttConfig("127.0.0.1", self.broker.port, username=user,
                          password=self.passwords[user], heartbeat_seconds=0.5,
                          heartbeat_timeout=HEARTBEAT_TIMEOUT)  # fmt: skip

    def start(self, server: str) -> None:
        agent = Agent(server, self.mqtt(server), report_seconds=0.5)
        self.tasks[server] = asyncio.run_coroutine_threadsafe(agent.run(), self.loop)

    def kill(self, server: str) -> None:
        self.tasks.pop(server).cancel()

    def run(self, coroutine: Any, timeout: float = 60.0) -> Any:
        """Run ``coroutine`` in the agents' loop (the attackers' MQTT clients too)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        """Cancel every task of the loop (agents, clients) and wait for them; stop it."""

        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.tasks.clear()
        self.run(shutdown(), timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


# -- the faults -------------------------------------------------------------------------


@dataclass
class Kill:
    server: str
    at_wall: float  # Unix seconds
    detected_after: float | None = None  # seconds from the kill to server_failed
    restarted: bool = False


@dataclass
class Chaos:
    """The schedule of the module docstring, run in its own thread during the load."""

    broker: Mosquitto
    agents: Agents
    db: Path
    seconds: float
    daemon: Daemon
    restarts: int = 0
    crashes: list[float] = field(default_factory=list)  # seconds until it listened again
    down: list[list[float]] = field(default_factory=list)  # [from, to] (Unix s) per crash
    poison_rounds: int = 0
    poison_messages: int = 0
    forged_reports: int = 0
    forged_entries: int = 0
    kills: list[Kill] = field(default_factory=list)
    writer_kills: int = 0  # commit processes killed
    orphans: int = 0  # a killed daemon's commit process still running 5 s after

    def run(self, load: Load) -> None:
        start = time.monotonic()
        plan: list[tuple[float, str, str]] = sorted(
            [(f * self.seconds, "restart", "") for f in (0.2, 0.45, 0.7, 0.9)]
            + [(f * self.seconds, "poison", "") for f in (0.1, 0.3, 0.55, 0.8)]
            + [
                (f * self.seconds, "kill", s)
                for f, s in zip((0.15, 0.4, 0.6, 0.75), KILLED, strict=True)
            ]
            + [(f * self.seconds, "crash", "") for f in (0.3, 0.85)]
            + [(f * self.seconds, "writer", "") for f in (0.25, 0.5, 0.65)]
        )
        next_forgery = 0.0
        crashing: list[threading.Thread] = []
        # after the load: until every killed agent was noticed or restarted (bounded)
        while (not load.finished.is_set() or plan or any(not k.restarted for k in self.kills)) and (
            time.monotonic() - start < self.seconds + 90
        ):
            now = time.monotonic() - start
            while plan and plan[0][0] <= now:
                _, what, server = plan.pop(0)
                if what == "restart":
                    self.broker.kill()
                    time.sleep(1.0)
                    self.broker.start()
                    self.restarts += 1
                elif what == "poison":
                    self.agents.run(self._poison())
                elif what == "writer":
                    self._kill_writer()
                elif what == "crash":  # in a thread: the schedule goes on meanwhile
                    crash = threading.Thread(target=self._crash, name="crash")
                    crash.start()
                    crashing.append(crash)
                else:
                    self.agents.kill(server)
                    self.kills.append(Kill(server, time.time()))
            if now >= next_forgery:
                self.agents.run(self._forge())
                next_forgery = now + 1.0
            self._restart_detected()
            time.sleep(0.1)
        for crash in crashing:
            crash.join(150)

    def _kill_writer(self) -> None:
        """SIGKILL the daemon's commit process (none while the daemon is down)."""
        proc = self.daemon.proc
        for pid in commit_processes(proc.pid) if proc is not None else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                self.writer_kills += 1

    def _crash(self) -> None:
        """SIGKILL the daemon and start it again on the same port."""
        killed = time.monotonic()
        self.down.append([time.time(), math.inf])
        proc = self.daemon.proc
        writers = commit_processes(proc.pid) if proc is not None else []
        self.daemon.kill9()
        self.orphans += sum(not ended(pid, 5.0) for pid in writers)
        self.daemon.start(timeout=120)
        self.down[-1][1] = time.time()
        self.crashes.append(round(time.monotonic() - killed, 2))

    def _downtime_since(self, since: float) -> float:
        """Seconds the daemon has been down since ``since`` (Unix; inf while it is)."""
        return sum(max(0.0, min(to, time.time()) - max(at, since)) if to < math.inf
                   else math.inf for at, to in self.down if to > since)  # fmt: skip

    def _restart_detected(self) -> None:
        failed = failures(self.db)
        for kill in self.kills:
            if kill.restarted:
                continue
            after = [at - kill.at_wall for server, at in failed
                     if server == kill.server and at >= kill.at_wall]  # fmt: skip
            if after and kill.detected_after is None:
                kill.detected_after = min(after)
            # 30 s to notice, not counting the daemon's own downtime
            waited = time.time() - kill.at_wall - self._downtime_since(kill.at_wall)
            if kill.detected_after is not None or waited > 30:
                self.agents.start(kill.server)
                kill.restarted = True

    async def _poison(self) -> None:
        unknown = [TaskProgress(f"ghost-{i}", 1.0, 1.0) for i in range(100_000)]
        messages = [
            (TOPICS.progress(POISONER), b"[" * 50_000, True),
            (TOPICS.progress(POISONER), Progress(POISONER, "x", unknown).to_bytes(), False),
            (TOPICS.progress(POISONER), Progress(POISONER, "x", unknown[:1000]).to_bytes(),
             False),
            (TOPICS.heartbeat(POISONER), b"\xff\xfe not utf-8", False),
        ]  # fmt: skip
        try:
            async with self._client(POISONER) as client:
                for topic, payload, retain in messages:
                    await client.publish(topic, payload, qos=1, retain=retain)
        except aiomqtt.MqttError:
            return  # the broker is restarting: next round
        self.poison_rounds += 1
        self.poison_messages += len(messages)

    async def _forge(self) -> None:
        with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=5) as conn:
            running = conn.execute(
                "SELECT id, spec FROM jobs WHERE state = 'running' LIMIT 200"
            ).fetchall()
        lies = []
        for job_id, spec_text in running:
            spec = json.loads(spec_text)
            total = spec["epochs"] * spec["chunks"] * spec["minibatches"]
            lies.append(TaskProgress(job_id, float(total), 1.0))
        down = [k.server for k in self.kills if not k.restarted]
        try:
            async with self._client(FORGER) as client:
                if lies:
                    for named, topic in (("w0", TOPICS.progress(FORGER)),
                                         (FORGER, TOPICS.progress(FORGER)),
                                         ("w0", TOPICS.progress("w0"))):  # fmt: skip
                        report = Progress(named, FORGED_SESSION, lies)
                        await client.publish(topic, report.to_bytes(), qos=1)
                        self.forged_reports += 1
                        self.forged_entries += len(lies)
                for server in down:
                    beat = Heartbeat(server, FORGED_SESSION).to_bytes()
                    await client.publish(TOPICS.heartbeat(FORGER), beat, qos=0)
                    await client.publish(TOPICS.heartbeat(server), beat, qos=0)
        except aiomqtt.MqttError:
            return

    def _client(self, user: str) -> aiomqtt.Client:
        mqtt = self.agents.mqtt(user)
        name = f"chaos-{user}-{uuid.uuid4().hex[:6]}"
        return aiomqtt.Client(mqtt.host, mqtt.port, username=mqtt.username,
                              password=mqtt.password, identifier=name)  # fmt: skip


def failures(db: Path) -> list[tuple[str, float]]:
    """``(server, Unix time)`` of every stored ``server_failed`` event."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        rows = conn.execute("SELECT at, detail FROM events WHERE kind = 'server_failed'")
        found = rows.fetchall()
    out = []
    for at, detail in found:
        when = datetime.fromisoformat(str(at))
        if when.tzinfo is None:  # SQLite keeps the UTC time without its zone
            when = when.replace(tzinfo=UTC)
        out.append((str(json.loads(detail)["server"]), when.timestamp()))
    return out


def jobs_failed(db: Path) -> dict[str, int]:
    """How many jobs failed, by the reason stored with their ``failed`` event."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        rows = conn.execute("SELECT detail FROM events WHERE kind = 'failed'").fetchall()
    reasons: dict[str, int] = {}
    for (detail,) in rows:
        reason = str(json.loads(detail).get("reason", "?"))
        reasons[reason] = reasons.get(reason, 0) + 1
    return reasons


# -- reading the broker and the store ---------------------------------------------------


def latest_stored(db: Path) -> dict[str, int]:
    """Each job's latest published event (its sequence), from the store, but for a job
    whose latest is a rejection: that is published, not retained, nor restored
    (:data:`controller.plane.event_messages.UNRETAINED`, eef36bf). Counted, every
    rejected job read as stale and the check failed ("250 jobs' retained events stale"
    of 360, the 110 admitted restored)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        rows = conn.execute(  # SQLite: a bare column is read from the max()'s row
            "SELECT job_id, max(sequence), kind, state FROM events WHERE job_id != '' "
            f"AND kind IN {JOB_EVENT_KINDS} GROUP BY job_id"
        ).fetchall()
    return {str(j): int(s) for j, s, kind, state in rows if event_kind(kind, state) != UNRETAINED}


async def retained(agents: Agents, user: str, topic: str, wait: float) -> dict[str, Any]:
    """Retained messages matching ``topic`` (topic -> JSON) as ``user`` sees them."""
    mqtt = agents.mqtt(user)
    got: dict[str, Any] = {}
    async with aiomqtt.Client(mqtt.host, mqtt.port, username=user,
                              password=mqtt.password) as client:  # fmt: skip
        await client.subscribe(topic, qos=1)
        try:
            async with asyncio.timeout(wait):
                async for message in client.messages:
                    if isinstance(message.payload, bytes):
                        got[str(message.topic)] = json.loads(message.payload)
        except TimeoutError:
            pass
    return got


def count(path: Path, event: str) -> int:
    return sum(1 for e in json_log(path) if e.get("event") == event)


# -- one run ----------------------------------------------------------------------------


@dataclass
class ChaosReport:
    """One run; ``problems`` empty means every check passed."""

    seconds: float
    rate: float
    jobs: int
    answered: int = 0
    admitted: int = 0
    given_up: int = 0
    latency_p50_ms: float = 0.0
    latency_p99_ms: float = 0.0
    latency_max_ms: float = 0.0
    failed_calls: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    duplicated: int = 0
    ledger_equals_store: bool = False
    broker_restarts: int = 0
    reconnects: int = 0
    reconnects_per_minute: float = 0.0
    link_failures: int = 0
    daemon_crashes: int = 0
    commit_process_kills: int = 0
    orphaned_commit_processes: int = 0
    jobs_failed: dict[str, int] = field(default_factory=dict)  # reason -> jobs
    back_after_crash_seconds: list[float] = field(default_factory=list)
    poison_messages: int = 0
    bad_messages_logged: int = 0
    forged_reports: int = 0
    forged_entries_sent: int = 0
    forged_entries_counted: int = 0
    failures_injected: int = 0
    failures_detected: int = 0
    false_failures: int = 0
    detection_seconds: list[float] = field(default_factory=list)
    jobs_with_events: int = 0
    stale_after_restart: int = -1
    restore_seconds: float = 0.0
    offline_after_stop: bool = False
    problems: list[str] = field(default_factory=list)


def run_chaos(workdir: Path, seconds: float, rate: float, clients: int, seed: int) -> ChaosReport:
    run_id = uuid.uuid4().hex[:6]
    passwords = {DAEMON_USER: uuid.uuid4().hex, "watcher": uuid.uuid4().hex,
                 **{s["name"]: uuid.uuid4().hex for s in servers()}}  # fmt: skip
    acl = workdir / "mosquitto.acl"  # the shipped ACL, and a reader of job events
    reader = "user watcher\ntopic read oasis/v1/jobs/+/events\ntopic read oasis/v1/daemon/status\n"
    acl.write_text((ROOT / "config" / "mosquitto.acl").read_text() + "\n" + reader)
    broker = Mosquitto(users=passwords, acl=acl)
    data_dir = workdir / "data"
    db = data_dir / "oasis.db"
    epoch = time.time()
    config = write_config(workdir / "oasisd.toml", data_dir, "", servers(), epoch,
                          slot_seconds=SLOT_SECONDS, window=WINDOW,
                          extra=mqtt_table(broker, passwords[DAEMON_USER]))  # fmt: skip
    log = workdir / "oasisd.log"
    daemon = Daemon(config, log).start(timeout=120)
    # later starts (after a SIGKILL) listen where the clients' channels already point
    config.write_text(config.read_text().replace('listen = "127.0.0.1:0"',
                                                 f'listen = "{daemon.address}"'))  # fmt: skip
    agents = Agents(broker, passwords)
    specs = job_specs(int(seconds * rate), seed, run_id)
    report = ChaosReport(seconds=seconds, rate=rate, jobs=len(specs))
    try:
        for s in servers():
            agents.start(str(s["name"]))
        requests = [pb.SubmitJobRequest(job=spec_to_proto(spec)) for spec in specs]
        load = Load(daemon.address, requests, clients, max_seconds=seconds + 30,
                    job_seconds=120.0, monitor_interval=1.0, rate=rate)  # fmt: skip
        chaos = Chaos(broker, agents, db, seconds, daemon)
        wall = load.run(chaos)
        connections = count(log, "broker connected")
        _finish(report, load, chaos, wall, connections, db)

        # every killed agent back, every outage over, then a last broker restart
        for kill in chaos.kills:
            if not kill.restarted:
                agents.start(kill.server)
                kill.restarted = True
        _wait_recovered(db, epoch)
        _restore(report, agents, broker, db)

        # quiet: without the broker nothing is reported or failed; then compare
        broker.kill()
        time.sleep(1.0)
        _check(report, daemon, db, specs, load)
        broker.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and count(log, "broker connected") <= connections + 2:
            time.sleep(0.2)
        code = daemon.stop()
        if code != 0:
            report.problems.append(f"oasisd exited with {code}; log: {log}")
        status = agents.run(retained(agents, "watcher", TOPICS.status, 1.0))
        report.offline_after_stop = status.get(TOPICS.status, {}).get("online") is False
        if not report.offline_after_stop:
            report.problems.append(f"retained status after a clean stop: {status}")
        report.link_failures = count(log, "execution plane failed; reconnecting")
        if report.link_failures:
            report.problems.append(f"the broker link failed {report.link_failures} times")
    finally:
        agents.close()
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()
        broker.close()
    return report


def _finish(
    report: ChaosReport, load: Load, chaos: Chaos, wall: float, connections: int, db: Path
) -> None:
    """The load's figures and what the faults did."""
    answers = list(load.answers.values())
    report.answered = len(answers)
    report.admitted = sum(a.admitted for a in answers)
    report.given_up = len(load.given_up)
    report.failed_calls = dict(load.failed_calls)
    report.latency_p50_ms, report.latency_p99_ms, report.latency_max_ms = percentiles(
        [a.seconds * 1000.0 for a in answers]
    )
    report.broker_restarts = chaos.restarts
    report.daemon_crashes = len(chaos.crashes)
    report.commit_process_kills = chaos.writer_kills
    report.orphaned_commit_processes = chaos.orphans
    if chaos.orphans:
        report.problems.append(f"{chaos.orphans} commit processes outlived their daemon")
    report.jobs_failed = jobs_failed(db)
    report.back_after_crash_seconds = chaos.crashes
    report.reconnects = connections - 1
    report.reconnects_per_minute = report.reconnects / (wall / 60.0)
    # a broker restart while the daemon is down costs it no reconnection: at most one each
    if report.reconnects > chaos.restarts + len(chaos.crashes):
        report.problems.append(
            f"{report.reconnects} reconnections for {chaos.restarts} broker restarts "
            f"and {len(chaos.crashes)} daemon crashes"
        )
    report.poison_messages = chaos.poison_messages
    report.forged_reports = chaos.forged_reports
    report.forged_entries_sent = chaos.forged_entries
    report.failures_injected = len(chaos.kills)
    failed = failures(db)
    killed = {k.server for k in chaos.kills}
    report.detection_seconds = [round(k.detected_after, 2) for k in chaos.kills
                                if k.detected_after is not None]  # fmt: skip
    report.failures_detected = len(report.detection_seconds)
    report.false_failures = sum(1 for server, _at in failed if server not in killed)
    if report.failures_detected != report.failures_injected or report.false_failures:
        report.problems.append(
            f"failures detected {report.failures_detected} of {report.failures_injected}, "
            f"{report.false_failures} servers failed that were not killed: {failed}"
        )


def _wait_recovered(db: Path, epoch: float, timeout: float = 120.0) -> None:
    """Until no outage is open and the slot every server is back from has begun."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            back = [u for (u,) in conn.execute("SELECT up_from FROM server_outages")]
        slot = int((time.time() - epoch) // SLOT_SECONDS)
        if all(u is not None and int(u) <= slot for u in back):
            return
        time.sleep(0.5)
    raise TimeoutError("servers did not come back")


def _restore(report: ChaosReport, agents: Agents, broker: Mosquitto, db: Path) -> None:
    """A last broker restart; then until every job's retained event is its latest."""
    broker.kill()
    time.sleep(1.0)
    broker.start()
    started = time.monotonic()
    stale: list[str] = ["not read"]
    while stale and time.monotonic() - started < 60:
        before = latest_stored(db)
        got = agents.run(retained(agents, "watcher", TOPICS.job_events("+"), 2.0))
        seen = {p["job"]: int(p["sequence"]) for p in got.values()}
        stale = [j for j, seq in before.items() if seen.get(j, -1) < seq]
        report.jobs_with_events = len(before)
        report.stale_after_restart = len(stale)
    report.restore_seconds = round(time.monotonic() - started, 1)
    if stale:
        report.problems.append(f"{len(stale)} jobs' retained events stale, e.g. {stale[:3]}")


def _check(
    report: ChaosReport, daemon: Daemon, db: Path, specs: list[dict[str, Any]], load: Load
) -> None:
    """Lost, duplicated, forged entries, capacity and ledger == store (a few tries: a slot
    boundary between two reads is not a disagreement)."""
    url = f"sqlite:///{db.resolve()}"
    ids = [str(s["id"]) for s in specs]
    problems: list[str] = ["not checked"]
    for _attempt in range(5):
        rows = read_store(url)
        problems = decision_problems(rows, ids, load.answers)
        use = store_use(rows)
        problems += capacity_problems(use, servers())
        ledger = check_ledger(daemon.address, use, servers())
        report.ledger_equals_store = not ledger
        problems += ledger
        if not problems:
            break
        time.sleep(1.0)
    report.lost = sum(
        1
        for job_id, a in load.answers.items()
        if job_id not in rows.jobs
        or (a.sequence, a.admitted)
        != (rows.jobs[job_id].sequence, bool(rows.jobs[job_id].admitted))
    )
    report.duplicated = sum(1 for n in rows.decided.values() if n > 1)
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        stored = conn.execute("SELECT per_server FROM job_progress").fetchall()
    report.forged_entries_counted = sum(
        1 for (per_server,) in stored for key in json.loads(per_server)
        if key.endswith(f"/{FORGED_SESSION}")
    )  # fmt: skip
    if report.forged_entries_counted:
        problems.append(f"{report.forged_entries_counted} forged entries were counted")
    report.bad_messages_logged = count(daemon.log_path, "bad message from an agent")
    report.problems += problems[:20]


# -- report -----------------------------------------------------------------------------


def print_report(r: ChaosReport, command: str) -> None:
    m = describe(grpcio=grpc.__version__, aiomqtt=aiomqtt.__version__)
    print(f"machine: {m['cpu']}, {m['cores']} cores; Python {m['python']}, "
          f"grpcio {m['grpcio']}, aiomqtt {m['aiomqtt']}")  # fmt: skip
    print(f"command: {command}\n")
    d = r.detection_seconds
    rows = [
        ("load", f"{r.jobs} jobs at {r.rate}/s over {r.seconds:.0f} s: {r.answered} answered "
                 f"({r.admitted} admitted), {r.given_up} given up; latency p50 / p99 / max "
                 f"{r.latency_p50_ms:.0f} / {r.latency_p99_ms:.0f} / {r.latency_max_ms:.0f} ms; "
                 f"failed calls {r.failed_calls or 0}"),
        ("lost", str(r.lost)),
        ("duplicated", str(r.duplicated)),
        ("ledger == store", "yes" if r.ledger_equals_store else "NO"),
        ("failures detected", f"{r.failures_detected} of {r.failures_injected} (after "
                              f"{', '.join(f'{x:.1f}' for x in d)} s); {r.false_failures} "
                              "false"),
        ("daemon kill -9", f"{r.daemon_crashes}, listening again after "
                           f"{', '.join(f'{x:.1f}' for x in r.back_after_crash_seconds)} s"),
        ("commit process kill -9", f"{r.commit_process_kills}; orphaned after a daemon "
                                   f"kill -9: {r.orphaned_commit_processes}"),
        ("jobs failed, by reason", ", ".join(f"{k} {v}" for k, v in r.jobs_failed.items())
                                   or "none"),
        ("broker restarts / reconnects", f"{r.broker_restarts} / {r.reconnects} "
                                         f"({r.reconnects_per_minute:.1f} per minute); link "
                                         f"failures {r.link_failures}"),
        ("poison messages", f"{r.poison_messages} sent, {r.bad_messages_logged} warnings "
                            "(throttled)"),
        ("forged reports", f"{r.forged_reports} ({r.forged_entries_sent} entries) sent, "
                           f"{r.forged_entries_counted} entries counted"),
        ("restored after a restart", f"{r.jobs_with_events - max(r.stale_after_restart, 0)} "
                                     f"of {r.jobs_with_events} jobs' events within "
                                     f"{r.restore_seconds} s"),
        ("status after a clean stop", "offline" if r.offline_after_stop else "NOT offline"),
    ]  # fmt: skip
    print("| figure | measured |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    print("\nchecks: " + ("pass" if not r.problems else "FAIL"))
    for problem in r.problems:
        print(f"  {problem}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="load duration")
    parser.add_argument("--rate", type=float, default=3.0, help="jobs submitted per second")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="oasis-chaos-"))
    agent_log: TextIO = open(workdir / "agents.log", "w")  # noqa: SIM115
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(),
                    structlog.processors.JSONRenderer()],
        logger_factory=structlog.PrintLoggerFactory(agent_log),
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
    )  # fmt: skip
    try:
        report = run_chaos(workdir, args.seconds, args.rate, args.clients, args.seed)
    finally:
        agent_log.close()
        if not args.keep:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    command = "python -m bench.chaos " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        print_report(report, command.strip())
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
