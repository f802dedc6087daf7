"""The admission API's refusals, importable without the admission controller (the
execution plane raises and catches them too)::

    OasisError (pricing.errors)
    ├── NotFoundError        no job with that id
    ├── ConflictError        the job id exists with another spec or submitter
    ├── PreconditionError    the job's state does not allow the request
    ├── DrainingError        the daemon is stopping
    ├── QueueFullError       the submitter's (or everyone's) pending jobs are at their limit
    └── BusyError            the client has too many calls in flight
"""

from __future__ import annotations

from pricing import OasisError

__all__ = [
    "BusyError",
    "ConflictError",
    "DrainingError",
    "NotFoundError",
    "PreconditionError",
    "QueueFullError",
]


class NotFoundError(OasisError):
    """No job with that id."""


class ConflictError(OasisError):
    """The job id exists with another spec."""


class PreconditionError(OasisError):
    """The job is in a state that does not allow the request."""


class DrainingError(OasisError):
    """The daemon is stopping: it finishes the decisions in flight and takes no new ones."""


class BusyError(OasisError):
    """The client already has ``limits.max_in_flight`` calls waiting for a decision
    (RESOURCE_EXHAUSTED: retry once some are answered)."""


class QueueFullError(OasisError):
    """A job would go pending, but its submitter (or the daemon) has as many pending jobs
    as ``[limits]`` allows; nothing was committed, so it may be submitted again later."""
