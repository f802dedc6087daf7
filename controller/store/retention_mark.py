"""The store's record of how far retention has deleted: the slot before which jobs (and
outages) may be missing.

Retention (:mod:`controller.admission.retention`) deletes a finished job, with its
allocations, once it ended before a cutoff slot; an ended outage the same way. Every
row it deletes held slots before that cutoff only. ``oasis offline --store`` reading a
stretch that starts before it would see those slots as free and the optimum there as
higher than it was: it needs to know where the deletions end. They are recorded here,
in the ``meta`` row :data:`RETENTION_KEY`, as ``{"deleted_before_slot": C}``, the
highest cutoff of any deletion, in the deleting transaction.

The row is read leniently (a store edited by hand): a value that is not a slot reads as
no record.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from controller.store.models import MetaRow
from pricing.fields import is_integer

__all__ = ["RETENTION_KEY", "deleted_before", "mark_deleted_before"]

RETENTION_KEY = "retention"


def deleted_before(session: Session) -> int | None:
    """The slot before which retention has deleted rows (None: it deleted none, or the
    record does not read)."""
    row = session.get(MetaRow, RETENTION_KEY)
    value: Any = row.value if row is not None else None
    slot = value.get("deleted_before_slot") if isinstance(value, dict) else None
    if is_integer(slot) and 0 <= slot < 1 << 63:
        return slot
    return None


def mark_deleted_before(session: Session, cutoff: int) -> None:
    """Record, in ``session``'s transaction, that rows of slots before ``cutoff`` were
    deleted (kept as the highest such cutoff)."""
    known = deleted_before(session)
    if known is None or cutoff > known:
        session.merge(MetaRow(key=RETENTION_KEY, value={"deleted_before_slot": cutoff}))
