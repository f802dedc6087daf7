"""``oasis offline --store URL [--from --to]``: the offline optimum over what the daemon
decided, read from its store (the admission controller in-process, a fake clock, a
real SQLite store)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog
from sqlalchemy import event

from controller.admission import AdmissionController
from controller.cli import main
from controller.clock import FakeClock, SlotClock
from controller.config import from_dict
from controller.history import load_history
from controller.store import Database
from pricing import trace_from_dict
from pricing.offline import solve_offline
from pricing.workload import generate_trace
from tests.stores import store_session

WINDOW = 6
SLOT = 3600.0


def _jobs(seed: int, n: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A small cluster and ``n`` jobs that fit in ``WINDOW`` slots (specs without arrival)."""
    raw = generate_trace(
        np.random.default_rng(seed), n_jobs=n, n_worker_servers=2, n_ps_servers=1, horizon=WINDOW
    )
    jobs: list[dict[str, Any]] = raw["jobs"]  # type: ignore[assignment]
    specs = [{k: v for k, v in j.items() if k != "arrival"} for j in jobs]
    return raw, specs


class Controller:
    """The daemon's admission controller on a SQLite file, at slot 0 of a fake clock."""

    def __init__(
        self, tmp_path: Path, raw: dict[str, Any], limits: dict[str, Any] | None = None
    ) -> None:
        config = from_dict(
            {
                "daemon": {"data_dir": str(tmp_path), "window": WINDOW, "epoch": 0},
                "pricing": {"bounds": "estimate"},
                "cluster": {"resources": raw["resources"], "servers": raw["servers"]},
                "limits": limits or {},
            }
        )
        self.url = config.database_url
        self.clock = FakeClock(1.0)
        self.inner = AdmissionController(
            config,
            Database(self.url),
            SlotClock(self.clock, SLOT, 0.0),
            log=structlog.wrap_logger(structlog.ReturnLogger()),
        )
        self.inner.open()

    def submit(self, spec: dict[str, Any]) -> Any:
        return asyncio.run(self.inner.submit(spec))

    def next_slot(self) -> None:
        self.clock.advance(SLOT)
        asyncio.run(self.inner.tick())


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    raw, _ = _jobs(0, 1)
    c = Controller(tmp_path, raw)
    yield c
    c.inner.close()


def _offline(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["offline", "--json", "--time-limit", "30", *args]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_the_whole_store_equals_the_equivalent_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw, specs = _jobs(3, 8)
    c = Controller(tmp_path, raw)
    try:
        views = [c.submit(s) for s in specs]  # all in slot 0: arrival 1, slots 1 .. WINDOW
    finally:
        c.inner.close()
    out = _offline(capsys, "--store", c.url)
    online = sum(v.decision.utility or 0.0 for v in views if v.decision.admitted)
    assert out["online"] == pytest.approx(online)
    assert out["status"] == "optimal" and out["optimum"] >= online - 1e-6
    assert [j["id"] for j in out["jobs"]] == [s["id"] for s in specs]
    assert [j["online_admitted"] for j in out["jobs"]] == [v.decision.admitted for v in views]
    # the same jobs as a trace: arrival 0 (slot 1 shifted), horizon WINDOW
    trace = trace_from_dict({**raw, "jobs": [{**s, "arrival": 0} for s in specs]})
    expected = solve_offline(trace, time_limit=30)
    assert expected.status == "optimal"
    assert out["optimum"] == pytest.approx(expected.optimum, abs=1e-6)


def test_from_to_compares_one_stretch_and_holds_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw, specs = _jobs(5, 9)
    c = Controller(tmp_path, raw)
    try:
        for spec in specs[:5]:
            c.submit(spec)  # arrival 1
        c.next_slot()
        c.next_slot()
        later = [c.submit(spec) for spec in specs[5:]]  # slot 2: arrival 3
    finally:
        c.inner.close()
    history = _history(c.url, 3, 3)
    assert [j.id for j in history.trace.jobs] == [s["id"] for s in specs[5:]]
    assert history.first_slot == 3 and all(j.arrival == 0 for j in history.trace.jobs)
    assert history.held.worker_used.any()  # the earlier jobs still run in slots 3 ..
    assert (history.held.last_slot == WINDOW - 1).all()

    out = _offline(capsys, "--store", c.url, "--from", "3", "--to", "3")
    online = sum(v.decision.utility or 0.0 for v in later if v.decision.admitted)
    assert out["online"] == pytest.approx(online)
    assert out["status"] == "optimal" and out["optimum"] >= online - 1e-6
    # with the earlier jobs' resources held, the optimum cannot beat an empty cluster
    alone = solve_offline(history.trace, time_limit=30)
    assert alone.optimum is not None and out["optimum"] <= alone.optimum + 1e-6


def test_a_decision_committed_while_the_store_is_read_changes_nothing_read(
    tmp_path: Path,
) -> None:
    """The daemon decides while ``oasis offline --store`` reads: a job admitted between
    the read of the jobs and that of the allocations is not half seen (its allocations
    counted as another job's held use); the history equals the store's before it."""
    raw, specs = _jobs(5, 9)
    c = Controller(tmp_path, raw)
    db = Database(c.url)
    try:
        for spec in specs[:3]:
            c.submit(spec)
        quiet = load_history(db)
        decided: list[Any] = []

        def decide_meanwhile(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if "FROM allocations" in statement and not decided:
                decided.extend(c.submit(spec) for spec in specs[3:])

        event.listen(db.engine, "before_cursor_execute", decide_meanwhile)
        busy = load_history(db)
    finally:
        c.inner.close()
        db.dispose()
    assert any(v.decision.admitted for v in decided)  # their allocations were in the store
    assert [j.id for j in busy.trace.jobs] == [j.id for j in quiet.trace.jobs]
    assert (busy.held.worker_used == quiet.held.worker_used).all()
    assert (busy.held.ps_used == quiet.held.ps_used).all()
    assert busy.online == quiet.online


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["t.json", "--from", "2"], "--from and --to select slots of a --store"),
        ([], "give either a TRACE or --store STORE"),
        (["--store", "sqlite:///{tmp}/nothing.db"], "no such file"),  # and none made
        (["--store", "sqlite:///{tmp}/empty.db"], "cannot read a daemon's store"),
        (["--store", "nonsense://"], "--store: no SQLAlchemy dialect or driver 'nonsense'"),
        (
            ["--store", "postgresql+psycopg://oasis@db/oasis?sslmod=require"],
            "--store: ?sslmod=...: not a connection parameter libpq knows; did you mean 'sslmode'?",
        ),
    ],
)
def test_bad_store_arguments_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    (tmp_path / "empty.db").touch()  # a file, but no daemon's store
    assert main(["offline", *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "nothing.db").exists()


def test_a_store_is_named_by_its_file_or_data_dir_as_store_copy_takes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``oasis offline --store /var/lib/oasis`` (the data_dir, as ``oasis store copy
    --from`` takes it) was refused: "not a SQLAlchemy URL ... e.g.
    postgresql+psycopg://oasis@db/oasis". A directory names its oasis.db, a path a
    SQLite file, for ``offline`` and ``calibrate`` alike."""
    raw, specs = _jobs(3, 4)
    c = Controller(tmp_path, raw)
    try:
        for spec in specs:
            c.submit(spec)
    finally:
        c.inner.close()
    by_url = _offline(capsys, "--store", c.url)
    for given in (str(tmp_path), str(tmp_path / "oasis.db")):
        out = _offline(capsys, "--store", given)
        assert (out["online"], out["optimum"]) == (by_url["online"], by_url["optimum"])
        assert [j["id"] for j in out["jobs"]] == [s["id"] for s in specs]
        prior = tmp_path / "prior.json"
        assert main(["calibrate", "--store", given, "-o", str(prior)]) == 0
        assert json.loads(prior.read_text())["kind"] == "oasis-bound-prior"
    capsys.readouterr()
    assert main(["offline", "--store", str(tmp_path / "elsewhere")]) == 2
    assert "no such file (a daemon's SQLite store is oasis.db" in capsys.readouterr().err
    assert not (tmp_path / "elsewhere").exists()  # none made


def test_an_empty_stretch_is_a_clear_error(
    controller: Controller, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["offline", "--store", controller.url, "--from", "5", "--to", "9"]) == 2
    assert "no job arrived in slots 5 .. 9" in capsys.readouterr().err
    # one bound given past the store's arrivals: the other is the store's, and named so
    # (it said "--to 1 is before --from 5", with no --to given)
    _, specs = _jobs(0, 1)
    controller.submit(specs[0])  # submitted in slot 0: arrives in slot 1
    assert main(["offline", "--store", controller.url, "--from", "5"]) == 2
    assert ("--store: --from 5 is after the newest arrival the store holds, slot 1: no job "
            "to compare") in capsys.readouterr().err  # fmt: skip
    controller.next_slot()
    controller.next_slot()
    controller.submit({**specs[0], "id": "later"})  # arrives in slot 3
    assert main(["offline", "--store", controller.url, "--to", "0"]) == 2
    assert ("--store: --to 0 is before the oldest arrival the store holds, slot 1: no job "
            "to compare") in capsys.readouterr().err  # fmt: skip


def test_utilities_summing_past_the_largest_float_are_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A daemon without a utility cap (limits.max_utility = 0) took three jobs of
    1.7e308: each is finite, their sum is not, and `offline --json` printed `Infinity`."""
    raw, specs = _jobs(0, 3)
    c = Controller(tmp_path, raw, {"max_utility": 0})
    try:
        for spec in specs:
            c.submit({**spec, "utility": {"kind": "sigmoid", "priority": 1.7e308,
                                          "decay": 0, "target": 1}})  # fmt: skip
    finally:
        c.inner.close()
    assert main(["offline", "--store", c.url, "--json"]) == 2
    err = capsys.readouterr().err
    assert "the jobs compared: the jobs' best utilities f(d_min) sum past the largest" in err


def test_a_deadline_without_half_life_leaves_the_store_tools_working(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A deadline job without ``half_life`` is worth 0 after its deadline, so SPEC 4's
    oracle L (from each job's value at the latest completion) was 0: `offline --store`
    and `calibrate --store` printed a SpecError traceback for any store holding one
    ordinary job of that kind, and `replay` refused such a trace under oracle bounds.
    Its value at the last completion still worth something counts now."""
    raw, specs = _jobs(3, 8)
    due = {"kind": "deadline", "value": 50, "deadline": "3h"}
    specs[0] = {**specs[0], "utility": due}
    c = Controller(tmp_path, raw)
    try:
        views = [c.submit(s) for s in specs]
    finally:
        c.inner.close()
    assert views[0].spec["utility"]["kind"] == "deadline"
    out = _offline(capsys, "--store", c.url)
    assert [j["id"] for j in out["jobs"]] == [s["id"] for s in specs]
    assert out["status"] == "optimal" and out["optimum"] > 0
    prior = tmp_path / "prior.json"
    assert main(["calibrate", "--store", c.url, "-o", str(prior)]) == 0
    assert json.loads(prior.read_text())
    trace = trace_from_dict({**raw, "jobs": [{**s, "arrival": 0} for s in specs]})

    assert np.isfinite(trace.bounds.log_l1).all()  # replay's oracle L is not 0


def test_jobs_whose_stored_plan_is_short_of_their_work_do_not_stop_the_comparison(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job its agents finished early keeps the allocations of the slots it ran, fewer
    worker-slots than its work W (and a failed job those it held): given to the solver
    as part of its start, that allocation broke SPEC 3-5 and ``oasis offline --store``
    refused the whole comparison ("the starting allocation breaks SPEC 3-5"), on any
    real week where a job was done early. Such jobs are left out of the start; the
    comparison runs, and their online utility counts as the daemon recorded it."""
    from sqlalchemy import delete, func, select

    from controller.store import AllocationRow, JobRow

    raw, specs = _jobs(3, 8)
    c = Controller(tmp_path, raw)
    try:
        views = [c.submit(s) for s in specs]
    finally:
        c.inner.close()
    admitted = [v for v in views if v.decision.admitted]
    assert admitted
    early = admitted[0].id
    with store_session(c.url) as session:  # as the plane's early completion does
        first = session.scalar(select(func.min(AllocationRow.slot)).where(
            AllocationRow.job_id == early))  # fmt: skip
        session.execute(delete(AllocationRow).where(
            AllocationRow.job_id == early, AllocationRow.slot > first))  # fmt: skip
        row = session.get(JobRow, early)
        assert row is not None and first is not None
        row.state, row.completion_slot = "completed", first
        row.jct = first - row.arrival_slot + 1
        assert row.utility is not None
        row.utility += 10.0  # the utility of its earlier completion, as stored
    out = _offline(capsys, "--store", c.url)
    assert out["status"] in ("optimal", "time limit"), out["status"]
    assert [j["id"] for j in out["jobs"]] == [s["id"] for s in specs]
    # the online side counts what the early completion earned, which the offline side
    # (the spec's work) cannot; before, nothing said why online could pass the bound
    (note,) = [n for n in out["notes"] if n.startswith("counted at their earlier completion")]
    assert "1 job(s) done early, 10 utility above their admission's" in note


def test_a_cordoned_server_is_out_of_service_offline_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server cordoned (or failed) over the stretch was out of the daemon's reach; the
    offline optimum used it all the same, since the outages were not read: its
    allocation and its "certified" bound counted a server nobody could use, and the
    online share was understated. Its slots are held whole now: the comparison equals
    the one over the other servers alone."""
    raw, specs = _jobs(3, 8)
    c = Controller(tmp_path, raw)
    try:
        asyncio.run(c.inner.cordon("w1", "disk swap"))  # from slot 1 on, no end
        views = [c.submit(s) for s in specs]  # arrival 1
    finally:
        c.inner.close()
    history = _history(c.url)
    assert not history.held.worker_capacity(history.trace)[:, 1].any()  # w1: nothing left
    assert any("w1" in n and "out of service" in n for n in history.notes)

    out = _offline(capsys, "--store", c.url)
    online = sum(v.decision.utility or 0.0 for v in views if v.decision.admitted)
    assert out["online"] == pytest.approx(online)
    servers = [s for s in raw["servers"] if s["name"] != "w1"]
    trace = trace_from_dict({**raw, "servers": servers,
                             "jobs": [{**s, "arrival": 0} for s in specs]})  # fmt: skip
    expected = solve_offline(trace, time_limit=30)
    assert expected.status == "optimal" and out["status"] == "optimal"
    assert out["optimum"] == pytest.approx(expected.optimum, abs=1e-6)
    assert any("w1" in n for n in out["notes"])


def test_a_failed_job_counts_nothing_online_and_the_notes_say_what_was_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failed job's plan was not carried out (``oasis jobs`` and the console: none
    earned), yet its planned utility counted in the online side, which then exceeded what
    the daemon earned. It counts 0 now, and the notes (stderr and ``notes`` in --json)
    say so, with the cancelled jobs left out and the jobs still running counted at their
    plan."""
    from sqlalchemy import delete, text

    from controller.store import AllocationRow, JobRow

    raw, specs = _jobs(6, 8)
    c = Controller(tmp_path, raw)
    try:
        views = [c.submit(s) for s in specs]
        admitted = [v.id for v in views if v.decision.admitted]
        assert len(admitted) >= 3
        asyncio.run(c.inner.cancel(admitted[2]))
    finally:
        c.inner.close()
    failed = admitted[0]
    with store_session(c.url) as session:  # as a stranded job: its plan gone, state failed
        session.execute(delete(AllocationRow).where(AllocationRow.job_id == failed))
        row = session.get(JobRow, failed)
        assert row is not None
        row.state, row.completion_slot = "failed", None
        # an edit's text in a number column (SQLite keeps it): before, counted 0 unsaid
        unread = admitted[1]
        session.execute(text("UPDATE jobs SET utility = 'lots' WHERE id = :j"), {"j": unread})
    out = _offline(capsys, "--store", c.url)
    earned = sum(
        v.decision.utility or 0.0
        for v in views
        if v.decision.admitted and v.id not in (failed, admitted[2], unread)
    )
    assert out["online"] == pytest.approx(earned)
    by_id = {j["id"]: j for j in out["jobs"]}
    assert admitted[2] not in by_id  # cancelled: left out
    assert by_id[failed]["online_utility"] == 0.0 and by_id[failed]["online_state"] == "failed"
    assert by_id[unread]["online_utility"] is None
    notes = "\n".join(out["notes"])
    assert "1 failed job(s)" in notes and "1 cancelled job(s)" in notes
    assert (
        f"counted 0 online: 1 job(s) whose stored utility (jobs.utility) is not a number: "
        f"{unread!r}" in notes
    ), notes
    assert "still admitted or running" in notes
    assert out["online"] <= out["optimum"] + 1e-6


def test_held_use_over_capacity_is_cut_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A held job's allocation edited over a server's capacity left the compared jobs a
    negative capacity there: no allocation, not even admitting nothing, was feasible,
    and the comparison failed with "the starting allocation breaks SPEC 3-5" naming no
    row (after saying "the solver starts from nothing"). The held use is cut to the
    capacity, and a note names the cell and the jobs in it."""
    from sqlalchemy import select

    from controller.store import AllocationRow

    raw, specs = _jobs(5, 9)
    c = Controller(tmp_path, raw)
    try:
        early = [c.submit(s) for s in specs[:5]]  # arrival 1
        c.next_slot()
        c.next_slot()
        for spec in specs[5:]:
            c.submit(spec)  # arrival 3
    finally:
        c.inner.close()
    held = next(v.id for v in early if v.decision.admitted)
    with store_session(c.url) as session:
        a = session.scalars(select(AllocationRow).where(
            AllocationRow.job_id == held, AllocationRow.slot >= 3, AllocationRow.workers > 0
        )).first()  # fmt: skip
        assert a is not None
        a.workers, slot, server = 500, a.slot, a.server
    assert (
        main(["offline", "--store", c.url, "--from", "3", "--to", "3", "--time-limit", "30"]) == 0
    )
    captured = capsys.readouterr()
    assert "offline optimum" in captured.out
    assert f"slot {slot} on {server}" in captured.err and repr(held) in captured.err


def _two_stretches(tmp_path: Path) -> tuple[Controller, list[dict[str, Any]], dict[str, Any]]:
    """Five jobs submitted in slot 0 (arrival 1), four in slot 2 (arrival 3)."""
    raw, specs = _jobs(5, 9)
    c = Controller(tmp_path, raw)
    try:
        for spec in specs[:5]:
            c.submit(spec)
        c.next_slot()
        c.next_slot()
        for spec in specs[5:]:
            c.submit(spec)
    finally:
        c.inner.close()
    return c, specs, raw


def _stored_allocations(url: str) -> list[Any]:
    from sqlalchemy import select

    from controller.store import AllocationRow

    with store_session(url) as session:
        return list(session.execute(select(AllocationRow.job_id, AllocationRow.slot,
            AllocationRow.server, AllocationRow.workers, AllocationRow.ps)).all())  # fmt: skip


def _history(url: str, first: int | None = None, last: int | None = None) -> Any:
    db = Database(url)
    try:
        return load_history(db, first, last)
    finally:
        db.dispose()


def test_the_held_use_is_each_other_jobs_stored_allocation_times_its_demand(
    tmp_path: Path,
) -> None:
    """``--from 3 --to 3``: the held use of each (slot, server) is the sum over the
    earlier jobs' stored allocations there of count x demand, workers and PS alike, from
    slot 3 itself on; each compared job's start is its own stored allocation. Before,
    only "some worker use is held" was checked: the first slot's allocations left out,
    two jobs in one cell counted as one, or a PS counted at a worker's demand passed."""
    from controller.replay import allocations

    c, specs, _raw = _two_stretches(tmp_path)
    history = _history(c.url, 3, 3)
    cluster, horizon = history.trace.cluster, history.trace.horizon
    resources = list(cluster.resources)
    demand = {s["id"]: s for s in specs}
    compared = {s["id"] for s in specs[5:]}
    worker = np.zeros_like(history.held.worker_used)
    ps = np.zeros_like(history.held.ps_used)
    cells: dict[tuple[int, str], set[str]] = {}
    rows = _stored_allocations(c.url)
    for a in rows:
        t = a.slot - 3
        if a.job_id in compared or not 0 <= t < horizon:
            continue
        cells.setdefault((t, a.server), set()).add(a.job_id)
        if a.server in cluster.worker_names:
            need = [demand[a.job_id]["worker"].get(r, 0.0) for r in resources]
            worker[t, cluster.worker_names.index(a.server)] += a.workers * np.array(need)
        else:
            need = [demand[a.job_id]["ps"].get(r, 0.0) for r in resources]
            ps[t, cluster.ps_names.index(a.server)] += a.ps * np.array(need)
    assert worker[0].any() and ps.any()  # slot 3 itself holds earlier jobs, and PS too
    assert max(len(jobs) for jobs in cells.values()) >= 2  # two held jobs share a cell
    np.testing.assert_allclose(history.held.worker_used, worker, rtol=1e-12)
    np.testing.assert_allclose(history.held.ps_used, ps, rtol=1e-12)

    for job, schedule in zip(history.trace.jobs, history.schedules, strict=True):
        stored = {(a.slot, a.server, a.workers or a.ps) for a in rows if a.job_id == job.id}
        if schedule is None:
            assert not stored
            continue
        assert stored
        entries = allocations(schedule, cluster)
        got = {(e["slot"] + 3, e["server"], e.get("workers", e.get("ps"))) for e in entries}
        assert got == stored, job.id


def test_an_outage_holds_its_slots_within_the_stretch_and_no_others(tmp_path: Path) -> None:
    """An outage (a ``server_outages`` row) holds the server whole in slots ``down_from
    .. up_from - 1`` clipped to the problem: one begun before ``--from`` blocks from
    slot 0 of the problem, its ``up_from`` slot is free again, and one that ended at
    ``--from`` holds nothing and is not named. Before, only an outage from the first slot
    on with no end was checked."""
    from datetime import UTC, datetime

    from controller.store import OutageRow

    c, _specs, _raw = _two_stretches(tmp_path)
    before = _history(c.url, 3, 3)
    with store_session(c.url) as session:
        now = datetime(2026, 1, 1, tzinfo=UTC)
        session.add(OutageRow(server="w0", down_from=1, up_from=5, detected_at=now))
        session.add(OutageRow(server="p0", down_from=2, up_from=3, detected_at=now))
    after = _history(c.url, 3, 3)
    cluster = after.trace.cluster
    w0 = cluster.worker_names.index("w0")
    full = np.broadcast_to(cluster.worker_capacity[w0], after.held.worker_used[:2, w0].shape)
    np.testing.assert_array_equal(after.held.worker_used[:2, w0], full)  # slots 3, 4
    np.testing.assert_array_equal(after.held.worker_used[2:], before.held.worker_used[2:])
    others = [i for i in range(len(cluster.worker_names)) if i != w0]
    np.testing.assert_array_equal(
        after.held.worker_used[:, others], before.held.worker_used[:, others]
    )
    np.testing.assert_array_equal(after.held.ps_used, before.held.ps_used)  # p0: ended at 3
    (note,) = [n for n in after.notes if "out of service" in n]
    assert note.endswith(": w0")


def test_the_size_past_which_a_stretch_is_refused_is_max_cells_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stretch of exactly MAX_CELLS slots x servers x resources is compared; one cell
    more is refused, naming --from and --to."""
    import controller.history as history_module
    from controller.history import HistoryError

    c, _specs, raw = _two_stretches(tmp_path)
    cells = (3 + WINDOW - 1) * len(raw["servers"]) * len(raw["resources"])  # slots 1 .. 8
    monkeypatch.setattr(history_module, "MAX_CELLS", cells)
    assert _history(c.url).trace.horizon == 3 + WINDOW - 1
    monkeypatch.setattr(history_module, "MAX_CELLS", cells - 1)
    with pytest.raises(HistoryError, match="narrow it with --from and --to"):
        _history(c.url)


@pytest.mark.parametrize(
    ("utility", "payoff", "cost", "gain"),
    [
        (30.0, 20.0, 10.0, 0.0),  # done as planned
        (30.0 * (1 + 1e-12), 20.0, 10.0, 0.0),  # the same up to float rounding
        (5e-10, 0.0, 0.0, 0.0),  # within the absolute rounding of a utility near 0
        (40.0, 20.0, 10.0, 10.0),  # done early: 10 above its admission's
        (float("nan"), 20.0, 10.0, 0.0),
        (40.0, None, 10.0, 0.0),
    ],
)
def test_a_completed_jobs_early_gain_is_over_its_admissions_utility_past_rounding(
    utility: float, payoff: float | None, cost: float | None, gain: float
) -> None:
    """The "done early" note counts a completed job whose stored utility is above its
    admission's (``payoff + cost``) past float rounding: one stored at its plan, its
    utility re-added from payoff and cost, is no early completion."""
    from controller.history import _early_gain

    assert _early_gain(utility, payoff, cost) == pytest.approx(gain)


def test_an_infinite_stored_utility_counts_0_online_and_is_named(tmp_path: Path) -> None:
    """An admitted job whose stored utility reads back infinite (SQLite keeps 9e999 as
    inf) counts 0 online, named in the notes, as text does: before, only text (read as
    none) was checked, and keeping the value made the online total infinite."""
    from sqlalchemy import text

    c, _specs, _raw = _two_stretches(tmp_path)
    history = _history(c.url)
    admitted = [j.id for j in history.online if j.admitted]
    assert admitted and all(np.isfinite(j.utility or 0.0) for j in history.online)
    with store_session(c.url) as session:
        session.execute(text("UPDATE jobs SET utility = 9e999 WHERE id = :j"), {"j": admitted[0]})
    history = _history(c.url)
    by_id = {j.id: j for j in history.online}
    assert by_id[admitted[0]].admitted and by_id[admitted[0]].utility is None
    assert sum(j.utility or 0.0 for j in history.online) < float("inf")
    assert any(repr(admitted[0]) in n and "is not a number" in n for n in history.notes)


def test_the_over_capacity_note_counts_cells_and_names_the_held_jobs_of_its_cell(
    tmp_path: Path,
) -> None:
    """One held allocation edited over its server's capacity in every resource it needs:
    the note counts one (slot, server) cell, and names the held jobs of that cell alone,
    not a compared job placed beside them there (one worker) nor a held job with a row on
    another server in that slot (none)."""
    from controller.store import AllocationRow

    c, specs, raw = _two_stretches(tmp_path)
    compared = sorted(s["id"] for s in specs[5:])
    rows = _stored_allocations(c.url)
    a = next(a for a in rows if a.slot >= 3 and a.workers > 0 and a.job_id not in compared)
    other = next(
        s["name"] for s in raw["servers"] if s["kind"] == "worker" and s["name"] != a.server
    )
    neighbour = next(s["id"] for s in specs[:5] if s["id"] != a.job_id)
    with store_session(c.url) as session:
        session.merge(
            AllocationRow(job_id=a.job_id, slot=a.slot, server=a.server, workers=500, ps=0)
        )
        session.merge(
            AllocationRow(job_id=compared[0], slot=a.slot, server=a.server, workers=1, ps=0)
        )
        session.merge(AllocationRow(job_id=neighbour, slot=a.slot, server=other,
                                    workers=0, ps=0))  # fmt: skip
    rows = _stored_allocations(c.url)
    beside = {b.job_id for b in rows if (b.slot, b.server) == (a.slot, a.server)}
    (note,) = [n for n in _history(c.url, 3, 3).notes if "exceed the capacity" in n]
    named = ", ".join(repr(j) for j in sorted(beside - set(compared)))
    assert f"in 1 (slot, server) cell(s), e.g. slot {a.slot} on {a.server}: " in note, note
    assert f"by jobs {named} (a store edited by hand" in note, note


def test_rows_naming_no_server_or_slots_that_do_not_read_are_left_out(tmp_path: Path) -> None:
    """An allocation on a server the cluster no longer lists holds nothing (the daemon's
    ledger has no such server), and an outage row whose slots do not read back as whole
    numbers is left out with a note naming it, as the daemon leaves it out: the held use
    is as without them. Before, neither kind of row was read by any test."""
    from datetime import UTC, datetime

    from sqlalchemy import text

    from controller.store import AllocationRow, OutageRow

    c, specs, _raw = _two_stretches(tmp_path)
    before = _history(c.url, 3, 3)
    with store_session(c.url) as session:
        now = datetime(2026, 1, 1, tzinfo=UTC)
        for job in (specs[0]["id"], specs[5]["id"]):  # a held job and a compared one
            session.add(AllocationRow(job_id=job, slot=4, server="gone", workers=3, ps=0))
        session.add(OutageRow(server="w0", down_from=3, up_from=None, detected_at=now))
    with store_session(c.url) as session:
        session.execute(text("UPDATE server_outages SET down_from = 3.5 "
                             "WHERE server = 'w0'"))  # fmt: skip
    after = _history(c.url, 3, 3)
    np.testing.assert_array_equal(after.held.worker_used, before.held.worker_used)
    np.testing.assert_array_equal(after.held.ps_used, before.held.ps_used)
    for b, a in zip(before.schedules, after.schedules, strict=True):
        assert (b is None) == (a is None)
        if a is not None and b is not None:
            assert a.start == b.start and np.array_equal(a.workers, b.workers)
    (bad,) = [n for n in after.notes if "do not read back; left out" in n]
    assert "(w0)" in bad, after.notes
    assert not any("out of service" in n for n in after.notes)


def test_the_failed_jobs_note_sums_the_failed_jobs_plans_alone(tmp_path: Path) -> None:
    """The note on failed jobs gives the utility their plans were worth: theirs alone,
    not that of the other admitted jobs compared beside them."""
    from sqlalchemy import text

    from controller.store import JobRow

    c, _specs, _raw = _two_stretches(tmp_path)
    admitted = [j for j in _history(c.url).online if j.admitted]
    assert len(admitted) >= 2
    failed = admitted[0]
    with store_session(c.url) as session:
        row = session.get(JobRow, failed.id)
        assert row is not None
        row.state = "failed"
    history = _history(c.url)
    assert failed.utility is not None
    planned = (
        "counted 0 online: 1 failed job(s), their plans not carried out "
        f"({failed.utility:.6g} utility planned)"
    )
    assert planned in history.notes, history.notes
    assert {j.id: j.utility for j in history.online}[failed.id] == 0.0
    # a failed job counts 0 whatever its stored utility: it is no unread one
    with store_session(c.url) as session:
        session.execute(text("UPDATE jobs SET utility = 'lots' WHERE id = :j"), {"j": failed.id})
    notes = _history(c.url).notes
    assert any("1 failed job(s)" in n for n in notes)
    assert not any("is not a number" in n for n in notes), notes


def test_the_problems_price_bounds_take_the_daemons_window_as_tmax(tmp_path: Path) -> None:
    """The module docstring: the bounds (for the Theorem 4 figure) are SPEC 4's over the
    compared jobs with ``Tmax = T``, the daemon's window, not the problem's horizon
    (here 8 slots: arrivals 1 and 3, a window of 6)."""
    from pricing.prices import oracle_bounds

    c, _specs, _raw = _two_stretches(tmp_path)
    history = _history(c.url)
    trace = history.trace
    assert history.window == WINDOW and trace.horizon == WINDOW + 2
    jobs = list(trace.jobs)

    def bounds(t: int) -> Any:
        return oracle_bounds(jobs, trace.cluster, t, {j.id: t for j in jobs})

    fields = ("log_u1", "log_u2", "log_l1", "log_l2", "eta1", "eta2")
    got = [np.asarray(getattr(trace.bounds, f)) for f in fields]
    assert all(np.array_equal(g, np.asarray(getattr(bounds(WINDOW), f)))
               for g, f in zip(got, fields, strict=True))  # fmt: skip
    assert not all(np.array_equal(g, np.asarray(getattr(bounds(trace.horizon), f)))
                   for g, f in zip(got, fields, strict=True))  # fmt: skip
