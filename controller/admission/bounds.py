"""The daemon's price bounds: the estimate started from the configured prior (the rule
``replay`` uses for ``{"bounds": "estimate"}``, so a replay decides as the daemon), kept
in the store across restarts, and an operator's control over it (``oasis bounds``):
reset to the prior, pin U and L, unpin.

A stored estimate is used only if it reads back and was started for the configured
servers; its resources are matched by name
(:meth:`pricing.bound_estimate.BoundEstimate.refit`): reordering ``[cluster] resources``
keeps every resource's estimate, an added resource starts from the prior and the others
keep theirs, a removed one drops only its own. Otherwise (a kept resource's mean
capacity changed: the servers changed) the estimate starts afresh from the prior, and
the log says why. A change of the configured prior
takes effect at ``oasis bounds reset`` (or with a new store): the stored estimate has
taken in jobs the new prior does not know of.

Every change an operator makes is committed with an event ``bounds`` (detail: the
action, who, the pins) before the ledger is repriced.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from controller.admission.state import ESTIMATE_KEY, AdmissionState
from controller.config_pricing import PricingConfig
from controller.errors import PreconditionError
from controller.events import Event
from controller.job_keys import submitter_of
from controller.pins import KINDS, Pins, pins_from_dict, split_pins
from controller.store import EventRow, MetaRow
from controller.store.decisions import SUBMITTER_ESTIMATE_PREFIX, submitter_estimate_key
from pricing.bound_estimate import exp_shown
from pricing.cluster import Cluster
from pricing.errors import SpecError
from pricing.prices import PriceBounds
from pricing.shared_estimate import ANONYMOUS, SharedEstimate, submitter_key

__all__ = ["ACTIONS", "PINS_KEY", "BoundControl"]

PINS_KEY = "bound_pins"
"""Meta row with the pinned bounds (:mod:`controller.pins`)."""
ACTIONS = ("reset", "pin", "unpin")


class BoundControl(AdmissionState):
    """The estimate's start, its stored state and an operator's pins; see the module
    docstring."""

    def _stored_estimate(self, session: Session) -> SharedEstimate:
        """The stored estimate if it fits the configuration, else a fresh one."""
        fresh = SharedEstimate.start(self._fresh_estimate())
        meta = session.get(MetaRow, ESTIMATE_KEY)
        if meta is None or self.config.pricing.mode != "estimate":
            return fresh
        if not SharedEstimate.is_head(meta.value):  # one JSON value (the lone estimate's)
            stored = SharedEstimate.from_dict(meta.value, fresh.fresh)
        else:  # the submitters' states in rows of their own
            rows = session.scalars(
                select(MetaRow).where(
                    MetaRow.key.startswith(SUBMITTER_ESTIMATE_PREFIX, autoescape=True)
                )
            ).all()
            states = {
                row.value["name"]: row.value.get("state")
                for row in rows
                if isinstance(row.value, dict) and isinstance(row.value.get("name"), str)
            }
            stored, lost = SharedEstimate.from_parts(meta.value, states, fresh.fresh)
            if lost:
                self.log.warning(
                    "price-bound estimates start afresh for some submitters",
                    why="their stored state is missing or unreadable", submitters=lost[:20],
                )  # fmt: skip
        refitted = None if stored is None else stored.refit()
        if stored is None:
            why = "the stored state is of an older format or unreadable"
        elif refitted is None:
            why = "the stored state was estimated for other servers or resources"
        else:
            if refitted is not stored:
                self._note_refit(stored)
            return refitted
        if self._estimate_note != why:  # once, not at every rebuild after an outage
            self.log.warning("price-bound estimate starts afresh", why=why, prior=fresh.prior)
            self._estimate_note = why
        return fresh

    def _followed_estimate(
        self, session: Session, events: Sequence[EventRow]
    ) -> SharedEstimate | None:
        """The stored estimate after ``events`` (a standby's follow), read in ``session``;
        None if none of them moves it (no decision, no operator's change of the bounds).
        When only decisions did, the head is read and the states of the submitters they
        name (a decision rewrites its submitter's row alone; a submitter new to this
        standby's estimate is read too), the others' estimates kept; anything else is
        read in full (:meth:`_stored_estimate`). Before, every follow (each 0.5 s) read
        and parsed every submitter's state: with 2,000 submitters an idle standby spent
        0.6 s of CPU a second on it, in its decision thread."""
        kinds = {e.kind for e in events}
        if not kinds & {"decided", "bounds"}:
            return None
        current = self._estimate
        meta = session.get(MetaRow, ESTIMATE_KEY)
        if (
            "bounds" in kinds
            or self.config.pricing.mode != "estimate"
            or meta is None
            or not SharedEstimate.is_head(meta.value)
        ):
            return self._stored_estimate(session)
        names = meta.value.get("submitters")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            return self._stored_estimate(session)
        if not set(current.submitters) <= set(names):  # one dropped: read it all
            return self._stored_estimate(session)
        moved = {submitter_key(submitter_of(e.job_id)) for e in events if e.kind == "decided"}
        wanted = [n for n in names if n in moved or n not in current.submitters]
        states: dict[str, Any] = {}
        if wanted:
            keys = [submitter_estimate_key(n) for n in wanted]
            for row in session.scalars(select(MetaRow).where(MetaRow.key.in_(keys))):
                if isinstance(row.value, dict) and isinstance(row.value.get("name"), str):
                    states[row.value["name"]] = row.value.get("state")
        if set(wanted) - states.keys():  # a row missing: as a start would read it
            return self._stored_estimate(session)
        stored, lost = SharedEstimate.from_parts(
            meta.value, states, current.fresh, known=current.submitters
        )
        refitted = None if stored is None or lost else stored.refit()
        if refitted is None:
            return self._stored_estimate(session)
        return refitted.cached_as(current)  # the kept submitters' bounds not made anew

    def _note_refit(self, stored: SharedEstimate) -> None:
        """Log, once, that the stored estimate was kept across a change of the configured
        resources (their order, or one added or removed), by name."""
        now = self.cluster.resources
        before = next((e.resources for e in stored.submitters.values() if e.resources), ())
        note = f"refit {before} -> {now}"
        if self._estimate_note == note:
            return
        self._estimate_note = note
        self.log.info(
            "price-bound estimate kept by resource name", resources=list(now),
            added=[r for r in now if r not in before],
            removed=[r for r in before if r not in now],
        )  # fmt: skip

    def _stored_pins(self, session: Session) -> Pins:
        """The stored pins of the configured resources; none (with a warning) if the row
        is not valid pins. The pins of a resource no longer in ``[cluster] resources``
        are set aside (said once), not read: before, one such resource had every pin
        ignored (an operator's U of gpu among them, every tenant's prices with it), and
        the next ``oasis bounds pin`` wrote over the row, so none came back."""
        meta = session.get(MetaRow, PINS_KEY)
        if meta is None:
            return Pins()
        known, aside = split_pins(meta.value, self.cluster.resources)
        if aside:
            names = sorted({r for per in aside.values() for r in per})
            if self._pins_note != names:  # once, not at every rebuild
                self._pins_note = names
                self.log.warning(
                    "pinned bounds of resources not in [cluster] resources set aside: kept "
                    "in the store, they apply again if the resource comes back (oasis "
                    "bounds unpin, with no resource, drops them)",
                    resources=[r[:64] for r in names[:20]],
                )  # fmt: skip
        try:
            return pins_from_dict(known, self.cluster.resources, PINS_KEY)
        except SpecError as err:
            self.log.warning("stored pinned bounds ignored", why=str(err)[:500])
            return Pins()

    def _bounds(self, estimate: SharedEstimate) -> PriceBounds:
        """The bounds in use: configured or estimated, with the pins put in."""
        pricing = self.config.pricing
        if pricing.mode == "explicit":
            assert pricing.bounds is not None
            bounds = pricing.bounds
        else:
            found = estimate.bounds(pricing.l_margin, pricing.u_margin, pricing.trim)
            if found is None:  # no prior and no job yet: flat unit prices until the first
                zeros = np.zeros(len(self.cluster.resources))
                found = PriceBounds(zeros, zeros, zeros, zeros, 1.0, 1.0)
            bounds = found
        return self._pins.apply(bounds, self.cluster.resources)

    # -- what oasis bounds shows and does ------------------------------------------------

    def _bounds_view(self) -> dict[str, Any]:
        """The bounds in use per kind and resource, how each was set, and the estimate's
        description (:meth:`pricing.bound_estimate.BoundEstimate.describe`)."""
        return self._bounds_snapshot()()

    def _bounds_snapshot(self) -> Callable[[], dict[str, Any]]:
        """What :meth:`_bounds_view` reads of the state, taken as it is now (in the
        decision thread; every part immutable): the function that makes the view of it,
        which may run in another thread. The view walks every submitter's estimate: with
        2,000 submitters 30-100 ms, during which every tenant's decisions waited when
        ``oasis bounds`` made it in the decision thread."""
        return functools.partial(
            _view_of, self.config.pricing, self._estimate, self._ledger.bounds, self._pins,
            self.cluster,
        )  # fmt: skip

    def _set_bounds_sync(
        self, action: str, pins: Any, by: str | None, submitter: str | None = None
    ) -> tuple[dict[str, Any], list[Event]]:
        """Reset the estimate to the prior, pin bounds (``pins`` in the JSON form of
        :mod:`controller.pins`, merged over those pinned), or unpin (``pins``: the
        resources to unpin, ``{kind: [resource, ...]}``; empty: all). Committed with an
        event, then applied to the ledger."""
        self._advance_window()
        estimate, new_pins = self._estimate, self._pins
        detail: dict[str, Any] = {"action": action, "by": by or ""}
        if submitter is not None and action != "reset":
            raise SpecError.one("submitter", f"goes with reset only, not {action!r}")
        dropped = None
        if action == "reset":
            if self.config.pricing.mode != "estimate":
                raise PreconditionError("pricing.bounds is 'explicit': there is no estimate")
            if submitter is None:
                estimate = SharedEstimate.start(self._fresh_estimate())
            else:
                dropped = ANONYMOUS if submitter == "-" else submitter
                if dropped not in estimate.submitters:
                    known = ", ".join(n or "-" for n in sorted(estimate.submitters)) or "none"
                    raise SpecError.one(
                        "submitter", f"no estimate of {submitter[:200]!r} (submitters: {known})"
                    )
                estimate = estimate.without(dropped)
                detail["submitter"] = submitter
            detail["prior"] = estimate.prior
        elif action == "pin":
            given = pins_from_dict(pins, self.cluster.resources, "pins")
            if not given:
                raise SpecError.one("pins", "nothing to pin: give U and/or L of a resource")
            new_pins = new_pins.merged(given)
            detail["pins"] = given.to_dict()
        elif action == "unpin":
            for kind, resource in _unpin_list(pins, self.cluster.resources):
                new_pins = new_pins.without(kind, resource)
            detail["unpinned"] = pins or "all"
            if not pins:
                new_pins = Pins()
        else:
            raise SpecError.one("action", f"must be one of {list(ACTIONS)}, got {action!r}")
        now = datetime.now(UTC)
        with self._write() as session:  # fenced (high availability)
            if action == "reset":
                rows = (
                    MetaRow.key.startswith(SUBMITTER_ESTIMATE_PREFIX, autoescape=True)
                    if dropped is None
                    else MetaRow.key == submitter_estimate_key(dropped)
                )
                session.execute(delete(MetaRow).where(rows))
                session.merge(MetaRow(key=ESTIMATE_KEY, value=estimate.head()))
            else:
                value = new_pins.to_dict()
                if action == "pin" or pins:  # unpin with no resource: every pin goes
                    stored = session.get(MetaRow, PINS_KEY)
                    aside = split_pins(stored and stored.value, self.cluster.resources)[1]
                    for kind, per in aside.items():  # a removed resource's, kept
                        value.setdefault(kind, {}).update(per)
                session.merge(MetaRow(key=PINS_KEY, value=value))
            event = self._event(session, now, "bounds", "", "", detail)
        # committed: only now may the ledger change
        self._estimate, self._pins = estimate, new_pins
        self._ledger.set_bounds(self._bounds(estimate))
        self.log.info("price bounds changed", **detail)
        return self._bounds_view(), [event]


def _unpin_list(raw: Any, resources: tuple[str, ...]) -> list[tuple[str | None, str]]:
    """``{kind: [resource, ...]}`` (kind ``"both"``: either kind) as pairs; SpecError
    for an unknown kind or resource."""
    if not raw:
        return []
    if not isinstance(raw, dict):
        raise SpecError.one("pins", "must be an object of kind -> resources to unpin")
    out: list[tuple[str | None, str]] = []
    for kind, names in raw.items():
        if kind not in (*KINDS, "both") or not isinstance(names, list):
            raise SpecError.one(f"pins.{str(kind)[:32]}", "must be worker, ps or both: [names]")
        for name in names:
            if name not in resources:
                raise SpecError.one(f"pins.{kind}", f"unknown resource {str(name)[:64]!r}")
            out.append((None if kind == "both" else kind, name))
    return out


def _view_of(
    pricing: PricingConfig,
    estimate: SharedEstimate,
    bounds: PriceBounds,
    pins: Pins,
    cluster: Cluster,
) -> dict[str, Any]:
    """:meth:`BoundControl._bounds_view` of the state given: the bounds in use
    (``bounds``), ``pins``, the ``estimate`` and the configured ``pricing`` and
    ``cluster``."""
    out = estimate.describe(cluster.resources)
    out["mode"] = pricing.mode
    if pricing.mode == "explicit":
        out["method"] = "explicit: [pricing] U1, U2, L1, L2 of the config"
    seen = pricing.mode == "explicit" or estimate.bounds() is not None
    base = "explicit" if pricing.mode == "explicit" else (
        "observed" if estimate.jobs else "prior"
    )  # fmt: skip
    rows = []
    for kind, log_u, floor, capacity in (
        ("worker", bounds.log_u1, bounds.floor1, cluster.worker_capacity),
        ("ps", bounds.log_u2, bounds.floor2, cluster.ps_capacity),
    ):
        for i, r in enumerate(cluster.resources):
            pinned = [s for s in ("U", "L") if pins.get(kind, r, s) is not None]
            if not pinned and not (capacity[:, i] > 0).any():
                continue  # no server of the kind has it (a PS server's gpu): no price
            if len(pinned) == 2:
                how = "pinned"
            elif pinned:
                how = f"pinned {pinned[0]}" + ("" if seen else ", other unset")
            else:
                how = base if seen else "unset"
            rows.append({
                "kind": kind, "resource": r, "how": how,
                "U": exp_shown(float(log_u[i])), "L": exp_shown(float(floor[i])),
            })  # fmt: skip
    out["bounds"] = rows
    out["pins"] = pins.to_dict()
    return out
