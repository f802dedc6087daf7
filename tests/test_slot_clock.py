"""Time: the slot clock, and jobs moving admitted -> running -> completed on slot
boundaries, with a fake clock the test advances (the daemon in-process, real gRPC)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from controller.clock import (
    CONFIRM_SECONDS,
    LATEST_EPOCH,
    STEP_SECONDS,
    FakeClock,
    SlotClock,
    SlotTimes,
    SteadyClock,
    epoch,
    first_epoch,
    slots_for,
)
from controller.config import load
from controller.convert import spec_to_proto
from controller.daemon import serve
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from pricing.errors import SpecError
from tests.servers import write_config
from tests.test_daemon_e2e import job

SLOT = 3600.0


def test_slot_times_follow_an_epoch_set_later() -> None:
    # without an epoch in the config, recovery sets it from the store after the clock is
    # made: times shown (and deadlines read) must count from that epoch, not from 0
    slots = SlotClock(FakeClock(0.0), 3600.0)
    slots.epoch = 1_800_000_000.0
    assert slots.times.start(2) == 1_800_000_000.0 + 7200.0
    assert slots.times.slot_at(1_800_000_000.0 + 3700.0) == 1


def test_slot_clock_maps_wall_time_to_slots() -> None:
    clock = FakeClock(1000.0)
    slots = SlotClock(clock, 60.0, epoch=1000.0)
    assert slots.current_slot() == 0
    clock.advance(59.9)
    assert slots.current_slot() == 0
    assert slots.seconds_to_next_slot() == pytest.approx(0.1)
    clock.advance(0.1)
    assert slots.current_slot() == 1
    clock.advance(600)
    assert slots.current_slot() == 11
    assert SlotClock(FakeClock(0.0), 60.0, epoch=500.0).current_slot() == 0  # before the epoch


@pytest.mark.parametrize(
    ("slot_seconds", "epoch"),
    [
        (60.0, 1_700_000_100.0),  # a whole minute
        (3600.0, 1_699_999_200.0),  # on the hour
        (86400.0, 1_699_920_000.0),  # midnight UTC
        (7.0, 1_700_000_120.0),  # a multiple of 7 s since the Unix epoch
        (0.25, 1_700_000_123.0),  # shorter than a second: a whole second
    ],
)
def test_a_first_start_is_floored_to_a_whole_slot(slot_seconds: float, epoch: float) -> None:
    now = 1_700_000_123.4
    assert first_epoch(now, slot_seconds) == epoch
    assert 0 <= now - epoch < max(slot_seconds, 1.0)


def test_a_span_takes_its_whole_slots_rounded_up() -> None:
    """``slots_for`` rounds up (retention's cutoff, a cordon's window, the plane's flap
    hold-off), forgiving a float's last bit: two hours of hour slots are 2, not 3."""
    assert slots_for(7200.0, 3600.0) == 2
    assert slots_for(0.1 * 3 * 24_000, 7200.0) == 1  # 7200.000000000001 s: still one slot
    assert slots_for(7200.5, 3600.0) == 3
    assert slots_for(1.0, 3600.0) == 1  # a second of a slot takes it
    assert slots_for(0.0, 3600.0) == 0


def test_slot_times_before_the_epoch_are_negative_slots() -> None:
    """A time a second before slot 0 is in slot -1 (a deadline before the epoch), not
    in slot 0, which truncation toward zero would say."""
    times = SlotTimes(1000.0, 60.0)
    assert times.slot_at(999.0) == -1
    assert times.slot_at(1000.0 - 60.0) == -1
    assert times.slot_at(1000.0 - 60.5) == -2
    assert times.slot_at(1059.9) == 0 and times.slot_at(1060.0) == 1
    assert times.start(-1) == 940.0


def test_the_latest_epoch_is_allowed_and_a_second_past_it_is_not() -> None:
    """'from 0 to the year 3000': both ends are allowed."""
    assert epoch(LATEST_EPOCH, "daemon.epoch") == LATEST_EPOCH
    assert epoch("3000-01-01T00:00:00Z", "daemon.epoch") == LATEST_EPOCH
    assert epoch(0, "daemon.epoch") == 0.0
    with pytest.raises(SpecError, match="from 0 to 32503680000"):
        epoch(LATEST_EPOCH + 1, "daemon.epoch")


class InProcessDaemon:
    """``serve`` on its own event loop in a thread, with a fake clock."""

    def __init__(self, config_path: Path, clock: FakeClock) -> None:
        self.config = load(config_path)
        self.clock = clock
        self.address = ""
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)

        def ready(address: str) -> None:
            self.address = address
            self._ready.set()

        try:
            self._loop.run_until_complete(
                serve(self.config, clock=self.clock, stop=self._stop, on_ready=ready)
            )
        finally:
            self._loop.close()

    def __enter__(self) -> InProcessDaemon:
        self._thread.start()
        assert self._ready.wait(60), "daemon did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


@pytest.fixture
def stub(tmp_path: Path) -> Iterator[tuple[Any, FakeClock]]:
    clock = FakeClock(1_000_000.0)
    config = write_config(tmp_path / "c.toml", tmp_path / "data", epoch=clock.now(), extra="")
    config.write_text(config.read_text().replace("tick_seconds = 0.2", "tick_seconds = 0.02"))
    with InProcessDaemon(config, clock) as d, grpc.insecure_channel(d.address) as channel:
        yield pb_grpc.AdmissionStub(channel), clock


def wait_for_state(stub: Any, job_id: str, state: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        got = stub.GetJob(pb.GetJobRequest(id=job_id), timeout=5).job.state
        if got == state:
            return
        time.sleep(0.02)
    raise AssertionError(f"{job_id}: state {got}, expected {state}")


def test_jobs_move_through_states_on_slot_boundaries(stub: tuple[Any, FakeClock]) -> None:
    admission, clock = stub
    spec = spec_to_proto(job("t1", epochs=6, chunks=4, minibatches=60))
    resp = admission.SubmitJob(pb.SubmitJobRequest(job=spec), timeout=30).job
    d = resp.decision
    assert d.admitted and d.arrival_slot == 1  # submitted in slot 0, arrives at the next
    assert resp.state == pb.JOB_STATE_ADMITTED
    first = min(a.slot for a in d.allocations)
    assert d.completion_slot > first, "the test needs a job spanning several slots"

    clock.advance(SLOT * first)  # its first slot begins
    wait_for_state(admission, "t1", pb.JOB_STATE_RUNNING)
    clock.advance(SLOT * (d.completion_slot - first))  # its last slot begins
    time.sleep(0.1)
    assert admission.GetJob(pb.GetJobRequest(id="t1")).job.state == pb.JOB_STATE_RUNNING
    clock.advance(SLOT)  # ... and ends
    wait_for_state(admission, "t1", pb.JOB_STATE_COMPLETED)

    # the window rolled: a job submitted now arrives in the next slot
    now_slot = d.completion_slot + 1
    later = admission.SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(job("t2"))), timeout=30)
    assert later.job.decision.arrival_slot == now_slot + 1
    assert min(a.slot for a in later.job.decision.allocations) >= now_slot + 1

    events = admission.WatchEvents(pb.WatchEventsRequest(after_sequence=0), timeout=5)
    kinds = []
    for event in events:
        kinds.append((event.kind, event.job_id))
        if len(kinds) == 4:
            break
    assert kinds == [("decided", "t1"), ("running", "t1"), ("completed", "t1"), ("decided", "t2")]


def test_cancel_releases_only_future_slots(stub: tuple[Any, FakeClock]) -> None:
    admission, clock = stub
    spec = spec_to_proto(job("c1", epochs=6, chunks=4, minibatches=60))
    d = admission.SubmitJob(pb.SubmitJobRequest(job=spec), timeout=30).job.decision
    first = min(a.slot for a in d.allocations)
    clock.advance(SLOT * first)
    wait_for_state(admission, "c1", pb.JOB_STATE_RUNNING)
    out = admission.CancelJob(pb.CancelJobRequest(id="c1"), timeout=10)
    kept = [a for a in out.job.decision.allocations]
    assert kept and max(a.slot for a in kept) == first  # the running slot stays
    assert out.released_worker_slots == sum(a.workers for a in d.allocations if a.slot > first)
    # a repeated cancel answers as the first did, even slots later (idempotent)
    clock.advance(SLOT)
    assert admission.CancelJob(pb.CancelJobRequest(id="c1"), timeout=10) == out


def test_a_decision_after_a_boundary_does_not_skip_the_state_changes(tmp_path: Path) -> None:
    """A submission (or the execution plane's review) that moves the window first must
    not make the slot clock's tick skip the jobs that start or end at that boundary."""
    import structlog

    from controller.admission import AdmissionController
    from controller.store import Database

    clock = FakeClock(1_000_000.0)
    path = write_config(tmp_path / "c.toml", tmp_path / "data", epoch=clock.now(), extra="")
    config = load(path)
    config.data_dir.mkdir(parents=True)
    c = AdmissionController(
        config,
        Database(config.database_url),
        SlotClock(clock, SLOT, clock.now()),
        log=structlog.wrap_logger(structlog.ReturnLogger()),
    )
    c.open()
    try:
        first = asyncio.run(c.submit(job("a", epochs=6, chunks=4, minibatches=60))).decision
        assert first.admitted and first.arrival_slot == 1 and first.completion_slot
        clock.advance(SLOT)  # slot 1: "a" starts
        asyncio.run(c.submit(job("b")))  # decided before the tick: the window moves
        asyncio.run(c.tick())
        assert c._get_sync("a").state == "running"
        clock.advance(SLOT * first.completion_slot)  # well past its plan
        asyncio.run(c.quote(job("c")))  # a quote moves the window too
        asyncio.run(c.tick())
        assert c._get_sync("a").state == "completed"
    finally:
        c.close()


def test_a_first_start_late_in_its_slot_runs_jobs_on_the_round_boundaries(tmp_path: Path) -> None:
    """Without an epoch in the config slot 0 begins on the hour before the first start,
    here a second before the next: the first job arrives at that boundary, a second
    away, and moves through its states on the hours after it."""
    hour = 1_699_999_200.0
    clock = FakeClock(hour + 3599.0)
    config = write_config(tmp_path / "c.toml", tmp_path / "data", epoch=0.0, extra="")
    text = config.read_text().replace("epoch = 0.0\n", "")
    config.write_text(text.replace("tick_seconds = 0.2", "tick_seconds = 0.02"))
    with InProcessDaemon(config, clock) as daemon, grpc.insecure_channel(daemon.address) as channel:
        info = pb_grpc.ClusterStub(channel).GetClusterInfo(pb.GetClusterInfoRequest(), timeout=10)
        assert (info.epoch, info.current_slot) == (hour, 0)
        admission = pb_grpc.AdmissionStub(channel)
        spec = spec_to_proto(job("t1", epochs=6, chunks=4, minibatches=60))
        d = admission.SubmitJob(pb.SubmitJobRequest(job=spec), timeout=30).job.decision
        assert d.admitted and d.arrival_slot == 1
        first = min(a.slot for a in d.allocations)
        clock.advance(1.0 + SLOT * (first - 1))  # slot 1 begins a second later
        wait_for_state(admission, "t1", pb.JOB_STATE_RUNNING)
        clock.advance(SLOT * (d.completion_slot - first + 1))
        wait_for_state(admission, "t1", pb.JOB_STATE_COMPLETED)


class _Logged:
    """A structlog-like logger that keeps what it was told."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **kw: Any) -> None:
        self.lines.append((event, kw))


def test_a_steady_clock_holds_off_a_step_until_it_lasts() -> None:
    wall = FakeClock(1_000_000.0)
    log = _Logged()
    steady = SteadyClock(wall, log)
    assert steady.now() == 1_000_000.0
    wall.advance(10)
    wall.step(2.0)  # NTP's small corrections are followed
    assert steady.now() == 1_000_012.0
    wall.step(864_000)  # ten days ahead, for three seconds
    assert steady.now() == 1_000_012.0
    wall.advance(3)
    assert steady.now() == 1_000_015.0
    wall.step(-864_000)
    assert steady.now() == 1_000_015.0
    assert [e for e, _ in log.lines] == [
        "the system clock stepped; slots keep to the time passed until it holds",
        "the system clock is back from its step; the step was ignored",
    ]
    assert log.lines[0][1]["step_seconds"] == 864_000
    wall.step(-3600)  # back an hour, and it holds: taken after CONFIRM_SECONDS
    assert steady.now() == 1_000_015.0
    wall.advance(CONFIRM_SECONDS - 1)
    assert steady.now() == 1_000_015.0 + CONFIRM_SECONDS - 1
    wall.advance(1)
    assert steady.now() == 1_000_015.0 + CONFIRM_SECONDS - 3600
    assert log.lines[-1] == ("the system clock's step held; slots follow it",
                             {"step_seconds": -3600})  # fmt: skip


def test_a_steady_clock_follows_a_change_of_exactly_step_seconds() -> None:
    """A change of up to :data:`STEP_SECONDS` is followed at once (only a larger one
    is a step to hold off), and once a held step ends, no more is said of it."""
    wall = FakeClock(1_000_000.0)
    log = _Logged()
    steady = SteadyClock(wall, log)
    assert steady.now() == 1_000_000.0
    wall.step(STEP_SECONDS)
    assert steady.now() == 1_000_000.0 + STEP_SECONDS and log.lines == []
    wall.step(3600)
    assert steady.now() == 1_000_000.0 + STEP_SECONDS
    wall.step(-3600)
    assert steady.now() == 1_000_000.0 + STEP_SECONDS
    assert len(log.lines) == 2  # stepped; back from it
    wall.advance(1)
    assert steady.now() == 1_000_001.0 + STEP_SECONDS
    assert len(log.lines) == 2, log.lines  # said once, not at every reading after


def test_a_held_step_that_moves_again_waits_its_whole_hold_anew() -> None:
    """A step is taken once the wall clock has kept to it for :data:`CONFIRM_SECONDS`:
    a held step the clock moves on from (by more than :data:`STEP_SECONDS`) is a new
    step, held from then on; one it moves on from by :data:`STEP_SECONDS` or less is
    the same step, its hold counted from when it was first seen."""
    wall = FakeClock(1_000_000.0)
    log = _Logged()
    steady = SteadyClock(wall, log)
    steady.now()
    wall.step(3600)
    assert steady.now() == 1_000_000.0
    wall.advance(CONFIRM_SECONDS - 10)
    wall.step(3600)  # another hour ahead: a new step
    assert steady.now() == 1_000_000.0 + CONFIRM_SECONDS - 10
    wall.advance(10)  # the first step's hold is over, not the second's
    assert steady.now() == 1_000_000.0 + CONFIRM_SECONDS
    wall.advance(CONFIRM_SECONDS - 20)
    wall.step(STEP_SECONDS)  # the same step, a little further
    assert steady.now() == 1_000_000.0 + 2 * CONFIRM_SECONDS - 20
    wall.advance(10)  # the second step has now held CONFIRM_SECONDS
    assert (
        steady.now() == wall.now() == 1_000_000.0 + 2 * CONFIRM_SECONDS - 10 + 7200 + STEP_SECONDS
    )
    assert log.lines[-1][0] == "the system clock's step held; slots follow it"


def test_a_clock_ten_days_ahead_for_seconds_ends_no_tenants_jobs(tmp_path: Path) -> None:
    """The time audit: a head node's clock set ten days ahead for three seconds moved
    the daemon to a slot ten days on, and its tick completed every admitted job (and
    retention deleted them); new jobs were planned ten days out. Through the daemon's
    steady clock the step is never seen."""
    import structlog

    from controller.admission import AdmissionController
    from controller.store import Database

    wall = FakeClock(1_000_000.0)
    quiet = structlog.wrap_logger(structlog.ReturnLogger())
    path = write_config(tmp_path / "c.toml", tmp_path / "data", epoch=wall.now(), extra="")
    config = load(path)
    config.data_dir.mkdir(parents=True)
    slots = SlotClock(SteadyClock(wall, quiet), SLOT, wall.now())
    c = AdmissionController(config, Database(config.database_url), slots, log=quiet)
    c.open()
    try:
        first = asyncio.run(c.submit(job("a", epochs=6, chunks=4, minibatches=60))).decision
        assert first.admitted and first.arrival_slot == 1
        wall.step(864_000)
        asyncio.run(c.tick())
        wall.advance(3)
        asyncio.run(c.tick())
        wall.step(-864_000)
        asyncio.run(c.tick())
        assert c._get_sync("a").state == "admitted"
        assert c.slot == 0
        later = asyncio.run(c.submit(job("b"))).decision
        assert later.arrival_slot == 1
    finally:
        c.close()


def test_the_slot_clients_are_given_never_moves_back_with_the_clock(tmp_path: Path) -> None:
    """After the head node's clock was set back (and the step held), the clock's slot is
    behind the daemon's, which never moves back; GetClusterInfo gave the clock's, and a
    cordon's ``--for`` counted from it ended before the cordon began (the time audit)."""
    import structlog

    from controller.admission import AdmissionController
    from controller.servicer import ClusterServicer
    from controller.store import Database

    wall = FakeClock(1_000_000.0)
    quiet = structlog.wrap_logger(structlog.ReturnLogger())
    path = write_config(tmp_path / "c.toml", tmp_path / "data", epoch=wall.now(), extra="")
    config = load(path)
    config.data_dir.mkdir(parents=True)
    c = AdmissionController(config, Database(config.database_url),
                            SlotClock(wall, SLOT, wall.now()), log=quiet)  # fmt: skip
    c.open()
    try:
        wall.advance(3 * SLOT)
        asyncio.run(c.tick())
        assert c.slot == 3
        wall.step(-2 * SLOT)  # set back two hours, for good
        info = asyncio.run(ClusterServicer(c).GetClusterInfo(pb.GetClusterInfoRequest(), None))
        assert info.current_slot == 3
    finally:
        c.close()
