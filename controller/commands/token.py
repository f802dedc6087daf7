"""``oasis token NAME --role ROLE``: make a bearer token for ``oasisd``'s ``[auth]``.

Prints the token (give it to the client, e.g. as ``$OASIS_TOKEN``) and the line to add
to the daemon's tokens file, which holds only the token's SHA-256 (controller/auth.py);
``--add-to FILE`` appends the line itself (a new file is made 0640).
Nothing is sent anywhere; the daemon reads its tokens file at start and at a reload
(``systemctl reload oasisd``, SIGHUP: controller/reload.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from controller.auth import NAME_PATTERN, Role, hash_token, new_token, parse_tokens, token_lines
from controller.commands import SUMMARIES
from controller.commands.common import EXIT_OK, InputError
from pricing.errors import SpecError

__all__ = ["register"]


def register(sub: Any) -> None:
    help_ = SUMMARIES["token"]
    p = sub.add_parser("token", help=help_, description=help_)
    p.add_argument("name", help="who uses it; recorded as the submitter of its jobs")
    p.add_argument(
        "--role",
        choices=[r.value for r in Role],
        default=Role.SUBMITTER.value,
        help="submitter (default): submit, quote, read and cancel own jobs; operator: all",
    )
    p.add_argument("--add-to", metavar="FILE",
                   help="append the line to this tokens file (made 0640 if new; a name "
                   "already there, or a file oasisd would not read, is refused)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_token)


def cmd_token(args: argparse.Namespace) -> int:
    if not NAME_PATTERN.fullmatch(args.name):
        raise InputError(f"name {args.name[:40]!r}: use 1-200 of A-Z a-z 0-9 _ . @ -")
    token = new_token()
    line = f"{args.name} {args.role} {hash_token(token)}"
    if args.add_to:
        _append(Path(args.add_to), args.name, line)
    if args.json:
        print(json.dumps({"name": args.name, "role": args.role, "token": token, "line": line}))
    else:
        print(f"token (give it to {args.name}; it is not stored anywhere): {token}")
        if args.add_to:
            print(f"added to {args.add_to}: {line}")
        else:
            print(f"line for the daemon's tokens file:\n{line}")
        print(
            "then: systemctl reload oasisd, or kill -HUP its pid (it reads the tokens file "
            "again; no restart); a daemon not started yet reads it at its start"
        )
    return EXIT_OK


def _append(path: Path, name: str, line: str) -> None:
    """Append ``line`` to the tokens file ``path`` (made 0640 if new, never through a
    symbolic link); InputError if ``name`` has a line there already, or if a line there
    is one oasisd would refuse."""
    new = not os.path.lexists(path)
    try:
        fd = os.open(
            path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o640
        )
    except OSError as err:
        raise InputError(f"--add-to {path}: {err.strerror or err}") from err
    if new and os.fstat(fd).st_gid == 0:
        # made by root (the daemon's own message says "make it: oasis token ... --add-to"):
        # 0640 root:root, which oasisd, run as its own user, cannot read (exit 2 at start)
        print(f"oasis token: made {path} 0640 root:root; oasisd reads it as its own user: "
              f"chgrp oasis {path} (its group; the install steps make the file with "
              "install -m 0640 -g oasis /dev/null FILE)", file=sys.stderr)  # fmt: skip
    with os.fdopen(fd, "r+", encoding="utf-8") as f:
        try:
            text = f.read(1 << 24)
        except UnicodeDecodeError as err:
            raise InputError(f"--add-to {path}: not UTF-8 text") from err
        text = text.removeprefix("\ufeff")  # a byte-order mark: oasisd reads past it
        names = {words[0] for _number, words in token_lines(text)}
        if name in names:
            raise InputError(f"--add-to {path}: {name!r} has a token there already (one "
                             "per name): remove its line first to replace it")  # fmt: skip
        # a file oasisd would refuse (its config file named by mistake): adding a line
        # would mend nothing, and in a config file it stops the next start (the audit)
        try:
            parse_tokens(text, f"--add-to {path}")
        except SpecError as err:
            raise InputError(f"{err}: not a tokens file oasisd reads; nothing added") from err
        f.write(("\n" if text and not text.endswith("\n") else "") + line + "\n")
