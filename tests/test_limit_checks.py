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
from typing import Any

import grpc
import pytest

from controller.auth import _InFlight
from controller.limits import SENT_FACTOR, JobTooLargeError, Limits, search_size
from pricing.job import Job
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
