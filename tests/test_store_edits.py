"""A store edited by hand (an operator, a bad migration, a half-restored backup): the
daemon, a subprocess on SQLite and on PostgreSQL, still starts, takes out the one row it
cannot use with a log line and an event naming it, and leaves every other tenant's job
as it was. Nothing prints a traceback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiomqtt
import grpc
import pytest
import sqlalchemy

from controller.plane.topics import Topics
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.store.stored import MAX_STORED_SPEC
from tests.broker import NEEDS_MOSQUITTO, Mosquitto
from tests.servers import (
    CLUSTER_TOML,
    ROOT,
    Daemon,
    Postgres,
    events_through,
    newest_event,
    oasis,
    write_config,
)
from tests.test_config_shrink import Decided, _plan, copy_of, decide_in, job_pages, read_back
from tests.test_metrics import METRICS_ON, Samples, parse, value


@dataclass
class Store(Decided):
    """A copy of a store a daemon decided six jobs in (j0-j3 admitted, j4-j5 rejected)."""

    def execute(self, *statements: str) -> None:
        engine = sqlalchemy.create_engine(self.url)
        try:
            with engine.begin() as conn:
                for statement in statements:
                    conn.execute(sqlalchemy.text(statement))
        finally:
            engine.dispose()


@pytest.fixture(scope="module")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Decided:
    folder = tmp_path_factory.mktemp("template")
    return decide_in(f"sqlite:///{folder / 'store.db'}", folder, 6)


@pytest.fixture(scope="module")
def postgres_template(tmp_path_factory: pytest.TempPathFactory, postgres: Postgres) -> Decided:
    return decide_in(postgres.new_database(), tmp_path_factory.mktemp("template"), 6)


def _cases(names: list[str], on_postgresql: list[str]) -> list[Any]:
    """``(store, name)`` parameters: every case on SQLite, those named on PostgreSQL too.
    The rebuild reads both stores through the same code; PostgreSQL gets the cases where
    its typed columns or JSON checks could make a difference, which keeps these restarts
    (5 s each) within the suite's time."""
    both = [pytest.param("sqlite", n, id=f"sqlite-{n}") for n in names]
    return both + [pytest.param("postgresql", n, id=f"postgresql-{n}") for n in on_postgresql]


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh copy of the template store of the backend."""
    sqlite = request.param == "sqlite"
    template: Decided = request.getfixturevalue(
        "sqlite_template" if sqlite else "postgres_template"
    )
    postgres = None if sqlite else request.getfixturevalue("postgres")
    return Store(copy_of(template, tmp_path, postgres), template.epoch, template.before)


@dataclass
class Restarted:
    jobs: dict[str, Any]
    events: dict[str, dict[str, Any]]  # job id -> detail of its last replanned/failed event
    first_slot: int
    log: str
    use: dict[str, dict[str, float]]  # the ledger's use per server in the first slot
    metrics: Samples  # one scrape of /metrics ({} unless asked for)


def _restart(
    store: Store, tmp_path: Path, edit: Callable[[str], str] = str, scrape: bool = False
) -> Restarted:
    """The daemon restarted on ``store`` (its config passed through ``edit``), what it
    reads back, and with ``scrape`` one scrape of its /metrics, after the reads."""
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", store.url, store.epoch)
    config.write_text(edit(config.read_text()) + (METRICS_ON if scrape else ""))
    log = tmp_path / "restarted.log"
    daemon = Daemon(config, log).start()
    metrics: Samples = {}
    try:
        jobs, now, events = read_back(daemon.address, store.url)
        with grpc.insecure_channel(daemon.address) as channel:
            servers = (
                pb_grpc.ClusterStub(channel)
                .ListServers(pb.ListServersRequest(slot=now), timeout=10)
                .servers
            )
            use = {s.name: dict(s.used) for s in servers}
        if scrape:  # logged before the daemon reports that it listens
            line = next(x for x in log.read_text().splitlines() if "metrics listening" in x)
            url = f"http://{json.loads(line)['address']}/metrics"
            with urllib.request.urlopen(url, timeout=30) as answer:
                metrics = parse(answer.read().decode())
    finally:
        assert daemon.stop() == 0, log.read_text()
    text = log.read_text()
    assert "Traceback" not in text, text
    return Restarted(jobs, events, now, text, use, metrics)


def _payoffs_by_state(after: Restarted, store: Store, *left_out: str) -> dict[str, float]:
    """The payoffs decided for the admitted jobs (as ``store`` was before the edits),
    summed by their state after the restart, ``left_out`` left out."""
    sums: dict[str, float] = {}
    for job_id, job in store.before.items():
        if job_id in left_out or not job.decision.admitted:
            continue
        state = pb.JobState.Name(after.jobs[job_id].state).removeprefix("JOB_STATE_").lower()
        sums[state] = sums.get(state, 0.0) + job.decision.payoff
    return sums


def _start_refused(store: Store, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """oasisd started on ``store`` in the foreground, as a process that is expected to
    refuse to start (its exit status and stderr)."""
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", store.url, store.epoch)
    return subprocess.run(
        [sys.executable, "-m", "controller.daemon", "--config", str(config)],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip


def _use_of(jobs: dict[str, Any], slot: int) -> dict[str, dict[str, float]]:
    """What ``jobs``' stored plans use per server and resource in ``slot``."""
    use: dict[str, dict[str, float]] = {}
    for job in jobs.values():
        for a in job.decision.allocations:
            if a.slot != slot:
                continue
            demand, count = (job.spec.worker, a.workers) if a.workers else (job.spec.ps, a.ps)
            cell = use.setdefault(a.server, {})
            for resource, amount in demand.items():
                cell[resource] = cell.get(resource, 0.0) + amount * count
    return use


def _others_untouched(store: Store, after: Restarted, *edited: str) -> None:
    for job_id, job in store.before.items():
        if job_id in edited:
            continue
        assert after.jobs[job_id].state == job.state, job_id
        assert _plan(after.jobs[job_id], after.first_slot) == _plan(job, after.first_slot), job_id
        assert job_id not in after.events, (job_id, after.events[job_id])


BAD_SPECS: dict[str, Callable[[str], str]] = {
    "not JSON": lambda spec: "{not json",
    "nested too deeply": lambda spec: '{"a": ' + "[" * 100_000 + "}",
}


@pytest.mark.parametrize(
    ("store", "bad"), _cases(sorted(BAD_SPECS), ["nested too deeply"]), indirect=["store"]
)
def test_a_stored_spec_that_does_not_read_back_fails_that_job_alone(
    store: Store, tmp_path: Path, bad: str
) -> None:
    """Before: json.loads raised out of the rebuild (JSONDecodeError, RecursionError): a
    traceback and exit 1 at every start, a crash loop under systemd."""
    spec = BAD_SPECS[bad]("")
    store.execute(f"UPDATE jobs SET spec = '{spec}' WHERE id = 'j1'")
    after = _restart(store, tmp_path)
    assert after.jobs["j1"].state == pb.JOB_STATE_FAILED
    why = after.events["j1"]["why"]
    assert "the stored spec of job 'j1'" in why and after.events["j1"]["how"] == "stranded", why
    assert not _plan(after.jobs["j1"], after.first_slot)
    _others_untouched(store, after, "j1")


def _first_allocation(store: Store, job_id: str, server: str) -> int:
    engine = sqlalchemy.create_engine(store.url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sqlalchemy.text(
                "SELECT min(slot) FROM allocations WHERE job_id = :j AND server = :s"
            ), {"j": job_id, "s": server}).scalar_one())  # fmt: skip
    finally:
        engine.dispose()


BAD_ALLOCATIONS: dict[str, tuple[str, str]] = {
    # name: (SET clause on j1's first row on w0, what the reason says)
    "negative workers": ("workers = -50", "workers: must be 0 .. 13 (its chunks), got -50"),
    "workers past int32": ("workers = 2000000000", "workers: must be 0 .. 13"),
    "huge workers": ("workers = 1000", "workers: must be 0 .. 13 (its chunks), got 1000"),
    "negative ps": ("ps = -3", "ps: must be 0 .. 13 (its chunks), got -3"),
    "slot far past the window": ("slot = 1000000000000", "slot 1000000000000 on w0: more than"),
    "workers not a number": (
        "workers = 'abc'",
        "workers: must be 0 .. 13 (its chunks), got no integer",
    ),
}


@pytest.mark.parametrize(
    ("store", "bad"),
    _cases(sorted(BAD_ALLOCATIONS), ["negative workers", "workers past int32"]),
    indirect=["store"],
)
def test_a_stored_allocation_out_of_range_fails_that_job_alone(
    store: Store, tmp_path: Path, bad: str
) -> None:
    """Before: a negative count went into the ledger as it was (freeing capacity other
    tenants' jobs then took: servers over capacity); a huge one made the refit search
    billions of worker-slots (MemoryError at start-up) and a far slot a misfit array of
    a trillion slots (MemoryError): each a crash loop."""
    change, reason = BAD_ALLOCATIONS[bad]  # text in an integer column: SQLite only
    slot = _first_allocation(store, "j1", "w0")
    where = f"job_id = 'j1' AND server = 'w0' AND slot = {slot}"
    store.execute(f"UPDATE allocations SET {change} WHERE {where}")
    after = _restart(store, tmp_path)
    assert after.jobs["j1"].state == pb.JOB_STATE_FAILED
    why = after.events["j1"]["why"]
    assert "the stored plan of job 'j1'" in why and reason in why, why
    assert not _plan(after.jobs["j1"], after.first_slot)
    _others_untouched(store, after, "j1")


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)  # the config changes, not the store
def test_a_server_whose_kind_changed_has_its_units_refitted(store: Store, tmp_path: Path) -> None:
    """Before: a PS server made a worker server (or the reverse) in the config kept the
    stored rows, reading the PS count as 0 workers: the job's parameter servers silently
    vanished from the ledger, their capacity free for others, and nothing was logged."""
    engine = sqlalchemy.create_engine(store.url)
    try:
        with engine.connect() as conn:
            used = conn.execute(sqlalchemy.text(
                "SELECT DISTINCT job_id FROM allocations WHERE server = 'p1' AND ps > 0"
            )).scalars().all()  # fmt: skip
    finally:
        engine.dispose()
    assert used, "some job must have PS on p1, or the test checks nothing"
    after = _restart(store, tmp_path, lambda text: text.replace(
        '{name="p1", kind="ps"', '{name="p1", kind="worker"'))  # fmt: skip
    for job_id in used:
        assert after.events[job_id]["reason"] == "config_changed", after.events
        assert "server p1 is now a worker server" in after.events[job_id]["why"]
        assert all(p == 0 for _, server, _, p in _plan(after.jobs[job_id], 0) if server == "p1")


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)  # the config changes, not the store
def test_a_refit_is_held_to_the_search_limits(store: Store, tmp_path: Path) -> None:
    """A plan that no longer fits is re-planned by the best-schedule search at start-up
    (and at a takeover), where every tenant waits for it: the search is held to the
    limits a submission is, so a stored spec edited into a huge job cannot hold the
    start. Here the limit is set low and a server removed: the jobs that cannot be
    re-placed in their slots are stranded, naming the limit, instead of searched."""
    w2 = next(line for line in CLUSTER_TOML.splitlines() if 'name="w2"' in line)
    after = _restart(store, tmp_path, lambda text: text.replace(w2 + "\n", "").replace(
        "[cluster]", "[limits]\nmax_search_steps = 10\n\n[cluster]"))  # fmt: skip
    refused = {j: e for j, e in after.events.items() if "re-plan is not searched" in e["why"]}
    assert refused, after.events
    for job_id, event in refused.items():
        assert event["how"] == "stranded" and "limits.max_search_steps" in event["why"], event
        assert after.jobs[job_id].state == pb.JOB_STATE_FAILED


def test_a_job_row_that_does_not_read_back_leaves_every_other_readable(
    store: Store, tmp_path: Path
) -> None:
    """Before: one row whose spec was not JSON (or not an object), whose state was not a
    state or whose detail was not an object failed every ListJobs page holding it
    (INTERNAL or UNKNOWN), so `oasis jobs` and `oasis status` failed for everyone."""
    store.execute(
        "UPDATE jobs SET spec = '{not json' WHERE id = 'j4'",  # rejected: no plan to rebuild
        "UPDATE jobs SET spec = '[1, 2]' WHERE id = 'j5'",
        "UPDATE jobs SET state = 'zombie' WHERE id = 'j3'",
        "UPDATE jobs SET detail = '[1]' WHERE id = 'j2'",
    )
    after = _restart(store, tmp_path)
    assert sorted(after.jobs) == sorted(store.before)
    assert json.loads(after.jobs["j4"].spec.json) == {"id": "j4"}
    assert json.loads(after.jobs["j5"].spec.json) == {"id": "j5"}
    assert after.jobs["j3"].state == pb.JOB_STATE_UNSPECIFIED
    for job_id in ("j0", "j1", "j2", "j3"):
        assert _plan(after.jobs[job_id], 0) == _plan(store.before[job_id], 0), job_id
    warned = {e["job"]: e["why"] for e in map(json.loads, after.log.splitlines())
              if e.get("event", "").startswith("stored job row does not read back")}  # fmt: skip
    assert "the stored spec of job 'j4': is not valid JSON" in warned["j4"], warned
    assert "must be a JSON object, got list" in warned["j5"], warned
    assert "state 'zombie' is not one of" in warned["j3"], warned
    assert "detail: must be a JSON object, got list" in warned["j2"], warned


def test_a_pending_job_whose_spec_does_not_read_back_expires_alone(
    store: Store, tmp_path: Path
) -> None:
    """Before: the pass over the pending queue at a slot boundary caught ValueError, not
    RecursionError: a pending job's spec nested too deeply failed the whole pass, at
    every boundary, so no pending job of any tenant was decided again."""
    deep = '{"a": ' + "[" * 100_000 + "}"
    store.execute(
        f"UPDATE jobs SET state = 'pending', wait_until_slot = 20, decided_slot = NULL, "
        f"spec = '{deep}' WHERE id = 'j4'",
        "UPDATE jobs SET state = 'pending', wait_until_slot = 20, decided_slot = NULL "
        "WHERE id = 'j5'",
    )
    after = _restart(store, tmp_path)
    assert after.jobs["j4"].state == pb.JOB_STATE_EXPIRED
    assert (
        "the stored spec of job 'j4': is JSON nested too deeply" in after.jobs["j4"].decision.reason
    )
    assert after.jobs["j5"].state in (pb.JOB_STATE_PENDING, pb.JOB_STATE_ADMITTED)
    # decided again (its search timed anew) in the same pass, after j4 expired
    assert after.jobs["j5"].decision.decision_ms != store.before["j5"].decision.decision_ms


def test_a_store_of_a_newer_version_is_refused_in_one_line(store: Store, tmp_path: Path) -> None:
    """Before: a store a newer oasis migrated (an upgrade rolled back, a backup from a
    newer head node) stopped the start with Alembic's traceback ending in "Can't locate
    revision identified by ...", at every restart. Exit 2: the unit does not restart it
    (a restart cannot help; in a rolling upgrade, this node waits for its own)."""
    store.execute("UPDATE alembic_version SET version_num = '0042_from_the_future'")
    out = _start_refused(store, tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("oasisd: the store ") and "0042_from_the_future" in lines[0]
    assert "newer oasis" in lines[0] and "0009" in lines[0], lines[0]


SCHEMA_APART: dict[str, tuple[str, str]] = {
    # alembic_version restored from an older backup than the tables: 0006's index is there
    "revision older than the tables": (
        "UPDATE alembic_version SET version_num = '0005'",
        "records schema revision '0005', but its tables are already past it",
    ),
    # older still: 0007's first column is there (SQLite: "duplicate column name",
    # PostgreSQL: duplicate_column), not an index
    "revision before a column the tables hold": (
        "UPDATE alembic_version SET version_num = '0006'",
        "records schema revision '0006', but its tables are already past it",
    ),
    # a table left out of a restore: named, not a traceback from reading its columns
    "a table missing": (
        "DROP TABLE job_progress",
        "records schema revision '0009', but lacks its table job_progress",
    ),
    # a table restored from a backup older than alembic_version
    "tables older than the revision": (
        "ALTER TABLE jobs DROP COLUMN decided_slot",
        "records schema revision '0009', but lacks its column jobs.decided_slot",
    ),
}


@pytest.mark.parametrize(
    ("store", "edit"),
    _cases(
        sorted(SCHEMA_APART),
        ["revision older than the tables", "revision before a column the tables hold"],
    ),
    indirect=["store"],
)
def test_tables_apart_from_their_schema_revision_stop_the_start_with_exit_2(
    store: Store, tmp_path: Path, edit: str
) -> None:
    """Before: the migration from the older revision failed on its own index ("index
    ix_jobs_state_sequence already exists"), or the rebuild on the missing column ("no
    such column: jobs.decided_slot"): exit 1, which the unit restarts every 2 s for
    ever. Now exit 2 naming the revision and what is apart, the store left as it was."""
    statement, message = SCHEMA_APART[edit]
    store.execute(statement)
    out = _start_refused(store, tmp_path)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    engine = sqlalchemy.create_engine(store.url)
    try:
        with engine.connect() as conn:
            revision = conn.scalar(sqlalchemy.text("SELECT version_num FROM alembic_version"))
    finally:
        engine.dispose()
    left = {"revision older than the tables": "0005",
            "revision before a column the tables hold": "0006"}  # fmt: skip
    assert revision == left.get(edit, "0009")  # as it was


@pytest.mark.parametrize(
    ("store", "up_from"), _cases(["NULL", "1000000000000"], ["NULL"]), indirect=["store"]
)
def test_an_outage_row_over_planned_slots_refits_the_jobs_on_that_server(
    store: Store, tmp_path: Path, up_from: str
) -> None:
    """A store restored half from a backup: the server outages (the execution plane's)
    from after the plans. Before: the rebuild placed the plans, then blocking the
    server raised LedgerError ("still holds jobs"): a traceback at every start."""
    store.execute(
        "INSERT INTO server_outages (server, down_from, up_from, detected_at) "
        f"VALUES ('w0', -1000000000000, {up_from}, '2026-01-01 00:00:00+00:00')"
    )
    on_w0 = {j for j, job in store.before.items() if any(s == "w0" for _, s, _, _ in _plan(job, 0))}
    assert on_w0, "some job must be planned on w0, or the test checks nothing"
    after = _restart(store, tmp_path)
    for job_id in on_w0:
        assert after.events[job_id]["reason"] == "config_changed", after.events
        assert all(s != "w0" for _, s, _, _ in _plan(after.jobs[job_id], after.first_slot))
    _others_untouched(store, after, *on_w0)


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)  # PostgreSQL checks JSON
def test_sqlite_json_that_does_not_parse_reads_as_null(store: Store, tmp_path: Path) -> None:
    """SQLite keeps any text in a JSON column (PostgreSQL checks it). Before: a meta row
    edited into text that is not JSON raised json.JSONDecodeError out of the start-up
    (a crash loop), an event's detail out of every read of the event log."""
    store.execute(
        "UPDATE meta SET value = '{oops' WHERE key = 'bound_estimate'",
        "UPDATE events SET detail = '{oops' WHERE job_id = 'j2'",
        "UPDATE jobs SET detail = '{oops' WHERE id = 'j3'",
    )
    after = _restart(store, tmp_path)
    assert sorted(after.jobs) == sorted(store.before)
    assert '"why": "the stored state is of an older format or unreadable"' in after.log
    assert "stored job row does not read back" in after.log
    _others_untouched(store, after)


OFFLINE_EDITS: dict[str, tuple[list[str], str]] = {
    # name: (statements, what the one-line error says)
    "spec not JSON": (["UPDATE jobs SET spec = '{not json' WHERE id = 'j1'"],
                      "the stored spec of job 'j1': is not valid JSON"),
    "spec nested too deeply": ([f"UPDATE jobs SET spec = '{{\"a\": {'[' * 100_000}}}' "
                                "WHERE id = 'j4'"], "the stored spec of job 'j4': is JSON nested"),
    "a held job's spec not an object": (
        ["UPDATE jobs SET spec = '[1]', arrival_slot = 0 WHERE id = 'j0'"],
        "the stored spec of job 'j0': must be a JSON object, got list"),
    "an arrival a trillion slots out": (
        ["UPDATE jobs SET arrival_slot = 1000000000000 WHERE id = 'j5'"],
        "too large to compare at once; narrow it with --from and --to"),
    "a negative count": (["UPDATE allocations SET workers = -5 WHERE job_id = 'j0'"],
                         "allocation of job 'j0' at slot"),
    "settings of the wrong type": (["UPDATE meta SET value = '[1]' WHERE key = 'settings'"],
                                   "the store's meta row 'settings'"),
    # the message named the id whole: a line of 2 MB on stderr
    "an id of a megabyte": (
        ["UPDATE jobs SET id = printf('%.*c', 1000000, 'c'), spec = replace(spec, "
         "'\"id\":\"j4\"', '\"id\":\"' || printf('%.*c', 1000000, 'c') || '\"') "
         "WHERE id = 'j4'"],
        "ccc... (1000000 characters) no longer fits the servers"),
}  # fmt: skip
CALIBRATE_UNREAD = {"an arrival a trillion slots out", "a negative count"}


@pytest.mark.parametrize(
    ("store", "edit"),
    _cases(sorted(OFFLINE_EDITS), ["settings of the wrong type", "spec not JSON"]),
    indirect=["store"],
)
def test_the_offline_tools_name_a_bad_row(store: Store, edit: str) -> None:
    """Before: `oasis offline --store` and `oasis calibrate --store` printed a traceback
    (json.JSONDecodeError, RecursionError, AttributeError, a MemoryError of 109 TiB for
    one arrival slot edited far out) instead of naming the row."""
    statements, message = OFFLINE_EDITS[edit]
    store.execute(*statements)
    for command in (["offline", "--method", "ilp", "--time-limit", "5", "--no-progress"],
                    ["calibrate", "-o", "/dev/null"]):  # fmt: skip
        out = subprocess.run(
            [sys.executable, "-m", "controller.cli", *command, "--store", store.url],
            capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
        )  # fmt: skip
        assert "Traceback" not in out.stderr, (command, out.stderr)
        if command[0] == "calibrate" and edit in CALIBRATE_UNREAD:
            # a prior reads the jobs' specs only: neither arrivals nor allocations
            assert out.returncode == 0 and "jobs -> a prior" in out.stderr, out.stderr
            continue
        assert out.returncode == 2, (command, out.stderr)
        assert message in out.stderr, (command, out.stderr)
        assert len(out.stderr) < 10_000, (command, out.stderr[:2000])


@pytest.mark.parametrize(
    ("store", "plane"),
    _cases(
        ["[1]", '{"epoch": "x", "events": 3}', '{"epoch": 3, "events": 1' + "0" * 29 + "}"],
        ['{"epoch": "x", "events": 3}'],
    ),
    indirect=["store"],
)
def test_the_execution_plane_starts_past_rows_that_do_not_read_back(
    store: Store, tmp_path: Path, plane: str
) -> None:
    """With [mqtt], the plane reads the progress of active jobs and its own meta row at
    start. Before: a progress row or the plane row of the wrong shape raised
    AttributeError, TypeError or ValueError out of the start-up: a crash loop; an event
    count of 10**29 overflowed every read of the events after it, and the plane
    reconnected every second (the store audit). A progress row keeps what reads."""
    store.execute(
        "INSERT INTO job_progress VALUES ('j1', 1.0, 1.0, '[1]', '{}', '2026-01-01 00:00:00')",
        "INSERT INTO job_progress VALUES ('j2', 1.0, 1.0, '{\"w0/x\": 5}', '{\"points\": 3}', "
        "'2026-01-01 00:00:00')",
        f"INSERT INTO meta VALUES ('plane', '{plane}')",
    )
    broker = 'url = "mqtt://127.0.0.1:1"\n'  # nothing listens: the daemon decides on
    after = _restart(
        store, tmp_path, lambda t: t.replace("[cluster]", f"[mqtt]\n{broker}\n[cluster]")
    )
    logged = [json.loads(line) for line in after.log.splitlines() if line.startswith("{")]
    skipped = {e["job"] for e in logged if e["event"] == "stored progress entries ignored"}
    assert skipped == {"j1", "j2"}, logged
    [epoch] = [e for e in logged if e["event"] == "stored plane state ignored"]
    assert epoch["epoch"] > 1_000_000_000, epoch  # above any counter: agents take its plans
    _others_untouched(store, after)


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_a_job_of_megabytes_reads_back_through_the_cli(store: Store, tmp_path: Path) -> None:
    """Before: a spec blown up by hand to the 4 Mi characters the daemon reads back made
    its GetJob answer, and every ListJobs page holding it, larger than gRPC's default
    4 MiB a client reads: ``oasis job`` and ``oasis jobs`` failed with
    RESOURCE_EXHAUSTED, the latter for every job listed after it too."""
    pad = MAX_STORED_SPEC - 100
    store.execute(
        f"""UPDATE jobs SET spec = '{{"id": "j4", "note": "{"x" * pad}"}}' WHERE id = 'j4'"""
    )
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", store.url, store.epoch)
    daemon = Daemon(config, tmp_path / "oasisd.log").start()
    try:
        one = json.loads(oasis("job", "j4", "--json", server=daemon.address).stdout)
        assert len(one["spec"]["note"]) == pad
        listed = json.loads(oasis("jobs", "--json", server=daemon.address).stdout)
        assert sorted(j["id"] for j in listed["jobs"]) == sorted(store.before)
    finally:
        assert daemon.stop() == 0


def test_a_reason_or_id_of_megabytes_leaves_the_listing_readable(
    store: Store, tmp_path: Path
) -> None:
    """A job's reason edited to 20 MB (or, on SQLite, which keeps any length, its id or
    an allocation's server) made every ``oasis jobs`` page holding it fail,
    RESOURCE_EXHAUSTED over gRPC's 16 MiB, for every reader. Now the reason and id are
    shown cut, the allocation left out, and the row named in the log."""
    edits = ["UPDATE jobs SET reason = '" + "r" * 20_000_000 + "' WHERE id = 'j4'"]
    if store.url.startswith("sqlite"):  # PostgreSQL keeps an id to its 400 characters
        edits += ["UPDATE allocations SET server = '" + "s" * 20_000_000 + "' WHERE rowid = 1",
                  "PRAGMA foreign_keys = OFF",
                  "UPDATE jobs SET id = '" + "J" * 20_000_000 + "' WHERE id = 'j5'"]  # fmt: skip
    store.execute(*edits)
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", store.url, store.epoch)
    log = tmp_path / "oasisd.log"
    daemon = Daemon(config, log).start()
    try:
        listed = json.loads(oasis("jobs", "--json", server=daemon.address).stdout)["jobs"]
        j4 = json.loads(oasis("job", "j4", "--json", server=daemon.address).stdout)
    finally:
        assert daemon.stop() == 0
    assert len(listed) == len(store.before)
    reason = j4["decision"]["reason"]
    assert len(reason) < 20_000 and reason.endswith("(cut: the stored reason was edited)")
    assert "reason: 20000000 characters, over 16384" in log.read_text()
    if store.url.startswith("sqlite"):
        cut = [j["id"] for j in listed if j["id"].startswith("JJJ")]
        assert len(cut) == 1 and cut[0].endswith("... (cut: the stored id was edited)")


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)  # PostgreSQL types its columns
def test_sqlite_text_in_typed_columns_fails_that_job_alone(store: Store, tmp_path: Path) -> None:
    """SQLite keeps whatever text an edit writes into a number, flag or time column."""
    store.execute(
        "UPDATE jobs SET payoff = 'abc', decision_ms = 'slow' WHERE id = 'j0'",
        "UPDATE jobs SET completion_slot = 'soon', jct = 'x' WHERE id = 'j1'",
        "UPDATE jobs SET decided_at = 'yesterday' WHERE id = 'j5'",
        "UPDATE jobs SET admitted = 'maybe', arrival_slot = 'then' WHERE id = 'j4'",
        "UPDATE events SET at = 'never', slot = 'some' WHERE job_id = 'j2'",
        "UPDATE jobs SET utility = 1e999 WHERE id = 'j3'",  # infinity, which SQLite keeps
    )
    assert store.before["j0"].decision.admitted, "j0 must be admitted, or its payoff counts not"
    after = _restart(store, tmp_path, scrape=True)
    assert sorted(after.jobs) == sorted(store.before)
    _others_untouched(store, after, "j0", "j1", "j4", "j5")
    j0, j1, j4 = after.jobs["j0"], after.jobs["j1"], after.jobs["j4"]
    assert not j0.decision.HasField("payoff") and j0.decision.decision_ms == 0
    assert not j1.decision.HasField("completion_slot") and not j1.decision.HasField("jct")
    assert not j4.decision.admitted
    assert not after.jobs["j3"].decision.HasField("utility")
    warned = {e["job"]: e["why"] for e in map(json.loads, after.log.splitlines())
              if e.get("event", "").startswith("stored job row does not read back")}  # fmt: skip
    assert "decision_ms: not a number" in warned["j0"], warned
    assert "payoff: an admitted job's is not a number" in warned["j0"], warned
    assert "utility: inf is not a finite number" in warned["j3"], warned
    assert "admitted: not a flag" in warned["j4"] and "arrival_slot" in warned["j4"], warned
    # before: SQLite's sum() counted j0's 'abc' as 0 in oasis_payoff, and nothing said so
    [named] = _logged(after.log, "stored payoff is not a number; left out of oasis_payoff")
    assert (named["job"], named["column"], named["value"]) == ("j0", "jobs.payoff", "'abc'")
    for state, total in _payoffs_by_state(after, store, "j0", "j4").items():
        assert math.isclose(value(after.metrics, "oasis_payoff", state=state), total), state


@pytest.mark.parametrize("store", ["postgresql"], indirect=True)  # SQLite keeps no NaN
def test_postgresql_nan_and_infinity_in_amounts_are_left_out_and_named(
    store: Store, tmp_path: Path
) -> None:
    """PostgreSQL keeps NaN and infinity in a double precision column. Before: an
    admitted job's payoff edited to NaN made oasis_payoff of its state NaN (the sum of
    every tenant's payoffs lost) and showed as nan in `oasis job`, with nothing logged."""
    assert store.before["j0"].decision.admitted, "j0 must be admitted, or its payoff counts not"
    store.execute(
        "UPDATE jobs SET payoff = 'NaN' WHERE id = 'j0'",
        "UPDATE jobs SET cost = '-Infinity', decision_ms = 'NaN' WHERE id = 'j1'",
    )
    after = _restart(store, tmp_path, scrape=True)
    _others_untouched(store, after)
    assert not after.jobs["j0"].decision.HasField("payoff")
    assert not after.jobs["j1"].decision.HasField("cost")
    assert after.jobs["j1"].decision.decision_ms == 0  # was shown NaN (`oasis job --json`)
    warned = {e["job"]: e["why"] for e in _logged(after.log, "stored job row does not read back")}
    assert "payoff: nan is not a finite number" in warned["j0"], warned
    assert "cost: -inf is not a finite number" in warned["j1"], warned
    assert "decision_ms: nan" in warned["j1"], warned
    [named] = _logged(after.log, "stored payoff is not a number; left out of oasis_payoff")
    assert (named["job"], named["column"], named["value"]) == ("j0", "jobs.payoff", "nan"), named
    for state, total in _payoffs_by_state(after, store, "j0").items():
        assert math.isclose(value(after.metrics, "oasis_payoff", state=state), total), state


def _same_use(ledger: dict[str, dict[str, float]], plans: dict[str, dict[str, float]]) -> None:
    """The ledger's use per server and resource is what the plans add up to."""
    for server in ledger.keys() | plans.keys():
        held, planned = ledger.get(server, {}), plans.get(server, {})
        for resource in held.keys() | planned.keys():
            assert math.isclose(
                held.get(resource, 0.0), planned.get(resource, 0.0), abs_tol=1e-9
            ), (server, resource, held, planned)


def _logged(log: str, event: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    return [e for e in lines if e.get("event", "").startswith(event)]


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)  # text in an integer column
def test_a_pending_job_whose_slots_do_not_read_back_expires_alone(
    store: Store, tmp_path: Path
) -> None:
    """Before: a pending row whose submission slot an edit made text (it reads as None)
    raised TypeError in the pass over the pending queue, and one whose arrival was a
    trillion slots out ValueError out of the search: the pass runs at every start, slot
    boundary and submission, so the daemon answered every tenant's submit INTERNAL and
    exited 1 at every start (a crash loop)."""
    store.execute(
        "UPDATE jobs SET state = 'pending', wait_until_slot = 20, decided_slot = NULL, "
        "submitted_slot = 'then' WHERE id = 'j4'",
        "UPDATE jobs SET state = 'pending', wait_until_slot = 20, decided_slot = NULL, "
        "arrival_slot = 1000000000000 WHERE id = 'j5'",
    )
    after = _restart(store, tmp_path)
    for job_id, field in (("j4", "submitted_slot"), ("j5", "arrival_slot")):
        job = after.jobs[job_id]
        assert job.state == pb.JOB_STATE_EXPIRED, job_id
        assert f"no longer valid: {field}: must be an integer" in job.decision.reason, job_id
    _others_untouched(store, after, "j4", "j5")


def _with_id(spec_sql: str, job_id: str) -> str:
    """SQL for a job's spec with its ``id`` replaced (the specs are canonical JSON)."""
    return f"""replace({spec_sql}, '"id":"' || id || '"', '"id":"{job_id}"')"""


@pytest.mark.parametrize("store", ["sqlite", "postgresql"], indirect=True)
def test_a_spec_naming_another_job_acts_on_neither(store: Store, tmp_path: Path) -> None:
    """Before: the rebuild, the refit and the pending pass took a job's id from its spec:
    a row edited to carry another job's spec (j1 holding j0's id) was refitted as j0,
    failing j0 (another tenant's job) and leaving j1's slots unaccounted, and a pending
    one wrote its plan into j0's allocations, then stopped the start (LedgerError)."""
    store.execute(
        f"UPDATE jobs SET spec = {_with_id('spec', 'j0')} WHERE id = 'j1'",
        f"UPDATE jobs SET state = 'pending', wait_until_slot = 20, decided_slot = NULL, "
        f"spec = {_with_id('spec', 'j0')} WHERE id = 'j5'",
    )
    after = _restart(store, tmp_path)
    assert after.jobs["j1"].state == pb.JOB_STATE_FAILED
    assert (
        "the stored spec of job 'j1': names 'j0', not the job it is stored as"
        in (after.events["j1"]["why"])
    )
    assert after.jobs["j5"].state == pb.JOB_STATE_EXPIRED
    assert "names 'j0', not the job it is stored as" in after.jobs["j5"].decision.reason
    _others_untouched(store, after, "j1", "j5")
    _same_use(after.use, _use_of({j: after.jobs[j] for j in ("j0", "j2", "j3")}, after.first_slot))


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)  # text in an integer column
def test_an_outage_row_that_does_not_read_back_is_left_out(store: Store, tmp_path: Path) -> None:
    """Before: an outage whose first slot an edit made text raised TypeError out of the
    rebuild: exit 1 at every start."""
    store.execute(
        "INSERT INTO server_outages (server, down_from, up_from, detected_at) "
        "VALUES ('w0', 'yesterday', NULL, '2026-01-01 00:00:00+00:00')"
    )
    after = _restart(store, tmp_path)
    [warned] = _logged(after.log, "an outage row that does not read back is left out")
    assert warned["server"] == "w0" and warned["down_from"] == "None", warned
    _others_untouched(store, after)


@pytest.mark.parametrize("store", ["sqlite", "postgresql"], indirect=True)
def test_the_rows_of_a_job_that_holds_nothing_take_no_capacity(
    store: Store, tmp_path: Path
) -> None:
    """Before: the rebuild placed the stored rows of every job, whatever its state: a job
    an edit marked cancelled (or completed, failed, ...) kept its slots from every
    tenant until they passed, and a rejected job given rows was even re-planned."""
    store.execute(
        "UPDATE jobs SET state = 'cancelled' WHERE id = 'j1'",
        "INSERT INTO allocations (job_id, slot, server, workers, ps) "
        "SELECT 'j4', slot, server, workers, ps FROM allocations WHERE job_id = 'j2'",
    )
    assert _plan(store.before["j1"], 0), "j1 must have held slots, or the test checks nothing"
    after = _restart(store, tmp_path)
    [warned] = _logged(after.log, "allocations of jobs that hold no capacity deleted")
    assert warned["jobs"] == 2 and sorted(warned["first"]) == ["j1 (cancelled)", "j4 (rejected)"]
    assert after.jobs["j1"].state == pb.JOB_STATE_CANCELLED
    assert after.jobs["j4"].state == pb.JOB_STATE_REJECTED
    assert not _plan(after.jobs["j1"], after.first_slot)
    assert not _plan(after.jobs["j4"], after.first_slot)
    _others_untouched(store, after, "j1", "j4")
    holding = {j: after.jobs[j] for j in ("j0", "j2", "j3")}
    _same_use(after.use, _use_of(holding, after.first_slot))


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_a_job_in_a_state_oasis_does_not_know_keeps_its_plan_and_is_named(
    store: Store, tmp_path: Path
) -> None:
    """Before: a job whose state an edit made ``bogus`` kept its slots at a restart (so
    no slot is sold twice) with no line in the log: `oasis jobs` showed it
    `unspecified`, `oasis status` left it out, and `oasis cancel` refused it."""
    store.execute("UPDATE jobs SET state = 'bogus' WHERE id = 'j1'")
    assert _plan(store.before["j1"], 0), "j1 must have held slots, or the test checks nothing"
    after = _restart(store, tmp_path)
    [warned] = _logged(after.log, "jobs in a state oasis does not know keep their plans")
    assert warned["jobs"] == 1 and warned["first"] == ["j1 ('bogus')"], warned
    assert "jobs.state" in warned["hint"], warned
    assert _plan(after.jobs["j1"], after.first_slot) == _plan(store.before["j1"], after.first_slot)
    _others_untouched(store, after, "j1")


@pytest.mark.parametrize("store", ["sqlite", "postgresql"], indirect=True)
def test_a_plan_inflated_past_its_job_fails_that_job_alone(store: Store, tmp_path: Path) -> None:
    """Before: a plan given rows past what its job needs (each count within its chunks)
    was placed as stored, and the rebuild goes in decision order: the first job's
    inflated plan took the capacity of every later job, each then re-planned or
    stranded (failed)."""
    store.execute(
        "INSERT INTO allocations (job_id, slot, server, workers, ps) "
        "SELECT job_id, slot, 'w2', 1, 0 FROM allocations a WHERE job_id = 'j0' "
        "AND NOT EXISTS (SELECT 1 FROM allocations b WHERE b.job_id = 'j0' "
        "AND b.slot = a.slot AND b.server = 'w2') GROUP BY job_id, slot"
    )
    after = _restart(store, tmp_path)
    assert after.jobs["j0"].state == pb.JOB_STATE_FAILED
    why = after.events["j0"]["why"]
    assert "the stored plan of job 'j0'" in why, why
    assert "over the job's" in why, why  # its work, or its chunks in a slot
    _others_untouched(store, after, "j0")


@pytest.mark.parametrize("store", ["sqlite", "postgresql"], indirect=True)
def test_a_sequence_edited_out_of_range_stops_no_submission(store: Store, tmp_path: Path) -> None:
    """The store audit: a job's sequence edited to 2**63 - 1 made every submission of
    every tenant fail (INTERNAL: the next number overflowed), across restarts; on SQLite
    one edited to 1e30 read as none, and every new job was numbered 1 again (UNIQUE
    failed). New jobs are numbered after the others, the same before and after a restart
    (the review: a first fix counted on only from rows below 2**53, while a running
    daemon numbered past it, and after a restart every number was taken again); the
    edited rows stay listed."""
    edits = [
        "UPDATE jobs SET sequence = 9223372036854775807 WHERE id = 'j1'",
        f"UPDATE jobs SET sequence = {2**53 - 2} WHERE id = 'j3'",
    ]
    if store.url.startswith("sqlite"):
        edits.append("UPDATE jobs SET sequence = 1e30 WHERE id = 'j2'")
    store.execute(*edits)
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", store.url, store.epoch)
    spec = json.loads(store.before["j0"].spec.json or "{}")
    for names in (("new-1", "new-2"), ("new-3",)):  # a restart between the two
        daemon = Daemon(config, tmp_path / "oasisd.log").start()
        try:
            with grpc.insecure_channel(daemon.address) as channel:  # as `oasis submit` sends it
                stub = pb_grpc.AdmissionStub(channel)
                for name in names:  # decided (admitted or rejected), not refused
                    job = pb.JobSpec(json=json.dumps({**spec, "id": name}))
                    stub.SubmitJob(pb.SubmitJobRequest(job=job), timeout=60)
            jobs, _, _ = read_back(daemon.address, store.url)
        finally:
            assert daemon.stop() == 0, (tmp_path / "oasisd.log").read_text()
    assert {"new-1", "new-2", "new-3", "j1", "j3"} <= set(jobs)
    numbers = [jobs[n].sequence for n in ("new-1", "new-2", "new-3")]
    assert numbers == [2**53 - 1, 2**53, 2**53 + 1], numbers


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_an_event_numbered_near_2_63_stops_the_start_with_exit_2(
    store: Store, tmp_path: Path
) -> None:
    """The store audit: past an event numbered 2**63 - 1, SQLite numbers new events at
    random, and the execution plane, which publishes the events after the last it
    published, would skip them silently. Only an operator can mend it: exit 2 (systemd
    does not restart it), naming the number."""
    store.execute("UPDATE events SET sequence = 9223372036854775807 WHERE sequence = "
                  "(SELECT max(sequence) FROM events)")  # fmt: skip
    out = _start_refused(store, tmp_path)
    assert out.returncode == 2, out.stderr
    assert "events table holds sequence 9223372036854775807" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_progress_rows_too_large_or_of_the_wrong_shape_are_read_no_further(
    store: Store, tmp_path: Path
) -> None:
    """The store audit: a progress row of 70 MB was read whole at every start (0.38 ->
    1.1 GB; a larger one a crash loop by memory), and `oasis progress` of an ended job
    whose row had the wrong shape answered INTERNAL (AttributeError)."""
    big = '\'{"w0/x": [1, 1], "pad": "\' || hex(zeroblob(4500000)) || \'"}\''
    store.execute(
        f"INSERT INTO job_progress VALUES ('j1', 1.0, 1.0, {big}, '{{}}', '2026-01-01 00:00:00')",
        "INSERT INTO job_progress VALUES ('j4', 10.0, 20.0, '[1,2]', '{\"points\": 5}', "
        "'2026-01-01 00:00:00')",
    )
    broker = 'url = "mqtt://127.0.0.1:1"\n'  # nothing listens: the daemon decides on
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", store.url, store.epoch)
    config.write_text(config.read_text().replace("[cluster]", f"[mqtt]\n{broker}\n[cluster]"))
    log = tmp_path / "oasisd.log"
    daemon = Daemon(config, log).start()
    try:
        for job_id in ("j1", "j4"):
            out = oasis("progress", job_id, "--json", server=daemon.address, check=False)
            assert out.returncode == 0, out.stderr
            assert json.loads(out.stdout).get("minibatches_done", 0) == 0, out.stdout
    finally:
        assert daemon.stop() == 0, log.read_text()
    [skipped] = _logged(log.read_text(), "stored progress ignored")
    assert skipped["job"] == "j1" and "over 8388608" in skipped["why"], skipped
    assert "Traceback" not in log.read_text()


@NEEDS_MOSQUITTO
@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_rows_edited_under_a_running_daemon_are_left_out_of_the_plans_alone(
    store: Store, tmp_path: Path
) -> None:
    """The plane builds each round's plans from the store. Before: a row inserted by hand
    on a server not configured raised KeyError out of every round ("execution plane
    failed; reconnecting", in a loop): no tenant's plan went out again until a restart;
    a count edited past the job's chunks, or a row moved onto a slot whose server other
    jobs fill, went to the agent as it was (past the server's capacity). Now each such
    row is left out and logged; every other row of the slot goes out."""
    broker = Mosquitto()
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", store.url, store.epoch)
    config.write_text(
        config.read_text().replace(
            "[cluster]", f'[mqtt]\nurl = "{broker.url}"\nheartbeat_seconds = 0.3\n\n[cluster]'
        )
    )
    log = tmp_path / "oasisd.log"
    daemon = Daemon(config, log).start()
    try:
        store.execute(
            "INSERT INTO allocations VALUES ('j0', 1, 'ghost', 3, 0)",
            "UPDATE allocations SET workers = 1000 WHERE job_id = 'j0' AND slot = 1 "
            "AND server = 'w1'",
            "INSERT INTO allocations VALUES ('j0', 1, 'p1', 2, 0)",
            # j3's last slot moved onto j0's first: over w0's and w2's GPUs with j0
            "UPDATE allocations SET slot = 1 WHERE job_id = 'j3' AND slot = 10",
        )
        engine = sqlalchemy.create_engine(store.url)
        with engine.connect() as conn:
            stored = conn.scalar(sqlalchemy.text("SELECT spec FROM jobs WHERE id = 'j0'"))
        engine.dispose()
        spec = {**json.loads(stored), "id": "after-the-edit"}
        path = tmp_path / "job.json"
        path.write_text(json.dumps(spec))
        oasis("submit", str(path), server=daemon.address)  # a round of plans
        deadline = time.monotonic() + 30
        while "left out of the plans" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        plans = asyncio.run(_retained_plans(broker.port))
    finally:
        assert daemon.stop() == 0, log.read_text()
        broker.close()
    text = log.read_text()
    assert "execution plane failed" not in text and "Traceback" not in text, text
    logged = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    left_out = {
        (e["job"], e["server"], e["why"])
        for e in logged
        if e["event"] == "stored allocation left out of the plans"
    }
    over = "with the jobs decided before it"
    assert left_out == {
        ("j0", "ghost", "its server is not configured"),
        ("j0", "w1", "workers: must be 0 .. 10 (its chunks), got 1000"),
        ("j0", "p1", "workers: 2 on a ps server"),
        ("j3", "w0", f"over the server's capacity of gpu (8 > 4) {over}"),
        ("j3", "w2", f"over the server's capacity of gpu (10 > 8) {over}"),
    }, left_out
    tasks = {
        server: [(t["job"], t["workers"], t["ps"]) for t in plan["next"]["tasks"]]
        for server, plan in plans.items()
    }
    assert tasks == {
        "w0": [("j0", 4, 0)],
        "w1": [("j3", 2, 0)],  # fits: j0's row there is left out
        "w2": [("j0", 2, 0)],
        "p0": [("j0", 0, 2), ("j3", 0, 2)],
        "p1": [],
    }, tasks


async def _retained_plans(port: int) -> dict[str, Any]:
    """The plan the broker on ``port`` holds retained per server (its ``server``)."""
    got: dict[str, Any] = {}
    async with aiomqtt.Client("127.0.0.1", port) as client:
        await client.subscribe(Topics("oasis").all_plans, qos=0)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2):
                async for message in client.messages:
                    if isinstance(message.payload, bytes) and message.payload:
                        plan = json.loads(message.payload)
                        got[plan["server"]] = plan
    return got


@pytest.mark.parametrize("store", ["postgresql"], indirect=True)
def test_a_writer_epoch_edited_near_2_63_is_not_counted_on_from(
    store: Store, tmp_path: Path
) -> None:
    """Before: a ``writer`` row whose epoch was edited to 2**63 - 1 was counted on from:
    the daemon led in epoch 2**63, which no int64 carries, and every GetLeadership failed
    with ValueError (``oasis status``: "unreachable", "no node named in --server leads").
    Such an epoch now reads as none: the daemon counts on from its events' epoch."""
    store.execute(
        'UPDATE meta SET value = \'{"host": "h", "pid": 1, "epoch": '
        "9223372036854775807}' WHERE key = 'writer'"
    )
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", store.url, store.epoch)
    log = tmp_path / "oasisd.log"
    daemon = Daemon(config, log).start()
    try:
        with grpc.insecure_channel(daemon.address) as channel:
            answer = pb_grpc.HighAvailabilityStub(channel).GetLeadership(
                pb.GetLeadershipRequest(), timeout=10
            )
    finally:
        assert daemon.stop() == 0, log.read_text()
    assert answer.role == "leader" and 0 < answer.epoch < 1 << 62, answer
    assert "Traceback" not in log.read_text()


def test_an_event_edited_to_megabytes_is_shown_with_a_note(store: Store, tmp_path: Path) -> None:
    """An event whose detail was edited to 20 MB made every ``oasis watch --from`` before
    it end there (the message over gRPC's 16 MiB: RESOURCE_EXHAUSTED), for good. Now its
    detail is replaced by a note, and the events after it follow; the kind (SQLite keeps
    any length) is cut to its column's 32 characters."""
    if store.url.startswith("postgresql"):
        store.execute("UPDATE events SET detail = json_build_object('x', repeat('y', 20000000)) "
                      "WHERE sequence = 1")  # fmt: skip
    else:
        store.execute(
            "UPDATE events SET detail = '{\"x\": \"' || hex(zeroblob(10000000)) || '\"}', "
            "kind = 'decided' || hex(zeroblob(100)) WHERE sequence = 1"
        )
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", store.url, store.epoch)
    daemon = Daemon(config, tmp_path / "oasisd.log").start()
    last = newest_event(store.url)
    try:
        with grpc.insecure_channel(daemon.address) as channel:
            events = events_through(pb_grpc.AdmissionStub(channel), last)
    finally:
        assert daemon.stop() == 0
    assert [e.sequence for e in events] == list(range(1, last + 1))
    first = events[0]
    assert "20000009 characters as JSON, over 65536" in json.loads(first.detail)["unreadable"]
    assert 0 < len(first.kind) <= 32
    assert all("unreadable" not in json.loads(e.detail) for e in events[1:])


def _pages(address: str) -> list[tuple[list[str], str]]:
    """Each ``ListJobs`` page from the start, its job ids and next token (at most 10)."""
    with grpc.insecure_channel(address) as channel:
        pages = job_pages(pb_grpc.AdmissionStub(channel), most=10)
    return [([j.spec.id for j in page.jobs], page.next_page_token) for page in pages]


def _listed_in_pages_of_four(
    store: Store, tmp_path: Path, limits: str = ""
) -> tuple[list[Any], str, list[Any]]:
    """The pages of ``ListJobs`` (4 jobs a page, and ``limits`` more), the daemon's log,
    and ``oasis jobs``."""
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", store.url, store.epoch,
                          f"\n[limits]\nmax_page_jobs = 4\n{limits}")  # fmt: skip
    log = tmp_path / "oasisd.log"
    daemon = Daemon(config, log).start()
    try:
        pages = _pages(daemon.address)
        listed = json.loads(oasis("jobs", "--json", server=daemon.address).stdout)["jobs"]
    finally:
        assert daemon.stop() == 0
    return pages, log.read_text(), listed


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)  # PostgreSQL types its columns
def test_a_sequence_edited_to_text_or_a_real_is_listed_once(store: Store, tmp_path: Path) -> None:
    """SQLite sorts an edit's text or real after every job the daemon numbered, and reads
    it as no integer: a page that ended at such a row took its sequence, read as 0, for
    the next token, and ``oasis jobs`` asked for the first page again, for good. Now a
    page ends before the first such row, they come on a last page of their own, and
    each is named in the log."""
    store.execute("UPDATE jobs SET sequence = 1e30 WHERE id = 'j1'",
                  "UPDATE jobs SET sequence = 'abc' WHERE id = 'j2'",
                  "UPDATE jobs SET sequence = 1e31 WHERE id = 'j3'",
                  "UPDATE jobs SET sequence = 'xyz' WHERE id = 'j4'")  # fmt: skip
    pages, log, listed = _listed_in_pages_of_four(store, tmp_path)
    assert pages == [(["j0", "j5"], "6"), (["j1", "j3", "j2", "j4"], "")], pages
    assert sorted(j["id"] for j in listed) == sorted(store.before)
    warned = {e["job"]: e["why"] for e in map(json.loads, log.splitlines())
              if e.get("event", "").startswith("stored job row does not read back")}  # fmt: skip
    for edited in ("j1", "j2", "j3", "j4"):
        assert "sequence: not an integer" in warned[edited], warned


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)  # one store is enough
def test_a_sequence_past_any_page_token_is_listed_once(store: Store, tmp_path: Path) -> None:
    """A sequence edited past 18 digits sorts after every job the daemon numbered, and a
    token naming it (19 digits) is refused, so no page ends at it but the last."""
    store.execute(*(f"UPDATE jobs SET sequence = {10**18 + i} WHERE id = 'j{i}'"
                    for i in (1, 2, 3, 4)))  # fmt: skip
    pages, log, listed = _listed_in_pages_of_four(store, tmp_path)
    assert pages == [(["j0", "j5"], "6"), (["j1", "j2", "j3", "j4"], "")], pages
    assert sorted(j["id"] for j in listed) == sorted(store.before)
    assert "sequence: 1000000000000000001, over any a page token holds" in log


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_a_page_cut_by_bytes_at_an_edited_sequence_is_the_last(
    store: Store, tmp_path: Path
) -> None:
    """A page cut by ``max_page_bytes`` at a row whose sequence an edit made unreadable
    has no next token (none names the rows after it): before, its sequence read as 0 was
    the token, which reads as the start, and the listing began again, for good. The
    rows after it on that page go unlisted, as they would be past a page of such rows."""
    store.execute("UPDATE jobs SET sequence = 'abc' WHERE id = 'j1'",
                  "UPDATE jobs SET sequence = 'xyz' WHERE id = 'j2'")  # fmt: skip
    pages, _, listed = _listed_in_pages_of_four(store, tmp_path, "max_page_bytes = 1\n")
    assert [ids for ids, _ in pages] == [["j0"], ["j3"], ["j4"], ["j5"], ["j1"]], pages
    assert pages[-1][1] == "" and len(listed) == 5
