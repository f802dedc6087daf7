"""Cordoned servers (controller/admission/cordons.py): an operator takes a server out of
service from the next slot on, its jobs move as after a failure, the store keeps it
across restarts, heartbeats never end it, and ``oasis uncordon`` gives it back.

In-process on a SQLite file with a fake clock (the controller of
tests/test_outage_rebuild.py), and the CLI against a real daemon.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import generate_latest
from sqlalchemy import select

from controller.admission import AdmissionController
from controller.admission.views import Cordon
from controller.clock import FakeClock
from controller.commands.records import local_time
from controller.errors import NotFoundError, PreconditionError
from controller.metrics import Metrics
from controller.plane.execution import Execution
from controller.plane.settings import mqtt_from_dict
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.store.models import AllocationRow, EventRow, JobRow, OutageRow
from pricing.durations import format_time
from pricing.errors import SpecError
from tests.servers import Daemon, json_log, oasis, write_config
from tests.test_daemon_e2e import job
from tests.test_ha_units import _serve
from tests.test_metrics import parse, value
from tests.test_outage_rebuild import JOB, PS, WORKER, _open, _state


def _on(c: AdmissionController, server: str, from_slot: int) -> dict[str, int]:
    """Workers (or PS) each job holds on ``server`` from ``from_slot`` on, in the store."""
    with c.db.session() as s:
        rows = s.execute(
            select(AllocationRow.job_id, AllocationRow.workers, AllocationRow.ps).where(
                AllocationRow.server == server, AllocationRow.slot >= from_slot
            )
        ).all()
    out: dict[str, int] = {}
    for job_id, workers, ps in rows:
        out[job_id] = out.get(job_id, 0) + workers + ps
    return out


def _slots_on(c: AdmissionController, server: str) -> dict[str, set[int]]:
    """The slots each job holds ``server`` in, in the store."""
    with c.db.session() as s:
        rows = s.execute(
            select(AllocationRow.job_id, AllocationRow.slot).where(AllocationRow.server == server)
        ).all()
    out: dict[str, set[int]] = {}
    for job_id, slot in rows:
        out.setdefault(job_id, set()).add(slot)
    return out


def _later(c: AdmissionController, slots: int) -> None:
    """Move the fake clock of ``c`` on by ``slots`` slots, and tick."""
    clock = c.slots.clock
    assert isinstance(clock, FakeClock)
    clock.advance(slots * c.slots.slot_seconds)
    asyncio.run(c.tick())


def _fill(c: AdmissionController, n: int) -> list[str]:
    decided = [asyncio.run(c.submit({**JOB, "id": f"j{i}"})) for i in range(n)]
    return [d.id for d in decided if d.decision.admitted]


def _within_capacity(c: AdmissionController) -> None:
    ledger = c._ledger
    for side in (ledger.worker_side, ledger.ps_side):
        assert (side.used <= side.capacity[None, :, :] + 1e-9).all()


def test_a_cordon_moves_the_jobs_off_from_the_next_slot_and_outlives_a_restart(
    tmp_path: Path,
) -> None:
    c = _open(tmp_path)
    try:
        admitted = _fill(c, 4)
        planned = _on(c, "w0", 1)
        assert admitted and planned, "the test needs jobs planned on w0"
        current = _on(c, "w0", 0).keys() - planned.keys()  # held in slot 0 only, if any

        view = asyncio.run(c.cordon("w0", "disk swap", "ops"))
        assert view["from_slot"] == 1 and not view["already"]
        assert set(view["moved"]) == set(planned)  # every job planned there from slot 1
        assert set(view["moved"].values()) <= {"replaced", "replanned", "stranded"}
        assert _on(c, "w0", 1) == {}  # the store holds nothing there from slot 1 on
        w0 = c.cluster.worker_names.index("w0")
        ledger = c._ledger
        assert ledger.worker_side.blocked[1:, w0].all()  # full to every search from slot 1
        for j in ledger.job_ids():  # and no plan holds it there
            assert not ledger.schedule(j).after(1).workers[:, w0].any(), j
        assert _on(c, "w0", 0).keys() >= current  # slot 0 runs as planned
        _within_capacity(c)
        with c.db.session() as s:
            event = s.scalars(select(EventRow).where(EventRow.kind == "server_cordoned")).one()
            outage = s.scalars(select(OutageRow)).one()
        assert event.detail["reason"] == "disk swap" and event.detail["by"] == "ops"
        assert event.detail["jobs"] == list(view["moved"])
        assert (outage.cause, outage.down_from, outage.up_from) == ("cordoned", 1, None)

        # new jobs go around it; cordoning again changes nothing
        more = asyncio.run(c.submit({**JOB, "id": "after"}))
        assert "after" not in _on(c, "w0", 1)
        again = asyncio.run(c.cordon("w0"))
        assert again["already"] and again["from_slot"] == 1 and not again["moved"]
        states = c.between_decisions(c.server_states)
        assert states == {"w0": "cordoned", "w1": "up", "p0": "up"}
        scraped = parse(generate_latest(Metrics(c).registry).decode())
        assert value(scraped, "oasis_servers", state="cordoned") == 1
        assert value(scraped, "oasis_servers", state="up") == 2
        # its capacity is out of service, not in use (a half-failed cluster read as busy:
        # the observability audit); utilisation is over the capacity in service
        side, slot = c._ledger.worker_side, 1 - c._ledger.origin
        for r, resource in enumerate(c.cluster.resources):
            total = side.capacity[:, r].sum()
            if total <= 0:
                continue
            _, out = c.between_decisions(lambda: c.out_of_service(1, 1))
            _, use = c.between_decisions(lambda: c.utilisation(1, 1))
            shares = {(k, res): sh[0] for res, k, sh in out}
            used = {(k, res): sh[0] for res, k, sh in use}
            assert shares[("worker", resource)] == pytest.approx(side.capacity[w0, r] / total)
            others = np.delete(side.used[slot, :, r], w0).sum()
            serving = total - side.capacity[w0, r]
            assert used[("worker", resource)] == pytest.approx(others / serving if serving else 0)
        live = _state(c._ledger)
        assert more.decision is not None
    finally:
        c.close()

    c = _open(tmp_path)  # a restart blocks it again, from the store
    try:
        assert c.cordoned == {"w0": Cordon(1, "disk swap", "ops")}  # who and why, kept
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)  # the same ledger, bit for bit

        back = asyncio.run(c.uncordon("w0", "ops"))
        assert back == {"server": "w0", "from_slot": 1, "already": False, "failed": False,
                        "planned": False}  # fmt: skip
        assert not c._ledger.worker_side.blocked[1:, w0].any()
        assert c.between_decisions(c.server_states)["w0"] == "up"
        assert asyncio.run(c.uncordon("w0"))["already"]
        live = _state(c._ledger)
    finally:
        c.close()

    c = _open(tmp_path)  # and after the uncordon, a restart leaves it in service
    try:
        assert c.cordoned == {}
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)
        with c.db.session() as s:
            assert s.scalars(select(OutageRow.up_from)).one() == 1
    finally:
        c.close()


RACK = [*({"name": f"w{i}", "kind": "worker", "capacity": WORKER} for i in range(4)),
        {"name": "p0", "kind": "ps", "capacity": PS}]  # fmt: skip
"""Four worker servers: room for a cordoned pair's jobs on the other two."""


def _landed(c: AdmissionController, job_ids: list[str], from_slot: int) -> set[str]:
    """The servers ``job_ids`` hold from ``from_slot`` on, in the store."""
    with c.db.session() as s:
        rows = s.scalars(
            select(AllocationRow.server).where(
                AllocationRow.job_id.in_(job_ids), AllocationRow.slot >= from_slot
            )
        ).all()
    return set(rows)


def test_servers_cordoned_together_move_each_job_once_never_onto_each_other(
    tmp_path: Path,
) -> None:
    """One server a call moved a job off the first onto the second, then off it again
    (a rack's maintenance, server by server); cordoned together, each job moves once,
    onto neither, and the store, the events and a restart say so."""
    for name in ("one", "together"):
        (tmp_path / name).mkdir()
    one = _open(tmp_path / "one", servers=RACK)
    try:
        admitted = _fill(one, 6)
        first = next(s for s in ("w0", "w1", "w2", "w3") if _on(one, s, 1))
        moved_once = asyncio.run(one.cordon(first))["moved"]
        assert moved_once, "the test needs jobs planned on the first server"
        landed = _landed(one, list(moved_once), 1) - {"p0"}
        second = sorted(landed)[0]  # where one of them went
        again = asyncio.run(one.cordon(second))["moved"]
        assert set(again) & set(moved_once)  # the churn: moved twice
    finally:
        one.close()

    c = _open(tmp_path / "together", servers=RACK)
    try:
        assert _fill(c, 6) == admitted  # the same decisions, the same ledger
        trial = asyncio.run(c.cordon(first, more=[second], dry_run=True))
        assert trial["servers"] == [first, second] and trial["dry_run"]
        assert _on(c, first, 1) and not c.cordoned  # nothing changed
        view = asyncio.run(c.cordon(first, "rack 7", "ops", more=[second, first]))
        assert view["servers"] == [first, second] and view["already_servers"] == []
        assert view["moved"] == trial["moved"]
        moved = view["moved"]
        assert set(moved) >= set(moved_once) and len(moved) == len(set(moved))
        for name in (first, second):
            assert _on(c, name, 1) == {}
        _within_capacity(c)
        assert set(c.cordoned) == {first, second}
        with c.db.session() as s:
            cordoned = s.scalars(select(EventRow).where(EventRow.kind == "server_cordoned")).all()
            moves = s.scalars(select(EventRow).where(EventRow.kind.in_(("replanned", "failed"))
                                                     )).all()  # fmt: skip
            outages = s.scalars(select(OutageRow)).all()
        assert sorted(e.detail["server"] for e in cordoned) == sorted([first, second])
        assert sorted(j for e in cordoned for j in e.detail["jobs"]) == sorted(moved)
        assert {e.detail["with"][0] for e in cordoned} == {first, second}
        assert sorted(e.job_id for e in moves) == sorted(moved)  # one event a job
        assert all(e.detail["server"] in (first, second) for e in moves)
        assert sorted((o.server, o.cause, o.down_from) for o in outages) == sorted(
            [(first, "cordoned", 1), (second, "cordoned", 1)])  # fmt: skip
        live = _state(c._ledger)

        more = asyncio.run(c.cordon(second, more=[first]))
        assert more["already"] and more["already_servers"] == [second, first]
        third = next(s for s in ("w0", "w1", "w2", "w3") if s not in (first, second))
        with pytest.raises(PreconditionError, match=f"cordoning {third}, "):
            asyncio.run(
                c.cordon(
                    second,
                    more=[
                        third,
                        *(s for s in ("w0", "w1", "w2", "w3") if s not in (first, second, third)),
                    ],
                )
            )
        with pytest.raises(NotFoundError, match="no server 'w9'"):
            asyncio.run(c.cordon(third, more=["w9"]))
        assert set(c.cordoned) == {first, second}  # neither changed anything
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)
    finally:
        c.close()

    c = _open(tmp_path / "together", servers=RACK)  # a restart blocks both again
    try:
        assert set(c.cordoned) == {first, second}
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)
    finally:
        c.close()


def test_servers_of_both_kinds_cordoned_together_ahead_with_an_end(tmp_path: Path) -> None:
    """Worker and PS servers cordoned together, planned ahead with an end, one of them
    failed already and one named twice: each gets its cordon and outage row, no job
    holds any of them in the cordon's slots, each job moves once, and a restart
    rebuilds the same ledger."""
    servers = [*RACK, {"name": "p1", "kind": "ps", "capacity": PS}]
    c = _open(tmp_path, servers=servers)
    try:
        assert _fill(c, 6)
        plane = _plane(c)
        c.between_decisions(lambda: plane.outages.fail_sync("w3"))
        named = ["w0", "p0", "w3", "w1"]
        view = asyncio.run(c.cordon("w0", "rack", "ops", start=3, until=6,
                                    more=[*named[1:], "w0"]))  # fmt: skip
        assert view["servers"] == named and view["already_servers"] == []
        assert (view["from_slot"], view["until"]) == (3, 6) and view["moved"]
        for name in named:
            assert all(not slots & {3, 4, 5} for slots in _slots_on(c, name).values())
        _within_capacity(c)
        assert set(c.cordoned) == set(named)
        with c.db.session() as s:
            rows = s.execute(select(OutageRow.server, OutageRow.cause, OutageRow.down_from,
                                    OutageRow.up_from)).all()  # fmt: skip
            events = s.scalars(select(EventRow).where(EventRow.kind == "server_cordoned")).all()
            moves = s.scalars(select(EventRow).where(
                EventRow.kind.in_(("replanned", "failed")),
                EventRow.detail["reason"].as_string() == "server_cordoned")).all()  # fmt: skip
        assert sorted(rows) == sorted([("w3", "failed", 1, None),
                                       *((n, "cordoned", 3, 6) for n in named)])  # fmt: skip
        assert [e.detail["server"] for e in events] == named
        assert sorted(e.job_id for e in moves) == sorted(view["moved"])
        live = _state(c._ledger)
    finally:
        c.close()
    c = _open(tmp_path, servers=servers)
    try:
        assert set(c.cordoned) == set(named)
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)
    finally:
        c.close()


def _plane(c: AdmissionController, **settings: Any) -> Any:
    """An execution plane over ``c`` with ``[mqtt]`` ``settings`` (not connected: its
    reactions are called directly)."""
    mqtt = mqtt_from_dict({"host": "127.0.0.1", **settings})
    assert mqtt is not None
    c.config = replace(c.config, mqtt=mqtt)  # a plane runs only with [mqtt]
    plane = Execution(c, mqtt)
    plane.load()
    return plane


def test_servers_found_silent_at_one_review_fail_together(tmp_path: Path) -> None:
    """Agents found silent at one review (a rack without power; every dead server once
    the broker is back) fail in one step: one at a time, a job moved onto the next of
    them and then again."""
    for name in ("one", "together"):
        (tmp_path / name).mkdir()
    one = _open(tmp_path / "one", servers=RACK)
    try:
        admitted = _fill(one, 6)
        plane = _plane(one)
        first = next(s for s in ("w0", "w1", "w2", "w3") if _on(one, s, 1))
        one.between_decisions(lambda: plane.outages.fail_sync(first))
        with one.db.session() as s:
            moved_once = [e.job_id for e in s.scalars(select(EventRow).where(
                EventRow.kind.in_(("replanned", "failed"))))]  # fmt: skip
        assert moved_once, "the test needs jobs planned on the first server"
        second = sorted(_landed(one, moved_once, 1) - {"p0"})[0]
        one.between_decisions(lambda: plane.outages.fail_sync(second))
        with one.db.session() as s:
            moves = [e.job_id for e in s.scalars(select(EventRow).where(
                EventRow.kind.in_(("replanned", "failed"))))]  # fmt: skip
        assert len(moves) > len(set(moves))  # the churn: a job moved twice
    finally:
        one.close()

    c = _open(tmp_path / "together", servers=RACK)
    try:
        assert _fill(c, 6) == admitted
        plane = _plane(c)
        held = {name: set(_on(c, name, 1)) for name in (first, second)}
        events = c.between_decisions(
            lambda: plane.outages.fail_together_sync([first, second, first])
        )
        for name in (first, second):
            assert _on(c, name, 1) == {}
        _within_capacity(c)
        failed = [e for e in events if e.kind == "server_failed"]
        assert sorted(e.detail["server"] for e in failed) == sorted([first, second])
        assert {e.detail["with"][0] for e in failed} == {first, second}
        moved = [e.job_id for e in events if e.kind in ("replanned", "failed")]
        assert moved and len(moved) == len(set(moved))  # each job once
        assert sorted(j for e in failed for j in e.detail["jobs"]) == sorted(moved)
        # each move names a failed server the job was on, and that server's event lists it
        named = {e.job_id: e.detail["server"] for e in events if e.kind in ("replanned", "failed")}
        assert all(job in held[server] for job, server in named.items()), (named, held)
        assert {s for s in named.values()} == {first, second}, named  # the test needs both
        for e in failed:
            mine = sorted(j for j, s in named.items() if s == e.detail["server"])
            assert sorted(e.detail["jobs"]) == mine, (e.detail, named)
        with c.db.session() as s:
            outages = s.execute(select(OutageRow.server, OutageRow.cause)).all()
        assert sorted(outages) == sorted([(first, "failed"), (second, "failed")])
        live = _state(c._ledger)
    finally:
        c.close()

    c = _open(tmp_path / "together", servers=RACK)  # a restart finds both down
    try:
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)
    finally:
        c.close()


def test_a_failed_commit_of_failures_found_together_writes_each_once_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A silent cordoned server and a silent server with jobs, found at one review, and
    the store refuses the moves' commit: nothing of it is kept, and the next review
    records each failure once (a cordoned server's row written before the failed moves
    was written again, and counted toward flap_failures)."""
    from controller.store import StoreUnavailableError

    c = _open(tmp_path, servers=RACK)
    try:
        _fill(c, 6)
        busy = next(s for s in ("w0", "w1", "w2", "w3") if _on(c, s, 1))
        idle = next(s for s in ("w3", "w2", "w1", "w0") if s != busy)
        asyncio.run(c.cordon(idle, force=True))
        plane = _plane(c)
        index = c.cluster.worker_names.index(busy)
        write = c._write

        def refused() -> Any:  # the moves' commit: the busy server is blocked by then
            if c._ledger.is_down("worker", index):
                monkeypatch.setattr(c, "_write", write)  # back for the next review
                raise StoreUnavailableError("the store is unavailable: a test")
            return write()

        monkeypatch.setattr(c, "_write", refused)
        with pytest.raises(StoreUnavailableError):
            c.between_decisions(lambda: plane.outages.fail_together_sync([idle, busy]))
        assert c._write == write  # the refusal happened
        with c.db.session() as s:
            assert s.scalars(select(OutageRow).where(OutageRow.cause != "cordoned")).all() == []
        c.between_decisions(lambda: plane.outages.fail_together_sync([idle, busy]))
        with c.db.session() as s:
            failures = s.scalars(
                select(OutageRow.server).where(OutageRow.cause != "cordoned")
            ).all()
        assert sorted(failures) == sorted([idle, busy])  # each once
        assert _on(c, busy, 1) == {}
    finally:
        c.close()


BIG = {**JOB, "id": "big", "epochs": 20, "minibatches": 8,
       "utility": {"kind": "sigmoid", "priority": 100, "decay": 0.1, "target": 12}}  # fmt: skip
"""A job that needs both worker servers for most of the window: without w0 it fails."""


def test_a_dry_run_changes_nothing_and_a_cordon_that_fails_jobs_needs_force(
    tmp_path: Path,
) -> None:
    c = _open(tmp_path)
    try:
        assert asyncio.run(c.submit(BIG)).decision.admitted
        before = _state(c._ledger)
        trial = asyncio.run(c.cordon("w0", dry_run=True))
        assert trial["dry_run"] and trial["moved"] == {"big": "stranded"}
        for a, b in zip(before, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)  # the ledger as it was
        with pytest.raises(PreconditionError) as refused:
            asyncio.run(c.cordon("w0", "maintenance"))
        assert str(refused.value) == (
            "cordoning w0 from slot 1 would fail 1 job that fits nowhere else (big); nothing "
            "changed. --force cordons it anyway, --dry-run shows every move"
        )
        for a, b in zip(before, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)
        with c.db.session() as s:  # nothing stored either
            assert s.scalars(select(OutageRow)).all() == []
            assert s.scalars(select(EventRow.kind)).all() == ["decided"]
        assert c.cordoned == {}

        done = asyncio.run(c.cordon("w0", "maintenance", force=True))
        assert done["moved"] == {"big": "stranded"} and not done["dry_run"]
        with c.db.session() as s:
            kinds = s.scalars(select(EventRow.kind).order_by(EventRow.sequence)).all()
            row = s.get(JobRow, "big")
            assert row is not None and row.state == "failed"
        assert kinds == ["decided", "failed", "server_cordoned"]
    finally:
        c.close()


def test_a_job_failed_after_it_ran_keeps_what_it_had_planned(tmp_path: Path) -> None:
    """A job failed by a cordon (``--force``) after running a few slots had its plan's
    jct and utility overwritten with those of the slots it ran: ``oasis job`` then said
    "it had been admitted with payoff 720.305 (planned: completion in slot 168, jct 1 =
    10s, ...)" of a job planned to complete in slot 178 (jct 11), the README's
    ``planned`` (what its admission planned) wrong for every failed job that had run."""
    c = _open(tmp_path)
    try:
        first = asyncio.run(c.submit(BIG)).decision
        assert first.admitted and first.jct is not None and first.jct > 4
        _later(c, 2)  # it runs in slots 1 and 2
        done = asyncio.run(c.cordon("w0", "maintenance", force=True))
        assert done["moved"] == {"big": "stranded"}
        view = asyncio.run(c.get("big"))
        assert view.state == "failed" and view.decision.completion_slot == 2  # ran until
        assert (view.decision.jct, view.decision.utility) == (first.jct, first.utility)
        assert view.decision.payoff == first.payoff
        # and says why to its submitter, who may not read the events: `oasis job` said
        # "failed before completing (its 'failed' event says why)", an operator's stream
        assert view.decision.reason == (
            "failed from slot 3: its server w0 was cordoned by an operator, and no other "
            "server had room for the rest of its work"
        ), view.decision.reason
    finally:
        c.close()


def test_a_cordon_names_what_is_wrong(tmp_path: Path) -> None:
    c = _open(tmp_path)
    try:
        with pytest.raises(
            NotFoundError, match=r"no server 'gpu-a' in \[cluster\] \(servers: w0, w1"
        ):
            asyncio.run(c.cordon("gpu-a"))
        with pytest.raises(
            NotFoundError, match=r"no server 'W0' in \[cluster\]; did you mean 'w0'\?"
        ):
            asyncio.run(c.uncordon("W0"))
        with pytest.raises(SpecError, match="reason: at most 500 characters"):
            asyncio.run(c.cordon("w0", "x" * 501))
        # a start MAX_CORDON_SLOTS after the next slot is the furthest taken
        from controller.admission.cordons import MAX_CORDON_SLOTS

        furthest = c.slot + 1 + MAX_CORDON_SLOTS
        assert asyncio.run(c.cordon("w1", start=furthest, dry_run=True))["from_slot"] == furthest
        with pytest.raises(SpecError, match=f"from_slot: at most {MAX_CORDON_SLOTS} slots"):
            asyncio.run(c.cordon("w1", start=furthest + 1, dry_run=True))
        # --from the next slot is no planned cordon: an end not after it is told so
        nxt = c.slot + 1
        with pytest.raises(SpecError, match=rf"starts in \({nxt}, the next one\)"):
            asyncio.run(c.cordon("w1", start=nxt, until=nxt))
        # every operator reads the reason (oasis servers, the log): an escape that would
        # draw a fake "uncordoned" line on their terminals, or a NUL (PostgreSQL's text
        # refuses it, and the failed write rebuilt the ledger), is refused
        for reason in ("disk swap\x1b[1A\x1b[2K\rw0: uncordoned", "nul\x00", "rtl\u202e"):
            with pytest.raises(SpecError, match="reason: must not hold control"):
                asyncio.run(c.cordon("w0", reason))
        asyncio.run(c.cordon("w0", "磁盘更换, ECC"))  # any text that shows as written
        assert c.cordoned["w0"].reason == "磁盘更换, ECC"
        back = asyncio.run(c.uncordon("w0"))
        assert c.cordoned == {} and not back["failed"]
        # an operator's cordon is no failure: without an execution plane, its uncordon
        # does not say it ended one
        with c.db.session() as s:
            event = s.scalars(select(EventRow).where(EventRow.kind == "server_uncordoned")).one()
        assert c.config.mqtt is None and "failure_ended" not in event.detail, event.detail
    finally:
        c.close()


def test_a_cordon_planned_to_start_in_the_past_is_refused(tmp_path: Path) -> None:
    """``--from`` a slot before the current one (a maintenance's date mistyped, a year
    off) was taken as "from the next slot": the server's jobs moved at once, tenants'
    tasks restarted days before the work. It is refused, naming the current slot;
    ``--from`` the current slot is still the next one, as a time in it rounds up to."""
    c = _open(tmp_path)
    try:
        _later(c, 5)  # slot 5
        _fill(c, 2)
        with pytest.raises(SpecError, match=r"from_slot: slot 3 is before the current slot \(5"):
            asyncio.run(c.cordon("w0", start=3))
        assert c.cordoned == {}
        done = asyncio.run(c.cordon("w0", start=5, dry_run=True))  # the current one: next
        assert done["from_slot"] == 6
    finally:
        c.close()


def test_a_job_that_cannot_fit_for_servers_out_of_service_is_told_which(
    tmp_path: Path,
) -> None:
    """A job rejected as it cannot fit names the servers out of service (before: with
    every parameter server cordoned, ``it needs 21 worker-slots ..., and only 48 are
    free``, a contradiction that read as a full cluster)."""
    c = _open(tmp_path)
    try:
        asyncio.run(c.cordon("p0"))
        reason = asyncio.run(c.submit({**JOB, "id": "no-ps"})).decision.reason
        assert reason.startswith("cannot fit: its parameter servers do not fit in slots 1..")
        assert "for the 21 it needs)" in reason, reason
        assert reason.endswith("; out of service in those slots: p0"), reason
        asyncio.run(c.uncordon("p0"))
        asyncio.run(c.cordon("w0"))
        asyncio.run(c.cordon("w1"))
        reason = asyncio.run(c.submit({**JOB, "id": "no-workers"})).decision.reason
        assert reason.startswith("cannot fit: it needs 21 worker-slots in slots 1..")
        assert "only 0 worker-slots are free there" in reason, reason
        assert reason.endswith("; out of service in those slots: w0, w1"), reason
    finally:
        c.close()


def test_the_execution_plane_neither_ends_a_cordon_nor_reads_it_as_a_failure(
    tmp_path: Path,
) -> None:
    """A cordoned server's agent that falls silent and comes back: the failure and the
    recovery are recorded, and the server stays out until the operator's uncordon; one
    that also failed stays out after the uncordon until its agent is heard again."""
    c = _open(tmp_path)
    try:
        _fill(c, 2)
        asyncio.run(c.cordon("w0"))
        plane = _plane(c)
        assert "w0" not in plane.failed  # a cordon is no failure
        w0 = c.cluster.worker_names.index("w0")
        c.between_decisions(lambda: plane.outages.fail_sync("w0"))  # its agent fell silent
        c.between_decisions(lambda: plane.outages.recover_sync("w0"))  # and is back
        assert c._ledger.worker_side.blocked[1:, w0].all()  # still cordoned
        assert c.cordoned == {"w0": Cordon(1)}
        with c.db.session() as s:  # the recovery ended the failure, not the cordon
            ups = s.execute(select(OutageRow.cause, OutageRow.up_from)).all()
        assert sorted(ups, key=str) == [("cordoned", None), ("failed", 1)], ups

        c.between_decisions(lambda: plane.outages.fail_sync("w0"))  # silent again, then uncordoned
        back = asyncio.run(c.uncordon("w0"))
        assert back["failed"] and c._ledger.worker_side.blocked[1:, w0].all()
        c.between_decisions(lambda: plane.outages.recover_sync("w0"))  # heard again: in service
        assert not c._ledger.worker_side.blocked[1:, w0].any()
        with c.db.session() as s:
            causes = s.execute(select(OutageRow.cause, OutageRow.up_from)).all()
        assert sorted(causes) == [("cordoned", 1), ("failed", 1), ("failed", 1)]
    finally:
        c.close()


def test_a_server_failed_already_fails_again_only_once_it_is_back(tmp_path: Path) -> None:
    """A server down already (failed, not cordoned) found silent again records nothing:
    a second outage row of one silence would count as a flap, and a third hold the
    server out as flapping after one failure. Back, it fails again as any server."""
    c = _open(tmp_path)
    try:
        _fill(c, 2)
        plane = _plane(c, flap_seconds=7200)
        first = c.between_decisions(lambda: plane.outages.fail_sync("w0"))
        assert [e.kind for e in first if e.kind == "server_failed"] == ["server_failed"]
        for _ in range(2):
            assert c.between_decisions(lambda: plane.outages.fail_sync("w0")) == []
        with c.db.session() as s:
            assert s.scalars(select(OutageRow.server)).all() == ["w0"]
        c.between_decisions(lambda: plane.outages.recover_sync("w0"))
        assert c.cordoned == {}  # one failure: back, not held out
        again = c.between_decisions(lambda: plane.outages.fail_sync("w0"))
        assert [e.detail["server"] for e in again if e.kind == "server_failed"] == ["w0"]
        # a cordon planned ahead is not in force yet: its server failed is no cordoned one
        asyncio.run(c.cordon("w1", start=3, until=5, force=True))
        c.between_decisions(lambda: plane.outages.fail_sync("w1"))
        assert c.between_decisions(lambda: plane.outages.fail_sync("w1")) == []
    finally:
        c.close()


def test_a_parameter_servers_failure_re_plans_only_the_work_left(tmp_path: Path) -> None:
    """A failed server's workers lose the current slot's work, which its jobs' re-plans
    make up for; a parameter server's failure loses none of it: the job re-planned off
    it keeps the worker-slots it had left, no more (its index is no worker's: the
    workers of the worker server of that index in the current slot were added once)."""
    servers = [{"name": "w0", "kind": "worker", "capacity": WORKER},
               {"name": "w1", "kind": "worker", "capacity": WORKER},
               {"name": "p0", "kind": "ps", "capacity": PS},
               {"name": "p1", "kind": "ps", "capacity": PS}]  # fmt: skip
    c = _open(tmp_path, servers=servers)
    try:
        assert asyncio.run(c.submit({**JOB, "id": "j"})).decision.admitted
        plane = _plane(c)
        _later(c, 1)  # its first slot: workers on w0 now, its PS on p0
        s = c.slot
        now = c._ledger.schedule("j").after(s).before(s + 1)
        assert now.workers[0, 0] > 0 and now.ps[0, 0] > 0, (now.workers, now.ps)
        left = c._ledger.schedule("j").after(s + 1).work()
        asyncio.run(c.cordon("p1", until=s + 2))  # no PS at the next slot: a re-plan
        events = c.between_decisions(lambda: plane.outages.fail_sync("p0"))
        [moved] = [e for e in events if e.job_id == "j"]
        assert moved.detail["how"] == "replanned", moved.detail
        assert c._ledger.schedule("j").after(s + 1).work() == left
    finally:
        c.close()


def test_a_failure_during_a_cordon_with_an_end_is_given_back_at_its_end(tmp_path: Path) -> None:
    """A server whose agent fell silent and came back during a cordon with an end stays
    out for the cordon, and is back from its end; one still silent at the end stays out
    until its agent is heard again."""
    c = _open(tmp_path)
    try:
        _fill(c, 2)
        asyncio.run(c.cordon("w0", until=4))
        asyncio.run(c.cordon("w1", until=4))
        plane = _plane(c)
        w0, w1 = (c.cluster.worker_names.index(n) for n in ("w0", "w1"))
        for name in ("w0", "w1"):
            c.between_decisions(lambda name=name: plane.outages.fail_sync(name))  # type: ignore[misc]
        c.between_decisions(lambda: plane.outages.recover_sync("w0"))  # w0 heard again, w1 not
        blocked = c._ledger.worker_side.blocked
        assert blocked[1:4, w0].all() and blocked[1:, w1].all()  # out for the cordon
        # w0 up to its end only, as a rebuild from the store has it (before: for good)
        assert not blocked[4:, w0].any() and not c._ledger.is_down("worker", w0)
        live = _state(c._ledger)
        c.close()
        c = _open(tmp_path)
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)
        plane = _plane(c)
        _later(c, 3)  # slot 3: both cordons end at the next boundary
        assert c.cordoned == {}
        blocked = c._ledger.worker_side.blocked  # slot 3 is row 0 now
        assert blocked[0, w0] and not blocked[1:, w0].any()  # back from slot 4
        assert blocked[:, w1].all()  # still silent: out
        c.between_decisions(lambda: plane.outages.recover_sync("w1"))
        assert not c._ledger.worker_side.blocked[1:, w1].any()  # from slot 4
    finally:
        c.close()


def test_a_flapping_server_is_held_out_by_a_cordon_with_an_end(tmp_path: Path) -> None:
    """An agent that falls silent and comes back again and again: each failure moved
    every tenant's jobs planned on its server, and each return let new plans onto it to
    be moved again. The third failure within ``flap_seconds`` holds it out that long,
    as a cordon with an end by ``oasisd`` that names why; then it is back by itself."""
    c = _open(tmp_path)
    try:
        _fill(c, 2)
        plane = _plane(c, flap_seconds=7200)  # 2 slots
        assert plane.mqtt.flap_failures == 3
        w0 = c.cluster.worker_names.index("w0")
        for failures in (1, 2, 3):
            c.between_decisions(lambda: plane.outages.fail_sync("w0"))
            events = c.between_decisions(lambda: plane.outages.recover_sync("w0"))
            blocked = c._ledger.worker_side.blocked[1:, w0]
            if failures < 3:  # back at once
                assert not blocked.any() and c.cordoned == {}, failures
                assert [e.kind for e in events] == ["server_recovered"]
        # the third time: held out for its slots alone, as a rebuild holds it (before,
        # the failure's block stayed on past the hold-out, until a rebuild)
        assert blocked[:2].all() and not blocked[2:].any(), blocked.tolist()
        live = _state(c._ledger)
        c.between_decisions(c._reload)
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)
        held = c.cordoned["w0"]
        assert (held.from_slot, held.until, held.by) == (1, 3, "oasisd")
        assert held.reason == "flapping: its agent fell silent 3 times within 2h"
        assert [e.kind for e in events] == ["server_recovered", "server_cordoned"]
        assert c.between_decisions(c.server_states)["w0"] == "cordoned"
        _later(c, 2)  # slot 2: the hold ends at the next boundary
        assert c.cordoned == {} and not c._ledger.worker_side.blocked[1:, w0].any()
    finally:
        c.close()

    with pytest.raises(SpecError, match=r"mqtt.flap_seconds: must be at most"):
        mqtt_from_dict({"host": "127.0.0.1", "flap_seconds": 30 * 86400})
    with pytest.raises(SpecError, match=r"mqtt.flap_failures: must be"):
        mqtt_from_dict({"host": "127.0.0.1", "flap_failures": -1})


def test_no_hold_out_with_the_rule_off_nor_beside_a_planned_cordon(tmp_path: Path) -> None:
    """``flap_failures = 0`` turns the hold-out off: a server failing again and again is
    back each time. A flapping server with a cordon planned ahead keeps that one (one
    cordon per server): it is not replaced by a hold-out of ``oasisd``'s."""
    c = _open(tmp_path)
    try:
        _fill(c, 2)
        off = _plane(c, flap_failures=0, flap_seconds=7200)
        for _ in range(4):
            c.between_decisions(lambda: off.outages.fail_sync("w0"))
            events = c.between_decisions(lambda: off.outages.recover_sync("w0"))
            assert [e.kind for e in events] == ["server_recovered"]
        assert c.cordoned == {}
        asyncio.run(c.cordon("w1", start=3, until=5))
        planned = c.cordoned["w1"]
        plane = _plane(c, flap_seconds=7200)
        for _ in range(3):
            c.between_decisions(lambda: plane.outages.fail_sync("w1"))
            events = c.between_decisions(lambda: plane.outages.recover_sync("w1"))
            assert [e.kind for e in events] == ["server_recovered"]
        assert c.cordoned == {"w1": planned}
    finally:
        c.close()


def test_an_operators_cordons_are_no_flaps(tmp_path: Path) -> None:
    """A server an operator cordoned and gave back twice, whose agent then falls silent
    once and comes back, is back: only its agent's failures count toward
    ``flap_failures``, not the cordons' rows beside them."""
    c = _open(tmp_path)
    try:
        _fill(c, 2)
        plane = _plane(c, flap_seconds=7200)
        for _ in range(2):
            asyncio.run(c.cordon("w1", force=True))
            asyncio.run(c.uncordon("w1"))
        c.between_decisions(lambda: plane.outages.fail_sync("w1"))
        events = c.between_decisions(lambda: plane.outages.recover_sync("w1"))
        assert [e.kind for e in events] == ["server_recovered"] and c.cordoned == {}
    finally:
        c.close()


def test_without_an_execution_plane_an_uncordon_ends_a_failure_nothing_else_would(
    tmp_path: Path,
) -> None:
    """A failure the execution plane recorded before ``[mqtt]`` was turned off: no agent
    can be heard again to end it, so an uncordon does (before: the server stayed out for
    good, and ``oasis uncordon`` said it stays out until its agent is heard again)."""
    c = _open(tmp_path)
    try:
        with c.db.session() as s:
            s.add(OutageRow(server="w0", down_from=1, up_from=None, detected_at=datetime.now(UTC)))
            s.commit()
    finally:
        c.close()
    c = _open(tmp_path)  # no [mqtt]
    try:
        w0 = c.cluster.worker_names.index("w0")
        assert c.between_decisions(c.server_states)["w0"] == "failed"
        back = asyncio.run(c.uncordon("w0", "ops"))
        assert back == {"server": "w0", "from_slot": 1, "already": False, "failed": False,
                        "planned": False}  # fmt: skip
        assert not c._ledger.worker_side.blocked[1:, w0].any()
        assert c.between_decisions(c.server_states)["w0"] == "up"
        assert asyncio.run(c.uncordon("w0"))["already"]
        with c.db.session() as s:
            assert s.scalars(select(OutageRow.up_from)).all() == [1]
            event = s.scalars(select(EventRow).where(EventRow.kind == "server_uncordoned")).one()
        assert event.detail["failure_ended"] is True
        live = _state(c._ledger)
    finally:
        c.close()
    c = _open(tmp_path)  # and a restart reads it so
    try:
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)
    finally:
        c.close()


def test_oasis_cordon_and_uncordon_against_a_daemon(tmp_path: Path) -> None:
    extra = '[web]\nlisten = "127.0.0.1:0"\n'
    epoch = time.time()
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", epoch=epoch, extra=extra)
    daemon = Daemon(config, tmp_path / "oasisd.log").start()
    web = next(
        e["address"]
        for e in json_log(tmp_path / "oasisd.log")
        if e.get("event") == "console listening"
    )
    try:
        server = ["--server", daemon.address]
        spec = tmp_path / "job.json"
        spec.write_text(json.dumps(job("c1")))
        oasis("submit", str(spec), *server)
        trial = oasis("cordon", "w2", "--dry-run", *server).stdout
        assert (
            trial.startswith("w2: a cordon from slot 1 (")
            and "nothing changed (--dry-run)" in trial
        )
        listed = oasis("servers", *server).stdout.splitlines()
        assert any(line.split()[:3] == ["w2", "worker", "up"] for line in listed)  # unchanged
        # the config's resources in its order (the units audit: alphabetical, and a PS
        # server's "gpu 0/0"); --json's maps in the same order
        head = next(line for line in listed if line.startswith("server "))
        assert head.split()[3:] == ["agent", "gpu", "cpu", "mem", "disk", "bandwidth"]
        ps_row = next(line for line in listed if " ps " in line).split()
        assert ps_row[3:5] == ["-", "-"]  # no [mqtt]: no agent watched; no gpu
        data = json.loads(oasis("servers", "--json", *server).stdout)
        assert data["resources"] == ["gpu", "cpu", "mem", "disk", "bandwidth"]
        assert list(data["servers"][0]["capacity"]) == data["resources"]
        assert data["agent_heartbeat_timeout_seconds"] is None
        first = data["servers"][0]
        assert first["agent_heard"] is None and first["agent_heard_seconds_ago"] is None
        out = oasis("cordon", "w2", "--reason", "GPU 3 errors", *server).stdout
        assert out.startswith("w2: cordoned from slot 1 (")
        assert "no new plans there (oasis uncordon w2 gives it back)" in out
        listed = oasis("servers", *server).stdout
        assert any(line.split()[:3] == ["w2", "worker", "cordoned"] for line in listed.splitlines())
        assert "\nw2: cordoned from slot 1 (" in listed
        assert listed.rstrip().endswith("): GPU 3 errors (oasis uncordon w2)")
        by_name = {x["name"]: x for x in json.loads(oasis("servers", "--json", *server).stdout)[
            "servers"]}  # fmt: skip
        assert by_name["w2"]["cordoned_from_slot"] == 1  # no end: null, not slot 0
        assert by_name["w2"]["cordoned_until_slot"] is None
        assert by_name["w0"]["cordoned_from_slot"] is None and by_name["w0"]["cordoned_by"] is None
        assert any(line.split()[:3] == ["w0", "worker", "up"] for line in listed.splitlines())
        with urllib.request.urlopen(f"http://{web}/api/overview", timeout=10) as r:
            assert json.load(r)["out_of_service"] == {"w2": "cordoned"}
        screen = oasis("status", *server).stdout.splitlines()
        assert not [x for x in screen if "AGENT" in x]  # no [mqtt]: no agents watched
        assert "cordoned; " in next(x for x in screen if x.startswith("w2 "))
        assert "cordoned" not in next(x for x in screen if x.startswith("w0 "))
        again = json.loads(oasis("cordon", "w2", "--json", *server).stdout)
        assert again == {"server": "w2", "servers": ["w2"], "already_servers": ["w2"],
                         "from_slot": 1, "until_slot": None, "already": True,
                         "moved": [], "dry_run": False}  # fmt: skip
        missing = oasis("cordon", "w9", *server, check=False)
        assert missing.returncode == 1 and "no server 'w9'" in missing.stderr
        out = oasis("uncordon", "w2", *server).stdout
        assert out.startswith("w2: back in service from slot 1 (")
        assert "not cordoned; nothing changed" in oasis("uncordon", "w2", *server).stdout
        # one server's --json: its object (several: a list of them, below)
        one = json.loads(oasis("uncordon", "w2", "--json", *server).stdout)
        assert one == {"server": "w2", "from_slot": None, "already": True, "failed": False,
                       "planned": False}  # fmt: skip

        # a planned maintenance: an end in the user's terms, shown, and refused if past
        slot = json.loads(oasis("cordon", "w1", "--for", "90m", "--json", *server).stdout)
        assert (slot["from_slot"], slot["until_slot"]) == (1, 3)  # 1-hour slots, rounded up
        listed = oasis("servers", *server).stdout
        assert "\nw1: cordoned from slot 1 (" in listed and " until slot 3 (" in listed
        screen = oasis("status", *server).stdout.splitlines()
        busiest = next(x for x in screen if x.startswith("w1 "))
        assert f"cordoned until slot 3 ({local_time(epoch + 3 * 3600)}); " in busiest
        with urllib.request.urlopen(f"http://{web}/api/overview", timeout=10) as r:
            overview = json.load(r)
        assert overview["out_of_service"] == {"w1": "cordoned"}
        back = overview["cordoned_until"]["w1"]
        assert back["last_slot"] == 2 and back["back_at"] == format_time(epoch + 3 * 3600)
        other = oasis("cordon", "w1", "--for", "5h", *server).stdout
        assert "cordoned already" in other and "oasis uncordon w1 first" in other
        assert "uncordon w1 first" not in oasis("cordon", "w1", "--for", "2h", *server).stdout
        oasis("uncordon", "w1", *server)
        out = oasis("cordon", "w1", "--until", "4", *server).stdout
        assert out.startswith("w1: cordoned from slot 1 (") and " until slot 4 (" in out
        assert "(3 slots, 3h)" in out and "it is back then by itself" in out
        oasis("uncordon", "w1", *server)
        ago = oasis("cordon", "w1", "--from", "2000-01-01T00:00:00Z", *server, check=False)
        assert ago.returncode == 2, ago.stdout + ago.stderr  # a mistyped year: not "now"
        assert "--from: 2000-01-01T00:00:00Z is before the current slot" in ago.stderr
        assert "w1: not cordoned" in oasis("uncordon", "w1", *server).stdout
        past = oasis("cordon", "w1", "--until", "2000-01-01T00:00:00Z", *server, check=False)
        assert past.returncode != 0 and "--until: the cordon starts at the next slot" in past.stderr
        naive = oasis("cordon", "w1", "--until", "2030-01-01T06:00", *server, check=False)
        assert naive.returncode != 0 and "has no UTC offset" in naive.stderr
        # an end of slot 0 (0 is "no end" in the request): refused, not a cordon for good
        for end in ("0", format_time(epoch)):
            none = oasis("cordon", "w1", "--until", end, *server, check=False)
            assert none.returncode == 2, none.stdout + none.stderr
            assert "--until: " in none.stderr and "must" in none.stderr
        assert "w1: not cordoned" in oasis("uncordon", "w1", *server).stdout
        zero = oasis("cordon", "w1", "--for", "0h", *server, check=False)
        assert zero.returncode != 0 and "must be > 0" in zero.stderr
        assert "w1: not cordoned" in oasis("uncordon", "w1", *server).stdout  # none was made

        # a cordon planned ahead (--from): in service until then, shown as planned
        start = datetime.fromtimestamp(epoch + 4 * 3600, UTC).isoformat()
        out = oasis("cordon", "w1", "--from", start, "--for", "2h", *server).stdout
        assert out.startswith("w1: cordon planned from slot 4 (") and " until slot 6 (" in out
        assert "in service until then" in out and "oasis uncordon w1 cancels it" in out
        listed = oasis("servers", *server).stdout
        assert any(line.split()[:3] == ["w1", "worker", "up"] for line in listed.splitlines())
        assert "\nw1: a cordon planned from slot 4 (" in listed
        screen = oasis("status", *server).stdout.splitlines()
        busiest = next(x for x in screen if x.startswith("w1 "))
        assert f"cordon from slot 4 ({local_time(epoch + 4 * 3600)}); " in busiest
        with urllib.request.urlopen(f"http://{web}/api/overview", timeout=10) as r:
            overview = json.load(r)
        assert overview["out_of_service"] == {} and overview["cordoned_until"] == {}
        assert overview["cordons_planned"] == {"w1": {
            "from_slot": 4, "starts_at": format_time(epoch + 4 * 3600),
            "last_slot": 5, "back_at": format_time(epoch + 6 * 3600)}}  # fmt: skip
        other = oasis("cordon", "w1", *server).stdout
        assert "a cordon is planned already" in other and "oasis uncordon w1 first" in other
        assert "the planned cordon is cancelled" in oasis("uncordon", "w1", *server).stdout
        wrong = oasis("cordon", "w1", "--from", "6", "--until", "5", *server, check=False)
        assert wrong.returncode != 0 and "--until 5 is not after --from 6" in wrong.stderr
        # an end at the slot it starts in: a cordon of no slot, refused by its options too
        same = oasis("cordon", "w1", "--from", "6", "--until", "6", *server, check=False)
        assert same.returncode == 2 and "--until 6 is not after --from 6" in same.stderr
        assert "w1: not cordoned" in oasis("uncordon", "w1", *server).stdout

        # several servers in one step (a rack): named once each, in the order given
        trial = oasis("cordon", "w0", "w1", "--dry-run", *server).stdout
        assert trial.startswith("w0, w1: a cordon from slot 1 (") and "(--dry-run)" in trial
        both = json.loads(oasis("cordon", "w0", "w1", "w0", "--reason", "rack 7", "--json",
                                *server).stdout)  # fmt: skip
        assert both["servers"] == ["w0", "w1"] and both["already_servers"] == []
        assert not both["already"] and both["from_slot"] == 1
        listed = oasis("servers", *server).stdout.splitlines()
        for name in ("w0", "w1"):
            assert any(line.split()[:3] == [name, "worker", "cordoned"] for line in listed)
        out = oasis("cordon", "w1", "w2", "--dry-run", *server).stdout
        assert "w1: cordoned already; left as it was" in out
        assert "\nw2: a cordon from slot 1 (" in out and " would move 1 job; " in out
        moved = json.loads(oasis("cordon", "w2", "--dry-run", "--json", *server).stdout)["moved"]
        assert len(moved) == 1 and moved[0]["how"] in ("replaced", "replanned", "stranded")
        out = oasis("cordon", "w0", "w1", *server).stdout
        assert out.startswith("w0, w1: each cordoned already; nothing changed")
        back = json.loads(oasis("uncordon", "w0", "w1", "w2", "--json", *server).stdout)
        assert [(b["server"], b["already"]) for b in back] == [
            ("w0", False), ("w1", False), ("w2", True)]  # fmt: skip
        missing = oasis("cordon", "w0", "w9", *server, check=False)
        assert missing.returncode == 1 and "no server 'w9'" in missing.stderr
        assert "w0: not cordoned" in oasis("uncordon", "w0", *server).stdout  # nothing made
    finally:
        assert daemon.stop() == 0


def test_a_cordon_with_an_end_blocks_only_its_slots_and_ends_by_itself(tmp_path: Path) -> None:
    """A planned maintenance (``oasis cordon --for/--until``): only the jobs planned on the
    server before the end move, it is free to plan on after it, a restart keeps it, and it
    ends at its end without an uncordon, also across a restart."""
    c = _open(tmp_path)
    w0 = c.cluster.worker_names.index("w0")
    try:
        _fill(c, 4)
        before = _slots_on(c, "w0")
        inside = {j for j, slots in before.items() if slots & {1, 2, 3}}
        assert inside and any(slots & {4, 5, 6} for slots in before.values()), before
        view = asyncio.run(c.cordon("w0", "BIOS update", "ops", until=4))
        assert (view["from_slot"], view["until"]) == (1, 4)
        assert set(view["moved"]) == inside  # every job planned there in slots 1 .. 3
        now = _slots_on(c, "w0")
        assert all(not slots & {1, 2, 3} for slots in now.values()), now
        for j in before.keys() - inside:  # the others keep their plans there
            assert now[j] == before[j]
        blocked = c._ledger.worker_side.blocked[:, w0]
        assert blocked[1:4].all() and not blocked[0] and not blocked[4:].any()
        _within_capacity(c)
        with c.db.session() as s:
            outage = s.scalars(select(OutageRow)).one()
        assert (outage.cause, outage.down_from, outage.up_from) == ("cordoned", 1, 4)
        assert c.cordoned == {"w0": Cordon(1, "BIOS update", "ops", 4)}
        with pytest.raises(SpecError, match="until_slot: must be after"):
            asyncio.run(c.cordon("w1", until=1))
        live = _state(c._ledger)
    finally:
        c.close()

    c = _open(tmp_path)  # a restart: the same cordon, the same ledger
    try:
        assert c.cordoned == {"w0": Cordon(1, "BIOS update", "ops", 4)}
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)
        _later(c, 3)  # slot 3: the cordon's last slot
        assert c.cordoned == {}  # it ends at the next boundary, by itself
        assert c.between_decisions(c.server_states)["w0"] == "up"
        live = _state(c._ledger)
    finally:
        c.close()

    c = _open(tmp_path)  # and a restart in its last slot does not bring it back
    try:
        _later(c, 3)
        assert c.cordoned == {}
    finally:
        c.close()


def test_an_end_past_the_window_stays_blocked_as_the_window_moves() -> None:
    """A block with an end beyond the window's last slot (a long maintenance) covers the
    slots the window opens later, up to its end, and no further; an unblock ends it."""
    from tests.test_replan import admitted, make_job

    ledger = admitted([make_job("a")])
    one, two = np.flatnonzero(ledger.schedule("a").workers.sum(axis=0) == 0)[:2]
    length = ledger.length
    ledger.block("worker", one, 2, until=length + 5)
    assert ledger.worker_side.blocked[2:, one].all()
    ledger.advance(length)  # slots length .. 2 * length - 1
    blocked = ledger.worker_side.blocked[:, one]
    assert blocked[:5].all() and not blocked[5:].any()
    assert ledger.worker_side.ahead == []  # inside the window now
    assert (ledger.worker_side.used[:5, one] == ledger.worker_side.capacity[one]).all()

    ledger.block("worker", two, ledger.end + 1, until=ledger.end + 3)  # past the window
    assert not ledger.worker_side.blocked[:, two].any()
    saved, origin = ledger.snapshot(), ledger.end
    ledger.advance(origin)
    assert ledger.worker_side.blocked[:4, two].tolist() == [False, True, True, False]
    ledger.restore(saved)
    ledger.unblock("worker", two, origin)
    ledger.advance(origin)
    assert not ledger.worker_side.blocked[:, two].any()  # the unblock ended it


def test_a_moved_plan_is_shown_as_re_planned_not_as_a_payoff_over_its_utility() -> None:
    """``oasis job`` of a job whose plan moved (a cordon, a failure) showed its decision's
    cost and payoff next to its new plan's utility: ``utility 18.9, cost 0.23, payoff
    30.9``."""
    from controller.commands.client import _jobs_table, _worth_words
    from controller.rpc import oasis_pb2 as pb

    as_decided = pb.Decision(admitted=True, utility=31.123, cost=0.231, payoff=30.892)
    assert _worth_words(as_decided) == "utility 31.123, cost 0.231, payoff 30.892"
    moved = pb.Decision(admitted=True, utility=18.877, cost=0.231, payoff=30.892)
    assert _worth_words(moved) == (
        "utility 18.877 as re-planned (its 'replanned' events say why); admitted with "
        "utility 31.123, cost 0.231, payoff 30.892"
    )
    # and in the table of oasis jobs, marked and explained under it (an audit found a
    # payoff of 36.36 over a utility of 18.88 there, unexplained)
    spec = pb.JobSpec(id="m1")
    table = _jobs_table([pb.Job(spec=spec, state=pb.JOB_STATE_RUNNING, decision=moved),
                         pb.Job(spec=pb.JobSpec(id="a1"), state=pb.JOB_STATE_RUNNING,
                                decision=as_decided)], None)  # fmt: skip
    rows = table.splitlines()
    assert next(r for r in rows if r.startswith("m1")).rstrip().endswith("18.88*")
    assert next(r for r in rows if r.startswith("a1")).rstrip().endswith("31.12")
    assert rows[-1].startswith("* re-planned since its admission")
    assert "re-planned since" not in _jobs_table([pb.Job(spec=pb.JobSpec(id="a1"),
                                                  decision=as_decided)], None)  # fmt: skip


def test_a_planned_cordon_moves_only_its_slots_and_keeps_the_server_until_it_begins(
    tmp_path: Path,
) -> None:
    """``oasis cordon --from``: the jobs planned on the server from the planned start move
    at once, those before it keep their plans there, and new jobs may still use it
    before; the server is up until then, across a restart and a failure and recovery of
    its agent; the cordon then begins by itself and lasts until an uncordon."""

    c = _open(tmp_path)
    w0 = c.cluster.worker_names.index("w0")
    try:
        _fill(c, 4)
        before = _slots_on(c, "w0")
        later = {j for j, slots in before.items() if max(slots) >= 3}
        early = {j for j, slots in before.items() if slots & {1, 2}}
        assert later and early, before
        view = asyncio.run(c.cordon("w0", "PSU swap", "ops", start=3))
        assert (view["from_slot"], view["until"], view["already"]) == (3, None, False)
        assert set(view["moved"]) == later
        now = _slots_on(c, "w0")
        assert all(max(slots) < 3 for slots in now.values()), now
        for j in before.keys() - later:  # planned there before slot 3 only: unchanged
            assert now[j] == before[j]
        ledger = c._ledger
        blocked = ledger.worker_side.blocked[:, w0]
        assert not blocked[:3].any() and blocked[3:].all() and not ledger.is_down("worker", w0)
        _within_capacity(c)
        assert c.cordoned == {"w0": Cordon(3, "PSU swap", "ops")}
        assert c.between_decisions(c.server_states)["w0"] == "up"  # in service until then
        with c.db.session() as s:
            outage = s.scalars(select(OutageRow)).one()
        assert (outage.cause, outage.down_from, outage.up_from) == ("cordoned", 3, None)
        again = asyncio.run(c.cordon("w0"))  # one cordon per server
        assert again["already"] and again["from_slot"] == 3
        with pytest.raises(SpecError, match=r"until_slot: .*\(3, its --from\)"):
            asyncio.run(c.cordon("w1", start=3, until=3))
        with pytest.raises(SpecError, match="from_slot: at most"):
            asyncio.run(c.cordon("w1", start=10**7))
        live = _state(c._ledger)
    finally:
        c.close()

    c = _open(tmp_path)  # a restart: the same planned cordon, the same ledger
    try:
        assert c.cordoned == {"w0": Cordon(3, "PSU swap", "ops")}
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)
        assert not c._ledger.is_down("worker", w0)
        assert c.between_decisions(c.server_states)["w0"] == "up"

        plane = _plane(c)
        c.between_decisions(lambda: plane.outages.fail_sync("w0"))  # its agent falls silent
        assert c._ledger.worker_side.blocked[1:, w0].all()
        assert c.between_decisions(c.server_states)["w0"] == "failed"
        c.between_decisions(lambda: plane.outages.recover_sync("w0"))  # and is back: until slot 3
        blocked = c._ledger.worker_side.blocked[:, w0]
        assert not blocked[1:3].any() and blocked[3:].all()
        assert c.cordoned == {"w0": Cordon(3, "PSU swap", "ops")}

        _later(c, 2)  # slot 2: the cordon begins at the next boundary
        assert c.between_decisions(c.server_states)["w0"] == "cordoned"
        assert c._ledger.is_down("worker", w0) and c._ledger.worker_side.blocked[1:, w0].all()
        _later(c, 3)  # and lasts, with no end
        assert c._ledger.worker_side.blocked[1:, w0].all() and "w0" in c.cordoned
        back = asyncio.run(c.uncordon("w0"))
        assert not back["planned"] and not c._ledger.worker_side.blocked[1:, w0].any()
    finally:
        c.close()


def test_a_job_a_planned_cordon_strands_fails_at_once_holding_nothing(tmp_path: Path) -> None:
    """A cordon ahead that leaves a job no room from its start on fails the job (with
    ``force``). Before, the failed job kept its slots up to the cordon's start, in the
    ledger and the store: capacity priced for every tenant, planned for no one, and a
    rebuild dropped it (the interleaving audit)."""
    c = _open(tmp_path)
    try:
        asyncio.run(c.cordon("w1", force=True))  # only w0 left for workers
        patient = {"kind": "sigmoid", "priority": 100, "decay": 0.1, "target": 12}
        view = asyncio.run(c.submit({**JOB, "id": "victim", "utility": patient}))
        assert view.state == "admitted", view.decision
        assert max(a["slot"] for a in view.decision.allocations) >= 4
        with pytest.raises(PreconditionError, match="victim"):  # refused without force
            asyncio.run(c.cordon("w0", "maintenance", start=4))
        moved = asyncio.run(c.cordon("w0", "maintenance", force=True, start=4))["moved"]
        assert moved == {"victim": "stranded"}
        assert "victim" not in c._ledger  # its first slot had not begun: nothing kept
        with c.db.session() as s:
            row = s.get(JobRow, "victim")
            assert row is not None and row.state == "failed" and row.completion_slot is None
            held = s.scalars(select(AllocationRow.slot).where(
                AllocationRow.job_id == "victim", AllocationRow.slot > c.slot)).all()  # fmt: skip
            failed = s.scalars(select(EventRow.detail).where(
                EventRow.job_id == "victim", EventRow.kind == "failed")).one()  # fmt: skip
        assert held == [] and failed["from_slot"] == c.slot + 1, (held, failed)
        live = _state(c._ledger)
        c.between_decisions(c._reload)
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)
    finally:
        c.close()


def test_an_uncordon_cancels_a_planned_cordon(tmp_path: Path) -> None:
    """A planned cordon uncordoned before it begins is cancelled: the slots it blocked
    are free again at once and stay free after a restart and when its start passes."""
    c = _open(tmp_path)
    w1 = c.cluster.worker_names.index("w1")
    try:
        view = asyncio.run(c.cordon("w1", start=4, until=7))
        assert (view["from_slot"], view["until"]) == (4, 7)
        assert c._ledger.worker_side.blocked[4:7, w1].all()
        assert c.between_decisions(c.server_states)["w1"] == "up"
        back = asyncio.run(c.uncordon("w1", "ops"))
        assert back["planned"] and not back["already"] and not back["failed"]
        assert not c._ledger.worker_side.blocked[:, w1].any() and c.cordoned == {}
        with c.db.session() as s:
            event = s.scalars(select(EventRow).where(EventRow.kind == "server_uncordoned")).one()
        assert event.detail["planned"] is True
        with c.db.session() as s:  # cancelled: an empty span, not an end before its start
            row = s.scalars(select(OutageRow).where(OutageRow.server == "w1")).one()
        assert (row.down_from, row.up_from) == (4, 4)
        live = _state(c._ledger)
    finally:
        c.close()
    c = _open(tmp_path)
    try:
        assert c.cordoned == {}
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)
        _later(c, 5)
        assert not c._ledger.worker_side.blocked[:, w1].any() and c.cordoned == {}
    finally:
        c.close()


class _OlderDaemon(pb_grpc.ClusterServicer):
    """An oasisd older than the client (between an upgrade's install and its restart):
    it knows neither a cordon's start nor its end, so it cordons at once and for good.
    Records the requests it got."""

    def __init__(self, slot: int = 28) -> None:
        self.requests: list[Any] = []
        self.slot = slot  # its clock's current slot

    def GetClusterInfo(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.GetClusterInfoResponse(slot_seconds=3600.0, epoch=0.0, window=48,
                                         current_slot=self.slot,
                                         now=self.slot * 3600.0 + 5)  # fmt: skip

    def CordonServer(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.requests.append(request)
        return pb.CordonServerResponse(server=request.server, from_slot=self.slot + 1,
                                       dry_run=request.dry_run)  # fmt: skip


def test_a_timed_cordon_to_an_older_daemon_is_refused_and_changes_nothing() -> None:
    """Such a daemon ignored ``--for`` and cordoned the server for good, moving its jobs
    (the upgrade audit); the client's dry run now finds it out first."""
    older = _OlderDaemon()
    server, address = _serve(older)
    try:
        out = oasis("cordon", "w1", "--for", "2h", "--force", server=address, check=False)
        assert out.returncode == 2, out.stdout + out.stderr
        assert "does not know a cordon's start or end" in out.stderr, out.stderr
        assert "nothing was changed" in out.stderr
        assert [r.dry_run for r in older.requests] == [True]
        out = oasis("cordon", "w1", "--from", "31", server=address, check=False)
        assert out.returncode == 2 and "nothing was changed" in out.stderr, out.stderr
        out = oasis("cordon", "w1", server=address)  # untimed: as it always was
        assert "cordoned from slot 29" in out.stdout, out.stdout
        assert [r.dry_run for r in older.requests] == [True, True, False]
        # it ignores more_servers: it would cordon w1 alone (and move its jobs onto w2)
        out = oasis("cordon", "w1", "w2", server=address, check=False)
        assert out.returncode == 2 and "does not cordon several servers" in out.stderr
        assert "nothing was changed" in out.stderr, out.stderr
        out = oasis("cordon", "w1", "w2", "--dry-run", server=address, check=False)
        assert out.returncode == 2 and "its dry run was of w1 alone" in out.stderr, out.stderr
        assert [r.dry_run for r in older.requests] == [True, True, False, True, True]
    finally:
        server.stop(None)


def test_a_cordon_from_slot_0_once_it_is_past_is_refused_before_any_request() -> None:
    """``--from 0`` is the request's "next boundary" (``from_slot``'s default), which the
    daemon cannot tell from no ``--from``: at slot 28 it cordoned at once, moving every
    job planned on the server from slot 29, where ``--from 27`` was refused. The client
    refuses it, sending nothing; at slot 1 too, slot 0 just past."""
    for slot, ends in ((28, ["--until", "40"]), (1, ["--until", "9"])):
        daemon = _OlderDaemon(slot)  # its clock is at that slot
        server, address = _serve(daemon)
        try:
            for extra in ([], ["--for", "2h"], ends, ["--dry-run"]):
                out = oasis("cordon", "w1", "--from", "0", *extra, server=address, check=False)
                assert out.returncode == 2, out.stdout + out.stderr
                said = f"--from: slot 0 is before the current slot, {slot} ("
                assert said in out.stderr, out.stderr
                assert "a cordon cannot start in the past" in out.stderr
            assert daemon.requests == []
        finally:
            server.stop(None)


def test_a_moved_plan_with_no_worker_in_its_first_slot_starts_at_its_first_worker(
    tmp_path: Path,
) -> None:
    """A move (a cordon's, a failure's) may leave an admitted job's new plan with no
    worker in its first slots: it is stored as starting at its first worker, so the slot
    tick does not mark it running before (as :mod:`tests.test_decision_answer` checks for
    a decision)."""
    from pricing.schedule import Schedule

    c = _open(tmp_path)
    try:
        view = asyncio.run(c.submit({**JOB, "id": "a"}))
        assert view.state == "admitted"
        ledger = c._ledger
        old = ledger.schedule("a")
        workers = np.zeros((old.slots + 1, old.workers.shape[1]), np.int32)
        ps = np.zeros((old.slots + 1, old.ps.shape[1]), np.int32)
        workers[1:], ps[1:] = old.workers, old.ps  # the same plan a slot later
        moved = Schedule(old.start, workers, ps)
        with c.db.session() as session:
            row = session.get(JobRow, "a")
            assert row is not None and row.state == "admitted"
            job = c._parse(json.loads(row.spec), row.arrival_slot)
            c._write_schedule(session, job, row, moved, old.start)
            assert row.start_slot == old.start + 1
    finally:
        c.close()
