"""``oasis``: the command-line client and tools.

Each command lives in ``controller/commands/<module>.py`` with a ``register(subparsers)``
that adds its parser and sets ``func``. Only the module of the command being run is
imported: the client commands then start without SQLAlchemy, Alembic, numba or numpy
(bench/client_startup.py measures it), and ``oasis --help`` lists the commands from
:data:`controller.commands.COMMANDS` alone.

Exit status: 0 on success (a job admitted), 3 when a job is rejected (``submit``,
``quote``), 4 when ``submit --wait`` left a job pending (none rejected), 2 on bad input
(the message names the field), 1 otherwise (the daemon unreachable or stopping, a job
not found, ...).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from controller.commands import COMMANDS, common
from controller.terminal import guarded

__all__ = ["COMMANDS", "build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse, whose usage errors keep the ``--json`` contract when the command line
    asks for JSON: one error object on stdout (``{"error": {"code": "INVALID_ARGUMENT",
    ...}}``), exit 2, as every other error of a command with ``--json``."""

    json_errors = False
    secrets: tuple[str, ...] = ()  # the command line's --token values: never echoed
    misplaced = ""  # a command's option given before the command (`oasis --server H jobs`)
    command = ""  # the command named, if any

    def error(self, message: str) -> NoReturn:
        hinted = False
        for secret in _Parser.secrets:
            # argparse quotes a word it refuses, or names a whole --token=T it does not know
            shown = [w for w in (repr(secret), f"={secret}") if w in message]
            for word in shown:
                message = message.replace(word, "'***'" if word[0] == "'" else "=***")
            if shown:
                hinted = True
                message += (
                    " (--token goes after the command: oasis jobs --token TOKEN, or set "
                    "$OASIS_TOKEN)"
                )
        if _Parser.misplaced in _client_options() and not hinted:
            # `oasis --server H jobs` read H as the command: say where the option goes
            command = _Parser.command or "COMMAND"
            message += (
                f" ({_Parser.misplaced} goes after the command: oasis {command} "
                f"{_Parser.misplaced} ...; oasis {command} --help lists its options)"
            )
        if _Parser.json_errors:
            field, reason = _usage_field(message)
            problems = [{"field": field, "message": reason}] if field else []
            error = {"code": "INVALID_ARGUMENT", "message": f"{self.prog}: {message}",
                     "field": field, "problems": problems}  # fmt: skip
            print(json.dumps({"error": error}, indent=1))
            sys.exit(common.EXIT_BAD_INPUT)
        super().error(message)


def _usage_field(message: str) -> tuple[str, str]:
    """The option or argument an argparse usage error is about, and why, for the
    ``--json`` error's ``field`` (``"--jobs"``, ``"TRACE"``, an unknown ``"--bounds"``);
    ``("", message)`` when it names none or several (a machine reads ``field`` as the one)."""
    named = re.fullmatch(r"argument ([^:\s]+(?:/[^:\s]+)*): (.+)", message, re.DOTALL)
    if named:
        return named[1].split("/")[-1], named[2]
    required = "the following arguments are required: "
    if message.startswith(required) and ", " not in message:
        return message[len(required) :], "required"
    unknown = "unrecognized arguments: "
    if message.startswith(unknown):
        return message[len(unknown) :].split(" ", maxsplit=1)[
            0
        ], "not an option or argument of the command"
    return "", message


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``oasis`` parser. With ``only`` (a command name), only that command's module is
    imported and registered in full; every other command gets a stand-in that shows its
    summary in ``oasis --help``. Without it every module is loaded."""
    parser = _Parser(
        prog="oasis", description="Online admission control for shared ML clusters (OASiS)."
    )
    parser.add_argument("--version", action="version", version=f"oasis {common.version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = [COMMANDS[only].module] if only in COMMANDS else []
    if only is None:
        wanted = list(dict.fromkeys(c.module for c in COMMANDS.values()))
    for module in wanted:
        importlib.import_module(module).register(sub)
    for name, command in COMMANDS.items():
        if name not in sub.choices:
            sub.add_parser(name, help=command.summary, description=command.summary)
    return parser


def _token_values(argv: Sequence[str]) -> list[str]:
    """The values the command line gives ``--token`` (or an abbreviation argparse takes:
    ``--tok``), in ``--token T`` or ``--token=T`` form."""
    out = []
    for i, word in enumerate(argv):
        flag, equals, value = word.partition("=")
        if len(flag) < 4 or not "--token".startswith(flag):
            continue
        if equals:
            out.append(value)
        elif i + 1 < len(argv):
            out.append(argv[i + 1])
    return [v for v in out if v]


def _command_of(argv: Sequence[str]) -> str:
    """The command named on the command line: its first word not starting with ``-``."""
    return next((a for a in argv if not a.startswith("-")), "")


def _misplaced(argv: Sequence[str]) -> tuple[str, str]:
    """The option the command line starts with (``--server`` in ``oasis --server H
    jobs``, where argparse named ``H`` an invalid command), and the command named, if
    any."""
    command = next((a for a in argv if a in COMMANDS), "")
    first = argv[0].partition("=")[0] if argv else ""
    return (first if first.startswith("--") else ""), command


def _client_options() -> set[str]:
    """The options every command that talks to the daemon takes (``--server``,
    ``--json``, ``--token``, ...); read on a usage error only (it imports gRPC)."""
    from controller.commands.connection import options

    return {flag for action in options()._actions for flag in action.option_strings}


_TRACE_TOOLS = frozenset({"replay", "offline", "calibrate", "gen"})
"""Commands whose --json output is SPEC 6's document: their errors go to standard error
(controller/commands/connection.py)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its output shows what it prints and never acts on the terminal
    (:mod:`controller.terminal`)."""
    for name in ("stdout", "stderr"):  # closed (`oasis jobs >&-`): Python leaves None
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))  # noqa: SIM115 - for the process
    words = list(sys.argv[1:] if argv is None else argv)
    with guarded():
        try:
            return _main(words)
        except KeyboardInterrupt as err:  # before the command ran: its imports (seconds)
            return _stopped(_command_of(words), err)


def _stopped(command: str, err: BaseException) -> int:
    """Say that Ctrl-C (or SIGTERM: :class:`~controller.commands.common.Terminated`)
    ended ``command`` and return its status, 130 (143). ``err`` is the KeyboardInterrupt,
    or an exception it caused (:func:`_interrupt_in`)."""
    name = f"oasis {command}" if command in COMMANDS else "oasis"
    if isinstance(_interrupt_in(err), common.Terminated):
        print(f"{name}: terminated", file=sys.stderr)
        return common.EXIT_TERMINATED
    print(f"{name}: interrupted", file=sys.stderr)
    return common.EXIT_INTERRUPTED


def _interrupt_in(err: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C (or SIGTERM) that caused ``err``, if one did. A signal that arrives
    while a numba-compiled function calls back into Python (to unpickle a constant)
    comes out as ``SystemError: CPUDispatcher(<function _runs ...>) returned a result
    with an exception set``, caused by the KeyboardInterrupt through more SystemErrors:
    Ctrl-C early in `oasis offline` ended with that traceback, status 1 (2 of 60 replays
    of a 2,000-job trace interrupted at random, the replay audit)."""
    seen: BaseException | None = err
    for _ in range(100):  # a chain of causes, never a cycle
        if seen is None or isinstance(seen, KeyboardInterrupt):
            return seen
        seen = seen.__cause__
    return None


def _main(argv: list[str]) -> int:
    _Parser.json_errors = "--json" in argv
    _Parser.secrets = tuple(_token_values(argv))
    _Parser.misplaced, _Parser.command = _misplaced(argv)
    args = build_parser(_command_of(argv)).parse_args(argv)
    # SIGTERM ends a command as Ctrl-C does (its clean-up runs), where nothing else
    # handles it (a test's process, the agent's own loop: theirs stay)
    main_thread = threading.current_thread() is threading.main_thread()
    term = signal.getsignal(signal.SIGTERM) if main_thread else None
    if term == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, common.on_sigterm)
    try:
        code: int = args.func(args)
        sys.stdout.flush()  # a write that fails (a full disk) fails here, not at exit
    except common.InputError as err:
        if getattr(args, "json", False) and args.command not in _TRACE_TOOLS:
            # --json: the error is JSON too (``token``; the daemon's commands report it
            # themselves); the trace tools keep standard output for SPEC 6's document
            from controller.commands.connection import report_error

            return report_error(args, "INVALID_ARGUMENT", str(err), err.problems, err.extra,
                                err.about)  # fmt: skip
        print(f"oasis {args.command}: {err}", file=sys.stderr)
        return common.EXIT_BAD_INPUT
    except BrokenPipeError:
        return common.EXIT_FAILURE
    except KeyboardInterrupt as err:  # Ctrl-C: a line, not a traceback; the shell's status
        return _stopped(args.command, err)  # SIGTERM (Terminated): its own word and status
    except SystemError as err:  # numba's wrapping of either
        if _interrupt_in(err) is None:
            raise
        return _stopped(args.command, err)
    except OSError as err:  # its output: a full disk (`oasis replay > out.json`), ...
        where = f" ({err.filename})" if err.filename else ""
        print(f"oasis {args.command}: {err.strerror or err}{where}", file=sys.stderr)
        return common.EXIT_FAILURE
    except MemoryError:  # a trace's horizon or a model too large for this machine
        print(f"oasis {args.command}: out of memory (a trace's horizon x servers, or the "
              "model built from it, is too large for this machine's memory)",
              file=sys.stderr)  # fmt: skip
        return common.EXIT_FAILURE
    finally:
        if term == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return code


def _run() -> None:  # pragma: no cover - console entry
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    _run()
