"""What one submitter may have stored in a day (limits.max_stored_mb_per_day,
controller.admission.stored_budget): counted per hour and per submitter, and, in the
daemon over gRPC, a tenant past it refused with nothing stored while another tenant's
jobs and its own retries are answered."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import insert

from controller.admission.stored_budget import (
    BUCKET_SECONDS,
    StoredBudget,
    over_budget,
    stored_day,
)
from controller.admission.views import canonical_spec
from controller.limits import Limits, limits_from_dict
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.store import Database, JobRow
from controller.store.database import migrate
from controller.tls import client_channel
from pricing import SpecError
from tests.servers import SMALL_JOB, TENANT_TOKENS, Daemon, tenants_daemon

T0 = 1_800_000_000.0  # a Unix time on an hour boundary (an hour's multiple)


def test_bytes_are_counted_per_submitter_over_its_last_24_hours() -> None:
    assert T0 % BUCKET_SECONDS == 0
    budget = StoredBudget()
    budget.add("alice", T0, 100)
    budget.add("alice", T0 + 10, 50)
    budget.add("bob", T0, 7)
    budget.add(None, T0, 1)  # without [auth]: every caller together
    assert budget.used("alice", T0 + 20) == 150
    assert (budget.used("bob", T0), budget.used(None, T0), budget.used("carol", T0)) == (7, 1, 0)
    budget.add("alice", T0 + 5 * 3600, 30)
    # the first hour's bytes count until that hour is 24 hours back, then leave
    assert budget.used("alice", T0 + 24 * 3600 - 1) == 180
    assert budget.used("alice", T0 + 24 * 3600) == 30
    assert budget.used("alice", T0 + 29 * 3600) == 0
    assert budget.used("bob", T0 + 30 * 3600) == 0
    assert list(budget._by) == [None]  # a submitter whose day is found empty is let go
    assert budget.used(None, T0 + 30 * 3600) == 0 and budget._by == {}


def test_over_budget_says_why_and_zero_is_no_limit() -> None:
    mib = 2**20
    assert over_budget(0, mib, 1.0) == ""  # exactly the limit: stored
    why = over_budget(mib - 10, 11, 1.0)
    assert "limits.max_stored_mb_per_day = 1" in why and "nothing was stored" in why
    assert over_budget(10**15, 10**9, 0.0) == ""
    assert over_budget(10**15, 10**9, 1e308) == ""  # inf bytes: no overflow, no refusal


def test_the_limit_is_read_by_name() -> None:
    assert Limits().max_stored_mb_per_day == 1024.0
    assert limits_from_dict({"max_stored_mb_per_day": 0}).max_stored_mb_per_day == 0.0
    assert limits_from_dict({"max_stored_mb_per_day": 0.5}).max_stored_mb_per_day == 0.5
    for bad in (-1, "1G", float("nan")):
        with pytest.raises(SpecError, match=r"limits\.max_stored_mb_per_day"):
            limits_from_dict({"max_stored_mb_per_day": bad})


def _large(job_id: str) -> dict[str, object]:
    """A job whose spec is about 2.5 KB: a table utility of 200 values."""
    values = [round(100.0 - i * 0.25, 2) for i in range(200)]
    return {**SMALL_JOB, "id": job_id, "utility": {"kind": "table", "values": values}}


def test_a_tenant_past_its_days_bytes_is_refused_and_the_others_are_not(
    tmp_path: Path,
) -> None:
    size = len(canonical_spec({**_large("a00"), "id": "alice:a00"}).encode())
    limit_mb = 4.5 * size / 2**20  # four of alice's jobs fit, the fifth does not
    extra = f"[limits]\nmax_stored_mb_per_day = {limit_mb}\n"
    with tenants_daemon(tmp_path, extra) as (_daemon, alice, bob):
        a, b = pb_grpc.AdmissionStub(alice), pb_grpc.AdmissionStub(bob)

        def submit(stub: pb_grpc.AdmissionStub, spec: dict[str, object]) -> pb.SubmitJobResponse:
            request = pb.SubmitJobRequest(job=pb.JobSpec(json=json.dumps(spec)))
            answer: pb.SubmitJobResponse = stub.SubmitJob(request, timeout=30)
            return answer

        for i in range(4):
            assert submit(a, _large(f"a{i:02}")).job.spec.id == f"a{i:02}"
        with pytest.raises(grpc.RpcError) as refused:
            submit(a, _large("a04"))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limits.max_stored_mb_per_day" in (refused.value.details() or "")
        with pytest.raises(grpc.RpcError) as missing:  # nothing of it was stored
            a.GetJob(pb.GetJobRequest(id="a04"), timeout=10)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        again = submit(a, _large("a00"))  # a retry of a stored job: its first answer
        assert again.duplicate and again.job.spec.id == "a00"
        quoted = a.QuoteJob(pb.QuoteJobRequest(job=pb.JobSpec(json=json.dumps(_large("q")))))
        assert quoted.decision.arrival_slot > 0  # a quote stores nothing: not refused
        for i in range(4):  # bob's day is his own
            assert submit(b, _large(f"b{i:02}")).job.spec.id == f"b{i:02}"
        listed = a.ListJobs(pb.ListJobsRequest(), timeout=10)
        assert sorted(j.spec.id for j in listed.jobs) == ["a00", "a01", "a02", "a03"]
    # a restart reads the day back from the store: before, it forgot it, and alice could
    # store her budget again after every restart
    log = tmp_path / "restarted.log"
    daemon = Daemon(tmp_path / "oasisd.toml", log).start()  # the same config and store
    alice = client_channel(daemon.address, token=TENANT_TOKENS["alice"])
    try:
        with pytest.raises(grpc.RpcError) as refused:
            submit(pb_grpc.AdmissionStub(alice), _large("a04"))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        alice.close()
        assert daemon.stop() == 0, log.read_text()
    counted = [json.loads(line) for line in log.read_text().splitlines() if "last day" in line]
    assert [(c["jobs"], c["submitters"]) for c in counted] == [(8, 2)]


def test_a_restored_day_counts_only_its_own_hours() -> None:
    """:meth:`StoredBudget.restore` takes the hours of the day up to now, per submitter,
    and leaves older (or later) ones out; each leaves with its hour."""
    budget = StoredBudget()
    now = T0 + 30 * 60
    hour = int(T0 // 3600)
    rows = [("alice", hour, 100), ("alice", hour - 23, 10), (None, hour, 3),
            ("bob", hour - 24, 1000), ("bob", hour + 1, 1000)]  # fmt: skip
    budget.restore(rows, now)
    assert (budget.used("alice", now), budget.used(None, now), budget.used("bob", now)) == (
        110, 3, 0,
    )  # fmt: skip
    assert budget.used("alice", T0 + 2 * 3600) == 100


def _job_row(sequence: int, by: str | None, at: datetime, spec_bytes: int) -> dict[str, Any]:
    """A decided job's row as the daemon stores it, its spec ``spec_bytes`` long."""
    spec = canonical_spec({"id": f"j{sequence}", "pad": ""})
    spec = canonical_spec({"id": f"j{sequence}", "pad": "x" * (spec_bytes - len(spec))})
    return {
        "id": f"j{sequence}", "sequence": sequence, "spec": spec, "state": "rejected",
        "submitted_slot": 0, "arrival_slot": 1, "work": 1, "admitted": False,
        "payoff": -1.0, "reason": "", "detail": {}, "decision_ms": 1.0, "decided_at": at,
        "submitter": by,
    }  # fmt: skip


def test_the_day_is_read_back_per_submitter_and_hour(store_url: str) -> None:
    """:func:`stored_day` on SQLite and PostgreSQL: the jobs of the 24 hours up to now,
    summed per submitter and hour; the older history before them is not counted."""
    db = Database(store_url)
    migrate(db)
    now = T0 + 30 * 60
    utc = lambda seconds: datetime.fromtimestamp(seconds, UTC)  # noqa: E731
    rows = [_job_row(i + 1, "old", utc(now - 3 * 86_400 + i), 500) for i in range(49)]
    rows.append(_job_row(50, "old", utc(now - 86_400 - 60), 500))  # a minute before the day
    rows += [
        _job_row(51, "alice", utc(now - 23 * 3600), 300),  # the day's first hour
        _job_row(52, "alice", utc(now - 23 * 3600 + 60), 200),
        _job_row(53, None, utc(now - 3600), 70),
        _job_row(54, "alice", utc(now - 5), 1000),
        _job_row(55, "bob", utc(now - 1), 40),
    ]
    with db.session() as session:
        session.execute(insert(JobRow), rows)
    with db.session() as session:
        hours, jobs = stored_day(session, now)
    hour = int(T0 // 3600)
    assert jobs == 5
    assert sorted(hours, key=str) == sorted(
        [("alice", hour - 23, 500), (None, hour - 1, 70), ("alice", hour, 1000), ("bob", hour, 40)],
        key=str,
    )
    budget = StoredBudget()
    budget.restore(hours, now)
    assert (budget.used("alice", now), budget.used("bob", now), budget.used("old", now)) == (
        1500, 40, 0,
    )  # fmt: skip
    db.engine.dispose()
