"""The protobuf edge (``controller/convert.py``): what a client's typed fields become, what
the daemon sends back, field by field, with nothing lost, added or swapped."""

from __future__ import annotations

import pytest

from controller.admission import DecisionView, JobView
from controller.clock import SlotTimes
from controller.convert import (
    bounds_to_proto,
    decision_to_proto,
    job_to_proto,
    spec_from_proto,
    spec_to_proto,
)
from controller.rpc import oasis_pb2 as pb
from pricing.errors import SpecError

TIMES = SlotTimes(1_767_225_600.0, 3600.0)


def _decision(**given: object) -> DecisionView:
    view = {"admitted": True, "payoff": 1.5, "cost": 0.5, "completion_slot": 9, "jct": 4,
            "utility": 2.0, "arrival_slot": 5, "work": 12, "allocations": []}  # fmt: skip
    return DecisionView(**(view | given))  # type: ignore[arg-type]


def test_a_json_spec_naming_another_id_than_the_request_is_refused() -> None:
    """The id the client gave and the one in its json must agree: neither is taken over
    the other in silence (the job would be stored, and answered, under a name the client
    did not mean)."""
    with pytest.raises(SpecError, match=r"job\.id: is 'x' but json has 'y'"):
        spec_from_proto(pb.JobSpec(id="x", json='{"id": "y", "epochs": 1}'))
    assert spec_from_proto(pb.JobSpec(id="x", json='{"id": "x"}')) == {"id": "x"}
    assert spec_from_proto(pb.JobSpec(json='{"id": "y"}')) == {"id": "y"}


def test_typed_utility_fields_left_unset_stay_absent() -> None:
    """An unset field is left for the parser's default (or its error), not read as 0:
    a sigmoid's target of 0 slots, a deadline of slot 0, would price another job."""
    msg = pb.JobSpec(id="a", utility=pb.Utility(sigmoid=pb.SigmoidUtility(priority=2.0)))
    assert spec_from_proto(msg)["utility"] == {"kind": "sigmoid", "priority": 2.0}
    msg = pb.JobSpec(id="a", utility=pb.Utility(deadline=pb.DeadlineUtility(value=3.0)))
    assert spec_from_proto(msg)["utility"] == {"kind": "deadline", "value": 3.0}
    # a utility given with no kind is a utility the parser refuses, not no utility (the
    # default one, which the client did not ask for)
    msg = pb.JobSpec(id="a")
    msg.utility.SetInParent()
    assert spec_from_proto(msg)["utility"] == {}
    assert "utility" not in spec_from_proto(pb.JobSpec(id="a"))


def test_a_utility_of_only_its_kind_is_sent_with_that_kind() -> None:
    """``oasis submit`` of a job whose utility gives its kind alone (the defaults for the
    rest) sends that kind: an empty sub-message sets no oneof unless marked present."""
    for kind in ("sigmoid", "deadline", "table"):
        msg = spec_to_proto({"id": "a", "utility": {"kind": kind}})
        assert msg.utility.WhichOneof("kind") == kind
        assert spec_from_proto(msg)["utility"]["kind"] == kind
    with pytest.raises(ValueError, match=r"job\.utility\.kind: unknown utility kind 'step'"):
        spec_to_proto({"id": "a", "utility": {"kind": "step", "value": 1}})


def test_a_decision_of_zero_keeps_its_zeros_and_its_allocations_sides() -> None:
    """A payoff, cost or utility of 0 is a value (the client shows 0), not one left
    unset (shown as 'nothing fits'); and each allocation's workers and PS are each
    where they were planned."""
    msg = decision_to_proto(_decision(
        payoff=0.0, cost=0.0, utility=0.0, completion_slot=0, jct=0,
        allocations=[{"slot": 6, "server": "s1", "workers": 3, "ps": 1},
                     {"slot": 6, "server": "p1", "ps": 2}],
    ))  # fmt: skip
    for name in ("payoff", "cost", "utility", "completion_slot", "jct"):
        assert msg.HasField(name) and getattr(msg, name) == 0, name
    assert [(a.slot, a.server, a.workers, a.ps) for a in msg.allocations] == [
        (6, "s1", 3, 1),
        (6, "p1", 0, 2),
    ]
    unset = dict.fromkeys(("payoff", "cost", "utility", "completion_slot", "jct"))
    empty = decision_to_proto(_decision(admitted=False, **unset))
    assert not any(empty.HasField(n) for n in ("payoff", "cost", "utility", "completion_slot"))


def test_a_job_waiting_until_slot_0_says_so() -> None:
    spec = {"id": "w", "epochs": 1}
    view = JobView("w", spec, "pending", _decision(admitted=False), 0, 1, wait_until_slot=0)
    msg = job_to_proto(view, TIMES)
    assert msg.HasField("wait_until_slot") and msg.wait_until_slot == 0
    assert msg.state == pb.JOB_STATE_PENDING
    view = JobView("w", spec, "expired", _decision(admitted=False), 0, 1)
    msg = job_to_proto(view, TIMES)
    assert not msg.HasField("wait_until_slot") and msg.state == pb.JOB_STATE_EXPIRED


def test_bounds_as_sent_keep_upper_and_lower_and_each_submitters_own() -> None:
    """``oasis bounds``: each bound's U and L where they belong; a submitter with no job
    of its own votes its prior (one job is observed); and a submitter's bound is sent only
    for a resource the cluster's bounds show."""
    view = {
        "mode": "estimate", "method": "m", "jobs": 3, "prior": "none", "prior_share": 0.25,
        "units": "u", "pins": {},
        "bounds": [{"kind": "worker", "resource": "gpu", "U": 5.0, "L": 0.1, "how": "observed"}],
        "submitters": [
            {"name": "alice", "jobs": 1, "prior_share": 0.5,
             "bounds": {"worker": {"gpu": {"U": 4.0, "L": 0.2}, "cpu": {"U": 9.0, "L": 1.0}}}},
            {"name": "bob", "jobs": 0, "prior_share": 1.0,
             "bounds": {"worker": {"gpu": {"U": 6.0, "L": 0.3}}}},
        ],
    }  # fmt: skip
    out = bounds_to_proto(view)
    assert [(b.kind, b.resource, b.upper, b.lower, b.how) for b in out.bounds] == [
        (pb.SERVER_KIND_WORKER, "gpu", 5.0, 0.1, "observed")
    ]
    got = {
        v.name: [(b.resource, b.upper, b.lower, b.how) for b in v.bounds] for v in out.submitters
    }
    assert got == {"alice": [("gpu", 4.0, 0.2, "observed")], "bob": [("gpu", 6.0, 0.3, "prior")]}
