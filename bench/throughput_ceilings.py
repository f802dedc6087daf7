"""The ceilings the daemon's submit rate is measured against (``bench.daemon_throughput
--ceilings``): what its gRPC layer and its store commits allow alone, on the same machine,
in the same run.

gRPC ceiling
    A ``grpc.aio`` server in its own process, as oasisd is, whose ``SubmitJob`` answers
    at once with a canned ``SubmitJobResponse`` (a real rejection of the workload, price
    drivers included, so the messages are the daemon's size). The same client threads
    (:class:`bench.daemon_throughput.Load`) call it: calls per second with no decision
    and no store behind. Measured bare, and again behind the daemon's own interceptors
    (``front``: the stop gate, the access checks with the request read bounded, and the
    decoding of bad requests; no tokens, no rate limit), so the daemon's front is part
    of a ceiling rather than assumed free.

Commit ceiling
    The decisions' write sets (job row, allocation rows, estimate, event: what
    :mod:`controller.admission.commit` writes) of the workload's first jobs, collected
    from a controller in-process, then committed to a fresh store by the same function
    the daemon's writer uses, ``k`` write sets per transaction, one after another in one
    thread: decisions per second the store takes with no search and no gRPC. ``k = 1``
    is a commit per decision; ``k = 32`` what a full batch of 32 clients gives.

Run with
    .venv/bin/python -m bench.daemon_throughput --ceilings   # beside the daemon's rate
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog

from controller.admission import AdmissionController
from controller.admission.writer import WriteSet
from controller.clock import SlotClock, SlotTimes, SystemClock
from controller.config import load
from controller.rpc import oasis_pb2 as pb
from controller.store import Database

__all__ = ["commit_ceiling", "grpc_ceiling"]


def _controller(config_path: Path) -> AdmissionController:
    config = load(config_path)
    config.data_dir.mkdir(parents=True, exist_ok=True)
    c = AdmissionController(
        config,
        Database(config.database_url, sqlite_synchronous=config.sqlite_synchronous),
        SlotClock(SystemClock(), config.slot_seconds, config.epoch),
        log=structlog.wrap_logger(structlog.ReturnLogger()),
    )
    c.open()
    return c


def write_sets(config_path: Path, jobs: list[dict[str, Any]], run: str) -> list[WriteSet]:
    """The write sets of deciding ``jobs`` in order (ids ``{run}-{i}``), not committed."""
    c = _controller(config_path)
    taken: list[WriteSet] = []

    def keep(ws: WriteSet) -> Any:
        taken.append(ws)
        return ws.future

    c._writer.submit = keep  # type: ignore[method-assign]
    try:
        for i, job in enumerate(jobs):
            spec = {**job, "id": f"{run}-{i}"}
            c.between_decisions(functools.partial(c._submit_sync, spec, None, None), 60.0)
    finally:
        c.close()
    return taken


def commit_ceiling(config_path: Path, sets: list[WriteSet], k: int) -> float:
    """Decisions per second committed ``k`` per transaction into the (fresh) store of
    ``config_path``, by the daemon's own batch commit."""
    c = _controller(config_path)
    try:
        started = time.perf_counter()
        for i in range(0, len(sets), k):
            c._commit_batch(sets[i : i + k])
        return len(sets) / (time.perf_counter() - started)
    finally:
        c.close()


def canned_response(config_path: Path, job: dict[str, Any]) -> bytes:
    """A real answer to ``job`` (decided by a controller on the config's store, then
    discarded), serialised: what the gRPC ceiling's server sends back."""
    from controller.convert import job_to_proto

    c = _controller(config_path)
    try:
        submitted = c.between_decisions(lambda: c._submit_sync(job, None, None), 60.0)
        view, _events = (
            submitted
            if isinstance(submitted, tuple)
            else submitted.then(submitted.future.result(30))
        )
        times = SlotTimes(c.slots.epoch, c.config.slot_seconds)
        return pb.SubmitJobResponse(job=job_to_proto(view, times)).SerializeToString()
    finally:
        c.close()


def grpc_ceiling(
    response: bytes, clients: int, requests: list[Any], seconds: float, front: bool = False
) -> float:
    """Calls per second of ``clients`` threads against a server answering ``response``
    (behind the daemon's interceptors if ``front``)."""
    from bench.daemon_throughput import Load

    with tempfile.TemporaryDirectory() as tmp:
        payload = Path(tmp) / "response.bin"
        payload.write_bytes(response)
        port_file = Path(tmp) / "port"
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.throughput_ceilings",
                str(payload),
                str(port_file),
                "front" if front else "bare",
            ],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists() or not port_file.read_text().strip():
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the ceiling's gRPC server did not start")
                time.sleep(0.05)
            address = f"127.0.0.1:{port_file.read_text().strip()}"
            load = Load(address, requests, clients, 0.02, seconds)
            wall = load.run()
            return (load.admitted + load.rejected) / wall
        finally:
            server.terminate()
            server.wait(10)


async def _serve(payload: Path, port_file: Path, front: bool) -> None:
    """A gRPC server whose SubmitJob answers ``payload`` at once (with health checks),
    behind the daemon's interceptors if ``front`` (in the daemon's order)."""
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    from controller.rpc import oasis_pb2_grpc as pb_grpc

    answer = pb.SubmitJobResponse.FromString(payload.read_bytes())

    class Canned(pb_grpc.AdmissionServicer):
        async def SubmitJob(self, request: Any, context: Any) -> Any:  # noqa: N802
            return answer

        async def QuoteJob(self, request: Any, context: Any) -> Any:  # noqa: N802
            return pb.QuoteJobResponse(decision=answer.job.decision)

    interceptors: list[Any] = []
    if front:
        from controller.auth import AccessInterceptor
        from controller.drain import StopGate
        from controller.statuses import DecodeInterceptor

        interceptors = [StopGate(), AccessInterceptor(None, None), DecodeInterceptor()]
    server = grpc.aio.server(interceptors=interceptors)
    pb_grpc.add_AdmissionServicer_to_server(Canned(), server)
    checks = health.aio.HealthServicer()
    await checks.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    port_file.write_text(str(port))
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(_serve(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:] == ["front"]))
