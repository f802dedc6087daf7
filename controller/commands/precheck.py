"""``oasis submit`` of a list of jobs: every item checked before any is sent.

Each item is read as the daemon reads it -- :func:`controller.jobspec.prepare` at the
daemon's slot clock, :func:`pricing.job.job_from_dict` and
:func:`controller.jobspec.check_job_worth` -- against a cluster that has every resource
the item names and room for any number of its workers and PS. A problem found so is one
the daemon finds on its own cluster too; an id given twice with different specs is
found here as well. If any item has one, nothing is sent.

A resource the daemon's cluster lacks is found here too, from the resources its
``GetClusterInfo`` names: a typo (``"gpus"``) in the 37th item stopped the list there,
the 36 before it submitted. What else depends on the daemon's cluster and configuration
-- a worker or PS that fits on none of its servers, work its servers cannot finish in
the window, its ``[limits]``, an id already stored -- only the daemon can find; such an
item still fails when its turn comes, after the items before it were submitted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from controller.clock import SlotTimes
from controller.commands.common import MAX_PROBLEM_LINES, InputError
from controller.jobspec import check_job_worth, prepare, spec_differences
from pricing.cluster import BANDWIDTH, Cluster
from pricing.errors import Problem, SpecError
from pricing.job import job_from_dict
from pricing.text import label

__all__ = ["check_items", "item_problems"]


def _roomy_cluster(spec: Mapping[str, Any], known: Sequence[str]) -> Cluster:
    """One worker and one PS server of unbounded capacity in each of the daemon's
    resources ``known`` (empty: an older daemon's, which does not say them; then in each
    resource ``spec``'s worker and PS name, and bandwidth): any cluster's check is at
    least as strict."""
    named = [
        name
        for side in ("worker", "ps")
        if isinstance(spec.get(side), Mapping)
        for name in spec[side]
        if isinstance(name, str) and name != BANDWIDTH
    ]
    resources = tuple(known) if known else (BANDWIDTH, *dict.fromkeys(named))
    unbounded = np.full((1, len(resources)), np.inf)
    return Cluster(
        resources=resources,
        worker_names=("any worker server",),
        ps_names=("any ps server",),
        worker_capacity=unbounded,
        ps_capacity=unbounded.copy(),
        listing=(("worker", 0), ("ps", 0)),
    )


def item_problems(
    spec: dict[str, Any],
    times: SlotTimes,
    window: int,
    arrival: int,
    resources: Sequence[str] = (),
) -> tuple[dict[str, Any], list[Problem]]:
    """``spec`` as the daemon would store it (:func:`prepare`) and what the daemon would
    refuse it for on any cluster with ``resources`` (empty: any resource named), its job
    arriving in slot ``arrival`` with ``window`` slots (T) to finish in."""
    prepared = prepare(spec, times)
    try:
        job = job_from_dict(
            prepared,
            _roomy_cluster(prepared, resources),
            slot_seconds=times.slot_seconds,
            slots_available=lambda _a: window,
            arrival=arrival,
        )
        check_job_worth(job, prepared, slot_seconds=times.slot_seconds)
    except SpecError as err:
        return prepared, list(err.problems)
    return prepared, []


def _label(i: int, given: str | None) -> str:
    """Item ``i`` (from 0) as people count: from 1."""
    return f"item {i + 1} ({label(given)})" if given else f"item {i + 1}"


def _reused(
    first: tuple[int, dict[str, Any]], i: int, prepared: dict[str, Any], slot_seconds: float
) -> list[Problem]:
    """Item ``i``'s id taken by the earlier item ``first`` (index, prepared spec) with
    another spec, as a problem: the daemon would refuse it (ALREADY_EXISTS). The same
    spec again is a retry, answered with the first decision."""
    j, other = first
    differ = spec_differences(other, prepared, slot_seconds=slot_seconds) if j != i else []
    if not differ:
        return []
    fields = ", ".join(d.split(":", 1)[0] for d in differ[:4])
    why = f"also item {j + 1}'s, whose spec differs ({fields}): the daemon would refuse this one"
    return [Problem("job.id", why)]


def check_items(
    specs: Sequence[dict[str, Any]],
    given: Sequence[str | None],
    times: SlotTimes,
    window: int,
    arrival: int,
    path: str,
    resources: Sequence[str] = (),
) -> None:
    """Check every item of a list (``given``: each one's id as the file gives it, None
    for none) before any is sent, against the daemon's ``resources`` (empty: an older
    daemon's, which does not say them: an unknown one is then found at its item's turn).

    Raises:
        InputError: naming each bad item (index and given id), each field and why; with
            ``--json`` each problem carries its ``item`` and ``id``, and ``submitted``
            is ``[]``.
    """
    problems: list[Problem] = []
    about: list[dict[str, Any]] = []
    lines: list[str] = []
    first_of: dict[str, tuple[int, dict[str, Any]]] = {}
    bad = 0
    for i, (spec, name) in enumerate(zip(specs, given, strict=True)):
        prepared, found = item_problems(spec, times, window, arrival, resources)
        job_id = prepared.get("id")
        if isinstance(job_id, str) and not any(p.field == "job.id" for p in found):
            first_of.setdefault(job_id, (i, prepared))
            found.extend(_reused(first_of[job_id], i, prepared, times.slot_seconds))
        bad += bool(found)
        for p in found:
            problems.append(p)
            about.append({"item": i, "id": name})
            lines.append(f"  {_label(i, name)}: {p}")
    if problems:
        verb = "has" if bad == 1 else "have"
        head = f"{path}: {bad} of {len(specs)} jobs {verb} bad input; none was submitted:"
        if len(lines) > MAX_PROBLEM_LINES:  # as problem_lines: 20,000 bad items, 20,001 lines
            left = len(lines) - MAX_PROBLEM_LINES
            lines = [
                *lines[:MAX_PROBLEM_LINES],
                f"  ... and {left:,} more (--json lists every one)",
            ]
        raise InputError("\n".join([head, *lines]), problems, about, {"submitted": []})
