"""The console's store reads are a tenant's reads as its gRPC calls are: each takes its
caller's read turns (``READS_PER_CLIENT`` in the shared pool at once), and the job list
reads no allocations (a row shows none; 50 jobs of 60,000 allocations each were read
for a page of summaries). The controller runs in-process on SQLite; the statements are
seen by a SQLAlchemy ``before_cursor_execute`` listener."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import pytest
import structlog
from sqlalchemy import event

from controller.admission import AdmissionController
from controller.auth import Caller, Role, hash_token
from controller.clock import FakeClock, SlotClock
from controller.config import from_dict
from controller.console.app import Console
from controller.console.data import ConsoleData
from controller.console.shared_reads import SharedReads
from controller.store import Database
from tests.test_retention import SPEC
from tests.test_retention import _controller as retention_controller

ALICE = Caller("alice", Role.SUBMITTER, client="alice", turn="alice")
OPERATOR = Caller("ops", Role.OPERATOR, client="ops", turn="ops")


def _statements(c: AdmissionController, seen: list[str]) -> Any:
    def statement(conn: Any, cursor: Any, sql: str, *_: Any) -> None:
        seen.append(sql.lower())

    event.listen(c.db.engine, "before_cursor_execute", statement)
    return statement


def test_console_reads_take_the_callers_turns_and_the_list_reads_no_allocations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c, _ = retention_controller(tmp_path, keep_days=0)
    try:
        for job_id, by in (("train-1", "alice"), ("eval-2", "alice"), ("train-3", "bob")):
            view = asyncio.run(c.submit({**SPEC, "id": job_id}, by=by))
            assert view.decision.admitted, view.decision.reason
        clients: list[str] = []
        read_store = c.read_store

        async def recorded(fn: Any, *args: Any, client: str = "") -> Any:
            clients.append(client)
            return await read_store(fn, *args, client=client)

        monkeypatch.setattr(c, "read_store", recorded)
        data = ConsoleData(c)
        seen: list[str] = []
        listener = _statements(c, seen)
        try:
            listed = asyncio.run(data.jobs(ALICE))
            searched = asyncio.run(data.jobs(ALICE, query="tr"))
            everyone = asyncio.run(data.jobs(OPERATOR, query="tr"))
        finally:
            event.remove(c.db.engine, "before_cursor_execute", listener)
        assert [j["id"] for j in listed["jobs"]] == ["train-1", "eval-2"]  # its own only
        assert [j["id"] for j in searched["jobs"]] == ["train-1"]
        assert [j["id"] for j in everyone["jobs"]] == ["alice:train-1", "bob:train-3"]
        assert all(j["completion_slot"] is not None for j in listed["jobs"])
        assert not [sql for sql in seen if "from allocations" in sql], seen
        assert len([sql for sql in seen if "from jobs" in sql]) == 3  # one read a page
        assert clients == ["alice", "alice", "ops"]

        clients.clear()
        job = asyncio.run(data.job(ALICE, "train-1"))
        assert job["plan"], "a job's own page still shows its plan"
        asyncio.run(data.overview(ALICE))
        assert clients and set(clients) == {"alice"}, clients
    finally:
        c.close()


def test_many_tabs_read_the_ledger_once_and_see_each_change(tmp_path: Path) -> None:
    """The operator's scale audit: every tab's overview and heatmap read every server x
    slot of the ledger in the decision thread, ahead of the tenants' decisions (30-60 ms
    a read at 10,000 servers, each tab at every event). Tabs asking at once share one
    read (controller/console/shared_reads.py); a decision after it is seen at the next
    poll past the read's age (20 x its duration; the test moves the clock past it)."""
    c, _ = retention_controller(tmp_path, keep_days=0)
    try:
        data = ConsoleData(c)
        now = [0.0]
        data.shared = SharedReads(clock=lambda: now[0])  # its age, on a clock of the test's
        reads: list[str] = []
        read = c.read

        async def counted(fn: Any, client: str | None = None) -> Any:
            reads.append("read")
            return await read(fn, client)

        c.read = counted  # type: ignore[method-assign]

        async def tabs() -> list[Any]:
            pages = [data.overview(OPERATOR) for _ in range(8)] + [data.prices() for _ in range(8)]
            return list(await asyncio.gather(*pages))

        pages = asyncio.run(tabs())
        # each overview also reads the servers' states (cheap, its own): 8 + one use + one heatmap
        assert len(reads) == 8 + 2, reads
        assert all(p["use"] == pages[0]["use"] for p in pages[:8])
        assert all(p["level"] == pages[8]["level"] for p in pages[8:])
        before = pages[0]["use"]
        view = asyncio.run(c.submit({**SPEC, "id": "later"}, by="alice"))
        assert view.decision.admitted, view.decision.reason
        assert asyncio.run(data.overview(OPERATOR))["use"] == before  # reused meanwhile
        now[0] += 3600.0  # past 20 x the read's duration, whatever it was
        after = asyncio.run(data.overview(OPERATOR))["use"]
        assert after != before  # the new job's use shows
    finally:
        c.close()


# -- agents: when each server's agent was last heard ------------------------------------

ODD = "<i>w&1</i>"
"""A server's name is text from the config: shown, never read as HTML."""


def _agents_controller(tmp: Path, tokens: Path | None = None) -> AdmissionController:
    """An in-process controller of 14 servers (w0, ODD, w2 .. w12, p0), no ``[mqtt]``;
    a test fakes the execution plane's :meth:`agent_ages`."""
    servers = [{"name": n, "kind": "worker", "capacity": {"gpu": 4, "bandwidth": 10}}
               for n in ["w0", ODD, *(f"w{i}" for i in range(2, 13))]]  # fmt: skip
    servers.append({"name": "p0", "kind": "ps", "capacity": {"bandwidth": 10}})
    data: dict[str, Any] = {
        "daemon": {"data_dir": str(tmp), "window": 6, "epoch": 0},
        "cluster": {"resources": ["gpu", "bandwidth"], "servers": servers},
    }
    if tokens is not None:
        data["auth"] = {"tokens_file": str(tokens)}
        data["web"] = {"listen": "127.0.0.1:0"}
    config = from_dict(data)
    c = AdmissionController(
        config,
        Database(config.database_url),
        SlotClock(FakeClock(1.0), config.slot_seconds, 0.0),
        log=structlog.wrap_logger(structlog.ReturnLogger()),
    )
    c.open()
    return c


def _fake_agents(c: AdmissionController, ages: dict[str, float], timeout: float = 30.0) -> None:
    """The execution plane as the console reads it: Execution.agent_ages (every server)
    and the heartbeat timeout."""
    every = {name: ages.get(name, math.inf) for _, _, name, _ in c.cluster.servers()}
    mqtt = SimpleNamespace(heartbeat_timeout=timeout)
    c.execution = cast(Any, SimpleNamespace(agent_ages=lambda: dict(every), mqtt=mqtt))


def test_servers_page_and_overview_say_when_each_agent_was_heard(tmp_path: Path) -> None:
    """The operator audit, in the console as in `oasis servers` / `oasis status`: a
    server whose agent was never heard read 'up' and got plans its jobs never ran on.
    The servers page gives each agent's last beat in the CLI's words (records.heard_ago)
    and JSON (agent_heard, agent_heard_seconds_ago), and the overview names the servers
    up whose agent was never heard or is silent past the timeout, at most 10, then
    how many more, with oasis status's line; nothing of agents without [mqtt]."""
    c = _agents_controller(tmp_path)
    try:
        data = ConsoleData(c)
        listed = asyncio.run(data.servers())
        assert listed["agents_watched"] is False and listed["agents_unheard"] is None
        assert [s["agent"] for s in listed["servers"]] == ["-"] * 14
        assert listed["servers"][0]["agent_heard"] is None
        assert listed["servers"][0]["agent_heard_seconds_ago"] is None
        assert listed["servers"][-1]["capacity"] == {"gpu": 0.0, "bandwidth": 10.0}
        assert asyncio.run(data.overview(OPERATOR))["agents_unheard"] is None

        view = asyncio.run(c.cordon("w2", reason="ECC errors", by="ops"))
        assert view, view
        # w0 heard 5 s ago, w3 silent past the timeout, w2 never heard but cordoned (out
        # of service: not named), the 11 others never heard
        _fake_agents(c, {"w0": 5.2, "w3": 7325.0})
        listed = asyncio.run(data.servers())
        rows = {s["name"]: s for s in listed["servers"]}
        assert listed["agents_watched"] is True
        assert rows["w0"]["agent"] == "5s ago"
        assert (rows["w0"]["agent_heard"], rows["w0"]["agent_heard_seconds_ago"]) == (True, 5.2)
        assert rows["w3"]["agent"] == "2h2m ago"
        assert rows[ODD]["agent"] == "never"
        assert (rows[ODD]["agent_heard"], rows[ODD]["agent_heard_seconds_ago"]) == (False, None)
        assert rows["w2"]["state"] == "cordoned"
        cordon = rows["w2"]["cordon"]
        assert (cordon["reason"], cordon["by"], cordon["until_slot"]) == ("ECC errors", "ops", None)
        unheard = asyncio.run(data.overview(OPERATOR))["agents_unheard"]
        assert unheard == listed["agents_unheard"]
        assert unheard["count"] == 12 and len(unheard["servers"]) == 10
        assert [u["server"] for u in unheard["servers"]][:3] == [ODD, "w3", "w4"]
        assert unheard["servers"][1] == {"server": "w3", "heard": "2h2m ago",
                                         "heard_seconds_ago": 7325.0}  # fmt: skip
        assert unheard["line"] == (
            f"AGENTS NOT HEARD on 12 servers up, still planned on (jobs there do not run): "
            f"{ODD} (never), w3 (2h2m ago), w4 (never), w5 (never), w6 (never), w7 (never), "
            "w8 (never), w9 (never), w10 (never), w11 (never) and 2 more"
        )
        # a submitter reads no server of the cluster
        assert "agents_unheard" not in asyncio.run(data.overview(ALICE))
        # every agent heard within the timeout: nothing to say
        _fake_agents(c, {name: 1.0 for _, _, name, _ in c.cluster.servers()})
        unheard = asyncio.run(data.overview(OPERATOR))["agents_unheard"]
        assert unheard == {"count": 0, "servers": [], "line": None,
                           "heartbeat_timeout_seconds": 30.0}  # fmt: skip
    finally:
        c.execution = None
        c.close()


@pytest.mark.filterwarnings("ignore::aiohttp.web_exceptions.NotAppKeyWarning")
def test_the_servers_page_over_http_is_an_operators_and_escapes_names(tmp_path: Path) -> None:
    """/servers and /api/servers over HTTP: an operator's (a submitter: 403, as the
    prices and plans); the page's JSON embedded with no raw '<' or '&' (a server's name
    is text), linked from the navigation; the overview's twin says the agents too."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"ops operator {hash_token('ops-token')}\n"
                      f"alice submitter {hash_token('alice-token')}\n")  # fmt: skip
    c = _agents_controller(tmp_path, tokens)
    _fake_agents(c, {"w0": 3.0})

    async def scenario() -> None:
        console = Console(c.config, c, None, None)
        await console.start()
        url = f"http://{console.address}"
        ops = {"Authorization": "Bearer ops-token"}
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(url + "/api/servers?page=1", headers=ops) as r:
                    assert r.status == 200, await r.text()
                    listed = await r.json()
                assert [s["agent"] for s in listed["servers"][:2]] == ["3s ago", "never"]
                assert listed["servers"][1]["name"] == ODD
                assert listed["page"] == listed["pages"] == 1 and listed["servers_total"] == 14
                async with http.get(url + "/servers", headers=ops) as r:
                    assert r.status == 200
                    html = await r.text()
                assert 'data-page="servers"' in html and 'href="/servers"' in html
                assert ODD not in html and "w\\u0026amp" not in html
                assert "\\u003ci\\u003ew\\u00261\\u003c/i\\u003e" in html
                async with http.get(url + "/api/overview", headers=ops) as r:
                    line = (await r.json())["agents_unheard"]["line"]
                assert line.startswith("AGENTS NOT HEARD on 13 servers up") and ODD in line
                alice = {"Authorization": "Bearer alice-token"}
                for path in ("/api/servers", "/servers"):
                    async with http.get(url + path, headers=alice) as r:
                        assert r.status == 403, path
                async with http.get(url + "/", headers=alice) as r:
                    assert 'href="/servers"' not in await r.text()  # not in its navigation
        finally:
            await console.close()

    try:
        asyncio.run(scenario())
    finally:
        c.execution = None
        c.close()


def test_a_resumed_streams_backfill_is_its_owners_newest_events_oldest_first(
    tmp_path: Path,
) -> None:
    """``own_events`` (a submitter's console stream resuming after ``Last-Event-ID``): the
    newest ``limit`` events of the owner's jobs after ``after``, in the order they were
    stored, none of another tenant's. Read oldest-first or newest-first, a page sent its
    events out of order (a page takes the last it saw as the next ``Last-Event-ID``),
    or the oldest of the backlog instead of the newest."""
    c, _ = retention_controller(tmp_path, keep_days=0)
    try:
        for job_id, by in (("a1", "alice"), ("b1", "bob"), ("a2", "alice"), ("a3", "alice")):
            view = asyncio.run(c.submit({**SPEC, "id": job_id}, by=by))
            assert view.decision.admitted, view.decision.reason
        every = asyncio.run(c.stored_events(0, limit=100))
        hers = [e.sequence for e in every if e.job_id.startswith("alice:")]
        assert len(hers) >= 3 and any(not e.job_id.startswith("alice:") for e in every)
        newest = asyncio.run(c.own_events("alice", 0, 2))
        assert [e.sequence for e in newest] == hers[-2:]
        after_first = asyncio.run(c.own_events("alice", hers[0], 100))
        assert [e.sequence for e in after_first] == hers[1:]
    finally:
        c.close()


def test_a_top_price_past_the_largest_float_is_shown_as_it(tmp_path: Path) -> None:
    """The heatmap's legend reads the bounds' exp: a log U past the largest float's
    (730: a job of priority 1.7e308 on tiny demands, ``limits.max_utility`` lifted, or a
    stored value edited) raised OverflowError, and the prices page answered 500. It is
    shown as the largest float, and the answer is JSON without inf or NaN."""
    c, _ = retention_controller(tmp_path, keep_days=0)
    try:
        data = ConsoleData(c)
        assert c.ledger is not None
        c.ledger.side("worker").log_u[:] = 730.0
        page = asyncio.run(data.prices())
        assert 1e308 < page["top"] <= sys.float_info.max and 0 < page["floor"] < 1, page
        json.dumps(page, allow_nan=False)
    finally:
        c.close()
