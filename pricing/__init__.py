"""The numeric core of oasis: jobs, prices, the ledger and the best-schedule search.

Pure functions and small classes over numpy arrays: no gRPC, SQL, MQTT, clocks or
file I/O, except numba's cache of the compiled kernels (:mod:`pricing.jit`).

The names below are loaded on first use (PEP 562): ``from pricing.errors import
SpecError`` or ``from pricing import fields`` costs no numba compile and no numpy import,
which keeps the ``oasis`` client's start-up short (bench/client_startup.py).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pricing.admission import ADMIT_THRESHOLD, Decision, decide
    from pricing.best_schedule import BestSchedule, best_schedule
    from pricing.cluster import Cluster, cluster_from_dict
    from pricing.errors import CapacityError, LedgerError, OasisError, Problem, SpecError
    from pricing.job import Job, job_from_dict
    from pricing.ledger import Ledger
    from pricing.prices import PriceBounds, oracle_bounds
    from pricing.schedule import Schedule
    from pricing.trace import Trace, trace_from_dict

__all__ = [
    "ADMIT_THRESHOLD",
    "BestSchedule",
    "CapacityError",
    "Cluster",
    "Decision",
    "Job",
    "Ledger",
    "LedgerError",
    "OasisError",
    "PriceBounds",
    "Problem",
    "Schedule",
    "SpecError",
    "Trace",
    "best_schedule",
    "cluster_from_dict",
    "decide",
    "job_from_dict",
    "oracle_bounds",
    "trace_from_dict",
]

_HOME = {
    "ADMIT_THRESHOLD": "admission",
    "Decision": "admission",
    "decide": "admission",
    "BestSchedule": "best_schedule",
    "best_schedule": "best_schedule",
    "Cluster": "cluster",
    "cluster_from_dict": "cluster",
    "CapacityError": "errors",
    "LedgerError": "errors",
    "OasisError": "errors",
    "Problem": "errors",
    "SpecError": "errors",
    "Job": "job",
    "job_from_dict": "job",
    "Ledger": "ledger",
    "PriceBounds": "prices",
    "oracle_bounds": "prices",
    "Schedule": "schedule",
    "Trace": "trace",
    "trace_from_dict": "trace",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'pricing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"pricing.{home}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """The package's module type: importing the submodule ``pricing.best_schedule`` binds
    that name here (as every import of a submodule does), but ``pricing.best_schedule``
    stays the function the package exports, as it was when this file imported it."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _HOME.get(name) == name:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
