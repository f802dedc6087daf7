"""oasisd end to end: a real subprocess on a loopback port, driven with the CLI and a real
gRPC channel, on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controller.auth import MAX_OPEN_STREAMS
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.servers import SMALL_JOB, Daemon, oasis, write_config

BASE_JOB: dict[str, Any] = SMALL_JOB


def job(job_id: str, **changes: Any) -> dict[str, Any]:
    return {**BASE_JOB, "id": job_id, **changes}


def contending_jobs(n: int) -> list[dict[str, Any]]:
    """Jobs big enough to fill the small test cluster, so prices matter."""
    out = []
    for i in range(n):
        out.append(
            job(
                f"j{i}",
                epochs=2 + i % 3,
                chunks=10 + 3 * i,
                minibatches=60 + 10 * i,
                worker={"gpu": 1 + i % 2, "cpu": 4, "mem": 16, "disk": 5, "bandwidth": 1 + i % 3},
                utility={"kind": "sigmoid", "priority": 20 + 15 * i, "decay": 0.3, "target": 4},
            )
        )
    return out


def write_job(tmp_path: Path, spec: Any, name: str = "job.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(spec))
    return str(path)


@pytest.fixture
def daemon(tmp_path: Path, store_url: str) -> Any:
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", store_url)
    d = Daemon(config, tmp_path / "oasisd.log").start()
    yield d
    assert d.stop() == 0, (tmp_path / "oasisd.log").read_text()


def submit_json(tmp_path: Path, spec: dict[str, Any], server: str) -> dict[str, Any]:
    """The job record ``submit --json`` prints (a rejection exits 3)."""
    out = oasis("submit", write_job(tmp_path, spec), "--json", server=server, check=False)
    assert out.returncode in (0, 3), f"{out.stdout}\n{out.stderr}"
    record = dict(json.loads(out.stdout))
    assert out.returncode == (0 if record["decision"]["admitted"] else 3)
    return record


def prices(server: str, name: str, resource: str, slots: int = 24) -> list[float]:
    out = oasis("prices", "--json", "--slots", str(slots), "--server-name", name, server=server)
    data = json.loads(out.stdout)
    row = next(p for p in data["prices"] if p["resource"] == resource)
    return [float(x) for x in row["prices"]]


def test_submit_quote_cancel_and_prices_fall(tmp_path: Path, daemon: Daemon) -> None:
    addr = daemon.address
    spec = job("a1")
    quoted = json.loads(oasis("quote", write_job(tmp_path, spec), "--json", server=addr).stdout)
    assert quoted["decision"]["admitted"] is True
    assert json.loads(oasis("jobs", "--json", server=addr).stdout).get("jobs", []) == []

    first = submit_json(tmp_path, spec, addr)
    decision = first["decision"]
    assert decision["admitted"] is True and first["state"] == "admitted"
    # the quote was the same computation (bounds include the job in both)
    assert decision["payoff"] == pytest.approx(quoted["decision"]["payoff"], rel=1e-12)
    slots = sorted({a["slot"] for a in decision["allocations"]})
    server = next(a["server"] for a in decision["allocations"] if a.get("workers", 0) > 0)
    before = prices(addr, server, "gpu")
    first_slot = int(json.loads(oasis("prices", "--json", server=addr).stdout)["first_slot"])
    idle = before[-1]  # the window's last slot: untouched
    used = [before[int(s) - first_slot] for s in slots]
    assert all(p > idle for p in used)

    out = oasis("cancel", "a1", server=addr)
    assert out.stdout.startswith("a1: cancelled; ") and " worker-slot" in out.stdout
    after = prices(addr, server, "gpu")
    assert all(after[int(s) - first_slot] == idle for s in slots)  # back to the empty price
    shown = json.loads(oasis("job", "a1", "--json", server=addr).stdout)
    assert shown["state"] == "cancelled"
    # a repeated cancel (a retry after a lost answer) gets the same answer again
    with grpc.insecure_channel(addr) as channel:
        stub = pb_grpc.AdmissionStub(channel)
        first_cancel = stub.CancelJob(pb.CancelJobRequest(id="a1"), timeout=30)
        second_cancel = stub.CancelJob(pb.CancelJobRequest(id="a1"), timeout=30)
    assert first_cancel == second_cancel
    assert first_cancel.job.state == pb.JOB_STATE_CANCELLED
    assert first_cancel.released_worker_slots > 0
    again = oasis("cancel", "a1", server=addr, check=False)
    assert again.returncode == 0 and "cancelled" in again.stdout
    missing = oasis("job", "nope", server=addr, check=False)
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr


def test_retried_submit_is_idempotent(tmp_path: Path, daemon: Daemon) -> None:
    addr = daemon.address
    spec = job("r1")
    first = submit_json(tmp_path, spec, addr)
    snapshot = prices(addr, "w0", "gpu") + prices(addr, "w2", "gpu")
    second = submit_json(tmp_path, spec, addr)
    assert second["duplicate"] is True
    assert second["decision"] == first["decision"]
    assert prices(addr, "w0", "gpu") + prices(addr, "w2", "gpu") == snapshot  # nothing more
    jobs = json.loads(oasis("jobs", "--json", server=addr).stdout)["jobs"]
    assert [j["spec"]["id"] for j in jobs] == ["r1"]
    other = oasis("submit", write_job(tmp_path, {**spec, "epochs": 3}), server=addr, check=False)
    assert other.returncode == 1 and "ALREADY_EXISTS" in other.stderr


def test_invalid_input_is_a_clear_error_and_the_daemon_stays_healthy(
    tmp_path: Path, daemon: Daemon
) -> None:
    addr = daemon.address
    cases = [
        (job("b1", tau=-1), "job.tau: must be > 0"),
        (job("b2", worker={**BASE_JOB["worker"], "bandwidth": 9}), "job.worker.bandwidth"),
        (job("b3", worker={**BASE_JOB["worker"], "tpu": 1}), "job.worker.tpu: unknown resource"),
        (job("b4", epochs=10_000), "cannot finish|only 24 (1d) remain"),
        ({k: v for k, v in job("b5").items() if k != "chunks"}, "job.chunks: is required"),
    ]
    for spec, message in cases:
        out = oasis("submit", write_job(tmp_path, spec), server=addr, check=False)
        assert out.returncode == 2, out
        assert "INVALID_ARGUMENT" in out.stderr
        assert any(m in out.stderr for m in message.split("|")), out.stderr
    with grpc.insecure_channel(addr) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        # Watch (what some load balancers use) streams the status; it was UNKNOWN once.
        # The open services' streams take no token: at most MAX_OPEN_STREAMS at once (1000
        # of them refused every tenant's calls), and Check and others' calls go on
        watches = []
        for _ in range(MAX_OPEN_STREAMS):
            watches.append(health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60))
            assert next(watches[-1]).status == health_pb2.HealthCheckResponse.SERVING
        over = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
        with pytest.raises(grpc.RpcError) as refused:
            next(over)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"the most at once ({MAX_OPEN_STREAMS})" in str(refused.value.details())
        status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        pb_grpc.AdmissionStub(channel).ListJobs(pb.ListJobsRequest(), timeout=10)
        watches.pop().cancel()
        again = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
        deadline = time.monotonic() + 30  # the cancelled stream's place frees as it ends
        while True:
            try:
                assert next(again).status == health_pb2.HealthCheckResponse.SERVING
                break
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert time.monotonic() < deadline, "a closed stream's place never came back"
                time.sleep(0.1)
                again = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
        for watch in [*watches, again]:
            watch.cancel()
    assert submit_json(tmp_path, job("good"), addr)["decision"]["admitted"] is True
    listed = json.loads(oasis("jobs", "--json", server=addr).stdout)["jobs"]
    assert [j["spec"]["id"] for j in listed] == ["good"]


def test_watch_replays_and_streams_events(tmp_path: Path, daemon: Daemon) -> None:
    submit_json(tmp_path, job("w1"), daemon.address)
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.AdmissionStub(channel)
        stream = stub.WatchEvents(pb.WatchEventsRequest(after_sequence=0), timeout=20)
        first = next(stream)
        assert (first.kind, first.job_id) == ("decided", "w1")
        submit_json(tmp_path, job("w2"), daemon.address)
        second = next(stream)
        assert (second.kind, second.job_id) == ("decided", "w2")
        assert second.sequence > first.sequence
        stream.cancel()


def test_watch_from_past_the_newest_event_is_refused(tmp_path: Path, daemon: Daemon) -> None:
    """Every live event is numbered below it, so none was shown: ``oasis watch --from
    99999`` (a number mistyped, a store restored from a backup) waited in silence for
    good. Refused now, naming the newest; the newest itself is still taken."""
    submit_json(tmp_path, job("w-past"), daemon.address)
    out = oasis("watch", "--from", "999999999", server=daemon.address, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    said = out.stderr.strip().splitlines()[-1]
    assert said.startswith("  --from: event #999999999 is past the newest one, #"), out.stderr
    newest = int(said.split("#")[2].split(":")[0])
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.AdmissionStub(channel)
        stream = stub.WatchEvents(pb.WatchEventsRequest(after_sequence=newest - 1), timeout=20)
        assert next(stream).sequence == newest
        stream.cancel()
        past = stub.WatchEvents(pb.WatchEventsRequest(after_sequence=newest + 1), timeout=20)
        with pytest.raises(grpc.RpcError) as err:
            next(past)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        latest = stub.WatchEvents(pb.WatchEventsRequest(after_sequence=newest), timeout=1)
        with pytest.raises(grpc.RpcError) as err:
            next(latest)  # taken: it waits for the next event
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def submit_rpc(address: str, spec: dict[str, Any]) -> pb.SubmitJobResponse:
    """SubmitJob as ``oasis submit`` sends it (the spec as JSON): decided, not refused."""
    with grpc.insecure_channel(address) as channel:
        request = pb.SubmitJobRequest(job=pb.JobSpec(json=json.dumps(spec)))
        reply: pb.SubmitJobResponse = pb_grpc.AdmissionStub(channel).SubmitJob(request, timeout=60)
    return reply


def test_kill_9_and_restart_lose_nothing_and_decide_as_if_uninterrupted(
    tmp_path: Path, store_url: str, request: pytest.FixtureRequest
) -> None:
    """Driven over gRPC, as ``oasis submit`` sends a job (the CLI's submit and listing are
    the other tests'): through the CLI, each of its 15 calls started a process."""
    epoch = time.time()
    jobs = contending_jobs(7)
    crashed = Daemon(
        write_config(tmp_path / "a.toml", tmp_path / "a", store_url, epoch), tmp_path / "a.log"
    ).start()
    decisions = [submit_rpc(crashed.address, j).job for j in jobs[:6]]
    assert any(d.state == pb.JOB_STATE_REJECTED for d in decisions), "jobs should contend"
    assert any(d.state == pb.JOB_STATE_ADMITTED for d in decisions)
    crashed.kill9()

    restarted = Daemon(crashed.config, tmp_path / "a.log").start()
    try:
        with grpc.insecure_channel(restarted.address) as channel:
            listed = pb_grpc.AdmissionStub(channel).ListJobs(pb.ListJobsRequest(), timeout=30)
        assert not listed.next_page_token
        assert [j.decision for j in listed.jobs] == [d.decision for d in decisions]
        retry = submit_rpc(restarted.address, jobs[5])
        assert retry.duplicate is True
        after_crash = submit_rpc(restarted.address, jobs[6]).job.decision
    finally:
        assert restarted.stop() == 0

    if store_url.startswith("sqlite"):
        other_url = f"sqlite:///{tmp_path / 'b.db'}"
    else:
        other_url = request.getfixturevalue("postgres").new_database()
    calm = Daemon(
        write_config(tmp_path / "b.toml", tmp_path / "b", other_url, epoch), tmp_path / "b.log"
    ).start()
    try:
        for j in jobs[:6]:
            submit_rpc(calm.address, j)
        uninterrupted = submit_rpc(calm.address, jobs[6]).job.decision
    finally:
        assert calm.stop() == 0
    after_crash.ClearField("decision_ms")
    uninterrupted.ClearField("decision_ms")
    assert after_crash == uninterrupted  # same payoff, cost and plan, bit for bit


def test_bad_config_names_the_key(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.toml", tmp_path / "d", extra="")
    config.write_text(config.read_text().replace("window = 24", "window = -3"))
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "controller.daemon", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert "daemon.window: must be >= 1" in out.stderr


@pytest.mark.parametrize("which", ["daemon", "metrics"])
def test_an_address_in_use_is_a_clear_error(tmp_path: Path, which: str) -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        extra = f'[metrics]\nlisten = "{busy}"\n' if which == "metrics" else ""
        config = write_config(tmp_path / "c.toml", tmp_path / "d", extra=extra)
        listen = busy if which == "daemon" else "127.0.0.1:0"
        out = subprocess.run(
            [sys.executable, "-m", "controller.daemon", "--config", str(config),
             "--listen", listen],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert f"oasisd: {which}.listen: cannot listen on {busy}" in out.stderr
    assert "Traceback" not in out.stderr


def test_an_unreachable_store_is_a_clear_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.servers import free_port

    url = f"postgresql+psycopg://oasis:secret@127.0.0.1:{free_port()}/oasis"
    config = write_config(tmp_path / "c.toml", tmp_path / "d", store_url=url)
    out = subprocess.run(
        [sys.executable, "-m", "controller.daemon", "--config", str(config)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert "oasisd: cannot open the store postgresql+psycopg://oasis:***@127.0.0.1" in out.stderr
    assert "secret" not in out.stderr and "Traceback" not in out.stderr
