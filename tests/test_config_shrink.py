"""A configuration shrunk under admitted jobs (issue 12, item 2): the daemon, a subprocess,
still starts; plans that no longer fit are re-placed, re-planned or failed, each with an
event, no capacity is exceeded, and the jobs whose plans still fit are untouched."""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import sqlalchemy

from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.servers import Daemon, Postgres, events_through, newest_event, write_config
from tests.test_daemon_e2e import contending_jobs

W2 = '  {name="w2", kind="worker", capacity={gpu=8, cpu=64, mem=488, disk=500, bandwidth=40}},\n'
SHRINKS = {
    "capacity": lambda text: text.replace(
        W2, W2.replace("gpu=8, cpu=64, mem=488", "gpu=2, cpu=16, mem=64")
    ),
    "server": lambda text: text.replace(W2, ""),
    "window": lambda text: text.replace("window = 24", "window = 5"),
}


def job_pages(stub: pb_grpc.AdmissionStub, most: int = 100) -> list[Any]:
    """Every ``ListJobs`` answer from the start, page after page; AssertionError if a
    listing goes on past ``most`` pages (one that never ends)."""
    pages: list[Any] = []
    token = ""
    while len(pages) < most:
        page = stub.ListJobs(pb.ListJobsRequest(page_token=token), timeout=30)
        pages.append(page)
        token = page.next_page_token
        if not token:
            return pages
    raise AssertionError(f"still more pages after {most}")


def _jobs(stub: pb_grpc.AdmissionStub) -> dict[str, Any]:
    """Every listed job by id, page after page (a page ends before rows whose sequence
    an edit made no token's; they come on a page of their own)."""
    return {j.spec.id: j for page in job_pages(stub) for j in page.jobs}


def _plan(job: Any, from_slot: int) -> list[tuple[int, str, int, int]]:
    return sorted(
        (a.slot, a.server, a.workers, a.ps) for a in job.decision.allocations if a.slot >= from_slot
    )


def decided(config: Path, log: Path, n: int) -> dict[str, Any]:
    """Start ``oasisd --config config``, submit ``n`` contending jobs, stop it; its jobs
    by id, as it answered them."""
    daemon = Daemon(config, log).start()
    try:
        with grpc.insecure_channel(daemon.address) as channel:
            stub = pb_grpc.AdmissionStub(channel)
            for spec in contending_jobs(n):
                stub.SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(spec)), timeout=60)
            return _jobs(stub)
    finally:
        assert daemon.stop() == 0, log.read_text()


def read_back(
    address: str, store_url: str
) -> tuple[dict[str, Any], int, dict[str, dict[str, Any]]]:
    """What a restarted daemon at ``address`` holds: its jobs by id, its current slot
    (every plan from it on checked within capacity) and the detail of each job's last
    ``replanned`` or ``failed`` event (read up to the last event its store at
    ``store_url`` holds)."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.AdmissionStub(channel)
        cluster = pb_grpc.ClusterStub(channel)
        jobs = _jobs(stub)
        now = cluster.GetUtilisation(pb.GetUtilisationRequest(), timeout=10).first_slot
        _within_capacity(cluster, jobs, now)
        events = {
            e.job_id: json.loads(e.detail)
            for e in events_through(stub, newest_event(store_url))
            if e.kind in ("replanned", "failed")
        }
    return jobs, now, events


def _within_capacity(cluster: Any, jobs: dict[str, Any], from_slot: int) -> None:
    """Every job's demands summed per (slot, server, resource) from the stored plans,
    from ``from_slot`` on, are within the configured capacities."""
    capacity = {
        s.name: dict(s.capacity) for s in cluster.ListServers(pb.ListServersRequest()).servers
    }
    used: dict[tuple[int, str, str], float] = defaultdict(float)
    for job in jobs.values():
        for a in _plan_allocs(job, from_slot):
            assert a.server in capacity, f"{job.spec.id} planned on unknown {a.server}"
            demand = job.spec.worker if a.workers else job.spec.ps
            count = a.workers or a.ps
            for resource, amount in demand.items():
                used[(a.slot, a.server, resource)] += count * amount
    for (slot, server, resource), amount in used.items():
        assert amount <= capacity[server].get(resource, 0) + 1e-6, (slot, server, resource)


@dataclass
class Decided:
    """A store a daemon decided contending jobs in, the epoch it planned them from, and
    its jobs as it answered them (ListJobs)."""

    url: str
    epoch: float
    before: dict[str, Any]


def decide_in(url: str, folder: Path, n: int) -> Decided:
    """A daemon on the store at ``url`` (its files in ``folder``) decides ``n``
    contending jobs (:func:`decided`)."""
    epoch = time.time()
    config = write_config(folder / "oasisd.toml", folder / "data", url, epoch=epoch)
    return Decided(url, epoch, decided(config, folder / "oasisd.log", n))


def copy_of(template: Decided, tmp_path: Path, postgres: Postgres | None) -> str:
    """The URL of a fresh copy of ``template``'s store: its file copied into
    ``tmp_path`` (SQLite), or ``CREATE DATABASE ... TEMPLATE`` on ``postgres``."""
    if template.url.startswith("sqlite:///"):
        shutil.copy(template.url.removeprefix("sqlite:///"), tmp_path / "store.db")
        return f"sqlite:///{tmp_path / 'store.db'}"
    assert postgres is not None
    name = f"t_{uuid.uuid4().hex[:12]}"
    engine = sqlalchemy.create_engine(postgres.url(), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            database = template.url.rsplit("/", 1)[1]
            conn.execute(sqlalchemy.text(f'CREATE DATABASE "{name}" TEMPLATE "{database}"'))
    finally:
        engine.dispose()
    return postgres.url(name)


@pytest.fixture(scope="module")
def sqlite_decided(tmp_path_factory: pytest.TempPathFactory) -> Decided:
    folder = tmp_path_factory.mktemp("decided")
    return decide_in(f"sqlite:///{folder / 'store.db'}", folder, 10)


@pytest.fixture(scope="module")
def postgres_decided(tmp_path_factory: pytest.TempPathFactory, postgres: Postgres) -> Decided:
    return decide_in(postgres.new_database(), tmp_path_factory.mktemp("decided"), 10)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Decided:
    """A fresh copy of the backend's store of 10 decided jobs (deciding them once per
    module, not once per shrink: the copy is the same store, byte for byte on SQLite,
    ``CREATE DATABASE ... TEMPLATE`` on PostgreSQL)."""
    sqlite = request.param == "sqlite"
    template: Decided = request.getfixturevalue("sqlite_decided" if sqlite else "postgres_decided")
    postgres = None if sqlite else request.getfixturevalue("postgres")
    return Decided(copy_of(template, tmp_path, postgres), template.epoch, template.before)


@pytest.mark.parametrize("shrink", sorted(SHRINKS))
def test_a_shrunk_config_starts_and_refits_the_jobs_that_no_longer_fit(
    tmp_path: Path, store: Decided, shrink: str
) -> None:
    store_url, before = store.url, store.before
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", store_url, store.epoch)
    log = tmp_path / "oasisd.log"
    config.write_text(SHRINKS[shrink](config.read_text()))
    assert config.read_text() != write_config(tmp_path / "x.toml", tmp_path / "data").read_text()

    daemon = Daemon(config, log).start()  # before the fix: a CapacityError/LedgerError
    try:
        after, now, refits = read_back(daemon.address, store_url)
    finally:
        assert daemon.stop() == 0, log.read_text()

    admitted = [j for j, job in before.items() if job.decision.admitted]
    changed = [j for j in admitted if _plan(before[j], now) != _plan(after[j], now)]
    assert changed, "the shrink must hit some job, or the test checks nothing"
    for j in admitted:
        if j in changed or after[j].state == pb.JOB_STATE_FAILED:
            assert refits.get(j, {}).get("reason") == "config_changed", (j, refits)
            assert refits[j]["how"] in ("replaced", "replanned", "stranded")
            assert refits[j]["why"]
        else:  # still fits: untouched, no event
            assert j not in refits
            assert after[j].state == before[j].state
    for j in refits:
        assert (refits[j]["how"] == "stranded") == (after[j].state == pb.JOB_STATE_FAILED)
    text = log.read_text()
    assert "plan refitted to the configuration" in text and "Traceback" not in text
    if shrink == "capacity":  # the server by its name (it said "worker server #2")
        assert all("worker server 'w2'" in refits[j]["why"] for j in refits), refits
    if shrink == "server":
        assert all(a.server != "w2" for j in after.values() for a in _plan_allocs(j, now))
    if shrink == "window":
        assert all(a.slot <= now + 5 for j in after.values() for a in _plan_allocs(j, now))


def _plan_allocs(job: Any, from_slot: int) -> list[Any]:
    return [a for a in job.decision.allocations if a.slot >= from_slot]
