"""A PostgreSQL store restored from a ``pg_dump`` under running daemons (subprocesses on
one database; one throwaway server for the module), with ``pg_restore --clean
--single-transaction``:

- a leader and a standby with ``[ha]``, the standby stopped meanwhile (SIGSTOP) so that,
  when it reads again, the leader has already numbered new events with the numbers the
  restore freed. Before ``controller/admission/rewind.py``: the leader kept the jobs
  decided after the dump in its ledger (a tenant submitting one again got ``INTERNAL:
  LedgerError``), and the standby skipped the events the leader numbered again, so
  both ledgers differed from the store. Now each says ``the store was rewound`` and
  rebuilds its ledger from the store; the job submitted again is decided.
- a failover after the dump, so the restore rewinds the ``writer`` row below the
  leader's epoch. Before: the leader, fenced, failed every call with ``INTERNAL:
  FencedError`` (its stale rebuild's write was fenced outside the step-down), and the
  next leader took an epoch already led in. Now it steps down, and the next leader's
  epoch is above every one seen.
- one daemon without ``[ha]``, restarted after the dump (epoch 2; the dump holds 1).
  Before: fenced at its next write, it stepped down for good and refused every write
  ("a standby: no leader known yet") until restarted. Now the store's watch records it
  again above its epoch, and it decides on.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from bench.daemon_throughput import workload
from bench.failover import HaNodes, Node
from bench.load_test import check_ledger, read_store, store_use
from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.servers import Postgres, json_log, newest_event, oasis, postgres_or_skip

WAIT_SECONDS = 60.0
"""The longest a wait for a daemon to catch up may take before the test fails."""


@pytest.fixture(scope="module")
def server() -> Iterator[Postgres]:
    yield from postgres_or_skip()


def _submit(node: Node, spec: dict[str, Any]) -> pb.SubmitJobResponse:
    with grpc.insecure_channel(node.address) as channel:
        stub = pb_grpc.AdmissionStub(channel)
        response: pb.SubmitJobResponse = stub.SubmitJob(
            pb.SubmitJobRequest(job=spec_to_proto(spec)), timeout=30
        )
        return response


def _applied(node: Node) -> int:
    status = json.loads(oasis("status", "--json", server=node.address).stdout)
    (mine,) = status["nodes"]
    return int(mine["applied_sequence"])


def _wait_applied(node: Node, sequence: int) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while _applied(node) != sequence:
        assert time.monotonic() < deadline, f"{node.name} never applied event {sequence}"
        time.sleep(0.1)


def _pg(server: Postgres, tool: str, *args: str) -> None:
    base = ["-h", "127.0.0.1", "-p", str(server.port), "-U", "oasis"]
    subprocess.run([str(server.bindir / tool), *base, *args], check=True, capture_output=True)


def _dump(server: Postgres, database: str, directory: Path) -> Path:
    """A DBA's backup of ``database`` (``pg_dump -Fc``): its file."""
    dump = directory / "store.dump"
    _pg(server, "pg_dump", "-Fc", "-f", str(dump), database)
    return dump


def _restore(server: Postgres, database: str, dump: Path) -> None:
    """``dump`` restored over the live ``database`` in one transaction, as the README says."""
    _pg(server, "pg_restore", "--clean", "--if-exists", "--single-transaction", "-d",
        database, str(dump))  # fmt: skip


def test_a_restore_under_a_running_leader_and_standby(server: Postgres, tmp_path: Path) -> None:
    url = server.new_database()
    database = url.rsplit("/", 1)[1]
    servers, specs = workload(1, 12)
    group = HaNodes(tmp_path, url, servers, 2, lease=2.0).start()
    try:
        leader = group.wait_leader()
        standby = next(n for n in group.nodes if n is not leader)
        for i in range(4):
            _submit(leader, {**specs[i], "id": f"before-{i}"})
        dump = _dump(server, database, tmp_path)
        lost = [_submit(leader, {**specs[i], "id": f"after-{i}"}) for i in range(4, 8)]
        admitted = [f"after-{i}" for i, r in zip(range(4, 8), lost, strict=True)
                    if r.job.state == pb.JOB_STATE_ADMITTED]  # fmt: skip
        assert admitted, "the workload admits none of the jobs the restore loses"
        _wait_applied(standby, newest_event(url))
        standby.signal(signal.SIGSTOP)
        try:
            _restore(server, database, dump)
            # an id decided after the dump, submitted again: decided on the restored store
            again = _submit(leader, {**specs[int(admitted[0].split("-")[1])], "id": admitted[0]})
            assert again.job.spec.id == admitted[0] and not again.duplicate
            for i in range(8, 12):  # the event numbers the restore freed, used again
                _submit(leader, {**specs[i], "id": f"later-{i}"})
        finally:
            standby.signal(signal.SIGCONT)
        newest = newest_event(url)
        _wait_applied(standby, newest)
        use = store_use(read_store(url))
        assert check_ledger(leader.address, use, servers) == []
        assert check_ledger(standby.address, use, servers) == []
        for node in (leader, standby):
            said = [e for e in json_log(node.log) if e.get("event") == "the store was rewound"]
            assert said, f"{node.name} did not say the store was rewound"
            assert "README: Backups" in said[0]["hint"]
    finally:
        assert group.stop() == [0, 0]


def _leader_epoch(node: Node) -> int:
    status = json.loads(oasis("status", "--json", server=node.address).stdout)
    (mine,) = status["nodes"]
    assert mine["role"] == "leader"
    return int(mine["epoch"])


def _submit_once_served(node: Node, spec: dict[str, Any]) -> pb.SubmitJobResponse:
    """``spec`` submitted until an answer (UNAVAILABLE retried, as clients do)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        try:
            return _submit(node, spec)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def test_a_restore_older_than_a_failover(server: Postgres, tmp_path: Path) -> None:
    url = server.new_database()
    database = url.rsplit("/", 1)[1]
    servers, specs = workload(1, 12)
    group = HaNodes(tmp_path, url, servers, 2, lease=2.0).start()
    try:
        first = group.wait_leader()
        for i in range(4):
            _submit(first, {**specs[i], "id": f"before-{i}"})
        dump = _dump(server, database, tmp_path)  # writer epoch 1
        assert first.daemon is not None
        first.daemon.kill9()
        second = group.wait_leader(not_this=first)
        first.start()  # a standby now
        for i in range(4, 8):
            _submit(second, {**specs[i], "id": f"after-{i}"})
        led = _leader_epoch(second)
        assert led >= 2
        _restore(server, database, dump)
        for i in range(8, 12):  # through whichever node leads now
            pool = ",".join(group.addresses)
            job = tmp_path / f"later-{i}.json"
            job.write_text(json.dumps({**specs[i], "id": f"later-{i}"}))
            out = oasis("submit", str(job), "--json", server=pool, check=False)
            assert out.returncode in (0, 3), out.stderr  # admitted or not: decided
        leader = group.wait_leader()
        assert _leader_epoch(leader) > led  # no epoch led in twice
        newest = newest_event(url)
        use = store_use(read_store(url))
        for node in group.nodes:
            _wait_applied(node, newest)
            assert check_ledger(node.address, use, servers) == []
        logs = "".join(n.log.read_text() for n in group.nodes)
        assert "INTERNAL" not in logs and '"internal error"' not in logs
    finally:
        assert group.stop() == [0, 0]


def test_a_restore_under_one_daemon_restarted_since(server: Postgres, tmp_path: Path) -> None:
    url = server.new_database()
    database = url.rsplit("/", 1)[1]
    servers, specs = workload(1, 12)
    group = HaNodes(tmp_path, url, servers, 1, ha=False).start()
    (node,) = group.nodes
    try:
        for i in range(4):
            _submit(node, {**specs[i], "id": f"before-{i}"})
        dump = _dump(server, database, tmp_path)  # writer epoch 1
        assert node.daemon is not None and node.daemon.stop() == 0
        node.start()  # epoch 2
        for i in range(4, 8):
            _submit(node, {**specs[i], "id": f"after-{i}"})
        _restore(server, database, dump)
        for i in range(8, 12):
            answer = _submit_once_served(node, {**specs[i], "id": f"later-{i}"})
            assert answer.job.spec.id == f"later-{i}"
        assert check_ledger(node.address, store_use(read_store(url)), servers) == []
        said = [e for e in json_log(node.log) if "writer record was rewound" in e["event"]]
        assert said and said[0]["epoch"] > said[0]["previous_epoch"] == 2
    finally:
        assert group.stop() == [0]
