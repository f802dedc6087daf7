"""The execution plane end to end: a real Mosquitto on a loopback port, oasisd as a
subprocess with ``[mqtt]``, and reference agents (``oasis agent``) as subprocesses.

Slots are 6 s of real time so plans move while the test watches; every wait polls for
a state with a generous deadline (a slow machine makes a test slower, not wrong).
After every step the store, the daemon's ledger and the retained plans must agree
(:func:`wait_consistent`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiomqtt
import grpc
import pytest

from controller.plane.topics import Heartbeat, Plan, Topics
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.broker import NEEDS_MOSQUITTO, Mosquitto
from tests.servers import ROOT, Daemon, events_through, json_log, oasis, write_config

SLOT = 6.0
WINDOW = 24  # the daemon's window (tests/servers.py): its ledger holds slots s .. s + WINDOW
HEARTBEAT_TIMEOUT = 4.0
SERVERS = ("w0", "w1", "w2", "p0", "p1")
DEMAND = {
    "worker": {"gpu": 1, "cpu": 4, "mem": 8, "disk": 5, "bandwidth": 1},
    "ps": {"cpu": 2, "mem": 8, "disk": 5, "bandwidth": 5},
}
CAPACITY = {
    "w0": {"gpu": 4, "cpu": 32, "mem": 244, "disk": 250, "bandwidth": 25},
    "w1": {"gpu": 4, "cpu": 32, "mem": 244, "disk": 250, "bandwidth": 25},
    "w2": {"gpu": 8, "cpu": 64, "mem": 488, "disk": 500, "bandwidth": 40},
    "p0": {"cpu": 36, "mem": 60, "disk": 500, "bandwidth": 25},
    "p1": {"cpu": 16, "mem": 30, "disk": 250, "bandwidth": 20},
}
_T = TypeVar("_T")

pytestmark = NEEDS_MOSQUITTO


def plane_job(job_id: str, **changes: Any) -> dict[str, Any]:
    """216 mini-batches of ~0.32 s on one worker, at most 2 workers: 12 worker-slots of
    6 s, planned over 6 slots."""
    return {
        "id": job_id, "epochs": 1, "chunks": 2, "minibatches": 108, "tau": 0.05, "grad_mb": 1,
        "worker": DEMAND["worker"], "ps": DEMAND["ps"],
        "utility": {"kind": "sigmoid", "priority": 50, "decay": 0.5, "target": 3},
        **changes,
    }  # fmt: skip


async def retained_now(client: aiomqtt.Client, topic: str) -> dict[str, Any]:
    """The messages the broker holds retained on ``topic`` now, as ``client`` (connected)
    reads them: topic -> JSON payload. No fixed wait: subscribed at QoS 0 (the broker
    then sends every retained message at once, none held back by its in-flight window),
    then the UNSUBSCRIBE of a topic never subscribed: Mosquitto queues a subscription's
    retained messages before it reads the client's next packet, so all of them have come
    once the UNSUBACK has. Only messages sent as retained count: a live publication
    meanwhile is not what the broker holds (one cleared meanwhile is dropped)."""
    await client.subscribe(topic, qos=0)
    await client.unsubscribe("oasis-tests/barrier")
    got: dict[str, Any] = {}
    while len(client.messages):
        message = await anext(client.messages)
        assert isinstance(message.payload, bytes)
        if not message.payload:  # a retained message cleared (live)
            got.pop(str(message.topic), None)
        elif message.retain:
            got[str(message.topic)] = json.loads(message.payload)
    return got


def wait_for(what: str, probe: Callable[[], _T | None], timeout: float = 60.0) -> _T:
    """Poll ``probe`` until it returns something other than None/False."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except grpc.RpcError as err:
            last = err
        if last is not None and last is not False and not isinstance(last, grpc.RpcError):
            return last  # type: ignore[no-any-return]
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


class PlaneHarness:
    """What a broker, a daemon and agent processes under test share: gRPC calls to
    ``self.daemon``, job files in ``self.tmp``, and the tear-down."""

    tmp: Path
    db: Path  # the daemon's SQLite store
    daemon: Daemon
    broker: Mosquitto
    agents: dict[str, subprocess.Popen[bytes]]

    def store_rows(self, query: str, args: tuple[Any, ...] = ()) -> list[Any]:
        """``query``'s rows in the daemon's store, read-only (its connection closed)."""
        with contextlib.closing(
            sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10)
        ) as conn:
            return conn.execute(query, args).fetchall()

    def client(self, user: str = "") -> aiomqtt.Client:
        """An MQTT client of the broker (anonymous; ``user`` where the broker wants one)."""
        return aiomqtt.Client("127.0.0.1", self.broker.port)

    def wait_agents(self, servers: tuple[str, ...] = SERVERS, timeout: float = 60.0) -> None:
        """Until the agent of every server of ``servers`` is heard: its heartbeats reach
        the broker (and so the daemon, subscribed to them since it connected)."""

        async def listen() -> None:
            heard: set[str] = set()
            async with self.client() as client:
                await client.subscribe(Topics("oasis").all_heartbeats, qos=0)
                async with asyncio.timeout(timeout):
                    async for message in client.messages:
                        assert isinstance(message.payload, bytes)
                        heard.add(Heartbeat.parse(message.payload).server)
                        if heard >= set(servers):
                            return

        asyncio.run(listen())

    def kill_agent(self, server: str) -> None:
        proc = self.agents.pop(server)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def close(self) -> None:
        for server in list(self.agents):
            self.kill_agent(server)
        if self.daemon.proc is not None and self.daemon.proc.poll() is None:
            self.daemon.stop()
        self.broker.close()

    def stub(self) -> Any:
        return pb_grpc.AdmissionStub(grpc.insecure_channel(self.daemon.address))

    def cluster_stub(self) -> Any:
        return pb_grpc.ClusterStub(grpc.insecure_channel(self.daemon.address))

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        path = self.tmp / f"{spec['id']}.json"
        path.write_text(json.dumps(spec))
        out = oasis("submit", str(path), "--json", server=self.daemon.address)
        return dict(json.loads(out.stdout))

    def job(self, job_id: str) -> Any:
        return self.stub().GetJob(pb.GetJobRequest(id=job_id), timeout=10).job

    def events(self) -> list[Any]:
        """The daemon's events, replayed from the first up to the last one its store
        holds when called (the stream is cancelled there: no fixed wait)."""
        [(last,)] = self.store_rows("SELECT max(sequence) FROM events")
        return events_through(self.stub(), last)


class Cluster(PlaneHarness):
    """A broker, a daemon with ``[mqtt]`` and agents, in ``tmp``."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.broker = Mosquitto()
        self.topics = Topics("oasis")
        config = write_config(tmp / "oasisd.toml", tmp / "data", epoch=time.time())
        text = config.read_text().replace("slot_seconds = 3600", f"slot_seconds = {SLOT}")
        text = text.replace("tick_seconds = 0.2", "tick_seconds = 0.1").replace(
            "[cluster]",
            f'[mqtt]\nurl = "{self.broker.url}"\nheartbeat_timeout = {HEARTBEAT_TIMEOUT}\n'
            "heartbeat_seconds = 0.3\n\n[cluster]",
        )
        config.write_text(text)
        self.db = tmp / "data" / "oasis.db"
        self.daemon = Daemon(config, tmp / "oasisd.log")
        self.agents: dict[str, subprocess.Popen[bytes]] = {}

    def start_agent(self, server: str, speed: float = 1.0) -> None:
        log = open(self.tmp / f"agent-{server}.log", "ab")  # noqa: SIM115
        self.agents[server] = subprocess.Popen(
            [sys.executable, "-m", "controller.cli", "agent", "--node", server,
             "--broker", self.broker.url, "--speed", str(speed), "--report-seconds", "0.2"],
            stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT,
        )  # fmt: skip
        log.close()

    # -- reading what happened ----------------------------------------------------------

    def retained(self, topic: str) -> dict[str, Any]:
        """The retained messages matching ``topic`` now: topic -> JSON payload
        (:func:`retained_now`)."""

        async def read() -> dict[str, Any]:
            async with aiomqtt.Client("127.0.0.1", self.broker.port) as client:
                return await retained_now(client, topic)

        return asyncio.run(read())

    def plans(self, timeout: float = 10.0) -> dict[str, Plan]:
        """The retained plan of every server (as a fresh subscriber sees them)."""

        async def read() -> dict[str, Plan]:
            plans: dict[str, Plan] = {}
            async with aiomqtt.Client("127.0.0.1", self.broker.port) as client:
                await client.subscribe(self.topics.all_plans, qos=1)
                async with asyncio.timeout(timeout):
                    async for message in client.messages:
                        assert isinstance(message.payload, bytes)
                        plan = Plan.parse(message.payload)
                        plans[plan.server] = plan
                        if len(plans) == len(SERVERS):
                            return plans
            return plans

        return asyncio.run(read())

    def record(self, *topics: str) -> tuple[list[tuple[str, dict[str, Any]]], Callable[[], None]]:
        """Subscribe to ``topics`` in a thread from now on: the (topic, JSON payload)
        list it fills, and a function that stops it."""
        got: list[tuple[str, dict[str, Any]]] = []
        ready = threading.Event()
        loop = asyncio.new_event_loop()

        async def listen() -> None:
            async with aiomqtt.Client("127.0.0.1", self.broker.port) as client:
                for topic in topics:
                    await client.subscribe(topic, qos=1)
                ready.set()
                async for message in client.messages:
                    assert isinstance(message.payload, bytes)
                    got.append((str(message.topic), json.loads(message.payload)))

        task = loop.create_task(listen())
        # asyncio.wait returns, and does not raise, once close() has cancelled the task
        thread = threading.Thread(
            target=loop.run_until_complete, args=(asyncio.wait([task]),), daemon=True
        )
        thread.start()
        assert ready.wait(10), "the recorder did not subscribe"

        def close() -> None:
            loop.call_soon_threadsafe(task.cancel)
            thread.join(10)
            loop.close()

        return got, close


def inconsistencies(c: Cluster) -> list[str]:
    """Where the store's allocations and the daemon's ledger amounts disagree in any slot
    of the window, or the retained plans (the current and next slot: all a plan holds)
    and the store disagree (empty: they agree)."""
    with grpc.insecure_channel(c.daemon.address) as channel:
        return _inconsistencies(c, pb_grpc.ClusterStub(channel))


def _inconsistencies(c: Cluster, cluster: Any) -> list[str]:
    s = cluster.ListServers(pb.ListServersRequest(), timeout=10).current_slot
    problems: list[str] = []
    plans = c.plans()
    if set(plans) != set(SERVERS):
        return [f"retained plans for {sorted(plans)} only"]
    planned: dict[tuple[int, str], dict[str, tuple[int, int]]] = {}
    for name, plan in plans.items():
        if plan.window != WINDOW:  # agents drop set-aside counts by it
            problems.append(f"{name}: retained plan says window {plan.window}, not {WINDOW}")
        if plan.current.slot != s:
            problems.append(f"{name}: retained plan is for slot {plan.current.slot}, not {s}")
        for part in (plan.current, plan.next):
            for t in part.tasks:
                planned.setdefault((part.slot, name), {})[t.job] = (t.workers, t.ps)
    rows = c.store_rows(
        "SELECT a.job_id, a.slot, a.server, a.workers, a.ps, j.state FROM allocations a "
        "JOIN jobs j ON j.id = a.job_id WHERE a.slot >= ?",
        (s,),
    )
    stored: dict[tuple[int, str], dict[str, tuple[int, int]]] = {}
    amounts: dict[tuple[int, str], dict[str, float]] = {}
    for job_id, slot, server, workers, ps, state in rows:
        if state in ("admitted", "running") and slot in (s, s + 1):
            stored.setdefault((slot, server), {})[job_id] = (workers, ps)
        use = amounts.setdefault((slot, server), {})
        for kind, count in (("worker", workers), ("ps", ps)):
            for r, d in DEMAND[kind].items():
                use[r] = use.get(r, 0.0) + count * d
    if stored != planned:
        problems.append(f"store {stored} != plans {planned}")
    beyond = sorted({slot for slot, _server in amounts if slot > s + WINDOW})
    if beyond:
        problems.append(f"allocations in slots {beyond}, past the window's last {s + WINDOW}")
    outages = c.store_rows("SELECT server, down_from, up_from FROM server_outages")
    for slot in range(s, s + WINDOW + 1):
        down = {srv for srv, d, u in outages if d <= slot and (u is None or u > slot)}
        ledger = cluster.ListServers(pb.ListServersRequest(slot=slot), timeout=10)
        if ledger.current_slot != s:
            return [f"slot {s} ended while checking"]
        for srv in ledger.servers:
            want: dict[str, float] = dict(amounts.get((slot, srv.name), {}))
            if srv.name in down:  # a failed server is full: no room, price U
                want = {r: float(x) for r, x in CAPACITY[srv.name].items()}
            for r, cap in CAPACITY[srv.name].items():
                if abs(srv.used.get(r, 0.0) - want.get(r, 0.0)) > 1e-6 * max(cap, 1):
                    problems.append(
                        f"slot {slot} {srv.name} {r}: ledger {srv.used.get(r)} != store "
                        f"{want.get(r, 0.0)}"
                    )
    return problems


def wait_consistent(c: Cluster, timeout: float = 30.0) -> None:
    """Store and ledger agree over the whole window, and the retained plans with the
    store (after the publications settle)."""
    deadline = time.monotonic() + timeout
    problems = ["not checked"]
    while time.monotonic() < deadline:
        try:
            problems = inconsistencies(c)
        except grpc.RpcError as err:  # the slot moved on between two reads
            problems = [f"{err.code()}: {err.details()}"]
        if not problems:
            return
        time.sleep(0.3)
    raise AssertionError("store, ledger and plans disagree:\n" + "\n".join(problems))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


def planned_servers(job: dict[str, Any], slot: int) -> set[str]:
    return {a["server"] for a in job["decision"]["allocations"] if int(a["slot"]) == slot}


def test_agents_follow_plans_report_progress_and_early_completion_releases_slots(
    cluster: Cluster,
) -> None:
    recorded, stop_recording = cluster.record(cluster.topics.job_events("+"), cluster.topics.status)
    cluster.daemon.start()
    for server in SERVERS:
        cluster.start_agent(server, speed=6.0)
    wait_consistent(cluster)
    job = cluster.submit(plane_job("e1"))
    decision = job["decision"]
    assert decision["admitted"] is True
    slots = sorted({int(a["slot"]) for a in decision["allocations"]})
    assert len(slots) >= 4, "the job must be planned over several slots"
    wait_consistent(cluster)

    # the job reaches its servers' plans: first as the next slot, then as the current one
    first = slots[0]
    worker_server = next(a["server"] for a in decision["allocations"] if int(a.get("workers", 0)))
    plan: Any = wait_for(
        "the job in a retained plan",
        lambda: (p := cluster.plans()[worker_server]).current.slot == first and p,
    )
    assert [t.job for t in plan.current.tasks] == ["e1"]
    # the server's GPUs and the worker's, for the agent to hand out (CUDA_VISIBLE_DEVICES)
    assert plan.devices == CAPACITY[worker_server]["gpu"]
    assert plan.current.tasks[0].devices == DEMAND["worker"]["gpu"]
    assert all(p.devices == 0 for s, p in cluster.plans().items() if s.startswith("p"))
    # and the job's whole demand per worker (per PS on a PS server), for the launcher
    assert plan.current.tasks[0].demand == DEMAND["worker"]
    ps_tasks = [t for s, p in cluster.plans().items() if s.startswith("p")
                for t in p.current.tasks if p.current.slot == first]  # fmt: skip
    # (every resource, zeros included: a PS's none of the GPUs)
    assert ps_tasks and all(t.demand == {"gpu": 0, **DEMAND["ps"]} for t in ps_tasks)

    # six times faster than planned: done in about a slot; the rest is released
    done = wait_for(
        "early completion",
        lambda: (j := cluster.job("e1")).state == pb.JOB_STATE_COMPLETED and j,
    )
    assert done.decision.completion_slot < slots[-1]
    kept = {a.slot for a in done.decision.allocations}
    assert max(kept) == done.decision.completion_slot
    completed = [e for e in cluster.events() if e.kind == "completed" and e.job_id == "e1"]
    detail = json.loads(completed[0].detail)
    assert detail["early"] is True and detail["released_worker_slots"] > 0
    # prices of the released slots fall back to those of an empty slot
    prices = cluster.cluster_stub().GetPrices(
        pb.GetPricesRequest(first_slot=slots[-1], slots=1, server=worker_server), timeout=10
    )
    idle = cluster.cluster_stub().GetPrices(
        pb.GetPricesRequest(first_slot=slots[-1] + 10, slots=1, server=worker_server), timeout=10
    )
    assert [p.prices[0] for p in prices.prices] == [p.prices[0] for p in idle.prices]
    wait_consistent(cluster)
    assert all("e1" not in [t.job for t in p.next.tasks] for p in cluster.plans().values())

    # progress flowed back, and the runtime estimate saw the 6x pace
    progress = cluster.stub().GetProgress(pb.GetProgressRequest(id="e1"), timeout=10).progress
    assert progress.minibatches_done >= progress.minibatches_total == 216
    assert progress.reports >= 4
    planned = progress.planned_minibatch_seconds
    est = progress.minibatch_seconds
    assert est.low <= planned / 6 * 1.2 and est.high >= planned / 6 * 0.8
    assert est.high < planned / 2

    # the job's life on its events topic, in order, and the daemon's status
    wait_for(
        "the completion event on MQTT",
        lambda: any(p.get("kind") == "completed" for _, p in list(recorded)),
    )
    stop_recording()
    on_job = [p for t, p in recorded if t == cluster.topics.job_events("e1")]
    stored = [(e.kind, e.state) for e in cluster.events() if e.job_id == "e1"]
    assert [p["kind"] for p in on_job] == ["admitted", "started", "completed"], stored
    assert [p["state"] for p in on_job] == ["admitted", "running", "completed"]
    assert all(p["job"] == "e1" for p in on_job)
    sequences = [p["sequence"] for p in on_job]
    assert sequences == sorted(sequences) and len(set(sequences)) == 3
    assert on_job[-1]["detail"]["early"] is True
    status = [p for t, p in recorded if t == cluster.topics.status]
    assert status and status[-1]["online"] is True


def test_broker_restart_loses_nothing(cluster: Cluster) -> None:
    cluster.daemon.start()
    for server in SERVERS:
        cluster.start_agent(server, speed=1.0)
    wait_consistent(cluster)
    cluster.wait_agents()  # heard once: from now on their silence would count
    before = max(p.epoch for p in cluster.plans().values())

    cluster.broker.kill()  # retained plans are gone with it (in-memory broker)
    killed = time.monotonic()
    job = cluster.submit(plane_job("b1"))  # the daemon keeps deciding
    assert job["decision"]["admitted"] is True
    # longer than the heartbeat timeout: no agent is heard meanwhile, yet none has failed
    time.sleep(max(0.0, HEARTBEAT_TIMEOUT + 1.0 - (time.monotonic() - killed)))
    cluster.broker.start()
    wait_consistent(cluster)  # every plan republished
    assert min(p.epoch for p in cluster.plans().values()) > before

    def b1_planned() -> bool:
        """b1 is in the plans exactly where the store places it now (and somewhere)."""
        plans = cluster.plans()
        s = plans["w0"].current.slot
        got = {(part.slot, name) for name, p in plans.items() for part in (p.current, p.next)
               for t in part.tasks if t.job == "b1"}  # fmt: skip
        allocations = cluster.job("b1").decision.allocations
        want = {(a.slot, a.server) for a in allocations if a.slot in (s, s + 1)}
        return bool(want) and got == want

    wait_for("the job submitted in the outage in the republished plans", b1_planned)
    wait_for("the job to start", lambda: cluster.job("b1").state == pb.JOB_STATE_RUNNING)
    # agents reconnected: progress flows again
    wait_for(
        "progress after the restart",
        lambda: cluster.stub().GetProgress(pb.GetProgressRequest(id="b1"), timeout=10)
        .progress.minibatches_done > 0,
    )  # fmt: skip
    wait_consistent(cluster)
    failed = [(e.kind, e.detail) for e in cluster.events() if e.kind == "server_failed"]
    assert failed == [], "a broker outage is no server's failure"
    assert not any(p.down for p in cluster.plans().values())


def test_agents_of_an_old_store_follow_a_daemon_on_a_new_one(cluster: Cluster) -> None:
    """Agents ignore plans of an epoch below the one they follow, and a daemon on a new
    store (or a store restored from a backup) numbers its plans from 1 again: the MQTT
    audit saw every agent log "stale plan ignored" while the new daemon completed, with
    their plans, jobs that never ran. Their heartbeats name the epoch they follow; the
    daemon sends every plan again above it."""
    cluster.daemon.start()
    for server in SERVERS:
        cluster.start_agent(server, speed=1.0)
    cluster.wait_agents()
    for i in range(3):
        assert cluster.submit(plane_job(f"o{i}"))["decision"]["admitted"] is True
    wait_consistent(cluster)
    old = max(p.epoch for p in cluster.plans().values())
    cluster.daemon.stop()
    shutil.rmtree(cluster.tmp / "data")  # a new store: its plans start at epoch 1
    cluster.daemon.start()
    assert cluster.submit(plane_job("n1"))["decision"]["admitted"] is True
    wait_for("every agent's plan above the old store's epoch",
             lambda: min(p.epoch for p in cluster.plans().values()) > old,
             timeout=3 * SLOT)  # fmt: skip
    wait_for(
        "progress of the new store's job",
        lambda: cluster.stub().GetProgress(pb.GetProgressRequest(id="n1"), timeout=10)
        .progress.minibatches_done > 0,
    )  # fmt: skip
    warning = "agents follow plans of another daemon"
    said = [e for e in json_log(cluster.tmp / "oasisd.log")
            if str(e.get("event", "")).startswith(warning)]  # fmt: skip
    assert said and said[0]["followed"] >= old


def test_kill_9_daemon_republishes_plans_and_loses_nothing(cluster: Cluster) -> None:
    cluster.daemon.start()
    for server in SERVERS:
        cluster.start_agent(server, speed=1.0)
    job = cluster.submit(plane_job("k1"))
    assert job["decision"]["admitted"] is True
    wait_for("the job to run", lambda: cluster.job("k1").state == pb.JOB_STATE_RUNNING)
    wait_for(
        "progress",
        lambda: cluster.stub().GetProgress(pb.GetProgressRequest(id="k1"), timeout=10)
        .progress.minibatches_done > 0,
    )  # fmt: skip
    wait_consistent(cluster)
    epoch = max(p.epoch for p in cluster.plans().values())
    allocations = cluster.store_rows("SELECT * FROM allocations ORDER BY slot, server")

    cluster.daemon.kill9()
    # what the store holds now, before agents can resend anything to a new daemon
    [(stored_mb, per_server)] = cluster.store_rows(
        "SELECT minibatches, per_server FROM job_progress WHERE job_id = 'k1'"
    )
    assert stored_mb > 0 and json.loads(per_server)
    cluster.daemon.start()
    wait_for(
        "plans with a newer epoch",
        lambda: min(p.epoch for p in cluster.plans().values()) > epoch,
    )
    wait_consistent(cluster)
    rows = cluster.store_rows("SELECT * FROM allocations ORDER BY slot, server")
    # the downtime may leave the job behind its plan; when re-planning its rest pays off
    # (at the prices of the estimate's prior it can) it is re-planned from the slot after
    # the review on: the plan up to the review is kept, and without a re-plan all of it
    replans = [e.slot for e in cluster.events() if e.job_id == "k1" and e.kind == "replanned"]
    kept = min(replans, default=None)
    if kept is None:
        assert rows == allocations
    else:
        assert [r for r in rows if r[1] <= kept] == [r for r in allocations if r[1] <= kept]
    restarted = cluster.job("k1")
    assert restarted.decision.admitted and restarted.state == pb.JOB_STATE_RUNNING
    progress = cluster.stub().GetProgress(pb.GetProgressRequest(id="k1"), timeout=10).progress
    assert progress.minibatches_done >= stored_mb  # nothing stored before the crash is lost


def test_silent_server_is_declared_failed_and_its_jobs_move(cluster: Cluster) -> None:
    cluster.daemon.start()
    for server in SERVERS:
        cluster.start_agent(server, speed=1.0)
    cluster.wait_agents()  # a server is watched once it was heard (a slow start is not)
    cluster.submit(plane_job("f1"))
    wait_for("the job to run", lambda: cluster.job("f1").state == pb.JOB_STATE_RUNNING)
    wait_consistent(cluster)
    # the plan as it stands now (a loaded machine may have extended it as slow already),
    # and a server it holds in its last slot, so still after the failure takes effect
    planned = cluster.job("f1").decision.allocations
    victim = max((a for a in planned if a.workers > 0), key=lambda a: a.slot).server

    cluster.kill_agent(victim)
    failed = wait_for(
        "the server declared failed",
        lambda: next((e for e in cluster.events() if e.kind == "server_failed"), None),
    )
    detail = json.loads(failed.detail)
    assert detail["server"] == victim and "f1" in detail["jobs"]
    from_slot = detail["from_slot"]
    moved = cluster.job("f1")
    assert moved.state == pb.JOB_STATE_RUNNING
    assert all(a.server != victim for a in moved.decision.allocations if a.slot >= from_slot)
    replans = [json.loads(e.detail) for e in cluster.events()
               if e.job_id == "f1" and e.kind == "replanned"]  # fmt: skip
    assert [r["how"] for r in replans if r["reason"] == "server_failed"] == ["replaced"]
    work_after = sum(a.workers for a in moved.decision.allocations if a.slot >= from_slot)
    work_before = sum(a.workers for a in planned if a.slot >= from_slot)
    if any(r["reason"] == "slow" for r in replans):
        # the dead agent's work in the failing slot never came: the job then looks slow
        # and may be extended (tests/test_mqtt_units.py and test_replan.py cover that)
        assert work_after >= work_before, replans
    else:
        assert work_after == work_before, replans  # re-placed in the same slots
    wait_consistent(cluster)
    assert cluster.plans()[victim].down is True

    cluster.start_agent(victim)  # it comes back: usable again from the next slot
    wait_for(
        "the server back",
        lambda: any(e.kind == "server_recovered" for e in cluster.events()),
    )
    wait_consistent(cluster)
    assert wait_for("plan not down", lambda: not cluster.plans()[victim].down)


def test_servers_and_status_name_the_servers_whose_agent_was_never_heard(
    cluster: Cluster,
) -> None:
    """The operator audit: a server whose agent never came (never started, a wrong
    password, a new node) reads "up" and gets plans its jobs never run on, and only
    /metrics said so. ListServers, oasis servers (--json) and oasis status say it."""
    cluster.daemon.start()
    cluster.start_agent("w0")  # the only agent: the other four are never heard
    cluster.wait_agents(("w0",))
    listed = wait_for(
        "w0's agent heard by the daemon",
        lambda: (
            (r := cluster.cluster_stub().ListServers(pb.ListServersRequest(), timeout=10))
            and math.isfinite(r.servers[0].agent_heard_seconds_ago)
            and r
        ),
    )
    assert listed.agent_heartbeat_timeout_seconds == HEARTBEAT_TIMEOUT
    ages = {s.name: s.agent_heard_seconds_ago for s in listed.servers}
    assert 0 <= ages.pop("w0") < HEARTBEAT_TIMEOUT and ages == dict.fromkeys(ages, math.inf)
    address = cluster.daemon.address
    table = oasis("servers", server=address).stdout.splitlines()
    head = next(line for line in table if line.startswith("server "))
    assert head.split()[:4] == ["server", "kind", "state", "agent"]
    rows = {
        cells[0]: cells for line in table if (cells := line.split())[:1] in ([s] for s in SERVERS)
    }
    assert rows["w0"][2] == "up" and rows["w0"][3].endswith("s") and rows["w0"][4] == "ago"
    assert all(rows[s][2:4] == ["up", "never"] for s in ("w1", "w2", "p0", "p1")), rows
    data = {s["name"]: s for s in json.loads(oasis("servers", "--json", server=address).stdout)[
        "servers"]}  # fmt: skip
    assert data["w0"]["agent_heard"] is True and data["w0"]["agent_heard_seconds_ago"] >= 0
    assert (data["p1"]["agent_heard"], data["p1"]["agent_heard_seconds_ago"]) == (False, None)
    screen = oasis("status", server=address).stdout.splitlines()
    (line,) = [x for x in screen if x.startswith("AGENTS NOT HEARD")]
    assert line == ("AGENTS NOT HEARD on 4 servers up, still planned on (jobs there do not "
                    "run): w1 (never), w2 (never), p0 (never), p1 (never)")  # fmt: skip
    status = json.loads(oasis("status", "--json", server=address).stdout)
    assert [u["server"] for u in status["agents_unheard"]] == ["w1", "w2", "p0", "p1"]
    assert status["agents_unheard"][0]["heard_seconds_ago"] is None


def test_servers_cordoned_together_hand_their_tasks_on_once(cluster: Cluster) -> None:
    """``oasis cordon w0 w1`` with agents running: from the cordon's first slot the
    plans of both servers are empty, every job planned there moved once, and store,
    ledger and retained plans agree."""
    cluster.daemon.start()
    for server in SERVERS:
        cluster.start_agent(server, speed=1.0)
    cluster.wait_agents()
    for job_id in ("r1", "r2", "r3"):
        cluster.submit(plane_job(job_id))
    wait_consistent(cluster)
    rack = ["w0", "w1"]
    answer = cluster.cluster_stub().CordonServer(
        pb.CordonServerRequest(server="w0", more_servers=["w1", "w0"], reason="rack 7",
                               force=True), timeout=30)  # fmt: skip
    assert list(answer.servers) == rack and not answer.already
    from_slot = answer.from_slot
    moved = [m.id for m in answer.moved]
    assert moved, "the test needs jobs planned on w0 or w1"
    replans = [e.job_id for e in cluster.events()
               if e.kind in ("replanned", "failed")
               and json.loads(e.detail).get("reason") == "server_cordoned"]  # fmt: skip
    assert sorted(replans) == sorted(moved) and len(moved) == len(set(moved))  # once each
    for job_id in ("r1", "r2", "r3"):
        later = [a for a in cluster.job(job_id).decision.allocations if a.slot >= from_slot]
        assert not [a for a in later if a.server in rack], job_id
    wait_consistent(cluster)
    plans: Any = wait_for(
        "the cordon's first slot under way",
        lambda: (p := cluster.plans())["w0"].current.slot >= from_slot and p,
    )
    for name in rack:
        assert plans[name].current.tasks == [] and plans[name].next.tasks == [], name
    listed = {s.name: s.state for s in cluster.cluster_stub().ListServers(
        pb.ListServersRequest(), timeout=10).servers}  # fmt: skip
    assert (listed["w0"], listed["w1"], listed["w2"]) == ("cordoned", "cordoned", "up")
    wait_consistent(cluster)


def test_slow_job_is_re_estimated_and_extended(cluster: Cluster) -> None:
    cluster.daemon.start()
    for server in SERVERS:
        cluster.start_agent(server, speed=0.4)
    patient = {"kind": "sigmoid", "priority": 50, "decay": 0.05, "target": 12}
    job = cluster.submit(plane_job("s1", utility=patient))  # late is still worth it
    planned_end = job["decision"]["completion_slot"]
    replanned = wait_for(
        "a slow-job re-plan",
        lambda: next((e for e in cluster.events() if e.kind == "replanned"
                      and e.job_id == "s1"), None),
    )  # fmt: skip
    detail = json.loads(replanned.detail)
    assert detail["reason"] == "slow"
    assert detail["minibatch_seconds"] > 1.5 * detail["planned_minibatch_seconds"]
    assert cluster.job("s1").decision.completion_slot > int(planned_end)
    wait_consistent(cluster)

    def estimate() -> Any:
        return cluster.stub().GetProgress(pb.GetProgressRequest(id="s1"), timeout=10).progress

    true = estimate().planned_minibatch_seconds / 0.4
    # with more reports the interval closes in on the true pace (2.5x the plan)
    wait_for(
        "the estimate to cover the true pace",
        lambda: (e := estimate().minibatch_seconds).low <= true * 1.05
        and e.high >= true * 0.95 and e.high - e.low < 0.2 * true,
    )  # fmt: skip

    # the same estimate through the CLI, for machines and for people
    out = oasis("progress", "s1", "--json", server=cluster.daemon.address)
    shown = json.loads(out.stdout)
    assert shown["id"] == "s1" and int(shown["reports"]) >= 1
    low, high = shown["minibatch_seconds"]["low"], shown["minibatch_seconds"]["high"]
    assert low <= shown["minibatch_seconds"]["mean"] <= high
    text = oasis("progress", "s1", server=cluster.daemon.address).stdout
    assert text.startswith("s1: ") and "one mini-batch  planned" in text and "interval" in text
    missing = oasis("progress", "nope", server=cluster.daemon.address, check=False)
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr


def test_a_frozen_broker_fails_no_server(cluster: Cluster) -> None:
    """The stall audit: a broker that stops answering but keeps its connections open
    (SIGSTOP) while jobs run, for two heartbeat timeouts at least and for one more once
    the daemon gave the connection up. The daemon gives it up within half a
    ``heartbeat_timeout`` (its MQTT keepalive is a quarter of it), so the agents' silence
    stops counting: no server is failed, no job with it, then or in the heartbeat timeout
    after it is connected again.
    Before, with the keepalive at ``heartbeat_timeout`` (5 s at least), the link stayed
    "up" for up to twice that, every server was declared failed, and each admitted job
    that no longer fit the cluster became ``failed``."""
    cluster.daemon.start()
    for server in SERVERS:
        cluster.start_agent(server)
    cluster.wait_agents()
    for i in range(3):
        assert cluster.submit(plane_job(f"f{i}"))["decision"]["admitted"] is True
    broker = cluster.broker.proc
    assert broker is not None

    def settled() -> bool:
        """Every server heard by the daemon (so watched), and a job running."""
        rows = cluster.store_rows("SELECT value FROM meta WHERE key = 'plane'")
        heard = sorted(json.loads(rows[0][0]).get("heard", [])) if rows else []
        states = {cluster.job(j).state for j in ("f0", "f1", "f2")}
        return heard == sorted(SERVERS) and pb.JOB_STATE_RUNNING in states

    def said(event: str) -> int:
        return sum(e.get("event") == event for e in json_log(cluster.daemon.log_path))

    wait_for("every server heard and a job running", settled)
    connections = said("broker connected")
    os.kill(broker.pid, signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        wait_for("the connection given up", lambda: said("broker connection lost") > 0)
        # silent past a heartbeat timeout while the link is down, twice one in all
        lost = time.monotonic()
        time.sleep(max(lost + HEARTBEAT_TIMEOUT, frozen + 2 * HEARTBEAT_TIMEOUT) - lost)
    finally:
        os.kill(broker.pid, signal.SIGCONT)
    cluster.wait_agents()  # heard again
    wait_for("the daemon connected again", lambda: said("broker connected") > connections)
    # connected for a heartbeat timeout: the daemon has reviewed the agents since (a
    # silence counted over the freeze would have failed them by now)
    time.sleep(HEARTBEAT_TIMEOUT)
    log = json_log(cluster.daemon.log_path)
    failed = [e for e in log if e.get("event") == "server failed"]
    assert not failed, failed
    states = {j: cluster.job(j).state for j in ("f0", "f1", "f2")}
    assert pb.JOB_STATE_FAILED not in states.values(), states


def test_a_restored_store_names_the_jobs_its_agents_ran_that_it_does_not_know(
    cluster: Cluster,
) -> None:
    """A store restored from a backup (README "Backups") while the agents run a job
    admitted after the backup: the daemon withdraws that job's plan, and says which job
    it was, so the operator can tell its tenant. Before, the log said only "report
    entries ignored" with a count (the change audit). And it clears that job's retained
    event: before, the broker kept saying it ran, to every subscriber, for good (the
    operator audit); the kept job's stays."""
    cluster.daemon.start()
    for server in SERVERS:
        cluster.start_agent(server)
    cluster.wait_agents()
    assert cluster.submit(plane_job("kept"))["decision"]["admitted"] is True
    backup = cluster.tmp / "backup.db"
    with (
        contextlib.closing(sqlite3.connect(cluster.db)) as src,
        contextlib.closing(sqlite3.connect(backup)) as dst,
    ):
        src.backup(dst)
    assert cluster.submit(plane_job("lost"))["decision"]["admitted"] is True
    wait_for(
        "the later job's progress",
        lambda: cluster.stub().GetProgress(pb.GetProgressRequest(id="lost"), timeout=10)
        .progress.minibatches_done > 0,
    )  # fmt: skip
    lost, kept = cluster.topics.job_events("lost"), cluster.topics.job_events("kept")
    wait_for("the later job's event retained", lambda: lost in cluster.retained(lost))
    assert cluster.retained(lost)[lost]["job"] == "lost"
    cluster.daemon.stop()
    for suffix in ("-wal", "-shm"):
        Path(f"{cluster.db}{suffix}").unlink(missing_ok=True)
    shutil.copy(backup, cluster.db)
    cluster.daemon.start()
    warning = "agents ran jobs this store does not know"

    def named() -> list[dict[str, Any]]:
        return [e for e in json_log(cluster.tmp / "oasisd.log")
                if str(e.get("event", "")).startswith(warning)]  # fmt: skip

    said = wait_for("the lost job named", lambda: named() or None, timeout=4 * SLOT)
    assert {job for e in said for job in e["jobs"]} == {"lost"}
    wait_for("the lost job's retained event cleared", lambda: lost not in cluster.retained(lost))
    wait_consistent(cluster)  # the kept job runs on; no plan holds the lost one
    assert cluster.job("kept").state in (pb.JOB_STATE_ADMITTED, pb.JOB_STATE_RUNNING)
    assert cluster.retained(kept)[kept]["job"] == "kept"
    said_cleared = "retained events of jobs this store does not know cleared"
    cleared = [e for e in json_log(cluster.tmp / "oasisd.log") if e.get("event") == said_cleared]
    assert [e["jobs"] for e in cleared] == [["lost"]]  # once, though reported again


def test_a_restart_on_another_topic_prefix_fails_no_server_its_agents_are_not_on(
    cluster: Cluster,
) -> None:
    """The operator edits ``[mqtt] topic_prefix`` and restarts; the agents, configured
    on their own, still use the old prefix. Before, every server heard before the
    restart was watched from the start and declared failed after ``heartbeat_timeout``:
    every tenant's admitted job failed for good within seconds of the restart. Now the
    start warns, naming both links, and no server is failed for a silence on a link its
    agent was never told of; the jobs stay as they were."""
    cluster.daemon.start()
    for server in SERVERS:
        cluster.start_agent(server, speed=0.05)
    cluster.wait_agents()
    cluster.submit(plane_job("p1"))
    wait_for("the job to run", lambda: cluster.job("p1").state == pb.JOB_STATE_RUNNING)
    wait_consistent(cluster)
    assert cluster.daemon.stop() == 0
    config = cluster.daemon.config
    config.write_text(config.read_text().replace("[mqtt]\n", '[mqtt]\ntopic_prefix = "moved"\n'))
    cluster.daemon.start()
    said = wait_for(
        "the start's warning",
        lambda: next(
            (e for e in json_log(cluster.daemon.log_path)
             if e.get("event", "").startswith("[mqtt] broker or topic_prefix changed")),
            None,
        ),
    )  # fmt: skip
    assert said["was"].endswith("/oasis") and said["now"].endswith("/moved"), said
    time.sleep(3 * HEARTBEAT_TIMEOUT)  # before the fix: every server failed by now
    kinds = [e.kind for e in cluster.events()]
    assert "server_failed" not in kinds, kinds
    assert cluster.job("p1").state == pb.JOB_STATE_RUNNING
