"""The execution plane's bounded queues of what agents send, and the turns of slow jobs'
re-plans, as units (the mutation audit of controller/plane/{unknown_jobs,unknown_events,
intake,link_clock,replan_turns,demand,codec}.py): each pins a behaviour no test held."""

from __future__ import annotations

from pathlib import Path

from tests.test_mqtt_units import PlaneDaemon


def test_an_unknown_ids_lookup_asks_the_store_for_a_bounded_number_in_sorted_order(
    tmp_path: Path,
) -> None:
    """``unknown_jobs`` looks up the first ``MAX_LOOKED_UP`` ids in sorted order, however
    many it is given: one bounded primary-key query, whoever calls it."""
    from controller.plane.unknown_jobs import MAX_LOOKED_UP, unknown_jobs

    plane = PlaneDaemon(tmp_path)
    try:
        plane.submit("known")
        ids = [f"u{i:04d}" for i in range(MAX_LOOKED_UP + 5)] + ["known"]
        with plane.c.db.session() as session:
            named = unknown_jobs(session, reversed(ids))
            assert named == [f"u{i:04d}" for i in range(MAX_LOOKED_UP - 1)]  # "known" sorts first
            assert unknown_jobs(session, ["known", "u9", "u9"]) == ["u9"]
            assert unknown_jobs(session, []) == []
    finally:
        plane.c.close()


def test_an_id_reported_twice_waits_once_and_a_server_with_none_waits_for_nothing() -> None:
    """The ids waiting to be looked up are counted once each (a report naming a job twice,
    or at each report, does not fill the bound in all), and a server whose agent reported
    no new id holds no queue (an empty one broke the next take for every server)."""
    from controller.plane.unknown_jobs import UnknownLookups

    lookups = UnknownLookups()
    lookups.add("w0", ["a", "a", "b"])
    lookups.add("w0", ["a"])
    assert len(lookups) == 2
    lookups.add("p0", [])
    lookups.add("p1", ["c"])
    assert lookups.take() == [("p1", "c"), ("w0", "a"), ("w0", "b")]
    assert len(lookups) == 0 and lookups.take() == []
    for server in ("s1", "s2", "s3"):
        lookups.add(server, [f"{server}-a", f"{server}-b"])
    assert lookups.take(1) == [("s1", "s1-a")]
    assert lookups.take(1) == [("s2", "s2-a")]  # resumed after s1, not at s1 again
    assert lookups.take(2) == [("s3", "s3-a"), ("s1", "s1-b")]


def test_the_link_clock_counts_connected_seconds_once_and_is_never_rewound_forward() -> None:
    """A second ``up`` while connected does not restart the connection's seconds (the
    silence of every server would restart with it), time down stands still, and a
    rewind to a mark past now changes nothing."""
    from controller.plane.link_clock import LinkClock

    mono = [10.0]
    clock = LinkClock(lambda: mono[0])
    assert clock.now() == 0.0 and clock.up_for() is None
    clock.up()
    mono[0] = 15.0
    clock.up()  # already up: no change
    mono[0] = 17.0
    assert clock.now() == 7.0 and clock.up_for() == 7.0
    clock.down()
    clock.down()
    mono[0] = 50.0
    assert clock.now() == 7.0 and clock.up_for() is None
    clock.rewind_to(9.0)  # a mark later than now: nothing to take back
    assert clock.now() == 7.0
    clock.rewind_to(4.0)
    assert clock.now() == 4.0


def test_the_loop_watch_takes_off_only_a_stall_and_is_awake_until_one() -> None:
    """A tick later than due by less than ``LOOP_STALL_SECONDS`` is on time (0); a
    stall's seconds are those past the tick that was due; unwatched or within the
    bound, the loop is awake."""
    from controller.plane.link_clock import LOOP_STALL_SECONDS, LOOP_TICK_SECONDS, LoopWatch

    mono = [100.0]
    watch = LoopWatch(lambda: mono[0])
    assert watch.awake()  # not watched yet
    assert watch.tick() == 0.0
    mono[0] += LOOP_TICK_SECONDS + LOOP_STALL_SECONDS / 2
    assert watch.tick() == 0.0  # late, not stalled
    mono[0] += LOOP_TICK_SECONDS + 3.0
    assert watch.tick() == 3.0  # the loop did not run for 3 s past its tick
    mono[0] += LOOP_STALL_SECONDS
    assert watch.awake()
    mono[0] += 0.5
    assert not watch.awake()


def test_a_re_plans_budgets_let_each_ones_first_run_and_last_a_slot_per_submitter() -> None:
    """The first re-plan of a review and a submitter's first of a slot always run, even
    over their budget; a budget met exactly is not over; a new review of the same slot
    starts the review's budget again but not the submitter's."""
    from controller.plane.replan_turns import ReplanTurns

    turns = ReplanTurns(per_submitter=10.0, per_review=6.0)
    turns.new_review(1)
    assert turns.take("a", 8.0) == ""  # the review's first, over its budget: runs
    assert turns.take("b", 1.0) == "review"
    turns.new_review(1)
    assert turns.take("a", 2.0) == ""  # 10 of a's 10: not over
    assert turns.take("a", 1.0) == "submitter"
    assert turns.take("b", 20.0) == "review"  # not the review's first
    turns.new_review(1)
    assert turns.take("b", 20.0) == ""  # the review's first and b's first of the slot
    turns.new_review(1)
    assert turns.take("a", 1.0) == "submitter"  # a's budget of the slot stays spent
    turns.new_review(2)
    assert turns.take("a", 1.0) == ""  # a new slot


def test_slow_jobs_take_turns_never_tried_first_and_keyless_jobs_as_one_submitter() -> None:
    """Within a submitter the job never tried goes before those tried (longest ago
    first); jobs whose ids have no key part share one turn, not one each."""
    from controller.plane.replan_turns import in_turn

    ids = ["t:b", "t:a", "t:c", "x", "y", "u:a"]
    assert in_turn(ids, {"t:a": 5, "t:b": 3, "x": 1}) == ["y", "t:c", "u:a", "x", "t:b", "t:a"]


def test_a_tasks_demand_is_held_to_its_bounds_and_named_in_its_variables() -> None:
    """At most ``MAX_DEMAND_ENTRIES`` names, each of 1 to ``MAX_NAME_LENGTH`` carried
    characters (all of it, not a prefix), and an error that shows a bounded piece of a
    bad name; a worker's variables name each resource with ``_`` for a character not
    alphanumeric, and no demand sets no variable."""
    import pytest

    from controller.plane.demand import (
        MAX_DEMAND_ENTRIES,
        demand_environment,
        parse_demand,
        plain,
    )
    from pricing.errors import SpecError

    most = {f"r{i}": 1 for i in range(MAX_DEMAND_ENTRIES)}
    assert parse_demand(most, "demand") == most
    with pytest.raises(SpecError, match="at most"):
        parse_demand({**most, "one-more": 1}, "demand")
    for bad in ("", "cpu!", "gpu\n", "x" * 65):
        with pytest.raises(SpecError, match="resource names"):
            parse_demand({bad: 1}, "demand")
    with pytest.raises(SpecError) as err:
        parse_demand({"!" * 100_000: 1}, "demand")
    assert len(str(err.value)) < 400
    assert parse_demand({"mem.gb": 8.0, "gpu": 0}, "d") == {"mem.gb": 8, "gpu": 0}
    assert demand_environment({}) == {}
    assert demand_environment({"mem.gb": 8.0, "nv-link": 0.5}) == {
        "OASIS_DEMAND": '{"mem.gb":8,"nv-link":0.5}',
        "OASIS_DEMAND_MEM_GB": "8",
        "OASIS_DEMAND_NV_LINK": "0.5",
    }
    assert type(plain(2.0**53)) is float and type(plain(2.0**52)) is int


def test_a_payload_is_read_within_its_bounds_and_every_bad_one_is_a_spec_error() -> None:
    """``decode``: a payload of exactly ``max_bytes`` is read, one byte more is not
    (unparsed); JSON nested past the parser's depth, a lone surrogate escape, a version
    that is ``true`` are SpecErrors, and the parser's message is cut short."""
    import pytest

    from controller.plane.codec import MAX_RUN_CHARS, _below, _run, decode
    from pricing.errors import SpecError

    body = b'{"version":1,"x":"'
    exact = body + b"a" * (100 - len(body) - 2) + b'"}'
    assert len(exact) == 100 and decode(exact, "p", max_bytes=100)["x"].startswith("a")
    with pytest.raises(SpecError, match="over the limit"):
        decode(exact + b" ", "p", max_bytes=100)
    with pytest.raises(SpecError, match="nested too deep"):
        decode(b"[" * 100_000 + b"]" * 100_000, "p", max_bytes=10**6)
    with pytest.raises(SpecError, match="not JSON"):
        decode(b'{"version":1,"x":"\\ud800"}', "p")
    assert decode(b'{"version":1,"x":"\\ud83d\\ude00"}', "p")["x"] == "\U0001f600"
    with pytest.raises(SpecError, match="must be 1"):
        decode(b'{"version":true}', "p")
    with pytest.raises(SpecError) as err:
        decode(b'{"version":1,"' + b"k" * 50_000, "p")
    assert len(str(err.value)) < 400
    assert _run("r" * MAX_RUN_CHARS, "run") == "r" * MAX_RUN_CHARS and _run("", "run") == ""
    with pytest.raises(SpecError, match="over"):
        _run("r" * (MAX_RUN_CHARS + 1), "run")
    assert _below(4, "n", 0, 5) == 4
    with pytest.raises(SpecError, match="below 5"):
        _below(5, "n", 0, 5)


def test_the_inbox_gives_back_what_was_taken_before_what_came_since_and_keeps_sessions_apart() -> (
    None
):
    """``put_back`` (nothing applied: a store outage) queues what was taken before the
    reports that came meanwhile, losing none; a carried count is per agent session and
    job (a restarted agent's count from 0 does not replace its old session's)."""
    from controller.plane.agent_messages import Progress, TaskProgress
    from controller.plane.intake import Received, ReportInbox

    def received(at: float, session: str, job: str, n: float) -> Received:
        return Received(at, 0, Progress("w0", session, [TaskProgress(job, n, n)]))

    inbox = ReportInbox(max_entries=10)
    inbox.put(received(1.0, "s", "a", 1.0))
    taken = inbox.take()
    inbox.put(received(2.0, "s", "a", 2.0))
    inbox.put_back(taken)
    assert [r.at for r in inbox.take()] == [1.0, 2.0]
    inbox.put(received(2.0, "s", "a", 2.0))
    inbox.put_back(taken)  # what came since first: still after it
    assert [r.progress.jobs[0].minibatches for r in inbox.take()] == [1.0, 2.0]
    tiny = ReportInbox(max_entries=1)
    tiny.put(received(1.0, "s", "a", 1.0))
    taken = tiny.take()
    tiny.put(received(2.0, "s", "b", 1.0))
    tiny.put(received(3.0, "s", "c", 1.0))  # b to the carry: full
    tiny.put_back(taken)  # a is the oldest: it leaves the queue first, and is dropped
    assert [r.progress.jobs[0].job for r in tiny.take()] == ["b", "c"]

    small = ReportInbox(max_entries=2)
    small.put(received(1.0, "old", "a", 30.0))
    small.put(received(2.0, "new", "a", 1.0))
    small.put(received(3.0, "new", "b", 1.0))
    small.put(received(4.0, "new", "c", 1.0))  # both of a's counts have left the queue
    counts = [(r.progress.session, t.job, t.minibatches) for r in small.take()
              for t in r.progress.jobs]  # fmt: skip
    assert counts[:2] == [("old", "a", 30.0), ("new", "a", 1.0)] and len(counts) == 4


def test_a_re_plan_whose_commit_fails_leaves_the_ledger_as_the_store_has_it(
    tmp_path: Path,
) -> None:
    """``Jobs.guarded``: a change that moved the ledger and then failed (its commit) is
    raised, and the ledger is rebuilt from the store, so the job's schedule it dropped is
    back (left as it was, the ledger and the store disagreed until a restart)."""
    import pytest

    plane = PlaneDaemon(tmp_path)
    try:
        plane.submit("j")
        before = plane.c._ledger.schedule("j").start

        def change() -> list[object]:
            plane.c._ledger.release("j", 0)
            raise RuntimeError("the commit failed")

        with pytest.raises(RuntimeError, match="commit failed"):
            plane.ex.jobs.guarded(change)  # type: ignore[arg-type]
        assert "j" in plane.c._ledger.job_ids()
        assert plane.c._ledger.schedule("j").start == before
    finally:
        plane.c.close()


def test_a_full_queue_makes_room_only_from_a_server_holding_more_than_the_adder_would() -> None:
    """``crowding``: the server holding the most gives up an id only if it holds more than
    the adder will with it (one apart is even: no id goes back and forth), and never to
    itself."""
    from collections import Counter

    from controller.plane.unknown_events import crowding

    assert crowding(Counter({"a": 5, "b": 4}), "b") is None
    assert crowding(Counter({"a": 6, "b": 4}), "b") == "a"
    assert crowding(Counter({"a": 6, "b": 4}), "c") == "a"
    assert crowding(Counter({"a": 6, "b": 4}), "a") is None
