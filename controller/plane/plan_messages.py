"""The plan messages: what the daemon tells each server's agent to run.

A :class:`Plan` is retained on ``servers/<server>/plan``
(:class:`~controller.plane.topics.Topics`): the current and the next slot
(:class:`SlotPlan`), each a list of :class:`Task`.

Plans in parts. A plan over ``[mqtt] max_plan_bytes`` is published in parts
(:meth:`Plan.split`): part 0 on the plan's topic, part ``k`` on ``plan/<k>``, each a
:class:`Plan` with ``part`` and ``parts`` and a share of the tasks; an agent follows the
plan once it has every part of one epoch (:class:`PlanParts`), and ignores an empty
payload (a part topic cleared). A part says ``"version": 2`` (:data:`PART_VERSION`), so
an agent that predates parts refuses it with a "bad plan" line in its log instead of
running the first part's tasks alone: upgrade agents before the daemon (only plans over
``max_plan_bytes`` are split; smaller ones keep their exact bytes, version 1).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from controller.plane.codec import VERSION, _below, _run, decode
from controller.plane.demand import Demand, parse_demand
from controller.plane.devices import MAX_DEVICES
from pricing import fields
from pricing.errors import SpecError

__all__ = [
    "MAX_PLAN_PARTS",
    "MAX_PLAN_PAYLOAD_BYTES",
    "MAX_PLAN_TASKS",
    "PART_VERSION",
    "Plan",
    "PlanParts",
    "SlotPlan",
    "Task",
]

PART_VERSION = 2
"""The ``version`` of a part of a plan in parts (:meth:`Plan.split`): an agent that
predates parts refuses it ("plan.version: must be 1") and says so in its log, rather
than follow the first part as a whole plan and run only its tasks."""

MAX_PLAN_PAYLOAD_BYTES = 16 * 1024 * 1024
"""The largest plan (or part of one) an agent reads."""

MAX_PLAN_PARTS = 256
"""The most parts one plan is published in (:meth:`Plan.split`): 256 parts of the
default ``mqtt.max_plan_bytes`` hold about 200,000 tasks."""

MAX_PLAN_TASKS = 500_000
"""The most tasks the parts of one epoch held by an agent may have (:class:`PlanParts`),
both slots together: more than twice what 256 parts of the default ``max_plan_bytes``
hold. Each parsed task takes about 250 bytes; without it, parts of two epochs, 256
parts each of 16 MiB (a broker without the shipped ``max_packet_size``), held about
27 GB, 54 MB a part (the audit of what arrives on the plan topic)."""


@dataclass(frozen=True)
class Task:
    """One job's share of a server in a slot.

    Attributes:
        job: the job id.
        workers: workers to run on this server (worker servers).
        ps: parameter servers to run on this server (PS servers).
        minibatch_seconds: planned time of one mini-batch on one worker, seconds.
        minibatches: mini-batches of the whole job, ``E * N * M``.
        run: which admission of the job id this is (the daemon gives the time it was
            admitted): an id used again, after a store restored from a backup or its
            job deleted by retention, comes with another, and an agent's counts of the
            earlier one do not carry over to it. "": not said (an older daemon).
        devices: devices (GPUs) one of its workers needs (one of its PS on a PS
            server), whole or a fraction; 0: none, or not said (an older daemon). Left
            out of the payload when 0.
        demand: the job's demand of one of its workers (one of its PS on a PS server),
            every resource with a nonzero amount, in the cluster's units:
            ``{"cpu": 4, "mem": 8}`` (:mod:`controller.plane.demand`); empty: not said
            (an older daemon), left out of the payload. Never changed once built.
    """

    job: str
    workers: int
    ps: int
    minibatch_seconds: float
    minibatches: int
    run: str = ""
    devices: float = 0.0
    demand: Demand = field(default_factory=dict)


@dataclass(frozen=True)
class SlotPlan:
    """What a server runs in one slot.

    Attributes:
        slot: the absolute slot.
        starts_at: its start, Unix seconds.
        tasks: the jobs placed there, in decision order.
        refused: entries of the payload's ``tasks`` left out as bad (:meth:`from_dict`),
            and ``refused_error``, the first one's error; never compared or encoded.
    """

    slot: int
    starts_at: float
    tasks: list[Task] = field(default_factory=list)
    refused: int = field(default=0, compare=False)
    refused_error: str = field(default="", compare=False)

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> SlotPlan:
        """SpecError for a bad slot; a bad entry of its ``tasks`` is left out alone and
        counted in ``refused``. One job's entry that an agent refused (a count over
        2**53 that the daemon let through) made it refuse the whole plan: every other
        tenant's task on that server went without its new plan, and ran out."""
        obj = fields.mapping(raw, where)
        tasks_raw = obj.get("tasks", [])
        if not isinstance(tasks_raw, list):
            raise SpecError.one(f"{where}.tasks", "must be a list")
        tasks = []
        refused, first = 0, ""
        for i, t in enumerate(tasks_raw):
            try:
                tasks.append(_task(t, f"{where}.tasks[{i}]"))
            except SpecError as err:
                refused += 1
                first = first or str(err)[:300]
        return cls(
            slot=fields.integer(fields.require(obj, "slot", where), f"{where}.slot", minimum=0),
            starts_at=fields.number(fields.require(obj, "starts_at", where), f"{where}.starts_at"),
            tasks=tasks,
            refused=refused,
            refused_error=first,
        )


def _task(t: Any, tw: str) -> Task:
    """One entry of a slot plan's ``tasks``, at ``tw``: SpecError naming the field."""
    tm = fields.mapping(t, tw)
    return Task(
        job=fields.text(fields.require(tm, "job", tw), f"{tw}.job"),
        workers=fields.integer(tm.get("workers", 0), f"{tw}.workers", minimum=0),
        ps=fields.integer(tm.get("ps", 0), f"{tw}.ps", minimum=0),
        minibatch_seconds=fields.positive(
            fields.require(tm, "minibatch_seconds", tw), f"{tw}.minibatch_seconds"
        ),
        minibatches=fields.integer(
            fields.require(tm, "minibatches", tw), f"{tw}.minibatches", minimum=1
        ),
        run=_run(tm.get("run", ""), f"{tw}.run"),
        devices=_devices_demand(tm.get("devices", 0), f"{tw}.devices"),
        demand=parse_demand(tm["demand"], f"{tw}.demand") if "demand" in tm else {},
    )


def _slot_dict(plan: SlotPlan) -> dict[str, Any]:
    """``asdict(plan)``, by hand."""
    return {"slot": plan.slot, "starts_at": plan.starts_at,
            "tasks": [_task_dict(t) for t in plan.tasks]}  # fmt: skip


def _task_dict(t: Task) -> dict[str, Any]:
    """``asdict(t)``, by hand (``devices`` only when not 0, ``demand`` when not empty)."""
    out = {"job": t.job, "workers": t.workers, "ps": t.ps,
           "minibatch_seconds": t.minibatch_seconds, "minibatches": t.minibatches,
           "run": t.run}  # fmt: skip
    if t.devices:
        out["devices"] = t.devices
    if t.demand:
        out["demand"] = t.demand
    return out


def _devices_demand(value: Any, field: str) -> float:
    """A task's ``devices``: a number from 0 to :data:`MAX_DEVICES`."""
    demand = fields.non_negative(value, field)
    if demand > MAX_DEVICES:
        raise SpecError.one(field, f"must be at most {MAX_DEVICES}, got {demand:g}")
    return demand


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
        store: the id of the store whose daemon issued it ("": not said); an agent's
            heartbeats say it back.
        part: which part of the plan this is, ``0 .. parts - 1`` (:meth:`split`).
        parts: how many parts the plan was published in (1: whole; only then are the
            two fields left out of the payload).
        devices: the server's devices (GPUs: its capacity of the daemon's
            ``device_resource``, a fraction rounded up), which the agent hands to its workers
            (:mod:`controller.plane.devices`); 0: none (a worker sees none); None: not
            said (an older daemon, ``device_resource = ""``), left out of the payload.
        window: the daemon's window ``T``, slots: no job is planned more than ``T + 1``
            slots after its ``run`` (its admission), so an agent may drop the counts of
            a job it set aside that long ago (:mod:`controller.plane.set_aside`). None:
            not said (an older daemon), left out of the payload.
    """

    server: str
    kind: str
    epoch: int
    slot_seconds: float
    heartbeat_seconds: float
    down: bool
    current: SlotPlan
    next: SlotPlan
    store: str = ""
    part: int = 0
    parts: int = 1
    devices: int | None = None
    window: int | None = None

    def to_bytes(self) -> bytes:
        """The payload: the same bytes as ``_dump`` gives (without ``part`` and ``parts``
        for a whole plan, as before parts; without ``devices`` where it is None, or 0 in
        a task), built without :func:`dataclasses.asdict`'s deep copy (a slot boundary
        encodes one per server)."""
        body: dict[str, Any] = {
            "version": PART_VERSION if self.parts > 1 else VERSION,
            "server": self.server, "kind": self.kind, "epoch": self.epoch,
            "slot_seconds": self.slot_seconds, "heartbeat_seconds": self.heartbeat_seconds,
            "down": self.down, "current": _slot_dict(self.current),
            "next": _slot_dict(self.next), "store": self.store,
        }  # fmt: skip
        if self.parts > 1:
            body |= {"part": self.part, "parts": self.parts}
        if self.devices is not None:
            body["devices"] = self.devices
        if self.window is not None:
            body["window"] = self.window
        return json.dumps(body, separators=(",", ":")).encode()

    def split(self, max_bytes: int) -> list[Plan]:
        """This plan as parts whose payloads are each at most ``max_bytes`` (``[self]``
        if it fits): the same header in each, the tasks of both slots shared out in
        order. One tenant's many small jobs on a server made a plan larger than the
        broker's ``max_packet_size``, which then dropped the daemon's connection at each
        publish, for every server (an audit, 2026-11-27).

        Raises:
            ValueError: more than :data:`MAX_PLAN_PARTS` parts would be needed, or one
                task alone does not fit.
        """
        if len(self.to_bytes()) <= max_bytes:
            return [self]
        empty = replace(self, current=replace(self.current, tasks=[]),
                        next=replace(self.next, tasks=[]), part=MAX_PLAN_PARTS,
                        parts=MAX_PLAN_PARTS)  # fmt: skip
        room = max_bytes - len(empty.to_bytes())
        if room <= 0:
            raise ValueError(f"the plan's header alone is over {max_bytes} bytes")
        chunks: list[tuple[list[Task], list[Task]]] = [([], [])]
        used = 0
        for which, task in [(0, t) for t in self.current.tasks] + [(1, t) for t in self.next.tasks]:
            size = len(json.dumps(_task_dict(task), separators=(",", ":"))) + 1  # and a comma
            if size > room:
                raise ValueError(f"one task of job {task.job[:64]!r} is over {max_bytes} bytes")
            if used + size > room:
                chunks.append(([], []))
                used = 0
            chunks[-1][which].append(task)
            used += size
        if len(chunks) > MAX_PLAN_PARTS:
            raise ValueError(
                f"the plan of {self.server} needs {len(chunks)} parts of {max_bytes} bytes, "
                f"over {MAX_PLAN_PARTS}"
            )
        return [
            replace(
                self,
                current=replace(self.current, tasks=now),
                next=replace(self.next, tasks=later),
                part=i,
                parts=len(chunks),
            )
            for i, (now, later) in enumerate(chunks)
        ]

    @property
    def left_out(self) -> tuple[int, str]:
        """The entries of both slots' ``tasks`` left out as bad
        (:meth:`SlotPlan.from_dict`), and the first one's error ("" if none)."""
        return (self.current.refused + self.next.refused,
                self.current.refused_error or self.next.refused_error)  # fmt: skip

    def same_content(self, other: Plan | None) -> bool:
        """True if ``other`` plans the same (its epoch aside)."""
        if other is None:
            return False
        return (self.kind, self.down, self.current, self.next, self.heartbeat_seconds,
                self.devices, self.window) == (other.kind, other.down, other.current,
                                               other.next, other.heartbeat_seconds,
                                               other.devices, other.window)  # fmt: skip

    @classmethod
    def parse(cls, payload: bytes | bytearray | str) -> Plan:
        obj = decode(payload, "plan", MAX_PLAN_PAYLOAD_BYTES, (VERSION, PART_VERSION))
        plan = cls(
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
            store=_run(obj.get("store", ""), "plan.store"),
            part=_below(obj.get("part", 0), "plan.part", 0, MAX_PLAN_PARTS),
            parts=_below(obj.get("parts", 1), "plan.parts", 1, MAX_PLAN_PARTS + 1),
            devices=None
            if obj.get("devices") is None
            else _below(obj["devices"], "plan.devices", 0, MAX_DEVICES + 1),
            window=None
            if obj.get("window") is None
            else fields.integer(obj["window"], "plan.window", minimum=1),
        )
        if (obj["version"] == PART_VERSION) != (plan.parts > 1):
            raise SpecError.one("plan.version", f"{PART_VERSION} for a part of a plan in "
                                f"parts (parts > 1), {VERSION} for a whole plan")  # fmt: skip
        return plan


class PlanParts:
    """Puts a plan published in parts (:meth:`Plan.split`) back together on the agent's
    side: :meth:`add` each part as it comes; it returns the whole plan once every part
    of its epoch is in. Parts of at most two epochs are held (a newer one drops the
    oldest), each at most :data:`MAX_PLAN_PARTS` parts of :data:`MAX_PLAN_TASKS` tasks
    in all: bounded whatever arrives."""

    def __init__(self) -> None:
        self._held: dict[int, dict[int, Plan]] = {}

    def add(self, plan: Plan) -> Plan | None:
        """The whole plan of ``plan``'s epoch if this part completes it (``plan`` itself
        if it is whole), else None. SpecError for a part that does not belong (its
        ``part`` not below ``parts``, or a header unlike its epoch's other parts)."""
        if plan.parts == 1:
            return plan
        if plan.part >= plan.parts:
            raise SpecError.one("plan.part", f"must be below plan.parts ({plan.parts})")
        held = self._held.setdefault(plan.epoch, {})
        first = next(iter(held.values()), None)
        if first is not None and not _same_header(first, plan):
            raise SpecError.one("plan", f"part {plan.part} of epoch {plan.epoch} does not "
                                "match the epoch's other parts")  # fmt: skip
        tasks = sum(_tasks(p) for k, p in held.items() if k != plan.part) + _tasks(plan)
        if tasks > MAX_PLAN_TASKS:  # the epoch's parts dropped: it can never complete
            del self._held[plan.epoch]
            raise SpecError.one("plan", f"the parts of epoch {plan.epoch} hold over "
                                f"{MAX_PLAN_TASKS} tasks: dropped")  # fmt: skip
        held[plan.part] = plan
        while len(self._held) > 2:
            del self._held[min(self._held)]
        if len(held) < plan.parts:
            return None
        del self._held[plan.epoch]
        ordered = [held[i] for i in range(plan.parts)]
        return replace(
            ordered[0],
            current=_joined([p.current for p in ordered]),
            next=_joined([p.next for p in ordered]),
            part=0,
            parts=1,
        )


def _joined(slots: list[SlotPlan]) -> SlotPlan:
    """One slot's plan from its parts' (in order): their tasks, and their entries
    refused."""
    first = next((s.refused_error for s in slots if s.refused), "")
    return replace(slots[-1], tasks=[t for s in slots for t in s.tasks],
                   refused=sum(s.refused for s in slots), refused_error=first)  # fmt: skip


def _tasks(plan: Plan) -> int:
    """The tasks of both slots of ``plan``."""
    return len(plan.current.tasks) + len(plan.next.tasks)


def _same_header(a: Plan, b: Plan) -> bool:
    """Whether two parts are of the same plan (all but their tasks)."""

    def header(p: Plan) -> tuple[Any, ...]:
        return (p.server, p.kind, p.epoch, p.slot_seconds, p.heartbeat_seconds, p.down,
                p.parts, p.current.slot, p.current.starts_at, p.next.slot, p.next.starts_at,
                p.store, p.devices, p.window)  # fmt: skip

    return header(a) == header(b)
