"""MQTT topic names (versioned), and which JSON payload is sent on each.

Topics, under ``<prefix>/v1/`` (``prefix`` from ``[mqtt] topic_prefix``):

==============================  =========  ========  ======================================
topic                           from       QoS/ret.  payload
==============================  =========  ========  ======================================
``servers/<server>/plan``       daemon     1, yes    :class:`Plan`: this and the next slot
``servers/<server>/plan/<k>``   daemon     1, yes    part ``k`` (1 ..) of a plan in parts
``jobs/<job>/events``           daemon     1, yes(*) :class:`JobEvent`: the latest event
``daemon/status``               daemon     1, yes    :class:`Status`: online, known servers
``agents/<server>/heartbeat``   agent      0, no     :class:`Heartbeat`
``agents/<server>/progress``    agent      1, no     :class:`Progress`
==============================  =========  ========  ======================================

(*) but a rejection: published, not retained (``event_messages.UNRETAINED``).

Every payload is a JSON object with ``"version": 1`` (2 for a part of a plan in parts,
:mod:`controller.plane.plan_messages`). A plan carries an ``epoch`` that
grows with every plan the daemon issues, across restarts (it is kept in the store): an
agent ignores a plan whose epoch is lower than one it has followed. Progress counts are
cumulative per agent *session* (a random id per agent process), so a report repeated or
lost changes nothing, and a restarted agent does not undo what its predecessor did. On
every connection the daemon publishes every plan and every job's latest event again (a
broker restarted without persistence has lost them); consumers dedupe events on
``sequence``. A job deleted by retention (``daemon.keep_days``) has its retained event
cleared: an empty payload on its ``jobs/<job>/events`` topic, which consumers drop; so
has a job agents run that the store does not know (a store restored from an older
backup: :mod:`controller.plane.unknown_events`). An
agent subscribes to its plan, its plan's parts and the status.

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

Where the rest is. Topic naming is here; the payloads are in
:mod:`controller.plane.plan_messages` (:class:`Plan`, and plans in parts),
:mod:`controller.plane.agent_messages` (:class:`Heartbeat`, :class:`Progress`, the
daemon's :class:`Status`, and the limits on untrusted bytes) and
:mod:`controller.plane.event_messages` (:class:`JobEvent`), over the JSON envelope of
:mod:`controller.plane.codec` (:func:`decode`). This module re-exports all of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from controller.plane.agent_messages import (
    MAX_COUNT,
    MAX_DEVICES_SHORT,
    MAX_REPORT_JOBS,
    MAX_SESSION_CHARS,
    Heartbeat,
    Progress,
    Status,
    TaskProgress,
)
from controller.plane.codec import MAX_AGENT_PAYLOAD_BYTES, MAX_RUN_CHARS, VERSION, _dump, decode
from controller.plane.event_messages import JobEvent, event_kind
from controller.plane.plan_messages import (
    MAX_PLAN_PARTS,
    MAX_PLAN_PAYLOAD_BYTES,
    PART_VERSION,
    Plan,
    PlanParts,
    SlotPlan,
    Task,
)
from pricing import fields
from pricing.errors import SpecError

__all__ = [
    "MAX_AGENT_PAYLOAD_BYTES",
    "MAX_COUNT",
    "MAX_DEVICES_SHORT",
    "MAX_PLAN_PARTS",
    "MAX_PLAN_PAYLOAD_BYTES",
    "MAX_REPORT_JOBS",
    "MAX_RUN_CHARS",
    "MAX_SESSION_CHARS",
    "NAME_PATTERN",
    "PART_VERSION",
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
    "_dump",
    "decode",
    "event_kind",
    "job_level",
    "topic_name",
]


NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")
"""A server name that can be one topic level (``fullmatch``)."""


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
