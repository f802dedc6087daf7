"""The guards that keep one tenant from hurting another, at their edges (a mutation audit
of controller/limits.py, controller/auth.py, controller/job_keys.py and their callers):
each test here failed against a slip in one of them (``<`` for ``<=``, a bound or a
condition dropped) that every other test passed.

Unit checks where a function pins the behaviour; a daemon only where the guard lives in
the servicer.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest

from controller.admission.limit_checks import pending_refused
from controller.admission.state import parse_job
from controller.auth import (
    AccessInterceptor,
    Caller,
    Role,
    _HostShares,
    _InFlight,
    hash_token,
    parse_tokens,
)
from controller.convert import spec_to_proto
from controller.handler_memo import MAX_METHODS, HandlerMemo
from controller.holds import Holds
from controller.limits import (
    BYTES_PER_TOKEN,
    SENT_FACTOR,
    JobTooLargeError,
    Limits,
    RateLimiter,
    limits_from_dict,
    search_size,
)
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.store import Database, JobRow, migrate
from pricing import SpecError
from pricing.job import Job
from tests.servers import tenants_daemon
from tests.test_daemon_e2e import job
from tests.test_limits import CLUSTER, WINDOW, parsed


def canonical_size(spec: dict[str, Any]) -> int:
    """A spec's size as ``Limits.check_spec`` counts it (canonical JSON)."""
    return len(json.dumps(spec, sort_keys=True, separators=(",", ":")))


# -- job spec sizes --------------------------------------------------------------------


def test_a_spec_exactly_at_max_spec_bytes_is_taken_and_one_byte_over_is_refused() -> None:
    """``max_spec_bytes`` is inclusive, as sent (``SENT_FACTOR`` times it) and as
    canonical JSON; a slip to ``>=`` refused a tenant's spec of exactly the size the
    operator allowed."""
    spec = job("edge")
    size = canonical_size(spec)
    Limits(max_spec_bytes=size).check_spec(spec)
    with pytest.raises(JobTooLargeError, match=rf"spec of {size} bytes exceeds"):
        Limits(max_spec_bytes=size - 1).check_spec(spec)
    limits = Limits(max_spec_bytes=100)
    limits.check_sent(SENT_FACTOR * 100, 0)
    with pytest.raises(JobTooLargeError, match=rf"spec of {SENT_FACTOR * 100 + 1} bytes as sent"):
        limits.check_sent(SENT_FACTOR * 100 + 1, 0)


# -- utility caps ----------------------------------------------------------------------


def deadline_job(job_id: str, value: float) -> Job:
    """A job worth exactly ``value`` (a deadline it meets: ``f(d_min) = value``)."""
    utility = {"kind": "deadline", "value": value, "deadline": 20}
    return parsed(job(job_id, utility=utility))


def test_a_job_worth_exactly_the_utility_cap_is_taken() -> None:
    """``max_utility`` is the most a job may be worth, inclusive: one worth exactly the
    cap is taken, one a little over is refused naming the cap."""
    Limits(max_utility=50).check_utility(deadline_job("at", 50))
    with pytest.raises(
        JobTooLargeError, match=r"f\(\d+\) = 50\.5 exceeds limits\.max_utility = 50"
    ):
        Limits(max_utility=50).check_utility(deadline_job("over", 50.5))


def test_a_submitters_own_utility_cap_replaces_the_shared_one_for_it_alone() -> None:
    """``max_utility_by_submitter``: alice's cap (lower or higher, or 0 for none) holds
    for alice's jobs only, in ``check_job`` as the decision and a reload's check call it;
    everyone else keeps ``max_utility``."""
    limits = Limits(max_utility=100, max_utility_by_submitter={"alice": 10, "carol": 0})
    cheap, dear = deadline_job("cheap", 20), deadline_job("dear", 1000)
    limits.check_job(cheap, CLUSTER, WINDOW, "bob")
    limits.check_job(cheap, CLUSTER, WINDOW)  # anonymous: the shared cap
    with pytest.raises(JobTooLargeError, match=r"limits\.max_utility_by_submitter\.alice = 10"):
        limits.check_job(cheap, CLUSTER, WINDOW, "alice")
    with pytest.raises(JobTooLargeError, match=r"limits\.max_utility = 100"):
        limits.check_job(dear, CLUSTER, WINDOW, "bob")
    limits.check_job(dear, CLUSTER, WINDOW, "carol")  # her cap is off


# -- a search's size -------------------------------------------------------------------


def test_a_search_exactly_at_max_search_mb_is_taken_and_its_tables_are_counted_whole() -> None:
    """A search's tables are ``8 T (W + N + 2)`` bytes (a ``(T, W + 1)`` and a ``(T, N +
    1)`` table of float64), and ``max_search_mb`` is inclusive: a job whose tables are
    exactly the cap is decided; a cap a byte under it refuses the job."""
    edge = parsed(job("edge", chunks=16, minibatches=300))
    size = search_size(edge, CLUSTER, WINDOW)
    assert size.megabytes * 2**20 == 8 * WINDOW * (edge.work + edge.chunks + 2)
    Limits(max_search_mb=size.megabytes).check_job(edge, CLUSTER, WINDOW)
    under = Limits(max_search_mb=size.megabytes - 1 / 2**20)
    with pytest.raises(JobTooLargeError, match=r"limits\.max_search_mb"):
        under.check_job(edge, CLUSTER, WINDOW)


# -- calls in flight -------------------------------------------------------------------


class RefusedError(Exception):
    pass


class Context:
    """A call's context, as the access interceptor's caps use it."""

    def __init__(self, peer: str = "ipv4:203.0.113.7:1") -> None:
        self._peer = peer
        self.done: list[Any] = []

    def peer(self) -> str:
        return self._peer

    def add_done_callback(self, callback: Any) -> None:
        self.done.append(callback)

    def end(self) -> None:
        for callback in self.done:
            callback(self)

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise RefusedError(code, details)


def test_a_client_holds_exactly_max_calls_per_client_in_flight() -> None:
    """``connections.max_calls_per_client`` is the most calls one client has in flight:
    the one past it is refused (RESOURCE_EXHAUSTED, naming the cap), another client is
    not, and a call that ends gives its place back. (The daemon's test counts until a
    refusal: one call more than the cap passed it.)"""

    async def scenario() -> None:
        calls = _InFlight(3)
        held = [Context() for _ in range(3)]
        for context in held:
            await calls.hold("mallory", context)
        with pytest.raises(RefusedError, match=r"3 calls of this client .* = 3\)") as err:
            await calls.hold("mallory", Context())
        assert err.value.args[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
        await calls.hold("alice", Context())  # another tenant's calls are its own
        held[0].end()
        await calls.hold("mallory", Context())
        assert calls.calls.of("mallory") == 3

    asyncio.run(scenario())


# -- the access interceptor's refusals cost the rate ------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Call(Context):
    """A call's context with its metadata, as :meth:`AccessInterceptor._admit` reads it."""

    def __init__(self, token: str | None, peer: str = "ipv4:198.51.100.9:50000") -> None:
        super().__init__(peer)
        self.token = token

    def invocation_metadata(self) -> Any:
        return () if self.token is None else (("authorization", f"Bearer {self.token}"),)

    def set_trailing_metadata(self, metadata: Any) -> None:
        pass


def refused(access: AccessInterceptor, method: str, call: Call) -> grpc.StatusCode | None:
    """The code ``access`` refuses ``call`` of ``method`` with (None: admitted)."""
    try:
        asyncio.run(access._admit(method, call))
    except RefusedError as err:
        return err.args[0]
    return None


def tenant_access(burst: float) -> AccessInterceptor:
    digest = hash_token("alice-token")
    alice = Caller("alice", Role.SUBMITTER, client="alice", turn="alice", token=digest)
    return AccessInterceptor({digest: alice}, RateLimiter(1.0, burst, now=Clock()))


SUBMIT = "/oasis.v1.Admission/SubmitJob"


def test_a_tenants_calls_it_may_not_make_cost_its_rate_as_its_others() -> None:
    """A submitter calling an operator's RPC is refused PERMISSION_DENIED, and charged a
    token for it as for any call: refusals a client repeats cost it its rate (and keep
    its log lines to it), so past its burst it is told to slow down, and its own calls
    wait as well. Uncharged, a tenant could refuse itself as fast as it liked."""
    access = tenant_access(burst=2)
    denied = "/oasis.v1.Cluster/ListServers"
    codes = [refused(access, denied, Call("alice-token")) for _ in range(2)]
    assert codes == [grpc.StatusCode.PERMISSION_DENIED] * 2
    assert refused(access, denied, Call("alice-token")) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused(access, SUBMIT, Call("alice-token")) == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_calls_without_a_known_token_cost_their_hosts_rate() -> None:
    """A call with no token, or one the daemon does not know, is UNAUTHENTICATED and
    costs its host (the peer's address without the port) a token: guessing tokens, or
    calling without one, is held to the rate, and past it refused RESOURCE_EXHAUSTED
    from any port of that host; another host, and a tenant with its token, are not."""
    for token in (None, "guess"):
        access = tenant_access(burst=2)
        calls = [Call(token, f"ipv4:198.51.100.9:{port}") for port in (5000, 5001, 5002)]
        codes = [refused(access, SUBMIT, call) for call in calls]
        assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 2 + [
            grpc.StatusCode.RESOURCE_EXHAUSTED
        ], token
        other = Call(token, "ipv4:203.0.113.7:5000")
        assert refused(access, SUBMIT, other) == grpc.StatusCode.UNAUTHENTICATED
        assert refused(access, SUBMIT, Call("alice-token", "ipv4:198.51.100.9:5003")) is None


# -- [limits] as read -------------------------------------------------------------------


def test_a_burst_of_exactly_one_call_is_taken() -> None:
    """``limits.burst`` must hold a whole token: 1 is the smallest taken (a client's
    calls one at a time, at the rate); under it a bucket never holds a call's token."""
    assert limits_from_dict({"rate": 5, "burst": 1}).burst == 1
    with pytest.raises(SpecError, match=r"limits\.burst: must be 0 .* or >= 1, got 0\.99"):
        limits_from_dict({"rate": 5, "burst": 0.99})


def test_submitters_utility_caps_are_at_most_ten_thousand() -> None:
    """``[limits.max_utility_by_submitter]`` is looked up at every decision and copied at
    every reload: 10,000 submitters are taken, one more is refused naming the table."""
    caps = {f"t{i}": 5.0 for i in range(10_000)}
    assert len(limits_from_dict({"max_utility_by_submitter": caps}).max_utility_by_submitter) == (
        10_000
    )
    with pytest.raises(SpecError, match=r"max_utility_by_submitter: at most 10000 submitters"):
        limits_from_dict({"max_utility_by_submitter": {**caps, "one-more": 5.0}})


def test_without_tokens_a_caller_is_its_host_to_the_rate_and_no_one_to_the_turns() -> None:
    """Without ``[auth]`` a call's rate is its host's (the peer without its port), and
    its turn is empty: callers that cannot be told apart queue first come, first served,
    uncapped by ``limits.max_in_flight`` (a per-host cap would let one busy script on
    the head node refuse every other local client's calls)."""
    caller = asyncio.run(AccessInterceptor(None, None)._admit(SUBMIT, Call(None)))
    assert (caller.name, caller.client, caller.turn) == ("", "ipv4:198.51.100.9", "")
    assert (caller.owner, caller.submitter) == (None, None)


def test_a_token_name_is_at_most_the_200_characters_a_submitter_is_stored_in() -> None:
    """A token's name is recorded as its jobs' submitter (``VARCHAR(200)``) and prefixes
    their keys: a name of 200 characters is read, one of 201 refused naming the line."""
    digest = hash_token("t")
    [caller] = parse_tokens(f"{'a' * 200} submitter {digest}\n", "tokens").values()
    assert caller.name == "a" * 200
    with pytest.raises(SpecError, match=r"tokens: line 1: name 'a+' must be 1-200 of"):
        parse_tokens(f"{'a' * 201} submitter {digest}\n", "tokens")


# -- the token bucket ------------------------------------------------------------------


def test_a_client_idle_for_long_is_charged_from_a_full_bucket_not_more() -> None:
    """A bucket refills to ``burst`` and no further, when a search's cost is charged as
    when a call takes its token: a client idle for an hour that then submits a search of
    three tokens owes one (its next call waits 2 s at a rate of 1/s), not an hour's
    tokens less three (which let it flood the decision thread at once)."""
    clock = Clock()
    limiter = RateLimiter(rate=1.0, burst=2.0, now=clock)
    assert limiter.take("c") == 0.0
    clock.t += 3600
    limiter.charge("c", 3.0)
    assert limiter.take("c") == pytest.approx(2.0)


def test_bytes_past_the_first_bytes_per_token_cost_a_token_each_as_many_more() -> None:
    """``charge_bytes``: nothing for the first :data:`BYTES_PER_TOKEN` bytes of a spec
    or an answer, then a token each as many more: three times it costs two tokens."""
    clock = Clock()
    limiter = RateLimiter(rate=1.0, burst=4.0, now=clock)
    limiter.charge_bytes("c", BYTES_PER_TOKEN)  # free
    limiter.charge_bytes("c", 3 * BYTES_PER_TOKEN)  # two tokens of the four
    assert [limiter.take("c") for _ in range(3)] == [0.0, 0.0, pytest.approx(1.0)]


def test_every_local_peer_shares_only_the_total_of_the_open_services() -> None:
    """The per-host share of the open services' calls and streams binds hosts off this
    machine; local peers (127.x, ``::1`` as gRPC writes it, a unix socket, abstract or
    not) are every local client at once and count only against the total."""
    local = ("ipv4:127.0.0.2", "ipv6:%5B::1%5D", "unix:/run/oasis.sock", "unix-abstract:oasis")
    for peer in local:
        shares = _HostShares(limit=5, per_host=1)
        shares.take(peer)
        assert shares.over(peer) == "", peer
        shares.give_back(peer)
        assert shares.open == 0 and not shares.hosts
    remote = _HostShares(limit=5, per_host=1)
    remote.take("ipv4:203.0.113.7")
    assert remote.over("ipv4:203.0.113.7") == "host"
    assert remote.over("ipv4:198.51.100.9") == ""


def test_a_search_costs_its_steps_in_tokens_fractions_too() -> None:
    """A submit's or quote's search costs ``steps / search_steps_per_token`` tokens on top
    of its call's: a search of half that many steps costs half a token, not nothing (so
    a client's many searches just under it cost their share)."""
    limits = Limits(search_steps_per_token=100)
    assert limits.search_tokens(250) == 2.5
    assert limits.search_tokens(50) == 0.5


# -- the pending jobs a reload's limits would expire -----------------------------------


def pending_store(tmp_path: Path, rows: list[tuple[str, str | None, Any, int, str]]) -> Database:
    """A migrated SQLite store holding ``rows``: ``(key, submitter, spec (dict, or text
    as stored), arrival slot, state)``, in that order."""
    db = Database(f"sqlite:///{tmp_path / 'oasis.db'}")
    migrate(db)
    with db.session() as s:
        for sequence, (key, submitter, spec, arrival, state) in enumerate(rows, 1):
            text = spec if isinstance(spec, str) else json.dumps({**spec, "id": key})
            s.add(JobRow(id=key, sequence=sequence, spec=text, state=state, submitted_slot=0,
                         arrival_slot=arrival, work=1, admitted=state != "pending", reason="",
                         detail={}, decision_ms=0.1, decided_at=datetime.now(UTC),
                         submitter=submitter))  # fmt: skip
    return db


def refused_pending(db: Database, limits: Limits, first: int | None = None) -> list[str]:
    def parse(spec: Any, arrival: int) -> Job:
        return parse_job(spec, CLUSTER, 3600, WINDOW, arrival)

    with db.session() as s:
        return pending_refused(s, parse, limits, CLUSTER, WINDOW, first)


def test_a_reload_names_each_submitters_pending_jobs_its_limits_refuse(tmp_path: Path) -> None:
    """One line per submitter whose pending jobs the new limits refuse, a submitter's
    own utility cap included; jobs admitted or done are not the next boundary's to
    expire, and a spec that no longer parses is left out (it expires whatever the
    change). The first five of a submitter's jobs are named, ``...`` past them."""
    small, big = job("s"), job("b", chunks=16, minibatches=300)  # W = 9 and W = 101
    rows: list[tuple[str, str | None, Any, int, str]] = [
        *((f"alice:b{i}", "alice", big, 1, "pending") for i in range(5)),
        ("alice:s", "alice", small, 1, "pending"),
        ("alice:done", "alice", big, 1, "admitted"),
        ("bob:s", "bob", small, 1, "pending"),
        ("bob:torn", "bob", "{not json", 1, "pending"),
        *((f"carol:b{i}", "carol", big, 1, "pending") for i in range(6)),
    ]
    db = pending_store(tmp_path, rows)
    try:
        lines = refused_pending(db, Limits(max_job_work=100))
        alice = ", ".join(f"alice:b{i}" for i in range(5))
        carol = ", ".join(f"carol:b{i}" for i in range(5))
        assert [line.split(", first: ")[0] for line in lines] == [
            f"alice: 5 pending job(s) ({alice})",
            f"carol: 6 pending job(s) ({carol} ...)",
        ]
        assert "exceeds limits.max_job_work = 100" in lines[0]
        # bob's own cap refuses his job worth 50; alice's, under the shared cap, stays
        capped = Limits(max_utility=100, max_utility_by_submitter={"bob": 10})
        [bob] = refused_pending(db, capped)
        assert bob.startswith("bob: 1 pending job(s) (bob:s), first: no longer valid: ")
        assert "max_utility_by_submitter.bob = 10" in bob
    finally:
        db.dispose()


def test_a_restart_names_the_pending_jobs_that_could_no_longer_end_in_their_window(
    tmp_path: Path,
) -> None:
    """With the next slot ``first`` (a restart's config), a pending job that could not
    end by its arrival + window - 1 starting then is named, one that just could is not;
    and so is one whose spec no longer parses."""
    spec = job("s")  # two slots of work
    edge = parsed(spec).min_slots
    end = 1 + WINDOW - 1  # arriving in slot 1
    db = pending_store(
        tmp_path,
        [("alice:s", "alice", spec, 1, "pending"), ("bob:torn", "bob", "{x", 1, "pending")],
    )
    try:
        assert [line.split(" (")[0] for line in refused_pending(db, Limits(), end - edge + 1)] == [
            "bob: 1 pending job(s)"
        ]
        lines = refused_pending(db, Limits(), end - edge + 2)
        assert lines[0] == (
            f"alice: 1 pending job(s) (alice:s), first: it needs {edge} slots from slot "
            f"{end - edge + 2}, past slot {end}, the end of its window"
        )
        assert lines[1].startswith("bob: 1 pending job(s) (bob:torn), first: no longer valid: ")
    finally:
        db.dispose()


# -- what the caps count by ------------------------------------------------------------


def test_a_holder_that_gives_back_all_it_holds_is_forgotten() -> None:
    """Every per-client and per-host cap counts in a :class:`Holds`: a holder is kept
    while it holds any, and forgotten when it gives the last back, so the table is as
    large as the holders of the moment, not every peer or token ever seen (a client
    calling from a new port or address each time would grow it for good)."""
    holds = Holds()
    for holder in ("a", "a", "b"):
        holds.take(holder)
    assert dict(holds) == {"a": 2, "b": 1}
    holds.give_back("a")
    holds.give_back("b")
    assert dict(holds) == {"a": 1} and holds.of("b") == 0
    holds.give_back("a")
    holds.give_back("never-held")
    assert len(holds) == 0 and holds.of("a") == 0


def test_a_full_memo_still_keeps_the_new_wrapper_of_a_method_it_holds() -> None:
    """Past :data:`MAX_METHODS` a new method is wrapped per call, but one the memo holds
    whose handler was replaced has its new wrapper kept: built once, not at every call."""
    memo = HandlerMemo()
    built: list[str] = []

    def wrap(method: str, handler: Any) -> Any:
        built.append(method)
        return (method, handler)

    first, other = object(), object()
    for i in range(MAX_METHODS):
        memo.wrapped(f"/m{i}", first, wrap)
    built.clear()
    assert memo.wrapped("/m0", other, wrap) is memo.wrapped("/m0", other, wrap)
    assert built == ["/m0"]


# -- through the daemon ----------------------------------------------------------------


def test_a_large_spec_costs_its_senders_rate_by_its_bytes(tmp_path: Path) -> None:
    """A spec's bytes as sent past the first :data:`BYTES_PER_TOKEN` cost its sender a
    token each as many more, before it is read (reading a spec costs the event loop
    every tenant shares): alice's quote of a 56 KiB table utility costs her 3.5 tokens
    of her burst of ten (the call's and 2.5), and bob none."""
    extra = "[limits]\nrate = 0.01\nburst = 10\nmax_table_points = 10000\n"
    with tenants_daemon(tmp_path, extra) as (_daemon, a_channel, b_channel):
        alice, bob = pb_grpc.ClusterStub(a_channel), pb_grpc.ClusterStub(b_channel)
        table = {"kind": "table", "values": [1.0] * (7 * BYTES_PER_TOKEN // 16)}  # 8 B each
        request = pb.QuoteJobRequest(job=spec_to_proto(job("wide", utility=table)))
        assert 3.5 * BYTES_PER_TOKEN <= request.job.ByteSize() < 3.5 * BYTES_PER_TOKEN + 1024
        pb_grpc.AdmissionStub(a_channel).QuoteJob(request, timeout=60)

        def answered(stub: pb_grpc.ClusterStub) -> int:
            for n in range(12):
                try:
                    stub.GetClusterInfo(pb.GetClusterInfoRequest(), timeout=30)
                except grpc.RpcError as err:
                    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                    return n
            return 12

        assert answered(alice) == 6  # 10 - 3.5 and its search's (0.01 tokens a second back)
        assert answered(bob) == 10
