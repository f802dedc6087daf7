"""The answer to a submission is built from the decision, not read back from the store
(issue 16): it equals what a read of the stored job gives, for admitted, rejected and
pending jobs; and the in-memory index of stored ids keeps submissions idempotent, also
after the ledger was rebuilt from the store."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from controller.admission import ConflictError
from controller.clock import FakeClock
from tests.test_pending import SLOT, blocker, controller, small


def test_the_answer_is_the_stored_job(tmp_path: Path) -> None:
    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    try:
        answers = [
            asyncio.run(c.submit(blocker(), by="alice")),  # admitted: every GPU
            asyncio.run(c.submit(small("s2"), by="bob")),  # rejected: no GPU left
            asyncio.run(c.submit(small("s3"), by="bob", wait_seconds=5 * SLOT)),  # pending
        ]
        assert [a.state for a in answers] == ["admitted", "rejected", "pending"]
        assert answers[0].decision.allocations and answers[1].decision.reason
        for answer in answers:
            assert answer == c._get_sync(answer.id)
        again = asyncio.run(c.submit(small("s2"), by="bob"))  # a retry: the stored job
        assert again == replace(answers[1], duplicate=True)
    finally:
        c.close()


def test_ids_stay_known_after_a_rebuild(tmp_path: Path) -> None:
    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    try:
        asyncio.run(c.submit(small("s1")))
        c._stale = True  # as after a store outage: the next step rebuilds the ledger
        with pytest.raises(ConflictError, match="another spec"):
            asyncio.run(c.submit(small("s1", epochs=3)))
        assert asyncio.run(c.submit(small("s1"))).duplicate
    finally:
        c.close()
    reopened = controller(tmp_path, clock)  # a restart loads the ids from the store
    try:
        assert asyncio.run(reopened.submit(small("s1"))).duplicate
        ids = reopened.between_decisions(lambda: reopened._ids.wait(reopened._ledger))
        assert ids is not None and "s1" in ids and "s9" not in ids
    finally:
        reopened.close()


def test_a_retry_written_otherwise_is_the_same_job(tmp_path: Path) -> None:
    """Before: ``"chunks": 8.0`` or ``"target": "3h"`` instead of ``8`` and ``3`` (slots
    of an hour) was refused as 'another spec', though the first submission read 8.0 as 8."""
    c = controller(tmp_path, FakeClock(1_000_000.0))
    try:
        first = asyncio.run(c.submit(small("s1"), by="alice", owner="alice"))
        base = small("s1")
        for same in (
            {**base, "chunks": float(base["chunks"]), "epochs": float(base["epochs"])},
            {**base, "utility": {**base["utility"], "target": f"{base['utility']['target']}h"}},
            {
                **base,
                "utility": {**base["utility"], "target": f"{60 * base['utility']['target']}m"},
            },
            {**base, "worker": {k: float(v) for k, v in base["worker"].items()}},
        ):
            again = asyncio.run(c.submit(same, by="alice", owner="alice"))
            assert again == replace(first, duplicate=True)
    finally:
        c.close()


def test_another_spec_under_an_id_names_what_differs(tmp_path: Path) -> None:
    c = controller(tmp_path, FakeClock(1_000_000.0))
    try:
        base = small("s1")
        asyncio.run(c.submit(base, by="alice", owner="alice"))
        other = {**base, "chunks": 16, "utility": {**base["utility"], "target": "5h"}}
        with pytest.raises(ConflictError) as err:
            asyncio.run(c.submit(other, by="alice", owner="alice"))
        assert str(err.value) == (  # the job's key (the API names it 's1' to alice)
            f"job 'alice:s1' exists with another spec (chunks: stored {base['chunks']}, sent 16; "
            f"utility.target: stored {base['utility']['target']} slots "
            f"({base['utility']['target']}h), sent 5 slots (5h)): give this job another id"
        )
        many = {**base, "epochs": 9, "chunks": 9, "minibatches": 9, "tau": 0.02,
                "grad_mb": 9, "worker": {**base["worker"], "cpu": 1, "mem": 1}}  # fmt: skip
        with pytest.raises(ConflictError, match=r"; and 3 more\): give") as err:
            asyncio.run(c.submit(many, by="alice", owner="alice"))
        assert len(str(err.value)) < 400
        # another submitter's id is its own: a job of its own (controller.job_keys)
        bobs = asyncio.run(c.submit(other, by="bob", owner="bob"))
        assert bobs.id == "bob:s1" and not bobs.duplicate and bobs.spec["chunks"] == 16
    finally:
        c.close()


def test_a_quote_says_what_a_submission_of_a_stored_id_would_get(tmp_path: Path) -> None:
    """Before: a quote said 'would be admitted' for an id that a submission then refused
    (ALREADY_EXISTS), or answered with its first decision."""
    c = controller(tmp_path, FakeClock(1_000_000.0))
    try:
        base = small("s1")
        stored = asyncio.run(c.submit(base, by="alice", owner="alice"))
        view, existing = asyncio.run(c.quote(base, by="alice", owner="alice"))
        assert view.admitted and existing == stored  # priced anew, and the stored job
        assert asyncio.run(c.quote(small("s2"), by="alice", owner="alice"))[1] is None
        other = {**base, "chunks": 16}
        with pytest.raises(ConflictError) as submitted:
            asyncio.run(c.submit(other, by="alice", owner="alice"))
        with pytest.raises(ConflictError) as quoted:
            asyncio.run(c.quote(other, by="alice", owner="alice"))
        assert str(quoted.value) == str(submitted.value)
        assert asyncio.run(c.quote(base, by="bob", owner="bob"))[1] is None  # bob's own id
    finally:
        c.close()


def test_a_job_whose_first_slots_are_full_starts_running_at_its_first_worker(
    tmp_path: Path,
) -> None:
    """A job admitted with no worker in its first slot (every GPU there is another
    tenant's) starts in the slot of its first worker: it stays ``admitted`` through the
    slots before, as its plan says, and is ``running`` from then on."""
    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    try:
        one_slot = blocker("full-slot-1")
        one_slot["minibatches"] = 1  # 16 workers for one slot: every GPU of slot 1
        held = asyncio.run(c.submit(one_slot, by="alice"))
        assert {a["slot"] for a in held.decision.allocations} == {1}
        later = asyncio.run(c.submit(small("later"), by="bob"))
        assert later.state == "admitted"
        first = min(a["slot"] for a in later.decision.allocations if a.get("workers"))
        assert first == 2
        clock.advance(SLOT)  # slot 1: alice's job runs, bob's has no worker yet
        asyncio.run(c.tick())
        assert c._get_sync("alice:full-slot-1").state == "running"
        assert c._get_sync("bob:later").state == "admitted"
        clock.advance(SLOT)  # slot 2: its first worker
        asyncio.run(c.tick())
        assert c._get_sync("bob:later").state == "running"
    finally:
        c.close()


def test_a_pending_job_admitted_with_no_worker_in_its_first_slot_starts_at_its_first_worker(
    tmp_path: Path,
) -> None:
    """As above, for a job admitted at a slot boundary after waiting: its first slot
    (slot 3, full with another tenant's job) holds none of its workers, so it is stored
    as starting in the slot of its first worker and is not ``running`` in slot 3."""
    from sqlalchemy import select

    from controller.store import JobRow

    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    try:
        assert asyncio.run(c.submit(blocker("wall"), by="ops")).state == "admitted"
        view = asyncio.run(c.submit(small("waits"), by="bob", wait_seconds=10 * SLOT))
        assert view.state == "pending"
        clock.advance(SLOT)  # slot 1: still blocked; then the wall goes from slot 2 on
        asyncio.run(c.tick())
        asyncio.run(c.cancel("ops:wall", by="ops"))
        for name, slot in (("fill-2", 2), ("fill-3", 3)):  # every GPU of slot 2, then 3
            filler = blocker(name)
            filler["minibatches"] = 1
            held = asyncio.run(c.submit(filler, by="alice"))
            assert {a["slot"] for a in held.decision.allocations} == {slot}
        clock.advance(SLOT)  # slot 2: decided again from slot 3, full until slot 4
        asyncio.run(c.tick())
        got = c._get_sync("bob:waits")
        assert got.state == "admitted", got.decision.reason
        first = min(a["slot"] for a in got.decision.allocations if a.get("workers"))
        assert first == 4
        with c.db.session() as session:
            start = session.scalar(select(JobRow.start_slot).where(JobRow.id == "bob:waits"))
        assert start == first
        clock.advance(SLOT)  # slot 3: no worker of it yet
        asyncio.run(c.tick())
        assert c._get_sync("bob:waits").state == "admitted"
    finally:
        c.close()


def test_a_stored_job_of_another_submitter_under_a_callers_key_is_a_conflict(
    tmp_path: Path,
) -> None:
    """Keys keep one submitter's ids from another's, but a row's submitter is the
    store's word (an edit, a restore): a submission whose key names a job stored for
    another submitter is refused as taken, whether or not the specs match, and neither
    that job's decision nor its spec is shown."""
    import json

    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    try:
        spec = json.dumps(small("x"), sort_keys=True, separators=(",", ":"))
        for canonical in (spec, spec.replace('"chunks":8', '"chunks":4')):
            with pytest.raises(ConflictError, match="taken by another submitter") as err:
                c._check_duplicate("bob:x", spec, "alice", canonical, "bob")
            assert "chunks" not in str(err.value)
    finally:
        c.close()


def test_a_rejected_jobs_row_reads_back_with_no_problem_logged(tmp_path: Path) -> None:
    """A rejected job has no payoff: its row reads back as the daemon wrote it, and no
    "does not read back" line is logged for it (only an admitted job's missing payoff is
    an edit's; with the admitted check dropped, every read of a rejected job logged one
    and every test passed)."""
    c = controller(tmp_path, FakeClock(0.0))
    try:  # jobs until the cluster holds no schedule of the next: no payoff
        rich = {"kind": "sigmoid", "priority": 10**6, "decay": 0, "target": 1}
        for i in range(300):
            view = asyncio.run(c.submit(small(f"j{i}", utility=rich)))
            if view.state == "rejected":
                break
        assert view.state == "rejected" and view.decision.payoff is None, view.decision
        assert c._get_sync(view.id).decision.payoff is None
        c._list_sync([], 10)
        assert not c._unreadable, c._unreadable
    finally:
        c.close()
