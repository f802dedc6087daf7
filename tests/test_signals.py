"""Signals as an operator sends them (an audit of reloads and signals): a SIGHUP to every
process of the unit, while the daemon starts and while it stops, and reload storms. None
of them may end the daemon or its commit process, or cost a tenant an answer."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import grpc

from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.servers import Daemon, commit_processes, json_log, write_config
from tests.test_daemon_e2e import job
from tests.test_reload import reloads

EPOCH = 1_700_000_000.0


def _submitting(address: str, name: str, codes: Counter[str], done: threading.Event) -> None:
    """Submit jobs ``name-0``, ``name-1``, ... until ``done``, counting the answers."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.AdmissionStub(channel)
        i = 0
        while not done.is_set():
            request = pb.SubmitJobRequest(job=spec_to_proto(job(f"{name}-{i}", chunks=1 + i % 4)))
            try:
                stub.SubmitJob(request, timeout=30)
                codes["OK"] += 1
            except grpc.RpcError as err:
                codes[f"{err.code().name}: {err.details()}"] += 1
            i += 1


def test_a_sighup_to_every_process_of_the_unit_spares_the_commit_process(
    tmp_path: Path,
) -> None:
    """``systemctl kill -s HUP oasisd`` signals every process of the unit, the commit
    process too, which SIGHUP's default action ended: each such reload cost the decisions
    being committed their answer (UNAVAILABLE) and the daemon a rebuild of its ledger.
    The child ignores it now, as it ignores SIGINT and SIGTERM."""
    log = tmp_path / "oasisd.log"
    daemon = Daemon(write_config(tmp_path / "oasisd.toml", tmp_path / "data", epoch=EPOCH),
                    log).start()  # fmt: skip
    assert daemon.proc is not None
    codes: Counter[str] = Counter()
    done = threading.Event()
    clients = [
        threading.Thread(target=_submitting, args=(daemon.address, f"c{k}", codes, done))
        for k in range(2)
    ]
    try:
        for client in clients:
            client.start()
        deadline = time.monotonic() + 30
        while not codes["OK"] and time.monotonic() < deadline:
            time.sleep(0.05)
        [child] = commit_processes(daemon.proc.pid)
        for seen in range(3):
            for pid in (daemon.proc.pid, child):  # as systemctl kill does: the whole unit
                os.kill(pid, signal.SIGHUP)
            reloads(log, "config reloaded", seen)
            time.sleep(0.3)  # decisions committed meanwhile, through the child
            assert commit_processes(daemon.proc.pid) == [child], f"reload {seen + 1}"
        done.set()
        for client in clients:
            client.join(60)
        assert set(codes) == {"OK"}, codes
        events = {e.get("event") for e in json_log(log)}
        assert "commit process lost" not in events
    finally:
        done.set()
        assert daemon.stop() == 0, log.read_text()[-3000:]
