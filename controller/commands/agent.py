"""``oasis agent --node NAME``: the reference node agent (controller/plane/agent.py).

``--node`` names the server of the cluster the agent runs on. Before it was called
``--server``, which every other command uses for the daemon's address; ``--server`` is
now refused with a message saying so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import sys
import urllib.parse
from typing import TYPE_CHECKING, Any

from controller.commands import SUMMARIES
from controller.commands.common import EXIT_OK, InputError, warn_visible_password
from controller.plane.workers import MAX_STOP_GRACE, STOP_GRACE

MIN_REPORT_SECONDS = 0.1
"""The shortest report interval: 10 reports a second, under the daemon's rate of 20
messages a second per agent (controller.plane.link), heartbeats included."""

if TYPE_CHECKING:
    from controller.plane.agent import Agent
    from controller.plane.memory_guard import MemoryGuard
    from controller.plane.settings import MqttConfig

__all__ = ["broker_settings", "register", "run_agent"]


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "agent",
        help=SUMMARIES["agent"],
        description="Follow the plan the daemon publishes for one server over MQTT and report "
        "heartbeats and progress: simulated training at --speed times the planned pace, or "
        "--command run once per worker. Runs until interrupted; logs are JSON lines. A broker "
        "with passwords and TLS: --broker mqtts://host:8883 --mqtt-username NAME "
        "--mqtt-tls-ca CA.pem, the password in $OASIS_MQTT_PASSWORD or --mqtt-password-file.",
    )
    p.add_argument("--node", metavar="NAME", help="this node: the server's name in the cluster")
    p.add_argument("--server", dest="old_server", metavar="NAME", help=argparse.SUPPRESS)
    p.add_argument("--broker", metavar="URL", default=os.environ.get("OASIS_BROKER", ""),
                   help="mqtt://[user[:pass]@]host:port, mqtts://... for TLS (default: "
                   "$OASIS_BROKER, else [mqtt] of --config, else mqtt://127.0.0.1:1883)",
                   )  # fmt: skip
    p.add_argument("--config", metavar="FILE", help="take the broker from this oasisd config")
    p.add_argument("--topic-prefix", metavar="P", help="topic prefix (default: oasis)")
    p.add_argument("--mqtt-username", metavar="NAME", default=os.environ.get("OASIS_MQTT_USERNAME"),
                   help="broker user name (default: $OASIS_MQTT_USERNAME, else the one in "
                   "--broker mqtt://user:pass@host or --config)")  # fmt: skip
    p.add_argument("--mqtt-password-file", metavar="FILE",
                   help="read the broker password from FILE (first line); else "
                   "$OASIS_MQTT_PASSWORD; keeps it off the command line")  # fmt: skip
    # from the environment too: the unit's EnvironmentFile gives a site's own CA
    p.add_argument("--mqtt-tls-ca", metavar="FILE",
                   default=os.environ.get("OASIS_MQTT_TLS_CA") or None,
                   help="CA certificate (PEM) to verify the broker; turns TLS on "
                   "(mqtts:// in --broker does too, with the system's CAs) (default: "
                   "$OASIS_MQTT_TLS_CA)")  # fmt: skip
    p.add_argument("--speed", type=float, default=1.0,
                   help="simulated pace relative to the plan (default 1)")  # fmt: skip
    # dest: "command" is the subcommand's name, which error messages show
    p.add_argument("--command", dest="worker_command", default=None, metavar="CMD",
                   help="shell command per worker; prints its cumulative mini-batches")  # fmt: skip
    p.add_argument("--report-seconds", type=float, default=1.0, metavar="S",
                   help="progress report interval (default 1)")  # fmt: skip
    p.add_argument("--stop-grace", type=float, default=STOP_GRACE, metavar="S",
                   help="seconds a worker leaving the plan has between SIGTERM and SIGKILL; "
                        f"no other worker starts meanwhile (default {STOP_GRACE:g})")  # fmt: skip
    p.add_argument("--devices", metavar="IDS",
                   help="the server's GPUs to hand to workers, comma-separated (0,1,2,3 or "
                   "GPU-... names); each worker gets its own in CUDA_VISIBLE_DEVICES "
                   "(default: the agent's own $CUDA_VISIBLE_DEVICES, else 0 .. n-1 of "
                   "the n the daemon's cluster gives the server)")  # fmt: skip
    p.add_argument("--memory-resource", metavar="NAME=UNIT",
                   help="stop a worker whose resident memory is over its job's demand of "
                   "resource NAME, in UNIT (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB: that of "
                   "the cluster's capacities), times 1.10 plus 64 MiB; it is started again "
                   "after a back-off (e.g. mem=GB; default: no limit)")  # fmt: skip
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=_agent)


def _agent(args: argparse.Namespace) -> int:
    from controller import logs
    from controller.plane.agent import Agent, UnknownServerError
    from controller.plane.one_agent import AgentRunningError, agent_key, hold_server

    if args.old_server is not None:
        raise InputError(
            f"--server now names the daemon's address in every command; the node flag of "
            f"the agent is --node: oasis agent --node {args.old_server} ..."
        )
    if not args.node:
        raise InputError("--node NAME is required: the server this agent runs on")
    mqtt = broker_settings(args)
    if not (0 < args.speed < math.inf):  # nan and inf: every job done at once
        raise InputError(f"--speed: must be a number > 0, got {args.speed}")
    if not (MIN_REPORT_SECONDS <= args.report_seconds < math.inf):  # nan: the loop spins
        raise InputError(f"--report-seconds: must be a number >= {MIN_REPORT_SECONDS} (the "
                         f"daemon drops an agent's messages past 20 a second), got "
                         f"{args.report_seconds}")  # fmt: skip
    if args.worker_command is not None and not args.worker_command.strip():
        # the unit's ${OASIS_WORKER_COMMAND} unset: an empty word, and the agent
        # simulated its jobs, completing them with no work done (the re-audit)
        raise InputError("--command: is empty (is OASIS_WORKER_COMMAND set in the agent's "
                         "environment file?); leave the flag out to simulate")  # fmt: skip
    if not (0 <= args.stop_grace <= MAX_STOP_GRACE):  # nan: never killed
        raise InputError(f"--stop-grace: must be a number of seconds from 0 to "
                         f"{MAX_STOP_GRACE:g}, got {args.stop_grace}")  # fmt: skip
    devices, devices_from = _device_ids(args.devices)
    guard = _memory_guard(args.memory_resource, args.worker_command)
    try:  # before anything of the agent runs: it would stop the other's workers
        key = agent_key(mqtt.host, mqtt.port, mqtt.topic_prefix, args.node)
        held, unguarded = hold_server(key, mqtt.host, mqtt.port, mqtt.topic_prefix, args.node)
    except AgentRunningError as err:
        raise InputError(str(err)) from err
    if unguarded:
        print(f"oasis: warning: {unguarded}", file=sys.stderr)
    logs.configure(args.log_level)
    try:
        agent = Agent(args.node, mqtt, args.speed, args.worker_command or "", args.report_seconds,
                      stop_grace=args.stop_grace, adopt_orphans=True, devices=devices,
                      devices_from=devices_from, key=key, memory_guard=guard)  # fmt: skip
    except ValueError as err:
        raise InputError(f"--node: {err}") from err
    try:
        run_agent(agent)
    except UnknownServerError as err:
        raise InputError(str(err)) from err
    finally:
        if held is not None:
            held.close()
    return EXIT_OK


def _memory_guard(flag: str | None, command: str | None) -> MemoryGuard | None:
    """The guard of ``--memory-resource`` (None without it); InputError naming the flag
    for a unit not known, a name no plan carries, or no ``--command`` (the simulation
    runs no process to guard)."""
    from controller.plane.memory_guard import parse_memory_resource

    if flag is None:
        return None
    if command is None:
        raise InputError("--memory-resource: needs --command (the simulation runs no worker "
                         "processes)")  # fmt: skip
    try:
        return parse_memory_resource(flag)
    except ValueError as err:
        raise InputError(f"--memory-resource: {err}") from err


def _device_ids(flag: str | None) -> tuple[list[str] | None, str]:
    """``(ids, where from)``: those of ``--devices``, else those the agent's own
    ``$CUDA_VISIBLE_DEVICES`` lets it use, read as CUDA reads it (up to the first id
    that is none, such as ``-1``; its workers' are among them); None: neither, the
    plan's count decides. InputError naming the flag for ids that cannot be."""
    from controller.plane.devices import parse_device_ids, visible_devices

    if flag is not None:
        try:
            ids = parse_device_ids(flag)
        except ValueError as err:
            raise InputError(f"--devices: {err}") from err
        if not ids:
            raise InputError("--devices: is empty; leave it out to hand out the plan's devices")
        return ids, "--devices"
    own = os.environ.get("CUDA_VISIBLE_DEVICES")
    if own is None:
        return None, "the plan"
    ids = visible_devices(own)
    if not ids:
        print(f"oasis: warning: $CUDA_VISIBLE_DEVICES={own[:80]!r} lets this agent use no "
              "device, so its workers get none; give --devices, or unset it",
              file=sys.stderr)  # fmt: skip
    return ids, "$CUDA_VISIBLE_DEVICES"


def run_agent(agent: Agent) -> None:
    """Run ``agent`` until SIGINT (Ctrl-C) or SIGTERM, then stop its worker commands.

    Either signal asks the agent to stop (:class:`~controller.plane.client.Stopping`)
    and cancels it, and it stops every worker command it started (each in its own
    session, so nothing else would); a second signal kills them at once. Before,
    SIGTERM (``kill``, a service manager's stop) ended the agent at once and left its
    workers running on the server, holding its GPUs while the daemon planned other
    tenants' jobs there (the CLI audit)."""

    async def until_stopped() -> None:
        main = asyncio.current_task()
        assert main is not None

        def stop() -> None:
            agent.stopping.ask()  # seen by its loops if the cancel is lost
            main.cancel()

        for sig in (signal.SIGTERM, signal.SIGINT):  # SIGINT: not asyncio's own handler,
            # whose cancel alone a broker's acknowledgement could lose
            asyncio.get_running_loop().add_signal_handler(sig, stop)
        with contextlib.suppress(asyncio.CancelledError):
            await agent.run()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(until_stopped())


def broker_settings(args: argparse.Namespace) -> MqttConfig:
    """The broker settings of ``oasis agent``: --broker (else --config, else the local
    default) with the credential, CA and prefix flags applied, every value checked as in
    the ``[mqtt]`` table; InputError naming the flag otherwise."""
    from controller.config_file import ConfigError, load_mqtt
    from controller.plane.settings import mqtt_from_dict, override
    from pricing.errors import SpecError

    if args.broker and args.broker != os.environ.get("OASIS_BROKER"):
        with contextlib.suppress(ValueError):  # a bad URL is named below
            if urllib.parse.urlsplit(args.broker).password:
                warn_visible_password(
                    "--broker", "$OASIS_MQTT_PASSWORD or --mqtt-password-file FILE"
                )
    try:
        given = _security_flags(args)
        if args.broker or not args.config:
            url = args.broker or "mqtt://127.0.0.1:1883"
            mqtt = mqtt_from_dict({"url": url, **given})
            assert mqtt is not None  # a table with a url is never empty
            return mqtt
        mqtt = load_mqtt(args.config)
        if mqtt is None:
            raise InputError(f"{args.config}: has no [mqtt] table")
        if mqtt.username and "username" not in given and mqtt.username != args.node:
            print(f"oasis: warning: logging in to the broker as {mqtt.username!r}, the user "
                  f"of {args.config}'s [mqtt]: the daemon's, which the broker's ACL lets "
                  f"publish every server's plans; give this node's own: --mqtt-username "
                  f"{args.node or 'NODE'} and its password", file=sys.stderr)  # fmt: skip
        return override(mqtt, given)  # the flags win over the file
    except (SpecError, ConfigError) as err:
        if isinstance(err, SpecError) and err.field in _FLAGS:
            raise InputError(f"{_FLAGS[err.field]}: {err.reason}") from err
        raise InputError(str(err)) from err


# the [mqtt] keys the agent's flags give, for error messages in the flags' words
_FLAGS = {
    "mqtt.url": "--broker",
    "mqtt.username": "--mqtt-username",
    "mqtt.password": "--mqtt-password-file or $OASIS_MQTT_PASSWORD",
    "mqtt.tls_ca": "--mqtt-tls-ca",
    "mqtt.topic_prefix": "--topic-prefix",
}


def _security_flags(args: argparse.Namespace) -> dict[str, str]:
    """The ``[mqtt]`` keys given by flags or the environment (only those given).

    The password has no flag of its own but comes from a file or ``$OASIS_MQTT_PASSWORD``:
    a command line is visible to every user of the machine (``ps``)."""
    given: dict[str, str] = {}
    if args.mqtt_username:
        given["username"] = args.mqtt_username
    if args.mqtt_password_file:
        try:
            with open(args.mqtt_password_file, encoding="utf-8") as f:
                given["password"] = f.readline().rstrip("\r\n")
        except OSError as err:
            raise InputError(f"--mqtt-password-file: {err.strerror or err}") from err
        if not given["password"]:
            raise InputError(
                f"--mqtt-password-file: first line of {args.mqtt_password_file} is empty"
            )
    elif os.environ.get("OASIS_MQTT_PASSWORD"):
        given["password"] = os.environ["OASIS_MQTT_PASSWORD"]
    if args.mqtt_tls_ca:
        given["tls_ca"] = args.mqtt_tls_ca
    if args.topic_prefix:
        given["topic_prefix"] = args.topic_prefix
    return given
