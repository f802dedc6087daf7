"""The numeric core of oasis: jobs, prices, the ledger and the best-schedule search.

Pure functions and small classes over numpy arrays: no gRPC, SQL, MQTT, clocks or
file I/O.
"""

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
