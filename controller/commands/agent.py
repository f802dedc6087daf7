"""``oasis agent --server NAME``: the reference node agent (controller/plane/agent.py)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from typing import Any

from controller.commands.common import EXIT_OK, InputError

__all__ = ["register"]


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "agent",
        help="run a node agent: follow a server's plan, report progress",
        description="Follow the plan the daemon publishes for one server over MQTT and report "
        "heartbeats and progress: simulated training at --speed times the planned pace, or "
        "--command run once per worker. Runs until interrupted; logs are JSON lines.",
    )
    p.add_argument("--server", required=True, metavar="NAME", help="the server, as configured")
    p.add_argument("--broker", metavar="URL", default=os.environ.get("OASIS_BROKER", ""),
                   help="mqtt://host:port (default: $OASIS_BROKER, else [mqtt] of --config, "
                   "else mqtt://127.0.0.1:1883)")  # fmt: skip
    p.add_argument("--config", metavar="FILE", help="take the broker from this oasisd config")
    p.add_argument("--topic-prefix", metavar="P", help="topic prefix (default: oasis)")
    p.add_argument("--speed", type=float, default=1.0,
                   help="simulated pace relative to the plan (default 1)")  # fmt: skip
    p.add_argument("--command", default="", metavar="CMD",
                   help="shell command per worker; prints its cumulative mini-batches")  # fmt: skip
    p.add_argument("--report-seconds", type=float, default=1.0, metavar="S",
                   help="progress report interval (default 1)")  # fmt: skip
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=_agent)


def _agent(args: argparse.Namespace) -> int:
    from controller import logs
    from controller.config import ConfigError, load
    from controller.plane.agent import Agent
    from controller.plane.settings import MqttConfig, mqtt_from_dict
    from pricing.errors import SpecError

    mqtt: MqttConfig | None = None
    try:
        if args.broker:
            mqtt = mqtt_from_dict({"url": args.broker})
        elif args.config:
            mqtt = load(args.config).mqtt
            if mqtt is None:
                raise InputError(f"{args.config}: has no [mqtt] table")
        else:
            mqtt = mqtt_from_dict({"url": "mqtt://127.0.0.1:1883"})
        if args.topic_prefix:
            assert mqtt is not None
            mqtt = mqtt_from_dict({"host": mqtt.host, "port": mqtt.port,
                                   "topic_prefix": args.topic_prefix})  # fmt: skip
    except (SpecError, ConfigError) as err:
        raise InputError(str(err)) from err
    if args.speed <= 0:
        raise InputError(f"--speed: must be > 0, got {args.speed}")
    if args.report_seconds <= 0:
        raise InputError(f"--report-seconds: must be > 0, got {args.report_seconds}")
    assert mqtt is not None
    logs.configure(args.log_level)
    agent = Agent(args.server, mqtt, args.speed, args.command, args.report_seconds)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(agent.run())
    return EXIT_OK
