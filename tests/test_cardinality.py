"""What one tenant or agent can make the daemon keep by naming things (the cardinality
audit): state keyed by a name from outside must stay bounded, whatever the names."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.test_mqtt_units import PlaneDaemon


def test_progress_reads_of_ended_jobs_keep_no_spec(tmp_path: Path) -> None:
    # A tenant reading the progress of its many rejected (or long ended) jobs made the
    # plane keep each one's parsed spec until the next slot boundary: 5,000 reads, 196 MB
    plane = PlaneDaemon(tmp_path)
    try:
        plane.submit("live")
        cheap: dict[str, Any] = {**plane.SPEC, "utility": {"kind": "sigmoid", "priority":
                                 1e-6, "decay": 0.5, "target": 3}}  # fmt: skip
        ids = [f"r{i}" for i in range(20)]
        for job_id in ids:
            view = asyncio.run(plane.c.submit({"id": job_id, **cheap}))
            assert not view.decision.admitted
        for job_id in ids:
            assert plane.ex.view_sync(job_id).job_id == job_id
        assert not set(ids) & set(plane.ex.jobs.cache)
        plane.ex.view_sync("live")  # an active job's spec is kept, as its plans need it
        assert "live" in plane.ex.jobs.cache
    finally:
        plane.c.close()


def test_complaints_of_ever_new_callers_are_budgeted_per_reason() -> None:
    # one line per (caller, reason) per interval: a caller that changes its address at
    # each call made one line per call, and the remembered pairs grew past max_keys
    from structlog.testing import capture_logs

    from controller.logs import Complaints

    now = [0.0]
    complaints = Complaints(10.0, lambda: now[0], field="peer", max_lines=3)
    complaints.max_keys = 5
    with capture_logs() as logs:
        said = [complaints(f"10.0.0.{i}", "bad token", "refused") for i in range(10)]
        assert complaints("10.0.0.99", "no token", "refused")  # another reason: its own budget
    assert said == [True] * 3 + [False] * 7
    assert "more_held_back" in logs[2] and "more_held_back" not in logs[1]
    assert len(complaints._last) <= complaints.max_keys
    now[0] = 11.0
    with capture_logs() as logs:
        assert complaints("10.0.0.50", "bad token", "refused")
    assert logs[0]["others_held_back"] == 7  # none lost: counted, and said

    # the plane's: keyed by the config's servers, each one's complaint is said (a
    # cluster-wide event at 10,000 servers said 4,096 and counted the rest, a count a
    # later line of the reason might never give: the session's review)
    unbudgeted = Complaints(10.0, lambda: now[0])
    unbudgeted.max_keys = 5
    with capture_logs():
        said = [unbudgeted(f"w{i}", "flood", "dropped") for i in range(8)]
    assert said == [True] * 8 and len(unbudgeted._last) == 8


def test_complaints_over_their_cap_look_for_quiet_pairs_at_most_once_a_second() -> None:
    # over max_keys with every pair recent, each new caller rebuilt the table: 0.75 ms a
    # complaint at 4,096 pairs, 324 us at 10,000 servers complaining at once
    from structlog.testing import capture_logs

    from controller.logs import Complaints

    now = [0.0]
    complaints = Complaints(10.0, lambda: now[0])
    complaints.max_keys = 10
    tables: list[object] = []  # each pass makes a new table (held: no id used again)
    with capture_logs() as logs:
        for i in range(100):
            now[0] += 0.001
            complaints(f"w{i}", "clock", "agent's clock is off")
            if not any(t is complaints._last for t in tables):
                tables.append(complaints._last)
    assert len(logs) == 100 and len(tables) == 2  # the first table, and one pass
    now[0] += 11.0  # all quiet
    with capture_logs():
        assert complaints("late", "clock", "agent's clock is off")
    assert set(complaints._last) == {("late", "clock")}


def test_console_logins_from_many_addresses_write_a_bounded_log(tmp_path: Path) -> None:
    # 5,000 bad logins from 5,000 loopback addresses wrote 4,981 warning lines in 4 s
    import http.client
    import math
    import time

    from controller.auth import REFUSAL_LINES, hash_token
    from tests.servers import Daemon, json_log, write_config

    tokens = tmp_path / "tokens"
    tokens.write_text(f"ops operator {hash_token('ops-token')}\n")
    extra = f'[auth]\ntokens_file = "{tokens}"\n[web]\nlisten = "127.0.0.1:0"\n'
    log = tmp_path / "oasisd.log"
    daemon = Daemon(write_config(tmp_path / "oasisd.toml", tmp_path / "data", extra=extra), log)
    daemon.start()
    try:
        web = next(e["address"] for e in json_log(log) if e.get("event") == "console listening")
        host, port = web.rsplit(":", 1)
        logins, started = 3 * REFUSAL_LINES, time.monotonic()
        for i in range(logins):
            conn = http.client.HTTPConnection(
                host, int(port), timeout=10, source_address=(f"127.77.{i // 250}.{i % 250 + 1}", 0)
            )
            conn.request("POST", "/login", body="token=wrong",
                         headers={"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
            assert conn.getresponse().status == 401
            conn.close()
        windows = math.ceil((time.monotonic() - started) / 10.0) + 1  # a slow machine
    finally:
        assert daemon.stop() == 0
    lines = [e for e in json_log(log) if e.get("event") == "unauthenticated"]
    assert len(lines) <= min(windows * REFUSAL_LINES, logins - REFUSAL_LINES)
    assert any("more_held_back" in e for e in lines)
