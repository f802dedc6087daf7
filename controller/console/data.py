"""What each console page shows, as plain JSON values (each page's JSON twin).

Every read goes through the controller the gRPC API uses: jobs through
:meth:`~controller.admission.AdmissionController.get` and ``list_jobs`` (with the same
``owner`` rule: a submitter sees only its own jobs), a job as ``oasis job ID --json``
prints it (:func:`controller.commands.records.job_record`), progress through the
execution plane's ``view`` (as ``GetProgress``), use through ``utilisation`` and the
ledger's prices inside :meth:`~controller.admission.AdmissionController.read` (between two
decisions, never half-way through one), counts per state from the controller's
:class:`~controller.admission.job_counts.JobCounts` (shared, at most ``max(2 s, 50 x the
count's duration)`` old); the window's use and the price heatmap's ledger reads are
shared by every tab too, each reused for 20 times its duration (:mod:`.shared_reads`).
What the views lack -- allocations across jobs for the Gantt chart and the heatmap's
hover, one job's events -- is read here from the same store tables, never from a copy.

Sizes stay bounded at any cluster size: the heatmap is binned (:mod:`.heatmap`), the
Gantt chart and the job list are paginated, a job's events are the latest
:data:`MAX_JOB_EVENTS`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import ColumnElement, func, or_, select

from controller.admission import STATES, AdmissionController, NotFoundError
from controller.admission.views import page_after
from controller.auth import Caller, Role
from controller.clock import SlotTimes
from controller.commands.records import (
    ABANDONED,
    UNHEARD_NAMED,
    heard_ago,
    heard_record,
    is_unheard,
    job_record,
    plain,
    plan_of,
    unheard_line,
    unheard_record,
)
from controller.console.heatmap import MAX_BINS, bin_edges, bin_grid, price_levels
from controller.console.shared_reads import SharedReads, timed
from controller.convert import job_to_proto, progress_to_proto
from controller.errors import BusyError, DrainingError
from controller.events import Event, shown_event
from controller.job_keys import SEPARATOR, as_named, key_for, key_of, shown, shown_view
from controller.store import AllocationRow, EventRow, JobRow
from controller.store_trouble import store_trouble
from pricing.bound_estimate import exp_shown
from pricing.cluster import Kind
from pricing.durations import format_time
from pricing.errors import SpecError
from pricing.fields import is_integer
from pricing.text import printable_problem

__all__ = ["JOBS_PAGE", "MAX_JOB_EVENTS", "PLAN_PAGE", "SERVERS_PAGE", "ConsoleData"]

JOBS_PAGE = 50
"""Jobs per page of the job list."""
PLAN_PAGE = 40
"""Servers per page of the Gantt chart."""
SERVERS_PAGE = 100
"""Servers per page of the server list."""
MAX_JOB_EVENTS = 200
"""The latest events shown on a job's page."""
_CELL_JOBS = 10  # jobs listed for one heatmap cell
_CANCELLABLE = ("pending", "admitted", "running")


class ConsoleData:
    """The pages' data; see the module docstring.

    Args:
        controller: the opened admission controller.
        broker: whether the broker is connected; None: no broker configured.
    """

    def __init__(
        self, controller: AdmissionController, broker: Callable[[], bool | None] | None = None
    ) -> None:
        self.c = controller
        self.broker = broker or (lambda: None)
        self.shared = SharedReads()  # the window's use and prices, shared by every tab

    # -- common ------------------------------------------------------------------------

    def clock(self) -> dict[str, Any]:
        """The slot clock: what a page needs to show slots as local times."""
        slots = self.c.slots
        current = slots.current_slot()
        return {
            "slot": current,
            "slot_seconds": slots.slot_seconds,
            "epoch": slots.epoch,
            "window": self.c.window,
            "starts_at": format_time(slots.times.start(current)),
            "ends_at": format_time(slots.times.start(current + 1)),
            "now": format_time(slots.clock.now()),
        }

    def _listing(self, resource: int | None = None) -> list[tuple[Kind, int, str]]:
        """``(kind, index within its side, name)`` in listing order; with ``resource``,
        only the servers that have some of it."""
        cluster = self.c.cluster
        out: list[tuple[Kind, int, str]] = []
        for kind, idx, name, caps in cluster.servers():
            if resource is None or caps[resource] > 0:
                out.append((kind, idx, name))
        return out

    def _resource(self, name: str) -> int:
        try:
            return self.c.cluster.resources.index(name)
        except ValueError:
            known = ", ".join(self.c.cluster.resources)
            raise SpecError.one("resource", f"unknown resource {name!r} (known: {known})") from None

    def _agents(self) -> tuple[dict[str, float], float] | None:
        """Each server's seconds since its agent was last heard (``inf``: never;
        :meth:`~controller.plane.execution.Execution.agent_ages`, as ListServers gives
        it) and the heartbeat timeout; None: no agents watched (no ``[mqtt]``, or a
        standby)."""
        execution = self.c.execution
        if execution is None:
            return None
        return execution.agent_ages(), execution.mqtt.heartbeat_timeout

    def _unheard(
        self, states: dict[str, str], agents: tuple[dict[str, float], float] | None
    ) -> dict[str, Any] | None:
        """The servers up whose agent was never heard or is silent past the heartbeat
        timeout (:func:`~controller.commands.records.is_unheard`, as ``oasis status``),
        from ``agents`` (:meth:`_agents`): how many, the first :data:`UNHEARD_NAMED` in
        listing order, and ``oasis status``'s line; None: no agents watched."""
        if agents is None:
            return None
        ages, timeout = agents
        unheard = [
            unheard_record(name, ages.get(name))
            for _, _, name in self._listing()
            if is_unheard(states.get(name, "up"), ages.get(name), timeout)
        ]
        line = unheard_line(unheard)
        return {
            "count": len(unheard),
            "servers": unheard[:UNHEARD_NAMED],
            "line": line[0] if line else None,
            "heartbeat_timeout_seconds": timeout,
        }

    # -- overview ----------------------------------------------------------------------

    async def overview(self, caller: Caller) -> dict[str, Any]:
        """Use per resource (now, and over the window ahead), jobs per state, the node's
        role and health, the servers out of service from the next slot on (``{name:
        "cordoned" | "failed"}``; a cordon with an end in ``cordoned_until``, ``{name:
        {"last_slot", "back_at"}}``; those planned to start later in ``cordons_planned``,
        ``{name: {"from_slot", "starts_at", "last_slot", "back_at"}}``), and the slot with
        its wall-clock time. A submitter
        gets its own job counts and the clock (the cluster's use is for operators, as over
        gRPC).

        The counts are shared with every reader and the metrics and recounted at most
        every ``jobs_max_age_seconds`` (:mod:`controller.admission.job_counts`): they are
        ``jobs_age_seconds`` old, counted at ``jobs_counted_at``."""
        counts = await self.c.read_store(self.c.job_counts.read, caller.owner, client=caller.turn)
        out: dict[str, Any] = {
            "clock": self.clock(),
            "jobs": counts.jobs,
            "jobs_counted_at": format_time(counts.counted_at),
            "jobs_age_seconds": round(self.c.job_counts.age(counts), 3),
            "jobs_max_age_seconds": round(counts.max_age, 3),
        }
        up = await self.c.read_store(self.c.db.ping, client=caller.turn)
        trouble = store_trouble(self.c.db, caller)
        broker = self.broker()
        draining = self.c.draining
        ha = self.c.ha_status()
        role = "standalone" if self.c.config.ha is None else ha.role
        out["node"] = {
            "role": role,
            "epoch": ha.epoch,
            "lease_age_seconds": round(ha.lease_age, 3),
            "leader": ha.leader,
            # as the health of oasis.v1.Admission: it takes decisions
            "serving": up and not draining and role != "standby" and not self.c.db.refusing,
            "store_up": up,
            # why not, or why its writes fail, as oasis status says it (an operator reads
            # the store's words; a submitter, that something is wrong)
            "store_down": trouble.down or None,
            "writes_refused": trouble.refused or None,
            "writes_locked": trouble.locked or None,
            "draining": draining,
            "broker": "none" if broker is None else ("connected" if broker else "disconnected"),
            "execution_plane": self.c.execution is not None,
            # [mqtt] configured: a standby's plane (and broker link) is the leader's
            "mqtt": self.c.config.mqtt is not None,
            # a standby that could not take over now: why (its log says it too)
            "cannot_lead": (self.c.cannot_lead or None)
            if role == "standby" and caller.role is Role.OPERATOR
            else None,
        }
        if caller.role is not Role.OPERATOR:
            out["use"] = None
            return out
        states, cordons = await self.c.read(lambda: (self.c.server_states(), self.c.cordons()))
        out["out_of_service"] = {name: state for name, state in states.items() if state != "up"}
        out["agents_unheard"] = self._unheard(states, self._agents())
        times = self.c.slots.times
        out["cordoned_until"] = {  # a cordon with an end: the last slot out, and when back
            name: {"last_slot": c.until - 1, "back_at": format_time(times.start(c.until))}
            for name, c in cordons.items()
            if c.until is not None and c.started(self.c.slot)
        }
        out["cordons_planned"] = {  # not started: when it starts, and ends (None: no end)
            name: {
                "from_slot": c.from_slot,
                "starts_at": format_time(times.start(c.from_slot)),
                "last_slot": None if c.until is None else c.until - 1,
                "back_at": None if c.until is None else format_time(times.start(c.until)),
            }
            for name, c in cordons.items()
            if not c.started(self.c.slot)
        }
        first, rows = await self.shared.get(
            "use", lambda: self.c.read(timed(lambda: self.c.utilisation(0, self.c.window + 1)))
        )
        use = []
        for resource, kind, share in rows:
            series = np.asarray(share, np.float64)
            edges = bin_edges(len(series), MAX_BINS)
            binned: list[float] = []
            if len(series):
                binned = (np.add.reduceat(series, edges[:-1]) / np.diff(edges)).tolist()
            use.append(
                {
                    "kind": kind,
                    "resource": resource,
                    "now": float(series[0]) if len(series) else 0.0,
                    "window_mean": float(series.mean()) if len(series) else 0.0,
                    "window_peak": float(series.max()) if len(series) else 0.0,
                    "series": [round(float(v), 4) for v in binned],
                    "series_slots": [int(first + e) for e in edges.tolist()],
                }
            )
        out["use"] = use
        out["first_slot"] = first
        return out

    # -- servers -----------------------------------------------------------------------

    async def servers(self, page: int = 1) -> dict[str, Any]:
        """The servers of page ``page`` (:data:`SERVERS_PAGE` a page, listing order), as
        ``oasis servers`` shows them: kind, state from the next slot on (and a cordon's
        slots, who and why), when its agent was last heard (``agent``: ``5s ago``,
        ``never``, ``-`` with no agents watched; ``agent_heard``,
        ``agent_heard_seconds_ago`` as ``oasis servers --json``) and use of the current
        slot against capacity per resource; and the agents not heard of the whole
        cluster (:meth:`_unheard`)."""
        cluster = self.c.cluster
        use, states, cordons = await self.c.read(
            lambda: (self.c.current_use(), self.c.server_states(), self.c.cordons())
        )
        agents = self._agents()
        ages = agents[0] if agents is not None else {}
        listing = list(cluster.servers())
        pages = max(1, math.ceil(len(listing) / SERVERS_PAGE))
        page = min(max(page, 1), pages)
        rows = []
        for kind, _, name, caps in listing[(page - 1) * SERVERS_PAGE : page * SERVERS_PAGE]:
            cordon = cordons.get(name)
            age = ages.get(name)
            rows.append(
                {
                    "name": name,
                    "kind": kind,
                    "state": states.get(name, "up"),
                    "agent": heard_ago(age),
                    **heard_record(age),
                    "capacity": dict(zip(cluster.resources, caps.tolist(), strict=True)),
                    "used": use.get(name, {}),
                    "cordon": None
                    if cordon is None
                    else {
                        "from_slot": cordon.from_slot,
                        "until_slot": cordon.until,
                        "by": cordon.by,
                        "reason": cordon.reason,
                    },
                }
            )
        return {
            "clock": self.clock(),
            "resources": list(cluster.resources),
            "page": page,
            "pages": pages,
            "servers_total": len(listing),
            "agents_watched": agents is not None,
            "agents_unheard": self._unheard(states, agents),
            "servers": rows,
        }

    # -- prices ------------------------------------------------------------------------

    async def prices(self, resource: str = "") -> dict[str, Any]:
        """The heatmap of unit prices of ``resource`` (empty: the costliest) over servers
        x slots of the window ahead, binned to at most 100 x 100 cells. Each cell carries
        only what draws it: ``level``, its mean price on the log scale from the floor L
        (0) to the top U (255), and ``use``, its mean share of capacity in percent (both
        integers, so 10,000 cells stay small); :meth:`price_cell` gives a cell's exact
        prices, use and jobs."""
        chosen = self._resource(resource) if resource else None
        snap = await self.shared.get(
            ("prices", chosen), lambda: self.c.read(timed(lambda: self._price_snapshot(chosen)))
        )
        r, origin, first, price, share, floor, top = snap
        names = [name for _, _, name in self._listing(r)]
        grid = bin_grid(price)
        use = bin_grid(share)
        rows = []
        for a, b in zip(grid.row_edges[:-1].tolist(), grid.row_edges[1:].tolist(), strict=True):
            label = names[a] if b - a == 1 else f"{names[a]} .. {names[b - 1]}"
            rows.append({"from": a, "to": b, "label": label, "servers": b - a})
        cols = [
            {"from": first + a, "to": first + b}
            for a, b in zip(grid.col_edges[:-1].tolist(), grid.col_edges[1:].tolist(), strict=True)
        ]
        return {
            "clock": self.clock(),
            "resource": self.c.cluster.resources[r],
            "resources": list(self.c.cluster.resources),
            "chosen": "given" if chosen is not None else "costliest",
            "window_origin": origin,
            "first_slot": first,
            "servers": len(names),
            "slots": int(price.shape[1]),
            "rows": rows,
            "cols": cols,
            "level": price_levels(grid.mean, floor, top).tolist(),
            "use": np.rint(100 * use.mean).astype(np.int64).tolist(),
            "floor": floor,
            "top": top,
        }

    def _price_snapshot(
        self, chosen: int | None
    ) -> tuple[int, int, int, NDArray[np.float64], NDArray[np.float64], float, float]:
        """In the decision thread: ``(resource, ledger origin, first slot, price (n, S),
        share (n, S), floor, top)`` from the current slot to the window's end."""
        ledger = self.c.ledger
        if ledger is None:
            raise RuntimeError("the ledger is not open")
        lo = max(self.c.slot - ledger.origin, 0)
        if chosen is None:
            chosen = self._costliest(lo)
        listing = self._listing(chosen)
        price = np.empty((len(listing), ledger.length - lo))
        share = np.empty_like(price)
        floors, tops = [], []
        # a kind's rows at once: a strided slice per server took 140 ms at 10,000 servers
        for kind in ("worker", "ps"):
            rows = [pos for pos, (k, _, _) in enumerate(listing) if k == kind]
            if not rows:
                continue
            idx = [i for k, i, _ in listing if k == kind]
            side = ledger.side(kind)
            price[rows] = side.prices(lo, ledger.length)[lo:, idx, chosen].T
            share[rows] = (side.used[lo:, idx, chosen] / side.capacity[idx, chosen]).T
            floors.append(float(side.log_l[chosen]))
            tops.append(float(side.log_u[chosen]))
        floor, top = exp_shown(min(floors)), exp_shown(max(tops))
        return chosen, ledger.origin, ledger.origin + lo, price, share, floor, top

    def _costliest(self, lo: int) -> int:
        """The resource whose prices come closest to their top U anywhere ahead, measured
        on the log scale between the floor L and U (unit-free); ties: the first."""
        ledger = self.c.ledger
        assert ledger is not None
        # each server's highest price ahead, (n, R) per side, in one pass over the cells
        highest = [
            (side, side.prices(lo, ledger.length)[lo:].max(axis=0))
            for side in (ledger.worker_side, ledger.ps_side)
            if side.capacity.shape[0] and lo < ledger.length
        ]
        best, best_level = 0, -1.0
        for r in range(len(self.c.cluster.resources)):
            level = 0.0
            for side, top in highest:
                have = side.capacity[:, r] > 0
                if not have.any():
                    continue
                span = max(float(side.log_u[r] - side.log_l[r]), 1e-12)
                # the log of the highest price is the highest of the prices' logs
                high = math.log(max(float(top[have, r].max()), 1e-300))
                level = max(level, (high - float(side.log_l[r])) / span)
            if level > best_level + 1e-9:
                best, best_level = r, level
        return best

    async def price_cell(
        self, resource: str, rows: tuple[int, int], slots: tuple[int, int]
    ) -> dict[str, Any]:
        """The jobs holding servers ``rows`` (indices ``from, to`` of the heatmap's
        servers, end excluded) in ``slots`` (``from, to``, end excluded): the hover of a
        heatmap bin, read from the stored allocations."""
        r = self._resource(resource)
        names = [name for _, _, name in self._listing(r)]
        a, b = rows
        s0, s1 = slots
        if not (0 <= a < b <= len(names)) or s1 <= s0 or s1 - s0 > 10 * self.c.window + 10:
            raise SpecError.one("cell", f"rows {a}..{b} or slots {s0}..{s1} out of range")
        servers = names[a:b]
        stats = await self.c.read(lambda: self._cell_stats(r, a, b, s0, s1))
        jobs = await self.c.read_store(self._holding, servers, s0, s1)
        return {
            "resource": resource,
            **stats,
            "servers": servers[:5],
            "more_servers": max(0, len(servers) - 5),
            "slots": [s0, s1 - 1],
            "jobs": jobs[:_CELL_JOBS],
            "more_jobs": max(0, len(jobs) - _CELL_JOBS),
        }

    def _cell_stats(self, r: int, a: int, b: int, s0: int, s1: int) -> dict[str, Any]:
        """In the decision thread: min, max and mean unit price and mean use of servers
        ``a .. b - 1`` (of those with resource ``r``) in the window's slots ``s0 .. s1 - 1``."""
        ledger = self.c.ledger
        if ledger is None:
            raise RuntimeError("the ledger is not open")
        lo, hi = max(s0 - ledger.origin, 0), min(s1 - ledger.origin, ledger.length)
        if lo >= hi:
            raise SpecError.one("cell", f"slots {s0}..{s1 - 1} are not in the window")
        prices, shares = [], []
        for kind, idx, _ in self._listing(r)[a:b]:
            side = ledger.side(kind)
            prices.append(side.price[lo:hi, idx, r])
            shares.append(side.used[lo:hi, idx, r] / side.capacity[idx, r])
        price, share = np.concatenate(prices), np.concatenate(shares)
        return {
            "price_min": float(price.min()),
            "price_max": float(price.max()),
            "price_mean": float(price.mean()),
            "use": float(share.mean()),
        }

    def _holding(self, servers: list[str], s0: int, s1: int) -> list[dict[str, Any]]:
        with self.c.db.session() as session:
            query = (
                select(
                    AllocationRow.job_id,
                    func.sum(AllocationRow.workers),
                    func.sum(AllocationRow.ps),
                )
                .where(AllocationRow.slot >= s0, AllocationRow.slot < s1)
                .group_by(AllocationRow.job_id)
            )
            # a few servers by name; a large range by position is filtered below
            if len(servers) <= 500:
                query = query.where(AllocationRow.server.in_(servers))
                rows = [(j, int(w or 0), int(p or 0)) for j, w, p in session.execute(query)]
            else:
                wanted = set(servers)
                rows = self._filtered(session, wanted, s0, s1)
        rows.sort(key=lambda row: (-(row[1] + row[2]), row[0]))
        return [{"id": j, "worker_slots": w, "ps_slots": p} for j, w, p in rows]

    @staticmethod
    def _filtered(session: Any, wanted: set[str], s0: int, s1: int) -> list[tuple[str, int, int]]:
        sums: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for job, server, w, p in session.execute(
            select(AllocationRow.job_id, AllocationRow.server, AllocationRow.workers,
                   AllocationRow.ps).where(AllocationRow.slot >= s0, AllocationRow.slot < s1)
        ):  # fmt: skip
            if server in wanted:
                sums[job][0] += w
                sums[job][1] += p
        return [(j, w, p) for j, (w, p) in sums.items()]

    # -- plans (Gantt) -----------------------------------------------------------------

    async def plans(
        self, page: int = 1, job: str = "", caller: Caller | None = None
    ) -> dict[str, Any]:
        """The plan per server over the window ahead: for each server of page ``page``
        (:data:`PLAN_PAGE` servers a page, listing order), each job's runs of consecutive
        slots with the same number of workers or PS. With ``job``, only the servers that
        job uses; NotFoundError if no such job (with ``caller``, told as to its page)."""
        clock = self.clock()
        first = clock["slot"]
        end = first + self.c.window + 1
        listing = self._listing()
        if job:
            used = await self.c.read_store(self._servers_of, job, first, end)
            if not used and caller is not None:  # no plan, or no job: "uses no server" was
                await as_named(caller, job, self.c.get(job, None, caller.turn))  # said of both
            listing = [s for s in listing if s[2] in used]
        pages = max(1, math.ceil(len(listing) / PLAN_PAGE))
        page = min(max(page, 1), pages)
        shown = listing[(page - 1) * PLAN_PAGE : page * PLAN_PAGE]
        runs = await self.c.read_store(self._runs, [s[2] for s in shown], first, end)
        return {
            "clock": clock,
            "first_slot": first,
            "slots": end - first,
            "page": page,
            "pages": pages,
            "servers_total": len(listing),
            "job": job or None,
            "servers": [
                {"name": name, "kind": kind, "jobs": runs.get(name, [])} for kind, _, name in shown
            ],
        }

    def _servers_of(self, job: str, first: int, end: int) -> set[str]:
        with self.c.db.session() as session:
            return set(
                session.scalars(
                    select(AllocationRow.server).where(
                        AllocationRow.job_id == job,
                        AllocationRow.slot >= first,
                        AllocationRow.slot < end,
                    )
                ).all()
            )

    def _runs(self, servers: list[str], first: int, end: int) -> dict[str, list[dict[str, Any]]]:
        """``{server: [{"id", "bars": [[from, to, workers, ps], ...]}, ...]}``, bars of
        consecutive slots (``to`` included) with the same counts; jobs by first slot."""
        if not servers:
            return {}
        with self.c.db.session() as session:
            rows = session.execute(
                select(AllocationRow.server, AllocationRow.job_id, AllocationRow.slot,
                       AllocationRow.workers, AllocationRow.ps)
                .where(AllocationRow.server.in_(servers), AllocationRow.slot >= first,
                       AllocationRow.slot < end)
                .order_by(AllocationRow.server, AllocationRow.job_id, AllocationRow.slot)
            ).all()  # fmt: skip
        per: dict[str, dict[str, list[list[int]]]] = defaultdict(dict)
        for server, job, slot, workers, ps in rows:
            bars = per[server].setdefault(job, [])
            last = bars[-1] if bars else None
            if last is not None and last[1] == slot - 1 and last[2:] == [workers, ps]:
                last[1] = slot
            else:
                bars.append([slot, slot, workers, ps])
        return {
            server: sorted(
                ({"id": job, "bars": bars} for job, bars in jobs.items()),
                key=lambda d: (d["bars"][0][0], d["id"]),
            )
            for server, jobs in per.items()
        }

    # -- jobs --------------------------------------------------------------------------

    async def jobs(
        self, caller: Caller, state: str = "", query: str = "", after: int = 0
    ) -> dict[str, Any]:
        """A page of :data:`JOBS_PAGE` jobs in decision order after sequence ``after``,
        of one ``state`` (empty: all) and whose id starts with ``query`` (empty: any);
        a submitter's own jobs only. An operator's ``query`` matches the start of a key
        (``alice:``: all of alice's) or of the id in one (``train``: ``alice:train-1``)."""
        if state and state not in STATES:
            raise SpecError.one("state", f"unknown state {state!r} (known: {', '.join(STATES)})")
        if len(query) > 200:
            raise SpecError.one("q", "at most 200 characters")
        why = printable_problem(query)  # a NUL fails PostgreSQL's text (a 500 before)
        if why is not None:
            raise SpecError.one("q", why)
        owner = caller.owner
        states = [state] if state else []
        # one read of the rows, none of their allocations (a row shows none), in the
        # caller's read turns (one user's reads wait for each other, not every tenant's)
        match = self._search(key_of(query, owner), owner) if query else None
        views, more = await self.c.list_jobs(
            states, JOBS_PAGE, after, owner, client=caller.turn, match=match, allocations=False
        )
        return {
            "clock": self.clock(),
            "state": state or None,
            "q": query or None,
            "after": after,
            "states": list(STATES),
            "jobs": [_job_row(shown_view(caller, v)) for v in views],
            "next_after": page_after(views[-1]) if more and views else None,
        }

    @staticmethod
    def _search(prefix: str, owner: str | None) -> ColumnElement[bool]:
        """The jobs whose key starts with ``prefix``; for an operator (``owner`` None),
        also those whose id in a key does (``train``: ``alice:train-1``)."""
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        match: ColumnElement[bool] = JobRow.id.like(escaped + "%", escape="\\")
        if owner is None and SEPARATOR not in prefix:  # an operator: a key, or an id in one
            match = or_(match, JobRow.id.like(f"%{SEPARATOR}{escaped}%", escape="\\"))
        return match

    async def job(self, caller: Caller, job_id: str) -> dict[str, Any]:
        """One job as ``oasis job ID --json`` prints it, with its plan per slot, its
        progress against plan (with the execution plane), its latest events and whether
        the caller may cancel it. NotFoundError for another submitter's job. ``job_id``
        as the caller names it (:func:`controller.job_keys.key_for`)."""
        key = key_for(caller, job_id)
        view = await as_named(caller, key, self.c.get(key, caller.owner, caller.turn))
        times = self.c.slots.times
        record = job_record(job_to_proto(shown_view(caller, view), times), times)
        plan: dict[int, dict[str, Any]] = {}
        for a in view.decision.allocations:
            entry = plan.setdefault(
                a["slot"],
                {"slot": a["slot"], "starts_at": format_time(times.start(a["slot"])),
                 "workers": {}, "ps": {}},
            )  # fmt: skip
            if a.get("workers"):
                entry["workers"][a["server"]] = a["workers"]
            if a.get("ps"):
                entry["ps"][a["server"]] = a["ps"]
        events = await self.c.read_store(self._job_events, view.id, client=caller.turn)
        progress = await self._progress(view.id, caller.turn)
        if "id" in progress:
            progress["id"] = shown(caller, progress["id"])
        return {
            "clock": self.clock(),
            "job": record,
            "plan": [plan[s] for s in sorted(plan)],
            "progress": progress,
            "events": events,
            "can_cancel": view.state in _CANCELLABLE,  # another's job is NotFoundError above
            "can_see_plans": caller.role is Role.OPERATOR,  # the Gantt chart is theirs
        }

    async def _progress(self, job_id: str, client: str) -> dict[str, Any]:
        execution = self.c.execution
        if execution is None:
            why = "no execution plane: the daemon has no [mqtt] broker configured"
            return {"available": False, "why": why}
        try:
            view = await execution.view(job_id, client)  # the caller's turn, as GetProgress
        except (BusyError, DrainingError, NotFoundError) as err:
            return {"available": False, "why": str(err)}
        return {"available": True, **plain(progress_to_proto(view))}

    def _job_events(self, job_id: str) -> list[dict[str, Any]]:
        times = self.c.slots.times
        with self.c.db.session() as session:
            rows = session.scalars(
                select(EventRow)
                .where(EventRow.job_id == job_id)
                .order_by(EventRow.sequence.desc())
                .limit(MAX_JOB_EVENTS)
            ).all()
            return [_event_row(shown_event(r), _iso(r.at), times) for r in reversed(rows)]

    async def owner_of(self, job_ids: Iterable[str]) -> dict[str, str | None]:
        """``{job id: its submitter}`` for the stored ones (the live stream's filter)."""
        ids = list(job_ids)

        def read() -> dict[str, str | None]:
            with self.c.db.session() as session:
                rows = session.execute(
                    select(JobRow.id, JobRow.submitter).where(JobRow.id.in_(ids))
                ).all()
                return {job: who for job, who in rows}

        return await self.c.read_store(read) if ids else {}


def _event_row(event: Event, at: str, times: SlotTimes) -> dict[str, Any]:
    """A job's event as its page shows it, bounded as ``oasis watch`` reads it
    (:func:`~controller.events.shown_event`); a slot an edit made unreadable (SQLite's
    text reads as None) is null, its start "". Before, such a slot failed the job's page
    (500), and a detail edited to megabytes was sent whole."""
    slot = event.slot if is_integer(event.slot) else None
    return {"sequence": event.sequence, "kind": event.kind, "slot": slot,
            "state": event.state, "at": at, "detail": event.detail,
            "slot_starts_at": "" if slot is None else format_time(times.start(slot))}  # fmt: skip


def _iso(at: datetime | None) -> str:
    """A stored time (SQLite returns it without a zone: it was written in UTC); "" for
    one an edit broke (it reads as None: :mod:`controller.store.lenient`)."""
    if at is None:
        return ""
    return format_time((at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp())


def _job_row(view: Any) -> dict[str, Any]:
    """A job of the list. A cancelled or failed job's ``utility`` is null (its plan's was
    never earned; ``oasis job ID --json`` says the same) and its ``completion_slot`` the
    last slot it ran (null: none); ``planned`` is what its admission planned,
    ``{"completion_slot", "jct", "utility"}`` (null: never admitted), and its ``cost`` and
    ``payoff`` are that plan's."""
    d = view.decision
    return {
        "id": view.id,
        "state": view.state,
        "sequence": view.sequence,
        "submitted_slot": view.submitted_slot,
        "arrival_slot": d.arrival_slot,
        "completion_slot": d.completion_slot,
        "utility": None if view.state in ABANDONED else d.utility,
        "planned": plan_of(d.admitted, d.arrival_slot, d.jct, d.utility),
        "cost": d.cost,
        "payoff": d.payoff,
        "reason": (d.reason or "")[:200],
    }
