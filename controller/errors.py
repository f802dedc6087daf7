"""The admission API's refusals, importable without the admission controller (the
execution plane raises and catches them too)::

    OasisError (pricing.errors)
    ├── NotFoundError        no job with that id
    ├── ConflictError        the job id exists with another spec or submitter
    ├── PreconditionError    the job's state does not allow the request
    ├── DrainingError        the daemon is stopping
    ├── NotLeaderError       a write sent to a standby (high availability)
    ├── QueueFullError       the submitter's (or everyone's) pending jobs are at their limit
    ├── StoredBudgetError    the submitter's jobs stored in the last day are at their limit
    ├── BusyError            the client has too many calls in flight
    └── SlotGridChangedError the config numbers slots otherwise than the store's jobs
        └── ResourcesRemovedError  ... or lacks a resource they demand
"""

from __future__ import annotations

from pricing import OasisError

__all__ = [
    "STORE_UNAVAILABLE",
    "TENANT_UNAVAILABLE",
    "BusyError",
    "ConflictError",
    "DrainingError",
    "NotFoundError",
    "NotLeaderError",
    "PreconditionError",
    "QueueFullError",
    "ResourcesRemovedError",
    "SlotGridChangedError",
    "StoredBudgetError",
]

STORE_UNAVAILABLE = "the store is unavailable"
"""How every store outage's message over gRPC begins (a client tells it from an
unreachable daemon by it)."""
TENANT_UNAVAILABLE = f"{STORE_UNAVAILABLE}; retry shortly (the daemon's log says why)"
"""What a submitter is told of a store outage, over gRPC and in the console: the reason
(the database's host and port, the path of the store's file system) is the operator's
to read, in the log and as an operator."""


class NotFoundError(OasisError):
    """No job with that id."""


class ConflictError(OasisError):
    """The job id exists with another spec."""


class PreconditionError(OasisError):
    """The job is in a state that does not allow the request."""


class DrainingError(OasisError):
    """The daemon is stopping: it finishes the decisions in flight and takes no new ones."""


class NotLeaderError(OasisError):
    """This daemon is a standby (or has just stepped down): writes go to the leader.

    Attributes:
        leader: the leader's advertised ``host:port``; "" if not known.
    """

    METADATA_KEY = "oasis-leader"
    """The trailing metadata key that carries :attr:`leader` (gRPC UNAVAILABLE)."""

    def __init__(self, leader: str, why: str = "this oasisd is a standby") -> None:
        where = f"the leader is at {leader}" if leader else "no leader known yet; retry shortly"
        super().__init__(f"{why}: {where}")
        self.leader = leader

    @property
    def trailing(self) -> tuple[tuple[str, str], ...]:
        """The call's trailing metadata naming the leader."""
        return ((self.METADATA_KEY, self.leader),) if self.leader else ()


class BusyError(OasisError):
    """The client already has ``limits.max_in_flight`` calls waiting for a decision
    (RESOURCE_EXHAUSTED: retry once some are answered)."""


class QueueFullError(OasisError):
    """A job would go pending, but its submitter (or the daemon) has as many pending jobs
    as ``[limits]`` allows; nothing was committed, so it may be submitted again later."""


class StoredBudgetError(OasisError):
    """A new job's spec would take its submitter's specs stored in the last day past
    ``limits.max_stored_mb_per_day`` (:mod:`controller.admission.stored_budget`); nothing
    was stored, so it may be submitted again later."""


class SlotGridChangedError(OasisError):
    """The config's slot length or slot 0 differs from those the store's jobs were
    planned with: started, the daemon would move every stored plan to another time."""


class ResourcesRemovedError(SlotGridChangedError):
    """The config's ``[cluster] resources`` lack one that jobs holding or awaiting a plan
    demand: started, the daemon could not read their specs and would fail every one of
    them for good. Caught where a slot grid change is: both are a config the store's
    jobs were not planned with."""


class StoreEditedError(OasisError):
    """The store holds what no daemon writes (an edit by hand) and the daemon cannot set
    aside: only an operator can mend it, so it does not start (exit 2, not restarted)."""
