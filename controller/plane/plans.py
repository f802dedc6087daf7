"""The plans the daemon publishes to the node agents: each server's tasks for the current
and the next slot (each with its job's demand per worker, or per PS), with its device
(GPU) count, computed from the store (the source of
truth) in a thread of its own, after every decision so far is committed (see
:meth:`~controller.plane.execution.Execution.plans_begin`);
and the epochs they go out under, moved above the agents' when they follow another
daemon's plans (:class:`EpochClaims`).

:class:`~controller.plane.execution.Execution` publishes what :class:`PlanBuilder`
builds (:meth:`~controller.plane.execution.Execution.plans_sync`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.plane.demand import MAX_DEMAND_ENTRIES, NAME_CHARACTERS, Demand, carried, plain
from controller.plane.devices import MAX_DEVICES
from controller.plane.jobs import ACTIVE, Jobs
from controller.plane.part import PlanePart
from controller.plane.plan_messages import Plan, SlotPlan, Task
from controller.plane.port import AdmissionPort
from controller.plane.settings import MqttConfig
from controller.store import AllocationRow, JobRow
from controller.store.stored import count_problem
from pricing.errors import SpecError
from pricing.job import Job

__all__ = [
    "BUMP_SECONDS",
    "CAPACITY_SLACK",
    "MAX_EPOCH_STEP",
    "MAX_FOLLOWED_EPOCH",
    "MAX_SKIPPED_LOGGED",
    "EpochClaims",
    "PlanBuilder",
    "plan_task",
    "run_of",
    "task_demand",
]

BUMP_SECONDS = 60.0
"""At most one move of the epoch above the agents' (see
:meth:`controller.plane.execution.Execution.plans_sync`) per this many seconds: two
daemons publishing under one topic prefix (a misconfiguration) would otherwise move above
each other at every round, each sending every plan again."""
MAX_EPOCH_STEP = 1 << 40
"""The furthest above this daemon's epoch a heartbeat's may move it (a trillion rounds: no
store restored from a backup is that far behind; a hostile claim moves it only so far)."""
CAPACITY_SLACK = 1e-6
"""Relative (and absolute) use past a server's capacity a plan built from the store may
show before its row is left out: the ledger places up to ``1e-9`` of a worker's demand
past it (SPEC 5's room rule), far below this."""
MAX_SKIPPED_LOGGED = 1000
"""Stored allocation rows left out of the plans that are logged, one line each, over the
daemon's life (a store edited in bulk is not logged row by row without end)."""
MAX_FOLLOWED_EPOCH = 1 << 52
"""The highest epoch an agent's heartbeat may move this daemon's to (see
:meth:`controller.plane.execution.Execution.plans_sync`): plan epochs are at most 2**53,
so a hostile agent's claim leaves room for 2**52 more rounds."""


def run_of(decided_at: Any) -> str:
    """A job's ``run`` in plans and reports (:class:`~controller.plane.plan_messages.Task`): the
    time it was admitted, to the microsecond (UTC, as the store keeps it). Every head node
    of one store gives the same; an id used again gets another. "" if it does not read."""
    if not isinstance(decided_at, datetime):
        return ""
    at: datetime = decided_at
    if at.tzinfo is not None:  # PostgreSQL gives it in the session's time zone (PGTZ,
        at = at.astimezone(UTC)  # options): the same run whatever it is
    return at.strftime("%Y%m%dT%H%M%S.%f")  # naive: UTC, as SQLite keeps it


class EpochClaims:
    """Heartbeats' claims that their agent follows a plan of an epoch above this
    daemon's, and when the epoch moves above them (at most every :data:`BUMP_SECONDS`).

    :meth:`heard` (event loop) and :meth:`take` (decision thread) are called with the
    plane's inbox lock held (:class:`~controller.plane.execution.Execution`);
    :meth:`bumped` in the decision thread, after :meth:`take`.

    Args:
        mqtt: the broker settings (``heartbeat_seconds``).
        monotonic: the clock claims are timed with, seconds.
    """

    def __init__(self, mqtt: MqttConfig, monotonic: Callable[[], float]) -> None:
        self.mqtt = mqtt
        self.monotonic = monotonic
        # the highest epoch an agent follows above this daemon's (its heartbeats), and
        # that agent's server: plans of another daemon's store, which hide this one's
        self._ahead: tuple[int, str] = (0, "")
        self._ahead_since: float | None = None  # monotonic time of the first such claim
        self._bumped_at: float | None = None  # monotonic time of the last such move

    def heard(self, epoch: int, server: str, own: int) -> bool:
        """A heartbeat of ``server`` says its agent follows ``epoch`` (this daemon's is
        ``own``): True if the epoch moves above the agents' at the next round."""
        if not own < epoch <= min(MAX_FOLLOWED_EPOCH, own + MAX_EPOCH_STEP):
            return False
        if epoch > self._ahead[0]:
            self._ahead = (epoch, server)
        if self._ahead_since is None:
            self._ahead_since = self.monotonic()
        return self._bump_due()

    def take(self) -> tuple[int, str, bool]:
        """``(epoch, server, due)``: the highest claim heard (0 if none) and its server,
        and whether the epoch moves above it now (then the claims start again)."""
        (ahead, by) = self._ahead
        due = self._bump_due()
        if due:  # else it stays for the first round it is due at
            self._ahead, self._ahead_since = (0, ""), None
        return ahead, by, due

    def bumped(self) -> None:
        """The epoch moved above the agents' now."""
        self._bumped_at = self.monotonic()

    def _bump_due(self) -> bool:
        """Whether the epoch moves above the agents' at the next round (the inbox lock
        held): a beat's claim was heard an agent's beat ago (so every agent has said which
        epoch it follows: the first claim heard may be a lagging agent's), and the last
        move was :data:`BUMP_SECONDS` ago."""
        now = self.monotonic()
        heard = (
            self._ahead_since is not None and now - self._ahead_since >= self.mqtt.heartbeat_seconds
        )
        paused = self._bumped_at is not None and now - self._bumped_at < BUMP_SECONDS
        return heard and not paused


def task_demand(job: Job, kind: str, resources: list[tuple[int, str]]) -> Demand:
    """One worker's (``kind`` ``"worker"``) or PS's demand of ``job`` for its plan's
    tasks: each of ``resources`` (``(index, name)``), a zero amount included. Before,
    zeros were left out, and an agent's memory guard read a job that declared no memory
    (``mem`` left out of its spec) as one of no limit: its workers grew unchecked on a
    server whose memory the daemon had given to other tenants' jobs."""
    per = job.worker if kind == "worker" else job.ps
    return {name: plain(float(per[i])) for i, name in resources}


def plan_task(
    job_id: str,
    job: Job,
    kind: str,
    workers: int,
    ps: int,
    run: str,
    device: int | None,
    demand: Demand,
    slot_seconds: float,
) -> Task:
    """The task of ``job`` (stored as ``job_id``) on a server of ``kind`` in one slot:
    ``workers`` and ``ps`` there, its admission ``run``, the devices of one of its
    workers (or PS) by the resource index ``device`` (None: none said), at most
    :data:`~controller.plane.devices.MAX_DEVICES` as a server's are, and ``demand``
    (:func:`task_demand`). Whatever job the daemon admits gives a task agents parse
    (``tests/test_plan_tasks.py``): an entry they refuse is left out, its job not run."""
    per = job.worker if kind == "worker" else job.ps
    devices = min(float(MAX_DEVICES), float(per[device])) if device is not None else 0.0
    return Task(job_id, workers, ps, job.minibatch_slots * slot_seconds,
                job.total_minibatches, run, devices, demand)  # fmt: skip


class PlanBuilder(PlanePart):
    """Every server's plan for a slot and the next (:meth:`build`: any thread; it reads
    only the store, the job specs and what it is handed).

    Args:
        controller: the opened admission controller.
        mqtt: the broker settings (``heartbeat_seconds``, ``device_resource``).
        server_index: server name -> ``(kind, index)`` (``"worker"`` or ``"ps"``).
        jobs: the plane's job specs.
    """

    def __init__(
        self,
        controller: AdmissionPort,
        mqtt: MqttConfig,
        server_index: dict[str, tuple[str, int]],
        jobs: Jobs,
    ) -> None:
        super().__init__(controller, mqtt, jobs)
        self.server_index = server_index
        # (job, server, slot) of the stored rows left out of plans and logged
        self._skipped: set[tuple[str, str, str]] = set()

    def build(
        self, session: Session, s: int, epoch: int, store_id: str, failed: dict[str, float]
    ) -> list[Plan]:
        """The plans of every server for slots ``s`` and ``s + 1`` from the store
        (``session``), under ``epoch``, for the store ``store_id``; those of ``failed``
        servers say they are down."""
        tasks: dict[tuple[str, int], list[Task]] = {}
        rows = session.execute(
            select(AllocationRow.job_id, AllocationRow.slot, AllocationRow.server,
                   AllocationRow.workers, AllocationRow.ps, JobRow.decided_at)
            .join(JobRow, JobRow.id == AllocationRow.job_id)
            .where(AllocationRow.slot.in_((s, s + 1)), JobRow.state.in_(ACTIVE))
            .order_by(JobRow.sequence)
        ).all()  # fmt: skip
        device = self._device_resource()
        resources = self._carried_resources()
        demands: dict[tuple[str, str], Demand] = {}  # (job, kind) -> one dict, shared
        used: dict[tuple[str, int], NDArray[np.float64]] = {}  # (server, slot) -> use
        for r in rows:
            found = self._usable(r, session)
            if found is None or not self._fits(r, found, used):
                continue
            job, kind = found
            demand = demands.get((r.job_id, kind))
            if demand is None:
                demand = demands[(r.job_id, kind)] = task_demand(job, kind, resources)
            task = plan_task(r.job_id, job, kind, r.workers, r.ps, run_of(r.decided_at),
                             device, demand, self.slot_seconds)  # fmt: skip
            tasks.setdefault((r.server, r.slot), []).append(task)
        epoch0 = self.c.slots.epoch
        plans: list[Plan] = []
        devices_of = self._devices(device)
        for server, (kind, index) in self.server_index.items():
            plans.append(Plan(
                server=server,
                kind=kind,
                store=store_id,
                epoch=epoch,
                slot_seconds=self.slot_seconds,
                heartbeat_seconds=self.mqtt.heartbeat_seconds,
                down=server in failed,
                current=SlotPlan(s, epoch0 + s * self.slot_seconds, tasks.get((server, s), [])),
                next=SlotPlan(
                    s + 1, epoch0 + (s + 1) * self.slot_seconds, tasks.get((server, s + 1), [])
                ),
                devices=None if devices_of is None else devices_of[kind][index],
                window=self.c.window,
            ))  # fmt: skip
        return plans

    def _usable(self, row: Any, session: Session) -> tuple[Job, str] | None:
        """``row``'s job and its server's kind (``"worker"`` or ``"ps"``), or None if
        the row is not one the daemon writes (a hand edit under the running daemon): a
        server not configured, a spec that does not read, a count that is not an integer
        from 0 to the job's chunks, or workers on a PS server (PS on a worker server).
        Such a row is left out of the plans and logged, once a slot; the next restart
        takes its job out or re-plans it (:mod:`controller.admission.recovery`). Before,
        a row on a server not configured raised KeyError out of every round: the plane
        reconnected in a loop and no tenant's plan went out."""
        why = ""
        job: Job | None = None
        index = self.server_index.get(row.server)
        if index is None:
            why = "its server is not configured"
        else:
            try:
                job = self.jobs.get(row.job_id, session)
            except (SpecError, KeyError) as err:
                why = f"its job's spec does not read: {str(err)[:200]}"
        if job is not None and index is not None:
            off = "ps" if index[0] == "worker" else "workers"
            for name, value in (("workers", row.workers), ("ps", row.ps)):
                if problem := count_problem(name, value, job.chunks):
                    why = problem
                elif name == off and value:
                    why = f"{name}: {value} on a {index[0]} server"
        if not why:
            assert job is not None and index is not None
            return job, index[0]
        self._left_out(row, why)
        return None

    def _left_out(self, row: Any, why: str) -> None:
        """Log, once per job, server and slot, that stored ``row`` is left out of the
        plans, and ``why``."""
        key = (str(row.job_id)[:128], str(row.server)[:64], str(row.slot)[:24])
        if key not in self._skipped and len(self._skipped) < MAX_SKIPPED_LOGGED:
            self._skipped.add(key)
            self.log.warning(
                "stored allocation left out of the plans", job=key[0], server=key[1],
                slot=key[2], why=why,
                hint="a row no daemon writes (a hand edit of the store): restart the "
                "daemon to take the job out or re-plan it",
            )  # fmt: skip

    def _fits(
        self, row: Any, found: tuple[Job, str], used: dict[tuple[str, int], NDArray[np.float64]]
    ) -> bool:
        """Whether ``row`` (of ``found``: its job and server kind) fits its server's
        capacity with the rows of its server and slot taken before it (``used``, their
        use per resource, which this adds it to). Rows come in decision order, as the
        ledger admitted them, so only a row an edit under the running daemon moved or
        added can fail this; it is left out and logged (:meth:`_left_out`), not sent to
        an agent to run past the server's capacity. The ledger's own rounding slack
        (``floor(free / w + 1e-9)``) is far within :data:`CAPACITY_SLACK`."""
        job, kind = found
        index = self.server_index[row.server][1]
        cluster = self.c.cluster
        capacity = (cluster.worker_capacity if kind == "worker" else cluster.ps_capacity)[index]
        per, count = (job.worker, row.workers) if kind == "worker" else (job.ps, row.ps)
        if not count:
            return True
        key = (row.server, row.slot)
        total = used.get(key, 0.0) + np.asarray(per, np.float64) * count
        over = total > capacity * (1 + CAPACITY_SLACK) + CAPACITY_SLACK
        if over.any():
            r = int(np.flatnonzero(over)[0])
            name = cluster.resources[r]
            why = (
                f"over the server's capacity of {name} ({total[r]:.6g} > {capacity[r]:.6g}) "
                "with the jobs decided before it"
            )
            self._left_out(row, why)
            return False
        used[key] = total
        return True

    def check_devices(self) -> None:
        """Warn of a device resource that the cluster does not have while one of its
        resources looks like it (``GPU`` against the default ``gpu``: agents would hand
        out no devices, and every worker would see every GPU), and of servers whose
        device capacity is not whole (the fraction counts as a device of its own)."""
        device = self._device_resource()
        name = self.mqtt.device_resource
        if device is None:
            alike = [r for r in self.c.cluster.resources if "gpu" in r.lower()]
            if name and alike:
                self.log.warning(
                    f"[mqtt] device_resource {name!r} is not a resource of the cluster: "
                    "agents give workers no devices of their own, and each sees every GPU; "
                    f"set device_resource = {alike[0]!r}", resources=list(alike),
                )  # fmt: skip
            return
        odd = [server for _kind, _i, server, capacity in self.c.cluster.servers()
               if not float(capacity[device]).is_integer()]  # fmt: skip
        if odd:
            self.log.warning(
                "servers whose capacity of the device resource is not whole: agents count "
                "the fraction as a device of its own, which the workers placed on it share",
                resource=name, servers=odd,
            )  # fmt: skip

    def check_demand(self) -> None:
        """Warn of the cluster's resources that plans do not carry in their tasks'
        ``demand`` (:meth:`_carried_resources`): agents and worker commands are not told
        a job's demand of them."""
        kept = {name for _, name in self._carried_resources()}
        left = [r for r in self.c.cluster.resources if r not in kept]
        if left:
            self.log.warning(
                "resources whose demand plans do not carry to the agents: a name must be "
                f"of {NAME_CHARACTERS}, at most {MAX_DEMAND_ENTRIES} resources",
                resources=left,
            )  # fmt: skip

    def _carried_resources(self) -> list[tuple[int, str]]:
        """``[(index, name)]`` of the cluster's resources a task's ``demand`` carries:
        those whose names :func:`~controller.plane.demand.carried` allows, the first
        :data:`~controller.plane.demand.MAX_DEMAND_ENTRIES` of them."""
        out = [(i, name) for i, name in enumerate(self.c.cluster.resources) if carried(name)]
        return out[:MAX_DEMAND_ENTRIES]

    def _device_resource(self) -> int | None:
        """The index of ``[mqtt] device_resource`` among the cluster's resources; None if
        the cluster has no such resource (plans then give no devices)."""
        resources = self.c.cluster.resources
        name = self.mqtt.device_resource
        return resources.index(name) if name in resources else None

    def _devices(self, device: int | None) -> dict[str, list[int]] | None:
        """Each server's devices for its plan, by kind (``"worker"``, ``"ps"``) and index:
        its capacity of the device resource ``device``, a fraction rounded up (a server
        of half a GPU has one, which its workers share; rounded down, a worker placed
        there got none: the audit), at most :data:`~controller.plane.devices.MAX_DEVICES`;
        None without one. All at once: one at a time took 60% of a round's build at
        10,000 servers."""
        if device is None:
            return None
        cluster = self.c.cluster
        out: dict[str, list[int]] = {}
        for kind, capacity in (("worker", cluster.worker_capacity), ("ps", cluster.ps_capacity)):
            amounts: list[float] = (
                capacity.reshape(len(capacity), -1)[:, device].tolist() if len(capacity) else []
            )
            out[kind] = [min(MAX_DEVICES, math.ceil(a - 1e-9)) for a in amounts]
        return out
