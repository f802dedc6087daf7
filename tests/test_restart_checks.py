"""The checks a start, a takeover and a reload run of a config against the store's jobs
(``controller/admission/restart_checks.py``), read directly on a store a daemon wrote:
the slot grid their plans were made in, the resources their specs name, slot 0."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from sqlalchemy import update

from controller.admission.restart_checks import resources_problem, slot_grid_problem, stored_epoch
from controller.admission.state import EPOCH_KEY, SETTINGS_KEY
from controller.clock import FakeClock
from controller.store import JobRow, MetaRow
from tests.test_daemon_e2e import job
from tests.test_pending import SLOT, controller

RESOURCES = ["gpu", "cpu", "mem", "disk", "bandwidth"]


def test_the_slot_grid_check_refuses_a_slot_0_moved_half_a_second_and_spares_an_empty_store(
    tmp_path: Path,
) -> None:
    """Slot 0 is compared to a millisecond and the slot length to a part in 10^9: a slot
    0 moved by half a second moves every stored plan by as much. A store without jobs
    takes new settings, and a recorded slot length that is no length is not compared.
    The mutation audit: a tolerance of a second, the empty store checked, or a slot of 0
    s compared, each passed every test."""
    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    try:
        epoch = c.slots.epoch
        with c.db.session() as session:  # no job yet: any grid starts
            assert slot_grid_problem(session, SLOT * 2, epoch + 7) is None
        assert asyncio.run(c.submit(job("j"))).state == "admitted"
        with c.db.session() as session:
            assert slot_grid_problem(session, SLOT, epoch) is None
            assert slot_grid_problem(session, SLOT, epoch + 0.0005) is None
            moved = slot_grid_problem(session, SLOT, epoch + 0.5)
            assert moved is not None and "slot 0 begins at" in moved
            longer = slot_grid_problem(session, SLOT * (1 + 1e-6), epoch)
            assert longer is not None and "daemon.slot_seconds" in longer
            recorded = session.get(MetaRow, SETTINGS_KEY)
            assert recorded is not None
            recorded.value = {**recorded.value, "slot_seconds": 0}
        with c.db.session() as session:  # not a length: rewritten, as before
            assert slot_grid_problem(session, SLOT, epoch) is None
    finally:
        c.close()


def test_the_resources_check_reads_the_parameter_servers_demand_of_live_jobs_only(
    tmp_path: Path,
) -> None:
    """A resource only the parameter servers of a live job demand is one the config must
    keep; a job that ended holds nothing to check. The mutation audit: with the ``ps``
    side left out, or ended jobs read too, every test passed."""
    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    try:
        spec = job("j")
        assert asyncio.run(c.submit(spec)).state == "admitted"
        worker = {k: v for k, v in spec["worker"].items() if k != "bandwidth"}
        with c.db.session() as session:  # the worker side names no bandwidth
            session.execute(update(JobRow).where(JobRow.id == "j").values(
                spec=json.dumps({**spec, "worker": worker}, sort_keys=True)))  # fmt: skip
        without = [r for r in RESOURCES if r != "bandwidth"]
        with c.db.session() as session:
            assert resources_problem(session, RESOURCES) is None
            problem = resources_problem(session, without)
        assert problem is not None and "lacks 'bandwidth'" in problem and "'j'" in problem
        asyncio.run(c.cancel("j"))
        with c.db.session() as session:
            assert resources_problem(session, without) is None
    finally:
        c.close()


def test_slot_0_is_read_from_the_epoch_row_before_the_settings(tmp_path: Path) -> None:
    """A start without ``daemon.epoch`` reads slot 0 from the store's ``epoch`` row, the
    recorded settings' only when that row is missing. The mutation audit: with the
    settings' read first, every test passed."""
    clock = FakeClock(1_000_000.0)
    c = controller(tmp_path, clock)
    try:
        epoch = c.slots.epoch
        with c.db.session() as session:
            session.merge(MetaRow(key=EPOCH_KEY, value={"epoch": epoch}))
            recorded = session.get(MetaRow, SETTINGS_KEY)
            assert recorded is not None
            recorded.value = {**recorded.value, "epoch": epoch + SLOT}
        with c.db.session() as session:
            assert stored_epoch(session) == epoch
        with c.db.session() as session:
            session.delete(session.get(MetaRow, EPOCH_KEY))
        with c.db.session() as session:
            assert stored_epoch(session) == epoch + SLOT
    finally:
        c.close()
