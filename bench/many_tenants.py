"""A daemon shared by many submitters: what each decision, a restart, ``oasis bounds`` and
a reload of the tokens file cost as the number of submitters with estimates grows.

What is measured
    ``oasisd`` runs as a subprocess (``tests.servers``: the test cluster, a window of 24
    slots of 3600 s, SQLite, or PostgreSQL with ``--backend postgresql``) with ``[auth]``
    and a tokens file of ``--tenants`` submitters and one operator. Each submitter
    submits one job (``tests.test_bounds_daemon``'s ordinary jobs, so each has an
    estimate of its own and votes in the median), admitted ones cancelled at once, so the
    cluster stays empty. Then:

    - ``decision``: ``--decisions`` submissions, one after another, by tenants in turn
      (each cancelled if admitted): the client's wall time of a ``SubmitJob``, median and
      p99 (ms), and the daemon's own ``decision_ms`` (the search alone); then the
      daemon's resident memory (``rss_mb``, its main process);
    - ``bounds``: ``oasis bounds`` and ``oasis bounds --json``: wall time (s; a CLI
      start-up included) and bytes and lines printed;
    - ``status``: ``oasis status``: wall time, bytes;
    - ``metrics``: not served without ``[metrics]``; not measured;
    - ``reload``: SIGHUP with the tokens file rewritten with every token rotated (each a
      new hash), the time until the log says ``config reloaded``, and the bytes of that
      line;
    - ``restart``: SIGTERM, then a start until ``listening`` and the first answered
      submission (the stored estimates read back).

With ``--standby`` it measures instead two nodes with ``[ha]`` (``follow_seconds =
0.5``) and ``[auth]`` on one PostgreSQL: after the submitters' jobs (on the leader), each
node's CPU time (user + system, s) over 10 s idle, then the CPU time of each while the
leader decides ``--decisions`` more submissions (the standby following).

Usage
    .venv/bin/python -m bench.many_tenants [--tenants 1,200,2000] [--decisions 200]
        [--backend sqlite|postgresql] [--standby] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from bench.machine import describe
from controller.auth import hash_token
from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.servers import ROOT, Daemon, Postgres, free_port, write_config
from tests.test_bounds_daemon import ordinary_jobs

OPERATOR = "ops-bench-token"


def _token(i: int) -> str:
    return f"tenant-{i}-bench-token"


def _tokens_text(n: int, rotation: str = "") -> str:
    lines = [f"ops operator {hash_token(OPERATOR)}\n"]
    lines += [f"tenant{i} submitter {hash_token(_token(i) + rotation)}\n" for i in range(n)]
    return "".join(lines)


def _submit(stub: Any, who: int, spec: dict[str, Any], rotation: str = "") -> tuple[float, Any]:
    """Submit ``spec`` as tenant ``who``; cancel it if admitted. (wall ms, decision)"""
    meta = (("authorization", f"Bearer {_token(who) + rotation}"),)
    started = time.perf_counter()
    reply = stub.SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(spec)), timeout=120, metadata=meta)
    ms = (time.perf_counter() - started) * 1000.0
    if reply.job.decision.admitted:
        stub.CancelJob(pb.CancelJobRequest(id=spec["id"]), timeout=120, metadata=meta)
    return ms, reply.job.decision


def _cli(address: str, *args: str) -> tuple[float, str]:
    """Run ``oasis ARGS`` as the operator: (wall s, stdout)."""
    env = {**os.environ, "OASIS_TOKEN": OPERATOR}
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "controller.cli", *args, "--server", address],
        capture_output=True, text=True, cwd=ROOT, timeout=300, env=env, check=False,
    )  # fmt: skip
    took = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"oasis {' '.join(args)}: {proc.returncode}\n{proc.stderr[-2000:]}")
    return took, proc.stdout


def _rss_mb(pid: int) -> float:
    """The resident memory of process ``pid``, MB (its VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def _wait_log(path: Path, text: str, after: int, timeout: float = 300.0) -> str:
    """The first line of ``path`` past byte ``after`` holding ``text``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(path, "rb") as f:
            f.seek(after)
            for line in f.read().decode(errors="replace").splitlines():
                if text in line:
                    return line
        time.sleep(0.02)
    raise TimeoutError(f"no {text!r} in {path}")


@contextmanager
def _store(backend: str) -> Iterator[str]:
    if backend == "sqlite":
        yield ""
        return
    server = Postgres()
    try:
        yield server.new_database()
    finally:
        server.close()


def measure(n: int, decisions: int, backend: str, tmp: Path) -> dict[str, Any]:
    """One daemon with ``n`` submitters (see the module docstring)."""
    tokens = tmp / "tokens"
    tokens.write_text(_tokens_text(n))
    out: dict[str, Any] = {"tenants": n, "backend": backend}
    with _store(backend) as url:
        config = write_config(
            tmp / "oasisd.toml", tmp / "data", store_url=url,
            extra=f'[auth]\ntokens_file = "{tokens}"\n',
        )  # fmt: skip
        log = tmp / "oasisd.log"
        daemon = Daemon(config, log).start(timeout=300)
        try:
            jobs = ordinary_jobs(n + decisions, seed=3, prefix="j")
            with grpc.insecure_channel(daemon.address) as channel:
                stub = pb_grpc.AdmissionStub(channel)
                started = time.perf_counter()
                for i in range(n):
                    _submit(stub, i, jobs[i])
                out["seed_s"] = round(time.perf_counter() - started, 2)
                walls, searches = [], []
                for k in range(decisions):
                    ms, decision = _submit(stub, k % n, jobs[n + k])
                    walls.append(ms)
                    searches.append(decision.decision_ms)
            walls.sort()
            assert daemon.proc is not None
            out["rss_mb"] = _rss_mb(daemon.proc.pid)
            out["decision_ms"] = {
                "median": round(statistics.median(walls), 2),
                "p99": round(walls[int(0.99 * (len(walls) - 1))], 2),
                "search_median": round(statistics.median(searches), 2),
            }
            for name, args in (
                ("bounds", ("bounds",)),
                ("bounds_json", ("bounds", "--json")),
                ("status", ("status",)),
            ):
                took, text = _cli(daemon.address, *args)
                out[name] = {
                    "s": round(took, 2), "bytes": len(text), "lines": text.count("\n"),
                }  # fmt: skip
            # a reload with every token rotated
            tokens.write_text(_tokens_text(n, rotation="-r"))
            at = log.stat().st_size
            assert daemon.proc is not None
            started = time.perf_counter()
            daemon.proc.send_signal(signal.SIGHUP)
            line = _wait_log(log, "config reloaded", at)
            out["reload"] = {"s": round(time.perf_counter() - started, 2), "log_bytes": len(line)}
        finally:
            daemon.stop()
        # a restart: the stored estimates read back
        started = time.perf_counter()
        daemon = Daemon(config, log).start(timeout=300)
        try:
            listening = time.perf_counter() - started
            with grpc.insecure_channel(daemon.address) as channel:
                stub = pb_grpc.AdmissionStub(channel)
                _submit(stub, 0, {**jobs[0], "id": "after-restart"}, rotation="-r")
            out["restart_s"] = {
                "listening": round(listening, 2),
                "first_decision": round(time.perf_counter() - started, 2),
            }
        finally:
            daemon.stop()
    return out


def _cpu_s(pid: int) -> float:
    """User + system CPU time of process ``pid``, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_standby(n: int, decisions: int, tmp: Path) -> dict[str, Any]:
    """Two ``[ha]`` nodes with ``n`` submitters (see the module docstring)."""
    tokens = tmp / "tokens"
    tokens.write_text(_tokens_text(n))
    out: dict[str, Any] = {"tenants": n, "backend": "postgresql", "standby": True}
    ha = "[ha]\nlease_seconds = 2\nretry_seconds = 0.25\nfollow_seconds = 0.5\n"
    with _store("postgresql") as url:
        nodes, epoch = [], time.time()  # one slot grid for both
        for k in range(2):
            config = write_config(
                tmp / f"node{k}.toml", tmp / f"data{k}", store_url=url, epoch=epoch,
                extra=f'[auth]\ntokens_file = "{tokens}"\n{ha}',
            )  # fmt: skip
            config.chmod(0o600)
            text = config.read_text().replace('"127.0.0.1:0"', f'"127.0.0.1:{free_port()}"')
            config.write_text(text)
            nodes.append(Daemon(config, tmp / f"node{k}.log"))
        try:
            nodes[0].start(timeout=300)
            time.sleep(2.0)  # it leads before the other starts
            nodes[1].start(timeout=300)
            pids = [node.proc.pid for node in nodes if node.proc is not None]
            jobs = ordinary_jobs(n + decisions, seed=3, prefix="j")
            with grpc.insecure_channel(nodes[0].address) as channel:
                stub = pb_grpc.AdmissionStub(channel)
                for i in range(n):
                    _submit(stub, i, jobs[i])
                time.sleep(3.0)
                before = [_cpu_s(p) for p in pids]
                time.sleep(10.0)
                out["idle_cpu_s_in_10s"] = {
                    "leader": round(_cpu_s(pids[0]) - before[0], 2),
                    "standby": round(_cpu_s(pids[1]) - before[1], 2),
                }
                before, started = [_cpu_s(p) for p in pids], time.perf_counter()
                for k in range(decisions):
                    _submit(stub, (7 * k) % n, jobs[n + k])
                out["decisions"] = {
                    "n": decisions,
                    "wall_s": round(time.perf_counter() - started, 2),
                    "leader_cpu_s": round(_cpu_s(pids[0]) - before[0], 2),
                    "standby_cpu_s": round(_cpu_s(pids[1]) - before[1], 2),
                }
        finally:
            for node in nodes:
                if node.proc is not None:
                    node.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", default="1,200,2000")
    parser.add_argument("--decisions", type=int, default=200)
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--standby", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = []
    for n in (int(x) for x in args.tenants.split(",")):
        with tempfile.TemporaryDirectory(prefix="oasis-tenants-") as tmp:
            if args.standby:
                results.append(measure_standby(n, args.decisions, Path(tmp)))
            else:
                results.append(measure(n, args.decisions, args.backend, Path(tmp)))
        if not args.json:
            print(json.dumps(results[-1]), flush=True)
    if args.json:
        print(json.dumps({"machine": describe(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
