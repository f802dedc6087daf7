"""A reload (SIGHUP, ``systemctl reload oasisd``) reads the config file again and applies
its tokens file: a tenant added, removed or a token rotated without a restart, which
would cost every tenant the daemon's downtime (controller/reload.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import sqlite3
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from controller.auth import Caller, Role, hash_token
from controller.config import ConfigError, load
from controller.convert import spec_to_proto
from controller.limits import RateLimiter
from controller.reload import reread, token_changes
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.tls import client_channel
from tests.servers import Daemon, json_log, oasis, write_config
from tests.test_daemon_e2e import contending_jobs, job

MOVES = (
    "reload: a restart with this config file would move admitted jobs; if that "
    "is not meant (a server renamed by mistake), mend the file and reload again; "
    "to free a server first, oasis cordon it"
)
"""The warning of a reload whose file a restart would move admitted jobs with."""

EPOCH = 1_700_000_000.0  # fixed, so writing the config again leaves [daemon] as it was


def tokens_file(path: Path, lines: dict[str, tuple[str, str]]) -> Path:
    """``{name: (role, token)}`` as a tokens file."""
    path.write_text("".join(f"{n} {role} {hash_token(t)}\n" for n, (role, t) in lines.items()))
    return path


def config_file(d: Path, tokens: Path, limits: str = "") -> Path:
    extra = f'[auth]\ntokens_file = "{tokens}"\n[web]\nlisten = "127.0.0.1:0"\n{limits}'
    return write_config(d / "oasisd.toml", d / "data", epoch=EPOCH, extra=extra)


def code_of(address: str, token: str) -> grpc.StatusCode:
    with client_channel(address, token=token) as channel:
        try:
            pb_grpc.AdmissionStub(channel).ListJobs(pb.ListJobsRequest(), timeout=10)
        except grpc.RpcError as err:
            return err.code()
    return grpc.StatusCode.OK


def reloads(log: Path, event: str, seen: int, timeout: float = 30.0) -> dict[str, Any]:
    """The next log entry ``event`` after the first ``seen`` of them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in json_log(log) if e.get("event") == event]
        if len(found) > seen:
            return found[seen]
        time.sleep(0.05)
    raise AssertionError(f"no {event!r} logged within {timeout} s:\n{log.read_text()[-3000:]}")


# -- what a reload finds -----------------------------------------------------------------


def test_token_changes_name_each_kind_of_change() -> None:
    def caller(name: str, role: Role, digest: str) -> tuple[str, Caller]:
        return digest, Caller(name, role, token=digest)

    old = dict([caller("alice", Role.SUBMITTER, "a1"), caller("ops", Role.OPERATOR, "o1"),
                caller("carol", Role.SUBMITTER, "c1")])  # fmt: skip
    new = dict([caller("bob", Role.SUBMITTER, "b1"), caller("ops", Role.OPERATOR, "o2"),
                caller("carol", Role.OPERATOR, "c1")])  # fmt: skip
    changes = token_changes(old, new)
    assert changes.added == ("bob",) and changes.removed == ("alice",)
    assert changes.rotated == ("ops",) and changes.roles == ("carol: submitter -> operator",)
    assert changes.words() == (
        "added bob; removed alice; rotated ops; role changed carol: submitter -> operator"
    )
    assert not token_changes(old, dict(old)) and token_changes(old, old).words() == "no change"


def test_reread_applies_tokens_and_limits_and_names_what_waits_for_a_restart(
    tmp_path: Path,
) -> None:
    tokens = tokens_file(tmp_path / "tokens", {"alice": ("submitter", "t-alice")})
    running = load(config_file(tmp_path, tokens, limits="[limits]\nrate = 20\n"))
    tokens_file(tokens, {"bob": ("submitter", "t-bob")})
    edited = (
        "[limits]\nrate = 40\nmax_message_bytes = 2097152\n"
        "[limits.max_utility_by_submitter]\nbob = 10\n"
    )
    config_file(tmp_path, tokens, limits=edited)
    found = reread(running, Path(running.source))
    assert found.tokens.added == ("bob",) and found.tokens.removed == ("alice",)
    assert found.limits == ("rate: 20 -> 40", "max_utility_by_submitter: {} -> {'bob': 10.0}")
    assert found.restart == ("limits.max_message_bytes",)  # noted, not applied
    assert found.config.limits.rate == 40 and found.config.limits.max_utility_by_submitter == {
        "bob": 10.0
    }
    assert found.config.limits.max_message_bytes == running.limits.max_message_bytes
    assert {c.name for c in (found.config.tokens or {}).values()} == {"bob"}
    # every reload names it until a restart applies it; the rest is not news again
    again = reread(found.config, Path(running.source))
    assert again.restart == ("limits.max_message_bytes",)
    assert not again.tokens and again.limits == ()


def test_reread_leaves_turning_the_rate_limit_on_or_off_and_other_tables_to_a_restart(
    tmp_path: Path,
) -> None:
    tokens = tokens_file(tmp_path / "tokens", {"alice": ("submitter", "t-alice")})
    running = load(config_file(tmp_path, tokens))
    config_file(
        tmp_path, tokens, limits="[limits]\nrate = 20\nburst = 40\n[pricing]\ntrim = 0.25\n"
    )
    found = reread(running, Path(running.source))
    assert found.restart == ("limits.burst", "limits.rate", "pricing")
    assert found.limits == () and found.config.limits == running.limits


def test_reread_leaves_turning_auth_on_or_off_to_a_restart(tmp_path: Path) -> None:
    tokens = tokens_file(tmp_path / "tokens", {"alice": ("submitter", "t-alice")})
    running = load(config_file(tmp_path, tokens))
    write_config(tmp_path / "oasisd.toml", tmp_path / "data", epoch=EPOCH,
                 extra='[web]\nlisten = "127.0.0.1:0"\n')  # fmt: skip
    found = reread(running, Path(running.source))
    assert found.restart == ("auth",) and not found.tokens
    assert found.config.tokens == running.tokens  # authentication stays on


def test_reread_of_a_file_that_would_not_start_raises_and_names_the_line(
    tmp_path: Path,
) -> None:
    tokens = tokens_file(tmp_path / "tokens", {"alice": ("submitter", "t-alice")})
    running = load(config_file(tmp_path, tokens))
    tokens.write_text("bob submitter not-a-hash\n")
    with pytest.raises(ConfigError, match="line 1: the token's SHA-256 must be 64 hex"):
        reread(running, Path(running.source))


def test_a_reload_that_removes_a_capped_tenant_revokes_it_and_warns_of_the_cap(
    tmp_path: Path,
) -> None:
    """Removing a tenant's token while ``[limits.max_utility_by_submitter]`` still caps it
    revokes the token all the same, with a warning that the cap applies to no one (an
    audit found the reload refused, the cap read as a typo, so a leaked token went on
    calling). A cap naming a name that never had a token is still an error."""
    tokens = tokens_file(tmp_path / "tokens", {"alice": ("submitter", "t-alice"),
                                                "ops": ("operator", "t-ops")})  # fmt: skip
    caps = "[limits.max_utility_by_submitter]\nalice = 100\n"
    running = load(config_file(tmp_path, tokens, caps))
    tokens_file(tmp_path / "tokens", {"ops": ("operator", "t-ops")})
    found = reread(running, Path(running.source))
    assert found.tokens.removed == ("alice",)
    assert found.warnings == (
        "limits.max_utility_by_submitter.alice: alice has no token any more, so its cap "
        "applies to no one: remove it (a start refuses a cap naming no token)",
    )
    config_file(tmp_path, tokens, "[limits.max_utility_by_submitter]\nalicia = 100\n")
    with pytest.raises(ConfigError) as refused:  # a typo: never a tenant
        reread(running, Path(running.source))
    assert str(refused.value) == (
        "limits.max_utility_by_submitter.alicia: names no submitter of [auth]'s tokens "
        "file (if its tenant was removed, remove its cap too)"
    )


def test_a_reload_lowering_max_wait_below_the_running_default_wait_waits_for_a_restart(
    tmp_path: Path,
) -> None:
    """A file that lowers ``daemon.wait_seconds`` and ``limits.max_wait_seconds`` together
    starts the daemon; a reload applies limits but not ``[daemon]``, so it applied the cap
    alone, under the running default wait of 2 h: every tenant's submission without a
    wait of its own was refused (``wait_seconds: 2h (7200 s) exceeds
    limits.max_wait_seconds = 1h``) until a restart. Now the cap waits for the restart
    too, said with why; the daemon (a subprocess) goes on admitting."""
    tokens = tokens_file(tmp_path / "tokens", {"alice": ("submitter", "t-alice"),
                                                "bob": ("submitter", "t-bob")})  # fmt: skip
    extra = f'wait_seconds = "2h"\n[auth]\ntokens_file = "{tokens}"\n'
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", epoch=EPOCH, extra=extra)
    log = tmp_path / "oasisd.log"
    daemon = Daemon(config, log).start()
    try:
        assert daemon.proc is not None
        text = config.read_text().replace('wait_seconds = "2h"', 'wait_seconds = "30m"')
        config.write_text(text + '\n[limits]\nmax_wait_seconds = "1h"\n')
        daemon.proc.send_signal(signal.SIGHUP)
        reloaded = reloads(log, "config reloaded", 0)
        assert reloaded["limits"] == []  # nothing applied: the cap waits
        assert reloaded["restart_needed"] == ["daemon", "limits.max_wait_seconds"]
        waits = reloads(log, "config changes that apply only at a restart", 0)
        assert waits["keys"] == ["daemon.wait_seconds", "limits.max_wait_seconds"]
        assert any("refuse every submission without a wait" in w for w in waits["why"])
        for name, token in (("alice", "t-alice"), ("bob", "t-bob")):
            with client_channel(daemon.address, token=token) as channel:
                request = pb.SubmitJobRequest(job=spec_to_proto(job(f"{name}-1")))
                # before the fix: INVALID_ARGUMENT, wait_seconds exceeds the new cap
                answer = pb_grpc.AdmissionStub(channel).SubmitJob(request, timeout=30)
                assert answer.job.decision.admitted, answer
    finally:
        assert daemon.stop() == 0, log.read_text()
    # the file as it is starts a daemon with both applied
    assert load(config).limits.max_wait_seconds == 3600 and load(config).wait_seconds == 1800


def test_a_reload_warns_of_the_pending_jobs_its_limits_or_a_restart_would_expire(
    tmp_path: Path,
) -> None:
    """Two tenants' jobs wait (pending) on a full cluster; a reload lowers
    ``limits.max_job_work`` below some of them (a slip: 50 for 5000). The next slot
    boundary expires those for good ("no longer valid"); before, the reload said only
    ``max_job_work: 100000 -> 50``. Now it warns of them, per tenant, with the reason,
    while the boundary is ahead; the jobs within the limit are not named. A window
    shortened (read at a restart) under the queue is warned of too: the restart expired
    them with no word at the reload that read it."""
    tokens = tokens_file(tmp_path / "tokens", {"alice": ("submitter", "t-alice"),
                                                "bob": ("submitter", "t-bob")})  # fmt: skip
    log = tmp_path / "oasisd.log"
    daemon = Daemon(config_file(tmp_path, tokens), log).start()
    try:
        assert daemon.proc is not None
        works: dict[str, int] = {}
        for i, spec in enumerate(contending_jobs(8)):
            name, token = ("alice", "t-alice") if i % 2 == 0 else ("bob", "t-bob")
            with client_channel(daemon.address, token=token) as channel:
                request = pb.SubmitJobRequest(job=spec_to_proto(spec), wait_seconds=7200)
                answer = pb_grpc.AdmissionStub(channel).SubmitJob(request, timeout=60)
            if answer.job.state == pb.JOB_STATE_PENDING:
                works[f"{name}:{spec['id']}"] = spec["epochs"] * spec["chunks"]
        assert {k.split(":")[0] for k in works} == {"alice", "bob"}, works
        config_file(tmp_path, tokens, limits="[limits]\nmax_job_work = 50\n")
        daemon.proc.send_signal(signal.SIGHUP)
        reloaded = reloads(log, "config reloaded", 0)
        assert reloaded["limits"] == ["max_job_work: 100000 -> 50"]
        event = (
            "reload: pending jobs over the new [limits] expire at the next slot boundary, "
            "for good; if that is not meant, mend [limits] and reload again before it"
        )
        lines = [reloads(log, event, 0)["jobs"], reloads(log, event, 1)["jobs"]]
        assert lines[0].startswith("alice: ") and lines[1].startswith("bob: ")
        assert all("exceeds limits.max_job_work = 50" in line for line in lines)
        named = {j for line in lines for j in re.findall(r"(?:alice|bob):j\d+", line)}
        assert named and named <= set(works)
        # a reload that changes no limit says nothing of them again; one whose window
        # (read at start) is shorter warns of the pending jobs a restart would expire
        config = config_file(tmp_path, tokens)
        config.write_text(config.read_text().replace("window = 24", "window = 2"))
        daemon.proc.send_signal(signal.SIGHUP)
        reloads(log, "config reloaded", 1)
        assert len([e for e in json_log(log) if e.get("event") == event]) == 2
        moved = MOVES
        expiring = [
            e["moves"]
            for e in _wait_for(log, lambda e: e.get("event") == moved)
            if e["moves"].startswith("pending jobs it would expire: ")
        ]
        # before the fix: only the admitted jobs planned past the new window were named
        assert [m.split(": ")[1] for m in expiring] == ["alice", "bob"], expiring
        named = {j for m in expiring for j in re.findall(r"(?:alice|bob):j\d+", m)}
        assert named == set(works), (named, works)
    finally:
        assert daemon.stop() == 0, log.read_text()


def test_a_reload_whose_file_is_never_read_is_refused_and_holds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tokens file that never returns when read (a FIFO here; a hung network mount):
    the reload is refused (after ``READ_SECONDS`` for a mount; a FIFO, or a device
    such as ``/dev/zero`` that read until memory ran out, at once: not a regular file),
    the next one, of a fixed file, applies, and nothing is left reading (before: that
    reload and every later one waited for good, and a stopped oasisd never exited: its
    read thread was joined)."""
    import os

    from controller import reload as reload_module

    tokens = tokens_file(tmp_path / "tokens", {"alice": ("submitter", "t-alice")})
    config = config_file(tmp_path, tokens)
    running = load(config)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    config.write_text(config.read_text().replace(str(tokens), str(fifo)))
    monkeypatch.setattr(reload_module, "READ_SECONDS", 0.5, raising=False)
    applied: list[Any] = []
    reloader = reload_module.Reloader(running, [applied.append])

    def unblock() -> None:  # an EOF to a blocked read, if any (no reader: nothing to do)
        with contextlib.suppress(OSError):  # ENXIO: nobody reads it
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    rescue = threading.Timer(10, unblock)  # a test that fails must not hang
    rescue.start()

    async def twice() -> tuple[Any, Any]:
        stuck = await asyncio.wait_for(reloader.reload(), 5)
        config.write_text(config.read_text().replace(str(fifo), "/dev/zero"))
        assert await asyncio.wait_for(reloader.reload(), 5) is None
        config.write_text(config.read_text().replace("/dev/zero", str(tokens)))
        tokens_file(tokens, {"bob": ("submitter", "t-bob")})
        return stuck, await asyncio.wait_for(reloader.reload(), 10)

    try:
        stuck, fixed = asyncio.run(twice())
        assert stuck is None and fixed is not None
        assert fixed.tokens.words() == "added bob; removed alice"
        assert len(applied) == 1
        for thread in [t for t in threading.enumerate() if t.name == "reload"]:
            thread.join(5)  # the last reload's thread may still be ending
            assert not thread.is_alive()  # none blocked: the FIFO and device were not read
    finally:
        rescue.cancel()
        if any(t.name == "reload" and t.is_alive() for t in threading.enumerate()):
            unblock()


# -- the daemon ------------------------------------------------------------------------


def test_a_reload_adds_removes_and_rotates_tokens_of_a_running_daemon(tmp_path: Path) -> None:
    """With the daemon as a subprocess: bob added and alice removed by a SIGHUP, the
    operator's token rotated. The old tokens are refused at their next call, an operator's
    WatchEvents stream opened with the rotated token ends, alice's console session ends;
    a new tenant's cap in ``[limits]`` applies at once; a tokens file with a mistake
    changes nothing, and the daemon never stops."""
    tokens = tokens_file(tmp_path / "tokens", {"alice": ("submitter", "t-alice"),
                                               "ops": ("operator", "t-ops")})  # fmt: skip
    log = tmp_path / "oasisd.log"
    daemon = Daemon(config_file(tmp_path, tokens, limits="[limits]\nrate = 100\n"), log).start()
    try:
        address = daemon.address
        assert daemon.proc is not None
        web = next(e["address"] for e in json_log(log) if e.get("event") == "console listening")
        assert code_of(address, "t-alice") == grpc.StatusCode.OK
        assert code_of(address, "t-bob") == grpc.StatusCode.UNAUTHENTICATED

        ended: list[tuple[grpc.StatusCode, str]] = []
        watching = threading.Event()

        def watch() -> None:
            with client_channel(address, token="t-ops") as channel:
                stream = pb_grpc.AdmissionStub(channel).WatchEvents(
                    pb.WatchEventsRequest(after_sequence=-1), timeout=120
                )
                watching.set()
                try:
                    for _ in stream:
                        pass
                except grpc.RpcError as err:
                    ended.append((err.code(), err.details() or ""))

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        assert watching.wait(10)

        async def login(http: aiohttp.ClientSession) -> str:
            async with http.post(
                f"http://{web}/login", data={"token": "t-alice"}, allow_redirects=False
            ) as r:
                assert r.status == 303
                return str(r.cookies["oasis_session"].value)

        async def overview(http: aiohttp.ClientSession, session: str) -> int:
            cookies = {"oasis_session": session}
            async with http.get(f"http://{web}/api/overview", cookies=cookies) as r:
                return r.status

        async def console_login() -> str:
            async with aiohttp.ClientSession() as http:
                session = await login(http)
                assert await overview(http, session) == 200
                return session

        alice_session = asyncio.run(console_login())
        with client_channel(address, token="t-alice") as channel:
            request = pb.SubmitJobRequest(job=spec_to_proto(job("alice-1")))
            answer = pb_grpc.AdmissionStub(channel).SubmitJob(request, timeout=30)
            assert answer.job.decision.admitted

        tokens_file(tokens, {"bob": ("submitter", "t-bob"), "ops": ("operator", "t-ops-2")})
        capped = "[limits]\nrate = 50\n[limits.max_utility_by_submitter]\nbob = 10\n"
        config_file(tmp_path, tokens, limits=capped)  # a new tenant with a cap of its own
        daemon.proc.send_signal(signal.SIGHUP)
        reloaded = reloads(log, "config reloaded", 0)
        assert reloaded["tokens"] == "added bob; removed alice; rotated ops"
        assert reloaded["limits"] == [
            "rate: 100 -> 50",
            "max_utility_by_submitter: {} -> {'bob': 10.0}",
        ]
        assert reloaded["restart_needed"] == []
        # removing alice does not stop her work, and the log says so
        left = reloads(log, "tenants removed from the tokens file still have jobs that may "
                       "run: pending ones are still admitted when they fit, admitted ones run "
                       "on; oasis cancel NAME:ID ends one", 0)  # fmt: skip
        assert left["jobs"] == {"alice": {"admitted": 1}}
        # recorded for a standby: what it compares with at a takeover
        db = sqlite3.connect(tmp_path / "data" / "oasis.db")
        try:
            (value,) = db.execute("SELECT value FROM meta WHERE key = 'settings'").fetchone()
        finally:
            db.close()
        settings = json.loads(value)
        assert settings["limits"]["rate"] == 50 and settings["window"] == 24
        assert settings["limits"]["max_utility_by_submitter"] == {"bob": 10.0}
        assert code_of(address, "t-bob") == grpc.StatusCode.OK
        assert code_of(address, "t-ops-2") == grpc.StatusCode.OK
        assert code_of(address, "t-alice") == grpc.StatusCode.UNAUTHENTICATED
        assert code_of(address, "t-ops") == grpc.StatusCode.UNAUTHENTICATED

        # bob's cap applies at once; an event (the operator's job) wakes the old
        # operator's stream, which then ends
        with client_channel(address, token="t-bob") as channel:
            spec = spec_to_proto(job("bob-1"))
            with pytest.raises(grpc.RpcError) as over:
                pb_grpc.AdmissionStub(channel).SubmitJob(pb.SubmitJobRequest(job=spec), timeout=30)
            assert over.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "limits.max_utility_by_submitter.bob = 10" in (over.value.details() or "")
        with client_channel(address, token="t-ops-2") as channel:
            spec = spec_to_proto(job("ops-1"))
            pb_grpc.AdmissionStub(channel).SubmitJob(pb.SubmitJobRequest(job=spec), timeout=30)
        watcher.join(30)
        assert ended and ended[0][0] == grpc.StatusCode.UNAUTHENTICATED, ended
        assert "token of ops revoked" in ended[0][1]

        async def console_after() -> int:
            async with aiohttp.ClientSession() as http:
                return await overview(http, alice_session)

        assert asyncio.run(console_after()) == 401  # logged out

        # a mistake in the file changes nothing, and says where it is
        tokens.write_text(tokens.read_text() + "carol submitter 1234\n")
        daemon.proc.send_signal(signal.SIGHUP)
        refused = reloads(log, "reload refused: the config file would not start oasisd; "
                          "nothing changed", 0)  # fmt: skip
        assert "line 3: the token's SHA-256 must be 64 hex digits" in refused["error"]
        assert code_of(address, "t-bob") == grpc.StatusCode.OK
        assert daemon.proc.poll() is None

        # a file that the store's jobs would not let start: said at the reload, not at
        # the next restart (a reboot), which would leave the daemon down with exit 2
        tokens_file(tokens, {"bob": ("submitter", "t-bob"), "ops": ("operator", "t-ops-2")})
        config = Path(daemon.config)
        good = config.read_text()
        bad = re.sub(r'"disk", |disk=\d+, ', "", good).replace("slot_seconds = 3600",
                                                              "slot_seconds = 1800")  # fmt: skip
        config.write_text(bad)
        daemon.proc.send_signal(signal.SIGHUP)
        said = "reload: a restart with this config file would be refused (exit 2), and the "
        problem = reloads(log, said + "daemon would stay down; mend the file, then reload "
                          "again", 0)  # fmt: skip
        other = reloads(log, problem["event"], 1)
        assert problem["level"] == "error"
        assert (
            "daemon.slot_seconds is 1800 s, but the store's jobs were planned in slots of 3600 s"
            in problem["problem"]
        ), problem
        assert other["problem"].startswith(
            "[cluster] resources lacks 'disk', which 2 admitted, running or pending job(s) "
            "demand ('alice:alice-1', 'ops:ops-1')"
        ), other
        config.write_text(good)  # mended: the next reload says nothing of a restart
        daemon.proc.send_signal(signal.SIGHUP)
        reloads(log, "config reloaded", 2)
        moved = MOVES
        assert not any(e.get("event") == moved for e in json_log(log))
        # every server renamed (a typo): the jobs a restart would move are named (the
        # change audit: the reload said only that [cluster] waits for a restart)
        config.write_text(re.sub(r'name="(\w+)"', r'name="\1x"', good))
        daemon.proc.send_signal(signal.SIGHUP)
        renamed = reloads(log, moved, 0)
        assert "is not in the new [cluster]" in renamed["moves"], renamed
        assert "alice:alice-1" in renamed["moves"], renamed
        config.write_text(good)
        daemon.proc.send_signal(signal.SIGHUP)
        reloads(log, "config reloaded", 4)
        assert daemon.stop() == 0, log.read_text()[-3000:]
        assert sum(e.get("event", "").startswith(said) for e in json_log(log)) == 2
        assert Daemon(config, log).start().stop() == 0  # and it does start
    finally:
        assert daemon.stop() == 0, log.read_text()[-3000:]


def test_a_retuned_rate_limit_keeps_each_clients_tokens_up_to_the_new_burst() -> None:
    now = [0.0]
    limiter = RateLimiter(10.0, 20.0, now=lambda: now[0])
    for _ in range(5):
        assert limiter.take("alice") == 0  # 15 left
    limiter.retune(1.0, 4.0)  # burst 4: alice keeps 4
    for _ in range(4):
        assert limiter.take("alice") == 0
    assert limiter.take("alice") == pytest.approx(1.0)  # one token a second now
    now[0] += 1.0
    assert limiter.take("alice") == 0
    assert limiter.words == "rate limit: 1 request/s per client"
    with pytest.raises(ValueError, match="rate must be > 0"):
        limiter.retune(0.0)


def test_the_reload_check_reads_slot_0_from_the_store_as_a_start_would(tmp_path: Path) -> None:
    """The review: a file without ``daemon.epoch`` starts from the store's epoch row,
    which a config that set the epoch never rewrote; the check used the running slot 0
    and said nothing of a restart that then refused."""
    import structlog

    from controller.admission import AdmissionController
    from controller.clock import FakeClock, SlotClock
    from controller.config import from_dict
    from controller.store import Database
    from tests.test_outage_rebuild import JOB, PS, WORKER

    cluster = {"resources": ["gpu", "cpu", "mem", "disk", "bandwidth"],
               "servers": [{"name": "w0", "kind": "worker", "capacity": WORKER},
                           {"name": "p0", "kind": "ps", "capacity": PS}]}  # fmt: skip

    def opened(**daemon: Any) -> AdmissionController:
        config = from_dict({"daemon": {"data_dir": str(tmp_path), "window": 12, **daemon},
                            "cluster": cluster})  # fmt: skip
        c = AdmissionController(config, Database(config.database_url),
                                SlotClock(FakeClock(10_000.0), 3600.0, 0.0),
                                log=structlog.wrap_logger(structlog.ReturnLogger()))  # fmt: skip
        c.open()
        return c

    opened().close()  # the first start records slot 0 at 7200 (its epoch row)
    c = opened(epoch=3600)  # no jobs yet: the store takes this one
    try:
        asyncio.run(c.submit({**JOB, "id": "j"}))  # a job stored: its slot grid is kept
        without = from_dict({"daemon": {"data_dir": str(tmp_path), "window": 12},
                             "cluster": cluster})  # fmt: skip
        [problem] = asyncio.run(c.restart_problems(without))
        assert problem.startswith(
            "slot 0 begins at 1970-01-01T02:00:00Z (daemon.epoch), but "
            "the store's jobs were planned from 1970-01-01T01:00:00Z"
        )
        assert asyncio.run(c.restart_problems(c.config)) == []
    finally:
        c.close()
    with pytest.raises(Exception, match="slot 0 begins at"):  # as the restart says
        opened()


def test_the_reload_check_names_the_admitted_jobs_a_restart_would_move(tmp_path: Path) -> None:
    """The change audit: a server renamed (a typo), made smaller or of another kind, or a
    shorter window, re-places, re-plans or fails admitted jobs at the next restart
    (``config_changed``); the reload named the edit as waiting for a restart but said
    nothing of those jobs."""
    from sqlalchemy import update

    from controller.clock import FakeClock
    from controller.config import from_dict
    from controller.store import JobRow
    from tests.test_outage_rebuild import JOB, PS, SLOT, WORKER, _open

    def config(
        name: str = "w0", capacity: Any = WORKER, window: int = 12, kind: str = "worker"
    ) -> Any:
        servers = [{"name": name, "kind": kind, "capacity": capacity},
                   {"name": "w1", "kind": "worker", "capacity": WORKER},
                   {"name": "p0", "kind": "ps", "capacity": PS}]  # fmt: skip
        return from_dict({
            "daemon": {"data_dir": str(tmp_path), "window": window, "epoch": 0},
            "cluster": {"resources": ["gpu", "cpu", "mem", "disk", "bandwidth"],
                        "servers": servers},
        })  # fmt: skip

    c = _open(tmp_path)
    try:
        job = asyncio.run(c.submit({**JOB, "id": "j"}))
        assert job.decision.admitted
        used = {a["server"] for a in job.decision.allocations}
        assert "w0" in used, used  # the first worker server is taken first
        assert asyncio.run(c.restart_moves(c.config)) == []
        [renamed] = asyncio.run(c.restart_moves(config(name="w9")))
        assert renamed.startswith("server w0 is not in the new [cluster]"), renamed
        assert renamed.endswith("(config_changed): j"), renamed
        [shrunk] = asyncio.run(c.restart_moves(config(capacity={**WORKER, "gpu": 1})))
        assert shrunk.startswith(f"server w0 has less capacity (gpu {WORKER['gpu']:g} -> 1)")
        # a parameter server's capacity is no less in any resource both kinds have
        [turned] = asyncio.run(c.restart_moves(config(kind="ps", capacity=PS)))
        assert turned.startswith("server w0 is now a ps server"), turned
        [shorter] = asyncio.run(c.restart_moves(config(window=0 + 1)))
        assert shorter.startswith("planned past the new window's last slot 1"), shorter
        # a window whose last slot is the plan's last still holds it (the mutation audit:
        # >= in place of > named such a plan as moved, and every test passed)
        end = max(int(a["slot"]) for a in job.decision.allocations)  # the clock is at slot 0
        assert end > 1, end
        assert asyncio.run(c.restart_moves(config(window=end))) == []
        [one_short] = asyncio.run(c.restart_moves(config(window=end - 1)))
        assert one_short.startswith(f"planned past the new window's last slot {end - 1}")
        bigger = {**WORKER, "gpu": WORKER["gpu"] * 2}
        assert asyncio.run(c.restart_moves(config(capacity=bigger, window=24))) == []
        # in the plan's last slot, what it holds in that slot is still named (> in place
        # of >= on the current slot left it out, and every test passed), its job running
        with c.db.session() as session:
            session.execute(update(JobRow).where(JobRow.id == "j").values(state="running"))
        clock = c.slots.clock
        assert isinstance(clock, FakeClock)
        clock.advance(end * SLOT)
        assert c.slots.current_slot() == end
        assert "w0" in {a["server"] for a in job.decision.allocations if int(a["slot"]) == end}
        [renamed] = asyncio.run(c.restart_moves(config(name="w9", window=24)))
        assert renamed.startswith("server w0 is not in the new [cluster]"), renamed
    finally:
        c.close()


def test_a_reload_to_another_store_warns_of_the_jobs_it_leaves_behind(tmp_path: Path) -> None:
    """``daemon.data_dir`` edited (a path mistyped, a move not yet copied) with
    ``slot_seconds`` too: a restart opens another, empty store, where none of the two
    tenants' jobs is seen or run. Before, the reload checked the file against the
    running store's jobs: it said a restart would be refused (the slot grid of jobs
    the restart would not read) and nothing of the jobs left behind. Now it warns of
    those, per tenant, and says no refusal; the file with the old store checks as
    before. With the key not edited, the running data_dir (``--data-dir``'s) stands."""
    tokens = tokens_file(tmp_path / "tokens", {"alice": ("submitter", "t-alice"),
                                                "bob": ("submitter", "t-bob")})  # fmt: skip
    config = config_file(tmp_path, tokens)
    log = tmp_path / "oasisd.log"
    daemon = Daemon(config, log).start()
    try:
        assert daemon.proc is not None
        for name in ("alice", "bob"):
            with client_channel(daemon.address, token=f"t-{name}") as channel:
                request = pb.SubmitJobRequest(job=spec_to_proto(job(f"{name}-1")))
                pb_grpc.AdmissionStub(channel).SubmitJob(request, timeout=30)
        good = config.read_text()
        moved = good.replace(f'data_dir = "{tmp_path / "data"}"', f'data_dir = "{tmp_path}/d2"')
        assert moved != good
        config.write_text(moved.replace("slot_seconds = 3600", "slot_seconds = 1800"))
        daemon.proc.send_signal(signal.SIGHUP)
        event = MOVES
        left = reloads(log, event, 0)["moves"]
        assert left.startswith("daemon.store_url or daemon.data_dir: a restart opens another")
        assert f"{tmp_path}/d2/oasis.db" in left and "(alice: 1, bob: 1)" in left, left
        refused = "reload: a restart with this config file would be refused"
        # before the fix: refused for the slot grid of the jobs the restart would not read
        assert not any(e.get("event", "").startswith(refused) for e in json_log(log))
        config.write_text(good.replace("slot_seconds = 3600", "slot_seconds = 1800"))
        daemon.proc.send_signal(signal.SIGHUP)  # the same store: checked against its jobs
        reloads(log, "config reloaded", 1)
        [problem] = _wait_for(log, lambda e: e.get("event", "").startswith(refused))
        assert "slots of 3600 s" in problem["problem"], problem
    finally:
        assert daemon.stop() == 0, log.read_text()[-3000:]
    running = load(config)
    running = replace(running, data_dir=tmp_path / "elsewhere")  # as oasisd --data-dir
    config.write_text(good.replace("window = 24", "window = 25"))
    fresh = reread(running, config).fresh
    assert fresh is not None and fresh.database_url == running.database_url


def test_a_reload_renaming_a_cordoned_server_warns_that_its_cordon_stays_behind(
    tmp_path: Path,
) -> None:
    """w1 is cordoned (ECC errors, no job on it) and the file renames it w1x. The
    cordon names w1, so the restart would put the machine back in service; the reload
    warned of moved jobs only, and none was planned there: it said nothing. Now it
    names the cordon left behind."""
    tokens = tokens_file(tmp_path / "tokens", {"ops": ("operator", "t-ops")})
    config = config_file(tmp_path, tokens)
    log = tmp_path / "oasisd.log"
    daemon = Daemon(config, log).start()
    try:
        assert daemon.proc is not None
        oasis("cordon", "w1", "--reason", "ECC errors", "--token", "t-ops",
              server=daemon.address)  # fmt: skip
        good = config.read_text()
        config.write_text(good.replace('name="w1"', 'name="w1x"'))
        daemon.proc.send_signal(signal.SIGHUP)
        event = MOVES
        [said] = _wait_for(log, lambda e: e.get("event") == event)
        assert said["moves"].startswith(
            "server w1 is cordoned (ECC errors) but not in the new [cluster]"
        ), said
    finally:
        assert daemon.stop() == 0, log.read_text()[-3000:]


def _wait_for(log: Path, match: Any, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The log's entries that ``match``, once there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in json_log(log) if match(e)]
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"no such entry within {timeout} s:\n{log.read_text()[-3000:]}")


def test_a_value_written_another_way_is_no_edit(tmp_path: Path) -> None:
    """Before: ``tick_seconds = "1s"`` for ``1.0`` (or ``"0.2s"`` for ``0.2``), or
    ``slot_seconds = "1h"`` for ``3600``, was an edit of ``[daemon]``, and the reload said
    `waits for a restart (systemctl restart oasisd): daemon.tick_seconds` of a value that
    had not changed; now only a changed value is."""
    tokens = tokens_file(tmp_path / "tokens", {"alice": ("submitter", "t-alice")})
    path = config_file(tmp_path, tokens)
    running = load(path)
    text = path.read_text()
    assert "tick_seconds = 0.2\n" in text and "slot_seconds = 3600\n" in text, text
    path.write_text(
        text.replace("tick_seconds = 0.2\n", 'tick_seconds = "0.2s"\n').replace(
            "slot_seconds = 3600\n", 'slot_seconds = "1h"\n'
        )
    )
    found = reread(running, Path(running.source))
    assert found.restart == () and found.keys == (), (found.restart, found.keys)
    path.write_text(text.replace("tick_seconds = 0.2\n", 'tick_seconds = "0.3s"\n'))
    found = reread(running, Path(running.source))
    assert found.restart == ("daemon",) and found.keys == ("daemon.tick_seconds",)
