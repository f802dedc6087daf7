"""MQTT topic names (versioned) and the JSON payloads sent on them.

Topics, under ``<prefix>/v1/`` (``prefix`` from ``[mqtt] topic_prefix``):

==============================  =========  ========  ======================================
topic                           from       QoS/ret.  payload
==============================  =========  ========  ======================================
``servers/<server>/plan``       daemon     1, yes    :class:`Plan`: this and the next slot
``servers/<server>/plan/<k>``   daemon     1, yes    part ``k`` (1 ..) of a plan in parts
``jobs/<job>/events``           daemon     1, yes    :class:`JobEvent`: the latest event
``daemon/status``               daemon     1, yes    :class:`Status`: online, known servers
``agents/<server>/heartbeat``   agent      0, no     :class:`Heartbeat`
``agents/<server>/progress``    agent      1, no     :class:`Progress`
==============================  =========  ========  ======================================

Every payload is a JSON object with ``"version": 1`` (2 for a part of a plan in parts,
below). A plan carries an ``epoch`` that
grows with every plan the daemon issues, across restarts (it is kept in the store): an
agent ignores a plan whose epoch is lower than one it has followed. Progress counts are
cumulative per agent *session* (a random id per agent process), so a report repeated or
lost changes nothing, and a restarted agent does not undo what its predecessor did. On
every connection the daemon publishes every plan and every job's latest event again (a
broker restarted without persistence has lost them); consumers dedupe events on
``sequence``. A job deleted by retention (``daemon.keep_days``) has its retained event
cleared: an empty payload on its ``jobs/<job>/events`` topic, which consumers drop. An
agent subscribes to its plan, its plan's parts and the status.

Plans in parts. A plan over ``[mqtt] max_plan_bytes`` is published in parts
(:meth:`Plan.split`): part 0 on the plan's topic, part ``k`` on ``plan/<k>``, each a
:class:`Plan` with ``part`` and ``parts`` and a share of the tasks; an agent follows the
plan once it has every part of one epoch (:class:`PlanParts`), and ignores an empty
payload (a part topic cleared). A part says ``"version": 2`` (:data:`PART_VERSION`), so
an agent that predates parts refuses it with a "bad plan" line in its log instead of
running the first part's tasks alone: upgrade agents before the daemon (only plans over
``max_plan_bytes`` are split; smaller ones keep their exact bytes, version 1).

Names in topics. A server name is one topic level: 1-128 characters of
``A-Z a-z 0-9 . _ -`` (:data:`NAME_PATTERN`), so it can hold no ``/``, no wildcard
``+``/``#`` and no NUL (which makes Mosquitto drop the connection). A job is named by its
key (:mod:`controller.job_keys`): its id, or with tokens its submitter's name, ``:`` and
its id (:func:`pricing.fields.job_key`: no ``/``, ``+``, ``#`` or NUL either). Job ids
are checked at submission (:func:`pricing.fields.job_id`), server names when a config
with ``[mqtt]`` is loaded, an agent's at its start; :func:`topic_name` checks a server's
name, :func:`job_level` a job's key, and the daemon logs and skips an event it cannot
publish (a job stored before the check).

Who says what. The daemon takes an agent's identity from the topic it published on, never
from the payload: a heartbeat or report whose ``server`` differs from its topic is dropped.
A report counts only for jobs that have workers on that server in the slot it arrived in
(or the one before or after, for reports sent across a boundary). That the topic is the
agent's own is the broker's to enforce: ``config/mosquitto.acl`` confines each agent's
user (its server's name) to its own topics.

Untrusted bytes. An agent's payload over :data:`MAX_AGENT_PAYLOAD_BYTES` is dropped
before it is parsed (the MQTT client has read it by then: the broker's
``max_packet_size`` keeps larger ones away), and a report may name at most
:data:`MAX_REPORT_JOBS` jobs (the reference agent splits larger ones) and its session
id at most :data:`MAX_SESSION_CHARS` characters; any payload that does not parse (bad
UTF-8, bad JSON, JSON nested too deep for the parser) is a
:class:`~pricing.errors.SpecError`, logged and skipped. A report's entry whose count is
not a number from 0 to :data:`MAX_COUNT` is left out (``Progress.refused``), its other
entries kept.

The status. ``{"version": 1, "online": true, "servers": [...]}`` while the daemon is
connected (``servers``: every server of its cluster, so an agent for another name can
stop with an error); ``{"version": 1, "online": false}`` after a clean stop, and as the
connection's will, which the broker publishes if the daemon vanishes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from controller.plane.devices import MAX_DEVICES
from pricing import fields
from pricing.errors import SpecError

__all__ = [
    "MAX_AGENT_PAYLOAD_BYTES",
    "MAX_COUNT",
    "MAX_PLAN_PARTS",
    "MAX_PLAN_PAYLOAD_BYTES",
    "MAX_REPORT_JOBS",
    "MAX_SESSION_CHARS",
    "NAME_PATTERN",
    "VERSION",
    "Heartbeat",
    "JobEvent",
    "Plan",
    "PlanParts",
    "Progress",
    "SlotPlan",
    "Status",
    "Task",
    "TaskProgress",
    "Topics",
    "decode",
    "event_kind",
    "job_level",
    "topic_name",
]

VERSION = 1

PART_VERSION = 2
"""The ``version`` of a part of a plan in parts (:meth:`Plan.split`): an agent that
predates parts refuses it ("plan.version: must be 1") and says so in its log, rather
than follow the first part as a whole plan and run only its tasks."""

NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")
"""A server name that can be one topic level (``fullmatch``)."""
MAX_AGENT_PAYLOAD_BYTES = 256 * 1024
"""The largest heartbeat or progress payload the daemon parses; larger ones are dropped.
A report of :data:`MAX_REPORT_JOBS` entries with 128-character ids is ~210 KB."""

MAX_REPORT_JOBS = 1000
"""The most jobs one progress report may name (a server runs far fewer at once)."""

MAX_PLAN_PAYLOAD_BYTES = 16 * 1024 * 1024
"""The largest plan (or part of one) an agent reads."""

MAX_PLAN_PARTS = 256
"""The most parts one plan is published in (:meth:`Plan.split`): 256 parts of the
default ``mqtt.max_plan_bytes`` hold about 200,000 tasks."""

MAX_COUNT = fields.MAX_INTEGER
"""The largest mini-batch or worker-second count of a report (2**53: about 285 million
years of worker-seconds); the sum over any number of sessions stays finite."""

MAX_SESSION_CHARS = 128
"""The longest agent session id (the reference agent's are 12 hex digits); a job's
stored progress is keyed by them."""


def topic_name(name: str, what: str) -> str:
    """``name`` if it can be one topic level (:data:`NAME_PATTERN`); ValueError naming
    ``what`` otherwise."""
    if not NAME_PATTERN.fullmatch(name):
        shown = name if len(name) <= 40 else f"{name[:40]}..."
        raise ValueError(
            f"{what} {shown!r} cannot name an MQTT topic: it must be 1-128 characters of "
            "A-Z a-z 0-9 . _ -"
        )
    return name


def job_level(key: str) -> str:
    """``key``, a job's key, if it can be one topic level (the rule of
    :func:`pricing.fields.job_key`); ValueError saying why otherwise."""
    try:
        return fields.job_key(key, "job id")
    except SpecError as err:
        shown = key if len(key) <= 40 else f"{key[:40]}..."
        raise ValueError(f"job {shown!r} cannot name an MQTT topic: {err}") from None


@dataclass(frozen=True)
class Topics:
    """Topic names under ``<prefix>/v1``."""

    prefix: str = "oasis"

    @property
    def root(self) -> str:
        return f"{self.prefix}/v{VERSION}"

    def plan(self, server: str, part: int = 0) -> str:
        """The topic of ``server``'s plan, or of its part ``part`` (1 ..; 0: the plan's
        own topic, where a whole plan or its first part goes)."""
        own = f"{self.root}/servers/{server}/plan"
        return own if part == 0 else f"{own}/{part}"

    def plan_parts(self, server: str) -> str:
        """A filter for the parts of ``server``'s plan after the first."""
        return f"{self.root}/servers/{server}/plan/+"

    def job_events(self, job_id: str) -> str:
        """Also a filter: ``job_events("+")``; check an id with :func:`topic_name` first."""
        return f"{self.root}/jobs/{job_id}/events"

    @property
    def status(self) -> str:
        return f"{self.root}/daemon/status"

    def heartbeat(self, server: str) -> str:
        return f"{self.root}/agents/{server}/heartbeat"

    def progress(self, server: str) -> str:
        return f"{self.root}/agents/{server}/progress"

    def agent_of(self, topic: str) -> tuple[str, str] | None:
        """``(server, "heartbeat" | "progress")`` of an agent's topic; None for any other
        topic. The server is the topic's, whatever the payload says."""
        head = f"{self.root}/agents/"
        if not topic.startswith(head):
            return None
        server, _, what = topic[len(head) :].partition("/")
        if what not in ("heartbeat", "progress") or not NAME_PATTERN.fullmatch(server):
            return None
        return server, what

    @property
    def all_plans(self) -> str:
        return f"{self.root}/servers/+/plan"

    @property
    def all_heartbeats(self) -> str:
        return f"{self.root}/agents/+/heartbeat"

    @property
    def all_progress(self) -> str:
        return f"{self.root}/agents/+/progress"


def _dump(obj: Any, *omit: str) -> bytes:
    """``obj``'s fields but ``omit`` as a version-1 payload."""
    body = {k: v for k, v in asdict(obj).items() if k not in omit}
    return json.dumps({"version": VERSION, **body}, separators=(",", ":")).encode()


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate: a pair is text, a lone one is not (checked)."""


def decode(
    payload: bytes | bytearray | str,
    what: str,
    max_bytes: int = MAX_AGENT_PAYLOAD_BYTES,
    versions: tuple[int, ...] = (VERSION,),
) -> Mapping[str, Any]:
    """Parse a payload as a JSON object of one of ``versions`` (1); SpecError naming
    ``what`` if not, or if it is over ``max_bytes`` (then not parsed). Every failure of
    the parser on untrusted bytes is a SpecError: bad UTF-8 and bad JSON (ValueError),
    and JSON nested deeper than the parser's recursion limit (RecursionError)."""
    if len(payload) > max_bytes:
        raise SpecError.one(what, f"{len(payload)} bytes, over the limit of {max_bytes}")
    try:
        # strictly: json.loads(bytes) lets UTF-8-encoded surrogates through
        text = payload if isinstance(payload, str) else bytes(payload).decode("utf-8")
        data = json.loads(text)
        if _SURROGATE_ESCAPE.search(text):  # "\ud800" escaped: valid JSON, not text
            json.dumps(data, ensure_ascii=False).encode("utf-8")
    except ValueError as err:  # JSONDecodeError and UnicodeError are ValueErrors
        raise SpecError.one(what, f"not JSON: {str(err)[:200]}") from None
    except RecursionError:
        raise SpecError.one(what, "not JSON the parser can read: nested too deep") from None
    obj = fields.mapping(data, what)
    version = obj.get("version")
    if type(version) is not int or version not in versions:
        shown = " or ".join(map(str, versions))
        raise SpecError.one(f"{what}.version", f"must be {shown}, got {version!r}")
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
        run: which admission of the job id this is (the daemon gives the time it was
            admitted): an id used again, after a store restored from a backup or its
            job deleted by retention, comes with another, and an agent's counts of the
            earlier one do not carry over to it. "": not said (an older daemon).
        devices: devices (GPUs) one of its workers needs (one of its PS on a PS
            server), whole or a fraction; 0: none, or not said (an older daemon). Left
            out of the payload when 0.
    """

    job: str
    workers: int
    ps: int
    minibatch_seconds: float
    minibatches: int
    run: str = ""
    devices: float = 0.0


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
                    run=_run(tm.get("run", ""), f"{tw}.run"),
                    devices=_devices_demand(tm.get("devices", 0), f"{tw}.devices"),
                )
            )
        return cls(
            slot=fields.integer(fields.require(obj, "slot", where), f"{where}.slot", minimum=0),
            starts_at=fields.number(fields.require(obj, "starts_at", where), f"{where}.starts_at"),
            tasks=tasks,
        )


def _slot_dict(plan: SlotPlan) -> dict[str, Any]:
    """``asdict(plan)``, by hand."""
    return {"slot": plan.slot, "starts_at": plan.starts_at,
            "tasks": [_task_dict(t) for t in plan.tasks]}  # fmt: skip


def _task_dict(t: Task) -> dict[str, Any]:
    """``asdict(t)``, by hand (``devices`` only when not 0)."""
    out = {"job": t.job, "workers": t.workers, "ps": t.ps,
           "minibatch_seconds": t.minibatch_seconds, "minibatches": t.minibatches,
           "run": t.run}  # fmt: skip
    if t.devices:
        out["devices"] = t.devices
    return out


def _devices_demand(value: Any, field: str) -> float:
    """A task's ``devices``: a number from 0 to :data:`MAX_DEVICES`."""
    demand = fields.non_negative(value, field)
    if demand > MAX_DEVICES:
        raise SpecError.one(field, f"must be at most {MAX_DEVICES}, got {demand:g}")
    return demand


MAX_DEVICES_SHORT = 100_000
"""The most workers short of devices a heartbeat may say."""

MAX_RUN_CHARS = 64
"""The longest ``run`` of a task or a report entry."""


def _run(value: Any, field: str) -> str:
    """A task's or report entry's ``run``: text of at most :data:`MAX_RUN_CHARS`, or ""."""
    if value == "":
        return ""
    run = fields.text(value, field)
    if len(run) > MAX_RUN_CHARS:
        raise SpecError.one(field, f"{len(run)} characters, over {MAX_RUN_CHARS}")
    return run


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

    def same_content(self, other: Plan | None) -> bool:
        """True if ``other`` plans the same (its epoch aside)."""
        if other is None:
            return False
        return (self.kind, self.down, self.current, self.next, self.heartbeat_seconds,
                self.devices) == (other.kind, other.down, other.current, other.next,
                                  other.heartbeat_seconds, other.devices)  # fmt: skip

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
        )
        if (obj["version"] == PART_VERSION) != (plan.parts > 1):
            raise SpecError.one("plan.version", f"{PART_VERSION} for a part of a plan in "
                                f"parts (parts > 1), {VERSION} for a whole plan")  # fmt: skip
        return plan


class PlanParts:
    """Puts a plan published in parts (:meth:`Plan.split`) back together on the agent's
    side: :meth:`add` each part as it comes; it returns the whole plan once every part
    of its epoch is in. Parts of at most two epochs are held (a newer one drops the
    oldest), each at most :data:`MAX_PLAN_PARTS` parts: bounded whatever arrives."""

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
        held[plan.part] = plan
        while len(self._held) > 2:
            del self._held[min(self._held)]
        if len(held) < plan.parts:
            return None
        del self._held[plan.epoch]
        ordered = [held[i] for i in range(plan.parts)]
        return replace(
            ordered[0],
            current=replace(plan.current, tasks=[t for p in ordered for t in p.current.tasks]),
            next=replace(plan.next, tasks=[t for p in ordered for t in p.next.tasks]),
            part=0,
            parts=1,
        )


def _below(value: Any, field: str, least: int, end: int) -> int:
    """An integer ``least .. end - 1``; SpecError naming ``field`` otherwise."""
    number = fields.integer(value, field, minimum=least)
    if number >= end:
        raise SpecError.one(field, f"must be below {end}, got {number}")
    return number


def _same_header(a: Plan, b: Plan) -> bool:
    """Whether two parts are of the same plan (all but their tasks)."""

    def header(p: Plan) -> tuple[Any, ...]:
        return (p.server, p.kind, p.epoch, p.slot_seconds, p.heartbeat_seconds, p.down,
                p.parts, p.current.slot, p.current.starts_at, p.next.slot, p.next.starts_at,
                p.store, p.devices)  # fmt: skip

    return header(a) == header(b)


@dataclass(frozen=True)
class Heartbeat:
    """An agent is alive.

    Attributes:
        server: the server it runs on.
        session: the agent process's random id.
        epoch: the epoch of the plan it follows (0: none yet).
        sent_at: the agent's clock when it sent the beat, Unix seconds; None from an
            agent that does not say (older ones). The daemon compares it with its own
            clock: an agent follows the next slot's plan from its ``starts_at`` by its
            own clock, so an agent ahead switches plans early and one behind late.
        store: the ``store`` of the plan it follows ("": none, or not said).
        devices_short: its workers running on devices others hold, or without the
            devices their task needs (:mod:`controller.plane.devices`); 0: none, or
            not said (left out of the payload).
    """

    server: str
    session: str
    epoch: int = 0
    sent_at: float | None = None
    store: str = ""
    devices_short: int = 0

    def to_bytes(self) -> bytes:
        unsaid = (
            (("sent_at",) if self.sent_at is None else ())
            + (("store",) if not self.store else ())
            + (("devices_short",) if not self.devices_short else ())
        )
        return _dump(self, *unsaid)

    @classmethod
    def parse(cls, payload: bytes | bytearray | str) -> Heartbeat:
        obj = decode(payload, "heartbeat")
        sent_at = obj.get("sent_at")
        return cls(
            server=fields.text(fields.require(obj, "server", "heartbeat"), "heartbeat.server"),
            session=fields.text(fields.require(obj, "session", "heartbeat"), "heartbeat.session"),
            epoch=fields.integer(obj.get("epoch", 0), "heartbeat.epoch", minimum=0),
            sent_at=None if sent_at is None else fields.number(sent_at, "heartbeat.sent_at"),
            store=_run(obj.get("store", ""), "heartbeat.store"),
            devices_short=_below(
                obj.get("devices_short", 0), "heartbeat.devices_short", 0, MAX_DEVICES_SHORT + 1
            ),
        )


@dataclass(frozen=True)
class TaskProgress:
    """One job's progress on one agent, cumulative over the agent's session.

    Attributes:
        job: the job id.
        minibatches: mini-batches its workers on this server finished.
        worker_seconds: time its workers ran, summed over workers, seconds.
        run: the ``run`` of the task these counts are for (:class:`Task`); "": not said.
    """

    job: str
    minibatches: float
    worker_seconds: float
    run: str = ""


@dataclass(frozen=True)
class Progress:
    """An agent's progress report for every job it ran.

    Attributes:
        server: the server it runs on.
        session: the agent process's random id.
        jobs: cumulative counts per job.
        refused: what was wrong with each entry left out of ``jobs`` when parsed (not
            sent): one job's bad count costs that entry, never the other jobs' progress
            in the same report (another tenant's job would fail for want of it).
    """

    server: str
    session: str
    jobs: list[TaskProgress]
    refused: list[str] = field(default_factory=list, compare=False)

    def to_bytes(self) -> bytes:
        return _dump(self, "refused")  # what the receiver found wrong is not sent

    @classmethod
    def parse(cls, payload: bytes | bytearray | str) -> Progress:
        obj = decode(payload, "progress")
        raw_jobs = fields.require(obj, "jobs", "progress")
        if not isinstance(raw_jobs, list):
            raise SpecError.one("progress.jobs", "must be a list")
        if len(raw_jobs) > MAX_REPORT_JOBS:
            raise SpecError.one(
                "progress.jobs", f"{len(raw_jobs)} entries, over the limit of {MAX_REPORT_JOBS}"
            )
        jobs, refused = [], []
        for i, j in enumerate(raw_jobs):
            w = f"progress.jobs[{i}]"
            try:
                m = fields.mapping(j, w)
                jobs.append(
                    TaskProgress(
                        job=fields.text(fields.require(m, "job", w), f"{w}.job"),
                        minibatches=_count(fields.require(m, "minibatches", w), f"{w}.minibatches"),
                        worker_seconds=_count(
                            fields.require(m, "worker_seconds", w), f"{w}.worker_seconds"
                        ),
                        run=_run(m.get("run", ""), f"{w}.run"),
                    )
                )
            except SpecError as err:
                refused.append(str(err)[:200])
        session = fields.text(fields.require(obj, "session", "progress"), "progress.session")
        if len(session) > MAX_SESSION_CHARS:
            raise SpecError.one(
                "progress.session", f"{len(session)} characters, over {MAX_SESSION_CHARS}"
            )
        return cls(
            server=fields.text(fields.require(obj, "server", "progress"), "progress.server"),
            session=session,
            jobs=jobs,
            refused=refused,
        )


def _count(value: Any, field: str) -> float:
    """A cumulative count of a report: a number in ``0 .. 2**53``. The daemon sums them
    over the sessions of a job and fits its runtime estimate to the sums, which must stay
    finite (two sessions of 1e308 each made inf)."""
    x = fields.non_negative(value, field)
    if x > MAX_COUNT:
        raise SpecError.one(field, f"must be <= 2**53 = {MAX_COUNT}, got {fields.show(value)}")
    return x


@dataclass(frozen=True)
class Status:
    """The daemon's retained status.

    Attributes:
        online: connected (False: stopped cleanly, or vanished: the connection's will).
        servers: every server of its cluster while online; empty when offline.
    """

    online: bool
    servers: list[str] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        body: dict[str, Any] = {"version": VERSION, "online": self.online}
        if self.online:
            body["servers"] = self.servers
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, payload: bytes | bytearray | str) -> Status:
        obj = decode(payload, "status", MAX_PLAN_PAYLOAD_BYTES)
        online = obj.get("online")
        if not isinstance(online, bool):
            raise SpecError.one("status.online", "must be true or false")
        raw = obj.get("servers", [])
        if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
            raise SpecError.one("status.servers", "must be a list of names")
        return cls(online, list(raw))


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
