"""Job ids per submitter: a job submitted with a token is stored under ``NAME:ID``.

Why: job ids were one namespace for every tenant. A tenant's job ``train-1`` made every
other tenant's ``train-1`` ALREADY_EXISTS ("taken by another submitter"), which also told
them it existed. Each job submitted with a token is now keyed by its token's name and its
id (:mod:`controller.job_keys`); a submitter still names and sees its jobs by their ids.

What it does: every job with a submitter, and its allocations, progress and events, is
renamed from ``ID`` to ``NAME:ID``, and its stored spec's ``id`` with it (the daemon
checks that a stored spec names the job it is stored as). The key columns widen from 200
to 400 characters (a name of up to 200, ``:``, an id of up to 128). A spec that does not
read as a JSON object is left as it is: the daemon takes that job out and says so, as it
would have before. Job ids named inside the details of older events (a server failure's
moved jobs, say) stay as they were written.

Downgrade strips the names again; it is refused if two submitters now hold the same id.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

KEY_CHARS = 400
_KEYS = (("jobs", "id"), ("allocations", "job_id"), ("job_progress", "job_id"),
         ("events", "job_id"))  # fmt: skip
_CHILDREN = ("allocations", "job_progress", "events")
_BATCH = 1000


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":  # SQLite does not hold a VARCHAR to its length
        for table, column in _KEYS:
            op.alter_column(table, column, type_=sa.String(KEY_CHARS),
                            existing_type=sa.String(200))  # fmt: skip
    _rename(bind, "submitter || ':' || id", "submitter IS NOT NULL AND id NOT LIKE '%:%'")


def downgrade() -> None:
    bind = op.get_bind()
    named = "submitter IS NOT NULL AND id LIKE submitter || ':%'"
    plain = "substr(id, length(submitter) + 2)"
    # two submitters' jobs of one id, or one of an anonymous job's id (no ':' in it)
    taken = list(bind.execute(sa.text(
        f"SELECT {plain} FROM jobs WHERE {named} GROUP BY {plain} HAVING count(*) > 1 "
        f"UNION SELECT id FROM jobs WHERE id IN (SELECT {plain} FROM jobs WHERE {named})"
    )).scalars())  # fmt: skip
    if taken:
        raise RuntimeError(
            "cannot downgrade below 0008: more than one submitter holds the job ids "
            f"{', '.join(map(repr, taken[:5]))}; an older oasis keeps one job per id"
        )
    _rename(bind, plain, named)


def _rename(bind: Any, new_id: str, where: str) -> None:
    """Give the jobs ``where`` selects the id ``new_id`` (SQL over the jobs row), in
    their children and their specs too."""
    fks = _drop_foreign_keys(bind)
    for child in _CHILDREN:
        bind.execute(sa.text(
            f"UPDATE {child} SET job_id = (SELECT {new_id} FROM jobs "
            f"WHERE jobs.id = {child}.job_id) "
            f"WHERE job_id IN (SELECT id FROM jobs WHERE {where})"
        ))  # fmt: skip
    # a spec as the daemon stores it (canonical JSON, :func:`canonical_spec`) holds its
    # id once, as '"id":"ID"': renamed in SQL with the row (10^5 jobs: 3.1 s, against 13.8 s
    # read, parsed and written back one by one); any other spec (an edit) in Python
    quoted = "'\"id\":\"' || {} || '\"'"
    found = (f"instr(spec, {quoted.format('id')}) > 0" if bind.dialect.name == "sqlite"
             else f"strpos(spec, {quoted.format('id')}) > 0")  # fmt: skip
    rows = bind.execute(sa.text(
        f"SELECT id, {new_id} AS new_id, spec FROM jobs WHERE ({where}) AND NOT ({found})"
    )).all()  # fmt: skip
    bind.execute(sa.text(
        f"UPDATE jobs SET spec = replace(spec, {quoted.format('id')}, {quoted.format(new_id)}), "
        f"id = {new_id} WHERE ({where}) AND ({found})"
    ))  # fmt: skip
    changes = [_respecced(old, new, spec) for old, new, spec in rows]
    statement = sa.text("UPDATE jobs SET id = :new_id, spec = :spec WHERE id = :old_id")
    for start in range(0, len(changes), _BATCH):
        bind.execute(statement, changes[start : start + _BATCH])
    for name, table, columns, referred in fks:
        op.create_foreign_key(name, table, "jobs", columns, referred)


def _respecced(old: str, new: str, spec: Any) -> dict[str, Any]:
    """The parameters renaming job ``old`` to ``new``: its spec's id too, if it reads."""
    try:
        value = json.loads(spec) if isinstance(spec, str) else None
    except (ValueError, RecursionError):
        value = None
    if isinstance(value, dict) and value.get("id") == old:
        value["id"] = new
        spec = json.dumps(value, sort_keys=True, separators=(",", ":"))  # canonical_spec
    return {"old_id": old, "new_id": new, "spec": spec}


def _drop_foreign_keys(bind: Any) -> list[tuple[str, str, list[str], list[str]]]:
    """Drop the foreign keys onto ``jobs`` (PostgreSQL checks them at each statement, and
    none cascades), returned to be made again; on SQLite, defer them to the commit."""
    if bind.dialect.name == "sqlite":
        bind.execute(sa.text("PRAGMA defer_foreign_keys = ON"))
        return []
    dropped = []
    inspector = sa.inspect(bind)
    for table in _CHILDREN:
        for fk in inspector.get_foreign_keys(table):
            if fk["referred_table"] == "jobs" and fk.get("name"):
                op.drop_constraint(fk["name"], table, type_="foreignkey")
                columns, referred = fk["constrained_columns"], fk["referred_columns"]
                dropped.append((fk["name"], table, columns, referred))
    return dropped
