"""High availability end to end: two ``oasisd`` with ``[ha]`` on one PostgreSQL, as
subprocesses, under submit load from clients that follow the leader
(``controller/commands/failover.py``); the harness and its checks are
``bench/failover.py``'s (and ``bench/load_test.py``'s).

- ``kill -9`` the leader: the standby takes over and the clients carry on.
- SIGSTOP the leader past its lease, then SIGCONT: the standby takes over meanwhile; the
  stopped one commits nothing after the stop, and steps down.
- In one run: restart PostgreSQL, stop the standby, kill -9 the leader (both down), start
  one again: it leads.

After each: 0 lost, 0 duplicated (every answered submission in the store exactly once,
as answered), nothing half-written, capacity never exceeded, the ledger of every live
node equal to the store, and one leader per epoch (event epochs never go down in commit
order). Plus: the standby's answers to writes, and its health.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.daemon_throughput import workload
from bench.failover import (
    CALL_TIMEOUT,
    FollowingLoad,
    HaNodes,
    epoch_problems,
    run_failover,
)
from bench.load_test import Load, check_ledger, check_store, requests_for
from controller.commands.failover import PING_SECONDS, PING_TIMEOUT_SECONDS
from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.broker import NEEDS_MOSQUITTO, Mosquitto
from tests.browser import needed, opened
from tests.servers import (
    ROOT,
    Daemon,
    Postgres,
    commit_processes,
    free_port,
    json_log,
    oasis,
    postgres_or_skip,
    write_config,
)
from tests.test_daemon_e2e import job

LEASE = 2.0


@pytest.fixture
def own_postgres() -> Iterator[Postgres]:
    yield from postgres_or_skip()


def test_kill_9_the_leader_under_load(own_postgres: Postgres, tmp_path: Path) -> None:
    report = run_failover(own_postgres, tmp_path, jobs=240, clients=4, every=80, times=1,
                          rate=60.0, lease=LEASE)  # fmt: skip
    assert report.problems == []
    assert report.answered == report.jobs
    (failover,) = report.failovers
    assert failover.new != failover.old
    assert 0 < failover.first_decision_s < 10


def test_sigstop_the_leader_past_its_lease(own_postgres: Postgres, tmp_path: Path) -> None:
    report = run_failover(own_postgres, tmp_path, jobs=240, clients=4, every=80, times=1,
                          how="stop", stop_seconds=LEASE + 1.0, rate=60.0, lease=LEASE)  # fmt: skip
    assert report.problems == []  # includes: nothing committed by the stopped leader
    assert report.answered == report.jobs
    (failover,) = report.failovers
    assert failover.new != failover.old
    logs = "".join(p.read_text() for p in tmp_path.glob("node*.log"))
    assert '"standby now"' in logs or '"stepping down: now a standby"' in logs


def test_a_standby_redirects_writes_and_serves_reads(
    own_postgres: Postgres, tmp_path: Path
) -> None:
    servers, specs = workload(1, 3)
    group = HaNodes(tmp_path, own_postgres.new_database(), servers, 2, lease=LEASE).start()
    try:
        leader = group.wait_leader()
        standby = next(n for n in group.nodes if n is not leader)
        assert standby.role() == "standby"
        with grpc.insecure_channel(standby.address) as channel:
            stub = pb_grpc.AdmissionStub(channel)
            request = pb.SubmitJobRequest(job=spec_to_proto({**specs[0], "id": "s0"}))
            with pytest.raises(grpc.RpcError) as refused:
                stub.SubmitJob(request, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert leader.address in (refused.value.details() or "")
            trailing = dict(refused.value.trailing_metadata() or ())
            assert trailing.get("oasis-leader") == leader.address
            health = health_pb2_grpc.HealthStub(channel)
            status = {
                name: health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10).status
                for name in ("", "oasis.v1.Admission", "oasis.v1.Cluster")
            }
            serving, not_serving = (health_pb2.HealthCheckResponse.SERVING,
                                    health_pb2.HealthCheckResponse.NOT_SERVING)  # fmt: skip
            assert status == {"": serving, "oasis.v1.Admission": not_serving,
                              "oasis.v1.Cluster": serving}  # fmt: skip
            cluster = pb_grpc.ClusterStub(channel)  # reads are served
            assert cluster.GetClusterInfo(pb.GetClusterInfoRequest(), timeout=10).window == 300
        # the CLI given both nodes, the standby first, finds the leader
        job = tmp_path / "job.json"
        job.write_text(json.dumps({**specs[1], "id": "cli-1"}))
        both = f"{standby.address},{leader.address}"
        out = oasis("submit", str(job), "--json", server=both, check=False)
        assert out.returncode in (0, 3), out.stderr
        assert '"id": "cli-1"' in out.stdout
        # oasis status shows each node's role, epoch and lease age
        status = json.loads(oasis("status", "--json", server=both).stdout)
        roles = {n["address"]: n for n in status["nodes"]}
        assert roles[leader.address]["role"] == "leader"
        assert roles[standby.address]["role"] == "standby"
        assert roles[standby.address]["leader"] == leader.address
        assert roles[leader.address]["epoch"] == roles[standby.address]["epoch"] >= 1
        assert 0 <= roles[standby.address]["lease_age_seconds"] < LEASE
        # a cordon through the standby reaches the leader, and the standby follows it
        with grpc.insecure_channel(standby.address) as channel:
            listed = pb_grpc.ClusterStub(channel).ListServers(pb.ListServersRequest(), timeout=10)
        first = next(s.name for s in listed.servers if s.kind == pb.SERVER_KIND_WORKER)
        out = oasis("cordon", first, "--for", "5h", "--json", server=both)
        assert json.loads(out.stdout)["server"] == first

        def standby_sees(state: str) -> dict[str, str]:
            deadline = time.monotonic() + 30
            while True:
                with grpc.insecure_channel(standby.address) as channel:
                    servers = (
                        pb_grpc.ClusterStub(channel)
                        .ListServers(pb.ListServersRequest(), timeout=10)
                        .servers
                    )
                states = {s.name: s.state for s in servers}
                if states[first] == state or time.monotonic() > deadline:
                    return states
                time.sleep(0.2)

        states = standby_sees("cordoned")
        assert states[first] == "cordoned", states
        # ended before its end: the outage row's end moves, and the standby follows that
        oasis("uncordon", first, server=both)
        states = standby_sees("up")
        assert states[first] == "up", states
    finally:
        group.stop()


class _Outages:
    """Restart PostgreSQL, stop the standby, kill the leader and start one node again,
    each once ``every`` more jobs are answered."""

    def __init__(self, postgres: Postgres, group: HaNodes, every: int) -> None:
        self.postgres = postgres
        self.group = group
        self.every = every
        self.done: list[str] = []
        self.problems: list[str] = []

    def _after(self, load: Load, answers: int) -> bool:
        target = load.answered_count() + answers
        while load.answered_count() < target and not load.finished.is_set():
            time.sleep(0.01)
        return not load.finished.is_set()

    def run(self, load: Load) -> None:
        try:
            if not self._after(load, self.every):
                return
            self.postgres.stop("fast")
            time.sleep(1.0)
            self.postgres.start()
            self.done.append("postgres restarted")
            leader = self.group.wait_leader(timeout=60)
            if not self._after(load, self.every):
                return
            standby = next(n for n in self.group.nodes if n is not leader)
            assert standby.daemon is not None
            if standby.daemon.stop() != 0:
                self.problems.append("the standby did not stop cleanly")
            self.done.append("standby stopped")
            if not self._after(load, self.every):
                return
            leader = self.group.wait_leader(timeout=60)
            assert leader.daemon is not None
            leader.daemon.kill9()
            self.done.append("leader killed: none left")
            time.sleep(0.5)
            standby.start()
            self.group.wait_leader(timeout=60)
            self.done.append("one started again")
        except Exception as err:
            self.problems.append(f"{type(err).__name__}: {err}")


def test_postgres_restart_standby_stop_and_both_down(
    own_postgres: Postgres, tmp_path: Path
) -> None:
    url = own_postgres.new_database()
    servers, ids, requests = requests_for("o", 1, 400)  # every outage before the load ends
    group = HaNodes(tmp_path, url, servers, 2, lease=LEASE).start()
    try:
        group.wait_leader()
        load = FollowingLoad(
            group.addresses,
            requests,
            4,
            max_seconds=300.0,
            job_seconds=120.0,
            monitor_interval=0.5,
            rate=60.0,
            call_timeout=CALL_TIMEOUT,
        )
        fault = _Outages(own_postgres, group, 50)
        load.run(fault)
        assert fault.problems == []
        assert fault.done == ["postgres restarted", "standby stopped", "leader killed: none left",
                              "one started again"]  # fmt: skip
        assert len(load.answers) == len(ids), load.given_up
        found = check_store(url, ids, load.answers, servers)
        assert found.problems == []
        leader = group.wait_leader(timeout=30)
        assert check_ledger(leader.address, found.use, servers) == []
        assert epoch_problems(url, []) == []
    finally:
        group.stop()


@NEEDS_MOSQUITTO
def test_oasis_status_calls_a_standbys_broker_the_leaders(
    own_postgres: Postgres, tmp_path: Path
) -> None:
    """Only the leader runs the execution plane and its broker link. Before, ``oasis
    status`` over two healthy nodes with ``[mqtt]`` said of the standby ``THE BROKER IS
    DISCONNECTED (no plan reaches the agents)``, a false alarm in capitals, and the
    standby's console said ``Broker: disconnected`` and ``Execution plane: off (no
    [mqtt])``."""
    needed()  # the console's page, read in Chromium
    broker = Mosquitto()
    url = own_postgres.new_database()
    mqtt = f'\n[mqtt]\nurl = "{broker.url}"\n\n[ha]\nlease_seconds = {LEASE}\n'
    mqtt += '\n[web]\nlisten = "127.0.0.1:0"\n'
    nodes, epoch = [], time.time()
    try:
        for name in ("a", "b"):
            config = write_config(tmp_path / f"{name}.toml", tmp_path / name, url, epoch, mqtt)
            listen = f'listen = "127.0.0.1:{free_port()}"'  # [ha] sends clients to it
            config.write_text(config.read_text().replace('listen = "127.0.0.1:0"', listen, 1))
            nodes.append(Daemon(config, tmp_path / f"{name}.log").start())
        leader, standby = (n.address for n in nodes)
        both = f"{leader},{standby}"
        deadline = time.monotonic() + 30
        while True:
            lines = oasis("status", server=both).stdout.splitlines()[2:4]
            if lines[0] == f"{leader}: store up, broker connected" or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert lines == [
            f"{leader}: store up, broker connected",
            f"{standby}: store up, broker: the leader's (a standby runs no execution plane)",
        ]
        facts = {name: _node_facts(tmp_path / f"{name}.log") for name in ("a", "b")}
        assert facts["a"]["Broker"] == "connected"
        assert facts["a"]["Execution plane"] == "on (progress reported by agents)"
        assert facts["b"]["Broker"] == "the leader's (a standby runs no execution plane)"
        assert facts["b"]["Execution plane"] == "on the leader (a standby runs none)"
    finally:
        for node in nodes:
            node.stop()
        broker.close()


def _node_facts(log: Path) -> dict[str, str]:
    """The console's Node section of the daemon that wrote ``log`` (no ``[auth]``: no
    login), as ``{fact: text}``, read in Chromium once it is drawn (in one script: the
    page redraws itself)."""
    web = next(e["address"] for e in json_log(log) if e.get("event") == "console listening")
    read = """return Array.from(document.querySelectorAll(
        'section[aria-labelledby=h-node] dl > div')).map(function (d) {
          return [d.querySelector('dt').textContent, d.querySelector('dd').textContent]; });"""
    with opened() as driver:
        driver.get(f"http://{web}/")
        deadline = time.monotonic() + 30
        while True:
            facts = {str(k): str(v) for k, v in driver.execute_script(read)}
            if "Broker" in facts or time.monotonic() > deadline:
                return facts
            time.sleep(0.2)


def test_oasis_status_over_two_nodes_with_postgres_down_answers_in_seconds(
    own_postgres: Postgres, tmp_path: Path
) -> None:
    """The HA audit: with PostgreSQL stopped, `oasis status --server a,b` retried the
    jobs in flight over both nodes (each UNAVAILABLE: the store is out) for its whole
    --timeout, 30 s, before it showed the status it shows a single node's at once; and
    a submission was refused with `the leader is at B` alone, though none led."""
    url = own_postgres.new_database()
    nodes, epoch = [], time.time()
    try:
        for name in ("a", "b"):
            extra = f"\n[ha]\nlease_seconds = {LEASE}\n"
            config = write_config(tmp_path / f"{name}.toml", tmp_path / name, url, epoch, extra)
            listen = f'listen = "127.0.0.1:{free_port()}"'  # [ha] sends clients to it
            config.write_text(config.read_text().replace('listen = "127.0.0.1:0"', listen, 1))
            nodes.append(Daemon(config, tmp_path / f"{name}.log").start())
        both = ",".join(n.address for n in nodes)
        deadline = time.monotonic() + 30
        while " standby " not in oasis("status", server=both, check=False).stdout:
            assert time.monotonic() < deadline, "no standby"
            time.sleep(0.5)
        own_postgres.stop()
        started = time.monotonic()
        out = oasis("status", "--timeout", "20", server=both).stdout
        assert time.monotonic() - started < 10, out
        assert "THE STORE IS UNAVAILABLE" in out
        # a submission's refusal says so too, not only "the leader is at" a node that
        # leads no more: both nodes' leases ended with the store
        spec = tmp_path / "job.json"
        spec.write_text(json.dumps(job("late")))
        refused = oasis("submit", "--timeout", "3", str(spec), server=both, check=False)
        assert refused.returncode != 0
        assert "the store is unavailable" in refused.stderr, refused.stderr
    finally:
        own_postgres.start()
        for node in nodes:
            node.stop()


def _lock_waiters(dsn: str) -> int:
    """How many sessions of ``dsn``'s database wait for a row lock."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        waiting = "wait_event_type = 'Lock' AND datname = current_database()"
        row = conn.execute(f"SELECT count(*) FROM pg_stat_activity WHERE {waiting}").fetchone()
    return int(row[0]) if row else 0


@contextlib.contextmanager
def _writes_held(dsn: str) -> Iterator[None]:
    """Within the block, the leader's writes wait (the fence's ``writer`` row is held
    ``FOR UPDATE``): a decision that takes as long, its daemon alive all along."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT * FROM meta WHERE key = 'writer' FOR UPDATE")
        try:
            yield
        finally:
            conn.rollback()


def _submitting(tmp_path: Path, name: str, both: str) -> subprocess.Popen[str]:
    """``oasis submit`` of job ``name`` over both nodes, started (its decision waits)."""
    spec = tmp_path / f"{name}.json"
    spec.write_text(json.dumps(job(name)))
    cmd = [sys.executable, "-m", "controller.cli", "submit", str(spec), "--json",
           "--timeout", "60", "--server", both]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)  # fmt: skip


def _watched(watch: subprocess.Popen[str], job_id: str) -> dict[str, Any]:
    """The next event of ``job_id`` ``oasis watch --json`` prints (its others skipped)."""
    assert watch.stdout is not None
    for line in watch.stdout:
        event: dict[str, Any] = json.loads(line)
        if event.get("job_id") == job_id:
            return event
    raise AssertionError(f"the watch ended before an event of {job_id}")


def _until(predicate: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_call_in_flight_to_a_paused_leader_is_answered_by_the_other_node(
    own_postgres: Postgres, tmp_path: Path
) -> None:
    """The HA keepalive audit: `oasis submit --server a,b --timeout 60` whose leader's
    host was frozen (SIGSTOP) while it decided failed DEADLINE_EXCEEDED after the whole
    60 s (the TCP connection stays open: the kernel still acknowledges), though the
    standby led after the lease (2 s); and `oasis watch --server a,b` on that leader
    printed nothing more, for ever. The clients of several nodes now ping (HTTP/2
    keepalive) and move on. A decision that is slow but alive (its store waits) is not
    cut off; and the frozen leader, resumed, commits nothing: the job is decided once,
    by the new leader."""
    url = own_postgres.new_database()
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    servers, _ = workload(1, 3)
    group = HaNodes(tmp_path, url, servers, 2, lease=LEASE)
    for node in group.nodes:  # a store that waits 20 s is slow, not down
        node.config.write_text(
            node.config.read_text().replace("tick_seconds", "store_timeout = 20\ntick_seconds", 1)
        )
    group.start()
    watch: subprocess.Popen[str] | None = None
    try:
        leader = group.wait_leader()
        standby = next(n for n in group.nodes if n is not leader)
        both = f"{leader.address},{standby.address}"
        watch = subprocess.Popen(
            [sys.executable, "-m", "controller.cli", "watch", "--json", "--from", "0",
             "--server", both],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        # slow but alive: the leader's decision waits for its store through 5 pings (a
        # daemon that did not permit them answered the 4th with too_many_pings); it
        # answers, and the watch sees it
        with _writes_held(dsn):
            slow = _submitting(tmp_path, "slow", both)
            _until(lambda: _lock_waiters(dsn) > 0, "the decision never waited")
            time.sleep(5 * PING_SECONDS + PING_TIMEOUT_SECONDS)
        out, err = slow.communicate(timeout=120)
        assert slow.returncode in (0, 3), out + err
        assert (json.loads(out)["id"], json.loads(out)["duplicate"]) == ("slow", False)
        assert _watched(watch, "slow")["detail"]["epoch"] == 1
        # its host frozen mid-decision (the daemon and its commit process): the other
        # node answers
        frozen = [leader.pid, *commit_processes(leader.pid)]
        with _writes_held(dsn):
            paused = _submitting(tmp_path, "paused", both)
            _until(lambda: _lock_waiters(dsn) > 0, "the decision never waited")
            for pid in frozen:
                os.kill(pid, signal.SIGSTOP)
        out, err = paused.communicate(timeout=120)
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        assert paused.returncode in (0, 3), out + err  # before: DEADLINE_EXCEEDED at 60 s
        answer = json.loads(out)
        assert (answer["id"], answer["duplicate"]) == ("paused", False)
        assert group.wait_leader(not_this=leader) is standby
        # the watch went on at the other node, from its last event
        assert _watched(watch, "paused")["detail"]["epoch"] == 2
        # the resumed leader steps down, and commits nothing: one decision of the job
        _until(lambda: leader.role() == "standby", "the paused leader did not step down")
        with psycopg.connect(dsn) as conn:
            decided = conn.execute("SELECT state, detail FROM events WHERE job_id = 'paused' "
                                   "AND kind = 'decided'").fetchall()  # fmt: skip
        assert [(s, d["epoch"]) for s, d in decided] == [(answer["state"], 2)]
        assert epoch_problems(url, []) == []
    finally:
        if watch is not None:
            watch.kill()
            watch.communicate()
        group.stop()
