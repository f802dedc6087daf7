"""The agents' messages, and the daemon's status they watch.

An agent publishes a :class:`Heartbeat` on ``agents/<server>/heartbeat`` and a
:class:`Progress` report on ``agents/<server>/progress``; the daemon retains its
:class:`Status` on ``daemon/status`` (:class:`~controller.plane.topics.Topics`).

Untrusted bytes. An agent's payload over
:data:`~controller.plane.codec.MAX_AGENT_PAYLOAD_BYTES` is dropped before it is parsed
(the MQTT client has read it by then: the broker's
``max_packet_size`` keeps larger ones away), and a report may name at most
:data:`MAX_REPORT_JOBS` jobs (the reference agent splits larger ones); a heartbeat's or
a report's session id is at most :data:`MAX_SESSION_CHARS` characters; any payload that
does not parse (bad UTF-8, bad JSON, JSON nested too deep for the parser) is a
:class:`~pricing.errors.SpecError`, logged and skipped. A report's entry whose count is
not a number from 0 to :data:`MAX_COUNT`, or whose job is longer than any job's key
(:data:`~pricing.fields.MAX_JOB_KEY_CHARS`), is left out (``Progress.refused``), its
other entries kept.

Why the strings are bounded, not only the payload: the daemon keeps what they name
after the message is gone. An entry's job id that no stored job has is remembered, up
to 10,000 of them, for its retained event to be cleared once
(:mod:`controller.plane.unknown_events`), and a session that beats beside another is
kept and stored with the plane's state (:mod:`controller.plane.agent_sessions`). One
agent sending one made-up job id of 250,000 characters per report grew the daemon by
150 MB in 30 s (to 2.5 GB before the ids were forgotten), and heartbeats of two 200,000-
character sessions put 200 KB in the plane's meta row, written again at every plan
round, per session ignored.

The status. ``{"version": 1, "online": true, "servers": [...]}`` while the daemon is
connected (``servers``: every server of its cluster, so an agent for another name can
stop with an error); ``{"version": 1, "online": false}`` after a clean stop, and as the
connection's will, which the broker publishes if the daemon vanishes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from controller.plane.codec import VERSION, _below, _dump, _run, decode
from controller.plane.plan_messages import MAX_PLAN_PAYLOAD_BYTES
from pricing import fields
from pricing.errors import SpecError

__all__ = [
    "MAX_COUNT",
    "MAX_DEVICES_SHORT",
    "MAX_REPORT_JOBS",
    "MAX_SESSION_CHARS",
    "Heartbeat",
    "Progress",
    "Status",
    "TaskProgress",
]

MAX_REPORT_JOBS = 1000
"""The most jobs one progress report may name (a server runs far fewer at once)."""

MAX_COUNT = fields.MAX_INTEGER
"""The largest mini-batch or worker-second count of a report (2**53: about 285 million
years of worker-seconds); the sum over any number of sessions stays finite."""

MAX_SESSION_CHARS = 128
"""The longest agent session id, in a heartbeat or a report (the reference agent's are
12 hex digits); a job's stored progress is keyed by them, and the plane's stored state
by those it ignores."""

MAX_DEVICES_SHORT = 100_000
"""The most workers short of devices a heartbeat may say."""


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
            session=_session(fields.require(obj, "session", "heartbeat"), "heartbeat.session"),
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
        run: the ``run`` of the task these counts are for
            (:class:`~controller.plane.plan_messages.Task`); "": not said.
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
                        job=_job(fields.require(m, "job", w), f"{w}.job"),
                        minibatches=_count(fields.require(m, "minibatches", w), f"{w}.minibatches"),
                        worker_seconds=_count(
                            fields.require(m, "worker_seconds", w), f"{w}.worker_seconds"
                        ),
                        run=_run(m.get("run", ""), f"{w}.run"),
                    )
                )
            except SpecError as err:
                refused.append(str(err)[:200])
        session = _session(fields.require(obj, "session", "progress"), "progress.session")
        return cls(
            server=fields.text(fields.require(obj, "server", "progress"), "progress.server"),
            session=session,
            jobs=jobs,
            refused=refused,
        )


def _session(value: Any, field: str) -> str:
    """An agent's session id: text of at most :data:`MAX_SESSION_CHARS` characters."""
    return _short(value, field, MAX_SESSION_CHARS, f"over {MAX_SESSION_CHARS}")


def _job(value: Any, field: str) -> str:
    """A report entry's job: text of at most :data:`~pricing.fields.MAX_JOB_KEY_CHARS`
    characters, as long as a job's key can be (submitter, ``:``, id). Its characters are
    not checked: a job stored before ids were is still planned, and reported, under its
    own."""
    limit = fields.MAX_JOB_KEY_CHARS
    return _short(value, field, limit, f"longer than any job's ({limit})")


def _short(value: Any, field: str, limit: int, beyond: str) -> str:
    """Text of at most ``limit`` characters (the strings the daemon keeps after the
    message: the module docstring); SpecError saying ``N characters, {beyond}``."""
    text = fields.text(value, field)
    if len(text) > limit:
        raise SpecError.one(field, f"{len(text)} characters, {beyond}")
    return text


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
