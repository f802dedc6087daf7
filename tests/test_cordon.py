"""Cordoned servers (controller/admission/cordons.py): an operator takes a server out of
service from the next slot on, its jobs move as after a failure, the store keeps it
across restarts, heartbeats never end it, and ``oasis uncordon`` gives it back.

In-process on a SQLite file with a fake clock (the controller of
tests/test_outage_rebuild.py), and the CLI against a real daemon.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest
from sqlalchemy import select

from controller.admission import AdmissionController
from controller.admission.views import Cordon
from controller.errors import NotFoundError, PreconditionError
from controller.metrics import Metrics
from controller.store.models import AllocationRow, EventRow, JobRow, OutageRow
from pricing.errors import SpecError
from tests.servers import Daemon, json_log, oasis, write_config
from tests.test_daemon_e2e import job
from tests.test_metrics import parse, value
from tests.test_outage_rebuild import JOB, _open, _state


def _on(c: AdmissionController, server: str, from_slot: int) -> dict[str, int]:
    """Workers (or PS) each job holds on ``server`` from ``from_slot`` on, in the store."""
    with c.db.session() as s:
        rows = s.execute(
            select(AllocationRow.job_id, AllocationRow.workers, AllocationRow.ps).where(
                AllocationRow.server == server, AllocationRow.slot >= from_slot
            )
        ).all()
    out: dict[str, int] = {}
    for job_id, workers, ps in rows:
        out[job_id] = out.get(job_id, 0) + workers + ps
    return out


def _fill(c: AdmissionController, n: int) -> list[str]:
    decided = [asyncio.run(c.submit({**JOB, "id": f"j{i}"})) for i in range(n)]
    return [d.id for d in decided if d.decision.admitted]


def _within_capacity(c: AdmissionController) -> None:
    ledger = c._ledger
    for side in (ledger.worker_side, ledger.ps_side):
        assert (side.used <= side.capacity[None, :, :] + 1e-9).all()


def test_a_cordon_moves_the_jobs_off_from_the_next_slot_and_outlives_a_restart(
    tmp_path: Path,
) -> None:
    c = _open(tmp_path)
    try:
        admitted = _fill(c, 4)
        planned = _on(c, "w0", 1)
        assert admitted and planned, "the test needs jobs planned on w0"
        current = _on(c, "w0", 0).keys() - planned.keys()  # held in slot 0 only, if any

        view = asyncio.run(c.cordon("w0", "disk swap", "ops"))
        assert view["from_slot"] == 1 and not view["already"]
        assert set(view["moved"]) == set(planned)  # every job planned there from slot 1
        assert set(view["moved"].values()) <= {"replaced", "replanned", "stranded"}
        assert _on(c, "w0", 1) == {}  # the store holds nothing there from slot 1 on
        w0 = c.cluster.worker_names.index("w0")
        ledger = c._ledger
        assert ledger.worker_side.blocked[1:, w0].all()  # full to every search from slot 1
        for j in ledger.job_ids():  # and no plan holds it there
            assert not ledger.schedule(j).after(1).workers[:, w0].any(), j
        assert _on(c, "w0", 0).keys() >= current  # slot 0 runs as planned
        _within_capacity(c)
        with c.db.session() as s:
            event = s.scalars(select(EventRow).where(EventRow.kind == "server_cordoned")).one()
            outage = s.scalars(select(OutageRow)).one()
        assert event.detail["reason"] == "disk swap" and event.detail["by"] == "ops"
        assert event.detail["jobs"] == list(view["moved"])
        assert (outage.cause, outage.down_from, outage.up_from) == ("cordoned", 1, None)

        # new jobs go around it; cordoning again changes nothing
        more = asyncio.run(c.submit({**JOB, "id": "after"}))
        assert "after" not in _on(c, "w0", 1)
        again = asyncio.run(c.cordon("w0"))
        assert again["already"] and again["from_slot"] == 1 and not again["moved"]
        states = c.between_decisions(c.server_states)
        assert states == {"w0": "cordoned", "w1": "up", "p0": "up"}
        scraped = parse(generate_latest(Metrics(c).registry).decode())
        assert value(scraped, "oasis_servers", state="cordoned") == 1
        assert value(scraped, "oasis_servers", state="up") == 2
        live = _state(c._ledger)
        assert more.decision is not None
    finally:
        c.close()

    c = _open(tmp_path)  # a restart blocks it again, from the store
    try:
        assert c.cordoned == {"w0": Cordon(1, "disk swap", "ops")}  # who and why, kept
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)  # the same ledger, bit for bit

        back = asyncio.run(c.uncordon("w0", "ops"))
        assert back == {"server": "w0", "from_slot": 1, "already": False, "failed": False}
        assert not c._ledger.worker_side.blocked[1:, w0].any()
        assert c.between_decisions(c.server_states)["w0"] == "up"
        assert asyncio.run(c.uncordon("w0"))["already"]
        live = _state(c._ledger)
    finally:
        c.close()

    c = _open(tmp_path)  # and after the uncordon, a restart leaves it in service
    try:
        assert c.cordoned == {}
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)
        with c.db.session() as s:
            assert s.scalars(select(OutageRow.up_from)).one() == 1
    finally:
        c.close()


BIG = {**JOB, "id": "big", "epochs": 20, "minibatches": 8,
       "utility": {"kind": "sigmoid", "priority": 100, "decay": 0.1, "target": 12}}  # fmt: skip
"""A job that needs both worker servers for most of the window: without w0 it fails."""


def test_a_dry_run_changes_nothing_and_a_cordon_that_fails_jobs_needs_force(
    tmp_path: Path,
) -> None:
    c = _open(tmp_path)
    try:
        assert asyncio.run(c.submit(BIG)).decision.admitted
        before = _state(c._ledger)
        trial = asyncio.run(c.cordon("w0", dry_run=True))
        assert trial["dry_run"] and trial["moved"] == {"big": "stranded"}
        for a, b in zip(before, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)  # the ledger as it was
        with pytest.raises(PreconditionError) as refused:
            asyncio.run(c.cordon("w0", "maintenance"))
        assert str(refused.value) == (
            "cordoning w0 from slot 1 would fail 1 job that fits nowhere else (big); nothing "
            "changed. --force cordons it anyway, --dry-run shows every move"
        )
        for a, b in zip(before, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)
        with c.db.session() as s:  # nothing stored either
            assert s.scalars(select(OutageRow)).all() == []
            assert s.scalars(select(EventRow.kind)).all() == ["decided"]
        assert c.cordoned == {}

        done = asyncio.run(c.cordon("w0", "maintenance", force=True))
        assert done["moved"] == {"big": "stranded"} and not done["dry_run"]
        with c.db.session() as s:
            kinds = s.scalars(select(EventRow.kind).order_by(EventRow.sequence)).all()
            row = s.get(JobRow, "big")
            assert row is not None and row.state == "failed"
        assert kinds == ["decided", "failed", "server_cordoned"]
    finally:
        c.close()


def test_a_cordon_names_what_is_wrong(tmp_path: Path) -> None:
    c = _open(tmp_path)
    try:
        with pytest.raises(
            NotFoundError, match=r"no server 'gpu-a' in \[cluster\] \(servers: w0, w1"
        ):
            asyncio.run(c.cordon("gpu-a"))
        with pytest.raises(
            NotFoundError, match=r"no server 'W0' in \[cluster\]; did you mean 'w0'\?"
        ):
            asyncio.run(c.uncordon("W0"))
        with pytest.raises(SpecError, match="reason: at most 500 characters"):
            asyncio.run(c.cordon("w0", "x" * 501))
        assert c.cordoned == {}
    finally:
        c.close()


def test_a_job_that_cannot_fit_for_servers_out_of_service_is_told_which(
    tmp_path: Path,
) -> None:
    """A job rejected as it cannot fit names the servers out of service (before: with
    every parameter server cordoned, ``it needs 21 worker-slots ..., and only 48 are
    free``, a contradiction that read as a full cluster)."""
    c = _open(tmp_path)
    try:
        asyncio.run(c.cordon("p0"))
        reason = asyncio.run(c.submit({**JOB, "id": "no-ps"})).decision.reason
        assert reason.startswith("cannot fit: its parameter servers do not fit in slots 1..")
        assert "for the 21 it needs)" in reason, reason
        assert reason.endswith("; out of service in those slots: p0"), reason
        asyncio.run(c.uncordon("p0"))
        asyncio.run(c.cordon("w0"))
        asyncio.run(c.cordon("w1"))
        reason = asyncio.run(c.submit({**JOB, "id": "no-workers"})).decision.reason
        assert reason.startswith("cannot fit: it needs 21 worker-slots in slots 1..")
        assert "only 0 worker-slots are free there" in reason, reason
        assert reason.endswith("; out of service in those slots: w0, w1"), reason
    finally:
        c.close()


def test_the_execution_plane_neither_ends_a_cordon_nor_reads_it_as_a_failure(
    tmp_path: Path,
) -> None:
    """A cordoned server's agent that falls silent and comes back: the failure and the
    recovery are recorded, and the server stays out until the operator's uncordon; one
    that also failed stays out after the uncordon until its agent is heard again."""
    from controller.plane.execution import Execution
    from controller.plane.settings import mqtt_from_dict

    c = _open(tmp_path)
    try:
        _fill(c, 2)
        asyncio.run(c.cordon("w0"))
        mqtt = mqtt_from_dict({"host": "127.0.0.1"})
        assert mqtt is not None
        c.config = replace(c.config, mqtt=mqtt)  # a plane runs only with [mqtt]
        plane = Execution(c, mqtt)
        plane.load()
        assert "w0" not in plane.failed  # a cordon is no failure
        w0 = c.cluster.worker_names.index("w0")
        c.between_decisions(lambda: plane._fail_sync("w0"))  # its agent fell silent
        c.between_decisions(lambda: plane._recover_sync("w0"))  # and is back
        assert c._ledger.worker_side.blocked[1:, w0].all()  # still cordoned
        assert c.cordoned == {"w0": Cordon(1)}

        c.between_decisions(lambda: plane._fail_sync("w0"))  # silent again, then uncordoned
        back = asyncio.run(c.uncordon("w0"))
        assert back["failed"] and c._ledger.worker_side.blocked[1:, w0].all()
        c.between_decisions(lambda: plane._recover_sync("w0"))  # heard again: in service
        assert not c._ledger.worker_side.blocked[1:, w0].any()
        with c.db.session() as s:
            causes = s.execute(select(OutageRow.cause, OutageRow.up_from)).all()
        assert sorted(causes) == [("cordoned", 1), ("failed", 1), ("failed", 1)]
    finally:
        c.close()


def test_without_an_execution_plane_an_uncordon_ends_a_failure_nothing_else_would(
    tmp_path: Path,
) -> None:
    """A failure the execution plane recorded before ``[mqtt]`` was turned off: no agent
    can be heard again to end it, so an uncordon does (before: the server stayed out for
    good, and ``oasis uncordon`` said it stays out until its agent is heard again)."""
    c = _open(tmp_path)
    try:
        with c.db.session() as s:
            s.add(OutageRow(server="w0", down_from=1, up_from=None, detected_at=datetime.now(UTC)))
            s.commit()
    finally:
        c.close()
    c = _open(tmp_path)  # no [mqtt]
    try:
        w0 = c.cluster.worker_names.index("w0")
        assert c.between_decisions(c.server_states)["w0"] == "failed"
        back = asyncio.run(c.uncordon("w0", "ops"))
        assert back == {"server": "w0", "from_slot": 1, "already": False, "failed": False}
        assert not c._ledger.worker_side.blocked[1:, w0].any()
        assert c.between_decisions(c.server_states)["w0"] == "up"
        assert asyncio.run(c.uncordon("w0"))["already"]
        with c.db.session() as s:
            assert s.scalars(select(OutageRow.up_from)).all() == [1]
            event = s.scalars(select(EventRow).where(EventRow.kind == "server_uncordoned")).one()
        assert event.detail["failure_ended"] is True
        live = _state(c._ledger)
    finally:
        c.close()
    c = _open(tmp_path)  # and a restart reads it so
    try:
        for a, b in zip(live, _state(c._ledger), strict=True):
            assert np.array_equal(a, b)
    finally:
        c.close()


def test_oasis_cordon_and_uncordon_against_a_daemon(tmp_path: Path) -> None:
    extra = '[web]\nlisten = "127.0.0.1:0"\n'
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", extra=extra)
    daemon = Daemon(config, tmp_path / "oasisd.log").start()
    web = next(
        e["address"]
        for e in json_log(tmp_path / "oasisd.log")
        if e.get("event") == "console listening"
    )
    try:
        server = ["--server", daemon.address]
        spec = tmp_path / "job.json"
        spec.write_text(json.dumps(job("c1")))
        oasis("submit", str(spec), *server)
        trial = oasis("cordon", "w2", "--dry-run", *server).stdout
        assert (
            trial.startswith("w2: a cordon from slot 1 (")
            and "nothing changed (--dry-run)" in trial
        )
        listed = oasis("servers", *server).stdout.splitlines()
        assert any(line.split()[:3] == ["w2", "worker", "up"] for line in listed)  # unchanged
        out = oasis("cordon", "w2", "--reason", "GPU 3 errors", *server).stdout
        assert out.startswith("w2: cordoned from slot 1 (")
        assert "no new plans there (oasis uncordon w2 gives it back)" in out
        listed = oasis("servers", *server).stdout
        assert any(line.split()[:3] == ["w2", "worker", "cordoned"] for line in listed.splitlines())
        assert "\nw2: cordoned from slot 1 (" in listed
        assert listed.rstrip().endswith("): GPU 3 errors (oasis uncordon w2)")
        assert any(line.split()[:3] == ["w0", "worker", "up"] for line in listed.splitlines())
        with urllib.request.urlopen(f"http://{web}/api/overview", timeout=10) as r:
            assert json.load(r)["out_of_service"] == {"w2": "cordoned"}
        screen = oasis("status", *server).stdout.splitlines()
        assert "cordoned; " in next(x for x in screen if x.startswith("w2 "))
        assert "cordoned" not in next(x for x in screen if x.startswith("w0 "))
        again = json.loads(oasis("cordon", "w2", "--json", *server).stdout)
        assert again == {"server": "w2", "from_slot": 1, "already": True, "moved": [],
                         "dry_run": False}  # fmt: skip
        missing = oasis("cordon", "w9", *server, check=False)
        assert missing.returncode == 1 and "no server 'w9'" in missing.stderr
        out = oasis("uncordon", "w2", *server).stdout
        assert out.startswith("w2: back in service from slot 1 (")
        assert "not cordoned; nothing changed" in oasis("uncordon", "w2", *server).stdout
    finally:
        assert daemon.stop() == 0


def test_a_moved_plan_is_shown_as_re_planned_not_as_a_payoff_over_its_utility() -> None:
    """``oasis job`` of a job whose plan moved (a cordon, a failure) showed its decision's
    cost and payoff next to its new plan's utility: ``utility 18.9, cost 0.23, payoff
    30.9``."""
    from controller.commands.client import _worth_words
    from controller.rpc import oasis_pb2 as pb

    as_decided = pb.Decision(admitted=True, utility=31.123, cost=0.231, payoff=30.892)
    assert _worth_words(as_decided) == "utility 31.123, cost 0.231, payoff 30.892"
    moved = pb.Decision(admitted=True, utility=18.877, cost=0.231, payoff=30.892)
    assert _worth_words(moved) == (
        "utility 18.877 as re-planned (its 'replanned' events say why); admitted with "
        "utility 31.123, cost 0.231, payoff 30.892"
    )
