"""What a config must keep of the store's jobs to start on it: the slot grid their plans
were made in, and every resource their specs name.

Start-up and a standby's takeover refuse a config that breaks either
(:meth:`controller.admission.recovery.Recovery._check_setup`); a reload reads the same
checks against the file it read (:meth:`AdmissionController.restart_problems`), so that
the operator learns of the refusal when editing, not at the next restart (a reboot),
when the daemon would stay down with exit 2.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Collection
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.admission.state import EPOCH_KEY, SETTINGS_KEY
from controller.admission.views import LIVE_STATES
from controller.clock import epoch as slot_zero
from controller.store import JobRow, MetaRow
from controller.store.stored import stored_spec
from pricing.durations import format_time
from pricing.errors import SpecError
from pricing.fields import is_integer

__all__ = [
    "epoch_row",
    "recorded_settings",
    "resources_problem",
    "settings_epoch",
    "slot_grid_problem",
    "stored_epoch",
    "when",
]


def recorded_settings(session: Session) -> dict[str, Any]:
    """The settings the last leader recorded (``Recovery._record_setup``): window,
    slot length, slot 0; {} if none, or if the row does not read back as an object."""
    meta = session.get(MetaRow, SETTINGS_KEY)
    return meta.value if meta is not None and isinstance(meta.value, dict) else {}


def epoch_row(session: Session) -> float | None:
    """Slot 0 as the store's ``epoch`` meta row records it; None if there is no row.

    Raises:
        SpecError: the row does not read (an edit's).
    """
    meta = session.get(MetaRow, EPOCH_KEY)
    if meta is None:
        return None
    where = f"the store's meta row {EPOCH_KEY!r}"
    if not isinstance(meta.value, dict):
        got = type(meta.value).__name__
        raise SpecError.one(where, f'must be a JSON object {{"epoch": ...}}, got {got}')
    return slot_zero(meta.value.get("epoch"), f"{where}: epoch")


def settings_epoch(session: Session) -> float | None:
    """Slot 0 as the last leader's recorded settings give it; None if they do not."""
    recorded = recorded_settings(session).get("epoch")
    if is_integer(recorded):
        with contextlib.suppress(OverflowError):  # an edited row: not read
            recorded = float(recorded)
    return recorded if isinstance(recorded, float) and math.isfinite(recorded) else None


def stored_epoch(session: Session) -> float | None:
    """Slot 0 as a start without ``daemon.epoch`` reads it from the store: its ``epoch``
    meta row's, else (none, or one that does not read) the recorded settings'; None if
    neither gives it (``Recovery._epoch`` reads the same, and logs which)."""
    with contextlib.suppress(SpecError):
        value = epoch_row(session)
        if value is not None:
            return value
    return settings_epoch(session)


def resources_problem(session: Session, resources: Collection[str]) -> str | None:
    """Why ``[cluster] resources`` = ``resources`` cannot start on this store, or None.

    A job holding or awaiting a plan (admitted, running, pending) whose spec names a
    resource not in the list would not read against it ("unknown resource"), and the
    rebuild would fail the job and drop its plan, for good: putting the resource back
    afterwards brought none back (the restore audit: ``disk`` taken out of the list
    failed every tenant's six jobs). A resource renamed is the same, and so is a demand
    of 0 for it (the spec names it). A spec that does not read at all is left to the
    rebuild, which fails that job alone.
    """
    known = set(resources)
    missing: dict[str, list[str]] = {}
    rows = session.execute(select(JobRow.id, JobRow.spec).where(JobRow.state.in_(LIVE_STATES)))
    for job_id, text in rows:
        try:
            spec = stored_spec(text, job_id)  # bounded: size, nesting, its own id
        except SpecError:
            continue
        if not isinstance(spec, dict):
            continue
        for side in ("worker", "ps"):
            demand = spec.get(side)
            if not isinstance(demand, dict):
                continue
            for name in demand:  # a demand of 0 too: the spec does not read without it
                if name not in known:
                    missing.setdefault(str(name), []).append(job_id)
    if not missing:
        return None
    jobs = sorted({j for ids in missing.values() for j in ids})
    names = ", ".join(repr(r) for r in sorted(missing))
    return (
        f"[cluster] resources lacks {names}, which {len(jobs)} admitted, running or "
        f"pending job(s) demand ({', '.join(repr(j) for j in jobs[:5])}"
        f"{', ...' if len(jobs) > 5 else ''}): started so, the daemon could not read "
        "their specs and would fail them all, for good. Put the resource back (a "
        "resource renamed: under its old name), or take it out once those jobs have ended"
    )


def slot_grid_problem(session: Session, slot_seconds: float, epoch: float) -> str | None:
    """Why a slot length of ``slot_seconds`` and slot 0 at Unix time ``epoch`` cannot
    start on this store, or None.

    Stored plans, windows and waits are slot numbers, read through the ``settings``
    row's ``slot_seconds`` and ``epoch``. With others the daemon would read each plan as
    another time: admitted jobs would seem long over, or not yet due, and be moved on
    accordingly. Only a store that holds jobs is checked (an empty one takes the new
    settings), and a ``settings`` row that does not read is rewritten as before.
    """
    recorded = recorded_settings(session)
    length, start = recorded.get("slot_seconds"), recorded.get("epoch")
    numbers = (int, float)
    if not (isinstance(length, numbers) and isinstance(start, numbers)):
        return None
    if not (math.isfinite(length) and length > 0 and math.isfinite(start)):
        return None
    if session.scalar(select(JobRow.id).limit(1)) is None:
        return None
    changed = []
    if abs(slot_seconds - length) > 1e-9 * length:
        changed.append(f"daemon.slot_seconds is {slot_seconds:g} s, but the store's jobs "
                       f"were planned in slots of {length:g} s")  # fmt: skip
    if abs(epoch - start) > 1e-3:
        changed.append(
            f"slot 0 begins at {when(epoch)} (daemon.epoch), but the store's "
            f"jobs were planned from {when(start)}"
        )
    if not changed:
        return None
    return (
        f"{'; '.join(changed)} (its meta row {SETTINGS_KEY!r}): started so, it would "
        "move every stored plan to another time. Set them back, or give the new "
        "settings a new store (another daemon.data_dir or store_url)"
    )


def when(unix: float) -> str:
    """``unix`` as a UTC time, or as seconds if no date can show it."""
    try:
        return format_time(unix)
    except (OverflowError, OSError, ValueError):
        return f"{unix:g} s after the Unix epoch"
