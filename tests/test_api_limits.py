"""The API's size bounds, end to end (issue 12, item 10): ``ListJobs`` pages and bounded
job specs, on a daemon subprocess over a real gRPC channel, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import grpc
import pytest

from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.servers import Daemon, oasis, write_config
from tests.test_daemon_e2e import job

LIMITS = """
[limits]
max_page_jobs = 3
max_table_points = 40
max_spec_bytes = 900
rate = 1000        # the limiter on: a spec over a limit is refused the same way when the
burst = 1000       # rate is charged its search (it was UNKNOWN there, with rate on)
"""


@pytest.fixture
def daemon(tmp_path: Path, store_url: str) -> Iterator[Daemon]:
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", store_url, extra=LIMITS)
    d = Daemon(config, tmp_path / "oasisd.log").start()
    yield d
    assert d.stop() == 0, (tmp_path / "oasisd.log").read_text()


def _code(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        assert callable(call)
        call()
    return err.value.code(), str(err.value.details())


def test_list_jobs_pages_and_specs_are_bounded(daemon: Daemon) -> None:
    addr = daemon.address
    ids = [f"p{i}" for i in range(7)]
    with grpc.insecure_channel(addr) as channel:
        stub = pb_grpc.AdmissionStub(channel)
        for job_id in ids:
            stub.SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(job(job_id))), timeout=60)

        # no page_size: the daemon's maximum page, then the rest by token, in order
        first = stub.ListJobs(pb.ListJobsRequest(), timeout=30)
        assert [j.spec.id for j in first.jobs] == ids[:3] and first.next_page_token
        seen = [j.spec.id for j in first.jobs]
        token = first.next_page_token
        while token:
            page = stub.ListJobs(pb.ListJobsRequest(page_token=token, page_size=50), timeout=30)
            assert len(page.jobs) <= 3  # a page_size above the maximum is cut to it
            seen += [j.spec.id for j in page.jobs]
            token = page.next_page_token
        assert seen == ids
        two = stub.ListJobs(pb.ListJobsRequest(page_size=2), timeout=30)
        assert [j.spec.id for j in two.jobs] == ids[:2]
        last = stub.ListJobs(pb.ListJobsRequest(page_size=3, page_token=two.next_page_token))
        assert [j.spec.id for j in last.jobs] == ids[2:5]
        code, details = _code(lambda: stub.ListJobs(pb.ListJobsRequest(page_token="x?")))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "page_token" in details
        # a limit is a page's cap too, never past the daemon's: a limit of 1,000 asked
        # the store for 1,000 rows a call (the guard audit's S14, not run until now)
        capped = stub.ListJobs(pb.ListJobsRequest(limit=1000), timeout=30)
        assert [j.spec.id for j in capped.jobs] == ids[:3] and capped.next_page_token
        one = stub.ListJobs(pb.ListJobsRequest(limit=1, page_size=3), timeout=30)
        assert [j.spec.id for j in one.jobs] == ids[:1]
        for negative in (pb.ListJobsRequest(page_size=-1), pb.ListJobsRequest(limit=-1)):
            code, details = _code(lambda r=negative: stub.ListJobs(r, timeout=30))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, details
            assert details == "page_size, limit: must be >= 0", details

        # bounded specs: named field, INVALID_ARGUMENT, for submit and quote alike
        table = {"kind": "table", "values": [100.0 - i for i in range(41)]}
        for rpc in (stub.SubmitJob, stub.QuoteJob):
            request = pb.SubmitJobRequest if rpc is stub.SubmitJob else pb.QuoteJobRequest
            big = request(job=spec_to_proto(job("t1", utility=table)))
            code, details = _code(lambda r=rpc, b=big: r(b, timeout=30))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, details
            assert "job.utility.values" in details and "max_table_points = 40" in details
        long_values = {"kind": "table", "values": [1e6 / 3 - i for i in range(40)]}
        wide = pb.SubmitJobRequest(job=spec_to_proto(job("t2", utility=long_values)))
        code, details = _code(lambda: stub.SubmitJob(wide, timeout=30))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "max_spec_bytes = 900" in details
        short = {"kind": "table", "values": [100.0 - i for i in range(40)]}
        ok = stub.SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(job("t3", utility=short))))
        assert ok.job.spec.id == "t3"  # at the limits: accepted

        # a spec is refused by its size as sent before its JSON is read (a 1 MB one took
        # 94 ms of the event loop to parse first)
        padded = pb.JobSpec(json=" " * 4000 + json.dumps(job("t4")))
        code, details = _code(lambda: stub.QuoteJob(pb.QuoteJobRequest(job=padded), timeout=30))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        assert "as sent exceeds 4 x limits.max_spec_bytes = 3600" in details, details

        # each state once: 70,000 repeats were a query of 70,000 parameters, past
        # psycopg's 65,535, which read as the store being down for every tenant
        expired = pb.ListJobsRequest(states=[pb.JOB_STATE_EXPIRED] * 70_000)
        assert list(stub.ListJobs(expired, timeout=30).jobs) == []
        # an unknown state names the known ones by number, as the request gives them
        # (before: a Python tuple of their names, "(('pending', 'admitted', ...))")
        code, details = _code(
            lambda: stub.ListJobs(pb.ListJobsRequest(states=[cast(pb.JobState, 99)]))
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        assert details.startswith("states: unknown state 99 (known: 1 (admitted), "), details
        assert "7 (pending), 8 (expired))" in details and "((" not in details, details
        after = stub.SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(job("t5"))), timeout=30)
        assert after.job.spec.id == "t5"

    # the CLI follows the pages
    listed = json.loads(oasis("jobs", "--json", server=addr).stdout)["jobs"]
    assert [j["spec"]["id"] for j in listed] == [*ids, "t3", "t5"]
    limited = json.loads(oasis("jobs", "--json", "--limit", "5", server=addr).stdout)["jobs"]
    assert [j["spec"]["id"] for j in limited] == ids[:5]
    # the table says that jobs were left out (it did not), and not when none were
    table = oasis("jobs", "--limit", "5", server=addr).stdout.splitlines()
    assert [line.split()[0] for line in table[2:7]] == ids[:5]
    assert table[-1] == "the first 5 in decision order; more follow (--limit 0 lists every one)"
    every = oasis("jobs", "--limit", str(len(listed)), server=addr).stdout
    assert "more follow" not in every and every.count("\n") == len(listed) + 3
    status = json.loads(oasis("status", "--json", "--limit", "100", server=addr).stdout)
    in_flight = [j["spec"]["id"] for j in listed if j["state"] == "admitted"]
    assert len(in_flight) > 3  # more than one page
    assert sorted(j["id"] for j in status["jobs"]) == sorted(in_flight)


def test_a_page_ends_at_its_byte_bound(tmp_path: Path) -> None:
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data",
                          extra="[limits]\nmax_page_bytes = 1\n")  # fmt: skip
    d = Daemon(config, tmp_path / "oasisd.log").start()
    try:
        with grpc.insecure_channel(d.address) as channel:
            stub = pb_grpc.AdmissionStub(channel)
            for job_id in ("b0", "b1", "b2"):
                stub.SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(job(job_id))), timeout=60)
            pages = []
            token = ""
            for _ in range(5):
                page = stub.ListJobs(pb.ListJobsRequest(page_token=token), timeout=30)
                pages.append([j.spec.id for j in page.jobs])
                token = page.next_page_token
                if not token:
                    break
            # the CLI follows GetPrices' pages too, each cut at the byte bound (the
            # mutation audit: stopped after the first page, it showed one server's rows)
            cluster = pb_grpc.ClusterStub(channel)
            first = cluster.GetPrices(pb.GetPricesRequest(slots=2, page_size=1000), timeout=30)
            assert first.next_page_token and len(first.prices) < 5 * 5
            prices = json.loads(oasis("prices", "--json", "--slots", "2", server=d.address).stdout)
            rows = {(r["server"], r["resource"]) for r in prices["prices"]}
            assert len(prices["prices"]) == len(rows) == 3 * 5 + 2 * 4  # every server's
            assert "next_page_token" not in prices
    finally:
        assert d.stop() == 0, (tmp_path / "oasisd.log").read_text()
    assert pages == [["b0"], ["b1"], ["b2"]]  # at least one job a page, never more here
