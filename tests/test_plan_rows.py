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


def test_a_row_over_capacity_is_the_later_decided_one_and_takes_no_room(
    daemon: PlaneDaemon,
) -> None:
    """The mutation audit: rows read in no set order (job ids ``a``.. before ``z``..
    in the store's key), or a row left out over capacity still counted as used, passed
    every test. A hand edit that puts a job on a full server then left out the job
    decided first (what the ledger placed), or a job after it that fits: another
    tenant's workers not run. Now the rows come in decision order; the one over
    capacity is left out and takes no room. The edited row is one worker over (the audit
    of 2026-12-03: a slack of a whole unit, not ``CAPACITY_SLACK``, passed with two)."""
    from sqlalchemy import delete

    from controller.store import AllocationRow

    spec = {**PlaneDaemon.SPEC, "chunks": 4}
    for job_id in ("z-first", "a-edited", "b-after"):
        view = asyncio.run(daemon.c.submit({"id": job_id, **spec}))
        assert view.decision.admitted, job_id
    daemon.clock.advance(daemon.config.slot_seconds)
    with daemon.c.db.session() as session:  # w0 has 4 GPUs, a worker takes 1
        session.execute(delete(AllocationRow).where(AllocationRow.slot == 1))
        session.add_all(
            [
                AllocationRow(job_id="a-edited", slot=1, server="w0", workers=3, ps=0),
                AllocationRow(job_id="b-after", slot=1, server="w0", workers=2, ps=0),
                AllocationRow(job_id="z-first", slot=1, server="w0", workers=2, ps=0),
            ]
        )  # fmt: skip  (stored in another order than decided)
        session.commit()
    [w0] = [p for p in daemon.ex.plans_sync({}) if p.server == "w0"]
    assert [(t.job, t.workers) for t in w0.current.tasks] == [("z-first", 2), ("b-after", 2)]


def test_a_job_completed_early_in_its_slot_leaves_the_plans_at_once(daemon: PlaneDaemon) -> None:
    """The mutation audit: plans built from the rows of every job but a cancelled one
    passed every test; a job whose agents reported its last mini-batch mid-slot (its
    tenant told it completed, its GPUs free for the next decisions) was still sent to
    its agents, planned in the slots that followed."""
    from controller.plane.agent_messages import Progress, TaskProgress

    daemon.submit("done")
    daemon.submit("kept")
    daemon.clock.advance(daemon.config.slot_seconds)  # their first slot
    assert _jobs_in(daemon.ex.plans_sync({})) == {"done", "kept"}
    daemon.ex.report(Progress("w0", "a", [TaskProgress("done", daemon.TOTAL, 200.0)]))
    assert [e.kind for e in daemon.ex.review_sync()] == ["completed"]
    assert daemon.state("done") == "completed"
    assert _jobs_in(daemon.ex.plans_sync({})) == {"kept"}


def test_a_ps_row_edited_onto_a_worker_server_is_left_out(daemon: PlaneDaemon) -> None:
    """The mutation audit: with the check of PS on a worker server dropped, every test
    passed (only workers on a PS server were tried). A hand edit that gave a job PS on
    a worker server sent them to its agent, whose capacity check counts workers only
    there. A single PS (the check read as "more than one", 2026-12-03) as well."""
    from sqlalchemy import update

    from controller.store import AllocationRow

    daemon.submit("edited")
    daemon.submit("kept")
    daemon.clock.advance(daemon.config.slot_seconds)
    with daemon.c.db.session() as session:
        session.execute(
            update(AllocationRow)
            .where(AllocationRow.job_id == "edited", AllocationRow.server == "w0")
            .values(ps=1)
        )
        session.commit()
    [w0] = [p for p in daemon.ex.plans_sync({}) if p.server == "w0"]
    assert {t.job for t in w0.current.tasks} == {"kept"}


def test_each_slot_of_a_plan_starts_when_its_slot_does(daemon: PlaneDaemon) -> None:
    """The mutation audit: with the next slot's ``starts_at`` given as the current
    one's, every unit test passed; an agent would take the next slot's tasks as due
    now (the daemon's epoch 0 here, slots of ``slot_seconds``)."""
    daemon.submit("j")
    daemon.clock.advance(3 * daemon.config.slot_seconds)
    seconds = daemon.config.slot_seconds
    for plan in daemon.ex.plans_sync({}):
        assert (plan.current.slot, plan.next.slot) == (3, 4), plan.server
        assert (plan.current.starts_at, plan.next.starts_at) == (3 * seconds, 4 * seconds)


def test_a_server_declared_failed_has_its_plan_sent_again_saying_so(daemon: PlaneDaemon) -> None:
    """The mutation audit: with ``down`` left out of what makes a plan differ from the
    one published, every test passed (a failure re-places jobs too, so the plan changed
    anyway); a failed server whose tasks stood still kept a plan that said it was up."""
    daemon.clock.advance(daemon.config.slot_seconds)
    published = {p.server: p for p in daemon.ex.plans_sync({})}
    assert not any(p.down for p in published.values())
    daemon.ex.failed["w0"] = daemon.mono[0]
    changed = daemon.ex.plans_sync(published)
    assert [(p.server, p.down) for p in changed] == [("w0", True)]
