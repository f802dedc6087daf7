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
other entries kept. An entry's optional ``failures`` (an integer from 0 to
:data:`MAX_FAILURES`) and ``last_failure`` (text of at most :data:`MAX_FAILURE_CHARS`
characters) that are not are ignored alone (``Progress.ignored``), the entry's counts
kept; ``last_failure`` is a worker's failure as the agent words it, read by the job's
tenant: its control and invisible characters are escaped (:func:`pricing.text.escape`).

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from controller.plane.codec import VERSION, _below, _dump, _run, decode
from controller.plane.plan_messages import MAX_PLAN_PAYLOAD_BYTES
from pricing import fields
from pricing.errors import SpecError
from pricing.text import escape

__all__ = [
    "MAX_COUNT",
    "MAX_DEVICES_SHORT",
    "MAX_ENTRIES_LEFT_OUT",
    "MAX_FAILURES",
    "MAX_FAILURE_CHARS",
    "MAX_REPORT_JOBS",
    "MAX_SESSION_CHARS",
    "Heartbeat",
    "Progress",
    "Status",
    "TaskProgress",
]

T = TypeVar("T")

MAX_REPORT_JOBS = 1000
"""The most jobs one progress report may name (a server runs far fewer at once)."""

MAX_COUNT = fields.MAX_INTEGER
"""The largest mini-batch or worker-second count of a report (2**53: about 285 million
years of worker-seconds); the sum over any number of sessions stays finite."""

MAX_SESSION_CHARS = 128
"""The longest agent session id, in a heartbeat or a report (the reference agent's are
12 hex digits); a job's stored progress is keyed by them, and the plane's stored state
by those it ignores."""

MAX_ENTRIES_LEFT_OUT = 1_000_000
"""The most plan entries left out a heartbeat says (an agent says at most this many)."""

MAX_DEVICES_SHORT = 100_000
"""The most workers short of devices a heartbeat may say."""

MAX_FAILURES = fields.MAX_INTEGER
"""The largest count of a job's worker failures in a report entry (2**53)."""

MAX_FAILURE_CHARS = 200
"""The longest ``last_failure`` of a report entry (``exit status 1``, ``over its memory
demand``); the agent cuts its own to this."""


@dataclass(frozen=True)
class Heartbeat:
    """An agent is alive.

    Attributes:
        server: the server it runs on.
        session: the agent process's random id.
        epoch: the epoch of the plan it follows (0: none yet; None: not said, left out
            of the payload, by an agent that does not tell). An agent that beats but has
            never said it follows a plan has not received one (it cannot read its plan's
            topic: the broker's ACL): the jobs planned on its server do not run
            (:meth:`~controller.plane.job_review.JobReview.unfinished`).
        sent_at: the agent's clock when it sent the beat, Unix seconds; None from an
            agent that does not say (older ones). The daemon compares it with its own
            clock: an agent follows the next slot's plan from its ``starts_at`` by its
            own clock, so an agent ahead switches plans early and one behind late.
        store: the ``store`` of the plan it follows ("": none, or not said).
        devices_short: its workers running on devices others hold, or without the
            devices their task needs (:mod:`controller.plane.devices`); 0: none, or
            not said (left out of the payload).
        entries_left_out: entries of the plan it follows that it left out as bad
            (:meth:`~controller.plane.plan_messages.SlotPlan.from_dict`): their jobs do not
            run on its server; 0: none, or not said (left out of the payload).
    """

    server: str
    session: str
    epoch: int | None = None
    sent_at: float | None = None
    store: str = ""
    devices_short: int = 0
    entries_left_out: int = 0

    def to_bytes(self) -> bytes:
        unsaid = (
            (("epoch",) if self.epoch is None else ())
            + (("sent_at",) if self.sent_at is None else ())
            + (("store",) if not self.store else ())
            + (("devices_short",) if not self.devices_short else ())
            + (("entries_left_out",) if not self.entries_left_out else ())
        )
        return _dump(self, *unsaid)

    @classmethod
    def parse(cls, payload: bytes | bytearray | str) -> Heartbeat:
        obj = decode(payload, "heartbeat")
        sent_at, epoch = obj.get("sent_at"), obj.get("epoch")
        return cls(
            server=fields.text(fields.require(obj, "server", "heartbeat"), "heartbeat.server"),
            session=_session(fields.require(obj, "session", "heartbeat"), "heartbeat.session"),
            epoch=None if epoch is None else fields.integer(epoch, "heartbeat.epoch", minimum=0),
            sent_at=None if sent_at is None else fields.number(sent_at, "heartbeat.sent_at"),
            store=_run(obj.get("store", ""), "heartbeat.store"),
            devices_short=_below(
                obj.get("devices_short", 0), "heartbeat.devices_short", 0, MAX_DEVICES_SHORT + 1
            ),
            entries_left_out=_below(
                obj.get("entries_left_out", 0),
                "heartbeat.entries_left_out",
                0,
                MAX_ENTRIES_LEFT_OUT + 1,
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
        failures: its worker commands' failures on this agent over the session (exits
            not 0, signals not the agent's, starts that failed, stops by the memory
            guard: :mod:`controller.plane.workers`); 0: none, or not said (left out of
            the payload, as older agents do).
        last_failure: the latest of them in words (``exit status 1``), at most
            :data:`MAX_FAILURE_CHARS` characters; "": none, or not said (left out).
    """

    job: str
    minibatches: float
    worker_seconds: float
    run: str = ""
    failures: int = 0
    last_failure: str = ""

    def to_json(self) -> dict[str, Any]:
        """The entry as a report's payload holds it, its unsaid fields left out."""
        body: dict[str, Any] = {
            "job": self.job, "minibatches": self.minibatches,
            "worker_seconds": self.worker_seconds, "run": self.run,
        }  # fmt: skip
        if self.failures:
            body["failures"] = self.failures
        if self.last_failure:
            body["last_failure"] = self.last_failure
        return body


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
        ignored: what was wrong with each optional field of a kept entry that was
            ignored when parsed (``failures``, ``last_failure``; not sent).
    """

    server: str
    session: str
    jobs: list[TaskProgress]
    refused: list[str] = field(default_factory=list, compare=False)
    ignored: list[str] = field(default_factory=list, compare=False)

    def to_bytes(self) -> bytes:
        # what the receiver found wrong is not sent; an entry's unsaid fields neither
        body = {"version": VERSION, "server": self.server, "session": self.session,
                "jobs": [t.to_json() for t in self.jobs]}  # fmt: skip
        return json.dumps(body, separators=(",", ":")).encode()

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
        ignored: list[str] = []
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
                        failures=_lenient(_failures, m, "failures", w, 0, ignored),
                        last_failure=_lenient(_failure_text, m, "last_failure", w, "", ignored),
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
            ignored=ignored,
        )


def _lenient(
    check: Callable[[Any, str], T],
    entry: Mapping[str, Any],
    key: str,
    where: str,
    unsaid: T,
    ignored: list[str],
) -> T:
    """``check(entry[key], field)`` (``unsaid`` if the entry lacks ``key``); on a
    SpecError, ``unsaid``, and what was wrong added to ``ignored``."""
    if key not in entry:
        return unsaid
    try:
        return check(entry[key], f"{where}.{key}")
    except SpecError as err:
        ignored.append(str(err)[:200])
        return unsaid


def _failures(value: Any, field: str) -> int:
    """A count of worker failures: an integer ``0 .. 2**53``."""
    return _below(value, field, 0, MAX_FAILURES + 1)


def _failure_text(value: Any, field: str) -> str:
    """A worker failure in words: text of at most :data:`MAX_FAILURE_CHARS` characters
    ("" too), its control and invisible characters escaped (a tenant reads it)."""
    if value == "":
        return ""
    return escape(_short(value, field, MAX_FAILURE_CHARS, f"over {MAX_FAILURE_CHARS}"))


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
