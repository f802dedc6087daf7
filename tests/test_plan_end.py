"""A job whose plan ends before its agents report all its work: it stays running until
they report the rest (then completes, late) or fails once they have had
``heartbeat_timeout`` seconds after the slot boundary; a job nobody reported on
completes with its plan, as without the plane, once that plan went out to its agents.

The admission controller and the execution plane's daemon side run in-process
(``tests.test_mqtt_units.PlaneDaemon``: SQLite, fake clocks, no broker).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.plane.topics import Heartbeat, Progress, TaskProgress
from tests.test_mqtt_units import PlaneDaemon

TOTAL = PlaneDaemon.TOTAL


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[PlaneDaemon]:
    d = PlaneDaemon(tmp_path)
    d.c.execution = d.ex  # as oasisd wires it: the slot clock asks the plane
    d.ex.connected()  # the broker connection up for long: the grace runs (a job past its
    d.mono[0] = 10 * d.ex.mqtt.heartbeat_timeout  # plan fails only with agents reachable)
    try:
        yield d
    finally:
        d.c.close()


def _past_plan(d: PlaneDaemon, view: Any) -> int:
    """Move the slot clock to the slot after ``view``'s plan; that slot."""
    after = int(view.decision.completion_slot) + 1
    d.clock.advance(after * d.config.slot_seconds)
    asyncio.run(d.c.tick())
    assert d.c.slot == after
    return after


def _report(ex: Any, job_id: str, minibatches: float) -> None:
    """``minibatches`` done so far by one worker session on w0, reported to ``ex``."""
    ex.report(Progress("w0", "a", [TaskProgress(job_id, minibatches, minibatches * 60.0)]))


def _servers_of(d: PlaneDaemon, job_id: str) -> list[str]:
    """The servers ``job_id``'s plan holds workers or parameter servers on, sorted."""
    from sqlalchemy import select

    from controller.store import AllocationRow

    with d.c.db.session() as session:
        rows = session.scalars(select(AllocationRow.server).where(AllocationRow.job_id == job_id))
        return sorted(set(rows))


def _beat_all(ex: Any) -> None:
    """A heartbeat from every server's agent: each is heard."""
    for server in ex.server_index:
        ex.heartbeat(Heartbeat(server, "a"))
    ex.review_sync()  # the decision thread takes them in


def test_a_job_nobody_reported_on_completes_with_its_plan(daemon: PlaneDaemon) -> None:
    _beat_all(daemon.ex)  # its agents are there (workers may print no counts)
    view = daemon.submit("quiet")
    assert daemon.ex.plans_sync({})  # its plan went out (else it fails: test_mqtt_units)
    _past_plan(daemon, view)
    assert daemon.state("quiet") == "completed"


def test_a_job_planned_where_no_agent_was_ever_heard_fails_naming_those_servers(
    daemon: PlaneDaemon,
) -> None:
    """Before, a job planned on servers whose agent was never heard (not installed, a
    wrong password), which nobody reported on, completed with its whole utility at its
    plan's end; the README said it fails ``plan_ended``. Now it does, naming them."""
    view = daemon.submit("unheard")
    planned = _servers_of(daemon, "unheard")
    others = [s for s in daemon.ex.server_index if s not in planned]
    heard = planned[1:] + others  # all but the first of its servers are heard
    for server in heard:
        daemon.ex.heartbeat(Heartbeat(server, "a"))
    assert daemon.ex.review_sync() == []
    assert daemon.ex.plans_sync({})
    _past_plan(daemon, view)
    assert daemon.state("unheard") == "running"  # its agents' grace, as any job short
    daemon.clock.advance(daemon.ex.mqtt.heartbeat_timeout + 1.0)
    for server in heard:  # still beating: heard, not failed
        daemon.ex.heartbeat(Heartbeat(server, "a"))
    [failed] = [e for e in daemon.ex.review_sync() if e.kind == "failed"]
    assert failed.detail["reason"] == "plan_ended", failed.detail
    assert failed.detail["agents_never_heard"] == planned[:1], failed.detail
    # named once, for what it is: an agent never heard follows no plan, but is not said so
    assert "agents_following_no_plan" not in failed.detail, failed.detail
    reason = daemon.c._get_sync("unheard").decision.reason
    assert f"the agent of {planned[0]}, where its plan placed it, was never heard" in reason


def test_a_job_planned_where_the_agent_follows_no_plan_fails_naming_it(
    daemon: PlaneDaemon,
) -> None:
    """The agents audit: an agent that beats but never had a plan (its broker user
    cannot read its plan's topic) left every job planned on its server, which nobody
    reported on, completed with its whole utility. Its beats say ``epoch`` 0: the job
    fails ``plan_ended`` naming it. A beat that does not say its epoch counts as
    following (an agent that does not tell), and so does every server heard before a
    restart by a daemon that did not keep which followed."""
    assert b'"epoch"' not in Heartbeat("w0", "a").to_bytes()  # not said: left out
    assert Heartbeat.parse(b'{"version":1,"server":"w0","session":"a"}').epoch is None
    view = daemon.submit("planless")
    planned = _servers_of(daemon, "planless")
    for server in daemon.ex.server_index:  # all heard; the first of its servers plan-less
        daemon.ex.heartbeat(Heartbeat(server, "a", 0 if server == planned[0] else 3))
    assert daemon.ex.review_sync() == []
    assert daemon.ex.plans_sync({})
    _past_plan(daemon, view)
    daemon.clock.advance(daemon.ex.mqtt.heartbeat_timeout + 1.0)
    [failed] = [e for e in daemon.ex.review_sync() if e.kind == "failed"]
    assert failed.detail["agents_following_no_plan"] == planned[:1], failed.detail
    # on /metrics once it has beaten so for NO_PLAN_SECONDS (connected seconds)
    from controller.plane.execution import NO_PLAN_SECONDS
    from tests.test_mqtt_units import _metric

    assert _metric(daemon, "oasis_agents_following_no_plan") == [({}, 0.0)]
    daemon.mono[0] += NO_PLAN_SECONDS
    daemon.ex.heartbeat(Heartbeat(planned[0], "a", 0))
    assert daemon.ex.following_no_plan() == planned[:1]
    assert _metric(daemon, "oasis_agents_following_no_plan") == [({}, 1.0)]
    daemon.ex.heartbeat(Heartbeat(planned[0], "a", 4))  # its plan came: no longer
    assert _metric(daemon, "oasis_agents_following_no_plan") == [({}, 0.0)]
    assert "agents_never_heard" not in failed.detail
    reason = daemon.c._get_sync("planless").decision.reason
    assert f"the agent of {planned[0]}, where its plan placed it, never had a plan" in reason
    # kept in the store; an older daemon's state without it: every server heard follows
    from sqlalchemy import update

    from controller.plane.execution import Execution
    from controller.store import MetaRow

    def reloaded() -> set[str]:
        ex = Execution(daemon.c, daemon.ex.mqtt, monotonic=lambda: daemon.mono[0])
        ex.load()
        return ex.following

    assert reloaded() == set(daemon.ex.server_index) - {planned[0]}
    with daemon.c._write() as session:
        row = session.get(MetaRow, "plane")
        assert row is not None
        value = dict(row.value)
        del value["following"]
        session.execute(update(MetaRow).where(MetaRow.key == "plane").values(value=value))
    assert reloaded() == set(daemon.ex.server_index)


def test_a_job_whose_plan_its_agent_never_took_fails_naming_it(daemon: PlaneDaemon) -> None:
    """The agents audit: an agent following an older plan than the one that carried a
    job to its server (it refused the newer as a whole, or cannot read its parts) never
    ran it there, and the job, which nobody reported on, completed with its whole
    utility. One that took it (or a later one) counts as having run it."""
    ex = daemon.ex
    assert ex.plans_sync({}) and ex.epoch == 1  # plans of no job, taken by every agent
    view = daemon.submit("old")
    planned = _servers_of(daemon, "old")
    assert ex.plans_sync({}) and ex.epoch == 2  # the plans carrying it
    assert ex.taken.first["old"] == dict.fromkeys(planned, 2)
    for server in ex.server_index:  # the first of its servers still on epoch 1
        ex.heartbeat(Heartbeat(server, "a", 1 if server == planned[0] else 2))
    assert ex.review_sync() == []
    _past_plan(daemon, view)
    daemon.clock.advance(ex.mqtt.heartbeat_timeout + 1.0)
    [failed] = [e for e in ex.review_sync() if e.kind == "failed"]
    assert failed.detail["agents_behind_their_plan"] == planned[:1], failed.detail
    reason = daemon.c._get_sync("old").decision.reason
    assert f"the agent of {planned[0]}, where its plan placed it, never took that plan" in reason


def test_a_job_whose_plan_its_agents_took_completes_with_it(daemon: PlaneDaemon) -> None:
    ex = daemon.ex
    assert ex.plans_sync({})
    view = daemon.submit("took")
    assert ex.plans_sync({}) and ex.epoch == 2
    for server in ex.server_index:
        ex.heartbeat(Heartbeat(server, "a", 2))
    ex.review_sync()
    for server in ex.server_index:  # a later one still counts
        ex.heartbeat(Heartbeat(server, "a", 3))
    _past_plan(daemon, view)
    daemon.clock.advance(ex.mqtt.heartbeat_timeout + 1.0)
    ex.review_sync()
    assert daemon.state("took") == "completed"


def test_the_rest_reported_after_the_plan_ended_completes_it_late(daemon: PlaneDaemon) -> None:
    view = daemon.submit("j")
    _report(daemon.ex, "j", 12.0)
    assert daemon.ex.review_sync() == []
    after = _past_plan(daemon, view)
    assert daemon.state("j") == "running"  # 12 of 20 reported: not done
    assert daemon.ex.review_sync() == []  # within heartbeat_timeout of the boundary
    _report(daemon.ex, "j", float(TOTAL))
    events = daemon.ex.review_sync()
    assert [e.kind for e in events] == ["completed"]
    assert daemon.state("j") == "completed"
    late = daemon.c._get_sync("j").decision
    assert (late.completion_slot, late.jct) == (after, after - view.decision.arrival_slot + 1)


def test_one_mini_batch_short_at_the_plan_end_is_short(daemon: PlaneDaemon) -> None:
    """A job whose agents reported all but one of its mini-batches when its plan ended
    is not done: it stays running, and fails once the grace is over (a bound of a whole
    mini-batch, not a rounding error's, completed it with its whole utility)."""
    view = daemon.submit("m")
    _report(daemon.ex, "m", float(TOTAL - 1))
    assert daemon.ex.review_sync() == []
    _past_plan(daemon, view)
    assert daemon.state("m") == "running"
    daemon.clock.advance(daemon.ex.mqtt.heartbeat_timeout + 1.0)
    events = daemon.ex.review_sync()
    assert [(e.kind, e.detail["minibatches"]) for e in events] == [("failed", TOTAL - 1.0)]


def test_silence_after_the_plan_ended_short_fails_the_job(daemon: PlaneDaemon) -> None:
    view = daemon.submit("k")
    _report(daemon.ex, "k", 5.0)
    daemon.ex.review_sync()
    _past_plan(daemon, view)
    assert daemon.state("k") == "running"
    assert daemon.ex.review_sync() == []
    daemon.clock.advance(daemon.ex.mqtt.heartbeat_timeout + 1.0)
    events = daemon.ex.review_sync()
    assert [(e.kind, e.state) for e in events] == [("failed", "failed")]
    detail = events[0].detail
    assert detail["reason"] == "plan_ended"
    assert (detail["minibatches"], detail["of"]) == (5.0, TOTAL)
    assert daemon.state("k") == "failed"
    # its submitter reads why with the job (the event stream is an operator's)
    reason = daemon.c._get_sync("k").decision.reason
    assert reason == (f"failed: its plan ended in slot {detail['completion_slot']} and its "
                      f"agents reported 5 of its {TOTAL} mini-batches"), reason  # fmt: skip
    assert daemon.ex.review_sync() == []  # failed once


def test_a_job_cancelled_while_it_ran_past_its_plan_stays_cancelled(daemon: PlaneDaemon) -> None:
    """A job short of its work at its plan's end, cancelled by its tenant before the
    grace ran out, is not failed afterwards: the grace's check reads its state (the
    mutation audit: that check could be dropped with every test passing, and the
    cancelled job became ``failed``, a ``failed`` event on the record)."""
    view = daemon.submit("c")
    _report(daemon.ex, "c", 5.0)
    daemon.ex.review_sync()
    _past_plan(daemon, view)
    assert daemon.state("c") == "running"
    assert daemon.ex.review_sync() == []  # short, within the grace: kept to see
    asyncio.run(daemon.c.cancel("c"))
    assert daemon.state("c") == "cancelled"
    daemon.clock.advance(daemon.ex.mqtt.heartbeat_timeout + 1.0)
    assert daemon.ex.review_sync() == []
    assert daemon.state("c") == "cancelled"


def test_a_job_failed_for_its_failing_workers_says_what_its_agents_said(
    daemon: PlaneDaemon,
) -> None:
    """The failure's event is stored and read by the job's tenant; it now carries the
    workers' failures the agents last said (before: only ``plan_ended``, the reason in
    the agent's log on the server), and so does the ``behind`` (``no_progress``) one."""
    view = daemon.submit("f")
    planned = view.decision.work * 3600.0
    failing = TaskProgress("f", 0.0, planned, failures=7, last_failure="exit status 3")
    daemon.ex.report(Progress("w0", "a", [failing]))
    said = [{"server": "w0", "failures": 7, "last_failure": "exit status 3"}]
    (behind,) = daemon.ex.review_sync()
    assert (behind.kind, behind.detail["reason"]) == ("behind", "no_progress")
    assert behind.detail["worker_failures"] == said
    _past_plan(daemon, view)
    daemon.clock.advance(daemon.ex.mqtt.heartbeat_timeout + 1.0)
    (failed,) = daemon.ex.review_sync()
    assert (failed.kind, failed.detail["reason"]) == ("failed", "plan_ended")
    assert failed.detail["worker_failures"] == said
    assert daemon.c._events_sync(0)[-1].detail == failed.detail  # as stored
    reason = daemon.c._get_sync("f").decision.reason
    assert reason.endswith("; its workers failed 7 time(s) on w0, last: exit status 3"), reason


def test_no_job_fails_while_its_agents_cannot_be_heard(daemon: PlaneDaemon) -> None:
    """Past its plan, short, and silent for the grace -- but the broker connection is
    down, or up for less than the grace (just reconnected, or the daemon just started):
    the agents may have finished and not been able to say so, so the job stays open."""
    view = daemon.submit("d")
    _report(daemon.ex, "d", 5.0)
    daemon.ex.review_sync()
    _past_plan(daemon, view)
    daemon.clock.advance(daemon.ex.mqtt.heartbeat_timeout + 1.0)
    daemon.ex.disconnected()
    assert daemon.ex.review_sync() == [] and daemon.state("d") == "running"
    daemon.ex.connected()  # just back: its grace counts from now
    assert daemon.ex.review_sync() == [] and daemon.state("d") == "running"
    daemon.mono[0] += daemon.ex.mqtt.heartbeat_timeout + 1.0  # (w0 silent too: failed)
    assert [e.kind for e in daemon.ex.review_sync() if e.job_id == "d"] == ["failed"]


def test_the_grace_counts_from_the_end_of_the_plan(daemon: PlaneDaemon) -> None:
    """Slots past its plan, a short job fails at the first review, not after the grace
    of the current slot's boundary."""
    view = daemon.submit("m")
    _report(daemon.ex, "m", 5.0)
    daemon.ex.review_sync()
    late = int(view.decision.completion_slot) + 3
    daemon.clock.advance(late * daemon.config.slot_seconds)  # a second into slot `late`
    asyncio.run(daemon.c.tick())
    assert daemon.state("m") == "running"
    assert [e.kind for e in daemon.ex.review_sync()] == ["failed"]


def test_a_restart_after_the_plan_ended_keeps_the_job_open(daemon: PlaneDaemon) -> None:
    """The daemon restarts after a job's plan ended short: opening the store must not
    complete it before the execution plane (with its stored progress) is attached."""
    import structlog

    from controller.admission import AdmissionController
    from controller.clock import SlotClock
    from controller.config import from_dict
    from controller.plane.execution import Execution
    from controller.plane.settings import MqttConfig
    from controller.store import Database
    from tests.test_mqtt_units import CLUSTER

    view = daemon.submit("r")
    first = min(int(a["slot"]) for a in view.decision.allocations)
    daemon.clock.advance(first * daemon.config.slot_seconds)
    asyncio.run(daemon.c.tick())
    assert daemon.state("r") == "running"
    _report(daemon.ex, "r", 7.0)
    daemon.ex.review_sync()  # progress stored
    daemon.c.close()

    after = int(view.decision.completion_slot) + 1
    daemon.clock.advance((after - first) * daemon.config.slot_seconds)  # down meanwhile
    config = from_dict(
        {
            "daemon": {"data_dir": str(daemon.config.data_dir), "window": 6, "epoch": 0},
            "cluster": CLUSTER,
            "mqtt": {"url": "mqtt://127.0.0.1:1"},  # never connected here
        }
    )
    c = AdmissionController(
        config,
        Database(config.database_url),
        SlotClock(daemon.clock, config.slot_seconds, 0.0),
        log=structlog.wrap_logger(structlog.ReturnLogger()),
    )
    daemon.c = c  # closed by the fixture
    c.open()
    assert daemon.state("r") == "running"  # not completed before the plane is attached
    ex = Execution(c, MqttConfig("localhost"), monotonic=lambda: daemon.mono[0])
    ex.load()
    c.execution = ex
    asyncio.run(c.tick())
    assert daemon.state("r") == "running"  # 7 of 20 reported: left open, then ...
    _report(ex, "r", float(TOTAL))
    assert [e.kind for e in ex.review_sync()] == ["completed"]  # ... completed, late
    assert daemon.state("r") == "completed"
