"""The paper's four baseline schedulers (section V-A), simulated slot by slot, and RRH
without preemption (``rrh-np``), the quality reports' fairer comparison for OASiS.

``POLICIES`` maps a name to a factory of a fresh policy; :func:`run` replays a trace
under one. Every policy obeys the rules OASiS obeys (:mod:`pricing.baselines.simulator`)
but prices nothing: it earns ``f(jct)`` of each job it completes by the horizon.
"""

from __future__ import annotations

from collections.abc import Callable

from pricing.baselines.dorm import Dorm
from pricing.baselines.drf import Drf
from pricing.baselines.fifo import Fifo
from pricing.baselines.rrh import Rrh, RrhNoPreemption
from pricing.baselines.simulator import Outcome, Policy, PolicyError, simulate
from pricing.trace import Trace

__all__ = ["POLICIES", "Outcome", "Policy", "PolicyError", "run"]

POLICIES: dict[str, Callable[[], Policy]] = {
    "fifo": Fifo,
    "drf": Drf,
    "rrh": Rrh,
    "dorm": Dorm,
    "rrh-np": RrhNoPreemption,
}
"""Baseline name (as ``oasis replay --policy`` takes it) to a factory of the policy."""


def run(
    trace: Trace,
    name: str,
    clock: Callable[[], float] | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Outcome]:
    """Replay ``trace`` under the baseline ``name``; outcomes in trace order.

    ``clock`` (seconds) times each re-plan; ``progress`` is called with the slot of
    each re-plan after it; KeyError for an unknown name.
    """
    return simulate(trace, POLICIES[name](), clock, progress)
