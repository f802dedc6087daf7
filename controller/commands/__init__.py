"""The ``oasis`` subcommands, one module each (``controller/cli.py`` loads the one run).

:data:`COMMANDS` maps each command to its module and the line ``oasis --help`` shows.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["COMMANDS", "SUMMARIES", "Command"]


class Command(NamedTuple):
    """Where a command lives and the line ``oasis --help`` shows for it."""

    module: str
    summary: str


_CLIENT = "controller.commands.client"
COMMANDS: dict[str, Command] = {
    "replay": Command(
        "controller.commands.replay", "decide every job of a trace with the online algorithm"
    ),
    "offline": Command(
        "controller.commands.offline",
        "the offline optimum (or a certified bound) of a trace against the online replay",
    ),
    "gen": Command(
        "controller.commands.gen",
        "generate a seeded synthetic trace in the paper's simulation setting",
    ),
    "calibrate": Command(
        "controller.commands.calibrate",
        "write a prior for the price-bound estimate from a trace or a daemon's store",
    ),
    "submit": Command(_CLIENT, "submit a job (or a list of jobs) and print the decision"),
    "quote": Command(_CLIENT, "price a job without committing anything"),
    "jobs": Command(_CLIENT, "list jobs"),
    "job": Command(_CLIENT, "show one job with its plan"),
    "cancel": Command(_CLIENT, "cancel a job; its future slots are released"),
    "servers": Command(_CLIENT, "list servers with their state, capacity and current use"),
    "cordon": Command(
        "controller.commands.cordon",
        "take servers out of service from the next slot on; their jobs move (operators)",
    ),
    "uncordon": Command(
        "controller.commands.cordon", "put cordoned servers back in service (operators)"
    ),
    "prices": Command(_CLIENT, "unit prices per server and resource over the next slots"),
    "watch": Command(_CLIENT, "print decisions and state changes as they happen"),
    "status": Command(
        "controller.commands.status",
        "one screen: cluster use, price heat by server, jobs in flight",
    ),
    "bounds": Command(
        "controller.commands.bounds",
        "the price bounds U and L per resource and how they were set; reset, pin, unpin",
    ),
    "progress": Command(
        "controller.commands.progress",
        "a job's reported progress and its runtime estimate with a credible interval",
    ),
    "agent": Command(
        "controller.commands.agent", "run a node agent: follow a server's plan, report progress"
    ),
    "store": Command(
        "controller.commands.store",
        "copy a whole store into another database, e.g. SQLite to PostgreSQL (daemon stopped)",
    ),
    "token": Command(
        "controller.commands.token",
        "make a bearer token and the tokens-file line for oasisd's [auth]",
    ),
}
SUMMARIES = {name: c.summary for name, c in COMMANDS.items()}
