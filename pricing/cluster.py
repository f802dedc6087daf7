"""The cluster: resource types, worker servers and parameter-server (PS) servers (SPEC 2)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from pricing import fields
from pricing.errors import Problem, SpecError
from pricing.text import label

__all__ = ["BANDWIDTH", "SERVER_KEYS", "Cluster", "cluster_from_dict"]

BANDWIDTH = "bandwidth"
"""The resource whose per-worker and per-PS demands set ``b`` and ``B`` (Gbps)."""

Kind = Literal["worker", "ps"]

_HUGE_INT = 1 << 1000
"""An int below this converts to a finite float (one past float64's range is refused as
not finite, as :func:`pricing.fields.number` reads it)."""

SERVER_KEYS = frozenset({"name", "kind", "capacity"})
"""Every key a server object may have."""


@dataclass(frozen=True, eq=False)
class Cluster:
    """Servers and their capacities, in the order they were listed.

    Attributes:
        resources: resource names; index ``r`` of every ``(..., R)`` array.
        worker_names: names of the ``H`` worker servers.
        ps_names: names of the ``K`` PS servers.
        worker_capacity: ``(H, R)`` float64, capacity ``c[h][r]`` in the resource's unit.
        ps_capacity: ``(K, R)`` float64, capacity ``c[k][r]``.
        listing: ``(kind, index)`` of every server in listing order, for output.
    """

    resources: tuple[str, ...]
    worker_names: tuple[str, ...]
    ps_names: tuple[str, ...]
    worker_capacity: NDArray[np.float64]
    ps_capacity: NDArray[np.float64]
    listing: tuple[tuple[Kind, int], ...]

    @cached_property
    def listing_positions(self) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
        """Where each worker server (``(H,)``) and each PS server (``(K,)``) stands in
        :attr:`listing` (computed once)."""
        workers = np.empty(len(self.worker_names), np.intp)
        ps = np.empty(len(self.ps_names), np.intp)
        for pos, (kind, idx) in enumerate(self.listing):
            (workers if kind == "worker" else ps)[idx] = pos
        return workers, ps

    @cached_property
    def resource_index(self) -> dict[str, int]:
        """Each resource's index ``r`` by name (computed once)."""
        return {name: r for r, name in enumerate(self.resources)}

    def servers(self) -> Iterator[tuple[Kind, int, str, NDArray[np.float64]]]:
        """Every server in listing order: ``(kind, index within its kind, name, capacity
        (R,))``."""
        for kind, idx in self.listing:
            if kind == "worker":
                yield kind, idx, self.worker_names[idx], self.worker_capacity[idx]
            else:
                yield kind, idx, self.ps_names[idx], self.ps_capacity[idx]

    def capacities(self) -> dict[str, tuple[Kind, dict[str, float]]]:
        """Every server by name, in listing order: its kind and its capacity by resource
        name (as the store records a server)."""
        return {
            name: (kind, dict(zip(self.resources, caps.tolist(), strict=True)))
            for kind, _, name, caps in self.servers()
        }

    @property
    def bandwidth(self) -> int:
        """Index of the bandwidth resource."""
        return self.resources.index(BANDWIDTH)

    def demand_vector(self, demand: Mapping[str, Any], field: str) -> NDArray[np.float64]:
        """A per-resource demand (missing = 0) as an ``(R,)`` float64 array.

        Raises SpecError naming ``field.<resource>`` for unknown resources and for
        negative or non-finite amounts.
        """
        index = self.resource_index
        values = [0.0] * len(self.resources)
        problems: list[Problem] = []
        for name, amount in demand.items():
            r = index.get(name)
            kind = type(amount)
            if (
                r is not None
                and (kind is float or (kind is int and amount < _HUGE_INT))
                and 0 <= amount < math.inf
            ):  # what fields.non_negative reads it as, without naming the field
                values[r] = float(amount)
                continue
            sub = f"{field}.{label(name)}"
            if name not in self.resources:
                problems.append(Problem(sub, self._unknown(name)))
                continue
            r = self.resources.index(name)
            if isinstance(amount, str):  # "16GiB": the cluster's capacities have no unit
                problems.append(Problem(sub, self._unitless(name, r, amount)))
                continue
            try:
                values[r] = fields.non_negative(amount, sub)
            except SpecError as err:
                problems.extend(err.problems)
        if problems:
            raise SpecError(problems)
        return np.array(values, dtype=np.float64)

    def _unknown(self, name: Any) -> str:
        """Why ``name`` is no resource of the cluster: the resources it has, and the one
        it differs from only in case (``"GPU"``: ``gpu``). Not any close name: a ``tpu``
        is no ``gpu``."""
        known = ", ".join(self.resources)
        folded = name.casefold() if isinstance(name, str) else None
        same = next((r for r in self.resources if r.casefold() == folded), None)
        hint = f"; did you mean {same!r}?" if same else ""
        return f"unknown resource{hint} (the cluster has: {known})"

    def _unitless(self, name: str, r: int, amount: str) -> str:
        """Why ``amount`` (a string, such as ``"16GiB"``) is no amount of resource ``r``.
        Bandwidth's unit is SPEC 2's, Gbps (b and B divide gradient gigabits). Any other
        unit is the cluster's, named by its largest server's; a cluster being read, with
        no servers yet, names none, nor does :mod:`controller.commands.precheck`'s, whose
        servers have no bound (its largest was "mem inf")."""
        if name == BANDWIDTH:
            return (
                "must be a number of Gbps (gigabits per second: 10 Gb/s is 10, 1 GB/s is 8), "
                f"got {fields.show(amount)}"
            )
        if not (len(self.worker_capacity) or len(self.ps_capacity)):
            return (
                f"must be a number (amounts have no unit: give every server's and job's "
                f"{name} in one unit), got {fields.show(amount)}"
            )
        largest = max(self.worker_capacity[:, r].max(initial=0.0),
                      self.ps_capacity[:, r].max(initial=0.0))  # fmt: skip
        if not math.isfinite(largest):
            return (
                f"must be a number, in the unit of the cluster's capacities, got "
                f"{fields.show(amount)}"
            )
        return (
            f"must be a number, in the unit of the cluster's capacities (its largest "
            f"server has {name} {largest:g}), got {fields.show(amount)}"
        )


def cluster_from_dict(resources: Any, servers: Any, prefix: str = "") -> Cluster:
    """Build a Cluster from the trace format's ``resources`` and ``servers`` values.

    Every problem found is reported at once, each naming its field (an unknown key of
    a server with the closest known one).
    """
    res_field = f"{prefix}resources"
    if not isinstance(resources, list) or not resources:
        raise SpecError.one(res_field, "must be a non-empty list of resource names")
    names: list[str] = []
    for i, r in enumerate(resources):
        name = fields.name(r, f"{res_field}[{i}]")
        if name in names:
            raise SpecError.one(f"{res_field}[{i}]", f"duplicate resource {name!r}")
        names.append(name)
    if BANDWIDTH not in names:
        raise SpecError.one(res_field, f"must include {BANDWIDTH!r} (it sets b and B, SPEC 3)")

    srv_field = f"{prefix}servers"
    if not isinstance(servers, Sequence) or isinstance(servers, str) or not servers:
        raise SpecError.one(srv_field, "must be a non-empty list of servers")
    problems: list[Problem] = []
    seen: set[str] = set()
    rows: dict[Kind, list[NDArray[np.float64]]] = {"worker": [], "ps": []}
    kind_names: dict[Kind, list[str]] = {"worker": [], "ps": []}
    listing: list[tuple[Kind, int]] = []
    empty = np.zeros((0, len(names)))
    probe = Cluster(tuple(names), (), (), empty, empty, ())
    for i, raw in enumerate(servers):
        field = f"{srv_field}[{i}]"
        try:
            server = fields.mapping(raw, field)
            problems.extend(fields.unknown_keys(server, SERVER_KEYS, field))
            name = fields.name(fields.require(server, "name", field), f"{field}.name")
            if name in seen:
                raise SpecError.one(f"{field}.name", f"duplicate server name {name!r}")
            raw_kind = fields.require(server, "kind", field)
            if raw_kind not in ("worker", "ps"):
                raise SpecError.one(f"{field}.kind", f"must be 'worker' or 'ps', got {raw_kind!r}")
            kind: Kind = "worker" if raw_kind == "worker" else "ps"
            capacity = fields.mapping(
                fields.require(server, "capacity", field), f"{field}.capacity"
            )
            vec = probe.demand_vector(capacity, f"{field}.capacity")
        except SpecError as err:
            problems.extend(err.problems)
            continue
        seen.add(name)
        listing.append((kind, len(rows[kind])))
        rows[kind].append(vec)
        kind_names[kind].append(name)
    if not problems:
        for needed in ("worker", "ps"):
            if not rows[needed]:
                problems.append(Problem(srv_field, f"needs at least one {needed!r} server"))
    if problems:
        raise SpecError(problems)
    return Cluster(
        resources=tuple(names),
        worker_names=tuple(kind_names["worker"]),
        ps_names=tuple(kind_names["ps"]),
        worker_capacity=np.array(rows["worker"], dtype=np.float64),
        ps_capacity=np.array(rows["ps"], dtype=np.float64),
        listing=tuple(listing),
    )
