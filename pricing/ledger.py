"""Allocated amounts and prices per server, resource and slot over a window of slots.

The ledger is the state the online algorithm prices against: ``used`` amounts
(the paper's ``g`` and ``v``) and the exponential prices derived from them, over the
window ``origin .. origin + length - 1``. It admits schedules, releases a job's
remaining slots (cancellation, early completion), replaces a job's schedule (re-plans),
takes failed servers out of future slots, and advances the window.

Amounts are sums over admitted schedules in admission order, and a release recomputes
the affected slots in that same order, so releasing a job restores the exact floats
the slots held before it was admitted. A replaced schedule keeps its job's place in
that order, so a ledger rebuilt by admitting the current schedules in admission order
holds the same floats as one that lived through the re-plans.

A server that is down (failed) is *blocked* from some slot on: its amounts in those
slots equal its capacity, so it has no room and prices at ``U``, and the search and
placement kernels need no change. Blocked slots hold no job's allocation.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import NDArray

from pricing.cluster import Cluster
from pricing.errors import CapacityError, LedgerError
from pricing.prices import PriceBounds, price, same_values, spread
from pricing.schedule import Schedule
from pricing.shares import least_shares

__all__ = [
    "CAPACITY_SLACK",
    "LOG_PRICE_CAP",
    "LOG_PRICE_FLOOR",
    "ROOM_SLACK",
    "Ledger",
    "Side",
    "capacity_slack",
    "ledger_bytes",
    "ledger_bytes_of",
    "ledger_need",
]

CAPACITY_SLACK = 1e-7
"""Absolute slack on capacity checks (with :func:`capacity_slack`'s relative part)."""

ROOM_SLACK = 2e-9
"""Relative slack on capacity checks. SPEC 5's room ``floor(free / w + 1e-9)`` lets ``y``
units of demand ``w`` take up to ``1e-9 w`` more than is free, and ``w <= c (1 + 1e-9)``
for a unit the server takes at all, so a placement the search makes may exceed a
capacity ``c`` by up to about ``1e-9 c`` (memory in bytes: 16 bytes of 16e9), and the sums
add float noise of a few ulps of ``c``."""


def capacity_slack(capacity: NDArray[np.float64]) -> NDArray[np.float64]:
    """How far amounts may exceed ``capacity`` (any shape, same units) and still fit:
    :data:`CAPACITY_SLACK` plus :data:`ROOM_SLACK` of the capacity."""
    out: NDArray[np.float64] = CAPACITY_SLACK + ROOM_SLACK * np.abs(capacity)
    return out


LOG_PRICE_CAP = 600.0
"""Every price is capped so that a server's whole capacity of a resource costs at most
``e^600`` per slot: ``log U[r]`` and ``log L[r]`` are cut to ``600 - log max_h c[h][r]``
(bounds from any source: explicit, oracle or estimated). A worker or PS fits on some
server, so one unit costs at most ``R e^600`` per slot, and a schedule of at most
``2**40`` units per server, ``2**20`` servers and ``2**30`` slots stays below ``e^700``:
costs and payoffs are always finite (float64 overflows at ``e^709.78``). Ordinary bounds
are hundreds of orders of magnitude below the cap, which only ever binds for absurd
inputs (a priority of ``1e308``)."""

LOG_PRICE_FLOOR = -1e6
"""``log L`` is raised to at least this: ``exp`` of it is 0 anyway, and a finite floor
keeps ``log L + share * (log U - log L)`` free of ``inf - inf``."""


def ledger_bytes(cluster: Cluster, length: int) -> int:
    """Bytes of the arrays a :class:`Ledger` of ``cluster`` over ``length`` slots holds
    (:func:`ledger_bytes_of`)."""
    n_worker, resources = cluster.worker_capacity.shape
    return ledger_bytes_of(n_worker, cluster.ps_capacity.shape[0], resources, length)


def ledger_bytes_of(n_worker: int, n_ps: int, resources: int, length: int) -> int:
    """Bytes of the arrays a :class:`Ledger` over ``length`` slots holds for ``n_worker``
    worker and ``n_ps`` PS servers of ``resources`` resources.

    Per side of ``n`` servers and ``r`` resources: amounts and prices ``(length, n, r)``
    float64, blocked flags ``(length, n)`` bool, least shares ``(length, r)`` float64 and
    price versions ``(length,)`` int64; plus the ``(length,)`` bool ``touched``. About
    ``16 r + 1`` bytes per server and slot (81 with the paper's five resources)."""
    total = length  # touched
    for n in (n_worker, n_ps):
        total += length * (n * resources * 16 + n + resources * 8 + 8)
    return total


def ledger_need(length: int, servers: int, need: int) -> str:
    """How a too-large ledger is named in every refusal: ``"300 slots of 100 servers
    need a price ledger of 2.3 GiB"`` (``need`` in bytes, :func:`ledger_bytes`)."""
    return f"{length:,} slots of {servers:,} servers need a price ledger of {need / 2**30:,.1f} GiB"


_VERSIONS = itertools.count(1)
"""Bound versions: each distinct pair of bounds a side prices with gets a fresh number."""


@dataclass(eq=False)
class Side:
    """One kind of server (workers or PS) over the window.

    Prices are derived lazily: a change of bounds only gives the side a new bounds
    *version* (``O(n R)``: the empty-cluster prices), and a slot's prices are derived
    from its amounts (``O(n R)``, :func:`pricing.prices.price`, the same floats as an
    eager derivation) the first time something reads them under that version:
    :meth:`prices` for a range of slots, :attr:`price` for the whole window. A search
    derives only the slots it scans, so the cost of a bounds change is at most one
    derivation per slot a decision reads, and is part of that decision's time.

    Attributes:
        capacity: ``(n, R)`` float64, per server and resource.
        used: ``(S, n, R)`` float64, allocated amounts per slot, server and resource.
        cells: ``(S, n, R)`` float64, prices as last derived; slot ``t`` is valid only
            when ``priced[t] == version`` (read :attr:`price` or :meth:`prices`).
        empty_price: ``(n, R)`` float64, the price of a slot with nothing allocated.
        log_l: ``(R,)`` float64, ``log L[r]`` of this side; ``log_u``: ``(R,)``,
            ``log U[r]``; both as priced, after :data:`LOG_PRICE_CAP`.
        blocked: ``(S, n)`` bool, True where the server is down in that slot.
        down: ``(n,)`` bool, servers down with no end: slots the window opens are blocked.
        ahead: blocks with an end that reaches past the window's last slot, ``(server,
            first, until)`` in absolute slots (``until`` exclusive): the slots the window
            opens up to ``until`` are blocked too (an operator's cordon with an end).
        touched: ``(S,)`` bool, the ledger's: False where nothing is allocated on either
            side (such a slot prices at ``empty_price``).
        min_share: ``(S, R)`` float64, the least ``used / capacity`` over servers per slot
            and resource (1 where no server has the resource): prices rise with the share,
            so the cheapest unit price of a slot follows from it without deriving prices.
        priced: ``(S,)`` int64, the bounds version each slot's cells were derived under
            (0: none).
        version: the bounds version in use.
        derived: slots derived so far (a counter of the lazy work, for benchmarks).
    """

    capacity: NDArray[np.float64]
    used: NDArray[np.float64]
    cells: NDArray[np.float64]
    empty_price: NDArray[np.float64]
    log_l: NDArray[np.float64]
    log_u: NDArray[np.float64]
    blocked: NDArray[np.bool_]
    down: NDArray[np.bool_]
    touched: NDArray[np.bool_]
    min_share: NDArray[np.float64]
    priced: NDArray[np.int64]
    version: int = 0
    derived: int = 0
    ahead: list[tuple[int, int, int]] = field(default_factory=list)
    _known: list[tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], int]] = field(
        default_factory=list
    )
    _capped: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None

    @classmethod
    def empty(
        cls,
        capacity: NDArray[np.float64],
        length: int,
        log_l: float | NDArray[np.float64],
        log_u: NDArray[np.float64],
        touched: NDArray[np.bool_],
    ) -> Side:
        n, r = capacity.shape
        side = cls(capacity, np.zeros((length, n, r)), np.empty((length, n, r)),
                   np.empty((n, r)), np.empty(r), log_u, np.zeros((length, n), np.bool_),
                   np.zeros(n, np.bool_), touched, np.empty((length, r)),
                   np.zeros(length, np.int64))  # fmt: skip
        side.use_bounds(log_l, log_u)
        side.refresh_shares(0, length)
        return side

    def use_bounds(self, log_l: float | NDArray[np.float64], log_u: NDArray[np.float64]) -> None:
        """Price with ``log L`` (one number or ``(R,)``) and ``log U`` (``(R,)``) from now
        on, each cut to :data:`LOG_PRICE_CAP`. No slot is derived here (see the class);
        going back to the bounds used just before makes the slots derived under them, and
        not changed since, valid again."""
        cap = self._cap()
        floor = spread(log_l, cap.shape)
        new_l = np.minimum(np.maximum(floor, LOG_PRICE_FLOOR), cap)
        new_u = np.minimum(np.asarray(log_u, np.float64), cap)
        for known in self._known:
            if same_values(known[0], new_l) and same_values(known[1], new_u):
                self.log_l, self.log_u, self.empty_price, self.version = known
                break
        else:
            self.log_l, self.log_u, self.version = new_l, new_u, next(_VERSIONS)
            self.empty_price = price(new_l, new_u, np.zeros_like(self.capacity), self.capacity)
            self._known = [*self._known[-1:], (new_l, new_u, self.empty_price, self.version)]

    def _cap(self) -> NDArray[np.float64]:
        """``(R,)``: the most ``log L`` and ``log U`` of each resource,
        :data:`LOG_PRICE_CAP` less the log of its largest capacity (computed once per
        capacity array)."""
        if self._capped is None or self._capped[0] is not self.capacity:
            # a resource no server of this side has is priced at a share of 1 (nothing
            # demands it here) and capped as one of capacity 1: uncapped, an estimated U
            # past e^709 priced it inf, and inf x a demand of 0 made the search's stopping
            # bound (min_unit_price) NaN, which stopped searches at their first slot
            largest = self.capacity.max(axis=0, initial=0.0)
            cap = LOG_PRICE_CAP - np.log(np.where(largest > 0, largest, 1.0))
            self._capped = (self.capacity, cap)
        return self._capped[1]

    @property
    def price(self) -> NDArray[np.float64]:
        """``(S, n, R)`` float64, the price of one unit, utility per unit per slot (every
        slot derived first)."""
        return self.prices(0, self.used.shape[0])

    def prices(self, lo: int, hi: int, idle: bool = True) -> NDArray[np.float64]:
        """The whole ``(S, n, R)`` price array, with window slots ``lo .. hi - 1`` derived
        under the bounds in use (slots outside may be stale). With ``idle`` False, of the
        untouched slots in the range only the first is made valid (they all price alike)."""
        if lo >= hi:
            return self.cells
        stale = (self.priced[lo:hi] != self.version).nonzero()[0]  # np.flatnonzero, 1-D
        if not stale.size:
            return self.cells
        stale += lo
        busy = self.touched[stale]
        empty = stale[~busy]
        if not idle and empty.size:  # the first untouched slot, the one a search reads
            first = lo + int(self.touched[lo:hi].argmin())
            empty = empty[:1] if empty[0] == first else empty[:0]
        self.cells[empty] = self.empty_price
        rows = stale[busy]
        if rows.size:
            self._derive(rows)
        self.priced[empty] = self.version
        self.priced[rows] = self.version
        self.derived += int(empty.size + rows.size)
        return self.cells

    def _derive(self, rows: NDArray[np.intp]) -> None:
        """Derive the cells of window slots ``rows`` from their amounts.

        A server with nothing allocated in a slot prices at :attr:`empty_price`: the same
        floats, as ``exp`` gets the same argument (a share of 0, or of 1 where the server
        lacks the resource) whatever else the array holds. So when few servers of these
        slots hold anything (a large cluster), only theirs are derived."""
        amounts = self.used[rows]  # (k, n, R)
        held = amounts.any(axis=2)  # (k, n)
        if 4 * int(np.count_nonzero(held)) > held.size:
            self.cells[rows] = price(self.log_l, self.log_u, amounts, self.capacity)
            return
        self.cells[rows] = self.empty_price
        t, h = np.nonzero(held)
        self.cells[rows[t], h] = price(self.log_l, self.log_u, amounts[t, h], self.capacity[h])

    def kernel_view(
        self, demand: NDArray[np.float64], lo: int = 0, hi: int | None = None
    ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
        """``(price, used, capacity, demand)`` as the compiled search takes a side, with
        prices derived in window slots ``lo .. hi - 1`` (None: to the end)."""
        cells = self.prices(lo, self.used.shape[0] if hi is None else hi)
        return (cells, self.used, self.capacity, np.ascontiguousarray(demand, np.float64))

    def min_unit_price(self, demand: NDArray[np.float64], lo: int, hi: int) -> NDArray[np.float64]:
        """``(hi - lo,)`` float64: per window slot, ``sum_r demand[r] * min_h price[h, r]``,
        at most the price of one unit of ``demand`` on any server of the slot (equal up to
        rounding when one server is cheapest in every resource)."""
        # price() of the least shares at capacity 1: share / 1 is the share, so the same
        # floats without its division and masks
        log_l = self.log_l
        least = np.exp(log_l + self.min_share[lo:hi] * (self.log_u - log_l))
        out: NDArray[np.float64] = least @ demand
        return out

    def reprice(self, lo: int, hi: int) -> NDArray[np.bool_]:
        """Amounts of window slots ``lo .. hi - 1`` changed: their prices are derived
        again when next read, and their least shares now. Returns ``(hi - lo,)`` bool,
        whether anything is allocated in each of those slots."""
        self.priced[lo:hi] = 0
        return self.refresh_shares(lo, hi)

    def refresh_shares(self, lo: int, hi: int) -> NDArray[np.bool_]:
        """Recompute :attr:`min_share` of window slots ``lo .. hi - 1``; returns
        ``(hi - lo,)`` bool, whether anything is allocated in each of those slots."""
        busy = np.zeros(self.used.shape[0], np.bool_)
        if lo < hi:
            least_shares(self.used, self.capacity, lo, hi, self.min_share, busy)
        out: NDArray[np.bool_] = busy[lo:hi]
        return out

    def fill_blocked(self, lo: int, hi: int) -> None:
        """Set amounts of blocked cells in window slots ``lo .. hi - 1`` to capacity."""
        t, srv = np.nonzero(self.blocked[lo:hi])
        self.used[lo + t, srv] = self.capacity[srv]

    def snapshot(self, touched: NDArray[np.bool_]) -> Side:
        """A copy for :meth:`Ledger.snapshot`: amounts, marks and blocks copied, its
        ``touched`` the ledger copy's; its price cells not copied but fresh (unwritten
        memory, which the system hands out as it is first written) and every slot stale
        (``priced`` 0), so each slot is derived from its amounts when next read (the
        same floats, see the class)."""
        return replace(
            self,
            used=self.used.copy(),
            cells=np.empty_like(self.cells),
            blocked=self.blocked.copy(),
            down=self.down.copy(),
            touched=touched,
            min_share=self.min_share.copy(),
            priced=np.zeros_like(self.priced),
            ahead=list(self.ahead),
            _known=list(self._known),
        )

    def job_used(self) -> NDArray[np.float64]:
        """``(S, n, R)`` amounts allocated to jobs (blocked cells count 0)."""
        out: NDArray[np.float64] = np.where(self.blocked[:, :, None], 0.0, self.used)
        return out


_Columns = tuple[NDArray[np.intp], NDArray[np.intp]]
"""Server indices of each kind, ``(workers (k,), ps (k,))``."""


def _columns(*schedules: Schedule) -> _Columns:
    """The servers, of each kind, that any of ``schedules`` holds units on."""
    n_w, n_p = schedules[0].workers.shape[1], schedules[0].ps.shape[1]
    workers, ps = np.zeros(n_w, np.bool_), np.zeros(n_p, np.bool_)
    for s in schedules:
        if s.slots:
            workers |= s.workers.any(axis=0)
            ps |= s.ps.any(axis=0)
    return np.flatnonzero(workers), np.flatnonzero(ps)


@dataclass(frozen=True, eq=False)
class _Entry:
    worker: NDArray[np.float64]
    ps: NDArray[np.float64]
    schedule: Schedule


class Ledger:
    """Allocations and prices over the window ``origin .. origin + length - 1``.

    Attributes:
        cluster: the servers.
        bounds: the price bounds.
        origin: the absolute slot of window index 0.
        length: slots in the window.
        worker_side, ps_side: amounts and prices of worker and PS servers.
        touched: ``(S,)`` bool, True where any amount is allocated; untouched slots
            all share the empty-cluster prices.
    """

    def __init__(self, cluster: Cluster, bounds: PriceBounds, length: int, origin: int = 0) -> None:
        if length < 1:
            raise ValueError("a ledger needs at least one slot")
        self.cluster = cluster
        self.bounds = bounds
        self.origin = origin
        self.length = length
        self.touched = np.zeros(length, dtype=np.bool_)
        self.worker_side = Side.empty(
            cluster.worker_capacity, length, bounds.log_l1, bounds.log_u1, self.touched
        )
        self.ps_side = Side.empty(
            cluster.ps_capacity, length, bounds.log_l2, bounds.log_u2, self.touched
        )
        self._entries: dict[str, _Entry] = {}
        # within :meth:`deferred`: the window indices ``[lo, hi)`` and the worker and PS
        # server columns whose amounts changed by differences, rebuilt exactly at its end
        self._deferred: tuple[list[int], set[int], set[int]] | None = None

    # -- reading -----------------------------------------------------------------------

    @property
    def end(self) -> int:
        """One past the last absolute slot of the window."""
        return self.origin + self.length

    def index(self, slot: int) -> int:
        """Window index of absolute ``slot``; LedgerError if outside the window."""
        if not self.origin <= slot < self.end:
            raise LedgerError(f"slot {slot} is outside the window {self.origin}..{self.end - 1}")
        return slot - self.origin

    def schedule(self, job_id: str) -> Schedule:
        """The admitted schedule of ``job_id`` as it stands (after any release)."""
        try:
            return self._entries[job_id].schedule
        except KeyError:
            raise LedgerError(f"no admitted job {job_id!r}") from None

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._entries

    def holding(
        self, kind: str, index: int | Sequence[int], from_slot: int, until: int | None = None
    ) -> list[str]:
        """The jobs with units on server ``index`` of ``kind`` (or on any of the servers
        ``index``, a sequence) in absolute slots ``from_slot .. until - 1`` (``until``
        None: from then on), in admission order: those a block of it there must move
        first (a failure, a cordon)."""
        return [
            j
            for j, e in self._entries.items()
            if self._uses(
                e.schedule if until is None else e.schedule.before(until), kind, index, from_slot
            )
        ]

    def snapshot(self) -> Ledger:
        """A copy of this ledger's state, for :meth:`restore`: a trial of changes that may
        be undone. Its amounts, blocks and jobs' entries are copied; the cluster, the
        bounds and the jobs' schedules (never changed in place: a change replaces the
        entry) are shared; the price cells are not copied, the copy's all stale
        (:meth:`Side.snapshot`). A deep copy also copied every cell's price and every
        schedule: at 10,000 servers x 300 slots, 0.4 s of the decision thread and about
        twice the ledger's memory for every cordon (the operator's scale audit)."""
        saved = copy.copy(self)
        saved.touched = self.touched.copy()
        saved.worker_side = self.worker_side.snapshot(saved.touched)
        saved.ps_side = self.ps_side.snapshot(saved.touched)
        saved._entries = dict(self._entries)
        saved._deferred = copy.deepcopy(self._deferred)
        return saved

    def restore(self, saved: Ledger) -> None:
        """Put this ledger back as it was when ``saved`` (its :meth:`snapshot`) was taken,
        in place: whoever holds this ledger holds the restored one. ``saved`` is used up
        (its arrays become this ledger's)."""
        self.__dict__.update(saved.__dict__)

    def job_ids(self) -> list[str]:
        """Jobs with a schedule in the ledger, in admission order."""
        return list(self._entries)

    def side(self, kind: str) -> Side:
        """The side of ``kind`` (``"worker"`` or ``"ps"``)."""
        if kind == "worker":
            return self.worker_side
        if kind == "ps":
            return self.ps_side
        raise LedgerError(f"unknown server kind {kind!r} (known: worker, ps)")

    def demands(self, job_id: str) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``(worker, ps)``: the per-unit demands ``(R,)`` ``job_id`` was admitted with."""
        entry = self._entries.get(job_id)
        if entry is None:
            raise LedgerError(f"no admitted job {job_id!r}")
        return entry.worker, entry.ps

    def is_down(self, kind: str, index: int) -> bool:
        """True if server ``index`` of ``kind`` is down with no end."""
        return bool(self.side(kind).down[index])

    # -- changing ----------------------------------------------------------------------

    def set_bounds(self, bounds: PriceBounds) -> None:
        """Use new price bounds (nothing is done when they equal the bounds in use).

        Costs ``O(n R)``: prices are derived from the amounts lazily, slot by slot, as
        they are read (:class:`Side`)."""
        if bounds.same_as(self.bounds):
            return
        old, self.bounds = self.bounds, bounds
        if not (same_values(old.floor1, bounds.floor1) and same_values(old.log_u1, bounds.log_u1)):
            self.worker_side.use_bounds(bounds.log_l1, bounds.log_u1)
        if not (same_values(old.floor2, bounds.floor2) and same_values(old.log_u2, bounds.log_u2)):
            self.ps_side.use_bounds(bounds.log_l2, bounds.log_u2)

    def admit(
        self,
        job_id: str,
        worker: NDArray[np.float64],
        ps: NDArray[np.float64],
        schedule: Schedule,
    ) -> None:
        """Add ``schedule`` (per-unit demands ``worker`` and ``ps``, ``(R,)``).

        Raises:
            LedgerError: the job is already admitted, or the schedule leaves the window.
            CapacityError: some amount would exceed a capacity; nothing changes.
        """
        if job_id in self._entries:
            raise LedgerError(f"job {job_id!r} is already admitted")
        if schedule.slots == 0:
            raise LedgerError(f"job {job_id!r}: empty schedule")
        lo = self.index(schedule.start)
        hi = self.index(schedule.start + schedule.slots - 1) + 1
        # only the servers the schedule uses change (x + 0 is x): (slots, m, R) each
        changes = []
        for name, side, counts, demand in (
            ("worker", self.worker_side, schedule.workers, worker),
            ("PS", self.ps_side, schedule.ps, ps),
        ):
            cols = np.flatnonzero(counts.any(axis=0))
            new = side.used[lo:hi, cols] + counts[:, cols, None] * demand[None, None, :]
            cap = side.capacity[None, cols]
            over = new > cap + capacity_slack(cap)
            if over.any():
                t, srv, r = (int(i) for i in np.argwhere(over)[0])
                raise CapacityError(
                    f"job {job_id!r} would exceed {name} server "
                    f"{self._server_name(name, int(cols[srv]))} resource "
                    f"{self.cluster.resources[r]!r} in slot {schedule.start + t}"
                )
            changes.append((side, cols, new))
        for side, cols, new in changes:
            side.used[lo:hi, cols] = new
        self._entries[job_id] = _Entry(worker, ps, schedule)
        self._refresh(lo, hi)

    def release(self, job_id: str, from_slot: int) -> Schedule:
        """Take back ``job_id``'s slots from ``from_slot`` on; returns the released part.

        The job keeps its slots before ``from_slot`` (what already ran). Releasing from
        the job's first slot removes it entirely.
        """
        if job_id not in self._entries:
            raise LedgerError(f"no admitted job {job_id!r}")
        return self.release_many([job_id], from_slot)[job_id]

    def release_many(self, job_ids: Sequence[str], from_slot: int) -> dict[str, Schedule]:
        """:meth:`release` of each of ``job_ids`` from ``from_slot`` on (those the ledger
        holds; each id once), the amounts rebuilt once for all: ``{job: released
        part}``. The same amounts, bit for bit, as releasing them one at a time (each
        cell is rebuilt as its sum over the jobs left, in admission order), without one
        rebuild over every job per job: 1,000 jobs completed together took 1 s of the
        decision thread in rebuilds alone."""
        released: dict[str, Schedule] = {}
        for job_id in job_ids:
            entry = self._entries.get(job_id)
            if entry is None or job_id in released:
                continue
            part = entry.schedule.after(from_slot)
            kept = entry.schedule.before(from_slot)
            if kept.slots and kept.workers.any():
                self._entries[job_id] = _Entry(entry.worker, entry.ps, kept)
            else:
                del self._entries[job_id]
            released[job_id] = part
        parts = [p for p in released.values() if p.slots]
        if parts:
            lo = max(min(p.start for p in parts), self.origin)
            hi = min(max(p.start + p.slots for p in parts), self.end)
            if lo < hi:
                self._recompute(lo - self.origin, hi - self.origin, _columns(*parts))
        return released

    def replace(self, job_id: str, schedule: Schedule) -> None:
        """Make ``schedule`` the schedule of admitted ``job_id``, keeping its place in the
        admission order (a re-plan). The job stays in the ledger even if ``schedule`` is
        empty, so a later replace puts it back in the same place.

        Raises:
            LedgerError: no such job.
            CapacityError: the new schedule does not fit; nothing changes.
        """
        entry = self._entries.get(job_id)
        if entry is None:
            raise LedgerError(f"no admitted job {job_id!r}")
        old = entry.schedule
        parts = [s for s in (old, schedule) if s.slots]
        lo = max(min((s.start for s in parts), default=self.origin), self.origin) - self.origin
        hi = min(max((s.start + s.slots for s in parts), default=0), self.end) - self.origin
        self._entries[job_id] = _Entry(entry.worker, entry.ps, schedule)  # same place
        if lo < hi and self._deferred is not None:
            self._replace_by_difference(job_id, entry, schedule, lo, hi)
            return
        if lo < hi:
            columns = _columns(old, schedule)
            self._recompute(lo, hi, columns)
            problem = self._over_capacity(lo, hi, schedule)
            if problem:
                self._entries[job_id] = entry
                self._recompute(lo, hi, columns)
                raise CapacityError(f"job {job_id!r}: the new schedule {problem}")

    def reorder(self, job_ids: Sequence[str]) -> None:
        """Put the jobs in the order of ``job_ids`` (any not named keep theirs, after
        them) and rebuild every amount in that order: the ledger then equals, bit for
        bit, one that admitted them in it (a rebuild from the store admits in decision
        order; a refit at start admits the refitted jobs after the others)."""
        named = [j for j in dict.fromkeys(job_ids) if j in self._entries]
        seen = set(named)
        order = named + [j for j in self._entries if j not in seen]
        if order == list(self._entries):
            return
        self._entries = {j: self._entries[j] for j in order}
        self._recompute(0, self.length)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Within it, :meth:`replace` changes the amounts by the difference of the two
        schedules (its cost the job's cells) instead of summing every job holding the
        cells again (its cost every such job: a cordon of a server holding 2,440 small
        jobs made 4,880 replaces of 2,440 jobs each, and held every tenant's calls for
        four minutes). Capacity is checked after each, as outside. At its end the cells
        changed are rebuilt once from the schedules in admission order (:meth:`_recompute`),
        so the ledger ends bit for bit as a rebuild gives it; in between, amounts may
        differ from that by rounding. Nested, the outermost rebuilds."""
        if self._deferred is not None:
            yield
            return
        self._deferred = ([self.length, 0], set(), set())
        try:
            yield
        finally:
            (lo, hi), w, p = self._deferred
            self._deferred = None
            if lo < hi:
                columns = (np.array(sorted(w), np.intp), np.array(sorted(p), np.intp))
                self._recompute(lo, hi, columns)

    @contextlib.contextmanager
    def avoiding(self, servers: dict[str, list[int]], from_slot: int) -> Iterator[None]:
        """Within it, the servers ``servers`` (their indices by kind) have no room from
        absolute ``from_slot`` on: their amounts read as their capacity, as a blocked
        server's, so no placement or search puts a new unit there (and they price at
        ``U``), but they are not blocked: jobs keep the units they hold on them, and a
        job may give back and take again its own. At its end their amounts are rebuilt
        from the schedules (exact, as after any change). Only within :meth:`deferred`
        (outside, a :meth:`replace` rebuilds the cells it changes from the schedules and
        would give the room back). Used by :func:`pricing.replan.fail_servers` to keep
        a failed server's jobs off servers about to fail too.

        Raises:
            LedgerError: outside :meth:`deferred`.
        """
        if self._deferred is None:
            raise LedgerError("avoiding() needs deferred(): a replace outside rebuilds cells")
        lo = max(from_slot, self.origin) - self.origin
        w = np.array(sorted(set(servers.get("worker", []))), np.intp)
        p = np.array(sorted(set(servers.get("ps", []))), np.intp)
        if lo >= self.length or not (w.size or p.size):
            yield
            return
        for side, cols in ((self.worker_side, w), (self.ps_side, p)):
            if cols.size:
                side.used[lo:, cols] = side.capacity[cols]
        self._refresh(lo, self.length)
        try:
            yield
        finally:
            self._recompute(lo, self.length, (w, p))

    def _replace_by_difference(
        self, job_id: str, entry: _Entry, schedule: Schedule, lo: int, hi: int
    ) -> None:
        """:meth:`replace` within :meth:`deferred`: ``entry`` (the job's before) has
        been replaced by ``schedule``; amounts of window slots ``lo .. hi - 1`` move by
        the difference, or back if it does not fit (CapacityError)."""
        assert self._deferred is not None
        columns = _columns(entry.schedule, schedule)
        # noted first: a move refused (put back by differences, which round) or one
        # that raised half-way is rebuilt at the end too, as every other (the review)
        span, w, p = self._deferred
        span[0], span[1] = min(span[0], lo), max(span[1], hi)
        w.update(columns[0].tolist())
        p.update(columns[1].tolist())
        self._add(entry, entry.schedule, columns, -1.0, lo, hi)
        self._add(entry, schedule, columns, 1.0, lo, hi)
        problem = self._over_capacity(lo, hi, schedule)
        if problem:
            self._entries[job_id] = entry
            self._add(entry, schedule, columns, -1.0, lo, hi)
            self._add(entry, entry.schedule, columns, 1.0, lo, hi)
            raise CapacityError(f"job {job_id!r}: the new schedule {problem}")

    def _add(
        self, entry: _Entry, sched: Schedule, columns: _Columns, sign: float, lo: int, hi: int
    ) -> None:
        """Add ``sign`` times ``sched``'s units (of ``entry``'s demands) on ``columns`` to
        the amounts, then refresh window slots ``lo .. hi - 1`` (amounts never below 0,
        blocked cells full)."""
        a = max(self.origin, sched.start)
        b = min(self.end, sched.start + sched.slots)
        if a < b:
            rows = slice(a - sched.start, b - sched.start)
            win = slice(a - self.origin, b - self.origin)
            for side, counts, demand, cols in (
                (self.worker_side, sched.workers, entry.worker, columns[0]),
                (self.ps_side, sched.ps, entry.ps, columns[1]),
            ):
                part = counts[rows][:, cols]
                if part.any():
                    cells = side.used[win, cols] + sign * (part[:, :, None] * demand)
                    side.used[win, cols] = np.maximum(cells, 0.0)
        for side in (self.worker_side, self.ps_side):
            side.fill_blocked(lo, hi)
        self._refresh(lo, hi)

    def block(
        self, kind: str, index: int | Sequence[int], from_slot: int, until: int | None = None
    ) -> None:
        """Take server ``index`` of ``kind`` (or each of the servers ``index``, a sequence:
        as one at a time, with one walk of the jobs and one repricing, which a cordon of
        100 servers at 5,000 took 100 times over) down from absolute ``from_slot`` on: its
        capacity there is zero. With ``until`` (absolute, exclusive) it is down only in
        slots ``from_slot .. until - 1`` of this window (an outage it has recovered from,
        replayed at a rebuild); without, in this window and every slot it opens later.

        Raises:
            LedgerError: a job still has an allocation on it in those slots (move those
                first).
        """
        side = self.side(kind)
        indices = [int(i) for i in np.atleast_1d(index)]
        lo = max(from_slot, self.origin) - self.origin
        hi = self.length if until is None else min(max(until - self.origin, 0), self.length)
        users = self.holding(kind, indices, self.origin + lo, self.origin + hi) if lo < hi else []
        if users:
            last = "" if until is None else f" to {until - 1}"
            which = f"#{indices[0]}" if len(indices) == 1 else f"among #{indices[:20]}"
            raise LedgerError(
                f"{kind} server {which} still holds jobs {users} in slots {from_slot}{last}"
            )
        # noted only once nothing refuses the block: a refused one left its part past the
        # window here, and the next advance blocked the server under the job it held
        if until is not None and until > self.end and until > from_slot:
            side.ahead.extend((i, from_slot, until) for i in indices)
        if lo < hi and indices:
            side.blocked[lo:hi, indices] = True
            side.fill_blocked(lo, hi)
            self._refresh(lo, hi)
        if until is None:
            side.down[indices] = True

    def unblock(self, kind: str, index: int, from_slot: int) -> None:
        """Bring server ``index`` of ``kind`` back from absolute ``from_slot`` on."""
        side = self.side(kind)
        side.down[index] = False
        side.ahead = [b for b in side.ahead if b[0] != index or b[2] <= from_slot]
        lo = max(from_slot, self.origin) - self.origin
        if lo < self.length and side.blocked[lo:, index].any():
            side.blocked[lo:, index] = False
            one, none = np.array([index], np.intp), np.zeros(0, np.intp)
            self._recompute(lo, self.length, (one, none) if kind == "worker" else (none, one))

    def advance(self, origin: int) -> None:
        """Move the window to start at ``origin``: past slots drop, new empty ones open."""
        shift = origin - self.origin
        if shift < 0:
            raise LedgerError(f"the window cannot move back from {self.origin} to {origin}")
        if shift == 0:
            return
        keep = max(self.length - shift, 0)
        for side in (self.worker_side, self.ps_side):
            side.used[:keep] = side.used[self.length - keep :]
            side.used[keep:] = 0.0
            side.cells[:keep] = side.cells[self.length - keep :]
            side.priced[:keep] = side.priced[self.length - keep :]
            side.priced[keep:] = 0
            side.min_share[:keep] = side.min_share[self.length - keep :]
            side.refresh_shares(keep, self.length)
            side.blocked[:keep] = side.blocked[self.length - keep :]
            side.blocked[keep:] = side.down[None, :]
            for index, first, until in side.ahead:  # blocks with an end past the old window
                lo, hi = max(first - origin, keep), min(until - origin, self.length)
                if lo < hi:
                    side.blocked[lo:hi, index] = True
            side.ahead = [b for b in side.ahead if b[2] > origin + self.length]
        self.touched[:keep] = self.touched[self.length - keep :]
        self.touched[keep:] = False
        self.origin = origin
        if self.worker_side.blocked[keep:].any() or self.ps_side.blocked[keep:].any():
            for side in (self.worker_side, self.ps_side):
                side.fill_blocked(keep, self.length)
            self._refresh(keep, self.length)
        for job_id in [j for j, e in self._entries.items() if e.schedule.end < origin]:
            del self._entries[job_id]

    # -- internals ---------------------------------------------------------------------

    def _recompute(self, lo: int, hi: int, columns: _Columns | None = None) -> None:
        """Rebuild amounts of window slots ``lo .. hi - 1`` from the schedules, in
        admission order (the order ``admit`` added them in).

        With ``columns`` (``(workers, ps)``, each the ``(k,)`` indices of the servers of
        that kind whose amounts changed), only those servers' amounts are rebuilt. Each
        cell is its own sum over the jobs in admission order, so the others' are what a
        rebuild of every server gives, bit for bit; at 2,000 + 2,000 servers a rebuild of
        every server took 0.3 s per moved job of a server failure or cordon."""
        a, b = self.origin + lo, self.origin + hi
        if columns is None:
            for side in (self.worker_side, self.ps_side):
                side.used[lo:hi] = 0.0
        else:
            self.worker_side.used[lo:hi, columns[0]] = 0.0
            self.ps_side.used[lo:hi, columns[1]] = 0.0
        for entry in self._entries.values():
            sched = entry.schedule
            s_lo = max(a, sched.start)
            s_hi = min(b, sched.start + sched.slots)
            if s_lo >= s_hi:
                continue
            rows = slice(s_lo - sched.start, s_hi - sched.start)
            win = slice(s_lo - self.origin, s_hi - self.origin)
            if columns is None:
                self.worker_side.used[win] += sched.workers[rows, :, None] * entry.worker
                self.ps_side.used[win] += sched.ps[rows, :, None] * entry.ps
                continue
            # a job with no units on those servers adds zeros there (x + 0 is x): skipped
            w, p = columns
            counts = sched.workers[rows][:, w]
            if counts.any():
                self.worker_side.used[win, w] += counts[:, :, None] * entry.worker
            counts = sched.ps[rows][:, p]
            if counts.any():
                self.ps_side.used[win, p] += counts[:, :, None] * entry.ps
        for side in (self.worker_side, self.ps_side):
            side.fill_blocked(lo, hi)
        self._refresh(lo, hi)

    def _uses(
        self, schedule: Schedule, kind: str, index: int | Sequence[int], from_slot: int
    ) -> bool:
        part = schedule.after(from_slot)
        counts = part.workers if kind == "worker" else part.ps
        return bool(part.slots and counts[:, index].any())

    def _over_capacity(self, lo: int, hi: int, schedule: Schedule) -> str:
        """Where window slots ``lo .. hi - 1`` exceed a capacity (or ``schedule`` uses a
        blocked server), in words; empty if nowhere."""
        for name, side, counts in (("worker", self.worker_side, schedule.workers),
                                   ("PS", self.ps_side, schedule.ps)):  # fmt: skip
            over = side.used[lo:hi] > side.capacity[None] + capacity_slack(side.capacity)[None]
            if schedule.slots:
                a = max(schedule.start, self.origin + lo)
                b = min(schedule.start + schedule.slots, self.origin + hi)
                if a < b:
                    rows = counts[a - schedule.start : b - schedule.start] > 0
                    hit = rows & side.blocked[a - self.origin : b - self.origin]
                    if hit.any():
                        t, srv = (int(i) for i in np.argwhere(hit)[0])
                        shown = self._server_name(name, srv)
                        return f"uses {name} server {shown}, down in slot {a + t}"
            if over.any():
                t, srv, r = (int(i) for i in np.argwhere(over)[0])
                resource = self.cluster.resources[r]
                shown = self._server_name(name, srv)
                return f"exceeds {name} server {shown} {resource!r} in slot {self.origin + lo + t}"
        return ""

    def _server_name(self, kind: str, index: int) -> str:
        """Server ``index`` of ``kind`` (``"worker"`` or ``"PS"``) as messages name it:
        its configured name, quoted (a refit's reason, a tenant's event, said ``worker
        server #2`` before, which an operator had to count out in ``[cluster]``)."""
        names = self.cluster.worker_names if kind == "worker" else self.cluster.ps_names
        return repr(names[index]) if 0 <= index < len(names) else f"#{index}"

    def _refresh(self, lo: int, hi: int) -> None:
        busy_w = self.worker_side.reprice(lo, hi)
        busy_p = self.ps_side.reprice(lo, hi)
        self.touched[lo:hi] = busy_w | busy_p
