"""A job whose plan ends before its agents report all its work: it stays running until
they report the rest (then completes, late) or fails once they have had
``heartbeat_timeout`` seconds after the slot boundary; a job nobody reported on
completes with its plan, as without the plane.

The admission controller and the execution plane's daemon side run in-process
(``tests.test_mqtt_units.PlaneDaemon``: SQLite, fake clocks, no broker).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.plane.topics import Progress, TaskProgress
from tests.test_mqtt_units import PlaneDaemon

TOTAL = PlaneDaemon.TOTAL


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[PlaneDaemon]:
    d = PlaneDaemon(tmp_path)
    d.c.execution = d.ex  # as oasisd wires it: the slot clock asks the plane
    try:
        yield d
    finally:
        d.c.close()


def _past_plan(d: PlaneDaemon, view: Any) -> int:
    """Move the slot clock to the slot after ``view``'s plan; that slot."""
    after = int(view.decision.completion_slot) + 1
    d.clock.advance(after * d.config.slot_seconds)
    asyncio.run(d.c.tick())
    assert d.c.slot == after
    return after


def _report(d: PlaneDaemon, job_id: str, minibatches: float) -> None:
    d.ex.report(Progress("w0", "a", [TaskProgress(job_id, minibatches, minibatches * 60.0)]))


def test_a_job_nobody_reported_on_completes_with_its_plan(daemon: PlaneDaemon) -> None:
    _past_plan(daemon, daemon.submit("quiet"))
    assert daemon.state("quiet") == "completed"


def test_the_rest_reported_after_the_plan_ended_completes_it_late(daemon: PlaneDaemon) -> None:
    view = daemon.submit("j")
    _report(daemon, "j", 12.0)
    assert daemon.ex.review_sync() == []
    after = _past_plan(daemon, view)
    assert daemon.state("j") == "running"  # 12 of 20 reported: not done
    assert daemon.ex.review_sync() == []  # within heartbeat_timeout of the boundary
    _report(daemon, "j", float(TOTAL))
    events = daemon.ex.review_sync()
    assert [e.kind for e in events] == ["completed"]
    assert daemon.state("j") == "completed"
    late = daemon.c._get_sync("j").decision
    assert (late.completion_slot, late.jct) == (after, after - view.decision.arrival_slot + 1)


def test_silence_after_the_plan_ended_short_fails_the_job(daemon: PlaneDaemon) -> None:
    view = daemon.submit("k")
    _report(daemon, "k", 5.0)
    daemon.ex.review_sync()
    _past_plan(daemon, view)
    assert daemon.state("k") == "running"
    assert daemon.ex.review_sync() == []
    daemon.clock.advance(daemon.ex.mqtt.heartbeat_timeout + 1.0)
    events = daemon.ex.review_sync()
    assert [(e.kind, e.state) for e in events] == [("failed", "failed")]
    detail = events[0].detail
    assert detail["reason"] == "plan_ended"
    assert (detail["minibatches"], detail["of"]) == (5.0, TOTAL)
    assert daemon.state("k") == "failed"
    assert daemon.ex.review_sync() == []  # failed once
