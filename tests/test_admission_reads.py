"""The admission controller's store reads (controller/admission/reads.py), in-process on
SQLite, on rows written straight to the store: a submitter gets and lists its own jobs
only, a listing's pages neither repeat nor skip a job and say whether more follow, a
byte budget ends a page at the job that reaches it, and the event reads page as their
callers count on (the mutation audit of the admission controller's reads)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert

from controller.admission import AdmissionController
from controller.clock import FakeClock
from controller.config import from_dict
from controller.errors import NotFoundError
from controller.store import AllocationRow, EventRow, JobRow
from pricing import SpecError
from tests.stores import in_process
from tests.test_pending import controller
from tests.test_retention import SPEC


def _job(key: str, sequence: int, state: str = "rejected", **changes: Any) -> dict[str, Any]:
    submitter = key.split(":", maxsplit=1)[0] if ":" in key else None
    return {"id": key, "sequence": sequence, "spec": f'{{"id": "{key}"}}', "state": state,
            "submitted_slot": 0, "arrival_slot": 1, "work": 9, "admitted": False,
            "reason": "priced out", "detail": {}, "decided_at": datetime.now(UTC),
            "submitter": submitter, **changes}  # fmt: skip


def _event(sequence: int, job_id: str, kind: str = "decided") -> dict[str, Any]:
    return {"sequence": sequence, "at": datetime.now(UTC), "kind": kind, "job_id": job_id,
            "slot": 1, "state": "rejected", "detail": {}}  # fmt: skip


@pytest.fixture
def c(tmp_path: Path) -> Any:
    c = controller(tmp_path, FakeClock(1_000_000.0))
    try:
        yield c
    finally:
        c.close()


def _store(c: AdmissionController, table: Any, rows: list[dict[str, Any]]) -> None:
    with c.db.session() as session:
        session.execute(insert(table), rows)


def _ids(views: list[Any]) -> list[str]:
    return [v.id for v in views]


def test_a_submitter_gets_its_own_job_and_no_other_tenants(c: AdmissionController) -> None:
    """``get`` with an owner: another tenant's job is not found, as a job that does not
    exist is (an operator's record under a tenant's key is the operator's)."""
    _store(c, JobRow, [_job("alice:a", 1), _job("bob:b", 2),
                       _job("alice:by-ops", 3, submitter="ops")])  # fmt: skip
    assert c._get_sync("alice:a", owner="alice").id == "alice:a"
    assert c._get_sync("bob:b").id == "bob:b"  # an operator's read: every job
    for key in ("bob:b", "alice:by-ops", "alice:none"):
        with pytest.raises(NotFoundError, match=f"^no job '{key}'$"):
            c._get_sync(key, owner="alice")


def test_pages_of_jobs_neither_repeat_nor_skip_and_end_where_the_jobs_do(
    c: AdmissionController,
) -> None:
    """Each page starts after the last one's last sequence: none repeated (``>=``
    listed it again at the top of the next page), none skipped, and ``more`` is False on
    the page that holds the last job, also when it fills the page exactly."""
    _store(c, JobRow, [_job(f"alice:j{i}", 10 * i) for i in range(1, 5)])
    seen: list[str] = []
    pages = []
    after = 0
    while True:
        views, more = c._list_sync([], 2, after)
        pages.append((_ids(views), more))
        seen += _ids(views)
        if not more:
            break
        after = views[-1].sequence
    assert pages == [(["alice:j1", "alice:j2"], True), (["alice:j3", "alice:j4"], False)]
    # a page after a job's own sequence starts at the next job
    assert _ids(c._list_sync([], 10, 20)[0]) == ["alice:j3", "alice:j4"]
    assert c._list_sync([], 10, 40) == ([], False)


def test_a_submitters_listing_of_a_state_holds_its_own_jobs_of_that_state_only(
    c: AdmissionController,
) -> None:
    done = "completed"
    _store(c, JobRow, [_job("alice:r", 1), _job("bob:r", 2), _job("alice:c", 3, state=done),
                       _job("bob:c", 4, state=done)])  # fmt: skip
    assert _ids(c._list_sync(["rejected"], 10, owner="alice")[0]) == ["alice:r"]
    assert _ids(c._list_sync(["completed"], 10, owner="alice")[0]) == ["alice:c"]
    assert _ids(c._list_sync([], 10, owner="bob")[0]) == ["bob:r", "bob:c"]
    assert _ids(c._list_sync(["completed", "completed"], 10)[0]) == ["alice:c", "bob:c"]
    # the console's search: only the jobs its condition holds for
    match = JobRow.id.like("%:c")
    assert _ids(c._list_sync([], 10, owner="alice", match=match)[0]) == ["alice:c"]


def test_rows_whose_sequence_no_token_names_come_last_on_a_page_of_their_own(
    c: AdmissionController,
) -> None:
    """A row numbered past any page token (an edit) sorts after the others: the page
    before it ends before it, saying more follow, and its own page says none do."""
    big = 10**18  # one past MAX_TOKEN_SEQUENCE
    _store(c, JobRow, [_job("alice:a", 1), _job("alice:b", 2), _job("alice:edited", big)])
    assert c._list_sync([], 5)[1] is True
    views, more = c._list_sync([], 5)
    assert (_ids(views), more) == (["alice:a", "alice:b"], True)
    views, more = c._list_sync([], 5, 2)
    assert (_ids(views), more) == (["alice:edited"], False)


def test_a_byte_budget_ends_the_page_at_the_job_whose_allocations_reach_it(
    c: AdmissionController,
) -> None:
    """Each allocation row counts its server's name and 6 bytes: a budget of exactly the
    first job's ends the page there, and the page says more follow, even when the store
    holds no more than the page asked for. ``allocations=False`` reads none."""
    server = c._server_order()[0]
    keys = ("alice:a", "alice:b")
    on: dict[str, Any] = {"state": "admitted", "admitted": True, "payoff": 1.0}
    _store(c, JobRow, [_job(key, i + 1, **on) for i, key in enumerate(keys)])
    _store(c, AllocationRow, [{"job_id": key, "slot": slot, "server": server, "workers": 1,
                               "ps": 0} for key in keys for slot in (1, 2)])  # fmt: skip
    first = 2 * (len(server) + 6)
    views, more = c._list_sync([], 2, budget=first)
    assert (_ids(views), more) == (["alice:a"], True)
    views, more = c._list_sync([], 2, budget=first + 1)
    assert (_ids(views), more) == (["alice:a", "alice:b"], False)
    assert len(views[0].decision.allocations) == 2
    views, _ = c._list_sync([], 2, allocations=False)
    assert [v.decision.allocations for v in views] == [[], []]


def test_event_reads_page_after_a_sequence_oldest_or_newest_first(
    c: AdmissionController,
) -> None:
    """``stored_events`` after a sequence holds none at or before it; ``newest`` gives
    the last ``limit`` in order. ``own_events`` gives the newest of the owner's jobs'
    events after a sequence, in order, none of another tenant's."""
    _store(c, JobRow, [_job("alice:a", 1), _job("bob:b", 2)])
    base = max([0, *(e.sequence for e in c._events_sync(0))])
    hers = [base + i for i in (1, 2, 4, 6)]
    rows = [_event(s, "alice:a") for s in hers] + [_event(base + s, "bob:b") for s in (3, 5, 7)]
    _store(c, EventRow, sorted(rows, key=lambda r: r["sequence"]))
    assert [e.sequence for e in c._events_sync(base + 2)] == [base + s for s in range(3, 8)]
    assert [e.sequence for e in c._events_sync(base, limit=2)] == [base + 1, base + 2]
    newest = c._events_sync(base, limit=3, newest=True)
    assert [e.sequence for e in newest] == [base + 5, base + 6, base + 7]
    assert [e.sequence for e in c._own_events_sync("alice", base, 3)] == hers[1:]
    assert [e.sequence for e in c._own_events_sync("alice", hers[1], 10)] == hers[2:]
    assert [e.sequence for e in c._own_events_sync("bob", base, 10)] == [base + 3, base + 5,
                                                                        base + 7]  # fmt: skip


class _Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def warning(self, message: str, **fields: Any) -> None:
        self.lines.append((message, fields))


def test_job_counts_sum_finite_payoffs_of_earning_states_and_name_a_bad_one_once(
    c: AdmissionController,
) -> None:
    """``JobCounts``: the payoffs summed are those of the earning states that are finite
    numbers; text and infinity are left out and each such job is named once, however
    many counts see it; a submitter's count holds its own jobs only."""
    from sqlalchemy import text

    from controller.admission.job_counts import JobCounts

    _store(c, JobRow, [
        _job("alice:a", 1, state="admitted", admitted=True, payoff=2.0),
        _job("alice:b", 2, state="admitted", admitted=True, payoff=1.0),
        _job("alice:c", 3, state="completed", admitted=True, payoff=1.0),
        _job("bob:d", 4, state="failed", admitted=True, payoff=3.0),
        _job("bob:e", 5, state="rejected", payoff=5.0),
    ])  # fmt: skip
    with c.db.session() as session:  # edits: text in SQLite's column, and infinity
        session.execute(text("UPDATE jobs SET payoff = 'lots' WHERE id = 'alice:b'"))
        session.execute(text("UPDATE jobs SET payoff = 9e999 WHERE id = 'alice:c'"))
    now = [0.0]
    log = _Log()
    counts = JobCounts(c.db, clock=lambda: now[0], log=log)
    first = counts.read()
    assert first.payoff == {"admitted": 2.0, "running": 0.0, "completed": 0.0,
                            "cancelled": 0.0, "failed": 3.0}  # fmt: skip
    assert (first.jobs["admitted"], first.jobs["completed"], first.jobs["rejected"]) == (2, 1, 1)
    assert sorted(f["job"] for _, f in log.lines) == ["alice:b", "alice:c"]
    now[0] += first.max_age
    again = counts.read()
    assert again is not first and again.payoff == first.payoff
    assert len(log.lines) == 2  # each named once
    own = counts.read("bob")
    assert own.payoff == {} and own.jobs["failed"] == own.jobs["rejected"] == 1
    assert sum(own.jobs.values()) == 2


def _cluster_controller(tmp: Path) -> tuple[AdmissionController, FakeClock]:
    """A controller of two GPU servers and two PS servers (window 6), at slot 3."""
    cluster = {
        "resources": ["gpu", "bandwidth"],
        "servers": [
            {"name": "w0", "kind": "worker", "capacity": {"gpu": 4, "bandwidth": 10}},
            {"name": "w1", "kind": "worker", "capacity": {"gpu": 4, "bandwidth": 10}},
            {"name": "p0", "kind": "ps", "capacity": {"bandwidth": 10}},
            {"name": "p1", "kind": "ps", "capacity": {"bandwidth": 10}},
        ],
    }
    config = from_dict({"daemon": {"data_dir": str(tmp), "window": 6, "epoch": 0},
                        "cluster": cluster})  # fmt: skip
    clock = FakeClock(3 * config.slot_seconds + 1.0)
    c = in_process(config, clock)
    c.open()
    return c, clock


def test_window_reads_take_the_current_slot_for_0_and_refuse_slots_outside_it(
    tmp_path: Path,
) -> None:
    """``prices``, ``current_use`` and ``utilisation`` read window slots: 0 names the
    current slot (not slot 0), 0 slots the default 12 clipped to the window's end, and a
    slot at or past the window's end is refused as a SpecError naming the window."""
    c, _ = _cluster_controller(tmp_path)
    try:
        assert c.ledger is not None
        origin, end = c.ledger.origin, c.ledger.end
        assert c.slot == origin == 3 and end - origin == c.ledger.length < 12
        view = asyncio.run(c.submit({**SPEC, "id": "a"}, by="alice"))
        assert view.decision.admitted
        used = {(a["slot"], a["server"]) for a in view.decision.allocations if "workers" in a}
        first, blocks = c.prices(0, 0)
        assert first == origin
        rows = [r for b in blocks for r in b.rows(c.cluster.resources)]
        assert {len(r[3]) for r in rows} == {c.ledger.length}
        first, blocks = c.prices(end - 1, 5)  # clipped to the window's last slot
        assert first == end - 1
        assert {len(r[3]) for b in blocks for r in b.rows(c.cluster.resources)} == {1}
        for slot in (end, origin - 1):
            with pytest.raises(SpecError, match=f"^first_slot: slot {slot} is outside"):
                c.prices(slot, 1)
            with pytest.raises(SpecError, match=f"^slot: must be in the window {origin}"):
                c.current_use(slot)
        assert c.current_use() == c.current_use(origin)
        [(slot, server)] = sorted(used)[:1]
        assert c.current_use(slot)[server]["gpu"] > 0
        share_first, shares = c.utilisation(0, 0)
        assert share_first == origin
        gpu = dict(((res, kind), s) for res, kind, s in shares)[("gpu", "worker")]
        assert len(gpu) == c.ledger.length
        assert gpu[slot - origin] == pytest.approx(
            sum(u["gpu"] for n, u in c.current_use(slot).items() if n.startswith("w")) / 8
        )
    finally:
        c.close()


def test_utilisation_and_the_price_summary_leave_a_cordoned_server_out(
    tmp_path: Path,
) -> None:
    """From a cordon's first slot the cordoned server's capacity is out of service:
    utilisation is the use over the capacity still in service, the summary's peak
    leaves its cells (priced as full) out, and its ``serving`` and ``now`` are those of
    the first slot read (before the cordon)."""
    c, _ = _cluster_controller(tmp_path)
    try:
        assert c.ledger is not None
        origin = c.ledger.origin
        view = asyncio.run(c.submit({**SPEC, "id": "a"}, by="alice"))
        busy = {a["server"] for a in view.decision.allocations}
        idle = next(n for n in ("w0", "w1") if n not in busy)
        asyncio.run(c.cordon(idle, reason="maintenance"))  # from the next slot on
        _, shares = c.utilisation(0, 0)
        gpu = dict(((res, kind), s) for res, kind, s in shares)[("gpu", "worker")]
        _, down = c.out_of_service(0, 0)
        gone = dict(((res, kind), s) for res, kind, s in down)[("gpu", "worker")]
        assert gone[0] == 0.0 and gone[1:] == [0.5] * (len(gone) - 1)
        for slot in range(origin, c.ledger.end):
            own = sum(c.current_use(slot)[n]["gpu"] for n in ("w0", "w1") if n != idle)
            serving = 8 if slot == origin else 4
            assert gpu[slot - origin] == pytest.approx(own / serving), slot
        summary = {s.kind: s for s in c.price_summary()}
        worker = summary["worker"]
        at = worker.names.index(idle)
        assert worker.serving.tolist() == [True, True]  # the current slot's
        _, blocks = c.prices(0, 0)
        cells = {(r[0], r[2]): r[3] for b in blocks for r in b.rows(c.cluster.resources)}
        assert worker.now[at].tolist() == [cells[(idle, "gpu")][0], cells[(idle, "bandwidth")][0]]
        for r, res in enumerate(("gpu", "bandwidth")):
            expected = max(max(cells[(n, res)]) for n in ("w0", "w1") if n != idle)
            expected = max(expected, cells[(idle, res)][0])
            assert worker.peak[r] == pytest.approx(expected), res
            assert max(cells[(idle, res)][1:]) > expected  # counted, its cells would show
    finally:
        c.close()


def test_a_row_at_every_bound_reads_back_whole_with_nothing_logged(
    c: AdmissionController,
) -> None:
    """A stored row at each read-back limit (16 price drivers, names of 400 characters,
    a reason of ``MAX_SHOWN_REASON`` characters, the largest sequence a page token names,
    a decision of 0 ms, a rejected job without a payoff) is shown as stored, and logs
    no problem; a row that does not read back is logged once however often it is read."""
    from controller.admission.reads import MAX_SHOWN_REASON
    from controller.admission.views import MAX_TOKEN_SEQUENCE

    driver = {"resource": "r" * 400, "server": "s" * 400, "first_slot": 1, "last_slot": 2,
              "cost": 1.0, "price": 0.5}  # fmt: skip
    reason = "x" * MAX_SHOWN_REASON
    _store(c, JobRow, [
        _job("alice:edge", MAX_TOKEN_SEQUENCE, reason=reason, decision_ms=0.0, payoff=None,
             detail={"drivers": [driver] * 16}),
        _job("alice:odd", 1, state="weird"),
    ])  # fmt: skip
    log = _Log()
    c.log = log
    view = c._get_sync("alice:edge")
    assert view.decision.reason == reason and view.decision.drivers == [driver] * 16
    assert view.sequence == MAX_TOKEN_SEQUENCE and view.decision.decision_ms == 0.0
    assert view.decision.payoff is None
    assert log.lines == []
    for _ in range(2):
        assert c._get_sync("alice:odd").state == "weird"
        c._list_sync([], 10)
    assert [f["job"] for _, f in log.lines] == ["alice:odd"]


def test_allocations_are_listed_by_slot_then_the_clusters_order_of_servers(
    c: AdmissionController,
) -> None:
    """A view's allocation entries: by slot, then by the server's place in the cluster
    (as it is now: a cluster reloaded in another order lists in the new one), workers
    and parameter servers each with their own count."""
    from controller.config import load

    order = c._server_order()
    w_first, w_last = order[0], order[-1]
    _store(c, JobRow, [_job("alice:a", 1, state="admitted", admitted=True, payoff=1.0)])
    _store(c, AllocationRow, [
        {"job_id": "alice:a", "slot": 2, "server": w_first, "workers": 1, "ps": 0},
        {"job_id": "alice:a", "slot": 1, "server": w_last, "workers": 0, "ps": 3},
        {"job_id": "alice:a", "slot": 1, "server": w_first, "workers": 2, "ps": 0},
    ])  # fmt: skip
    assert c._get_sync("alice:a").decision.allocations == [
        {"slot": 1, "server": w_first, "workers": 2},
        {"slot": 1, "server": w_last, "ps": 3},
        {"slot": 2, "server": w_first, "workers": 1},
    ]
    # the same servers listed in the reverse order (a reload builds a new cluster)
    path = next(Path(str(c.config.data_dir)).parent.glob("*.toml"))
    text = path.read_text()
    lines = [line for line in text.splitlines() if line.startswith("  {name=")]
    reordered = text.replace("\n".join(lines), "\n".join(reversed(lines)))
    other = path.with_name("reversed.toml")
    other.write_text(reordered)
    c.cluster = load(other).cluster
    assert c._server_order() == order[::-1]
    assert [a["server"] for a in c._get_sync("alice:a").decision.allocations][:2] == [
        w_last,
        w_first,
    ]
