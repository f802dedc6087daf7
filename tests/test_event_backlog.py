"""A long event history must not cost a reader memory in proportion to it.

The store keeps every event (a decision, each state change, the plane's). A daemon that
has run for months holds hundreds of thousands. A console event stream resumed with
``?after=0`` (any logged-in user, a submitter too) and ``WatchEvents`` from sequence 0
read them all into memory at once -- half a gigabyte for 300,000 -- before sending the
last thousand or paging through them. The test fills a real daemon's SQLite store with
such a history, then reads it both ways and watches the daemon's peak resident memory.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
import urllib.request
from pathlib import Path

from controller.auth import hash_token
from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.tls import client_channel
from tests.servers import SMALL_JOB, Daemon, json_log, write_config

HISTORY = 80_000  # read whole, they cost the daemon ~150 MB (380 MB for 200,000)
TOKENS = {"alice": "alice-backlog-token", "ops": "ops-backlog-token"}
GROWTH_MB = 60  # the daemon's peak may grow by this much while it serves the backlog


def _peak_mb(daemon: Daemon) -> float:
    assert daemon.proc is not None
    with open(f"/proc/{daemon.proc.pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def test_event_backlogs_are_read_in_bounded_pages(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice submitter {hash_token(TOKENS['alice'])}\n"
                      f"ops operator {hash_token(TOKENS['ops'])}\n")  # fmt: skip
    extra = f'[auth]\ntokens_file = "{tokens}"\n[web]\nlisten = "127.0.0.1:0"\n'
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", extra=extra)
    log = tmp_path / "oasisd.log"
    Daemon(config, log).start().stop()  # the store, migrated
    detail = json.dumps({"admitted": True, "payoff": 12.5, "drivers": []})
    with contextlib.closing(sqlite3.connect(tmp_path / "data" / "oasis.db")) as db, db:
        db.executemany(
            "INSERT INTO events (at, kind, job_id, slot, state, detail) VALUES (?,?,?,?,?,?)",
            (("2026-01-01 00:00:00", "decided", f"old-{i}", 0, "admitted", detail)
             for i in range(HISTORY)),
        )  # fmt: skip
    daemon = Daemon(config, log).start()
    try:
        web = [e["address"] for e in json_log(log) if e.get("event") == "console listening"][-1]
        alice = client_channel(daemon.address, token=TOKENS["alice"])
        ops = client_channel(daemon.address, token=TOKENS["ops"])
        submit = pb_grpc.AdmissionStub(alice).SubmitJob
        time.sleep(1.0)
        before = _peak_mb(daemon)

        # a submitter's console stream, resumed from the start of history
        request = urllib.request.Request(
            f"http://{web}/api/events?after=0",
            headers={"Authorization": f"Bearer {TOKENS['alice']}"},
        )
        with urllib.request.urlopen(request, timeout=60) as stream:
            spec = {**SMALL_JOB, "id": "alice-new"}
            submit(pb.SubmitJobRequest(job=spec_to_proto(spec)), timeout=60)
            while b"alice-new" not in stream.readline():  # live events follow the backlog
                pass
        console_growth = _peak_mb(daemon) - before

        # an operator's WatchEvents from sequence 0: every event, in order
        watch = pb_grpc.AdmissionStub(ops).WatchEvents(
            pb.WatchEventsRequest(after_sequence=0), timeout=120
        )
        seen, last = 0, 0
        for event in watch:
            assert event.sequence > last
            last, seen = event.sequence, seen + 1
            if event.job_id == "alice:alice-new":  # an operator sees the job's key
                break
        watch.cancel()
        assert seen == HISTORY + 1
        watch_growth = _peak_mb(daemon) - before
        alice.close()
        ops.close()
    finally:
        daemon.stop()
    assert console_growth < GROWTH_MB, f"the console's backlog took {console_growth:.0f} MB"
    assert watch_growth < GROWTH_MB, f"WatchEvents' backlog took {watch_growth:.0f} MB"
