"""One agent's flood of the broker's own capacity: the broker's memory, the daemon's, and
whether a server is failed, under each broker setting asked.

What is measured
    A Mosquitto of its own on a loopback port, with the README's ``max_packet_size
    300000`` and each ``--setting`` in turn (one line of ``mosquitto.conf`` or several,
    ``;``-separated; ``max_queued_messages 1000`` is Mosquitto's default, which the test
    brokers raise), ``oasisd`` with ``[mqtt]`` (``tests.test_mqtt_faults.Plane``: heartbeat
    timeout 4 s) and ``oasis agent`` for w0 and p0. Then ``--flooders`` clients publish
    250 KB progress reports on w1's topic (as one agent could, on its own topic, within the
    ACL) at QoS ``--qos`` as fast as they can for ``--seconds``. Reported per setting: the
    broker's and the daemon's resident memory before and at peak (MB, sampled every 0.5
    s), the reports sent, the daemon's broker connections lost, and the servers failed by
    the end (w0 and p0 beat all along). Mosquitto 2.0.11 here (Debian 12).

    The daemon subscribes to progress at QoS 1, so the broker queues a flood of it for
    the daemon, up to ``max_queued_messages`` (default 1,000) and ``max_queued_bytes``
    (default none); heartbeats are QoS 0 and not queued.

Usage
    .venv/bin/python -m bench.broker_flood [--flooders 3] [--seconds 20] [--qos 1]
        [--setting "max_queued_messages 1000" --setting "..."] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.test_plane_flood import flood, rss_mb, started_plane

DEFAULT_SETTINGS = (
    "max_queued_messages 1000",
    "max_queued_messages 1000; max_queued_bytes 16777216",
)


def run(setting: str, flooders: int, qos: int, seconds: float) -> dict[str, Any]:
    """One setting's run (module docstring)."""
    lines = "".join(f"{part.strip()}\n" for part in setting.split(";") if part.strip())
    plane = started_plane(Path(tempfile.mkdtemp(prefix="broker-flood-")), lines)
    try:
        assert plane.daemon.proc is not None and plane.broker.proc is not None
        daemon, broker = plane.daemon.proc.pid, plane.broker.proc.pid
        before = (rss_mb(broker), rss_mb(daemon))
        peak = list(before)
        stop = threading.Event()
        sent: list[int] = []
        port = plane.broker.port

        def one() -> None:
            sent.append(flood(port, stop, qos, backlog=2000))

        threads = [threading.Thread(target=one) for _ in range(flooders)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.5)
            peak = [max(peak[0], rss_mb(broker)), max(peak[1], rss_mb(daemon))]
        stop.set()
        for thread in threads:
            thread.join(30)
        time.sleep(3.0)  # a few reviews after the flood
        return {
            "setting": setting,
            "flooders": flooders,
            "qos": qos,
            "seconds": seconds,
            "reports_sent": sum(sent),
            "broker_mb": [round(before[0]), round(peak[0])],
            "daemon_mb": [round(before[1]), round(peak[1])],
            "servers_failed": [e.get("server") for e in plane.logged("server failed")],
            "daemon_connections_lost": len(plane.logged("broker connection lost")),
            "broker_running": plane.broker.proc.poll() is None,
        }
    finally:
        plane.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.broker_flood", description=__doc__.split("\n")[0])
    parser.add_argument("--flooders", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--qos", type=int, choices=(0, 1), default=1)
    parser.add_argument("--setting", action="append", help="mosquitto.conf lines, ';'-separated")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [run(s, args.flooders, args.qos, args.seconds)
               for s in args.setting or DEFAULT_SETTINGS]  # fmt: skip
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print("| setting | reports sent | broker MB before / peak | daemon MB before / peak | "
          "connections lost | servers failed |\n|---|---|---|---|---|---|")  # fmt: skip
    for r in results:
        print(f"| `{r['setting']}` | {r['reports_sent']} | {r['broker_mb'][0]} / "
              f"{r['broker_mb'][1]} | {r['daemon_mb'][0]} / {r['daemon_mb'][1]} | "
              f"{r['daemon_connections_lost']} | "
              f"{', '.join(r['servers_failed']) or 'none'} |")  # fmt: skip


if __name__ == "__main__":
    main()
