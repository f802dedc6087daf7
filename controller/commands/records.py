"""What the client commands print: plain JSON records and wall-clock times for people.

JSON (``--json``) is plain: integers are numbers, states and kinds are words
(``"admitted"``, ``"worker"``), unset values are null, and a job's ``spec`` is the job
object in the form ``oasis submit`` reads, so ``oasis job ID --json | oasis quote -``
prices the same job again. Tables show each slot with the local time it begins.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from controller.clock import SlotTimes
from controller.rpc import oasis_pb2 as pb
from pricing.durations import format_duration, format_time

__all__ = [
    "ABANDONED",
    "STATES",
    "UNHEARD_NAMED",
    "agent_heard",
    "agent_record",
    "agents_unheard",
    "decision_record",
    "event_record",
    "heard_ago",
    "heard_record",
    "is_unheard",
    "job_record",
    "plain",
    "plan_of",
    "slot_label",
    "state_name",
    "unheard_line",
    "unheard_record",
]

STATES = tuple(
    n.removeprefix("JOB_STATE_").lower()
    for n in pb.JobState.keys()  # noqa: SIM118 - an enum wrapper, not a dict
    if n != "JOB_STATE_UNSPECIFIED"
)
ABANDONED = ("cancelled", "failed")
"""States of a job whose plan was not carried out: its decision's completion time and
utility were planned, never earned."""
_INTEGERS = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_SINT32,
}


UNHEARD_NAMED = 10
"""Servers named in the line on agents not heard (``oasis status``, the console's
overview); the rest are counted."""


def _heard_seconds(s: pb.Server) -> float | None:
    return s.agent_heard_seconds_ago if s.HasField("agent_heard_seconds_ago") else None


def heard_ago(seconds: float | None) -> str:
    """When an agent was last heard, ``seconds`` ago, for a table: ``5s ago``
    (``2h5m ago``: the two largest units), ``never`` (``inf``), or ``-`` (None: no agents
    watched: a daemon without ``[mqtt]``, a standby, or one older than the field). The
    one wording of ``oasis servers``, ``oasis status`` and the console."""
    if seconds is None:
        return "-"
    if not math.isfinite(seconds):
        return "never"
    unit = 3600 if seconds >= 86400 else 60 if seconds >= 3600 else 1
    return f"{format_duration(round(seconds / unit) * unit)} ago"


def heard_record(seconds: float | None) -> dict[str, Any]:
    """An agent heard ``seconds`` ago in JSON (which has no infinity): ``agent_heard``
    (false: never; null: no agents watched) and ``agent_heard_seconds_ago`` (null unless
    heard)."""
    if seconds is None:
        return {"agent_heard": None, "agent_heard_seconds_ago": None}
    if not math.isfinite(seconds):
        return {"agent_heard": False, "agent_heard_seconds_ago": None}
    return {"agent_heard": True, "agent_heard_seconds_ago": round(seconds, 3)}


def agent_heard(s: pb.Server) -> str:
    """When ``s``'s agent was last heard, for a table (:func:`heard_ago`)."""
    return heard_ago(_heard_seconds(s))


def agent_record(s: pb.Server) -> dict[str, Any]:
    """``s``'s agent in JSON (:func:`heard_record`)."""
    return heard_record(_heard_seconds(s))


def is_unheard(state: str, seconds: float | None, timeout: float) -> bool:
    """Whether a server in ``state`` (``""``: up) whose agent was heard ``seconds`` ago
    (None: not watched) is ``up`` (a cordon planned included) with its agent never
    heard, or silent past the heartbeat ``timeout`` (its failure not yet declared): it
    still gets plans, and the jobs planned there do not run."""
    return state in ("", "up") and seconds is not None and seconds > timeout


def agents_unheard(resp: pb.ListServersResponse) -> list[pb.Server] | None:
    """The servers of ``resp`` whose agent is not heard (:func:`is_unheard`), in its
    order. None: no agents watched."""
    if not resp.HasField("agent_heartbeat_timeout_seconds"):
        return None
    timeout = resp.agent_heartbeat_timeout_seconds
    return [s for s in resp.servers if is_unheard(s.state, _heard_seconds(s), timeout)]


def unheard_record(server: str, seconds: float | None) -> dict[str, Any]:
    """One server whose agent is not heard, as ``oasis status --json`` and the console's
    overview give it: ``server``, ``heard`` (:func:`heard_ago`) and ``heard_seconds_ago``
    (null: never heard)."""
    return {"server": server, "heard": heard_ago(seconds),
            "heard_seconds_ago": heard_record(seconds)["agent_heard_seconds_ago"]}  # fmt: skip


def unheard_line(unheard: Sequence[dict[str, Any]] | None) -> list[str]:
    """A line naming the servers up whose agent was never heard or is silent past the
    heartbeat timeout (:func:`unheard_record` each; before, only /metrics said so: the
    operator audit), at most :data:`UNHEARD_NAMED`, then how many more; none when
    there are none. They get plans, and the jobs planned there do not run until their
    plan ends. ``oasis status`` and the console's overview show it."""
    if not unheard:
        return []
    named = ", ".join(f"{u['server']} ({u['heard']})" for u in unheard[:UNHEARD_NAMED])
    more = f" and {len(unheard) - UNHEARD_NAMED:,} more" if len(unheard) > UNHEARD_NAMED else ""
    servers = "server" if len(unheard) == 1 else "servers"
    return [f"AGENTS NOT HEARD on {len(unheard):,} {servers} up, still planned on (jobs "
            f"there do not run): {named}{more}"]  # fmt: skip


def state_name(state: int) -> str:
    """``JOB_STATE_ADMITTED`` -> ``"admitted"``."""
    return pb.JobState.Name(state).removeprefix("JOB_STATE_").lower()


def _enum_word(field: Any, number: int) -> str | None:
    enum = field.enum_type
    value = enum.values_by_number.get(number)
    if value is None or value.number == 0:
        return None
    prefix = "".join(f"_{c}" if c.isupper() else c.upper() for c in enum.name).lstrip("_")
    return str(value.name).removeprefix(prefix + "_").lower()


def _scalar(field: Any, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return plain(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return _enum_word(field, value)
    if field.type in _INTEGERS:
        return int(value)
    return value


def plain(msg: Message) -> dict[str, Any]:
    """A message as plain JSON values (see the module docstring): every field, by its
    proto name; a field with presence that is unset is None."""
    out: dict[str, Any] = {}
    field: Any  # the descriptor classes of protobuf's two implementations
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _scalar(value_field, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_scalar(field, v) for v in value]
        elif field.has_presence and not msg.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _scalar(field, value)
    return out


def decision_record(d: pb.Decision, times: SlotTimes | None) -> dict[str, Any]:
    """A decision: allocations as in SPEC 6 (``workers`` or ``ps``), and with the slot
    clock the UTC times it arrives and completes by."""
    out = plain(d)
    out["allocations"] = [
        {"slot": a.slot, "server": a.server, **({"workers": a.workers} if a.workers else {}),
         **({"ps": a.ps} if a.ps else {})}
        for a in d.allocations
    ]  # fmt: skip
    if times is not None:
        out["arrives_at"] = format_time(times.start(d.arrival_slot))
        done = d.completion_slot if d.HasField("completion_slot") else None
        out["completes_by"] = None if done is None else format_time(times.start(done + 1))
    return out


def spec_of(job_spec: pb.JobSpec) -> dict[str, Any]:
    """A job's spec as the job object ``oasis submit`` reads."""
    if job_spec.json:
        spec: dict[str, Any] = json.loads(job_spec.json)
        return spec
    from controller.convert import spec_from_proto  # a daemon that sends no json

    return spec_from_proto(job_spec)


def planned(d: pb.Decision) -> dict[str, Any] | None:
    """What an admission planned (:func:`plan_of`) for a decision as the API sends it."""
    jct = d.jct if d.HasField("jct") else None
    return plan_of(d.admitted, d.arrival_slot, jct, d.utility if d.HasField("utility") else None)


def plan_of(
    admitted: bool, arrival_slot: int, jct: int | None, utility: float | None
) -> dict[str, Any] | None:
    """What an admission planned: ``{"completion_slot", "jct", "utility"}`` (slots, slots,
    the utility of that completion); None for a decision that admitted nothing."""
    if not admitted or jct is None:
        return None
    return {"completion_slot": arrival_slot + jct - 1, "jct": jct, "utility": utility}


def job_record(job: pb.Job, times: SlotTimes | None) -> dict[str, Any]:
    """A stored job: its id, state in words, spec (the form ``submit`` reads), decision,
    and what its admission ``planned``. A cancelled or failed job's decision has no
    ``jct``, ``utility`` or ``completes_by`` (null: it never completed; its plan's are in
    ``planned``), and its ``completion_slot`` is the last slot it ran (null: none), as
    the daemon says."""
    state = state_name(job.state)
    decision = decision_record(job.decision, times)
    if state in ABANDONED:
        decision |= {"jct": None, "utility": None}
        if "completes_by" in decision:
            decision["completes_by"] = None
    return {
        "id": job.spec.id,
        "state": state,
        "spec": spec_of(job.spec),
        "decision": decision,
        "planned": planned(job.decision),
        "submitted_slot": job.submitted_slot,
        "sequence": job.sequence,
        # submitted with a wait: the last slot it may be admitted at (null: no wait)
        "wait_until_slot": job.wait_until_slot if job.HasField("wait_until_slot") else None,
    }


def event_record(event: pb.Event, times: SlotTimes | None) -> dict[str, Any]:
    """An event with its ``detail`` as JSON (not a string holding JSON)."""
    out = plain(event)
    try:
        out["detail"] = json.loads(event.detail) if event.detail else {}
    except json.JSONDecodeError:
        out["detail"] = event.detail
    if times is not None:
        out["slot_starts_at"] = format_time(times.start(event.slot))
    return out


def local_time(unix: float, now: float | None = None) -> str:
    """A time for a table: ``Tue 14:00`` within six days of now, else the date too; with
    its seconds if it has any (slots of 90 s: ``Sat 01:28:30``, not ``01:28``)."""
    now = time.time() if now is None else now
    try:
        second = math.ceil(unix)  # up, as format_time: a slot's start reads as in that slot
        local = time.localtime(second)
    except (OverflowError, ValueError, OSError):  # past time_t: a slot an edit set far out
        return format_time(unix)
    clock = "%H:%M:%S" if second % 60 else "%H:%M"
    if local.tm_isdst != time.localtime(now).tm_isdst:  # across a clock change: say which
        clock += " %Z"
    if abs(unix - now) < 6 * 86400:
        return time.strftime(f"%a {clock}", local)
    return time.strftime(f"%Y-%m-%d {clock}", local)


def slot_label(slot: int, times: SlotTimes | None, *, end: bool = False) -> str:
    """``"12 (Tue 14:00)"``: a slot and the local time it begins (``end``: ends)."""
    if times is None:
        return str(slot)
    return f"{slot} ({local_time(times.start(slot + 1 if end else slot))})"


def clock_caption(times: SlotTimes | None) -> str:
    """One line on how to read the times of a table (empty without the slot clock)."""
    if times is None:
        return ""
    zone = time.strftime("%Z") or time.strftime("%z")
    return f"times are local ({zone}); a slot is {format_duration(times.slot_seconds)}"
