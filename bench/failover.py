"""Failover of ``oasisd`` with a standby (high availability, issue 14): the time from the
leader's death to the new leader's first decision, and what a following standby costs.

What is measured
    Two (or more) ``oasisd`` with ``[ha]`` share one PostgreSQL database (a throwaway
    server with ``fsync=off``, ``tests/servers.py``) at the paper's scale, as in
    ``bench/load_test.py``: 50 worker + 50 PS servers, T = 300. Client threads submit
    through :class:`controller.commands.failover.LeaderPool` (the client library
    ``oasis --server a,b`` uses): they follow the ``oasis-leader`` redirect and retry
    UNAVAILABLE with back-off, with the same job id each time.

    ``--kills N``: paced submissions (``--rate`` jobs/s); every ``--every`` answers the
    leader is killed with ``kill -9`` and restarted at once (it comes back as the
    standby). Failover time, per kill: from the ``kill`` to the first answer a client got
    for a decision committed after it (``answered_at`` > kill time, not a duplicate), and
    to the first such answer that admitted its job. p50 / p99 / max over the kills.

    ``--throughput``: unpaced submissions of ``--jobs`` jobs by ``--clients`` clients to
    (a) one daemon without ``[ha]``, (b) one with ``[ha]`` (every write fenced), (c) one
    with ``[ha]`` and a standby following it; submissions per second of each.

Checks, after each run (``bench/load_test.py``'s): no decision lost or duplicated, each
answer the stored one, nothing half-written, capacity never exceeded, the leader's and
every standby's ledger equal to the store; and one leader per epoch: the events' epochs
never go down in commit order.

Run with
    .venv/bin/python -m bench.failover --kills 20
    .venv/bin/python -m bench.failover --throughput --jobs 2000
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from sqlalchemy import create_engine, text

from bench.daemon_throughput import percentiles, write_config
from bench.load_test import Answer, Load, check_ledger, check_store, requests_for
from bench.machine import describe
from controller.commands.failover import FollowingStub, LeaderPool
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.servers import Daemon, Postgres, free_port, json_log

__all__ = ["FollowingLoad", "HaNodes", "KillLeader", "epoch_problems", "main"]

HA_TOML = """[ha]
lease_seconds = {lease}
retry_seconds = {retry}
follow_seconds = {follow}
"""


CALL_TIMEOUT = 3.0
"""Seconds per call: a call to a stopped leader is tried on the other node after this."""


class Node:
    """One ``oasisd`` of the group: its config, log and process."""

    def __init__(self, name: str, config: Path, log: Path, address: str) -> None:
        self.name = name
        self.config = config
        self.log = log
        self.address = address
        self.daemon: Daemon | None = None

    def start(self) -> Node:
        self.daemon = Daemon(self.config, self.log).start(timeout=120)
        return self

    @property
    def pid(self) -> int:
        assert self.daemon is not None and self.daemon.proc is not None
        return self.daemon.proc.pid

    def alive(self) -> bool:
        return (
            self.daemon is not None
            and self.daemon.proc is not None
            and (self.daemon.proc.poll() is None)
        )

    def role(self) -> str:
        """The role its log last announced ("" before it listens)."""
        role = ""
        for line in json_log(self.log):  # the log of every run of this node, in order
            event = line.get("event")
            if event == "listening":
                role = str(line.get("role", ""))
            elif event == "leading":
                role = "leader"
            elif event in ("standby now", "stepping down: now a standby"):
                role = "standby"
        return role

    def signal(self, sig: signal.Signals) -> None:
        assert self.daemon is not None and self.daemon.proc is not None
        self.daemon.proc.send_signal(sig)


class HaNodes:
    """``n`` daemons with ``[ha]`` on one store; the first started leads."""

    def __init__(
        self,
        workdir: Path,
        store_url: str,
        servers: list[dict[str, Any]],
        n: int = 2,
        *,
        lease: float = 2.0,
        retry: float = 0.25,
        follow: float = 0.25,
        ha: bool = True,
    ) -> None:
        self.store_url = store_url
        self.nodes: list[Node] = []
        workdir.mkdir(parents=True, exist_ok=True)
        epoch = time.time()
        extra = HA_TOML.format(lease=lease, retry=retry, follow=follow) if ha else ""
        for i in range(n):
            name = f"node{i}"
            address = f"127.0.0.1:{free_port()}"
            path = write_config(
                workdir / f"{name}.toml",
                workdir / f"{name}-data",
                store_url,
                servers,
                epoch,
                extra=extra,
            )
            body = path.read_text().replace('listen = "127.0.0.1:0"', f'listen = "{address}"')
            path.write_text(body.replace("[pricing]", "tick_seconds = 0.5\n\n[pricing]", 1))
            self.nodes.append(Node(name, path, workdir / f"{name}.log", address))

    @property
    def addresses(self) -> list[str]:
        return [n.address for n in self.nodes]

    def start(self) -> HaNodes:
        for node in self.nodes:
            node.start()
        return self

    def leader(self) -> Node | None:
        leaders = [n for n in self.nodes if n.alive() and n.role() == "leader"]
        return leaders[0] if len(leaders) == 1 else None

    def wait_leader(self, not_this: Node | None = None, timeout: float = 60.0) -> Node:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [n for n in self.nodes if n is not not_this and n.alive()
                     and n.role() == "leader"]  # fmt: skip
            if found:
                return found[0]
            time.sleep(0.05)
        raise TimeoutError("no node took the lead")

    def stop(self) -> list[int]:
        codes = []
        for node in self.nodes:
            if node.daemon is not None and node.daemon.proc is not None:
                codes.append(node.daemon.stop())
        return codes


class FollowingLoad(Load):
    """:class:`bench.load_test.Load` whose clients follow the leader over ``addresses``."""

    def __init__(self, addresses: list[str], *args: Any, **kw: Any) -> None:
        super().__init__(addresses[0], *args, **kw)
        self.addresses = addresses

    def stop_starting(self) -> None:
        """Start no more jobs (those under way are still answered)."""
        self._deadline = 0.0

    def _client(self, channel: grpc.Channel, start: threading.Barrier) -> None:
        pool = LeaderPool(self.addresses, grpc.insecure_channel, budget=2.0)
        stub = FollowingStub(pool, pb_grpc.AdmissionStub)
        try:
            start.wait()
            while (request := self._take()) is not None:
                self._submit(stub, request)
        finally:
            pool.close()


@dataclass
class Failover:
    """One leader taken down: when, and the first answers after."""

    how: str
    down_at: float  # perf_counter
    down_wall: float  # time.time()
    old: str
    new: str = ""
    first_decision_s: float = 0.0
    first_admitted_s: float = 0.0


@dataclass
class KillLeader:
    """Take the leader down once ``every`` more jobs are answered, ``times`` times:
    ``kill -9`` (restarted at once, as a standby) or SIGSTOP for ``stop_seconds``, then
    SIGCONT (it must step down)."""

    nodes: HaNodes
    every: int
    times: int = 1
    how: str = "kill"
    stop_seconds: float = 0.0
    until_done: bool = False  # start no more jobs once the last failover is measured
    events: list[Failover] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def run(self, load: Load) -> None:
        try:
            for _ in range(self.times + 1):  # then `every` answers after the last
                target = load.answered_count() + self.every
                while load.answered_count() < target and not load.finished.is_set():
                    time.sleep(0.01)
                if load.finished.is_set() or len(self.events) == self.times:
                    break
                self._once(load)
        except Exception as err:  # reported, not lost in the thread
            self.problems.append(f"fault: {type(err).__name__}: {err}")
        if isinstance(load, FollowingLoad) and self.until_done:
            load.stop_starting()

    def _once(self, load: Load) -> None:
        old = self.nodes.leader()
        if old is None:
            raise RuntimeError("no single leader to take down")
        event = Failover(self.how, time.perf_counter(), time.time(), old.name)
        if self.how == "kill":
            assert old.daemon is not None
            old.daemon.kill9()
            event.down_at, event.down_wall = time.perf_counter(), time.time()
            self.events.append(event)
            event.new = self.nodes.wait_leader(old).name
            old.start()  # back as a standby
            return
        old.signal(signal.SIGSTOP)
        event.down_at, event.down_wall = time.perf_counter(), time.time()
        self.events.append(event)
        new = self.nodes.wait_leader(old)
        event.new = new.name
        answered = load.answered_count()
        deadline = time.perf_counter() + self.stop_seconds
        limit = deadline + 60.0  # the new leader answers some first, if it can
        while time.perf_counter() < deadline or (
            load.answered_count() < answered + 10
            and not load.finished.is_set()
            and time.perf_counter() < limit
        ):
            time.sleep(0.05)
        old.signal(signal.SIGCONT)
        limit = time.monotonic() + 30
        while old.role() != "standby":
            if time.monotonic() > limit:
                raise RuntimeError(f"{old.name} did not step down after SIGCONT")
            time.sleep(0.05)

    def measure(self, answers: dict[str, Answer]) -> None:
        """Fill in each failover's first answers from the clients' answers."""
        fresh = sorted(
            (a for a in answers.values() if not a.duplicate), key=lambda a: a.answered_at
        )
        for e in self.events:
            after = [a for a in fresh if a.answered_at > e.down_at]
            if after:
                e.first_decision_s = after[0].answered_at - e.down_at
            admitted = [a for a in after if a.admitted]
            if admitted:
                e.first_admitted_s = admitted[0].answered_at - e.down_at


def epoch_problems(url: str, stopped: list[Failover]) -> list[str]:
    """One leader per epoch: event epochs never go down in commit order, every event
    has one, and no event of a leader stopped with SIGSTOP was committed after the stop."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT sequence, at, detail FROM events ORDER BY sequence"))
            events = [(r.sequence, r.at, r.detail if isinstance(r.detail, dict)
                       else json.loads(r.detail)) for r in rows]  # fmt: skip
    finally:
        engine.dispose()
    problems: list[str] = []
    last = 0
    for seq, _at, detail in events:
        epoch = detail.get("epoch")
        if not isinstance(epoch, int):
            problems.append(f"event {seq} has no epoch")
            continue
        if epoch < last:
            problems.append(f"event {seq} of epoch {epoch} after one of epoch {last}")
        last = max(last, epoch)
    for s in stopped:
        # the epoch the stopped leader led in: the newest before the stop
        before = [d.get("epoch", 0) for _, at, d in events if at.timestamp() < s.down_wall]
        mine = max(before, default=0)
        late = [seq for seq, at, d in events
                if d.get("epoch") == mine and at.timestamp() > s.down_wall + 0.5]  # fmt: skip
        if late:
            problems.append(
                f"{len(late)} events of the stopped leader's epoch {mine} "
                f"committed after the stop, e.g. {late[:3]}"
            )
    return problems


@dataclass
class FailoverReport:
    jobs: int
    answered: int = 0
    admitted: int = 0
    seconds: float = 0.0
    per_second: float = 0.0
    failed_calls: dict[str, int] = field(default_factory=dict)
    failovers: list[Failover] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def run_failover(
    postgres: Postgres,
    workdir: Path,
    *,
    jobs: int,
    clients: int,
    every: int,
    times: int,
    how: str = "kill",
    stop_seconds: float = 0.0,
    rate: float = 0.0,
    lease: float = 2.0,
    nodes: int = 2,
    seed: int = 1,
    until_done: bool = False,
) -> FailoverReport:
    """Start ``nodes`` daemons, load them, take the leader down ``times`` times, check."""
    url = postgres.new_database()
    servers, ids, requests = requests_for("ha", seed, jobs)
    group = HaNodes(workdir, url, servers, nodes, lease=lease).start()
    report = FailoverReport(jobs=len(ids))
    try:
        group.wait_leader()
        load = FollowingLoad(
            group.addresses,
            requests,
            clients,
            max_seconds=600.0,
            job_seconds=120.0,
            monitor_interval=0.5,
            rate=rate,
            call_timeout=CALL_TIMEOUT,
        )
        fault = KillLeader(group, every, times, how, stop_seconds, until_done)
        report.seconds = load.run(fault)
        fault.measure(load.answers)
        report.failovers = fault.events
        report.problems += fault.problems
        found = check_store(url, ids, load.answers, servers)
        report.problems += found.problems
        leader = group.wait_leader(timeout=30)
        time.sleep(1.0)  # a follow interval or two: the standbys catch up
        for node in group.nodes:
            if node.alive():
                for p in check_ledger(node.address, found.use, servers):
                    report.problems.append(f"{node.name} ({node.role()}): {p}")
        report.problems += epoch_problems(url, [e for e in fault.events if e.how == "stop"])
        if len([n for n in group.nodes if n.alive() and n.role() == "leader"]) != 1:
            report.problems.append("not exactly one leader at the end")
        del leader
        answers = list(load.answers.values())
        report.answered = len(answers)
        report.admitted = sum(a.admitted for a in answers)
        report.per_second = report.answered / report.seconds if report.seconds else 0.0
        report.failed_calls = dict(load.failed_calls)
        for job_id, why in list(load.given_up.items())[:5]:
            report.problems.append(f"{job_id}: given up: {why}")
        if report.answered != len(ids) and not until_done:
            report.problems.append(f"{len(ids) - report.answered} jobs not answered")
        if len(report.failovers) != times:
            report.problems.append(f"{len(report.failovers)} failovers, not {times}")
    finally:
        for code in group.stop():
            if code not in (0, -9):
                report.problems.append(f"an oasisd exited with {code}")
    return report


def run_throughput(postgres: Postgres, workdir: Path, *, jobs: int, clients: int, mode: str,
                   seed: int = 1) -> FailoverReport:  # fmt: skip
    """Unpaced load on one leader: ``mode`` "plain" (no [ha]), "ha" (alone) or "standby"."""
    url = postgres.new_database()
    servers, ids, requests = requests_for("tp", seed, jobs)
    n = 2 if mode == "standby" else 1
    group = HaNodes(workdir / mode, url, servers, n, ha=mode != "plain").start()
    report = FailoverReport(jobs=len(ids))
    try:
        load = FollowingLoad(
            group.addresses[:1],
            requests,
            clients,
            max_seconds=600.0,
            job_seconds=120.0,
            monitor_interval=1.0,
        )
        report.seconds = load.run()
        report.answered = len(load.answers)
        report.per_second = report.answered / report.seconds if report.seconds else 0.0
        found = check_store(url, ids, load.answers, servers)
        report.problems += found.problems
        if mode == "standby":
            time.sleep(1.0)
            report.problems += check_ledger(group.addresses[1], found.use, servers)
    finally:
        group.stop()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--kills", type=int, default=0, help="leader kills (0: none)")
    parser.add_argument("--every", type=int, default=40, help="answers between kills (40)")
    parser.add_argument("--rate", type=float, default=20.0, help="jobs/s while killing (20)")
    parser.add_argument("--lease", type=float, default=2.0, help="[ha] lease_seconds (2)")
    parser.add_argument("--throughput", action="store_true", help="standby vs none")
    parser.add_argument("--jobs", type=int, default=2000, help="jobs for --throughput (2000)")
    parser.add_argument("--clients", type=int, default=8, help="client threads (8)")
    parser.add_argument("--modes", default="plain,ha,standby", help="for --throughput, in order")
    args = parser.parse_args(argv)
    m = describe(grpcio=grpc.__version__)
    print(f"machine: {m['cpu']}, {m['cores']} cores; Python {m['python']}, grpcio {m['grpcio']}")
    print(
        "servers: 50 worker + 50 PS, T = 300; PostgreSQL fsync=off; "
        f"[ha] lease_seconds = {args.lease}, retry_seconds = 0.25, follow_seconds = 0.25\n"
    )
    failed = False
    with tempfile.TemporaryDirectory(prefix="oasis-ha-") as tmp:
        postgres = Postgres()
        try:
            if args.kills:
                jobs = args.every * (args.kills + 1) * 20  # restarts take seconds of load
                r = run_failover(
                    postgres,
                    Path(tmp) / "kills",
                    jobs=jobs,
                    clients=args.clients,
                    every=args.every,
                    times=args.kills,
                    rate=args.rate,
                    lease=args.lease,
                    until_done=True,
                )
                first = [e.first_decision_s * 1000 for e in r.failovers if e.first_decision_s]
                admit = [e.first_admitted_s * 1000 for e in r.failovers if e.first_admitted_s]
                print(
                    "| kills | to first decision p50 / p99 / max ms | to first admission "
                    "p50 / p99 / max ms (kills with one) | answered | checks |"
                )
                print("|---|---|---|---|---|")
                p = percentiles(first)
                q = percentiles(admit)
                print(
                    f"| {len(r.failovers)} | {p[0]:.0f} / {p[1]:.0f} / {p[2]:.0f} | {q[0]:.0f} "
                    f"/ {q[1]:.0f} / {q[2]:.0f} ({len(admit)}) | {r.answered}/{r.jobs} | "
                    f"{'pass' if not r.problems else f'{len(r.problems)} problems'} |"
                )
                for problem in r.problems[:20]:
                    print(f"  problem: {problem}")
                failed |= bool(r.problems)
            if args.throughput:
                print("\n| mode | jobs | answered | per second | vs no [ha] | checks |")
                print("|---|---|---|---|---|---|")
                per_mode: dict[str, float] = {}
                for mode in args.modes.split(","):
                    r = run_throughput(
                        postgres, Path(tmp), jobs=args.jobs, clients=args.clients, mode=mode
                    )
                    per_mode[mode] = r.per_second
                    base = per_mode.get("plain", 0.0)
                    ratio = r.per_second / base if base else 0.0
                    print(
                        f"| {mode} | {r.jobs} | {r.answered} | {r.per_second:.1f} | "
                        f"{ratio:.0%} | {'pass' if not r.problems else r.problems[:3]} |"
                    )
                    failed |= bool(r.problems)
        finally:
            postgres.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
