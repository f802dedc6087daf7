"""What the agents say of a job's failing worker commands, for its tenant.

A node agent counts the failures of each job's workers over its session (exits not 0,
signals not its own, starts that failed, stops by its memory guard:
:mod:`controller.plane.workers`) and sends the count with the latest in words in the
job's progress entry (:class:`~controller.plane.agent_messages.TaskProgress`). Before,
that was only in the agent's log on the server: a tenant whose worker command exited 1
at once saw no mini-batch, then the job ``behind`` and ``failed``, and no reason.

The daemon keeps, in memory only, the latest of those per job and server, from the
reports that count (:meth:`~controller.plane.execution.Execution._drain`: a job planned
on the server, the first agent of two), and ``GetProgress`` gives them
(:class:`WorkerFailures`). At most one record per server a job's reports count from, for
the jobs the plane follows; forgotten with the job (:meth:`FailuresHeard.forget`). A
daemon restart forgets them: the agents' next failures are said again.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FailuresHeard", "WorkerFailures"]


@dataclass(frozen=True)
class WorkerFailures:
    """A job's failing workers on one server, as its agent last said.

    Attributes:
        server: the server.
        failures: its workers' failures over the agent's session (>= 1).
        last_failure: the latest in the agent's words (``exit status 1``), escaped, at
            most 200 characters; "": not said.
        seconds_ago: seconds since the daemon took in the report that said it.
    """

    server: str
    failures: int
    last_failure: str
    seconds_ago: float


@dataclass(frozen=True)
class _Heard:
    failures: int
    last_failure: str
    at: float  # the daemon's monotonic clock, seconds


class FailuresHeard:
    """The latest worker failures per job and server (see the module docstring); used
    in the decision thread only."""

    def __init__(self) -> None:
        self._jobs: dict[str, dict[str, _Heard]] = {}

    def heard(self, job: str, server: str, failures: int, last_failure: str, at: float) -> None:
        """A counted report entry of ``job`` from ``server``'s agent, taken in
        at ``at`` (monotonic seconds). It replaces what that server said before; one
        without failures (an older agent, a new session, counts started afresh) clears
        it (reports come in the order they were taken in)."""
        servers = self._jobs.get(job)
        if not failures:
            if servers is not None:
                servers.pop(server, None)
                if not servers:
                    del self._jobs[job]
            return
        self._jobs.setdefault(job, {})[server] = _Heard(failures, last_failure, at)

    def of(self, job: str, now: float) -> list[WorkerFailures]:
        """``job``'s failing workers per server, by server name; ``now`` on the clock of
        :meth:`heard`."""
        servers = self._jobs.get(job, {})
        return [
            WorkerFailures(server, h.failures, h.last_failure, max(0.0, now - h.at))
            for server, h in sorted(servers.items())
        ]

    def forget(self, active: set[str]) -> None:
        """Forget every job not in ``active`` (the admitted or running ones)."""
        for job in [j for j in self._jobs if j not in active]:
            del self._jobs[job]

    def __len__(self) -> int:
        """How many jobs have failures kept."""
        return len(self._jobs)
