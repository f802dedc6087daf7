"""A submitter's large answers cost its rate whichever call returns them (the tenant
isolation audit).

``GetJob`` and ``ListJobs`` charged a submitter's answers past 16 KiB a token per 16 KiB
more (building a page of 60,000 allocations takes 0.6 s of the event loop every tenant
shares), but ``SubmitJob``, ``QuoteJob`` and ``CancelJob`` return the same job, its plan
included, at one token a call: a retried submission of a stored job (its first answer
again), a quote of it (``existing``), or a retried cancel of a cancelled job (its plan up
to the cancel) built the same answer as ``GetJob`` at a fraction of its price, so one
tenant could keep the event loop busy for everyone within its rate. Now every answer of
a submitter is charged by its size (:meth:`controller.servicer.AdmissionServicer._charge_answer`).

A daemon subprocess over a real channel, with a cluster of many one-GPU servers so that
one job's plan is a large answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from controller.auth import hash_token
from controller.convert import spec_to_proto
from controller.limits import BYTES_PER_TOKEN
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.tls import client_channel
from tests.servers import Daemon

TOKENS = {"alice": "alice-answers-token", "carol": "carol-answers-token",
          "bob": "bob-answers-token"}  # fmt: skip
SERVERS = 240
WIDTH = 120
BURST = 24

# a job that runs a worker on each of WIDTH one-GPU servers for 10 slots and a bit: a
# plan of about 1,200 allocations, some 50 KB as an answer (two fit side by side)
WIDE = {
    "id": "wide",
    "epochs": 1,
    "chunks": WIDTH,
    "minibatches": 10,
    "tau": 1.0,
    "grad_mb": 0.001,
    "worker": {"gpu": 1, "cpu": 1, "mem": 1, "disk": 1, "bandwidth": 1},
    "ps": {"cpu": 1, "mem": 1, "disk": 1, "bandwidth": 10},
    "utility": {"kind": "sigmoid", "priority": 1000, "decay": 0.5, "target": 12},
}


def _config(directory: Path) -> Path:
    tokens = directory / "tokens"
    tokens.write_text("".join(f"{n} submitter {hash_token(t)}\n" for n, t in TOKENS.items()))
    worker = "capacity={gpu=1, cpu=8, mem=64, disk=100, bandwidth=10}"
    servers = [
        f'{{name="worker-server-with-a-long-name-{i:03d}", kind="worker", {worker}}}'
        for i in range(SERVERS)
    ]
    ps = "capacity={cpu=64, mem=512, disk=1000, bandwidth=100}"
    servers += [f'{{name="ps-server-{i}", kind="ps", {ps}}}' for i in range(4)]
    listed = ",\n  ".join(servers)
    path = directory / "oasisd.toml"
    path.write_text(
        f"""
[daemon]
listen = "127.0.0.1:0"
data_dir = "{directory / "data"}"
slot_seconds = 3600
window = 24
epoch = {time.time()}
log_level = "info"

[auth]
tokens_file = "{tokens}"

[limits]
rate = 0.01      # next to nothing refills while the test runs
burst = {BURST}

[cluster]
resources = ["gpu", "cpu", "mem", "disk", "bandwidth"]
servers = [
  {listed},
]
"""
    )
    return path


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = tmp_path_factory.mktemp("answers")
    daemon = Daemon(_config(d), d / "oasisd.log").start()
    yield daemon
    assert daemon.stop() == 0, (d / "oasisd.log").read_text()


def _stub(daemon: Daemon, name: str) -> tuple[pb_grpc.AdmissionStub, grpc.Channel]:
    channel = client_channel(daemon.address, token=TOKENS[name])
    return pb_grpc.AdmissionStub(channel), channel


def _calls_until_refused(call: Callable[[], Any], most: int) -> tuple[int, str]:
    """How many times ``call`` answers before the rate refuses it, and the refusal."""
    for n in range(most):
        try:
            call()
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
            return n, err.details() or ""
    return most, ""


@pytest.mark.parametrize(("rpc", "tenant"), [("submit", "alice"), ("quote", "carol")])
def test_a_submitters_repeated_large_answers_cost_its_rate_not_the_others(
    daemon: Daemon, rpc: str, tenant: str
) -> None:
    alice, a_channel = _stub(daemon, tenant)  # a tenant of its own each: a bucket each
    bob, b_channel = _stub(daemon, "bob")
    try:
        spec = spec_to_proto({**WIDE, "id": f"wide-{rpc}"})
        # alice's job; then she asks for it again and again (a retried submission
        # returns the first answer; a quote, the job stored)
        first = alice.SubmitJob(pb.SubmitJobRequest(job=spec), timeout=60)
        assert first.job.decision.admitted and not first.duplicate
        size = first.ByteSize()
        assert size > 3 * BYTES_PER_TOKEN, size  # the plan makes the answer large
        if rpc == "submit":

            def again() -> None:
                assert alice.SubmitJob(pb.SubmitJobRequest(job=spec), timeout=60).duplicate

        else:

            def again() -> None:
                quote = alice.QuoteJob(pb.QuoteJobRequest(job=spec), timeout=60)
                assert quote.existing.spec.id == f"wide-{rpc}"

        answered, refusal = _calls_until_refused(again, BURST)
        # each answer costs about size / 16 KiB tokens as a GetJob's does, so the burst
        # buys a few of them (before: one token each, BURST - 2 of them)
        per_call = size / BYTES_PER_TOKEN  # the call's token, and one per 16 KiB past 16
        assert answered <= BURST / per_call + 1, (answered, size)
        assert "rate" in refusal, refusal
        # bob's rate is his own: alice's answers took none of it
        small = {**WIDE, "id": f"small-{rpc}", "chunks": 1, "minibatches": 2}
        mine = bob.SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(small)), timeout=60)
        assert mine.job.decision.admitted
    finally:
        a_channel.close()
        b_channel.close()
