"""Start-up time of the ``oasis`` client: how long a command takes, end to end.

What is measured
    The wall time of whole ``oasis`` processes, as a person or a script runs them:
    ``oasis --help``, ``oasis submit JOB.json`` (a small job on the test cluster; the
    file has no id, so each run is a new job; older clients send it as ``job``, an
    empty id), ``oasis jobs`` and ``oasis status``, the last three
    against an ``oasisd`` running as a subprocess on a loopback port with a SQLite store.
    Each time covers interpreter start, imports, the calls to the daemon and the output.
    For comparison, ``python -c pass`` (the interpreter alone) and ``python -c "import
    grpc"`` (the gRPC library every network command needs).

    Goal: every command well under 0.5 s (issue 13 measured 2.5-3 s, when
    ``controller.cli`` imported SQLAlchemy, Alembic and the numba code).

Methodology
    Like hyperfine: ``--warmup`` runs first (page cache, ``__pycache__``), then ``--runs``
    runs of each command one after another, each timed from ``subprocess.run`` to its
    exit with ``time.perf_counter``; mean, standard deviation, min and max. The client
    runs as ``python -m controller.cli`` (what the ``oasis`` console script calls), from
    this checkout or, with ``--source DIR``, from another one (e.g. ``git worktree add
    DIR <commit>`` and ``python proto/generate.py`` there) against the same daemon, for
    a before/after comparison. Other work on the machine shows up in the max; the min is
    the least a command takes.

Run with
    .venv/bin/python -m bench.client_startup [--runs 20] [--warmup 3] [--source DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.machine import describe
from tests.servers import SMALL_JOB, Daemon, write_config

__all__ = ["main"]

JOB = SMALL_JOB  # SPEC 3's form, which clients before issue 13 read too


def _time(argv: list[str], source: Path | None = None) -> float:
    env = None if source is None else {**os.environ, "PYTHONPATH": str(source)}
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60,
                          cwd=source, env=env)  # fmt: skip
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 3):  # 3: a rejected job, still a complete run
        raise RuntimeError(f"{argv} failed ({done.returncode}):\n{done.stderr}")
    return seconds


def measure(argv: list[str], runs: int, warmup: int, source: Path | None) -> dict[str, float]:
    """Seconds of ``runs`` runs of ``argv`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        _time(argv, source)
    times = [_time(argv, source) for _ in range(runs)]
    return {
        "mean": statistics.fmean(times),
        "sd": statistics.stdev(times) if len(times) > 1 else 0.0,
        "min": min(times),
        "max": max(times),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.client_startup")
    parser.add_argument("--runs", type=int, default=20, help="timed runs per command")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs first")
    parser.add_argument("--source", type=Path, help="run the client of this checkout")
    args = parser.parse_args(argv)
    source = args.source.resolve() if args.source else None
    oasis = [sys.executable, "-m", "controller.cli"]
    work = Path(tempfile.mkdtemp(prefix="oasis-startup-"))
    job = work / "job.json"
    job.write_text(json.dumps(JOB))
    daemon = Daemon(write_config(work / "oasisd.toml", work / "data"), work / "oasisd.log")
    daemon.start()
    load_start = os.getloadavg()[0]
    try:
        server = ["--server", daemon.address]
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            'python -c "import grpc"': [sys.executable, "-c", "import grpc"],
            "oasis --help": [*oasis, "--help"],
            "oasis submit JOB.json": [*oasis, "submit", str(job), *server],
            "oasis jobs": [*oasis, "jobs", *server],
            "oasis status": [*oasis, "status", *server],
        }
        results = {
            name: measure(cmd, args.runs, args.warmup, source) for name, cmd in commands.items()
        }
    finally:
        daemon.stop()
        shutil.rmtree(work, ignore_errors=True)

    machine = describe()
    command = f"python -m bench.client_startup --runs {args.runs} --warmup {args.warmup}"
    print(f"Command: `{command}" + (f" --source {args.source}`" if source else "`"))
    print(f"1-minute load average: {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at "
          f"the end ({machine['cores']} cores: above that, other work competed).")  # fmt: skip
    print("Machine: " + ", ".join(f"{k} {v}" for k, v in machine.items()) + ".")
    print()
    print("| command | mean (s) | sd | min | max |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| `{name}` | {r['mean']:.3f} | {r['sd']:.3f} | {r['min']:.3f} | {r['max']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
