"""The load test of ``bench/load_test.py`` at a size for CI: 300 submissions from 8
concurrent clients against the daemon on loopback, on SQLite and on PostgreSQL; then no
decision lost or duplicated, nothing half-written, store and ledger agree, capacity
never exceeded. Its timings are the benchmark's business (bench/RESULTS.md), not this
test's.

The checks are then shown to fail: the store is tampered with in the ways they guard
against, and each is reported.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import create_engine, text

from bench.daemon_throughput import workload
from bench.load_test import Answer, check_store, run_load

JOBS = 300
CLIENTS = 8


def test_300_submissions_from_8_clients(store_url: str, tmp_path: Path) -> None:
    backend = "sqlite" if store_url.startswith("sqlite") else "postgresql"
    report = run_load(backend, store_url, tmp_path, jobs=JOBS, clients=CLIENTS)
    assert report.problems == []
    assert (report.answered, report.given_up, report.failed_calls) == (JOBS, 0, {})
    assert 0 < report.admitted < JOBS  # the cluster fills: both outcomes are checked
    assert report.allocation_rows > 0
    assert report.utilisation_samples >= 1 and 0 < report.utilisation_max <= 1

    tamper_and_check(report.store_url)


def tamper_and_check(url: str) -> None:
    servers, _ = workload(1, JOBS)
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            rows = conn.execute(text("SELECT id, sequence, admitted FROM jobs ORDER BY sequence"))
            answers = {
                r.id: Answer(r.sequence, bool(r.admitted), False, 1, 0.0, 0.0, 0.0) for r in rows
            }
            ids = list(answers)
            admitted = [i for i in ids if answers[i].admitted]
            rejected = [i for i in ids if not answers[i].admitted]
            assert check_store(url, ids, answers, servers).problems == []

            lost, doubled, emptied, crowded = admitted[0], rejected[0], admitted[1], admitted[2]
            conn.execute(
                text("DELETE FROM events WHERE kind = 'decided' AND job_id = :j"), {"j": lost}
            )
            conn.execute(
                text(
                    "INSERT INTO events (at, kind, job_id, slot, state, detail) "
                    "SELECT at, kind, job_id, slot, state, detail FROM events "
                    "WHERE kind = 'decided' AND job_id = :j"
                ),
                {"j": doubled},
            )
            conn.execute(text("DELETE FROM allocations WHERE job_id = :j"), {"j": emptied})
            conn.execute(
                text(
                    "UPDATE allocations SET workers = workers + 1000 WHERE job_id = :j "
                    "AND workers > 0"
                ),
                {"j": crowded},
            )
            answers["never-stored"] = Answer(10**6, True, False, 1, 0.0, 0.0, 0.0)
            answers[rejected[1]].sequence += 1  # a client told another decision
    finally:
        engine.dispose()
    problems = check_store(url, [*ids, "never-stored"], answers, servers).problems
    expected = [
        f"{lost}: 0 'decided' events, not 1",
        f"{doubled}: 2 'decided' events, not 1",
        f"{emptied}: admitted with work",
        f"{crowded}: slot",  # workers without their PS
        "> capacity",
        "never-stored: answered (sequence 1000000) but not in the store",
        f"{rejected[1]}: answered (seq",
    ]
    for text_ in expected:
        assert any(text_ in p for p in problems), (text_, problems[:10])
