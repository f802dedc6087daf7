"""The pending queue: a job submitted with a wait that is not admitted at once stays
``pending`` and is decided again at each slot boundary, its utility counted from its
original arrival; it is admitted, expires, or is cancelled, survives ``kill -9``, and one
submitter's pending jobs are bounded.

The cluster of tests/servers.py has 16 GPUs. A blocker job of 16 one-GPU workers whose
work needs all of them in every slot of its window leaves no GPU to anyone arriving in
that window; explicit price bounds keep it cheap enough to be admitted.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
import structlog
from sqlalchemy import delete, select

from controller.admission import AdmissionController, QueueFullError
from controller.clock import FakeClock, SlotClock
from controller.config import Config, load
from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.store import Database, JobRow
from pricing import SpecError
from pricing.utility import Sigmoid
from tests.servers import Daemon, oasis, write_config
from tests.stores import store_session
from tests.test_daemon_e2e import job
from tests.test_slot_clock import InProcessDaemon, wait_for_state

SLOT = 3600.0
CHEAP = """
[pricing]
bounds = "explicit"
L1 = 0.001
L2 = 0.001
U1 = {gpu = 0.01, cpu = 0.01, mem = 0.01, disk = 0.01, bandwidth = 0.01}
U2 = {cpu = 0.01, mem = 0.01, disk = 0.01, bandwidth = 0.01}
"""


def blocker(job_id: str = "blocker", tau: float = 0.999) -> dict[str, Any]:
    """16 workers in each of 24 slots (W = 384 = N * T): every GPU of the window."""
    return job(
        job_id,
        epochs=1,
        chunks=16,
        minibatches=24,
        tau=tau,
        grad_mb=1,
        utility={"kind": "sigmoid", "priority": 1000, "decay": 0, "target": 1},
    )


def small(job_id: str, **changes: Any) -> dict[str, Any]:
    """Nine worker-slots (W = 9) in at least two slots (N = 8)."""
    return job(job_id, **changes)


def controller(
    tmp_path: Path, clock: FakeClock, extra: str = CHEAP, commit_process: bool = False
) -> AdmissionController:
    path = write_config(tmp_path / "c.toml", tmp_path / "data", epoch=clock.now(), extra="")
    path.write_text(path.read_text() + extra)
    return opened(load(path), clock, commit_process)


def opened(config: Config, clock: FakeClock, commit_process: bool = False) -> AdmissionController:
    """The controller of ``config`` on ``clock``, open (its store created); with
    ``commit_process``, its batches are written by a child process, as in the daemon."""
    config.data_dir.mkdir(parents=True, exist_ok=True)
    c = AdmissionController(
        config,
        Database(config.database_url),
        SlotClock(clock, SLOT, config.epoch),
        log=structlog.wrap_logger(structlog.ReturnLogger()),
        commit_process=commit_process,
    )
    c.open()
    return c


@pytest.fixture
def stub(tmp_path: Path) -> Iterator[tuple[Any, FakeClock]]:
    clock = FakeClock(1_000_000.0)
    path = write_config(tmp_path / "c.toml", tmp_path / "data", epoch=clock.now(), extra="")
    text = path.read_text().replace("tick_seconds = 0.2", "tick_seconds = 0.02")
    path.write_text(text + CHEAP)
    with InProcessDaemon(path, clock) as d, grpc.insecure_channel(d.address) as channel:
        yield pb_grpc.AdmissionStub(channel), clock


def test_a_cancel_frees_room_and_the_pending_job_is_admitted_at_the_next_boundary(
    stub: tuple[Any, FakeClock],
) -> None:
    admission, clock = stub
    held = admission.SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(blocker())), timeout=30)
    assert held.job.state == pb.JOB_STATE_ADMITTED
    assert len({a.slot for a in held.job.decision.allocations}) == 24

    req = pb.SubmitJobRequest(job=spec_to_proto(small("w1")), wait_seconds=5 * SLOT)
    waiting = admission.SubmitJob(req, timeout=30).job
    assert waiting.state == pb.JOB_STATE_PENDING
    assert waiting.wait_until_slot == 5
    assert "cannot fit" in waiting.decision.reason
    listed = admission.ListJobs(pb.ListJobsRequest(states=[pb.JOB_STATE_PENDING]), timeout=5)
    assert [j.spec.id for j in listed.jobs] == ["w1"]

    # without a wait the same job is rejected, as before
    plain = admission.SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(small("w0"))), timeout=30)
    assert plain.job.state == pb.JOB_STATE_REJECTED

    admission.CancelJob(pb.CancelJobRequest(id="blocker"), timeout=10)
    time.sleep(0.2)  # several ticks: nothing changes before the boundary
    got = admission.GetJob(pb.GetJobRequest(id="w1"), timeout=5).job
    assert got.state == pb.JOB_STATE_PENDING

    clock.advance(SLOT)  # slot 1: decided again from slot 2 on, its arrival still slot 1
    wait_for_state(admission, "w1", pb.JOB_STATE_ADMITTED)
    d = admission.GetJob(pb.GetJobRequest(id="w1"), timeout=5).job.decision
    assert d.arrival_slot == 1
    assert min(a.slot for a in d.allocations) == 2
    assert d.jct == d.completion_slot - d.arrival_slot + 1  # the slot of waiting counts
    f = Sigmoid(50, 0.5, 3)
    assert d.utility == pytest.approx(float(f.values(d.jct)), rel=1e-12)
    assert d.jct >= 3 and d.utility < float(f.values(2))  # d_min = 2: waiting cost utility
    events = admission.WatchEvents(pb.WatchEventsRequest(after_sequence=0), timeout=5)
    seen = []
    for e in events:
        seen.append((e.kind, e.job_id, e.state))
        if len(seen) == 5:
            break
    assert seen == [
        ("decided", "blocker", pb.JOB_STATE_ADMITTED),
        ("decided", "w1", pb.JOB_STATE_PENDING),
        ("decided", "w0", pb.JOB_STATE_REJECTED),
        ("cancelled", "blocker", pb.JOB_STATE_CANCELLED),
        ("decided", "w1", pb.JOB_STATE_ADMITTED),
    ]


def test_pending_jobs_expire_when_their_wait_ends_or_they_cannot_pay_off(
    tmp_path: Path,
) -> None:
    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    try:
        assert asyncio.run(c.submit(blocker())).state == "admitted"
        # wait ends at slot 1: decided once more there, still blocked, so it expires
        short = asyncio.run(c.submit(small("short"), wait_seconds=1.5 * SLOT))
        assert short.state == "pending" and short.wait_until_slot == 1
        # d_min = 2; worth ~100 by jct 3 and ~0 from jct 4: one slot of waiting may pay,
        # two cannot
        steep = {"kind": "sigmoid", "priority": 100, "decay": 50, "target": 3.5}
        doomed = asyncio.run(c.submit(small("doomed", utility=steep), wait_seconds=9 * SLOT))
        assert doomed.state == "pending"
        # a job that cannot pay off after even one slot of waiting is not queued at all
        hopeless = {"kind": "sigmoid", "priority": 100, "decay": 50, "target": 2.5}
        now_or_never = asyncio.run(
            c.submit(small("never", utility=hopeless), wait_seconds=SLOT * 9)
        )
        assert now_or_never.state == "rejected"
        assert "not queued: it cannot pay off after waiting" in now_or_never.decision.reason
        # a wait shorter than the time to the next boundary cannot help either
        brief = asyncio.run(c.submit(small("brief"), wait_seconds=SLOT / 2))
        assert (
            brief.state == "rejected" and "before the next slot boundary" in brief.decision.reason
        )

        clock.advance(SLOT)
        asyncio.run(c.tick())
        assert c._get_sync("short").state == "expired"
        assert "wait ended" in c._get_sync("short").decision.reason
        assert c._get_sync("doomed").state == "pending"  # f(3) may still pay
        clock.advance(SLOT)
        asyncio.run(c.tick())
        gone = c._get_sync("doomed")
        assert gone.state == "expired" and "can no longer pay off" in gone.decision.reason
        states = {v.id: v.state for v in c._list_sync([], 1000)[0]}
        assert states["short"] == states["doomed"] == "expired"
    finally:
        c.close()


def test_a_job_of_little_worth_is_admitted_in_the_last_slot_of_its_wait(tmp_path: Path) -> None:
    """The wait's last slot is one it may be admitted at, and a job worth little (its
    payoff ceiling under 1, still positive) is decided, not expired: the room the
    blocker's cancel frees in slot 1 is its in slot 2, the last of its wait."""
    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    try:
        assert asyncio.run(c.submit(blocker())).state == "admitted"
        modest = {"kind": "sigmoid", "priority": 1.2, "decay": 0, "target": 1}  # worth 0.6
        view = asyncio.run(c.submit(small("modest", utility=modest), wait_seconds=2.5 * SLOT))
        assert view.state == "pending" and view.wait_until_slot == 2
        clock.advance(SLOT)
        asyncio.run(c.tick())
        assert c._get_sync("modest").state == "pending"  # still blocked in slot 1
        asyncio.run(c.cancel("blocker"))
        clock.advance(SLOT)
        asyncio.run(c.tick())
        got = c._get_sync("modest")
        assert got.state == "admitted", got.decision.reason
        payoff = got.decision.payoff
        assert payoff is not None and 0 < payoff < 1
    finally:
        c.close()


def test_the_queue_of_all_submitters_is_bounded_by_max_pending(tmp_path: Path) -> None:
    """``max_pending`` places in all: with them taken by two tenants, a third's wait is
    refused (nothing stored), and its plain submission is decided as ever."""
    clock = FakeClock(1_000_000.0)
    extra = "\n[limits]\nmax_pending = 3\nmax_pending_per_submitter = 2\n"
    c = controller(tmp_path, clock, CHEAP + extra)
    try:
        asyncio.run(c.submit(blocker(), by="ops"))
        for by, name in (("alice", "a1"), ("alice", "a2"), ("bob", "b1")):
            view = asyncio.run(c.submit(small(name), by=by, wait_seconds=SLOT * 5))
            assert view.state == "pending"
        with pytest.raises(
            QueueFullError, match=r"3 jobs are pending already \(limits.max_pending = 3\)"
        ):
            asyncio.run(c.submit(small("c1"), by="carol", wait_seconds=SLOT * 5))
        assert len(c._list_sync(["pending"], 1000)[0]) == 3
        assert asyncio.run(c.submit(small("c1"), by="carol")).state == "rejected"
    finally:
        c.close()


def test_a_pending_job_is_planned_within_its_own_window_or_expires(tmp_path: Path) -> None:
    """SPEC 1: a job arriving at ``a`` may be planned up to ``a + T - 1`` (T = 24 here).
    Before: a job re-decided after waiting was planned up to ``first + T - 1``, so once the
    blocker's 24 slots ended it was admitted with a jct of 26 > T, past the slot a later
    re-plan of it (``arrival + T - 1``) may use."""
    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    try:
        assert asyncio.run(c.submit(blocker())).state == "admitted"  # slots 1 .. 24
        flat = {"kind": "sigmoid", "priority": 50, "decay": 0, "target": 1}  # waiting is free
        late = asyncio.run(c.submit(small("late", utility=flat), wait_seconds=30 * SLOT))
        assert late.state == "pending" and late.decision.arrival_slot == 1
        for _ in range(25):
            clock.advance(SLOT)
            asyncio.run(c.tick())
            got = c._get_sync("late")
            assert got.state != "admitted", got.decision
            if got.state == "expired":
                break
        assert got.state == "expired", got.decision.reason
        assert c.slot == 23  # d_min = 2: from slot 24 on it cannot end by slot 24
        assert "can no longer finish by slot 24, the end of its window" in got.decision.reason
        # a job that needs the whole window cannot wait at all
        whole = small("whole", epochs=1, chunks=16, minibatches=24, tau=0.999, utility=flat)
        assert asyncio.run(c.submit(whole, wait_seconds=5 * SLOT)).state == "rejected"
    finally:
        c.close()


def test_a_pending_job_can_be_cancelled(tmp_path: Path) -> None:
    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    try:
        asyncio.run(c.submit(blocker()))
        assert asyncio.run(c.submit(small("p"), wait_seconds=5 * SLOT)).state == "pending"
        view, released = asyncio.run(c.cancel("p"))
        assert view.state == "cancelled" and released == 0
        asyncio.run(c.cancel("blocker"))
        clock.advance(SLOT)
        asyncio.run(c.tick())
        assert c._get_sync("p").state == "cancelled"  # not admitted once room is free
        assert "p" not in c._ledger
    finally:
        c.close()


def test_a_job_whose_arrival_an_edit_broke_can_still_be_cancelled(tmp_path: Path) -> None:
    """The store audit: with ``arrival_slot`` edited to text (it reads as None) while the
    daemon ran, its tenant's cancel answered INTERNAL (TypeError). It is cancelled from
    the next slot, every allocation from there released."""
    from sqlalchemy import text

    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    try:
        view = asyncio.run(c.submit(small("broken")))
        assert view.state == "admitted"
        planned = sum(a.get("workers", 0) for a in view.decision.allocations)
        with c.db.session() as session:
            session.execute(text("UPDATE jobs SET arrival_slot = 'then' WHERE id = 'broken'"))
        cancelled, released = asyncio.run(c.cancel("broken"))
        assert cancelled.state == "cancelled"
        assert 0 < released <= planned
    finally:
        c.close()


def test_one_submitters_pending_jobs_are_bounded(tmp_path: Path) -> None:
    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock, CHEAP + "\n[limits]\nmax_pending_per_submitter = 2\n")
    try:
        asyncio.run(c.submit(blocker(), by="alice"))
        for name in ("a1", "a2"):
            assert asyncio.run(c.submit(small(name), by="alice", wait_seconds=SLOT * 5)).state == (
                "pending"
            )
        with pytest.raises(QueueFullError, match="max_pending_per_submitter = 2"):
            asyncio.run(c.submit(small("a3"), by="alice", wait_seconds=SLOT * 5))
        with pytest.raises(SpecError, match="max_wait_seconds"):
            asyncio.run(c.submit(small("a4"), by="bob", wait_seconds=1e9))
        # another tenant still gets a place, and the refused job left nothing behind
        assert asyncio.run(c.submit(small("b1"), by="bob", wait_seconds=SLOT * 5)).state == (
            "pending"
        )
        pending = [v.id for v in c._list_sync(["pending"], 1000)[0]]
        assert pending == ["alice:a1", "alice:a2", "bob:b1"]  # keyed by submitter
        assert asyncio.run(c.submit(small("a3"), by="alice", wait_seconds=0)).state == "rejected"
    finally:
        c.close()


def test_a_smaller_queue_keeps_one_submitter_from_filling_it(tmp_path: Path) -> None:
    """``max_pending`` lowered alone (a small cluster's queue) lowers the submitter's
    share with it, a tenth as in the defaults: it stayed 100, so one tenant's jobs could
    take every place of a queue of 20 and every other tenant's ``--wait`` was refused
    (the tenant isolation audit)."""
    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock, CHEAP + "\n[limits]\nmax_pending = 20\n")
    try:
        assert c.config.limits.max_pending_per_submitter == 2
        asyncio.run(c.submit(blocker(), by="ops"))
        for name in ("a1", "a2"):
            view = asyncio.run(c.submit(small(name), by="alice", wait_seconds=SLOT * 5))
            assert view.state == "pending"
        with pytest.raises(QueueFullError, match="max_pending_per_submitter = 2"):
            asyncio.run(c.submit(small("a3"), by="alice", wait_seconds=SLOT * 5))
        view = asyncio.run(c.submit(small("b1"), by="bob", wait_seconds=SLOT * 5))
        assert view.state == "pending"
    finally:
        c.close()


def test_pending_jobs_are_decided_again_in_submission_order(tmp_path: Path) -> None:
    """After the blocker is cancelled there is room for only one of two equal pending
    jobs, each needing every GPU of its window but one slot (the one it waited): the one
    submitted first gets it."""
    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    try:
        asyncio.run(c.submit(blocker()))
        for name in ("first", "second"):
            spec = small(name, chunks=16, minibatches=23, epochs=1, tau=0.999, grad_mb=1)
            spec["utility"] = {"kind": "sigmoid", "priority": 1000, "decay": 0, "target": 1}
            assert asyncio.run(c.submit(spec, wait_seconds=SLOT * 5)).state == "pending"
        asyncio.run(c.cancel("blocker"))
        clock.advance(SLOT)
        asyncio.run(c.tick())
        a, b = c._get_sync("first"), c._get_sync("second")
        assert (a.state, b.state) == ("admitted", "pending")
        assert a.sequence > 1  # it took the next place in decision order when admitted
    finally:
        c.close()


def test_one_submitters_pending_jobs_cannot_hold_the_boundary_for_everyone(
    tmp_path: Path,
) -> None:
    """Alice's many pending jobs are searched again within her budget of search steps
    per boundary (``limits.pending_steps_per_submitter``), so Bob's submission right
    after a boundary waits for a bounded number of her searches, not all of them. The
    jobs she had left over go first at the next boundary: within ceil(7 / 2) boundaries
    each of hers was decided again, none starved; one left over in its wait's last slot
    expires at the next boundary all the same (no search, so not charged). Counted in
    searches (deterministic)."""
    clock = FakeClock(1_000_000.0)
    flat = {"kind": "sigmoid", "priority": 50, "decay": 0, "target": 1}  # waiting is free

    def mine(job_id: str) -> dict[str, Any]:
        # W = 9 with one worker per slot: nine slots, so it cannot fit at boundary k < 9
        # (only slots 25..k + 24 are free of the blocker's plan) and stays pending
        return small(job_id, chunks=1, minibatches=450, utility=flat)

    (tmp_path / "probe").mkdir()
    probe = controller(tmp_path / "probe", clock)
    steps = probe.search_steps(mine("x"))
    probe.close()
    limits = f"[limits]\nmax_pending_per_submitter = 10\npending_steps_per_submitter = {2 * steps}"
    c = controller(tmp_path, clock, f"{CHEAP}\n{limits}\n")
    searched: list[str] = []
    search = c._search

    def counted(job: Any, *args: Any, **kwargs: Any) -> Any:
        searched.append(job.id.partition(":")[2])  # its id, without its submitter
        return search(job, *args, **kwargs)

    c._search = counted  # type: ignore[method-assign]
    try:
        assert asyncio.run(c.submit(blocker(), by="ops")).state == "admitted"
        alice = [f"a{i}" for i in range(7)]
        for name in alice:
            view = asyncio.run(c.submit(mine(name), by="alice", wait_seconds=SLOT * 20))
            assert view.state == "pending"
        # its wait ends in slot 2, while Alice's earlier jobs take her budget
        short = asyncio.run(c.submit(mine("a7"), by="alice", wait_seconds=SLOT * 2.5))
        assert (short.state, short.wait_until_slot) == ("pending", 2)
        assert asyncio.run(c.submit(mine("b0"), by="bob", wait_seconds=SLOT * 20)).state == (
            "pending"
        )

        # each boundary: two of Alice's jobs (her budget; the ones left over last time
        # first, then in submission order), Bob's pending one, then Bob's newcomer
        expected = {
            1: ["a0", "a1", "b0"],
            2: ["a2", "a3", "b0"],
            3: ["a4", "a5", "b0"],
            4: ["a6", "a0", "b0"],  # every job of Alice's decided again within 4
        }
        for slot, pending in expected.items():
            clock.advance(SLOT)
            del searched[:]
            # the first step after the boundary is Bob's: the pending jobs are decided
            # (within budget) before it, then his
            view = asyncio.run(c.submit(small(f"b{slot}"), by="bob"))
            assert view.state != "pending"  # a plain submission, no wait
            assert searched == [*pending, f"b{slot}"], slot
            still = {*alice, "b0"} | ({"a7"} if slot < 3 else set())
            ids = {v.id.partition(":")[2] for v in c._list_sync(["pending"], 1000)[0]}
            assert ids == still
        gone = c._get_sync("alice:a7")
        assert gone.state == "expired" and "its wait ended in slot 2" in gone.decision.reason
        with c.db.session() as session:
            keys = [f"alice:{name}" for name in alice]
            query = select(JobRow.id, JobRow.decided_slot).where(JobRow.id.in_(keys))
            decided = {key.partition(":")[2]: slot for key, slot in session.execute(query)}
        assert decided == {"a0": 4, "a1": 1, "a2": 2, "a3": 2, "a4": 3, "a5": 3, "a6": 4}
    finally:
        c.close()


_FLAT = {"kind": "sigmoid", "priority": 50, "decay": 0, "target": 1}  # waiting is free


def _waiting(job_id: str) -> dict[str, Any]:
    """A job that cannot fit beside the blocker of the budget tests: it stays pending."""
    return small(job_id, chunks=1, minibatches=450, utility=_FLAT)


def _steps_of_one_wait(tmp_path: Path, clock: FakeClock) -> int:
    """The search steps of one :func:`_waiting` job, on a probe controller of its own."""
    (tmp_path / "probe").mkdir()
    probe = controller(tmp_path / "probe", clock)
    try:
        return probe.search_steps(_waiting("x"))
    finally:
        probe.close()


def test_many_submitters_pending_jobs_cannot_hold_the_boundary_either(tmp_path: Path) -> None:
    """Five submitters' pending jobs, each within its own budget, are held together to
    the boundary's (``limits.pending_steps_per_boundary``: here four searches), so the
    submission right after a boundary waits for four searches, not ten; the jobs not
    reached go first at the next boundary, each decided again within three. Counted in
    searches (deterministic)."""
    clock = FakeClock(1_000_000.0)
    steps = _steps_of_one_wait(tmp_path, clock)
    waiting = _waiting
    limits = (f"[limits]\npending_steps_per_submitter = {100 * steps}\n"
              f"pending_steps_per_boundary = {4 * steps}")  # fmt: skip
    c = controller(tmp_path, clock, f"{CHEAP}\n{limits}\n")
    searched: list[str] = []
    search = c._search

    def counted(job: Any, *args: Any, **kwargs: Any) -> Any:
        searched.append(job.id)
        return search(job, *args, **kwargs)

    c._search = counted  # type: ignore[method-assign]
    try:
        assert asyncio.run(c.submit(blocker(), by="ops")).state == "admitted"
        queued = [f"u{u}:j{j}" for j in range(2) for u in range(5)]  # in submission order
        for key in queued:
            by, _, name = key.partition(":")
            view = asyncio.run(c.submit(waiting(name), by=by, wait_seconds=SLOT * 20))
            assert view.state == "pending"
        expected = {
            1: queued[0:4],
            2: queued[4:8],
            3: [*queued[8:10], *queued[0:2]],  # every job decided again within 3
        }
        for slot, pending in expected.items():
            clock.advance(SLOT)
            del searched[:]
            view = asyncio.run(c.submit(small(f"n{slot}"), by="ops"))
            assert view.state != "pending"
            assert searched == [*pending, f"ops:n{slot}"], slot
        assert {v.id for v in c._list_sync(["pending"], 1000)[0]} == set(queued)
    finally:
        c.close()


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        # each submitter's first job is searched though it alone is over her budget
        ("pending_steps_per_submitter", {1: ["a0", "b0"], 2: ["a1", "b0"], 3: ["a0", "b0"]}),
        # the boundary's first job is searched though it alone is over the boundary's
        ("pending_steps_per_boundary", {1: ["a0"], 2: ["a1"], 3: ["b0"]}),
    ],
)
def test_a_budget_below_one_search_still_decides_the_first_job_so_none_starves(
    tmp_path: Path, budget: str, expected: dict[int, list[str]]
) -> None:
    """A budget of search steps smaller than one pending job's search (an operator's
    choice: the budgets and ``max_search_steps`` are set apart) still lets the first
    search of each submitter, and of the boundary, run: else no pending job of that
    submitter (or nobody's) were decided again at any boundary, and each would wait out
    its wait beside room freed for it."""
    clock = FakeClock(1_000_000.0)
    steps = _steps_of_one_wait(tmp_path, clock)
    waiting = _waiting
    c = controller(tmp_path, clock, f"{CHEAP}\n[limits]\n{budget} = {steps / 2}\n")
    searched: list[str] = []
    search = c._search

    def counted(job: Any, *args: Any, **kwargs: Any) -> Any:
        searched.append(job.id.partition(":")[2])
        return search(job, *args, **kwargs)

    c._search = counted  # type: ignore[method-assign]
    try:
        assert asyncio.run(c.submit(blocker(), by="ops")).state == "admitted"
        for by, name in (("alice", "a0"), ("alice", "a1"), ("bob", "b0")):
            view = asyncio.run(c.submit(waiting(name), by=by, wait_seconds=SLOT * 20))
            assert view.state == "pending"
        for slot, pending in expected.items():
            clock.advance(SLOT)
            del searched[:]
            view = asyncio.run(c.submit(small(f"n{slot}"), by="ops"))
            assert view.state != "pending"
            assert searched == [*pending, f"n{slot}"], slot
    finally:
        c.close()


def test_a_pending_job_survives_kill_9(tmp_path: Path) -> None:
    """The daemon as a subprocess with 10-second slots: a pending job is still pending
    after ``kill -9`` and a restart, and is admitted at the first boundary after the
    blocker is cancelled. It needs 17 slots of one worker, so the slots after the
    blocker's plan cannot hold it for 16 boundaries (160 s), far longer than the test."""
    config = write_config(tmp_path / "c.toml", tmp_path / "data")
    text = config.read_text().replace("slot_seconds = 3600", "slot_seconds = 10")
    config.write_text(text + CHEAP)
    d = Daemon(config, tmp_path / "oasisd.log").start()
    try:
        spec_file = tmp_path / "blocker.json"
        spec_file.write_text(json.dumps(blocker(tau=0.998)))  # W = 384 with 10-s slots
        out = oasis("submit", str(spec_file), "--json", server=d.address)
        assert json.loads(out.stdout)["state"] == "admitted"
        flat = {"kind": "sigmoid", "priority": 50, "decay": 0, "target": 1}  # waiting is free
        spec_file.write_text(json.dumps(small("survivor", chunks=1, utility=flat)))
        out = oasis("submit", str(spec_file), "--wait", "1h", server=d.address, check=False)
        assert out.returncode == 4, out.stderr  # pending: neither admitted nor rejected
        assert "survivor: pending until slot" in out.stdout, out.stdout
        d.kill9()
        d = Daemon(config, tmp_path / "oasisd2.log").start()
        listed = oasis("jobs", "--state", "pending", server=d.address)
        assert "survivor" in listed.stdout and "pending" in listed.stdout
        oasis("cancel", "blocker", server=d.address)
        with grpc.insecure_channel(d.address) as channel:
            admission = pb_grpc.AdmissionStub(channel)
            wait_for_state(admission, "survivor", pb.JOB_STATE_ADMITTED, timeout=45)
            got = admission.GetJob(pb.GetJobRequest(id="survivor"), timeout=5).job
        assert got.decision.jct == got.decision.completion_slot - got.decision.arrival_slot + 1
        assert min(a.slot for a in got.decision.allocations) > got.decision.arrival_slot
    finally:
        d.stop()


def test_estimated_bounds_observe_a_pending_job_once(tmp_path: Path) -> None:
    """With estimated price bounds, a job is observed at its submission only: deciding
    it again at later boundaries (pending, then admitted) leaves the estimate as it was."""
    from controller.admission.state import ESTIMATE_KEY
    from controller.store import MetaRow

    clock = FakeClock(1_000_000.0)
    # [pricing] bounds estimated (the default), from no prior: x alone sets them, so the
    # busy slots price y out (the shipped prior prices them lower and admits y at once)
    c = controller(tmp_path, clock, extra='[pricing]\nprior = "none"\n')
    try:
        assert c.config.pricing.mode == "estimate"
        # 16 GPUs for 3 slots, then a small job priced out by the busy slots
        x = job("x", epochs=1, chunks=16, minibatches=3, tau=0.999, grad_mb=1)
        x["utility"] = {"kind": "sigmoid", "priority": 1000, "decay": 0, "target": 1}
        assert asyncio.run(c.submit(x)).state == "admitted"
        y = small("y", utility={"kind": "sigmoid", "priority": 80, "decay": 0.5, "target": 3})
        assert asyncio.run(c.submit(y, wait_seconds=SLOT * 5)).state == "pending"

        def stored() -> Any:
            """The estimate as the store holds it: its head row and a row per submitter."""
            with c.db.session() as session:
                assert session.get(MetaRow, ESTIMATE_KEY) is not None
                return c._stored_estimate(session).to_dict()

        after_submission = c._estimate.to_dict()
        assert stored() == after_submission
        clock.advance(SLOT)
        asyncio.run(c.tick())
        assert c._get_sync("y").state == "pending"
        asyncio.run(c.cancel("x"))
        clock.advance(SLOT)
        asyncio.run(c.tick())
        assert c._get_sync("y").state == "admitted"
        assert c._estimate.to_dict() == after_submission
        assert stored() == after_submission
        # ... whereas observing it again would have changed it
        job_y = c._parse(y, 1)
        assert c._estimate.observe(job_y).to_dict() != after_submission
    finally:
        c.close()


def test_slot_0_is_the_first_start_on_a_whole_slot_recorded_in_the_store(tmp_path: Path) -> None:
    """Without ``epoch`` in the config, slot 0 begins at the daemon's first start floored
    to a whole slot in Unix time (before: the start to the second, so tables showed
    10:41:57), and a restart keeps it; an explicit ``epoch`` still wins, and a store
    whose slot 0 an older version recorded to the second keeps that one."""
    from controller.admission.state import EPOCH_KEY
    from controller.store import MetaRow

    hour = 1_699_999_200.0  # 472,222 hours after the Unix epoch
    clock = FakeClock(hour + 3599.0)  # a second before the next hour
    path = write_config(tmp_path / "c.toml", tmp_path / "data", epoch=0.0)
    path.write_text(path.read_text().replace("epoch = 0.0\n", ""))
    config = load(path)
    assert config.epoch_from_store
    c = opened(config, clock)
    try:
        assert c.slots.epoch == hour and c.slot == 0  # a second of slot 0 left
        assert c.slots.seconds_to_next_slot() == pytest.approx(1.0)
        view = asyncio.run(c.submit(small("first")))
        assert view.state == "admitted" and view.decision.arrival_slot == 1
    finally:
        c.close()
    clock.advance(2.5 * SLOT)
    c = opened(config, clock)
    assert c.slots.epoch == hour and c.slot == 3  # not restarted at slot 0
    c.close()
    explicit = load(write_config(tmp_path / "e.toml", tmp_path / "other", epoch=1000.0))
    assert not explicit.epoch_from_store
    c = opened(explicit, clock)
    assert c.slots.epoch == 1000.0 and c.slot == int((clock.now() - 1000.0) // SLOT)
    c.close()
    older_path = write_config(tmp_path / "o.toml", tmp_path / "older", epoch=0.0)
    older_path.write_text(older_path.read_text().replace("epoch = 0.0\n", ""))
    older = load(older_path)
    opened(older, clock).close()
    recorded = {"epoch": hour + 123.4, "source": "the daemon's first start"}  # to the second
    with store_session(older.database_url) as session:
        session.merge(MetaRow(key=EPOCH_KEY, value=recorded))
    c = opened(older, clock)
    assert c.slots.epoch == hour + 123.4
    c.close()


def test_slot_0_far_out_is_refused_in_the_config_and_in_the_store(tmp_path: Path) -> None:
    """Slot 0 at 1e300 s made every listing's slot times overflow in the client: the
    config's ``epoch`` and the store's recorded one must be Unix times up to the year
    3000, each refused naming where it came from."""
    from controller.admission.state import EPOCH_KEY, SETTINGS_KEY
    from controller.config import ConfigError
    from controller.startup import StartupError, open_store
    from controller.store import MetaRow

    path = write_config(tmp_path / "c.toml", tmp_path / "data", epoch=0.0)
    for bad in ("1e300", "-1.0", "32503680001"):
        path.write_text(path.read_text().replace("epoch = 0.0\n", f"epoch = {bad}\n"))
        with pytest.raises(ConfigError, match=r"daemon\.epoch: must be a Unix time from 0"):
            load(path)
        path.write_text(path.read_text().replace(f"epoch = {bad}\n", "epoch = 0.0\n"))
    path.write_text(path.read_text().replace("epoch = 0.0\n", ""))
    config = load(path)
    c = opened(config, FakeClock(1_700_000_000.0))  # records slot 0 in the store
    epoch = c.slots.epoch
    c.close()
    # the store audit: an edited epoch row stopped the daemon with exit 1, which systemd
    # restarts in a loop; the settings row's slot 0 is read then (and the row mended)
    for edit in ({"epoch": 1e300, "source": "an edit"}, [1], {"epoch": "nan"}):
        with store_session(config.database_url) as session:
            session.merge(MetaRow(key=EPOCH_KEY, value=edit))
        c = opened(config, FakeClock(1_700_000_000.0))
        try:
            assert c.slots.epoch == epoch
        finally:
            c.close()
        with store_session(config.database_url) as session:
            mended = session.get(MetaRow, EPOCH_KEY)
            assert mended is not None and mended.value["epoch"] == epoch
    # with no settings row to read it from, a refusal naming the row, exit 2
    with store_session(config.database_url) as session:
        session.merge(MetaRow(key=EPOCH_KEY, value={"epoch": 1e300, "source": "an edit"}))
        session.execute(delete(MetaRow).where(MetaRow.key == SETTINGS_KEY))
    with pytest.raises(SpecError, match=r"meta row 'epoch': epoch: must be a Unix time"):
        opened(config, FakeClock(1_700_000_000.0))
    with store_session(config.database_url) as session:
        session.merge(MetaRow(key=EPOCH_KEY, value=[1]))
    with pytest.raises(SpecError, match=r"meta row 'epoch': must be a JSON object .*got list"):
        opened(config, FakeClock(1_700_000_000.0))
    c = AdmissionController(config, Database(config.database_url),
                            SlotClock(FakeClock(1_700_000_000.0), SLOT, config.epoch))  # fmt: skip
    with pytest.raises(StartupError, match=r"set daemon\.epoch .* or mend that row") as refused:
        open_store(config, c, None)
    assert refused.value.status == 2  # not restarted by systemd
    c.close()


def test_a_deleted_slot_0_row_is_read_from_the_settings_or_refused(tmp_path: Path) -> None:
    """The HA audit: ``delete from meta`` made a restart read slot 0 as the Unix epoch
    (the legacy rule) and complete every tenant's admitted job at once, its capacity
    sold again; deleting the ``epoch`` row alone gave a refusal that blamed a
    ``daemon.epoch`` the config does not set. Slot 0 is now read from the ``settings``
    row, and without either row a store whose newest job says otherwise is refused."""
    from controller.admission.state import EPOCH_KEY, SETTINGS_KEY
    from controller.errors import SlotGridChangedError
    from controller.store import MetaRow

    clock = FakeClock(time.time())  # decided_at is the wall clock's
    path = write_config(tmp_path / "c.toml", tmp_path / "data", epoch=0.0)
    path.write_text(path.read_text().replace("epoch = 0.0\n", ""))
    config = load(path)
    c = opened(config, clock)
    try:
        epoch = c.slots.epoch
        assert asyncio.run(c.submit(small("kept"))).state == "admitted"
    finally:
        c.close()
    for deleted in ((EPOCH_KEY,), (EPOCH_KEY, SETTINGS_KEY)):
        with store_session(config.database_url) as session:
            session.execute(delete(MetaRow).where(MetaRow.key.in_(deleted)))
        if len(deleted) == 2:
            with pytest.raises(SlotGridChangedError, match="puts slot 0 near") as refused:
                opened(config, clock)
            assert f"epoch = {epoch:.0f}" in str(refused.value)
            break
        c = opened(config, clock)
        try:
            assert c.slots.epoch == epoch
            assert c._get_sync("kept").state == "admitted"
        finally:
            c.close()


def test_the_slot_0_a_refusal_suggests_holds_after_a_job_that_waited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The diff review: the refusal above took the newest job's submitted slot with its
    decision time, and a job admitted after waiting was decided slots later: the slot 0
    it suggested was that many slots late (an operator following it would move every
    stored plan). It takes the slot the decision was made in."""
    from datetime import datetime

    from controller.admission import pending
    from controller.admission.state import EPOCH_KEY, SETTINGS_KEY
    from controller.errors import SlotGridChangedError
    from controller.store import MetaRow

    clock = FakeClock(time.time())

    class Now(datetime):  # the pending module's wall clock follows the fake one
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return datetime.fromtimestamp(clock.now(), tz)

    monkeypatch.setattr(pending, "datetime", Now)
    path = write_config(tmp_path / "c.toml", tmp_path / "data", epoch=0.0)
    path.write_text(path.read_text().replace("epoch = 0.0\n", "") + CHEAP)
    config = load(path)
    c = opened(config, clock)
    try:
        epoch = c.slots.epoch
        assert asyncio.run(c.submit(blocker())).state == "admitted"
        assert asyncio.run(c.submit(small("w"), wait_seconds=20 * SLOT)).state == "pending"
        for _ in range(6):
            clock.advance(SLOT)
            asyncio.run(c.tick())
        asyncio.run(c.cancel("blocker"))
        clock.advance(SLOT)
        asyncio.run(c.tick())
        assert c._get_sync("w").state == "admitted"
    finally:
        c.close()
    db = Database(config.database_url)
    with db.session() as session:
        session.execute(delete(MetaRow).where(MetaRow.key.in_((EPOCH_KEY, SETTINGS_KEY))))
    db.dispose()
    with pytest.raises(SlotGridChangedError) as refused:
        opened(config, clock)
    assert f"epoch = {epoch:.0f}" in str(refused.value), str(refused.value)


def test_a_store_with_jobs_but_no_recorded_slot_0_keeps_the_unix_epoch(tmp_path: Path) -> None:
    """A store written before slot 0 was recorded numbered its slots from the Unix epoch
    (the old default): a config without ``epoch`` keeps that numbering for it."""
    clock = FakeClock(1_700_000_000.0)
    old = controller(tmp_path, FakeClock(0.0), extra="")  # writes c.toml with epoch = 0
    old.close()
    path = tmp_path / "c.toml"
    legacy = load(path)
    assert not legacy.epoch_from_store
    c = opened(legacy, clock)
    assert asyncio.run(c.submit(small("old"))).state == "admitted"
    c.close()
    path.write_text(path.read_text().replace("epoch = 0.0\n", ""))
    config = load(path)
    assert config.epoch_from_store
    c = opened(config, clock)
    try:
        assert c.slots.epoch == 0.0 and c.slot == int(1_700_000_000.0 // SLOT)
    finally:
        c.close()


def test_a_slot_tick_moves_jobs_a_batch_a_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: every job starting or ending at a boundary moved in one step of the
    decision thread (14,593 tiny jobs held every tenant's calls 4.5 s). Now a batch of
    TICK_BATCH a step; running jobs whose agents are still reporting (they stay running)
    are walked past, so the tick ends however many there are."""
    monkeypatch.setattr("controller.admission.lifecycle.TICK_BATCH", 3)
    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    steps: list[int] = []
    tick_sync = c._tick_sync

    def counted(*args: Any) -> Any:
        events, cursor = tick_sync(*args)
        steps.append(len(events))
        return events, cursor

    monkeypatch.setattr(c, "_tick_sync", counted)
    try:
        for i in range(8):  # W = 1 each, worth most in slot 1: in slot 1 only
            view = asyncio.run(c.submit(small(f"t{i}", chunks=1, minibatches=1)))
            assert (view.state, view.decision.completion_slot) == ("admitted", 1)
        clock.advance(SLOT)
        asyncio.run(c.tick())
        assert steps == [3, 3, 2]  # 8 jobs start: three steps
        assert {v.state for v in c._list_sync([], 100)[0]} == {"running"}
        # their agents still report (the plane's check): all stay running, the tick ends
        c.execution = SimpleNamespace(unfinished=lambda job_id, session: True)  # type: ignore[assignment]
        steps.clear()
        clock.advance(SLOT)
        asyncio.run(c.tick())
        assert steps == [0, 0, 0]  # walked past in three steps, none completed
        assert {v.state for v in c._list_sync([], 100)[0]} == {"running"}
        c.execution = None
        steps.clear()
        clock.advance(SLOT)
        asyncio.run(c.tick())
        assert steps == [3, 3, 2]
        assert {v.state for v in c._list_sync([], 100)[0]} == {"completed"}
    finally:
        c.close()


def test_a_rejection_says_when_a_deadline_was_before_the_arrival(tmp_path: Path) -> None:
    """A deadline (with a half_life) or a target already past is valid, but a mistyped
    date read as 'priced out' alone (audit, 2026-11-27): the reason now says so."""
    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    try:
        asyncio.run(c.submit(blocker()))
        late = {"kind": "deadline", "value": 50, "deadline": {"slot": 0}, "half_life": 2}
        view = asyncio.run(c.submit(small("late", utility=late)))
        assert view.state == "rejected"
        assert "note: utility.deadline " in view.decision.reason
        assert "is not after the job's arrival" in view.decision.reason
        on_time = {"kind": "deadline", "value": 50, "deadline": {"slot": 20}, "half_life": 2}
        other = asyncio.run(c.submit(small("on-time", utility=on_time)))
        assert other.state == "rejected" and "note:" not in other.decision.reason
    finally:
        c.close()


def test_a_quote_at_a_boundary_counts_the_pending_jobs_decided_there(tmp_path: Path) -> None:
    """A quote in the moments after a slot boundary, before the slot clock's tick, was
    priced on a ledger without the pending jobs that boundary admits: alice's whole-cluster
    job was quoted ``admitted`` (exit 0) while the same file submitted a moment later was
    rejected (exit 3), bob's pending job having taken the room first. The quote now has the
    boundary's pending jobs decided first, as a submission does, and commits nothing of its
    own; on a store refusing writes it is still answered (reads and quotes go on)."""
    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    whole = {"chunks": 16, "minibatches": 23, "epochs": 1, "tau": 0.999, "grad_mb": 1}
    rich = {"kind": "sigmoid", "priority": 1000, "decay": 0, "target": 1}
    try:
        asyncio.run(c.submit(blocker(), by="ops"))
        waiting = asyncio.run(
            c.submit(small("b1", **whole, utility=rich), by="bob", wait_seconds=SLOT * 5)
        )
        assert waiting.state == "pending"
        asyncio.run(c.cancel("ops:blocker"))
        clock.advance(SLOT)  # slot 1 began; the slot clock has not ticked yet
        quoted, existing = asyncio.run(c.quote(small("a1", **whole, utility=rich), by="alice"))
        assert existing is None
        assert not quoted.admitted, "quoted against room bob's pending job takes"
        assert c._get_sync("bob:b1").state == "admitted"
        assert c._list_sync([], 1000)[0][-1].id == "bob:b1"  # the quote stored nothing
        submitted = asyncio.run(c.submit(small("a1", **whole, utility=rich), by="alice"))
        assert submitted.state == "rejected"  # as quoted

        # a store refusing writes: the quote is answered without the pass, as before
        b2 = small("b2", **whole, utility=rich)
        assert asyncio.run(c.submit(b2, by="bob", wait_seconds=SLOT * 5)).state == "pending"
        clock.advance(SLOT)
        c.db._full = "no space left on device"
        try:
            quoted, _ = asyncio.run(c.quote(small("a2"), by="alice"))
            assert quoted.arrival_slot == 3  # priced at slot 2, its window moved
            assert c._get_sync("bob:b2").state == "pending"
        finally:
            c.db._full = ""
    finally:
        c.close()


def test_a_submission_refused_for_a_full_queue_leaves_the_price_bounds_as_they_were(
    tmp_path: Path,
) -> None:
    """With estimated bounds a decision first folds its job into the estimate and
    prices with it; a submission then refused (its submitter's queue full: nothing is
    stored) must put the bounds back, or every tenant's next decisions, and the pending
    jobs decided at the next boundary, were priced with a job that never was. One
    submitter: the bounds are its estimate's (with more, the median may not move)."""
    clock = FakeClock(1_000_000.0)
    # no prior: the first jobs set the values, so one more job moves them
    extra = (
        '\n[pricing]\nbounds = "estimate"\nprior = "none"\n'
        "[limits]\nmax_pending_per_submitter = 1\n"
    )
    c = controller(tmp_path, clock, extra)
    try:
        assert c.config.pricing.mode == "estimate"
        asyncio.run(c.submit(blocker()))
        steep = {"kind": "sigmoid", "priority": 90, "decay": 0, "target": 1}
        first = asyncio.run(c.submit(small("a1", utility=steep), wait_seconds=SLOT * 5))
        assert first.state == "pending"
        before = c._ledger.bounds
        estimate = c._estimate
        other = small("a2", utility={"kind": "sigmoid", "priority": 3e4, "decay": 0, "target": 1})
        with pytest.raises(QueueFullError):
            asyncio.run(c.submit(other, wait_seconds=SLOT * 5))
        assert c._estimate is estimate
        assert c._ledger.bounds.same_as(before)
    finally:
        c.close()


def test_a_list_of_jobs_admitted_and_pending_exits_pending(tmp_path: Path) -> None:
    """The mutation audit of the client: ``submit --wait`` of a list whose first job was
    admitted and second left pending exits 4 (pending), not 3 (rejected: none was), with
    or without ``--json``."""
    config = write_config(tmp_path / "c.toml", tmp_path / "data", extra=CHEAP)
    d = Daemon(config, tmp_path / "oasisd.log").start()
    try:
        spec_file = tmp_path / "jobs.json"
        spec_file.write_text(json.dumps([blocker(), small("lw1")]))
        out = oasis("submit", str(spec_file), "--wait", "5h", server=d.address, check=False)
        assert out.returncode == 4, out.stdout + out.stderr
        assert "lw1: pending until slot" in out.stdout, out.stdout
        spec_file.write_text(json.dumps([small("lw2"), small("lw3")]))
        out = oasis("submit", str(spec_file), "--wait", "5h", "--json", server=d.address,
                    check=False)  # fmt: skip
        assert out.returncode == 4, out.stdout + out.stderr
        listed = json.loads(out.stdout)
        assert [j["state"] for j in listed] == ["pending", "pending"]
        # the last slot each may be admitted at (the mutation audit: dropped from the
        # record, every test passed); a job submitted without a wait has none
        until = [j["wait_until_slot"] for j in listed]
        assert until[0] == until[1] == listed[0]["submitted_slot"] + 5, listed
        shown = json.loads(oasis("job", "blocker", "--json", server=d.address).stdout)
        assert "wait_until_slot" in shown and shown["wait_until_slot"] is None, shown
        # oasis status counts them apart from the jobs in flight
        status = json.loads(oasis("status", "--json", server=d.address).stdout)
        assert status["jobs_pending"] == 3, status
        assert [j["id"] for j in status["jobs"]] == ["blocker"], status["jobs"]
        screen = oasis("status", server=d.address).stdout
        assert "; 3 pending, not admitted yet (oasis jobs --state pending)" in screen, screen
    finally:
        assert d.stop() == 0, (tmp_path / "oasisd.log").read_text()
