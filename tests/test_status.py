"""``oasis status`` against a real daemon subprocess: the screen and its JSON agree with
the plans the daemon answered."""

from __future__ import annotations

import json
import math
import socket
import sqlite3
import tomllib
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from controller.commands.status import RAMP, level
from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.servers import Daemon, console_address, free_port, oasis, write_config
from tests.test_daemon_e2e import contending_jobs, job


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, list[pb.Job]]]:
    """A daemon (SQLite) that decided six contending jobs; the admitted ones."""
    tmp = tmp_path_factory.mktemp("status")
    # a short store_timeout: a commit waiting for another connection's lock fails sooner
    extra = (
        f'store_timeout = 1\n[metrics]\nlisten = "127.0.0.1:{free_port()}"\n'
        '[web]\nlisten = "127.0.0.1:0"\n'
    )
    config = write_config(tmp / "s.toml", tmp / "data", extra=extra)
    daemon = Daemon(config, tmp / "s.log").start()
    try:
        with grpc.insecure_channel(daemon.address) as channel:
            stub = pb_grpc.AdmissionStub(channel)
            answers = [
                stub.SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(spec)), timeout=60).job
                for spec in contending_jobs(6)
            ]
        admitted = [j for j in answers if j.decision.admitted]
        assert 1 < len(admitted) < len(answers), "jobs should contend"
        yield daemon, admitted
    finally:
        assert daemon.stop() == 0, (tmp / "s.log").read_text()


def test_json_agrees_with_the_plans(busy: tuple[Daemon, list[pb.Job]]) -> None:
    daemon, admitted = busy
    st: dict[str, Any] = json.loads(oasis("status", "--json", server=daemon.address).stdout)
    first = st["first_slot"]
    assert st["current_slot"] == first and st["slots"] == 12
    assert st["jobs_in_flight"] == {
        "running": 0,
        "admitted": len(admitted),
    }  # they arrive next slot
    assert [j["id"] for j in st["jobs"]] == [j.spec.id for j in admitted]
    assert [j["payoff"] for j in st["jobs"]] == [j.decision.payoff for j in admitted]
    assert set(st["price_floor"]) == {"worker", "ps"}

    with grpc.insecure_channel(daemon.address) as channel:
        use = pb_grpc.ClusterStub(channel).GetUtilisation(pb.GetUtilisationRequest(), timeout=30)
    assert [u["share"] for u in st["use"]] == [list(u.share) for u in use.use]

    booked = {(a.server, a.slot) for j in admitted for a in j.decision.allocations}
    assert any(first <= slot < first + 12 for _, slot in booked)
    for heat in st["heat"]:
        assert len(heat["price_ratio"]) == 12
        for i, ratio in enumerate(heat["price_ratio"]):
            if (heat["server"], first + i) in booked:
                assert ratio > 1  # dearer than the floor: something is in use
            else:
                assert ratio == pytest.approx(1.0)  # nothing booked: the floor price


def test_screen_shows_use_heat_and_jobs(busy: tuple[Daemon, list[pb.Job]]) -> None:
    daemon, admitted = busy
    screen = oasis("status", "--limit", "1", server=daemon.address).stdout
    st = json.loads(oasis("status", "--json", server=daemon.address).stdout)
    assert f"oasis status: {daemon.address}, slot {st['current_slot']}" in screen
    assert "cluster use" in screen and "price heat by server" in screen
    # its health, which the screen did not say (the observability audit)
    assert screen.splitlines()[2] == "store up, no broker", screen
    assert st["nodes"] == [{**st["nodes"][0], "store_up": True, "broker": "none",
                            "draining": False, "writes_refused": None}]  # fmt: skip
    assert f"jobs in flight: 0 running, {len(admitted)} admitted" in screen
    assert admitted[0].spec.id in screen and admitted[1].spec.id not in screen
    assert f"... and {len(admitted) - 1} more" in screen
    top = max(math.log(r) for h in st["heat"] for r in h["price_ratio"])
    lines = screen.splitlines()
    for heat in st["heat"]:
        row = next(x for x in lines if x.startswith(heat["server"] + " "))
        cells = "".join(RAMP[level(math.log(r), top)] for r in heat["price_ratio"])
        assert cells in row
    assert any("@" in x for x in lines if x.startswith("w"))  # the hottest cell is on screen


def test_the_screen_shows_the_hottest_servers_and_says_how_many_more(
    busy: tuple[Daemon, list[pb.Job]],
) -> None:
    """The operator's scale audit: at 10,000 servers the price heat was 10,000 lines.
    ``--servers N`` (40 by default) shows the N hottest, and says how many are left out."""
    daemon, _ = busy
    st = json.loads(oasis("status", "--json", server=daemon.address).stdout)
    assert len(st["heat"]) == 5  # --json lists every server
    hottest = max(st["heat"], key=lambda h: max(h["price_ratio"]))["server"]
    screen = oasis("status", "--servers", "1", server=daemon.address).stdout.splitlines()
    names = {h["server"] for h in st["heat"]}
    listed = [x.split()[0] for x in screen if x.split() and x.split()[0] in names]
    assert listed == [hottest], screen
    assert ("... and 4 more servers, none hotter than those shown (--servers 0 lists every "
            "one; oasis servers)") in screen  # fmt: skip
    every = oasis("status", "--servers", "0", server=daemon.address).stdout.splitlines()
    assert sorted(x.split()[0] for x in every if x.split() and x.split()[0] in names) == sorted(
        names
    )
    out = oasis("status", "--servers", "-1", server=daemon.address, check=False)
    assert out.returncode == 2 and "--servers: must be >= 0, got -1" in out.stderr


def test_shown_heat_keeps_the_hottest_and_every_server_out_of_service() -> None:
    from controller.commands.status import ServerHeat, shown_heat

    heat = [
        ServerHeat("a", "worker", [1.0, 1.0], "idle"),
        ServerHeat("b", "worker", [1.0, 9.0], "gpu 4/8"),
        ServerHeat("c", "worker", [1.0, 1.0], "failed; idle"),
        ServerHeat("d", "worker", [3.0, 1.0], "gpu 1/8"),
        ServerHeat("e", "ps", [1.0, 1.0], "cordoned until slot 9; idle"),
        ServerHeat("f", "ps", [1.0, 1.0], "idle"),
    ]
    assert [h.server for h in shown_heat(heat, 2)] == ["b", "c", "d", "e"]  # cluster order
    assert [h.server for h in shown_heat(heat, 1)] == ["b", "c", "e"]
    assert shown_heat(heat, 0) == heat and shown_heat(heat, 6) == heat
    idle = [ServerHeat(n, "worker", [1.0], "idle") for n in "xyz"]
    assert [h.server for h in shown_heat(idle, 2)] == ["x", "y"]  # the first among equals


def test_bad_input_and_no_daemon_are_clear_errors() -> None:
    out = oasis("status", "--slots", "0", server="127.0.0.1:1", check=False)
    assert out.returncode == 2 and "--slots: must be >= 1" in out.stderr
    out = oasis("status", "--timeout", "5", server=f"127.0.0.1:{free_port()}", check=False)
    assert out.returncode == 1 and "UNAVAILABLE" in out.stderr


def test_heat_levels() -> None:
    assert level(0.0, 5.0) == 0  # the floor only
    assert level(1e-9, 5.0) == 1  # anything above it shows
    assert level(5.0, 5.0) == len(RAMP) - 1
    assert level(0.0, 0.0) == 0
    inf = float("inf")  # pinned bounds of 1e308 over 1e-308: the ratio overflows
    assert level(inf, inf) == level(inf, 5.0) == len(RAMP) - 1


def test_a_cordoned_server_does_not_set_the_heats_scale(
    busy: tuple[Daemon, list[pb.Job]],
) -> None:
    """Before: a cordoned server is priced as full where it is out, and its price was
    the ramp's top: on the example cluster one cordon of an idle server took the legend
    from "@ 690 x it" to "@ 1.87e+04 x it", and every other server's heat to a dot or
    two. Now the top is the dearest price of a server in service."""
    daemon, _ = busy
    before = json.loads(oasis("status", "--json", server=daemon.address).stdout)
    oasis("cordon", "w0", "--force", server=daemon.address)
    try:
        st = json.loads(oasis("status", "--json", server=daemon.address).stdout)
        heat = {h["server"]: h for h in st["heat"]}
        assert heat["w0"]["busiest"].startswith("cordoned"), heat["w0"]
        top = max(r for h in st["heat"] if h["server"] != "w0" for r in h["price_ratio"])
        assert max(heat["w0"]["price_ratio"]) > top > 1.0, (heat, before)  # else no test
        screen = oasis("status", server=daemon.address).stdout
        assert f"@ {top:.3g} x it or more (a server out of service: @ where it is out)" in screen
        row = next(x for x in screen.splitlines() if x.startswith("w0 "))
        assert row.split()[2].endswith("@"), row
    finally:
        oasis("uncordon", "w0", server=daemon.address)


def test_a_node_that_takes_the_connection_but_never_answers_is_said_to_be_stopped_or_hung(
    busy: tuple[Daemon, list[pb.Job]],
) -> None:
    """The on-call audit: with a head node frozen (SIGSTOP; here a socket that listens and
    never answers: the kernel takes the connection all the same), the nodes' table read
    ``unreachable``, as for a node switched off, and no health line named it. Now its role
    is ``not answering`` and a line says what is known (stopped or hung) and what to do;
    a node where nothing listens still reads ``unreachable``, with its cause."""
    daemon, _ = busy
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    refused = f"127.0.0.1:{free_port()}"
    try:
        frozen = f"127.0.0.1:{silent.getsockname()[1]}"
        nodes = f"{daemon.address},{frozen},{refused}"
        screen = oasis("status", "--timeout", "5", server=nodes).stdout.splitlines()
        st = json.loads(oasis("status", "--timeout", "5", "--json", server=nodes).stdout)
    finally:
        silent.close()
    by = {n["address"]: n for n in st["nodes"]}
    # gRPC gives the connection up after failover.CONNECT_SECONDS (4 s), within --timeout
    assert by[frozen]["role"] == "not answering", by
    assert "stopped or hung" in by[frozen]["reason"], by
    assert by[refused]["role"] == "unreachable", by
    assert by[refused]["reason"] == "connection refused: nothing listens there"
    line = next(x for x in screen if x.startswith(f"{frozen}: "))
    assert line.startswith(f"{frozen}: NOT ANSWERING: it "), line
    assert "stopped or hung" in line and "Check oasisd there" in line, line
    line = next(x for x in screen if x.startswith(f"{refused}: "))
    assert line.startswith(f"{refused}: UNREACHABLE: connection refused"), line
    assert "and that --server names its address" in line
    row = next(x for x in screen if x.startswith(frozen + " "))
    assert row.split()[1:3] == ["not", "answering"], row
    # a node without [ha] holds no lease: none is shown (it read its uptime, "302.5 s")
    row = next(x for x in screen if x.startswith(daemon.address + " "))
    assert row.split()[1] == "single" and row.split()[3] == "-", row


def test_a_server_out_of_service_now_is_not_read_as_full() -> None:
    """The on-call audit: a cordoned server in its cordon's slots holds its capacity as
    "used" in ListServers (its jobs moved off), and the heat's "busiest now" read
    ``cordoned; mem 488/488``, a full server, with nothing running on it; so did a
    failed one from the slot after its failure (``failed; gpu 8/8``)."""
    from controller.commands.status import _busiest

    cap = {"gpu": 8.0, "cpu": 32.0, "mem": 488.0}
    held = pb.Server(name="p", capacity=cap, used=cap, state="cordoned", cordoned_from_slot=22)
    assert _busiest(held, None, 22) == "cordoned; out of service now"
    assert _busiest(held, None, 21) == "cordoned; mem 488/488"  # a slot of its jobs, if full
    failed = pb.Server(name="f", capacity=cap, used=cap, state="failed")
    assert _busiest(failed, None, 9) == "failed; out of service now"
    running = pb.Server(name="f", capacity=cap, used={"gpu": 5.0}, state="failed")
    assert _busiest(running, None, 9) == "failed; gpu 5/8"  # the slot it failed in
    up = pb.Server(name="u", capacity=cap, used=cap, state="up")
    assert _busiest(up, None, 9) == "mem 488/488"
    ahead = pb.Server(name="a", capacity=cap, used={}, state="up", cordoned_from_slot=30)
    assert _busiest(ahead, None, 9) == "cordon from slot 30; idle"


def test_a_store_whose_writes_wait_for_a_lock_says_so(busy: tuple[Daemon, list[pb.Job]]) -> None:
    """The on-call audit: with another connection holding the SQLite store's write lock
    (a sqlite3 shell's BEGIN EXCLUSIVE), every submission failed `UNAVAILABLE: the store
    is unavailable: database is locked` while `oasis status` read "store up" and the
    metrics oasis_store_up 1 and oasis_store_writes_refused 0 (reads go through): the
    operator's screen gave no sign. Now its health line and oasis_store_writes_locked
    say so until the lock is gone (the store watch's next probe, within a second)."""
    daemon, _ = busy
    config = tomllib.loads(daemon.config.read_text())
    store = Path(config["daemon"]["data_dir"]) / "oasis.db"
    metrics = f"http://{config['metrics']['listen']}/metrics"
    shell = sqlite3.connect(store, isolation_level=None)
    try:
        shell.execute("BEGIN EXCLUSIVE")
        with grpc.insecure_channel(daemon.address) as channel, pytest.raises(grpc.RpcError) as e:
            spec = spec_to_proto(job("locked-out"))
            pb_grpc.AdmissionStub(channel).SubmitJob(pb.SubmitJobRequest(job=spec), timeout=60)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value
        assert "database is locked" in (e.value.details() or "")
        st = json.loads(oasis("status", "--json", server=daemon.address).stdout)
        screen = oasis("status", server=daemon.address).stdout.splitlines()
        scraped = urllib.request.urlopen(metrics, timeout=30).read().decode()
        console = _overview(daemon)
    finally:
        shell.close()
    locked = st["nodes"][0]["writes_locked"]
    assert locked.startswith("database is locked: another connection held a lock"), locked
    assert (
        screen[2] == f"THE STORE'S WRITES WAIT FOR A LOCK (no decision can be stored; "
        f"reads go on): {locked}"
    ), screen
    assert "\noasis_store_writes_locked 1.0\n" in scraped
    assert "\noasis_store_up 1.0\n" in scraped
    # the console's overview said "Store: reachable" (no [auth]: an operator's words)
    assert (console["store_up"], console["writes_locked"]) == (True, locked), console
    for _ in range(100):  # the watch probes once a second
        st = json.loads(oasis("status", "--json", server=daemon.address).stdout)
        if st["nodes"][0]["writes_locked"] is None:
            break
    assert st["nodes"][0]["writes_locked"] is None, st["nodes"]
    assert oasis("status", server=daemon.address).stdout.splitlines()[2] == "store up, no broker"
    assert _overview(daemon)["writes_locked"] is None


def _overview(daemon: Daemon) -> dict[str, Any]:
    """The console's overview of ``daemon``'s node (no [auth]: as an operator)."""
    url = f"http://{console_address(daemon.log_path)}/api/overview"
    with urllib.request.urlopen(url, timeout=30) as response:
        node: dict[str, Any] = json.loads(response.read())["node"]
    return node


def test_the_screen_counts_pending_jobs_and_says_where_the_rest_are() -> None:
    """A job submitted with --wait and not admitted yet was on no line of the screen
    (only running and admitted were counted), and the jobs past --limit were sent to
    ``oasis jobs --state running`` when they were admitted ones."""
    from controller.commands.status import Status, render

    def job(name: str, state: str) -> dict[str, Any]:
        return {"id": name, "state": state, "arrival_slot": 3, "completion_slot": 9,
                "payoff": 1.5}  # fmt: skip

    st = Status(server="h:1", current_slot=2, first_slot=2, slots=1, use=[],
                price_floor={}, heat=[], jobs_in_flight={"running": 1, "admitted": 2},
                jobs=[job("a", "running"), job("b", "admitted"), job("c", "admitted")],
                jobs_pending=4)  # fmt: skip
    lines = render(st, limit=1).splitlines()
    assert ("jobs in flight: 1 running, 2 admitted; 4 pending, not admitted yet (oasis jobs "
            "--state pending)") in lines  # fmt: skip
    assert lines[-1] == "... and 2 more (oasis jobs --state admitted)", lines
    lines = render(replace(st, jobs_pending=0), limit=0).splitlines()
    assert "jobs in flight: 1 running, 2 admitted" in lines
    assert not [x for x in lines if x.startswith("job ")]  # --limit 0: no headers alone
    assert lines[-1] == "... and 3 more (oasis jobs --state running --state admitted)", lines
    unread = render(replace(st, jobs=None, jobs_in_flight=None, jobs_pending=None), limit=1)
    assert unread.splitlines()[-1] == "jobs in flight: not read (the store is unavailable)"


def test_the_ramps_legend_says_a_price_past_the_largest_float() -> None:
    """Pinned bounds of 1e308 over 1e-308 put the dearest price past the largest float:
    the legend said ``@ inf x it``."""
    from controller.commands.status import times_floor

    assert times_floor(math.log(690.0)) == "690"
    assert times_floor(800.0) == "e^800"
    assert times_floor(math.inf) == "over 1.8e+308"


class _Late(grpc.RpcError):  # type: ignore[misc]  # grpc is untyped
    """A GetLeadership that got no answer within its deadline (gRPC's own error)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return "Deadline Exceeded"


def test_a_node_that_answered_too_late_is_not_answering_not_unreachable() -> None:
    """The client's mutation audit: a node whose GetLeadership ran out of time (it took
    the call: busy, stopped or hung) could read ``unreachable``, as one where nothing
    listens, with every test passing."""
    from controller.commands.connection import CHECK_IT
    from controller.commands.status import _health_lines, _unanswered

    node = _unanswered("h:1", _Late())
    why = "it did not answer in time (busy, stopped or hung)"
    assert node == {"address": "h:1", "role": "not answering", "error": "DEADLINE_EXCEEDED",
                    "reason": why}  # fmt: skip
    assert _health_lines([node]) == [f"h:1: NOT ANSWERING: {why}. {CHECK_IT}"]


def test_a_standby_without_a_broker_link_is_not_said_to_be_disconnected() -> None:
    """A standby runs no execution plane, so has no broker link of its own: its line
    says the leader's link is the one; the leader's own disconnection is said (the
    mutation audit: ``and not standby`` dropped survived every test)."""
    from controller.commands.status import _health_lines

    up = {"store_up": True, "draining": False}
    nodes = [{"address": "a:1", "role": "leader", "broker": "disconnected", **up},
             {"address": "b:1", "role": "standby", "broker": "disconnected", **up}]  # fmt: skip
    assert _health_lines(nodes) == [
        "a:1: THE BROKER IS DISCONNECTED (no plan reaches the agents)",
        "b:1: store up, broker: the leader's (a standby runs no execution plane)",
    ]
