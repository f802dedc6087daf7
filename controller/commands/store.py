"""``oasis store copy --from STORE --to STORE``: move a whole store to another database,
with the daemon stopped (:mod:`controller.store.copy`): e.g. from the embedded SQLite
store to PostgreSQL, jobs, plans, events and ids as they are.

A STORE is a SQLAlchemy URL (``postgresql+psycopg://oasis@db/oasis``,
``sqlite:////var/lib/oasis/oasis.db``), a SQLite file's path, or a daemon's
``data_dir`` (its ``oasis.db``). Progress goes to standard error; the rows copied per
table to standard output (``--json``: one object). Exit status: 0 copied; 2 a bad
command line (a flag, a URL that cannot name a store, a source file that does not exist,
the same store twice); 1 the stores refused (a daemon holds one, the destination holds
rows, a revision this oasis does not know) or the copy failed (the destination is then
left without a copied row).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from controller.commands import SUMMARIES
from controller.commands.common import (
    EXIT_FAILURE,
    EXIT_OK,
    InputError,
    check_store_url,
    int_at_least,
    store_url,
)

__all__ = ["register", "run_copy", "store_url"]

PROGRESS_SECONDS = 2.0
"""At most one progress line per this many seconds within a table (and one as each
table starts and ends)."""


def register(sub: Any) -> None:
    """Add the ``store`` subcommand (and its ``copy``) to ``sub`` (argparse subparsers)."""
    p = sub.add_parser(
        "store",
        help=SUMMARIES["store"],
        description="Tools for a daemon's store, run with the daemon stopped.",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    c = actions.add_parser(
        "copy",
        help="copy every row of a store into a new, empty one (e.g. SQLite to PostgreSQL)",
        description=(
            "Copy every table of the store --from into the store --to, ids kept, in one "
            "transaction on --to: all or nothing. Both stores' writer locks are held "
            "throughout (stop the daemon first: a daemon running on either makes the copy "
            "refuse, naming it). --from is migrated to this oasis's schema first; --to is "
            "created or migrated to it and must hold no rows. Then set the daemon's "
            "store_url to --to and start it."
        ),
    )
    c.add_argument(
        "--from", dest="source", metavar="STORE", required=True,
        help="the store to copy: a SQLAlchemy URL, a SQLite file, or a daemon's data_dir",
    )  # fmt: skip
    c.add_argument(
        "--to", dest="destination", metavar="STORE", required=True,
        help="the store to fill (e.g. postgresql+psycopg://oasis@db/oasis): created if need "
        "be, and must hold no rows",
    )  # fmt: skip
    c.add_argument(
        "--batch", type=int_at_least(1, 1_000_000), default=None, metavar="ROWS",
        help="rows read and written at a time (default: 5000); memory grows with it",
    )  # fmt: skip
    c.add_argument("--json", action="store_true", help="print the result as JSON")
    c.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress on stderr"
    )
    c.set_defaults(func=run_copy)


def _check_destination(url: str) -> None:
    """InputError for a ``--to`` that cannot name a store (its URL unusable, a SQLite
    file in a folder that does not exist)."""
    from controller.store.urls import unusable

    why = unusable(url)
    if why is not None:
        raise InputError(f"--to: {why}")
    prefix = "sqlite:///"
    if url.startswith(prefix):
        path = url[len(prefix) :].split("?", 1)[0]
        if path in ("", ":memory:"):
            raise InputError("--to: an in-memory SQLite database keeps nothing; name a file")
        if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise InputError(f"--to {url}: no such folder for the SQLite file")


def run_copy(args: argparse.Namespace) -> int:
    """``oasis store copy``."""
    source = store_url(args.source, "--from")
    destination = store_url(args.destination, "--to")
    try:
        check_store_url(source)
    except InputError as err:
        raise InputError(str(err).replace("--store", "--from", 1)) from None
    if source.startswith("sqlite:///") and source[len("sqlite:///") :] in ("", ":memory:"):
        raise InputError("--from: an in-memory SQLite database holds no daemon's store")
    _check_destination(destination)
    if source == destination:
        raise InputError("--from and --to name the same store")

    # the store's modules only now: `oasis --help` and a usage error stay light
    from controller.store.copy import DEFAULT_BATCH, CopyError, copy_store
    from controller.store.urls import shown

    def say(line: str) -> None:
        if args.progress:
            print(f"oasis store copy: {line}", file=sys.stderr, flush=True)

    last = [0.0]

    def progress(table: str, done: int, total: int) -> None:
        now = time.monotonic()
        if not args.progress:
            return
        if done in (0, total) or now - last[0] >= PROGRESS_SECONDS:
            last[0] = now
            share = f" ({100 * done / total:.0f}%)" if total else ""
            print(f"oasis store copy: {table}: {done:,} of {total:,} rows{share}",
                  file=sys.stderr, flush=True)  # fmt: skip

    try:
        report = copy_store(source, destination, args.batch or DEFAULT_BATCH, progress, say)
    except CopyError as err:
        if args.json:
            from controller.commands.connection import report_error

            return report_error(args, "FAILED_PRECONDITION", str(err))
        print(f"oasis store copy: {err}", file=sys.stderr)
        return EXIT_FAILURE
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
        return EXIT_OK
    width = max(len(t) for t in [*report.rows, "table"])
    lines = [f"{'table':<{width}}  {'rows':>12}"]
    lines += [f"{t:<{width}}  {n:>12,}" for t, n in report.rows.items()]
    lines.append(f"{'total':<{width}}  {sum(report.rows.values()):>12,}")
    print("\n".join(lines))
    print(
        f"oasis store copy: copied {shown(source)} to {shown(destination)} (schema revision "
        f"{report.revision}) in {report.seconds:.1f} s; set the daemon's store_url to the "
        "new store and start it",
        file=sys.stderr,
    )
    return EXIT_OK
