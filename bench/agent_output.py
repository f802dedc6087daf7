"""The reference agent's CPU while one of its workers floods its output.

What is measured
    An in-process :class:`controller.plane.agent.Agent` runs one worker command that
    writes lines as fast as it can (``--kind counts``: ``yes 7``, a count a line;
    ``--kind logs``: ``yes`` of a 100-character log line), steps its commands every
    50 ms for ``--seconds``, and reports the agent process's own CPU seconds per
    second of wall time (``time.process_time``: the agent, not the worker) and the
    lines the agent read. The agent's CPU is taken from the server's other tenants'
    workers; a worker's output is its own business only up to a budget.

Run with
    .venv/bin/python -m bench.agent_output [--seconds 5] [--kind counts|logs] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from bench.machine import describe
from controller.plane.agent import Agent
from controller.plane.settings import MqttConfig
from controller.plane.topics import Plan, SlotPlan, Task

_COMMANDS = {"counts": "exec yes 7", "logs": "exec yes " + "x" * 99}


def measure(seconds: float, kind: str) -> dict[str, float]:
    """``{"cpu_per_s": ..., "lines_per_s": ...}`` of one agent following one flooding
    worker for ``seconds``."""
    now = [101.0]
    task = Task("a", 1, 0, 0.5, 10**9)
    plan = Plan("w0", "worker", 1, 1e6, 0.5, False, SlotPlan(5, 100.0, [task]),
                SlotPlan(6, 100.0 + 1e6, []))  # fmt: skip
    agent = Agent("w0", MqttConfig("localhost"), command=_COMMANDS[kind], wall=lambda: now[0])
    agent.accept(plan)
    lines = [0]
    read = agent._read_counts

    async def counting(
        stream: asyncio.StreamReader, count: list[float], budget: Any = None
    ) -> None:
        real = stream.readuntil

        async def readuntil(separator: bytes = b"\n") -> bytes:
            lines[0] += 1
            return await real(separator)

        stream.readuntil = readuntil  # type: ignore[method-assign,assignment]
        # (an older agent's reader takes no budget: the same script measures it)
        await (read(stream, count) if budget is None else read(stream, count, budget))

    agent._read_counts = counting  # type: ignore[method-assign]

    async def go() -> dict[str, float]:
        commands = agent.commands
        assert commands is not None
        commands.read_counts = counting
        await agent._commands(0.0)
        await asyncio.sleep(0.5)  # started
        cpu0, wall0, lines0 = time.process_time(), time.monotonic(), lines[0]
        while time.monotonic() - wall0 < seconds:
            await asyncio.sleep(0.05)
            await agent._commands(0.05)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        counted = lines[0] - lines0
        commands.stop_grace = 0.5
        await commands.stop_all()
        return {"cpu_per_s": cpu / wall, "lines_per_s": counted / wall}

    return asyncio.run(go())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--kind", choices=sorted(_COMMANDS), default="counts")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = {**measure(args.seconds, args.kind), "kind": args.kind, "machine": describe()}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.kind}: agent CPU {result['cpu_per_s']:.3f} s/s, "
              f"{result['lines_per_s']:,.0f} lines/s read")  # fmt: skip


if __name__ == "__main__":
    main()
