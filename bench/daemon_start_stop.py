"""How long ``oasisd`` takes to start and to stop, on SQLite, with and without ``[mqtt]``.

What is measured
    ``oasisd --config FILE`` as a subprocess (``tests.servers.Daemon``: a new SQLite store
    in a temporary directory, the test suite's cluster), from the spawn until it prints
    that it listens, and from SIGTERM until it has exited, nothing called in between.
    With ``[mqtt]`` it links to a Mosquitto started on a loopback port
    (``tests.broker.Mosquitto``). The test suite starts several hundred daemons, so
    these times are much of its own; an operator's restart waits for them too.

Methodology
    ``--rounds`` starts and stops of each kind, one after another; the table gives the
    median and the maximum. Wall-clock seconds from ``time.monotonic``; a start's CPU
    seconds (user + system, ``/proc``) of the daemon and its commit process when it
    listens, which another program on the machine changes less than the wall-clock's.

Run with
    ``python -m bench.daemon_start_stop`` (``--rounds 6``; ``--json`` for machines)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cpu_use import tree_seconds
from bench.machine import describe
from tests.broker import Mosquitto
from tests.servers import Daemon, write_config


def once(extra: str) -> tuple[float, float, float]:
    """One start and one stop of a daemon on a new store: their seconds, and the start's
    CPU seconds."""
    directory = Path(tempfile.mkdtemp(prefix="oasis-start-"))
    config = write_config(directory / "oasisd.toml", directory / "data", extra=extra)
    began = time.monotonic()
    daemon = Daemon(config, directory / "oasisd.log").start()
    listening = time.monotonic()
    assert daemon.proc is not None
    cpu = tree_seconds([daemon.proc.pid])
    code = daemon.stop()
    stopped = time.monotonic()
    if code != 0:
        raise RuntimeError(f"oasisd exited {code}: {(directory / 'oasisd.log').read_text()}")
    return listening - began, stopped - listening, cpu


def run(rounds: int) -> list[dict[str, Any]]:
    broker = Mosquitto()
    try:
        kinds = {
            "sqlite": "",
            "sqlite, [mqtt]": f'[mqtt]\nurl = "mqtt://127.0.0.1:{broker.port}"\n',
        }
        rows = []
        for name, extra in kinds.items():
            once(extra)  # a warm-up: the kernels' cache and the bytecode read once
            times = [once(extra) for _ in range(rounds)]
            starts, stops, cpus = ([t[i] for t in times] for i in range(3))
            rows.append({"daemon": name, "rounds": rounds,
                         "start median s": round(statistics.median(starts), 2),
                         "start max s": round(max(starts), 2),
                         "start CPU median s": round(statistics.median(cpus), 2),
                         "start CPU max s": round(max(cpus), 2),
                         "stop median s": round(statistics.median(stops), 2),
                         "stop max s": round(max(stops), 2)})  # fmt: skip
            print(f"{name}: starts {[round(s, 2) for s in starts]}, "
                  f"CPU {[round(s, 2) for s in cpus]}, "
                  f"stops {[round(s, 2) for s in stops]}", flush=True)  # fmt: skip
        return rows
    finally:
        broker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="starts and stops of each kind")
    parser.add_argument("--json", action="store_true", help="one JSON document")
    args = parser.parse_args()
    rows = run(args.rounds)
    if args.json:
        print(json.dumps({"machine": describe(), "results": rows}, indent=2))
        return
    print("| daemon | start median / max s | start CPU median / max s | stop median / max s |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['daemon']} | {r['start median s']} / {r['start max s']} | "
              f"{r['start CPU median s']} / {r['start CPU max s']} | "
              f"{r['stop median s']} / {r['stop max s']} |")  # fmt: skip


if __name__ == "__main__":
    main()
