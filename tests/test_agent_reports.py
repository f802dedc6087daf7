"""Node agents' progress reports that are careless or hostile, against a real Mosquitto
and a real oasisd with ``[mqtt]``: the test publishes as the agents (raw MQTT clients),
so it can send what the reference agent never does.

- A session's counts that go back (a stale or out-of-order report, an agent counting
  wrong) are not taken: the higher ones stay, and the daemon says so, naming the server
  and the job. Before, 100 mini-batches went back to 10, silently, and the job's
  estimate said a mini-batch took a negative time.
- A report repeated adds no sample to the job's runtime estimate.
- Neither touches another tenant's job.
- An agent that beats but follows no plan (its broker user cannot read its plan's
  topic) is said, and a job planned on its server, which nobody reported on, fails at
  its plan's end naming it. Before, it completed with its whole utility, never having
  run. One that follows an older plan than its server's, published 10 s before, is
  said too (it refused the newer one, or cannot read it), and a job that plan carried
  there, which nobody reported on, fails naming it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from controller.plane.topics import Heartbeat, Progress, TaskProgress
from controller.rpc import oasis_pb2 as pb
from tests.broker import NEEDS_MOSQUITTO
from tests.test_mqtt_faults import TOPICS, Plane
from tests.test_mqtt_plane import SERVERS, plane_job, wait_for

pytestmark = NEEDS_MOSQUITTO


class Agents:
    """Every server's agent played by one MQTT client in a thread: a heartbeat of each
    every 0.3 s, and the reports :meth:`report` queues, in order, at QoS 1."""

    def __init__(self, port: int, epoch: int | None = None) -> None:
        self.port = port
        self.sessions = {s: f"{s}-session" for s in SERVERS}
        # the epoch each one's beats say it follows (None: not said), from the first beat:
        # a beat without one counts as following a plan, for good
        self.epochs: dict[str, int | None] = dict.fromkeys(SERVERS, epoch)
        self._out: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    async def _run(self) -> None:
        async with aiomqtt.Client("127.0.0.1", self.port) as client:
            while not self._stop.is_set():
                for server in SERVERS:
                    beat = Heartbeat(server, self.sessions[server], self.epochs[server],
                                     sent_at=time.time())  # fmt: skip
                    await client.publish(TOPICS.heartbeat(server), beat.to_bytes(), qos=0)
                with self._lock:
                    out, self._out = self._out, []
                for topic, payload in out:
                    await client.publish(topic, payload, qos=1)
                await asyncio.sleep(0.3)

    def report(self, server: str, job: str, minibatches: float, worker_seconds: float) -> None:
        progress = Progress(server, self.sessions[server],
                            [TaskProgress(job, minibatches, worker_seconds)])  # fmt: skip
        with self._lock:
            self._out.append((TOPICS.progress(server), progress.to_bytes()))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture
def plane(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Plane, Agents]]:
    """The daemon and its agents, whose beats say the epoch of ``request.param`` (an
    indirect parameter; None, the default: no epoch) from the first."""
    p = Plane(tmp_path)
    agents: Agents | None = None
    try:
        p.daemon.start()
        p.wait_logged("broker connected")
        agents = Agents(p.broker.port, getattr(request, "param", None))
        yield p, agents
    finally:
        if agents is not None:
            agents.close()
        p.close()


def worker_server(decision: dict[str, Any]) -> str:
    """A server the job has workers on (its first, by name)."""
    return str(min(a["server"] for a in decision["decision"]["allocations"] if a.get("workers")))


def progress(p: Plane, job_id: str) -> Any:
    return p.stub().GetProgress(pb.GetProgressRequest(id=job_id), timeout=10).progress


def test_counts_that_go_back_are_not_taken_and_are_said(plane: tuple[Plane, Agents]) -> None:
    p, agents = plane
    a, b = p.submit(plane_job("a")), p.submit(plane_job("b"))
    on_a, on_b = worker_server(a), worker_server(b)  # b: another tenant's job
    agents.report(on_b, "b", 30, 15)
    agents.report(on_a, "a", 100, 50)
    wait_for("a's counts", lambda: progress(p, "a").minibatches_done == 100)
    agents.report(on_a, "a", 10, 60)  # back: stale, or an agent counting wrong
    agents.report(on_a, "a", 120, 40)  # more mini-batches, fewer worker-seconds
    said = p.wait_logged(
        "report entries below their agent session's earlier counts: the higher ones kept "
        "(a stale or out-of-order report, or an agent counting wrong)"
    )
    assert said[0]["server"] == on_a and said[0]["job"] == "a", said
    view = wait_for("a's next counts", lambda: (v := progress(p, "a")).minibatches_done == 120
                    and v)  # fmt: skip
    assert view.worker_seconds == 60  # the higher of each, never back
    assert view.minibatch_seconds.mean > 0  # was -0.2 s: a fit to counts that went back
    other = progress(p, "b")
    assert (other.minibatches_done, other.worker_seconds) == (30, 15)
    assert p.job("b").state in (pb.JOB_STATE_ADMITTED, pb.JOB_STATE_RUNNING)


def test_a_repeated_report_adds_no_sample(plane: tuple[Plane, Agents]) -> None:
    p, agents = plane
    on_a = worker_server(p.submit(plane_job("a")))
    agents.report(on_a, "a", 5, 3)
    wait_for("a's counts", lambda: progress(p, "a").minibatches_done == 5)
    for _ in range(5):  # a resend after a reconnection, a QoS 1 duplicate
        agents.report(on_a, "a", 5, 3)
    agents.report(on_a, "a", 7, 4)
    view = wait_for("a's next counts", lambda: (v := progress(p, "a")).minibatches_done == 7
                    and v)  # fmt: skip
    assert view.reports == 2  # was 7: each repeat a sample of the estimate
    assert p.logged("report entries below their agent session's earlier counts: the higher "
                    "ones kept (a stale or out-of-order report, or an agent counting "
                    "wrong)") == []  # fmt: skip


@pytest.mark.parametrize("plane", [0], indirect=True)  # beating, but no plan ever came
def test_a_job_planned_where_the_agent_follows_no_plan_fails_naming_it(
    plane: tuple[Plane, Agents],
) -> None:
    p, _agents = plane
    job = p.submit(plane_job("a", minibatches=18))  # 36 mini-batches: one slot's work
    servers = sorted({a["server"] for a in job["decision"]["allocations"]})
    said = p.wait_logged(
        "this server's agent beats but follows no plan: it has received none (can its "
        "broker user read its plan's topic? the ACL); jobs planned on it do not run, and "
        "fail at their plan's end"
    )
    assert {e["server"] for e in said} <= set(SERVERS), said
    failed = wait_for("a failed", lambda: p.job("a").state == pb.JOB_STATE_FAILED or None)
    assert failed
    [(detail,)] = p.store_rows("SELECT detail FROM events WHERE job_id = 'a' AND kind = 'failed'")
    assert json.loads(detail)["agents_following_no_plan"] == servers, detail
    assert "never had a plan" in p.job("a").decision.reason


@pytest.mark.parametrize("plane", [1], indirect=True)  # the first plan taken, none since
def test_an_agent_following_an_older_plan_than_its_servers_is_said(
    plane: tuple[Plane, Agents],
) -> None:
    p, _agents = plane
    job = p.submit(plane_job("a", minibatches=18))  # plans of a higher epoch carry it
    servers = sorted({a["server"] for a in job["decision"]["allocations"]})
    said = p.wait_logged(
        "this server's agent follows an older plan than the one published for it: it "
        "refused the newer one (an agent older than the daemon; its log says 'bad plan') "
        "or cannot read it (the broker's ACL); the jobs it places there do not run"
    )
    assert said[0]["server"] in SERVERS and said[0]["follows"] == 1, said
    assert said[0]["published"] > 1 and said[0]["published_seconds_ago"] >= 10, said
    # nobody reported on it, and no agent of its servers took the plan that placed it:
    # it fails at its plan's end (it completed with its whole utility, never having run)
    wait_for("a failed", lambda: p.job("a").state == pb.JOB_STATE_FAILED or None)
    [(detail,)] = p.store_rows("SELECT detail FROM events WHERE job_id = 'a' AND kind = 'failed'")
    assert json.loads(detail)["agents_behind_their_plan"] == servers, detail
    assert "never took that plan" in p.job("a").decision.reason


def test_an_agent_a_round_behind_at_each_beat_is_not_behind() -> None:
    """Plans going out every second (a busy daemon), the agent taking each a moment
    after its beat: it never follows one published 10 s before, so it is not said."""
    from controller.plane.plan_lag import LAG_SECONDS, PlanLag

    lag = PlanLag()
    for t in range(60):
        lag.published("w0", t + 1, float(t))
        assert lag.behind("w0", t, t + 0.5) is None  # the previous round's epoch
    assert lag.behind("w0", 40, 60.0) == (51, 10.0)  # ten rounds behind: said
    assert lag.behind("w1", 1, 60.0) is None  # nothing published for it
    assert len(lag._published["w0"]) <= LAG_SECONDS + 2  # bounded by the lag's rounds
    lag.forget()
    assert lag.behind("w0", 1, 100.0) is None
