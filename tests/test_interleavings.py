"""Random interleavings of tenants' and operators' calls keep the admission controller's
invariants.

The admission controller and the execution plane's daemon side run in-process on a
SQLite file, with a fake wall clock and a fake monotonic clock (as in
tests/test_outage_rebuild.py and tests/test_mqtt_units.py). Each test draws, from a
fixed seed, a sequence of operations: tenants submit (some jobs too long for the window
or too large for any server), cancel, and submit an id again with the same spec or
another; agents report progress on plan, behind it, ahead of it, done, or of another
admission, and go silent and are heard again (some after a restart: a new session),
which fails servers and, with the flapping rule on, holds them out; operators cordon
and uncordon servers (now, ahead, with an end or without, forced or not), restart the
daemon, shrink a server's capacity, reload, prune; time passes within a slot and over
slots. After every operation:

- no server holds more than its capacity, and no amount is negative;
- the store's allocations of each job equal its schedule in the ledger;
- a job in a terminal state holds nothing after the current slot, in the ledger or the
  store, and a pending job holds nothing at all;
- nothing is planned, from the next slot on, on a failed or cordoned server within its
  outage, nor on any server in a slot the ledger blocks it in;
- every job's state moved only along legal transitions;
- a tenant's own call (a submission, a cancellation, a report of its job that failed no
  server) leaves every other job's plan from the next slot on as it was;
- no operation raises anything but the refusals it may give.

Every five operations, and at the end, a controller opened afresh on a copy of the
store rebuilds the ledger, which must equal the running one exactly (used amounts,
prices, blocked cells, each job's schedule): what a restart, a store outage or a
takeover would hold.

These interleavings found three bugs (fixed in commit 307c07c), each also covered by a
test of its own:

- a rebuild in the slot of a server failure, or after a slow job's re-plan, read the
  re-planned job's plan (over its spec's work) as a hand edit and failed the job
  (tests/test_outage_rebuild.py, tests/test_mqtt_units.py);
- a job stranded by a cordon ahead (``--from``) failed but kept its slots up to the
  cordon's start, priced for everyone, planned for no one (tests/test_cordon.py);
- a flapping server's hold-out (a cordon with an end) stayed blocked past its end until
  a rebuild (tests/test_cordon.py).
"""

from __future__ import annotations

import asyncio
import copy
import random
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pytest
import structlog
from sqlalchemy import select

from controller.admission import AdmissionController
from controller.clock import FakeClock, SlotClock
from controller.config import Config, from_dict
from controller.errors import ConflictError, NotFoundError, PreconditionError
from controller.plane.execution import Execution, run_of
from controller.plane.topics import Heartbeat, Progress, TaskProgress
from controller.store import Database
from controller.store.models import AllocationRow, JobRow, OutageRow
from pricing.errors import SpecError
from pricing.schedule import Schedule
from tests.test_cordon import _within_capacity
from tests.test_mqtt_units import PlaneDaemon
from tests.test_outage_rebuild import _state

SLOT = 3600.0
WORKERS = ["w0", "w1", "w2"]
PSS = ["p0", "p1"]
SERVERS = WORKERS + PSS
CLUSTER: dict[str, Any] = {
    "resources": ["gpu", "bandwidth"],
    "servers": [
        *({"name": w, "kind": "worker", "capacity": {"gpu": 4, "bandwidth": 10}} for w in WORKERS),
        *({"name": p, "kind": "ps", "capacity": {"bandwidth": 10}} for p in PSS),
    ],
}
WINDOW = 6
SPEC = PlaneDaemon.SPEC  # 20 mini-batches on one worker and one PS
TENANTS = ["alice", "bob", "carol"]
HEARTBEAT_TIMEOUT = 20.0  # seconds of silence that fail a server
NEXT: dict[str, set[str]] = {  # a job's states after each one, in one step
    "pending": {"admitted", "expired", "cancelled", "rejected"},
    "admitted": {"running", "completed", "cancelled", "failed"},
    "running": {"completed", "cancelled", "failed"},
}
TERMINAL = {"completed", "cancelled", "rejected", "expired", "failed"}
LIVE = {"admitted", "running"}
STEPS = 60
REBUILD_EVERY = 5

Cell = tuple[int, str, str]
"""(slot, server, "w" for workers or "p" for parameter servers)"""


def _reachable(state: str) -> set[str]:
    """The states a job in ``state`` may be in after any number of transitions."""
    seen, todo = {state}, [state]
    while todo:
        for nxt in NEXT.get(todo.pop(), set()) - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def _config(data_dir: Path, flaps: int, w2_gpus: int = 4) -> Config:
    cluster = copy.deepcopy(CLUSTER)
    cluster["servers"][2]["capacity"]["gpu"] = w2_gpus
    mqtt = {"host": "localhost", "heartbeat_timeout": HEARTBEAT_TIMEOUT,
            "heartbeat_seconds": 3.0, "flap_failures": flaps}  # fmt: skip
    return from_dict(
        {
            "daemon": {"data_dir": str(data_dir), "window": WINDOW, "epoch": 0},
            "cluster": cluster,
            "mqtt": mqtt,
        }
    )


def _controller(config: Config, clock: FakeClock) -> AdmissionController:
    c = AdmissionController(
        config,
        Database(config.database_url),
        SlotClock(clock, SLOT, 0.0),
        log=structlog.wrap_logger(structlog.ReturnLogger()),
    )
    c.open()
    return c


def _cells(schedule: Schedule, origin: int) -> dict[Cell, int]:
    """What ``schedule`` holds from slot ``origin`` on, cell by cell."""
    out: dict[Cell, int] = {}
    for i in range(schedule.slots):
        slot = schedule.start + i
        if slot < origin:
            continue
        for kind, names, counts in (("w", WORKERS, schedule.workers), ("p", PSS, schedule.ps)):
            for h, server in enumerate(names):
                if counts[i, h]:
                    out[slot, server, kind] = int(counts[i, h])
    return out


def _plans(c: AdmissionController, from_slot: int | None = None) -> dict[str, dict[Cell, int]]:
    """Each job's cells in the ledger from ``from_slot`` on (the window's first slot:
    None); jobs that hold nothing there are left out."""
    ledger = c._ledger
    first = ledger.origin if from_slot is None else from_slot
    plans = {j: _cells(ledger.schedule(j), first) for j in ledger.job_ids()}
    return {j: cells for j, cells in plans.items() if cells}


@dataclass
class Done:
    """An operation's line for the log, and the job whose tenant made it (None: an
    operator's call or time passing), whose plan alone it may change."""

    text: str
    tenants_job: str | None = None


class Interleaving:
    """One controller with its execution plane, driven by operations drawn from ``seed``."""

    def __init__(self, seed: int, tmp: Path, flaps: int) -> None:
        self.rng = random.Random(seed)
        self.tmp = tmp
        self.flaps = flaps
        self.data = tmp / "data"
        self.data.mkdir()
        self.w2_gpus = 4  # w2's capacity, which an operator changes (op_resize)
        self.config = _config(self.data, flaps)
        self.clock = FakeClock(1.0)
        self.mono = [0.0]
        self.c = _controller(self.config, self.clock)
        self.ex = self._attach_plane()
        self.n = 0  # operations so far (names of jobs, sessions, copies)
        self.tenant: dict[str, str] = {}  # job id -> its tenant
        self.specs: dict[str, dict[str, Any]] = {}
        self.states: dict[str, str] = {}  # as the last check found them
        self.silent: set[str] = set()  # servers whose agents are not heard
        self.sessions = dict.fromkeys(SERVERS, "s0")
        self.counts: dict[tuple[str, str], float] = {}  # (job, server) -> mini-batches
        self.log: list[str] = []

    def _attach_plane(self) -> Execution:
        assert self.c.config.mqtt is not None
        ex = Execution(self.c, self.c.config.mqtt, monotonic=lambda: self.mono[0])
        ex.load()
        self.c.execution = ex
        ex.connected()
        return ex

    def close(self) -> None:
        self.c.close()

    def fail(self, why: str) -> NoReturn:
        tail = "\n    ".join(self.log[-12:])
        pytest.fail(f"{why}\n  after {len(self.log)} operations, the last:\n    {tail}")

    # -- what the daemon's event loop would do --------------------------------------------

    def _review(self) -> list[str]:
        return [e.kind for e in asyncio.run(self.c._run(self.ex.review_sync))]

    def _beats(self) -> None:
        for server in SERVERS:
            if server not in self.silent:
                self.ex.heartbeat(Heartbeat(server, self.sessions[server]))

    def _stored_jobs(self) -> dict[str, JobRow]:
        with self.c.db.session() as s:
            return {row.id: row for row in s.scalars(select(JobRow))}

    def _stored_plans(self) -> dict[str, dict[Cell, int]]:
        with self.c.db.session() as s:
            rows = s.execute(select(AllocationRow.job_id, AllocationRow.slot,
                                    AllocationRow.server, AllocationRow.workers,
                                    AllocationRow.ps)).all()  # fmt: skip
        out: dict[str, dict[Cell, int]] = {}
        for job_id, slot, server, workers, ps in rows:
            cells = out.setdefault(job_id, {})
            if workers:
                cells[slot, server, "w"] = workers
            if ps:
                cells[slot, server, "p"] = ps
        return out

    # -- tenants ----------------------------------------------------------------------------

    def op_submit(self) -> Done:
        rng = self.rng
        tenant = rng.choice(TENANTS)
        job_id = f"{tenant}-{self.n}"
        chunks, epochs = rng.choice([1, 2, 3, 4]), rng.choice([1, 1, 2, 3, 6])
        utility = {**SPEC["utility"], "priority": rng.choice([5, 50, 200, 1000])}
        spec = {**SPEC, "id": job_id, "chunks": chunks, "epochs": epochs, "utility": utility}
        kind = rng.random()
        if kind < 0.07:
            spec["epochs"] = 200  # longer than the window
        elif kind < 0.12:
            spec["worker"] = {"gpu": 5, "bandwidth": 1}  # larger than any server
        elif kind < 0.2:
            spec["chunks"], spec["epochs"] = 12, 4
        wait = rng.choice([None, None, 0.0, 3 * SLOT])
        try:
            view = asyncio.run(self.c.submit(spec, by=tenant, wait_seconds=wait))
        except SpecError as err:
            return Done(f"submit {job_id} refused: {str(err)[:60]}", job_id)
        self.tenant[view.id] = tenant
        self.specs[view.id] = spec
        return Done(f"submit {view.id} ch={spec['chunks']} ep={spec['epochs']} -> {view.state}",
                    view.id)  # fmt: skip

    def op_cancel(self) -> Done | None:
        live = [j for j in self.tenant if self.states.get(j) not in TERMINAL] or list(self.tenant)
        if not live:
            return None
        job_id = self.rng.choice(live)
        try:
            view, released = asyncio.run(self.c.cancel(job_id, by=self.tenant[job_id]))
        except (NotFoundError, PreconditionError, ConflictError) as err:
            return Done(f"cancel {job_id} refused: {type(err).__name__}", job_id)
        return Done(f"cancel {job_id} -> {view.state}, {released} released", job_id)

    def op_resubmit(self) -> Done | None:
        if not self.tenant:
            return None
        job_id = self.rng.choice(list(self.tenant))
        spec = {**self.specs[job_id], "id": job_id.split(":", 1)[1]}
        other = self.rng.random() < 0.3
        if other:
            spec["epochs"] += 1
        try:
            view = asyncio.run(self.c.submit(spec, by=self.tenant[job_id]))
        except ConflictError:
            return Done(f"resubmit {job_id} (another spec: {other}) refused", job_id)
        if other:
            self.fail(f"{job_id} submitted again with another spec was taken: {view.state}")
        return Done(f"resubmit {job_id} -> {view.state}", job_id)

    # -- agents -----------------------------------------------------------------------------

    def op_report(self) -> Done:
        rng, now = self.rng, self.c.slot
        rows = [(j, cell[1]) for j, cells in self._stored_plans().items()
                for cell in cells if cell[2] == "w" and now - 1 <= cell[0] <= now + 1]  # fmt: skip
        if rng.random() < 0.8:  # mostly of jobs that run
            rows = [r for r in rows if self.states.get(r[0]) in LIVE] or rows
        if rows and rng.random() < 0.75:
            job_id, server = rng.choice(sorted(rows))
        else:  # of a job not planned there, or not known at all
            job_id = rng.choice([*self.tenant, "ghost"])
            server = rng.choice(WORKERS)
        spec = self.specs.get(job_id, SPEC)
        total = float(spec["epochs"] * spec["chunks"] * spec["minibatches"])
        mode = rng.choice(["plan", "plan", "behind", "behind", "ahead", "done", "done", "other"])
        before = self.counts.get((job_id, server), 0.0)
        minibatches = {
            "done": total,
            "ahead": min(total, before + total * 0.6),
            "behind": before + 0.1,
        }.get(mode, min(total, before + total * 0.25))
        seconds = minibatches * (50.0 if mode == "behind" else 0.2)
        row = self._stored_jobs().get(job_id)
        run = run_of(row.decided_at) if row is not None and row.decided_at is not None else ""
        if mode == "other":  # counts of another admission of the same id
            run, minibatches = "1999-01-01T00:00:00.000000Z", total
        else:
            self.counts[job_id, server] = minibatches
        task = TaskProgress(job_id, minibatches, seconds, run)
        self.ex.report(Progress(server, self.sessions[server], [task]))
        self._beats()
        kinds = self._review()
        text = f"report {job_id}@{server} {mode} {minibatches:.1f}/{total:g} -> {kinds}"
        return Done(text, None if "server_failed" in kinds else job_id)

    def op_silence(self) -> Done:
        heard = [s for s in SERVERS if s not in self.silent]
        if self.silent and (not heard or self.rng.random() < 0.3):
            server = self.rng.choice(sorted(self.silent))
            self.silent.discard(server)
            if self.rng.random() < 0.5:
                self.sessions[server] = f"s{self.n}"  # its agent restarted
            return Done(f"agent of {server} heard again")
        server = self.rng.choice(heard)
        self.silent.add(server)
        return Done(f"agent of {server} silent")

    # -- operators --------------------------------------------------------------------------

    def op_cordon(self) -> Done:
        rng, now = self.rng, self.c.slot
        server = rng.choice(SERVERS)
        start = rng.choice([None, None, now + 2, now + 3, now + 8])
        until = rng.choice([None, None, (start or now + 1) + rng.choice([1, 2, 4])])
        force = rng.random() < 0.5
        text = f"cordon {server} from {start} until {until} force={force}"
        try:
            view = asyncio.run(self.c.cordon(server, "audit", "ops", force=force, until=until,
                                              start=start))  # fmt: skip
        except (PreconditionError, SpecError, NotFoundError) as err:
            return Done(f"{text} refused: {type(err).__name__}: {str(err)[:80]}")
        return Done(f"{text} -> {view.get('moved')}")

    def op_uncordon(self) -> Done:
        server = self.rng.choice(SERVERS)
        try:
            asyncio.run(self.c.uncordon(server, "ops"))
        except (PreconditionError, NotFoundError) as err:
            return Done(f"uncordon {server} refused: {type(err).__name__}")
        return Done(f"uncordon {server}")

    def op_restart(self) -> Done:
        self.c.close()
        self.c = _controller(self.config, self.clock)
        self.ex = self._attach_plane()
        asyncio.run(self.c.tick())
        return Done(f"restart in slot {self.c.slot}")

    def op_resize(self) -> Done:
        self.w2_gpus = self.rng.choice([1, 2, 4, 4])
        self.config = _config(self.data, self.flaps, self.w2_gpus)
        return Done(f"w2 has {self.w2_gpus} GPUs; {self.op_restart().text}")

    def op_reload(self) -> Done:
        asyncio.run(self.c.reconfigure(self.c.config))
        return Done("reload")

    def op_prune(self) -> Done:
        return Done(f"prune -> {asyncio.run(self.c.prune())}")

    # -- time -------------------------------------------------------------------------------

    def op_time(self) -> Done:
        seconds = self.rng.choice([5.0, 12.0, 25.0, 60.0])
        self.mono[0] += seconds
        self.clock.advance(seconds)
        self._beats()
        return Done(f"+{seconds:g} s -> {self._review()}")

    def op_slot(self) -> Done:
        slots = self.rng.choice([1, 1, 1, 2, 3, 7])
        self.clock.advance(slots * SLOT)
        self.mono[0] += 30.0  # the broker's link was up for some of it
        self._beats()
        asyncio.run(self.c.tick())
        return Done(f"+{slots} slots -> slot {self.c.slot} {self._review()}")

    OPS: tuple[tuple[str, int], ...] = (
        ("submit", 8), ("cancel", 2), ("report", 8), ("cordon", 2), ("uncordon", 2),
        ("silence", 2), ("time", 3), ("slot", 3), ("restart", 1), ("prune", 1), ("reload", 1),
        ("resize", 1), ("resubmit", 1),
    )  # fmt: skip

    def step(self) -> None:
        """One operation drawn at random, and the checks after it."""
        self.n += 1
        names, weights = zip(*self.OPS, strict=True)
        name = self.rng.choices(names, weights)[0]
        op: Callable[[], Done | None] = getattr(self, "op_" + name)
        slot = self.c.slot
        before = _plans(self.c, slot + 1)
        try:
            done = op()
        except Exception as err:
            self.log.append(f"{name}: raised")
            self.fail(f"{name} raised {type(err).__name__}: {err}")
        if done is None:
            self.log.append(f"{name}: nothing to do it on")
            return
        self.log.append(done.text)
        subject = done.tenants_job
        if subject is not None and self.c.slot == slot:
            after = _plans(self.c, slot + 1)
            for job_id, plan in before.items():
                if job_id != subject and after.get(job_id, {}) != plan:
                    self.fail(f"{done.text}: {job_id}'s plan changed from {plan} to "
                              f"{after.get(job_id)}")  # fmt: skip
        try:
            self.check()
        except AssertionError as err:
            self.fail(str(err))

    # -- invariants -------------------------------------------------------------------------

    def check(self) -> None:
        c, ledger = self.c, self.c._ledger
        now = c.slot
        _within_capacity(c)
        for side in (ledger.worker_side, ledger.ps_side):
            assert (side.used >= 0).all(), side.used.min()
            assert (side.job_used() >= -1e-12).all(), side.job_used().min()
        in_ledger, origin = set(ledger.job_ids()), ledger.origin
        stored_plans = self._stored_plans()
        for job_id, row in self._stored_jobs().items():
            state, was = row.state, self.states.get(job_id)
            if was is not None and state not in _reachable(was):
                self.fail(f"{job_id} went from {was} to {state}")
            self.states[job_id] = state
            stored = {k: v for k, v in stored_plans.get(job_id, {}).items() if k[0] >= origin}
            stored_ahead = {k: v for k, v in stored.items() if k[0] > now}
            if state == "pending" and stored:
                self.fail(f"pending {job_id} holds {stored}")
            if state in TERMINAL and stored_ahead:
                self.fail(f"{state} {job_id} holds {stored_ahead} in the store")
            if job_id not in in_ledger:
                if state in LIVE and stored_ahead:
                    self.fail(f"{state} {job_id} is in the store, not in the ledger")
                continue
            held = _cells(ledger.schedule(job_id), origin)
            if state in TERMINAL and any(k[0] > now for k in held):
                self.fail(f"{state} {job_id} holds {held} in the ledger")
            if held != stored:
                self.fail(f"{job_id} ({state}): the store holds {sorted(stored.items())}, "
                          f"the ledger {sorted(held.items())}")  # fmt: skip
        with c.db.session() as s:
            outages = [(o.server, o.down_from, o.up_from, o.cause)
                       for o in s.scalars(select(OutageRow))]  # fmt: skip
        for server, down_from, up_from, cause in outages:
            end = up_from if up_from is not None else 1 << 60
            for job_id, cells in stored_plans.items():
                if self.states.get(job_id) not in LIVE:
                    continue
                for slot, on, _kind in cells:
                    if on == server and max(down_from, now + 1) <= slot < end:
                        self.fail(f"{job_id} holds {server} in slot {slot}, in its outage "
                                  f"({cause}) [{down_from}, {up_from})")  # fmt: skip
        for job_id in in_ledger:
            schedule = ledger.schedule(job_id)
            for side, counts in ((ledger.worker_side, schedule.workers),
                                 (ledger.ps_side, schedule.ps)):  # fmt: skip
                for i in range(schedule.slots):
                    t = schedule.start + i
                    cell_row = t - origin  # the ledger's row of slot t
                    blocked = t > now and 0 <= cell_row < side.blocked.shape[0]
                    if blocked and (counts[i] > 0)[side.blocked[cell_row]].any():
                        self.fail(f"{job_id} holds a blocked server in slot {t}")

    def check_rebuild(self) -> None:
        """A controller opened on a copy of the store holds the same ledger, exactly."""
        copied = self.tmp / f"copy{self.n}"
        copied.mkdir()
        source = sqlite3.connect(self.config.database_url.split("///", 1)[1])
        target = sqlite3.connect(copied / "oasis.db")
        try:
            source.backup(target)
        finally:
            source.close()
            target.close()
        fresh = _controller(_config(copied, self.flaps, self.w2_gpus), FakeClock(self.clock.now()))
        try:
            live, again = self.c._ledger, fresh._ledger
            names = ("worker used", "worker prices", "worker blocked",
                     "PS used", "PS prices", "PS blocked")  # fmt: skip
            if live.origin != again.origin:
                self.fail(f"a rebuild's window begins at {again.origin}, not {live.origin}")
            for name, a, b in zip(names, _state(live), _state(again), strict=True):
                if not np.array_equal(a, b):
                    at = [tuple(i) for i in np.argwhere(a != b)[:4].tolist()]
                    self.fail(f"a rebuild's {name} differ at {at} (slot, server, resource): "
                              f"live {[float(a[i]) for i in at]}, "
                              f"rebuilt {[float(b[i]) for i in at]}")  # fmt: skip
            plans, rebuilt = _plans(self.c), _plans(fresh)
            for job_id in sorted(set(plans) | set(rebuilt)):
                if plans.get(job_id) != rebuilt.get(job_id):
                    self.fail(f"a rebuild's plan of {job_id}: {rebuilt.get(job_id)}, live "
                              f"{plans.get(job_id)}")  # fmt: skip
        finally:
            fresh.close()
            shutil.rmtree(copied)


SEEDS = [
    (14, 3), (35, 3), (60, 3), (27, 3), (50, 3), (90, 3), (10, 2), (1, 2), (64, 2),
    (0, 3), (3, 0), (7, 0),
]  # fmt: skip
"""(seed, flap_failures), the flapping rule on (3, the default; 2, oftener) and off. With
the fixes of commit 307c07c reverted one at a time, 14, 35 and 60 meet the first bug, 27,
50 and 90 the second, 10, 1 and 64 the third (a few seeds in a hundred do, at 60
operations each). A change to the controller's decisions may move them off a bug; the
tests of each fix keep guarding it."""


@pytest.mark.parametrize(("seed", "flaps"), SEEDS)
def test_random_interleavings_keep_the_invariants(tmp_path: Path, seed: int, flaps: int) -> None:
    run = Interleaving(seed, tmp_path, flaps)
    try:
        for i in range(1, STEPS + 1):
            run.step()
            if i % REBUILD_EVERY == 0 or i == STEPS:
                run.check_rebuild()
    finally:
        run.close()
