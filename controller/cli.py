"""``oasis``: the command-line client and tools.

Each command lives in ``controller/commands/<name>.py`` with a ``register(subparsers)``
that adds its parser and sets ``func``. Exit status: 0 on success, 2 on bad input (the
message names the field), 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from controller.commands import (
    agent,
    calibrate,
    client,
    common,
    gen,
    offline,
    progress,
    replay,
    status,
    token,
)

__all__ = ["build_parser", "main"]

COMMANDS = (replay, offline, gen, calibrate, client, status, progress, agent, token)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oasis", description="Online admission control for shared ML clusters (OASiS)."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except common.InputError as err:
        print(f"oasis {args.command}: {err}", file=sys.stderr)
        return common.EXIT_BAD_INPUT
    except BrokenPipeError:
        return common.EXIT_FAILURE
    return code


def _run() -> None:  # pragma: no cover - console entry
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    _run()
