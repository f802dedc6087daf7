"""Conversions between protobuf messages and the plain values the domain uses.

Protobuf stays at the edge: the controller sees dicts (job specs in the trace format)
and views, never messages.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from controller.clock import SlotTimes
from controller.jobspec import for_display, read_json
from controller.rpc import oasis_pb2 as pb
from pricing.errors import SpecError

if TYPE_CHECKING:  # the CLI needs none of these (SQLAlchemy, numba, scipy)
    from controller.admission import DecisionView, JobView
    from controller.events import Event
    from controller.plane.execution import ProgressView
    from pricing.runtime_estimate import Interval

__all__ = [
    "SERVER_KINDS",
    "STATE_NAMES",
    "bounds_to_proto",
    "decision_to_proto",
    "event_to_proto",
    "job_to_proto",
    "progress_to_proto",
    "spec_from_proto",
    "spec_to_proto",
]

STATE_NAMES = {
    "admitted": pb.JOB_STATE_ADMITTED,
    "running": pb.JOB_STATE_RUNNING,
    "completed": pb.JOB_STATE_COMPLETED,
    "cancelled": pb.JOB_STATE_CANCELLED,
    "rejected": pb.JOB_STATE_REJECTED,
    "failed": pb.JOB_STATE_FAILED,
    "pending": pb.JOB_STATE_PENDING,
    "expired": pb.JOB_STATE_EXPIRED,
}
STATE_OF = {v: k for k, v in STATE_NAMES.items()}
SERVER_KINDS = {"worker": pb.SERVER_KIND_WORKER, "ps": pb.SERVER_KIND_PS}

_SCALARS = ("epochs", "chunks", "minibatches", "tau", "grad_mb")
_UTILITY_FIELDS = {
    "sigmoid": ("priority", "decay", "target"),
    "deadline": ("value", "deadline", "half_life"),
}
_CORE_KEYS = frozenset({"id", *_SCALARS, "worker", "ps", "utility"})


def spec_from_proto(msg: pb.JobSpec) -> dict[str, Any]:
    """A JobSpec as a job object: its ``json`` read, or the typed fields in the trace
    format (fields left unset stay absent, for the parser to name).

    Raises:
        SpecError: ``json`` that is not a JSON object, or ``json`` with typed fields.
    """
    if msg.json:
        typed = [f.name for f, _ in msg.ListFields() if f.name not in ("id", "json")]
        if typed:
            raise SpecError.one(f"job.{typed[0]}", "give the typed fields or json, not both")
        given = read_json(msg.json)
        if msg.id and given.get("id", msg.id) != msg.id:
            raise SpecError.one("job.id", f"is {msg.id!r} but json has {given.get('id')!r}")
        return given if not msg.id else {**given, "id": msg.id}
    spec: dict[str, Any] = {"id": msg.id}
    for name in _SCALARS:
        if msg.HasField(name):
            spec[name] = getattr(msg, name)
    spec["worker"] = dict(msg.worker)
    spec["ps"] = dict(msg.ps)
    if msg.HasField("utility"):
        kind = msg.utility.WhichOneof("kind")
        if kind in _UTILITY_FIELDS:
            sub = getattr(msg.utility, kind)
            spec["utility"] = {"kind": kind} | {
                k: getattr(sub, k) for k in _UTILITY_FIELDS[kind] if sub.HasField(k)
            }
        elif kind == "table":
            spec["utility"] = {"kind": "table", "values": list(msg.utility.table.values)}
        else:
            spec["utility"] = {}
    return spec


def spec_to_proto(spec: dict[str, Any]) -> pb.JobSpec:
    """A job object in SPEC 3's form (time in slots) as typed JobSpec fields. Raises
    ValueError naming a field that cannot be carried (the server validates the rest);
    send anything else as ``JobSpec(json=...)``."""
    msg = pb.JobSpec(id=str(spec.get("id", "")))
    for name in _SCALARS:
        if name in spec:
            try:
                setattr(msg, name, spec[name])
            except (TypeError, ValueError) as err:
                raise ValueError(f"job.{name}: {err}") from err
    for side in ("worker", "ps"):
        for key, value in (spec.get(side) or {}).items():
            try:
                getattr(msg, side)[key] = float(value)
            except (TypeError, ValueError) as err:
                raise ValueError(f"job.{side}.{key}: must be a number") from err
    utility = spec.get("utility")
    if isinstance(utility, dict):
        kind = utility.get("kind")
        if kind in _UTILITY_FIELDS:
            sub = getattr(msg.utility, kind)
            for key in _UTILITY_FIELDS[kind]:
                if key in utility:
                    try:
                        setattr(sub, key, float(utility[key]))
                    except (TypeError, ValueError) as err:
                        raise ValueError(f"job.utility.{key}: must be a number") from err
            sub.SetInParent()
        elif kind == "table":
            msg.utility.table.values.extend(float(v) for v in utility.get("values", []))
            msg.utility.table.SetInParent()
        else:
            raise ValueError(f"job.utility.kind: unknown utility kind {kind!r}")
    return msg


def _stored_spec_to_proto(spec: dict[str, Any], times: SlotTimes) -> pb.JobSpec:
    """A stored spec for a response: ``json`` always (times shown as times), the typed
    fields too when the spec is in SPEC 3's form."""
    msg = pb.JobSpec(id=str(spec.get("id", "")))
    utility = spec.get("utility")
    core = set(spec) <= _CORE_KEYS and (
        not isinstance(utility, dict)
        or all(isinstance(v, int | float) for k, v in utility.items() if k != "kind")
        or utility.get("kind") == "table"
    )
    if core:
        try:
            msg = spec_to_proto(spec)
        except ValueError:
            msg = pb.JobSpec(id=str(spec.get("id", "")))
    msg.json = json.dumps(for_display(spec, times), sort_keys=True)
    return msg


def decision_to_proto(view: DecisionView) -> pb.Decision:
    msg = pb.Decision(
        admitted=view.admitted,
        arrival_slot=view.arrival_slot,
        work=view.work,
        reason=view.reason,
        decision_ms=view.decision_ms,
    )
    for name in ("payoff", "cost", "utility"):
        value = getattr(view, name)
        if value is not None:
            setattr(msg, name, value)
    for name in ("completion_slot", "jct"):
        value = getattr(view, name)
        if value is not None:
            setattr(msg, name, value)
    for a in view.allocations:
        msg.allocations.add(
            slot=a["slot"], server=a["server"], workers=a.get("workers", 0), ps=a.get("ps", 0)
        )
    for d in view.drivers:
        msg.price_drivers.add(**d)
    return msg


def job_to_proto(view: JobView, times: SlotTimes) -> pb.Job:
    """A stored job; ``times`` shows the times in its spec as times."""
    msg = pb.Job(
        spec=_stored_spec_to_proto(view.spec, times),
        state=STATE_NAMES.get(view.state, pb.JOB_STATE_UNSPECIFIED),
        decision=decision_to_proto(view.decision),
        submitted_slot=view.submitted_slot,
        sequence=view.sequence,
    )
    if view.wait_until_slot is not None:
        msg.wait_until_slot = view.wait_until_slot
    return msg


def bounds_to_proto(view: dict[str, Any]) -> pb.GetBoundsResponse:
    """The bounds ``oasis bounds`` shows (:mod:`controller.admission.bounds`)."""
    out = pb.GetBoundsResponse(
        mode=view["mode"],
        method=view["method"],
        jobs=view["jobs"],
        prior=view["prior"],
        prior_share=view["prior_share"],
        units=view["units"],
        pins=json.dumps(view["pins"], sort_keys=True),
    )
    shown = {(row["kind"], row["resource"]) for row in view["bounds"]}
    for voter in view.get("submitters", ()):
        added = out.submitters.add(
            name=voter["name"], jobs=voter["jobs"], prior_share=voter["prior_share"]
        )
        how = "prior" if voter["jobs"] == 0 else "observed"
        for kind, per in voter.get("bounds", {}).items():
            for resource, pair in per.items():
                if pair is not None and (kind, resource) in shown:  # as the bounds in use
                    added.bounds.add(kind=SERVER_KINDS[kind], resource=resource,
                                     upper=pair["U"], lower=pair["L"], how=how)  # fmt: skip
    for row in view["bounds"]:
        out.bounds.add(
            kind=SERVER_KINDS[row["kind"]],
            resource=row["resource"],
            upper=row["U"],
            lower=row["L"],
            how=row["how"],
        )
    return out


def event_to_proto(event: Event) -> pb.Event:
    return pb.Event(
        sequence=event.sequence,
        kind=event.kind,
        job_id=event.job_id,
        slot=event.slot,
        state=STATE_NAMES.get(event.state, pb.JOB_STATE_UNSPECIFIED),
        detail=json.dumps(event.detail, sort_keys=True),
    )


def progress_to_proto(view: ProgressView) -> pb.JobProgress:
    """A job's progress and runtime estimate (the execution plane)."""

    def estimate(i: Interval) -> pb.Estimate:
        return pb.Estimate(mean=i.mean, low=i.low, high=i.high, level=i.level)

    return pb.JobProgress(
        id=view.job_id,
        state=STATE_NAMES.get(view.state, pb.JOB_STATE_UNSPECIFIED),
        minibatches_done=view.minibatches_done,
        minibatches_total=view.minibatches_total,
        worker_seconds=view.worker_seconds,
        reports=view.reports,
        planned_minibatch_seconds=view.planned_minibatch_seconds,
        minibatch_seconds=estimate(view.minibatch_seconds),
        total_worker_seconds=estimate(view.total_worker_seconds),
        planned_worker_seconds=view.planned_worker_seconds,
        completion_slot=view.completion_slot,
        worker_failures=[
            pb.WorkerFailures(server=f.server, failures=f.failures,
                              last_failure=f.last_failure, seconds_ago=f.seconds_ago)
            for f in view.worker_failures
        ],
    )  # fmt: skip
