"""Retention (``daemon.keep_days``, controller/admission/retention.py): the finished jobs
past it are deleted from the store with their allocations, progress and events, at a
slot boundary; jobs that may still hold slots are kept; a deleted id is free again; and
what keeps jobs by id elsewhere (the console's owners, the plane's retained events) is
told. The controller runs in-process on SQLite with a fake clock."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from controller.admission import AdmissionController
from controller.clock import FakeClock
from controller.config import ConfigError, from_dict
from controller.errors import NotFoundError
from controller.history import load_history
from controller.store import (
    AllocationRow,
    Database,
    EventRow,
    JobRow,
    MetaRow,
    OutageRow,
    ProgressRow,
    migrate,
)
from controller.store.retention_mark import RETENTION_KEY, deleted_before
from tests.stores import in_process
from tests.test_mqtt_units import CLUSTER, PlaneDaemon

HOUR = 3600.0
SPEC = PlaneDaemon.SPEC  # 2 workers' worth of 1 GPU, planned within a few slots


def _controller(tmp: Path, keep_days: float) -> tuple[AdmissionController, FakeClock]:
    daemon = {"data_dir": str(tmp), "window": 6, "epoch": 0, "keep_days": keep_days}
    config = from_dict({"daemon": daemon, "cluster": CLUSTER})
    clock = FakeClock(1.0)
    c = in_process(config, clock)
    c.open()
    return c, clock


def _rows(c: AdmissionController) -> dict[str, set[str]]:
    """The job ids each table holds rows of."""
    with c.db.session() as session:
        return {
            table.__tablename__: set(session.scalars(select(column).distinct()))
            for table, column in ((JobRow, JobRow.id), (AllocationRow, AllocationRow.job_id),
                                  (EventRow, EventRow.job_id), (ProgressRow, ProgressRow.job_id))
        }  # fmt: skip


def _to_slot(c: AdmissionController, clock: FakeClock, slot: int) -> None:
    clock.t = slot * HOUR + 1.0
    asyncio.run(c.tick())


def test_finished_jobs_past_keep_days_are_deleted_and_live_ones_kept(tmp_path: Path) -> None:
    c, clock = _controller(tmp_path, keep_days=1)  # 24 one-hour slots
    deleted: list[list[str]] = []
    c.prune_hooks.append(deleted.append)
    try:
        assert asyncio.run(c.submit({"id": "done", **SPEC})).decision.admitted
        assert asyncio.run(c.submit({"id": "gone", **SPEC})).decision.admitted
        asyncio.run(c.cancel("gone"))
        cheap = {**SPEC, "utility": {**SPEC["utility"], "priority": 1e-9}}
        assert not asyncio.run(c.submit({"id": "cheap", **cheap})).decision.admitted
        with c.db.session() as session:  # progress an agent reported
            now = datetime.now(UTC)
            session.add(ProgressRow(job_id="done", minibatches=1.0, worker_seconds=1.0,
                                    per_server={}, samples={}, updated_at=now))  # fmt: skip
            session.commit()
        _to_slot(c, clock, 20)  # every job ended, none for 24 slots yet
        assert not deleted and _rows(c)["jobs"] == {"done", "gone", "cheap"}
        assert asyncio.run(c.get("done")).state == "completed"
        assert asyncio.run(c.submit({"id": "live", **SPEC})).decision.admitted
        _to_slot(c, clock, 40)
        assert deleted == [["done", "gone", "cheap"]]
        rows = _rows(c)
        assert rows["jobs"] == {"live"} and rows["allocations"] == {"live"}, rows
        assert rows["events"] <= {"", "live"} and rows["job_progress"] == set(), rows
        with pytest.raises(NotFoundError):
            asyncio.run(c.get("done"))
        # the id is free again: a new job, with another spec, not ALREADY_EXISTS
        again = asyncio.run(c.submit({"id": "done", **SPEC, "epochs": 2}))
        assert again.decision.admitted and again.spec["epochs"] == 2
        _to_slot(c, clock, 41)  # nothing more to delete: no batch, no hook
        assert deleted == [["done", "gone", "cheap"]]
    finally:
        c.close()


def test_without_keep_days_every_job_is_kept(tmp_path: Path) -> None:
    c, clock = _controller(tmp_path, keep_days=0)
    try:
        asyncio.run(c.submit({"id": "old", **SPEC}))
        _to_slot(c, clock, 10_000)
        assert asyncio.run(c.get("old")).state == "completed"
        assert asyncio.run(c.prune()) == 0
    finally:
        c.close()


def test_deletion_goes_in_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each batch is one decision-thread step: decisions go on between them."""
    from controller.admission import retention

    c, clock = _controller(tmp_path, keep_days=1)
    monkeypatch.setattr(retention, "PRUNE_BATCH", 2)
    try:
        cheap = {**SPEC, "utility": {**SPEC["utility"], "priority": 1e-9}}
        for i in range(5):
            asyncio.run(c.submit({"id": f"r{i}", **cheap}))
        clock.t = 30 * HOUR + 1.0
        c._advance_window()
        sizes, after = [], 0
        for _ in range(4):
            ids, following = asyncio.run(c._run(functools.partial(c._prune_sync, 2, after)))
            sizes.append(len(ids))
            after = following or 0
        assert sizes == [2, 2, 1, 0]
        with c.db.session() as session:
            assert session.scalar(select(func.count()).select_from(JobRow)) == 0
    finally:
        c.close()


def test_the_servers_history_past_keep_days_is_deleted(tmp_path: Path) -> None:
    """Outage rows and the events of no job were kept for ever (one row and two events
    per failure). Past keep_days they go too, but an outage only once it is also past
    the flap window (7 days of ``detected_at``: the flap rule counts those failures)
    and past the ledger's window."""
    c, clock = _controller(tmp_path, keep_days=1)  # 24 one-hour slots
    old = datetime.now(UTC) - timedelta(days=8)
    try:
        with c.db.session() as session:
            for server, down, up, at in (("w0", 1, 2, old), ("w0", 3, 4, datetime.now(UTC)),
                                         ("w1", 5, 30, old)):  # fmt: skip
                session.add(OutageRow(server=server, down_from=down, up_from=up,
                                      detected_at=at, cause="failed"))  # fmt: skip
            for slot in (1, 2, 39):
                session.add(EventRow(at=old, kind="server_failed", job_id="", slot=slot,
                                     state="", detail={"server": "w0"}))  # fmt: skip
            session.commit()
        _to_slot(c, clock, 40)  # the cutoff: slot 16
        with c.db.session() as session:
            kept = {(o.down_from, o.up_from) for o in session.scalars(select(OutageRow))}
            slots = set(session.scalars(select(EventRow.slot).where(EventRow.job_id == "")))
        assert kept == {(3, 4), (5, 30)}  # within the flap window; ended after the cutoff
        assert slots == {39}
    finally:
        c.close()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "daemon.keep_days: must be >= 0"),
        (1e6, "daemon.keep_days: must be at most 36525"),
        ("week", "daemon.keep_days"),
    ],
)
def test_keep_days_is_checked(value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_dict({"daemon": {"keep_days": value}, "cluster": CLUSTER})


def test_the_console_forgets_the_owners_of_deleted_jobs() -> None:
    """A deleted id can come back as another submitter's job: an owner remembered for
    it would show the new job's events in the old owner's event streams."""
    from types import SimpleNamespace
    from typing import cast

    from controller.console.app import Console
    from controller.events import EventBus

    config = from_dict({"cluster": CLUSTER, "web": {"listen": "127.0.0.1:0"}})
    controller = SimpleNamespace(bus=EventBus(), prune_hooks=[])
    console = Console(config, cast(Any, controller), None, None)
    console.owners.update({"a": "alice", "b": "bob"})
    for hook in controller.prune_hooks:
        hook(["a"])
    assert console.owners == {"b": "bob"}
    json.dumps(console.owners)  # still a plain mapping


def test_a_console_stream_reads_the_owner_again_at_a_later_decision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a standby (no prune hook runs there) or after a batch, a job under a deleted
    job's id is another submitter's: its first event, a decision after the owner was
    read, makes the console read it again; other events do not cost a read."""
    from types import SimpleNamespace
    from typing import cast

    from controller.console.app import Console
    from controller.events import Event, EventBus

    config = from_dict({"cluster": CLUSTER, "web": {"listen": "127.0.0.1:0"}})
    console = Console(
        config, cast(Any, SimpleNamespace(bus=EventBus(), prune_hooks=[])), None, None
    )
    reads: list[list[str]] = []

    async def owner_of(ids: Iterable[str]) -> dict[str, str | None]:
        reads.append(sorted(ids))
        return {j: "bob" for j in ids}

    monkeypatch.setattr(console.data, "owner_of", owner_of)

    async def scenario() -> list[bool]:
        await console._learn_owners({"a"}, 5)
        console.owners["a"] = "alice"  # as it was read at sequence 5
        return [
            await console._visible(Event(4, "decided", "a", 0, "admitted", {}), "alice"),
            await console._visible(Event(7, "running", "a", 0, "running", {}), "alice"),
            await console._visible(Event(9, "decided", "a", 0, "admitted", {}), "alice"),
            await console._visible(Event(10, "running", "a", 0, "running", {}), "bob"),
        ]

    assert asyncio.run(scenario()) == [True, True, False, True]
    assert reads == [["a"], ["a"]]


def test_offline_compares_no_stretch_whose_neighbours_retention_deleted(tmp_path: Path) -> None:
    """Retention records how far it deleted (``controller/store/retention_mark.py``); the
    default comparison of ``oasis offline --store`` starts there, and an operator's
    earlier ``--from`` is compared with a note that it is optimistic: the deleted jobs'
    slots read as free."""
    c, clock = _controller(tmp_path, keep_days=1)  # 24 one-hour slots
    try:
        assert asyncio.run(c.submit({"id": "done", **SPEC})).decision.admitted  # arrival 1
        _to_slot(c, clock, 14)
        beside = asyncio.run(c.submit({"id": "beside", **SPEC, "epochs": 6})).decision  # from 15
        assert beside.admitted and beside.completion_slot is not None
        _to_slot(c, clock, 40)  # cutoff 40 - 24 = 16: "done" goes, "beside" stays
        assert asyncio.run(c.submit({"id": "new", **SPEC})).decision.admitted
        assert _rows(c)["jobs"] == {"beside", "new"}
        with c.db.session() as session:
            assert deleted_before(session) == 16
        default = load_history(c.db)
        chosen = load_history(c.db, first=0, last=41)
        only_to = load_history(c.db, last=41)  # no --from: the stretch starts at the mark
        only_from = load_history(c.db, first=0)  # the operator's --from stays
    finally:
        c.close()
    assert beside.completion_slot >= 16  # it ran beside the deleted job's time, and stays
    assert default.first_slot == 16 and [j.id for j in default.trace.jobs] == ["new"]
    assert any("compared from slot 16 on" in n for n in default.notes), default.notes
    assert [j.id for j in chosen.trace.jobs] == ["beside", "new"]
    assert any(n.startswith("optimistic:") and "--from 16" in n for n in chosen.notes)
    assert only_to.first_slot == 16 and [j.id for j in only_to.trace.jobs] == ["new"]
    assert only_from.first_slot == 0 and len(only_from.trace.jobs) == 2


EDITED = ["16", [], *({"deleted_before_slot": v} for v in ("16", True, -1, 1.5))]


@pytest.mark.parametrize("value", EDITED)
def test_a_retention_record_edited_by_hand_reads_as_none(tmp_path: Path, value: Any) -> None:
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    migrate(db)
    with db.session() as session:
        session.add(MetaRow(key=RETENTION_KEY, value=value))
    with db.session() as session:
        assert deleted_before(session) is None
    db.dispose()


def test_retention_deleting_the_newest_events_is_not_a_rewound_store(tmp_path: Path) -> None:
    """A quiet cluster: keep_days pass with nothing decided, and retention deletes the
    newest events there are. Before, the next look read the store as rewound under the
    daemon ('the store was rewound' in the journal, the ledger rebuilt; on SQLite the
    next event took the deleted one's number again, and a leader stepped down)."""
    c, clock = _controller(tmp_path, keep_days=1)  # 24 one-hour slots
    said: list[str] = []
    note = c._note_rewound

    def noted(why: str) -> None:
        if why:
            said.append(why)
        note(why)

    c._note_rewound = noted  # type: ignore[method-assign]
    try:
        assert asyncio.run(c.submit({"id": "only", **SPEC})).decision.admitted
        _to_slot(c, clock, 40)
        assert _rows(c)["jobs"] == set()
        with c.db.session() as session:  # the deletion said in the log, numbered past it
            kept = session.execute(select(EventRow.kind, EventRow.job_id, EventRow.detail)).all()
        assert [tuple(r) for r in kept] == [
            ("history_deleted", "", {"jobs": 1, "ended_before_slot": 16})
        ]
        _to_slot(c, clock, 41)  # the leader's look at the store
        asyncio.run(c.tick())
        assert asyncio.run(c.submit({"id": "next", **SPEC})).decision.admitted
        _to_slot(c, clock, 42)
        assert said == [] and not c._rewound, said
        with c.db.session() as session:  # numbers are never given twice
            numbers = list(session.scalars(select(EventRow.sequence)))
        assert len(numbers) == len(set(numbers))
    finally:
        c.close()


def _ended_slots(c: AdmissionController) -> dict[str, int]:
    """Each stored job's slot of ending as retention reads it: completion (a completed
    job's), cancellation (a cancelled one's) or decision (a rejected one's)."""
    ended: dict[str, int] = {}
    with c.db.session() as session:
        for row in session.scalars(select(JobRow)):
            column = {"completed": "completion_slot", "cancelled": "cancelled_slot"}
            end = getattr(row, column.get(row.state, "decided_slot"))
            assert isinstance(end, int), (row.id, row.state)
            ended[row.id] = end
    return ended


def test_a_finished_job_is_kept_through_its_last_kept_slot_and_deleted_at_the_next(
    tmp_path: Path,
) -> None:
    """Every kind of end is kept while its slot is at or after the cutoff (the slot
    ``keep_days`` before the current one) and deleted once it is before it: one slot of
    a finished job's history neither cut short nor kept too long."""
    c, clock = _controller(tmp_path, keep_days=1)  # 24 one-hour slots
    try:
        assert asyncio.run(c.submit({"id": "done", **SPEC})).decision.admitted
        assert asyncio.run(c.submit({"id": "gone", **SPEC})).decision.admitted
        _to_slot(c, clock, 1)
        asyncio.run(c.cancel("gone"))
        _to_slot(c, clock, 3)
        cheap = {**SPEC, "utility": {**SPEC["utility"], "priority": 1e-9}}
        assert not asyncio.run(c.submit({"id": "cheap", **cheap})).decision.admitted
        _to_slot(c, clock, 10)
        ended = _ended_slots(c)
        assert {j: asyncio.run(c.get(j)).state for j in ended} == {
            "done": "completed", "gone": "cancelled", "cheap": "rejected",
        }  # fmt: skip
        # each kind ends in a slot of its own, after slot 0 (a cutoff of 0 deletes nothing)
        assert len(set(ended.values())) == 3 and min(ended.values()) > 0, ended
        for slot in range(min(ended.values()) + 24, max(ended.values()) + 26):
            _to_slot(c, clock, slot)
            cutoff = slot - 24
            kept = {j for j, end in ended.items() if end >= cutoff}
            assert _rows(c)["jobs"] == kept, (slot, ended)
        assert _rows(c)["jobs"] == set()
    finally:
        c.close()


def test_a_job_running_past_its_plan_is_never_deleted(tmp_path: Path) -> None:
    """With the execution plane, a job whose agents have not reported all its work stays
    running past its planned completion: it may still hold servers, and retention keeps
    it (and its allocations, progress and events) however long ago that plan ended."""
    from types import SimpleNamespace

    c, clock = _controller(tmp_path, keep_days=1)  # 24 one-hour slots
    try:
        assert asyncio.run(c.submit({"id": "late", **SPEC})).decision.admitted
        assert asyncio.run(c.submit({"id": "done", **SPEC})).decision.admitted
        # the plane's check: the agents of "late" still report, "done" finished
        c.execution = SimpleNamespace(unfinished=lambda job_id, session: job_id == "late")  # type: ignore[assignment]
        for slot in range(1, 10):
            _to_slot(c, clock, slot)
        with c.db.session() as session:
            late = session.get(JobRow, "late")
            assert late is not None and late.state == "running"
            assert late.completion_slot is not None and late.completion_slot < 9
        _to_slot(c, clock, 40)  # the cutoff, slot 16, is long past its planned completion
        rows = _rows(c)
        assert rows["jobs"] == {"late"} and rows["allocations"] == {"late"}, rows
        assert "late" in rows["events"], rows
        assert asyncio.run(c.get("late")).state == "running"
    finally:
        c.execution = None
        c.close()


def test_a_pass_reaches_every_finished_job_past_stretches_with_none_and_full_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass goes on past a stretch of jobs none of which may go (here, jobs still
    running) and past a step that deleted as many as it may: every finished job past
    ``keep_days`` is deleted in the one pass, not left for later ones."""
    from types import SimpleNamespace

    from controller.admission import retention

    monkeypatch.setattr(retention, "PRUNE_SCAN", 3)
    c, clock = _controller(tmp_path, keep_days=1)  # 24 one-hour slots
    try:
        late = [f"late{i}" for i in range(3)]  # the first stretch: none of them may go
        for job_id in late:
            assert asyncio.run(c.submit({"id": job_id, **SPEC})).decision.admitted
        cheap = {**SPEC, "utility": {**SPEC["utility"], "priority": 1e-9}}
        rejected = [f"r{i}" for i in range(5)]
        for job_id in rejected:
            assert not asyncio.run(c.submit({"id": job_id, **cheap})).decision.admitted
        c.execution = SimpleNamespace(unfinished=lambda job_id, session: True)  # type: ignore[assignment]
        for slot in range(1, 10):
            _to_slot(c, clock, slot)
        clock.t = 40 * HOUR + 1.0  # the cutoff: slot 16
        c._advance_window()
        steps: list[list[str]] = []
        after: int | None = 0
        while after is not None:  # one pass, in steps of at most 2 jobs
            ids, after = asyncio.run(c._run(functools.partial(c._prune_sync, 2, after)))
            steps.append(ids)
        assert steps == [[], ["r0", "r1"], ["r2", "r3"], ["r4"]], steps
        assert _rows(c)["jobs"] == set(late)
    finally:
        c.execution = None
        c.close()


def test_deleting_the_newest_server_events_writes_an_event_past_them(tmp_path: Path) -> None:
    """The servers' history is deleted the same way as the jobs': when its deletion
    takes the store's newest event (a quiet cluster whose last news was a server's),
    a ``history_deleted`` event numbered past it says so, and the store's newest event
    number never goes back (else the leader read the store as rewound under it)."""
    c, clock = _controller(tmp_path, keep_days=1)  # 24 one-hour slots
    old = datetime.now(UTC) - timedelta(days=8)
    try:
        with c.db.session() as session:
            for slot in (1, 2):
                session.add(EventRow(at=old, kind="server_failed", job_id="", slot=slot,
                                     state="", detail={"server": "w0"}))  # fmt: skip
            session.commit()
        with c.db.session() as session:
            newest = session.scalar(select(func.max(EventRow.sequence)))
        _to_slot(c, clock, 40)  # the cutoff: slot 16
        with c.db.session() as session:
            kept = session.execute(
                select(EventRow.sequence, EventRow.kind, EventRow.detail)
                .where(EventRow.job_id == "").order_by(EventRow.sequence)
            ).all()  # fmt: skip
        assert kept and kept[-1].kind == "history_deleted", kept
        assert kept[-1].sequence > newest
        assert kept[-1].detail["ended_before_slot"] == 16 and kept[-1].detail["events"] >= 2
        assert all(k.kind != "server_failed" for k in kept), kept
    finally:
        c.close()


def test_the_retention_record_keeps_the_highest_cutoff(tmp_path: Path) -> None:
    """A deletion with a lower cutoff than one before (``keep_days`` raised since) must
    not lower the record: the rows before the higher one are gone all the same, and
    ``oasis offline --store`` would compare a stretch whose neighbours were deleted."""
    from controller.store.retention_mark import mark_deleted_before

    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    migrate(db)
    try:
        for cutoff, recorded in ((16, 16), (10, 16), (16, 16), (20, 20)):
            with db.session() as session:
                mark_deleted_before(session, cutoff)
                session.commit()
            with db.session() as session:
                assert deleted_before(session) == recorded, cutoff
    finally:
        db.dispose()


@pytest.mark.parametrize(
    ("lo", "hi", "defaulted", "first", "note"),
    [
        (16, 20, True, 16, None),  # from the first kept slot: nothing deleted is compared
        (10, 16, True, 16, "compared from slot 16 on"),  # the newest arrival at the mark
        (10, 15, True, 10, "optimistic:"),  # every arrival before the mark: it stays
        (10, 20, False, 10, "optimistic:"),  # the operator's --from stays
        (16, 20, False, 16, None),
    ],
)
def test_the_stretch_moves_past_retentions_mark_at_its_edges(
    lo: int, hi: int, defaulted: bool, first: int, note: str | None
) -> None:
    """Arrival slots ``lo .. hi`` and retention's mark at slot 16: a stretch from the
    mark on is compared as it is, with no note; a default one reaching the mark (its
    newest arrival at 16) starts there."""
    from controller.history import _past_deletions

    got, notes = _past_deletions(lo, hi, defaulted, 16)
    assert got == first
    if note is None:
        assert notes == []
    else:
        (line,) = notes
        assert line.startswith(note), line
    assert _past_deletions(lo, hi, defaulted, None) == (lo, [])
