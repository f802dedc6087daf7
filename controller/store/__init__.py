"""The SQL store: servers, jobs and their decisions, allocations, the event log.

The store is the source of truth: a decision is committed before it is answered, and a
restarted daemon rebuilds its ledger and prices from it.
"""

from controller.store.database import (
    REBUILD_SECONDS,
    Database,
    StoreUnavailableError,
    StoreVersionError,
    in_batches,
    migrate,
)
from controller.store.models import (
    CORDONED,
    AllocationRow,
    EventRow,
    JobRow,
    MetaRow,
    OutageRow,
    ProgressRow,
    ServerRow,
)

__all__ = [
    "CORDONED",
    "REBUILD_SECONDS",
    "AllocationRow",
    "Database",
    "EventRow",
    "JobRow",
    "MetaRow",
    "OutageRow",
    "ProgressRow",
    "ServerRow",
    "StoreUnavailableError",
    "StoreVersionError",
    "in_batches",
    "migrate",
]
