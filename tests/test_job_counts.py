"""Jobs per state (controller/admission/job_counts.py): the Prometheus scrape and the
console's overview share one count of the store, reused until it is ``max_age`` old, and
follow the store once it is. The controller runs in-process on SQLite with a fake clock;
the store's statements are seen by a SQLAlchemy ``before_cursor_execute`` listener."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from sqlalchemy import event, func, select

from controller import metrics as metrics_module
from controller.admission import STATES, AdmissionController
from controller.admission.job_counts import MIN_AGE_SECONDS
from controller.auth import Caller, Role
from controller.console.data import ConsoleData
from controller.metrics import Metrics
from controller.store import JobRow
from tests.test_metrics import parse, value
from tests.test_retention import SPEC
from tests.test_retention import _controller as retention_controller

CHEAP = {**SPEC, "utility": {**SPEC["utility"], "priority": 1e-9}}  # rejected
ALICE = Caller("alice", Role.SUBMITTER)
OPERATOR = Caller("ops", Role.OPERATOR)


@contextmanager
def counting(c: AdmissionController) -> Iterator[list[str]]:
    """The statements that count jobs (``count(`` over ``jobs``) run inside the block."""
    seen: list[str] = []

    def statement(conn: Any, cursor: Any, sql: str, *_: Any) -> None:
        if "count(" in sql.lower() and "from jobs" in sql.lower():
            seen.append(sql)

    event.listen(c.db.engine, "before_cursor_execute", statement)
    try:
        yield seen
    finally:
        event.remove(c.db.engine, "before_cursor_execute", statement)


def _scrape(metrics: Metrics) -> dict[Any, float]:
    return parse(generate_latest(metrics.registry).decode())


def _stored(c: AdmissionController, owner: str | None = None) -> dict[str, int]:
    """Jobs per state, counted straight from the store."""
    query = select(JobRow.state, func.count()).group_by(JobRow.state)
    if owner is not None:
        query = query.where(JobRow.submitter == owner)
    with c.db.session() as session:
        return {**dict.fromkeys(STATES, 0), **{s: int(n) for s, n in session.execute(query)}}


def test_scrapes_and_overviews_share_one_count_within_its_age(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second scrape, an operator's overview and a submitter's second overview within
    the age run no count: a long history cost a full count of the jobs at each (0.5 s
    per scrape and 60-90 ms per overview at 10^6 jobs, bench/history_scale.py)."""
    monkeypatch.setattr(metrics_module, "SCRAPE_INTERVAL", 0.0)  # every scrape reads
    c, _ = retention_controller(tmp_path, keep_days=0)
    try:
        asyncio.run(c.submit({"id": "a1", **SPEC}, by="alice"))
        asyncio.run(c.submit({"id": "b1", **CHEAP}, by="bob"))
        metrics, data = Metrics(c), ConsoleData(c)
        stored, alices = _stored(c), _stored(c, "alice")
        with counting(c) as seen:
            first = _scrape(metrics)
            assert len(seen) == 1
            second = _scrape(metrics)
            overview = asyncio.run(data.overview(OPERATOR))
            assert len(seen) == 1, seen  # the scrape's count, shared
            assert value(second, "oasis_jobs", state="admitted") == 1
            assert value(second, "oasis_jobs", state="rejected") == 1
            moving = ("process_", "oasis_ledger_metrics_age", "oasis_decision_step")

            def steady(scrape: dict[Any, Any]) -> dict[Any, Any]:  # the clocks move on
                return {k: v for k, v in scrape.items() if not str(k[0]).startswith(moving)}

            assert steady(second) == steady(first)
            assert overview["jobs"] == stored
            assert overview["jobs_age_seconds"] <= overview["jobs_max_age_seconds"]
            own = asyncio.run(data.overview(ALICE))
            assert len(seen) == 2, seen  # a submitter's own count
            assert own["jobs"] == alices and own["jobs"]["admitted"] == 1
            assert asyncio.run(data.overview(ALICE))["jobs"] == own["jobs"]
            assert len(seen) == 2
    finally:
        c.close()


def test_the_counts_follow_the_store_once_their_age_is_past(tmp_path: Path) -> None:
    """Within the age an answer may be stale by the changes since its count; past it,
    the next reader gets the store's counts and payoffs, exactly."""
    c, _ = retention_controller(tmp_path, keep_days=0)
    now = [100.0]
    c.job_counts.clock = lambda: now[0]
    try:
        asyncio.run(c.submit({"id": "a1", **SPEC}, by="alice"))
        metrics = Metrics(c)
        before = c.job_counts.read()
        assert before.jobs == _stored(c) and before.max_age >= MIN_AGE_SECONDS
        answer = asyncio.run(c.submit({"id": "a2", **SPEC}, by="alice"))
        asyncio.run(c.cancel("alice:a1"))  # the job's key (controller.job_keys)
        asyncio.run(c.submit({"id": "b1", **CHEAP}, by="bob"))
        now[0] += before.max_age - 0.01
        assert c.job_counts.read() is before  # still within its age
        now[0] += 0.02
        after = c.job_counts.read()
        assert after.jobs == _stored(c) != before.jobs
        assert after.jobs["cancelled"] == 1 and after.jobs["rejected"] == 1
        with c.db.session() as session:
            payoffs = {j: p for j, p in session.execute(select(JobRow.id, JobRow.payoff))}
        assert after.payoff["cancelled"] == pytest.approx(payoffs["alice:a1"])
        assert after.payoff["admitted"] == pytest.approx(answer.decision.payoff)
        assert set(after.payoff) == {"admitted", "running", "completed", "cancelled", "failed"}
        scraped = _scrape(metrics)
        assert value(scraped, "oasis_jobs", state="cancelled") == 1
        assert value(scraped, "oasis_payoff", state="cancelled") == pytest.approx(
            payoffs["alice:a1"]
        )
        assert ("oasis_payoff", (("state", "rejected"),)) not in scraped
        assert value(scraped, "oasis_jobs_counted_timestamp_seconds") == after.counted_at
        assert value(scraped, "oasis_jobs_count_seconds") == after.seconds
        overview = asyncio.run(ConsoleData(c).overview(OPERATOR))
        assert overview["jobs"] == after.jobs
        assert overview["jobs_age_seconds"] == 0.0
        assert overview["jobs_max_age_seconds"] == round(after.max_age, 3)
    finally:
        c.close()
