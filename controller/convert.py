"""Conversions between protobuf messages and the plain values the domain uses.

Protobuf stays at the edge: the controller sees dicts (job specs in the trace format)
and views, never messages.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from controller.admission import DecisionView, JobView
from controller.events import Event
from controller.rpc import oasis_pb2 as pb

if TYPE_CHECKING:  # the execution plane loads scipy; the CLI never needs it
    from controller.plane.execution import ProgressView
    from pricing.runtime_estimate import Interval

__all__ = [
    "SERVER_KINDS",
    "STATE_NAMES",
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


def spec_from_proto(msg: pb.JobSpec) -> dict[str, Any]:
    """A JobSpec as the trace format's job object (fields left unset stay absent)."""
    spec: dict[str, Any] = {"id": msg.id}
    for name in _SCALARS:
        if msg.HasField(name):
            spec[name] = getattr(msg, name)
    spec["worker"] = dict(msg.worker)
    spec["ps"] = dict(msg.ps)
    if msg.HasField("utility"):
        kind = msg.utility.WhichOneof("kind")
        if kind == "sigmoid":
            sig = msg.utility.sigmoid
            spec["utility"] = {"kind": "sigmoid"} | {
                k: getattr(sig, k) for k in ("priority", "decay", "target") if sig.HasField(k)
            }
        elif kind == "table":
            spec["utility"] = {"kind": "table", "values": list(msg.utility.table.values)}
        else:
            spec["utility"] = {}
    return spec


def spec_to_proto(spec: dict[str, Any]) -> pb.JobSpec:
    """A trace-format job object as a JobSpec. Raises ValueError naming a field that
    cannot be carried (the server validates everything else)."""
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
        if kind == "sigmoid":
            for key in ("priority", "decay", "target"):
                if key in utility:
                    setattr(msg.utility.sigmoid, key, float(utility[key]))
            msg.utility.sigmoid.SetInParent()
        elif kind == "table":
            msg.utility.table.values.extend(float(v) for v in utility.get("values", []))
            msg.utility.table.SetInParent()
        else:
            raise ValueError(f"job.utility.kind: unknown utility kind {kind!r}")
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


def job_to_proto(view: JobView) -> pb.Job:
    msg = pb.Job(
        spec=spec_to_proto(view.spec),
        state=STATE_NAMES[view.state],
        decision=decision_to_proto(view.decision),
        submitted_slot=view.submitted_slot,
        sequence=view.sequence,
    )
    if view.wait_until_slot is not None:
        msg.wait_until_slot = view.wait_until_slot
    return msg


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
        state=STATE_NAMES[view.state],
        minibatches_done=view.minibatches_done,
        minibatches_total=view.minibatches_total,
        worker_seconds=view.worker_seconds,
        reports=view.reports,
        planned_minibatch_seconds=view.planned_minibatch_seconds,
        minibatch_seconds=estimate(view.minibatch_seconds),
        total_worker_seconds=estimate(view.total_worker_seconds),
        planned_worker_seconds=view.planned_worker_seconds,
        completion_slot=view.completion_slot,
    )
