"""MQTT topic names (versioned) and the JSON payloads sent on them.

Topics, under ``<prefix>/v1/`` (``prefix`` from ``[mqtt] topic_prefix``):

==============================  =========  ========  ======================================
topic                           from       QoS/ret.  payload
==============================  =========  ========  ======================================
``servers/<server>/plan``       daemon     1, yes    :class:`Plan`: this and the next slot
``jobs/<job>/events``           daemon     1, yes    :class:`JobEvent`: the latest event
``daemon/status``               daemon     1, yes    ``{"version": 1, "online": bool}``
``agents/<server>/heartbeat``   agent      0, no     :class:`Heartbeat`
``agents/<server>/progress``    agent      1, no     :class:`Progress`
==============================  =========  ========  ======================================

Every payload is a JSON object with ``"version": 1``. A plan carries an ``epoch`` that
grows with every plan the daemon issues, across restarts (it is kept in the store): an
agent ignores a plan whose epoch is lower than one it has followed. Progress counts are
cumulative per agent *session* (a random id per agent process), so a report repeated or
lost changes nothing, and a restarted agent does not undo what its predecessor did.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from pricing import fields
from pricing.errors import SpecError

__all__ = [
    "VERSION",
    "Heartbeat",
    "JobEvent",
    "Plan",
    "Progress",
    "SlotPlan",
    "Task",
    "TaskProgress",
    "Topics",
    "decode",
    "event_kind",
]

VERSION = 1


@dataclass(frozen=True)
class Topics:
    """Topic names under ``<prefix>/v1``."""

    prefix: str = "oasis"

    @property
    def root(self) -> str:
        return f"{self.prefix}/v{VERSION}"

    def plan(self, server: str) -> str:
        return f"{self.root}/servers/{server}/plan"

    def job_events(self, job_id: str) -> str:
        return f"{self.root}/jobs/{job_id}/events"

    @property
    def status(self) -> str:
        return f"{self.root}/daemon/status"

    def heartbeat(self, server: str) -> str:
        return f"{self.root}/agents/{server}/heartbeat"

    def progress(self, server: str) -> str:
        return f"{self.root}/agents/{server}/progress"

    @property
    def all_plans(self) -> str:
        return f"{self.root}/servers/+/plan"

    @property
    def all_heartbeats(self) -> str:
        return f"{self.root}/agents/+/heartbeat"

    @property
    def all_progress(self) -> str:
        return f"{self.root}/agents/+/progress"


def _dump(obj: Any) -> bytes:
    return json.dumps({"version": VERSION, **asdict(obj)}, separators=(",", ":")).encode()


def decode(payload: bytes | bytearray | str, what: str) -> Mapping[str, Any]:
    """Parse a payload as a version-1 JSON object; SpecError naming ``what`` if not."""
    try:
        data = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as err:
        raise SpecError.one(what, f"not JSON: {err}") from None
    obj = fields.mapping(data, what)
    if obj.get("version") != VERSION:
        raise SpecError.one(f"{what}.version", f"must be {VERSION}, got {obj.get('version')!r}")
    return obj


@dataclass(frozen=True)
class Task:
    """One job's share of a server in a slot.

    Attributes:
        job: the job id.
        workers: workers to run on this server (worker servers).
        ps: parameter servers to run on this server (PS servers).
        minibatch_seconds: planned time of one mini-batch on one worker, seconds.
        minibatches: mini-batches of the whole job, ``E * N * M``.
    """

    job: str
    workers: int
    ps: int
    minibatch_seconds: float
    minibatches: int


@dataclass(frozen=True)
class SlotPlan:
    """What a server runs in one slot.

    Attributes:
        slot: the absolute slot.
        starts_at: its start, Unix seconds.
        tasks: the jobs placed there, in decision order.
    """

    slot: int
    starts_at: float
    tasks: list[Task] = field(default_factory=list)

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> SlotPlan:
        obj = fields.mapping(raw, where)
        tasks_raw = obj.get("tasks", [])
        if not isinstance(tasks_raw, list):
            raise SpecError.one(f"{where}.tasks", "must be a list")
        tasks = []
        for i, t in enumerate(tasks_raw):
            tw = f"{where}.tasks[{i}]"
            tm = fields.mapping(t, tw)
            tasks.append(
                Task(
                    job=fields.text(fields.require(tm, "job", tw), f"{tw}.job"),
                    workers=fields.integer(tm.get("workers", 0), f"{tw}.workers", minimum=0),
                    ps=fields.integer(tm.get("ps", 0), f"{tw}.ps", minimum=0),
                    minibatch_seconds=fields.positive(
                        fields.require(tm, "minibatch_seconds", tw), f"{tw}.minibatch_seconds"
                    ),
                    minibatches=fields.integer(
                        fields.require(tm, "minibatches", tw), f"{tw}.minibatches", minimum=1
                    ),
                )
            )
        return cls(
            slot=fields.integer(fields.require(obj, "slot", where), f"{where}.slot", minimum=0),
            starts_at=fields.number(fields.require(obj, "starts_at", where), f"{where}.starts_at"),
            tasks=tasks,
        )


@dataclass(frozen=True)
class Plan:
    """The retained plan of one server: the current and the next slot.

    Attributes:
        server: the server's name.
        kind: ``"worker"`` or ``"ps"``.
        epoch: grows with every plan issued; ignore a plan older than one followed.
        slot_seconds: slot length, seconds.
        heartbeat_seconds: how often the agent should send a heartbeat, seconds.
        down: the daemon considers this server failed (it plans nothing on it).
        current: the slot in progress when the plan was issued.
        next: the slot after it.
    """

    server: str
    kind: str
    epoch: int
    slot_seconds: float
    heartbeat_seconds: float
    down: bool
    current: SlotPlan
    next: SlotPlan

    def to_bytes(self) -> bytes:
        return _dump(self)

    def same_content(self, other: Plan | None) -> bool:
        """True if ``other`` plans the same (its epoch aside)."""
        if other is None:
            return False
        return (self.kind, self.down, self.current, self.next, self.heartbeat_seconds) == (
            other.kind,
            other.down,
            other.current,
            other.next,
            other.heartbeat_seconds,
        )

    @classmethod
    def parse(cls, payload: bytes | bytearray | str) -> Plan:
        obj = decode(payload, "plan")
        return cls(
            server=fields.text(fields.require(obj, "server", "plan"), "plan.server"),
            kind=fields.text(fields.require(obj, "kind", "plan"), "plan.kind"),
            epoch=fields.integer(fields.require(obj, "epoch", "plan"), "plan.epoch", minimum=0),
            slot_seconds=fields.positive(
                fields.require(obj, "slot_seconds", "plan"), "plan.slot_seconds"
            ),
            heartbeat_seconds=fields.positive(
                obj.get("heartbeat_seconds", 5.0), "plan.heartbeat_seconds"
            ),
            down=bool(obj.get("down", False)),
            current=SlotPlan.from_dict(fields.require(obj, "current", "plan"), "plan.current"),
            next=SlotPlan.from_dict(fields.require(obj, "next", "plan"), "plan.next"),
        )


@dataclass(frozen=True)
class Heartbeat:
    """An agent is alive.

    Attributes:
        server: the server it runs on.
        session: the agent process's random id.
        epoch: the epoch of the plan it follows (0: none yet).
    """

    server: str
    session: str
    epoch: int = 0

    def to_bytes(self) -> bytes:
        return _dump(self)

    @classmethod
    def parse(cls, payload: bytes | bytearray | str) -> Heartbeat:
        obj = decode(payload, "heartbeat")
        return cls(
            server=fields.text(fields.require(obj, "server", "heartbeat"), "heartbeat.server"),
            session=fields.text(fields.require(obj, "session", "heartbeat"), "heartbeat.session"),
            epoch=fields.integer(obj.get("epoch", 0), "heartbeat.epoch", minimum=0),
        )


@dataclass(frozen=True)
class TaskProgress:
    """One job's progress on one agent, cumulative over the agent's session.

    Attributes:
        job: the job id.
        minibatches: mini-batches its workers on this server finished.
        worker_seconds: time its workers ran, summed over workers, seconds.
    """

    job: str
    minibatches: float
    worker_seconds: float


@dataclass(frozen=True)
class Progress:
    """An agent's progress report for every job it ran.

    Attributes:
        server: the server it runs on.
        session: the agent process's random id.
        jobs: cumulative counts per job.
    """

    server: str
    session: str
    jobs: list[TaskProgress]

    def to_bytes(self) -> bytes:
        return _dump(self)

    @classmethod
    def parse(cls, payload: bytes | bytearray | str) -> Progress:
        obj = decode(payload, "progress")
        raw_jobs = fields.require(obj, "jobs", "progress")
        if not isinstance(raw_jobs, list):
            raise SpecError.one("progress.jobs", "must be a list")
        jobs = []
        for i, j in enumerate(raw_jobs):
            w = f"progress.jobs[{i}]"
            m = fields.mapping(j, w)
            jobs.append(
                TaskProgress(
                    job=fields.text(fields.require(m, "job", w), f"{w}.job"),
                    minibatches=fields.non_negative(
                        fields.require(m, "minibatches", w), f"{w}.minibatches"
                    ),
                    worker_seconds=fields.non_negative(
                        fields.require(m, "worker_seconds", w), f"{w}.worker_seconds"
                    ),
                )
            )
        return cls(
            server=fields.text(fields.require(obj, "server", "progress"), "progress.server"),
            session=fields.text(fields.require(obj, "session", "progress"), "progress.session"),
            jobs=jobs,
        )


@dataclass(frozen=True)
class JobEvent:
    """A job's event as published (the store's event log entry).

    Attributes:
        sequence: the event's place in the daemon's log (consumers dedupe on it).
        kind: ``admitted``, ``rejected``, ``pending`` (not admitted yet; decided again at
            each slot boundary), ``expired`` (was pending), ``started``, ``replanned``,
            ``completed``, ``cancelled`` or ``failed``.
        job: the job id.
        slot: the slot it happened in.
        state: the job's state after it.
        detail: kind-specific details.
    """

    sequence: int
    kind: str
    job: str
    slot: int
    state: str
    detail: dict[str, Any]

    def to_bytes(self) -> bytes:
        return _dump(self)


_KINDS = {"running": "started", "completed": "completed", "cancelled": "cancelled",
          "replanned": "replanned", "failed": "failed", "expired": "expired"}  # fmt: skip
_DECIDED = {"admitted": "admitted", "pending": "pending"}


def event_kind(kind: str, state: str) -> str | None:
    """The published kind of a stored event (None: not a job event)."""
    if kind == "decided":
        return _DECIDED.get(state, "rejected")
    return _KINDS.get(kind)
