"""``oasis token NAME --role ROLE``: make a bearer token for ``oasisd``'s ``[auth]``.

Prints the token (give it to the client, e.g. as ``$OASIS_TOKEN``) and the line to add
to the daemon's tokens file, which holds only the token's SHA-256 (controller/auth.py).
Nothing is sent anywhere; the daemon reads its tokens file at start and at a reload
(``systemctl reload oasisd``, SIGHUP: controller/reload.py).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from controller.auth import NAME_PATTERN, Role, hash_token, new_token
from controller.commands import SUMMARIES
from controller.commands.common import EXIT_OK, InputError

__all__ = ["register"]


def register(sub: Any) -> None:
    help_ = SUMMARIES["token"]
    p = sub.add_parser("token", help=help_, description=help_)
    p.add_argument("name", help="who uses it; recorded as the submitter of its jobs")
    p.add_argument(
        "--role",
        choices=[r.value for r in Role],
        default=Role.SUBMITTER.value,
        help="submitter (default): submit, quote, read own jobs; operator: all",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_token)


def cmd_token(args: argparse.Namespace) -> int:
    if not NAME_PATTERN.fullmatch(args.name):
        raise InputError(f"name {args.name[:40]!r}: use 1-200 of A-Z a-z 0-9 _ . @ -")
    token = new_token()
    line = f"{args.name} {args.role} {hash_token(token)}"
    if args.json:
        print(json.dumps({"name": args.name, "role": args.role, "token": token, "line": line}))
    else:
        print(f"token (give it to {args.name}; it is not stored anywhere): {token}")
        print(f"line for the daemon's tokens file:\n{line}")
        print("then: systemctl reload oasisd (it reads the tokens file again; no restart)")
    return EXIT_OK
