"""Every problem of a config file at once: :func:`controller.config.from_dict` stops at
its first, so :func:`_problems` takes out the key each one names and reads the document
again (:func:`controller.config.load` says them all, a line each)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from controller.config_file import ConfigError

__all__ = ["MAX_PROBLEMS"]


MAX_PROBLEMS = 20
"""Problems of a config file said at once, at most."""


def _problems(
    parse: Callable[..., object],
    data: Mapping[str, Any],
    source: str,
    base: Path,
    former: Collection[str],
) -> list[str]:
    """Every problem of ``data`` ``parse`` (:func:`controller.config.from_dict`) finds one
    at a time (at most
    :data:`MAX_PROBLEMS`): after each, the key it names is taken out (its default then
    applies) and the document read again. The parser stops at its first problem, so a
    file with three mistakes took three starts to mend (the CLI audit). A key its table
    requires takes its table with it. A problem that names no key a table holds (a
    list's item, a rule between two keys) ends the list."""
    trial = copy.deepcopy(dict(data))
    out: list[str] = []
    dropped = ""
    gone: set[str] = set()  # tables taken out for a removal's sake, not the file's
    while len(out) < MAX_PROBLEMS:
        try:
            parse(trial, source, base=base, former=former)
        except ConfigError as err:
            path = str(err).split(":", 1)[0].strip()
            if path == dropped or dropped.startswith(f"{path}."):
                # a key its table requires ("tls.key" unreadable, then "tls: needs both
                # cert and key"): its removal's problem, not the file's; the table goes
                # instead (its defaults, or none), if it is one
                table = path if path != dropped else path.rpartition(".")[0]
                if not table or not _drop(trial, table):
                    break
                dropped = table
                gone.add(table)
                continue
            if any(f"[{table}]" in str(err) for table in gone):
                # of a table taken out above ("[tls] is not configured", of a [tls] whose
                # key was unreadable): not so in the file, and said by its first problem
                break
            out.append(str(err))
            if not _drop(trial, path):
                break
            dropped = path
        else:
            break
    return out


def _drop(doc: dict[str, Any], path: str) -> bool:
    """Take the key at dotted ``path`` out of ``doc``'s tables; False if there is none."""
    *tables, key = path.split(".")
    for name in tables:
        inner = doc.get(name)
        if not isinstance(inner, dict):
            return False
        doc = inner
    if key not in doc:
        return False
    del doc[key]
    return True
