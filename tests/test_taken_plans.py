"""Whether a server's agent took the plan that carried a job there
(controller/plane/taken_plans.py): a job nobody reported on fails at its plan's end,
naming the servers whose agent follows an older plan than the first that carried it
there (``agents_behind_their_plan``), and completes where every agent took it."""

from __future__ import annotations

from controller.plane.plan_messages import Plan, SlotPlan, Task
from controller.plane.taken_plans import TakenPlans


def _plan(server: str, epoch: int, *tasks: Task, following: tuple[Task, ...] = ()) -> Plan:
    return Plan(server, "worker", epoch, 60.0, 5.0, False,
                SlotPlan(1, 60.0, list(tasks)), SlotPlan(2, 120.0, list(following)))  # fmt: skip


def test_an_agent_following_the_plan_that_carried_a_job_took_it_and_an_older_did_not() -> None:
    """The mutation audit: "below the first epoch" read as "at or below" (every agent
    following exactly the plan that carried the job counted as behind, and the job
    failed though it ran), and the highest epoch said replaced by the latest (a
    heartbeat delayed past a newer one undid it), both passed every test."""
    taken = TakenPlans()
    job = Task("j", 2, 0, 0.5, 10)
    taken.carried([_plan("w0", 3, job), _plan("w1", 3), _plan("w2", 4, following=(job,))])
    taken.carried([_plan("w0", 5, job), _plan("w1", 5, job)])  # w0: still epoch 3's
    assert taken.first["j"] == {"w0": 3, "w2": 4, "w1": 5}
    taken.follows("w0", 3)  # exactly the plan that carried it: taken
    taken.follows("w1", 4)  # older than the plan that carried it there: not taken
    taken.follows("w2", 5)
    assert taken.not_taken("j", ["w0", "w1", "w2", "w3"]) == ["w1"]
    taken.follows("w2", 2)  # a beat of an older plan, heard after the newer one
    assert taken.followed["w2"] == 5
    assert taken.not_taken("j", ["w2"]) == []
    taken.follows("w1", 5)
    assert taken.not_taken("j", ["w0", "w1", "w2"]) == []
    taken.forget({"other"})
    assert taken.not_taken("j", ["w1"]) == [] and "j" not in taken.first


def test_a_plan_giving_a_job_nothing_on_a_server_does_not_carry_it_there() -> None:
    taken = TakenPlans()
    taken.carried(
        [_plan("w0", 1, Task("j", 0, 0, 0.5, 10)), _plan("w1", 2, Task("j", 0, 1, 0.5, 10))]
    )
    assert taken.first == {"j": {"w1": 2}}
