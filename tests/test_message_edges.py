"""Edges of the MQTT messages between the daemon and the node agents
(controller/plane/topics.py, agent_messages.py, plan_messages.py, plans.py,
sent_plans.py) that the mutation audit of 2026-12-03 found no test pinned: an agent's
payload is untrusted, and a plan must carry exactly the admitted schedule."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from controller.plane.agent_messages import MAX_COUNT, Heartbeat, Progress, Status, TaskProgress
from controller.plane.plan_messages import Plan, PlanParts, SlotPlan, Task
from controller.plane.topics import Topics
from pricing.errors import SpecError


def _report(*entries: dict[str, Any]) -> bytes:
    return json.dumps(
        {"version": 1, "server": "w0", "session": "s", "jobs": list(entries)}
    ).encode()


def test_an_agent_topic_under_another_prefix_of_the_same_length_names_no_agent() -> None:
    """The mutation audit: ``agent_of`` without its prefix check passed every test (the
    other prefix tested was shorter, so its server level came out empty); a topic of
    another prefix or version with the same length then named an agent."""
    t = Topics("oasis")
    assert t.agent_of("oasis/v1/agents/w0/progress") == ("w0", "progress")
    for other in ("other/v1/agents/w0/progress", "oasis/v2/agents/w0/heartbeat",
                  "oasis/v1/servers/w0/heartbeat"):  # fmt: skip
        assert t.agent_of(other) is None, other


def test_a_reports_count_of_exactly_two_to_the_53_is_kept_and_one_past_it_left_out() -> None:
    """The mutation audit: a bound read as ``>=`` (2**53 itself refused) passed every
    test; the counts are documented as ``0 .. 2**53``."""
    edge = {"job": "a", "minibatches": MAX_COUNT, "worker_seconds": MAX_COUNT}
    past = {"job": "b", "minibatches": MAX_COUNT * 2, "worker_seconds": 1}
    got = Progress.parse(_report(edge, past))
    assert got.jobs == [TaskProgress("a", float(MAX_COUNT), float(MAX_COUNT))]
    assert [r.split(":")[0] for r in got.refused] == ["progress.jobs[1].minibatches"]


def test_a_heartbeats_epoch_is_an_integer_from_0_and_0_is_said_not_left_out() -> None:
    """The mutation audit: a negative epoch let through, and an epoch of 0 ("none yet")
    left out of the payload as though not said (None), both passed every test."""
    for epoch, said in ((0, b'"epoch":0'), (7, b'"epoch":7')):
        beat = Heartbeat("w0", "s", epoch)
        assert said in beat.to_bytes() and Heartbeat.parse(beat.to_bytes()) == beat
    assert Heartbeat.parse(Heartbeat("w0", "s").to_bytes()).epoch is None
    with pytest.raises(SpecError, match=re.escape("heartbeat.epoch: must be >= 0")):
        Heartbeat.parse(b'{"version": 1, "server": "w0", "session": "s", "epoch": -1}')


def test_the_daemons_status_is_online_only_as_a_boolean_and_its_servers_only_names() -> None:
    """The mutation audit: ``online`` taken as any value said (``"false"``, a string, is
    truthy) and ``servers`` as any list, both passed every test; an agent reads it to
    stop for a server the daemon does not know."""
    assert Status.parse(Status(True, ["w0", "p0"]).to_bytes()) == Status(True, ["w0", "p0"])
    assert Status.parse(Status(False).to_bytes()) == Status(False)
    for online in (b'"false"', b"0", b"1", b"null"):
        with pytest.raises(SpecError, match=re.escape("status.online")):
            Status.parse(b'{"version": 1, "online": ' + online + b"}")
    for servers in (b"[1]", b'["w0", null]', b'"w0"'):
        with pytest.raises(SpecError, match=re.escape("status.servers")):
            Status.parse(b'{"version": 1, "online": true, "servers": ' + servers + b"}")


def _plan(*tasks: Task, following: tuple[Task, ...] = (), **kw: Any) -> Plan:
    return Plan("w0", "worker", 7, 10.0, 0.5, False, SlotPlan(5, 100.0, list(tasks)),
                SlotPlan(6, 110.0, list(following)), **kw)  # fmt: skip


def test_a_task_of_no_time_a_mini_batch_is_left_out_and_the_others_kept() -> None:
    """The mutation audit: a task's ``minibatch_seconds`` of 0 let through (as a count,
    not a time) passed every test; an agent divides by it (its simulated rate)."""
    ok = Task("ok", 2, 0, 0.5, 40)
    payload = _plan(Task("zero", 2, 0, 0.25, 40), ok).to_bytes()
    got = Plan.parse(payload.replace(b'"minibatch_seconds":0.25', b'"minibatch_seconds":0'))
    assert got.current.tasks == [ok] and got.current.refused == 1
    assert got.current.refused_error.startswith("plan.current.tasks[0].minibatch_seconds")


def test_a_tasks_fraction_of_a_device_is_carried_in_the_plan() -> None:
    """The mutation audit: ``devices`` left out of a task's payload unless whole (read
    back as 0: none) passed every test, which planned whole devices only; a job of half
    a GPU a worker then ran as one of none."""
    for devices in (0.5, 0.25, 1.0, 2.5):
        p = _plan(Task("j", 1, 0, 0.5, 40, devices=devices))
        assert Plan.parse(p.to_bytes()).current.tasks[0].devices == devices


def test_a_plan_in_over_a_hundred_parts_keeps_each_within_the_bytes_and_goes_back_whole() -> None:
    """The mutation audit: the room for tasks measured under a header numbered as a
    plan's first of two parts (``"part":1,"parts":2``), not its widest, passed every
    test: the parts of 573 bytes at most came out 3 bytes over ``max_bytes`` (a broker's
    ``max_packet_size`` drops the daemon's connection for it, every server's plans
    with it)."""
    p = _plan(*[Task(f"j{i}", 1, 0, 0.5, 40) for i in range(600)])
    for max_bytes in range(569, 577):
        parts = p.split(max_bytes)
        assert len(parts) >= 150
        assert max(len(q.to_bytes()) for q in parts) <= max_bytes, max_bytes
    held = PlanParts()
    assert [held.add(Plan.parse(q.to_bytes())) for q in parts][-1] == p


def test_the_entries_left_out_of_a_plan_are_counted_over_both_slots() -> None:
    """The mutation audit: ``Plan.left_out`` counting the current slot's only passed
    every test; an agent's heartbeat says the count, and the daemon warns of it (a job
    left out of the next slot's plan does not run there)."""
    ok, bad = Task("ok", 1, 0, 0.5, 40), Task("bad", 1, 0, 0.5, 40)
    payload = _plan(ok, following=(bad, ok)).to_bytes()
    got = Plan.parse(payload.replace(b'"job":"bad","workers":1', b'"job":"bad","workers":-1'))
    assert got.next.tasks == [ok] and got.left_out[0] == 1
    assert got.left_out[1].startswith("plan.next.tasks[0].workers")
    both = Plan.parse(payload.replace(b'"job":"ok","workers":1', b'"job":"ok","workers":-1'))
    assert both.current.tasks == [] and both.next.tasks == [bad]
    assert both.left_out[0] == 2 and both.left_out[1].startswith("plan.current.tasks[0]")


def test_a_plan_has_the_same_content_as_another_only_if_all_but_its_epoch_is_the_same() -> None:
    """The mutation audit: ``same_content`` comparing a plan's next slot with its own
    passed every test; a round publishes only the plans whose content changed, so a job
    admitted into the next slot alone never reached its agent."""
    task = Task("j", 1, 0, 0.5, 40)
    p = _plan(task, devices=2, window=24)
    assert p.same_content(dataclasses.replace(p, epoch=8)) and not p.same_content(None)
    for other in (_plan(task, following=(task,), devices=2, window=24),
                  _plan(devices=2, window=24), _plan(task, devices=1, window=24),
                  _plan(task, devices=2, window=25), _plan(task, window=24),
                  dataclasses.replace(p, down=True), dataclasses.replace(p, kind="ps"),
                  dataclasses.replace(p, heartbeat_seconds=1.0),
                  dataclasses.replace(p, next=SlotPlan(7, 120.0))):  # fmt: skip
        assert not p.same_content(other) and not other.same_content(p), other


def test_a_whole_plan_says_version_1_and_a_part_version_2() -> None:
    """The mutation audit: a whole plan (no ``parts``) saying version 2 let through
    passed every test; each version goes with its own kind of plan only."""
    whole = _plan(Task("j", 1, 0, 0.5, 40)).to_bytes()
    assert whole.startswith(b'{"version":1,')
    with pytest.raises(SpecError, match=re.escape("plan.version: 2 for a part")):
        Plan.parse(whole.replace(b'{"version":1,', b'{"version":2,', 1))
    part = dataclasses.replace(_plan(), part=0, parts=2).to_bytes()
    with pytest.raises(SpecError, match=re.escape("plan.version: 2 for a part")):
        Plan.parse(part.replace(b'{"version":2,', b'{"version":1,', 1))


def test_a_part_received_again_is_not_counted_twice_against_the_epochs_tasks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mutation audit: the tasks of a part already held counted again when the same
    part came back (the broker sends retained parts again at every connection) passed
    every test; a plan near :data:`MAX_PLAN_TASKS` was then dropped and never followed."""
    from controller.plane import plan_messages

    monkeypatch.setattr(plan_messages, "MAX_PLAN_TASKS", 4)
    tasks = [Task(f"j{i}", 1, 0, 0.5, 40) for i in range(4)]
    first = dataclasses.replace(_plan(*tasks[:3]), part=0, parts=2)
    second = dataclasses.replace(_plan(tasks[3]), part=1, parts=2)
    held = PlanParts()
    assert held.add(first) is None and held.add(first) is None
    assert held.add(second) == _plan(*tasks)
    with pytest.raises(SpecError, match="hold over 4 tasks"):  # the bound itself stands
        held.add(dataclasses.replace(_plan(*tasks, tasks[0]), part=0, parts=2))


def test_an_epoch_claim_past_the_highest_followed_moves_nothing_even_one_step_away() -> None:
    """The mutation audit: the cap :data:`MAX_FOLLOWED_EPOCH` dropped (only the step
    :data:`MAX_EPOCH_STEP` kept) passed every test, whose daemon's epoch was far below
    it; a hostile agent's claims then moved a daemon near it up to 2**53, past which no
    plan's epoch parses."""
    from controller.plane.plans import MAX_EPOCH_STEP, MAX_FOLLOWED_EPOCH, EpochClaims
    from controller.plane.settings import MqttConfig

    clock = [0.0]

    def heard(epoch: int, own: int) -> tuple[int, str, bool]:
        claims = EpochClaims(MqttConfig("localhost"), lambda: clock[0])
        assert not claims.heard(epoch, "w1", own)  # within an agent's beat: not yet due
        return claims.take()

    top = MAX_FOLLOWED_EPOCH
    for epoch, own in ((top + 1, top - 5), (top + 1, top), (2 + MAX_EPOCH_STEP + 1, 2), (7, 7)):
        assert heard(epoch, own) == (0, "", False), (epoch, own)  # nothing heard
    for epoch, own in ((top, top - 5), (2 + MAX_EPOCH_STEP, 2), (8, 7)):
        assert heard(epoch, own) == (epoch, "w1", False), (epoch, own)


def _job(worker: dict[str, float], ps: dict[str, float], gpus: float = 8) -> tuple[Any, Any]:
    """A job of ``worker`` and ``ps`` demands on a cluster of a worker server of
    ``gpus`` GPUs and a PS server, and the cluster's config."""
    from controller.config import from_dict
    from pricing.job import job_from_dict

    big = {"gpu": gpus, "cpu": 64, "mem": 512, "disk": 500, "bandwidth": 25}
    servers = [{"name": "w0", "kind": "worker", "capacity": big},
               {"name": "p0", "kind": "ps", "capacity": big}]  # fmt: skip
    cfg = from_dict({"cluster": {"resources": list(big), "servers": servers}})
    spec = {"id": "j", "epochs": 2, "chunks": 8, "minibatches": 50, "tau": 0.01, "grad_mb": 100,
            "worker": worker, "ps": ps,
            "utility": {"kind": "sigmoid", "priority": 50, "decay": 0.5, "target": 3}}  # fmt: skip
    job = job_from_dict(spec, cfg.cluster, slot_seconds=cfg.slot_seconds,
                        slots_available=lambda _a: 300, arrival=0)  # fmt: skip
    return job, cfg


def test_a_ps_task_carries_the_jobs_demand_of_a_ps_and_a_worker_task_a_workers() -> None:
    """The mutation audit: a PS task given the job's demand of a worker passed every
    test (the round trip of whatever demand is given does not tell); an agent's memory
    guard holds each process to its task's ``mem``."""
    from controller.plane.plans import plan_task, task_demand

    job, cfg = _job(
        {"gpu": 1, "cpu": 4, "mem": 8, "bandwidth": 1}, {"cpu": 2, "mem": 16, "bandwidth": 5}
    )
    resources = list(enumerate(cfg.cluster.resources))
    assert task_demand(job, "worker", resources) == {
        "gpu": 1, "cpu": 4, "mem": 8, "disk": 0, "bandwidth": 1}  # fmt: skip
    ps = task_demand(job, "ps", resources)
    assert ps == {"gpu": 0, "cpu": 2, "mem": 16, "disk": 0, "bandwidth": 5}
    task = plan_task("j", job, "ps", 0, 2, "", 0, ps, cfg.slot_seconds)
    assert (task.ps, task.workers, task.devices, task.demand) == (2, 0, 0.0, ps)
    assert plan_task("j", job, "worker", 3, 0, "", 0, {}, cfg.slot_seconds).devices == 1.0


def test_a_tasks_devices_are_at_most_what_an_agent_takes() -> None:
    """The mutation audit: a task's devices not capped at :data:`MAX_DEVICES` passed
    every test; a job whose worker needs more GPUs (on a server of more than 1024) then
    gave an entry every agent leaves out, its job never run."""
    from controller.plane.devices import MAX_DEVICES
    from controller.plane.plans import plan_task

    job, cfg = _job({"gpu": 2000, "bandwidth": 1}, {"bandwidth": 1}, gpus=4096)
    task = plan_task("j", job, "worker", 1, 0, "", 0, {}, cfg.slot_seconds)
    assert task.devices == MAX_DEVICES
    back = Plan.parse(_plan(task).to_bytes())
    assert back.current.tasks == [task] and back.current.refused == 0


def test_a_jobs_unsent_plans_run_from_the_first_slot_any_of_its_writes_changed() -> None:
    """The mutation audit: of a job's plan writes since the latest round that went out,
    the first slot taken from the last write read (not the earliest) passed every test.
    A job admitted from slot 1 and re-planned from slot 3 while the broker was out then
    had only slot 3 noted as never sent: its slots 1 and 2, whose plans no agent had,
    counted as sent (``plan_not_sent`` missed)."""
    from datetime import datetime

    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from controller.plane.sent_plans import SentPlans
    from controller.store.models import AllocationRow, Base, EventRow

    engine = create_engine("sqlite://")
    Base.metadata.create_all(engine)
    at = datetime(2026, 12, 3)
    with Session(engine) as session:
        session.add_all([
            EventRow(at=at, kind="decided", job_id="j", slot=1, state="admitted"),
            EventRow(at=at, kind="replanned", job_id="j", slot=3, detail={"from_slot": 3}),
            EventRow(at=at, kind="decided", job_id="no", slot=1, state="rejected"),
            EventRow(at=at, kind="decided", job_id="ps", slot=1, state="admitted"),
            *(AllocationRow(job_id="j", slot=s, server="w0", workers=1) for s in range(1, 6)),
            AllocationRow(job_id="ps", slot=2, server="p0", ps=1),  # no workers: not run
        ])  # fmt: skip
        session.commit()
        assert SentPlans().runs_of("j", session, 4) == [(1, 3)]
        assert SentPlans().runs_of("j", session, 1) == []  # none before its first slot
        sent = SentPlans()
        sent.went_out(session, 4, 4)
        assert sent.runs == {"j": [(1, 3)]} and sent.sent_event == 4
        assert sent.runs_of("j", session, 4) == [(1, 3)]


def test_a_report_entrys_run_is_text_of_at_most_64_characters_else_the_entry_left_out() -> None:
    """The mutation audit: an entry's ``run`` taken as whatever it was, made text,
    passed every test; the daemon compares it with its jobs' runs and keeps the counts
    under it (a run of 200,000 characters per entry, or ``{"a": 1}`` read as text)."""
    from controller.plane.codec import MAX_RUN_CHARS

    ok = {"job": "ok", "minibatches": 1, "worker_seconds": 1, "run": "r" * MAX_RUN_CHARS}
    bad = [{**ok, "job": "long", "run": "r" * (MAX_RUN_CHARS + 1)},
           {**ok, "job": "num", "run": 5}, {**ok, "job": "obj", "run": {"a": 1}}]  # fmt: skip
    got = Progress.parse(_report(ok, *bad))
    assert got.jobs == [TaskProgress("ok", 1.0, 1.0, "r" * MAX_RUN_CHARS)]
    assert [r.split(":")[0] for r in got.refused] == [f"progress.jobs[{i}].run" for i in (1, 2, 3)]


def test_a_plans_bounds_on_a_tasks_devices_its_part_and_its_window() -> None:
    """The mutation audit: a task's devices up to 1025 (not :data:`MAX_DEVICES`), a
    ``part`` of 256 (parts are numbered below :data:`MAX_PLAN_PARTS`) and a ``window`` of
    0 slots (an agent drops a set-aside job's counts ``window + 1`` slots after its run)
    let through, each passed every test."""
    from controller.plane.devices import MAX_DEVICES
    from controller.plane.plan_messages import MAX_PLAN_PARTS

    payload = _plan(Task("j", 1, 0, 0.5, 40, devices=0.5)).to_bytes()
    for devices, kept in (
        (MAX_DEVICES, True),
        (MAX_DEVICES + 0.5, False),
        (MAX_DEVICES + 1, False),
    ):
        got = Plan.parse(payload.replace(b'"devices":0.5', f'"devices":{devices}'.encode()))
        assert (got.current.refused == 0) == kept, devices
    part = dataclasses.replace(_plan(), part=MAX_PLAN_PARTS - 1, parts=MAX_PLAN_PARTS)
    assert Plan.parse(part.to_bytes()) == part
    with pytest.raises(SpecError, match=re.escape("plan.part: must be below 256")):
        Plan.parse(dataclasses.replace(part, part=MAX_PLAN_PARTS).to_bytes())
    windowed = _plan(window=1)
    assert Plan.parse(windowed.to_bytes()) == windowed
    with pytest.raises(SpecError, match=re.escape("plan.window: must be >= 1")):
        Plan.parse(dataclasses.replace(windowed, window=0).to_bytes())


def test_a_part_that_says_another_count_of_parts_than_its_epochs_others_is_refused() -> None:
    """The mutation audit: ``parts`` left out of the header the parts of an epoch must
    share passed every test; a part saying fewer parts then completed the plan without
    the tasks of those not yet in (a tenant's job dropped from the plan an agent
    followed)."""
    tasks = [Task(f"j{i}", 1, 0, 0.5, 40) for i in range(3)]
    held = PlanParts()
    assert held.add(dataclasses.replace(_plan(tasks[0]), part=0, parts=3)) is None
    with pytest.raises(SpecError, match="part 1 of epoch 7 does not match"):
        held.add(dataclasses.replace(_plan(tasks[1]), part=1, parts=2))
    assert held.add(dataclasses.replace(_plan(tasks[1]), part=1, parts=3)) is None
    assert held.add(dataclasses.replace(_plan(tasks[2]), part=2, parts=3)) == _plan(*tasks)


def test_a_server_of_many_gpus_and_a_cluster_of_many_resources_get_plans_agents_take(
    tmp_path: Path,
) -> None:
    """The mutation audit: a server's devices not capped at :data:`MAX_DEVICES` and a
    task's demand not cut to :data:`MAX_DEMAND_ENTRIES` resources each passed every
    test; an agent then refused the plan of a server of 4096 GPUs whole (every tenant's
    tasks there), and left out every task of a cluster of 66 resources."""
    from controller.plane.demand import MAX_DEMAND_ENTRIES
    from controller.plane.devices import MAX_DEVICES
    from tests.test_mqtt_units import PlaneDaemon

    extra = [f"r{i}" for i in range(MAX_DEMAND_ENTRIES)]
    cluster = {
        "resources": ["gpu", "bandwidth", *extra],
        "servers": [
            {"name": "w0", "kind": "worker", "capacity": {"gpu": 4096, "bandwidth": 10}},
            {"name": "p0", "kind": "ps", "capacity": {"bandwidth": 10}},
        ],
    }
    daemon = PlaneDaemon(tmp_path, cluster)
    try:
        daemon.submit("j")
        plans = {p.server: p for p in daemon.ex.plans_sync({})}
    finally:
        daemon.c.close()
    assert plans["w0"].devices == MAX_DEVICES and plans["p0"].devices == 0
    for plan in plans.values():
        back = Plan.parse(plan.to_bytes())
        assert back.left_out == (0, "") and back == plan
        tasks = [t for slot in (back.current, back.next) for t in slot.tasks]
        assert {t.job for t in tasks} == {"j"}
        assert all(len(t.demand) == MAX_DEMAND_ENTRIES for t in tasks)


def test_the_newest_unsent_runs_of_a_job_are_kept_from_the_stored_state() -> None:
    """The mutation audit: the oldest :data:`MAX_RUNS_PER_JOB` runs kept from the
    plane's stored state (not the newest, as :meth:`SentPlans.went_out` keeps them)
    passed every test; a job's recent unsent slots were forgotten at a restart."""
    from controller.plane.sent_plans import MAX_RUNS_PER_JOB, SentPlans

    runs = [[3 * i, 3 * i + 1] for i in range(MAX_RUNS_PER_JOB + 4)]
    sent = SentPlans()
    sent.load(7, {"j": runs}, newest=40, oldest=0)
    assert sent.runs == {"j": [tuple(r) for r in runs[-MAX_RUNS_PER_JOB:]]}


def test_a_slow_jobs_re_plan_changed_its_plan_from_the_slot_after_its_own() -> None:
    """The mutation audit: a re-plan that says no ``from_slot`` (a slow job's) read as
    changing its own slot, whose plan had gone out, passed every test; a round going
    out in the next slot then noted that slot as never sent, and the job could fail
    ``plan_not_sent`` though its agents had run it."""
    from datetime import datetime

    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from controller.plane.sent_plans import SentPlans
    from controller.store.models import AllocationRow, Base, EventRow

    engine = create_engine("sqlite://")
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        session.add_all([
            EventRow(at=datetime(2026, 12, 3), kind="replanned", job_id="slow", slot=3),
            *(AllocationRow(job_id="slow", slot=s, server="w0", workers=1) for s in range(1, 6)),
        ])  # fmt: skip
        session.commit()
        sent = SentPlans()
        sent.went_out(session, 1, 4)
        assert sent.runs == {} and sent.runs_of("slow", session, 4) == []
        assert SentPlans().runs_of("slow", session, 5) == [(4, 4)]
        later = SentPlans()
        later.went_out(session, 1, 5)  # the round built after the re-plan, event 1 itself
        assert later.runs == {"slow": [(4, 4)]}


def test_a_report_or_beat_names_its_server_as_text() -> None:
    """The mutation audit: a report's ``server`` taken as whatever was said, made text,
    passed every test; the link drops a report whose server is not its topic's."""
    for server in (b"", b', "server": 5', b', "server": null'):
        with pytest.raises(SpecError, match=re.escape("progress.server")):
            Progress.parse(b'{"version": 1, "session": "s", "jobs": []' + server + b"}")


def test_a_plan_of_exactly_max_bytes_is_whole_and_257_parts_are_refused() -> None:
    """The mutation audit: a plan of exactly ``max_bytes`` split (into version-2 parts,
    which older agents refuse), and 257 parts let through (an agent reads ``parts`` up
    to 256), each passed every test."""
    p = _plan(Task("j", 1, 0, 0.5, 40))
    assert p.split(len(p.to_bytes())) == [p]

    def one_task_each(n: int) -> tuple[Plan, int]:
        tasks = [Task(f"j{i:03d}", 1, 0, 0.5, 40) for i in range(n)]
        plan = _plan(*tasks)
        part = dataclasses.replace(_plan(tasks[0]), part=255, parts=256)
        return plan, len(part.to_bytes()) + 1  # each task counts a comma

    plan, max_bytes = one_task_each(256)
    assert len(plan.split(max_bytes)) == 256
    plan, max_bytes = one_task_each(257)
    with pytest.raises(ValueError, match="needs 257 parts"):
        plan.split(max_bytes)


def test_the_parts_of_at_most_two_epochs_are_held() -> None:
    """The mutation audit: three epochs' parts held passed every test; a part of an
    epoch two newer ones followed completes nothing (the bound on what arrives)."""
    task = Task("j", 1, 0, 0.5, 40)

    def part(epoch: int, k: int) -> Plan:
        return dataclasses.replace(_plan(task), epoch=epoch, part=k, parts=2)

    held = PlanParts()
    for epoch in (1, 2, 3):
        assert held.add(part(epoch, 0)) is None
    assert held.add(part(1, 1)) is None  # epoch 1's first part was dropped
    assert held.add(part(3, 1)) is not None  # epoch 3's complete


def test_parts_join_with_the_first_parts_error_and_share_down() -> None:
    """The mutation audit: the error of the entries left out taken from the last part
    (not the first that left one out), and ``down`` left out of the header the parts of
    an epoch share, each passed every test."""
    task = Task("j", 1, 0, 0.5, 40)
    first = dataclasses.replace(
        _plan(), current=SlotPlan(5, 100.0, [task], refused=1, refused_error="first"),
        part=0, parts=2,
    )  # fmt: skip
    last = dataclasses.replace(_plan(task), part=1, parts=2)
    held = PlanParts()
    assert held.add(first) is None
    whole = held.add(last)
    assert whole is not None and whole.left_out == (1, "first")
    assert whole.current.tasks == [task, task]
    assert held.add(first) is None
    with pytest.raises(SpecError, match="does not match"):
        held.add(dataclasses.replace(last, down=True))


def test_runs_within_others_are_joined_and_counters_are_bounded() -> None:
    """The mutation audit: a run within the one before it cutting that one short, and
    a stored counter over 2**53 taken, each passed every test."""
    from controller.plane.sent_plans import counter, joined_runs

    assert joined_runs([(2, 9), (3, 4), (5, 5)]) == [(2, 9)]
    assert counter(0) and counter(1 << 53) and not counter((1 << 53) + 1)
    assert not counter(10**29) and not counter(-1) and not counter(1.5)
