"""The reason stored with a failed job (``controller/failed_reasons.py``), as its
submitter reads it with ``oasis job``: each kind of ``failed`` event's detail in words,
bounded. The daemon tests check a reason or two whole; these pin the wording's edges.
The mutation audit: the one-slot/many-slots wording inverted, a single slot written as
a run ("3-3"), every agent listed however many, an empty list said as "the agent of ,",
and a long plan-ended reason left unbounded passed every test."""

from __future__ import annotations

from controller.failed_reasons import MAX_REASON, failed_reason


def _ended(**more: object) -> dict[str, object]:
    return {"reason": "plan_ended", "completion_slot": 9, "minibatches": 5, "of": 20, **more}


def test_slots_never_sent_are_said_as_one_slot_or_as_runs() -> None:
    one = failed_reason(_ended(reason="plan_not_sent", not_sent_slots=[[3, 3]]))
    assert "; the plan of slot 3 never reached its agents" in one, one
    runs = failed_reason(_ended(reason="plan_not_sent", not_sent_slots=[[2, 4], [7, 7]]))
    assert "; the plans of slots 2-4, 7 never reached its agents" in runs, runs
    many = failed_reason(
        _ended(reason="plan_not_sent", not_sent_slots=[[s, s] for s in range(0, 14, 2)])
    )
    assert "slots 0, 2, 4, 6, 8 and 2 more runs never reached" in many, many


def test_the_agents_named_are_at_most_five_and_an_empty_list_says_nothing() -> None:
    servers = [f"w{i}" for i in range(7)]
    text = failed_reason(_ended(agents_never_heard=servers, agents_following_no_plan=[]))
    assert "; the agent of w0, w1, w2, w3, w4, ..., where its plan placed it, was never " in text
    assert "w5" not in text and "never had a plan" not in text, text
    assert failed_reason(_ended(agents_behind_their_plan=[])) == (
        "failed: its plan ended in slot 9 and its agents reported 5 of its 20 mini-batches"
    )


def test_a_reason_is_bounded_however_long_its_detail() -> None:
    failures = [{"failures": 3, "server": "w0", "last_failure": "x" * 5000}]
    ended = failed_reason(_ended(worker_failures=failures))
    assert ended.startswith("failed: its plan ended in slot 9") and len(ended) == MAX_REASON
    moved = failed_reason({"reason": "config_changed", "from_slot": 4, "why": "y" * 5000})
    assert moved.startswith("failed from slot 4: the cluster's configuration changed")
    assert len(moved) == MAX_REASON
