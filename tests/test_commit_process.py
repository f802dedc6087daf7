"""The commit process (controller/store/commit_process.py): the daemon's writer hands each
batch to a child process. A child killed, stopped or failing costs at most the callers of
the batch it held (UNAVAILABLE, nothing of it stored, the ledger rebuilt from the store),
and the next batch goes to a new child; the child never outlives the daemon."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controller.admission import AdmissionController
from controller.clock import FakeClock
from controller.metrics import Metrics
from controller.store import StoreUnavailableError
from controller.store.commit_process import CommitProcess, CommitProcessError, child_command
from controller.store.decisions import DecisionPayload
from controller.store.writer_lock import FencedError
from tests.servers import ROOT, Daemon, commit_processes, ended, oasis, write_config
from tests.test_group_commit import StoreLock, _db_file, _until
from tests.test_pending import controller, small


@pytest.fixture
def c(tmp_path: Path) -> Iterator[AdmissionController]:
    ctl = controller(tmp_path, FakeClock(1_000_000.0), commit_process=True)
    try:
        yield ctl
    finally:
        ctl.close()


def _committer(c: AdmissionController) -> CommitProcess:
    assert c._committer is not None
    return c._committer


def _child(c: AdmissionController) -> int:
    """The running child's pid, once the writer thread started it (it answered ready)."""
    deadline = time.monotonic() + 30
    while _committer(c).pid is None or _committer(c).starts < 1:
        assert time.monotonic() < deadline, "no commit process started"
        time.sleep(0.02)
    pid = _committer(c).pid
    assert pid is not None
    return pid


def test_decisions_commit_through_the_child_and_read_back(c: AdmissionController) -> None:
    pid = _child(c)
    views = [asyncio.run(c.submit(small(f"j{i}"))) for i in range(3)]
    assert [v.sequence for v in views] == [1, 2, 3]
    for view in views:
        assert c._get_sync(view.id) == view
    assert _committer(c).pid == pid and _committer(c).starts == 1
    assert c._writer.committed == 3


def test_a_child_killed_during_a_batch_fails_its_callers_and_the_next_goes_to_another(
    c: AdmissionController,
) -> None:
    """The child is killed while it waits for the store's write lock: its batch's callers
    get UNAVAILABLE, nothing of it is stored, and the ledger is rebuilt before the next
    decision, which a new child commits."""
    first = _child(c)

    async def scenario() -> list[Any]:
        lock = StoreLock(_db_file(c))
        try:
            tasks = [asyncio.ensure_future(c.submit(small(i))) for i in ("k0", "k1")]
            await _until(lambda: c._writer.queued == 2 and "k1" in c._uncommitted)
            await asyncio.sleep(0.2)  # the batch is in the child, waiting for the lock
            os.kill(first, signal.SIGKILL)
            return list(await asyncio.gather(*tasks, return_exceptions=True))
        finally:
            lock.release()

    results = asyncio.run(scenario())
    assert all(isinstance(r, StoreUnavailableError) for r in results), results
    assert "commit process failed" in str(results[0])
    after = asyncio.run(c.submit(small("after")))
    assert after.state == "admitted" and not after.duplicate
    assert _committer(c).pid not in (None, first) and _committer(c).starts == 2
    assert c.ledger is not None and "k0" not in c.ledger and "k1" not in c.ledger
    for job_id in ("k0", "k1"):
        with pytest.raises(Exception, match="no job"):
            c._get_sync(job_id)


def test_a_child_killed_while_idle_is_replaced_without_failing_a_decision(
    c: AdmissionController,
) -> None:
    first = _child(c)
    os.kill(first, signal.SIGKILL)
    assert ended(first)
    view = asyncio.run(c.submit(small("next")))
    assert view.state == "admitted" and not c._stale
    assert _committer(c).pid not in (None, first) and _committer(c).starts == 2


def test_sigterm_and_sigint_leave_the_child_writing(c: AdmissionController) -> None:
    """systemd and a terminal signal the whole group at a stop: the daemon then drains
    its last batches through the child, so the child must not end on them."""
    pid = _child(c)
    os.kill(pid, signal.SIGTERM)
    os.kill(pid, signal.SIGINT)
    time.sleep(0.2)
    assert asyncio.run(c.submit(small("still"))).state == "admitted"
    assert _committer(c).pid == pid


def test_a_child_that_stops_answering_is_killed_and_its_batch_fails(
    c: AdmissionController,
) -> None:
    pid = _child(c)
    _committer(c).answer_seconds = 1.0
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="did not answer its batch within 1 s"):
        asyncio.run(c.submit(small("stuck")))
    assert time.monotonic() - started < 10
    assert ended(pid)
    assert asyncio.run(c.submit(small("then"))).state == "admitted"


def _payloads(c: AdmissionController, job_id: str) -> list[DecisionPayload]:
    """The rows deciding ``small(job_id)`` would commit, taken from the writer's queue
    (not committed; the ledger is rebuilt from the store afterwards). Once the child is
    ready: the tests then use it from their own thread, the writer thread being idle."""
    _child(c)
    taken: list[Any] = []
    submit = c._writer.submit

    def keep(ws: Any) -> Any:
        taken.append(ws)
        ws.future.set_result(None)
        return ws.future

    c._writer.submit = keep  # type: ignore[method-assign]
    try:
        c.between_decisions(lambda: c._submit_sync(small(job_id), None, None))
    finally:
        c._writer.submit = submit  # type: ignore[method-assign]
        c._stale = True
    return [ws.rows.payload() for ws in taken]


def test_a_batch_the_store_refuses_fails_with_the_childs_traceback_and_it_goes_on(
    c: AdmissionController,
) -> None:
    pid = _child(c)
    payload = _payloads(c, "dup")
    with pytest.raises(CommitProcessError, match="IntegrityError"):
        _committer(c).commit(payload * 2, None, None, None)  # one job id twice
    written = _committer(c).commit(payload, None, None, None)
    assert written.first_sequence == 1 and len(written.events) == 1
    assert _committer(c).pid == pid


def test_a_fenced_batch_raises_fenced_error_with_the_recorded_holder(
    c: AdmissionController,
) -> None:
    payload = _payloads(c, "fenced")
    with pytest.raises(FencedError) as err:
        _committer(c).commit(payload, None, 7, None)  # no holder is recorded: not epoch 7
    assert err.value.mine == 7 and err.value.holder is None
    assert "led in epoch 7" in str(err.value)
    with pytest.raises(Exception, match="no job"):
        c._get_sync("fenced")


def test_the_child_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import structlog, time
        from controller.store import Database
        from controller.store.commit_process import CommitProcess
        p = CommitProcess(Database("sqlite:///{tmp_path / "s.db"}"),
                          structlog.wrap_logger(structlog.ReturnLogger()))
        p.start()
        print(p.pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert not ended(child, 0.2)
        parent.kill()
        parent.wait(10)
        assert ended(child), "the commit process outlived its daemon"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()


def test_the_daemon_writes_through_a_child_that_a_kill_9_takes_with_it(tmp_path: Path) -> None:
    config = write_config(tmp_path / "d.toml", tmp_path / "data")
    daemon = Daemon(config, tmp_path / "d.log").start()
    child = 0
    try:
        assert daemon.proc is not None
        deadline = time.monotonic() + 30
        while not (children := commit_processes(daemon.proc.pid)):
            assert time.monotonic() < deadline, "the daemon started no commit process"
            time.sleep(0.05)
        [child] = children
        job = tmp_path / "job.json"
        job.write_text(json.dumps(small("one")))
        out = oasis("submit", str(job), "--json", server=daemon.address, check=False)
        assert out.returncode in (0, 3), out.stderr
    finally:
        daemon.kill9()
    assert ended(child), "the commit process outlived its daemon"
    # the store is free for the next daemon, which has the decision
    again = Daemon(config, tmp_path / "d.log").start()
    try:
        listed = oasis("jobs", "--json", server=again.address).stdout
        assert '"one"' in listed
    finally:
        assert again.stop() == 0


def _process_gauges(c: AdmissionController) -> tuple[float, float]:
    """(oasis_commit_process_up, oasis_commit_process_starts_total) of a fresh scrape."""
    text = generate_latest(Metrics(c).registry).decode()
    found = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return found["oasis_commit_process_up"], found["oasis_commit_process_starts_total"]


def test_a_child_that_cannot_start_leaves_the_writer_thread_committing(
    c: AdmissionController,
) -> None:
    """No child can be started (here: its command exits at once): the batch is written
    by the writer thread instead, nothing fails, and a start is tried again only after
    the back-off; then a child takes over again."""
    committer = _committer(c)
    first = _child(c)
    committer.command = [sys.executable, "-c", "raise SystemExit(3)"]
    os.kill(first, signal.SIGKILL)
    assert ended(first)
    views = [asyncio.run(c.submit(small(f"t{i}"))) for i in range(3)]
    assert all(v.state == "admitted" and not v.duplicate for v in views)
    assert [c._get_sync(v.id) for v in views] == views and not c._stale
    assert committer.failed_starts == 1 and committer.pid is None  # tried once, not per batch
    assert _process_gauges(c) == (0.0, 1.0)  # the mutation audit: up stayed 1 unnoticed
    committer.command = [sys.executable, "-m", "controller.store.commit_process"]
    committer._retry_at = 0.0  # the back-off is over
    assert asyncio.run(c.submit(small("again"))).sequence == views[-1].sequence + 1
    assert committer.pid is not None and committer.starts == 2 and committer.failed_starts == 0
    assert _process_gauges(c) == (1.0, 2.0)


def test_a_thread_writer_is_used_for_an_in_memory_store() -> None:
    from controller.store.commit_process import separate_process_ok

    assert not separate_process_ok("sqlite://")
    assert not separate_process_ok("sqlite:///:memory:")
    assert not separate_process_ok("sqlite:///file:x?mode=memory&cache=shared&uri=true")
    # the same URI written into the database's name (escaped), as SQLite opens it too
    assert not separate_process_ok("sqlite:///file:x%3Fmode%3Dmemory%26cache%3Dshared?uri=true")
    assert separate_process_ok("sqlite:////var/lib/oasis/oasis.db")
    assert separate_process_ok("postgresql+psycopg://oasis@/oasis")


@pytest.mark.parametrize("planted", ["controller", "sqlalchemy"])
def test_the_child_never_imports_code_from_the_working_directory(
    tmp_path: Path, planted: str
) -> None:
    """``python -m`` puts the working directory first: a ``controller/`` there ran as
    the daemon's user when it was started in a directory others can write to."""
    marker = tmp_path / "ran"
    package = tmp_path / "cwd" / planted
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    child = subprocess.run(
        child_command(), cwd=package.parent, input=b"", capture_output=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert not marker.exists(), "the planted package ran"
    # it imported the real module: with no settings on its input, it ends with 2
    assert child.returncode == 2 and not child.stderr, child.stderr.decode()[-2000:]


def test_a_child_that_fails_to_start_is_tried_again_after_a_doubling_back_off(
    tmp_path: Path,
) -> None:
    """The first failed start waits RETRY_SECONDS[0] before the next try, each failure
    after it twice as long, up to RETRY_SECONDS[1]; a start that succeeds begins the
    count again."""
    import structlog

    from controller.store import Database
    from controller.store.commit_process import RETRY_SECONDS, CommitProcessStartError

    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    committer = CommitProcess(db, structlog.wrap_logger(structlog.ReturnLogger()))
    working = committer.command
    committer.command = [sys.executable, "-c", "raise SystemExit(3)"]
    first, most = RETRY_SECONDS
    try:
        for n in range(8):
            before = time.monotonic()
            with pytest.raises(CommitProcessStartError):
                committer.start()
            after = time.monotonic()
            wait = min(most, first * 2**n)
            assert before + wait <= committer._retry_at <= after + wait, (n, wait)
            committer._retry_at = 0.0  # the back-off is over
        committer.command = working
        committer.start()
        assert committer.failed_starts == 0 and committer.starts == 1
    finally:
        committer.close()
        db.dispose()
