"""Limits (controller/limits.py): message size, job size and search budget, job ids, and
the per-client rate, each through a real daemon on loopback and in unit checks.

The job sizes below are worked out on the test cluster of ``tests.servers`` (workers
with 4, 4 and 8 GPUs; PS servers p0, p1) with ``BASE_JOB``'s demands: one GPU per
worker, so at most ``Y = min(N, 16)`` workers per slot, and ``m = 0.01 + 2 * 100 *
0.008 / 1 / 3600 = 0.010444`` slots per mini-batch, so ``W = ceil(2 N M m)``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controller.auth import hash_token
from controller.cli import main
from controller.config import ConfigError, from_dict
from controller.convert import spec_to_proto
from controller.limits import (
    MAX_PAGE_BYTES,
    MAX_PAGE_JOBS,
    MAX_SPEC_BYTES,
    MAX_TURN_STEPS,
    MAX_WAIT_SECONDS,
    JobTooLargeError,
    Limits,
    RateLimiter,
    check_job_id,
    limits_from_dict,
    machine_mb,
    search_size,
)
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.store.stored import MAX_STORED_SPEC
from controller.tls import MAX_RESPONSE_BYTES, client_channel
from pricing import SpecError, job_from_dict, trace_from_dict
from pricing.cluster import Cluster, cluster_from_dict
from pricing.job import Job
from tests.servers import CLUSTER_TOML, SMALL_JOB, Daemon, oasis, tenants_daemon, write_config
from tests.test_daemon_e2e import job, write_job

WINDOW = 24  # tests.servers.write_config


def _cluster() -> Cluster:
    raw = tomllib.loads(CLUSTER_TOML)["cluster"]
    return cluster_from_dict(raw["resources"], raw["servers"])


CLUSTER = _cluster()


def parsed(spec: dict[str, Any]) -> Job:
    return job_from_dict(
        spec, CLUSTER, slot_seconds=3600, slots_available=lambda _a: WINDOW, arrival=1
    )


# -- unit checks -----------------------------------------------------------------------


def test_search_size_follows_the_dp() -> None:
    small = parsed(job("s"))  # N = 8, M = 50: W = ceil(8.36) = 9
    size = search_size(small, CLUSTER, WINDOW)
    assert (small.work, size.workers) == (9, 8)
    assert size.steps == WINDOW * 8 * 10
    wide = parsed(job("w", chunks=40))  # 16 GPUs: 16 workers a slot, whatever N
    assert search_size(wide, CLUSTER, WINDOW).workers == 16


def test_each_job_limit_names_itself() -> None:
    limits = Limits(max_job_work=300, max_job_chunks=32, max_search_steps=5e4, max_search_mb=1)
    limits.check_job(parsed(job("ok", chunks=16, minibatches=300)), CLUSTER, WINDOW)
    cases = [
        (job("w", chunks=16, minibatches=1000), "limits.max_job_work = 300"),  # W = 335
        (job("n", chunks=40), "limits.max_job_chunks = 32"),
        (job("s", chunks=16, minibatches=600), "limits.max_search_steps"),  # 24*16*202
    ]
    for spec, message in cases:
        with pytest.raises(JobTooLargeError, match=message) as err:
            limits.check_job(parsed(spec), CLUSTER, WINDOW)
        assert err.value.field.startswith("job")
        assert isinstance(err.value, SpecError)  # INVALID_ARGUMENT at the API
    tight = Limits(max_search_mb=0.01)  # 8 * 24 * (101 + 16 + 2) bytes = 0.022 MiB
    with pytest.raises(JobTooLargeError, match=r"limits\.max_search_mb"):
        tight.check_job(parsed(job("m", chunks=16, minibatches=300)), CLUSTER, WINDOW)


def test_a_job_at_each_limit_is_taken_and_one_over_is_refused() -> None:
    """The limits are inclusive: a job exactly at ``max_job_work``, ``max_job_chunks``
    and ``max_search_steps`` is decided, one unit over any of them is refused. (The test
    above is far over each: a limit off by one passed it.)"""
    edge = parsed(job("edge", chunks=16, minibatches=300))
    size = search_size(edge, CLUSTER, WINDOW)
    at = Limits(max_job_work=edge.work, max_job_chunks=edge.chunks, max_search_steps=size.steps)
    at.check_job(edge, CLUSTER, WINDOW)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"max_job_work": edge.work - 1}, "limits.max_job_work"),
        ({"max_job_chunks": edge.chunks - 1}, "limits.max_job_chunks"),
        ({"max_search_steps": size.steps - 1}, "limits.max_search_steps"),
    ]
    for over, message in cases:
        limits = dataclasses.replace(at, **over)
        with pytest.raises(JobTooLargeError, match=message):
            limits.check_job(edge, CLUSTER, WINDOW)


def test_independent_limits_are_named_together() -> None:
    """Before: the first limit a job or spec was over, then the next on a retry."""
    limits = Limits(max_job_work=300, max_job_chunks=32, max_utility=1)
    with pytest.raises(JobTooLargeError) as err:  # W = 335, N = 40, f(9) = 2.37
        limits.check_job(parsed(job("wnu", chunks=40, minibatches=400)), CLUSTER, WINDOW)
    assert [p.field for p in err.value.problems] == ["job.utility.priority", "job", "job.chunks"]
    assert "limits.max_job_work = 300" in str(err.value)
    table = {"kind": "table", "values": [1.0] * 20}
    with pytest.raises(JobTooLargeError) as err:
        Limits(max_table_points=10, max_spec_bytes=100).check_spec(job("t", utility=table))
    assert [p.field for p in err.value.problems] == ["job.utility.values", "job"]
    with pytest.raises(JobTooLargeError) as err:
        Limits(max_table_points=10, max_spec_bytes=100).check_sent(10_000, 20)
    assert [p.field for p in err.value.problems] == ["job.utility.values", "job"]


def test_the_default_budget_refuses_a_job_that_would_stall_the_daemon() -> None:
    """Tiny demands let thousands of workers run a slot: a W of 53,900 over 4,500 workers
    a slot is 5.8e9 DP steps in a 24-slot window, refused before any search."""
    spec = job(
        "huge",
        chunks=5000,
        epochs=1,
        minibatches=198,
        worker={"cpu": 0.01, "bandwidth": 0.01},
        ps={"cpu": 0.01, "bandwidth": 0.05},
    )
    big = parsed(spec)
    size = search_size(big, CLUSTER, WINDOW)
    assert size.steps > Limits().max_search_steps
    assert big.work <= Limits().max_job_work and big.chunks <= Limits().max_job_chunks
    with pytest.raises(JobTooLargeError, match="too large to decide"):
        Limits().check_job(big, CLUSTER, WINDOW)


def test_job_ids() -> None:
    """One safe alphabet, because an id names an MQTT topic level."""
    check_job_id("a" * 128)
    check_job_id("AZaz09._-")
    for bad in ("", "a" * 129):
        with pytest.raises(
            SpecError, match=rf"job\.id: must be 1-128 characters long, got {len(bad)}"
        ):
            check_job_id(bad)
    for bad in ("a\x00b", "tab\there", "a/b", "a+b", "a#", "sp ace", "caf\u00e9"):
        with pytest.raises(SpecError, match=r"job\.id: must be characters of A-Z a-z 0-9 \. _ -"):
            check_job_id(bad)


def test_trace_job_ids_follow_the_same_alphabet() -> None:
    """SPEC 3: a trace's ids are job ids too; replay and offline refuse the same ones."""
    from tests.test_units import base_trace

    raw = base_trace(id="a/b")
    with pytest.raises(SpecError, match=r"jobs\[0\]\.id: must be characters of A-Z .* '/'"):
        trace_from_dict(raw)
    assert trace_from_dict(base_trace(id="a.b_c-1")).jobs[0].id == "a.b_c-1"


def test_a_trace_horizon_past_memory_is_refused_by_name() -> None:
    """A horizon whose price ledger would not fit in memory is a bad field of the
    trace, not a MemoryError (or an OOM kill) once the replay starts."""
    from tests.test_units import base_trace

    raw = base_trace()
    raw["horizon"] = 10**9
    with pytest.raises(SpecError, match=r"horizon: 1,000,000,000 slots of [\d,]+ servers need a "):
        trace_from_dict(raw)
    raw["horizon"] = 10**4
    assert trace_from_dict(raw).horizon == 10**4


def test_limits_config() -> None:
    assert limits_from_dict({}) == Limits()
    got = limits_from_dict({"rate": 2.5, "burst": 10, "max_search_steps": 1e8})
    assert (got.rate, got.burst, got.max_search_steps) == (2.5, 10, 1e8)
    assert limits_from_dict({"pending_steps_per_submitter": 1e9}).pending_steps_per_submitter == 1e9
    # search tables past the machine's memory: one job's search would have oasisd killed
    memory = machine_mb()
    assert memory is not None  # Linux
    assert limits_from_dict({"max_search_mb": memory}).max_search_mb == memory
    with pytest.raises(SpecError, match=r"limits\.max_search_mb: must be at most this machine"):
        limits_from_dict({"max_search_mb": 1e12})
    assert limits_from_dict({"pending_steps_per_boundary": 4e9}).pending_steps_per_boundary == 4e9
    # one turn of the decision thread, where every tenant's calls wait: at most 1e10 steps
    # (about 30 s, a stop's wait for a decision); before, 1e15 was taken as it was
    for key in ("max_search_steps", "pending_steps_per_boundary", "replan_steps_per_review"):
        assert getattr(limits_from_dict({key: MAX_TURN_STEPS}), key) == 1e10
        with pytest.raises(
            SpecError, match=rf"limits\.{key}: must be at most 1e\+10: .* got 1e\+15"
        ):
            limits_from_dict({key: 1e15})
    # a wait's last slot is stored in a 64-bit column: 1e300 failed its commit's batch
    assert limits_from_dict({"max_wait_seconds": MAX_WAIT_SECONDS}).max_wait_seconds > 3e9
    with pytest.raises(SpecError, match=r"limits\.max_wait_seconds: must be at most 3155760000"):
        limits_from_dict({"max_wait_seconds": 1e300})
    # a page ends after the job that reaches max_page_bytes, and a job read back may be
    # 4 MiB: past 8 MiB a page could pass the 16 MiB the daemon sends (before: 1e9 was
    # taken, and ListJobs of five such jobs failed RESOURCE_EXHAUSTED for every operator)
    assert MAX_PAGE_BYTES + MAX_STORED_SPEC < MAX_RESPONSE_BYTES
    # each ListJobs reads max_page_jobs rows and their plans before the page is cut
    assert limits_from_dict({"max_page_jobs": MAX_PAGE_JOBS}).max_page_jobs == 1000
    with pytest.raises(SpecError, match=r"limits\.max_page_jobs: must be at most 1000"):
        limits_from_dict({"max_page_jobs": 10**6})
    # a spec the store would not read back (4 Mi characters): before, 1e8 was taken, and
    # a job of a 4.4 MiB spec was admitted, then failed at the next start
    assert 2 * MAX_SPEC_BYTES <= MAX_STORED_SPEC
    assert limits_from_dict({"max_spec_bytes": MAX_SPEC_BYTES}).max_spec_bytes == 2 * 2**20
    with pytest.raises(SpecError, match=r"limits\.max_spec_bytes: must be at most 2097152"):
        limits_from_dict({"max_spec_bytes": 10**8})
    assert limits_from_dict({"max_page_bytes": MAX_PAGE_BYTES}).max_page_bytes == 8 * 2**20
    with pytest.raises(SpecError, match=r"limits\.max_page_bytes: must be at most 8388608"):
        limits_from_dict({"max_page_bytes": 10**9})
    # a submitter's share of the queue is a tenth of it unless given, at most 100
    shares = {n: limits_from_dict({"max_pending": n}).max_pending_per_submitter
              for n in (1, 9, 50, 1000, 5000)}  # fmt: skip
    assert shares == {1: 1, 9: 1, 50: 5, 1000: 100, 5000: 100}
    given = limits_from_dict({"max_pending": 50, "max_pending_per_submitter": 50})
    assert given.max_pending_per_submitter == 50  # one submitter's queue: the operator's
    # above the queue (a file an earlier version started with): kept, not refused
    over = limits_from_dict({"max_pending": 50, "max_pending_per_submitter": 100})
    assert (over.max_pending, over.max_pending_per_submitter) == (50, 100)
    for raw, message in (
        ({"rate": -1}, "limits.rate: must be >= 0"),
        ({"burst": 5}, "limits.burst: needs limits.rate > 0"),
        ({"rate": 5, "burst": 0.5}, r"limits.burst: must be 0 \(= max\(1, rate\)\) or >= 1"),
        ({"max_job_work": 0}, "limits.max_job_work: must be >= 1"),
        ({"max_search_steps": "many"}, "limits.max_search_steps: must be a number"),
        ({"pending_steps_per_submitter": 0}, "limits.pending_steps_per_submitter: must be > 0"),
        ({"pending_steps_per_boundary": -1}, "limits.pending_steps_per_boundary: must be > 0"),
        ({"pending_steps_per_submitter": "x"}, "limits.pending_steps_per_submitter: must be a"),
        ({"speed": 1}, "limits.speed: unknown key"),
    ):
        with pytest.raises(SpecError, match=message):
            limits_from_dict(raw)
    with pytest.raises(ConfigError, match=r"limits\.rate"):
        from_dict(tomllib.loads(f"[limits]\nrate = -2\n{CLUSTER_TOML}"))


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_token_bucket() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate=2.0, burst=3.0, now=clock)
    assert [limiter.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("a") == pytest.approx(0.5)  # one token needs 1/rate s
    assert limiter.take("b") == 0.0  # clients do not share a bucket
    clock.t += 0.25
    assert limiter.take("a") == pytest.approx(0.25)
    clock.t += 0.25
    assert limiter.take("a") == 0.0
    clock.t += 60  # refills to the burst, no more
    assert [limiter.take("a") for _ in range(4)][-1] > 0
    assert RateLimiter.retry_hint_ms(0.0001) == 1 and RateLimiter.retry_hint_ms(0.25) == 250
    assert limiter.words == "rate limit: 2 requests/s per client"
    assert RateLimiter(rate=1.0).words == "rate limit: 1 request/s per client"  # not "requests"
    # a wait that is infinite (a rate of 5e-324, or a search's tokens at a tiny
    # search_steps_per_token): before, OverflowError, and every call answered UNKNOWN
    tiny = RateLimiter(rate=5e-324, now=clock)
    assert tiny.take("a") == 0.0 and tiny.take("a") == math.inf
    limiter.charge("c", 1e10 / 1e-300)
    assert limiter.take("c") == math.inf
    assert RateLimiter.retry_hint_ms(math.inf) == 10**15


def test_idle_buckets_are_forgotten() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate=1.0, burst=1.0, now=clock, max_clients=3)
    for c in "abc":
        limiter.take(c)
    clock.t += 10
    limiter.take("d")  # a, b, c are full again: forgotten
    assert set(limiter._buckets) == {"d"}


def test_a_client_in_debt_is_not_forgotten_with_the_idle_ones() -> None:
    """A bucket idle longer than a refill was dropped whatever it still owed: a client
    charged for an expensive search (a debt of 100 tokens) had it forgiven once the
    table went over its cap, and searched again at once."""
    clock = FakeClock()
    limiter = RateLimiter(rate=1.0, burst=1.0, now=clock, max_clients=3)
    limiter.take("a")
    limiter.charge("a", 100.0)
    for c in "bc":
        limiter.take(c)
    clock.t += 10  # b and c are full again; a still owes about 90 tokens
    limiter.take("d")
    assert set(limiter._buckets) == {"a", "d"}
    assert limiter.take("a") == pytest.approx(91.0)


def test_a_table_over_its_cap_of_recent_clients_is_not_scanned_at_every_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over ``max_clients`` with every client recent, nothing can be forgotten, and each
    call looked at every bucket: 1.3 -> 103 us a call at 10,000 clients (the cardinality
    audit). A pass now runs at most once per ``PURGE_SECONDS``."""
    clock = FakeClock()
    limiter = RateLimiter(rate=1.0, burst=1.0, now=clock, max_clients=100)
    passes: list[float] = []
    forget = limiter._forget_idle

    def counted(now: float) -> None:
        passes.append(now)
        forget(now)

    monkeypatch.setattr(limiter, "_forget_idle", counted)
    for i in range(1000):  # 1,000 new clients within 0.1 s: none idle
        clock.t += 0.0001
        limiter.take(f"c{i}")
    assert len(passes) == 1 and len(limiter._buckets) == 1000
    clock.t += RateLimiter.PURGE_SECONDS + 1.0  # all full again
    limiter.take("late")
    assert len(passes) == 2 and set(limiter._buckets) == {"late"}


# -- through the daemon ----------------------------------------------------------------


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = tmp_path_factory.mktemp("limited")
    extra = """
[limits]
max_message_bytes = 4096
max_job_work = 300
max_job_chunks = 32
max_search_steps = 50000
"""
    config = write_config(d / "oasisd.toml", d / "data", extra=extra)
    daemon = Daemon(config, d / "oasisd.log").start()
    yield daemon
    assert daemon.stop() == 0, (d / "oasisd.log").read_text()


def test_oversized_jobs_are_refused_with_the_limit(limited: Daemon, tmp_path: Path) -> None:
    cases = [
        (job("w", chunks=16, minibatches=1000), "limits.max_job_work = 300"),
        (job("n", chunks=40), "limits.max_job_chunks = 32"),
        (job("s", chunks=16, minibatches=600), "over limits.max_search_steps = 5e+04"),
        # worth nothing and over a limit: both at once (before: the worth, then the limit)
        (
            job("wl", chunks=40, utility={"kind": "deadline", "value": 5, "deadline": 0.5}),
            "invalid input:\n  job.utility.deadline: leaves 0 slots (0s) after the job's "
            "arrival (30m is 0.5 slots: a job ends with a slot, so only whole slots count), "
            "but it needs at least 2 slots (2h) even on an empty cluster",
        ),
        (
            job("wl", chunks=40, utility={"kind": "deadline", "value": 5, "deadline": 0.5}),
            "\n  job.chunks: 40 exceeds limits.max_job_chunks = 32",
        ),
        (
            job("tiny", worker={"cpu": 0.01, "bandwidth": 0.1}),  # 400 on w2 (40 Gbps)
            "job.worker: 400 workers of this job fit on one server (w2), over the 203 one "
            "job may put on a server: a node agent runs at most 1,024 worker commands",
        ),
        (job("x" * 129), "job.id: must be 1-128 characters long, got 129"),
        (job("bad\tid"), "job.id: must be characters of A-Z a-z 0-9 . _ - only"),
        (
            job("a/+/#"),
            "job.id: must be characters of A-Z a-z 0-9 . _ - only (it names an "
            "MQTT topic), got '/' at position 1",
        ),
    ]
    for spec, message in cases:
        out = oasis("submit", write_job(tmp_path, spec), server=limited.address, check=False)
        assert out.returncode == 2, out.stderr
        assert "INVALID_ARGUMENT" in out.stderr and message in out.stderr, out.stderr
        quote = oasis("quote", write_job(tmp_path, spec), server=limited.address, check=False)
        if "job.id" not in message:  # quotes are searched too, so limited too
            assert quote.returncode == 2 and message in quote.stderr
    # refused, not decided: nothing stored, and a job within the limits still admitted
    with grpc.insecure_channel(limited.address) as channel:
        stub = pb_grpc.AdmissionStub(channel)
        assert list(stub.ListJobs(pb.ListJobsRequest(), timeout=10).jobs) == []
        request = pb.SubmitJobRequest(job=spec_to_proto(job("fits", chunks=16, minibatches=300)))
        assert stub.SubmitJob(request, timeout=30).job.decision.admitted


def test_a_message_over_the_limit_is_refused_by_grpc(limited: Daemon, tmp_path: Path) -> None:
    values = [100.0 - i * 0.01 for i in range(1000)]  # ~9 KB, over 4096 bytes
    spec = job("big", utility={"kind": "table", "values": values})
    # the client says it as bad input (exit 2), not gRPC's "Received message larger
    # than max (9038 vs. 4096)" with exit 1 (the offline tools' audit)
    out = oasis("submit", write_job(tmp_path, spec), server=limited.address, check=False)
    assert out.returncode == 2, out.stderr
    assert (
        "INVALID_ARGUMENT: the request is " in out.stderr
        and "(4,096, its [limits] max_message_bytes)" in out.stderr
    ), out.stderr
    with grpc.insecure_channel(limited.address) as channel:
        stub = pb_grpc.AdmissionStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(spec)), timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_rate_limit_per_token(tmp_path: Path) -> None:
    """alice's burst spent: RESOURCE_EXHAUSTED with a retry hint; bob and health checks
    are not affected; after the hinted wait alice is served again."""
    with tenants_daemon(tmp_path, "[limits]\nrate = 0.5\nburst = 3\n") as (daemon, alice, bob):
        a, b = pb_grpc.AdmissionStub(alice), pb_grpc.AdmissionStub(bob)
        codes: list[grpc.StatusCode] = []
        hint_ms = 0
        while hint_ms == 0 and len(codes) < 10:  # until refused: the burst of 3, then 1/2 s
            try:
                a.ListJobs(pb.ListJobsRequest(), timeout=10)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as err:
                codes.append(err.code())
                assert "rate limit: 0.5 requests/s per client; retry in" in (err.details() or "")
                hint_ms = int(dict(err.trailing_metadata() or ())["grpc-retry-pushback-ms"])
        assert codes[:3] == [grpc.StatusCode.OK] * 3
        assert codes[-1] == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert 0 < hint_ms <= 2000
        b.ListJobs(pb.ListJobsRequest(), timeout=10)  # bob has his own bucket
        guesses: list[grpc.StatusCode] = []
        with client_channel(daemon.address, token="a-guess") as mallory:
            for _ in range(4):  # a bad token costs its address's bucket
                with pytest.raises(grpc.RpcError) as refused:
                    pb_grpc.AdmissionStub(mallory).ListJobs(pb.ListJobsRequest(), timeout=10)
                guesses.append(refused.value.code())
        assert guesses == [grpc.StatusCode.UNAUTHENTICATED] * 3 + [
            grpc.StatusCode.RESOURCE_EXHAUSTED
        ]
        health = health_pb2_grpc.HealthStub(alice)
        for _ in range(5):  # health checks are never limited
            health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        time.sleep(hint_ms / 1000 + 0.05)
        a.ListJobs(pb.ListJobsRequest(), timeout=10)


def _alices_daemon(tmp_path: Path, rate: float, burst: int) -> Daemon:
    """A daemon, started, whose one token is submitter alice's ``a-token``, at
    ``limits.rate`` calls a second and ``burst``; its log is ``oasisd.log``."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice submitter {hash_token('a-token')}\n")
    extra = f'[auth]\ntokens_file = "{tokens}"\n[limits]\nrate = {rate}\nburst = {burst}\n'
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", extra=extra)
    return Daemon(config, tmp_path / "oasisd.log").start()


def _spend_alices_bucket(address: str) -> str:
    """Call ``ListJobs`` as alice until her rate refuses one (RESOURCE_EXHAUSTED);
    returns the refusal's ``grpc-retry-pushback-ms`` trailer."""
    with client_channel(address, token="a-token") as channel:
        stub = pb_grpc.AdmissionStub(channel)
        with pytest.raises(grpc.RpcError) as spent:
            for _ in range(10):
                stub.ListJobs(pb.ListJobsRequest(), timeout=10)
    assert spent.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    return str(dict(spent.value.trailing_metadata() or ())["grpc-retry-pushback-ms"])


def test_a_list_longer_than_the_burst_is_sent_at_the_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the README audit: with the example config's rate (20/s, burst 40),
    ``oasis submit`` of a list of 80 jobs stopped at item 48, ``RESOURCE_EXHAUSTED: rate
    limit ...; retry in 0.008 s``, the rest not sent. The client now waits what the
    daemon's ``grpc-retry-pushback-ms`` says (the item was refused unread) and sends
    the item again; other refusals still stop the list."""
    daemon = _alices_daemon(tmp_path, rate=2, burst=2)
    try:
        small = {**SMALL_JOB, "chunks": 2, "worker": {**SMALL_JOB["worker"], "gpu": 0.5}}
        items = [{**small, "id": f"paced-{i}"} for i in range(6)]
        spec = tmp_path / "list.json"
        spec.write_text(json.dumps(items))
        args = ("submit", str(spec), "--json", "--token", "a-token")
        out = oasis(*args, server=daemon.address, check=False)
        assert out.returncode in (0, 3), out.stdout + out.stderr
        assert [r["id"] for r in json.loads(out.stdout)] == [i["id"] for i in items]
        # a refusal without a wait to keep (max_job_chunks) still stops the list there;
        # alice's bucket spent first, so the list's first call (the slot clock) waits too
        spec.write_text(json.dumps([{**small, "id": "paced-6"}, {**small, "chunks": 10**9}]))
        _spend_alices_bucket(daemon.address)
        out = oasis(*args, server=daemon.address, check=False)
        assert out.returncode == 2, out.stdout + out.stderr
        failed = json.loads(out.stdout)
        assert failed["failed"]["item"] == 1 and failed["error"]["code"] == "INVALID_ARGUMENT"
        assert [r["id"] for r in failed["submitted"]] == ["paced-6"]
        # one call left in alice's bucket: a single job's submit (and `job`) used it, and
        # the slot clock asked after the answer was refused for the rate: exit 1,
        # RESOURCE_EXHAUSTED (which reads as "not admitted"), the job stored all the same
        spec.write_text(json.dumps({**small, "id": "paced-one"}))
        for argv in (("submit", str(spec)), ("job", "paced-one")):
            hint = _spend_alices_bucket(daemon.address)
            time.sleep(int(hint) / 1000 + 0.05)  # one call's worth back (rate 2/s)
            capsys.readouterr()
            # in this process: a subprocess's start-up would let more calls' worth back
            status = main([*argv, "--json", "--token", "a-token", "--server", daemon.address])
            said = capsys.readouterr().out
            assert status in (0, 3), said
            assert json.loads(said)["id"] == "paced-one"
    finally:
        assert daemon.stop() == 0, (tmp_path / "oasisd.log").read_text()


@pytest.mark.parametrize("rate", [0.05, 0.5], ids=["wait-past-timeout", "wait-within"])
def test_a_wait_for_the_rate_is_kept_within_timeout_and_in_milliseconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rate: float
) -> None:
    """The client's mutation audit: the waits the daemon names for the rate are kept for
    up to ``--timeout`` seconds in all; without that bound every test passed, and a
    client past a slow rate (one call per 20 s) would wait it out at every call. A wait
    past ``--timeout`` (8 s here) is the refusal, said at once: RESOURCE_EXHAUSTED, exit
    1; one within it (one call per 2 s: a trailer of up to 2000 ms, not 2000 s) is kept,
    and the job submitted."""
    daemon = _alices_daemon(tmp_path, rate=rate, burst=1)
    try:
        spec = tmp_path / "job.json"
        spec.write_text(json.dumps({**SMALL_JOB, "id": "slow-1"}))
        hint = _spend_alices_bucket(daemon.address)
        capsys.readouterr()
        argv = ["submit", str(spec), "--json", "--token", "a-token", "--timeout", "8"]
        status = main([*argv, "--server", daemon.address])
        said = json.loads(capsys.readouterr().out)
        if rate < 0.1:
            assert int(hint) > 8000  # the next call's worth is further off than --timeout
            assert (status, said["error"]["code"]) == (1, "RESOURCE_EXHAUSTED"), said
            assert "rate limit" in said["error"]["message"], said
        else:
            assert (status, said["id"], said["state"]) == (0, "slow-1", "admitted"), said
    finally:
        assert daemon.stop() == 0, (tmp_path / "oasisd.log").read_text()
