"""What every ``oasis`` command shares: exit codes, input errors, reading a trace."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controller.files import read_bounded, write_whole
from pricing.durations import DURATION_EXAMPLES, parse_duration
from pricing.errors import Problem
from pricing.fields import DuplicateKeyError, unique_object
from pricing.json_mistakes import json_problem

if TYPE_CHECKING:  # the client commands never read traces: no numpy at their start
    from pricing.trace import Trace

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "INT32_MAX",
    "INT64_MAX",
    "InputError",
    "Terminated",
    "add_search_limit",
    "ascii_number",
    "call_timeout",
    "check_store_url",
    "check_total_utility",
    "counted",
    "few",
    "fmt",
    "int_at_least",
    "json_document",
    "load_prior_file",
    "load_trace",
    "machine_memory",
    "on_sigterm",
    "positive_seconds",
    "problem_lines",
    "quiet_native_stdout",
    "read_json",
    "same_file",
    "seconds_of",
    "store_url",
    "version",
    "warn_visible_password",
    "write_output",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
"""Ctrl-C (SIGINT), as a shell reports a command it ended: 128 + 2."""
EXIT_TERMINATED = 143
"""SIGTERM (``timeout``, a batch scheduler's limit, ``kill``): 128 + 15."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt, so a command ends the same
    way: its clean-up runs (a solver's temporary folder, a CBC child) and it says so in
    a line, status :data:`EXIT_TERMINATED`. Before, ``timeout 60 oasis offline`` ended
    with no word and left CBC's 2.6 MB model file in ``/tmp``."""


def on_sigterm(signum: int, frame: Any) -> None:
    """A SIGTERM handler: raise :class:`Terminated` in the main thread."""
    raise Terminated


MAX_PROBLEM_LINES = 20
"""Problems of one input said on the terminal at most."""


def problem_lines(problems: Iterable[Problem], more: str = "", unlisted: int = 0) -> str:
    """One indented line per problem, the first :data:`MAX_PROBLEM_LINES`, then how many
    more there are (and ``more``: where to find them, e.g. ``--json``). A trace whose
    every job misses one key has as many problems as jobs: all of them were printed,
    200,000 lines for a trace of 10^5 servers named twice. ``unlisted`` counts problems
    found beyond ``problems`` (``SpecError.more``): a trace of 1,000 bad jobs, cut to 50
    problems and a line for the rest, said "... and 31 more"."""
    listed = list(problems)
    lines = [f"  {p}" for p in listed[:MAX_PROBLEM_LINES]]
    left = max(len(listed) - MAX_PROBLEM_LINES, 0) + unlisted
    if left > 0:
        lines.append(f"  ... and {left:,} more" + (f" ({more})" if more else ""))
    return "\n".join(lines)


class InputError(Exception):
    """Input the command cannot use; the message is shown as is.

    Attributes:
        problems: the bad fields, when the input is a job or a trace.
        about: with ``--json``, keys added to each problem's object, in order (a list
            of jobs: ``{"item": 2, "id": "train-b"}``); empty: none.
        extra: with ``--json``, top-level keys next to ``error``.
    """

    def __init__(
        self,
        message: str,
        problems: Iterable[Problem] = (),
        about: Iterable[dict[str, Any]] = (),
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.problems = tuple(problems)
        self.about = tuple(about)
        self.extra = extra or {}


MAX_INPUT_BYTES = 512 << 20
"""The most a JSON input (a trace, a job file) is read: ``oasis replay /dev/zero`` read
until the machine ran out of memory (24 GB). A trace of 10^6 jobs is about 300 MB."""


def read_json(path: str, what: str = "", limit: int | None = None) -> Any:
    """A JSON file (``-``: standard input; a pipe too: ``<(oasis gen ...)``); InputError
    saying why not: unreadable, more than ``limit`` bytes (None:
    :data:`MAX_INPUT_BYTES`), not UTF-8, not JSON, or JSON Python cannot hold (nested
    too deeply, an integer of thousands of digits)."""
    name = what or path
    limit = MAX_INPUT_BYTES if limit is None else limit
    try:
        if path == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(limit + 1)
    except OSError as err:
        raise InputError(f"{name}: cannot read: {err.strerror or err}") from err
    if len(data) > limit:
        raise InputError(
            f"{name}: more than {limit:,} bytes, the most read (a device or another file "
            f"than meant?)"
        )
    return _parsed(data, name)


_COMPRESSED = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"BZh", "bzip2"),
               (b"\xfd7zXZ\x00", "xz"), (b"PK\x03\x04", "zip"))  # fmt: skip
"""Magic numbers of compressed files: a week's trace kept as ``week.json.gz`` was refused
as "not UTF-8 text: invalid start byte at byte 1", which does not say why."""


def _parsed(data: bytes, name: str) -> Any:
    """``data`` as JSON; InputError naming ``name`` and why not (a key given twice in
    one object included: :func:`pricing.fields.unique_object`)."""
    try:
        # utf-8-sig: a byte-order mark, as some Windows editors write, is no error
        return json.loads(data.decode("utf-8-sig"), object_pairs_hook=unique_object)
    except DuplicateKeyError as err:  # json alone keeps the last value without a word
        raise InputError(f"{name}: {err}") from err
    except UnicodeDecodeError as err:
        packed = next((k for m, k in _COMPRESSED if data.startswith(m)), None)
        hint = f" ({packed}-compressed: decompress it first)" if packed else ""
        raise InputError(f"{name}: not UTF-8 text: {err.reason} at byte {err.start}{hint}") from err
    except json.JSONDecodeError as err:
        raise InputError(f"{name}: not JSON: {json_problem(err)}") from err
    except RecursionError as err:
        raise InputError(f"{name}: JSON nested too deeply to read") from err
    except ValueError as err:  # an integer past Python's digit limit (its message tells
        # a programmer to call sys.set_int_max_str_digits: not the user's remedy)
        digits = sys.get_int_max_str_digits()
        raise InputError(
            f"{name}: JSON that cannot be read: an integer of more than {digits} digits"
        ) from err


def load_prior_file(path: Path, what: str) -> Any:
    """The JSON of a prior file (``oasis calibrate`` writes one), at most
    ``MAX_PRIOR_BYTES`` read: a trace names its prior, so the trace's author chooses the
    path, and a device or a pipe would be read without end (or wait for a writer)."""
    from pricing.bound_prior import MAX_PRIOR_BYTES  # numpy: not for every client command

    try:
        data = read_bounded(path, MAX_PRIOR_BYTES)
    except OSError as err:
        raise InputError(f"{what}: cannot read {path}: {err.strerror or err}") from err
    return _parsed(data, f"{what} ({path})")


def check_total_utility(path: str, trace: Trace) -> None:
    """InputError if the jobs' best utilities sum past the largest float
    (:func:`pricing.trace.total_utility_problem`), as an invalid trace is named."""
    from pricing.trace import total_utility_problem

    problems = total_utility_problem(trace.jobs)
    if problems:
        raise InputError(f"{path}: invalid trace:\n{problem_lines(problems)}", problems)


def json_document(doc: Any, compact: bool = False) -> str:
    """``doc`` as strict JSON (no ``Infinity`` or ``NaN``, which JSON readers refuse);
    InputError if a number is past the float range (utilities that sum past 1.8e308)."""
    try:
        return json.dumps(doc, indent=None if compact else 1, allow_nan=False)
    except ValueError as err:
        raise InputError(
            "a total is past the largest number (1.8e308): the admitted jobs' utilities sum "
            "past it; divide every utility by one factor"
        ) from err


def load_trace(path: str) -> Trace:
    """Read and validate a trace file (``-`` reads standard input).

    A ``pricing.prior`` that names a file (not ``"default"`` or ``"none"``) is read from
    there, relative to the trace's directory (the working directory for stdin)."""
    from pricing.errors import SpecError
    from pricing.trace import trace_from_dict

    data = read_json(path)
    pricing = data.get("pricing") if isinstance(data, dict) else None
    prior = pricing.get("prior") if isinstance(pricing, dict) else None
    if isinstance(pricing, dict) and isinstance(prior, str) and prior not in ("default", "none"):
        base = Path.cwd() if path == "-" else Path(path).parent
        data = {
            **data,
            "pricing": {
                **pricing,
                "prior": load_prior_file(base / prior, f"{path}: pricing.prior"),
            },
        }
    try:
        trace = trace_from_dict(data)
    except SpecError as err:
        lines = problem_lines(err.problems, unlisted=err.more) + _job_spec_hint(data)
        raise InputError(f"{path}: invalid trace:\n{lines}", err.problems) from err
    _check_memory(path, trace)
    return trace


_SPEC_KEYS = frozenset({"epochs", "chunks", "minibatches", "tau", "grad_mb", "utility"})


def _job_spec_hint(data: Any) -> str:
    """A last line for a file that looks like ``oasis submit``'s input, not a trace: one
    job spec or a list of them (before, ``oasis replay job.json`` said only "unknown
    key" of each of its fields, and of a list "trace: must be an object")."""
    if isinstance(data, dict) and "jobs" not in data and _SPEC_KEYS & data.keys():
        what = "a job spec"
    elif isinstance(data, list) and any(isinstance(x, dict) and _SPEC_KEYS & x.keys()
                                        for x in data[:100]):  # fmt: skip
        what = "a list of job specs"
    else:
        return ""
    return (f"\n  (this looks like {what}, which oasis submit takes; a trace is an object "
            "with version, horizon, resources, servers, pricing and jobs: oasis gen writes "
            "one)")  # fmt: skip


MEMORY_SHARE = 0.75
"""The most of this machine's memory a trace's price ledger may take: a 1 KB trace's
horizon can ask for up to the 16 GiB any trace may (``MAX_LEDGER_BYTES``), and on a
smaller machine the kernel killed the replay as it filled the ledger, with no word."""


def machine_memory() -> int:
    """This machine's physical memory, bytes; 0 when unknown (not a POSIX machine)."""
    try:
        return max(int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), 0)
    except (ValueError, OSError, AttributeError):
        return 0


def _check_memory(path: str, trace: Trace) -> None:
    """InputError if ``trace``'s ledger needs more than :data:`MEMORY_SHARE` of this
    machine's physical memory (unknown: not checked)."""
    from pricing.ledger import ledger_bytes, ledger_need

    memory = machine_memory()
    need = ledger_bytes(trace.cluster, trace.horizon)
    if memory > 0 and need > MEMORY_SHARE * memory:
        servers = len(trace.cluster.worker_names) + len(trace.cluster.ps_names)
        raise InputError(
            f"{path}: horizon: {ledger_need(trace.horizon, servers, need)}, more than "
            f"{MEMORY_SHARE:.0%} of this machine's {memory / 2**30:,.1f} GiB of memory; a "
            "shorter horizon, or fewer servers"
        )


def add_arrival_slots(p: argparse.ArgumentParser, first_help: str, last_help: str) -> None:
    """``--from SLOT`` and ``--to SLOT`` (``args.first``, ``args.last``: arrival slots of
    a daemon's store, each an integer >= 0, None if not given)."""
    for flag, dest, help_text in (("--from", "first", first_help), ("--to", "last", last_help)):
        p.add_argument(flag, dest=dest, type=int_at_least(0), metavar="SLOT", help=help_text)


INT64_MAX = 2**63 - 1
"""The largest slot, sequence or count a request's int64 field holds."""
INT32_MAX = 2**31 - 1
"""The largest count a request's int32 field (``slots``, ``limit``) holds."""


def ascii_number(text: str) -> bool:
    """Whether ``text`` is written in ASCII alone: Python's ``int()`` and ``float()`` also
    read other scripts' digits (``"٣"``, ``"３"``) and ``_`` between digits
    (``"1_000"``), which no other tool reads as a number."""
    return text.isascii() and "_" not in text


def int_at_least(low: int, high: int = INT64_MAX) -> Callable[[str], int]:
    """An argparse ``type``: an integer from ``low`` to ``high`` in ASCII digits, or an
    error saying which (a number past what its request field holds was a traceback)."""

    def parse(text: str) -> int:
        try:
            if not ascii_number(text):
                raise ValueError(text)
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not an integer: {text!r} ({_integer_hint(text, low, high)})"
            ) from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}, got {text}")
        return value

    return parse


def _integer_hint(text: str, low: int, high: int) -> str:
    """What to give instead of ``text``: the integer a whole number in another form
    (``1e3``, ``20.0``) stands for, when in range; else ASCII digits, by example."""
    try:
        value = float(text) if ascii_number(text) else math.nan
    except ValueError:
        value = math.nan
    if math.isfinite(value) and value.is_integer() and low <= value <= high:
        return f"write it as {int(value)}"
    return f"give ASCII digits, e.g. {max(low, 0) + 12}"


def add_search_limit(p: argparse.ArgumentParser) -> None:
    """``--max-search-steps`` and ``--max-search-mb`` on a command that replays a trace;
    their defaults are the daemon's ``limits.max_search_steps`` and ``max_search_mb``."""
    from controller.limits import Limits  # numpy: only for the commands that replay

    steps, mb = Limits.max_search_steps, Limits.max_search_mb
    p.add_argument(
        "--max-search-steps",
        type=float,
        default=steps,
        metavar="STEPS",
        help="a job whose search would take more steps is rejected unsearched, as the "
        f"daemon refuses it (default {steps:g}, the daemon's limits.max_search_steps; "
        "0: no limit)",
    )
    p.add_argument(
        "--max-search-mb",
        type=float,
        default=mb,
        metavar="MIB",
        help="a job whose search tables would take more memory is rejected unsearched, as "
        f"the daemon refuses it (default {mb:g}, the daemon's limits.max_search_mb; 0: no "
        "limit)",
    )


def search_limits(args: argparse.Namespace) -> tuple[float | None, float | None]:
    """``(max_search_steps, max_search_mb)`` of :func:`controller.replay.replay` from the
    flags (None: no limit); InputError if one is not a number >= 0."""
    out: list[float | None] = []
    for flag, key in (("--max-search-steps", "max_search_steps"),
                      ("--max-search-mb", "max_search_mb")):  # fmt: skip
        value = float(getattr(args, key))
        if not (value >= 0 and math.isfinite(value)):
            raise InputError(f"{flag}: must be a number >= 0, got {value:g}")
        out.append(value or None)
    return out[0], out[1]


def same_file(a: str, b: str) -> bool:
    """Whether paths ``a`` and ``b`` name one existing file."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def write_output(output: str, text: str) -> None:
    """Write a command's ``-o FILE`` whole or not at all (:func:`controller.files.write_whole`);
    InputError naming the flag if it cannot."""
    try:
        write_whole(Path(output), text)
    except OSError as err:
        raise InputError(f"-o {output}: cannot write: {err.strerror or err}") from err


def warn_visible_password(flag: str, instead: str) -> None:
    """Warn (stderr) that the password in ``flag`` is visible to every user of this
    machine, as the command line is (``ps``), and where it belongs ``instead``."""
    print(f"oasis: warning: {flag} holds a password, which every user of this machine "
          f"can read in the process list (ps); leave it out: {instead}",
          file=sys.stderr)  # fmt: skip


def store_url(given: str, flag: str) -> str:
    """The SQLAlchemy URL of a STORE as given to ``flag`` (``oasis store copy``'s
    ``--from`` and ``--to``, ``offline`` and ``calibrate``'s ``--store``): a URL as it
    is; a directory as the ``oasis.db`` in it (a daemon's ``data_dir``); any other path
    as a SQLite file. ``offline --store /var/lib/oasis`` was refused as "not a
    SQLAlchemy URL ... e.g. postgresql+psycopg://oasis@db/oasis", which ``store copy``
    took."""
    if "://" in given:
        return given
    if not given:
        raise InputError(f"{flag}: give a store URL or a SQLite file's path")
    path = Path(given).expanduser().absolute()
    if path.is_dir():
        path = path / "oasis.db"
    return f"sqlite:///{path}"


def unreadable_store(err: Exception) -> InputError:
    """The error of a ``--store`` that could not be read (``offline``, ``calibrate``):
    its first line, or why a pooler before PostgreSQL refused the connection."""
    from controller.store.poolers import pooler_refusal

    first_line = str(err).splitlines()[0]
    why = pooler_refusal(first_line, "--store") or first_line
    return InputError(f"--store: cannot read a daemon's store there: {why}")


def check_store_url(url: str) -> None:
    """InputError for a ``--store`` SQLite URL whose file does not exist: SQLite would
    create an empty one there (left behind), and the error would be "no such table".
    A password in it is warned of (:func:`warn_visible_password`)."""
    from controller.store.urls import has_password, unusable

    if has_password(url):
        warn_visible_password("--store", "psycopg reads it from $PGPASSWORD or ~/.pgpass")
    why = unusable(url)
    if why is not None:
        raise InputError(f"--store: {why}")
    prefix = "sqlite:///"
    if url.startswith(prefix) and url[len(prefix) :] not in ("", ":memory:"):
        path = url[len(prefix) :].split("?", 1)[0]
        if not os.path.isfile(path):
            # sqlite:///var/lib/oasis/oasis.db names var/lib/oasis/oasis.db, relative to
            # the working directory: an absolute path takes a fourth slash
            hint = (f"; a path after sqlite:/// is relative to the working directory: "
                    f"for /{path} write sqlite:////{path}"
                    if not path.startswith("/") else "")  # fmt: skip
            raise InputError(f"--store {url}: no such file (a daemon's SQLite store is "
                             f"oasis.db in its data_dir){hint}")  # fmt: skip


def call_timeout(text: str) -> float:
    """An argparse ``type``: ``--timeout``, a finite number of seconds > 0, at most a
    day (``inf`` or ``0`` made every call fail at once, blamed on the daemon)."""
    value = positive_seconds(text)
    if value > 86400:
        raise argparse.ArgumentTypeError(f"must be at most 86400 seconds (a day), got {text}")
    return value


def seconds_of(text: str) -> float | None:
    """Seconds of a bare number (``"3600"``) or of a duration (``"1h30m"``); None if
    ``text`` is neither (any float, ``inf`` and ``nan`` included: callers bound it), or
    is not ASCII (:func:`ascii_number`)."""
    if not ascii_number(text):  # float() reads "٣" as 3 and "1_0" as 10
        return None
    try:
        return float(text)
    except ValueError:
        return parse_duration(text)


def positive_seconds(text: str) -> float:
    """An argparse ``type``: a finite number of seconds > 0, or a duration such as
    ``"1h"`` (``oasis gen --slot-seconds 1h`` was "not a number", where ``submit --wait``
    and the config's ``_seconds`` keys take one)."""
    value = seconds_of(text)
    if value is None:
        raise argparse.ArgumentTypeError(
            f"not seconds or a duration: {text!r} (e.g. {DURATION_EXAMPLES}, or 3600)"
        )
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def counted(n: float, noun: str) -> str:
    """``1 job``, ``2 jobs``, ``0.5 jobs``: a count and its noun, singular for one."""
    return f"{n:g} {noun}{'' if n == 1 else 's'}"


def few(items: Sequence[str], limit: int) -> str:
    """The first ``limit`` of ``items`` joined by commas, and how many more there are:
    ``a, b, c and 4 more``."""
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit:,} more" if len(items) > limit else "")


def fmt(x: float | None, digits: int = 4) -> str:
    """A number for a table cell; ``-`` for None (and ``0`` for -0.0)."""
    return "-" if x is None else f"{x + 0.0:.{digits}g}"


@contextlib.contextmanager
def quiet_native_stdout() -> Iterator[None]:
    """Discard what native solvers print on file descriptor 1 (HiGHS prints its banner
    there whatever its options say), so that stdout holds only the report; the
    progress lines on stderr say what runs."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no descriptor 1 (e.g. a closed stdout): nothing to protect
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def plain_doc(doc: str | None) -> str:
    """A module docstring as ``--help`` text: without reST's double backquotes and
    roles (``:func:`x``` -> ``x``)."""
    import re

    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc or "")
    return text.replace("``", "")


def version() -> str:
    """This installation's version (the ``oasis-scheduler`` package's), for ``--version``."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("oasis-scheduler")
    except PackageNotFoundError:  # run from a checkout without pip install
        return "unknown (not installed)"
