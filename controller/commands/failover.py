"""Clients of several head nodes (high availability): find the leader, follow it.

``--server a:50051,b:50051`` (or ``$OASIS_SERVER`` with commas) names every head node. A
call goes to the node last found leading (at first, the first named). A node that is
not the leader answers a write UNAVAILABLE naming the leader in the trailing metadata
``oasis-leader`` (``controller/errors.py``): the call is sent there at once. Any other
UNAVAILABLE (a node down, a takeover under way), or with several nodes a call not
answered within its deadline (a node stopped), moves on to the next node named (passing
over one that failed a call within :data:`FAILED_MEMORY`: a standby naming a stopped
leader is asked again until it takes over), after a back-off (:class:`Backoff`), for at
most ``budget`` seconds in all; then the last error is raised.
With one address, only a redirect is followed: a node
that cannot be reached fails at once, as before.

With several nodes, the first call asks them all at once who leads (``GetLeadership``,
for at most :data:`LOCATE_SECONDS`) and starts at the leader: a node that is hung (a
stopped process, a frozen host) answers nothing, and with each call given the whole
``--timeout`` one such node named first used it all up before the next was tried, in
every command, long after the standby had taken over (the HA audit).

With several nodes, every channel pings its node (HTTP/2 keepalive,
:data:`KEEPALIVE_OPTIONS`) every :data:`PING_SECONDS` while a call is in flight, and
drops the connection when a ping is not answered within :data:`PING_TIMEOUT_SECONDS`:
the call then fails UNAVAILABLE and is tried on the next node. A stopped leader (SIGSTOP,
a frozen VM) keeps its TCP connection open (the kernel still acknowledges), so without
the pings a call in flight to it, or an ``oasis watch`` stream, waited its whole
``--timeout`` (the watch: for ever) though the standby had taken over. A node that is
slow but alive (a long decision, a slow store) answers the pings from gRPC's own I/O
threads, and its calls are not cut off. With one node named there is nowhere else to
go: no pings, and a call waits for a paused daemon up to ``--timeout`` as before.

Retrying a submission is safe: the daemon answers a job id it has decided with its
first decision (the client gives a job without an id one first, so that a retry
carries the same id).
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

__all__ = [
    "KEEPALIVE_OPTIONS",
    "LEADER_KEY",
    "Backoff",
    "FollowingStub",
    "LeaderPool",
    "followed_events",
    "redirected_by",
    "split_servers",
    "tried_address",
]

LEADER_KEY = "oasis-leader"
"""The trailing metadata key a standby names the leader with."""
FIRST_DELAY = 0.05
"""Seconds before the second try (jittered: 0.025 to 0.075), doubling for each next one."""
MAX_DELAY = 0.5
"""Seconds between tries at the most (jittered to 0.75): a takeover takes well under one."""
MAX_HOPS = 8  # redirects in a row before backing off (nodes naming each other)
LOCATE_SECONDS = 2.0
"""With several nodes, how long the first call waits for their answers to "who leads"."""
PING_SECONDS = 2.0
"""With several nodes, how long a connection with a call in flight may be silent before
the client pings its node (the daemon permits pings this often: ``controller/connections.py``)."""
PING_TIMEOUT_SECONDS = 2.0
"""How long the client waits for a ping's answer before it gives the node up."""
CONNECT_SECONDS = PING_SECONDS + PING_TIMEOUT_SECONDS
"""How long a connection to a node may take to open (TCP, TLS and HTTP/2's SETTINGS)."""
KEEPALIVE_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.keepalive_time_ms", round(PING_SECONDS * 1000)),
    ("grpc.keepalive_timeout_ms", round(PING_TIMEOUT_SECONDS * 1000)),
    # gRPC 1.85 times a keepalive ping out by this one (default 60 s), not by the above
    ("grpc.http2.ping_timeout_ms", round(PING_TIMEOUT_SECONDS * 1000)),
    ("grpc.http2.max_pings_without_data", 0),  # a long call sends no data: ping on
    # a new connection to a stopped node (a standby names it until its lease ends) is
    # given up after this, not gRPC's 20 s: the TCP handshake is the kernel's, but the
    # HTTP/2 one is the process's
    ("grpc.min_reconnect_backoff_ms", round(CONNECT_SECONDS * 1000)),
]
"""Channel arguments of the clients of several nodes (see the module docstring)."""
_GONE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
"""A call's codes when the node it went to could not answer (down, stopped, unreachable)."""
FAILED_MEMORY = 2.0
"""Seconds a node that failed a call (down, unreachable) is not followed to: a standby
may still name a leader that has just died."""


_TRIED = "oasis: the call went to "
"""The note :meth:`LeaderPool.call` adds to the error it raises (see :func:`tried_address`)."""


_SAID = "oasis: before it, "
"""The note :meth:`LeaderPool.call` adds when a node redirected the call
(:func:`redirected_by`)."""


class Backoff:
    """The pauses between tries over the nodes, of a call (:meth:`LeaderPool.call`) and of
    a watch (:func:`followed_events`) alike: :data:`FIRST_DELAY` doubling up to
    :data:`MAX_DELAY`, each jittered by half either way (clients that failed together do
    not all come back together)."""

    def __init__(self) -> None:
        self.delay = FIRST_DELAY

    def reset(self) -> None:
        """The next pause is the first one again (a try got through)."""
        self.delay = FIRST_DELAY

    def pause(self, deadline: float) -> None:
        """Sleep the next pause, but not past ``deadline`` (``time.monotonic()``)."""
        pause = self.delay * random.uniform(0.5, 1.5)
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        self.delay = min(MAX_DELAY, self.delay * 2)


def redirected_by(err: BaseException) -> str | None:
    """``"b:50051 said: this oasisd is a standby ..."``: what the node that named the
    failed call's last node the leader said (a standby that cannot take over says why),
    from the note :meth:`LeaderPool.call` adds; None if no node redirected it."""
    return _noted(err, _SAID)


def tried_address(err: BaseException) -> str | None:
    """The node the failed call went to last (a redirect's target, perhaps not one of
    those named), from the note :meth:`LeaderPool.call` adds; None if it has none."""
    return _noted(err, _TRIED)


def _noted(err: BaseException, prefix: str) -> str | None:
    """The rest of ``err``'s first note that starts with ``prefix``; None if none does."""
    for note in getattr(err, "__notes__", ()):
        if isinstance(note, str) and note.startswith(prefix):
            return note[len(prefix) :]
    return None


def split_servers(text: str) -> list[str]:
    """The addresses in ``a:50051,b:50051`` (empty items dropped)."""
    return [part.strip() for part in text.split(",") if part.strip()]


class LeaderPool:
    """Channels to the named head nodes, and calls that follow the leader.

    Args:
        addresses: the head nodes, ``host:port`` each (at least one).
        connect: opens a channel to one address.
        budget: seconds a call may spend retrying over all nodes.
    """

    def __init__(
        self, addresses: list[str], connect: Callable[[str], grpc.Channel], budget: float = 30.0
    ) -> None:
        if not addresses:
            raise ValueError("no server address")
        self.addresses = list(addresses)
        self.connect = connect
        self.budget = budget
        self.address = self.addresses[0]
        self.last_tried = self.address  # the node the last attempt of a call went to
        self._said: tuple[str, str] | None = None  # the last redirect: (node, its message)
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[tuple[str, str], Any] = {}
        self.redirects = 0  # how many times a node named another as the leader
        self._failed: dict[str, float] = {}  # address -> when it last failed unredirected
        self._located = len(self.addresses) < 2  # asked who leads (see the docstring)

    def channel(self, address: str | None = None) -> grpc.Channel:
        address = address or self.address
        if address not in self._channels:
            self._channels[address] = self.connect(address)
        return self._channels[address]

    def stub(self, factory: Callable[[grpc.Channel], Any], address: str | None = None) -> Any:
        """``factory``'s stub on ``address``'s channel (default: the current node)."""
        address = address or self.address
        key = (address, getattr(factory, "__name__", repr(factory)))
        if key not in self._stubs:
            self._stubs[key] = factory(self.channel(address))
        return self._stubs[key]

    def call(
        self, factory: Callable[[grpc.Channel], Any], method: str, *args: Any, **kw: Any
    ) -> Any:
        """``stub.method(*args, **kw)`` on the leader (see the module docstring); its
        error names the node it went to last (:func:`tried_address`)."""
        self._said = None  # this call's redirect only
        try:
            return self._call(factory, method, *args, **kw)
        except grpc.RpcError as err:
            err.add_note(_TRIED + self.last_tried)
            if err.code() in _GONE and self._said and self._said[0] != self.last_tried:
                err.add_note(f"{_SAID}{self._said[0]} said: {self._said[1]}")
            raise

    def _call(
        self, factory: Callable[[grpc.Channel], Any], method: str, *args: Any, **kw: Any
    ) -> Any:
        deadline = time.monotonic() + self.budget
        if not self._located:
            self._locate(min(LOCATE_SECONDS, self.budget))
        backoff = Backoff()
        hops = 0
        while True:
            self.last_tried = self.address
            try:
                return getattr(self.stub(factory), method)(*args, **kw)
            except grpc.RpcError as err:
                code = err.code()
                several = len(self.addresses) > 1
                # a node that does not answer in time may be stopped: try another
                moving = code == grpc.StatusCode.UNAVAILABLE or (
                    several and code == grpc.StatusCode.DEADLINE_EXCEEDED
                )
                if not moving:
                    raise
                leader = dict(err.trailing_metadata() or ()).get(LEADER_KEY, "")
                now = time.monotonic()
                if not leader:
                    self._failed[self.address] = now
                failed = self._failed.get(str(leader))
                fresh = failed is None or now - failed >= FAILED_MEMORY
                # told where (and it did not just fail us): go there at once
                if isinstance(leader, str) and leader and leader != self.address and fresh:
                    self._said = (self.address, (err.details() or "")[:500])
                    self.address = leader
                    self.redirects += 1
                    hops += 1
                    if now > deadline:
                        raise
                    if hops <= MAX_HOPS:
                        continue
                    # nodes naming each other (a takeover under way): back off, then ask
                else:
                    if len(self.addresses) == 1 and not leader:
                        raise  # one node, and it is down (or stopping): say so at once
                    self.address = self._next(now)  # the next call starts there, even after this
                    if now > deadline:
                        raise
                backoff.pause(deadline)
                hops = 0

    @contextlib.contextmanager
    def budget_at_most(self, seconds: float) -> Iterator[None]:
        """Within the block, calls retry over the nodes for at most ``seconds``."""
        budget, self.budget = self.budget, min(self.budget, seconds)
        try:
            yield
        finally:
            self.budget = budget

    def _locate(self, seconds: float) -> None:
        """Ask every node at once who leads, for at most ``seconds``; the next call goes
        to the first named that says it leads, else to the first that answered (a
        standby names the leader). A node that does not answer is remembered as failed
        (:data:`FAILED_MEMORY`), so a standby naming it is not followed there at once."""
        from controller.rpc import oasis_pb2 as pb
        from controller.rpc import oasis_pb2_grpc as pb_grpc

        self._located = True
        asked = {
            address: self.stub(pb_grpc.HighAvailabilityStub, address).GetLeadership.future(
                pb.GetLeadershipRequest(), timeout=seconds
            )
            for address in self.addresses
        }
        roles: dict[str, str] = {}
        for address, future in asked.items():
            try:
                roles[address] = future.result().role
            except grpc.RpcError as err:
                if err.code() in _GONE:
                    self._failed[address] = time.monotonic()
                else:  # it answered (refused, or an older daemon): alive, role unknown
                    roles[address] = ""
        leading = [a for a in self.addresses if roles.get(a) == "leader"]
        answered = [a for a in self.addresses if a in roles]
        if leading or answered:
            self.address = (leading or answered)[0]

    def _next(self, now: float) -> str:
        """The node named after the current one that has not failed a call within
        :data:`FAILED_MEMORY` (the current one last), else the one named after it.

        A standby naming a stopped leader it has not yet taken over from is retried, not
        left for that leader: a stopped process answers nothing until the call's whole
        timeout, so a submission sent there 1 s after a SIGSTOP waited 18 s for the
        connection to time out, though the standby led after 5 s (the HA audit)."""
        start = self.addresses.index(self.address) + 1 if self.address in self.addresses else 0
        ring = [
            self.addresses[(start + i) % len(self.addresses)] for i in range(len(self.addresses))
        ]
        for address in ring:
            failed = self._failed.get(address)
            if failed is None or now - failed >= FAILED_MEMORY:
                return address
        return ring[0]

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        self._stubs.clear()


class FollowingStub:
    """A stub whose unary calls go through :meth:`LeaderPool.call`; streaming calls go
    to the current node as they are."""

    def __init__(self, pool: LeaderPool, factory: Callable[[grpc.Channel], Any]) -> None:
        self._pool = pool
        self._factory = factory

    def __getattr__(self, method: str) -> Any:
        target = getattr(self._pool.stub(self._factory), method)
        if not isinstance(target, grpc.UnaryUnaryMultiCallable):
            return target

        def call(*args: Any, **kw: Any) -> Any:
            return self._pool.call(self._factory, method, *args, **kw)

        return call


def followed_events(pool: LeaderPool, after: int) -> Iterator[Any]:
    """``WatchEvents`` from after ``after`` on, over the pool's nodes.

    With several head nodes, a stream that ends UNAVAILABLE (its node died or is
    stopping) is opened again on another node (a standby serves the events too) from
    after the last event received, with the calls' back-off, until ``pool.budget``
    seconds pass without one opening; then the last error is raised. Before, `oasis
    watch --server a,b` ended at the leader's kill -9 while the standby took over (the
    HA audit). With ``after`` -1 (new events only) and none received yet, the events
    of the gap are not replayed. With one node, the error is raised as before."""
    from controller.rpc import oasis_pb2 as pb
    from controller.rpc import oasis_pb2_grpc as pb_grpc

    broken: float | None = None  # when the streams began failing
    backoff = Backoff()
    while True:
        pool.last_tried = pool.address
        request = pb.WatchEventsRequest(after_sequence=after)
        try:
            for event in pool.stub(pb_grpc.AdmissionStub).WatchEvents(request):
                broken = None
                backoff.reset()
                after = max(after, event.sequence)
                yield event
            return
        except grpc.RpcError as err:
            now = time.monotonic()
            broken = now if broken is None else broken
            if (
                len(pool.addresses) < 2
                or err.code() != grpc.StatusCode.UNAVAILABLE
                or now - broken > pool.budget
            ):
                err.add_note(_TRIED + pool.last_tried)
                raise
            pool._failed[pool.address] = now
            pool.address = pool._next(now)
            backoff.pause(broken + pool.budget)
