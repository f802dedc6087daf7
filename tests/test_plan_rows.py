"""Which stored rows go into the plans agents follow (controller/plane/plans.py): only
those of jobs still admitted or running. A job cancelled, completed early or failed in
the current slot keeps its rows of that slot in the store (what it held), but no agent
is told to run it any more (``tests.test_mqtt_units.PlaneDaemon``: SQLite, fake clocks,
no broker)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.plane.plan_messages import Plan
from tests.test_mqtt_units import PlaneDaemon


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[PlaneDaemon]:
    d = PlaneDaemon(tmp_path)
    try:
        yield d
    finally:
        d.c.close()


def _jobs_in(plans: list[Plan]) -> set[str]:
    return {t.job for p in plans for part in (p.current, p.next) for t in part.tasks}


def test_a_job_cancelled_in_its_slot_leaves_the_plans_at_once(daemon: PlaneDaemon) -> None:
    """The mutation audit: plans built from every stored row of the slot, whatever its
    job's state, passed every test; the agents ran a cancelled job (its tenant told it
    was stopped, its GPUs held) to the end of the slot."""
    daemon.submit("gone")
    daemon.submit("kept")
    daemon.clock.advance(daemon.config.slot_seconds)  # their first slot
    assert _jobs_in(daemon.ex.plans_sync({})) == {"gone", "kept"}
    asyncio.run(daemon.c.cancel("gone"))
    assert daemon.state("gone") == "cancelled"
    assert _jobs_in(daemon.ex.plans_sync({})) == {"kept"}
