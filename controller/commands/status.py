"""``oasis status``: one screen for an operator: cluster use, price heat by server over the
next slots, and the jobs in flight (``--json`` for scripts).

Built from the public API (ListServers, GetUtilisation, GetPrices, ListJobs, and
GetLeadership of every head node named: its role, epoch and lease age; high
availability, ``controller/ha``). Price heat:
a server's unit prices (SPEC 4) grow exponentially with its use, from a floor per resource
and kind of server (``L1[r]`` for workers, ``L2[r]`` for parameter servers; the estimated
bounds give each resource its own, normalised by capacity). A cell shows ``max over
resources of log(price / floor)`` on a ramp from ``.`` (the floor: nothing in use) to
``@`` (the hottest cell on screen), and the legend says how many times the floor that
is. A floor is the lowest price of its resource seen in the shown slots and, over the
whole window, on the first server of each kind (the far slots are rarely booked).

With ``[mqtt]``, a line under the daemon's health names the servers in service whose
agent was never heard or is silent past the heartbeat timeout (ListServers'
``agent_heard_seconds_ago``): they get plans, and the jobs planned there do not run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from typing import Any

import grpc

from controller.clock import SlotTimes
from controller.commands import SUMMARIES
from controller.commands.client import get_prices, list_jobs
from controller.commands.common import EXIT_OK, INT32_MAX, fmt, int_at_least
from controller.commands.connection import (
    CHECK_IT,
    SILENT_WORDS,
    Stubs,
    guarded,
    options,
    store_unavailable,
    took_but_silent,
    unreachable_cause,
)
from controller.commands.records import (
    agents_unheard,
    clock_caption,
    local_time,
    slot_label,
    state_name,
    unheard_line,
    unheard_record,
)
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.table import render_table

__all__ = ["register"]

STORE_RETRY_SECONDS = 2.0
"""How long the jobs in flight are retried over several head nodes (a PostgreSQL
restart) before the status is shown without them."""

RAMP = ".:-=+*#%@"  # level 0 (nothing in use / the price floor) .. 8 (the most)
_KIND = {pb.SERVER_KIND_WORKER: "worker", pb.SERVER_KIND_PS: "ps"}
_WHOLE_WINDOW = 1 << 20  # slots: the server clips it to the window
SERVERS_SHOWN = 40
"""Servers the price heat shows by default: the hottest (at 10,000 servers the screen was
10,000 lines; the operator's scale audit)."""


def register(sub: Any) -> None:
    """Add the ``status`` subcommand to ``sub`` (an argparse subparsers object)."""
    help_ = SUMMARIES["status"]
    p = sub.add_parser("status", parents=[options()], help=help_, description=help_)
    p.add_argument("--slots", type=int_at_least(1, INT32_MAX), default=12,
                   help="slots to show from now (default 12)")  # fmt: skip
    p.add_argument("--limit", type=int_at_least(0), default=20,
                   help="jobs in flight to list (default 20)")  # fmt: skip
    p.add_argument(
        "--servers",
        type=int_at_least(0),
        default=SERVERS_SHOWN,
        metavar="N",
        help=f"servers in the price heat: the N hottest, and any out of service, in the "
        f"cluster's order (default {SERVERS_SHOWN}; 0: every server; --json lists all)",
    )
    p.set_defaults(func=guarded(run))


@dataclass(frozen=True)
class ServerHeat:
    """One server's price heat.

    Attributes:
        server, kind: the server and its kind (``worker`` or ``ps``).
        price_ratio: per shown slot, the highest unit price over its resources divided by
            the floor of that resource on its kind of server (>= 1).
        busiest: the resource with the largest share in use now, as ``gpu 4/8``, or
            ``idle``; after ``cordoned; `` (``cordoned to slot N; `` for a cordon with
            an end) or ``failed; `` for a server out of service.
    """

    server: str
    kind: str
    price_ratio: list[float]
    busiest: str


@dataclass(frozen=True)
class Status:
    """What ``oasis status`` shows; ``--json`` prints it as is."""

    server: str
    current_slot: int
    first_slot: int
    slots: int
    use: list[dict[str, Any]]
    price_floor: dict[str, dict[str, float]]
    heat: list[ServerHeat]
    jobs_in_flight: dict[str, int] | None  # None: not read (the store is unavailable)
    jobs: list[dict[str, Any]] | None
    clock: SlotTimes | None = None
    jobs_pending: int | None = None  # None: not read (the store is unavailable)
    nodes: list[dict[str, Any]] | None = None
    # servers up whose agent was never heard (heard_seconds_ago null) or is silent past
    # the heartbeat timeout, in the cluster's order; None: no agents watched (no [mqtt])
    agents_unheard: list[dict[str, Any]] | None = None


def collect(stubs: Stubs, server: str, slots: int) -> Status:
    """Read everything shown from the daemon (one call per API)."""
    t = stubs.timeout
    servers = stubs.cluster.ListServers(pb.ListServersRequest(), timeout=t)
    use = stubs.cluster.GetUtilisation(pb.GetUtilisationRequest(slots=slots), timeout=t)
    prices = get_prices(stubs, 0, slots)
    first_of_kind = {_KIND[s.kind]: s.name for s in reversed(servers.servers)}
    window = [
        row
        for name in first_of_kind.values()
        for row in stubs.cluster.GetPrices(
            pb.GetPricesRequest(slots=_WHOLE_WINDOW, server=name), timeout=t
        ).prices
    ]
    in_flight = [pb.JOB_STATE_RUNNING, pb.JOB_STATE_ADMITTED]
    try:
        # every node of several answers UNAVAILABLE with the store out: retried over them
        # for the whole --timeout, a status then took 30 s to say so (the HA audit)
        with stubs.pool.budget_at_most(STORE_RETRY_SECONDS):
            jobs: list[pb.Job] | None = list_jobs(stubs, in_flight)
            pending: int | None = len(list_jobs(stubs, [pb.JOB_STATE_PENDING]))
    except grpc.RpcError as err:  # the store is out: the ledger's views still show
        if not store_unavailable(err.details() or ""):
            raise
        jobs = pending = None

    floor: dict[str, dict[str, float]] = {}  # kind -> resource -> lowest price
    for row in (*prices.prices, *window):
        of_kind = floor.setdefault(_KIND[row.kind], {})
        of_kind[row.resource] = min(of_kind.get(row.resource, math.inf), *row.prices, math.inf)
    ratios: dict[str, list[float]] = {}
    for row in prices.prices:
        low = floor[_KIND[row.kind]][row.resource]
        current = ratios.setdefault(row.server, [1.0] * len(row.prices))
        for i, p in enumerate(row.prices):
            current[i] = max(current[i], p / low if low > 0 else 1.0)
    clock = stubs.times()
    heat = [
        ServerHeat(
            s.name,
            _KIND[s.kind],
            ratios.get(s.name, []),
            _busiest(s, clock, servers.current_slot),
        )
        for s in servers.servers
    ]
    shown = max((len(u.share) for u in use.use), default=0)
    order = {"running": 0, "admitted": 1}
    listed = sorted(jobs or [], key=lambda j: (order[state_name(j.state)], j.sequence))
    return Status(
        server=server,
        current_slot=servers.current_slot,
        first_slot=use.first_slot,
        slots=shown,
        use=[
            {"resource": u.resource, "kind": _KIND[u.kind], "share": list(u.share)} for u in use.use
        ],
        price_floor=floor,
        heat=heat,
        jobs_in_flight=None
        if jobs is None
        else {s: sum(state_name(j.state) == s for j in jobs) for s in order},
        jobs=None if jobs is None else [_job(j) for j in listed],
        jobs_pending=pending,
        clock=clock,
        nodes=nodes(stubs),
        agents_unheard=_unheard(servers),
    )


def _unheard(resp: pb.ListServersResponse) -> list[dict[str, Any]] | None:
    unheard = agents_unheard(resp)
    if unheard is None:
        return None
    return [unheard_record(s.name, s.agent_heard_seconds_ago) for s in unheard]


def nodes(stubs: Stubs) -> list[dict[str, Any]]:
    """Each head node named in ``--server``: its role, epoch and lease age
    (GetLeadership), or why it did not say; none from daemons without the service."""
    out: list[dict[str, Any]] = []
    for address in stubs.pool.addresses:
        stub = stubs.pool.stub(pb_grpc.HighAvailabilityStub, address)
        try:
            r = stub.GetLeadership(pb.GetLeadershipRequest(), timeout=min(stubs.timeout, 5.0))
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                continue
            out.append(_unanswered(address, err))
            continue
        out.append({
            "address": address, "role": r.role if r.enabled else "single", "epoch": r.epoch,
            "lease_age_seconds": round(r.lease_age_seconds, 3), "leader": r.leader,
            "applied_sequence": r.applied_sequence, "cannot_lead": r.cannot_lead or None,
            # "" from a daemon older than these fields: nothing said of its health
            **({"store_up": r.store_up, "broker": r.broker, "draining": r.draining,
                "writes_refused": r.writes_refused or None,
                "writes_locked": r.writes_locked or None,
                "store_down": r.store_down or None} if r.broker else {}),
        })  # fmt: skip
    return out


def _unanswered(address: str, err: grpc.RpcError) -> dict[str, Any]:
    """A node that did not answer GetLeadership, with what is known of it: ``not
    answering`` if it took the connection (up as far as its kernel goes: oasisd stopped
    or hung), else ``unreachable`` (nothing listens, the name does not resolve, ...).
    Before, a node frozen by SIGSTOP read ``unreachable``, as one switched off does."""
    code, details = err.code(), err.details() or ""
    if took_but_silent(code, details):
        role, reason = "not answering", SILENT_WORDS
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        role, reason = "not answering", "it did not answer in time (busy, stopped or hung)"
    else:
        role, reason = "unreachable", unreachable_cause(details)
    return {"address": address, "role": role, "error": code.name, "reason": reason}


def _health_lines(nodes: list[dict[str, Any]]) -> list[str]:
    """A line per node on its store, broker and drain: what is wrong first, in words
    (before, the operator's screen said nothing of a store or broker outage: the
    observability audit). A standby has no broker link of its own (the leader runs the
    execution plane): before, each healthy standby's line said THE BROKER IS
    DISCONNECTED."""
    out = []
    for n in nodes:
        if "reason" in n:  # it did not answer (:func:`_unanswered`)
            check = (
                CHECK_IT
                if n["role"] == "not answering"
                else "Check that oasisd runs there (systemctl status oasisd) and that "
                "--server names its address"
            )
            out.append(f"{n['address']}: {n['role'].upper()}: {n['reason']}. {check}")
            continue
        if "store_up" not in n:
            continue
        who = f"{n['address']}: " if len(nodes) > 1 else ""
        wrong = []
        if not n["store_up"]:
            why = f": {n['store_down']}" if n.get("store_down") else ""
            wrong.append(f"THE STORE IS UNAVAILABLE (no decision can be stored){why}")
        elif n.get("writes_refused"):
            wrong.append("THE STORE REFUSES WRITES (no decision can be stored; reads go on): "
                         f"{n['writes_refused']}")  # fmt: skip
        elif n.get("writes_locked"):
            wrong.append("THE STORE'S WRITES WAIT FOR A LOCK (no decision can be stored; "
                         f"reads go on): {n['writes_locked']}")  # fmt: skip
        standby = n["role"] == "standby"  # runs no plane: the leader's link is the one
        if n["broker"] == "disconnected" and not standby:
            wrong.append("THE BROKER IS DISCONNECTED (no plan reaches the agents)")
        if n["draining"]:
            wrong.append("DRAINING (stopping: new decisions are refused)")
        if wrong:
            out.append(f"{who}{'; '.join(wrong)}")
        else:
            broker = {"connected": "broker connected", "none": "no broker"}.get(
                n["broker"], "broker: the leader's (a standby runs no execution plane)"
            )
            out.append(f"{who}store up, {broker}")
    return out


def _leadership_warnings(nodes: list[dict[str, Any]]) -> list[str]:
    """Lines on what the nodes' table alone does not say: that no node named leads (a
    standby names a leader that is gone), and each standby that could not take over."""
    out = []
    if nodes and not any(n["role"] in ("leader", "single") for n in nodes):
        named = sorted({n["leader"] for n in nodes if n.get("leader")})
        where = f": the standbys name {', '.join(named)}" if named else ""
        out.append(f"no node named in --server leads{where}")
    for n in nodes:
        if n.get("cannot_lead"):
            out.append(f"{n['address']} cannot take over: {n['cannot_lead']}")
    return out


def _busiest(s: pb.Server, times: SlotTimes | None = None, now: int | None = None) -> str:
    """``gpu 4/8`` or ``idle``; a server out of service from the next slot on says so
    first (``cordoned; gpu 4/8``): its full prices ahead are no demand. A cordon's end or
    a planned one's start names its slot and, with the slot clock, its local time
    (``cordoned until slot 12 (Tue 14:00)``), as ``oasis servers`` does. One out of
    service in the current slot ``now`` reads ``out of service now``: ListServers gives
    its capacity as used there (it is held, its jobs moved off), and before this read
    ``cordoned; mem 488/488``, a full server, with nothing running on it."""
    out = "" if s.state in ("", "up") else f"{s.state}; "
    if s.state == "cordoned" and s.cordoned_until_slot:  # a planned maintenance
        out = f"cordoned until slot {slot_label(s.cordoned_until_slot, times)}; "
    elif s.state in ("", "up", "failed") and s.cordoned_from_slot:  # one ahead
        out += f"cordon from slot {slot_label(s.cordoned_from_slot, times)}; "
    if now is not None and _out_now(s, now):
        return out + "out of service now"
    shares = [(s.used.get(r, 0.0) / c, r) for r, c in s.capacity.items() if c > 0]
    share, r = max(shares, default=(0.0, ""))
    if share <= 0:
        return out + "idle"
    return out + f"{r} {s.used.get(r, 0.0):g}/{s.capacity[r]:g}"


def _out_now(s: pb.Server, now: int) -> bool:
    """Whether ``s`` is out of service in slot ``now``: cordoned from it or before, or
    failed and held whole (a failure holds a server from the slot after it, and its
    capacity is then all "used"; in the slot it failed in, its jobs' use shows)."""
    if s.state == "cordoned" and s.HasField("cordoned_from_slot"):
        return s.cordoned_from_slot <= now
    full = all(s.used.get(r, 0.0) >= c for r, c in s.capacity.items())
    return s.state == "failed" and bool(s.capacity) and full


def _job(j: pb.Job) -> dict[str, Any]:
    d = j.decision
    return {
        "id": j.spec.id,
        "state": state_name(j.state),
        "arrival_slot": d.arrival_slot,
        "completion_slot": d.completion_slot if d.HasField("completion_slot") else None,
        "payoff": d.payoff if d.HasField("payoff") else None,
    }


OUT_OF_SERVICE = ("cordoned", "failed")
"""How :attr:`ServerHeat.busiest` begins for a server out of service."""


_LARGEST_LOG = math.log(sys.float_info.max)


def _log_top(heat: list[ServerHeat]) -> float:
    """The log of the dearest price ratio over ``heat``'s servers and slots; 0 for none."""
    return max((math.log(r) for h in heat for r in h.price_ratio), default=0.0)


def times_floor(log_ratio: float) -> str:
    """``e^log_ratio``, a price over its floor, as the ramp's legend says it: pinned bounds
    may put it past the largest float (``1e308`` over ``1e-308``), where the legend said
    ``@ inf x``."""
    if log_ratio < _LARGEST_LOG:
        return f"{math.exp(log_ratio):.3g}"
    if math.isfinite(log_ratio):
        return f"e^{log_ratio:.4g}"
    return f"over {sys.float_info.max:.3g}"


def level(x: float, top: float) -> int:
    """``x`` in ``[0, top]`` on the ramp: 0 only for 0, else 1..8 (rounded up). Pinned
    bounds may make both infinite (a price of 1e308 over an L of 1e-308): inf over inf
    is the top, and any share above it too."""
    if x <= 0 or top <= 0:
        return 0
    share = x / top
    share = 1.0 if math.isnan(share) else min(share, 1.0)
    return max(1, math.ceil((len(RAMP) - 1) * share))


def shown_heat(heat: list[ServerHeat], servers: int) -> list[ServerHeat]:
    """The rows of the price heat on screen: with ``servers`` > 0, the ``servers``
    hottest (the highest price over the shown slots; the first in the cluster's order
    among equals) and every server out of service (cordoned, failed: what an operator
    looks for), in the cluster's order; 0: every server."""
    if servers <= 0 or len(heat) <= servers:
        return heat
    rank = sorted(range(len(heat)), key=lambda i: (-max(heat[i].price_ratio, default=1.0), i))
    keep = set(rank[:servers])
    keep.update(i for i, h in enumerate(heat) if h.busiest.startswith(OUT_OF_SERVICE))
    return [h for i, h in enumerate(heat) if i in keep]


def render(st: Status, limit: int, servers: int = 0) -> str:
    """The screen, as text; ``servers``: the price heat's rows (:func:`shown_heat`)."""
    last = st.first_slot + st.slots - 1
    span = f"{st.first_slot}..{last}"
    times = st.clock
    out = [f"oasis status: {st.server}, slot {slot_label(st.current_slot, times)}"]
    if times is not None:
        begins, ends = local_time(times.start(st.first_slot)), local_time(times.start(last + 1))
        out.append(f"slots {span} run from {begins} to {ends}; {clock_caption(times)}")
    out += _health_lines(st.nodes or [])
    out += unheard_line(st.agents_unheard)
    out.append("")
    if st.nodes and (len(st.nodes) > 1 or st.nodes[0]["role"] != "single"):
        rows = [
            [n["address"], n["role"], str(n.get("epoch", "-")),
             # a node without [ha] holds no lease: its "age" was its uptime (302.5 s)
             f"{n['lease_age_seconds']:.1f} s"
             if "lease_age_seconds" in n and n["role"] != "single" else "-",
             n.get("leader") or "-", str(n.get("applied_sequence", "-"))]
            for n in st.nodes
        ]  # fmt: skip
        out.append("head nodes (high availability): lease age = since the lease was confirmed "
                   "(a standby: since it last read the leader's record)")  # fmt: skip
        out.append(render_table(["node", "role", "epoch", "lease age", "leader", "applied event"],
                                rows, right={2, 3, 5}))  # fmt: skip
        out += _leadership_warnings(st.nodes)
        out.append("")

    out.append(f"cluster use: share of capacity in use, slots {span} ({RAMP[0]} none, @ all)")
    rows = []
    for u in st.use:
        share = u["share"]
        bar = "".join(RAMP[level(x, 1.0)] for x in share)
        now = f"{100 * share[0]:.0f}%" if share else "-"
        peak = f"{100 * max(share):.0f}%" if share else "-"
        rows.append([u["resource"], u["kind"], now, peak, bar])
    out.append(render_table(["resource", "kind", "now", "peak", span], rows, right={2, 3}))
    out.append("")

    # the ramp's top: the dearest price of a server in service. A failed or cordoned
    # server is priced as full where it is out; taken for the top, one cordon of an idle
    # server made it 1.87e+04 x the floor (from 690) and every other server's heat
    # a dot or two. Its cells above the top read @.
    serving = [h for h in st.heat if not h.busiest.startswith(OUT_OF_SERVICE)]
    top = _log_top(serving)
    if top <= 0:  # every server in service at its floor, or none: the ramp spans them all
        serving, top = st.heat, _log_top(st.heat)
    floors = ", ".join(
        f"{k} {min(v.values()):.3g}..{max(v.values()):.3g}"
        for k, v in sorted(st.price_floor.items())
        if v
    )
    out.append(f"price heat by server, slots {span}: the costliest resource of each server")
    out.append(
        f"  {RAMP[0]} each resource's price floor ({floors or '-'}), @ {times_floor(top)} x it"
        + (
            " or more (a server out of service: @ where it is out)"
            if len(serving) < len(st.heat)
            else ""
        )
        if top > 0
        else f"  {RAMP[0]} each resource's price floor ({floors or '-'}) everywhere"
    )
    heat = shown_heat(st.heat, servers)
    rows = [
        [h.server, h.kind, "".join(RAMP[level(math.log(r), top)] for r in h.price_ratio), h.busiest]
        for h in heat
    ]
    out.append(render_table(["server", "kind", span, "busiest now"], rows, right=set()))
    if len(heat) < len(st.heat):
        out.append(
            f"... and {len(st.heat) - len(heat):,} more servers, none hotter than those shown "
            "(--servers 0 lists every one; oasis servers)"
        )
    out.append("")

    out += _jobs_lines(st, limit, times)
    return "\n".join(out)


def _jobs_lines(st: Status, limit: int, times: SlotTimes | None) -> list[str]:
    """The jobs in flight: their counts (and the pending jobs', which the screen left
    out: a queue of jobs searched at every boundary, unseen), the first ``limit``, and
    where to find the rest (it named ``--state running`` for admitted jobs too)."""
    if st.jobs_in_flight is None or st.jobs is None:
        return ["jobs in flight: not read (the store is unavailable)"]
    counts = ", ".join(f"{n} {state}" for state, n in st.jobs_in_flight.items())
    if st.jobs_pending:
        counts += f"; {st.jobs_pending} pending, not admitted yet (oasis jobs --state pending)"
    out = [f"jobs in flight: {counts}"]
    if not st.jobs:
        return out
    rows = [
        [
            j["id"],
            j["state"],
            slot_label(j["arrival_slot"], times),
            "-"
            if j["completion_slot"] is None
            else slot_label(j["completion_slot"], times, end=True),
            fmt(j["payoff"]),
        ]
        for j in st.jobs[:limit]
    ]
    headers = ["job", "state", "arrival (begins)", "completes (done by)", "payoff"]
    if rows:  # --limit 0: the counts alone, not a table of headers
        out.append(render_table(headers, rows, right={4}))
    rest = st.jobs[limit:]
    if rest:
        states = dict.fromkeys(j["state"] for j in rest)  # running first, as listed
        where = " ".join(f"--state {state}" for state in states)
        out.append(f"... and {len(rest)} more (oasis jobs {where})")
    return out


def run(args: argparse.Namespace) -> int:
    st = collect(Stubs(args), args.server, args.slots)
    if args.json:
        print(json.dumps(asdict(st), indent=1))
    else:
        print(render(st, args.limit, args.servers))
    return EXIT_OK
