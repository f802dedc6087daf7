"""A PostgreSQL that answers but will not let the daemon's role write, as a DBA can make it
while the daemon runs: a privilege revoked, the database made read-only, the role's
``search_path`` moved to another schema. Submissions get ``UNAVAILABLE`` naming what the
DBA does (not ``INTERNAL``, which clients do not retry, and a traceback in the log), what
can still be read is served, and once the DBA undoes it the same submission is decided
and stored, without a restart. Start-up on a role that may not create the tables says
what to grant.

The daemon runs as a role of its own (not the superuser the test cluster's ``oasis`` is)
owning its database, as ``README`` ("Install on a head node") sets it up.
"""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.load_test import check_ledger, read_store, store_use
from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.store import Database, migrate
from tests.servers import CLUSTER_TOML, ROOT, Daemon, Postgres, json_log, write_config
from tests.test_daemon_e2e import job

RECOVERY_SECONDS = 30.0  # bound on the retries once the DBA undid it (a rebuild, a reconnect)


@dataclass
class RoleStore:
    """A login role (not a superuser) and a database it owns, on the test cluster."""

    role: str
    database: str
    port: int

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{self.role}@127.0.0.1:{self.port}/{self.database}"

    def admin(self, database: str | None = None) -> psycopg.Connection[tuple[object, ...]]:
        """A superuser connection (autocommit) to the store's database, or ``database``."""
        dsn = f"host=127.0.0.1 port={self.port} user=oasis dbname={database or self.database}"
        return psycopg.connect(dsn, autocommit=True)

    def impose(self, statements: str) -> None:
        """Run a DBA's ``"; "``-separated ``statements``, then end the role's sessions so
        that they take effect."""
        with self.admin() as admin:
            for statement in statements.split("; "):
                admin.execute(statement)
        self.end_sessions()

    def lift(self, statement: str) -> None:
        """Undo a fault with ``statement`` (in a session that may write, whatever the
        database's default), then end the role's sessions so that it takes effect."""
        with self.admin() as admin:
            admin.execute("SET default_transaction_read_only = off")  # this session's
            admin.execute(statement)
        self.end_sessions()

    def end_sessions(self) -> None:
        """End the role's sessions, as a DBA does so that a setting takes effect."""
        with self.admin("postgres") as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (self.role,),
            )


@pytest.fixture
def role_store(postgres: Postgres) -> Iterator[RoleStore]:
    name = f"r_{uuid.uuid4().hex[:10]}"
    store = RoleStore(name, name, postgres.port)
    with store.admin("postgres") as conn:
        conn.execute(f'CREATE ROLE "{name}" LOGIN')
        conn.execute(f'CREATE DATABASE "{name}" OWNER "{name}"')
    yield store
    with store.admin("postgres") as conn:
        conn.execute(f'ALTER ROLE "{name}" RESET ALL')
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'DROP ROLE IF EXISTS "{name}"')


def _start(config: Path) -> subprocess.CompletedProcess[str]:
    """``oasisd --config config`` until it exits (it is expected to, at start)."""
    return subprocess.run(
        [sys.executable, "-m", "controller.daemon", "--config", str(config)],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
    )  # fmt: skip


def _last_line(out: subprocess.CompletedProcess[str], code: int) -> str:
    """The last line ``oasisd`` wrote to stderr before it exited with ``code``."""
    assert out.returncode == code, out.stderr
    return out.stderr.strip().splitlines()[-1]


def _submit(stub: pb_grpc.AdmissionStub, job_id: str) -> pb.SubmitJobResponse:
    reply: pb.SubmitJobResponse = stub.SubmitJob(
        pb.SubmitJobRequest(job=spec_to_proto(job(job_id))), timeout=30
    )
    return reply


def _refused(stub: pb_grpc.AdmissionStub, job_id: str, words: str) -> str:
    """Submit ``job_id`` until it is refused with ``words`` in its details (the first
    calls may meet the ended sessions); every refusal must be UNAVAILABLE."""
    deadline = time.monotonic() + RECOVERY_SECONDS
    while True:
        with pytest.raises(grpc.RpcError) as refused:
            _submit(stub, job_id)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()
        details = refused.value.details() or ""
        if words in details:
            return details
        assert time.monotonic() < deadline, details
        time.sleep(0.2)


def _commits_failed(log: Path) -> int:
    """The commits the daemon's log says failed so far."""
    return sum(e["event"].startswith("commit failed") for e in json_log(log))


def _decided(stub: pb_grpc.AdmissionStub, job_id: str) -> pb.SubmitJobResponse:
    """Submit ``job_id`` until it is decided, retrying UNAVAILABLE only."""
    deadline = time.monotonic() + RECOVERY_SECONDS
    while True:
        try:
            return _submit(stub, job_id)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err.details()
            assert time.monotonic() < deadline, err.details()
            time.sleep(0.2)


def _ledger_is_the_store(address: str, url: str) -> None:
    """The daemon's utilisation and servers' use come to be the store's allocations,
    within :data:`RECOVERY_SECONDS`."""
    servers = tomllib.loads(CLUSTER_TOML)["cluster"]["servers"]
    deadline = time.monotonic() + RECOVERY_SECONDS
    while True:
        problems = check_ledger(address, store_use(read_store(url)), servers)
        if not problems:
            return
        assert time.monotonic() < deadline, problems[:5]
        time.sleep(0.2)


# (what the DBA does, in the store's database; what undoes it; what the refusal says)
FAULTS = {
    "privilege_revoked": (
        "REVOKE INSERT, UPDATE ON ALL TABLES IN SCHEMA public FROM {role}",
        "GRANT INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO {role}",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}",
    ),
    "database_read_only": (
        "ALTER DATABASE {database} SET default_transaction_read_only = on",
        "ALTER DATABASE {database} SET default_transaction_read_only = off",
        "default_transaction_read_only",
    ),
    "search_path_moved": (
        "CREATE SCHEMA elsewhere; ALTER ROLE {role} SET search_path = elsewhere",
        "ALTER ROLE {role} RESET search_path",
        "search_path",
    ),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_store_that_refuses_the_role_is_unavailable_naming_the_remedy_then_recovers(
    fault: str, role_store: RoleStore, tmp_path: Path
) -> None:
    do, undo, words = (s.format(role=role_store.role, database=role_store.database)
                       for s in FAULTS[fault])  # fmt: skip
    log = tmp_path / "d.log"
    daemon = Daemon(write_config(tmp_path / "d.toml", tmp_path / "data", role_store.url), log)
    daemon.start()
    try:
        with grpc.insecure_channel(daemon.address) as channel:
            stub = pb_grpc.AdmissionStub(channel)
            answers = {f"before{i}": _submit(stub, f"before{i}") for i in range(3)}

            role_store.impose(do)
            details = _refused(stub, "during", words)
            assert role_store.role in details
            # what was stored is still read (not with the tables out of search_path)
            if fault != "search_path_moved":
                listed = stub.ListJobs(pb.ListJobsRequest(), timeout=30)
                assert {j.spec.id for j in listed.jobs} >= set(answers)

            role_store.lift(undo)
            # no call comes: the ledger still drops the decisions the store refused
            # (before, reads showed them until the next submission or slot boundary)
            _ledger_is_the_store(daemon.address, role_store.url)
            answers["during"] = _decided(stub, "during")
            answers["after"] = _decided(stub, "after")
    finally:
        assert daemon.stop() == 0
    text = log.read_text()
    assert '"internal error"' not in text, text
    # the journal says it too (the probe's SELECT 1 went through: no "store unreachable")
    refusals = [e for e in json_log(log) if e["event"] == "the store refuses this daemon's role"]
    assert refusals and words in refusals[0]["reason"], text
    with role_store.admin() as admin:
        stored = {str(i): str(st) for i, st in admin.execute("SELECT id, state FROM jobs")}
    for job_id, answer in answers.items():
        assert answer.job.decision.admitted, job_id  # the small test job fits
        assert stored.get(job_id) in ("admitted", "running"), (job_id, stored)


def test_a_role_that_may_not_create_the_tables_is_told_what_to_grant(
    role_store: RoleStore, tmp_path: Path
) -> None:
    """The DBA created the role with CONNECT only, in a database another role owns."""
    with role_store.admin("postgres") as conn:
        other = f"{role_store.database}_o"
        conn.execute(f'CREATE DATABASE "{other}"')  # owned by the superuser
    try:
        url = role_store.url.rsplit("/", 1)[0] + f"/{other}"
        config = write_config(tmp_path / "d.toml", tmp_path / "data", url)
        out = _start(config)
    finally:
        with role_store.admin("postgres") as conn:
            conn.execute(f'DROP DATABASE "{other}" WITH (FORCE)')
    last = _last_line(out, 1)
    assert last.startswith("oasisd: cannot open the store postgresql+psycopg://"), last
    assert "permission denied for schema public" in last, last
    assert f"ALTER SCHEMA public OWNER TO {role_store.role}" in last, last
    assert f"GRANT USAGE, CREATE ON SCHEMA public TO {role_store.role}" in last, last


def test_a_search_path_moved_between_two_starts_begins_no_empty_store_beside_the_old(
    role_store: RoleStore, tmp_path: Path
) -> None:
    """Before, the second start created an empty store in the new schema and decided on
    it, blind to the jobs admitted in public."""
    epoch = time.time()
    config = write_config(tmp_path / "d.toml", tmp_path / "data", role_store.url, epoch=epoch)
    daemon = Daemon(config, tmp_path / "d.log").start()
    try:
        with grpc.insecure_channel(daemon.address) as channel:
            assert _submit(pb_grpc.AdmissionStub(channel), "kept").job.decision.admitted
    finally:
        assert daemon.stop() == 0
    role = role_store.role
    with role_store.admin() as admin:
        admin.execute(f'CREATE SCHEMA elsewhere AUTHORIZATION "{role}"')
        admin.execute(f'ALTER ROLE "{role}" SET search_path = elsewhere')

    out = _start(config)
    last = _last_line(out, 2)  # not restarted: a DBA's to mend
    assert last.startswith("oasisd: cannot use the store postgresql+psycopg://"), last
    assert "schema public of database" in last, last
    assert f"ALTER ROLE {role} RESET search_path" in last, last
    with role_store.admin() as admin:  # nothing was created in the other schema
        created = admin.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'elsewhere'"
        ).fetchone()
    assert created == (0,)

    # named in store_url, the schema is the operator's choice: a new store begins there
    chosen = role_store.url + "?options=-csearch_path%3Delsewhere"
    config = write_config(tmp_path / "e.toml", tmp_path / "data", chosen, epoch=epoch)
    daemon = Daemon(config, tmp_path / "e.log").start()
    assert daemon.stop() == 0

    # search_path set back: the first store, with its job
    with role_store.admin() as admin:
        admin.execute(f'ALTER ROLE "{role}" RESET search_path')
    config = write_config(tmp_path / "d.toml", tmp_path / "data", role_store.url, epoch=epoch)
    daemon = Daemon(config, tmp_path / "f.log").start()
    try:
        with grpc.insecure_channel(daemon.address) as channel:
            got = pb_grpc.AdmissionStub(channel).GetJob(pb.GetJobRequest(id="kept"), timeout=30)
        assert got.job.decision.admitted
    finally:
        assert daemon.stop() == 0


def test_a_start_behind_a_dba_s_table_lock_names_the_session_holding_it(
    role_store: RoleStore, tmp_path: Path
) -> None:
    """A LOCK TABLE left open in psql (or a VACUUM FULL) while the daemon starts: the
    start fails after daemon.store_timeout, as before, but its line names that setting
    and the session, where it said only "canceling statement due to lock timeout"."""
    config = write_config(tmp_path / "d.toml", tmp_path / "data", role_store.url,
                          extra="store_timeout = 1")  # fmt: skip
    store = Database(role_store.url)  # the store exists: its tables, made by the role
    try:
        migrate(store)
    finally:
        store.dispose()
    with role_store.admin() as admin:
        admin.execute("BEGIN")
        admin.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        pid = admin.info.backend_pid
        out = _start(config)
        admin.execute("ROLLBACK")
    last = _last_line(out, 1)
    assert last.startswith("oasisd: cannot open the store postgresql+psycopg://"), last
    assert "canceling statement due to lock timeout" in last, last
    assert "daemon.store_timeout (1 s)" in last, last
    assert f"session {pid} (user oasis) holds AccessExclusiveLock on jobs" in last, last
    assert f"SELECT pg_terminate_backend({pid})" in last, last


def test_clients_retrying_a_refused_commit_cost_one_rebuild_not_one_each(
    role_store: RoleStore, tmp_path: Path
) -> None:
    """A refusal that lets the ledger's rebuild read the store but fails every commit
    (here INSERT on ``jobs`` revoked; PostgreSQL's disk full does the same): each retried
    submission was decided, failed at its commit and cost a rebuild of the ledger in the
    thread that decides (22 in 6 s in the audit, seconds each at 10,000 servers) while
    every read waited. After one, decisions are refused at once for
    ``WRITE_PAUSE_SECONDS``, then one is tried again."""
    log = tmp_path / "d.log"
    daemon = Daemon(write_config(tmp_path / "d.toml", tmp_path / "data", role_store.url), log)
    daemon.start()
    try:
        with grpc.insecure_channel(daemon.address) as channel:
            stub = pb_grpc.AdmissionStub(channel)
            _submit(stub, "before")
            with role_store.admin() as admin:
                admin.execute(f"REVOKE INSERT ON jobs FROM {role_store.role}")
            for i in range(10):
                with pytest.raises(grpc.RpcError) as refused:
                    _submit(stub, f"retry{i}")
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "lacks a privilege" in (refused.value.details() or "")
            assert _commits_failed(log) == 1, [e["event"] for e in json_log(log)]
            with role_store.admin() as admin:
                admin.execute(f"GRANT INSERT ON jobs TO {role_store.role}")
            assert _decided(stub, "after").job.decision.admitted
    finally:
        assert daemon.stop() == 0


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
HEALTH_SECONDS = 10.0  # bound on the store watch's finding (it probes every second)
# what a DBA does and undoes (in the store's database) for the health test: the insert
# on jobs alone, which every read still passes, and the three of FAULTS
HEALTH_FAULTS = {
    "insert_on_jobs_revoked": (
        "REVOKE INSERT ON jobs FROM {role}",
        "GRANT INSERT ON jobs TO {role}",
    ),
    **{name: (do, undo) for name, (do, undo, _words) in FAULTS.items()},
}


def _health(channel: grpc.Channel) -> dict[str, int]:
    """Each service's gRPC health (``""``: the daemon as a whole)."""
    health = health_pb2_grpc.HealthStub(channel)
    return {
        name: health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10).status
        for name in ("", "oasis.v1.Admission", "oasis.v1.Cluster")
    }


def _health_becomes(channel: grpc.Channel, admission: int, reads: bool = True) -> None:
    """Wait until ``oasis.v1.Admission`` reports ``admission``; with ``reads``, the reads
    (``""`` and ``oasis.v1.Cluster``) must be SERVING throughout."""
    deadline = time.monotonic() + HEALTH_SECONDS
    while True:
        status = _health(channel)
        if reads:
            assert status[""] == SERVING and status["oasis.v1.Cluster"] == SERVING, status
        if status["oasis.v1.Admission"] == admission:
            return
        assert time.monotonic() < deadline, status
        time.sleep(0.2)


@pytest.mark.parametrize("fault", sorted(HEALTH_FAULTS))
def test_the_admission_service_is_not_serving_while_the_store_refuses_writes(
    fault: str, role_store: RoleStore, tmp_path: Path
) -> None:
    """Before, health said SERVING for every service throughout (the probe's SELECT 1
    went through), so a load balancer, or HA's clients, kept sending every write to a
    daemon that could commit none. Now the Admission service turns NOT_SERVING without
    a submission having to fail first (the store watch's dry writes), reads stay
    SERVING, and once the DBA undoes it the daemon is SERVING again by itself and
    admits."""
    do, undo = (s.format(role=role_store.role, database=role_store.database)
                for s in HEALTH_FAULTS[fault])  # fmt: skip
    log = tmp_path / "d.log"
    daemon = Daemon(write_config(tmp_path / "d.toml", tmp_path / "data", role_store.url), log)
    daemon.start()
    try:
        with grpc.insecure_channel(daemon.address) as channel:
            stub = pb_grpc.AdmissionStub(channel)
            assert _submit(stub, "before").job.decision.admitted
            _health_becomes(channel, SERVING)

            role_store.impose(do)
            # ending the sessions ended the writer lock's too, and with the tables out of
            # sight it cannot be taken again: the whole daemon is NOT_SERVING then, as
            # for a lock lost in an outage (controller/store/watch.py)
            reads = fault != "search_path_moved"
            _health_becomes(channel, NOT_SERVING, reads)  # no submission was tried
            cluster = pb_grpc.ClusterStub(channel)  # reads are served
            assert cluster.GetClusterInfo(pb.GetClusterInfoRequest(), timeout=10).window > 0

            role_store.lift(undo)
            _health_becomes(channel, SERVING, reads)  # by itself: no submission came
            assert _decided(stub, "after").job.decision.admitted
            assert set(_health(channel).values()) == {SERVING}
    finally:
        assert daemon.stop() == 0
    if reads:  # the journal says why (with the lock not taken again: "store unreachable")
        events = [e["event"] for e in json_log(log)]
        assert "the store refuses writes: admission not serving" in events, events
        assert "the store takes writes again: admission serving" in events, events


def test_a_store_url_naming_no_role_or_database_exits_2_saying_what_to_create(
    postgres: Postgres, tmp_path: Path
) -> None:
    """Before: exit 1 with PostgreSQL's FATAL line, which systemd's unit restarts every
    2 s for ever (``RestartPreventExitStatus=2`` is for what only an operator mends)."""
    name = f"r_{uuid.uuid4().hex[:10]}"
    base = f"postgresql+psycopg://{{}}@127.0.0.1:{postgres.port}/{{}}"
    for url, words in (
        (base.format(name, "postgres"), f"there is no role {name} on that server (FATAL: "
         f'role "{name}" does not exist): a DBA creates it (CREATE ROLE {name} LOGIN), or '
         "daemon.store_url names another user"),
        (base.format("oasis", name), f"there is no database {name} on that server (FATAL: "
         f'database "{name}" does not exist): a DBA creates it (CREATE DATABASE {name} '
         "OWNER oasis), or daemon.store_url names another"),
    ):  # fmt: skip
        last = _last_line(_start(write_config(tmp_path / "d.toml", tmp_path / "data", url)), 2)
        assert last == f"oasisd: cannot open the store {url}: {words}", last


def test_a_refused_password_or_host_is_said_with_where_to_mend_it() -> None:
    """PostgreSQL's words for a wrong password and for a host pg_hba.conf does not
    admit (the test cluster trusts every local connection, so neither can be made
    here), and a refusal that passes by itself, which is not one of them."""
    from sqlalchemy.engine import make_url

    from controller.store.refusals import login_refusal

    url = make_url("postgresql+psycopg://oasis:secret@db.example:5432/oasis")
    failed = 'connection to server at "db.example" (10.0.0.9), port 5432 failed: '
    said = login_refusal(failed + 'FATAL:  password authentication failed for user "oasis"', url)
    assert said == (
        "PostgreSQL refused role oasis's password (FATAL: password authentication failed "
        'for user "oasis"): set the right one where libpq reads it (the oasis user\'s '
        "~/.pgpass, PGPASSWORD in the unit's environment), or in daemon.store_url"
    )
    hba = 'no pg_hba.conf entry for host "10.0.0.5", user "oasis", database "oasis", no encryption'
    said = login_refusal(failed + "FATAL:  " + hba, url)
    assert said is not None and said.startswith(
        "PostgreSQL's pg_hba.conf admits no connection of role oasis to database oasis "
        f"from this host (FATAL: {hba}): a DBA adds a line"
    ), said
    assert "secret" not in said
    said = login_refusal(failed + 'FATAL:  role "oasis" is not permitted to log in', url)
    assert said == ('role oasis may not log in (FATAL: role "oasis" is not permitted to log '
                    "in): a DBA runs ALTER ROLE oasis LOGIN, or daemon.store_url names "
                    "another user")  # fmt: skip
    for passing in ("the database system is starting up", "sorry, too many clients already",
                    "Connection refused"):  # fmt: skip
        assert login_refusal(failed + "FATAL:  " + passing, url) is None


class _RefusedError(Exception):
    """A driver error as psycopg raises it: its SQLSTATE and PostgreSQL's primary message."""

    def __init__(self, sqlstate: str, primary: str) -> None:
        super().__init__(f"{primary}\nDETAIL: more")
        self.sqlstate = sqlstate
        self.diag = type("Diag", (), {"message_primary": primary})()


def test_each_refusal_names_its_remedy_and_reads_as_one_when_passed_back() -> None:
    """Every SQLSTATE a DBA's change causes is worded (the role, the database, the
    setting), never with the URL's password; and each text, as the commit process passes
    it back, reads as a refusal (UNAVAILABLE, writes paused), not as a bug (INTERNAL)."""
    from sqlalchemy.engine import make_url

    from controller.store.refusals import REFUSED_SQLSTATES, is_refusal, refusal

    url = make_url("postgresql+psycopg://oasis:secret@db.example:5432/ledger")
    cases = [
        ("42501", "permission denied for table jobs",
         "the store's role oasis lacks a privilege (permission denied for table jobs): a DBA "
         "gives it back, e.g. GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES"),
        ("42501", "permission denied for schema public",
         "the store's role oasis may not create or use its tables (permission denied for "
         "schema public): PostgreSQL 15 and later let only the owner of schema public"),
        ("25006", "cannot execute INSERT in a read-only transaction",
         "the store is read-only (cannot execute INSERT in a read-only transaction): database "
         "ledger or role oasis has default_transaction_read_only on"),
        ("42P01", 'relation "jobs" does not exist',
         "the store's tables are not in the schemas role oasis searches (relation \"jobs\" "
         "does not exist): the search_path of role oasis or of database ledger changed"),
        ("3F000", "no schema has been selected to create in",
         "the store's tables are not in the schemas role oasis searches (no schema has been "
         "selected to create in)"),
    ]  # fmt: skip
    assert {c[0] for c in cases} == REFUSED_SQLSTATES
    for sqlstate, primary, words in cases:
        said = refusal(_RefusedError(sqlstate, primary), url)
        assert said is not None and said.startswith(words), said
        assert "secret" not in said and "DETAIL" not in said
        assert is_refusal(said), said
    assert refusal(_RefusedError("40001", "could not serialize access"), url) is None
    assert not is_refusal("could not serialize access due to concurrent update")


def test_a_lock_wait_names_each_session_holding_the_tables_and_how_to_end_it() -> None:
    from datetime import datetime
    from typing import Any, cast

    from controller.store.refusals import lock_waited

    rows = [(4242, "dba", "psql", datetime(2026, 1, 2, 3, 4, 5), "jobs", "AccessExclusiveLock"),
            (4243, "other", "", None, "events", "ExclusiveLock")]  # fmt: skip

    class Conn:
        def __enter__(self) -> Conn:
            return self

        def __exit__(self, *_: object) -> None:
            return None

        def execute(self, _query: object) -> Any:
            return type("Result", (), {"all": lambda _self: rows})()

    engine = cast(Any, type("Engine", (), {"connect": lambda _self: Conn()})())
    said = lock_waited(_RefusedError("55P03", "canceling statement due to lock timeout"), engine, 5)
    assert said == (
        "canceling statement due to lock timeout: another session held a lock on the "
        "store's tables longer than daemon.store_timeout (5 s): session 4242 (user dba, "
        "application 'psql', in a transaction since 2026-01-02T03:04:05Z) holds "
        "AccessExclusiveLock on jobs; session 4243 (user other) holds ExclusiveLock on "
        "events. End it (COMMIT or ROLLBACK in that session, or SELECT "
        "pg_terminate_backend(4242) or SELECT pg_terminate_backend(4243)), or let a VACUUM "
        "FULL finish"
    )
    assert lock_waited(_RefusedError("42501", "permission denied"), engine, 5) is None
