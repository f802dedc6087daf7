"""One agent flooding its own topic with large reports (below the broker's
``max_packet_size`` of the README's set-up, 300000): the daemon's memory stays level and
the other agents' beats still get in.

Before, every message the broker delivered waited in aiomqtt's unbounded queue, and
reading them cost the event loop more than taking them: reports of 250 KB published as
fast as one client could queued 4,800 in 20 s, the daemon grew from 250 MB to 1.3 GB
resident, and the other agents' heartbeats, queued behind them, came 15 s late: two
healthy servers were failed (:mod:`controller.plane.agent_queue`). Real parts: Mosquitto,
oasisd, ``oasis agent`` for w0 and p0, and a paho client flooding w1's topic.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path

import aiomqtt
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from controller import procfs
from controller.plane.agent_queue import QUEUE_BYTES, TOPIC_MESSAGES, AgentQueue
from tests.test_mqtt_faults import TOPICS, Plane
from tests.test_mqtt_plane import wait_for

FLOOD_SECONDS = 10.0
REPORT = b'{"version":1,"server":"w1","session":"flood","jobs":[],"pad":"' + b"x" * 250_000 + b'"}'


def rss_mb(pid: int) -> float:
    """Process ``pid``'s resident memory, MB (0 once it has ended)."""
    return procfs.status(pid).get("VmRSS", 0) / 1024


def flood(port: int, stop: threading.Event, qos: int = 1, backlog: int = 1000) -> int:
    """Publish REPORT on w1's progress topic as fast as one client can until ``stop``,
    at most ``backlog`` unacknowledged; the number published."""
    client = paho.Client(CallbackAPIVersion.VERSION2)
    client.max_inflight_messages_set(0)
    client.connect("127.0.0.1", port)
    client.loop_start()
    sent = 0
    try:
        while not stop.is_set():
            for _ in range(100):
                client.publish(TOPICS.progress("w1"), REPORT, qos=qos)
            sent += 100
            while len(client._out_messages) > backlog and not stop.is_set():
                time.sleep(0.01)
    finally:
        client.loop_stop()
        client.disconnect()
    return sent


def started_plane(tmp: Path, broker_extra: str = "") -> Plane:
    """A :class:`Plane` with the README's ``max_packet_size`` (and ``broker_extra``), its
    daemon connected and ``oasis agent`` for w0 and p0 heard."""
    p = Plane(tmp, broker_extra="max_packet_size 300000\n" + broker_extra)
    try:
        p.daemon.start()
        p.wait_logged("broker connected")
        for server in ("w0", "p0"):
            p.start_agent(server)
        p.wait_agents(("w0", "p0"))
    except BaseException:
        p.close()
        raise
    return p


def test_one_agents_flood_of_large_reports_costs_no_memory_and_no_other_server(
    tmp_path: Path,
) -> None:
    p = started_plane(tmp_path)
    try:
        assert p.daemon.proc is not None
        pid = p.daemon.proc.pid
        before = peak = rss_mb(pid)
        stop = threading.Event()
        flooder = threading.Thread(target=flood, args=(p.broker.port, stop), daemon=True)
        flooder.start()
        deadline = time.monotonic() + FLOOD_SECONDS
        while time.monotonic() < deadline:
            time.sleep(0.5)
            peak = max(peak, rss_mb(pid))
        stop.set()
        flooder.join(30)
        assert peak - before < 150, (before, peak)  # was +1 GB in 20 s
        wait_for("the drops said", lambda: p.logged(
            "messages from an agent dropped unread: too many of its topic waiting (in a "
            "flood, silence counts half meanwhile)") or None)  # fmt: skip
        time.sleep(2)  # a review or two after the flood
        assert p.logged("server failed") == [], p.logged("server failed")
    finally:
        p.close()


def test_the_queue_keeps_order_and_bounds_each_topic_not_a_quiet_one() -> None:
    dropped: list[str] = []

    def message(topic: str, size: int) -> aiomqtt.Message:
        return aiomqtt.Message(topic, b"x" * size, qos=0, retain=False, mid=0, properties=None)

    async def go() -> list[str]:
        queue = AgentQueue.factory(dropped.append)()
        for _ in range(TOPIC_MESSAGES + 5):
            queue.put_nowait(message("a/flood", 10))
        queue.put_nowait(message("a/quiet", 10))
        for _ in range(20):  # 16 fit in TOPIC_BYTES (4 MiB)
            queue.put_nowait(message("b/large", 250_000))
        queue.put_nowait(message("a/quiet2", 10))
        out = []
        while not queue.empty():
            out.append(str((await queue.get()).topic))
        return out

    out = asyncio.run(go())
    assert out == ["a/flood"] * TOPIC_MESSAGES + ["a/quiet"] + ["b/large"] * 16 + ["a/quiet2"]
    assert dropped == ["a/flood"] * 5 + ["b/large"] * 4


def test_past_the_queues_bytes_only_a_quiet_topics_message_is_taken_and_taking_frees_them() -> None:
    """Past :data:`QUEUE_BYTES` waiting in all, a topic's second message is dropped, but a
    topic with none waiting (a quiet agent's heartbeat) still gets in, however large the
    others' backlog (before the bound, a flood queued 1.3 GB; without the exception, one
    agent's flood kept every other server's beats out: failed while healthy). Taking the
    messages frees their bytes: the queue takes seconds again once drained."""
    dropped: list[str] = []
    mib = 1 << 20
    payloads = {size: b"x" * size for size in (10, mib)}  # one of each: no 64 MiB to build

    def message(topic: str, size: int) -> aiomqtt.Message:
        return aiomqtt.Message(topic, payloads[size], qos=0, retain=False, mid=0, properties=None)

    async def go() -> list[str]:
        queue = AgentQueue.factory(dropped.append)()
        topics = QUEUE_BYTES // (2 * mib)  # two messages of 1 MiB each: all the bytes
        for i in range(topics):
            queue.put_nowait(message(f"a{i}/report", mib))
            queue.put_nowait(message(f"a{i}/report", mib))
        queue.put_nowait(message("a0/report", 10))  # a second of a topic: dropped
        queue.put_nowait(message("quiet/beat", 10))  # none of its topic waiting: taken
        assert dropped == ["a0/report"]
        out = []
        while not queue.empty():
            out.append(str((await queue.get()).topic))
        queue.put_nowait(message("a0/report", 10))  # drained: taken again, and a second
        queue.put_nowait(message("a0/report", 10))
        assert queue.qsize() == 2 and dropped == ["a0/report"]
        return out

    out = asyncio.run(go())
    assert out[-1] == "quiet/beat" and len(out) == QUEUE_BYTES // mib + 1


def test_a_stop_under_a_frozen_broker_says_why_the_offline_status_did_not_go(
    tmp_path: Path,
) -> None:
    """SIGSTOP on the broker, then the daemon's stop: it gives up on ``online: false``
    after 2 s and says why; the line said ``"error": ""`` (a timeout's text)."""
    p = Plane(tmp_path)
    try:
        p.daemon.start()
        p.wait_logged("broker connected")
        assert p.broker.proc is not None
        p.broker.proc.send_signal(signal.SIGSTOP)
        try:
            p.daemon.stop()
        finally:
            p.broker.proc.send_signal(signal.SIGCONT)
        (line,) = p.logged("could not publish the offline status")
        assert line["error"] == "the broker did not answer within 2 s", line
    finally:
        p.close()
